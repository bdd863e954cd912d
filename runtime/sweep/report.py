"""The sweep's report: the figures into the --plot directory and summary.md / summary.html (counts, best fps per
model, Pareto tables, failures by reason, the figures)."""
from __future__ import annotations

import html
import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from .figures import bottleneck_figure, heatmap_figure, label, pareto_figure, save
from .tables import feasible, is_ok, models_of, num, param_value, params_of, pareto_front, swept_parameters

PARETO_COLUMNS = ("point", "target", "fps", "dsp", "bram36", "latency_ms", "mac_util")
FAILED_POINTS_SHOWN = 5
# number formats in the summary tables
FORMATS: dict[str, str] = {"fps": ".2f", "latency_ms": ".3f", "mac_util": ".3f", "gops": ".2f", "bram36": "g",
                           "clock_mhz": "g"}


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


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).strip("_") or "model"


# ---------------------------------------------------------------------------------------------------------- summary

def _counts(rows: Sequence[dict]) -> dict[str, int]:
    return {"points": len(rows), "ok": sum(1 for r in rows if is_ok(r)),
            "failed": sum(1 for r in rows if not is_ok(r)),
            "excluded by constraints": sum(1 for r in rows if is_ok(r) and not feasible(r))}


def _best_fps(rows: Sequence[dict]) -> list[dict]:
    """Per model, its ok row with the highest fps (preferring rows that meet the constraints; ties: the first by
    `point`, as in pareto_front)."""
    out = []
    for m in models_of(rows):
        mine = [r for r in rows if str(r.get("model", "")) == m and is_ok(r) and num(r.get("fps")) is not None]
        pool = [r for r in mine if feasible(r)] or mine
        if pool:
            out.append(min(pool, key=lambda r: (-float(r["fps"]), str(r.get("point", "")))))
    return out


def _failures(rows: Sequence[dict]) -> list[tuple[str, list[dict]]]:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if not is_ok(r):
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
        for m in models_of(rows):
            out.append((f"fps vs {name}", m, [r for r in front if str(r.get("model", "")) == m]))
    return out


def write_summary(outdir: str, rows: Sequence[dict], figures: dict[str, str], title: str = "opendpu sweep",
                  spec_text: str | None = None) -> tuple[str, str]:
    """Write summary.md and summary.html in outdir: counts, best-fps point per model, Pareto tables (fps vs DSP and
    vs BRAM36), failures by reason and the figures (relative links). Returns (markdown path, HTML path)."""
    os.makedirs(outdir, exist_ok=True)
    parts = {"counts": _counts(rows), "best": _best_fps(rows), "fails": _failures(rows),
             "pareto": _pareto_sections(rows),
             "rel": {name: os.path.relpath(p, outdir).replace(os.sep, "/") for name, p in figures.items()}}
    md_path = os.path.join(outdir, "summary.md")
    with open(md_path, "w", encoding="utf-8") as f:
        f.write("\n".join(_summary_md(title, spec_text, **parts)).rstrip("\n") + "\n")
    html_path = os.path.join(outdir, "summary.html")
    with open(html_path, "w", encoding="utf-8") as f:
        f.write("\n".join(_summary_html(title, spec_text, **parts)) + "\n")
    return md_path, html_path


_BEST_COLUMNS = ("model", "point", "target", "fps", "dsp", "bram36", "latency_ms", "mac_util")


def _failed_points(rs: list[dict]) -> tuple[str, str]:
    """The first FAILED_POINTS_SHOWN points of a failure group as text, and "(and N more)" or ""."""
    pts = ", ".join(f"{r.get('model', '')}:{r.get('point', '')}" for r in rs[:FAILED_POINTS_SHOWN])
    more = f" (and {len(rs) - FAILED_POINTS_SHOWN} more)" if len(rs) > FAILED_POINTS_SHOWN else ""
    return pts, more


def _summary_md(title: str, spec_text: str | None, counts, best, fails, pareto, rel) -> list[str]:
    md = [f"# {title}", "", "## Points", ""]
    md += [f"- {k}: {v}" for k, v in counts.items()]
    md += ["", "## Best fps per model", ""]
    md += _md_table(best, _BEST_COLUMNS) if best else ["No point ran successfully."]
    md += ["", "## Pareto fronts", ""]
    for heading, m, fr in pareto:
        md += [f"### {heading}: {_md_cell(m)}", ""]
        md += _md_table(fr, PARETO_COLUMNS) if fr else ["No point on the front."]
        md.append("")
    md += ["## Failures", ""]
    if not fails:
        md.append("None.")
    for reason, rs in fails:
        pts, more = _failed_points(rs)
        md.append(f"- {len(rs)} x `{reason.replace('`', chr(39))}`: {pts}{more}")
    if rel:
        md += ["", "## Figures", ""]
        md += [f"![{name}]({path})\n" for name, path in rel.items()]
    if spec_text:
        md += ["", "## Sweep specification", "", "```", spec_text.rstrip("\n"), "```"]
    return md


def _summary_html(title: str, spec_text: str | None, counts, best, fails, pareto, rel) -> list[str]:
    e = html.escape
    h = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">", f"<title>{e(title)}</title>",
         "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:0.5em 0}"
         "td,th{border:1px solid #bbb;padding:2px 8px;text-align:right}th{background:#eef1f5}"
         "img{max-width:100%;margin:1em 0}pre{background:#f6f6f6;padding:1em}</style>",
         "</head><body>", f"<h1>{e(title)}</h1>", "<h2>Points</h2>", "<ul>"]
    h += [f"<li>{e(k)}: {v}</li>" for k, v in counts.items()]
    h += ["</ul>", "<h2>Best fps per model</h2>"]
    h += _html_table(best, _BEST_COLUMNS) if best else ["<p>No point ran successfully.</p>"]
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
            pts, more = _failed_points(rs)
            h.append(f"<li>{len(rs)} &times; <code>{e(reason)}</code>: {e(pts)}{e(more)}</li>")
        h.append("</ul>")
    if rel:
        h.append("<h2>Figures</h2>")
        h += [f"<div><img src=\"{e(path, quote=True)}\" alt=\"{e(name, quote=True)}\"></div>"
              for name, path in rel.items()]
    if spec_text:
        h += ["<h2>Sweep specification</h2>", f"<pre>{e(spec_text)}</pre>"]
    h.append("</body></html>")
    return h


def _default_heatmap(rows: Sequence[dict]) -> tuple[str, str] | None:
    """Two swept parameters with at least two distinct values each that are set together in the most rows (a
    union of a preset space and a pp/cp space gives pp x cp, not preset x pp); the first such pair, or None."""
    multi = [p for p in swept_parameters(rows)
             if len({json.dumps(param_value(r, p)) for r in rows if param_value(r, p) is not None}) >= 2]
    best, score = None, 0
    for i, a in enumerate(multi):
        for b in multi[i + 1:]:
            n = sum(1 for r in rows if a in params_of(r) and b in params_of(r))
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
    ok_rows = [r for r in rows if is_ok(r)]
    if plot_dir is not None and ok_rows:
        for x in ("dsp", "bram36"):
            if any(num(r.get(x)) is not None and num(r.get("fps")) is not None for r in ok_rows):
                fig = pareto_figure(rows, x, "fps", title=f"fps vs {label(x)}: Pareto front per model")
                figures[f"pareto_fps_{x}"] = save(fig, os.path.join(plot_dir, f"pareto_fps_vs_{x}.png"))
        pair = heatmap or _default_heatmap(rows)
        if pair is not None:
            models = [m for m in models_of(rows) if any(str(r.get("model", "")) == m for r in ok_rows)]
            for m in models:
                fig = heatmap_figure(rows, pair[0], pair[1], metric="fps", model=m)
                name = "heatmap" if len(models) == 1 else f"heatmap_{_slug(m)}"
                figures[name] = save(fig, os.path.join(plot_dir, f"{name}_fps_{pair[0]}_{pair[1]}.png"))
        if breakdown_hash is None:
            first = models_of(ok_rows)[0]
            best = [r for r in _best_fps(ok_rows) if str(r.get("model", "")) == first]
            breakdown_hash = str(best[0].get("hash")) if best else None
        result = results_by_hash.get(breakdown_hash) if breakdown_hash is not None else None
        if result is not None and result.get("layers"):
            fig = bottleneck_figure(result)
            figures["bottleneck"] = save(fig, os.path.join(plot_dir, f"bottleneck_{_slug(str(breakdown_hash))}.png"))
    write_summary(outdir, rows, figures)
    return figures
