"""Tests of the independent XIR reference executor (compiler/ref).

Expected values come from hand computation (numbers written out) or from onnxruntime on float
models where the quantized op reduces to exact float math (power-of-two scales, integer-valued
sums below 2^24); the final rounding of such float results is done here with plain float64 math.
"""

from __future__ import annotations

import sys
from fractions import Fraction
import zlib
from math import floor
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opendpu.compiler.ref import SUPPORTED, RefError, avg_pool_factor, dpu_round, evaluate  # noqa: E402

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402


# --------------------------------------------------------------------------------------------------
# helpers (independent of the code under test)
# --------------------------------------------------------------------------------------------------

def run_onnx(op: str, inputs: dict[str, np.ndarray], out_rank: int, **attrs) -> np.ndarray:
    """Run a single float32 ONNX node on onnxruntime."""
    names = list(inputs)
    node = helper.make_node(op, names, ["y"], **attrs)
    g = helper.make_graph(
        [node], "t",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * out_rank)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {n: a.astype(np.float32) for n, a in inputs.items()})[0]


def round_half_up_sat(v: np.ndarray) -> np.ndarray:
    """floor(v + 1/2), saturated to int8; v must be an exactly representable dyadic float64."""
    return np.clip(np.floor(np.asarray(v, np.float64) + 0.5), -128, 127).astype(np.int8)


def rand_i8(rng, shape, lo=-128, hi=127):
    return rng.integers(lo, hi + 1, size=shape).astype(np.int8)


def nhwc_to_nchw(a):
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2))


def nchw_to_nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def conv_attrs(kernel_hw, stride_hw=(1, 1), dil_hw=(1, 1), pad_tblr=(0, 0, 0, 0), nonlinear="NONE",
               **extra):
    kh, kw = kernel_hw
    pt, pb, pl, pr = pad_tblr
    a = {"kernel": [kw, kh], "stride": [stride_hw[1], stride_hw[0]],
         "dilation": [dil_hw[1], dil_hw[0]], "pad": [pl, pr, pt, pb], "nonlinear": nonlinear,
         "pad_mode": "FLOOR", "group": 1}
    a.update(extra)
    return a


# --------------------------------------------------------------------------------------------------
# dpu_round
# --------------------------------------------------------------------------------------------------

def test_dpu_round_ties_and_saturation():
    v = np.array([2.5, -2.5, 1.5, -1.5, 0.5, -0.5, 2.4999, -2.5001, 126.5, 127.49, 127.5, 1000.0,
                  -128.5, -128.6, -1e9, 0.49999999999999994])
    exp = [3, -2, 2, -1, 1, 0, 2, -3, 127, 127, 127, 127, -128, -128, -128, 0]
    r = dpu_round(v)
    assert r.dtype == np.int8
    assert r.tolist() == exp


def test_dpu_round_integer_form():
    n = np.array([5, -5, 3, -3, 7, -7, 1000, -1000, 6], dtype=np.int64)
    # n / 2: 2.5 -> 3, -2.5 -> -2, 1.5 -> 2, -1.5 -> -1, 3.5 -> 4, -3.5 -> -3, 500 -> 127, ...
    assert dpu_round(n, 1).tolist() == [3, -2, 2, -1, 4, -3, 127, -128, 3]
    # n / 4: 1.25 -> 1, -1.25 -> -1, 0.75 -> 1, -0.75 -> -1, 1.75 -> 2, -1.75 -> -2
    assert dpu_round(n, 2).tolist() == [1, -1, 1, -1, 2, -2, 127, -128, 2]
    # left shift: n * 4
    assert dpu_round(n, -2).tolist() == [20, -20, 12, -12, 28, -28, 127, -128, 24]
    assert dpu_round(np.array([1, -1]), -70).tolist() == [127, -128]
    assert dpu_round(np.array([2 ** 40, -(2 ** 40)]), 80).tolist() == [0, 0]


# --------------------------------------------------------------------------------------------------
# conv2d-fix
# --------------------------------------------------------------------------------------------------

def test_conv_hand_computed_bias_and_round():
    # 1x1 conv, one input / one output channel: acc = x*w
    # fp_in 1, fp_w 2, fp_bias 2, fp_out 1: sb = 1, sc = 2
    # v = (acc + bias*2^1) / 2^2
    x = np.array([3, -3, 5, -5, 1, 100], np.int8).reshape(1, 1, 6, 1)
    w = np.array([[[[1]]]], np.int8)
    b = np.array([1], np.int8)
    y = evaluate("conv2d-fix", [x, w, b], conv_attrs((1, 1)), [1, 2, 2], 1, (1, 1, 6, 1))
    # (3+2)/4=1.25->1, (-3+2)/4=-0.25->0, 7/4=1.75->2, -3/4=-0.75->-1, 3/4->1, 102/4=25.5->26
    assert y.reshape(-1).tolist() == [1, 0, 2, -1, 1, 26]
    assert y.dtype == np.int8


def test_conv_bias_shift_clamp_c1():
    # fp_in 0, fp_w 0, fp_bias 3: sb = -3 -> clamped to sb_eff = -1 (spec §7.2 C1): the bias is
    # weighted by 2^-1 instead of 2^-3.   fp_out 0 (sc = 0): v = acc + bias/2
    x = np.array([0, 1, -2, 10], np.int8).reshape(1, 1, 4, 1)
    w = np.array([[[[1]]]], np.int8)
    b = np.array([5], np.int8)
    y = evaluate("conv2d-fix", [x, w, b], conv_attrs((1, 1)), [0, 0, 3], 0, (1, 1, 4, 1))
    # 2.5 -> 3, 3.5 -> 4, 0.5 -> 1, 12.5 -> 13   (an unclamped 5/8 would give 1, 2, -1, 11)
    assert y.reshape(-1).tolist() == [3, 4, 1, 13]
    # sb = -1 exactly is not clamped: fp_bias 1 -> bias/2 as well
    y1 = evaluate("conv2d-fix", [x, w, b], conv_attrs((1, 1)), [0, 0, 1], 0, (1, 1, 4, 1))
    assert y1.reshape(-1).tolist() == [3, 4, 1, 13]
    # sb = +2: bias * 4
    y2 = evaluate("conv2d-fix", [x, w, b], conv_attrs((1, 1)), [1, 1, 0], 2, (1, 1, 4, 1))
    assert y2.reshape(-1).tolist() == [20, 21, 18, 30]


def test_conv_leaky_26_over_256():
    x = np.array([-5, -10, -15, -20, -40, 7, -1], np.int8).reshape(1, 1, 7, 1)
    w = np.array([[[[1]]]], np.int8)
    attrs = conv_attrs((1, 1), nonlinear="LEAKYRELU", LEAKYRELU_alpha=0.1015625)
    y = evaluate("conv2d-fix", [x, w], attrs, [0, 0], 0, (1, 1, 7, 1))
    # -5*26/256=-0.5078->-1, -1.0156->-1, -1.5234->-2, -2.03->-2, -4.0625->-4, 7, -0.1016->0
    # (slope 0.1 would give 0, -1, -1, -2, -4, 7, 0)
    assert y.reshape(-1).tolist() == [-1, -1, -2, -2, -4, 7, 0]
    # no alpha attribute: the DPU slope 26/256
    attrs.pop("LEAKYRELU_alpha")
    y = evaluate("conv2d-fix", [x, w], attrs, [0, 0], 0, (1, 1, 7, 1))
    assert y.reshape(-1).tolist() == [-1, -1, -2, -2, -4, 7, 0]


def test_conv_relu_and_relu6():
    x = np.array([100, 50, -3, 97, 127], np.int8).reshape(1, 1, 5, 1)
    w = np.array([[[[1]]]], np.int8)
    y = evaluate("conv2d-fix", [x, w], conv_attrs((1, 1), nonlinear="RELU6"), [4, 0], 4,
                 (1, 1, 5, 1))
    assert y.reshape(-1).tolist() == [96, 50, 0, 96, 96]
    y = evaluate("conv2d-fix", [x, w], conv_attrs((1, 1), nonlinear="RELU6"), [3, 0], 3,
                 (1, 1, 5, 1))
    assert y.reshape(-1).tolist() == [96, 50, 0, 96, 96]       # fp_out < 4: still 96
    y = evaluate("conv2d-fix", [x, w], conv_attrs((1, 1), nonlinear="RELU6"), [5, 0], 5,
                 (1, 1, 5, 1))
    assert y.reshape(-1).tolist() == [100, 50, 0, 97, 127]     # fp_out > 4: no clamp at 96
    y = evaluate("conv2d-fix", [x, w], conv_attrs((1, 1), nonlinear="RELU"), [5, 0], 5,
                 (1, 1, 5, 1))
    assert y.reshape(-1).tolist() == [100, 50, 0, 97, 127]


CONV_CASES = [
    # (N, H, W, C, O, kernel_hw, stride_hw, dil_hw, pad_tblr, fp_in, fp_w, fp_b, fp_out, nonlinear)
    (1, 9, 11, 3, 5, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 4, 6, 7, 5, "NONE"),
    (2, 10, 7, 4, 6, (3, 3), (2, 2), (1, 1), (1, 0, 1, 0), 2, 7, 6, 3, "RELU"),
    (1, 12, 12, 2, 4, (3, 2), (1, 2), (2, 1), (2, 2, 0, 1), -1, 8, 4, 2, "NONE"),
    (1, 8, 9, 5, 3, (1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 5, 5, 8, 8, "RELU"),
    (1, 13, 13, 4, 7, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2), 3, 7, 9, 4, "NONE"),
    (1, 7, 6, 3, 2, (2, 3), (3, 2), (1, 2), (0, 1, 1, 0), 0, 4, 3, 0, "RELU"),
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_vs_onnxruntime(case):
    N, H, W, C, O, (kh, kw), (sh, sw), (dh, dw), (pt, pb, pl, pr), fi, fw, fb, fo, nl = case
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    x = rand_i8(rng, (N, H, W, C))
    w = rand_i8(rng, (O, kh, kw, C))
    b = rand_i8(rng, (O,))
    assert fb <= fi + fw + 1                     # bias representable in float32 Conv exactly
    oh = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (W + pl + pr - dw * (kw - 1) - 1) // sw + 1
    attrs = conv_attrs((kh, kw), (sh, sw), (dh, dw), (pt, pb, pl, pr), nonlinear=nl)
    y = evaluate("conv2d-fix", [x, w, b], attrs, [fi, fw, fb], fo, (N, oh, ow, O), name="c")
    f = run_onnx("Conv", {"x": nhwc_to_nchw(x * 2.0 ** -fi),
                          "w": nhwc_to_nchw(w * 2.0 ** -fw),
                          "b": b * 2.0 ** -fb}, 4,
                 kernel_shape=[kh, kw], strides=[sh, sw], dilations=[dh, dw],
                 pads=[pt, pl, pb, pr])
    v = nchw_to_nhwc(f).astype(np.float64) * 2.0 ** fo
    if nl == "RELU":
        v = np.maximum(v, 0)
    exp = round_half_up_sat(v)
    assert y.shape == exp.shape
    np.testing.assert_array_equal(y, exp)


def test_conv_grouped_vs_onnxruntime():
    rng = np.random.default_rng(7)
    x = rand_i8(rng, (1, 6, 6, 4))
    w = rand_i8(rng, (6, 3, 3, 2))
    b = rand_i8(rng, (6,))
    attrs = conv_attrs((3, 3), pad_tblr=(1, 1, 1, 1), group=2)
    y = evaluate("conv2d-fix", [x, w, b], attrs, [3, 6, 7], 3, (1, 6, 6, 6))
    f = run_onnx("Conv", {"x": nhwc_to_nchw(x * 2.0 ** -3), "w": nhwc_to_nchw(w * 2.0 ** -6),
                          "b": b * 2.0 ** -7}, 4, kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2)
    np.testing.assert_array_equal(y, round_half_up_sat(nchw_to_nhwc(f) * 2.0 ** 3))


def test_conv_no_bias_and_negative_shift_cut():
    # fp_in 1, fp_w 1, fp_out 3: sc = -1 -> result acc * 2 (left shift), saturating
    x = np.array([1, 2, -3, 40, -70], np.int8).reshape(1, 1, 5, 1)
    w = np.array([[[[3]]]], np.int8)
    y = evaluate("conv2d-fix", [x, w], conv_attrs((1, 1)), [1, 1], 3, (1, 1, 5, 1))
    assert y.reshape(-1).tolist() == [6, 12, -18, 127, -128]


def test_conv_large_layer_shape_and_values():
    # a PointPillars-like 1x1 layer (smaller): fp_in 6, fp_w 3, fp_b 7, fp_out 5, RELU
    rng = np.random.default_rng(3)
    x = rand_i8(rng, (1, 300, 100, 4))
    w = rand_i8(rng, (64, 1, 1, 4))
    b = rand_i8(rng, (64,))
    y = evaluate("conv2d-fix", [x, w, b], conv_attrs((1, 1), nonlinear="RELU"), [6, 3, 7], 5,
                 (1, 300, 100, 64))
    # independent: v = (acc + bias*2^(6+3-7)) / 2^(6+3-5), exact in float64
    acc = np.einsum("nhwc,oc->nhwo", x.astype(np.float64), w[:, 0, 0, :].astype(np.float64))
    v = (acc + b.astype(np.float64) * 4) / 16
    np.testing.assert_array_equal(y, round_half_up_sat(np.maximum(v, 0)))


# --------------------------------------------------------------------------------------------------
# depthwise and transposed conv
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mult,stride,pad", [(1, 1, (1, 1, 1, 1)), (1, 2, (1, 0, 1, 0)),
                                             (2, 1, (0, 1, 2, 0))])
def test_depthwise_vs_onnxruntime(mult, stride, pad):
    rng = np.random.default_rng(11 + mult + stride)
    C, H, W = 5, 9, 8
    x = rand_i8(rng, (1, H, W, C))
    w = rand_i8(rng, (mult, 3, 3, C))
    b = rand_i8(rng, (C * mult,))
    pt, pb, pl, pr = pad
    oh = (H + pt + pb - 3) // stride + 1
    ow = (W + pl + pr - 3) // stride + 1
    attrs = conv_attrs((3, 3), (stride, stride), pad_tblr=pad, nonlinear="RELU", group=C)
    y = evaluate("depthwise-conv2d-fix", [x, w, b], attrs, [2, 6, 5], 2, (1, oh, ow, C * mult))
    # ONNX grouped conv: output channel c*mult + m reads input channel c
    w_onnx = np.zeros((C * mult, 1, 3, 3))
    for c in range(C):
        for m in range(mult):
            w_onnx[c * mult + m, 0] = w[m, :, :, c]
    f = run_onnx("Conv", {"x": nhwc_to_nchw(x * 2.0 ** -2), "w": w_onnx * 2.0 ** -6,
                          "b": b * 2.0 ** -5}, 4, kernel_shape=[3, 3], strides=[stride, stride],
                 pads=[pt, pl, pb, pr], group=C)
    exp = round_half_up_sat(np.maximum(nchw_to_nhwc(f) * 2.0 ** 2, 0))
    np.testing.assert_array_equal(y, exp)


def test_depthwise_hand_computed():
    # 2x2 input, 1 channel, 2x2 kernel, no pad: acc = 1*1 + 2*(-1) + 3*2 + 4*0 = 5
    x = np.array([1, 2, 3, 4], np.int8).reshape(1, 2, 2, 1)
    w = np.array([1, -1, 2, 0], np.int8).reshape(1, 2, 2, 1)
    b = np.array([-3], np.int8)
    # fp_in 0, fp_w 1, fp_b 1, fp_out 0: v = (5 + (-3)) / 2 = 1
    y = evaluate("depthwise-conv2d-fix", [x, w, b], conv_attrs((2, 2)), [0, 1, 1], 0, (1, 1, 1, 1))
    assert y.item() == 1
    b = np.array([-2], np.int8)                   # (5-2)/2 = 1.5 -> 2
    y = evaluate("depthwise-conv2d-fix", [x, w, b], conv_attrs((2, 2)), [0, 1, 1], 0, (1, 1, 1, 1))
    assert y.item() == 2


TCONV_CASES = [
    # (H, W, C, O, k, s, pad, fi, fw, fb, fo)
    (5, 4, 3, 4, 2, 2, 0, 4, 6, 7, 4),      # PointPillars deconv2
    (3, 4, 2, 3, 4, 4, 0, 4, 8, 6, 4),      # PointPillars deconv3
    (4, 4, 3, 2, 1, 1, 0, 4, 5, 5, 4),      # PointPillars deconv1 (1x1)
    (5, 6, 2, 3, 3, 2, 1, 2, 7, 5, 3),
]


@pytest.mark.parametrize("case", TCONV_CASES)
def test_transposed_conv_vs_onnxruntime(case):
    H, W, C, O, k, s, p, fi, fw, fb, fo = case
    rng = np.random.default_rng(sum(case))
    x = rand_i8(rng, (1, H, W, C))
    w = rand_i8(rng, (O, k, k, C))             # XIR OHWI, applied unflipped (§7.9)
    b = rand_i8(rng, (O,))
    oh, ow = (H - 1) * s + k - 2 * p, (W - 1) * s + k - 2 * p
    attrs = conv_attrs((k, k), (s, s), pad_tblr=(p, p, p, p), nonlinear="RELU")
    y = evaluate("transposed-conv2d-fix", [x, w, b], attrs, [fi, fw, fb], fo, (1, oh, ow, O))
    # ONNX ConvTranspose weight [C_in, C_out, kh, kw] is the spatially flipped XIR kernel
    w_onnx = np.ascontiguousarray(w[:, ::-1, ::-1, :].transpose(3, 0, 1, 2))
    f = run_onnx("ConvTranspose", {"x": nhwc_to_nchw(x * 2.0 ** -fi), "w": w_onnx * 2.0 ** -fw,
                                   "b": b * 2.0 ** -fb}, 4,
                 kernel_shape=[k, k], strides=[s, s], pads=[p, p, p, p])
    exp = round_half_up_sat(np.maximum(nchw_to_nhwc(f) * 2.0 ** fo, 0))
    assert exp.shape == y.shape
    np.testing.assert_array_equal(y, exp)


def test_transposed_depthwise_vs_onnxruntime():
    rng = np.random.default_rng(5)
    C = 3
    x = rand_i8(rng, (1, 4, 5, C))
    w = rand_i8(rng, (1, 2, 2, C))
    b = rand_i8(rng, (C,))
    attrs = conv_attrs((2, 2), (2, 2))
    y = evaluate("transposed-depthwise-conv2d-fix", [x, w, b], attrs, [3, 6, 6], 3, (1, 8, 10, C))
    w_onnx = np.ascontiguousarray(w[:, ::-1, ::-1, :].transpose(3, 0, 1, 2))   # [C, 1, kh, kw]
    f = run_onnx("ConvTranspose", {"x": nhwc_to_nchw(x * 2.0 ** -3), "w": w_onnx * 2.0 ** -6,
                                   "b": b * 2.0 ** -6}, 4,
                 kernel_shape=[2, 2], strides=[2, 2], group=C)
    np.testing.assert_array_equal(y, round_half_up_sat(nchw_to_nhwc(f) * 2.0 ** 3))


# --------------------------------------------------------------------------------------------------
# pool-fix
# --------------------------------------------------------------------------------------------------

def pool_attrs(typ, kernel_hw, stride_hw, pad_tblr=(0, 0, 0, 0), **extra):
    pt, pb, pl, pr = pad_tblr
    a = {"type": typ, "kernel": [kernel_hw[1], kernel_hw[0]], "stride": [stride_hw[1], stride_hw[0]],
         "pad": [pl, pr, pt, pb]}
    a.update(extra)
    return a


def test_avg_pool_factor_table_and_search():
    assert avg_pool_factor(3, 3) == (7, 6)
    assert avg_pool_factor(5, 5) == (10, 8)
    assert avg_pool_factor(6, 6) == (7, 8)
    assert avg_pool_factor(7, 7) == (21, 10)
    assert avg_pool_factor(14, 14) == (21, 12)
    assert avg_pool_factor(2, 2) == (1, 2)            # exact 1/4
    assert avg_pool_factor(4, 4) == (1, 4)
    assert avg_pool_factor(1, 1) == (1, 0)
    # 1x3: s = 0..8; best |N/2^s - 1/3| at s = 8: N = round(256/3) = 85 (err 1/768)
    assert avg_pool_factor(1, 3) == (85, 8)
    # 1x5: s = 8 gives 51/256 (err 1/1280); s = 9 gives 102/512, the same error -> first kept
    assert avg_pool_factor(1, 5) == (51, 8)


def test_avg_pool_3x3_divisor_7_over_64():
    x = np.zeros((1, 3, 3, 2), np.int8)
    x[0, :, :, 0] = np.array([[5, 5, 5], [5, 5, 5], [5, 5, 1]])        # sum 41
    x[0, :, :, 1] = np.array([[-5, -5, -5], [-5, -5, -5], [-5, -5, -1]])  # sum -41
    y = evaluate("pool-fix", [x], pool_attrs("AVG", (3, 3), (1, 1)), [3], 3, (1, 1, 1, 2))
    # 41*7/64 = 4.484 -> 4 (the exact mean 4.556 would round to 5); -4.484 -> -4
    assert y.reshape(-1).tolist() == [4, -4]
    # fix point +1: 8.97 -> 9
    y = evaluate("pool-fix", [x], pool_attrs("AVG", (3, 3), (1, 1)), [3], 4, (1, 1, 1, 2))
    assert y.reshape(-1).tolist() == [9, -9]


def test_avg_pool_7x7_global_divisor_21_over_1024():
    x = np.zeros((1, 7, 7, 1), np.int8)
    x.reshape(-1)[:44] = 5                     # sum 220
    # 220*21/1024 = 4.5117 -> 5 (the exact mean 4.49 would round to 4)
    y = evaluate("pool-fix", [x], {"type": "AVG", "kernel": [7, 7], "stride": [7, 7]}, [2], 2,
                 (1, 1, 1, 1))
    assert y.item() == 5
    y = evaluate("pool-fix", [x], {"type": "AVG", "global": True, "kernel": [7, 7],
                                   "stride": [1, 1]}, [2], 2, (1, 1, 1, 1))
    assert y.item() == 5
    # fix point +2: 220*21/1024*4 = 18.05 -> 18; -1: 2.256 -> 2
    y = evaluate("pool-fix", [x], {"type": "AVG", "global": True}, [2], 4, (1, 1, 1, 1))
    assert y.item() == 18
    y = evaluate("pool-fix", [x], {"type": "AVG", "global": True}, [2], 1, (1, 1, 1, 1))
    assert y.item() == 2


def test_avg_pool_2x2_exact_quarter_ties_and_padding():
    x = np.array([[1, 1, 3, -4], [2, 2, 0, -2]], np.int8).reshape(1, 2, 4, 1)
    y = evaluate("pool-fix", [x], pool_attrs("AVG", (2, 2), (2, 2)), [0], 0, (1, 1, 2, 1))
    # 6/4 = 1.5 -> 2 ; -3/4 = -0.75 -> -1
    assert y.reshape(-1).tolist() == [2, -1]
    x2 = np.array([[2, 1], [0, 0]], np.int8).reshape(1, 2, 2, 1)
    y = evaluate("pool-fix", [x2], pool_attrs("AVG", (2, 2), (1, 1), (1, 0, 1, 0)), [0], 0,
                 (1, 2, 2, 1))
    # padded windows count the pad (0) with the full-kernel divisor:
    # [pad,pad;pad,2]=2/4=0.5->1, [pad,pad;2,1]=3/4->1, [pad,2;pad,0]=2/4->1, [2,1;0,0]=3/4->1
    assert y.reshape(-1).tolist() == [1, 1, 1, 1]
    x3 = np.array([[-2, 0], [0, 0]], np.int8).reshape(1, 2, 2, 1)
    y = evaluate("pool-fix", [x3], pool_attrs("AVG", (2, 2), (1, 1), (1, 0, 1, 0)), [0], 0,
                 (1, 2, 2, 1))
    assert y.reshape(-1).tolist() == [0, 0, 0, 0]       # -0.5 -> 0 (ties towards +inf)


@pytest.mark.parametrize("k,s,pad,ceil", [(5, 1, 2, 0), (9, 1, 4, 0), (13, 1, 6, 0), (2, 2, 0, 0),
                                          (3, 2, 1, 0), (2, 2, 0, 1), (3, 2, 0, 1)])
def test_max_pool_vs_onnxruntime(k, s, pad, ceil):
    rng = np.random.default_rng(k * 10 + s + ceil)
    H, W, C = 13, 11, 6
    x = rand_i8(rng, (1, H, W, C))
    f = run_onnx("MaxPool", {"x": nhwc_to_nchw(x)}, 4, kernel_shape=[k, k], strides=[s, s],
                 pads=[pad] * 4, ceil_mode=ceil)
    exp = nchw_to_nhwc(f).astype(np.int8)
    y = evaluate("pool-fix", [x], pool_attrs("MAX", (k, k), (s, s), (pad,) * 4), [5], 5, exp.shape)
    np.testing.assert_array_equal(y, exp)


def test_max_pool_1x100_and_rescale():
    rng = np.random.default_rng(1)
    x = rand_i8(rng, (1, 20, 100, 8))
    attrs = {"type": "MAX", "kernel": [100, 1], "stride": [1, 1], "pad": [0, 0, 0, 0]}
    y = evaluate("pool-fix", [x], attrs, [5], 5, (1, 20, 1, 8))
    np.testing.assert_array_equal(y, x.max(axis=2, keepdims=True))
    # fix point -1: max/2 rounded half up
    y = evaluate("pool-fix", [x], attrs, [5], 4, (1, 20, 1, 8))
    np.testing.assert_array_equal(y, np.floor(x.max(axis=2, keepdims=True) / 2 + 0.5).astype(np.int8))
    # hand: [3, -3] -> 1.5 -> 2 ; -1.5 -> -1
    x2 = np.array([3, -3], np.int8).reshape(1, 1, 1, 2)
    y = evaluate("pool-fix", [x2], {"type": "MAX", "kernel": [1, 1], "stride": [1, 1]}, [3], 2,
                 (1, 1, 1, 2))
    assert y.reshape(-1).tolist() == [2, -1]


# --------------------------------------------------------------------------------------------------
# eltwise-fix
# --------------------------------------------------------------------------------------------------

def eltwise_add_dpu_reference(xs, fps, fo, relu=False):
    """Spec §6.7 written independently with Fractions: t_i = floor(x_i*4/2^(fp_i-min)),
    value = sum(t)/4 * 2^(fo-min), rounded half up, saturated."""
    m = min(fps)
    out = []
    for vals in zip(*[x.reshape(-1).tolist() for x in xs]):
        S = sum(floor(Fraction(v * 4, 2 ** (fp - m))) for v, fp in zip(vals, fps))
        v = Fraction(S, 4) * Fraction(2) ** (fo - m)
        if relu:
            v = max(v, Fraction(0))
        out.append(min(127, max(-128, floor(v + Fraction(1, 2)))))
    return np.array(out, np.int8).reshape(xs[0].shape)


def test_eltwise_add_hand_computed():
    a = np.array([3, -3, 100, 1], np.int8).reshape(1, 1, 4, 1)
    b = np.array([1, 1, 100, -2], np.int8).reshape(1, 1, 4, 1)
    # same fix point 4 -> out 4
    y = evaluate("eltwise-fix", [a, b], {"type": "ADD", "nonlinear": "NONE"}, [4, 4], 4, a.shape)
    assert y.reshape(-1).tolist() == [4, -2, 127, -1]
    # spread 1: a fp 5, b fp 4, out 4: a/2 + b: 2.5->3, -0.5->0, 150->127, -1.5->-1
    y = evaluate("eltwise-fix", [a, b], {"type": "ADD"}, [5, 4], 4, a.shape)
    assert y.reshape(-1).tolist() == [3, 0, 127, -1]
    # spread 2: a fp 6: a/4 + b: 1.75->2, 0.25->0, 125, -1.75->-2 ; with RELU
    y = evaluate("eltwise-fix", [a, b], {"type": "ADD", "nonlinear": "RELU"}, [6, 4], 4, a.shape)
    assert y.reshape(-1).tolist() == [2, 0, 125, 0]


def test_eltwise_add_spread_above_two_uses_dpu_2bit_floor():
    # a fp 7, b fp 4, out fp 6: the DPU floors a*4/8 before adding:
    # a=1: floor(0.5)=0 -> 0 (7-bit reference: 1/128*64 = 0.5 -> 1)
    # a=-1: floor(-0.5)=-1 -> -1/4*4 = -1 (7-bit reference: -0.5 -> 0)
    a = np.array([1, -1, 5, -5], np.int8).reshape(1, 1, 1, 4)
    b = np.zeros_like(a)
    y = evaluate("eltwise-fix", [a, b], {"type": "ADD"}, [7, 4], 6, a.shape)
    # a=5: floor(2.5)=2 -> 2/4*4 = 2 (exact 2.5 -> 3); a=-5: floor(-2.5)=-3 -> -3
    assert y.reshape(-1).tolist() == [0, -1, 2, -3]


@pytest.mark.parametrize("fps,fo", [((4, 4), 4), ((5, 4), 4), ((4, 6), 3), ((3, 5), 6),
                                    ((7, 3), 5), ((2,), 1), ((2,), 4), ((4, 5, 6), 4)])
def test_eltwise_add_random_vs_fraction_model(fps, fo):
    rng = np.random.default_rng(sum(fps) * 7 + fo)
    xs = [rand_i8(rng, (1, 3, 4, 5)) for _ in fps]
    for relu in (False, True):
        y = evaluate("eltwise-fix", xs, {"type": "ADD", "nonlinear": "RELU" if relu else "NONE"},
                     list(fps), fo, xs[0].shape)
        np.testing.assert_array_equal(y, eltwise_add_dpu_reference(xs, fps, fo, relu))


def test_eltwise_mul():
    a = np.array([3, -3, 100, 7], np.int8).reshape(1, 1, 1, 4)
    b = np.array([5, 5, 100, -1], np.int8).reshape(1, 1, 1, 4)
    # fp 4 * fp 3 -> out 4: product / 2^3: 15/8 = 1.875 -> 2; -1.875 -> -2; 1250 -> 127; -0.875 -> -1
    y = evaluate("eltwise-fix", [a, b], {"type": "MUL"}, [4, 3], 4, a.shape)
    assert y.reshape(-1).tolist() == [2, -2, 127, -1]


def test_eltwise_leaky_relu_type():
    # §7.7: slope = prelu_in / 2^prelu_shift = 26/256; fp_in 4 -> fp_out 4
    x = np.array([-5, -15, 9, 0], np.int8).reshape(1, 1, 1, 4)
    y = evaluate("eltwise-fix", [x], {"type": "LEAKY-RELU", "prelu_in": 26, "prelu_shift": 8},
                 [4], 4, x.shape)
    assert y.reshape(-1).tolist() == [-1, -2, 9, 0]
    # fp_out 5: positive doubled, negative -5*26/128 = -1.016 -> -1
    y = evaluate("eltwise-fix", [x], {"type": "LEAKY-RELU", "prelu_in": 26, "prelu_shift": 8},
                 [4], 5, x.shape)
    assert y.reshape(-1).tolist() == [-1, -3, 18, 0]


# --------------------------------------------------------------------------------------------------
# data movement ops
# --------------------------------------------------------------------------------------------------

def test_concat_rescale():
    a = np.array([3, -3, 5, 40], np.int8).reshape(1, 1, 2, 2)        # fp 5
    b = np.array([1, 2, 3, 4], np.int8).reshape(1, 1, 2, 2)          # fp 4
    y = evaluate("concat-fix", [a, b], {"axis": 3}, [5, 4], 4, (1, 1, 2, 4))
    # a/2: 1.5 -> 2, -1.5 -> -1, 2.5 -> 3, 20
    assert y.reshape(2, 4).tolist() == [[2, -1, 1, 2], [3, 20, 3, 4]]
    y = evaluate("concat-fix", [a, b], {"axis": -1}, [5, 4], 6, (1, 1, 2, 4))
    # a*2, b*4 (saturating)
    assert y.reshape(2, 4).tolist() == [[6, -6, 4, 8], [10, 80, 12, 16]]
    y = evaluate("concat-fix", [a, b], {"axis": 1}, [5, 5], 5, (1, 2, 2, 2))
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=1))


def test_upsample_nearest():
    x = np.array([[1, 2], [3, -3]], np.int8).reshape(1, 2, 2, 1)
    attrs = {"mode": "NEAREST", "scale": [2.0, 2.0], "align_corners": False,
             "half_pixel_centers": False}
    y = evaluate("upsample-fix", [x], attrs, [5], 5, (1, 4, 4, 1))
    assert y.reshape(4, 4).tolist() == [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, -3, -3], [3, 3, -3, -3]]
    y = evaluate("upsample-fix", [x], attrs, [5], 4, (1, 4, 4, 1))
    # /2 rounded half up: 0.5 -> 1, 1, 1.5 -> 2, -1.5 -> -1
    assert y.reshape(4, 4)[::2, ::2].tolist() == [[1, 1], [2, -1]]
    rng = np.random.default_rng(2)
    x = rand_i8(rng, (1, 3, 5, 4))
    y = evaluate("upsample-fix", [x], attrs, [3], 3, (1, 6, 10, 4))
    f = run_onnx("Resize", {"x": nhwc_to_nchw(x), "r": np.zeros(0, np.float32),
                            "sc": np.array([1, 1, 2, 2], np.float32)}, 4,
                 mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    np.testing.assert_array_equal(y, nchw_to_nhwc(f).astype(np.int8))


def test_tile_fix_reverse_depth_to_space():
    x = np.array([10, 20, 30, 40], np.int8).reshape(1, 1, 1, 4)
    y = evaluate("tile-fix", [x], {"reverse": True, "stride": 2}, [3], 3, (1, 2, 2, 1))
    assert y.reshape(2, 2).tolist() == [[10, 20], [30, 40]]
    rng = np.random.default_rng(4)
    x = rand_i8(rng, (1, 3, 4, 12))
    y = evaluate("tile-fix", [x], {"reverse": True, "stride": 2}, [3], 3, (1, 6, 8, 3))
    f = run_onnx("DepthToSpace", {"x": nhwc_to_nchw(x)}, 4, blocksize=2, mode="DCR")
    np.testing.assert_array_equal(y, nchw_to_nhwc(f).astype(np.int8))
    # reverse false is the inverse (space-to-depth)
    z = evaluate("tile-fix", [y], {"reverse": False, "stride": 2}, [3], 3, (1, 3, 4, 12))
    np.testing.assert_array_equal(z, x)


def test_hard_sigmoid_tf2_layer():
    # tf2_custom_op: fp_in 2, fp_out 7, hsigmoid_in 2, shift_hsigmoid 9
    # y = round(max(0, x*2731 + 3*2731*4) / 512)
    x = np.array([0, -12, 12, 1, -13, -1, 4, 100], np.int8).reshape(1, 1, 1, 8)
    attrs = {"hsigmoid_in": 2, "shift_hsigmoid": 9}
    y = evaluate("hard-sigmoid-fix", [x], attrs, [2], 7, x.shape)
    # 32772/512=64.008->64, 0, 65544/512=128.02->127, 35503/512=69.34->69, 0,
    # 30041/512=58.67->59, 43696/512=85.34->85, huge->127
    assert y.reshape(-1).tolist() == [64, 0, 127, 69, 0, 59, 85, 127]
    # attributes absent: derived from the fix points (hsigmoid_in = fp_in, shift = 14+fp_in-fp_out)
    y2 = evaluate("hard-sigmoid-fix", [x], {}, [2], 7, x.shape)
    np.testing.assert_array_equal(y2, y)


def test_reshape_flatten_transpose_slice():
    x = np.arange(24, dtype=np.int8).reshape(1, 2, 3, 4)
    y = evaluate("reshape-fix", [x], {"shape": [1, 24]}, [2], 2, (1, 24))
    assert y.dtype == np.int8 and y.reshape(-1).tolist() == list(range(24))
    y = evaluate("flatten", [x.astype(np.float32)], {"start_axis": 1, "end_axis": -1}, [None], None,
                 (1, 24))
    assert y.dtype == np.float32 and y.reshape(-1).tolist() == list(range(24))
    y = evaluate("transpose", [x.astype(np.float32)], {"order": [0, 3, 1, 2]}, [None], None,
                 (1, 4, 2, 3))
    assert y[0, 1, 1, 2] == x[0, 1, 2, 1]
    y = evaluate("strided_slice-fix", [x], {"begin": [0, 1, 0, 1], "end": [1, 2, 3, 4],
                                            "strides": [1, 1, 2, 2]}, [2], 2, (1, 1, 2, 2))
    assert y.reshape(-1).tolist() == [13, 15, 21, 23]


# --------------------------------------------------------------------------------------------------
# float <-> fix and float ops
# --------------------------------------------------------------------------------------------------

def test_float2fix_round_modes():
    x = np.array([2.5, -2.5, 0.5, -0.5, 1.5, 2.3, -2.6, 200.0, -200.0], np.float32)
    base = {"fix_point": 0, "bit_width": 8, "if_signed": True}
    y = evaluate("float2fix", [x], dict(base, round_mode="DPU_ROUND"), [None], 0, x.shape)
    assert y.dtype == np.int8
    assert y.tolist() == [3, -2, 1, 0, 2, 2, -3, 127, -128]
    y = evaluate("float2fix", [x], dict(base, round_mode="PY3_ROUND"), [None], 0, x.shape)
    assert y.tolist() == [2, -2, 0, 0, 2, 2, -3, 127, -128]
    y = evaluate("float2fix", [x], dict(base, round_mode="STD_ROUND"), [None], 0, x.shape)
    assert y.tolist() == [3, -3, 1, -1, 2, 2, -3, 127, -128]
    # fix point 2: 0.625*4 = 2.5 -> 3; -0.375*4 = -1.5 -> -1
    y = evaluate("float2fix", [np.array([0.625, -0.375], np.float32)],
                 dict(base, fix_point=2, round_mode="DPU_ROUND"), [None], 2, (2,))
    assert y.tolist() == [3, -1]


def test_fix_and_fix2float():
    x = np.array([0.625, -0.375, 100.0], np.float32)
    y = evaluate("fix", [x], {"fix_point": 2, "bit_width": 8, "if_signed": True,
                              "round_mode": "DPU_ROUND"}, [None], None, (3,))
    assert y.dtype == np.float32 and y.tolist() == [0.75, -0.25, 31.75]
    q = np.array([-128, -1, 0, 3, 127], np.int8)
    y = evaluate("fix2float", [q], {"fix_point": 3, "bit_width": 8, "if_signed": True}, [3], None,
                 (5,))
    assert y.dtype == np.float32 and y.tolist() == [-16.0, -0.125, 0.0, 0.375, 15.875]
    y = evaluate("fix2float", [q], {}, [-2], None, (5,))          # fix point from the tensor
    assert y.tolist() == [-512.0, -4.0, 0.0, 12.0, 508.0]


def test_softmax_vs_onnxruntime():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((2, 3, 10)) * 4).astype(np.float32)
    for axis in (-1, 1):
        y = evaluate("softmax", [x], {"axis": axis}, [None], None, x.shape)
        f = run_onnx("Softmax", {"x": x}, 3, axis=axis)
        assert y.dtype == np.float32
        np.testing.assert_allclose(y, f, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(y.sum(axis=axis), 1.0, rtol=1e-5)


def test_sigmoid_and_relu():
    x = np.array([-2.0, 0.0, 3.0], np.float32)
    y = evaluate("sigmoid", [x], {}, [None], None, (3,))
    np.testing.assert_allclose(y, [0.11920292, 0.5, 0.95257413], rtol=1e-6)
    assert evaluate("relu", [x], {}, [None], None, (3,)).tolist() == [0.0, 0.0, 3.0]


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------

def test_unknown_op_raises_referror():
    with pytest.raises(RefError) as ei:
        evaluate("PPScatterV2", [np.zeros(3, np.float32)], {}, [None], None, (3,), name="scatter")
    msg = str(ei.value)
    assert "PPScatterV2" in msg and "scatter" in msg and "register" in msg
    assert isinstance(ei.value, ValueError)
    assert "PPScatterV2" not in SUPPORTED


def test_bad_inputs_raise_referror_naming_the_op():
    x = np.zeros((1, 4, 4, 3), np.int8)
    w = np.zeros((2, 3, 3, 4), np.int8)                  # wrong input channel count
    with pytest.raises(RefError, match="conv2d-fix 'c1'"):
        evaluate("conv2d-fix", [x, w], conv_attrs((3, 3)), [0, 0], 0, (1, 2, 2, 2), name="c1")
    with pytest.raises(RefError, match="fix point"):
        evaluate("conv2d-fix", [x, np.zeros((2, 3, 3, 3), np.int8)], conv_attrs((3, 3)), [0, None],
                 0, (1, 2, 2, 2))
    with pytest.raises(RefError, match="shape"):
        evaluate("concat-fix", [x, x], {"axis": 3}, [0, 0], 0, (1, 4, 4, 5))
    with pytest.raises(RefError, match="nonlinear"):
        evaluate("conv2d-fix", [x, np.zeros((2, 1, 1, 3), np.int8)],
                 conv_attrs((1, 1), nonlinear="HSWISH"), [0, 0], 0, (1, 4, 4, 2))


def test_supported_set():
    for op in ("conv2d-fix", "depthwise-conv2d-fix", "transposed-conv2d-fix", "pool-fix",
               "eltwise-fix", "concat-fix", "upsample-fix", "hard-sigmoid-fix", "tile-fix",
               "reshape-fix", "reshape", "flatten", "strided_slice", "strided_slice-fix",
               "transpose", "fix2float", "float2fix", "fix", "softmax", "sigmoid"):
        assert op in SUPPORTED


# --------------------------------------------------------------------------------------------------
# every supported op of the real models evaluates with its real attributes, shapes and fix points
# --------------------------------------------------------------------------------------------------

def _attr_value(a):
    v = getattr(a, a.WhichOneof("value"))
    if hasattr(v, "value"):
        v = v.value
    if isinstance(v, (bytes, str, bool, int, float)):
        return v
    try:
        return list(v)
    except TypeError:
        return v


def _tensor_fix(t):
    for key in ("fix_point", "quant_out_quantize_pos"):
        if key in t.tensor_attr:
            return _attr_value(t.tensor_attr[key])
    return None


@pytest.mark.parametrize("name", [
    "dpu_mnist_classifier", "tf2_custom_op", "yolox_nano_b512",
    pytest.param("pointpillars_custom_op", marks=pytest.mark.slow)])
def test_real_model_ops_evaluate(name):
    from opendpu.compiler.xir import xir_pb2
    from tests.conftest import model_path
    g = xir_pb2.Graph()
    with open(model_path(name), "rb") as f:
        g.ParseFromString(f.read())
    ops = {op.op_name: op for op in g.op_node}
    rng = np.random.default_rng(0)
    seen = set()
    for op in g.op_node:
        if op.op_type not in SUPPORTED:
            assert op.op_type in ("const", "const-fix", "data", "data-fix", "Mylayer", "PPScatterV2")
            continue
        inputs, fixes = [], []
        for arg in op.args:
            for producer in arg.arg_ops:
                t = ops[producer].output_tensor
                shape = tuple(t.tensor_dim)
                if t.data_type == 4:                                  # FLOAT
                    inputs.append(rng.standard_normal(shape).astype(np.float32))
                    fixes.append(None)
                else:
                    inputs.append(rand_i8(rng, shape))
                    fixes.append(_tensor_fix(t))
        attrs = {k: _attr_value(v) for k, v in op.op_attr.items()}
        out_t = op.output_tensor
        y = evaluate(op.op_type, inputs, attrs, fixes, _tensor_fix(out_t), tuple(out_t.tensor_dim),
                     op.op_name)
        assert y.shape == tuple(out_t.tensor_dim)
        assert y.dtype == (np.float32 if out_t.data_type == 4 else np.int8), op.op_type
        seen.add(op.op_type)
    assert seen
