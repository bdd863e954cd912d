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

The PP-OCRv4 detector is measured by benchmarks/bench_ocr.py (a 320×640 build takes about a minute).
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


def _cls_model() -> str:
    p = ocr_data.model_path(ocr_data.CLS_MODEL)
    if p is None:
        pytest.skip("rapidocr-onnxruntime==1.4.4 is not installed (pip install --no-deps, requirements-models.txt)")
    return p


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
    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.runner import GraphRunner
    _, out = cls_build
    meta = json.load(open(out / "compiled" / "meta.json"))
    g = Graph.load(str(out / "compiled" / meta["filename"]))
    dpu = [sg for sg in g.toposort_child_subgraphs() if sg.device == "DPU"]
    assert len(dpu) >= 1
    x, _ = ocr_data.text_strips(N_SIM, seed=3000)
    ref, sim = GraphRunner(g, backend="ref"), GraphRunner(g, backend="sim")
    for i in range(N_SIM):
        r = ref.run([x[i:i + 1]], keep_values=True, layout="nchw")
        s = sim.run([x[i:i + 1]], keep_values=True, layout="nchw")
        assert set(s.dpu_outputs) == set(r.dpu_outputs) == {sg.name for sg in dpu}
        for sg, outs in r.dpu_outputs.items():
            for t, v in outs.items():
                np.testing.assert_array_equal(s.dpu_outputs[sg][t], v, err_msg=f"{sg}: {t}")
        for t, v in r.outputs.items():
            np.testing.assert_array_equal(s.outputs[t], v, err_msg=t)


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
