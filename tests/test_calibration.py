"""Calibration (issue 16, docs/calibration.md): UG1414 row mapping and scores, board profiles, the multi-core
throughput model, with hand-computed values; and the compiled Caffe ResNet-50 on B4096 against UG1414's table."""
import math

import numpy as np
import pytest

from opendpu.isa.boards import BOARDS, get_board
from opendpu.isa.target import TargetError, get_target
from opendpu.runtime import calibration as cal
from opendpu.sim.multicore import throughput


def test_ug1414_table_transcribed():
    rows = cal.UG1414_RESNET50
    assert len(rows) == 55 and len({r[0] for r in rows}) == 55
    # the figures UG1414 prints for the whole table (sums of the columns as printed)
    assert sum(r[2] for r in rows) == pytest.approx(17.769, abs=1e-9)
    assert sum(r[1] for r in rows) == pytest.approx(6.981, abs=1e-9)
    # LdWB of a 3x3x512x512 layer is its weights in MiB; fc1000's 2048x1000 weights 1.953 MiB + bias
    assert dict((r[0], r[3]) for r in rows)["res5a_branch2b"] == 3 * 3 * 512 * 512 / 2 ** 20
    assert dict((r[0], r[3]) for r in rows)["fc1000_bias"] == pytest.approx(2048 * 1000 / 2 ** 20, abs=0.002)


def test_ug1414_fig34_is_parameters_and_maps_once():
    """UG1414's newer DPU Summary (Figure 34): every subgraph's Mem IO is, to the printed 0.001 MB of 10^6 bytes,
    its weights and biases plus its input (and residual) map loaded once and its output stored once, by the
    network's arithmetic; this includes res2c_branch2a, res3b/res3d_branch2a, res2b/res2c and res4a, where the
    older Figure 37 shows about 0.0205 MB more LdWB than the weights."""
    rows = cal.UG1414_FIG34
    assert len(rows) == 31 and len({r[0] for r in rows}) == 31
    for name, _, wl, memio in rows:
        io = cal.fig34_io(name)
        assert abs(sum(io) / 1e6 - memio) <= 0.0005, (name, io, memio)
    # by hand: res3b_branch2a, a 1x1 512 -> 128 conv on 28x28: 65,536 + 128 parameter bytes, 28·28·512 in, ·128 out
    assert cal.fig34_io("res3b_branch2a") == (65_664, 401_408, 100_352)
    # res4a (branch1 512 -> 1024 and the add): the 14x14x512 downsampled input and branch2c's output are read
    assert cal.fig34_io("res4a") == (525_312, 14 * 14 * (512 + 1024), 14 * 14 * 1024)
    assert cal.fig34_io("fake_downsample_3") == (0, 28 * 28 * 256, 28 * 28 * 256)
    with pytest.raises(ValueError, match="'pool5' is not a Figure 34 subgraph"):
        cal.fig34_io("pool5")


def _fig34_rows(scale=1.0, fuse=False):
    """Synthetic profile rows: one layer per conv of Figure 34's rows with LdWB = its parameters x `scale`."""
    rows, ops = [], {}
    for name, *_ in cal.UG1414_FIG34:
        p = cal.fig34_io(name)[0]
        if not p:
            continue
        conv = name if "branch" in name else name + ("_branch1" if name.endswith("a") else "_branch2c")
        rows.append({"level": "layer", "subgraph": "subgraph_" + conv, "ldwb_mb": p * scale / 2 ** 20})
        ops["subgraph_" + conv] = [conv, conv + "_relu"]
    if fuse:                                             # res2c_branch2a and _branch2b as one layer
        rows = [r for r in rows if r["subgraph"] != "subgraph_res2c_branch2b"]
        rows[[r["subgraph"] for r in rows].index("subgraph_res2c_branch2a")]["ldwb_mb"] = (16_448 + 36_928) / 2 ** 20
        ops["subgraph_res2c_branch2a"] = ["res2c_branch2a", "res2c_branch2b"]
    return rows, ops


def test_compare_fig34_by_hand():
    cmp = cal.compare_fig34(*_fig34_rows())
    assert len(cmp) == 27 and all(c.ok for c in cmp)                # the 4 fake_downsample rows have no parameters
    assert max(abs(c.amd_ldwb - c.params) for c in cmp) <= 500       # Mem IO printed to 1,000 bytes
    assert not any(c.ok for c in cal.compare_fig34(*_fig34_rows(1.06)))
    assert all(c.ok for c in cal.compare_fig34(*_fig34_rows(1.04)))
    fused = cal.compare_fig34(*_fig34_rows(fuse=True))
    g = next(c for c in fused if c.rows == 2)
    assert g.name == "res2c_branch2a + res2c_branch2b" and g.params == 16_448 + 36_928 and g.ok
    assert "LdWB within 5 %: 27/27 rows" in cal.format_fig34(cmp)


def test_fig34_rt_rows_by_hand():
    """The Figure 37 rows Figure 34 lists as the same computation: 21 (res2b; stage 3 but res3d; stage 4's a-c),
    not the blocks whose downsample is back-propagated (res2c, res3d)."""
    rows = cal.fig34_rt(cal.compare_resnet50(_rows(rt=0.3)))
    assert [n for n, _, _ in rows] == ["res2b", "res3a_branch2a", "res3a_branch2b", "res3a_branch2c", "res3a",
                                       "res3b_branch2a", "res3b_branch2b", "res3b", "res3c_branch2a", "res3c_branch2b",
                                       "res3c", "res4a_branch2a", "res4a_branch2b", "res4a_branch2c", "res4a",
                                       "res4b_branch2a", "res4b_branch2b", "res4b", "res4c_branch2a",
                                       "res4c_branch2b", "res4c"]
    assert rows[5] == ("res3b_branch2a", 0.216, 0.3)


@pytest.mark.parametrize("layer,row", [
    ("subgraph_conv1", "conv1"), ("pool1", "conv1"), ("res2a_branch2a", "res2a_branch2a"),
    ("res2a_branch2c", "res2a_branch2c"), ("res2a_branch1", "res2a"), ("res2a", "res2a"),
    ("res2b_branch2c", "res2b"), ("res2b", "res2b"), ("res3a_branch2c", "res3a_branch2c"),
    ("res2c_branch2b", "res2c_branch2b_bias"), ("res2c_branch2c", "res2b_downsample_bp_by_fake_downsample_0"),
    ("res2c", "res2b_downsample_bp_by_fake_downsample_0"), ("res4f_branch2a", "res4f_branch2a"),
    ("res4f", "res4e_downsample_bp_by_fake_downsample_2"), ("res5c", "res5c"), ("res5c_branch2b", "res5c_branch2b"),
    ("pool5", "pool5"), ("fc1000", "fc1000_bias"), ("flatten", None), ("res6a", None),
    ("res2b_downsample_bp", "res2b_downsample_bp_by_fake_downsample_0"),
    ("res4e_downsample_bp", "res4e_downsample_bp_by_fake_downsample_2"), ("res4d_downsample_bp", None)])
def test_ug1414_row_mapping(layer, row):
    assert cal.ug1414_row(layer) == row


def _rows(rt=1.0, ldwb=None):
    """Synthetic profile rows: one layer per UG1414 row (its first layer name), AMD's LdWB unless given."""
    first = {}
    for blk in [f"res{s}{c}" for s, n in ((2, 3), (3, 4), (4, 6), (5, 3)) for c in "abcdef"[:n]]:
        for br in ("_branch1", "_branch2a", "_branch2b", "_branch2c", ""):
            r = cal.ug1414_row(blk + br)
            first.setdefault(r, blk + br)
    first.update({"conv1": "conv1", "pool5": "pool5", "fc1000_bias": "fc1000"})
    return [{"level": "layer", "subgraph": "subgraph_" + first[n], "wl_gop": wl, "rt_ms": rt,
             "ldwb_mb": ld if ldwb is None else ldwb, "ldfm_mb": fm, "stfm_mb": st}
            for n, wl, _, ld, fm, st in cal.UG1414_RESNET50]


def test_compare_and_score_by_hand():
    cmp = cal.compare_resnet50(_rows(rt=0.3))
    assert [c.name for c in cmp] == [r[0] for r in cal.UG1414_RESNET50]
    s = cal.score(cmp)
    # RT 0.3 ms against each published RT: within 25 % when 0.24 <= RT_amd <= 0.4 (0.3 / 1.25 .. 0.3 / 0.75)
    want = sum(1 for r in cal.UG1414_RESNET50 if abs(0.3 / r[2] - 1) <= 0.25)
    assert s["rt_within"] == want and s["rows"] == 55
    assert s["total_rt_ms"] == pytest.approx(55 * 0.3)
    assert s["total_rt_err_pct"] == pytest.approx(100 * (16.5 / 17.769 - 1))
    assert s["ldwb_within_5pct"] == 55
    # LdWB 0.5 MB everywhere: only res5a_branch2a (0.500) is within 5 % (pool5 prints 0)
    assert cal.score(cal.compare_resnet50(_rows(ldwb=0.5)))["ldwb_within_5pct"] == \
        sum(1 for r in cal.UG1414_RESNET50 if r[3] >= 0.001 and abs(0.5 / r[3] - 1) <= 0.05) == 1
    # the overhead is added once per UG1414 row
    assert cal.score(cal.with_overhead(cmp, 0.1))["total_rt_ms"] == pytest.approx(55 * 0.4)


def test_best_overhead_recovers_a_constant():
    """Rows whose RT is AMD's minus 0.12 ms (where positive) are best explained by a 0.12 ms overhead."""
    rows = _rows()
    for r, (_, _, rt, *_rest) in zip(rows, cal.UG1414_RESNET50):
        r["rt_ms"] = max(rt - 0.12, 0.0)
    assert cal.best_overhead(cal.compare_resnet50(rows)) == pytest.approx(0.12)


def test_compare_refuses_other_models():
    with pytest.raises(ValueError, match="no UG1414 ResNet-50 row"):
        cal.compare_resnet50([{"level": "layer", "subgraph": "layer1.0.conv1", "wl_gop": 0.1, "rt_ms": 0.1,
                               "ldwb_mb": 0, "ldfm_mb": 0, "stfm_mb": 0}])
    with pytest.raises(ValueError, match="no layer of ours for UG1414 row"):
        cal.compare_resnet50(_rows()[:-1])


def test_boards():
    assert set(BOARDS) == {"zcu102", "zcu104", "kv260", "kr260"}
    t = get_board("ZCU102").target()
    assert t.name.endswith("B4096") and t.timing.cores == 3 and t.timing.clock_mhz == 281.0
    assert t.timing.board_ddr_mbps == 19200 and get_board("zcu104").target().timing.cores == 2
    assert get_board("kv260").target("DPUCZDX8G_ISA1_B4096").timing.cores == 1
    with pytest.raises(TargetError, match="unknown board 'zcu999'; known: zcu102"):
        get_board("zcu999")
    # a board gives its timing to any array (the rule of `sweep`): a B512 on a ZCU102 keeps its array
    t = get_board("zcu102").target("DPUCZDX8G_ISA1_B512")
    assert (t.name, t.pp, t.cp, t.timing.cores, t.timing.clock_mhz) == ("DPUCZDX8G_ISA1_B512", 4, 8, 3, 281.0)
    assert (t.timing.ddr_latency, t.timing.conv_latency, t.timing.weight_load_lines) == (30, 16, 2)
    # the host side: four A53 threads, at 1,200 MHz on the ZCU102 / ZCU104 and 1,333 MHz on the K26 SOM boards
    assert (t.timing.cpu_threads, t.timing.cpu_mhz, get_board("kv260").target().timing.cpu_mhz) == (4, 1200, 1333)
    # UG1414's Figure 37 is an older core: its timing is kept apart (a CONV pipeline fill and drain of 128)
    from opendpu.isa.boards import UG1414_DPU_TIMING
    assert UG1414_DPU_TIMING == {"ddr_latency": 30, "conv_latency": 128, "weight_load_lines": 2}
    z = get_board("zcu102")
    assert not z.ships(get_target("DPUCZDX8G_ISA1_B512")) and z.ships(get_target("DPUCZDX8G_ISA1_B4096"))
    assert z.applied_to([get_target("DPUCZDX8G_ISA1_B512")]) == (
        "board zcu102: timing of the board applied to the program's DPUCZDX8G_ISA1_B512 array (the board ships "
        "DPUCZDX8G_ISA1_B4096)")
    assert z.applied_to([get_target("DPUCZDX8G_ISA1_B4096")]) == (
        "board zcu102: timing of the board applied to the program's DPUCZDX8G_ISA1_B4096 array, the board's own")


def test_throughput_by_hand():
    t = get_target("DPUCZDX8G_ISA1_B4096").with_timing(clock_mhz=200.0, cores=4, board_ddr_mbps=10000,
                                                      ddr_efficiency_pct=50, frame_overhead_us=500)
    # 1,000,000 cycles at 200 MHz = 5 ms + 0.5 ms host per frame: 4 cores -> 4 / 5.5 ms = 727.27 fps;
    # DDR: 5,000 MB/s effective / 10 MB per frame = 500 fps -> DDR-bound at 500
    tp = throughput(1_000_000, 10_000_000, t)
    assert tp.fps_compute == pytest.approx(4 / 5.5e-3) and tp.fps_ddr == pytest.approx(500.0)
    assert tp.fps == pytest.approx(500.0) and tp.ddr_bound and tp.ddr_mbps == pytest.approx(5000.0)
    assert tp.latency_ms == pytest.approx(5.5)
    # two DPU runs per frame pay the host overhead twice; 1 MB per frame leaves the DDR far from saturation
    tp2 = throughput(1_000_000, 1_000_000, t, runs=2)
    assert tp2.fps == pytest.approx(4 / 6e-3) and not tp2.ddr_bound
    # no board: no DDR bound
    assert math.isinf(throughput(1000, 10 ** 9, get_target("DPUCZDX8G_ISA1_B512")).fps_ddr)


# ---- opendpu profile --board / --roofline / --compare ---------------------------------------------------------
def _board_fps_by_hand(cycles: int, runs: int, io_bytes: int, board) -> tuple[float, float]:
    """(single-thread, multi-thread) fps of a frame far from the DDR roof, from the board's constants: DPU time and
    the runs' overheads on a core; the host work (fixed + per byte, at 1,200 MHz, scaled to the board's CPU) in
    series for one thread; the cores or the CPU threads (host + overheads, times the load factor) for many."""
    from opendpu.isa import boards as B
    host = (B.HOST_FRAME_US + B.HOST_US_PER_MB * io_bytes / 1e6) * 1200 / board.cpu_mhz * 1e-6
    dpu = cycles / (board.clock_mhz * 1e6) + runs * B.FRAME_OVERHEAD_US * 1e-6
    cpu = (host + runs * B.FRAME_OVERHEAD_US * 1e-6) * B.HOST_LOAD_PCT / 100
    return 1 / (dpu + host), min(board.cores / dpu, B.CPU_THREADS / cpu)


def _cli():
    from opendpu.runtime.cli import main
    return main


def test_profile_board_roofline_and_side_by_side(tmp_path, capsys):
    import csv

    from conftest import model_path

    from opendpu.compiler.pipeline import compile as compile_graph
    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    from opendpu.runtime.profile import profile_graph
    amd = model_path("dpu_mnist_classifier")                      # B4096, the boards' array
    g = Graph.load(amd)
    t = DpuSubgraph(g, dpu_subgraphs(g)[0]).target
    ours = tmp_path / "ours.xmodel"
    compile_graph(g, t, recompile=True, name="ours").graph.save(str(ours))
    main = _cli()
    roof, side = tmp_path / "roof.png", tmp_path / "side.csv"
    assert main(["profile", str(ours), "--board", "zcu102", "--roofline", str(roof), "--compare", amd,
                 "--compare-csv", str(side)]) == 0
    out = capsys.readouterr().out
    # the board lines: 3 cores at 281 MHz with the board's calibrated DPU timing; by hand from the board's constants
    # (sim/multicore.py's model written out): MNIST is far from the DDR roof
    from opendpu.isa.boards import DPU_TIMING
    from opendpu.runtime.profile import host_io_bytes
    board_timing = {"clock_mhz": 281.0, **DPU_TIMING}
    prof = profile_graph(Graph.load(str(ours)), timing=board_timing)
    st, mt = _board_fps_by_hand(prof.total_cycles, len(prof.subgraphs), host_io_bytes(Graph.load(str(ours))),
                                BOARDS["zcu102"])
    assert "board zcu102: 3 core(s) at 281 MHz" in out
    assert f"single-thread {st:.1f} fps" in out and f"multi-thread {mt:.1f} fps" in out, out[-500:]
    assert roof.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(side.open()))
    assert rows[-1]["layer"] == "(total)"
    amd_prof = profile_graph(g, timing=board_timing)
    assert int(rows[-1]["cycles_a"]) == prof.total_cycles and int(rows[-1]["cycles_b"]) == amd_prof.total_cycles
    both = [r for r in rows[:-1] if r["rt_ms_a"] and r["rt_ms_b"]]
    assert both and all(float(r["rt_ratio"]) == pytest.approx(float(r["rt_ms_b"]) / float(r["rt_ms_a"]))
                        for r in both)
    assert f"A = {ours}" in out and f"B = {amd}" in out
    assert f"{len(both)} layer(s) in both programs" in out


def test_board_timing_on_the_programs_own_array(tmp_path, capsys):
    """`profile --board kr260` of the digits CNN compiled for B1024 (the board ships B4096): the program's B1024
    array with the board's clock, host overhead and calibrated DPU timing. The fps is computed by hand from the board's
    numbers: 1 core / (cycles / 300 MHz + 1,500 us host per DPU run) (0.01 MB per frame is far below 48 % of
    19,200 MB/s); the cycles are those of the B1024 program at the board's DDR and CONV latencies and wide weight
    path, not at the defaults. `run --board` takes the same rule."""
    import re

    import numpy as np
    from compile_helpers import compiled

    from opendpu.isa.boards import DPU_TIMING
    from opendpu.isa.program import to_arrays
    from opendpu.sim.timing import simulate
    c = compiled("digits", None, "B1024")
    path = tmp_path / "b1024.xmodel"
    c.xmodel.save(str(path))
    (prog,) = c.programs.values()
    b1024 = get_target("DPUCZDX8G_ISA1_B1024")
    cycles = simulate(to_arrays(prog.instructions), b1024.with_timing(**DPU_TIMING)).total_cycles
    assert cycles != simulate(to_arrays(prog.instructions), b1024).total_cycles      # the board's DPU timing matters
    main = _cli()
    assert main(["profile", str(path), "--board", "kr260"]) == 0
    out = capsys.readouterr().out
    assert ("board kr260: timing of the board applied to the program's DPUCZDX8G_ISA1_B1024 array (the board ships "
            "DPUCZDX8G_ISA1_B4096)") in out
    assert f"on DPUCZDX8G_ISA1_B1024, {cycles} cycles" in out
    from opendpu.runtime.profile import host_io_bytes
    st, mt = _board_fps_by_hand(cycles, 1, host_io_bytes(c.xmodel), BOARDS["kr260"])
    m = re.search(r"board kr260: single-thread ([0-9.]+) fps .*; multi-thread ([0-9.]+) fps", out)
    assert m and float(m.group(1)) == pytest.approx(st, abs=0.05) and float(m.group(2)) == pytest.approx(mt, abs=0.05)
    # run: the board's clock (zcu102: 281 MHz) and DPU timing for the reported cycles, on the program's array
    np.save(tmp_path / "x.npy", np.zeros((1, 8, 8, 1), np.float32))
    assert main(["run", str(path), "-i", str(tmp_path / "x.npy"), "--board", "zcu102"]) == 0
    out = capsys.readouterr().out
    assert "board zcu102: timing of the board applied to the program's DPUCZDX8G_ISA1_B1024 array" in out
    assert f": {cycles} cycles = {cycles / 281e3:.3f} ms at 281 MHz on DPUCZDX8G_ISA1_B1024" in out


def test_profile_board_bad_input(tmp_path, capsys):
    from conftest import model_path
    main = _cli()
    amd = model_path("dpu_mnist_classifier")
    assert main(["profile", amd, "--board", "zcu999"]) == 2
    err = capsys.readouterr().err
    assert "unknown board 'zcu999'; known: zcu102, zcu104, kv260, kr260" in err and "Traceback" not in err
    import numpy as np
    np.save(tmp_path / "x.npy", np.zeros((1, 28, 28, 1), np.float32))
    assert main(["run", amd, "-i", str(tmp_path / "x.npy"), "--board", "kr999"]) == 2
    out, err = capsys.readouterr()
    assert "--board kr999: unknown board 'kr999'" in err and out == ""
    assert main(["run", amd, "-i", str(tmp_path / "x.npy"), "--board", "kr260", "--backend", "ref"]) == 2
    assert "--board apply to the timed backends (sim, rtl), not to --backend ref" in capsys.readouterr().err
    assert main(["profile", amd, "--compare-csv", str(tmp_path / "s.csv")]) == 2
    assert "--compare-csv needs --compare" in capsys.readouterr().err
    assert not (tmp_path / "s.csv").exists()


def test_a_fused_layer_groups_the_rows_it_spans():
    """Our layer holding res2a_branch2a and res2a_branch2b (fused) is compared with the sum of AMD's two rows, and
    counts as 2 rows in the score; the per-row overhead is added twice there."""
    rows = _rows(rt=0.2)
    fused = next(r for r in rows if r["subgraph"] == "subgraph_res2a_branch2a")
    rows = [r for r in rows if r["subgraph"] != "subgraph_res2a_branch2b"]
    ops = {"subgraph_res2a_branch2a": ["res2a_branch2a", "res2a_branch2b", "res2a_branch2b_relu"]}
    cmp = cal.compare_resnet50(rows, ops)
    assert len(cmp) == 54
    g = next(c for c in cmp if c.rows == 2)
    assert g.name == "res2a_branch2a + res2a_branch2b" and g.layers == [fused["subgraph"]]
    assert g.amd_rt == pytest.approx(0.189 + 0.285) and g.rt == pytest.approx(0.2)
    assert cal.score(cmp)["rows"] == 55 and cal.score(cmp)["groups"] == 54
    assert next(c for c in cal.with_overhead(cmp, 0.1) if c.rows == 2).rt == pytest.approx(0.4)
    # without the op lists the fused layer is placed by its name only: res2a_branch2b has no layer
    with pytest.raises(ValueError, match="no layer of ours for UG1414 row.s. res2a_branch2b"):
        cal.compare_resnet50(rows)


def test_profile_ddr_bytes_equal_the_executors_counts():
    """Profile.ddr_bytes (from the cycle model's per-instruction DDR traffic) equals what the functional executor
    moved running the same program (its LOAD / SAVE byte counters)."""
    import numpy as np
    from conftest import model_path

    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    from opendpu.runtime.profile import profile_graph
    g = Graph.load(model_path("dpu_mnist_classifier"))
    d = DpuSubgraph(g, dpu_subgraphs(g)[0])
    m = d.new_machine(0)
    rng = np.random.default_rng(0)
    d.run_sim([rng.integers(-128, 128, s.dims).astype(np.int8) for s in d.inputs], machine=m)
    moved = sum(m.stats["load_bytes"].values()) + sum(m.stats["save_bytes"].values())
    prof = profile_graph(g)
    assert prof.ddr_bytes == moved > 0
    tp = prof.throughput()                                  # no board: one core, no DDR bound
    assert tp.fps == pytest.approx(300e6 / prof.total_cycles) and not tp.ddr_bound


def test_compare_refuses_two_unrelated_programs(capsys):
    from conftest import model_path
    main = _cli()
    assert main(["profile", model_path("dpu_mnist_classifier"), "--compare", model_path("yolox_nano_b4096")]) == 2
    err = capsys.readouterr().err
    assert "have no layer in common: not two programs of one graph" in err and "Traceback" not in err


# ---- the board as a pipeline (issue 33, sim/multicore.py) ---------------------------------------------------------
def test_shared_ddr_by_hand():
    from opendpu.sim.multicore import shared_ddr_fps
    flat = np.full(100, 4e6 / 100)                  # 4 MB per 1 ms frame, evenly
    # 3 cores ask 12 GB/s; with 6 GB/s all slow down alike: fps = BW / bytes per frame
    assert shared_ddr_fps(flat, 1e-3, 3, 6e9) == pytest.approx(1500.0, rel=1e-6)
    assert shared_ddr_fps(flat, 1e-3, 3, 12e9) == pytest.approx(3000.0)     # exactly enough: full speed
    burst = np.r_[np.full(50, 4e6 / 50), np.zeros(50)]   # all 4 MB in the first half: 8 GB/s, then compute
    # one core with 4 GB/s: the burst takes twice as long: 1 ms + 0.5 ms per frame
    assert shared_ddr_fps(burst, 1e-3, 1, 4e9) == pytest.approx(1e3 / 1.5, rel=1e-6)
    # two cores half a frame apart never burst together: 8 GB/s is enough
    assert shared_ddr_fps(burst, 1e-3, 2, 8e9) == pytest.approx(2000.0, rel=1e-6)
    # at 6 GB/s: no better than the roofline (6 GB/s / 4 MB = 1,500 fps), no worse than both bursting together at
    # 3 GB/s each (1.333 ms + 0.5 ms per frame: 2 / 1.833 ms = 1,091 fps)
    assert 2 / 1.8333e-3 <= shared_ddr_fps(burst, 1e-3, 2, 6e9) <= 1500.0 * (1 + 1e-9)
    # three cores at 10 GB/s: between all three bursting together (10/3 GB/s each: 1.2 + 0.5 ms, 1,765 fps) and the
    # roofline (2,500 fps)
    assert 3 / 1.7e-3 <= shared_ddr_fps(burst, 1e-3, 3, 10e9) <= 2500.0


def test_pipeline_single_and_multi_thread_by_hand():
    from opendpu.sim.multicore import host_us
    t = get_target("DPUCZDX8G_ISA1_B4096").with_timing(clock_mhz=300.0, cores=2, frame_overhead_us=100,
                                                      host_frame_us=400, host_us_per_mb=2000, cpu_threads=4,
                                                      cpu_mhz=1200)
    # host: 400 us + 2000 us/MB x 0.15 MB = 700 us on one thread; DPU: 3 ms + 0.1 ms per run
    assert host_us(150_000, t) == pytest.approx(700.0)
    assert host_us(150_000, t.with_timing(cpu_mhz=1500)) == pytest.approx(700.0 * 1200 / 1500)
    tp = throughput(900_000, 1000, t, io_bytes=150_000)
    assert tp.latency_ms == pytest.approx(3.1 + 0.7) and tp.fps_single == pytest.approx(1e3 / 3.8)
    # multi-thread: 2 cores / 3.1 ms = 645 fps against 4 threads / 0.7 ms = 5,714 fps: DPU-bound
    assert tp.fps == pytest.approx(2 / 3.1e-3) and tp.bound == "dpu"
    # a small model on 3 cores: 90,000 cycles (0.3 ms) -> 3 / 0.4 ms = 7,500 fps; the CPU per frame is the host work
    # and the run's overhead, 0.8 ms: 4 / 0.8 ms = 5,000 fps; with host_load_pct 150, 4 / 1.2 ms = 3,333
    small = throughput(90_000, 1000, t.with_timing(cores=3), io_bytes=150_000)
    assert small.fps == pytest.approx(4 / 0.8e-3) and small.bound == "host"
    assert throughput(90_000, 1000, t.with_timing(cores=3, host_load_pct=150), io_bytes=150_000).fps == \
        pytest.approx(4 / 1.2e-3)
    # single-thread fps does not depend on the cores
    assert small.fps_single == pytest.approx(throughput(90_000, 1000, t, io_bytes=150_000).fps_single)


def test_profile_board_kv260_on_amd_yolox_nano_b512(capsys):
    """`opendpu profile --board kv260` of AMD's B512 YOLOX-nano program (the board ships B4096): the board's single-
    and multi-thread fps for the program's own array, as computed by hand from the board's constants."""
    from conftest import model_path

    from opendpu.compiler.xir.graph import Graph
    from opendpu.isa.boards import DPU_TIMING
    from opendpu.runtime.profile import host_io_bytes, profile_graph
    path = model_path("yolox_nano_b512")
    g = Graph.load(path)
    prof = profile_graph(g, timing={"clock_mhz": 300.0, **DPU_TIMING})
    st, mt = _board_fps_by_hand(prof.total_cycles, len(prof.subgraphs), host_io_bytes(g), BOARDS["kv260"])
    assert _cli()(["profile", path, "--board", "kv260"]) == 0
    out = capsys.readouterr().out
    assert "(the board ships DPUCZDX8G_ISA1_B4096)" in out
    assert f"single-thread {st:.1f} fps" in out and f"multi-thread {mt:.1f} fps (dpu-bound" in out, out[-400:]


def test_demand_trace_by_hand():
    """A run of 100 cycles with 100 bytes over [0, 50) and 300 over [50, 100) (and an instruction without DDR
    traffic): four bins of 25 cycles get 50, 50, 150, 150; with 100 us of overhead at 1 MHz after the run (100
    cycles without traffic) four bins of 50 get 100, 300, 0, 0."""
    from types import SimpleNamespace

    from opendpu.sim.multicore import demand_trace
    s = SimpleNamespace(total_cycles=100, ddr_read=np.array([100, 0, 200]), ddr_write=np.array([0, 0, 100]),
                        start=np.array([0, 10, 50]), end=np.array([50, 20, 100]))
    assert demand_trace([s], 1.0, 0.0, bins=4).tolist() == [50.0, 50.0, 150.0, 150.0]
    assert demand_trace([s], 1.0, 100.0, bins=4).tolist() == [100.0, 300.0, 0.0, 0.0]
    # two runs in a frame follow each other: the second's traffic lands in the second half
    assert demand_trace([s, s], 1.0, 0.0, bins=2).tolist() == [400.0, 400.0]
