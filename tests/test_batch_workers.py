"""Batches and workers (issue 32, item 3): `GraphRunner.run` on N images at once equals N single runs byte for
byte (ref and sim), and `compare` over a process pool gives the same report with 1 and 2 workers; bad batches and
bad --workers are refused before any work."""
from __future__ import annotations

import json

import numpy as np
import pytest

from compile_helpers import compiled, digits_inputs
from opendpu.runtime.cli import main as cli
from opendpu.quant import zoo
from opendpu.runtime.dpu import RuntimeErrorDPU
from opendpu.runtime.runner import GraphRunner

K = 5                       # images in the batch


@pytest.fixture(scope="module")
def digits():
    """The digits CNN compiled for B512, and K test images as its int8 input (NHWC)."""
    c = compiled("digits", None, "B512")
    xs = np.concatenate([digits_inputs(c.graph, k)[0] for k in range(K)])
    return c.xmodel, xs


@pytest.mark.parametrize("backend", ["ref", "sim"])
def test_batch_equals_single_runs(digits, backend):
    g, xs = digits
    one = GraphRunner(g, backend=backend)
    singles = [one.run([xs[k:k + 1]], keep_values=True) for k in range(K)]
    batch = GraphRunner(g, backend=backend).run([xs], keep_values=True)
    assert list(batch.outputs) == list(singles[0].outputs)
    for name, v in batch.outputs.items():
        assert v.shape[0] == K and v.dtype == singles[0].outputs[name].dtype
        assert v.tobytes() == np.concatenate([s.outputs[name] for s in singles]).tobytes(), name
    for name in singles[0].values:                      # every observable value, stacked the same way
        assert batch.values[name].tobytes() == np.concatenate([s.values[name] for s in singles]).tobytes()
    # the dict form and the float form (quantized per image by the same rule) give the same batch
    spec = one.get_inputs()[0]
    by_name = GraphRunner(g, backend=backend).run({spec.name: xs})
    assert all(by_name.outputs[k].tobytes() == v.tobytes() for k, v in batch.outputs.items())
    # the outputs differ between images: the batch is not one image repeated
    first = next(iter(batch.outputs.values()))
    assert any(first[k].tobytes() != first[0].tobytes() for k in range(1, K))


def test_bad_batches_name_the_input(digits):
    g, xs = digits
    r = GraphRunner(g, backend="ref")
    name = r.get_inputs()[0].name
    with pytest.raises(RuntimeErrorDPU, match=f"input {name!r}: shape"):          # wrong image shape
        r.run([xs[:, :4]])
    with pytest.raises(RuntimeErrorDPU, match="takes 1 inputs"):
        r.run([xs, xs])
    with pytest.raises(RuntimeErrorDPU, match=f"input {name!r}: leading dimension 0"):
        r.run([xs[:0]])
    # two inputs holding batches of different sizes: both named (batch_of needs only the input specs)
    from types import SimpleNamespace
    two = SimpleNamespace(_inputs=[SimpleNamespace(name="a", dims=(1, 4, 4, 2)),
                                   SimpleNamespace(name="b", dims=(2, 3))])
    assert GraphRunner.batch_of(two, [np.zeros((3, 4, 4, 2)), np.zeros((6, 3))]) == 3
    assert GraphRunner.batch_of(two, [np.zeros((1, 4, 4, 2)), np.zeros((2, 3))]) == 1
    with pytest.raises(RuntimeErrorDPU, match="inputs 'a' and 'b' hold batches of different sizes \\(3 and 2"):
        GraphRunner.batch_of(two, [np.zeros((3, 4, 4, 2)), np.zeros((4, 3))])
    with pytest.raises(RuntimeErrorDPU, match="input 'b': leading dimension 5 is not a batch"):
        GraphRunner.batch_of(two, [np.zeros((3, 4, 4, 2)), np.zeros((5, 3))])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("bw")
    x_tr, _, x_te, y_te = zoo.digits_data()
    np.save(d / "calib.npy", x_tr[:40])
    np.savez(d / "test.npz", x=x_te[:24], y=y_te[:24])
    assert cli(["build", zoo.DIGITS_ONNX, "--calib", str(d / "calib.npy"), "--target", "B512", "-o", str(d / "b"),
                "--method", "maxmin"]) == 0
    return d


def test_compare_workers_1_and_2_identical(built, capsys):
    d = built
    reps = {}
    for w in (1, 2):
        assert cli(["compare", zoo.DIGITS_ONNX, str(d / "b"), "--data", str(d / "test.npz"), "--backend", "ref",
                    "--workers", str(w), "--json", str(d / f"w{w}.json")]) == 0
        out = capsys.readouterr().out
        assert "images/s" in out and f"{w} worker" in out
        reps[w] = json.loads((d / f"w{w}.json").read_text())
    t1, t2 = reps[1].pop("throughput"), reps[2].pop("throughput")
    assert (t1["workers"], t2["workers"]) == (1, 2) and t1["images_per_s"] > 0 and t2["images_per_s"] > 0
    assert reps[1] == reps[2]
    assert reps[1]["samples"] == 24 and reps[1]["metric"]["agreeing"] >= 20


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "many"])
def test_bad_workers_refused(built, capsys, value):
    d = built
    out = d / f"bad{value}.json"
    rc = cli(["compare", zoo.DIGITS_ONNX, str(d / "b"), "--data", str(d / "test.npz"), "--workers", value,
              "--json", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--workers" in err and value in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_run_cli_batch(built, capsys, workers):
    """`opendpu run -i` with a batch of images (NCHW floats): the stacked outputs equal single runs of the
    library runner on each image, whatever the workers."""
    d = built
    x = zoo.digits_data()[2][:K]
    np.save(d / "batch.npy", x)
    out = d / f"run{workers}.npz"
    assert cli(["run", str(d / "b" / "compiled" / "digits_cnn.xmodel"), "-i", str(d / "batch.npy"), "--layout",
                "nchw", "--raw", "--workers", workers, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"a batch of {K}" in text and "images/s" in text
    from opendpu.compiler.xir.graph import Graph
    r = GraphRunner(Graph.load(str(d / "b" / "compiled" / "digits_cnn.xmodel")), backend="ref")
    singles = [r.output_values(r.run([x[k:k + 1]], keep_values=True, layout="nchw"), raw=True) for k in range(K)]
    z = np.load(out)
    for name, (v, fp) in singles[0].items():
        assert z[name].tobytes() == np.concatenate([s[name][0] for s in singles]).tobytes()
        assert int(z[f"{name}.fix_point"]) == fp


def test_run_cli_batch_refuses_dump(built, capsys):
    d = built
    np.save(d / "batch3.npy", zoo.digits_data()[2][:3])
    rc = cli(["run", str(d / "b" / "compiled" / "digits_cnn.xmodel"), "-i", str(d / "batch3.npy"), "--layout", "nchw",
              "--dump", str(d / "dump")])
    err = capsys.readouterr().err
    assert rc == 2 and "--dump" in err and "batch of 3" in err and not (d / "dump").exists()


def test_quantize_evaluate_workers_identical():
    """quantize --evaluate's pool: 1 and 2 workers give QuantResult.evaluate's numbers exactly."""
    from opendpu.quant.quantize import QuantConfig
    from opendpu.runtime.flow import quantize_step
    from opendpu.runtime.quant_eval import evaluate
    x_tr, _, x_te, y_te = zoo.digits_data()
    res = quantize_step(zoo.DIGITS_ONNX, x_tr[:40], config=QuantConfig(method="maxmin"))
    want = res.evaluate(x_te[:150], y_te[:150])             # 3 batches of up to 64
    got = [evaluate(res, x_te[:150], y_te[:150], workers=w) for w in (1, 2)]
    assert [g.pop("throughput")["workers"] for g in got] == [1, 2]
    assert got[0] == want and got[1] == want


def test_per_sample_detection_records_match_the_tally():
    """The worker's per-sample detection record (float, DPU, matched counts) is DetectionTally's, on the
    hand-checked heads of test_compare; an onnxruntime session and a runner stand in as stubs."""
    from types import SimpleNamespace

    from opendpu.runtime.compare import DetectionTally, _Evaluator
    from test_compare import DPU_HEAD, FLOAT_HEAD
    shape = [1, *FLOAT_HEAD.shape]
    dpu = np.concatenate([DPU_HEAD, np.zeros((DPU_HEAD.shape[0], 1), np.float32)], axis=1)   # 5 anchors, as float
    spec = SimpleNamespace(name="head", dims=tuple(shape))
    sess = SimpleNamespace(run=lambda names, feeds: [FLOAT_HEAD[None]])
    runner = SimpleNamespace(get_outputs=lambda: [spec], run=lambda *a, **k: None,
                             output_values=lambda res: {"head": (dpu[None], None)})
    ev = _Evaluator(sess, runner, {"pairs": {"y": "head"}, "shapes": {"y": shape}, "layout": "nhwc",
                                   "outputs": ["y"], "in_name": "x", "task": "detect", "det": ("y", True),
                                   "score_threshold": 0.25, "iou": 0.5})
    recs = ev.measure(np.zeros((2, 1), np.float32))
    t = DetectionTally(0.25, 0.5)
    t.add(FLOAT_HEAD, dpu)
    assert [r["det"] for r in recs] == [(t.float_detections, t.dpu_detections, t.matched)] * 2 == [(3, 4, 2)] * 2
    e = FLOAT_HEAD.astype(np.float64) - dpu
    assert recs[0]["outputs"][0] == (float(np.sum(FLOAT_HEAD.astype(np.float64) ** 2)), float(np.sum(e * e)),
                                     float(np.abs(e).max()), float(FLOAT_HEAD.min()), float(FLOAT_HEAD.max()))
