"""Sweep report (runtime/sweep/: tables.py, figures.py, report.py): Pareto fronts, table files, figures and the
summary, on hand-built rows."""
import csv
import hashlib
import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from matplotlib.colors import to_rgba

from opendpu.runtime.plots import ENGINE_COLORS
from opendpu.runtime.sweep.figures import bottleneck_figure, heatmap_figure, pareto_figure, save
from opendpu.runtime.sweep.report import make_report, write_summary
from opendpu.runtime.sweep.spec import ROW_COLUMNS
from opendpu.runtime.sweep.tables import pareto_front, write_csv, write_json, write_parquet


def row(model, point, status="ok", meets=True, **kw):
    """A full result row: every ROW column, None where not given; `point` "pp=4;clock_mhz=300" also sets params."""
    r = dict.fromkeys(ROW_COLUMNS)
    params = {}
    for kv in point.split(";"):
        k, v = kv.split("=")
        params[k] = float(v) if "." in v else int(v)
    r.update(model=model, point=point, hash=hashlib.sha1(f"{model}/{point}".encode()).hexdigest()[:16], status=status,
             reason="" if status == "ok" else "compile error", target="T", preset="", board="",
             params=json.dumps(params), meets_constraints=meets if status == "ok" else None)
    r.update(kw)
    return r


def names(rows):
    return [(r["model"], r["point"]) for r in rows]


@pytest.fixture
def pareto_rows():
    return [
        row("A", "pp=1", dsp=100, fps=10.0),
        row("A", "pp=2", dsp=200, fps=30.0),
        row("A", "pp=3", dsp=250, fps=25.0),            # dominated by pp=2 (fewer DSPs, more fps)
        row("A", "pp=5", dsp=400, fps=50.0),            # ties pp=4: pp=4 is first by point, so pp=5 goes
        row("A", "pp=4", dsp=400, fps=50.0),
        row("A", "pp=6", dsp=200, fps=20.0),            # same DSPs as pp=2, fewer fps: dominated
        row("A", "pp=7", status="failed", dsp=50, fps=1000.0),      # better than all, but failed
        row("A", "pp=8", meets=False, dsp=60, fps=500.0),           # better than all, but violates constraints
        row("B", "pp=1", dsp=300, fps=40.0),
        row("B", "pp=2", dsp=100, fps=5.0),
        row("B", "pp=3", dsp=150, fps=5.0),             # dominated by pp=2
        row("B", "pp=4", dsp=500, fps=40.0),            # dominated by pp=1
        row("B", "pp=5", dsp=600, fps=90.0),
        row("B", "pp=6", dsp=None, fps=100.0),          # no DSP figure: not a candidate
    ]


def test_pareto_front_membership_and_order(pareto_rows):
    front = pareto_front(pareto_rows, x="dsp", y="fps")
    assert names(front) == [("A", "pp=1"), ("A", "pp=2"), ("A", "pp=4"),
                            ("B", "pp=2"), ("B", "pp=1"), ("B", "pp=5")]


def test_pareto_front_other_directions():
    rows = [row("M", "pp=1", fps=10.0, latency_ms=5.0), row("M", "pp=2", fps=20.0, latency_ms=8.0),
            row("M", "pp=3", fps=15.0, latency_ms=9.0),       # dominated by pp=2 (more fps, lower latency)
            row("M", "pp=4", fps=5.0, latency_ms=4.0)]
    front = pareto_front(rows, x="fps", y="latency_ms", minimize_x=False, maximize_y=False)
    assert names(front) == [("M", "pp=4"), ("M", "pp=1"), ("M", "pp=2")]


def test_pareto_figure_front_line(pareto_rows):
    fig = pareto_figure(pareto_rows, "dsp", "fps")
    ax = fig.axes[0]
    line = next(ln for ln in ax.get_lines() if ln.get_gid() == "front:B")
    # the step line goes through B's front points (DSP 100, 300, 600) in x order
    xs, ys = line.get_data()
    assert list(xs) == [100, 300, 600] and list(ys) == [5.0, 40.0, 90.0]
    excluded = next(c for c in ax.collections if c.get_gid() == "excluded")
    assert sorted(map(tuple, excluded.get_offsets().tolist())) == [(50.0, 1000.0), (60.0, 500.0)]
    assert ax.get_xscale() == "log"                     # x from 50 (the failed point) to 600: over 10x
    assert ax.get_xlabel().startswith("DSP48 slices") and ax.get_ylabel().startswith("throughput (fps)")


def test_pareto_figure_log_scale():
    rows = [row("M", "pp=1", dsp=10, fps=1.0), row("M", "pp=2", dsp=500, fps=9.0)]
    assert pareto_figure(rows, "dsp", "fps").axes[0].get_xscale() == "log"
    rows = [row("M", "pp=1", dsp=100, fps=1.0), row("M", "pp=2", dsp=900, fps=9.0)]
    assert pareto_figure(rows, "dsp", "fps").axes[0].get_xscale() == "linear"


def test_table_files_round_trip(tmp_path):
    rows = [row("A", "pp=4;clock_mhz=300.0", dsp=120.0, bram36=12.5, fps=99.5, cycles=3_000_000,
                compile_cached=True, bottleneck="CONV", note="x"),
            row("A", "pp=8;clock_mhz=300.0", status="failed")]
    del rows[1]["fps"]                                   # a missing column is written as null / empty
    cols = list(ROW_COLUMNS) + ["note"]
    pq_path, csv_path, json_path = (str(tmp_path / f"t.{s}") for s in ("parquet", "csv", "json"))
    write_parquet(rows, pq_path, cols)
    write_csv(rows, csv_path, cols)
    write_json(rows, json_path, cols, extra={"sweep": "s1", "bad": math.nan})

    t = pq.read_table(pq_path)
    assert t.column_names == cols
    sch = t.schema
    assert sch.field("model").type == pa.string() and sch.field("params").type == pa.string()
    assert sch.field("pp").type == pa.int64() and sch.field("dsp").type == pa.int64()
    assert sch.field("cycles").type == pa.int64() and sch.field("img_bg").type == pa.int64()
    assert sch.field("fps").type == pa.float64() and sch.field("bram36").type == pa.float64()
    assert sch.field("clock_mhz").type == pa.float64()
    assert sch.field("compile_cached").type == pa.bool_() and sch.field("meets_constraints").type == pa.bool_()
    # None in every row: typed all the same
    assert sch.field("ddr_mbps").type == pa.float64() and t.column("ddr_mbps").null_count == 2
    assert sch.field("lut").type == pa.int64() and t.column("lut").null_count == 2
    assert sch.field("note").type == pa.string()         # a column COLUMN_TYPES does not know: inferred
    d = t.to_pydict()
    assert d["dsp"] == [120, None] and d["bram36"] == [12.5, None] and d["fps"] == [99.5, None]
    assert d["status"] == ["ok", "failed"] and d["meets_constraints"] == [True, None]
    assert d["params"][0] == '{"pp": 4, "clock_mhz": 300.0}' and d["note"] == ["x", None]

    with open(csv_path, newline="") as f:
        lines = list(csv.reader(f))
    assert lines[0] == cols and len(lines) == 3
    rec = dict(zip(cols, lines[2]))
    assert rec["status"] == "failed" and rec["fps"] == "" and rec["dsp"] == ""
    assert dict(zip(cols, lines[1]))["fps"] == "99.5"

    doc = json.loads(open(json_path).read())
    assert doc["columns"] == cols and doc["sweep"] == "s1" and doc["bad"] is None
    assert doc["rows"][0]["bram36"] == 12.5 and doc["rows"][1]["fps"] is None and len(doc["rows"]) == 2


def test_parquet_rejects_fractional_int(tmp_path):
    with pytest.raises(ValueError, match="'dsp'"):
        write_parquet([row("A", "pp=1", dsp=1.5)], str(tmp_path / "t.parquet"), ["model", "dsp"])


@pytest.fixture
def grid_rows():
    """pp in {4, 8, 16} x clock in {200, 300}, two cp per cell; the expected max fps per cell is in EXPECTED."""
    rows = []
    fps = {(4, 200): (10, 12), (8, 200): (20, 18), (16, 200): (35, 30),
           (4, 300): (15, 11), (8, 300): (27, 29), (16, 300): None}
    for (pp, clk), v in fps.items():
        for k, cp in enumerate((8, 16)):
            point = f"pp={pp};cp={cp};clock_mhz={clk}.0"
            if v is None:
                rows.append(row("M", point, status="failed"))
            else:
                rows.append(row("M", point, fps=float(v[k]), pp=pp, cp=cp, clock_mhz=float(clk)))
    rows.append(row("M", "pp=4;cp=32;clock_mhz=200.0", meets=False, fps=1000.0))   # excluded
    rows.append(row("N", "pp=4;cp=8;clock_mhz=200.0", fps=5000.0))                  # another model
    return rows


EXPECTED = np.array([[12, 20, 35],              # clock 200: pp 4, 8, 16
                     [15, 29, np.nan]])         # clock 300: pp=16 only failed: blank


def test_heatmap_values(grid_rows):
    fig = heatmap_figure(grid_rows, "pp", "clock_mhz", metric="fps", model="M")
    ax = fig.axes[0]
    a = ax.images[0].get_array()
    assert a.shape == (2, 3)
    assert list(np.ma.getmaskarray(a).ravel()) == [False] * 5 + [True]
    np.testing.assert_array_equal(a.filled(np.nan), EXPECTED)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "8", "16"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["200", "300"]
    cells = {t.get_gid(): t.get_text() for t in ax.texts if t.get_gid()}
    assert cells == {"cell:0,0": "12", "cell:0,1": "20", "cell:0,2": "35", "cell:1,0": "15", "cell:1,1": "29"}
    # min, and the default model (the first one, M)
    lo = heatmap_figure(grid_rows, "pp", "clock_mhz", reduce="min").axes[0].images[0].get_array()
    np.testing.assert_array_equal(lo.filled(np.nan), [[10, 18, 30], [11, 27, np.nan]])


def test_heatmap_param_fallback_to_column(grid_rows):
    r = row("M", "pp=8", fps=99.0, clock_mhz=300.0)     # clock_mhz not in params: taken from the row
    a = heatmap_figure(grid_rows + [r], "pp", "clock_mhz").axes[0].images[0].get_array()
    assert a[1, 1] == 99.0


def test_heatmap_bad_parameter(grid_rows):
    with pytest.raises(ValueError, match="'bogus' is not a swept parameter.*pp, cp, clock_mhz"):
        heatmap_figure(grid_rows, "pp", "bogus")
    with pytest.raises(ValueError, match="two different"):
        heatmap_figure(grid_rows, "pp", "pp")


RESULT = {"model": "mnist", "point": "pp=4;cp=16", "target": "T4", "layers": [
    {"subgraph": "sg0", "name": "subgraph_conv1", "cycles": 400, "ops": 10, "bound": "CONV"},
    {"subgraph": "sg0", "name": "subgraph_conv2", "cycles": 100, "ops": 10, "bound": "LOAD"},
    {"subgraph": "sg0", "name": "subgraph_pool", "cycles": 250, "ops": 10, "bound": "CONV"},
    {"subgraph": "sg0", "name": "subgraph_reshape", "cycles": 30, "ops": 0, "bound": None},
    {"subgraph": "sg0", "name": "subgraph_add", "cycles": 70, "ops": 5, "bound": "MISC"}]}


def test_bottleneck_figure():
    fig = bottleneck_figure(RESULT)
    (ax,) = [a for a in fig.axes if a.get_label() == "layers"]
    bars = [p for p in ax.patches if str(p.get_gid()).startswith("layer-bar:")]
    assert len(bars) == 5
    assert [p.get_width() for p in bars] == [400, 100, 250, 30, 70]
    want = [ENGINE_COLORS["CONV"], ENGINE_COLORS["LOAD"], ENGINE_COLORS["CONV"], "#888888", ENGINE_COLORS["MISC"]]
    assert [p.get_facecolor() for p in bars] == [to_rgba(c) for c in want]
    (ax2,) = [a for a in fig.axes if a.get_label() == "engines"]
    totals = {p.get_gid(): p.get_width() for p in ax2.patches}
    assert totals == {"engine-bar:LOAD": 100, "engine-bar:CONV": 650, "engine-bar:MISC": 70, "engine-bar:none": 30}
    assert "mnist" in fig.get_suptitle() and "pp=4;cp=16" in fig.get_suptitle() and "T4" in fig.get_suptitle()


def test_save_formats(tmp_path):
    fig = bottleneck_figure(RESULT)
    for suf, magic in (("png", b"\x89PNG"), ("svg", b"<?xml"), ("pdf", b"%PDF")):
        p = save(fig, str(tmp_path / "sub" / f"b.{suf}"))
        assert open(p, "rb").read(5).startswith(magic)
    with pytest.raises(ValueError, match="suffix"):
        save(fig, str(tmp_path / "b.jpg"))


def test_write_summary(tmp_path, pareto_rows):
    for r in pareto_rows:
        if r["model"] == "A":
            r["model"] = "m<&>"
            r.update(bram36=10.5, latency_ms=3.0, mac_util=0.5)
    fig_path = str(tmp_path / "plots" / "p.png")
    md_path, html_path = write_summary(str(tmp_path), pareto_rows, {"pareto": fig_path}, spec_text="pp: [1, 2]")
    md = open(md_path).read()
    htm = open(html_path).read()
    assert "- points: 14" in md and "- ok: 13" in md and "- failed: 1" in md and "- excluded by constraints: 1" in md
    # fps vs DSP front of m<&>: pp=1, pp=2, pp=4, in that order
    lines = md.splitlines()
    start = lines.index("### fps vs DSP48: m<&>")
    assert lines[start + 2:start + 7] == [
        "| point | target | fps | dsp | bram36 | latency_ms | mac_util |", "|---|---|---|---|---|---|---|",
        "| pp=1 | T | 10.00 | 100 | 10.5 | 3.000 | 0.500 |",
        "| pp=2 | T | 30.00 | 200 | 10.5 | 3.000 | 0.500 |",
        "| pp=4 | T | 50.00 | 400 | 10.5 | 3.000 | 0.500 |"]
    # fps vs BRAM36 of m<&>: all at 10.5 BRAM36, so only the fastest (pp=4) is on the front
    start = lines.index("### fps vs BRAM36: m<&>")
    assert lines[start + 4:start + 6] == ["| pp=4 | T | 50.00 | 400 | 10.5 | 3.000 | 0.500 |", ""]
    assert "| m<&> | pp=4 | T | 50.00 |" in md                     # best fps of the model
    assert "- 1 x `compile error`: m<&>:pp=7" in md
    assert "![pareto](plots/p.png)" in md and "pp: [1, 2]" in md
    assert "m&lt;&amp;&gt;" in htm and "m<&>" not in htm
    assert '<img src="plots/p.png"' in htm


def test_make_report(tmp_path, grid_rows):
    rows = [r for r in grid_rows if r["model"] == "M"]
    for r in rows:
        if r["status"] == "ok":
            pr = json.loads(r["params"])
            r.update(dsp=pr["pp"] * pr["cp"], bram36=float(pr["cp"]))
    best = max((r for r in rows if r["status"] == "ok" and r["meets_constraints"]), key=lambda r: r["fps"])
    assert best["point"] == "pp=16;cp=8;clock_mhz=200.0"
    results = {r["hash"]: dict(r, layers=RESULT["layers"]) for r in rows}
    figs = make_report(str(tmp_path), rows, results, str(tmp_path / "plots"))
    assert sorted(figs) == ["bottleneck", "heatmap", "pareto_fps_bram36", "pareto_fps_dsp"]
    assert figs["bottleneck"].endswith(f"bottleneck_{best['hash']}.png")          # default: the best-fps point
    assert figs["heatmap"].endswith("heatmap_fps_pp_cp.png")      # the first two swept parameters with 2+ values
    for p in figs.values():
        assert os.path.dirname(p) == str(tmp_path / "plots") and open(p, "rb").read(4) == b"\x89PNG"
    md = open(tmp_path / "summary.md").read()
    assert "![heatmap](plots/heatmap_fps_pp_cp.png)" in md
    assert os.path.isfile(tmp_path / "summary.html")
    with pytest.raises(ValueError, match="not a swept parameter"):
        make_report(str(tmp_path / "x"), rows, results, str(tmp_path / "p2"), heatmap=("pp", "bogus"))
    assert not os.path.exists(tmp_path / "p2")            # checked before anything is written


def test_make_report_all_failed(tmp_path):
    rows = [row("M", "pp=4", status="failed"), row("M", "pp=8", status="failed", reason="timeout")]
    figs = make_report(str(tmp_path), rows, {}, str(tmp_path / "plots"))
    assert figs == {}
    assert not os.path.exists(tmp_path / "plots")
    md = open(tmp_path / "summary.md").read()
    assert "- failed: 2" in md and "- 1 x `timeout`: M:pp=8" in md and "![" not in md
    assert os.path.isfile(tmp_path / "summary.html")


def test_default_heatmap_takes_the_parameters_set_together():
    """A union of a preset space and a pp x cp space: the heatmap is pp x cp (set together in 4 rows), not
    preset x pp (never set together)."""
    from opendpu.runtime.sweep.report import _default_heatmap
    rows = [row("m", f"pp={pp};cp={cp}", fps=1.0) for pp in (4, 8) for cp in (8, 16)]
    for name in ("B512", "B4096"):
        r = row("m", "pp=1", fps=1.0)
        r.update(point=f"preset={name}", params=json.dumps({"preset": name}))
        rows.insert(0, r)
    assert _default_heatmap(rows) == ("pp", "cp")
