"""Profile figures (`runtime.profile.Profile.figure` / `.plot`).

One panel set per DPU subgraph, stacked in graph order (the figure grows with the subgraphs and their
layers):
* a layer strip: the span of each layer (the cycles charged to it, `SubgraphProfile.layer_runs`) as
  bands in time, alternately shaded, labelled with the layer's index (and short name where it fits);
* one Gantt lane per engine (LOAD, SAVE, CONV, MISC) with the engine's busy intervals (union of its
  instructions' [start, end) of the cycle model), the layer bands shaded behind them; the lane label
  gives the engine's busy share of the run;
* a per-layer chart: one horizontal bar per layer, in execution order, as long as the time charged to
  the layer (the bars add up to the subgraph's time), coloured by the layer's bounding engine
  (`SubgraphProfile.bounding_engines`: the engine busy for most cycles of the layer's span), with the
  engine legend outside the axes.
Titles are wrapped, never truncated. Artists carry gids (lane:<ENGINE>, layer-band:<i>, layer-bar:<i>)
and axes labels (layers:<k>, lanes:<k>, bars:<k>) so that tests can find them.
"""
from __future__ import annotations

import re
import textwrap

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from opendpu.isa.fields import Engine

# the one engine -> colour map of every figure (engine lanes, per-layer chart, roofline), by Engine name
ENGINE_COLORS = {"LOAD": "#1f77b4", "SAVE": "#ff7f0e", "CONV": "#2ca02c", "MISC": "#d62728"}
NO_ENGINE_COLOR = "#888888"                 # a layer without a bounding engine
BAND_SHADES = ("#c6d3e3", "#e9eef4")       # layer strip, even / odd layers
BACK_SHADE = "#eef1f5"                      # behind the lanes, even layers (odd ones stay white)
DPI = 110
WIDTH_IN = 15.0
NAME_CHARS = 64                              # longest short layer name on the per-layer chart

_CLASS_TOKEN = re.compile(r"[A-Z](?:[A-Za-z0-9]*[a-z][A-Za-z0-9]*|[A-Z0-9]{2,})?$")


def short_layer_names(names: list[str]) -> list[str]:
    """Short, readable layer names. XIR names a layer `subgraph_<op>`; PyTorch (NNDCT) op names are
    module paths `Model__Class_attr__Class_attr__..._<tensor>`. We drop `subgraph_`, the `__`-components
    that all the layers share, and from each component its leading class-like tokens (a capital letter
    alone, or a capitalised word with a lower-case letter or of three or more characters: `BaseConv`,
    `Q`, `YOLOPAFPN`, not `C3`), which leaves the module path, joined with dots:
    `...__Sequential_dark2__Q_CSPLayer_1__BaseConv_conv1__Conv2d_conv__input_31` -> `dark2.1.conv1.conv.
    input_31`. Names without such structure (TensorFlow `quant_conv2d_1`) are only stripped of the prefix.
    Longer than NAME_CHARS: cut in the middle with an ellipsis."""
    bare = [n[len("subgraph_"):] if n.startswith("subgraph_") else n for n in names]
    parts = [b.split("__") for b in bare]
    common = 0
    if len(parts) > 1:
        while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
            common += 1
    out = []
    for p in parts:
        comps = []
        for c in p[common:]:
            tok = c.split("_")
            while len(tok) > 1 and _CLASS_TOKEN.match(tok[0]):
                tok = tok[1:]
            comps.append("_".join(tok))
        s = ".".join(x for x in comps if x) or p[-1]
        if len(s) > NAME_CHARS:
            h = (NAME_CHARS - 1) // 3
            s = s[:h] + "…" + s[-(NAME_CHARS - 1 - h):]
        out.append(s)
    return out


def _wrap(text: str, width_in: float, fontsize: float) -> str:
    chars = max(20, int(width_in * 72 / (0.62 * fontsize)))
    return "\n".join(textwrap.fill(par, chars, break_long_words=True, break_on_hyphens=False)
                     for par in text.split("\n"))


def _merged(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Disjoint [start, end) intervals covering the union of the given ones, as (start, width) pairs."""
    if not len(start):
        return np.zeros((0, 2))
    o = np.argsort(start, kind="stable")
    s, e = start[o], end[o]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > reach[:-1]
    ms = s[new]
    me = np.maximum.reduceat(e, np.nonzero(new)[0])
    keep = me > ms
    return np.stack([ms[keep], (me - ms)[keep]], axis=1).astype(np.float64)


def _unit(total_cycles: int, clock_mhz: float) -> tuple[str, float]:
    """Time unit of a panel set and cycles per unit."""
    return ("ms", clock_mhz * 1e3) if total_cycles / clock_mhz >= 2000 else ("µs", clock_mhz)


def _layout(profile) -> list[dict]:
    """Heights (inches) of the parts of each panel set, top to bottom."""
    sets = []
    for sp in profile.subgraphs:
        n = len(sp.layers)
        sets.append(dict(title=0.0, strip=0.75 if n else 0.0, lanes=1.55, gap1=0.55 if n else 0.0,
                         bars_title=0.3 if n else 0.0, bars=max(0.9, 0.145 * n + 0.2) if n else 0.0,
                         gap2=0.85))
    return sets


def build_figure(profile) -> Figure:
    """The profile figure of `profile` (a runtime.profile.Profile); see the module docstring."""
    fig = Figure(dpi=DPI)
    FigureCanvasAgg(fig)
    # the time axes take the width; the per-layer chart leaves room for names (left) and the legend
    wide, narrow = (1.45, WIDTH_IN - 1.45 - 0.3), (4.3, WIDTH_IN - 4.3 - 2.35)
    title_fs, sub_fs = 11, 9.5
    clk0 = profile.subgraphs[0].schedule.clock_mhz
    head = (f"{profile.model}: {len(profile.subgraphs)} DPU subgraph(s), {profile.total_cycles} cycles = "
            f"{profile.total_ms:.3f} ms at {clk0:g} MHz for one batch = {profile.fps:.1f} fps "
            f"(opendpu cycle model)")
    head = _wrap(head, WIDTH_IN - 0.6, title_fs)
    sets = _layout(profile)
    titles = []
    for k, (sp, h) in enumerate(zip(profile.subgraphs, sets)):
        s = sp.schedule
        t = (f"DPU subgraph {k + 1}/{len(profile.subgraphs)}: {sp.name} on {sp.target.name}: {len(s)} "
             f"instructions, {len(sp.layers)} layers, {s.total_cycles} cycles = {s.latency_ms:.3f} ms at "
             f"{s.clock_mhz:g} MHz")
        t = _wrap(t, WIDTH_IN - 0.6, sub_fs)
        titles.append(t)
        h["title"] = 0.2 * (t.count("\n") + 1) + 0.15
    head_h = 0.24 * (head.count("\n") + 1) + 0.25
    height = head_h + sum(sum(h.values()) for h in sets) + 0.1
    fig.set_size_inches(WIDTH_IN, height)
    fig.suptitle(head, x=0.3 / WIDTH_IN, y=1 - 0.12 / height, ha="left", va="top", fontsize=title_fs,
                 fontweight="bold")

    def box(top_in, h_in, names=False):   # axes rectangle in figure fractions from a top offset in inches
        left, w = narrow if names else wide
        return [left / WIDTH_IN, 1 - (top_in + h_in) / height, w / WIDTH_IN, h_in / height]

    y = head_h
    for k, (sp, h, title) in enumerate(zip(profile.subgraphs, sets, titles)):
        fig.text(0.3 / WIDTH_IN, 1 - (y + 0.05) / height, title, ha="left", va="top", fontsize=sub_fs,
                 gid=f"subgraph-title:{k}")
        y += h["title"]
        _panel_set(fig, k, sp, box, y, h)
        y += sum(v for n, v in h.items() if n != "title")
    return fig


def _panel_set(fig: Figure, k: int, sp, box, y: float, h: dict) -> None:
    s = sp.schedule
    total = max(1, s.total_cycles)
    unit, per = _unit(total, s.clock_mhz)
    nl = len(sp.layers)
    short = short_layer_names([ly.name for ly in sp.layers])
    lanes = fig.add_axes(box(y + h["strip"], h["lanes"]), label=f"lanes:{k}")
    strip = None
    if nl:
        strip = fig.add_axes(box(y, h["strip"]), label=f"layers:{k}", sharex=lanes)
    # layer bands: the strip, and alternate shading behind the lanes
    for li in range(nl):
        r = sp.layer_runs(li).astype(np.float64)
        xr = list(zip(r[:, 0] / per, (r[:, 1] - r[:, 0]) / per))
        if strip is not None:                 # (there is a strip whenever there are layers)
            strip.broken_barh(xr, (0, 1), facecolors=BAND_SHADES[li % 2], edgecolors="white", linewidths=0.5,
                              gid=f"layer-band:{li}")
        if li % 2 == 0:
            lanes.broken_barh(xr, (-0.5, len(Engine)), facecolors=BACK_SHADE, linewidths=0, zorder=0,
                              gid=f"layer-shade:{li}")
    busy = s.engine_busy()
    for e in Engine:
        name = e.name
        m = s.engine == e
        iv = _merged(s.start[m], s.end[m])
        lanes.broken_barh(list(zip(iv[:, 0] / per, iv[:, 1] / per)), (e - 0.36, 0.72),
                          facecolors=ENGINE_COLORS[name], linewidths=0, zorder=2, gid=f"lane:{name}")
    lanes.set_ylim(len(Engine) - 0.5, -0.5)
    lanes.set_yticks(range(len(Engine)),
                     [f"{e.name}  {100 * busy[e.name] / total:.0f}% busy" for e in Engine], fontsize=8.5)
    lanes.set_xlim(0, total / per)
    lanes.set_xlabel(f"time ({unit}) from ap_start; shading: the spans of the layers in the strip above",
                     fontsize=8.5)
    lanes.tick_params(axis="x", labelsize=8)
    lanes.grid(axis="x", color="#999999", linewidth=0.4, alpha=0.5, zorder=1)
    if strip is not None:
        strip.set_ylim(0, 1)
        strip.set_yticks([0.5], ["layers\n(index)"], fontsize=8.5)
        strip.tick_params(axis="x", labelbottom=False, bottom=False)
        strip.tick_params(axis="y", left=False)
        for sd in ("top", "right", "left", "bottom"):
            strip.spines[sd].set_visible(False)
        _label_bands(fig, strip, sp, short, per)
        bars = fig.add_axes(box(y + h["strip"] + h["lanes"] + h["gap1"] + h["bars_title"], h["bars"], True),
                            label=f"bars:{k}")
        _layer_bars(bars, sp, short, per, unit)


def _label_bands(fig: Figure, ax, sp, short: list[str], per: float) -> None:
    """Label each layer's widest run: `i name` horizontally where it fits, else `i` horizontally, else
    `i` vertically; no label where even that does not fit."""
    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)     # every figure here is drawn by Agg (FigureCanvasAgg(fig))
    ren = canvas.get_renderer()
    x2px = ax.transData
    strip_px = ax.get_window_extent(ren).height
    for li in range(len(sp.layers)):
        r = sp.layer_runs(li)
        if not len(r):
            continue
        j = int(np.argmax(r[:, 1] - r[:, 0]))
        a, b = r[j] / per
        wpx = x2px.transform((b, 0))[0] - x2px.transform((a, 0))[0]
        mid = (a + b) / 2
        for txt, rot in ((f"{li} {short[li]}", 0), (str(li), 0), (str(li), 90)):
            t = ax.text(mid, 0.5, txt, rotation=rot, ha="center", va="center", fontsize=7, clip_on=True,
                        gid=f"layer-label:{li}")
            bb = t.get_window_extent(ren)
            if bb.width <= wpx - 2 and bb.height <= strip_px - 2:
                break
            t.remove()


def _layer_bars(ax, sp, short: list[str], per: float, unit: str) -> None:
    nl = len(sp.layers)
    bound = sp.bounding_engines()
    cyc = np.array([ly.cycles for ly in sp.layers], np.float64)
    colors = [ENGINE_COLORS.get(b, NO_ENGINE_COLOR) if b else NO_ENGINE_COLOR for b in bound]
    cont = ax.barh(np.arange(nl), cyc / per, height=0.78, color=colors, linewidth=0)
    for li, p in enumerate(cont.patches):
        p.set_gid(f"layer-bar:{li}")
    ax.set_ylim(nl - 0.5, -0.5)
    fs = 7 if nl <= 60 else 6.3
    ax.set_yticks(np.arange(nl), [f"{li}  {short[li]}" for li in range(nl)], fontsize=fs)
    ax.tick_params(axis="x", labelsize=8)
    tot = max(1.0, cyc.sum())
    for li in range(nl):
        ax.text(cyc[li] / per, li, f" {100 * cyc[li] / tot:.1f}%", va="center", ha="left", fontsize=fs - 0.3,
                color="#333333", gid=f"layer-share:{li}")
    ax.set_xlim(0, max(cyc.max() / per, 1e-9) * 1.08)
    ax.grid(axis="x", color="#999999", linewidth=0.4, alpha=0.5)
    ax.set_axisbelow(True)
    ax.set_xlabel(f"time charged to the layer ({unit}) and its share of the DPU subgraph's time (the bars add "
                  "up to it)",
                  fontsize=8.5)
    ax.set_title("time per layer, in execution order, coloured by the layer's bounding engine (the engine "
                 "busy for most cycles of the layer's span)", fontsize=8.5, loc="left")
    names = [e.name for e in Engine]
    counts = {n: sum(1 for b in bound if b == n) for n in names}
    handles = [Patch(facecolor=ENGINE_COLORS[n], label=f"{n}: {counts[n]} layer(s)") for n in names]
    ax.legend(handles=handles, title="bounding engine", loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0, fontsize=8, title_fontsize=8.5, frameon=False)


def save_figure(fig: Figure, path: str, fmt: str) -> None:
    fig.savefig(path, format=fmt, dpi=DPI, bbox_inches="tight", pad_inches=0.15)


def roofline_figure(profile) -> Figure:
    """Per layer: operational intensity (ops per DDR byte: WL / (LdWB + LdFM + StFM)) against achieved GOP/s,
    under the roofs of each DPU subgraph's target: peak ops (PP x ICP x OCP x 2 per cycle) and DDR read
    bandwidth (ddr_ports x ddr_bytes_per_cycle per cycle), at its clock. Layers with no workload or no DDR
    traffic have no point; the colour is the layer's bounding engine."""
    fig = Figure(figsize=(8.0, 5.5), constrained_layout=True)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    colors = {**ENGINE_COLORS, "": NO_ENGINE_COLOR}
    roofs = {}
    xs_all = []
    for sp in profile.subgraphs:
        tm = sp.target.timing
        peak = sp.target.peak_ops_per_cycle * tm.clock_mhz * 1e6 / 1e9                  # GOP/s
        bw = tm.ddr_ports * tm.ddr_bytes_per_cycle * tm.clock_mhz * 1e6 / 1e9             # GB/s
        roofs[(sp.target.name, tm.clock_mhz)] = (peak, bw)
    for r in profile.rows(layers=True):
        if r["level"] != "layer":
            continue
        nbytes = (r["ldwb_mb"] + r["ldfm_mb"] + r["stfm_mb"]) * (1 << 20)
        if r["wl_gop"] <= 0 or nbytes <= 0 or r["rt_ms"] <= 0:
            continue
        x = r["wl_gop"] * 1e9 / nbytes
        xs_all.append(x)
        ax.scatter([x], [r["perf_gops"]], s=18, color=colors.get(r["bound"], NO_ENGINE_COLOR), zorder=3,
                   gid=f"roofline-point:{r['bound'] or 'none'}")
    lo = min(xs_all + [0.1]) / 2
    hi = max(xs_all + [1000.0]) * 2
    for (name, clk), (peak, bw) in roofs.items():
        xs = np.geomspace(lo, hi, 200)
        ax.plot(xs, np.minimum(peak, bw * xs), color="k", lw=1.2)
        ax.text(hi, peak, f"{name.replace('DPUCZDX8G_ISA1_', '')} {peak:.0f} GOP/s at {clk:g} MHz",
                ha="right", va="bottom", fontsize=8)
        ax.text(lo * 1.1, bw * lo * 1.3, f"DDR read {bw:.1f} GB/s", fontsize=8, rotation=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operational intensity (ops per DDR byte)")
    ax.set_ylabel("achieved GOP/s")
    ax.set_title(f"{profile.model}: roofline per layer", fontsize=10)
    ax.legend(handles=[Patch(color=c, label=k or "none") for k, c in colors.items()], title="bounding engine",
              fontsize=8, title_fontsize=8, loc="lower right")
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    return fig
