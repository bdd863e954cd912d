"""`--exclude-nodes` / QuantConfig.nodes_to_exclude (vai_q_onnx's nodes_to_exclude): the named ONNX nodes stay float
on the CPU, what is around them still quantizes, the compiled program still equals the reference, and a name that
is not in the model is an error naming it with nothing written."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opendpu.quant.onnx_in import QuantError
from opendpu.quant.quantize import QuantConfig, quantize
from opendpu.runtime.cli import main as cli
from opendpu.runtime.compare import compare

B512 = "DPUCZDX8G_ISA1_B512"


def _model(path) -> str:
    """x [1,3,8,8] -> conv1 -> relu1 -> conv2 -> y: the ReLU would fuse into conv1 unless it is excluded."""
    rng = np.random.default_rng(3)
    w = {"w1": rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "b1": rng.normal(0, 0.1, 8).astype(np.float32),
         "w2": rng.normal(0, 0.3, (4, 8, 3, 3)).astype(np.float32), "b2": rng.normal(0, 0.1, 4).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "excl", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [numpy_helper.from_array(v, k) for k, v in w.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return str(path)


def _data(tmp_path):
    x = np.random.default_rng(4).uniform(-1, 1, (48, 3, 8, 8)).astype(np.float32)
    np.save(tmp_path / "calib.npy", x[:32])
    np.save(tmp_path / "eval.npy", x[32:])


def test_an_excluded_activation_stays_float_and_is_not_fused(tmp_path, capsys):
    _data(tmp_path)
    p = _model(tmp_path / "excl.onnx")
    out = tmp_path / "build"
    assert cli(["build", p, "--calib", str(tmp_path / "calib.npy"), "--target", B512, "-o", str(out),
                "--exclude-nodes", "relu1"]) == 0
    text = capsys.readouterr().out
    assert "0 mismatching" in text and "FAIL" not in text
    meta = json.load(open(out / "compiled" / "meta.json"))
    cpu = {c["name"]: c["reason"] for c in meta["coverage"]["cpu_ops"]}
    assert list(cpu) == ["relu1"] and "nodes_to_exclude" in cpu["relu1"], cpu
    assert meta["coverage"]["macs_dpu_pct"] == 100.0            # both convs stay on the DPU, conv1 without a ReLU
    q = json.load(open(out / "quantized" / "quant_info.json"))
    assert q["config"]["nodes_to_exclude"] == ["relu1"]
    res = compare(p, str(out), str(tmp_path / "eval.npy"), task="raw")
    assert res["outputs"][0]["sqnr_db"] > 25, res["outputs"]


def test_exclusion_by_output_tensor_name(tmp_path):
    _data(tmp_path)
    p = _model(tmp_path / "excl.onnx")
    x = np.load(tmp_path / "calib.npy")
    res = quantize(p, x, target=B512, config=QuantConfig(nodes_to_exclude=("c1",)))
    kinds = {n.name: (n.kind, n.reason) for n in res.prep.nodes}
    assert kinds["conv1"][0] == "float" and "nodes_to_exclude" in kinds["conv1"][1], kinds
    assert kinds["conv2"][0] == "conv"
    # float conv1 + ReLU, then INT8 conv2: against the float model within the output's quantization steps
    import onnxruntime as ort
    sess = ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    want = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(8)])
    got = np.asarray(res.run(x[:8], "dpu")["conv2"], np.float64)          # NCHW, as the ONNX model
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()


def test_an_unknown_name_is_an_error_and_nothing_is_written(tmp_path, capsys):
    _data(tmp_path)
    p = _model(tmp_path / "excl.onnx")
    out = tmp_path / "q"
    assert cli(["quantize", p, "--calib", str(tmp_path / "calib.npy"), "-o", str(out),
                "--exclude-nodes", "relu1,/relu9/Relu"]) == 2
    err = capsys.readouterr().err
    assert "nodes_to_exclude" in err and "'/relu9/Relu'" in err and "'relu1'" not in err.split("named")[1][:30]
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert cli(["quantize", p, "--calib", str(tmp_path / "calib.npy"), "-o", str(out), "--exclude-nodes", "a,,b"]) \
        == 2
    assert "node names" in capsys.readouterr().err and not out.exists()


def test_config_rejects_a_bare_string():
    with pytest.raises(QuantError, match="nodes_to_exclude"):
        QuantConfig(nodes_to_exclude="relu1").validate()
