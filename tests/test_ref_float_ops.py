"""Tests of the float (CPU) ops of the reference executor (compiler/ref/float_ops.py).

The independent reference is onnxruntime: small NCHW float32 ONNX models on random data, whose
outputs are transposed to NHWC (weights to OHWI) and compared with ``evaluate`` to 1e-5 relative.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opendpu.compiler.ref import SUPPORTED, RefError, evaluate  # noqa: E402

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


# --------------------------------------------------------------------------------------------------
# helpers (independent of the code under test)
# --------------------------------------------------------------------------------------------------

def run_onnx(nodes, inputs: dict[str, np.ndarray], inits: dict[str, np.ndarray] | None = None,
             opset: int = 17) -> np.ndarray:
    """Run an ONNX graph (nodes, last output named 'y') on onnxruntime, float32."""
    inits = inits or {}
    g = helper.make_graph(
        nodes, "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {n: a.astype(np.float32) for n, a in inputs.items()})[0]


def nchw_to_nhwc(a):
    return np.ascontiguousarray(np.asarray(a).transpose(0, 2, 3, 1))


def nhwc_to_nchw(a):
    return np.ascontiguousarray(np.asarray(a).transpose(0, 3, 1, 2))


def rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def close(got, want):
    got = np.asarray(got)
    want = np.asarray(want, dtype=np.float64)
    assert got.dtype == np.float32
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def geom(kernel_hw, stride_hw=(1, 1), dil_hw=(1, 1), pad_tblr=(0, 0, 0, 0), **extra):
    """XIR attributes: kernel/stride/dilation [w, h], pad [left, right, top, bottom]."""
    (kh, kw), (sh, sw), (dh, dw) = kernel_hw, stride_hw, dil_hw
    pt, pb, pl, pr = pad_tblr
    a = {"kernel": [kw, kh], "stride": [sw, sh], "dilation": [dw, dh], "pad": [pl, pr, pt, pb],
         "pad_mode": "FLOOR"}
    a.update(extra)
    return a


def onnx_pads(pad_tblr):
    pt, pb, pl, pr = pad_tblr
    return [pt, pl, pb, pr]


def act_nodes(nonlinear: str, src: str = "c"):
    """ONNX nodes applying the activation to `src`, output 'y'."""
    if nonlinear == "NONE":
        return [helper.make_node("Identity", [src], ["y"])]
    if nonlinear == "RELU":
        return [helper.make_node("Relu", [src], ["y"])]
    if nonlinear == "RELU6":
        return [helper.make_node("Clip", [src, "lo6", "hi6"], ["y"])]
    if nonlinear == "LEAKYRELU":
        return [helper.make_node("LeakyRelu", [src], ["y"], alpha=26 / 256)]
    if nonlinear == "HSIGMOID":
        return [helper.make_node("HardSigmoid", [src], ["y"], alpha=1 / 6, beta=0.5)]
    if nonlinear == "HSWISH":
        return [helper.make_node("HardSwish", [src], ["y"])]
    raise AssertionError(nonlinear)


ACT_INITS = {"lo6": np.array(0, np.float32), "hi6": np.array(6, np.float32)}


# --------------------------------------------------------------------------------------------------
# conv2d
# --------------------------------------------------------------------------------------------------

CONV_CASES = [
    # kernel, stride, dilation, pad (t, b, l, r), bias, nonlinear
    ((3, 3), (2, 2), (1, 1), (1, 0, 2, 1), True, "NONE"),
    ((3, 2), (1, 2), (2, 1), (2, 1, 0, 1), True, "RELU"),
    ((1, 1), (1, 1), (1, 1), (0, 0, 0, 0), False, "RELU6"),
    ((5, 3), (2, 1), (2, 2), (3, 1, 1, 2), True, "LEAKYRELU"),
    ((3, 3), (1, 1), (1, 1), (1, 1, 1, 1), True, "HSIGMOID"),
    ((3, 3), (2, 2), (1, 1), (0, 1, 0, 1), True, "HSWISH"),
]


@pytest.mark.parametrize("k,s,d,p,has_bias,nl", CONV_CASES)
def test_conv2d_matches_onnx(k, s, d, p, has_bias, nl):
    rng = np.random.default_rng(zlib.crc32(repr((k, s, d, p, nl)).encode()))
    N, C, H, W, O = 2, 5, 11, 13, 7
    x = rand(rng, (N, C, H, W), 2.0)
    w = rand(rng, (O, C) + k, 0.5)
    b = rand(rng, (O,))
    ins = ["x", "w"] + (["b"] if has_bias else [])
    nodes = [helper.make_node("Conv", ins, ["c"], kernel_shape=list(k), strides=list(s),
                              dilations=list(d), pads=onnx_pads(p))] + act_nodes(nl)
    inits = {"w": w, **ACT_INITS, **({"b": b} if has_bias else {})}
    want = nchw_to_nhwc(run_onnx(nodes, {"x": x}, inits))
    args = [nchw_to_nhwc(x), w.transpose(0, 2, 3, 1)] + ([b] if has_bias else [])
    got = evaluate("conv2d", args, geom(k, s, d, p, group=1, nonlinear=nl), [None] * len(args),
                   None, want.shape, name="conv")
    close(got, want)


def test_grouped_conv2d_matches_onnx():
    rng = np.random.default_rng(1)
    x = rand(rng, (1, 6, 9, 8))
    w = rand(rng, (4, 3, 3, 3))                     # group 2: 3 input channels per group
    b = rand(rng, (4,))
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], group=2,
                            pads=[1, 0, 0, 1])
    want = nchw_to_nhwc(run_onnx([node], {"x": x}, {"w": w, "b": b}))
    got = evaluate("conv2d", [nchw_to_nhwc(x), w.transpose(0, 2, 3, 1), b],
                   geom((3, 3), pad_tblr=(1, 0, 0, 1), group=2), [None] * 3, None, want.shape)
    close(got, want)


def test_depthwise_chunked_rows_agree(monkeypatch):
    """Tiny chunks (one output row at a time) give the same depthwise result as one chunk (the float conv
    shares the integer conv's row chunking in compiler/ref/ops.py)."""
    from opendpu.compiler.ref import float_ops
    rng = np.random.default_rng(2)
    x = rand(rng, (2, 12, 10, 4))
    dw = rand(rng, (1, 3, 3, 4))
    attrs = geom((3, 3), (1, 1), (1, 1), (1, 1, 1, 1))
    dfull = evaluate("depthwise-conv2d", [x, dw], attrs, [None, None], None, (2, 12, 10, 4))
    monkeypatch.setattr(float_ops, "_CHUNK_BYTES", 1)
    np.testing.assert_array_equal(
        evaluate("depthwise-conv2d", [x, dw], attrs, [None, None], None, (2, 12, 10, 4)), dfull)


# --------------------------------------------------------------------------------------------------
# depthwise-conv2d
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mult,s,d,p,nl", [
    (1, (2, 2), (1, 1), (1, 1, 0, 2), "RELU6"),
    (2, (1, 1), (2, 2), (2, 2, 2, 2), "NONE"),
    (1, (1, 2), (1, 1), (0, 2, 1, 1), "LEAKYRELU"),
])
def test_depthwise_conv2d_matches_onnx(mult, s, d, p, nl):
    rng = np.random.default_rng(10 + mult)
    N, C, H, W = 2, 6, 10, 9
    x = rand(rng, (N, C, H, W))
    w = rand(rng, (C * mult, 1, 3, 3))              # ONNX: output channel c*mult + m
    b = rand(rng, (C * mult,))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], group=C,
                              strides=list(s), dilations=list(d), pads=onnx_pads(p))] + act_nodes(nl)
    want = nchw_to_nhwc(run_onnx(nodes, {"x": x}, {"w": w, "b": b, **ACT_INITS}))
    # XIR depthwise weights [mult, kh, kw, C]: w_xir[m, y, x, c] = w_onnx[c*mult + m, 0, y, x]
    w_xir = w[:, 0].reshape(C, mult, 3, 3).transpose(1, 2, 3, 0)
    got = evaluate("depthwise-conv2d", [nchw_to_nhwc(x), w_xir, b],
                   geom((3, 3), s, d, p, nonlinear=nl), [None] * 3, None, want.shape, name="dw")
    close(got, want)


# --------------------------------------------------------------------------------------------------
# transposed convs
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,s,d,p,outpad,nl", [
    ((3, 3), (2, 2), (1, 1), (1, 1, 1, 1), (1, 1), "NONE"),
    ((4, 4), (2, 2), (1, 1), (1, 1, 1, 1), (0, 0), "RELU"),
    ((3, 2), (2, 3), (1, 1), (0, 1, 1, 0), (1, 2), "NONE"),
    ((3, 3), (2, 1), (2, 1), (2, 0, 1, 1), (0, 0), "LEAKYRELU"),
])
def test_transposed_conv2d_matches_onnx(k, s, d, p, outpad, nl):
    rng = np.random.default_rng(20 + k[1] + s[1])
    N, Cin, H, W, Cout = 2, 4, 5, 6, 3
    kh, kw = k
    x = rand(rng, (N, Cin, H, W))
    w = rand(rng, (Cin, Cout, kh, kw))              # ONNX ConvTranspose weights
    b = rand(rng, (Cout,))
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["c"], kernel_shape=list(k),
                              strides=list(s), dilations=list(d), pads=onnx_pads(p),
                              output_padding=list(outpad))] + act_nodes(nl)
    want = nchw_to_nhwc(run_onnx(nodes, {"x": x}, {"w": w, "b": b, **ACT_INITS}))
    # OHWI of the equivalent stride-1 conv: W_xir[o, y, x, i] = W_onnx[i, o, kh-1-y, kw-1-x]
    w_xir = w[:, :, ::-1, ::-1].transpose(1, 2, 3, 0)
    got = evaluate("transposed-conv2d", [nchw_to_nhwc(x), w_xir, b],
                   geom(k, s, d, p, nonlinear=nl), [None] * 3, None, want.shape, name="tc")
    close(got, want)


@pytest.mark.parametrize("op", ["transposed-depthwise-conv2d", "depthwise-transposed-conv2d"])
def test_transposed_depthwise_conv2d_matches_onnx(op):
    rng = np.random.default_rng(30)
    N, C, H, W = 1, 5, 4, 6
    x = rand(rng, (N, C, H, W))
    w = rand(rng, (C, 1, 3, 3))
    b = rand(rng, (C,))
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], group=C,
                            strides=[2, 2], pads=[1, 0, 0, 1], output_padding=[1, 0])
    want = nchw_to_nhwc(run_onnx([node], {"x": x}, {"w": w, "b": b}))
    w_xir = w[:, :, ::-1, ::-1].transpose(1, 2, 3, 0)          # [1, kh, kw, C]
    got = evaluate(op, [nchw_to_nhwc(x), w_xir, b], geom((3, 3), (2, 2), pad_tblr=(1, 0, 0, 1)),
                   [None] * 3, None, want.shape)
    close(got, want)


# --------------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------------

POOL_CASES = [
    # kernel, stride, pad (t, b, l, r), ceil_mode, count_include_pad
    ((3, 3), (2, 2), (1, 1, 1, 1), 0, 1),
    ((3, 3), (2, 2), (1, 1, 1, 1), 0, 0),
    ((2, 3), (2, 2), (0, 1, 1, 0), 1, 1),
    ((3, 3), (2, 2), (1, 0, 0, 1), 1, 0),
    ((3, 2), (3, 2), (0, 0, 0, 0), 1, 1),
    ((2, 2), (1, 1), (0, 0, 0, 0), 0, 1),
]


@pytest.mark.parametrize("k,s,p,ceil,cip", POOL_CASES)
def test_maxpool2d_matches_onnx(k, s, p, ceil, cip):
    rng = np.random.default_rng(40)
    x = rand(rng, (2, 3, 11, 10))
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=list(k), strides=list(s),
                            pads=onnx_pads(p), ceil_mode=ceil)
    want = nchw_to_nhwc(run_onnx([node], {"x": x}))
    a = geom(k, s, pad_tblr=p)
    a.pop("dilation")
    got = evaluate("maxpool2d", [nchw_to_nhwc(x)], a, [None], None, want.shape, name="mp")
    close(got, want)
    got2 = evaluate("pool", [nchw_to_nhwc(x)], {**a, "type": "MAX"}, [None], None, want.shape)
    close(got2, want)


@pytest.mark.parametrize("k,s,p,ceil,cip", POOL_CASES)
def test_avgpool2d_matches_onnx(k, s, p, ceil, cip):
    rng = np.random.default_rng(41)
    x = rand(rng, (2, 3, 11, 10))
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=list(k), strides=list(s),
                            pads=onnx_pads(p), ceil_mode=ceil, count_include_pad=cip)
    want = nchw_to_nhwc(run_onnx([node], {"x": x}))
    # ONNX / PyTorch never count window positions past the padded input (ceil mode)
    a = geom(k, s, pad_tblr=p, count_include_pad=bool(cip), count_include_invalid=False)
    a.pop("dilation")
    got = evaluate("avgpool2d", [nchw_to_nhwc(x)], a, [None], None, want.shape, name="ap")
    close(got, want)
    got2 = evaluate("pool", [nchw_to_nhwc(x)], {**a, "type": "AVG"}, [None], None, want.shape)
    close(got2, want)


def test_avgpool2d_count_include_invalid_default_uses_full_kernel():
    """XIR's default count_include_invalid=true: ceil-mode windows divide by the kernel area."""
    x = np.ones((1, 5, 5, 1), np.float32)
    a = geom((2, 2), (2, 2))
    a.pop("dilation")
    y = evaluate("avgpool2d", [x], a, [None], None, (1, 3, 3, 1))
    want = np.array([[1, 1, .5], [1, 1, .5], [.5, .5, .25]])
    close(y[0, :, :, 0], want)


@pytest.mark.parametrize("onnx_op,xir_op", [("GlobalAveragePool", "avgpool2d"),
                                            ("GlobalMaxPool", "maxpool2d")])
def test_global_pool_matches_onnx(onnx_op, xir_op):
    rng = np.random.default_rng(42)
    x = rand(rng, (2, 4, 7, 6))
    want = nchw_to_nhwc(run_onnx([helper.make_node(onnx_op, ["x"], ["y"])], {"x": x}))
    got = evaluate(xir_op, [nchw_to_nhwc(x)], {"global": True, "kernel": [1, 1], "stride": [1, 1],
                                               "pad": [0, 0, 0, 0]}, [None], None, want.shape)
    close(got, want)


# --------------------------------------------------------------------------------------------------
# elementwise, concat, resize, activations
# --------------------------------------------------------------------------------------------------

def test_add_mul_broadcast_matches_onnx():
    rng = np.random.default_rng(50)
    a = rand(rng, (2, 5, 4, 3))
    b = rand(rng, (1, 1, 1, 3))
    c = rand(rng, (5, 1, 3))
    for onnx_op, xir_op in (("Sum", "add"), ("Mul", "mul")):
        if onnx_op == "Sum":
            nodes = [helper.make_node("Sum", ["a", "b", "c"], ["y"])]
            ins, args = {"a": a, "b": b, "c": c}, [a, b, c]
        else:
            nodes = [helper.make_node("Mul", ["a", "b"], ["t"]),
                     helper.make_node("Mul", ["t", "c"], ["y"])]
            ins, args = {"a": a, "b": b, "c": c}, [a, b, c]
        want = run_onnx(nodes, ins)
        close(evaluate(xir_op, args, {}, [None] * 3, None, want.shape, name=xir_op), want)


@pytest.mark.parametrize("onnx_op,xir_op", [("Sub", "sub"), ("Div", "div"), ("Add", "add"),
                                            ("Mul", "mul")])
def test_binary_matches_onnx(onnx_op, xir_op):
    rng = np.random.default_rng(51)
    a = rand(rng, (1, 3, 4, 6))
    b = rand(rng, (1, 1, 4, 1)) + np.float32(3.0)
    want = run_onnx([helper.make_node(onnx_op, ["a", "b"], ["y"])], {"a": a, "b": b})
    close(evaluate(xir_op, [a, b], {}, [None, None], None, want.shape), want)


@pytest.mark.parametrize("axis", [3, 1, -1, 0])
def test_concat_matches_onnx(axis):
    rng = np.random.default_rng(52)
    shapes = [[2, 4, 5, 3], [2, 4, 5, 3], [2, 4, 5, 3]]
    for i, s in enumerate(shapes):
        s[axis] += i
    xs = [rand(rng, tuple(s)) for s in shapes]
    names = ["a", "b", "c"]
    want = run_onnx([helper.make_node("Concat", names, ["y"], axis=axis)], dict(zip(names, xs)))
    close(evaluate("concat", xs, {"axis": axis}, [None] * 3, None, want.shape), want)


@pytest.mark.parametrize("op", ["upsample", "resize"])
@pytest.mark.parametrize("in_hw,out_hw", [((4, 5), (8, 10)), ((3, 4), (9, 4)), ((5, 3), (7, 8))])
def test_nearest_upsample_matches_onnx(op, in_hw, out_hw):
    rng = np.random.default_rng(53)
    x = rand(rng, (2, 3) + in_hw)
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest",
                            coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    want = nchw_to_nhwc(run_onnx([node], {"x": x},
                                 {"sizes": np.array((2, 3) + out_hw, np.int64)}))
    sh, sw = out_hw[0] / in_hw[0], out_hw[1] / in_hw[1]
    got = evaluate(op, [nchw_to_nhwc(x)], {"mode": "NEAREST", "scale": [sw, sh],
                                           "align_corners": False, "half_pixel_centers": False},
                   [None], None, want.shape)
    close(got, want)


@pytest.mark.parametrize("ctm,attrs", [
    ("half_pixel", {"half_pixel_centers": True}),
    ("align_corners", {"align_corners": True}),
    ("asymmetric", {}),
])
def test_bilinear_resize_matches_onnx(ctm, attrs):
    rng = np.random.default_rng(54)
    x = rand(rng, (1, 3, 4, 5))
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear",
                            coordinate_transformation_mode=ctm)
    want = nchw_to_nhwc(run_onnx([node], {"x": x}, {"sizes": np.array([1, 3, 8, 7], np.int64)}))
    got = evaluate("resize", [nchw_to_nhwc(x)], {"mode": "BILINEAR", **attrs}, [None], None,
                   want.shape)
    close(got, want)


@pytest.mark.parametrize("xir_op,node", [
    ("hard-sigmoid", helper.make_node("HardSigmoid", ["x"], ["y"], alpha=1 / 6, beta=0.5)),
    ("hard-swish", helper.make_node("HardSwish", ["x"], ["y"])),
    ("tanh", helper.make_node("Tanh", ["x"], ["y"])),
    ("exp", helper.make_node("Exp", ["x"], ["y"])),
])
def test_unary_matches_onnx(xir_op, node):
    rng = np.random.default_rng(55)
    x = rand(rng, (2, 3, 5, 4), 3.0)
    want = run_onnx([node], {"x": x})
    close(evaluate(xir_op, [x], {}, [None], None, want.shape, name=xir_op), want)


def test_clamp_matches_onnx():
    rng = np.random.default_rng(56)
    x = rand(rng, (2, 3, 5, 4), 3.0)
    want = run_onnx([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], {"x": x},
                    {"lo": np.array(-1.5, np.float32), "hi": np.array(0.75, np.float32)})
    close(evaluate("clamp", [x], {"min": -1.5, "max": 0.75}, [None], None, want.shape), want)


def test_float_ops_are_supported():
    for op in ("conv2d", "depthwise-conv2d", "transposed-conv2d", "transposed-depthwise-conv2d",
               "maxpool2d", "avgpool2d", "pool", "add", "sub", "mul", "div", "concat", "upsample",
               "resize", "hard-sigmoid", "hard-swish", "tanh", "exp", "clamp", "flatten"):
        assert op in SUPPORTED, op


def test_flatten_is_a_row_major_reshape():
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    y = evaluate("flatten", [x], {"start_axis": 1, "end_axis": -1}, [None], None, (1, 24))
    np.testing.assert_array_equal(y, x.reshape(1, 24))
    assert y.dtype == np.float32


# --------------------------------------------------------------------------------------------------
# bad inputs: RefError naming the op and the problem
# --------------------------------------------------------------------------------------------------

def _raises(op, inputs, attrs, out_shape, match, name="bad"):
    with pytest.raises(RefError, match=match) as ei:
        evaluate(op, inputs, attrs, [None] * len(inputs), None, out_shape, name=name)
    assert str(ei.value).startswith(f"{op} '{name}'"), str(ei.value)


def test_conv_bad_inputs():
    x = np.zeros((1, 6, 6, 3), np.float32)
    w = np.zeros((2, 3, 3, 3), np.float32)
    a = geom((3, 3))
    _raises("conv2d", [x, np.zeros((2, 3, 3, 4), np.float32)], a, (1, 4, 4, 2), "channels")
    _raises("conv2d", [x[0], w], a, (1, 4, 4, 2), "4-D")
    _raises("conv2d", [x, w], {**a, "nonlinear": "PRELU"}, (1, 4, 4, 2), "nonlinear 'PRELU'")
    _raises("conv2d", [x, w, np.zeros(3, np.float32)], a, (1, 4, 4, 2), "bias has 3 values")
    _raises("conv2d", [x, w], a, (1, 4, 4, 5), "output shape")
    _raises("conv2d", [x, w], geom((5, 5)), (1, 4, 4, 2), "kernel")
    _raises("conv2d", [x], a, (1, 4, 4, 2), "expects 2..3 inputs")
    _raises("conv2d", [x.astype(bool), w], a, (1, 4, 4, 2), "dtype")
    _raises("depthwise-conv2d", [x, np.zeros((1, 3, 3, 4), np.float32)], a, (1, 4, 4, 4),
            "channels")
    _raises("transposed-conv2d", [x, w], {**a, "nonlinear": "GELU"}, (1, 8, 8, 2), "nonlinear")
    _raises("transposed-depthwise-conv2d", [x, w], a, (1, 8, 8, 3), "channels")


def test_pool_bad_inputs():
    x = np.zeros((1, 6, 6, 3), np.float32)
    a = {"kernel": [2, 2], "stride": [2, 2], "pad": [0, 0, 0, 0]}
    _raises("maxpool2d", [x[0]], a, (1, 3, 3, 3), "4-D")
    _raises("avgpool2d", [x], a, (1, 3, 3, 4), "output shape")
    _raises("avgpool2d", [x], {**a, "kernel": [2]}, (1, 3, 3, 3), "kernel")
    _raises("maxpool2d", [x], {**a, "dilation": [2, 2]}, (1, 3, 3, 3), "dilation")
    _raises("pool", [x], {**a, "type": "LP"}, (1, 3, 3, 3), "pool type 'LP'")
    _raises("avgpool2d", [x], {"kernel": [2, 2], "stride": [1, 1], "pad": [3, 0, 0, 0],
                               "count_include_pad": False}, (1, 5, 8, 3), "no element")


def test_eltwise_and_movement_bad_inputs():
    a = np.zeros((1, 4, 4, 3), np.float32)
    _raises("add", [a, np.zeros((1, 4, 4, 2), np.float32)], {}, (1, 4, 4, 3), "broadcast")
    _raises("sub", [a, a, a], {}, (1, 4, 4, 3), "expects 2 inputs")
    _raises("div", [a], {}, (1, 4, 4, 3), "expects 2 inputs")
    _raises("mul", [a, np.array(["x"])], {}, (1, 4, 4, 3), "dtype")
    _raises("concat", [a, np.zeros((1, 5, 4, 3), np.float32)], {"axis": 3}, (1, 4, 4, 6),
            "cannot concatenate")
    _raises("concat", [a, a], {"axis": 4}, (1, 4, 4, 6), "axis 4 out of range")
    _raises("concat", [a, a[0]], {"axis": 0}, (2, 4, 4, 3), "ranks")
    _raises("upsample", [a[0]], {"mode": "NEAREST"}, (1, 8, 8, 3), "4-D")
    _raises("upsample", [a], {"mode": "NEAREST"}, (1, 8, 8, 4), "output shape")
    _raises("resize", [a], {"mode": "CUBIC"}, (1, 8, 8, 3), "mode 'CUBIC'")
    _raises("resize", [a], {"mode": "NEAREST", "align_corners": True}, (1, 8, 8, 3),
            "align_corners")


def test_activation_bad_inputs():
    a = np.zeros((1, 4, 4, 3), np.float32)
    _raises("tanh", [a, a], {}, (1, 4, 4, 3), "expects 1 inputs")
    _raises("exp", [a.astype(np.complex64)], {}, (1, 4, 4, 3), "dtype")
    _raises("hard-sigmoid", [], {}, (1, 4, 4, 3), "expects 1 inputs")
    _raises("hard-swish", [a], {}, (1, 4, 4, 2), "shape")
    _raises("clamp", [a], {}, (1, 4, 4, 3), "min")
    _raises("clamp", [a], {"min": 2.0, "max": 1.0}, (1, 4, 4, 3), "min 2.0 > max 1.0")
