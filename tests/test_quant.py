"""The quantizer: preparation against the float model, golden (ONNX fake-quant) against the integer reference
runner, QDQ export against the reference, hand-computed fix points, constraints, quant_info, bad input."""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from opendpu.compiler.fixpoint import avg_pool_factor
from opendpu.compiler.xir.graph import Graph
from opendpu.quant.emit import session
from opendpu.quant.onnx_in import QuantError
from opendpu.quant.quantize import QuantConfig, quantize
from opendpu.runtime.cli import main as cli
from opendpu.runtime.runner import GraphRunner


def _model(nodes, inits, in_shape, out_names, name="m"):
    rng_inits = [nh.from_array(np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v), k)
                 for k, v in inits.items()]
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", T.FLOAT, in_shape)], [], rng_inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
    for o in out_names:
        m.graph.output.append(inferred[o])
    onnx.checker.check_model(m)
    return m


def rich_model(seed=0):
    """conv+BN+ReLU, maxpool, residual add+ReLU, depthwise, concat, 1x1 conv + LeakyReLU(0.1), hard-swish in the
    x*clip(x+3,0,6)/6 form, squeeze-excite (GAP, 1x1 convs, hard-sigmoid, channel Mul), nearest upsample,
    ConvTranspose, 3x3 avg pool, GAP, Flatten, Gemm."""
    r = np.random.default_rng(seed)
    n = r.normal
    inits = {"w1": n(0, .3, (8, 3, 3, 3)), "g": r.uniform(.5, 1.5, 8), "b": n(0, .1, 8), "m": n(0, .1, 8),
             "v": r.uniform(.5, 2, 8), "w2": n(0, .2, (8, 8, 3, 3)), "b2": n(0, .1, 8), "dw": n(0, .5, (8, 1, 3, 3)),
             "w3": n(0, .2, (8, 16, 1, 1)), "three": np.array(3.0), "zero": np.array(0.0), "six": np.array(6.0),
             "se1": n(0, .3, (4, 8, 1, 1)), "se1b": n(0, .1, 4), "se2": n(0, .3, (8, 4, 1, 1)), "se2b": n(0, .1, 8),
             "tw": n(0, .3, (8, 4, 2, 2)), "tb": n(0, .1, 4), "fc": n(0, .2, (10, 4)), "fcb": n(0, .1, 10)}
    N = h.make_node
    nodes = [N("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             N("BatchNormalization", ["c1", "g", "b", "m", "v"], ["bn1"], name="bn1"),
             N("Relu", ["bn1"], ["r1"], name="relu1"),
             N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
             N("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             N("Add", ["c2", "p1"], ["a2"], name="add2"), N("Relu", ["a2"], ["r2"], name="relu2"),
             N("Conv", ["r2", "dw"], ["d3"], pads=[1, 1, 1, 1], group=8, name="dw3"),
             N("Concat", ["r2", "d3"], ["cat"], axis=1, name="cat"),
             N("Conv", ["cat", "w3"], ["c4"], name="conv4"),
             N("LeakyRelu", ["c4"], ["l4"], alpha=0.1, name="leaky4"),
             N("Add", ["l4", "three"], ["hs_a"], name="hs_add"),
             N("Clip", ["hs_a", "zero", "six"], ["hs_c"], name="hs_clip"),
             N("Div", ["hs_c", "six"], ["hs_d"], name="hs_div"), N("Mul", ["l4", "hs_d"], ["hsw"], name="hswish"),
             N("GlobalAveragePool", ["hsw"], ["se_p"], name="se_pool"),
             N("Conv", ["se_p", "se1", "se1b"], ["se_c1"], name="se_fc1"),
             N("Relu", ["se_c1"], ["se_r"], name="se_relu"),
             N("Conv", ["se_r", "se2", "se2b"], ["se_c2"], name="se_fc2"),
             N("HardSigmoid", ["se_c2"], ["se_s"], alpha=1 / 6, beta=0.5, name="se_hsig"),
             N("Mul", ["hsw", "se_s"], ["se_o"], name="se_scale"),
             N("Resize", ["se_o", "", "scales"], ["up"], mode="nearest", coordinate_transformation_mode="asymmetric",
               nearest_mode="floor", name="up"),
             N("ConvTranspose", ["up", "tw", "tb"], ["tc"], strides=[2, 2], name="tconv"),
             N("AveragePool", ["tc"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
               count_include_pad=1, name="avgpool"),
             N("GlobalAveragePool", ["ap"], ["gap"], name="gap"), N("Flatten", ["gap"], ["fl"], name="flat"),
             N("Gemm", ["fl", "fc", "fcb"], ["y"], transB=1, name="fc")]
    inits["scales"] = np.array([1, 1, 2, 2], np.float32)
    return _model(nodes, inits, [1, 3, 16, 16], ["y"], "rich")


def calib(n=24, seed=1, shape=(3, 16, 16)):
    return np.random.default_rng(seed).normal(0, 1, (n,) + shape).astype(np.float32)


def ref_run(res, x1):
    """Every op output of the quantized xmodel on the integer reference runner (after a save/load round trip)."""
    g = Graph.deserialize(res.xmodel().serialize())
    gr = GraphRunner(g, backend="ref")
    out = gr.run([x1.transpose(0, 2, 3, 1)], keep_values=True)
    return out


@pytest.fixture(scope="module")
def rich():
    m = rich_model()
    return m, quantize(m, calib(), config=QuantConfig(method="diffs"))


def test_prepared_float_model_equals_original(rich):
    """BN folding, gemm->conv, pattern rewrites keep the float function (leaky slope aside: 0.1 -> 26/256)."""
    m, res = rich
    x = calib(4, seed=7)
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    for nd in m2.graph.node:
        if nd.op_type == "LeakyRelu":
            nd.attribute[0].f = 26 / 256
    s = session(m2)
    want = np.concatenate([s.run(None, {"x": x[i:i + 1]})[0] for i in range(len(x))])
    got = res.run(x, "float")[res.prep.outputs[0]]
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-5)
    kinds = [n.kind for n in res.prep.nodes]
    assert kinds.count("hsigmoid") == 2 and "tconv" in kinds and "upsample" in kinds
    assert [n for n in res.prep.nodes if n.name == "hswish"][0].attrs["type"] == "MUL"


def test_golden_equals_reference_runner_bit_exact(rich):
    """The ONNX fake-quant model (onnxruntime float math) and the integer XIR reference agree on every layer."""
    _, res = rich
    for i in range(3):
        x1 = calib(1, seed=100 + i)
        gold = res.golden(x1)
        vals = ref_run(res, x1).values
        compared = 0
        for name, v in gold.items():
            assert name in vals, name
            np.testing.assert_array_equal(vals[name].reshape(v.shape), v, err_msg=name)
            compared += 1
        assert compared >= 20


def test_qdq_export_agrees_with_reference(rich):
    _, res = rich
    s = session(res.qdq_onnx())
    kinds = {nd.op_type for nd in res.qdq_onnx().graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= kinds
    out = res.prep.outputs[0]
    fp = res.qp.act_fp[out]
    tot = ok = 0
    for i in range(20):
        x1 = calib(1, seed=200 + i)
        q = np.round(s.run(None, {"x": x1})[0] * 2.0 ** fp).astype(np.int64).reshape(-1)
        r = list(ref_run(res, x1).outputs.values())[0].astype(np.int64).reshape(-1)
        tot += q.size
        ok += int(np.sum(np.abs(q - r) <= 1))
    assert ok / tot >= 0.999


def test_xmodel_form(rich):
    _, res = rich
    g = res.xmodel()
    types = {op.type for op in g.ops.values()}
    assert {"data-fix", "const-fix", "conv2d-fix", "depthwise-conv2d-fix", "pool-fix", "eltwise-fix", "concat-fix",
            "upsample-fix", "hard-sigmoid-fix", "transposed-conv2d-fix", "reshape-fix"} <= types
    for op in g.ops.values():
        t = op.output
        assert t.is_fixed and t.attrs["bit_width"] == 8 and "fix_point" in t.attrs
        assert t.attrs["round_mode"] == ("PY3_ROUND" if op.type == "const-fix" else "DPU_ROUND")
        if op.type == "const-fix":
            assert len(op.attrs["data"]) == int(np.prod(t.shape))
    conv = g.ops["conv1"]
    assert conv.attrs["nonlinear"] == "RELU" and conv.attrs["kernel"] == [3, 3] and conv.attrs["pad"] == [1, 1, 1, 1]
    assert g.ops["conv4"].attrs["nonlinear"] == "LEAKYRELU" and g.ops["conv4"].attrs["LEAKYRELU_alpha"] == 26 / 256
    assert g.ops["conv1_weights"].output.shape == [8, 3, 3, 3]          # OHWI (C_in 3)
    assert g.ops["dw3_weights"].output.shape == [1, 3, 3, 8]            # [1, kh, kw, C]
    assert g.ops["fc"].attrs["kernel"] == [1, 1] and g.ops["fc"].output.shape == [1, 1, 1, 10]


def test_dpu_constraints(rich):
    _, res = rich
    g = res.xmodel()
    fix = {n: op.output.fix_point for n, op in g.ops.items()}
    for op in g.ops.values():
        ins = op.input_ops()
        if op.type == "concat-fix":       # the minimum; a producer read only by the concat shares it
            assert all(fix[op.name] <= fix[i] <= fix[op.name] + 15 for i in ins)
            assert all(fix[i] == fix[op.name] for i in ins if g.consumers(i) == [op.name])
        if op.type == "pool-fix" and op.attrs["type"] == "MAX":
            assert fix[ins[0]] == fix[op.name]
        if op.type == "pool-fix" and op.attrs["type"] == "AVG":     # its own; ALU exponent fp_out - fp_in - M <= 7
            kw, kh = op.attrs["kernel"]
            assert fix[op.name] - fix[ins[0]] - avg_pool_factor(kh, kw)[1] <= 7
        if op.type in ("conv2d-fix", "depthwise-conv2d-fix", "transposed-conv2d-fix"):
            x, w, b = op.inputs["input"][0], op.inputs["weights"][0], op.inputs["bias"][0]
            sc = fix[x] + fix[w] - fix[op.name]
            sb = fix[x] + fix[w] - fix[b] + 1
            assert 0 <= sc <= 63 and 0 <= sb <= 20, op.name
        if op.type == "eltwise-fix" and op.attrs["type"] == "ADD" and len(ins) > 1:
            assert max(fix[i] for i in ins) - min(fix[i] for i in ins) <= 2
        if op.type == "hard-sigmoid-fix":
            assert fix[op.name] == 7


def test_hand_computed_conv():
    """One 1x1 conv, weights and input chosen so maxmin fix points and the output are computable by hand."""
    w = np.array([0.5, -0.25, 0.75], np.float32).reshape(1, 3, 1, 1)
    b = np.array([0.1], np.float32)
    m = _model([h.make_node("Conv", ["x", "w", "b"], ["y"], name="conv")], {"w": w, "b": b}, [1, 3, 1, 1], ["y"])
    x = np.array([[1.0, -1.0, 0.5], [0.9, 0.2, -0.3]], np.float32).reshape(2, 3, 1, 1)
    res = quantize(m, x, config=QuantConfig(method="maxmin"))
    # maxmin = the largest fp with absmax * 2^fp <= 127:
    #   input |x| <= 1.0 -> 2^fp <= 127 -> 6;  weights 0.75 -> 2^fp <= 169.3 -> 7;  bias 0.1 -> 2^fp <= 1270 -> 10
    #   outputs 1.225 and 0.275 (by hand) -> 2^fp <= 103.7 -> 6;  bias 10 lies inside fp_in + fp_w - 19 .. + 1
    assert (res.qp.act_fp["x"], res.qp.w_fp["conv"], res.qp.b_fp["conv"], res.qp.act_fp["conv"]) == (6, 7, 10, 6)
    np.testing.assert_array_equal(res.qp.w_q["conv"].reshape(-1), [64, -32, 96])
    assert int(res.qp.b_q["conv"][0]) == 102                            # 0.1 * 1024 = 102.4 -> 102
    # x = [64, -64, 32] / 64; acc = 4096 + 2048 + 3072 = 9216; shift_bias 13 - 10 = 3, shift_cut 13 - 6 = 7
    # y = (9216 + 102 * 8) / 128 = 78.375 -> 78 (half up)
    got = list(ref_run(res, x[:1]).outputs.values())[0].reshape(-1)[0]
    assert got == 78
    assert res.golden(x[:1])["conv"].reshape(-1)[0] == 78


def test_quant_info_roundtrip_and_edit(tmp_path, rich):
    m, res = rich
    qi = res.quant_info()
    again = quantize(m, calib(), quant_info=qi)
    assert again.xmodel().serialize() == res.xmodel().serialize()
    qi2 = json.loads(json.dumps(qi))
    qi2["tensors"]["conv1"]["fix_point"] -= 1
    edited = quantize(m, calib(), quant_info=qi2)
    assert edited.qp.act_fp["conv1"] == res.qp.act_fp["conv1"] - 1
    qi3 = json.loads(json.dumps(qi))
    qi3["tensors"]["nonexistent"] = {"kind": "activation", "fix_point": 3}
    with pytest.raises(QuantError, match="CALIB_RESULT_MISMATCH"):
        quantize(m, calib(), quant_info=qi3)


def test_cli_quantize_run_golden(tmp_path, capsys):
    mp = tmp_path / "rich.onnx"
    onnx.save(rich_model(), mp)
    cp = tmp_path / "calib.npy"
    np.save(cp, calib())
    out = tmp_path / "q"
    assert cli(["quantize", str(mp), "--calib", str(cp), "-o", str(out), "--target", "DPUCZDX8G_ISA1_B512"]) == 0
    for f in ("rich_int.xmodel", "rich_int.onnx", "quant_info.json", "report.txt", "report.json"):
        assert (out / f).is_file(), f
    rep = (out / "report.txt").read_text()
    assert "SQNR" in rep and "conv1" in rep
    capsys.readouterr()
    rc = cli(["run", str(out / "rich_int.xmodel"), "--backend", "ref", "-i", str(out / "golden" / "x_aquant.bin"),
              "--golden", str(out / "golden")])
    text = capsys.readouterr().out
    assert rc == 0
    assert text.count("compare data success") >= 20 and "fail" not in text
    # a corrupted golden file is reported
    gf = out / "golden" / "conv2_int8.bin"
    a = np.fromfile(gf, np.int8)
    a[0] ^= 1
    a.tofile(gf)
    assert cli(["run", str(out / "rich_int.xmodel"), "--backend", "ref", "-i", str(out / "golden" / "x_aquant.bin"),
                "--golden", str(out / "golden")]) == 1
    assert "compare data fail ! layer_name conv2" in capsys.readouterr().out


@pytest.mark.parametrize("case", ["not_onnx", "nan_calib", "inf_calib", "wrong_shape", "missing"])
def test_bad_input_clear_error_no_output(tmp_path, capsys, case):
    mp = tmp_path / "m.onnx"
    onnx.save(rich_model(), mp)
    cp = tmp_path / "calib.npy"
    x = calib(8)
    want = {"not_onnx": "not an ONNX model", "nan_calib": "NaN or Inf",
            "inf_calib": "NaN or Inf", "wrong_shape": "does not match the model input", "missing": "no such file"}[case]
    if case == "not_onnx":
        mp.write_bytes(b"this is not a protobuf \x00\x01\x02" * 10)
    elif case == "nan_calib":
        x[3, 1, 2, 2] = np.nan
    elif case == "inf_calib":
        x[5, 0, 0, 0] = np.inf
    elif case == "wrong_shape":
        x = x[:, :, :8, :8]
    elif case == "missing":
        mp = tmp_path / "nope.onnx"
    np.save(cp, x)
    out = tmp_path / "out"
    rc = cli(["quantize", str(mp), "--calib", str(cp), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert want in err, err
    assert "Traceback" not in err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == []


def test_calibration_methods_differ_and_are_recorded():
    m = rich_model()
    x = calib(16)
    fps = {}
    for meth in ("maxmin", "percentile", "mse", "entropy", "diffs"):
        r = quantize(m, x, config=QuantConfig(method=meth))
        assert r.quant_info()["config"]["method"] == meth
        fps[meth] = r.qp.act_fp
        g = r.golden(x[:1])
        vals = ref_run(r, x[:1]).values
        for name, v in g.items():
            np.testing.assert_array_equal(vals[name].reshape(v.shape), v, err_msg=f"{meth} {name}")
    # maxmin never clips: every other method's calibrated (pre-constraint) position is the same or finer,
    # and at least one method differs from maxmin somewhere (the methods are not all the same rule)
    raw = {}
    for meth in ("maxmin", "percentile", "mse", "entropy", "diffs"):
        obs = quantize(m, x, config=QuantConfig(method=meth)).observers
        raw[meth] = {k: o.fix_point() for k, o in obs.items()}
    for meth in ("percentile", "mse", "entropy", "diffs"):
        assert all(raw[meth][k] >= raw["maxmin"][k] for k in raw["maxmin"]), meth
    assert any(raw[meth] != raw["maxmin"] for meth in ("mse", "entropy", "diffs"))


def test_torch_module_input():
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU6(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(4 * 4 * 4, 5)).eval()
    x = np.random.default_rng(0).normal(0, 1, (16, 1, 8, 8)).astype(np.float32)
    res = quantize(net, x, example_input=torch.zeros(1, 1, 8, 8))
    g = res.xmodel()
    assert any(op.type == "conv2d-fix" for op in g.ops.values())
    with torch.no_grad():
        want = net(torch.from_numpy(x[:4])).numpy()
    got = res.run(x[:4], "dpu")[res.prep.outputs[0]]
    assert np.mean(np.argmax(got, 1) == np.argmax(want, 1)) >= 0.75
    gold = res.golden(x[:1])
    vals = ref_run(res, x[:1]).values
    for name, v in gold.items():
        np.testing.assert_array_equal(vals[name].reshape(v.shape), v, err_msg=name)


def test_ops_the_target_cannot_run_stay_float(tmp_path, capsys):
    """A 17x17 conv exceeds the CONV kernel limit (16): with a target it stays a float CPU op, fed through
    fix2float / float2fix, and is listed with the rule's reason; softmax stays float too."""
    r = np.random.default_rng(3)
    inits = {"w1": r.normal(0, .05, (4, 3, 17, 17)), "b1": r.normal(0, .1, 4), "w2": r.normal(0, .3, (6, 4, 3, 3)),
             "b2": r.normal(0, .1, 6)}
    N = h.make_node
    m = _model([N("Conv", ["x", "w1", "b1"], ["c1"], pads=[8, 8, 8, 8], name="big"),
                N("Relu", ["c1"], ["r1"], name="r1"),
                N("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="small"),
                N("Softmax", ["c2"], ["y"], axis=1, name="softmax")], inits, [1, 3, 12, 12], ["y"])
    x = calib(16, shape=(3, 12, 12))
    res = quantize(m, x, target="DPUCZDX8G_ISA1_B512")
    big = res.prep.node("big")
    assert big.cpu and big.device == "CPU" and "conv kernel 17x17 > 16" in big.reason
    assert res.prep.node("small").quantized and res.prep.node("softmax").device == "CPU"
    g = res.xmodel()
    assert g.ops["big"].type == "conv2d" and g.ops["big"].output.dtype_name == "FLOAT32"
    assert g.ops["small"].type == "conv2d-fix"
    assert g.ops["small"].inputs["input"] == ["big_float2fix"] and g.ops["softmax"].type == "softmax"
    gold = res.golden(x[:1])
    vals = ref_run(res, x[:1]).values
    np.testing.assert_array_equal(vals["small"].reshape(gold["small"].shape), gold["small"])
    np.testing.assert_allclose(vals["big"], gold["big"], rtol=1e-4, atol=1e-5)
    want = res.run(x[:1], "dpu")[res.prep.outputs[0]].transpose(0, 2, 3, 1)
    np.testing.assert_allclose(vals["softmax"], want, rtol=1e-5, atol=1e-6)
    # without a target the conv is quantized like any other
    assert quantize(m, x).prep.node("big").quantized
    # the inspector gives the same reason
    mp = tmp_path / "m.onnx"
    onnx.save(m, mp)
    assert cli(["inspect", str(mp), "--target", "DPUCZDX8G_ISA1_B512", "-o", str(tmp_path / "insp"),
                "--verbose", "2"]) == 0
    out = capsys.readouterr().out
    assert "conv kernel 17x17 > 16" in out and "softmax" in out
    txt = (tmp_path / "insp" / "inspect_DPUCZDX8G_ISA1_B512.txt").read_text()
    assert "Start to inspect" in txt and "conv kernel 17x17 > 16" in txt


def test_bias_correction_and_fast_finetune():
    m = rich_model()
    x = calib(32)
    plain = quantize(m, x)
    bc = quantize(m, x, config=QuantConfig(bias_corr=True))
    # bias correction moves biases by E[conv(x, W - W_q)]; hand check on the first conv's mean output error
    xe = calib(32, seed=5)
    f = plain.run(xe, "float", ["conv2"])["conv2"]
    e_plain = np.abs((plain.run(xe, "dpu", ["conv2"])["conv2"] - f).mean(axis=(0, 2, 3))).mean()
    e_bc = np.abs((bc.run(xe, "dpu", ["conv2"])["conv2"] - f).mean(axis=(0, 2, 3))).mean()
    assert e_bc <= e_plain * 1.05
    # align_pool: with the avg pools' own output fix points the PTQ model is already 4 dB closer to float (37.1
    # vs 32.7 dB) and finetuning this small model no longer helps (it is reverted); the old rule leaves it room.
    # Likewise CLE (on by default: 34.7 dB instead of 32.7 here, and the finetune is reverted): off for this test
    ft = quantize(m, x, config=QuantConfig(fast_finetune=True, finetune_iters=500, seed=1, align_pool=True,
                                           cle=False))
    assert all(r["mse_tuned"] < r["mse_ptq"] for r in ft.finetune_log if r["kept"])
    assert any(r["kept"] for r in ft.finetune_log)
    assert ft.finetune_sqnr["after_db"] >= ft.finetune_sqnr["before_db"] and not ft.finetune_sqnr["reverted"]
    ft2 = quantize(m, x, config=QuantConfig(fast_finetune=True, finetune_iters=500, seed=1, align_pool=True,
                                            cle=False))
    assert ft.xmodel().serialize() == ft2.xmodel().serialize()          # seedable, deterministic
    g = ft.golden(x[:1])
    vals = ref_run(ft, x[:1]).values
    for name, v in g.items():
        np.testing.assert_array_equal(vals[name].reshape(v.shape), v, err_msg=name)


def test_fast_finetune_reverts_when_the_model_gets_worse(monkeypatch):
    """Layer-wise gains that lower the whole model's output SQNR are undone: every weight and bias, and so the
    xmodel, are PTQ's again (forced here by reporting a lower SQNR after tuning)."""
    from opendpu.quant import finetune as FT
    m, x = rich_model(), calib(32)
    plain = quantize(m, x)
    calls = iter([30.0, 20.0])
    monkeypatch.setattr(FT, "_output_sqnr", lambda ref, test: next(calls))
    ft = quantize(m, x, config=QuantConfig(fast_finetune=True, finetune_iters=60, seed=1))
    assert ft.finetune_sqnr == {"before_db": 30.0, "after_db": 20.0, "reverted": True}
    assert not any(r["kept"] for r in ft.finetune_log)
    assert any("reverted" in n for n in ft.notes)
    assert ft.xmodel().serialize() == plain.xmodel().serialize()


# ---- calibration data statistics and evaluation labels (issue 29; docs/quantizer.md "Calibration data checks")
def _digits(n=40):
    from opendpu.quant import zoo
    return zoo.digits_data()[0][:n].astype(np.float32)


def test_constant_calibration_data_is_refused_before_any_work():
    from opendpu.quant.quantize import calib_arrays
    m = _model([h.make_node("Relu", ["x"], ["y"], name="relu")], {}, [1, 1, 4, 4], ["y"])
    for v in (0.0, 0.5, -3.0):
        x = np.full((6, 1, 4, 4), v, np.float32)
        with pytest.raises(QuantError, match=f"every value of the 6 sample\\(s\\) is {v:g} \\(zero variance\\)"):
            calib_arrays(x, [1, 1, 4, 4])
        with pytest.raises(QuantError, match="zero variance"):
            quantize(m, x)
    # legal where nothing is calibrated on: evaluation data, and calibration data beside fix points given
    x = np.zeros((6, 1, 4, 4), np.float32)
    assert calib_arrays(x, [1, 1, 4, 4], check_values=False).shape == (6, 1, 4, 4)
    qi = quantize(m, np.random.default_rng(0).random((6, 1, 4, 4)).astype(np.float32)).quant_info()
    assert quantize(m, x, quant_info=qi).calib_samples == 6
    # one varying sample, or random data of any size, is fine
    for x in (np.random.default_rng(1).random((1, 1, 4, 4)), np.random.default_rng(2).standard_normal((3, 1, 4, 4))):
        assert calib_arrays(x, [1, 1, 4, 4]).shape == x.shape


def test_calibration_warnings_by_their_thresholds():
    from opendpu.quant.quantize import CALIB_OUTLIER_FACTOR, calib_warnings
    x = _digits()
    assert calib_warnings(x, "d") == []                                  # real images: nothing to say
    assert calib_warnings(np.random.default_rng(0).standard_normal((8, 3, 8, 8)).astype(np.float32), "d") == []
    same = calib_warnings(np.repeat(x[:1], 5, axis=0), "d")
    assert same == ["d: the 5 samples are identical; calibration sees one input (give varied, representative inputs)"]
    # constant images: a warning from half of the samples on, not below
    half = x.copy()
    half[:20] = -1
    assert any("20 of 40 samples are constant images (sample 0: every value is -1)" in w
               for w in calib_warnings(half, "d"))
    few = x.copy()
    few[:19] = -1
    assert not any("constant images" in w for w in calib_warnings(few, "d"))
    # an outlier: the largest |x| of one sample against the median sample's (max |x| of the digits: 1)
    for factor, warned in ((CALIB_OUTLIER_FACTOR, True), (CALIB_OUTLIER_FACTOR / 2, False)):
        o = x.copy()
        o[3] *= factor
        got = [w for w in calib_warnings(o, "d") if "reaches" in w]
        assert bool(got) == warned, (factor, got)
    o = x.copy()
    o[3] *= 1000
    (w,) = calib_warnings(o, "d")
    assert w.startswith("d: sample 3 reaches |x| = 1000, 1000x the largest |x| of the median sample (1)")
    # the spread below one step of the input's own 8-bit fix point: the DPU sees one constant input
    (w,) = calib_warnings(1000 + 1e-4 * x, "d")       # |x| <= 1000: fix point -3, a step of 8
    assert "differ by less than one step (2^3) of the input's 8-bit fix point -3" in w and w.endswith("input 125")
    (w,) = calib_warnings(1e-5 * (x + 1), "d")        # below 2^-13: the capped fix point 12 rounds it all to 0
    assert "fix point 12" in w and w.endswith("constant input 0")
    assert calib_warnings(1e-3 * (x + 1), "d") == []  # 2^-10 .. : several int8 values at fix point 12
    # constant data is calib_arrays' error; calib_warnings adds nothing to it
    assert calib_warnings(np.zeros((3, 1, 2, 2), np.float32), "d") == []


def test_labels_outside_the_model_classes_are_refused(tmp_path, capsys):
    from opendpu.quant import zoo
    from opendpu.quant.quantize import check_labels, eval_arrays, output_classes
    assert output_classes(zoo.DIGITS_ONNX, [1, 1, 8, 8]) == 10
    x = _digits(12)
    _, y = eval_arrays(x, [1, 1, 8, 8], np.arange(12) % 10, classes=10)
    assert list(y) == list(np.arange(12) % 10)
    for labels, found, n in ((np.arange(12), "10..11", 2), (np.array([-1] + [0] * 11), "-1", 1),
                             (np.full(12, 10.0), "10", 12)):
        with pytest.raises(QuantError, match=f"{n} of 12 labels are outside the model's 10 classes 0..9 "
                                             f"\\(found {found}\\)"):
            eval_arrays(x, [1, 1, 8, 8], labels, classes=10)
    check_labels(np.array([0, 9]), 10)
    with pytest.raises(QuantError, match="non-integral"):
        eval_arrays(x, [1, 1, 8, 8], np.arange(12) + 0.5, classes=10)
    # the library's evaluate checks them too: never a silent accuracy of 0 %
    res = quantize(zoo.DIGITS_ONNX, x, config=QuantConfig(method="maxmin"))
    assert res.evaluate(x, np.arange(12) % 10)["samples"] == 12
    with pytest.raises(QuantError, match="outside the model's 10 classes"):
        res.evaluate(x, np.arange(12) + 5)
    # the CLI: checked before calibration, one line naming the file
    cp, ev = tmp_path / "c.npy", tmp_path / "ev.npz"
    np.save(cp, x)
    np.savez(ev, x=x, y=np.arange(12) + 100)
    rc = cli(["quantize", zoo.DIGITS_ONNX, "--calib", str(cp), "--evaluate", str(ev), "-o", str(tmp_path / "q")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"opendpu quantize: error: --evaluate {ev}: ")
    assert "12 of 12 labels are outside the model's 10 classes 0..9 (found 100..111)" in err[0]
    assert not (tmp_path / "q").exists()


def _tiny_weight_conv(scale: float = 1e-4):
    """A 1x1 conv whose weights are near `scale` (a BatchNorm of huge running variance folded in, as PP-OCRv4 det's
    head) on inputs of std 1,000."""
    r = np.random.default_rng(0)
    w = (r.normal(0, 1, (8, 16, 1, 1)) * scale).astype(np.float32)
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 16, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 8, 8])], [nh.from_array(w, "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m, w, r.normal(0, 1000, (16, 16, 8, 8)).astype(np.float32)


def test_weight_cap_lifted_where_it_zeroes_a_layer():
    """vai_q's cap of 12 would zero 96 of the 128 weights (max |w| 2.3e-4 < 2^-12 = 2.44e-4 for most): the layer
    takes its own fix point (127 * 2^-19 = 2.4e-4 >= max |w|), with an adjustment naming the rule, and its SQNR
    against float goes from a few dB to over 30. With weight_fp_lift False the cap binds, as in vai_q."""
    m, w, x = _tiny_weight_conv()
    assert 127 * 2.0 ** -20 < np.abs(w).max() <= 127 * 2.0 ** -19           # maxmin's fix point is 19, by hand
    capped = quantize(m, x, config=QuantConfig(cle=False, weight_fp_lift=False))
    lifted = quantize(m, x, config=QuantConfig(cle=False))
    assert capped.qp.w_fp["conv"] == 12 and lifted.qp.w_fp["conv"] == 19
    assert np.sum(capped.qp.w_q["conv"] != 0) == 32 and np.sum(lifted.qp.w_q["conv"] != 0) >= 120
    (adj,) = [a for a in lifted.adjustments if a["tensor"] == "conv_weights"]
    assert (adj["from"], adj["to"]) == (12, 19) and "75% of the nonzero weights" in adj["rule"]
    assert not capped.adjustments
    sq_c = capped.layer_errors(x[:4])[0]["sqnr_db"]
    sq_l = lifted.layer_errors(x[:4])[0]["sqnr_db"]
    assert sq_c < 6 and sq_l > 30, (sq_c, sq_l)


def test_weight_cap_kept_where_it_costs_little():
    """Weights a little below 2^-12 * 127 (the cap binds, but at most a quarter of them round to zero) keep
    vai_q's cap: the lift is for layers the cap destroys, not a new rule for every small tensor."""
    m, w, x = _tiny_weight_conv(0.01)
    res = quantize(m, x, config=QuantConfig(cle=False))
    assert res.qp.w_fp["conv"] == 12 and not res.adjustments
    assert np.mean(res.qp.w_q["conv"] == 0) < 0.25
