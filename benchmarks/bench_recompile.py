"""Recompile the shared AMD-compiled models with opendpu's compiler for their own targets (and YOLOX-nano for every
preset) and print, per DPU subgraph, ours beside AMD's: instructions, cycle-model cycles, DDR bytes read / written,
and whether the two programs give the same output bytes on the same random inputs.

    python benchmarks/bench_recompile.py [--models DIR] [--seeds 2] [--retarget] [--options JSON]

--options passes compile options, e.g. '{"fuse": false}' or '{"channel_augmentation": false}' to measure one
code-generation optimisation against the program without it (docs/compiler.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from opendpu.compiler.pipeline import compile as compile_graph
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.target import PRESET_FINGERPRINTS, Target
from opendpu.runtime.costmodel import cycle_model
from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs

MODELS = {"dpu_mnist_classifier": "DPUCZDX8G_ISA1_B4096", "tf2_custom_op": "DPUCZDX8G_ISA1_B4096",
          "pointpillars_custom_op": "DPUCZDX8G_ISA1_B4096", "yolox_nano_b4096": "DPUCZDX8G_ISA1_B4096",
          "yolox_nano_b512": "DPUCZDX8G_ISA1_B512"}


def run(d: DpuSubgraph, inputs):
    m = d.new_machine(0)
    outs = d.run_sim(inputs, machine=m)
    st = m.stats
    return outs, int(d.last_schedule.total_cycles), sum(st["load_bytes"].values()), sum(st["save_bytes"].values())


def rand_inputs(d: DpuSubgraph, seed: int):
    rng = np.random.default_rng(seed)
    return [rng.integers(-128, 128, s.dims).astype(np.int8) for s in d.inputs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--retarget", action="store_true", help="also compile YOLOX-nano for every preset")
    ap.add_argument("--options", default="{}", help="compile options as JSON (e.g. '{\"fuse\": false}')")
    a = ap.parse_args(argv)
    opts = json.loads(a.options)
    print(f"{'model / DPU subgraph':58s} {'instr ours/AMD':>16s} {'cycles ours/AMD':>22s} {'DDR rd MB ours/AMD':>20s} "
          f"{'DDR wr MB ours/AMD':>20s} {'same outputs':>12s}")
    all_same = True
    for name, tname in MODELS.items():
        path = os.path.join(a.models, name + ".xmodel")
        amd = Graph.load(path)
        t0 = time.time()
        res = compile_graph(Graph.load(path), tname, recompile=True, cycles=cycle_model, **opts)
        tc = time.time() - t0
        ours = res.graph
        sa, so = dpu_subgraphs(amd), dpu_subgraphs(ours)
        if len(sa) != len(so):
            print(f"{name}: {len(so)} DPU subgraphs, AMD {len(sa)}: not compared (counts as a failure)")
            all_same = False
            continue
        for ga, go in zip(sa, so):
            da, do = DpuSubgraph(amd, ga), DpuSubgraph(ours, go)
            same = [s.dims for s in da.inputs] == [s.dims for s in do.inputs]
            row = None
            for seed in range(a.seeds):
                x = rand_inputs(da, seed)
                oa, ca, ra, wa = run(da, x)
                oo, co, ro, wo = run(do, x)
                same = same and len(oa) == len(oo) and all(np.array_equal(p, q) for p, q in zip(oa, oo))
                row = (co, ca, ro, ra, wo, wa)
            all_same &= same
            co, ca, ro, ra, wo, wa = row
            label = f"{name}/{ga.name}"[:58]
            print(f"{label:58s} {len(do.instructions):>7d}/{len(da.instructions):<8d} {co:>10d}/{ca:<11d} "
                  f"{ro / 1e6:>9.2f}/{ra / 1e6:<10.2f} {wo / 1e6:>9.2f}/{wa / 1e6:<10.2f} {str(same):>12s}")
        print(f"  ({name}: compiled in {tc:.1f} s)")
    if a.retarget:
        path = os.path.join(a.models, "yolox_nano_b4096.xmodel")
        print(f"\nYOLOX-nano retargeted ({'target':22s} instructions, cycles, ms at 300 MHz)")
        for tn in PRESET_FINGERPRINTS:
            res = compile_graph(Graph.load(path), tn, recompile=True, cycles=cycle_model, **opts)
            (go,) = dpu_subgraphs(res.graph)
            d = DpuSubgraph(res.graph, go)
            _, c, r, w = run(d, rand_inputs(d, 0))
            t = Target.from_name(tn)
            print(f"  {tn:28s} {len(d.instructions):>8d} {c:>10d} {c / (t.timing.clock_mhz * 1e3):8.2f}")
    print(f"\nall DPU subgraphs give AMD's output bytes: {all_same}")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
