"""Issue 30 part 5: `opendpu build` states the INT8 model's agreement with the float model on samples not used for
calibration (held-out calibration samples, or --evaluate), names the first collapsing layer of the quantize report,
and fails below --min-sqnr."""
import json
import os
import re

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from opendpu.quant import zoo
from opendpu.runtime.cli import main as cli
from opendpu.runtime.verdict import first_collapse, holdout

B512 = "DPUCZDX8G_ISA1_B512"
LINE = re.compile(r"^accuracy vs float \(compiled model on ref\) on (\d+) (.*?): output 'output' SQNR ([0-9.]+) dB; "
                  r"top-1 agreement (\d+)/(\d+)$", re.M)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("verdict")
    xtr, _, xte, yte = zoo.digits_data()
    np.save(d / "calib.npy", xtr[:40])
    np.save(d / "calib10.npy", xtr[:10])
    np.savez(d / "test.npz", x=xte[:30], y=yte[:30])
    return d


def _build(capsys, d, out, *extra, model=zoo.DIGITS_ONNX, calib="calib.npy"):
    capsys.readouterr()
    rc = cli(["build", str(model), "--calib", str(d / calib), "--target", B512, "-o", str(d / out), *extra])
    o, e = capsys.readouterr()
    return rc, o, e


def test_holdout_rule():
    assert [holdout(n) for n in (1, 15, 16, 23, 24, 40, 64, 1000)] == [0, 0, 2, 2, 3, 5, 8, 125]


def test_digits_build_states_accuracy_on_held_out_samples(data, capsys):
    rc, out, err = _build(capsys, data, "b")
    assert rc == 0, err
    m = LINE.search(out)
    assert m, out[-2000:]
    n, where, sqnr, agree, total = m.groups()
    assert (n, total) == ("5", "5") and "held-out" in where and "the last 5 of 40" in where
    assert float(sqnr) > 25.0 and int(agree) >= 4
    assert "on 35 calibration samples" in out        # the held-out samples did not calibrate
    assert "first collapsing layer" not in out and "warning" not in err
    v = json.loads((data / "b" / "accuracy.json").read_text())
    assert v["samples"] == 5 and v["task"] == "classify" and v["first_collapse"] is None
    assert abs(v["min_sqnr_db"] - float(sqnr)) < 0.06 and not v["below_floor"]


def test_small_calibration_set_says_none_held_out(data, capsys):
    rc, out, _ = _build(capsys, data, "b10", calib="calib10.npy")
    assert rc == 0
    m = LINE.search(out)
    assert m and m.group(1) == "10" and "none held out" in m.group(2)
    assert "on 10 calibration samples" in out


def test_evaluate_data_used_and_all_calibration_samples_calibrate(data, capsys):
    rc, out, _ = _build(capsys, data, "be", "--evaluate", str(data / "test.npz"))
    assert rc == 0
    m = LINE.search(out)
    assert m and m.group(1) == "30" and m.group(2) == f"samples of {data / 'test.npz'}"
    assert "on 40 calibration samples" in out


def test_min_sqnr_fails_after_writing(data, capsys):
    rc, out, _ = _build(capsys, data, "bm", "--min-sqnr", "200")
    assert rc == 1
    assert re.search(r"^opendpu build: accuracy below --min-sqnr 200 dB: smallest output SQNR [0-9.]+ dB \(exit 1\)$",
                     out, re.M), out[-1500:]
    v = json.loads((data / "bm" / "accuracy.json").read_text())
    assert v["below_floor"] and v["min_sqnr_floor"] == 200
    assert os.path.isfile(data / "bm" / "compiled" / "digits_cnn.xmodel")
    rc, out, _ = _build(capsys, data, "bm2", "--min-sqnr", "10")
    assert rc == 0 and "accuracy below" not in out


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "ten"])
def test_min_sqnr_must_be_finite(data, capsys, bad):
    rc, out, err = _build(capsys, data, "bx", "--min-sqnr", bad)
    assert rc == 2 and "--min-sqnr" in err and out == ""
    assert not os.path.exists(data / "bx")


def _planted(d) -> str:
    """The digits CNN with one channel of the second conv dead in float (BN gamma x300, beta -3000: always below
    ReLU's zero) but dominating the layer's per-tensor weight and bias ranges: without CLE every live channel's
    weights round to a step of 2 and the layer's output collapses."""
    m = onnx.load(zoo.DIGITS_ONNX)
    for i in m.graph.initializer:
        if i.name in ("features.5.weight", "features.5.bias"):
            a = numpy_helper.to_array(i).copy()
            a[0] = a[0] * 300 if i.name.endswith("weight") else -3000.0
            i.CopyFrom(numpy_helper.from_array(a, i.name))
    p = str(d / "planted.onnx")
    onnx.save(m, p)
    return p


def test_planted_collapse_names_the_layer(data, capsys):
    rc, out, err = _build(capsys, data, "bp", "--no-cle", model=_planted(data))
    assert rc == 0                                      # no --min-sqnr: a warning, not a failure
    m = LINE.search(out)
    assert m and float(m.group(3)) < 3.0, out[-2000:]
    assert re.search(r"^  first collapsing layer \(quantize report\): /features/features\.4/Conv \(conv\) SQNR "
                     r"[0-9.]+ dB, its input [0-9.]+ dB; weights at fix point -?\d+", out, re.M), out[-2000:]
    assert "what helps: --exclude-nodes /features/features.4/Conv" in out and "CLE (drop --no-cle)" in out
    assert "warning: an output of the INT8 model does not follow the float model" in err
    v = json.loads((data / "bp" / "accuracy.json").read_text())
    assert v["collapsed"] and v["first_collapse"]["layer"] == "/features/features.4/Conv"
    # the float model is untouched by the plant where it matters: CLE (the default) rescues most of it
    rc, out, err = _build(capsys, data, "bq", model=data / "planted.onnx")
    m = LINE.search(out)
    assert rc == 0 and m and float(m.group(3)) > 10.0 and "does not follow" not in err


def test_first_collapse_rules():
    rows = [{"layer": "a", "kind": "conv", "inputs": ["in"], "sqnr_db": 35.0},
            {"layer": "b", "kind": "conv", "inputs": ["a"], "sqnr_db": 28.0},      # -7 dB: normal
            {"layer": "c", "kind": "conv", "inputs": ["b"], "sqnr_db": 15.0, "weight_fix_point": 2},   # -13, < 20
            {"layer": "d", "kind": "conv", "inputs": ["c"], "sqnr_db": 5.0}]
    c = first_collapse({"layers": rows, "adjustments": [{"tensor": "c", "from": 6, "to": 3, "rule": "concat"}]})
    assert c["layer"] == "c" and c["input_sqnr_db"] == 28.0
    assert any("fix point 6 -> 3" in r for r in c["reasons"]) and any("step 2^-2" in r for r in c["reasons"])
    assert first_collapse({"layers": rows[:2]}) is None
    # an exact input (inf) is capped: 35 dB after it is no cliff
    assert first_collapse({"layers": [{"layer": "r", "kind": "reshape", "inputs": [], "sqnr_db": float("inf")},
                                      {"layer": "x", "kind": "conv", "inputs": ["r"], "sqnr_db": 35.0}]}) is None
    assert first_collapse({"layers": [{"layer": "x", "kind": "conv", "inputs": [], "sqnr_db": 8.0}]})["layer"] == "x"


def test_verdict_of_a_zero_float_output_and_an_exact_one():
    from opendpu.runtime.verdict import format_verdict, verdict
    rep = {"samples": 3, "backend": "ref", "task": "raw", "metric": {},
           "outputs": [{"name": "a", "sqnr_db": float("-inf")}, {"name": "b", "sqnr_db": float("inf")}]}
    v = verdict(rep, "calibration samples", None, 10.0)
    assert v["collapsed"] and v["below_floor"] and v["min_sqnr_db"] is None
    assert json.loads(json.dumps({k: x for k, x in v.items() if not k.startswith("_")}))["outputs"][1]["exact"]
    line, = format_verdict(v)
    assert line == ("accuracy vs float (compiled model on ref) on 3 calibration samples: output 'a' SQNR -inf (float "
                    "output all zero); output 'b' SQNR inf (exact)")
