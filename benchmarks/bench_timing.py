"""Speed of the cycle model (sim/timing.py): simulated DPU cycles per wall-second.

Prints, for every DPU subgraph of the shared models and for a synthetic ResNet-50-sized program from
the random program generator (sim/progen.py):
* timing-only time per run and simulated cycles per second. Goal: >= 20 M cycles/s.
* with functional execution: time per run and cycles per second.
* the synthetic ~50,000-instruction program in timing-only mode. Goal: <= 50 ms after warm-up.
Times are medians of several runs after one warm-up run (numba compile excluded).
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
from opendpu.isa.target import Target  # noqa: E402
from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs  # noqa: E402
from opendpu.sim.timing import simulate  # noqa: E402

MODELS = ("dpu_mnist_classifier", "tf2_custom_op", "yolox_nano_b4096", "yolox_nano_b512", "pointpillars_custom_op")


def _median(fn, reps):
    fn()                                   # warm-up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--functional-reps", type=int, default=2)
    ap.add_argument("--synthetic-n", type=int, default=50_000)
    a = ap.parse_args(argv)
    print(f"{'program':58s} {'instr':>7s} {'cycles':>10s} {'timing ms':>9s} {'Mcyc/s':>8s} "
          f"{'+func ms':>9s} {'Mcyc/s':>8s}")
    rates = []
    for name in MODELS:
        path = os.path.join(a.models, name + ".xmodel")
        if not os.path.isfile(path):
            print(f"{name}: not found at {path}")
            continue
        g = Graph.load(path)
        for k, sg in enumerate(dpu_subgraphs(g)):
            d = DpuSubgraph(g, sg)
            prog = d.arrays
            s = simulate(prog, d.target)
            t_only = _median(lambda: simulate(prog, d.target), a.reps)
            rng = np.random.default_rng(0)
            ins = [rng.integers(-128, 128, x.dims, dtype=np.int8) for x in d.inputs]
            m = d.new_machine()
            t_func = _median(lambda: d.run_sim(ins, machine=m), a.functional_reps)
            rates.append(s.total_cycles / t_only)
            print(f"{name + '#' + str(k):58s} {len(s):7d} {s.total_cycles:10d} {t_only * 1e3:9.2f} "
                  f"{s.total_cycles / t_only / 1e6:8.1f} {t_func * 1e3:9.1f} {s.total_cycles / t_func / 1e6:8.1f}")
    from opendpu.sim.progen import random_program
    for tname in ("B4096", "B512"):
        t = Target.from_name(tname)
        t0 = time.perf_counter()
        gp = random_program(t, n=a.synthetic_n, seed=1)
        gen = time.perf_counter() - t0
        prog = gp.arrays
        s = simulate(prog, t)
        t_only = _median(lambda: simulate(prog, t), a.reps)
        t_func = _median(lambda: simulate(prog, t, machine=gp.machine()), a.functional_reps)
        print(f"{'synthetic ' + tname + f' (generated in {gen:.1f} s)':58s} {len(s):7d} {s.total_cycles:10d} "
              f"{t_only * 1e3:9.2f} {s.total_cycles / t_only / 1e6:8.1f} {t_func * 1e3:9.1f} "
              f"{s.total_cycles / t_func / 1e6:8.1f}")
    if rates:
        print(f"\ntiming-only rate over the shared models: min {min(rates) / 1e6:.1f}, "
              f"median {statistics.median(rates) / 1e6:.1f} M cycles/s (goal >= 20)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
