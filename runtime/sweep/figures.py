"""Sweep figures: the Pareto scatter per model, the heatmap over two swept parameters and one point's per-layer
bottleneck breakdown. matplotlib's Agg canvas, no pyplot state (as runtime/plots.py), engines in plots.ENGINE_COLORS,
the one engine -> colour map of every figure. Artists and axes carry gids / labels (front:<model>, layer-bar:<i>,
axes "layers", "engines") for tests.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from opendpu.runtime.plots import ENGINE_COLORS, short_layer_names

from .tables import (feasible, fmt_value, models_of, num, param_value, pareto_front, sorted_values,
                     swept_parameters)

ENGINE_ORDER = ("LOAD", "SAVE", "CONV", "MISC")
NO_BOUND_COLOR = "#888888"
EXCLUDED_COLOR = "#9a9a9a"
DPI = 110
FIGURE_FORMATS = ("png", "svg", "pdf")

# axis labels, with units
LABELS: dict[str, str] = {
    "fps": "throughput (fps)", "dsp": "DSP48 slices", "bram36": "BRAM36 blocks", "lut": "LUTs", "ff": "flip-flops",
    "latency_ms": "latency (ms)", "gops": "achieved GOP/s", "mac_util": "MAC utilisation (0..1)",
    "clock_mhz": "clock (MHz)", "cycles": "cycles per frame", "ddr_mbps": "DDR bandwidth (MB/s)",
    "onchip_pct": "on-chip memory used (%)", "onchip_bytes": "on-chip memory (bytes)", "pp": "PP (pixel parallelism)",
    "cp": "CP (channel parallelism)", "alu_pp": "ALU PP", "bank_depth": "bank depth (lines)",
    "img_bg": "image bank groups", "cores": "DPU cores",
}


def label(name: str) -> str:
    return LABELS.get(name, name)


def new_figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=DPI, constrained_layout=True)
    FigureCanvasAgg(fig)
    return fig


def model_colors(models: Sequence[str]) -> dict[str, Any]:
    cmap = matplotlib.colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(models)}


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


def _xy(rows: Sequence[dict], x: str, y: str, keep: Callable[[dict], bool]) -> list[tuple[float, float]]:
    """(x, y) of the rows `keep` accepts that have both as finite numbers."""
    out = []
    for r in rows:
        if keep(r):
            a, b = num(r.get(x)), num(r.get(y))
            if a is not None and b is not None:
                out.append((a, b))
    return out


def pareto_figure(rows: Sequence[dict], x: str, y: str, title: str = "", minimize_x: bool = True,
                  maximize_y: bool = True) -> Figure:
    """Scatter of y against x of every ok row (a colour per model), failed / constraint-violating rows that have both
    values as grey crosses, and each model's Pareto front as a step line through its highlighted points."""
    fig = new_figure(8.0, 5.5)
    ax = fig.add_subplot(1, 1, 1)
    models = models_of(rows)
    colors = model_colors(models)
    xs_all: list[float] = []
    excl = _xy(rows, x, y, lambda r: not feasible(r))
    if excl:
        ax.scatter([a for a, _ in excl], [b for _, b in excl], marker="x", s=28, color=EXCLUDED_COLOR, zorder=2,
                   label="failed / violates constraints", gid="excluded")
        xs_all += [a for a, _ in excl]
    front = pareto_front(rows, x, y, minimize_x, maximize_y)
    for m in models:
        pts = _xy(rows, x, y, lambda r: str(r.get("model", "")) == m and feasible(r))
        if not pts:
            continue
        xs_all += [a for a, _ in pts]
        ax.scatter([a for a, _ in pts], [b for _, b in pts], s=22, color=colors[m], alpha=0.55, zorder=3,
                   label=m, gid=f"points:{m}")
        fr = [r for r in front if str(r.get("model", "")) == m]
        fx = [float(r[x]) for r in fr]
        fy = [float(r[y]) for r in fr]
        ax.step(fx, fy, where="post" if minimize_x == maximize_y else "pre", color=colors[m], lw=1.6, zorder=4,
                gid=f"front:{m}")
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
    ax.set_xlabel(label(x) + (" (lower is better)" if minimize_x else " (higher is better)"))
    ax.set_ylabel(label(y) + (" (higher is better)" if maximize_y else " (lower is better)"))
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
    models = models_of(rows)
    if model is None:
        model = models[0] if models else ""
    elif model not in models:
        raise ValueError(f"model {model!r} is not in the sweep (models: {', '.join(models) or 'none'})")
    mrows = [r for r in rows if str(r.get("model", "")) == model]
    swept = swept_parameters(rows)
    axes_vals = {}
    for p in (px, py):
        vals = [param_value(r, p) for r in mrows]
        vals = [v for v in vals if v is not None]
        if not vals:
            known = ", ".join(swept) or "none"
            why = "is not a swept parameter" if p not in swept else "takes no value"
            raise ValueError(f"heatmap parameter {p!r} {why} for model {model!r} (swept parameters: {known})")
        axes_vals[p] = sorted_values(vals)
    xv, yv = axes_vals[px], axes_vals[py]
    grid = np.full((len(yv), len(xv)), np.nan)
    better = max if reduce == "max" else min
    xi = {v: i for i, v in enumerate(xv)}
    yi = {v: i for i, v in enumerate(yv)}
    for r in mrows:
        a, b, m = param_value(r, px), param_value(r, py), num(r.get(metric))
        if a is None or b is None or m is None or not feasible(r):
            continue
        j, i = yi[b], xi[a]
        grid[j, i] = m if math.isnan(grid[j, i]) else better(grid[j, i], m)
    fig = new_figure(max(5.0, 1.1 * len(xv) + 2.5), max(3.5, 0.6 * len(yv) + 2.0))
    ax = fig.add_subplot(1, 1, 1)
    data = np.ma.masked_invalid(grid)
    cmap = matplotlib.colormaps["viridis" if reduce == "max" else "viridis_r"].with_extremes(bad="white")
    im = ax.imshow(data, cmap=cmap, origin="lower", aspect="auto", interpolation="nearest")
    fig.colorbar(im, ax=ax, label=label(metric))
    finite = grid[np.isfinite(grid)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for j in range(len(yv)):
        for i in range(len(xv)):
            v = grid[j, i]
            if np.isfinite(v):
                dark = (v < mid) if reduce == "max" else (v > mid)
                ax.text(i, j, f"{v:.4g}", ha="center", va="center", fontsize=8,
                        color="white" if dark else "black", gid=f"cell:{j},{i}")
    ax.set_xticks(np.arange(len(xv)), [fmt_value(v) for v in xv])
    ax.set_yticks(np.arange(len(yv)), [fmt_value(v) for v in yv])
    ax.set_xlabel(label(px))
    ax.set_ylabel(label(py))
    ax.set_title(f"{model}: {reduce} {metric} per ({px}, {py})", fontsize=10)
    return fig


def bottleneck_figure(result: dict) -> Figure:
    """One point's per-layer time: a horizontal bar per layer (execution order) as long as its cycles, coloured by
    its bounding engine; beside it, the total cycles per bounding engine."""
    layers = list(result.get("layers") or [])
    n = len(layers)
    height = min(300.0, max(3.5, 0.17 * n + 1.8))
    fig = new_figure(13.0, height)
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
