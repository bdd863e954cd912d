"""Bad ONNX input to `opendpu quantize`, `inspect` and `build` (issue acceptance): a truncated file, an external-data
model whose data file is missing, two inputs, a rank-3 input, an int64 input. Each is one line
`opendpu VERB: error: ...` naming the file and the problem, exit code 2, and nothing written (no output directory,
no other file, the inputs unchanged). Controls: the same models made valid (external data present, a rank-2 [1, K]
input) are accepted, so the checks refuse only what they should.

The CLI runs in-process with OPENDPU_DEBUG=1, so an unexpected exception fails the test instead of becoming an
"internal error" line. Models are built with onnx.helper in a temporary directory."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opendpu.quant.onnx_in import QuantError, load_onnx
from opendpu.runtime.cli import main as cli

VERBS = ("quantize", "inspect", "build")


def _conv_model(in_shape=(1, 3, 8, 8), in_type=TensorProto.FLOAT, second_input=False) -> onnx.ModelProto:
    """x -> Conv 3x3 (3 -> 4, pad 1) [-> Add of a second input]: the base of every case."""
    r = np.random.RandomState(0)
    init = [numpy_helper.from_array(r.randn(4, 3, 3, 3).astype(np.float32), "conv.weight"),
            numpy_helper.from_array(r.randn(4).astype(np.float32), "conv.bias")]
    nodes = [helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["y"], pads=[1, 1, 1, 1], name="conv")]
    ins = [helper.make_tensor_value_info("x", in_type, list(in_shape))]
    out = "y"
    if second_input:
        ins.append(helper.make_tensor_value_info("bias_map", TensorProto.FLOAT, [1, 4, 8, 8]))
        nodes.append(helper.make_node("Add", ["y", "bias_map"], ["z"], name="add"))
        out = "z"
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 4, 8, 8])],
                          init)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _single_op_model(op: str, in_type, shape, out_type=TensorProto.FLOAT, **attrs) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="op", **attrs)], "g",
                          [helper.make_tensor_value_info("x", in_type, list(shape))],
                          [helper.make_tensor_value_info("y", out_type, list(shape))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _save_external(m: onnx.ModelProto, path) -> None:
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin",
                    size_threshold=0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{case: model path} plus the calibration arrays, in one directory of their own."""
    d = tmp_path_factory.mktemp("bad_onnx")
    p = {}
    onnx.save(_conv_model(), d / "ok.onnx")
    p["ok"] = d / "ok.onnx"
    data = (d / "ok.onnx").read_bytes()
    (d / "truncated.onnx").write_bytes(data[:len(data) // 2])
    p["truncated"] = d / "truncated.onnx"
    (d / "ext").mkdir()
    _save_external(_conv_model(), d / "ext" / "model.onnx")
    os.remove(d / "ext" / "w.bin")
    p["external_missing"] = d / "ext" / "model.onnx"
    onnx.save(_conv_model(second_input=True), d / "two_inputs.onnx")
    p["two_inputs"] = d / "two_inputs.onnx"
    onnx.save(_single_op_model("Relu", TensorProto.FLOAT, [1, 3, 32]), d / "rank3.onnx")
    p["rank3"] = d / "rank3.onnx"
    onnx.save(_single_op_model("Cast", TensorProto.INT64, [1, 3, 8, 8], to=TensorProto.FLOAT), d / "int64.onnx")
    p["int64"] = d / "int64.onnx"
    np.save(d / "calib.npy", np.random.RandomState(1).rand(4, 3, 8, 8).astype(np.float32))
    p["calib"] = d / "calib.npy"
    return p


# case -> substrings the error line must hold (besides the model's file name)
CASES = {
    "truncated": ["truncated.onnx", "not an ONNX model", "truncated"],
    "external_missing": ["model.onnx", "external data file w.bin", "conv.weight", "missing"],
    "two_inputs": ["two_inputs.onnx", "2 inputs (x, bias_map)", "single-input"],
    "rank3": ["rank3.onnx", "input 'x' has rank 3 [1, 3, 32]", "rank 4", "rank-2 [1, K]"],
    "int64": ["int64.onnx", "input 'x' is int64", "only float inputs"],
}


def _argv(verb: str, model, calib, out) -> list[str]:
    if verb == "quantize":
        return ["quantize", str(model), "--calib", str(calib), "-o", str(out)]
    if verb == "inspect":
        return ["inspect", str(model), "--target", "DPUCZDX8G_ISA1_B4096", "-o", str(out)]
    return ["build", str(model), "--calib", str(calib), "--target", "DPUCZDX8G_ISA1_B4096", "-o", str(out)]


def _snapshot(d) -> dict[str, str]:
    """{relative path: md5} of every file under d."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            full = os.path.join(root, f)
            out[os.path.relpath(full, d)] = hashlib.md5(open(full, "rb").read()).hexdigest()
    return out


def _refused(argv, tmp_path, monkeypatch, capsys, must):
    """Run argv from an empty working directory: exit 2, one error line holding `must`, nothing written."""
    monkeypatch.setenv("OPENDPU_DEBUG", "1")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    inputs = os.path.dirname(argv[1])
    before = _snapshot(inputs)
    rc = cli(argv)
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert rc == 2, (rc, cap.err)
    assert len(err) == 1 and err[0].startswith(f"opendpu {argv[0]}: error: "), cap.err
    for s in must:
        assert s in err[0], (s, err[0])
    assert "Traceback" not in cap.err
    out = argv[argv.index("-o") + 1]
    assert not os.path.exists(out)
    assert os.listdir(cwd) == []
    assert _snapshot(inputs) == before


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("case", list(CASES))
def test_bad_onnx_is_one_line_exit_2_nothing_written(models, case, verb, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    _refused(_argv(verb, models[case], models["calib"], out), tmp_path, monkeypatch, capsys, CASES[case])


def test_truncated_anywhere_is_refused(models, tmp_path, monkeypatch, capsys):
    """Every prefix of a valid model (cut at 24 places, the last bytes included) is refused with the file named."""
    data = models["ok"].read_bytes()
    cuts = sorted(set(list(range(1, len(data), max(1, len(data) // 16))) + list(range(len(data) - 8, len(data)))))
    monkeypatch.setenv("OPENDPU_DEBUG", "1")
    for n in cuts:
        p = tmp_path / f"cut_{n}.onnx"
        p.write_bytes(data[:n])
        rc = cli(_argv("inspect", p, models["calib"], tmp_path / "never"))
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and f"cut_{n}.onnx" in err[0], (n, err)
        assert not (tmp_path / "never").exists()


def test_external_data_truncated_or_outside_the_directory(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    _save_external(_conv_model(), d / "model.onnx")
    (d / "w.bin").write_bytes((d / "w.bin").read_bytes()[:100])      # conv.weight needs 4*3*3*3*4 = 432 bytes
    with pytest.raises(QuantError, match=r"w\.bin is truncated: tensor conv\.weight needs bytes 0\.\.432 but the "
                                         r"file has 100 bytes"):
        load_onnx(str(d / "model.onnx"))
    m = onnx.load(str(d / "model.onnx"), load_external_data=False)
    for e in m.graph.initializer[0].external_data:
        if e.key == "location":
            e.value = "../w.bin"
    onnx.save(m, str(d / "escape.onnx"))
    with pytest.raises(QuantError, match=r"escape\.onnx: external data file \.\./w\.bin \(tensor conv\.weight\) lies "
                                         r"outside the model's directory"):
        load_onnx(str(d / "escape.onnx"))


def test_input_without_shape_and_other_ranks(tmp_path):
    from opendpu.quant.onnx_in import _static_input_shapes
    m = _single_op_model("Relu", TensorProto.FLOAT, [1, 3, 8, 8])
    m.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(QuantError, match=r"input 'x' has no shape; give input_shape"):
        _static_input_shapes(m, "noshape.onnx")
    assert _static_input_shapes(m, "noshape.onnx", [1, 3, 8, 8]) == [("x", [1, 3, 8, 8])]
    for shape in ([8], [1, 3, 8, 8, 2]):
        with pytest.raises(QuantError, match=rf"input 'x' has rank {len(shape)} "):
            _static_input_shapes(_single_op_model("Relu", TensorProto.FLOAT, shape), "r.onnx")
    m = _single_op_model("Relu", TensorProto.FLOAT, [1, 3, 8])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    with pytest.raises(QuantError, match=r"input 'x' has rank 3 \['N', 3, 'H'\]"):     # dynamic dims by name
        _static_input_shapes(m, "dyn.onnx")


# ---- controls: what the checks must keep accepting ------------------------------------------------------------
def test_external_data_present_is_read(models, tmp_path, capsys):
    """The external-data model with its w.bin in place loads with the very weights that were saved."""
    d = tmp_path / "ext_ok"
    d.mkdir()
    src = _conv_model()
    want = {t.name: numpy_helper.to_array(t).copy() for t in src.graph.initializer}
    _save_external(src, d / "model.onnx")                   # (moves the proto's data out to w.bin)
    assert os.path.getsize(d / "w.bin") == (4 * 3 * 3 * 3 + 4) * 4
    m = load_onnx(str(d / "model.onnx"))
    got = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    assert set(got) == {"conv.weight", "conv.bias"}
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    assert cli(["inspect", str(d / "model.onnx"), "--target", "B4096", "-o", str(tmp_path / "i"), "--verbose",
                "0"]) == 0
    assert os.path.isfile(tmp_path / "i" / "inspect_DPUCZDX8G_ISA1_B4096.txt")


def test_rank2_input_quantizes(tmp_path, capsys):
    """A [1, K] input (a dense classifier) is allowed: quantize runs it end to end."""
    r = np.random.RandomState(2)
    init = [numpy_helper.from_array(r.randn(10, 16).astype(np.float32), "fc.weight"),
            numpy_helper.from_array(r.randn(10).astype(np.float32), "fc.bias")]
    g = helper.make_graph([helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["y"], transB=1, name="fc")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "dense.onnx")
    np.save(tmp_path / "calib.npy", r.rand(8, 16).astype(np.float32))
    assert cli(["quantize", str(tmp_path / "dense.onnx"), "--calib", str(tmp_path / "calib.npy"), "-o",
                str(tmp_path / "q"), "--method", "maxmin"]) == 0
    assert os.path.isfile(tmp_path / "q" / "dense_int.xmodel")
