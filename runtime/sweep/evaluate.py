"""One point of a sweep: compile a model for the point's target (through the compile cache) and time it on the
timing-only cycle model. Its row gives cycles, latency, fps with cores and DDR contention (sim/multicore.py), GOP/s,
MAC utilisation, DDR bytes and bandwidth, on-chip memory use, the bounding engine per layer and the estimated FPGA
resources (hw/resources.py). A point that fails is a row with its reason; `run_task` never raises.
"""
from __future__ import annotations

import hashlib
import json
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.fields import Engine
from opendpu.isa.target import Target

from .cache import CompiledModel, compile_target, load_or_compile
from .points import point_id, resources
from .spec import ROW_COLUMNS


# ---- compiling -------------------------------------------------------------------------------------------------
def _onchip_lines(arrays, t: Target) -> int:
    """Distinct bank lines written by a program (isa.footprint): how much of the banks it uses."""
    from opendpu.isa.footprint import program_footprints
    used = np.zeros((t.num_banks, t.bank_depth), bool)
    for fp in program_footprints(arrays, t):
        for ln in fp.writes.lines:
            for k in range(ln.blocks):
                s = (ln.start + k * ln.step) % t.bank_depth
                e = s + ln.width
                if ln.bank < t.num_banks:
                    used[ln.bank, s:min(e, t.bank_depth)] = True
                    if e > t.bank_depth:
                        used[ln.bank, :e - t.bank_depth] = True
    return int(used.sum())


def compile_point(graph_bytes_or_path, t: Target, options: dict) -> CompiledModel:
    """Compile a quantized (or compiled: recompiled) graph for `t` with the cycle model as the cost function
    (runtime.flow.compile_step, as `opendpu compile`)."""
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    from opendpu.runtime.flow import compile_step
    from opendpu.runtime.profile import host_io_bytes, summarize_subgraph
    t0 = time.perf_counter()
    res = compile_step(_graph(graph_bytes_or_path), t, options=options)
    out = res.graph
    sums, lines = [], 0
    for sg in dpu_subgraphs(out):
        d = DpuSubgraph(out, sg)
        sums.append(summarize_subgraph(d))
        lines = max(lines, _onchip_lines(d.arrays, t))
    cpu = [(str(c["name"]), " ".join(str(c["reason"]).split())) for c in res.meta["coverage"]["cpu_ops"]]
    return CompiledModel(sums, cpu, lines, time.perf_counter() - t0, host_io_bytes(out))


_GRAPHS: dict[str, Any] = {}


def _graph(src):
    """The quantized graph of a model source (a path, or serialized bytes from the Ray object store), memoised."""
    from opendpu.compiler.xir.graph import Graph
    key = src if isinstance(src, str) else hashlib.sha256(src).hexdigest()
    g = _GRAPHS.get(key)
    if g is None:
        g = Graph.load(src) if isinstance(src, str) else Graph.deserialize(src)
        _GRAPHS.clear()
        _GRAPHS[key] = g
    return g


# ---- one point -------------------------------------------------------------------------------------------------
@dataclass
class Task:
    """One (model, point): everything a worker needs (picklable; `src` is a path or the graph's bytes)."""

    model: str
    model_hash: str
    point: dict
    hash: str
    target: Target | None
    key: str
    cache_dir: str | None
    options: dict
    reason: str = ""                   # a point that cannot be built: its reason (no work)


def base_row(task: Task) -> dict:
    t, p = task.target, task.point
    row: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
    row.update(model=task.model, point=point_id(p), hash=task.hash, status="failed", reason=task.reason,
               preset=p.get("preset", ""), board=p.get("board", ""),
               params=json.dumps(p, sort_keys=False), meets_constraints=True)
    if t is not None:
        row.update(target=t.name, pp=t.pp, cp=t.cp, alu_pp=t.alu_pp, bank_depth=t.bank_depth, img_bg=t.img_bg,
                   clock_mhz=t.timing.clock_mhz, cores=t.timing.cores, **resources(t))
    return row


def evaluate(task: Task, src) -> dict:
    """Compile (or take from the cache) and time one point; a failure is a row with status "failed" and its
    reason. Returns the point's full result: the row plus per-layer `layers`."""
    row = base_row(task)
    target = task.target
    if target is None:
        return {**row, "layers": []}
    t0 = time.perf_counter()
    try:
        comp, cached = load_or_compile(task.key, task.cache_dir,
                                       lambda: compile_point(src, compile_target(target), task.options))
    except (OpenDpuError, ValueError, AssertionError, RecursionError, MemoryError) as e:
        first = " ".join(str(e).split())[:400]
        row.update(reason=f"compile: {type(e).__name__}: {first}", eval_s=time.perf_counter() - t0)
        return {**row, "layers": []}
    row.update(compile_cached=cached, compile_s=comp.compile_s, cpu_ops=len(comp.cpu_ops))
    if not comp.summaries:
        why = "; ".join(f"{o}: {r}" for o, r in comp.cpu_ops[:3])
        row.update(reason=f"no DPU subgraph: every op runs on the CPU ({why})", eval_s=time.perf_counter() - t0)
        return {**row, "layers": []}
    try:
        row_m, layers = measure(comp, target)
    except (OpenDpuError, ValueError) as e:
        row.update(reason=f"timing: {type(e).__name__}: {e}", eval_s=time.perf_counter() - t0)
        return {**row, "layers": []}
    row.update(row_m, status="ok", reason="", eval_s=time.perf_counter() - t0)
    return {**row, "layers": layers}


def measure(comp: CompiledModel, t: Target) -> tuple[dict, list[dict]]:
    """The metrics of a compiled model on target `t` (its timing): the timing-only cycle model per DPU subgraph,
    in graph order, one DPU run each; fps with cores, host overhead and DDR contention (sim/multicore.py)."""
    from opendpu.runtime.profile import Profile, profile_summary
    subs = [profile_summary(s, t) for s in comp.summaries]
    prof = Profile("", subs, t.timing.cores, comp.io_bytes)
    thr = prof.throughput()
    cycles = prof.total_cycles
    ops = sum(s.workload for s in subs)
    ms = cycles / (t.timing.clock_mhz * 1e3)
    layers, by_engine = [], dict.fromkeys((e.name for e in Engine), 0)
    counts = dict.fromkeys((e.name for e in Engine), 0)
    for sp in subs:
        for ly, b in zip(sp.layers, sp.bounding_engines()):
            layers.append({"subgraph": sp.name, "name": ly.name, "cycles": ly.cycles, "ops": ly.workload,
                           "bound": b})
            if b is not None:
                by_engine[b] += ly.cycles
                counts[b] += 1
    rd = sum(s.ld_wb + s.ld_fm for s in subs)
    wr = sum(s.st_fm for s in subs)
    cap = t.num_banks * t.bank_depth
    row = {"cycles": cycles, "latency_ms": ms, "fps": thr.fps, "ddr_bound": bool(thr.ddr_bound),
           "fps_single": thr.fps_single, "fps_bound": thr.bound, "ops": ops,
           "gops": ops / ms / 1e6 if ms else 0.0,
           "mac_util": ops / (cycles * t.peak_ops_per_cycle) if cycles else 0.0,
           "ddr_read_bytes": rd, "ddr_write_bytes": wr, "ddr_mbps": (rd + wr) * thr.fps / 1e6,
           "onchip_bytes": comp.onchip_lines * t.bank_width, "onchip_pct": 100.0 * comp.onchip_lines / cap,
           "bottleneck": max(by_engine, key=lambda k: by_engine[k]) if cycles else None,
           "layers_conv": counts["CONV"], "layers_misc": counts["MISC"], "layers_load": counts["LOAD"],
           "layers_save": counts["SAVE"], "instructions": sum(len(s.arrays.op) for s in comp.summaries),
           "dpu_subgraphs": len(subs)}
    return row, layers


def run_task(task: Task, src) -> dict:
    """Worker entry point (pool and Ray alike): evaluate, never raise (an unexpected error is the point's
    reason, with the traceback's last line)."""
    try:
        return evaluate(task, src)
    except Exception as e:                           # noqa: BLE001 - one point's bug must not stop the sweep
        tb = traceback.format_exc().strip().splitlines()
        row = base_row(task)
        row.update(reason=f"internal error: {type(e).__name__}: {e} ({tb[-3].strip() if len(tb) > 2 else ''})")
        return {**row, "layers": []}

