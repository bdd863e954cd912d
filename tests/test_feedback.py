"""Feedback on long work (issue 11, item 7): one Numba cache location set by the package, kernel warm-up
reported apart from inference, the progress(done, total, what) callbacks of the long functions, the
progress bar helper, and no stray Amaranth warning from the RTL harness."""
import io
import json
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

from opendpu.isa.program import to_arrays
from opendpu.isa.target import Target, get_target
from opendpu.sim.progen import random_program

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=256)

_WARM = """
import json
from opendpu import sim
msgs = []
secs = sim.warm_kernels(log=msgs.append)
print(json.dumps({"secs": secs, "log": msgs, "status": sim.kernels_status()}))
"""


def _py(code, env):
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(kw)
    return env


def test_warm_kernels_compiles_once_then_loads_from_cache(tmp_path):
    """Two fresh processes on an empty NUMBA_CACHE_DIR: the first compiles every sim kernel (Numba cache
    misses) and says so through `log`, the second only loads them (cache hits, no misses, no message)."""
    cache = str(tmp_path / "numba")
    env = _env(NUMBA_CACHE_DIR=cache)
    first = json.loads(_py(_WARM, env).splitlines()[-1])
    second = json.loads(_py(_WARM, env).splitlines()[-1])
    kernels = ("run_range", "costs", "schedule")
    assert first["status"]["cache_dir"] == cache == second["status"]["cache_dir"]
    for k in kernels:
        assert first["status"][k]["compiled"] and first["status"][k]["cache_misses"] > 0
        assert second["status"][k]["compiled"]
        assert second["status"][k]["cache_hits"] > 0 and second["status"][k]["cache_misses"] == 0
    assert first["log"] == ["compiling simulator kernels (first run only)…"] and first["secs"] > 0
    assert second["log"] == [] and second["secs"] == 0.0
    assert os.listdir(cache)                       # the compiled kernels live in the chosen directory


def test_numba_cache_dir_default_and_override(tmp_path):
    code = ("from opendpu import sim\nimport json\nfrom numba.core import config\n"
            "print(json.dumps([config.CACHE_DIR, sim._kernels.run_range.stats.cache_path, "
            "sim.default_numba_cache_dir()]))")
    xdg = str(tmp_path / "xdg")
    for pre in ("", "import numba\n"):         # also when numba was imported before sim
        cfg, path, default = json.loads(_py(pre + code, _env(XDG_CACHE_HOME=xdg)))
        assert cfg == default and os.path.dirname(cfg) == os.path.join(xdg, "opendpu", "numba")
        assert os.path.basename(cfg).startswith("src-") and path.startswith(cfg)
    mine = str(tmp_path / "mine")
    cfg, path, _ = json.loads(_py(code, _env(XDG_CACHE_HOME=xdg, NUMBA_CACHE_DIR=mine)))
    assert cfg == mine and path.startswith(mine)  # a user-set NUMBA_CACHE_DIR wins
    home = str(tmp_path / "home")
    cfg, _, _ = json.loads(_py(code, _env(HOME=home, XDG_CACHE_HOME="relative/ignored")))
    assert os.path.dirname(cfg) == os.path.join(home, ".cache", "opendpu", "numba")


def test_numba_cache_key_follows_every_jitted_source(tmp_path):
    """An edit of any file a kernel inlines (isa/, sim/, quant/calib.py) gives another cache directory; other files
    do not (Numba alone checks only the file that defines a kernel, so sim/_kernels.py would reuse stale code after
    an edit of sim/_fastmac.py)."""
    from opendpu.isa.numba_cache import source_key
    for d, f in (("isa", "check.py"), ("sim", "_kernels.py"), ("sim", "_fastmac.py"), ("quant", "calib.py"),
                 ("quant", "zoo.py")):
        (tmp_path / d).mkdir(exist_ok=True)
        (tmp_path / d / f).write_text("x = 1\n")
    before = source_key(str(tmp_path))
    (tmp_path / "quant" / "zoo.py").write_text("x = 2\n")
    assert source_key(str(tmp_path)) == before
    for d, f in (("sim", "_fastmac.py"), ("isa", "check.py"), ("quant", "calib.py")):
        (tmp_path / d / f).write_text((tmp_path / d / f).read_text() + "y = 3\n")
        assert source_key(str(tmp_path)) != before, f
        before = source_key(str(tmp_path))


def test_warm_kernels_in_process_reports_no_compile_when_ready():
    from opendpu import sim
    sim.warm_kernels()
    msgs = []
    assert sim.warm_kernels(log=msgs.append) == 0.0 and msgs == []
    st = sim.kernels_status()
    assert all(st[k]["compiled"] for k in ("run_range", "costs", "schedule"))


def test_sweep_progress():
    from opendpu.sim.sweep import sweep
    t = get_target("DPUCZDX8G_ISA1_B512")
    prog = to_arrays(random_program(t, 40, seed=3).instructions)
    axes = {"ddr_latency": [0, 60], "queue_depth": [1, 8]}
    calls = []
    rows = sweep([prog], t, axes, progress=lambda *a: calls.append(a))
    assert rows == sweep([prog], t, axes)
    assert calls == [(0, 4, "ddr_latency=0;queue_depth=1"), (1, 4, "ddr_latency=0;queue_depth=8"),
                     (2, 4, "ddr_latency=60;queue_depth=1"), (3, 4, "ddr_latency=60;queue_depth=8"),
                     (4, 4, "done")]


def test_run_jobs_progress_reports_jobs_and_cycles(tmp_path, monkeypatch):
    """The watcher reports the running job's cycle count from the bench's +progress file and each
    finished job (its .regs file), on the calling thread; a fake simulator plays the bench's part."""
    from opendpu.hw import harness
    b = harness.Build(harness.HwParams.of(SMALL), "verilator", tmp_path, 20)
    jobs = [harness.Job(b"", {0: 4096}, name="a", expect_cycles=300_000), harness.Job(b"", {0: 4096}, name="b")]
    seen = {"a": threading.Event(), "b": threading.Event()}
    calls = []
    caller = threading.get_ident()

    def fake_simulate(b_, wd, timeout, plusargs):
        pf = next(a for a in plusargs if a.startswith("+progress=")).split("=", 1)[1]
        assert f"+progress_every={harness.PROGRESS_EVERY['verilator']}" in plusargs
        with open(pf, "w") as f:
            f.write("0 131072\n")
        assert seen["a"].wait(30)
        (wd / "j0.regs").write_text("done 1\n")
        with open(pf, "w") as f:
            f.write("1 262144\n")
        assert seen["b"].wait(30)
        (wd / "j1.regs").write_text("done 1\n")

    def cb(done, total, what):
        assert threading.get_ident() == caller
        calls.append((done, total, what))
        if what == "RTL job 1/2 a: cycle 131,072 of ~300,000":
            seen["a"].set()
        if what == "RTL job 2/2 b: cycle 262,144":
            seen["b"].set()

    monkeypatch.setattr(harness, "_simulate", fake_simulate)
    harness._simulate_watched(b, tmp_path, None, (), jobs, cb, poll=0.01)
    assert calls[0] == (0, 2, "RTL job 1/2 a")
    assert (0, 2, "RTL job 1/2 a: cycle 131,072 of ~300,000") in calls
    assert (1, 2, "RTL job 2/2 b: cycle 262,144") in calls
    assert calls[-1] == (2, 2, "RTL jobs done")
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)


def test_run_jobs_progress_propagates_simulator_errors(tmp_path, monkeypatch):
    from opendpu.hw import harness
    b = harness.Build(harness.HwParams.of(SMALL), "verilator", tmp_path, 20)

    def broken(*a, **k):
        raise harness.HwError("RTL simulation failed (exit 3)")
    monkeypatch.setattr(harness, "_simulate", broken)
    with pytest.raises(harness.HwError, match="exit 3"):
        harness._simulate_watched(b, tmp_path, None, (), [harness.Job(b"", {})], lambda *a: None, poll=0.01)


def test_core_ports_leave_no_unused_elaboratable():
    """The bench generator lists the core's ports from its signature; no DpuCore is left unelaborated
    (Amaranth then warned 'UnusedElaboratable ... created but never used' at the end of `opendpu cosim`)."""
    import gc
    from amaranth.back import verilog
    from amaranth.hdl import Module, Signal
    from opendpu.hw.harness import core_ports
    from opendpu.hw.params import HwParams
    m = Module()
    s = Signal()
    m.d.sync += s.eq(~s)
    verilog.convert(m, ports=[s])                 # after a first elaboration Amaranth checks for unused ones
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ports = core_ports(HwParams.of(SMALL))
        gc.collect()
    assert not [x for x in w if "never used" in str(x.message)], [str(x.message) for x in w]
    names = [n for n, _, _ in ports]
    assert {"bus_addr", "ap_done", "ddr_rd__addr", "ddr_wr__0__en"} <= set(names)


class _FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_plain_progress_lines():
    from opendpu.runtime.progress import PlainProgress
    clock = _FakeClock()
    out = io.StringIO()
    p = PlainProgress("cosim", out, interval=5.0, heartbeat=0, clock=clock)
    p(0, 3, "cycle model: a")                    # first call
    p(1, 3, "cycle model: b")                    # few steps: each advance
    p(3, 3, "cycle model: done")                 # end of stage
    p(0, 2, "build: export Verilog")             # new stage
    p(1, 2, "build: Verilator compile")
    p(2, 2, "build: built in 100 s")
    for k in range(50):                          # many jobs: rate-limited
        clock.t += 0.5
        p(k, 50, f"rtl: RTL job {k + 1}/50 j{k}")
    p(50, 50, "rtl: RTL jobs done")
    lines = out.getvalue().splitlines()
    assert lines[:6] == ["cosim: cycle model: a [0/3] (0 s)", "cosim: cycle model: b [1/3] (0 s)",
                         "cosim: cycle model: done [3/3] (0 s)", "cosim: build: export Verilog [0/2] (0 s)",
                         "cosim: build: Verilator compile [1/2] (0 s)", "cosim: build: built in 100 s [2/2] (0 s)"]
    rtl = lines[6:]
    assert rtl[0] == "cosim: rtl: RTL job 1/50 j0 [0/50] (0 s)"
    assert rtl[-1] == "cosim: rtl: RTL jobs done [50/50] (25 s)"
    assert 5 <= len(rtl) <= 7                    # 25 s of fake time at one line per 5 s


def test_plain_progress_eta():
    """The remaining time from the stage's own rate: 4 points in 20 s, 6 left -> 30 s."""
    from opendpu.runtime.progress import PlainProgress
    clock = _FakeClock()
    out = io.StringIO()
    p = PlainProgress("sweep", out, interval=5.0, heartbeat=0, clock=clock)
    p(10, 20, "resumed")                         # 10 points from an earlier run: not part of the rate
    clock.t += 20
    p(14, 20, "m pp=4")
    assert out.getvalue().splitlines() == ["sweep: resumed [10/20] (0 s)", "sweep: m pp=4 [14/20] (20 s, ETA 30 s)"]


def test_plain_progress_heartbeat():
    from opendpu.runtime.progress import PlainProgress
    clock = _FakeClock()
    out = io.StringIO()
    p = PlainProgress("build", out, interval=5.0, heartbeat=30.0, clock=clock)
    p.start()
    try:
        p(1, 2, "Verilator compile")
        clock.t += 31
        for _ in range(200):                     # the heartbeat thread checks once per second
            if "still" in out.getvalue():
                break
            threading.Event().wait(0.05)
    finally:
        p.stop()
    assert out.getvalue().splitlines()[-1] == "build: still Verilator compile [1/2] (31 s)"


def test_progress_bar_modes():
    from opendpu.runtime.progress import PlainProgress, progress_bar
    with progress_bar("x", enabled=False) as cb:
        assert cb is None
    out = io.StringIO()                           # not a terminal: plain lines
    with progress_bar("sweep", stream=out, quiet=0) as cb:
        assert isinstance(cb, PlainProgress)
        cb(0, 2, "p=1")
        cb(2, 2, "done")
    assert out.getvalue().splitlines() == ["sweep: p=1 [0/2] (0 s)", "sweep: done [2/2] (0 s)"]
    quick = io.StringIO()                         # work that ends within `quiet` seconds prints nothing
    with progress_bar("calibration", stream=quick, quiet=60) as cb:
        for i in range(8):
            cb(i + 1, 8, "batches")
    assert quick.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty = Tty()                                   # a terminal: rich draws the bar
    with progress_bar("sweep", stream=tty) as cb:
        assert not isinstance(cb, PlainProgress)
        cb(1, 2, "p=2")
        cb(2, 2, "done")
    assert "sweep: done" in tty.getvalue() and "2/2" in tty.getvalue()


def test_cosim_progress_stages():
    """cosim_programs reports its stages in order, each ending with done == total, and the programs still match
    (the build is the one of tests/test_hw_core.py for SMALL)."""
    from opendpu.runtime.cosim import cosim_programs
    progs = []
    for s in range(3):
        g = random_program(SMALL, 25, seed=s)
        progs.append((f"seed {s}", g.instructions, g.reg_sizes, g.reg_init))
    calls = []
    reps = cosim_programs(SMALL, progs, progress=lambda *a: calls.append(a))
    assert all(r.ok for r in reps), "\n".join(r.summary() for r in reps)
    stages = [c[2].split(":")[0] for c in calls]
    order = [s for k, s in enumerate(stages) if k == 0 or stages[k - 1] != s]
    assert order == ["cycle model", "build", "rtl", "compare"]
    for st, total in (("cycle model", 3), ("build", 2), ("rtl", 3), ("compare", 3)):
        mine = [c for c in calls if c[2].startswith(st + ":")]
        assert mine[-1][:2] == (total, total) and all(c[1] == total for c in mine)
    assert calls[0] == (0, 3, "cycle model: seed 0")
    assert np.array_equal([r.rtl_cycles for r in reps], [r.model_cycles for r in reps])


def test_bench_progress_file(tmp_path):
    """The generated bench's +progress plusarg: the file holds the job index and the last multiple of
    +progress_every cycles the job ran (the SMALL build of the test above, cached)."""
    from opendpu.hw.harness import build, ddr_needed, run_jobs
    from opendpu.runtime.cosim import rtl_job, through_end
    from opendpu.sim.timing import simulate
    g = random_program(SMALL, 25, seed=1)
    instrs = through_end(g.instructions)
    sched = simulate(to_arrays(instrs), SMALL)
    b = build(SMALL, ddr_bytes=ddr_needed(g.reg_sizes))
    pf = tmp_path / "progress.txt"
    res = run_jobs(b, [rtl_job("p", instrs, g.reg_sizes, g.reg_init, sched)], workdir=tmp_path / "wd",
                   plusargs=[f"+progress={pf}", "+progress_every=16"])[0]
    assert res.status == "done" and res.cycles == sched.total_cycles and res.waited >= 16
    job, cyc = (int(x) for x in pf.read_text().split())
    assert job == 0 and cyc % 16 == 0 and res.waited - 16 < cyc <= res.waited
