"""Architecture-sweep report (`opendpu sweep`): Pareto fronts, tables (CSV / JSON / Parquet), figures and a summary.

The sweep engine (runtime/archsweep.py) gives one flat row per (DPU configuration x model) point, with the columns of
ROW_COLUMNS; this module only reads those rows (and each point's full result with its `layers`) and writes files.
It needs numpy, matplotlib (Agg canvas, no pyplot state, as runtime/plots.py) and pyarrow; nothing of sim, hw or
compiler. Artists and axes carry gids / labels (front:<model>, layer-bar:<i>, axes "layers", "engines") for tests.
"""
from __future__ import annotations

import csv
import html
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from opendpu.runtime.archsweep import ROW_COLUMNS  # noqa: F401 - re-exported: the one definition of the columns
from opendpu.runtime.plots import ENGINE_COLORS, short_layer_names

# Parquet type of every row column, so that a column that is None in every row still gets a stable type.
# bram36 is a float: BRAM18 halves make it a multiple of 0.5.
COLUMN_TYPES: dict[str, str] = {
    **{c: "string" for c in ("model", "point", "hash", "status", "reason", "target", "preset", "board", "params",
                             "bottleneck")},
    **{c: "int64" for c in ("pp", "cp", "alu_pp", "bank_depth", "img_bg", "cores", "cycles", "ops",
                            "ddr_read_bytes", "ddr_write_bytes", "onchip_bytes", "layers_conv", "layers_misc",
                            "layers_load", "layers_save", "dsp", "lut", "ff", "instructions", "dpu_subgraphs",
                            "cpu_ops")},
    **{c: "float64" for c in ("clock_mhz", "latency_ms", "fps", "gops", "mac_util", "ddr_mbps", "onchip_pct",
                              "bram36", "compile_s", "eval_s")},
    **{c: "bool" for c in ("ddr_bound", "compile_cached", "meets_constraints")},
}

ENGINE_ORDER = ("LOAD", "SAVE", "CONV", "MISC")
NO_BOUND_COLOR = "#888888"
EXCLUDED_COLOR = "#9a9a9a"
DPI = 110
FIGURE_FORMATS = ("png", "svg", "pdf")
PARETO_COLUMNS = ("point", "target", "fps", "dsp", "bram36", "latency_ms", "mac_util")
FAILED_POINTS_SHOWN = 5

# axis labels, with units
LABELS: dict[str, str] = {
    "fps": "throughput (fps)", "dsp": "DSP48 slices", "bram36": "BRAM36 blocks", "lut": "LUTs", "ff": "flip-flops",
    "latency_ms": "latency (ms)", "gops": "achieved GOP/s", "mac_util": "MAC utilisation (0..1)",
    "clock_mhz": "clock (MHz)", "cycles": "cycles per frame", "ddr_mbps": "DDR bandwidth (MB/s)",
    "onchip_pct": "on-chip memory used (%)", "onchip_bytes": "on-chip memory (bytes)", "pp": "PP (pixel parallelism)",
    "cp": "CP (channel parallelism)", "alu_pp": "ALU PP", "bank_depth": "bank depth (lines)",
    "img_bg": "image bank groups", "cores": "DPU cores",
}
# number formats in the summary tables
FORMATS: dict[str, str] = {"fps": ".2f", "latency_ms": ".3f", "mac_util": ".3f", "gops": ".2f", "bram36": "g",
                           "clock_mhz": "g"}


# ---------------------------------------------------------------------------------------------------------- helpers

def _num(v: Any) -> float | None:
    """A finite float of v, or None (None, NaN, inf, non-numbers, bools)."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _ok(r: dict) -> bool:
    return r.get("status") == "ok"


def _feasible(r: dict) -> bool:
    """An ok row that meets the constraints (a missing / None meets_constraints means no constraints)."""
    return _ok(r) and r.get("meets_constraints") is not False


def _models(rows: Iterable[dict]) -> list[str]:
    """Model labels in order of first appearance."""
    return list(dict.fromkeys(str(r.get("model", "")) for r in rows))


def _params(r: dict) -> dict:
    """The swept parameters of a row (its `params` JSON string, or a dict); {} when absent or unreadable."""
    p = r.get("params")
    if isinstance(p, dict):
        return p
    if isinstance(p, str) and p:
        try:
            d = json.loads(p)
        except ValueError:
            return {}
        return d if isinstance(d, dict) else {}
    return {}


def swept_parameters(rows: Iterable[dict]) -> list[str]:
    """Names of the swept parameters (keys of the rows' `params`), in order of first appearance."""
    out: dict[str, None] = {}
    for r in rows:
        out.update(dict.fromkeys(_params(r)))
    return list(out)


def _param_value(r: dict, name: str) -> Any:
    p = _params(r)
    return p[name] if name in p else r.get(name)


def _sorted_values(vals: Iterable[Any]) -> list[Any]:
    """Distinct values, numerically sorted when all are numbers, else in natural order (B512 before B1024)."""
    distinct = list(dict.fromkeys(vals))
    if all(_num(v) is not None for v in distinct):
        return sorted(distinct, key=float)
    return sorted(distinct, key=lambda v: [(0, int(x), "") if x.isdigit() else (1, 0, x)
                                           for x in re.split(r"(\d+)", str(v))])


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _fmt(col: str, v: Any) -> str:
    """A table cell: '–' for None, yes/no for bools, FORMATS per column for floats."""
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return format(v, FORMATS.get(col, ".4g"))
    return str(v)


def _label(name: str) -> str:
    return LABELS.get(name, name)


def _new_figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=DPI, constrained_layout=True)
    FigureCanvasAgg(fig)
    return fig


def _model_colors(models: Sequence[str]) -> dict[str, Any]:
    cmap = matplotlib.colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(models)}


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_") or "model"


# ---------------------------------------------------------------------------------------------------- Pareto front

def pareto_front(rows: Sequence[dict], x: str = "dsp", y: str = "fps", minimize_x: bool = True,
                 maximize_y: bool = True) -> list[dict]:
    """Pareto-optimal rows per model: the ok rows that meet the constraints, with finite x and y, that no other such
    row of the same model matches in both objectives and beats in one. Rows with identical (x, y) are one design:
    only the first by `point` (string order, then input order) stays on the front. Returns the fronts of all
    models (models in order of first appearance), each sorted by x ascending."""
    out: list[dict] = []
    for model in _models(rows):
        cand = []
        for i, r in enumerate(rows):
            if str(r.get("model", "")) != model or not _feasible(r):
                continue
            xv, yv = _num(r.get(x)), _num(r.get(y))
            if xv is None or yv is None:
                continue
            cx = xv if minimize_x else -xv              # costs: lower is better in both
            cy = -yv if maximize_y else yv
            cand.append((cx, cy, str(r.get("point", "")), i, xv, yv, r))
        cand.sort(key=lambda c: c[:4])
        best_cy = math.inf
        front = []
        for cx, cy, _, i, xv, yv, r in cand:
            # every earlier candidate has a lower cx, or the same cx and a cy no higher: r is dominated (or an
            # identical later duplicate) iff one of them has cy <= r's
            if cy < best_cy:
                front.append((xv, yv, r))
                best_cy = cy
        front.sort(key=lambda f: (f[0], f[1]))
        out.extend(r for _, _, r in front)
    return out


# ------------------------------------------------------------------------------------------------------ table files

def _cell_json(v: Any) -> Any:
    """v with NaN / inf (which JSON lacks) as None and numpy scalars as Python ones, through dicts and lists."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, np.generic):
        return _cell_json(v.item())
    if isinstance(v, dict):
        return {k: _cell_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_cell_json(x) for x in v]
    return v


def write_csv(rows: Sequence[dict], path: str, columns: Sequence[str]) -> None:
    """CSV with a header of `columns`; a missing or None cell is empty, dicts / lists are written as JSON."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            cells = []
            for c in columns:
                v = r.get(c)
                cells.append("" if v is None else json.dumps(v) if isinstance(v, (dict, list)) else v)
            w.writerow(cells)


def write_json(rows: Sequence[dict], path: str, columns: Sequence[str], extra: dict | None = None) -> None:
    """A JSON object {"columns": [...], "rows": [{column: value}], **extra}; missing cells and NaN / inf are null."""
    doc: dict[str, Any] = {"columns": list(columns),
                           "rows": [{c: _cell_json(r.get(c)) for c in columns} for r in rows]}
    doc.update(_cell_json(extra or {}))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")


def _infer_type(values: Sequence[Any]) -> str:
    """Parquet type of a column that COLUMN_TYPES does not know, from its non-None values (string if mixed / none)."""
    vals = [v for v in values if v is not None]
    if vals and all(isinstance(v, (bool, np.bool_)) for v in vals):
        return "bool"
    if vals and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
        return "int64"
    if vals and all(_num(v) is not None or isinstance(v, (float, np.floating)) for v in vals):
        return "float64"
    return "string"


def _coerce(v: Any, kind: str, col: str) -> Any:
    """v as a Python value of the Parquet type kind (None stays None); ValueError when it does not fit."""
    if v is None:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if kind == "string":
        return v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list)) else str(v)
    if kind == "bool":
        if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return bool(v)
    elif kind == "int64":
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            if not math.isfinite(v):
                return None
            if v.is_integer():
                return int(v)
    elif kind == "float64":
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    raise ValueError(f"column {col!r}: {v!r} is not a {kind} value")


def write_parquet(rows: Sequence[dict], path: str, columns: Sequence[str]) -> None:
    """Parquet with an explicit schema: the COLUMN_TYPES type of each column (inferred for unknown columns), so that
    an all-None column keeps its type; missing cells are null."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pa_types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    fields, arrays = [], []
    for c in columns:
        raw = [r.get(c) for r in rows]
        kind = COLUMN_TYPES.get(c) or _infer_type(raw)
        fields.append(pa.field(c, pa_types[kind], nullable=True))
        arrays.append(pa.array([_coerce(v, kind, c) for v in raw], type=pa_types[kind]))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    pq.write_table(table, path)


# ---------------------------------------------------------------------------------------------------------- figures

def save(fig: Figure, path: str) -> str:
    """Write fig to path as png, svg or pdf (by the suffix); returns path."""
    fmt = os.path.splitext(path)[1].lstrip(".").lower()
    if fmt not in FIGURE_FORMATS:
        raise ValueError(f"cannot save a figure as {path!r}: the suffix must be one of "
                         f"{', '.join('.' + f for f in FIGURE_FORMATS)}")
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, format=fmt, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    return path


def pareto_figure(rows: Sequence[dict], x: str, y: str, title: str = "", minimize_x: bool = True,
                  maximize_y: bool = True) -> Figure:
    """Scatter of y against x of every ok row (a colour per model), failed / constraint-violating rows that have both
    values as grey crosses, and each model's Pareto front as a step line through its highlighted points."""
    fig = _new_figure(8.0, 5.5)
    ax = fig.add_subplot(1, 1, 1)
    models = _models(rows)
    colors = _model_colors(models)
    xs_all: list[float] = []
    excl = [(_num(r.get(x)), _num(r.get(y))) for r in rows if not _feasible(r)]
    excl = [(a, b) for a, b in excl if a is not None and b is not None]
    if excl:
        ax.scatter([a for a, _ in excl], [b for _, b in excl], marker="x", s=28, color=EXCLUDED_COLOR, zorder=2,
                   label="failed / violates constraints", gid="excluded")
        xs_all += [a for a, _ in excl]
    front = pareto_front(rows, x, y, minimize_x, maximize_y)
    for m in models:
        pts = [(_num(r.get(x)), _num(r.get(y))) for r in rows if str(r.get("model", "")) == m and _feasible(r)]
        pts = [(a, b) for a, b in pts if a is not None and b is not None]
        if not pts:
            continue
        xs_all += [a for a, _ in pts]
        ax.scatter([a for a, _ in pts], [b for _, b in pts], s=22, color=colors[m], alpha=0.55, zorder=3,
                   label=m, gid=f"points:{m}")
        fr = [r for r in front if str(r.get("model", "")) == m]
        fx = [float(r[x]) for r in fr]
        fy = [float(r[y]) for r in fr]
        where = "post" if minimize_x == maximize_y else "pre"
        ax.step(fx, fy, where=where, color=colors[m], lw=1.6, zorder=4, gid=f"front:{m}")
        ax.scatter(fx, fy, s=60, color=colors[m], edgecolors="black", linewidths=0.9, zorder=5,
                   gid=f"front-points:{m}")
        if len(fr) <= 12:
            for r, a, b in zip(fr, fx, fy):
                ax.annotate(str(r.get("point", "")), (a, b), textcoords="offset points", xytext=(4, 4), fontsize=6.5,
                            color="#333333")
    pos = [v for v in xs_all if v > 0]
    if pos and len(pos) == len(xs_all) and max(pos) / min(pos) > 10:
        ax.set_xscale("log")
    if not xs_all:
        ax.text(0.5, 0.5, "no point with both values", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(_label(x) + (" (lower is better)" if minimize_x else " (higher is better)"))
    ax.set_ylabel(_label(y) + (" (higher is better)" if maximize_y else " (lower is better)"))
    ax.set_title(title or f"{y} vs {x}: Pareto front per model", fontsize=10)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    if xs_all:
        ax.legend(fontsize=8, loc="best")
    return fig


def heatmap_figure(rows: Sequence[dict], px: str, py: str, metric: str = "fps", model: str | None = None,
                   reduce: str = "max") -> Figure:
    """A grid over two swept parameters (px across, py up) of one model (default: the first): each cell the best
    metric (max, or min with reduce="min") of the model's ok rows that meet the constraints, annotated; cells
    without such a row are blank. Parameter values come from `params`, else the row column of that name."""
    if reduce not in ("max", "min"):
        raise ValueError(f"reduce must be 'max' or 'min', not {reduce!r}")
    if px == py:
        raise ValueError(f"the heatmap needs two different parameters, got {px!r} twice")
    models = _models(rows)
    if model is None:
        model = models[0] if models else ""
    elif model not in models:
        raise ValueError(f"model {model!r} is not in the sweep (models: {', '.join(models) or 'none'})")
    mrows = [r for r in rows if str(r.get("model", "")) == model]
    swept = swept_parameters(rows)
    axes_vals = {}
    for p in (px, py):
        vals = [_param_value(r, p) for r in mrows]
        vals = [v for v in vals if v is not None]
        if not vals:
            known = ", ".join(swept) or "none"
            why = "is not a swept parameter" if p not in swept else "takes no value"
            raise ValueError(f"heatmap parameter {p!r} {why} for model {model!r} (swept parameters: {known})")
        axes_vals[p] = _sorted_values(vals)
    xv, yv = axes_vals[px], axes_vals[py]
    grid = np.full((len(yv), len(xv)), np.nan)
    better = max if reduce == "max" else min
    xi = {v: i for i, v in enumerate(xv)}
    yi = {v: i for i, v in enumerate(yv)}
    for r in mrows:
        a, b, m = _param_value(r, px), _param_value(r, py), _num(r.get(metric))
        if a is None or b is None or m is None or not _feasible(r):
            continue
        j, i = yi[b], xi[a]
        grid[j, i] = m if math.isnan(grid[j, i]) else better(grid[j, i], m)
    fig = _new_figure(max(5.0, 1.1 * len(xv) + 2.5), max(3.5, 0.6 * len(yv) + 2.0))
    ax = fig.add_subplot(1, 1, 1)
    data = np.ma.masked_invalid(grid)
    cmap = matplotlib.colormaps["viridis" if reduce == "max" else "viridis_r"].with_extremes(bad="white")
    im = ax.imshow(data, cmap=cmap, origin="lower", aspect="auto", interpolation="nearest")
    fig.colorbar(im, ax=ax, label=_label(metric))
    finite = grid[np.isfinite(grid)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for j in range(len(yv)):
        for i in range(len(xv)):
            v = grid[j, i]
            if np.isfinite(v):
                dark = (v < mid) if reduce == "max" else (v > mid)
                ax.text(i, j, f"{v:.4g}", ha="center", va="center", fontsize=8,
                        color="white" if dark else "black", gid=f"cell:{j},{i}")
    ax.set_xticks(np.arange(len(xv)), [_fmt_value(v) for v in xv])
    ax.set_yticks(np.arange(len(yv)), [_fmt_value(v) for v in yv])
    ax.set_xlabel(_label(px))
    ax.set_ylabel(_label(py))
    ax.set_title(f"{model}: {reduce} {metric} per ({px}, {py})", fontsize=10)
    return fig


def bottleneck_figure(result: dict) -> Figure:
    """One point's per-layer time: a horizontal bar per layer (execution order) as long as its cycles, coloured by
    its bounding engine; beside it, the total cycles per bounding engine."""
    layers = list(result.get("layers") or [])
    n = len(layers)
    height = min(300.0, max(3.5, 0.17 * n + 1.8))
    fig = _new_figure(13.0, height)
    gs = fig.add_gridspec(1, 2, width_ratios=[3.2, 1.0])
    ax = fig.add_subplot(gs[0, 0], label="layers")
    ax2 = fig.add_subplot(gs[0, 1], label="engines")
    cyc = np.array([float(ly.get("cycles") or 0) for ly in layers], np.float64)
    bound = [ly.get("bound") or None for ly in layers]
    colors = [ENGINE_COLORS.get(b, NO_BOUND_COLOR) if b else NO_BOUND_COLOR for b in bound]
    if n:
        cont = ax.barh(np.arange(n), cyc, height=0.78, color=colors, linewidth=0)
        for i, p in enumerate(cont.patches):
            p.set_gid(f"layer-bar:{i}")
        short = short_layer_names([str(ly.get("name", "")) for ly in layers])
        multi = len({ly.get("subgraph") for ly in layers}) > 1
        ticks = [f"{i}  {ly.get('subgraph')}: {s}" if multi else f"{i}  {s}"
                 for i, (ly, s) in enumerate(zip(layers, short))]
        ax.set_yticks(np.arange(n), ticks, fontsize=7 if n <= 60 else 6)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_xlim(0, max(cyc.max(), 1.0) * 1.05)
    else:
        ax.text(0.5, 0.5, "no layers", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("cycles per frame")
    ax.grid(axis="x", lw=0.4, alpha=0.5)
    ax.set_axisbelow(True)
    present = [e for e in ENGINE_ORDER if e in bound] + [b for b in dict.fromkeys(bound)
                                                         if b and b not in ENGINE_ORDER]
    names = present + (["none"] if None in bound else [])
    handles = [Patch(facecolor=ENGINE_COLORS.get(e, NO_BOUND_COLOR) if e != "none" else NO_BOUND_COLOR,
                     label=f"{e}: {sum(1 for b in bound if (b or 'none') == e)} layer(s)") for e in names]
    if handles:
        ax.legend(handles=handles, title="bounding engine", fontsize=8, title_fontsize=8.5, loc="lower right")
    totals = [float(sum(c for c, b in zip(cyc, bound) if (b or "none") == e)) for e in names]
    if names:
        cont2 = ax2.barh(np.arange(len(names)), totals, height=0.6,
                         color=[h.get_facecolor() for h in handles], linewidth=0)
        for e, p in zip(names, cont2.patches):
            p.set_gid(f"engine-bar:{e}")
        tot = max(sum(totals), 1.0)
        for k, v in enumerate(totals):
            ax2.text(v, k, f" {100 * v / tot:.1f}%", va="center", ha="left", fontsize=8)
        ax2.set_yticks(np.arange(len(names)), names, fontsize=8)
        ax2.set_ylim(len(names) - 0.5, -0.5)
        ax2.set_xlim(0, max(max(totals), 1.0) * 1.3)
    ax2.set_xlabel("total cycles")
    ax2.set_title("per bounding engine", fontsize=9)
    what = f"{result.get('model', '?')}  [{result.get('point', '')}]  on {result.get('target', '?')}"
    fig.suptitle(f"{what}: cycles per layer by bounding engine ({int(cyc.sum())} cycles)", fontsize=10)
    return fig


# ---------------------------------------------------------------------------------------------------------- summary

def _counts(rows: Sequence[dict]) -> dict[str, int]:
    return {"points": len(rows), "ok": sum(1 for r in rows if _ok(r)),
            "failed": sum(1 for r in rows if not _ok(r)),
            "excluded by constraints": sum(1 for r in rows if _ok(r) and not _feasible(r))}


def _best_fps(rows: Sequence[dict]) -> list[dict]:
    """Per model, its ok row with the highest fps (preferring rows that meet the constraints; ties: the first by
    `point`, as in pareto_front)."""
    out = []
    for m in _models(rows):
        mine = [r for r in rows if str(r.get("model", "")) == m and _ok(r) and _num(r.get("fps")) is not None]
        pool = [r for r in mine if _feasible(r)] or mine
        if pool:
            out.append(min(pool, key=lambda r: (-float(r["fps"]), str(r.get("point", "")))))
    return out


def _failures(rows: Sequence[dict]) -> list[tuple[str, list[dict]]]:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if not _ok(r):
            groups.setdefault(str(r.get("reason") or "(no reason given)"), []).append(r)
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(rows: Sequence[dict], cols: Sequence[str]) -> list[str]:
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    out += ["| " + " | ".join(_md_cell(_fmt(c, r.get(c))) for c in cols) + " |" for r in rows]
    return out


def _html_table(rows: Sequence[dict], cols: Sequence[str]) -> list[str]:
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{html.escape(_fmt(c, r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows]
    out.append("</table>")
    return out


def _pareto_sections(rows: Sequence[dict]) -> list[tuple[str, str, list[dict]]]:
    """(heading, model, front rows) for fps vs DSP and fps vs BRAM36, per model."""
    out = []
    for x, name in (("dsp", "DSP48"), ("bram36", "BRAM36")):
        front = pareto_front(rows, x=x, y="fps")
        for m in _models(rows):
            out.append((f"fps vs {name}", m, [r for r in front if str(r.get("model", "")) == m]))
    return out


def write_summary(outdir: str, rows: Sequence[dict], figures: dict[str, str], title: str = "opendpu sweep",
                  spec_text: str | None = None) -> tuple[str, str]:
    """Write summary.md and summary.html in outdir: counts, best-fps point per model, Pareto tables (fps vs DSP and
    vs BRAM36), failures by reason and the figures (relative links). Returns (markdown path, HTML path)."""
    os.makedirs(outdir, exist_ok=True)
    counts = _counts(rows)
    best = _best_fps(rows)
    fails = _failures(rows)
    pareto = _pareto_sections(rows)
    rel = {name: os.path.relpath(p, outdir).replace(os.sep, "/") for name, p in figures.items()}
    best_cols = ("model", "point", "target", "fps", "dsp", "bram36", "latency_ms", "mac_util")

    md = [f"# {title}", "", "## Points", ""]
    md += [f"- {k}: {v}" for k, v in counts.items()]
    md += ["", "## Best fps per model", ""]
    md += _md_table(best, best_cols) if best else ["No point ran successfully."]
    md += ["", "## Pareto fronts", ""]
    for heading, m, fr in pareto:
        md += [f"### {heading}: {_md_cell(m)}", ""]
        md += _md_table(fr, PARETO_COLUMNS) if fr else ["No point on the front."]
        md.append("")
    md += ["## Failures", ""]
    if not fails:
        md.append("None.")
    for reason, rs in fails:
        pts = ", ".join(f"{r.get('model', '')}:{r.get('point', '')}" for r in rs[:FAILED_POINTS_SHOWN])
        more = f" (and {len(rs) - FAILED_POINTS_SHOWN} more)" if len(rs) > FAILED_POINTS_SHOWN else ""
        md.append(f"- {len(rs)} x `{reason.replace('`', chr(39))}`: {pts}{more}")
    if rel:
        md += ["", "## Figures", ""]
        md += [f"![{name}]({path})\n" for name, path in rel.items()]
    if spec_text:
        md += ["", "## Sweep specification", "", "```", spec_text.rstrip("\n"), "```"]
    md_path = os.path.join(outdir, "summary.md")
    with open(md_path, "w", encoding="utf-8") as f:
        f.write("\n".join(md).rstrip("\n") + "\n")

    e = html.escape
    h = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">", f"<title>{e(title)}</title>",
         "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:0.5em 0}"
         "td,th{border:1px solid #bbb;padding:2px 8px;text-align:right}th{background:#eef1f5}"
         "img{max-width:100%;margin:1em 0}pre{background:#f6f6f6;padding:1em}</style>",
         "</head><body>", f"<h1>{e(title)}</h1>", "<h2>Points</h2>", "<ul>"]
    h += [f"<li>{e(k)}: {v}</li>" for k, v in counts.items()]
    h += ["</ul>", "<h2>Best fps per model</h2>"]
    h += _html_table(best, best_cols) if best else ["<p>No point ran successfully.</p>"]
    h.append("<h2>Pareto fronts</h2>")
    for heading, m, fr in pareto:
        h.append(f"<h3>{e(heading)}: {e(m)}</h3>")
        h += _html_table(fr, PARETO_COLUMNS) if fr else ["<p>No point on the front.</p>"]
    h.append("<h2>Failures</h2>")
    if not fails:
        h.append("<p>None.</p>")
    else:
        h.append("<ul>")
        for reason, rs in fails:
            pts = ", ".join(f"{r.get('model', '')}:{r.get('point', '')}" for r in rs[:FAILED_POINTS_SHOWN])
            more = f" (and {len(rs) - FAILED_POINTS_SHOWN} more)" if len(rs) > FAILED_POINTS_SHOWN else ""
            h.append(f"<li>{len(rs)} &times; <code>{e(reason)}</code>: {e(pts)}{e(more)}</li>")
        h.append("</ul>")
    if rel:
        h.append("<h2>Figures</h2>")
        h += [f"<div><img src=\"{e(path, quote=True)}\" alt=\"{e(name, quote=True)}\"></div>"
              for name, path in rel.items()]
    if spec_text:
        h += ["<h2>Sweep specification</h2>", f"<pre>{e(spec_text)}</pre>"]
    h.append("</body></html>")
    html_path = os.path.join(outdir, "summary.html")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write("\n".join(h) + "\n")
    return md_path, html_path


def _default_heatmap(rows: Sequence[dict]) -> tuple[str, str] | None:
    """Two swept parameters with at least two distinct values each that are set together in the most rows (a
    union of a preset space and a pp/cp space gives pp x cp, not preset x pp); the first such pair, or None."""
    multi = [p for p in swept_parameters(rows)
             if len({json.dumps(_param_value(r, p)) for r in rows if _param_value(r, p) is not None}) >= 2]
    best, score = None, 0
    for i, a in enumerate(multi):
        for b in multi[i + 1:]:
            n = sum(1 for r in rows if a in _params(r) and b in _params(r))
            if n > score:
                best, score = (a, b), n
    if best is None and len(multi) >= 2:
        best = (multi[0], multi[1])
    return best


def make_report(outdir: str, rows: Sequence[dict], results_by_hash: dict[str, dict], plot_dir: str | None,
                heatmap: tuple[str, str] | None = None, breakdown_hash: str | None = None) -> dict[str, str]:
    """The sweep's report: into plot_dir (png; none when plot_dir is None) the Pareto figures (fps vs DSP, fps vs
    BRAM36), a heatmap per model over two swept parameters and a bottleneck breakdown of one point; then
    summary.md / summary.html in outdir. Returns {figure name: path}."""
    if breakdown_hash is not None and breakdown_hash not in results_by_hash:
        raise ValueError(f"no result for the breakdown point {breakdown_hash!r}")
    if heatmap is not None:                           # an explicit choice is checked before anything is written
        swept = swept_parameters(rows)
        for p in heatmap:
            if p not in swept and all(r.get(p) is None for r in rows):
                raise ValueError(f"heatmap parameter {p!r} is not a swept parameter "
                                 f"(swept parameters: {', '.join(swept) or 'none'})")
    figures: dict[str, str] = {}
    ok_rows = [r for r in rows if _ok(r)]
    if plot_dir is not None and ok_rows:
        for x in ("dsp", "bram36"):
            if any(_num(r.get(x)) is not None and _num(r.get("fps")) is not None for r in ok_rows):
                fig = pareto_figure(rows, x, "fps", title=f"fps vs {_label(x)}: Pareto front per model")
                figures[f"pareto_fps_{x}"] = save(fig, os.path.join(plot_dir, f"pareto_fps_vs_{x}.png"))
        pair = heatmap or _default_heatmap(rows)
        if pair is not None:
            models = [m for m in _models(rows) if any(str(r.get("model", "")) == m for r in ok_rows)]
            for m in models:
                fig = heatmap_figure(rows, pair[0], pair[1], metric="fps", model=m)
                name = "heatmap" if len(models) == 1 else f"heatmap_{_slug(m)}"
                figures[name] = save(fig, os.path.join(plot_dir, f"{name}_fps_{pair[0]}_{pair[1]}.png"))
        if breakdown_hash is None:
            first = _models(ok_rows)[0]
            best = [r for r in _best_fps(ok_rows) if str(r.get("model", "")) == first]
            breakdown_hash = str(best[0].get("hash")) if best else None
        result = results_by_hash.get(breakdown_hash) if breakdown_hash is not None else None
        if result is not None and result.get("layers"):
            fig = bottleneck_figure(result)
            figures["bottleneck"] = save(fig, os.path.join(plot_dir, f"bottleneck_{_slug(breakdown_hash)}.png"))
    write_summary(outdir, rows, figures)
    return figures
