"""Speed of the RTL simulation (hw/): simulated DPU cycles per wall-second, build times, flow comparison.

Prints, per target, the Verilog export + compile time of the bench (first build; later runs are cached)
and the simulated cycles per second of long random programs (sim/progen.py) run in one simulator
process. Goal: >= 100 k cycles/s on B1024. Also the MNIST xmodel's RTL wall time, and with --flows the
same small workload on Verilator direct and cocotb + Icarus (the choice recorded in docs/rtl.md). Wall
times include process start and the file I/O of loading and dumping DDR.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

from opendpu.hw.harness import Job, build, ddr_needed, run_jobs  # noqa: E402
from opendpu.isa.program import encode  # noqa: E402
from opendpu.isa.target import Target, get_target  # noqa: E402
from opendpu.sim.progen import random_program  # noqa: E402
from opendpu.sim.timing import simulate  # noqa: E402


def workload(t, n_progs, n_instr, seed=0):
    jobs, cycles = [], 0
    for s in range(seed, seed + n_progs):
        g = random_program(t, n_instr, seed=s)
        sc = simulate(g.arrays, t)
        cycles += sc.total_cycles
        jobs.append(Job(encode(g.instructions), g.reg_sizes, g.reg_init, ninstr=len(sc),
                        max_cycles=sc.total_cycles * 2 + 1000))
    return jobs, cycles


def bench_target(name, t, flow, n_progs, n_instr):
    jobs, cycles = workload(t, n_progs, n_instr)
    need = max(ddr_needed(j.reg_sizes) for j in jobs)
    t0 = time.time()
    b = build(t, flow, ddr_bytes=need)
    built = time.time() - t0
    t0 = time.time()
    res = run_jobs(b, jobs)
    wall = time.time() - t0
    assert all(r.status == "done" for r in res)
    rtl_cycles = sum(r.cycles for r in res)
    assert rtl_cycles == cycles, (rtl_cycles, cycles)
    print(f"{name:28s} {flow:17s} build {b.build_seconds:6.1f} s (this call {built:5.1f} s)  "
          f"{n_progs} programs, {cycles:>9,d} cycles in {wall:6.2f} s = {cycles / wall / 1e3:8.1f} k cycles/s")
    return cycles / wall


def bench_mnist(models):
    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    path = os.path.join(models, "dpu_mnist_classifier.xmodel")
    if not os.path.isfile(path):
        print(f"(no {path})")
        return
    g = Graph.load(path)
    dsg = DpuSubgraph(g, dpu_subgraphs(g)[0])
    xs = [np.zeros(s.dims, np.int8) for s in dsg.inputs]
    dsg.run_rtl(xs)                       # build (cached afterwards)
    t0 = time.time()
    out, res = dsg.run_rtl(xs)
    wall = time.time() - t0
    print(f"MNIST xmodel on B4096 RTL: {res.cycles:,d} cycles, {wall:.2f} s wall "
          f"(simulator {res.wall_seconds:.2f} s) = {res.cycles / res.wall_seconds / 1e3:.1f} k cycles/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
    ap.add_argument("--flows", action="store_true", help="also compare the three simulator flows")
    ap.add_argument("--targets", default="small,DPUCZDX8G_ISA1_B512,DPUCZDX8G_ISA1_B1024,DPUCZDX8G_ISA1_B4096")
    a = ap.parse_args()
    for name in a.targets.split(","):
        t = Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=256) if name == "small" else get_target(name)
        bench_target(t.name or name, t, "verilator", 20, 400)
    bench_mnist(a.models)
    if a.flows:
        t = Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=256)
        for flow in ("verilator", "cocotb-icarus"):     # cocotb-verilator: see docs/rtl.md (build time)
            bench_target(t.name, t, flow, 5, 200)


if __name__ == "__main__":
    main()
