"""vaitrace-style profiler on the cycle model: per-layer table, Perfetto trace, utilisation plot, JSON/CSV.

Each DPU subgraph's program is timed by `sim.timing.simulate` on its target, with timing parameters
from the target or overrides. Instructions are attributed to the layers of the xmodel, which are the
child subgraphs of the DPU subgraph in `children_topological_sort` order. The rule is recorded in
docs/decisions.md:
* CONV/ALU/ELEW instructions fill the layer's compute ops in order, by the output elements they write.
  Their INITs go with them.
* A LOAD belongs to the layer of the compute instruction that consumes its group's token.
* A SAVE belongs to the layer of the compute instruction whose token its group waits for.
A program compiled by opendpu carries the exact instruction -> layer map (`opendpu_layer_map`, written by
compiler.emit); then every instruction goes to the layer the compiler generated it for, and only the compute
elements are still counted per op (for `attribution_quality`).
Each cycle of the run is charged to one layer. That is the layer of the active instruction, by
priority CONV > MISC > LOAD > SAVE. An idle cycle goes to the next instruction to start. So the
per-layer times add up exactly to the total. The cycles a layer is charged with, in time order, are its
*span* (`SubgraphProfile.layer_runs`); the engine busy for most cycles of the span is the layer's
*bounding engine* (`SubgraphProfile.bounding_engines`).

Figures (`Profile.plot`, `Profile.figure`, drawn by runtime/plots.py) are written in the formats of
`PLOT_FORMATS`.
"""
from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field

import numpy as np

from opendpu.compiler.fixpoint import conv_shifts
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.fields import FIELD_INDEX, OPS, Engine
from opendpu.isa.program import OP_INDEX, ProgramArrays
from opendpu.isa.target import Target
from opendpu.runtime.dpu import DpuSubgraph, RuntimeErrorDPU, dpu_subgraphs
from opendpu.runtime.ops import output_of
from opendpu.sim.timing import Schedule, simulate

PLOT_FORMATS = ("png", "svg", "pdf")    # figure formats of Profile.plot (the file suffix chooses)
MB = float(1 << 20)        # vaitrace MB (LdWB of a 3x3x512x512 conv prints 2.250)

# compute op types -> instruction class that realises them on ISA1 (spec §7)
_CONV_OPS = {"conv2d-fix", "transposed-conv2d-fix"}
_ALU_OPS = {"depthwise-conv2d-fix", "transposed-depthwise-conv2d-fix", "pool-fix", "hard-sigmoid-fix",
            "leaky-relu-fix", "prelu-fix", "reduction-max-fix"}
_ELEW_OPS = {"eltwise-fix", "upsample-fix"}
_KIND = {**{t: 0 for t in _CONV_OPS}, **{t: 1 for t in _ALU_OPS}, **{t: 2 for t in _ELEW_OPS}}
_OP_KIND = {OP_INDEX["CONV"]: 0, OP_INDEX["CONVINIT"]: 0, OP_INDEX["ALU"]: 1, OP_INDEX["ALUINIT"]: 1,
            OP_INDEX["ELEW"]: 2, OP_INDEX["ELEWINIT"]: 2}
_CONV, _CONVINIT, _ALU, _ALUINIT, _ELEW = (OP_INDEX[n] for n in ("CONV", "CONVINIT", "ALU", "ALUINIT", "ELEW"))
_LOAD, _SAVE, _END = OP_INDEX["LOAD"], OP_INDEX["SAVE"], OP_INDEX["END"]
_ELEWINIT_ = OP_INDEX["ELEWINIT"]
_FI = FIELD_INDEX
_PRIORITY = (Engine.CONV, Engine.MISC, Engine.LOAD, Engine.SAVE)   # charging order, also ties


@dataclass
class Layer:
    name: str                     # child subgraph name
    ops: list[str]
    workload: int                 # ops (2 per MAC), from the child's `workload` attribute
    cycles: int = 0
    instructions: int = 0
    ld_wb: int = 0                # bytes
    ld_fm: int = 0
    st_fm: int = 0
    expected: list = field(default_factory=list)    # [(kind, op name, expected output elements)]
    produced: dict = field(default_factory=dict)    # op name -> output elements written


def _coverage_ok(ly: "Layer") -> tuple[int, int]:
    ok = sum(1 for e in ly.expected if e[2] <= ly.produced.get(e[1], 0) <= 1.1 * e[2])
    return ok, len(ly.expected)


@dataclass
class SubgraphProfile:
    name: str
    target: Target
    schedule: Schedule
    layers: list[Layer]
    layer_of: np.ndarray          # layer index of each instruction
    workload: int
    ld_wb: int = 0
    ld_fm: int = 0
    st_fm: int = 0
    runs: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))   # [layer, start, end)

    @property
    def cycles(self) -> int:
        return self.schedule.total_cycles

    def layer_runs(self, layer: int) -> np.ndarray:
        """The span of `layer`: the maximal runs [start, end) of consecutive cycles charged to it, in time
        order (an [k, 2] array). The runs of all layers tile [0, total_cycles) and a layer's runs add up to
        its `cycles`; a layer interleaved with another one has several runs."""
        return self.runs[self.runs[:, 0] == layer, 1:]

    def layer_engine_busy(self) -> np.ndarray:
        """[layers, 4] cycles of each layer's span in which each engine (Engine order) executes at least
        one instruction, of any layer."""
        s = self.schedule
        out = np.zeros((len(self.layers), len(Engine)), np.int64)
        if not len(self.runs):
            return out
        for e in Engine:
            m = s.engine == e
            out[:, e] = np.bincount(self.runs[:, 0], weights=_busy_within(s.start[m], s.end[m], self.runs[:, 1],
                                                                          self.runs[:, 2]),
                                    minlength=len(self.layers))[:len(self.layers)].astype(np.int64)
        return out

    def bounding_engines(self) -> list:
        """Per layer, its bounding engine: the engine (LOAD, SAVE, CONV or MISC) busy for the most cycles
        of the layer's span (`layer_runs`, the cycles charged to the layer), counting the instructions of
        any layer that run then; ties go by the charging priority CONV > MISC > LOAD > SAVE. None for a
        layer charged with no cycle."""
        busy = self.layer_engine_busy()
        return [_bound(b) if ly.cycles else None for b, ly in zip(busy, self.layers)]

    def bounding_engine(self) -> str | None:
        """The bounding engine of the whole run (its span is [0, total_cycles))."""
        busy = self.schedule.engine_busy()
        return _bound(np.array([busy[e.name] for e in Engine])) if self.cycles else None

    def attribution_quality(self) -> dict:
        """Compute ops whose attributed instructions write between 1x and 1.1x their (channel-padded)
        output elements; the rest were attributed approximately."""
        ok = tot = 0
        for ly in self.layers:
            a, b = _coverage_ok(ly)
            ok, tot = ok + a, tot + b
        return {"compute_ops": tot, "matched": ok}

    @property
    def ms(self) -> float:
        return self.schedule.latency_ms


def _bound(busy: np.ndarray) -> str:
    best = max(_PRIORITY, key=lambda e: (busy[e], -_PRIORITY.index(e)))
    return best.name


def _busy_within(s: np.ndarray, e: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each window [a, b): the cycles covered by the union of the intervals [s, e)."""
    if not len(s):
        return np.zeros(len(a))
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    ms = s[new]
    me = np.maximum.reduceat(e, np.nonzero(new)[0])         # disjoint merged intervals [ms, me)
    ln = me - ms
    before = np.concatenate(([0], np.cumsum(ln)))           # busy cycles of the intervals before the k-th

    def covered(t):                                          # busy cycles in [0, t)
        k = np.searchsorted(ms, t, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where(k >= 0, before[kk] + np.clip(t - ms[kk], 0, ln[kk]), 0)

    return (covered(b) - covered(a)).astype(np.float64)


def _row(dpu_id, bat, name, level, wl, cycles, clock_mhz, ldwb, ldfm, stfm, dpu_subgraph="", label="",
         bound=None) -> dict:
    rt_ms = cycles / (clock_mhz * 1e3)
    gop = wl / 1e9
    return {"dpu_id": dpu_id, "bat": bat, "subgraph": name, "level": level, "wl_gop": gop, "rt_ms": rt_ms,
            "perf_gops": gop / (rt_ms / 1e3) if rt_ms > 0 else 0.0, "ldwb_mb": ldwb / MB, "ldfm_mb": ldfm / MB,
            "stfm_mb": stfm / MB, "avgbw_mbs": (ldwb + ldfm + stfm) / MB / (rt_ms / 1e3) if rt_ms > 0 else 0.0,
            "cycles": int(cycles), "dpu_subgraph": dpu_subgraph, "label": label or name, "bound": bound or ""}


# `subgraph` is the vaitrace SubGraph name: the layer (child subgraph) or, on the `level` == "subgraph"
# row, the DPU subgraph, which XIR often names after its first layer. `label` is unique across the rows:
# the layer name, or "<DPU subgraph> (DPU subgraph total)". `dpu_subgraph` is the DPU subgraph of the row,
# `bound` the bounding engine of its span (SubgraphProfile.bounding_engines).
COLUMNS = ("dpu_id", "bat", "subgraph", "level", "wl_gop", "rt_ms", "perf_gops", "ldwb_mb", "ldfm_mb", "stfm_mb",
           "avgbw_mbs", "cycles", "dpu_subgraph", "label", "bound")
TOTAL_SUFFIX = " (DPU subgraph total)"


@dataclass
class Profile:
    model: str
    subgraphs: list[SubgraphProfile]
    cores: int = 1
    io_bytes: int = 0             # the graph's input and output tensors (elements): what the host work grows with

    @property
    def total_cycles(self) -> int:
        return sum(s.cycles for s in self.subgraphs)

    @property
    def total_ms(self) -> float:
        return sum(s.ms for s in self.subgraphs)

    @property
    def ddr_bytes(self) -> int:
        """DDR bytes read and written by one batch through every DPU subgraph."""
        return sum(sp.ld_wb + sp.ld_fm + sp.st_fm for sp in self.subgraphs)

    def throughput(self):
        """fps of the first subgraph's target's `cores` on its board timing (sim/multicore.py): every DPU
        subgraph one DPU run per frame."""
        from opendpu.sim.multicore import demand_trace, throughput
        t = self.subgraphs[0].target
        tr = demand_trace([sp.schedule for sp in self.subgraphs], t.timing.clock_mhz, t.timing.frame_overhead_us)
        return throughput(self.total_cycles, self.ddr_bytes, t, runs=len(self.subgraphs), trace=tr,
                          io_bytes=self.io_bytes)

    @property
    def fps(self) -> float:
        """Frames per second of one batch through every DPU subgraph in turn: 1000 / total_ms."""
        return 1000.0 / self.total_ms if self.total_ms > 0 else 0.0

    def rows(self, layers: bool = True) -> list[dict]:
        """vaitrace DPU Summary rows: the layers of each DPU subgraph, then the subgraph itself (COLUMNS)."""
        out = []
        for k, sp in enumerate(self.subgraphs):
            dpu_id = f"DPUCZDX8G_{1 + k % self.cores}"
            clk = sp.target.timing.clock_mhz
            if layers:
                for ly, b in zip(sp.layers, sp.bounding_engines()):
                    out.append(_row(dpu_id, 1, ly.name, "layer", ly.workload, ly.cycles, clk, ly.ld_wb, ly.ld_fm,
                                    ly.st_fm, sp.name, ly.name, b))
            out.append(_row(dpu_id, 1, sp.name, "subgraph", sp.workload, sp.cycles, clk, sp.ld_wb, sp.ld_fm,
                            sp.st_fm, sp.name, sp.name + TOTAL_SUFFIX, sp.bounding_engine()))
        return out

    def table(self) -> str:
        """The text summary of `vaitrace --txt` (UG1414, Figure 37)."""
        def num(v):
            if 0 < abs(v) < 0.001:
                return "~0~"
            return f"{v:.3f}"
        lines = ["DPU Summary:", "",
                 "DPU Id | Bat | SubGraph | WL(GOP) | RT(ms) | Perf(GOP/s) | LdWB(MB) | LdFM(MB) | StFM(MB) | "
                 "AvgBw(MB/s)", ""]
        for r in self.rows(layers=True):
            lines.append(" | ".join([r["dpu_id"], str(r["bat"]), r["label"]] +
                                    [num(r[c]) for c in ("wl_gop", "rt_ms", "perf_gops", "ldwb_mb", "ldfm_mb",
                                                         "stfm_mb", "avgbw_mbs")]))
        clk = self.subgraphs[0].target.timing.clock_mhz if self.subgraphs else 0
        lines += ["", "Notes:", "~0~: Within range of (0, 0.001)", "Bat: DPU batch number",
                  "WL(GOP): Workload", "RT(ms): Run time", "Perf(GOP/s)",
                  "LdWB(MB): External memory load size of bias and weight",
                  "LdFM(MB): External memory load size of feature map",
                  "StFM(MB): External memory store size of feature map",
                  "AvgBw(MB/s): External memory average bandwidth",
                  "(DPU subgraph total): the row of a DPU subgraph, after the rows of its layers", "",
                  f"Total DPU time: {self.total_cycles} cycles = {self.total_ms:.3f} ms at {clk:g} MHz for one "
                  f"batch ({len(self.subgraphs)} DPU subgraph(s)) = {self.fps:.1f} fps"]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"model": self.model, "total_cycles": self.total_cycles, "total_ms": self.total_ms,
                "fps": self.fps, "rows": self.rows(layers=True),
                "subgraphs": [dict(name=sp.name, target=sp.target.name, fingerprint=(
                    f"0x{sp.target.fingerprint:016X}" if sp.target.fingerprint is not None else None),
                    **{k: v for k, v in sp.schedule.summary().items() if k != "target"},
                    attribution_quality=sp.attribution_quality(),
                    attribution=[dict(layer=ly.name, expected={e[1]: e[2] for e in ly.expected},
                                      produced=ly.produced, instructions=ly.instructions, bound=b,
                                      span=sp.layer_runs(li).tolist())
                                 for li, (ly, b) in enumerate(zip(sp.layers, sp.bounding_engines()))])
                    for sp in self.subgraphs]}

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")

    def write_csv(self, path: str) -> None:
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            for r in self.rows(layers=True):
                w.writerow(r)

    def write_instructions_csv(self, path: str) -> None:
        """One row per instruction of every DPU subgraph (SCALE-Sim-like stable columns)."""
        rows = []
        for sp in self.subgraphs:
            for r, li in zip(sp.schedule.instruction_rows(), sp.layer_of):
                rows.append({"subgraph": sp.name, "layer": sp.layers[li].name if len(sp.layers) else "", **r})
        with open(path, "w", newline="") as f:
            if rows:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)

    def trace(self) -> dict:
        """Chrome/Perfetto trace (JSON object format): one process per DPU subgraph run, one track per
        engine, one slice per instruction; timestamps in microseconds at the target clock."""
        ev = []
        t0 = 0.0
        for pid, sp in enumerate(self.subgraphs, start=1):
            s = sp.schedule
            us = 1.0 / s.clock_mhz
            ev.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"DPU {sp.name}"}})
            for e in Engine:
                ev.append({"ph": "M", "pid": pid, "tid": e + 1, "name": "thread_name", "args": {"name": e.name}})
                ev.append({"ph": "M", "pid": pid, "tid": e + 1, "name": "thread_sort_index",
                           "args": {"sort_index": e}})
            for i in range(len(s)):
                eng = int(s.engine[i])
                tid = eng + 1
                if eng == Engine.SAVE and s.port[i] > 0:        # overlapping SAVEs of port 1 on their own track
                    tid = 5
                ev.append({"ph": "X", "pid": pid, "tid": tid, "name": OPS[int(s.op[i])].mnemonic,
                           "ts": t0 + float(s.start[i]) * us, "dur": float(s.end[i] - s.start[i]) * us,
                           "args": {"index": i, "layer": sp.layers[sp.layer_of[i]].name if sp.layers else "",
                                    "dispatch": int(s.dispatch[i]), "start": int(s.start[i]),
                                    "end": int(s.end[i]), "stall_token": int(s.stall_token[i]),
                                    "stall_ddr": int(s.stall_ddr[i]), "stall_queue": int(s.stall_queue[i]),
                                    "stall_bank": int(s.stall_bank[i]) if s.stall_bank is not None else 0}})
            if (s.port > 0).any():
                ev.append({"ph": "M", "pid": pid, "tid": 5, "name": "thread_name", "args": {"name": "SAVE port 1"}})
            b0 = 0
            for ly in sp.layers:
                if ly.cycles:
                    ev.append({"ph": "X", "pid": pid, "tid": 0, "name": ly.name, "ts": t0 + b0 * us,
                               "dur": ly.cycles * us, "args": {"cycles": ly.cycles}})
                b0 += ly.cycles
            ev.append({"ph": "M", "pid": pid, "tid": 0, "name": "thread_name",
                       "args": {"name": "layers (cycles charged)"}})
            t0 += s.total_cycles * us
        return {"traceEvents": ev, "displayTimeUnit": "ns",
                "otherData": {"model": self.model, "total_cycles": self.total_cycles}}

    def write_trace(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.trace(), f)

    def figure(self):
        """The profile figure (a matplotlib Figure on the Agg canvas, see runtime/plots.py): per DPU
        subgraph a layer strip, one Gantt lane per engine and a per-layer time chart coloured by each
        layer's bounding engine."""
        from opendpu.runtime.plots import build_figure
        return build_figure(self)

    def plot(self, path: str) -> None:
        """Write `figure()` to `path`; the suffix picks the format, one of PLOT_FORMATS (else ValueError)."""
        _save(path, self.figure)

    def roofline(self, path: str) -> None:
        """Write the per-layer roofline (runtime/plots.py `roofline_figure`) to `path` (a PLOT_FORMATS suffix)."""
        from opendpu.runtime.plots import roofline_figure
        _save(path, lambda: roofline_figure(self))


def _save(path: str, make) -> None:
    """Write the figure `make()` builds to `path`, in the format its suffix names (one of PLOT_FORMATS, else
    ValueError before anything is built)."""
    fmt = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        raise ValueError(f"cannot write a figure to {os.fspath(path)}: unsupported suffix "
                         f"{'.' + fmt if fmt else '(none)'}; use one of "
                         f"{', '.join('.' + f for f in PLOT_FORMATS)}")
    from opendpu.runtime.plots import save_figure
    save_figure(make(), path, fmt)


SIDE_COLUMNS = ("layer", "rt_ms_a", "rt_ms_b", "rt_ratio", "cycles_a", "cycles_b", "ldwb_mb_a", "ldwb_mb_b",
                "ldfm_mb_a", "ldfm_mb_b", "stfm_mb_a", "stfm_mb_b")


def side_by_side(a: "Profile", b: "Profile") -> list[dict]:
    """Two profiles of the same graph (ours and AMD's program, or two configurations), layer by layer: the
    layers of `a` in order, then those only `b` has; a layer missing on one side has None there. The last row
    is the total (every DPU subgraph). Two profiles with no layer name in common are refused (ValueError)."""
    ra = {r["subgraph"]: r for r in a.rows(layers=True) if r["level"] == "layer"}
    rb = {r["subgraph"]: r for r in b.rows(layers=True) if r["level"] == "layer"}
    if not set(ra) & set(rb):
        raise ValueError(f"{a.model} and {b.model} have no layer in common: not two programs of one graph")
    names = list(ra) + [n for n in rb if n not in ra]
    out = []

    def row(name: str, x: dict | None, y: dict | None) -> dict:
        d: dict = {"layer": name}
        for k in ("rt_ms", "cycles", "ldwb_mb", "ldfm_mb", "stfm_mb"):
            d[k + "_a"] = x[k] if x else None
            d[k + "_b"] = y[k] if y else None
        d["rt_ratio"] = (y["rt_ms"] / x["rt_ms"]) if x and y and x["rt_ms"] > 0 else None
        return d
    for n in names:
        out.append(row(n, ra.get(n), rb.get(n)))
    tot = {}
    for side, pr in (("a", a), ("b", b)):
        sub = pr.rows(layers=False)
        tot[side] = {"rt_ms": pr.total_ms, "cycles": pr.total_cycles,
                     **{k: sum(r[k] for r in sub) for k in ("ldwb_mb", "ldfm_mb", "stfm_mb")}}
    out.append(row("(total)", tot["a"], tot["b"]))
    return out


def format_side_by_side(rows: list[dict], label_a: str, label_b: str) -> str:
    def f(v, fmt="8.3f"):
        return f"{'-':>8s}" if v is None else format(v, fmt)
    w = max([len(r["layer"]) for r in rows] + [10])
    lines = [f"A = {label_a}", f"B = {label_b}",
             f"{'layer':{w}s} {'RT A ms':>8s} {'RT B ms':>8s} {'B/A':>6s} {'LdWB A':>8s} {'LdWB B':>8s} "
             f"{'LdFM A':>8s} {'LdFM B':>8s} {'StFM A':>8s} {'StFM B':>8s}"]
    for r in rows:
        lines.append(f"{r['layer']:{w}s} {f(r['rt_ms_a'])} {f(r['rt_ms_b'])} "
                     f"{f(r['rt_ratio'], '6.2f') if r['rt_ratio'] is not None else '     -'} "
                     f"{f(r['ldwb_mb_a'])} {f(r['ldwb_mb_b'])} {f(r['ldfm_mb_a'])} {f(r['ldfm_mb_b'])} "
                     f"{f(r['stfm_mb_a'])} {f(r['stfm_mb_b'])}")
    return "\n".join(lines)


# ---- attribution ------------------------------------------------------------------------------------
def exact_layer_map(dpu: DpuSubgraph) -> list[str] | None:
    """The compiler's instruction -> layer (child subgraph) map of a program compiled by opendpu, else None; a
    damaged map is a RuntimeErrorDPU."""
    from opendpu.compiler.emit import EmitError, layer_map_of
    try:
        return layer_map_of(dpu.sg, len(dpu.instructions))
    except EmitError as e:
        raise RuntimeErrorDPU(str(e)) from None


def _layers_of(dpu: DpuSubgraph) -> list[Layer]:
    g, sg = dpu.graph, dpu.sg
    kids = {c.name: c for c in sg.children}
    order = list(sg.attrs.get("children_topological_sort") or [c.name for c in sg.children])
    exact = exact_layer_map(dpu)
    if exact is not None:        # every layer the map names, in program order where the sort does not list it
        named = set(exact)
        order = [n for n in order if n in named] + [n for n in dict.fromkeys(exact) if n not in order]
    cp = dpu.target.cp
    out = []
    for n in order:
        c = kids.get(n)
        if c is None:
            continue
        ops = g.toposort(c.all_ops())
        exp = []
        for o in ops:
            op = g.ops[o]
            k = _KIND.get(op.type)
            if k is None:
                continue
            shp = [int(d) for d in output_of(op).shape]
            ch = shp[-1] if shp else 1
            elems = int(np.prod(shp[:-1])) * (-(-ch // cp) * cp) if shp else cp
            exp.append((k, o, elems, _signature(g, op, k)))
        if not exp and c.attrs.get("skip_code_gen") and exact is None:
            continue
        wl = c.attrs.get("workload")
        out.append(Layer(n, ops, int(wl) if wl is not None else 0, expected=exp,
                         produced={e[1]: 0 for e in exp}))
    return out


def _fix(g: Graph, op, arg: str) -> int | None:
    src = op.inputs.get(arg) or []
    if not src:
        return None
    t = output_of(g.ops[src[0]])
    return t.fix_point if t.is_fixed else None


def _signature(g: Graph, op, kind: int):
    """Fields an INIT must carry for `op` (spec §7.2-7.5), or None when not derivable: conv-like ops
    (CONVINIT / ALUINIT dwconv) -> (shift_cut, shift_bias) as encoded (compiler.fixpoint, unchecked: an
    out-of-range layer simply matches no INIT); eltwise/upsample -> (num,)."""
    if kind == 2:
        return (len(op.input_ops()),) if op.type.startswith("eltwise") else (1,)
    if op.type.startswith("pool") or "sigmoid" in op.type or "relu" in op.type:
        return None
    fi, fw, fb, fo = _fix(g, op, "input"), _fix(g, op, "weights"), _fix(g, op, "bias"), output_of(op).fix_point
    if fi is None or fw is None or fo is None:
        return None
    return conv_shifts(fi, fw, fo, fb, check=False)


def _fixed_layers(dpu: DpuSubgraph, layers: list[Layer], n: int) -> np.ndarray | None:
    """The layer index of each of the first n instructions from the compiler's exact map, or None."""
    exact = exact_layer_map(dpu)
    if exact is None:
        return None
    index = {ly.name: k for k, ly in enumerate(layers)}
    return np.array([index[x] for x in exact[:n]], np.int64)


def _attribute(dpu: DpuSubgraph, s: Schedule | None, layers: list[Layer]) -> np.ndarray:
    """The layer of every instruction (`s`, the schedule, is needed unless the program carries the exact map)."""
    a = dpu.arrays
    n = len(s) if s is not None else len(a.op)
    op = a.op[:n].astype(np.int64)
    fl = a.fields[:n]
    lay = np.full(n, -1, np.int64)
    if not layers:
        return np.zeros(n, np.int64)
    fixed = _fixed_layers(dpu, layers, n)
    t = dpu.target
    # compute jobs per kind (CONV, ALU, ELEW): [layer, op name, expected elements, signature, produced]
    jobs = [[[li, e[1], e[2], e[3], 0] for li, ly in enumerate(layers) for e in ly.expected if e[0] == k]
            for k in range(3)]
    cur: list[list | None] = [None, None, None]        # the job each kind's instructions charge now
    conv_vpp = t.pp
    alu_len = alu_cg = 1
    ci, ai, ew = _FI["CONVINIT"], _FI["ALUINIT"], _FI["ELEW"]
    pending_elewinit: list[int] = []

    def choose(k, sig, keep):
        q = jobs[k]
        if fixed is not None:          # the compiler named the layer: only its ops of this kind
            q = [j for j in q if j[0] == fixed[i]]
            if keep is not None and keep[0] != fixed[i]:
                keep = None
            if not q:
                return None
        if keep is not None and keep[4] < keep[2] and (keep[3] is None or sig is None or keep[3] == sig):
            return keep
        first = None
        for j in q:
            if j[4] < j[2]:
                if first is None:
                    first = j
                if j[3] is None or sig is None or j[3] == sig:
                    return j
        return first if first is not None else (keep if keep is not None else q[-1])

    for i in range(n):
        o = int(op[i])
        k = _OP_KIND.get(o)
        if k is None or not jobs[k]:
            continue
        f = fl[i]
        if o == _CONVINIT:
            conv_vpp = int(f[ci["valid_pixel_parallel"]])
            cur[0] = choose(0, (int(f[ci["shift_cut"]]), int(f[ci["shift_bias"]])), cur[0])
            lay[i] = cur[0][0] if cur[0] is not None else -1
            continue
        if o == _ALUINIT:
            alu_len, alu_cg = int(f[ai["length"]]), int(f[ai["channel_group"]])
            mode = int(f[ai["exec_mode"]])
            sig = (int(f[ai["shift_cut"]]), int(f[ai["shift_bias"]])) if mode in (0, 6) else None
            cur[1] = choose(1, sig, cur[1])
            lay[i] = cur[1][0] if cur[1] is not None else -1
            continue
        if o == _ELEWINIT_:
            pending_elewinit.append(i)
            continue
        if o == _CONV:
            made = conv_vpp * int(f[_FI["CONV"]["length"]]) * t.cp
        elif o == _ALU:
            made = int(f[_FI["ALU"]["valid_pixel_parallel"]]) * alu_len * alu_cg * t.cp
        else:
            made = int(f[ew["valid_pixel_parallel"]]) * int(f[ew["length"]]) * int(f[ew["channel_group"]]) * t.cp
            cur[2] = choose(2, (int(f[ew["num"]]),), cur[2])
            for p in pending_elewinit:
                lay[p] = cur[2][0] if cur[2] is not None else -1
            pending_elewinit = []
        j = cur[k]
        if j is None or (fixed is not None and j[0] != fixed[i]):
            j = cur[k] = choose(k, None, None)
        if j is None:                  # exact map: a compute instruction of a layer without such ops (a copy)
            continue
        lay[i] = j[0]
        j[4] += made
        layers[j[0]].produced[j[1]] = layers[j[0]].produced.get(j[1], 0) + made
    if fixed is not None:
        return fixed
    assert s is not None
    eng = s.engine
    # LOAD -> consumer of its group's token; SAVE -> producer of its group's token (the schedule's pairing)
    src = s.token_source
    consumer = np.full(n, -1, np.int64)
    for c in (3, 2):                          # a CONV consumer wins over a MISC one
        w = np.nonzero((eng == c) & (src[:, 0] >= 0))[0]
        consumer[src[w, 0]] = w
    producer = np.where(eng == 1, np.where(src[:, 2] >= 0, src[:, 2], src[:, 3]), -1)
    compute = np.nonzero(lay >= 0)[0]
    last = compute[-1] if len(compute) else -1
    nxt_signal = -1
    for i in range(n - 1, -1, -1):          # LOADs: the next signalling LOAD's consumer
        if op[i] == _LOAD:
            if consumer[i] >= 0:
                nxt_signal = consumer[i]
            tgt = nxt_signal
            if tgt < 0 or lay[tgt] < 0:
                pos = np.searchsorted(compute, i)
                tgt = compute[pos] if pos < len(compute) else last
            lay[i] = lay[tgt] if tgt >= 0 else 0
    prev_wait = -1
    for i in range(n):                      # SAVEs: the waiting SAVE's producer
        if op[i] == _SAVE:
            if producer[i] >= 0:
                prev_wait = producer[i]
            prod = prev_wait
            if prod < 0 or lay[prod] < 0:
                pos = np.searchsorted(compute, i) - 1
                prod = compute[pos] if pos >= 0 else (compute[0] if len(compute) else -1)
            lay[i] = lay[prod] if prod >= 0 else 0
    lay[lay < 0] = lay[last] if last >= 0 else 0
    return lay


def _charge_cycles(s: Schedule, lay: np.ndarray, nlayers: int) -> tuple[np.ndarray, np.ndarray]:
    """Cycles per layer: each cycle to the active instruction of highest priority (CONV > MISC > LOAD >
    SAVE), idle cycles to the next instruction to start. Sums to total_cycles exactly. Also the runs
    [layer, start, end) of consecutive cycles charged to one layer, in time order (they tile the run)."""
    total = s.total_cycles
    cuts = np.unique(np.concatenate(([0, total], s.start, s.end)))
    cuts = cuts[(cuts >= 0) & (cuts <= total)]
    seg_s, seg_len = cuts[:-1], np.diff(cuts)
    owner = np.full(len(seg_s), -1, np.int64)
    for e in _PRIORITY:
        idx = np.nonzero(s.engine == e)[0]
        if not len(idx):
            continue
        o = idx[np.argsort(s.start[idx], kind="stable")]
        st, en = s.start[o], s.end[o]
        reach = np.maximum.accumulate(en)
        # index of the interval reaching furthest so far (the latest one on ties)
        arg = np.maximum.accumulate(np.where(en == reach, np.arange(len(en)), 0))
        pos = np.searchsorted(st, seg_s, side="right") - 1
        ok = (pos >= 0)
        act = np.zeros(len(seg_s), bool)
        act[ok] = reach[pos[ok]] > seg_s[ok]
        take = act & (owner < 0)
        owner[take] = o[arg[pos[take]]]
    idle = owner < 0
    if idle.any():
        so = np.argsort(s.start, kind="stable")
        nx = np.searchsorted(s.start[so], seg_s[idle], side="left")
        nx = np.minimum(nx, len(so) - 1)
        owner[idle] = so[nx]
    seg_lay = lay[owner]
    cycles = np.bincount(seg_lay, weights=seg_len, minlength=nlayers).astype(np.int64)
    first = np.concatenate(([True], seg_lay[1:] != seg_lay[:-1])) if len(seg_lay) else np.zeros(0, bool)
    k = np.nonzero(first)[0]
    runs = np.stack([seg_lay[k], seg_s[k], np.append(seg_s[k[1:]], total)], axis=1) if len(k) else \
        np.zeros((0, 3), np.int64)
    return cycles, runs.astype(np.int64)


def profile_subgraph(dpu: DpuSubgraph, target: Target | None = None) -> SubgraphProfile:
    t = target or dpu.target
    if t.fingerprint != dpu.target.fingerprint:
        raise RuntimeErrorDPU(f"subgraph {dpu.name!r} was compiled for {dpu.target.name}; the profile target "
                              f"{t.name} has another fingerprint (VART_GRAPH_FINGERPRINT_ERROR)")
    s = simulate(dpu.arrays, t)
    layers = _layers_of(dpu)
    lay = _attribute(dpu, s, layers)
    const = np.array([dpu.reg_context.get(int(r), "") == "CONST" for r in range(8)])
    return _charged(dpu.name, t, s, layers, lay, int(dpu.sg.attrs.get("workload") or 0), const)


def _charged(name: str, t: Target, s: Schedule, layers: list[Layer], lay: np.ndarray, workload: int,
             const: np.ndarray) -> SubgraphProfile:
    """The profile of a timed program: DDR bytes split into weights (CONST registers) and feature maps, and each
    layer's charged cycles, instructions and bytes."""
    is_ld = s.ddr_read > 0
    wb = is_ld & const[np.clip(s.ddr_reg, 0, 7)]
    sp = SubgraphProfile(name, t, s, layers, lay, workload, int(s.ddr_read[wb].sum()),
                         int(s.ddr_read[is_ld & ~wb].sum()), int(s.ddr_write.sum()))
    if layers:
        cyc, sp.runs = _charge_cycles(s, lay, len(layers))
        for li, ly in enumerate(layers):
            m = lay == li
            ly.cycles = int(cyc[li])
            ly.instructions = int(m.sum())
            ly.ld_wb = int(s.ddr_read[m & wb].sum())
            ly.ld_fm = int(s.ddr_read[m & is_ld & ~wb].sum())
            ly.st_fm = int(s.ddr_write[m].sum())
    return sp


@dataclass
class ProgramSummary:
    """What a timing profile needs of one compiled DPU subgraph, without its graph: small and picklable, so a
    sweep caches it per compiled configuration and times it under many timings (`profile_summary`)."""

    name: str
    arrays: ProgramArrays
    layers: list[tuple[str, int]]          # (layer name, workload) in profile order
    layer_of: np.ndarray                   # layer index of each instruction
    workload: int
    const_regs: np.ndarray                 # [8] bool: the DDR registers holding the parameter blob (CONST)


def summarize_subgraph(dpu: DpuSubgraph) -> ProgramSummary:
    """The `ProgramSummary` of a DPU subgraph (the instruction -> layer map: the compiler's exact one, else the
    attribution on the subgraph's own target)."""
    layers = _layers_of(dpu)
    exact = exact_layer_map(dpu) is not None
    lay = _attribute(dpu, None if exact else simulate(dpu.arrays, dpu.target), layers)
    const = np.array([dpu.reg_context.get(int(r), "") == "CONST" for r in range(8)])
    return ProgramSummary(dpu.name, dpu.arrays, [(ly.name, ly.workload) for ly in layers], lay,
                          int(dpu.sg.attrs.get("workload") or 0), const)


def profile_summary(ps: ProgramSummary, target: Target) -> SubgraphProfile:
    """`profile_subgraph` of a summarized program on `target` (same cycles, bytes and per-layer charge)."""
    s = simulate(ps.arrays, target)
    return _charged(ps.name, target, s, [Layer(n, [], wl) for n, wl in ps.layers], ps.layer_of[:len(s)],
                    ps.workload, ps.const_regs)


def profile_graph(graph: Graph, target: Target | None = None, timing: dict | None = None,
                  model: str = "") -> Profile:
    """Profile every DPU subgraph of `graph` (in graph order) on its own target (or `target`, which must
    have the same fingerprint), with optional timing overrides (e.g. {"clock_mhz": 200})."""
    subs = []
    cores = 1
    for sg in dpu_subgraphs(graph):
        d = DpuSubgraph(graph, sg)
        t = target or d.target
        if timing:
            t = t.with_timing(**timing)
        cores = t.timing.cores
        subs.append(profile_subgraph(d, t))
    if not subs:
        raise RuntimeErrorDPU(f"{model or graph.name}: the graph has no DPU subgraph to profile")
    return Profile(model or graph.name, subs, cores, host_io_bytes(graph))


def host_io_bytes(graph: Graph) -> int:
    """Elements of the graph's input tensors (data ops) and output tensors (ops nothing consumes): the data the
    host pre- and post-processes per frame (sim/multicore.py)."""
    n = 0
    for name, op in graph.ops.items():
        if op.output is None or op.type in ("const", "const-fix"):
            continue
        if op.type in ("data", "data-fix") or not graph.consumers(name):
            n += int(np.prod(op.output.shape, dtype=np.int64))
    return n


__all__ = ["Profile", "SubgraphProfile", "host_io_bytes",
           "Layer", "profile_graph", "profile_subgraph", "ProgramSummary",
           "summarize_subgraph", "profile_summary", "COLUMNS", "PLOT_FORMATS",
           "TOTAL_SUFFIX", "side_by_side", "format_side_by_side", "SIDE_COLUMNS"]
