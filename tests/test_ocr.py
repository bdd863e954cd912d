"""Real OCR models from the pinned `rapidocr-onnxruntime==1.4.4` wheel (requirements-models.txt; issue 30, part 8),
on text rendered offline (tests/ocr_data.py): the PP-OCR mobile text-direction classifier
(`ch_ppocr_mobile_v2.0_cls_infer.onnx`, MobileNetV3 with squeeze-excite, exported by Paddle2ONNX) through
`opendpu build` for B4096 on 3×48×192 strips.

* The build succeeds (Paddle's `Reshape(x, [-1, C])`, its `dim_value: -1` dynamic dims and its Identity graph
  output are taken as onnxruntime takes them).
* The compiled program on the instruction simulator equals the XIR reference bit for bit: every DPU subgraph's
  outputs and the model output, on rendered strips (beside `build`'s own check on random inputs).
* Coverage: every MAC is on the DPU, and the only CPU ops are those the DPU has no form for in this model: the
  softmax (and the reshape into it). Paddle's nine HardSigmoid(0.2, 0.5) gates run on the DPU, the 1.2 folded
  into the squeeze-excite convs before them (before that fold all nine went to the CPU).
* Accuracy against onnxruntime float (`compare` on the `ref` backend) over 40 held-out strips, half rotated 180°.
  Measured with benchmarks/bench_ocr.py on seeds 0..3 (64 calibration strips, 40 others): 97.5 to 100 % top-1
  agreement, with CLE on (the default) and off (at worst one strip in 40 differs); the floor asserted is 95 %, the
  issue's acceptance figure, just under the measured minimum. This test's data is bench_ocr's seed 0 (100 %).

The PP-OCRv4 text detector (`ch_PP-OCRv4_det_infer.onnx`, PP-LCNetV3 backbone + a DB head, 1.2 GMAC at 320×640)
through the library calls of `opendpu build` for B4096 on rendered pages (as benchmarks/bench_ocr.py builds it),
measured as bench_ocr does: the IoU of the binarised text map (probability > 0.3, rapidocr's Det.thresh) of the
compiled model on `ref` against onnxruntime float, page by page.

* Default suite, 224×448 pages, 8 calibration pages, 6 others (bench_ocr `--det-hw 224x448 --det-calib 8
  --det-eval 6`; this test's data is its seed 0): measured mean IoU 0.894 / 0.892 / 0.885 on seeds 0 / 1 / 2
  (smallest page 0.848 / 0.872 / 0.823). Floors asserted: mean 0.85, every page 0.75. At this size every MAC and
  every op but the final Sigmoid runs on the DPU (asserted); sim equals ref bit for bit on a rendered page.
* Slow (`-m slow`), the acceptance setup of issue 30: 320×640, 16 calibration pages, 8 others. Measured mean IoU
  0.876 / 0.879 / 0.876 on seeds 0 / 1 / 2 (bench_ocr defaults; smallest page 0.820 / 0.826 / 0.810); floor
  0.85. Every MAC and every op but the final Sigmoid runs on the DPU (asserted), the four GlobalAveragePools of the
  neck's squeeze-excite blocks (inputs 40×80 and 80×160) included: their rows are spread over the PP banks
  (docs/compiler.md "Global pools"; before, they went to the CPU).

Without cross-layer equalization (`--no-cle`) the detector's INT8 text map used to be empty (IoU 0.000 at 320×640):
vai_q's weight fix-point cap zeroed the head's first conv. With the cap lifted where it zeroes a layer
(docs/quantizer.md "Why PP-OCRv4 det collapses without CLE") `--no-cle` gives 0.882.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import ocr_data

pytest.importorskip("onnxruntime")
pytest.importorskip("PIL")
pytest.importorskip("matplotlib")

B4096 = "DPUCZDX8G_ISA1_B4096"
N_CALIB = 64
N_EVAL = 40
N_SIM = 2
AGREEMENT_FLOOR = 0.95          # measured 0.975 to 1.00 on seeds 0..3 (see the module docstring)
CPU_ONNX_TYPES = {"Softmax"}     # what may stay on the CPU in this model (and why: docstring)
DET_THRESH = 0.3                # rapidocr config.yaml Det.thresh
DET_HW, DET_CALIB, DET_EVAL = (224, 448), 8, 6
DET_IOU_FLOOR = 0.85            # measured 0.885 to 0.894 on seeds 0..2 (module docstring)
DET_PAGE_IOU_FLOOR = 0.75       # smallest page measured 0.823
ACCEPT_HW, ACCEPT_CALIB, ACCEPT_EVAL = (320, 640), 16, 8
ACCEPT_IOU_FLOOR = 0.85         # issue 30's acceptance figure; measured 0.876 to 0.879 on seeds 0..2


def _model(name: str) -> str:
    p = ocr_data.model_path(name)
    if p is None:
        pytest.skip("rapidocr-onnxruntime==1.4.4 is not installed (pip install --no-deps, requirements-models.txt)")
    return p


def _cls_model() -> str:
    return _model(ocr_data.CLS_MODEL)


def _assert_sim_equals_ref(out, x: np.ndarray) -> None:
    """Every sample of x on the compiled program of build dir `out`: sim equals ref bit for bit on every DPU
    subgraph's outputs and on the model outputs."""
    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.runner import GraphRunner
    meta = json.load(open(out / "compiled" / "meta.json"))
    g = Graph.load(str(out / "compiled" / meta["filename"]))
    dpu = [sg for sg in g.toposort_child_subgraphs() if sg.device == "DPU"]
    assert len(dpu) >= 1
    ref, sim = GraphRunner(g, backend="ref"), GraphRunner(g, backend="sim")
    for i in range(len(x)):
        r = ref.run([x[i:i + 1]], keep_values=True, layout="nchw")
        s = sim.run([x[i:i + 1]], keep_values=True, layout="nchw")
        assert set(s.dpu_outputs) == set(r.dpu_outputs) == {sg.name for sg in dpu}
        for sg, outs in r.dpu_outputs.items():
            for t, v in outs.items():
                np.testing.assert_array_equal(s.dpu_outputs[sg][t], v, err_msg=f"{sg}: {t}")
        for t, v in r.outputs.items():
            np.testing.assert_array_equal(s.outputs[t], v, err_msg=t)


@pytest.fixture(scope="module")
def cls_build(tmp_path_factory):
    from opendpu.runtime.cli import main as cli
    model = _cls_model()
    d = tmp_path_factory.mktemp("ocr_cls")
    xc, _ = ocr_data.text_strips(N_CALIB, seed=1000)
    np.save(d / "calib.npy", xc)
    rc = cli(["build", model, "--calib", str(d / "calib.npy"), "--target", B4096, "--input-shape", "1,3,48,192",
              "-o", str(d / "build")])
    assert rc == 0                          # includes build's own sim == ref check on random inputs
    return model, d / "build"


def test_cls_sim_equals_ref_on_rendered_strips(cls_build):
    _, out = cls_build
    x, _ = ocr_data.text_strips(N_SIM, seed=3000)
    _assert_sim_equals_ref(out, x)


def test_cls_coverage(cls_build):
    import onnx
    model, out = cls_build
    cov = json.load(open(out / "compiled" / "meta.json"))["coverage"]
    assert cov["macs_total"] > 10_000_000 and cov["macs_dpu"] == cov["macs_total"]
    types = {n.name: n.op_type for n in onnx.load(model).graph.node}
    for c in cov["cpu_ops"]:
        name = c["name"]
        if name in types:
            assert types[name] in CPU_ONNX_TYPES, c
        else:       # the dense layer's reshape back to [1, 2], read only by the float softmax
            assert name.endswith("_reshape") and types.get(name[:-len("_reshape")]) == "MatMul", c
    dpu_types = {"Conv", "GlobalAveragePool", "MaxPool", "Add", "Mul", "Relu", "BatchNormalization"}
    assert not [c for c in cov["cpu_ops"] if types.get(c["name"]) in dpu_types]
    assert len(cov["cpu_ops"]) == 2, cov["cpu_ops"]         # the softmax and its reshape; 9 HardSigmoids on the DPU
    assert sum(t == "HardSigmoid" for t in types.values()) == 9
    assert cov["ops_dpu"] >= 140


def test_cls_agreement_with_float(cls_build):
    from opendpu.runtime.compare import compare
    model, out = cls_build
    x, y = ocr_data.text_strips(N_EVAL, seed=2000)
    rep = compare(model, str(out), (x, y), task="classify", backend="ref")
    m = rep["metric"]
    assert m["float_accuracy"] >= 0.9           # the rendered strips are legible to the float model
    assert m["top1_agreement"] >= AGREEMENT_FLOOR, rep


# ---- PP-OCRv4 det -----------------------------------------------------------------------------------------------

def _det_build(d, hw: tuple[int, int], n_calib: int, n_eval: int, seed: int = 0):
    """The det model for B4096 on `n_calib` pages of hw (bench_ocr's pages for `seed`) through the library calls
    of `opendpu build` (quantize, the xmodel serialized and read back, compile; not the quantize verb's golden
    dumps and per-layer report, which take 40 s here); (model, build dir with compiled/, the `n_eval` other
    pages)."""
    from opendpu.compiler.pipeline import compile as compile_graph
    from opendpu.compiler.xir.graph import Graph
    from opendpu.quant.quantize import QuantConfig, quantize
    from opendpu.runtime.costmodel import cycle_model
    model = _model(ocr_data.DET_MODEL)
    xc = ocr_data.text_pages(n_calib, seed=seed + 1000, hw=hw)
    xe = ocr_data.text_pages(n_eval, seed=seed + 2000, hw=hw)
    res = quantize(model, xc, target=B4096, config=QuantConfig(seed=seed), input_shape=[1, 3, *hw])
    g = Graph.deserialize(res.xmodel().serialize())
    cr = compile_graph(g, B4096, name="ch_PP-OCRv4_det_infer", cycles=cycle_model)
    out = d / "build"
    (out / "compiled").mkdir(parents=True)
    cr.write(str(out / "compiled"))
    return model, out, xe


def _text_map_iou(model: str, out, x: np.ndarray) -> np.ndarray:
    """Per page: the IoU of the text maps (p > DET_THRESH) of the compiled model on ref and of onnxruntime float."""
    from opendpu.runtime.compare import Comparison
    c = Comparison(model, str(out), (x, None), task="raw", backend="ref")
    o = c.onnx_outputs[0]
    iou = []
    for i in range(len(x)):
        bf, bq = c._float(x[i:i + 1])[o] > DET_THRESH, c._dpu(x[i:i + 1])[o] > DET_THRESH
        union = int((bf | bq).sum())
        iou.append(int((bf & bq).sum()) / union if union else 1.0)
    return np.asarray(iou)


@pytest.fixture(scope="module")
def det_build(tmp_path_factory):
    return _det_build(tmp_path_factory.mktemp("ocr_det"), DET_HW, DET_CALIB, DET_EVAL)


def test_det_text_map_iou_with_float(det_build):
    model, out, xe = det_build
    iou = _text_map_iou(model, out, xe)
    print(f"det {DET_HW[0]}x{DET_HW[1]}: text-map IoU INT8 vs float {np.round(iou, 3).tolist()}, mean {iou.mean():.3f}")
    assert iou.mean() >= DET_IOU_FLOOR and iou.min() >= DET_PAGE_IOU_FLOOR, iou


def test_det_sim_equals_ref_on_a_rendered_page(det_build):
    _, out, xe = det_build
    _assert_sim_equals_ref(out, xe[:1])


def test_det_coverage(det_build):
    import onnx
    model, out, _ = det_build
    cov = json.load(open(out / "compiled" / "meta.json"))["coverage"]
    assert cov["macs_total"] > 500_000_000 and cov["macs_dpu"] == cov["macs_total"]
    types = {n.name: n.op_type for n in onnx.load(model).graph.node}
    assert [types.get(c["name"]) for c in cov["cpu_ops"]] == ["Sigmoid"], cov["cpu_ops"]   # the DB head's last op
    assert cov["ops_dpu"] >= 230


@pytest.mark.slow
def test_det_acceptance_320x640(tmp_path):
    """Issue 30's acceptance setup: 320×640 pages, 16 calibration pages, 8 others, B4096: mean IoU >= 0.85."""
    model, out, xe = _det_build(tmp_path, ACCEPT_HW, ACCEPT_CALIB, ACCEPT_EVAL)
    iou = _text_map_iou(model, out, xe)
    print(f"det 320x640: text-map IoU INT8 vs float {np.round(iou, 3).tolist()}, mean {iou.mean():.3f}")
    assert iou.mean() >= ACCEPT_IOU_FLOOR, iou
    cov = json.load(open(out / "compiled" / "meta.json"))["coverage"]
    assert cov["macs_dpu"] == cov["macs_total"], cov
    import onnx
    types = {n.name: n.op_type for n in onnx.load(model).graph.node}
    assert [types.get(c["name"]) for c in cov["cpu_ops"]] == ["Sigmoid"], cov["cpu_ops"]   # every GAP on the DPU
    _assert_sim_equals_ref(out, xe[:1])
