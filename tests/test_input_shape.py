"""--input-shape (issue 14, first point): a model whose input has dynamic H and W quantizes, inspects and builds
with the shape given on the command line or taken from the calibration data, and gives the same quantized model as
the static original; a dynamic model without a shape is a one-line error naming the option."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from opendpu.compiler.xir.graph import Graph
from opendpu.quant import zoo
from opendpu.runtime.cli import main as cli
from opendpu.runtime.runner import GraphRunner


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("dyn")
    m = onnx.load(zoo.DIGITS_ONNX)
    dims = m.graph.input[0].type.tensor_type.shape.dim
    for k, p in ((2, "H"), (3, "W")):
        dims[k].ClearField("dim_value")
        dims[k].dim_param = p
    onnx.save(m, str(d / "dyn.onnx"))
    x = zoo.digits_data()[0][:32]
    np.save(str(d / "calib.npy"), x)
    return d


def _outputs(path, x):
    g = Graph.load(path)
    gr = GraphRunner(g, backend="ref")
    return [np.concatenate([v for v in gr.run([x[i:i + 1].transpose(0, 2, 3, 1)]).outputs.values()])
            for i in range(len(x))]


def test_dynamic_model_quantizes_like_the_static_one(files, capsys):
    d = files
    assert cli(["quantize", str(d / "dyn.onnx"), "--calib", str(d / "calib.npy"), "-o", str(d / "q1"),
                "--input-shape", "1,1,8,8"]) == 0
    assert cli(["quantize", str(d / "dyn.onnx"), "--calib", str(d / "calib.npy"), "-o", str(d / "q2")]) == 0
    assert cli(["quantize", zoo.DIGITS_ONNX, "--calib", str(d / "calib.npy"), "-o", str(d / "q0")]) == 0
    x = zoo.digits_data()[2][:16]
    ref = _outputs(str(d / "q0" / "digits_cnn_int.xmodel"), x)
    for q in ("q1", "q2"):
        got = _outputs(str(d / q / "dyn_int.xmodel"), x)
        assert len(got) == len(ref) and all(np.array_equal(a, b) for a, b in zip(got, ref))


def test_inspect_and_build_take_the_shape(files, capsys):
    d = files
    assert cli(["inspect", str(d / "dyn.onnx"), "--target", "B512", "--input-shape", "1,1,8,8",
                "-o", str(d / "i")]) == 0
    assert cli(["build", str(d / "dyn.onnx"), "--calib", str(d / "calib.npy"), "--target", "B512",
                "--input-shape", "1,1,8,8", "-o", str(d / "b")]) == 0
    assert os.path.isfile(d / "b" / "compiled" / "dyn.xmodel")
    assert "0 mismatching" in capsys.readouterr().out


@pytest.mark.parametrize("args, msg", [
    (["inspect", "{m}", "--target", "B512", "-o", "{o}"], "input shape 1,1,H,W (NCHW): dimension 2 (H) and "
                                                          "dimension 3 (W) are dynamic; give --input-shape N,C,H,W"),
    (["quantize", "{m}", "--calib", "{c}", "-o", "{o}", "--input-shape", "1,1,9,8"], "does not match the model input"),
    (["quantize", "{m}", "--calib", "{c}", "-o", "{o}", "--input-shape", "1,x"], "is not a shape like"),
    (["quantize", "{m}", "--calib", "{c}", "-o", "{o}", "--input-shape", "1,0,8,8"], "each in 1.."),
])
def test_bad_shapes_are_one_line_errors(files, capsys, args, msg):
    d = files
    out = str(d / "never")
    argv = [a.format(m=str(d / "dyn.onnx"), c=str(d / "calib.npy"), o=out) for a in args]
    try:
        rc = cli(argv)
    except SystemExit as e:          # argparse usage errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert msg in err[-1] and "Traceback" not in "\n".join(err)
    assert not os.path.exists(out)



def test_shape_from_the_calibration_data_is_said(files, capsys):
    """One rule: a dynamic H/W comes from --input-shape, else from the calibration data (a file of [N, C, H, W], or
    a folder's first file, [N, C, H, W] or one [C, H, W] sample), and quantize / build say so in a line; given
    --input-shape, no such line."""
    d = files
    x = np.load(d / "calib.npy")
    folder = d / "samples"
    folder.mkdir()
    for i in range(4):
        np.save(folder / f"s{i}.npy", x[i])                   # one [1, 8, 8] sample per file
    for calib in (d / "calib.npy", folder):
        out = d / f"qs_{calib.name}"
        assert cli(["quantize", str(d / "dyn.onnx"), "--calib", str(calib), "-o", str(out)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == (f"input shape 1,1,H,W (NCHW) of {d / 'dyn.onnx'} taken from the calibration data "
                            f"{calib}: 1,1,8,8; --input-shape N,C,H,W sets it")
    assert cli(["quantize", str(d / "dyn.onnx"), "--calib", str(folder), "-o", str(d / "qs_given"),
                "--input-shape", "1,1,8,8"]) == 0
    assert "taken from the calibration data" not in capsys.readouterr().out
    assert cli(["quantize", zoo.DIGITS_ONNX, "--calib", str(d / "calib.npy"), "-o", str(d / "qs_static")]) == 0
    assert "taken from" not in capsys.readouterr().out


def test_input_shape_names_its_layout(files, capsys):
    """--input-shape is the ONNX model's NCHW; a shape that reads as NHWC is named so, with the NCHW to give."""
    d = files
    for model, shown in ((zoo.DIGITS_ONNX, "1,1,8,8"), (str(d / "dyn.onnx"), "1,1,H,W")):
        rc = cli(["quantize", model, "--calib", str(d / "calib.npy"), "-o", str(d / "never"),
                  "--input-shape", "1,8,8,1"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1
        assert err[0] == (f"opendpu quantize: error: --input-shape 1,8,8,1 does not match the model input {shown} "
                          f"(NCHW) of {model}; 1,8,8,1 reads as NHWC, but --input-shape takes the ONNX model's own "
                          f"layout: 1,1,8,8")
    assert not os.path.exists(d / "never")
