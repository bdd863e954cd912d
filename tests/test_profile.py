"""Profiler (runtime/profile.py) and the cycle model on every shared model."""
import csv
import json

import numpy as np
import pytest

from compiler.xir.graph import Graph
from runtime.cli import main
from runtime.dpu import DpuSubgraph, dpu_subgraphs
from runtime.profile import COLUMNS, profile_graph
from sim.timing import simulate

from conftest import MODEL_NAMES, model_path


@pytest.fixture(scope="module")
def mnist_profile():
    return profile_graph(Graph.load(model_path("dpu_mnist_classifier")), model="mnist")


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
    assert "DPU Id | Bat | SubGraph | WL(GOP) | RT(ms) | Perf(GOP/s) | LdWB(MB) | LdFM(MB) | StFM(MB) | AvgBw(MB/s)" in t
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
    assert "unknown timing parameter(s) ['ddr_lat']" in capsys.readouterr().err
    assert main(["profile", mnist_path, "--trace", str(tmp_path / "no" / "such" / "dir.json")]) == 2
    assert "cannot write the Perfetto trace to" in capsys.readouterr().err
    assert main(["profile", mnist_path, "--target", "B512"]) == 2
    assert "VART_GRAPH_FINGERPRINT_ERROR" in capsys.readouterr().err


def test_yolox_two_configurations():
    p512 = profile_graph(Graph.load(model_path("yolox_nano_b512")))
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
    from sim.sweep import parse_axis, sweep
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
