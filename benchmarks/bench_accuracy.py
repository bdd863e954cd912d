"""Quantizer accuracy per model and per quantizer configuration (issue 30): float (onnxruntime) against INT8 (the
compiled program on the `ref` backend, built as `opendpu build` does: benchmarks/bench_ocr.py's `build` and
`run_compiled`), one Markdown table of the accuracy and one of the cost.

Models (`--models`, comma separated):

* det — PP-OCRv4 det, rendered 320×640 pages (`--det-hw`), 16 calibration pages, 8 others: mean IoU of the
  binarised text map (p > 0.3) and output SQNR (bench_ocr);
* cls — PP-OCR mobile cls, 3×48×192 strips, 64 calibration strips, 40 others: top-1 agreement and output SQNR;
* mbv1, mbv2 — the zoo MobileNet v1 / v2 (random weights, `--zoo-size`, 224 by default) made CLE-sensitive as
  tests/test_cle.py makes them (`zoo.cle_sensitive(seed=1, relu6="relu")`: depthwise channel ranges over four
  decades, as BatchNorm folding leaves trained ones), on crops of skimage's sample images (16 calibration, 8
  others): output SQNR (top-1 agreement beside it, though the weights are random);
* nudenet — NudeNet 320n (a YOLOv8n, pinned `nudenet` wheel; SiLU on the CPU) on skimage crops as
  tests/test_real_models.py's slow test uses them (48 calibration, 48 others): detection agreement and the SQNR
  of the output.

Configurations (`--configs`): default (CLE on), no_cle (`cle=False`), no_cle_vaiq_cap (`cle=False`,
`weight_fp_lift=False`: vai_q's weight fix-point cap of 12 everywhere), align_pool (`align_pool=True`: average pools
take their input's fix point, the earlier rule), bias_corr (`bias_corr=True`), fast_finetune (`fast_finetune=True`).

Every (model, configuration) runs in its own child process (its peak memory, `ru_maxrss` after quantize, is its
own), killed after `--timeout` seconds; a failure or a timeout is a cell of the table. Each row also says whether
sim equals ref bit for bit on the first evaluation sample (a cell says "sim≠ref" when not), and a fast_finetune
cell the output SQNR on the tuning samples before and after tuning ("reverted" when tuning lowered it and
`quantize` restored the untuned model). `--json FILE` writes the rows; `--from-json FILE` prints
the tables of rows written before (several files merge, later rows replacing earlier ones).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import bench_ocr  # noqa: E402  (benchmarks/bench_ocr.py)

MODELS = ("det", "cls", "mbv1", "mbv2", "nudenet")
CONFIGS = {"default": [], "no_cle": ["--no-cle"],
           "no_cle_vaiq_cap": ["--no-cle", "--set", "weight_fp_lift=false"],     # vai_q's weight cap of 12 everywhere
           "align_pool": ["--set", "align_pool=true"], "bias_corr": ["--bias-corr"],
           "fast_finetune": ["--fast-finetune"]}
METRIC = {"det": ("mean IoU", "iou_mean"), "cls": ("top-1 agreement %", "top1_agreement_pct"),
          "mbv1": ("output SQNR dB", "output_sqnr_db"), "mbv2": ("output SQNR dB", "output_sqnr_db"),
          "nudenet": ("detection agreement", "detection_agreement")}
ZOO = {"mbv1": "mobilenet_v1", "mbv2": "mobilenet_v2"}
SCENES = ("astronaut", "coffee", "chelsea", "rocket", "camera", "immunohistochemistry", "cat", "hubble_deep_field")


# ---- one (model, configuration), in the child process ---------------------------------------------------------

def scene_images(size: int, n: int, seed: int) -> np.ndarray:
    """n square crops of skimage's sample images at random places and scales, some mirrored, resized to
    size×size, ImageNet-normalised NCHW float32 (the zoo models' input)."""
    from skimage import data, transform
    imgs = []
    for s in SCENES:
        im = getattr(data, s)()
        imgs.append(np.stack([im] * 3, -1) if im.ndim == 2 else im[..., :3])
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        im = imgs[i % len(imgs)]
        side = int(rng.integers(min(im.shape[:2]) // 3, min(im.shape[:2]) + 1))
        y, x = int(rng.integers(0, im.shape[0] - side + 1)), int(rng.integers(0, im.shape[1] - side + 1))
        c = im[y:y + side, x:x + side]
        c = c[:, ::-1] if rng.random() < 0.5 else c
        out.append(transform.resize(c, (size, size), anti_aliasing=True, preserve_range=True) / 255.0)
    x = (np.stack(out) - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)).astype(np.float32)


def bench_zoo(a, cfg, tmp) -> dict:
    import onnx

    from opendpu.quant import zoo
    model = os.path.join(tmp, f"{ZOO[a.model]}_cle_sensitive.onnx")
    onnx.save(zoo.cle_sensitive(zoo.build(ZOO[a.model], a.zoo_size), seed=1, relu6="relu"), model)
    xc, xe = scene_images(a.zoo_size, a.zoo_calib, a.seed), scene_images(a.zoo_size, a.zoo_eval, a.seed + 1)
    row = bench_ocr.build(model, xc, a.target, cfg, [1, 3, a.zoo_size, a.zoo_size], tmp)
    fl, q, same = bench_ocr.run_compiled(model, tmp, xe, a.sim)
    pf, pq = fl.reshape(len(xe), -1).argmax(1), q.reshape(len(xe), -1).argmax(1)
    row.update(samples=len(xe), output_sqnr_db=bench_ocr.sqnr(fl, q),
               top1_agreement_pct=float((pf == pq).mean() * 100), sim_equals_ref=same)
    return row


def nudenet_path() -> str | None:
    import importlib.util
    spec = importlib.util.find_spec("nudenet")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = os.path.join(list(spec.submodule_search_locations)[0], "320n.onnx")
    return p if os.path.isfile(p) else None


def bench_nudenet(a, cfg, tmp) -> dict:
    from test_real_models import sample_crops       # tests/test_real_models.py: skimage crops, 320×320, [0, 1]

    from opendpu.runtime.compare import Comparison
    model = nudenet_path()
    if model is None:
        raise SystemExit("bench_accuracy: nudenet==3.4.2 is not installed (requirements-models.txt)")
    xc, xe = sample_crops(16, 32, seed=100), sample_crops(36, 12, seed=11)
    row = bench_ocr.build(model, xc, a.target, cfg, [1, 3, 320, 320], tmp)
    rep = Comparison(model, tmp, (xe, None), task="detect", backend="ref").run()
    m = rep["metric"]
    same = None
    if a.sim:
        from opendpu.sim import warm_kernels
        warm_kernels()
        r = Comparison(model, tmp, (xe[:1], None), task="raw", backend="ref")
        s = Comparison(model, tmp, (xe[:1], None), task="raw", backend="sim")
        same = all(np.array_equal(s._dpu(xe[:1])[o], r._dpu(xe[:1])[o]) for o in r.onnx_outputs)
    row.update(samples=len(xe), detection_agreement=m.get("detection_agreement"),
               float_detections=m.get("float_detections"), output_sqnr_db=min(o["sqnr_db"] for o in rep["outputs"]),
               sim_equals_ref=same)
    return row


def child(a) -> int:
    """One (model, configuration) in this process; the row into a.json."""
    ocr_argv = [*CONFIGS[a.config], "--seed", str(a.seed), "--target", a.target, "--sim", str(a.sim),
                "--det-hw", f"{a.det_hw[0]}x{a.det_hw[1]}"]
    oa = bench_ocr.parser().parse_args(ocr_argv)
    cfg = bench_ocr.quant_config(oa)
    with tempfile.TemporaryDirectory(prefix="bench_accuracy_") as tmp:
        if a.model == "det":
            row = bench_ocr.bench_det(oa, cfg, tmp)
        elif a.model == "cls":
            row = bench_ocr.bench_cls(oa, cfg, tmp)
        elif a.model in ZOO:
            row = bench_zoo(a, cfg, tmp)
        else:
            row = bench_nudenet(a, cfg, tmp)
    row.update(model=a.model, config=a.config, status="ok")
    with open(a.json, "w") as f:
        json.dump(row, f, indent=1)
    return 0


# ---- the parent: one child per cell, the tables ------------------------------------------------------------------

def run_cell(a, model: str, config: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--models", model, "--configs", config,
           "--json", path, "--seed", str(a.seed), "--target", a.target, "--sim", str(a.sim),
           "--det-hw", f"{a.det_hw[0]}x{a.det_hw[1]}", "--zoo-size", str(a.zoo_size)]
    t0 = time.perf_counter()
    print(f"-- {model} / {config}", flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        wall = time.perf_counter() - t0
        if p.returncode == 0:
            with open(path) as f:
                row = json.load(f)
        else:
            tail = [ln for ln in (p.stderr or p.stdout).strip().splitlines() if ln.strip()]
            why = "killed (out of memory?)" if p.returncode < 0 else (tail[-1][:160] if tail else "")
            row = {"model": model, "config": config, "status": f"failed (exit {p.returncode}): {why}"}
    except subprocess.TimeoutExpired:
        wall = time.perf_counter() - t0
        row = {"model": model, "config": config, "status": f"timeout (> {a.timeout:g} s)"}
    finally:
        os.unlink(path)
    row["wall_s"] = wall
    print(f"   {row['status']}, {wall:.0f} s", flush=True)
    return row


def _cell(row: dict | None, model: str) -> str:
    if row is None:
        return "–"
    if row.get("status") != "ok":
        return row["status"].split(":")[0] if row["status"].startswith("failed") else row["status"]
    v = row.get(METRIC[model][1])
    main = "n/a" if v is None else f"{v:.3f}" if model in ("det", "nudenet") else f"{v:.1f}"
    if model in ("det", "cls", "nudenet"):
        main += f" ({row['output_sqnr_db']:.1f} dB)"
    ft = row.get("finetune_sqnr")
    if ft:
        main += (f" [reverted: {ft['before_db']:.1f}→{ft['after_db']:.1f} dB]" if ft.get("reverted")
                 else f" [tuned: {ft['before_db']:.1f}→{ft['after_db']:.1f} dB]")
    if row.get("sim_equals_ref") is False:
        main += " sim≠ref"
    return main


def _cost(row: dict | None) -> str:
    if row is None:
        return "–"
    if row.get("status") != "ok":
        return f"{row['status'].split(':')[0]} after {row['wall_s']:.0f} s" if "wall_s" in row else row["status"]
    return f"{row['quantize_s']:.1f} s / {row['peak_rss_quantize_mb'] / 1024:.2f} GB"


def tables(rows: list[dict], models, configs) -> str:
    by = {(r["model"], r["config"]): r for r in rows}
    models = [m for m in models if any((m, c) in by for c in configs)]
    head = "| model | metric (output SQNR) | " + " | ".join(configs) + " |\n|---|---|" + "---|" * len(configs)
    acc = [head] + [f"| {m} | {METRIC[m][0]} | " + " | ".join(_cell(by.get((m, c)), m) for c in configs) + " |"
                    for m in models]
    head2 = "| model | " + " | ".join(configs) + " |\n|---|" + "---|" * len(configs)
    cost = [head2] + [f"| {m} | " + " | ".join(_cost(by.get((m, c))) for c in configs) + " |" for m in models]
    notes = []
    for r in rows:
        if r.get("status") not in (None, "ok"):
            notes.append(f"* {r['model']} / {r['config']}: {r['status']}")
    return ("Accuracy, INT8 against float:\n\n" + "\n".join(acc) + "\n\nQuantize time / peak memory (ru_maxrss "
            "after quantize):\n\n" + "\n".join(cost) + ("\n\n" + "\n".join(notes) if notes else ""))


def _names(s: str, allowed, what: str) -> list[str]:
    out = [x for x in s.split(",") if x]
    bad = [x for x in out if x not in allowed]
    if bad:
        raise SystemExit(f"bench_accuracy: unknown {what} {', '.join(bad)} (use {', '.join(allowed)})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma separated: {', '.join(MODELS)}")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma separated: {', '.join(CONFIGS)}")
    ap.add_argument("--skip", action="append", default=[], metavar="MODEL/CONFIG",
                    help="leave this cell out (e.g. det/fast_finetune); repeatable")
    ap.add_argument("--target", default="DPUCZDX8G_ISA1_B4096")
    ap.add_argument("--det-hw", type=bench_ocr._hw, default=(320, 640), metavar="HxW")
    ap.add_argument("--zoo-size", type=int, default=224)
    ap.add_argument("--zoo-calib", type=int, default=16)
    ap.add_argument("--zoo-eval", type=int, default=8)
    ap.add_argument("--sim", type=int, default=1, help="evaluation samples also run on sim (0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per cell")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--from-json", action="append", default=[], metavar="FILE", help="print the tables of these rows")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    models, configs = _names(a.models, MODELS, "model"), _names(a.configs, CONFIGS, "configuration")
    if a.child:
        a.model, a.config = models[0], configs[0]
        return child(a)
    if a.from_json:
        rows: dict = {}
        for p in a.from_json:
            with open(p) as f:
                for r in json.load(f):
                    rows[(r["model"], r["config"])] = r
        print(tables(list(rows.values()), models, configs))
        return 0
    out = []
    for m in models:
        for c in configs:
            if f"{m}/{c}" in a.skip:
                continue
            if m in ("det", "cls") and bench_ocr.ocr_data.model_path(
                    bench_ocr.ocr_data.DET_MODEL if m == "det" else bench_ocr.ocr_data.CLS_MODEL) is None:
                out.append({"model": m, "config": c, "status": "skipped: rapidocr-onnxruntime==1.4.4 not installed"})
                continue
            if m == "nudenet" and nudenet_path() is None:
                out.append({"model": m, "config": c, "status": "skipped: nudenet==3.4.2 not installed"})
                continue
            out.append(run_cell(a, m, c))
            if a.json:                                  # after every cell: a long run leaves what it measured
                with open(a.json, "w") as f:
                    json.dump(out, f, indent=1)
    print(tables(out, models, configs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
