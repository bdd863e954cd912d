"""Whole-core RTL tests: co-simulation against the cycle model (every DDR byte, every instruction's start,
end and retire cycle, the host counters), Verilog generation for every preset, and the simulator flows.

The reference is the cycle model of issue 3, whose functional executor is validated bit-exact on real
AMD-compiled programs and whose schedule is the max-plus solution of docs/microarchitecture.md; the RTL
shares no code with either (it is generated from the Target by hw/).
"""
import os
import shutil
import subprocess

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

import numpy as np
import pytest

from opendpu.isa.target import PRESETS, Target, get_target
from opendpu.runtime.cosim import cosim_programs, initial_machine
from opendpu.sim.progen import random_program

SMALL = Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=256)
B512 = get_target("DPUCZDX8G_ISA1_B512")


def _programs(target, seeds, n=50, bank_conflicts=False):
    out = []
    for s in seeds:
        g = random_program(target, n, seed=s, bank_conflicts=bank_conflicts)
        out.append((f"seed {s}", g.instructions, g.reg_sizes, g.reg_init))
    return out


def _assert_all_match(reps):
    bad = [r for r in reps if not r.ok]
    assert not bad, "\n".join(r.summary() for r in bad[:5])


def test_random_programs_small_target():
    reps = cosim_programs(SMALL, _programs(SMALL, range(110)))
    assert len(reps) == 110
    _assert_all_match(reps)
    assert sum(r.instructions for r in reps) > 110 * 40


def test_random_programs_b512():
    reps = cosim_programs(B512, _programs(B512, range(1000, 1100)))
    assert len(reps) == 100
    _assert_all_match(reps)


def test_random_programs_b512_bank_conflicts():
    """Conflict-heavy random programs (progen bank_conflicts: image accesses crowd onto two hot banks): the
    arbiter refuses engines, and the RTL still matches the cycle model cycle for cycle (docs/bank-ports.md)."""
    reps = cosim_programs(B512, _programs(B512, range(3000, 3100), bank_conflicts=True))
    assert len(reps) == 100
    _assert_all_match(reps)
    stalled = [r for r in reps if r.bank_stalls > 0]
    assert len(stalled) >= 50, f"only {len(stalled)} of 100 programs stalled on a bank port"


def test_cosim_cli_random_bank_conflicts(capsys):
    from opendpu.runtime.cli import main
    assert main(["cosim", "--random", "3", "--bank-conflicts", "--target", "DPUCZDX8G_ISA1_B512",
                 "--seed", "40"]) == 0
    out = capsys.readouterr().out
    assert out.count("bank-conflict mode") == 3 and "3 match" in out and "bank-stall engine-cycles" in out


def test_random_programs_wide_weight_path():
    """weight_load_lines 2 (the board profiles' weight path): DDR LOADs into CONVW write two lines per cycle into
    the split CONVW memories; the RTL matches the cycle model (progen: about a fifth of its CONVW LOADs qualify)."""
    t = B512.with_timing(weight_load_lines=2)
    progs = _programs(t, range(4000, 4030))
    wide = sum(1 for _, ins, _, _ in progs for x in ins if x.op == "LOAD" and t.load_lines_per_cycle(
        x.fields["bank_id"], x.fields["channel"], x.fields["jump_read"], x.fields["broadcast"]) == 2)
    assert wide >= 10
    _assert_all_match(cosim_programs(t, progs))


def test_random_programs_other_timing():
    """Non-default queue, FIFO, fetch, DDR and pipeline parameters reach the RTL from the Target."""
    t = SMALL.with_timing(queue_depth=2, fetch_fifo_words=8, fetch_latency=3, ddr_latency=9,
                          ddr_bytes_per_cycle=4, ddr_ports=1, load_setup=2, save_setup=7, conv_latency=9,
                          alu_latency=7, elew_latency=6, init_cycles=2, end_cycles=3)
    reps = cosim_programs(t, _programs(t, range(2000, 2030)))
    _assert_all_match(reps)


def test_mismatch_names_first_diverging_instruction():
    """A model with a different DDR latency than the RTL: the report names the first LOAD that ends later."""
    progs = _programs(SMALL, [7])
    from opendpu.hw.harness import build, ddr_needed, run_jobs
    from opendpu.isa.program import to_arrays
    from opendpu.runtime.cosim import compare, rtl_job, through_end
    from opendpu.sim.timing import simulate
    name, instrs, sizes, init = progs[0]
    instrs = through_end(instrs)
    b = build(SMALL, ddr_bytes=ddr_needed(sizes))
    res = run_jobs(b, [rtl_job(name, instrs, sizes, init, simulate(to_arrays(instrs), SMALL))])[0]
    other = SMALL.with_timing(ddr_latency=SMALL.timing.ddr_latency + 1)
    m = initial_machine(other, sizes, init)
    sched = simulate(to_arrays(instrs), other, machine=m)
    rep = compare(name, other, instrs, sched, m, res)
    assert not rep.ok
    # Everything before the first DDR transfer ends is unchanged, so the earliest divergence is the end of
    # the LOAD/SAVE that ends first (one cycle later in the model).
    ddr_ops = [k for k, i in enumerate(instrs) if i.op == "SAVE" or (i.op == "LOAD" and i.fields["broadcast"] != 7)]
    k0 = min(ddr_ops, key=lambda k: (int(sched.end[k]), k))
    assert rep.first.instruction == k0 and rep.first.kind == "end", rep.summary()
    assert f"instruction {k0} ({instrs[k0].op}" in rep.first.message
    assert int(res.end[k0]) == int(sched.end[k0]) - 1
    assert f"RTL {int(res.end[k0])} != cycle model {int(sched.end[k0])}" in rep.first.message
    # a corrupted DDR byte is reported with the SAVE that wrote it
    sv = next(k for k, i in enumerate(instrs) if i.op == "SAVE")
    reg, off = instrs[sv].fields["reg_id"], instrs[sv].fields["ddr_addr"]
    m_ok = initial_machine(SMALL, sizes, init)
    sched_ok = simulate(to_arrays(instrs), SMALL, machine=m_ok)
    res.ddr[reg][off] ^= 1
    rep2 = compare(name, SMALL, instrs, sched_ok, m_ok, res)
    assert [mm.kind for mm in rep2.mismatches] == ["ddr"], rep2.summary()
    assert f"REG_{reg}" in rep2.first.message and f"offset {off:#x}" in rep2.first.message
    k = rep2.first.instruction           # the last SAVE whose DDR range covers the byte
    f = instrs[k].fields
    assert instrs[k].op == "SAVE" and f["reg_id"] == reg and k >= sv
    assert f["ddr_addr"] <= off < f["ddr_addr"] + (f["length"] - 1) * f["jump_write"] + f["channel"]
    # a bank-stall counter that disagrees with the model's stall_bank is reported by name
    res.ddr[reg][off] ^= 1
    res.bank_stalls["SSTALL"] += 1
    rep3 = compare(name, SMALL, instrs, sched_ok, m_ok, res)
    assert [mm.kind for mm in rep3.mismatches] == ["counter"], rep3.summary()
    assert "SSTALL" in rep3.first.message and f"cycle model {res.bank_stalls['SSTALL'] - 1}" in rep3.first.message


def test_mnist_on_b4096_rtl(mnist_path):
    """The real MNIST xmodel: RTL output == sim == ref, total and every retire cycle == cycle model."""
    from opendpu.compiler.xir.graph import load as load_xmodel
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    from opendpu.runtime.cosim import subgraph_program
    g = load_xmodel(mnist_path)
    sgs = dpu_subgraphs(g)
    assert len(sgs) == 1
    dsg = DpuSubgraph(g, sgs[0])
    assert dsg.target.name == "DPUCZDX8G_ISA1_B4096"
    rng = np.random.default_rng(5)
    xs = [rng.integers(-128, 128, size=s.dims, dtype=np.int8) for s in dsg.inputs]
    rtl_out, res = dsg.run_rtl(xs)
    sim_out = dsg.run_sim(xs, machine=dsg.new_machine(0, init_fill="zero"))
    ref_out, _ = dsg.run_ref(xs)
    for a, b, c in zip(rtl_out, sim_out, ref_out):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    sched = dsg.last_schedule
    # 57,219 cycles without bank-port arbitration: MNIST's engines are refused a bank in 272 cycles
    # (docs/bank-ports.md; the RTL's stall counters and the cycle model's stall_bank alike), which
    # lengthens the run by 116 cycles. 8 of its 17 CONVs have stride_out 2 (2 lines per bank and write):
    # their write queues add 81 LOAD stall cycles to the 35 of the arbitration alone (57,254 cycles).
    assert res.cycles == sched.total_cycles == 57219 + 116
    assert sum(res.bank_stalls.values()) == int(sched.stall_bank.sum()) == 272
    assert res.bank_stalls["LSTALL"] == 116 and res.bank_stalls["MSTALL"] == 156
    assert np.array_equal(res.retire, sched.retire) and np.array_equal(res.start, sched.start)
    assert np.array_equal(res.end, sched.end)
    rep = cosim_programs(dsg.target, [("mnist",) + subgraph_program(dsg, xs)])[0]
    assert rep.ok, rep.summary()


def _export_and_lint(names, tmp_path):
    """Verilog of each target (exported, or from the export cache) passes `verilator --lint-only -Wall` without
    an error and without a combinational loop."""
    from concurrent.futures import ProcessPoolExecutor
    from opendpu.hw.harness import export_verilog, tool_env, verilator_root
    with ProcessPoolExecutor(max_workers=2) as ex:
        texts = list(ex.map(export_verilog, names, [tmp_path / f"{n}.v" for n in names]))
    env = tool_env()
    for name, v in zip(names, texts):
        assert "module dpu_core" in v and (tmp_path / f"{name}.v").read_text() == v
        r = subprocess.run([str(verilator_root() / "bin" / "verilator"), "--lint-only", "-Wno-fatal", "-Wall",
                            "--top-module", "dpu_core", str(tmp_path / f"{name}.v")],
                           env=env, capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        assert "%Error" not in r.stderr, name
        assert "UNOPTFLAT" not in r.stderr and "ALWCOMBORDER" not in r.stderr, (name, r.stderr[-2000:])  # comb. loop


def test_verilog_and_lint_b512_b800_b4096(tmp_path):
    """CI: the smallest preset, one with a non-power-of-two bank width (CP 10) and the largest (whose export the
    B4096 MNIST build above has cached); every preset in the slow test below."""
    _export_and_lint(["DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B800", "DPUCZDX8G_ISA1_B4096"], tmp_path)


@pytest.mark.slow
def test_verilog_for_every_preset_and_lint(tmp_path):
    _export_and_lint(list(PRESETS), tmp_path)


def test_verilog_export_cache(tmp_path, monkeypatch):
    """The export is cached by target and hw sources: a second export reads the file (no Amaranth run), an
    uncached one gives the same text, and another timing (a different RTL constant) is another entry."""
    from opendpu.hw import harness
    monkeypatch.setattr(harness, "BUILD_ROOT", tmp_path)
    a = harness.export_verilog(SMALL)
    files = list((tmp_path / "verilog").glob("*.v"))
    assert len(files) == 1 and files[0].read_text() == a
    files[0].write_text(a + "// from the cache\n")
    assert harness.export_verilog(SMALL).endswith("// from the cache\n")
    assert harness.export_verilog(SMALL, cache=False) == a
    harness.export_verilog(SMALL.with_timing(conv_latency=9))
    assert len(list((tmp_path / "verilog").glob("*.v"))) == 2


def test_concurrent_builds_of_one_key_compile_once(tmp_path, monkeypatch):
    """Two builders of the same target at once (two cosims, a sweep's workers, parallel test processes): the
    second waits for the first's lock and finds its build; it never deletes the directory being compiled into."""
    import threading
    import time
    from opendpu.hw import harness
    monkeypatch.setattr(harness, "BUILD_ROOT", tmp_path)
    monkeypatch.setattr(harness, "export_verilog", lambda t, path=None, **kw: path.write_text("// core\n"))
    running, calls = [], []

    def slow_compile(cmd, cwd, env, what):
        running.append(1)
        calls.append(len(running))                 # how many compiles run at this moment
        time.sleep(0.3)
        (cwd / "obj").mkdir()
        running.pop()

    monkeypatch.setattr(harness, "_run", slow_compile)
    out = []
    threads = [threading.Thread(target=lambda: out.append(harness.build(SMALL))) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert calls == [1]                             # one compile, never two at once
    assert len(out) == 2 and out[0].dir == out[1].dir and (out[0].dir / "built").exists()
    assert (out[0].dir / "obj").is_dir() and (out[0].dir / "dpu_core.v").read_text() == "// core\n"


@pytest.mark.skipif(shutil.which("iverilog") is None, reason="Icarus Verilog (apt iverilog) not installed")
def test_cocotb_icarus_flow():
    """The same bench under cocotb 2.1 on Icarus gives the same bytes and cycles."""
    reps = cosim_programs(SMALL, _programs(SMALL, range(3), n=25), backend="cocotb-icarus")
    _assert_all_match(reps)


@pytest.mark.slow
def test_yolox_nano_b512_whole_on_rtl():
    """YOLOX-nano compiled for B512, every DPU subgraph on the B512 RTL: bit- and cycle-exact."""
    import time
    from opendpu.compiler.xir.graph import load as load_xmodel
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    from opendpu.runtime.cosim import subgraph_program
    from conftest import model_path
    g = load_xmodel(model_path("yolox_nano_b512"))
    rng = np.random.default_rng(11)
    progs = []
    for sg in dpu_subgraphs(g):
        dsg = DpuSubgraph(g, sg)
        xs = [rng.integers(-128, 128, size=s.dims, dtype=np.int8) for s in dsg.inputs]
        progs.append((sg.name,) + subgraph_program(dsg, xs))
    t0 = time.time()
    reps = cosim_programs(B512, progs)
    print(f"YOLOX-nano B512 on RTL: {sum(r.rtl_cycles for r in reps)} cycles, {time.time() - t0:.1f} s wall")
    _assert_all_match(reps)
    assert sum(r.instructions for r in reps) > 20000


def test_cosim_cli_bad_input(mnist_path, capsys):
    """Bad requests give one clear line and exit code 2, before any build."""
    from opendpu.runtime.cli import main
    assert main(["cosim", mnist_path, "--target", "DPUCZDX8G_ISA1_B512"]) == 2
    assert "compiled for DPUCZDX8G_ISA1_B4096" in capsys.readouterr().err
    assert main(["cosim", "--random", "3"]) == 2
    assert "--random needs --target" in capsys.readouterr().err
    assert main(["cosim", mnist_path, "--timing", "conv_latency=2"]) == 2
    assert "conv_latency = 2 is below the RTL pipeline depth" in capsys.readouterr().err
