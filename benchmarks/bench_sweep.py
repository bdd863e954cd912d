"""Architecture sweep benchmark (issue 17): the acceptance sweep cold and warm, and 1,000+ points on a warm cache.

    python benchmarks/bench_sweep.py [--models DIR] [--out DIR] [--workers 2] [--skip-cold]

1. Cold: `opendpu sweep --spec benchmarks/sweeps/acceptance.toml <shared>/yolox_nano_b4096.xmodel` with an empty
   compile cache: ResNet-50, MobileNet v2 and YOLOX-nano over the 8 presets and 44 sampled parametric arrays
   (156 points; every program compiled).
2. Warm: the same 52 configurations, each at 4 clocks x 1-2 cores (416 points per model, 1,248 in all), into a new
   sweep directory (nothing to resume) with the compile cache of step 1: every point is a cache hit plus the cycle
   model, the resource model and the reports.
Prints the wall-clock seconds of each, points per second, and the Pareto tables (fps vs DSP, fps vs BRAM36) of
the cold sweep. Everything goes through the `opendpu sweep` command line, as a user runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "benchmarks", "sweeps", "acceptance.toml")
CLOCKS = (200, 250, 300, 350)
CORES = (1, 2)


def opendpu(args: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "opendpu.runtime.cli", *args], text=True, capture_output=True)
    dt = time.perf_counter() - t0
    tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-4:])
    print(f"  $ opendpu {' '.join(args)}\n  rc {r.returncode}, {dt:.1f} s\n  " + tail.replace("\n", "\n  "), flush=True)
    if r.returncode not in (0, 2):
        raise SystemExit(f"opendpu sweep failed (rc {r.returncode})")
    return dt


def toml_value(v) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)


def warm_spec(path: str, yolox: str) -> int:
    """The 52 configurations of the acceptance sweep x CLOCKS x CORES as one list-mode space; returns the points."""
    from opendpu.runtime.sweep import expand, load_spec
    base = expand(load_spec(SPEC))
    pts = [{**p, "clock_mhz": float(c), "cores": n} for p in base for c in CLOCKS for n in CORES]
    lines = ["seed = 17", "[[model]]", 'zoo = "resnet50"', "[[model]]", 'zoo = "mobilenet_v2"',
             "[[model]]", f"path = {json.dumps(os.path.abspath(yolox))}", "[[space]]", "points = ["]
    lines += ["  {" + ", ".join(f"{k} = {toml_value(v)}" for k, v in p.items()) + "}," for p in pts]
    lines.append("]")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return len(pts)


def pareto_tables(out: str) -> None:
    from opendpu.runtime.sweep.tables import pareto_front
    with open(os.path.join(out, "sweep.json")) as f:
        rows = json.load(f)["rows"]
    for x in ("dsp", "bram36"):
        for model in dict.fromkeys(r["model"] for r in rows):
            front = [r for r in pareto_front(rows, x, "fps") if r["model"] == model]
            print(f"\n{model}: fps vs {x} Pareto front ({len(front)} of "
                  f"{sum(r['model'] == model and r['status'] == 'ok' for r in rows)} ok points)")
            print(f"  {'point':44s} {'fps':>8s} {'DSP':>6s} {'BRAM36':>7s} {'MAC util':>8s} {'bound':>6s}")
            for r in front:
                print(f"  {r['point'][:44]:44s} {r['fps']:8.1f} {r['dsp']:6d} {r['bram36']:7g} {r['mac_util']:8.3f} "
                      f"{str(r['bottleneck']):>6s}")
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        print(f"\n{len(failed)} failed points:")
        for r in failed[:10]:
            print(f"  {r['model']} {r['point']}: {r['reason'][:160]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.path.join(ROOT, "..", "shared", "models"))
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench-sweep"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-cold", action="store_true", help="reuse the cold sweep and cache of an earlier run")
    a = ap.parse_args()
    yolox = os.path.join(a.models, "yolox_nano_b4096.xmodel")
    cache, cold, warm = (os.path.join(a.out, d) for d in ("cache", "cold", "warm"))
    if not a.skip_cold:
        for d in (cache, cold):
            shutil.rmtree(d, ignore_errors=True)
        print("cold: empty compile cache", flush=True)
        dt = opendpu(["sweep", "--spec", SPEC, yolox, "-o", cold, "--cache", cache, "--workers", str(a.workers),
                      "--plot", os.path.join(cold, "plots")])
        print(f"cold sweep: 156 points in {dt:.0f} s ({156 / dt:.2f} points/s)")
    shutil.rmtree(warm, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    spec = os.path.join(a.out, "warm.toml")
    n = warm_spec(spec, yolox) * 3
    print(f"warm: {n} points, compile cache {cache}", flush=True)
    dt = opendpu(["sweep", "--spec", spec, "-o", warm, "--cache", cache, "--workers", str(a.workers)])
    print(f"warm sweep: {n} points in {dt:.0f} s ({n / dt:.1f} points/s; goal: 1,000 in <= 300 s)")
    pareto_tables(cold)
    return 0


if __name__ == "__main__":
    sys.exit(main())
