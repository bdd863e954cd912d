"""`opendpu compare` (runtime/compare.py): the metrics against hand-computed values, and the digits CNN built for
B512 compared end to end against onnxruntime (the float model, and the build's own QDQ model, which computes what
the DPU computes); wrong pairings and bad input are refused with exit 2 and write nothing."""
from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from opendpu.quant import zoo
from opendpu.runtime.cli import main as cli
from opendpu.runtime.compare import (DetectionTally, box_iou, compare, decode_yolo, match_detections, nms,
                                     sqnr_db, to_json)

TARGET = "DPUCZDX8G_ISA1_B512"


# ---- metrics against hand computations --------------------------------------------------------------------
def test_sqnr_by_hand():
    ref = np.array([3.0, 4.0])                      # Σ ref² = 25
    test = np.array([3.0, 3.0])                     # Σ err² = 1  -> 10·log10(25) = 13.9794 dB
    assert sqnr_db(ref, test) == pytest.approx(13.979400086720377, abs=1e-12)
    assert sqnr_db([1.0, -2.0, 2.0], [1.5, -2.0, 1.5]) == pytest.approx(10 * math.log10(9 / 0.5), abs=1e-12)
    assert sqnr_db(ref, ref) == math.inf
    assert sqnr_db([0.0, 0.0], [0.0, 1.0]) == -math.inf


def test_iou_and_nms_by_hand():
    a, b = [0, 0, 10, 10], [1, 1, 11, 11]
    assert box_iou([a], [b])[0, 0] == pytest.approx(81 / 119)           # 9x9 overlap, 100 + 100 - 81
    assert box_iou([a], [[5, 0, 15, 10]])[0, 0] == pytest.approx(1 / 3)  # 50 / 150
    assert box_iou([a], [[20, 20, 30, 30]])[0, 0] == 0.0
    boxes = np.array([a, b, [5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 10, 4.5]], float)
    scores = np.array([0.9, 0.8, 0.7, 0.95, 0.5])
    # D (0.95) kept; A (0.9) kept; B IoU 0.68 with A dropped; C IoU 1/3 kept; E IoU exactly 0.45 with A kept
    assert nms(boxes, scores, 0.45).tolist() == [3, 0, 2, 4]
    assert nms(boxes, scores, 0.3).tolist() == [3, 0]       # at 0.3, C (1/3) and E (0.45) go too


def _yolo(rows):
    """[4+nc, N] from rows of (x1, y1, x2, y2, class scores...) given per anchor."""
    r = np.asarray(rows, np.float32)
    cx, cy = (r[:, 0] + r[:, 2]) / 2, (r[:, 1] + r[:, 3]) / 2
    w, h = r[:, 2] - r[:, 0], r[:, 3] - r[:, 1]
    return np.concatenate([np.stack([cx, cy, w, h]), r[:, 4:].T], axis=0)


FLOAT_HEAD = _yolo([[0, 0, 10, 10, 0.9, 0.1],        # class 0, 0.9: kept
                    [1, 1, 11, 11, 0.8, 0.3],        # class 0, 0.8: IoU 0.68 with the first -> NMS drops it
                    [1, 1, 11, 11, 0.1, 0.6],        # class 1, 0.6: kept (NMS is class-wise)
                    [50, 50, 60, 60, 0.2, 0.24],     # best score 0.24 < 0.25: dropped
                    [20, 20, 30, 30, 0.05, 0.7]])    # class 1, 0.7: kept
DPU_HEAD = _yolo([[0, 0, 10, 11, 0.85, 0.0],         # matches float #1 (IoU 100/110)
                  [20, 20, 30, 30, 0.7, 0.0],        # same box as float #3 but class 0: no match
                  [2, 2, 12, 12, 0.0, 0.55],         # matches float #2 (IoU 81/119, class 1)
                  [40, 40, 50, 50, 0.0, 0.5]])       # nothing there in float


def test_decode_yolo_by_hand():
    boxes, scores, cls = decode_yolo(FLOAT_HEAD, 0.25)
    assert boxes.tolist() == [[0, 0, 10, 10], [20, 20, 30, 30], [1, 1, 11, 11]]
    assert scores == pytest.approx([0.9, 0.7, 0.6]) and cls.tolist() == [0, 1, 1]
    t = decode_yolo(FLOAT_HEAD.T, 0.25, channels_first=False)       # the transposed [N, 4+nc] form
    assert all(np.array_equal(u, v) for u, v in zip(t, (boxes, scores, cls)))
    assert len(decode_yolo(FLOAT_HEAD, 0.95)[0]) == 0


def test_matching_by_hand():
    f, d = decode_yolo(FLOAT_HEAD, 0.25), decode_yolo(DPU_HEAD, 0.25)
    assert len(d[0]) == 4
    assert match_detections(f, d, 0.5) == 2
    assert match_detections(f, d, 0.8) == 1                 # 81/119 = 0.68 no longer matches
    one = (np.array([[0, 0, 10, 10]], float), np.array([0.9]), np.array([0]))
    two = (np.array([[0, 0, 10, 10], [0, 0, 10, 9]], float), np.array([0.9, 0.8]), np.array([0, 0]))
    assert match_detections(two, one) == 1                  # one to one: the second float box finds it taken
    # greedy by score, each taking the best IoU: float 0.9 takes the IoU-1.0 box, float 0.8 the other
    fl = (np.array([[0, 0, 10, 10], [0, 0, 10, 8]], float), np.array([0.9, 0.8]), np.array([0, 0]))
    dp = (np.array([[0, 0, 10, 8], [0, 0, 10, 10]], float), np.array([0.5, 0.5]), np.array([0, 0]))
    assert match_detections(fl, dp) == 2


def test_detection_tally_by_hand():
    t = DetectionTally(0.25, 0.5)
    t.add(FLOAT_HEAD, DPU_HEAD)                             # 3 float, 4 DPU, 2 matched
    t.add(FLOAT_HEAD, FLOAT_HEAD)                           # 3, 3, 3
    r = t.result()
    assert (r["float_detections"], r["dpu_detections"], r["matched"]) == (6, 7, 5)
    assert r["detection_agreement"] == pytest.approx(5 / 6) and r["reverse_agreement"] == pytest.approx(5 / 7)
    e = DetectionTally().result()
    assert e["detection_agreement"] is None and e["reverse_agreement"] is None


# ---- end to end ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The digits CNN built for B512 through `opendpu build`: (dir, build dir, test .npz, x, y)."""
    d = tmp_path_factory.mktemp("cmp")
    x_tr, _, x_te, y_te = zoo.digits_data()
    np.save(d / "calib.npy", x_tr[:40])
    np.savez(d / "test.npz", x=x_te[:200], y=y_te[:200])
    assert cli(["build", zoo.DIGITS_ONNX, "--calib", str(d / "calib.npy"), "--target", TARGET, "-o",
                str(d / "b"), "--method", "maxmin"]) == 0
    return d, d / "b", d / "test.npz", x_te[:200], y_te[:200]


def _ort(path, x):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {s.get_inputs()[0].name: x[i:i + 1]})[0] for i in range(len(x))])


def test_compare_digits_end_to_end(built, capsys):
    d, b, data, x, y = built
    rc = cli(["compare", zoo.DIGITS_ONNX, str(b), "--data", str(data), "--json", str(d / "acc.json")])
    out = capsys.readouterr().out
    assert rc == 0
    rep = json.loads((d / "acc.json").read_text())
    assert list(rep) == ["model", "xmodel", "backend", "target", "data", "samples", "task", "metric", "outputs",
                         "throughput"]
    assert rep["throughput"]["workers"] == min(os.cpu_count() or 1, 200) and rep["throughput"]["images_per_s"] > 0
    assert rep["task"] == "classify" and rep["samples"] == 200 and rep["target"] == TARGET
    m, o = rep["metric"], rep["outputs"][0]
    assert m["top1_agreement"] >= 0.95
    assert o["sqnr_db"] is not None and math.isfinite(o["sqnr_db"]) and o["sqnr_db"] > 10 and not o["exact"]
    # independent: the float model and the build's QDQ model in onnxruntime (the QDQ model computes what the DPU
    # computes, with the same rounding), the metrics computed here by hand
    fl = _ort(zoo.DIGITS_ONNX, x).astype(np.float64)
    q = _ort(b / "quantized" / "digits_cnn_int.onnx", x).astype(np.float64)
    assert o["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(fl ** 2) / np.sum((fl - q) ** 2)), abs=1e-6)
    assert o["max_abs_err"] == pytest.approx(np.max(np.abs(fl - q)), abs=1e-6)
    assert [o["float_min"], o["float_max"]] == pytest.approx([fl.min(), fl.max()], abs=1e-6)
    assert m["top1_agreement"] == pytest.approx(np.mean(fl.argmax(1) == q.argmax(1)))
    assert m["float_accuracy"] == pytest.approx(np.mean(fl.argmax(1) == y))
    assert m["dpu_accuracy"] == pytest.approx(np.mean(q.argmax(1) == y))
    assert f"top-1 agreement {100 * m['top1_agreement']:.2f} %" in out and f"{o['sqnr_db']:.2f}" in out
    assert o["xmodel_output"] == "/classifier/classifier.4/Gemm_reshape" and o["shape"] == [1, 10]


def test_compare_ref_backend_and_feature_map_output(built):
    """A 4-D output (NHWC in the xmodel, NCHW in ONNX) is compared in the ONNX layout; task auto is raw."""
    d, _, data, x, _ = built
    m = onnx.load(zoo.DIGITS_ONNX)
    keep = list(m.graph.node)[:8]                             # up to the second MaxPool: [1, 32, 2, 2]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info(keep[-1].output[0], TensorProto.FLOAT, [1, 32, 2, 2]))
    used = {i for n in keep for i in n.input}
    inits = [i for i in m.graph.initializer if i.name in used]
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    onnx.save(m, d / "feat.onnx")
    assert cli(["build", str(d / "feat.onnx"), "--calib", str(d / "calib.npy"), "--target", TARGET, "-o",
                str(d / "bf"), "--method", "maxmin"]) == 0
    rep = compare(str(d / "feat.onnx"), str(d / "bf" / "compiled"), str(data), backend="ref", limit=60)
    assert rep["task"] == "raw" and rep["samples"] == 60 and rep["metric"] == {}
    fl = _ort(d / "feat.onnx", x[:60]).astype(np.float64)
    q = _ort(d / "bf" / "quantized" / "feat_int.onnx", x[:60]).astype(np.float64)
    assert fl.shape == q.shape == (60, 32, 2, 2)
    o = rep["outputs"][0]
    assert o["shape"] == [1, 32, 2, 2]
    assert o["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(fl ** 2) / np.sum((fl - q) ** 2)), abs=1e-6)
    assert o["max_abs_err"] == pytest.approx(np.max(np.abs(fl - q)), abs=1e-6)
    assert json.loads(to_json(rep))["outputs"][0]["sqnr_db"] == pytest.approx(o["sqnr_db"])


# ---- refusals: one line, exit 2, nothing written -------------------------------------------------------------
def _other_model(path, in_shape=(1, 1, 8, 8)):
    """A different classifier with the digits CNN's input and output shapes: conv -> relu -> pool -> fc."""
    rng = np.random.default_rng(0)
    c = in_shape[1]
    inits = [helper.make_tensor("w", TensorProto.FLOAT, [4, c, 3, 3], rng.normal(size=36 * c).tolist()),
             helper.make_tensor("fw", TensorProto.FLOAT, [10, 4], rng.normal(size=40).tolist()),
             helper.make_tensor("fb", TensorProto.FLOAT, [10], np.zeros(10).tolist())]
    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["output"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "other", [helper.make_tensor_value_info("input", TensorProto.FLOAT, list(in_shape))],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return str(path)


def _refused(argv, capsys, *needles):
    rc = cli(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("opendpu compare: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_wrong_pairing_refused(built, capsys):
    d, b, data, _, _ = built
    other = _other_model(d / "other.onnx")
    out = d / "w.json"
    _refused(["compare", other, str(b), "--data", str(data), "--json", str(out)], capsys,
             "other.onnx", "output 'output'", "not made from this model")
    wide = _other_model(d / "other3.onnx", (1, 3, 8, 8))
    _refused(["compare", wide, str(b), "--data", str(data), "--json", str(out)], capsys,
             "other3.onnx", "input 'input'", "not made from this model")
    assert not out.exists()


def test_bad_input_refused(built, capsys, tmp_path):
    d, b, data, x, _ = built
    out = tmp_path / "r.json"
    m = zoo.DIGITS_ONNX
    _refused(["compare", m, str(tmp_path / "nope"), "--data", str(data), "--json", str(out)], capsys, "nope")
    np.save(tmp_path / "nhwc.npy", x[:4].transpose(0, 2, 3, 1)[:, :, :7])
    _refused(["compare", m, str(b), "--data", str(tmp_path / "nhwc.npy"), "--json", str(out)], capsys,
             "nhwc.npy", "does not match the model input [1, 1, 8, 8]")
    _refused(["compare", m, str(b / "quantized"), "--data", str(data), "--json", str(out)], capsys,
             "holds no compiled xmodel")
    _refused(["compare", m, str(b), "--data", str(tmp_path / "missing.npz")], capsys, "--data", "missing.npz")
    _refused(["compare", m, str(b), "--data", str(data), "--task", "detect", "--json", str(out)], capsys,
             "task detect needs")
    _refused(["compare", m, str(b), "--data", str(data), "--json", str(data)], capsys, "--json")
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["nhwc.npy"]


def test_labels_outside_the_classes_are_refused(built, capsys, tmp_path):
    """Labels are class indices of the [1, 10] output: one outside 0..9 is an error naming the file, how many and
    their range, before any sample runs (never a silent "accuracy 0.00 %"); with task raw they are unused, and a
    warning line says so."""
    from opendpu.runtime.compare import CompareError, Comparison
    d, b, _, x, y = built
    out = tmp_path / "r.json"
    for labels, what in ((y[:20] + 10, "20 of 20 labels are outside the model's 10 classes 0..9"),
                         (np.where(np.arange(20) == 4, -3, y[:20]), "1 of 20 labels are outside the model's 10 "
                                                                     "classes 0..9 (found -3)")):
        np.savez(tmp_path / "bad.npz", x=x[:20], y=labels)
        _refused(["compare", zoo.DIGITS_ONNX, str(b), "--data", str(tmp_path / "bad.npz"), "--json", str(out)],
                 capsys, "bad.npz", "labels 'y'", what)
    with pytest.raises(CompareError, match="outside the model's 10 classes"):
        Comparison(zoo.DIGITS_ONNX, b, (x[:5], np.arange(5) + 8), backend="ref")
    assert not out.exists()
    np.savez(tmp_path / "ok.npz", x=x[:3], y=y[:3])
    assert cli(["compare", zoo.DIGITS_ONNX, str(b), "--data", str(tmp_path / "ok.npz"), "--task", "raw",
                "--backend", "ref"]) == 0
    io = capsys.readouterr()
    # progress lines ("compare: samples [1/3] (1 s)") appear when the run outlasts the quiet second (a loaded machine)
    err = [ln for ln in io.err.strip().splitlines() if not re.fullmatch(r"compare: .* \(\d+ s(, ETA \d+ s)?\)", ln)]
    assert err == [f"opendpu compare: warning: data {tmp_path / 'ok.npz'}: labels 'y' are not used: task "
                   f"raw measures SQNR only (labels give an accuracy with task classify)"]
    assert "raw: per-output SQNR only" in io.out
