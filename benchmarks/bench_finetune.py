"""Bias correction and fast finetune (issue 30 part 4, docs/quantizer.md "Fast finetune and bias correction: memory
and defaults"): for each model and each quantizer configuration — default, bias_corr, fast_finetune and
bias_corr+fast_finetune — the `quantize` time, its peak memory and the output SQNR of the INT8 (DPU fake-quant) model
against the original float ONNX model on held-out images.

Every (model, configuration) runs in its own child process, so the peak RSS (resource.getrusage ru_maxrss) is that
configuration's alone: the whole `quantize` call including loading the model and building the calibration data.

Models are the zoo's float ONNX with deterministic random weights (quant/zoo.py) — ResNet-50 at 224×224 and
MobileNetV2 at 128×128 by default; `mobilenet_v1`/`mobilenet_v2` take the CLE-sensitive weights of tests/test_cle.py
(`zoo.cle_sensitive`, depthwise channel ranges spread over four decades as BN folding leaves them) when written
`mobilenet_v2:cle` — and the PP-OCR mobile text-direction classifier (`ppocr_cls`, tests/ocr_data.py) when the
rapidocr wheel is installed. Images: skimage sample-image crops (tests/mtcnn_nets.scene_crops), ImageNet-normalised;
text strips for ppocr_cls. `--calib` images calibrate (64), `--eval` others (16) measure.

    .venv/bin/python benchmarks/bench_finetune.py                        # the default table (several minutes)
    .venv/bin/python benchmarks/bench_finetune.py --models resnet18@224,mobilenet_v1:cle@128 --configs default,bias_corr
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

CONFIGS = {"default": {}, "bias_corr": {"bias_corr": True}, "fast_finetune": {"fast_finetune": True},
           "bias_corr+fast_finetune": {"bias_corr": True, "fast_finetune": True}}
DEFAULT_MODELS = "resnet50@224,mobilenet_v2@128"


def images(size: int, n: int, seed: int) -> np.ndarray:
    """skimage sample-image crops, ImageNet-normalised NCHW float32 (as tests/test_cle.py)."""
    from mtcnn_nets import scene_crops
    x = scene_crops(size, n, seed).astype(np.float32) / 255.0
    x = (x - np.array([0.485, 0.456, 0.406], np.float32)) / np.array([0.229, 0.224, 0.225], np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def model_and_data(spec: str, n_calib: int, n_eval: int):
    """(ONNX model, calibration data, evaluation data, input shape or None) for a model spec
    `name[:cle][@size]`."""
    from opendpu.quant import zoo
    name, _, size = spec.partition("@")
    name, _, variant = name.partition(":")
    if name == "ppocr_cls":
        import onnx
        import ocr_data
        path = ocr_data.model_path(ocr_data.CLS_MODEL)
        if path is None:
            raise SystemExit("bench_finetune: ppocr_cls needs the rapidocr-onnxruntime wheel (requirements-models.txt)")
        xc, _ = ocr_data.text_strips(n_calib, seed=0)
        xe, _ = ocr_data.text_strips(n_eval, seed=1)
        return onnx.load(path), xc, xe, [1, *ocr_data.STRIP_CHW]
    s = int(size) if size else zoo.DEFAULT_SIZE[name]
    m = zoo.build(name, s)
    if variant == "cle":
        m = zoo.cle_sensitive(m, seed=1, relu6="relu")
    elif variant:
        raise SystemExit(f"bench_finetune: unknown variant {variant!r} in {spec!r} (use :cle)")
    return m, images(s, n_calib, 0), images(s, n_eval, 1), None


def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    ref, test = ref.astype(np.float64), test.astype(np.float64)
    e = float(np.mean((ref - test) ** 2))
    return float("inf") if e == 0 else float(10 * np.log10(float(np.mean(ref ** 2)) / e))


def child(spec: str, config: str, n_calib: int, n_eval: int, iters: int | None, seed: int) -> dict:
    """One (model, configuration) in this process: the figures as a dict."""
    import onnxruntime as ort
    from opendpu.quant.quantize import QuantConfig, quantize
    m, xc, xe, shape = model_and_data(spec, n_calib, n_eval)
    kw = dict(CONFIGS[config], seed=seed)
    if iters:
        kw["finetune_iters"] = iters
    t0 = time.perf_counter()
    res = quantize(m, xc, config=QuantConfig(**kw), input_shape=shape)
    t = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    iname = s.get_inputs()[0].name
    o = res.prep.outputs[0]
    ref = np.concatenate([s.run(None, {iname: xe[i:i + 1]})[0] for i in range(len(xe))])    # batch 1 models
    q = np.concatenate([res.run(xe[i:i + 4], "dpu")[o] for i in range(0, len(xe), 4)])
    out = {"model": spec, "config": config, "quantize_s": round(t, 1), "peak_rss_mb": round(rss),
           "sqnr_db": round(sqnr_db(ref, q), 2), "timings": {k: round(v, 1) for k, v in res.timings.items()}}
    if getattr(res, "finetune_sqnr", None):
        fs = res.finetune_sqnr
        out["finetune"] = {"before_db": round(fs["before_db"], 2), "after_db": round(fs["after_db"], 2),
                           "reverted": bool(fs["reverted"]),
                           "kept": sum(r["kept"] for r in res.finetune_log), "layers": len(res.finetune_log)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS,
                    help="comma-separated name[:cle][@size] (zoo names, ppocr_cls); default %(default)s")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated of " + ", ".join(CONFIGS))
    ap.add_argument("--calib", type=int, default=64, help="calibration images (default %(default)s)")
    ap.add_argument("--eval", type=int, default=16, help="held-out evaluation images (default %(default)s)")
    ap.add_argument("--iters", type=int, default=None, help="finetune_iters (default: QuantConfig's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="OUT.json", help="also write the rows as JSON")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "CONFIG"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child[0], a.child[1], a.calib, a.eval, a.iters, a.seed)), flush=True)
        return 0
    configs = [c for c in a.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit(f"bench_finetune: unknown config {c!r}; use {', '.join(CONFIGS)}")
    rows = []
    print(f"{'model':24} {'config':24} {'quantize s':>10} {'peak RSS MB':>11} {'SQNR dB':>8}  finetune")
    for spec in [s for s in a.models.split(",") if s]:
        for c in configs:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", spec, c, "--calib", str(a.calib),
                   "--eval", str(a.eval), "--seed", str(a.seed)] + (["--iters", str(a.iters)] if a.iters else [])
            p = subprocess.run(cmd, capture_output=True, text=True)
            line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if p.returncode or line is None:
                print(f"{spec:24} {c:24} failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(line[7:])
            rows.append(r)
            ft = r.get("finetune")
            fts = (f"{ft['kept']}/{ft['layers']} layers kept, {ft['before_db']} -> {ft['after_db']} dB on the calib "
                   f"samples{' (reverted)' if ft['reverted'] else ''}") if ft else ""
            print(f"{spec:24} {c:24} {r['quantize_s']:>10.1f} {r['peak_rss_mb']:>11} {r['sqnr_db']:>8.2f}  {fts}",
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
