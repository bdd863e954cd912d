"""Accuracy of real OCR models after quantization (issue 30): the PP-OCRv4 text detector and the PP-OCR mobile
text-direction classifier of the pinned `rapidocr-onnxruntime==1.4.4` wheel (requirements-models.txt), on text
rendered offline (tests/ocr_data.py: PIL + matplotlib's DejaVu fonts, rapidocr's preprocessing).

For each model: the float model in onnxruntime; `quantize` + `compile` for the target as `opendpu build` does
(library calls); the compiled model on the `ref` backend for every evaluation sample, and on `sim` for a few,
which must equal `ref` bit for bit. Prints one block per model:

* det — 320×640 pages (`--det-hw`), calibrated on `--det-calib` pages (16), measured on `--det-eval` others (8):
  the mean IoU of the binarised text map (probability > 0.3) of INT8 against float, the % of pixels marked text by
  each, the largest INT8 probability and the output SQNR;
* cls — 3×48×192 strips (half rotated 180°), calibrated on `--cls-calib` strips (64), measured on `--cls-eval`
  others (40): top-1 agreement of INT8 with float, and each one's accuracy against the true direction;

with the build's DPU coverage line, the quantize time and the peak memory (resource.getrusage ru_maxrss of the
process that quantized: each model runs in its own child process, so the figure is that model's).
Quantizer options pass through (`--method`, `--bias-corr`, `--exclude-nodes`, `--fast-finetune`, `--no-cle` when
the quantizer has CLE, and `--set FIELD=VALUE` for any other QuantConfig field)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import ocr_data  # noqa: E402  (tests/ocr_data.py)

DET_THRESH = 0.3                    # rapidocr config.yaml Det.thresh: the text map's binarisation


def _parse_set(items) -> dict:
    from opendpu.quant.quantize import QuantConfig
    fields = {f.name: f for f in dataclasses.fields(QuantConfig)}
    out: dict = {}
    for it in items or ():
        k, _, v = it.partition("=")
        if k not in fields:
            raise SystemExit(f"bench_ocr: --set {it}: QuantConfig has no field {k!r} ({', '.join(fields)})")
        d = getattr(QuantConfig(), k)
        if isinstance(d, bool):
            out[k] = v.lower() in ("1", "true", "yes", "on")
        elif isinstance(d, int):
            out[k] = int(v)
        elif isinstance(d, float):
            out[k] = float(v)
        elif isinstance(d, tuple):
            out[k] = tuple(s for s in v.split(",") if s)
        else:
            out[k] = v if v.lower() != "none" else None
    return out


def quant_config(a):
    from opendpu.quant.quantize import QuantConfig
    kw = {"seed": a.seed}
    if a.method:
        kw["method"] = a.method
    if a.bias_corr:
        kw["bias_corr"] = True
    if a.fast_finetune:
        kw["fast_finetune"] = True
    if a.exclude_nodes:
        kw["nodes_to_exclude"] = tuple(s for s in a.exclude_nodes.split(",") if s)
    if a.no_cle:
        if "cle" not in {f.name for f in dataclasses.fields(QuantConfig)}:
            raise SystemExit("bench_ocr: --no-cle: this quantizer has no CLE option")
        kw["cle"] = False
    kw.update(_parse_set(a.set))
    return QuantConfig(**kw)


def build(model: str, calib: np.ndarray, target: str, cfg, input_shape, out_dir: str) -> dict:
    """quantize + compile into out_dir (as `opendpu build`: quantized/, compiled/); the timings, the peak memory of
    the quantize step and the coverage line."""
    from opendpu.compiler.partition import format_coverage, target_label
    from opendpu.compiler.pipeline import compile as compile_graph
    from opendpu.isa.target import get_target
    from opendpu.quant.quantize import quantize
    from opendpu.runtime.costmodel import cycle_model
    t0 = time.perf_counter()
    res = quantize(model, calib, target=target, config=cfg, input_shape=input_shape)
    t_quant = time.perf_counter() - t0
    rss_quant = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    from opendpu.compiler.xir.graph import Graph
    g = Graph.deserialize(res.xmodel().serialize())         # as `build` hands the written xmodel to compile
    t1 = time.perf_counter()
    name = os.path.splitext(os.path.basename(model))[0]
    cr = compile_graph(g, target, name=name, cycles=cycle_model)
    t_comp = time.perf_counter() - t1
    os.makedirs(os.path.join(out_dir, "compiled"), exist_ok=True)
    cr.write(os.path.join(out_dir, "compiled"))
    cov = cr.meta["coverage"]
    return {"quantize_s": t_quant, "compile_s": t_comp, "peak_rss_quantize_mb": rss_quant,
            "finetune_sqnr": getattr(res, "finetune_sqnr", None),       # fast finetune: before/after dB, reverted
            "coverage": format_coverage(cov, target_label(get_target(target))),
            "macs_dpu_pct": cov.get("macs_dpu_pct"), "cpu_ops": [c["name"] for c in cov.get("cpu_ops", [])]}


def run_compiled(model: str, out_dir: str, x: np.ndarray, n_sim: int):
    """(float outputs, ref outputs, sim == ref on the first n_sim samples) for the build in out_dir; outputs are the
    model's first output, in ONNX layout, stacked over the samples."""
    from opendpu.runtime.compare import Comparison
    npy = os.path.join(out_dir, "eval.npy")
    np.save(npy, x)
    ref = Comparison(model, out_dir, npy, task="raw", backend="ref")
    o = ref.onnx_outputs[0]
    fl = np.concatenate([ref._float(x[i:i + 1])[o] for i in range(len(x))])
    q = np.concatenate([ref._dpu(x[i:i + 1])[o] for i in range(len(x))])
    same = None
    if n_sim:
        from opendpu.sim import warm_kernels
        warm_kernels()
        sim = Comparison(model, out_dir, npy, task="raw", backend="sim", limit=n_sim)
        same = all(np.array_equal(sim._dpu(x[i:i + 1])[o], q[i:i + 1]) for i in range(min(n_sim, len(x))))
    return fl, q, same


def sqnr(ref, test) -> float:
    from opendpu.runtime.compare import sqnr_db
    return sqnr_db(ref, test)


def text_map_iou(fl: np.ndarray, q: np.ndarray, thresh: float = DET_THRESH) -> np.ndarray:
    """Per sample: the IoU of the binarised text maps (p > thresh) of float `fl` and INT8 `q` ([n, 1, H, W]); 1 when
    neither marks a pixel."""
    bf, bq = fl > thresh, q > thresh
    inter = (bf & bq).sum(axis=tuple(range(1, bf.ndim)))
    union = (bf | bq).sum(axis=tuple(range(1, bf.ndim)))
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def _model(name: str) -> str:
    p = ocr_data.model_path(name)
    if p is None:
        raise SystemExit(f"bench_ocr: {name} not found: pip install --no-deps rapidocr-onnxruntime==1.4.4 "
                         f"(requirements-models.txt)")
    return p


def bench_det(a, cfg, tmp) -> dict:
    model = _model(ocr_data.DET_MODEL)
    hw = tuple(a.det_hw)
    xc = ocr_data.text_pages(a.det_calib, seed=a.seed + 1000, hw=hw)
    xe = ocr_data.text_pages(a.det_eval, seed=a.seed + 2000, hw=hw)
    row = build(model, xc, a.target, cfg, [1, 3, *hw], tmp)
    fl, q, same = run_compiled(model, tmp, xe, a.sim)
    bf, bq = fl > DET_THRESH, q > DET_THRESH
    iou = text_map_iou(fl, q)
    row.update(model="det", samples=len(xe), hw=list(hw), iou_mean=float(iou.mean()), iou_min=float(iou.min()),
               text_pct_float=float(bf.mean() * 100), text_pct_int8=float(bq.mean() * 100),
               max_prob_int8=float(q.max()), output_sqnr_db=sqnr(fl, q), sim_equals_ref=same)
    return row


def bench_cls(a, cfg, tmp) -> dict:
    model = _model(ocr_data.CLS_MODEL)
    xc, _ = ocr_data.text_strips(a.cls_calib, seed=a.seed + 1000)
    xe, ye = ocr_data.text_strips(a.cls_eval, seed=a.seed + 2000)
    row = build(model, xc, a.target, cfg, [1, *ocr_data.STRIP_CHW], tmp)
    fl, q, same = run_compiled(model, tmp, xe, a.sim)
    pf, pq = fl.reshape(len(xe), -1).argmax(1), q.reshape(len(xe), -1).argmax(1)
    row.update(model="cls", samples=len(xe), top1_agreement_pct=float((pf == pq).mean() * 100),
               float_accuracy_pct=float((pf == ye).mean() * 100), int8_accuracy_pct=float((pq == ye).mean() * 100),
               output_sqnr_db=sqnr(fl, q), sim_equals_ref=same)
    return row


def show(row: dict) -> None:
    hw = f", {row['hw'][0]}x{row['hw'][1]}" if "hw" in row else ""
    print(f"== {row['model']} ({row['samples']} samples{hw})")
    if row["model"] == "det":
        print(f"  mean IoU of the text map (p > {DET_THRESH}) INT8 vs float: {row['iou_mean']:.3f} "
              f"(min {row['iou_min']:.3f})")
        print(f"  text pixels: float {row['text_pct_float']:.2f} %, INT8 {row['text_pct_int8']:.2f} %; "
              f"largest INT8 probability {row['max_prob_int8']:.3g}")
    else:
        print(f"  top-1 agreement INT8 vs float: {row['top1_agreement_pct']:.1f} %  (accuracy: float "
              f"{row['float_accuracy_pct']:.1f} %, INT8 {row['int8_accuracy_pct']:.1f} %)")
    print(f"  output SQNR {row['output_sqnr_db']:.2f} dB; sim == ref: {row['sim_equals_ref']}")
    ft = row.get("finetune_sqnr")
    if ft:
        print(f"  fast finetune: output SQNR on the tuning samples {ft['before_db']:.2f} -> {ft['after_db']:.2f} dB"
              + (" (reverted to the untuned model)" if ft.get("reverted") else ""))
    print(f"  {row['coverage']}")
    kinds: dict[str, int] = {}
    for n in row["cpu_ops"]:
        k = "reshape" if n.endswith("_reshape") else \
            n.split(".")[-2] if n.startswith("p2o.") else n.split("@")[0]
        kinds[k] = kinds.get(k, 0) + 1
    print(f"  CPU ops by kind: {', '.join(f'{k} x{v}' for k, v in sorted(kinds.items())) or 'none'}")
    print(f"  quantize {row['quantize_s']:.1f} s, compile {row['compile_s']:.1f} s, peak memory "
          f"{row['peak_rss_quantize_mb']:.0f} MB (after quantize)", flush=True)


def _hw(s: str) -> tuple[int, int]:
    h, _, w = s.lower().partition("x")
    return int(h), int(w)


def parser() -> argparse.ArgumentParser:
    """bench_ocr's options (benchmarks/bench_accuracy.py builds its runs from them)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("det", "cls", "both"), default="both")
    ap.add_argument("--target", default="DPUCZDX8G_ISA1_B4096")
    ap.add_argument("--method", help="activation calibration method (quantize's default when absent)")
    ap.add_argument("--bias-corr", action="store_true")
    ap.add_argument("--fast-finetune", action="store_true")
    ap.add_argument("--no-cle", action="store_true", help="cross-layer equalization off")
    ap.add_argument("--exclude-nodes", metavar="NAME[,NAME]", help="ONNX nodes kept float on the CPU")
    ap.add_argument("--set", action="append", metavar="FIELD=VALUE", help="any other QuantConfig field")
    ap.add_argument("--det-hw", type=_hw, default=ocr_data.PAGE_HW, metavar="HxW",
                    help="det page size (multiples of 32; default 320x640)")
    ap.add_argument("--det-calib", type=int, default=16)
    ap.add_argument("--det-eval", type=int, default=8)
    ap.add_argument("--cls-calib", type=int, default=64)
    ap.add_argument("--cls-eval", type=int, default=40)
    ap.add_argument("--sim", type=int, default=2, help="samples also run on the sim backend (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the rows here")
    return ap


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    cfg = quant_config(a)
    for name in (ocr_data.DET_MODEL, ocr_data.CLS_MODEL):
        if ocr_data.model_path(name) is None:
            print(f"bench_ocr: {name} not found: pip install --no-deps rapidocr-onnxruntime==1.4.4 "
                  f"(requirements-models.txt)", file=sys.stderr)
            return 2
    if a.model == "both":               # one child process per model: each peak memory is its own
        rows = []
        for m in ("det", "cls"):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                path = f.name
            argv2 = [x for x in (argv if argv is not None else sys.argv[1:])]
            drop = {"--model", "--json"}
            clean, skip = [], False
            for x in argv2:
                if skip:
                    skip = False
                    continue
                if x in drop:
                    skip = True
                    continue
                if any(x.startswith(d + "=") for d in drop):
                    continue
                clean.append(x)
            rc = subprocess.call([sys.executable, os.path.abspath(__file__), "--model", m, "--json", path, *clean])
            if rc:
                return rc
            with open(path) as f:
                rows += json.load(f)
            os.unlink(path)
    else:
        print(f"quantizer config: {dataclasses.asdict(cfg)}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench_ocr_") as tmp:
            row = (bench_det if a.model == "det" else bench_cls)(a, cfg, tmp)
        show(row)
        rows = [row]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
