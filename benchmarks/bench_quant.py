"""PTQ time of a zoo model per calibration method (issue: ResNet-50, 100 calibration images, 2 cores).

Prints one row per method: wall seconds for preparation, weights, calibration, total, the process's peak RSS
and the output SQNR of the DPU fake-quant model against the float model on 8 held-out inputs.
Calibration images are deterministic synthetic N(0,1) tensors (nothing is downloaded)."""
from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np


def main() -> int:
    from opendpu.quant import zoo
    from opendpu.quant.quantize import QuantConfig, quantize
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet50", choices=zoo.NAMES)
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--size", type=int, help="input size (default: published)")
    ap.add_argument("--methods", default="maxmin,percentile,mse,entropy,diffs")
    ap.add_argument("--target", default="DPUCZDX8G_ISA1_B4096")
    ap.add_argument("--json", help="also write the rows here")
    a = ap.parse_args()
    size = a.size or zoo.DEFAULT_SIZE[a.model]
    m = zoo.build(a.model, size)
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (a.images, 3, size, size)).astype(np.float32)
    xe = rng.normal(0, 1, (8, 3, size, size)).astype(np.float32)
    print(f"{a.model} {size}x{size}, {a.images} calibration images, target {a.target}")
    print(f"{'method':10s} {'prepare s':>9s} {'weights s':>9s} {'calib s':>8s} {'total s':>8s} {'peak RSS MB':>11s} "
          f"{'out SQNR dB':>11s}")
    rows = []
    for meth in a.methods.split(","):
        t0 = time.perf_counter()
        res = quantize(m, x, target=a.target, config=QuantConfig(method=meth))
        total = time.perf_counter() - t0
        ev = res.evaluate(xe)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t = res.timings
        row = {"method": meth, "prepare_s": round(t["prepare"], 2), "weights_s": round(t["weights"], 2),
               "calibrate_s": round(t["calibrate"], 2), "total_s": round(total, 2), "peak_rss_mb": round(rss),
               "output_sqnr_db": round(ev["output_sqnr_db"], 2)}
        rows.append(row)
        print(f"{meth:10s} {row['prepare_s']:9.2f} {row['weights_s']:9.2f} {row['calibrate_s']:8.2f} "
              f"{row['total_s']:8.2f} {row['peak_rss_mb']:11d} {row['output_sqnr_db']:11.2f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
