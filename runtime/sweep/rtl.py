"""--verify-rtl: co-simulate K points of a sweep's Pareto front on the RTL (bit and cycle exact)."""
from __future__ import annotations

import json
import sys
import time

import numpy as np

from .cache import compile_target, prepare_model
from .points import build_target
from .spec import ModelSpec, SweepSpec, parse_model
from .tables import pareto_front

VERIFY_MAX_SIZE = 64           # --verify-rtl compiles a zoo model at most this large (input H and W)


def pick_points(rows: list[dict], model: str, k: int) -> list[dict]:
    """K rows of the model's fps-vs-DSP Pareto front, one per array (PP, CP, ALU PP, banks), spread over the front:
    the fastest, the smallest and the ones between."""
    front = [r for r in pareto_front(rows, "dsp", "fps") if r["model"] == model]
    seen, pick = set(), []
    for r in sorted(front, key=lambda r: -r["fps"]):
        key = (r["pp"], r["cp"], r["alu_pp"], r["bank_depth"], r["img_bg"])
        if key not in seen:
            seen.add(key)
            pick.append(r)
    if len(pick) > k:
        idx = sorted({round(i * (len(pick) - 1) / max(1, k - 1)) for i in range(k)})
        pick = [pick[i] for i in idx]
    return pick


def small_model(m: ModelSpec) -> ModelSpec:
    """The model as co-simulated: a zoo model larger than VERIFY_MAX_SIZE at a smaller input (multiples of 32, at
    least 32), any other model as it is."""
    if m.source.startswith("zoo:") and m.source != "zoo:digits":
        from opendpu.quant import zoo
        size = m.size or zoo.DEFAULT_SIZE[m.source[4:]]
        hw = size if isinstance(size, (list, tuple)) else (size, size)
        if max(hw) > VERIFY_MAX_SIZE:
            f = VERIFY_MAX_SIZE / max(hw)
            return parse_model(m.source, size=[max(32, int(v * f) // 32 * 32) for v in hw], label=m.label)
    return m


def _cosim_point(g, r: dict, options: dict, rng: np.random.Generator) -> tuple[list, float]:
    """Compile the graph for the row's point (runtime.flow.compile_step) and co-simulate its DPU subgraphs on
    random int8 inputs: the cosim reports and the co-simulation's seconds."""
    from opendpu.runtime.cosim import cosim_programs, subgraph_program
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    from opendpu.runtime.flow import compile_step
    t = build_target(json.loads(r["params"]))
    out = compile_step(g, compile_target(t), options=options).graph
    progs = []
    for sg in dpu_subgraphs(out):
        d = DpuSubgraph(out, sg)
        xs = [rng.integers(-128, 128, size=s.shape, dtype=np.int8) for s in d.inputs]
        instrs, sizes, init = subgraph_program(d, xs)
        progs.append((sg.name, instrs, sizes, init))
    t0 = time.perf_counter()
    return (cosim_programs(t, progs) if progs else []), time.perf_counter() - t0


def verify_rtl(spec: SweepSpec, rows: list[dict], k: int, cache: str) -> int:
    """Co-simulate K points of the fps-vs-DSP Pareto front of the first model on the RTL (bit and cycle exact).
    A zoo model is compiled at an input of at most VERIFY_MAX_SIZE for this check."""
    from opendpu.compiler.xir.graph import Graph
    m = spec.models[0]
    pick = pick_points(rows, m.label, k)
    if not pick:
        print(f"opendpu sweep: error: --verify-rtl: model {m.label} has no ok point on its Pareto front",
              file=sys.stderr)
        return 2
    small = small_model(m)
    g = Graph.load(prepare_model(small, cache, seed=spec.seed).path)
    bad = 0
    rng = np.random.default_rng(spec.seed)
    for r in pick:
        reps, seconds = _cosim_point(g, r, spec.options, rng)
        ok = bool(reps) and all(x.ok and x.ddr_bytes > 0 for x in reps)       # nothing compared is no match
        bad += not ok
        cyc = sum(x.rtl_cycles for x in reps)
        size = "" if small is m else f" at {small.label}/{small.size}"
        print(f"verify-rtl {r['point']}{size}: {len(reps)} DPU subgraph(s), RTL {cyc} cycles: "
              f"{'MATCH' if ok else 'MISMATCH'} ({seconds:.0f} s)", flush=True)
        for x in reps:
            if not x.ok:
                print("  " + x.summary(), flush=True)
    print(f"verify-rtl: {len(pick) - bad}/{len(pick)} Pareto points match the RTL bit and cycle for cycle")
    return 1 if bad else 0
