"""The `sweep` verb: its parser (`register`) and the choice of mode (docs/sweeps.md "Modes"): the timing-only
sweep of one compiled program (timing.py) or the architecture sweep, compile per point (arch.py). This module stays
light (the parser is built for every verb); the modes are imported when the verb runs.
"""
from __future__ import annotations

from opendpu.runtime.cli.common import SEED, SEED_MAX, _load_graph, add_verb, int_range


def register(sub) -> None:
    """Add the `sweep` verb to the top parser's subparsers."""
    sw = add_verb(sub, "sweep", "sweep DPU configurations (compile and time models per point: fps, resources, "
                                "Pareto) or the timing parameters of one compiled program")
    sw.add_argument("models", nargs="*", metavar="MODEL",
                    help="models: .onnx, quantized or compiled .xmodel (recompiled per point), zoo:NAME[@SIZE]; one "
                         "compiled .xmodel with timing --param only (no --spec) is the timing-only mode")
    sw.add_argument("--param", action="append", metavar="NAME=V1,V2,...",
                    help="a parameter and its values (preset, board, pp, cp, alu_pp, bank_depth, img_bg or a timing "
                         "field); several --param give the cartesian product")
    sw.add_argument("--spec", metavar="SWEEP.toml", help="a sweep file: [[model]], [[space]], constraints, seed "
                                                          "(docs/sweeps.md); the same file gives the same points")
    sw.add_argument("--samples", type=int_range(1, 10**6), metavar="N",
                    help="N random points of the --param grid (at most the grid's size; default: the whole grid)")
    sw.add_argument("--seed", type=SEED, metavar="S",
                    help=f"seed of random points, of the random calibration samples and of --verify-rtl inputs "
                         f"(0..{SEED_MAX}; default 0, or the spec's seed)")
    sw.add_argument("--constraint", action="append", metavar="EXPR",
                    help="e.g. 'dsp <= 1248' (a KV260) or 'bram36 <= 144'; constraints on resources and array "
                         "parameters drop points before compiling (an error when they drop every point), others "
                         "(fps, latency_ms, ...) keep them off the Pareto front (a line says when no point meets them)")
    sw.add_argument("--calib", metavar="DATA", help="calibration data for the .onnx MODEL arguments (.npy/.npz/"
                                                    "folder; default: random N(0,1) samples, cycles do not depend "
                                                    "on values)")
    sw.add_argument("-o", "--output", metavar="DIR", help="sweep directory: per-point results (resumable), "
                                                          "sweep.csv/.json/.parquet, pareto.csv, summary.md/.html")
    sw.add_argument("--cache", metavar="DIR", help="compile cache directory, created if missing (default "
                                                    "~/.cache/opendpu/sweep)")
    sw.add_argument("--executor", choices=("local", "ray"),
                    help="local process pool (default local) or a Ray cluster (--address)")
    sw.add_argument("--address", metavar="HOST:PORT", help="with --executor ray: the Ray cluster's address "
                                                           "(default: start a local one)")
    sw.add_argument("--workers", type=int_range(1, 256), metavar="N", help="local worker processes (default: CPUs; "
                                                                          "not with --executor ray)")
    sw.add_argument("--plot", metavar="DIR", help="write the figures (Pareto, heatmap, bottleneck breakdown) into "
                                                  "this directory (inside -o, or a new/empty one or opendpu's)")
    sw.add_argument("--heatmap", metavar="PX,PY", help="with --plot: the two swept parameters of the heatmap")
    sw.add_argument("--breakdown", metavar="HASH", help="with --plot: the point (hash) of the per-layer bottleneck "
                                                        "figure")
    sw.add_argument("--verify-rtl", type=int_range(0, 100), metavar="K",
                    help="co-simulate K points of the first model's Pareto front on the RTL (default: none)")
    sw.add_argument("--target", help="timing-only mode: preset, fingerprint or arch.json (must match the model)")
    sw.add_argument("--csv", metavar="S.csv", help="timing-only mode: write the rows as CSV")
    sw.set_defaults(fn=cmd_sweep)


def _arch_sweep_wanted(a) -> str | None:
    """The sweep's mode (docs/sweeps.md "Modes"): None for the timing-only sweep of one compiled program (one
    compiled .xmodel, every --param a timing field, no --spec), else why it is an architecture sweep (compile per
    point). Options decide nothing: one that the chosen mode does not use is an error (`_arch_mode_checks`,
    `timing.timing_mode_conflict`)."""
    from .spec import ARCH_PARAMS
    if a.spec:
        return "--spec is given"
    if len(a.models) != 1:
        return f"{len(a.models)} models" if a.models else "no MODEL argument"
    m = a.models[0]
    if m.startswith("zoo:"):
        return f"{m} is a zoo model"
    if not m.endswith(".xmodel"):
        return f"{m} is not a compiled .xmodel"
    arch = [k for k in (s.split("=", 1)[0].strip() for s in a.param or []) if k in ARCH_PARAMS]
    if arch:
        return f"--param {arch[0]} is an architecture parameter"
    from opendpu.compiler.frontend import detect_form
    a.model = m                          # errors name the file
    a.sweep_graph = _load_graph(m)      # a missing or damaged file is reported as such, in either mode
    form = detect_form(a.sweep_graph, m)
    return None if form == "compiled" else f"{m} is a quantized xmodel, not a compiled one"


def cmd_sweep(a) -> int:
    why = _arch_sweep_wanted(a)
    if why:
        from .arch import cmd_arch_sweep
        return cmd_arch_sweep(a, why)
    from .timing import timing_sweep
    a.model = a.models[0]
    return timing_sweep(a)


