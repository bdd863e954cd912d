"""Issue 14: models as users bring them. Export idioms (dynamic H/W, Paddle's HardSigmoid, Shape→Slice→Concat
reshape chains, Split, layout-dependent Reshape/Transpose, ops the DPU lacks) go through quantize → compile →
check; what the DPU cannot run stays float on the CPU with its reason. Accuracy is measured against the float
model in onnxruntime (`opendpu compare`), and every DPU subgraph against the reference (`opendpu check`).
The NudeNet 320n detector (a YOLOv8n, from the pinned `nudenet` wheel) runs end to end on skimage crops."""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opendpu.quant import zoo
from opendpu.quant.onnx_in import load_onnx, to_fgraph
from opendpu.runtime.cli import main as cli
from opendpu.runtime.compare import compare

B512 = "DPUCZDX8G_ISA1_B512"
B4096 = "DPUCZDX8G_ISA1_B4096"


def _digits(tmp_path):
    x_tr, _, x_te, y_te = zoo.digits_data()
    np.save(tmp_path / "calib.npy", x_tr[:64])
    np.savez(tmp_path / "test.npz", x=x_te[:300], y=y_te[:300])
    return x_te[:300]


def _build(tmp_path, model, *extra):
    out = tmp_path / "build"
    rc = cli(["build", str(model), "--calib", str(tmp_path / "calib.npy"), "--target", B512, "-o", str(out),
              *extra])
    assert rc == 0
    return out


def _save_model(path, nodes, x_shape, y_shape, weights: dict, opset: int = 17) -> str:
    """An opset-`opset` model of `nodes` from input x to output y, weights as initializers, saved at `path`."""
    g = helper.make_graph(nodes, os.path.splitext(os.path.basename(str(path)))[0],
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                          [numpy_helper.from_array(v, k) for k, v in weights.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, path)
    return str(path)


def _cpu_ops(build) -> dict[str, str]:
    meta = json.load(open(build / "compiled" / "meta.json"))
    return {c["name"]: c["reason"] for c in meta["coverage"]["cpu_ops"]}


# ---- a Paddle-style export: dynamic H and W, an SE gate with HardSigmoid(alpha=0.2, beta=0.5) on the DPU --------

def paddle_style_digits() -> onnx.ModelProto:
    """The trained digits CNN with dynamic H/W and an SE block gated by Paddle's HardSigmoid(0.2, 0.5) after its
    first ReLU (the gate is near 1, so the classifier still works)."""
    m = onnx.load(zoo.DIGITS_ONNX)
    g = m.graph
    relu = next(n for n in g.node if n.op_type == "Relu")
    c = next(numpy_helper.to_array(i) for i in g.initializer if i.name == g.node[0].input[1]).shape[0]
    rng = np.random.default_rng(3)
    w = (np.eye(c) * 0.5 + rng.normal(0, 0.05, (c, c))).astype(np.float32).reshape(c, c, 1, 1)
    b = np.full(c, 1.5, np.float32)
    g.initializer.extend([numpy_helper.from_array(w, "se_w"), numpy_helper.from_array(b, "se_b")])
    y = relu.output[0]
    se = [helper.make_node("GlobalAveragePool", [y], ["se_gap"], name="se_gap"),
          helper.make_node("Conv", ["se_gap", "se_w", "se_b"], ["se_fc"], name="se_fc"),
          helper.make_node("HardSigmoid", ["se_fc"], ["se_gate"], name="se_hsig", alpha=0.2, beta=0.5),
          helper.make_node("Mul", [y, "se_gate"], ["se_out"], name="se_mul")]
    for n in g.node:
        n.input[:] = ["se_out" if i == y else i for i in n.input]
    k = list(g.node).index(relu) + 1
    for j, n in enumerate(se):
        g.node.insert(k + j, n)
    d = g.input[0].type.tensor_type.shape.dim
    d[0].dim_param, d[2].dim_param, d[3].dim_param = "batch", "height", "width"
    del g.value_info[:]
    onnx.checker.check_model(m)
    return m


def test_paddle_style_dynamic_hw_and_hardsigmoid(tmp_path, capsys):
    x = _digits(tmp_path)
    p = tmp_path / "paddle.onnx"
    onnx.save(paddle_style_digits(), p)
    out = _build(tmp_path, p, "--input-shape", "1,1,8,8")
    text = capsys.readouterr().out
    assert "0 mismatching" in text and "FAIL" not in text
    assert _cpu_ops(out) == {}          # the gate's 1.2 folds into se_fc: hard-sigmoid on the DPU
    from opendpu.compiler.xir.graph import Graph
    g = Graph.load(str(out / "quantized" / "paddle_int.xmodel"))
    assert "hard-sigmoid-fix" in {o.type for o in g.ops.values()}
    res = compare(str(p), str(out), str(tmp_path / "test.npz"), task="classify")
    assert res["metric"]["top1_agreement"] >= 0.95, res["metric"]
    assert len(x) == res["samples"]


def _se_gate_model(tmp_path, alpha: float, shared: bool = False) -> str:
    """Conv -> ReLU -> Conv (se_fc) -> HardSigmoid(alpha, 0.5) -> Mul with the ReLU's output: a squeeze-excite
    gate at 8x8. `shared`: se_fc's output is also added to the product (so its scale cannot fold)."""
    rng = np.random.default_rng(11)
    w1 = rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32)
    b2 = rng.normal(0, 0.5, 8).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["fc"], name="se_fc"),
             helper.make_node("HardSigmoid", ["fc"], ["gate"], name="se_hsig", alpha=alpha, beta=0.5),
             helper.make_node("Mul", ["r1", "gate"], ["y" if not shared else "m"], name="se_mul")]
    if shared:
        nodes.append(helper.make_node("Add", ["m", "fc"], ["y"], name="add"))
    return _save_model(tmp_path / "se.onnx", nodes, [1, 3, 8, 8], [1, 8, 8, 8], {"w1": w1, "w2": w2, "b2": b2})


def _ort(path, x):
    import onnxruntime as ort
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])


@pytest.mark.parametrize("alpha", [0.2, 1 / 6, 0.125])
def test_hardsigmoid_slope_folds_into_the_producer(tmp_path, capsys, alpha):
    """HardSigmoid(alpha, 0.5) = the DPU's hard-sigmoid of 6·alpha·x (Paddle's and ONNX's default 0.2: 1.2·x;
    PyTorch's 1/6: as it is): the factor folds into se_fc, the whole SE gate runs on the DPU, the prepared float
    graph equals onnxruntime and INT8 is close to it; sim == ref (build's check)."""
    from opendpu.quant.quantize import QuantConfig, quantize
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (48, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "calib.npy", x[:32])
    np.save(tmp_path / "eval.npy", x[32:])
    p = _se_gate_model(tmp_path, alpha)
    res = quantize(onnx.load(p), x[:32], config=QuantConfig(cle=False))
    assert [n.kind for n in res.prep.nodes].count("hsigmoid") == 1
    got = res.run(x[32:], "float")[res.prep.outputs[0]]
    np.testing.assert_allclose(got.reshape(16, 8, 8, 8), _ort(p, x[32:]), rtol=1e-5, atol=1e-5)
    out = _build(tmp_path, p, "--input-shape", "1,3,8,8")
    text = capsys.readouterr().out
    assert "0 mismatching" in text and "FAIL" not in text
    assert _cpu_ops(out) == {}
    from opendpu.compiler.xir.graph import Graph
    types = {o.type for o in Graph.load(str(out / "quantized" / "se_int.xmodel")).ops.values()}
    assert "hard-sigmoid-fix" in types and "hard-sigmoid" not in types, types
    r = compare(str(p), str(out), str(tmp_path / "eval.npy"), task="raw")
    assert r["outputs"][0]["sqnr_db"] > 25, r["outputs"]


def test_hardsigmoid_slope_folds_into_a_copy_of_a_shared_producer(tmp_path, capsys):
    """se_fc's output is also read by an Add: scaling it would change the Add, so the gate reads a scaled copy of
    se_fc (`se_fc_hsig_scaled`) and stays on the DPU, and the build still matches float."""
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, (48, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "calib.npy", x[:32])
    np.save(tmp_path / "eval.npy", x[32:])
    p = _se_gate_model(tmp_path, 0.2, shared=True)
    out = _build(tmp_path, p, "--input-shape", "1,3,8,8")
    assert "0 mismatching" in capsys.readouterr().out
    assert _cpu_ops(out) == {}
    r = compare(str(p), str(out), str(tmp_path / "eval.npy"), task="raw")
    assert r["outputs"][0]["sqnr_db"] > 20, r["outputs"]


@pytest.mark.parametrize("alpha", [0.2, 0.25])
def test_leaky_relu_of_another_slope_runs_as_prelu(tmp_path, capsys, alpha):
    """LeakyReLU(alpha) with alpha neither 0.1 nor 26/256 is a one-slope PReLU on the DPU's ALU, not silently
    changed to 26/256: the prepared float graph equals onnxruntime, INT8 is close to it, sim == ref."""
    from opendpu.quant.quantize import QuantConfig, quantize
    rng = np.random.default_rng(6)
    w1 = rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("LeakyRelu", ["c1"], ["l1"], name="leaky", alpha=alpha),
             helper.make_node("Conv", ["l1", "w2"], ["y"], name="conv2")]
    p = _save_model(tmp_path / "lk.onnx", nodes, [1, 3, 8, 8], [1, 4, 8, 8], {"w1": w1, "w2": w2})
    x = rng.uniform(-1, 1, (48, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "calib.npy", x[:32])
    np.save(tmp_path / "eval.npy", x[32:])
    res = quantize(onnx.load(p), x[:32], config=QuantConfig(cle=False))
    assert [n.kind for n in res.prep.nodes] == ["input", "conv", "prelu", "conv"]
    assert not any("QUANTIZER_TORCH_LEAKYRELU" in m for m in res.prep.notes), res.prep.notes
    assert any("one-slope PReLU" in m for m in res.prep.notes), res.prep.notes
    got = res.run(x[32:], "float")[res.prep.outputs[0]]
    np.testing.assert_allclose(got.reshape(16, 4, 8, 8), _ort(p, x[32:]), rtol=1e-5, atol=1e-5)
    out = _build(tmp_path, p, "--input-shape", "1,3,8,8")
    assert "0 mismatching" in capsys.readouterr().out
    assert _cpu_ops(out) == {}
    from opendpu.compiler.xir.graph import Graph
    elew = [o.attrs.get("type") for o in Graph.load(str(out / "quantized" / "lk_int.xmodel")).ops.values()
            if o.type == "eltwise-fix"]
    assert elew == ["PRELU"], elew                  # the ALU's prelu, not its LEAKY-RELU (26/256)
    r = compare(str(p), str(out), str(tmp_path / "eval.npy"), task="raw")
    assert r["outputs"][0]["sqnr_db"] > 25, r["outputs"]


def test_dynamic_input_without_shape_names_the_option(tmp_path, capsys):
    _digits(tmp_path)
    p = tmp_path / "paddle.onnx"
    onnx.save(paddle_style_digits(), p)
    rc = cli(["inspect", str(p), "--target", B512])
    err = capsys.readouterr().err
    assert rc == 2 and "--input-shape" in err and "Traceback" not in err


# ---- PyTorch-style reshape chains, Split, layout-dependent ops, an op the DPU lacks ------------------------------

def _head_model() -> onnx.ModelProto:
    """A small detector-like graph: conv → Split along C → two branches (one conv, one Softsign, which the DPU
    lacks) → Concat → Reshape to [N, C, H·W] whose target comes from Shape → Slice → Concat → Transpose →
    Softmax. Every idiom of a PyTorch export head, at 8×8."""
    rng = np.random.default_rng(5)
    w1 = rng.normal(0, 0.4, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.4, (4, 4, 3, 3)).astype(np.float32)
    init = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array([4, 4], np.int64), "split"),
            numpy_helper.from_array(np.array([0], np.int64), "s0"),
            numpy_helper.from_array(np.array([2], np.int64), "s2"),
            numpy_helper.from_array(np.array([-1], np.int64), "m1")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Split", ["r1", "split"], ["a", "b"], axis=1, name="split"),
             helper.make_node("Conv", ["a", "w2"], ["ca"], pads=[1, 1, 1, 1], name="conv_a"),
             helper.make_node("Softsign", ["b"], ["sb"], name="softsign"),
             helper.make_node("Concat", ["ca", "sb"], ["cat"], axis=1, name="cat"),
             helper.make_node("Shape", ["cat"], ["shp"], name="shape"),
             helper.make_node("Slice", ["shp", "s0", "s2"], ["nc"], name="slice_shape"),
             helper.make_node("Concat", ["nc", "m1"], ["tgt"], axis=0, name="target"),
             helper.make_node("Reshape", ["cat", "tgt"], ["flat"], name="reshape"),
             helper.make_node("Transpose", ["flat"], ["t"], perm=[0, 2, 1], name="transpose"),
             helper.make_node("Softmax", ["t"], ["y"], axis=2, name="softmax")]
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "hw", 8])], init)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_reshape_chain_folds_to_static_shapes():
    fg = to_fgraph(load_onnx(_head_model()), input_shape=[1, 3, 8, 8])
    assert {n.op_type for n in fg.nodes} >= {"Conv", "Split", "Reshape", "Transpose", "Softmax", "Softsign"}
    assert "Shape" not in {n.op_type for n in fg.nodes}          # Shape → Slice → Concat folded to a constant
    assert fg.shapes["flat"] == [1, 8, 64] and fg.shapes["y"] == [1, 64, 8]


def test_export_idioms_place_on_cpu_and_match_float(tmp_path, capsys):
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (64, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "calib.npy", x[:48])
    np.save(tmp_path / "eval.npy", x[48:])
    p = tmp_path / "head.onnx"
    onnx.save(_head_model(), p)
    out = _build(tmp_path, p, "--input-shape", "1,3,8,8")
    text = capsys.readouterr().out
    assert "0 mismatching" in text and "FAIL" not in text
    cpu = _cpu_ops(out)
    assert any("softsign" in n for n in cpu), cpu
    assert any("reshape" in n and "layout" in r for n, r in cpu.items()), cpu
    meta = json.load(open(out / "compiled" / "meta.json"))
    assert meta["coverage"]["macs_dpu_pct"] == 100.0           # both convs on the DPU
    # the Split half that feeds a conv is a strided slice of the conv's image on the DPU; the half read only by
    # the CPU's Softsign stays float with it
    from opendpu.compiler.xir.graph import Graph
    g = Graph.load(str(out / "compiled" / "head.xmodel"))
    assert {o.name for o in g.ops.values() if o.type == "strided_slice-fix"} == {"split_0"}
    assert {o.name for o in g.ops.values() if o.type == "strided_slice"} == {"split_1"}
    # against the float model in onnxruntime (softmax outputs in [0, 1])
    res = compare(str(p), str(out), str(tmp_path / "eval.npy"), task="raw")
    assert res["outputs"][0]["sqnr_db"] > 20, res["outputs"]


def test_replace_silu_is_explicit(tmp_path):
    """SiLU (x·Sigmoid(x)) stays whole on the CPU by default; --replace-silu hardswish puts hard-swish on the DPU
    (an approximation the quantize report names)."""
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             helper.make_node("Mul", ["c", "s"], ["silu"], name="silu"),
             helper.make_node("Conv", ["silu", "w2"], ["y"], name="conv2")]
    p = _save_model(tmp_path / "silu.onnx", nodes, [1, 3, 8, 8], [1, 8, 8, 8], {"w": w, "w2": w2})
    np.save(tmp_path / "calib.npy", rng.uniform(-1, 1, (16, 3, 8, 8)).astype(np.float32))
    q1, q2 = tmp_path / "q1", tmp_path / "q2"
    assert cli(["quantize", str(p), "--calib", str(tmp_path / "calib.npy"), "-o", str(q1), "--target", B512]) == 0
    assert cli(["quantize", str(p), "--calib", str(tmp_path / "calib.npy"), "-o", str(q2), "--target", B512,
                "--replace-silu", "hardswish"]) == 0
    r1, r2 = (open(d / "report.txt").read() for d in (q1, q2))
    assert "SiLU" in r1 and "REPLACE_SILU" not in r1
    assert "REPLACE_SILU" in r2
    # the reports open with the coverage: 8·8·8·27 + 8·8·8·8 = 17920 MACs, all on the DPU; the SiLU on the CPU
    assert r1.splitlines()[0].startswith("DPU coverage (B512): 100.0 % of MACs")
    c1, c2 = (json.load(open(d / "report.json"))["coverage"] for d in (q1, q2))
    assert (c1["macs_total"], c1["macs_dpu"]) == (c2["macs_total"], c2["macs_dpu"]) == (17920, 17920)
    assert {c["name"] for c in c1["cpu_ops"]} == {"sig", "silu"} and c2["cpu_ops"] == []
    from opendpu.compiler.xir.graph import Graph
    t1 = {o.type for o in Graph.load(str(q1 / "silu_int.xmodel")).ops.values()}
    t2 = {o.type for o in Graph.load(str(q2 / "silu_int.xmodel")).ops.values()}
    assert "sigmoid" in t1 and "hard-sigmoid-fix" not in t1
    assert "hard-sigmoid-fix" in t2 and "sigmoid" not in t2


def test_replace_sigmoid_on_build(tmp_path, capsys):
    """A sigmoid gate stays on the CPU by default; `build --replace-sigmoid` puts it on the DPU as hard-sigmoid
    (an approximation), the quantize report names the replaced op, and INT8 stays near float."""
    rng = np.random.default_rng(8)
    w = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (8, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Conv", ["c", "w2"], ["g"], name="gate_fc"),
             helper.make_node("Sigmoid", ["g"], ["s"], name="sig"),
             helper.make_node("Mul", ["c", "s"], ["y"], name="gate")]
    p = _save_model(tmp_path / "sg.onnx", nodes, [1, 3, 8, 8], [1, 8, 8, 8], {"w": w, "w2": w2})
    x = rng.uniform(-1, 1, (48, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "calib.npy", x[:32])
    np.save(tmp_path / "eval.npy", x[32:])
    out = _build(tmp_path, p, "--input-shape", "1,3,8,8")
    assert "sig" in _cpu_ops(out)
    rep = open(out / "quantized" / "report.txt").read()
    assert "replaced sigmoid" not in rep
    out2 = tmp_path / "build2"
    assert cli(["build", str(p), "--calib", str(tmp_path / "calib.npy"), "--target", B512, "-o", str(out2),
                "--replace-sigmoid"]) == 0
    assert "0 mismatching" in capsys.readouterr().out
    assert _cpu_ops(out2) == {}
    rep = open(out2 / "quantized" / "report.txt").read()
    assert "replaced sigmoid -> hard-sigmoid (--replace-sigmoid), an approximation (see their SQNR below): " \
           "1 op(s): sig" in rep, rep
    r1 = compare(str(p), str(out), str(tmp_path / "eval.npy"), task="raw")["outputs"][0]["sqnr_db"]
    r2 = compare(str(p), str(out2), str(tmp_path / "eval.npy"), task="raw")["outputs"][0]["sqnr_db"]
    assert r2 > 10 and r2 < r1, (r1, r2)          # hard-sigmoid is close to sigmoid, but not equal


# ---- NudeNet 320n (YOLOv8n) from the pinned wheel ---------------------------------------------------------------

def _nudenet() -> str:
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("nudenet==3.4.2 is not installed (requirements-models.txt)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "320n.onnx")
    if not os.path.isfile(path):
        pytest.skip(f"{path} is missing")
    return path


def sample_crops(n_face: int, n_other: int, seed: int) -> np.ndarray:
    """RGB crops of skimage's bundled sample images, resized to 320×320, scaled to [0, 1], NCHW: `n_face` of the
    astronaut (a person: NudeNet finds her face), `n_other` from other images; every second one mirrored."""
    skd = pytest.importorskip("skimage.data")
    skt = pytest.importorskip("skimage.transform")
    rng = np.random.default_rng(seed)
    out = []

    def add(im, k, lo):
        im = np.stack([im] * 3, -1) if im.ndim == 2 else im
        H, W = im.shape[:2]
        s = int(min(H, W) * rng.uniform(lo, 1.0))
        y, x = rng.integers(0, H - s + 1), rng.integers(0, W - s + 1)
        c = im[y:y + s, x:x + s]
        c = c[:, ::-1] if k % 2 else c
        out.append(skt.resize(c, (320, 320), anti_aliasing=True, preserve_range=True).astype(np.float32) / 255)
    for k in range(n_face):
        add(skd.astronaut(), k, 0.45)
    others = [skd.coffee, skd.chelsea, skd.rocket, skd.camera, skd.immunohistochemistry, skd.colorwheel, skd.cat]
    for k in range(n_other):
        add(others[k % len(others)](), k, 0.6)
    return np.stack(out).transpose(0, 3, 1, 2).astype(np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["silu_cpu", "hardswish"])
def test_nudenet_320n_end_to_end(tmp_path, capsys, variant):
    model = _nudenet()
    np.save(tmp_path / "calib.npy", sample_crops(16, 32, seed=100))
    np.save(tmp_path / "eval.npy", sample_crops(36, 12, seed=11))
    extra = ["--replace-silu", "hardswish"] if variant == "hardswish" else ["--bias-corr"]
    out = tmp_path / "build"
    assert cli(["build", model, "--calib", str(tmp_path / "calib.npy"), "--target", B4096, "-o", str(out),
                "--input-shape", "1,3,320,320", "--check-n", "1", *extra]) == 0
    text = capsys.readouterr().out
    assert "0 mismatching" in text and "FAIL" not in text
    cov = json.load(open(out / "compiled" / "meta.json"))["coverage"]
    assert cov["macs_dpu_pct"] > 99.0, cov
    res = compare(model, str(out), str(tmp_path / "eval.npy"), task="detect")
    agree = res["metric"]["detection_agreement"]
    print(f"NudeNet 320n {variant}: coverage {cov['macs_dpu_pct']} % MACs, {cov['ops_dpu']}/{cov['ops_total']} "
          f"ops; detections {res['metric']}")
    assert res["metric"]["float_detections"] >= 40
    # measured on 48 eval crops (49 float detections), SiLU on the CPU with bias correction: 44/49 = 0.898 with the
    # concat rule of AMD's programs (unaligned producers with other consumers) and 44/49 with every producer aligned
    # (the earlier rule); on the earlier 16 crops (20 detections) 17/20 against 18/20, one detection of noise.
    assert agree >= (0.95 if variant == "hardswish" else 0.85), res["metric"]


def test_coverage_counts_macs_of_ops_kept_on_the_cpu(tmp_path, capsys):
    """A grouped conv (group 2: neither group 1 nor depthwise) stays on the CPU as its ONNX node; the coverage still
    counts its MACs: conv 3→8 3×3 on 8×8 = 8·8·8·3·9 = 13824 on the DPU, grouped 8→8 = 8·8·8·4·9 = 18432 on the
    CPU, so 13824 / 32256 = 42.86 % of MACs on the DPU."""
    rng = np.random.default_rng(4)
    w1 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[1, 1, 1, 1], group=2, name="grouped")]
    p = _save_model(tmp_path / "grouped.onnx", nodes, [1, 3, 8, 8], [1, 8, 8, 8], {"w1": w1, "w2": w2})
    np.save(tmp_path / "calib.npy", rng.uniform(-1, 1, (16, 3, 8, 8)).astype(np.float32))
    out = _build(tmp_path, p)
    cov = json.load(open(out / "compiled" / "meta.json"))["coverage"]
    assert (cov["macs_total"], cov["macs_dpu"]) == (32256, 13824)
    assert cov["macs_dpu_pct"] == pytest.approx(42.857, abs=0.01)
    cpu = _cpu_ops(out)
    assert list(cpu) == ["grouped_nchw"] and "group 2" in cpu["grouped_nchw"], cpu     # layout transposes not counted
    np.save(tmp_path / "eval.npy", rng.uniform(-1, 1, (8, 3, 8, 8)).astype(np.float32))
    res = compare(str(p), str(out), str(tmp_path / "eval.npy"), task="raw")
    assert res["outputs"][0]["sqnr_db"] > 25, res["outputs"]


def test_pytorch_opset11_export_idioms(tmp_path, capsys):
    """A PyTorch module exported at opset 11 (converted to 13 on load): ReLU6 as Clip with min/max inputs,
    nearest Upsample as Resize with scales, hardswish, PReLU, avgpool + flatten + Linear. It builds, every DPU
    program equals the reference, and the outputs match the float model (SQNR > 20 dB)."""
    torch = pytest.importorskip("torch")
    from opendpu.quant.onnx_in import torch_to_onnx
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
            self.pr = torch.nn.PReLU(8, init=0.2)
            self.fc = torch.nn.Linear(8 * 4 * 4, 10)

        def forward(self, x):
            y = torch.nn.functional.relu6(self.c1(x))
            y = torch.nn.functional.max_pool2d(y, 2)
            y = torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")
            y = torch.nn.functional.hardswish(self.c2(y))
            y = torch.nn.functional.avg_pool2d(self.pr(y), 2)
            return self.fc(torch.flatten(y, 1))

    net = Net().eval()
    x = np.random.default_rng(1).uniform(-1, 1, (48, 3, 8, 8)).astype(np.float32)
    m = torch_to_onnx(net, x[:1], opset=11)
    assert m.opset_import[0].version == 11
    assert {n.op_type for n in m.graph.node} >= {"Clip", "Resize", "PRelu", "Gemm"}
    p = tmp_path / "torch11.onnx"
    onnx.save(m, p)
    np.save(tmp_path / "calib.npy", x[:32])
    np.save(tmp_path / "eval.npy", x[32:])
    out = _build(tmp_path, p)
    text = capsys.readouterr().out
    assert "0 mismatching" in text and "FAIL" not in text
    assert json.load(open(out / "compiled" / "meta.json"))["coverage"]["macs_dpu_pct"] == 100.0
    res = compare(str(p), str(out), str(tmp_path / "eval.npy"), task="raw")
    with torch.no_grad():
        ref = net(torch.from_numpy(x[32:])).numpy()
    assert res["outputs"][0]["sqnr_db"] > 20, res["outputs"]
    assert np.abs(ref).max() == pytest.approx(max(abs(res["outputs"][0]["float_min"]),
                                                  abs(res["outputs"][0]["float_max"])), rel=1e-4)


def test_a_bad_model_is_reported_before_the_data_is_read(tmp_path, capsys):
    """A dynamic-shape model takes its shape from the calibration data, but only once the model itself is known to
    be good: with both broken, the model's error is the one reported."""
    w = np.ones((4, 3, 1, 1), np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Add", ["c", "b"], ["y"], name="add")]
    p = tmp_path / "two.onnx"
    _save_model(p, nodes, [1, 3, "h", "w"], [1, 4, "h", "w"], {"w": w})
    m = onnx.load(p)
    m.graph.input.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 4, "h", "w"]))
    onnx.save(m, p)
    (tmp_path / "calib.npy").write_bytes(b"not numpy at all")
    out = tmp_path / "q"
    rc = cli(["quantize", str(p), "--calib", str(tmp_path / "calib.npy"), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "2 inputs (x, b)" in err and "Traceback" not in err, err
    assert not out.exists()
