"""Architecture sweeps (runtime/sweep/, `opendpu sweep ... -o DIR`): the specification, targets per point,
metrics against hand-computed values and PG338's tables, the compile cache, resumption, fault tolerance of the
local pool and of Ray, and bad input. The model is the shipped digits CNN (its compiles take a fraction of a
second), so that the whole file runs in about a minute.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import threading
import time
import sys

import pytest

from opendpu.compiler.pipeline import compile as compile_graph
from opendpu.compiler.xir.graph import Graph
from opendpu.hw.resources import PG338_BRAM36, PG338_DSP
from opendpu.isa.boards import DPU_TIMING, get_board
from opendpu.isa.target import Target, get_target
from opendpu.runtime import sweep as S
from opendpu.runtime.cli import main as cli
from opendpu.runtime.costmodel import cycle_model
from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
from opendpu.sim.timing import simulate

DIGITS = "zoo:digits"
VOLATILE = ("compile_s", "eval_s", "compile_cached")          # wall-clock and cache state, not results


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("sweep-cache"))


@pytest.fixture(scope="module")
def digits(cache):
    return S.prepare_model(S.parse_model(DIGITS), cache)


def spec(space: dict, constraints=(), seed=0, models=(DIGITS,)) -> S.SweepSpec:
    return S.spec_from_dict({"model": [{"zoo": m[4:]} for m in models], "space": [space],
                             "constraints": list(constraints), "seed": seed})


def new_store(path: str) -> S.Store:
    st = S.Store(path)
    st.open("{}")
    return st


def stop_after(n: int, seen: list):
    """An on_result callback that interrupts the sweep (as Ctrl-C does) after n results, noting their hashes."""
    def cb(res):
        seen.append(res["hash"])
        if len(seen) == n:
            raise KeyboardInterrupt
    return cb


def kill_first(pids, killed: list):
    """An on_result callback that SIGKILLs the first process `pids()` lists, once: at the first result that finds
    one (a result may arrive when no worker is running a point, e.g. on a loaded machine)."""
    def cb(res):
        if not killed:
            for pid in pids():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                break
    return cb


def stable(rows):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rows]


# ---- specification and points ----------------------------------------------------------------------------------
def test_toml_spec_gives_the_same_points(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("""seed = 7
constraints = ["dsp <= 1248", "fps >= 10"]
[[model]]
zoo = "resnet18"
size = 64
[[space]]
preset = ["B512", "B4096"]
board = ["kv260"]
[[space]]
mode = "random"
samples = 5
pp = [2, 4, 8]
cp = [8, 16]
bank_depth = [1024, 2048]
[[space]]
points = [{pp = 4, cp = 12, img_bg = 3}, {preset = "B1024", ddr_latency = 80}]
""")
    a, b = S.load_spec(str(p)), S.load_spec(str(p))
    pa, pb = S.expand(a), S.expand(b)
    assert pa == pb and len(pa) == 2 + 5 + 2
    assert pa[0] == {"preset": "B512", "board": "kv260"}
    assert [str(c) for c in a.constraints] == ["dsp <= 1248", "fps >= 10"]
    assert a.models[0].label == "resnet18@64"
    # another seed samples other points of the same grid; every sample lies on the grid
    c = S.load_spec(str(p))
    c.seed = 8
    rnd_a, rnd_c = pa[2:7], S.expand(c)[2:7]
    assert rnd_a != rnd_c
    for q in rnd_a + rnd_c:
        assert q["pp"] in (2, 4, 8) and q["cp"] in (8, 16) and q["bank_depth"] in (1024, 2048)


def test_targets_of_points():
    # a preset with pp=8 is the PP8/CP8 array: PG338's B1024, found by its fingerprint
    assert S.build_target({"preset": "B512", "pp": 8}).name == "DPUCZDX8G_ISA1_B1024"
    t = S.build_target({"pp": 4, "cp": 12, "img_bg": 3})
    assert (t.pp, t.cp, t.alu_pp, t.img_bg, t.bank_depth) == (4, 12, 2, 3, 2048)
    # a board gives its timing (3 cores at 281 MHz on a ZCU102) to any array; its own array by default
    z = S.build_target({"board": "zcu102"})
    assert z.name == "DPUCZDX8G_ISA1_B4096" and z.timing.cores == 3 and z.timing.clock_mhz == 281.0
    assert z.timing.board_ddr_mbps == get_board("zcu102").ddr_mbps
    k = S.build_target({"board": "kv260", "preset": "B1152", "clock_mhz": 200})
    assert k.name == "DPUCZDX8G_ISA1_B1152" and k.timing.cores == 1 and k.timing.clock_mhz == 200.0
    # the board's calibrated DPU timing comes with it, and a point's own timing field still wins
    assert (k.timing.ddr_latency, k.timing.conv_latency) == (DPU_TIMING["ddr_latency"], DPU_TIMING["conv_latency"])
    assert S.build_target({"board": "kv260", "conv_latency": 16}).timing.conv_latency == 16
    with pytest.raises(S.SweepError, match="preset, a board, or both pp and cp"):
        S.build_target({"cp": 8})


def test_resources_are_pg338_per_core():
    for name in ("B512", "B1024", "B4096"):
        r = S.resources(get_target(name))
        assert r["dsp"] == PG338_DSP[name][0] and r["bram36"] == PG338_BRAM36[name][0]
    r = S.resources(S.build_target({"board": "zcu102"}))
    assert r["dsp"] == 3 * PG338_DSP["B4096"][0]


def test_compile_key_shares_programs_across_model_only_timing():
    b = get_target("B512")
    k = S.compile_key("m", b, {})
    assert S.compile_key("m", b.with_timing(clock_mhz=200, cores=2, board_ddr_mbps=19200), {}) == k
    assert S.compile_key("m", b.with_timing(ddr_latency=100), {}) != k      # the compiler decides by it
    assert S.compile_key("m", get_target("B1024"), {}) != k
    assert S.compile_key("m", b, {"fuse_conv": False}) != k
    assert S.compile_key("other", b, {}) != k


# ---- metrics ---------------------------------------------------------------------------------------------------
def test_metrics_against_an_independent_compile(tmp_path, cache, digits):
    """Each row's cycles and DDR bytes equal the cycle model on the compiled xmodel (compiled again here,
    outside the sweep); fps, GOP/s and MAC utilisation follow from them by hand."""
    sp = spec({"preset": ["B512", "B4096"], "clock_mhz": [200, 300]})
    store = new_store(str(tmp_path / "s"))
    res = S.run(sp, [digits], store, cache, workers=1)
    assert [r["status"] for r in res.rows] == ["ok"] * 4, [r["reason"] for r in res.rows]
    g = Graph.load(digits.path)
    for r in res.rows:
        t = S.build_target(json.loads(r["params"]))
        out = compile_graph(g, t, cycles=cycle_model).graph
        subs = [DpuSubgraph(out, sg) for sg in dpu_subgraphs(out)]
        scheds = [simulate(d.arrays, t) for d in subs]
        cyc = sum(s.total_cycles for s in scheds)
        assert r["cycles"] == cyc
        assert r["ddr_read_bytes"] == sum(int(s.ddr_read.sum()) for s in scheds)
        assert r["ddr_write_bytes"] == sum(int(s.ddr_write.sum()) for s in scheds)
        ops = sum(int(d.sg.attrs["workload"]) for d in subs)
        assert r["ops"] == ops
        assert r["fps"] == pytest.approx(t.timing.clock_mhz * 1e6 / cyc)      # one core, no board, no host
        assert r["latency_ms"] == pytest.approx(cyc / (t.timing.clock_mhz * 1e3))
        assert r["mac_util"] == pytest.approx(ops / (cyc * 2 * t.pp * t.cp * t.cp))
        assert r["gops"] == pytest.approx(ops * r["fps"] / 1e9)
        assert r["layers_conv"] + r["layers_misc"] + r["layers_load"] + r["layers_save"] >= 1
        assert 0 < r["onchip_pct"] <= 100
    # the clock changes ms, never cycles; the two clocks of a preset share one compiled program
    by = {(r["preset"], r["clock_mhz"]): r for r in res.rows}
    assert by[("B512", 200.0)]["cycles"] == by[("B512", 300.0)]["cycles"]
    assert by[("B512", 300.0)]["fps"] == pytest.approx(1.5 * by[("B512", 200.0)]["fps"])
    full = res.results[by[("B512", 300.0)]["hash"]]
    assert sum(ly["cycles"] for ly in full["layers"]) == by[("B512", 300.0)]["cycles"]


def test_board_fps_with_cores_and_host_overhead(tmp_path, cache, digits):
    sp = spec({"board": ["zcu102"]})
    store = new_store(str(tmp_path / "s"))
    r = S.run(sp, [digits], store, cache, workers=1).rows[0]
    # sim/multicore.py, written out with the zcu102 profile's constants (3 cores at 281 MHz, 4 A53 threads at 1,200
    # MHz; docs/calibration.md): digits is far from the DDR roof; its 64 input and 10 output bytes cost the host
    # almost only the fixed part
    from opendpu.isa import boards as B
    runs = r["dpu_subgraphs"]
    dpu = r["cycles"] / 281e6 + runs * B.FRAME_OVERHEAD_US * 1e-6
    host = (B.HOST_FRAME_US + B.HOST_US_PER_MB * 74 / 1e6) * 1e-6
    cpu = (host + runs * B.FRAME_OVERHEAD_US * 1e-6) * B.HOST_LOAD_PCT / 100
    assert r["fps"] == pytest.approx(min(3 / dpu, 4 / cpu)) and not r["ddr_bound"]
    assert r["fps_single"] == pytest.approx(1 / (dpu + host))
    assert r["fps_bound"] == ("host" if 4 / cpu < 3 / dpu else "dpu")


# ---- resume, interruption, faults ------------------------------------------------------------------------------
def test_resume_recomputes_no_finished_point(tmp_path, cache, digits):
    sp = spec({"preset": ["B512", "B1024", "B4096"], "cores": [1, 2]})
    store = new_store(str(tmp_path / "s"))
    seen: list = []
    with pytest.raises(KeyboardInterrupt):
        S.run(sp, [digits], store, cache, workers=1, on_result=stop_after(2, seen))
    kept = {h: os.stat(store.path(h)).st_mtime_ns for h in seen}
    again = []
    res = S.run(sp, [digits], store, cache, workers=1, on_result=lambda r: again.append(r["hash"]))
    assert res.reused == 2 and res.computed == 4 and not set(again) & set(seen)
    assert {h: os.stat(store.path(h)).st_mtime_ns for h in seen} == kept
    third = S.run(sp, [digits], store, cache, workers=1)
    assert third.computed == 0 and third.reused == 6
    assert stable(third.rows) == stable(res.rows)


def test_ctrl_c_keeps_finished_points_and_the_rerun_computes_only_the_rest(tmp_path):
    """SIGINT to `opendpu sweep` (a pool of 2) while it runs: exit 130, the finished points stay; the same
    command again computes exactly the points that were missing. A cold compile cache of its own keeps the sweep
    running for seconds (8 presets compiled first), so the signal lands mid-sweep."""
    import time
    o = tmp_path / "o"
    cache = str(tmp_path / "cold-cache")
    clocks = ",".join(str(c) for c in range(150, 400, 10))            # 8 presets x 25 clocks = 200 points
    argv = [sys.executable, "-m", "opendpu.runtime.cli", "sweep", DIGITS, "--param",
            "preset=B512,B800,B1024,B1152,B1600,B2304,B3136,B4096", "--param", f"clock_mhz={clocks}", "-o", str(o),
            "--cache", cache, "--workers", "2"]
    # a job started in the background by a non-interactive shell (a CI runner) inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler: give the sweep the default disposition, as a terminal would
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    log = o / "sweep.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or not log.read_text().strip()):
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "run the same command again" in err and "Traceback" not in err
    kept = len(os.listdir(o / "points"))
    assert 1 <= kept < 200
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{200 - kept} computed, {kept} taken from" in r.stdout
    assert len(log.read_text().splitlines()) == 200                   # every point evaluated exactly once


def test_killed_pool_worker_costs_only_a_retry(tmp_path, cache, digits):
    sp = spec({"preset": ["B512", "B1024", "B1152", "B4096"], "clock_mhz": [250, 300]})
    ref_store = new_store(str(tmp_path / "ref"))
    ref = S.run(sp, [digits], ref_store, cache, workers=1)
    store = new_store(str(tmp_path / "s"))
    killed: list = []
    res = S.run(sp, [digits], store, cache, workers=2,
                on_result=kill_first(lambda: [p.pid for p in mp.active_children()], killed))
    assert killed
    assert [r["status"] for r in res.rows] == ["ok"] * 8, [r["reason"] for r in res.rows]
    assert stable(res.rows) == stable(ref.rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray instance (head node, 2 CPUs) in its own processes, stopped at the end."""
    import secrets
    port = _free_port()
    # Ray >= 2.59 authenticates local clusters by token: the head and this driver share one
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16), "RAY_USAGE_STATS_ENABLED": "0"}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)                 # before ray is imported: it reads the token once
    pytest.importorskip("ray")
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, capture_output=True, timeout=120)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, timeout=120)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ray_workers() -> list[int]:
    """pids of this machine's Ray task workers that are running one of our points."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"ray::run_task" in cmd:
            out.append(int(pid))
    return out


def test_ray_backend_equals_local_pool_and_survives_a_killed_worker(tmp_path, cache, digits, ray_cluster):
    sp = spec({"preset": ["B512", "B1024", "B4096"], "clock_mhz": [250, 300]})
    local_store = new_store(str(tmp_path / "local"))
    local = S.run(sp, [digits], local_store, cache, workers=2)
    store = new_store(str(tmp_path / "ray"))
    seen: list = []
    with pytest.raises(KeyboardInterrupt):
        S.run(sp, [digits], store, str(tmp_path / "ray-cache"), executor="ray", address=ray_cluster,
              on_result=stop_after(2, seen))
    # a thread SIGKILLs the first Ray worker it sees running a point (polling, so that it does not depend on a
    # worker still running when a result arrives, which a loaded machine makes a matter of chance)
    killed: list = []
    done = threading.Event()

    def killer():
        while not done.is_set() and not killed:
            kill_first(_ray_workers, killed)(None)
            time.sleep(0.002)
    th = threading.Thread(target=killer, daemon=True)
    th.start()
    try:
        res = S.run(sp, [digits], store, str(tmp_path / "ray-cache"), executor="ray", address=ray_cluster)
    finally:
        done.set()
        th.join(10)
    assert res.reused == 2 and res.computed == 4          # the interrupted run's two points are not recomputed
    assert killed
    assert [r["status"] for r in res.rows] == ["ok"] * 6, [r["reason"] for r in res.rows]
    assert stable(res.rows) == stable(local.rows)
    again = S.run(sp, [digits], store, str(tmp_path / "ray-cache"), executor="ray", address=ray_cluster)
    assert again.computed == 0 and again.reused == 6


# ---- the command line ------------------------------------------------------------------------------------------
def test_cli_sweep_writes_tables_figures_and_resumes(tmp_path, cache, capsys):
    out, plots = tmp_path / "sw", tmp_path / "sw" / "plots"
    argv = ["sweep", DIGITS, "--param", "preset=B512,B1024,B4096", "--param", "clock_mhz=200,300", "-o", str(out),
            "--cache", cache, "--plot", str(plots), "--workers", "2", "--constraint", "fps >= 40000"]
    assert cli(argv) == 0
    text = capsys.readouterr().out
    assert "6 computed" in text
    for f in ("sweep.csv", "sweep.json", "sweep.parquet", "pareto.csv", "summary.md", "summary.html", "sweep.log"):
        assert (out / f).is_file(), f
    assert len(os.listdir(out / "points")) == 6
    assert sorted(p.name.split("_")[0] for p in plots.iterdir()) == ["bottleneck", "heatmap", "pareto", "pareto"]
    doc = json.loads((out / "sweep.json").read_text())
    rows = doc["rows"]
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows)
    assert {r["meets_constraints"] for r in rows if r["clock_mhz"] == 200.0} == {False}   # digits: < 40k fps
    assert cli(argv) == 0
    assert "0 computed, 6 taken" in capsys.readouterr().out
    assert len((out / "sweep.log").read_text().splitlines()) == 6


def _err(capsys, argv, code=2):
    rc = cli(argv)
    err = capsys.readouterr().err
    assert rc == code, err
    assert "Traceback" not in err
    return err


def test_cli_bad_input(tmp_path, cache, capsys):
    o = str(tmp_path / "o")
    base = ["sweep", DIGITS, "-o", o, "--cache", cache]
    assert "unknown parameter" in _err(capsys, base + ["--param", "pixels=4"]) and "pp" in _err(
        capsys, base + ["--param", "pixels=4"])
    assert "empty value" in _err(capsys, base + ["--param", "pp="])
    assert "out of range 1..8" in _err(capsys, base + ["--param", "pp=9", "--param", "cp=8"])
    err = _err(capsys, base + ["--param", "preset=B1024,B4096", "--constraint", "dsp <= 100"])
    assert "exclude every point" in err and "194" in err
    assert "unknown quantity" in _err(capsys, base + ["--param", "preset=B512", "--constraint", "dps <= 100"])
    plot = ["--plot", str(tmp_path / "o" / "plots")]
    assert "not a swept parameter" in _err(capsys, base + ["--param", "preset=B512,B1024", "--heatmap", "pp,cp"]
                                           + plot)
    assert "--plot DIR" in _err(capsys, base + ["--param", "preset=B512,B1024", "--heatmap", "preset,pp"])
    assert "16 hex digits" in _err(capsys, base + ["--param", "preset=B512", "--breakdown", "abc"] + plot)
    assert "no point of this sweep" in _err(capsys, base + ["--param", "preset=B512", "--breakdown",
                                                            "0123456789abcdef"] + plot)
    assert "-o DIR" in _err(capsys, ["sweep", DIGITS, "--param", "preset=B512"])
    assert "no model" in _err(capsys, ["sweep", "--param", "preset=B512", "-o", o])
    assert "unknown zoo model" in _err(capsys, ["sweep", "zoo:nope", "--param", "preset=B512", "-o", o])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    err = _err(capsys, ["sweep", DIGITS, "--param", "preset=B512", "-o", str(tmp_path / "mine"), "--cache", cache])
    assert "not a sweep's" in err and (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    assert not os.path.exists(o)                   # refused before any work: nothing written


def test_cli_model_failing_on_every_point_keeps_results(tmp_path, cache, capsys):
    """A 20x20 conv exceeds the DPU's 16x16 kernel: the model runs on the CPU at every point, each point a failed row
    with that reason; exit 2, the tables written."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, .1, (4, 3, 20, 20)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[20, 20])], "bigk",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 24, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "bigk.onnx"))
    o = tmp_path / "o"
    err = _err(capsys, ["sweep", str(tmp_path / "bigk.onnx"), "--param", "preset=B512,B4096", "-o", str(o),
                        "--cache", cache])
    assert "failed on every point" in err and "results are kept" in err and "kernel 20x20" in err
    rows = json.loads((o / "sweep.json").read_text())["rows"]
    assert len(rows) == 2 and all(r["status"] == "failed" and "CPU" in r["reason"] for r in rows)


@pytest.mark.parametrize("target", ["B512"])
def test_parametric_and_preset_points_agree(tmp_path, cache, digits, target):
    """The same array given as a preset or by its parameters is the same compiled program and the same row."""
    t = get_target(target)
    sp = S.spec_from_dict({"model": [{"zoo": "digits"}], "space": [
        {"points": [{"preset": target}, {"pp": t.pp, "cp": t.cp, "alu_pp": t.alu_pp}]}]})
    store = new_store(str(tmp_path / "s"))
    a, b = S.run(sp, [digits], store, cache, workers=1).rows
    assert a["target"] == b["target"] == t.name and a["cycles"] == b["cycles"]
    assert Target.parametric(t.pp, t.cp).fingerprint == t.fingerprint


# ---- RTL spot checks -------------------------------------------------------------------------------------------
def test_cli_verify_rtl_one_point(tmp_path, cache, capsys):
    """--verify-rtl 1: the digits CNN's best point (B512: as fast as B1024 with half the DSPs) on the RTL."""
    argv = ["sweep", DIGITS, "--param", "preset=B512,B1024", "-o", str(tmp_path / "o"), "--cache", cache,
            "--workers", "1", "--verify-rtl", "1"]
    assert cli(argv) == 0
    out = capsys.readouterr().out
    assert "verify-rtl preset=B512:" in out and "MATCH" in out and "1/1 Pareto points match" in out


@pytest.mark.slow
def test_cli_verify_rtl_three_pareto_points(tmp_path, cache, capsys):
    """--verify-rtl 3 on MobileNet v2 at 32x32: its fps-vs-DSP front is B512 < B1024 < B4096 (every larger array
    is faster); all three co-simulate bit and cycle exact."""
    argv = ["sweep", "zoo:mobilenet_v2@32", "--param", "preset=B512,B1024,B4096", "-o", str(tmp_path / "o"),
            "--cache", cache, "--workers", "1", "--verify-rtl", "3"]
    assert cli(argv) == 0
    out = capsys.readouterr().out
    for p in ("B512", "B1024", "B4096"):
        assert f"verify-rtl preset={p}:" in out
    assert "3/3 Pareto points match" in out and "MISMATCH" not in out


@pytest.mark.parametrize("text, must", [
    ("speed = 3\n[[model]]\nzoo = 'digits'\n[[space]]\npreset = ['B512']\n", "unknown key(s) speed"),
    ("[[model]]\nzoo = 'digits'\npath = 'x.onnx'\n[[space]]\npreset = ['B512']\n", "exactly one of zoo"),
    ("[[model]]\nzoo = 'digits'\n[[space]]\nbanks = [4]\n", "unknown parameter 'banks'"),
    ("[[model]]\nzoo = 'digits'\n[[space]]\nmode = 'random'\npp = [4]\ncp = [8]\n", "needs samples >= 1"),
    ("[[model]]\nzoo = 'digits'\n[[space]]\npreset = []\n", "no values (an empty space)"),
    ("[[model]]\nzoo = 'digits'\n", "no parameter space"),
    ("[[model]]\nzoo = 'digits'\n[[space]]\npreset = ['B512']\n[options]\nfuse_conv = 'maybe'\n", "fuse_conv"),
    ("[[model]\n", "not valid TOML"),
])
def test_cli_bad_spec_file(tmp_path, cache, capsys, text, must):
    p = tmp_path / "s.toml"
    p.write_text(text)
    err = _err(capsys, ["sweep", "--spec", str(p), "-o", str(tmp_path / "o"), "--cache", cache])
    assert must in err and (str(p) in err or "no parameter space" in err)
    assert not (tmp_path / "o" / "points").exists() or not os.listdir(tmp_path / "o" / "points")


def test_spec_paths_are_relative_to_the_file_and_checked_before_work(tmp_path, monkeypatch):
    """path and calib of a [[model]] are relative to the sweep file (not the working directory); validate_model
    reads the model with the quantizer's loader and checks that the calibration data fits its input."""
    import shutil

    import numpy as np

    from opendpu.quant import zoo
    d = tmp_path / "specs"
    d.mkdir()
    shutil.copyfile(zoo.DIGITS_ONNX, d / "net.onnx")
    np.save(d / "c.npy", zoo.digits_data()[0][:4].astype(np.float32))
    (d / "s.toml").write_text('[[model]]\npath = "net.onnx"\ncalib = "c.npy"\n[[space]]\npreset = ["B512"]\n')
    monkeypatch.chdir(tmp_path)
    m = S.load_spec("specs/s.toml").models[0]
    assert (m.source, m.calib) == (str(d / "net.onnx"), str(d / "c.npy"))
    S.validate_model(m)                                   # the digits images fit the [N, 1, 8, 8] input
    np.save(d / "c.npy", np.zeros((4, 3, 8, 8), np.float32))
    with pytest.raises(S.SweepError, match=r"c\.npy.*\[1, 1, 8, 8\]|\[1, 1, 8, 8\].*c\.npy"):
        S.validate_model(m)
    (d / "net.onnx").write_text("a text file, not a protobuf")
    with pytest.raises(S.SweepError, match="net.onnx: not an ONNX model"):
        S.validate_model(m)


def test_constraints_excluding_every_point_are_named_before_work():
    sp = spec({"preset": ["B1024", "B4096"]}, constraints=["dsp <= 100", "cores >= 1"])
    with pytest.raises(S.SweepError, match=r"dsp <= 100 excludes 2 of 2 \(dsp in the space: 194\.\.") as e:
        S.build_points(sp)
    assert "cores >= 1 excludes 0 of 2" in str(e.value)
    assert len(S.build_points(spec({"preset": ["B512", "B4096"]}, constraints=["dsp <= 100"]))) == 2
