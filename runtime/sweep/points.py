"""The points of a sweep: its spaces expanded, each point's Target and resources, and the constraints that drop
points before any compile."""
from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np

from opendpu.isa.boards import get_board
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import Target, get_target

from .spec import MAX_POINTS, PARAMS, RESOURCE_METRICS, TIMING_PARAMS, Constraint, SweepError, SweepSpec


def expand(spec: SweepSpec) -> list[dict]:
    """Every point of the spec's spaces in order, duplicates dropped (the same spec gives the same points)."""
    if not spec.spaces:
        raise SweepError("the sweep has no parameter space; give --param NAME=V1,V2,... or a [[space]] table")
    out: dict[str, dict] = {}
    rng = random.Random(spec.seed)
    for sp in spec.spaces:
        if sp.mode == "list":
            pts = [dict(p) for p in sp.points]
        else:
            names = list(sp.axes)
            n = int(np.prod([len(sp.axes[k]) for k in names], dtype=object))
            if sp.mode == "random" and sp.samples < n:
                idx = sorted(rng.sample(range(n), sp.samples))
                pts = [_nth(sp.axes, names, i) for i in idx]
            else:
                if n > MAX_POINTS:
                    raise SweepError(f"a grid of {n} points is too many (at most {MAX_POINTS}); sample it with "
                                     f"mode = \"random\"")
                pts = [dict(zip(names, v)) for v in itertools.product(*(sp.axes[k] for k in names))]
        for p in pts:
            out.setdefault(point_id(p), p)
    if len(out) > MAX_POINTS:
        raise SweepError(f"{len(out)} points is too many (at most {MAX_POINTS})")
    return list(out.values())


def _nth(axes: dict, names: list[str], i: int) -> dict:
    p = {}
    for k in reversed(names):
        vals = axes[k]
        i, r = divmod(i, len(vals))
        p[k] = vals[r]
    return {k: p[k] for k in names}


def point_id(p: dict) -> str:
    """'preset=DPUCZDX8G_ISA1_B512;clock_mhz=300.0': the point's parameters in PARAMS order."""
    return ";".join(f"{k}={p[k]}" for k in PARAMS if k in p)


def build_target(p: dict) -> Target:
    """The point's Target: the preset (or the board's arch), with pp/cp/alu_pp/bank_depth/img_bg overrides, then
    the board's timing (clock, cores, DDR, host overhead) and the point's timing fields. In a sweep a board gives
    its timing to any array (a B2304 on a KV260 is a legal design); its own array is the default."""
    base = p.get("preset") or (get_board(p["board"]).arch if "board" in p else None)
    over = {k: p[k] for k in ("pp", "cp", "alu_pp", "bank_depth", "img_bg") if k in p}
    if base is not None:
        t = get_target(base)
        if over:                 # the preset's features kept; ALU_PP follows a new PP unless given
            kw = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)
                  if f.name not in ("pp", "cp", "name", "fingerprint", "timing")}
            if "pp" in over:
                kw.pop("alu_pp")
            kw.update(over)
            t = Target.parametric(kw.pop("pp", t.pp), kw.pop("cp", t.cp), **kw)
    else:
        if "pp" not in over or "cp" not in over:
            raise SweepError(f"point {point_id(p)}: give a preset, a board, or both pp and cp")
        t = Target.parametric(over.pop("pp"), over.pop("cp"), **over)
    tm = dict(get_board(p["board"]).timing()) if "board" in p else {}
    tm.update({k: p[k] for k in TIMING_PARAMS if k in p})
    return t.with_timing(**tm) if tm else t


def resources(t: Target) -> dict:
    """Estimated DSP48 / LUT / FF / BRAM36 of all the target's cores (hw/resources.py, PG338 low RAM, high DSP)."""
    from opendpu.hw.resources import estimate
    r = estimate(t)
    n = t.timing.cores
    return {"dsp": r["dsp"] * n, "lut": r["lut"] * n, "ff": r["ff"] * n, "bram36": r["bram36"] * n}


PRE_CONSTRAINT_NAMES = RESOURCE_METRICS + ("pp", "cp", "alu_pp", "bank_depth", "img_bg", "clock_mhz", "cores")


def pre_constraints(spec: SweepSpec) -> list[Constraint]:
    """The constraints decided by a point's parameters alone (resources, array, clock, cores): they drop points
    before any compile. The others (fps, latency_ms, ...) need the compiled program."""
    return [c for c in spec.constraints if c.name in PRE_CONSTRAINT_NAMES]


def _point_values(t: Target) -> dict:
    return {"pp": t.pp, "cp": t.cp, "alu_pp": t.alu_pp, "bank_depth": t.bank_depth, "img_bg": t.img_bg,
            "clock_mhz": t.timing.clock_mhz, "cores": t.timing.cores, **resources(t)}


def build_points(spec: SweepSpec) -> list[tuple[dict, Target | None, str]]:
    """Every point of the spec with its target (or None and why not), checked before any work: at least one point
    is a valid configuration, and the constraints on resources and array parameters keep at least one."""
    points = expand(spec)
    built: list[tuple[dict, Target | None, str]] = []
    for p in points:
        try:
            built.append((p, build_target(p), ""))
        except (OpenDpuError, ValueError) as e:
            built.append((p, None, f"configuration: {e}"))
    if all(t is None for _, t, _ in built):
        raise SweepError(f"no point of the space is a valid configuration ({len(points)} points); the first: "
                         f"{point_id(built[0][0])}: {built[0][2]}")
    pre = pre_constraints(spec)
    if pre:
        vals = [_point_values(t) for _, t, _ in built if t is not None]
        if not any(all(c.ok(v[c.name]) for c in pre) for v in vals):
            parts = []
            for c in pre:
                xs = [v[c.name] for v in vals]
                parts.append(f"{c} excludes {sum(not c.ok(x) for x in xs)} of {len(xs)} ({c.name} in the space: "
                             f"{min(xs):g}..{max(xs):g})")
            raise SweepError("the constraints exclude every point, before any compile: " + "; ".join(parts))
    return built


