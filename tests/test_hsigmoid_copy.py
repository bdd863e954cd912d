"""HardSigmoid(alpha, 0.5) whose producer conv has other readers (issue 30): Paddle's HardSigmoid(0.2, 0.5) is the
DPU's hard-sigmoid of 1.2·x. When the producer conv feeds only the gate, the 1.2 folds into its weights and bias
(tests/test_real_models.py); when it also feeds another op — `x·hsig(x)` as in hard-swish, or the SE product —
`prepare` adds a copy of the conv, weights and bias times 1.2 (`<conv>_hsig_scaled`), that feeds only the
hard-sigmoid, so the gate stays on the DPU (quant/prepare.py `_scaled_copy`). A ReLU on the producer commutes with
1.2 and is copied with it; a ReLU6 does not, and the gate stays on the CPU with the reason. A dense producer (a conv
under a reshape to 2-D) is copied with its reshape.

Checked through the library: the prepared float graph equals onnxruntime; quantize + compile for B4096 put every op
on the DPU (the quantizer's coverage and the compiled meta's); the compiled program on `sim` equals the `ref`
backend bit for bit (every DPU subgraph output and the model output) and the quantized graph on `ref`; the INT8
output is close to onnxruntime float (output SQNR over 16 held-out inputs, floor below the measured value).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper

pytest.importorskip("onnxruntime")

B4096 = "DPUCZDX8G_ISA1_B4096"
# INT8 output SQNR of the compiled model (ref) against onnxruntime float on the 16 held-out inputs, measured with
# model seeds 0..3: 26.1 / 25.9 / 26.9 / 30.9 dB (plain), 27.3 / 27.2 / 28.6 / 31.9 dB (ReLU on the producer); this
# test uses seed 0. The floor is ~4 dB under the smallest.
SQNR_FLOOR_DB = 22.0


def hswish_model(act: str | None = None, seed: int = 0) -> onnx.ModelProto:
    """1x3x8x8: conv3x3 + ReLU -> 1x1 conv `fc` (bias) [-> `act`: Relu or Clip(0, 6)] -> HardSigmoid(0.2, 0.5)
    `hsig` and Mul(fc, hsig) (`fc` read twice: a hard-swish with Paddle's slope) -> 1x1 conv -> y [1, 4, 8, 8]."""
    r = np.random.default_rng(seed)
    w = {"w1": r.normal(0, .4, (8, 3, 3, 3)), "b1": r.normal(0, .1, 8), "w2": r.normal(0, .3, (8, 8, 1, 1)),
         "b2": r.normal(0, .5, 8), "w3": r.normal(0, .3, (4, 8, 1, 1))}
    N = oh.make_node
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             N("Relu", ["c1"], ["r1"], name="relu1"),
             N("Conv", ["r1", "w2", "b2"], ["fc"], name="fc")]
    t = "fc"
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()]
    if act == "Relu":
        nodes.append(N("Relu", ["fc"], ["fa"], name="fc_relu"))
        t = "fa"
    elif act == "Relu6":
        inits += [numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
        nodes.append(N("Clip", ["fc", "lo", "hi"], ["fa"], name="fc_relu6"))
        t = "fa"
    nodes += [N("HardSigmoid", [t], ["gate"], alpha=0.2, beta=0.5, name="hsig"),
              N("Mul", [t, "gate"], ["m"], name="mul"),
              N("Conv", ["m", "w3"], ["y"], name="conv3")]
    g = oh.make_graph(nodes, "hswish", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _data() -> np.ndarray:
    return np.random.default_rng(4).uniform(-1, 1, (48, 3, 8, 8)).astype(np.float32)


def _ort(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])


def _sqnr(ref: np.ndarray, test: np.ndarray) -> float:
    r = ref.astype(np.float64)
    return float(10 * np.log10(np.sum(r * r) / np.sum((r - test) ** 2)))


def _quantize(m, x):
    from opendpu.quant.quantize import QuantConfig, quantize
    return quantize(m, x[:32], target=B4096, config=QuantConfig(cle=False))


@pytest.mark.parametrize("act", [None, "Relu"])
def test_hardsigmoid_reads_a_scaled_copy_of_a_shared_producer(act):
    from opendpu.compiler.pipeline import compile as compile_graph
    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.runner import GraphRunner
    m, x = hswish_model(act), _data()
    res = _quantize(m, x)
    nodes = {n.name: n for n in res.prep.nodes}
    fc, cp, hs = nodes["fc"], nodes["fc_hsig_scaled"], nodes["hsig"]
    # the copy: same input, geometry and activation, weights and bias times 1.2, read only by the hard-sigmoid;
    # the original keeps its other reader (the Mul) and its own weights
    assert cp.kind == fc.kind == "conv" and cp.inputs == fc.inputs and cp.act == fc.act == ("RELU" if act else "NONE")
    assert {k: v for k, v in cp.attrs.items()} == fc.attrs
    np.testing.assert_allclose(cp.weight, 1.2 * fc.weight, rtol=1e-6)
    np.testing.assert_allclose(cp.bias, 1.2 * fc.bias, rtol=1e-6)
    np.testing.assert_array_equal(fc.weight, numpy_helper.to_array(next(i for i in m.graph.initializer
                                                                        if i.name == "w2")))
    assert hs.kind == "hsigmoid" and hs.inputs == [cp.name]
    assert [c.name for c in res.prep.consumers(cp.name)] == ["hsig"]
    assert [c.name for c in res.prep.consumers(fc.name)] == ["mul"]
    assert "hsig" in cp.sources and "fc" in cp.sources
    assert any("has other consumers, so 1.2 folded into a copy of it, 'fc_hsig_scaled'" in s for s in res.prep.notes)
    # exact in float: the prepared float graph equals onnxruntime
    want = _ort(m, x[32:])
    got = res.run(x[32:], "float")[res.prep.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # every op on the DPU, in the quantizer's placement and in the compiled program
    cov = res.coverage()
    assert cov["cpu_ops"] == [] and cov["macs_dpu"] == cov["macs_total"], cov
    assert all(n.device == "DPU" for n in res.prep.nodes if n.kind != "input")
    g = Graph.deserialize(res.xmodel().serialize())
    assert "hard-sigmoid-fix" in {o.type for o in g.ops.values()}
    cr = compile_graph(g, B4096, name="hswish")
    assert cr.meta["coverage"]["cpu_ops"] == [], cr.meta["coverage"]
    c = cr.graph
    assert [sg.device for sg in c.toposort_child_subgraphs() if sg.device in ("DPU", "CPU")] == ["DPU"]
    # sim == ref bit for bit, and both equal the quantized graph on ref; INT8 close to onnxruntime float
    ref, sim, qref = GraphRunner(c, backend="ref"), GraphRunner(c, backend="sim"), GraphRunner(g, backend="ref")
    outs = []
    for i in range(32, 48):
        xi = x[i:i + 1]
        r = ref.run([xi], layout="nchw")
        s = sim.run([xi], layout="nchw") if i < 36 else r      # the simulator on four inputs
        q = qref.run([xi], layout="nchw")
        for sg, o in r.dpu_outputs.items():
            for t, v in o.items():
                np.testing.assert_array_equal(s.dpu_outputs[sg][t], v, err_msg=f"{sg}: {t}")
        (name, v), = r.outputs.items()
        np.testing.assert_array_equal(s.outputs[name], v)
        np.testing.assert_array_equal(q.outputs[name], v)
        assert v.dtype == np.int8
        outs.append(v.astype(np.float64) * 2.0 ** -res.qp.act_fp[res.prep.outputs[0]])
    y = np.concatenate(outs).transpose(0, 3, 1, 2)             # the runner's outputs are NHWC
    assert y.shape == want.shape
    assert _sqnr(want, y) > SQNR_FLOOR_DB, _sqnr(want, y)


def test_relu6_producer_keeps_the_gate_on_the_cpu():
    """ReLU6 does not commute with 1.2 (min(max(1.2x, 0), 6) != 1.2·min(max(x, 0), 6)): no copy, the HardSigmoid
    stays float on the CPU with the reason, and the float graph still equals onnxruntime."""
    m, x = hswish_model("Relu6"), _data()
    res = _quantize(m, x)
    nodes = {n.name: n for n in res.prep.nodes}
    assert not any(k.endswith("_hsig_scaled") for k in nodes)
    assert nodes["hsig"].kind == "float" and nodes["hsig"].device == "CPU"
    assert "folds into a conv producer" in nodes["hsig"].reason and "RELU6" in nodes["hsig"].reason
    np.testing.assert_allclose(res.run(x[32:], "float")[res.prep.outputs[0]], _ort(m, x[32:]), rtol=1e-5, atol=1e-5)


def test_dense_producer_is_copied_with_its_reshape():
    """Flatten -> Gemm (a 4x4 conv + reshape to 2-D) read by HardSigmoid(0.2, 0.5) and by the Mul: the conv and its
    reshape are both copied, the gate reads the copied reshape; exact in float, every op on the DPU."""
    r = np.random.default_rng(0)
    w = {"w1": r.normal(0, .4, (8, 3, 3, 3)), "wg": r.normal(0, .3, (16, 128)), "bg": r.normal(0, .5, 16)}
    N = oh.make_node
    nodes = [N("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2], name="conv1"),
             N("Relu", ["c1"], ["r1"], name="relu1"), N("Flatten", ["r1"], ["f"], name="flat"),
             N("Gemm", ["f", "wg", "bg"], ["fc"], transB=1, name="fc"),
             N("HardSigmoid", ["fc"], ["gate"], alpha=0.2, beta=0.5, name="hsig"),
             N("Mul", ["fc", "gate"], ["y"], name="mul")]
    g = oh.make_graph(nodes, "dense", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in w.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    x = _data()
    res = _quantize(m, x)
    nodes_ = {n.name: n for n in res.prep.nodes}
    assert nodes_["fc_hsig_scaled"].kind == "conv" and nodes_["fc_reshape_hsig_scaled"].kind == "reshape"
    assert nodes_["fc_reshape_hsig_scaled"].inputs == ["fc_hsig_scaled"]
    assert nodes_["hsig"].inputs == ["fc_reshape_hsig_scaled"] and nodes_["mul"].inputs == ["fc_reshape", "hsig"]
    np.testing.assert_allclose(nodes_["fc_hsig_scaled"].weight, 1.2 * nodes_["fc"].weight, rtol=1e-6)
    assert res.coverage()["cpu_ops"] == []
    want = _ort(m, x[32:])
    np.testing.assert_allclose(res.run(x[32:], "float")[res.prep.outputs[0]], want, rtol=1e-5, atol=1e-5)
