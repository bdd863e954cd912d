"""The architecture sweep's command line (`opendpu sweep MODEL... --param pp=4,8 --param cp=8,16 -o DIR`, or
`--spec sweep.toml -o DIR`): compile every model for every point, time it and write DIR/sweep.csv, sweep.json,
sweep.parquet, pareto.csv, the summary and, with --plot, the figures. DIR keeps one result per point: running the
same command again skips finished points.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time

from opendpu.runtime.cli.common import CliError

from .cache import default_cache_dir, prepare_model
from .points import build_points, pre_constraints
from .driver import plan, run
from .spec import (PARAMS, ROW_COLUMNS, SweepError, SweepSpec, load_spec, parse_constraint, parse_model,
                   space_from_dict, validate_model)
from .store import Store

ARCH_MODE = "architecture mode (compile per point)"
TO_TIMING = ("--csv and --target are for the timing-only mode: one compiled .xmodel, --param over timing fields "
             "only, no --spec")


def _arch_mode_checks(a, mode: str) -> None:
    """Options the architecture mode would ignore, and combinations that do nothing: errors naming the mode."""
    for flag, v, why in (("--csv", a.csv, "writes its tables into the -o directory (sweep.csv, .json, .parquet)"),
                         ("--target", a.target, "compiles for each point's own array (--param preset=..., board, pp, "
                                                "cp, ...)")):
        if v:
            raise SweepError(f"{flag}: the sweep is in {mode}, which {why}; {TO_TIMING}")
    executor = a.executor or "local"
    if a.address and executor != "ray":
        raise SweepError("--address is the Ray cluster of --executor ray; add --executor ray, or leave --address out "
                         "for the local pool")
    if a.workers and executor == "ray":
        raise SweepError("--workers sizes the local pool; with --executor ray the cluster decides (leave --workers "
                         "out, or use --executor local)")
    if executor == "ray":
        import importlib.util
        if importlib.util.find_spec("ray") is None:
            raise SweepError("--executor ray needs the ray package (pip install ray==2.60.0)")
    for flag, v in (("--heatmap", a.heatmap), ("--breakdown", a.breakdown)):
        if v and not a.plot:
            raise SweepError(f"{flag} chooses a figure, and figures are drawn only with --plot DIR: add --plot DIR")
    if a.breakdown and not re.fullmatch(r"[0-9a-f]{16}", a.breakdown):
        raise SweepError(f"--breakdown {a.breakdown!r}: expected a point hash (16 hex digits, the hash column of "
                         f"sweep.csv)")


def _check_dirs(a, cache: str) -> None:
    """-o (a new directory, or a sweep's own), --cache and --plot (directories, existing or creatable), before any
    work; nothing is created here."""
    from opendpu.compiler.outdir import check_dir
    Store(a.output).check()                      # a file, or a directory of someone else's
    check_dir(a.output, force=True, what="sweep directory -o")        # creatable / writable (the probe)
    check_dir(cache, force=True, what="--cache")   # a shared cache: other files may sit beside opendpu's
    if a.plot:                  # within the sweep directory: the sweep's own; elsewhere: the output rule (marker)
        check_dir(a.plot, force=_within(a.plot, a.output), what="--plot")


def _within(path: str, root: str) -> bool:
    """path is root or below it (symlinks resolved)."""
    p, r = (os.path.realpath(os.path.abspath(x)) for x in (path, root))
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def _spec_from_args(a) -> SweepSpec:
    """The sweep of --spec FILE, with the command line's models, --param axes and --constraint added."""
    spec = load_spec(a.spec) if a.spec else SweepSpec([], [])
    onnx_args = [m for m in a.models or [] if str(m).strip().endswith(".onnx") and not str(m).startswith("zoo:")]
    if a.calib and not onnx_args:
        raise SweepError("--calib: no MODEL argument is an ONNX file (.onnx), the only kind that is quantized on "
                         "calibration data; leave --calib out (zoo models and .xmodel files take none)"
                         + (", or give calib = \"...\" in the spec's [[model]]" if a.spec else ""))
    for m in a.models or []:
        spec.models.append(parse_model(m, calib=a.calib if m in onnx_args else None))
    if a.param:
        axes: dict = {}
        for s in a.param:
            if "=" not in s:
                raise SweepError(f"--param {s!r}: expected NAME=V1,V2,... (e.g. pp=4,8 or preset=B512,B4096)")
            k, vals = (x.strip() for x in s.split("=", 1))
            if k not in PARAMS:
                raise SweepError(f"--param {k}: unknown parameter; known: {', '.join(PARAMS)}")
            if k in axes:
                raise SweepError(f"--param {k} is given twice; list all its values in one --param {k}=V1,V2,...")
            parts = [v.strip() for v in vals.split(",")]
            if not vals or any(not v for v in parts):
                raise SweepError(f"--param {s!r}: empty value (an empty space)")
            axes[k] = parts
        d: dict = dict(axes)
        if a.samples:
            d.update(mode="random", samples=a.samples)
        spec.spaces.append(space_from_dict(d, "--param"))
    elif a.samples:
        raise SweepError("--samples needs --param axes to sample from (a [[space]] of the spec samples with mode = "
                         "\"random\" and samples = N)")
    for c in a.constraint or []:
        spec.constraints.append(parse_constraint(c))
    if a.seed is not None:
        spec.seed = a.seed
    if not spec.models:
        raise SweepError("no model: give MODEL arguments (.onnx, .xmodel or zoo:NAME) or [[model]] tables in --spec")
    labels = [m.label for m in spec.models]
    if len(set(labels)) != len(labels):
        raise SweepError(f"two models have the same name ({', '.join(labels)}); set name = \"...\" in --spec")
    return spec


def _write_outputs(out: str, res, spec: SweepSpec, a) -> dict:
    from . import tables as tab
    from .report import make_report
    rows = res.rows
    files = {}
    extra = {"spec": spec.to_dict(), "computed": res.computed, "reused": res.reused, "excluded": res.excluded}
    for name, fn in (("sweep.csv", tab.write_csv), ("sweep.parquet", tab.write_parquet)):
        p = os.path.join(out, name)
        fn(rows, p, list(ROW_COLUMNS))
        files[name] = p
    p = os.path.join(out, "sweep.json")
    tab.write_json(rows, p, list(ROW_COLUMNS), extra=extra)
    files["sweep.json"] = p
    p = os.path.join(out, "pareto.csv")
    cols = ["front"] + list(ROW_COLUMNS)
    tab.write_csv([{"front": "fps_vs_dsp", **r} for r in tab.pareto_front(rows, "dsp", "fps")]
                  + [{"front": "fps_vs_bram36", **r} for r in tab.pareto_front(rows, "bram36", "fps")], p, cols)
    files["pareto.csv"] = p
    heat = tuple(x.strip() for x in a.heatmap.split(",")) if a.heatmap else None
    try:
        figs = make_report(out, rows, res.results, a.plot, heatmap=heat, breakdown_hash=a.breakdown)
    except ValueError as e:                  # e.g. a heatmap over parameters no ok row has
        raise CliError(f"report: {e}; the results are kept in {out}") from None
    files.update(figs)
    if a.plot and figs and not _within(a.plot, out):       # mark the figures as opendpu's (the output rule)
        from opendpu.compiler.outdir import record
        record(a.plot, [os.path.relpath(p, a.plot) for p in figs.values()])
    files.update({"summary.md": os.path.join(out, "summary.md"), "summary.html": os.path.join(out, "summary.html")})
    return files


def _check_report_args(a, points: list[dict]) -> None:
    """--heatmap names two swept parameters (checked before any work)."""
    if a.heatmap:
        pair = [x.strip() for x in a.heatmap.split(",")]
        swept = list(dict.fromkeys(k for p in points for k in p))
        if len(pair) != 2 or pair[0] == pair[1]:
            raise SweepError(f"--heatmap {a.heatmap!r}: expected two different swept parameters PX,PY (e.g. pp,cp)")
        bad = [x for x in pair if x not in swept]
        if bad:
            raise SweepError(f"--heatmap: {', '.join(bad)} is not a swept parameter; swept: {', '.join(swept)}")


def _check_breakdown(a, tasks) -> None:
    """--breakdown names a point of this sweep (its hash needs the models' content hashes)."""
    if a.breakdown and a.breakdown not in {t.hash for t in tasks}:
        raise SweepError(f"--breakdown {a.breakdown!r}: no point of this sweep has that hash (see the hash column "
                         f"of sweep.csv)")


def _print_table(rows: list[dict]) -> None:
    ok = [r for r in rows if r["status"] == "ok"]
    shown = sorted(ok, key=lambda r: (r["model"], -(r["fps"] or 0)))[:20]
    if not shown:
        return
    print(f"{'model':16s} {'fps':>9s} {'cycles':>11s} {'MAC util':>8s} {'DSP':>6s} {'BRAM36':>7s} {'bound':>6s}  point")
    for r in shown:
        print(f"{r['model'][:16]:16s} {r['fps']:9.1f} {r['cycles']:11d} {r['mac_util']:8.3f} {r['dsp']:6d} "
              f"{r['bram36']:7g} {str(r['bottleneck']):>6s}  {r['point']}")
    if len(ok) > len(shown):
        print(f"... {len(ok) - len(shown)} more ok points in sweep.csv")


def cmd_arch_sweep(a, why: str = "") -> int:
    """The architecture sweep: validate everything, plan, run (resumable), write the tables, figures and summary,
    spot-check the RTL. `why`: what chose the architecture mode (named in errors and in the first line)."""
    mode = f"{ARCH_MODE[:-1]}; {why})" if why else ARCH_MODE
    spec, cache, built = _arch_setup(a, mode)
    print(f"sweep: {mode}: {len(spec.models)} model(s) x {len(built)} point(s); results in {a.output}, compile cache "
          f"{cache}", flush=True)
    pre = pre_constraints(spec)
    post = [c for c in spec.constraints if c not in pre]
    if post:
        print(f"sweep: constraint(s) on results ({', '.join(map(str, post))}) are checked on each computed point; "
              f"rows that miss them stay in the tables, off the Pareto fronts", flush=True)
    store = Store(a.output)
    try:
        os.makedirs(cache, exist_ok=True)
        models = [prepare_model(m, cache, seed=spec.seed, log=lambda s: print(s, flush=True)) for m in spec.models]
        tasks, _ = plan(spec, models, cache, built)
        _check_breakdown(a, tasks)
        store.open(json.dumps(spec.to_dict(), indent=1, default=str))
    except SweepError as e:
        raise CliError(str(e)) from None
    res = _run(a, spec, models, store, cache, len(tasks))
    if res is None:
        return 130
    if post and any(r["status"] == "ok" for r in res.rows) \
            and not any(r["status"] == "ok" and r["meets_constraints"] for r in res.rows):
        span = "; ".join(_span(c.name, [r[c.name] for r in res.rows if r["status"] == "ok"]) for c in post)
        print(f"sweep: no ok point meets the constraint(s) {', '.join(map(str, post))} ({span}): every row stays in "
              f"the tables, and pareto.csv is empty")
    files = _write_outputs(a.output, res, spec, a)
    _print_table(res.rows)
    for name, p in files.items():
        print(f"wrote {p}")
    status = _failed_models(spec, res.rows, a.output)
    if a.verify_rtl:
        from .rtl import verify_rtl
        status = max(status, verify_rtl(spec, res.rows, a.verify_rtl, cache))
    return status


def _arch_setup(a, mode: str) -> tuple[SweepSpec, str, list]:
    """Everything checked before any work: the options, the spec, -o / --cache / --plot, the model files, the
    points (configurations and constraints on parameters) and the report options. (spec, cache dir, points)."""
    try:
        _arch_mode_checks(a, mode)
        spec = _spec_from_args(a)
        if not a.output:
            raise SweepError(f"the sweep is in {mode}, which keeps its results in a directory: give -o DIR (run the "
                             f"same command again to resume it)")
        cache = a.cache or default_cache_dir()
        _check_dirs(a, cache)
        for m in spec.models:
            validate_model(m)
        try:
            built = build_points(spec)      # configurations and constraints on parameters, before any work
        except SweepError as e:
            if "give a preset, a board, or both pp and cp" not in str(e):
                raise
            raise SweepError(f"{e}: the sweep is in {mode}, which compiles for each point's array") from None
        _check_report_args(a, [p for p, _, _ in built])
    except SweepError as e:
        raise CliError(str(e)) from None
    return spec, cache, built


def _run(a, spec: SweepSpec, models: list, store: Store, cache: str, total: int):
    """Run the sweep with a progress bar and say what it did; None when interrupted (the finished points kept)."""
    from opendpu.runtime.progress import progress_bar
    from opendpu.sim import warm_kernels
    warm_kernels()                      # once in this process: forked workers inherit the compiled kernels
    t0 = time.perf_counter()
    try:
        with progress_bar(f"sweep {total} points", enabled=total > 0) as prog:
            res = run(spec, models, store, cache, executor=a.executor or "local", workers=a.workers,
                      address=a.address, progress=prog)
    except KeyboardInterrupt:
        n = len(os.listdir(store.points))
        print(f"opendpu sweep: interrupted; {n} point result(s) are kept in {a.output}: run the same command again "
              f"to finish the sweep", file=sys.stderr)
        return None
    except SweepError as e:
        raise CliError(str(e)) from None
    dt = time.perf_counter() - t0
    ok = sum(r["status"] == "ok" for r in res.rows)
    failed = sum(r["status"] == "failed" for r in res.rows)
    print(f"sweep: {len(res.rows)} rows: {ok} ok, {failed} failed, {res.excluded} excluded by constraints; "
          f"{res.computed} computed, {res.reused} taken from {a.output} ({dt:.1f} s)")
    return res


def _failed_models(spec: SweepSpec, rows: list[dict], out: str) -> int:
    """2 (each said on stderr) when a model failed on every point it ran, else 0."""
    status = 0
    for m in spec.models:
        mine = [r for r in rows if r["model"] == m.label and r["status"] != "excluded"]
        if mine and not any(r["status"] == "ok" for r in mine):
            reasons = sorted({r["reason"] for r in mine})
            print(f"opendpu sweep: error: model {m.label} failed on every point ({len(mine)}); first reason: "
                  f"{reasons[0]}" + (f" (and {len(reasons) - 1} other reasons)" if len(reasons) > 1 else "")
                  + f"; the results are kept in {out}", file=sys.stderr)
            status = 2
    return status


def _span(name: str, vals: list) -> str:
    xs = [v for v in vals if isinstance(v, (int, float))]
    if not xs:
        return f"no {name} computed"
    return f"{name} of the ok points: " + (f"{xs[0]:g}" if min(xs) == max(xs) else f"{min(xs):g}..{max(xs):g}")


