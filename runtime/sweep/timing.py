"""The timing-only sweep (docs/sweeps.md "Modes"): one compiled program, timed for each point of its timing
parameters as it is (no recompilation), with `sim.sweep`; a table on stdout and, with --csv, a CSV file."""
from __future__ import annotations

import csv

import numpy as np

from opendpu.compiler.outdir import check_file
from opendpu.runtime.cli.common import (CliError, _load_graph, _select_dpu_subgraphs, _warm_kernels,
                                       _write_announced, input_file, timing_value)

TIMING_MODE = "timing-only mode (one compiled program, timing parameters)"
TO_ARCH = ("for an architecture sweep (compile per point), add an architecture parameter (--param preset=B512,... "
           "or board, pp, cp, alu_pp, bank_depth, img_bg) or --spec")
# (attribute, flag): the options only the architecture mode uses
ARCH_ONLY = (("output", "-o"), ("samples", "--samples"), ("seed", "--seed"), ("constraint", "--constraint"),
             ("calib", "--calib"), ("cache", "--cache"), ("executor", "--executor"), ("address", "--address"),
             ("workers", "--workers"), ("plot", "--plot"), ("heatmap", "--heatmap"), ("breakdown", "--breakdown"),
             ("verify_rtl", "--verify-rtl"))


def timing_mode_conflict(a) -> str | None:
    """The error for an architecture-mode option given to a timing-only sweep (it would be ignored), or None."""
    given = [flag for attr, flag in ARCH_ONLY if getattr(a, attr, None) is not None and getattr(a, attr) != []]
    if not given:
        return None
    what = ("writes no sweep directory; --csv FILE writes its rows" if given[0] == "-o" else "does not use it")
    return (f"{given[0]}: the sweep is in {TIMING_MODE}, which {what}; {TO_ARCH}"
            + (f" (also given: {', '.join(given[1:])})" if len(given) > 1 else ""))


def timing_axes(params: list[str]) -> dict[str, list]:
    """--param NAME=V1,V2,... (Timing fields, each once, distinct values) as {name: typed values}."""
    if not params:
        raise CliError("give at least one --param NAME=V1,V2,... (a timing parameter, e.g. ddr_latency=40,80)")
    axes: dict = {}
    for spec in params:
        if "=" not in spec:
            raise CliError(f"--param {spec!r}: expected NAME=V1,V2,... (e.g. ddr_latency=40,80)")
        k, vals = (x.strip() for x in spec.split("=", 1))
        if k in axes:
            raise CliError(f"--param {k} is given twice; list all its values in one --param {k}=V1,V2,...")
        parts = [v.strip() for v in vals.split(",")]
        if not vals or any(not v for v in parts):
            raise CliError(f"--param {spec!r}: empty value")
        axes[k] = [timing_value(k, v, "--param") for v in parts]
        if len(set(axes[k])) != len(axes[k]):
            raise CliError(f"--param {k}: a value is repeated ({vals})")
    return axes


def _program(a):
    """The model's DPU subgraphs and the target they are timed on (--target checks the model's)."""
    from opendpu.isa.target import get_target
    from opendpu.runtime.dpu import DpuSubgraph
    g = getattr(a, "sweep_graph", None) or _load_graph(a.model)
    dpus = [DpuSubgraph(g, sg) for sg in _select_dpu_subgraphs(g, a.model)]
    t = dpus[0].target
    if a.target:
        t = get_target(a.target)
        if any(d.fingerprint != t.fingerprint for d in dpus):
            raise CliError(f"--target {a.target}: {a.model} was compiled for {dpus[0].target.name} "
                           f"(VART_GRAPH_FINGERPRINT_ERROR)")
    if len({d.fingerprint for d in dpus}) > 1:
        raise CliError(f"{a.model}: DPU subgraphs were compiled for different targets; sweep one model per target")
    for d in dpus:
        d.validate(t)
    return dpus, t


def timing_sweep(a) -> int:
    """The timing-only sweep of `a.model` over its --param axes (Timing fields)."""
    from opendpu.runtime.progress import progress_bar
    from opendpu.sim.sweep import SWEEP_COLUMNS, sweep
    input_file(a.model, "model")
    axes = timing_axes(a.param)
    conflict = timing_mode_conflict(a)
    if conflict:
        raise CliError(conflict)
    npoints = int(np.prod([len(v) for v in axes.values()]))
    if npoints > 100000:
        raise CliError(f"--param: {npoints} points (the cartesian product) is too many; at most 100000")
    if a.csv:
        check_file(a.csv, suffixes=(".csv",), inputs=[a.model], what="--csv")
    dpus, t = _program(a)
    print(f"sweep: {TIMING_MODE}: {a.model}, {npoints} point(s) of {', '.join(axes)} (no recompilation)",
          flush=True)
    _warm_kernels()
    with progress_bar(f"sweep {npoints} points", enabled=npoints > 1) as prog:
        rows = sweep([d.arrays for d in dpus], t, axes, progress=prog)
    cols = list(axes) + [c for c in SWEEP_COLUMNS if c != "point"]
    print(" ".join(f"{c:>14s}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:14.4g}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in cols))
    if a.csv:
        def write(p):
            with open(p, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=cols)
                w.writeheader()
                w.writerows({c: r[c] for c in cols} for r in rows)
        _write_announced(a.csv, write, f"{len(rows)} rows as CSV")
    return 0
