"""Per-inference time of the DPU-subgraph runners (sim = instruction executor, ref = XIR reference).

Prints one row per (model, backend): instructions, warm-up time, median and best wall time per inference.
Goals (issue 2): sim <= 10 ms per MNIST inference, <= 2 s per YOLOX-nano B4096 inference, after warm-up.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from opendpu.compiler.xir.graph import Graph  # noqa: E402
from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs  # noqa: E402
from opendpu.runtime.runner import create_runner  # noqa: E402

DEFAULT = [("dpu_mnist_classifier", 50), ("tf2_custom_op", 50), ("yolox_nano_b4096", 3), ("yolox_nano_b512", 3),
           ("pointpillars_custom_op", 1)]


def bench(path: str, backend: str, reps: int) -> list[tuple]:
    g = Graph.load(path)
    rows = []
    for sg in dpu_subgraphs(g):
        r = create_runner(sg, backend)
        rng = np.random.default_rng(0)
        xs = [rng.integers(-128, 128, size=t.dims, dtype=np.int8) for t in r.get_input_tensors()]
        t0 = time.perf_counter()
        r.run(xs)
        warm = time.perf_counter() - t0
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            r.run(xs)
            ts.append(time.perf_counter() - t0)
        n = len(DpuSubgraph(g, sg).instructions)
        rows.append((sg.name[:48], n, warm, statistics.median(ts), min(ts)))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
    p.add_argument("--only", nargs="*", help="model stems to run (default: all five)")
    p.add_argument("--backends", nargs="*", default=["sim", "ref"])
    a = p.parse_args(argv)
    print(f"{'model':24s} {'backend':7s} {'subgraph':48s} {'instr':>6s} {'warmup_s':>9s} {'median_ms':>10s} "
          f"{'best_ms':>9s}")
    for stem, reps in DEFAULT:
        if a.only and stem not in a.only:
            continue
        path = os.path.join(a.models, stem + ".xmodel")
        if not os.path.isfile(path):
            print(f"{stem}: not found in {a.models}")
            continue
        for be in a.backends:
            for name, n, warm, med, best in bench(path, be, reps):
                print(f"{stem:24s} {be:7s} {name:48s} {n:6d} {warm:9.3f} {med * 1e3:10.2f} {best * 1e3:9.2f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
