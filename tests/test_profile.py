"""Profiler (runtime/profile.py) and the cycle model on every shared model."""
import csv
import json
import warnings

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from opendpu.compiler.xir.graph import Graph
from opendpu.runtime.cli import main
from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
from opendpu.runtime.plots import ENGINE_COLORS, short_layer_names
from opendpu.runtime.profile import COLUMNS, PLOT_FORMATS, TOTAL_SUFFIX, profile_graph
from opendpu.isa.fields import Engine
from opendpu.sim.timing import simulate

from conftest import MODEL_NAMES, model_path

ENGINES = tuple(e.name for e in Engine)     # engine names in numbering order


@pytest.fixture(scope="module")
def mnist_profile():
    return profile_graph(Graph.load(model_path("dpu_mnist_classifier")), model="mnist")


@pytest.fixture(scope="module")
def yolox512_profile():
    return profile_graph(Graph.load(model_path("yolox_nano_b512")), model="yolox_nano_b512.xmodel")


def test_mnist_profile_rows_sum_and_bytes(mnist_profile):
    p = mnist_profile
    (sp,) = p.subgraphs
    s = sp.schedule
    assert sum(ly.cycles for ly in sp.layers) == s.total_cycles
    assert [ly.name for ly in sp.layers] == ["subgraph_quant_conv2d", "subgraph_quant_dense(TransferMatMulToConv2d)",
                                            "subgraph_quant_dense_1(TransferMatMulToConv2d)"]
    # WL from the xmodel's child `workload` attributes; LdWB = bytes LOADed from the CONST register
    assert [ly.workload for ly in sp.layers] == [432640, 1384576, 2570]
    assert sp.ld_wb == 693_962 and sum(ly.ld_wb for ly in sp.layers) == 693_962
    assert sp.st_fm == 10                      # one SAVE of 10 int8 logits
    assert sum(ly.instructions for ly in sp.layers) == 230
    assert sp.attribution_quality() == {"compute_ops": 4, "matched": 4}
    # per layer, the weights+bias its LOADs bring in, by hand from the network: conv 3*3*1*32 + 32 bias,
    # dense (13*13*32 = 5408 inputs) * 128 + 128, dense_1 128 * 10 + 10
    assert [ly.ld_wb for ly in sp.layers] == [3 * 3 * 32 + 32, 5408 * 128 + 128, 128 * 10 + 10]
    rows = p.rows()
    assert len(rows) == 4 and rows[-1]["level"] == "subgraph"
    r = rows[-1]
    assert r["rt_ms"] == pytest.approx(s.total_cycles / 300e3)
    assert r["perf_gops"] == pytest.approx(r["wl_gop"] / (r["rt_ms"] / 1e3))
    assert r["avgbw_mbs"] == pytest.approx((693_962 + sp.ld_fm + 10) / 2**20 / (r["rt_ms"] / 1e3))


def test_mnist_table_and_files(mnist_profile, tmp_path):
    p = mnist_profile
    t = p.table()
    assert ("DPU Id | Bat | SubGraph | WL(GOP) | RT(ms) | Perf(GOP/s) | LdWB(MB) | LdFM(MB) | StFM(MB) | "
            "AvgBw(MB/s)") in t
    body = [ln for ln in t.splitlines() if ln.startswith("DPUCZDX8G_1 | 1 | ")]
    assert len(body) == 4
    assert "~0~" in t                                   # tiny values print as vaitrace does
    p.write_csv(tmp_path / "p.csv")
    with open(tmp_path / "p.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 4
    p.write_json(tmp_path / "p.json")
    d = json.loads((tmp_path / "p.json").read_text())
    assert d["total_cycles"] == p.total_cycles and d["subgraphs"][0]["ddr_bytes"]["read"]["REG_0"] == 693_962
    p.plot(tmp_path / "u.png")
    assert (tmp_path / "u.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mnist_trace_one_track_per_engine(mnist_profile):
    p = mnist_profile
    tr = p.trace()
    ev = tr["traceEvents"]
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"LOAD", "SAVE", "CONV", "MISC"} <= names
    s = p.subgraphs[0].schedule
    xs = [e for e in ev if e["ph"] == "X" and e["tid"] > 0]
    assert len(xs) == len(s)
    by_index = {e["args"]["index"]: e for e in xs}
    for i in (0, 100, 229):
        assert by_index[i]["ts"] == pytest.approx(s.start[i] / 300.0)
        assert by_index[i]["dur"] == pytest.approx((s.end[i] - s.start[i]) / 300.0)
    # the layer track covers the run exactly
    lay = [e for e in ev if e["ph"] == "X" and e["tid"] == 0]
    assert sum(e["dur"] for e in lay) == pytest.approx(s.total_cycles / 300.0)


def test_cli_profile_and_run_cycles(mnist_path, tmp_path, capsys):
    tr = tmp_path / "t.json"
    assert main(["profile", mnist_path, "--clock-mhz", "150", "--trace", str(tr), "--csv", str(tmp_path / "p.csv"),
                 "--plot", str(tmp_path / "p.png"), "--timing", "ddr_latency=60"]) == 0
    out = capsys.readouterr().out
    assert "DPU Summary:" in out and "at 150 MHz" in out
    json.loads(tr.read_text())
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28, 1), np.float32))
    assert main(["run", mnist_path, "-i", str(x)]) == 0
    out = capsys.readouterr().out
    g = Graph.load(mnist_path)
    d = DpuSubgraph(g, dpu_subgraphs(g)[0])
    s = simulate(d.arrays, d.target)
    assert f"{s.total_cycles} cycles = {s.total_cycles / 300e3:.3f} ms at 300 MHz" in out
    # bad overrides are named
    assert main(["profile", mnist_path, "--timing", "ddr_lat=3"]) == 2
    assert "--timing ddr_lat: unknown timing parameter" in capsys.readouterr().err
    assert main(["profile", mnist_path, "--trace", str(tmp_path / "no" / "such" / "dir.json")]) == 2
    assert "--trace " in (err := capsys.readouterr().err) and "no/such does not exist" in err
    assert main(["profile", mnist_path, "--target", "B512"]) == 2
    assert "VART_GRAPH_FINGERPRINT_ERROR" in capsys.readouterr().err


def test_yolox_two_configurations(yolox512_profile):
    p512 = yolox512_profile
    p4096 = profile_graph(Graph.load(model_path("yolox_nano_b4096")))
    (a,), (b,) = p512.subgraphs, p4096.subgraphs
    assert [ly.name for ly in a.layers] == [ly.name for ly in b.layers]        # same network
    assert a.workload == b.workload
    assert a.cycles > b.cycles                                                 # 8x less compute
    for sp, p in ((a, p512), (b, p4096)):
        assert sum(ly.cycles for ly in sp.layers) == sp.cycles
        q = sp.attribution_quality()
        assert q["matched"] >= 0.95 * q["compute_ops"]
        busy = sp.schedule.engine_busy()
        assert all(sp.cycles >= v for v in busy.values()) and sp.cycles <= sp.schedule.cost.sum()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_layer_weight_bytes_equal_the_const_tensors(name):
    """Independent check of attribution and LOAD byte counting: each layer's LdWB equals the bytes of
    the int8 const tensors (weights, bias) of its child subgraph in the xmodel."""
    g = Graph.load(model_path(name))
    off = 0
    for sp in profile_graph(g).subgraphs:
        total = 0
        for ly in sp.layers:
            want = sum(int(np.prod(g.ops[o].output.shape)) for o in ly.ops if g.ops[o].type == "const-fix")
            off += ly.ld_wb != want
            total += want
        assert sp.ld_wb == total
    # YOLOX B512: the two layers among the 3 approximately attributed ops (closing note) swap weights
    assert off == (2 if name == "yolox_nano_b512" else 0)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_timed_functional_equals_executor_on_every_model(name):
    """Functional results under the cycle model's start order are byte-identical to program order."""
    g = Graph.load(model_path(name))
    for sg in dpu_subgraphs(g):
        d = DpuSubgraph(g, sg)
        rng = np.random.default_rng(7)
        ins = [rng.integers(-128, 128, s.dims, dtype=np.int8) for s in d.inputs]
        ref = d.new_machine()
        for r in d.reg_sizes:
            if d.reg_context.get(r) != "CONST":
                ref.ddr(r)[...] = 0
        d.write_inputs(ref, ins)
        ref.run(d.arrays)
        m = d.new_machine()
        out = d.run_sim(ins, machine=m)                     # timed order
        s = d.last_schedule
        assert s is not None and s.complete
        assert np.array_equal(m._ddr, ref._ddr) and np.array_equal(m.banks, ref.banks)
        assert all(np.array_equal(a, b) for a, b in zip(out, d.read_outputs(ref)))
        # DDR traffic of the timing kernel == the executor's own byte counters
        assert s.ddr_bytes() == {"read": ref.stats["load_bytes"], "write": ref.stats["save_bytes"]}
        busy = s.engine_busy()
        assert all(s.total_cycles >= v for v in busy.values())
        # upper bound: the costs plus the fetch/dispatch allowance of docs/microarchitecture.md §4
        words = {"LOAD": 5, "SAVE": 5, "CONV": 5, "CONVINIT": 4, "ALUINIT": 6, "ALU": 5, "ELEWINIT": 3, "ELEW": 3,
                 "END": 1}
        allowance = d.target.timing.fetch_latency + sum(words[i.op] for i in d.instructions) + 2 * len(s)
        assert s.total_cycles <= s.cost.sum() + allowance
        if len(s) > 100:
            assert s.total_cycles <= s.cost.sum()


def test_sweep_timing_parameters(mnist_path, tmp_path, capsys):
    from opendpu.sim.sweep import parse_axis, sweep
    d = DpuSubgraph(Graph.load(mnist_path), dpu_subgraphs(Graph.load(mnist_path))[0])
    rows = sweep([d.arrays], d.target, {"ddr_latency": [0, 60], "clock_mhz": [300.0, 150.0]})
    assert [(r["ddr_latency"], r["clock_mhz"]) for r in rows] == [(0, 300.0), (0, 150.0), (60, 300.0), (60, 150.0)]
    # the program is LOAD-bound: each of its 202 LOADs (and the SAVE) carries the DDR latency once, so
    # going from 0 to 60 cycles adds at most 203*60 cycles and most of it
    diff = rows[2]["total_cycles"] - rows[0]["total_cycles"]
    assert 0.9 * 202 * 60 < diff <= 203 * 60
    assert rows[1]["latency_ms"] == pytest.approx(2 * rows[0]["latency_ms"])       # half the clock
    assert rows[0]["ddr_read_bytes"] == 693_962 + 2_184
    assert parse_axis("clock_mhz=200,250") == ("clock_mhz", [200.0, 250.0])
    with pytest.raises(ValueError, match="not a timing parameter"):
        parse_axis("pp=4,8")
    assert main(["sweep", mnist_path, "--param", "queue_depth=1,8", "--csv", str(tmp_path / "s.csv")]) == 0
    with open(tmp_path / "s.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
    assert main(["sweep", mnist_path]) == 2
    assert "give at least one --param" in capsys.readouterr().err


# ---- per-layer spans, bounding engines, fps, row names ---------------------------------------------------
_PRIO = ("CONV", "MISC", "LOAD", "SAVE")     # the charging priority, also the bounding engine's tie order


def _busy_per_cycle(s) -> np.ndarray:
    """[4, total_cycles] bool: engine e executes an instruction in cycle c (from start/end only)."""
    total = s.total_cycles
    d = np.zeros((len(ENGINES), total + 1), np.int64)
    np.add.at(d, (s.engine, np.clip(s.start, 0, total)), 1)
    np.add.at(d, (s.engine, np.clip(s.end, 0, total)), -1)
    return np.cumsum(d, axis=1)[:, :total] > 0


def _bound_from(busy_cycles: np.ndarray) -> str:
    best = max(busy_cycles)
    return next(n for n in _PRIO if busy_cycles[ENGINES.index(n)] == best)


def test_mnist_spans_and_bounding_engine_by_brute_force(mnist_profile):
    """Every cycle's layer, recomputed cycle by cycle: the layer of the active instructions of the highest
    priority engine (CONV > MISC > LOAD > SAVE); an idle cycle goes to the next instruction to start."""
    (sp,) = mnist_profile.subgraphs
    s, lay = sp.schedule, sp.layer_of
    total = s.total_cycles
    c = np.arange(total)[:, None]
    active = (s.start[None, :] <= c) & (c < s.end[None, :])            # [cycles, instructions]
    want = np.full(total, -1)
    for name in _PRIO[::-1]:                                           # lowest priority first, overwritten
        m = active & (s.engine == ENGINES.index(name))[None, :]
        rows = np.nonzero(m.any(axis=1))[0]
        layers_seen = [set(lay[np.nonzero(m[r])[0]]) for r in rows]
        assert all(len(x) == 1 for x in layers_seen)                   # no ambiguous cycle in this program
        want[rows] = [x.pop() for x in layers_seen]
    idle = np.nonzero(want < 0)[0]
    nxt = np.array([np.nonzero(s.start >= t)[0][np.argmin(s.start[s.start >= t])] for t in idle], int)
    want[idle] = lay[nxt]
    got = np.full(total, -1)
    for li in range(len(sp.layers)):
        for a, b in sp.layer_runs(li):
            assert (got[a:b] < 0).all()
            got[a:b] = li
    assert np.array_equal(got, want)
    busy = _busy_per_cycle(s)
    bounds = [_bound_from(busy[:, want == li].sum(axis=1)) for li in range(len(sp.layers))]
    assert sp.bounding_engines() == bounds == ["LOAD", "LOAD", "LOAD"]   # MNIST streams its weights
    assert [r["bound"] for r in mnist_profile.rows()] == bounds + ["LOAD"]


def test_fps_and_rows_named_apart_from_the_subgraph_total(mnist_profile, tmp_path):
    p = mnist_profile
    (sp,) = p.subgraphs
    assert p.fps == pytest.approx(1000.0 / p.total_ms) and p.fps == pytest.approx(300e3 / sp.cycles * 1000)
    last = p.table().splitlines()[-1]
    assert last == (f"Total DPU time: {sp.cycles} cycles = {p.total_ms:.3f} ms at 300 MHz for one batch "
                    f"(1 DPU subgraph(s)) = {1000.0 / p.total_ms:.1f} fps")
    assert p.to_dict()["fps"] == pytest.approx(1000.0 / p.total_ms)
    # MNIST's first layer and its DPU subgraph are both `subgraph_quant_conv2d`: same vaitrace name,
    # distinct labels and levels
    rows = p.rows()
    assert rows[0]["subgraph"] == rows[-1]["subgraph"] == sp.name == "subgraph_quant_conv2d"
    assert rows[0]["label"] == sp.name and rows[-1]["label"] == sp.name + TOTAL_SUFFIX
    assert [r["level"] for r in rows] == ["layer"] * 3 + ["subgraph"]
    assert {r["dpu_subgraph"] for r in rows} == {sp.name}
    body = [ln.split(" | ")[2] for ln in p.table().splitlines() if ln.startswith("DPUCZDX8G_1 | 1 | ")]
    assert body == [r["label"] for r in rows] and len(set(body)) == 4
    # CSV: the old columns first, in their order, then the added ones
    assert COLUMNS[:12] == ("dpu_id", "bat", "subgraph", "level", "wl_gop", "rt_ms", "perf_gops", "ldwb_mb",
                            "ldfm_mb", "stfm_mb", "avgbw_mbs", "cycles")
    p.write_csv(tmp_path / "p.csv")
    with open(tmp_path / "p.csv") as f:
        got = list(csv.DictReader(f))
    assert [r["label"] for r in got] == body


def test_rows_unique_over_several_dpu_subgraphs():
    p = profile_graph(Graph.load(model_path("tf2_custom_op")))
    rows = p.rows()
    assert len(p.subgraphs) == 2
    assert len({r["label"] for r in rows}) == len(rows) == sum(len(sp.layers) + 1 for sp in p.subgraphs)
    for sp in p.subgraphs:
        assert any(ly.name == sp.name for ly in sp.layers)            # the collision the labels resolve
    assert p.fps == pytest.approx(1000.0 / (sum(sp.cycles for sp in p.subgraphs) / 300e3))


# ---- figures ---------------------------------------------------------------------------------------------
def _axes(fig, label):
    (ax,) = [a for a in fig.axes if a.get_label() == label]
    return ax


def _widths(coll) -> np.ndarray:
    """[k, 2] (x0, x1) of the rectangles of a broken_barh collection."""
    return np.array([[p.vertices[:, 0].min(), p.vertices[:, 0].max()] for p in coll.get_paths()])


def _no_overlap(a, b) -> bool:
    return a.x1 <= b.x0 or b.x1 <= a.x0 or a.y1 <= b.y0 or b.y1 <= a.y0


def test_yolox_b512_figure(yolox512_profile):
    p = yolox512_profile
    (sp,) = p.subgraphs
    s = sp.schedule
    n = len(sp.layers)
    per = 300e3                                                     # cycles per ms (the figure is in ms)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = p.figure()
        ren = fig.canvas.get_renderer()
    assert {a.get_label() for a in fig.axes} == {"layers:0", "lanes:0", "bars:0"}
    # one lane per engine, each drawing exactly the engine's busy cycles
    lanes = _axes(fig, "lanes:0")
    lane = {c.get_gid(): c for c in lanes.collections if (c.get_gid() or "").startswith("lane:")}
    assert sorted(lane) == sorted(f"lane:{e}" for e in ENGINES)
    assert [t.get_text().split()[0] for t in lanes.get_yticklabels()] == list(ENGINES)
    busy = _busy_per_cycle(s)
    for e, name in enumerate(ENGINES):
        w = _widths(lane[f"lane:{name}"])
        assert (w[:, 1] - w[:, 0]).sum() * per == pytest.approx(busy[e].sum(), rel=1e-9)
    # one band per layer, covering exactly the cycles charged to it; together they tile the run
    strip = _axes(fig, "layers:0")
    bands = {c.get_gid(): c for c in strip.collections if (c.get_gid() or "").startswith("layer-band:")}
    assert len(bands) == n
    owner = np.full(s.total_cycles, -1)
    for li in range(n):
        w = np.rint(_widths(bands[f"layer-band:{li}"]) * per).astype(int)
        assert (w[:, 1] - w[:, 0]).sum() == sp.layers[li].cycles
        for a, b in w:
            assert (owner[a:b] < 0).all()
            owner[a:b] = li
    assert (owner >= 0).all()
    # band labels sit inside their band and never overlap each other
    labels = [t for t in strip.texts if (t.get_gid() or "").startswith("layer-label:")]
    assert 20 <= len(labels) <= n
    boxes = [t.get_window_extent(ren) for t in labels]
    assert all(_no_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    # one bar per layer, in order, as long as its cycles, coloured by the bounding engine recomputed
    # here from the schedule and the bands
    bars = _axes(fig, "bars:0")
    rects = [r for r in bars.patches if (r.get_gid() or "").startswith("layer-bar:")]
    assert [r.get_gid() for r in rects] == [f"layer-bar:{li}" for li in range(n)]
    assert [r.get_width() * per for r in rects] == pytest.approx([ly.cycles for ly in sp.layers])
    want = [_bound_from(busy[:, owner == li].sum(axis=1)) for li in range(n)]
    assert want == sp.bounding_engines()
    for r, b in zip(rects, want):
        assert np.allclose(r.get_facecolor(), to_rgba(ENGINE_COLORS[b]))
    counts = {e: want.count(e) for e in ENGINES}
    assert max(counts, key=counts.get) == "CONV"
    # the legend names the engines, outside the axes
    leg = bars.get_legend()
    assert [t.get_text() for t in leg.get_texts()] == [f"{e}: {counts[e]} layer(s)" for e in ENGINES]
    assert leg.get_window_extent(ren).x0 >= bars.get_window_extent(ren).x1
    # titles: wrapped, never truncated
    texts = [fig._suptitle.get_text()] + [t.get_text() for t in fig.texts]
    flat = ["".join(t.split()) for t in texts]
    assert any(sp.name in f and sp.target.name in f and "22959instructions" in f for f in flat)
    assert any("yolox_nano_b512.xmodel" in f and f"{p.fps:.1f}fps" in f for f in flat)
    assert not any("…" in t for t in texts)
    top = fig.get_window_extent(ren)
    for t in [fig._suptitle] + list(fig.texts):
        bb = t.get_window_extent(ren)
        assert top.x0 <= bb.x0 and bb.x1 <= top.x1                    # wrapped inside the figure width


def test_figure_of_two_dpu_subgraphs_and_formats(tmp_path):
    p = profile_graph(Graph.load(model_path("tf2_custom_op")))
    fig = p.figure()
    labels = sorted(a.get_label() for a in fig.axes)
    assert labels == ["bars:0", "bars:1", "lanes:0", "lanes:1", "layers:0", "layers:1"]
    for k, sp in enumerate(p.subgraphs):
        bars = _axes(fig, f"bars:{k}")
        assert sum(1 for r in bars.patches if (r.get_gid() or "").startswith("layer-bar:")) == len(sp.layers)
        assert sum(1 for c in _axes(fig, f"layers:{k}").collections
                   if c.get_gid().startswith("layer-band:")) == len(sp.layers)
    assert PLOT_FORMATS == ("png", "svg", "pdf")
    heads = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF"}
    for fmt in PLOT_FORMATS:
        f = tmp_path / f"p.{fmt.upper() if fmt == 'pdf' else fmt}"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            p.plot(f)
        data = f.read_bytes()
        assert data.startswith(heads[fmt]) if fmt in heads else b"<svg" in data[:2000]
    for bad, named in (("p.jpg", ".jpg"), ("p.png.txt", ".txt"), ("plot", "(none)")):
        with pytest.raises(ValueError, match=f"unsupported suffix {named}".replace("(", r"\(").replace(")", r"\)")):
            p.plot(tmp_path / bad)
        assert not (tmp_path / bad).exists()


def test_short_layer_names():
    yolox = ["subgraph_YOLOX__YOLOX_YOLOPAFPN_backbone__CSPDarknet_backbone__Sequential_dark2__Q_CSPLayer_1__"
             "BaseConv_conv1__Conv2d_conv__input_21",
             "subgraph_YOLOX__YOLOX_YOLOPAFPN_backbone__Q_CSPLayer_C3_n4__BaseConv_conv3__Conv2d_conv__input_447",
             "subgraph_YOLOX__YOLOX_YOLOXHead_head__Conv2d_obj_preds__ModuleList_2__25540"]
    assert short_layer_names(yolox) == ["backbone.backbone.dark2.1.conv1.conv.input_21",
                                        "backbone.C3_n4.conv3.conv.input_447", "head.obj_preds.2.25540"]
    assert short_layer_names(["subgraph_quant_conv2d", "subgraph_quant_dense(TransferMatMulToConv2d)"]) == \
        ["quant_conv2d", "quant_dense(TransferMatMulToConv2d)"]
    long = short_layer_names(["subgraph_" + "a" * 50 + "__" + "b" * 50])[0]
    assert len(long) == 64 and long.startswith("a" * 21) and long.endswith("b" * 42) and "…" in long
