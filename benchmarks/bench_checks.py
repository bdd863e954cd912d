"""Wall-clock figures of the checks whose complexity the tests guard by counting work (issue 29: no test asserts a
duration; tests/test_no_duration_asserts.py).

    python benchmarks/bench_checks.py [--models DIR] [--reps 3]

Prints the median wall time (after one warm-up run, so Numba compilation and first imports are excluded) of:
1. the random program generator (sim/progen.py): one 5,000-instruction B4096 program and 500 small B512 programs of
   10-80 instructions (tests/test_progen.py counts that the work is linear and the per-program cost small);
2. the static program check (isa/check.py) of every DPU subgraph of the shared models (tests/test_program_check.py
   counts that its Python work does not depend on the program's length);
3. one calibration observer update over 8 M float32 values per method (quant/calib.py; tests/test_calib.py counts
   the kernels' passes over the data and that the Python work does not depend on its size);
4. the Verilog export of the LOAD and SAVE engines on B512 and B4096 (hw/loadsave.py; tests/test_hw_loadsave.py
   checks that the netlist does not grow with the array).
The goal column is the limit the tests used to assert on a quiet machine.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


from bench_timing import MODELS, _median  # noqa: E402  (the shared model list and median-of-reps timer)


def _row(what: str, seconds: float, goal: float | None, note: str = "") -> None:
    g = f"<= {goal:g} s" if goal is not None else ""
    print(f"{what:66s} {seconds * 1e3:10.1f} ms  {g:>9s}  {note}")


def bench_progen(reps: int) -> None:
    from opendpu.isa.target import Target
    from opendpu.sim.progen import random_program
    b4096, b512 = Target.from_name("B4096"), Target.from_name("B512")
    _row("random_program: 5,000 instructions, B4096", _median(lambda: random_program(b4096, n=5000, seed=9), reps),
         2.0)

    def small():
        for s in range(500):
            random_program(b512, n=10 + s % 71, seed=s)
    _row("random_program: 500 programs of 10-80 instructions, B512", _median(small, reps), 3.0)


def bench_check(models: str, reps: int) -> None:
    from opendpu.compiler.xir.graph import Graph
    from opendpu.isa.check import check_program
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    for name in MODELS:
        path = os.path.join(models, name + ".xmodel")
        if not os.path.isfile(path):
            print(f"check_program {name}: not found at {path}")
            continue
        g = Graph.load(path)
        for k, sg in enumerate(dpu_subgraphs(g)):
            d = DpuSubgraph(g, sg)
            arr, t, sizes = d.arrays, d.target, d.reg_sizes
            _row(f"check_program {name}#{k}", _median(lambda: check_program(arr, t, sizes), reps), 1.0,
                 f"{len(arr.op)} instructions")


def bench_calib(reps: int) -> None:
    from opendpu.quant import calib as C
    x = np.random.default_rng(0).standard_normal((10, 64, 112, 112), dtype=np.float32)   # 8 M values
    for method in C.METHODS:
        o = C.make_observer("bench", method)
        _row(f"Observer.update, 8 M float32 values, {method}", _median(lambda: o.update(x), reps), 1.0)


def bench_verilog(reps: int) -> None:
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    from amaranth.back import verilog
    from opendpu.hw.loadsave import LoadEngine, SaveUnit
    from opendpu.hw.params import HwParams
    t0 = time.perf_counter()
    verilog.convert(LoadEngine(HwParams.of("DPUCZDX8G_ISA1_B512")), name="LoadEngine")
    print(f"(first Verilog export in this process, loading Yosys: {time.perf_counter() - t0:.1f} s)")
    for preset in ("DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B4096"):
        p = HwParams.of(preset)
        for cls in (LoadEngine, SaveUnit):
            lines = len(verilog.convert(cls(p), name=cls.__name__).splitlines())
            _row(f"Verilog export {cls.__name__}, {preset.rsplit('_', 1)[1]}",
                 _median(lambda: verilog.convert(cls(p), name=cls.__name__), reps), 30.0, f"{lines} lines")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    print(f"{'what':66s} {'median':>13s}  {'goal':>9s}")
    bench_progen(a.reps)
    bench_check(a.models, a.reps)
    bench_calib(a.reps)
    bench_verilog(a.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
