"""Co-simulation: the same program on the RTL (hw/) and on the cycle model, compared bit for bit and
cycle for cycle.

For every program the cycle model (sim.timing.simulate with functional execution) gives the reference
start, end and retire cycle of each instruction, the total cycle count, the host counters and the final
DDR image. The RTL runs the program from the same initial DDR image (banks start at zero in both). Any
difference is a `Mismatch`; the report names the first diverging instruction (earliest in time) with
both values, and the first differing byte of each DDR register with the SAVEs that wrote it.
It lives in runtime, the one layer that may use both sim and hw (tests/test_layering.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from opendpu.isa.fields import OPS
from opendpu.isa.program import encode, to_arrays
from opendpu.isa.target import Target, TargetError, get_target
from opendpu.sim.executor import DpuMachine
from opendpu.sim.timing import simulate


@dataclass
class Mismatch:
    kind: str                 # "status", "cycles", "start", "end", "retire", "ddr", "counter"
    message: str
    instruction: int | None = None
    cycle: int | None = None


@dataclass
class CosimReport:
    name: str
    target: str
    instructions: int
    model_cycles: int
    rtl_cycles: int
    mismatches: list = field(default_factory=list)
    ddr_bytes: int = 0
    rtl_seconds: float = 0.0
    model_seconds: float = 0.0
    backend: str = "verilator"
    bank_stalls: int = 0          # engine-cycles refused by the bank-port arbiter (RTL LSTALL..MSTALL sum)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    @property
    def first(self) -> Mismatch | None:
        return self.mismatches[0] if self.mismatches else None

    def summary(self) -> str:
        head = (f"{self.name}: {self.instructions} instructions on {self.target} ({self.backend}): "
                f"cycle model {self.model_cycles} cycles, RTL {self.rtl_cycles} cycles, "
                f"{self.ddr_bytes} DDR bytes compared"
                + (f", {self.bank_stalls} bank-stall engine-cycles" if self.bank_stalls else ""))
        if self.ok:
            return head + " -- MATCH (every DDR byte, every start/end/retire cycle, counters)"
        lines = [head + f" -- {len(self.mismatches)} MISMATCH(ES)"]
        for mm in self.mismatches[:10]:
            lines.append("  " + mm.message)
        return "\n".join(lines)


_STALL_ENGINE = {"L": "LOAD", "C": "CONV", "S": "SAVE", "M": "MISC"}     # LSTALL ... MSTALL -> engine


def _op(instrs, k):
    return instrs[k].op


def compare(name, target, instrs, sched, machine, res, backend="verilator") -> CosimReport:
    """Compare an RTL result (hw.harness.RtlResult) with the cycle model's schedule and machine."""
    n = len(sched)
    rep = CosimReport(name, target.name or target.describe(), n, int(sched.total_cycles), int(res.cycles),
                      backend=backend)
    mm = rep.mismatches
    if res.status != "done":
        mm.append(Mismatch("status", f"the RTL did not raise ap_done within {res.waited} cycles "
                                     f"(the cycle model finishes at {sched.total_cycles}); DPU_STS={res.sts:#x}"))
    if res.sts:
        mm.append(Mismatch("status", f"the RTL reports DPU_STS={res.sts:#x} (1 = illegal opcode, "
                                     f"2 = SAVE reorder buffer overflow)"))
    # per-instruction cycles: the earliest divergence in time comes first
    cyc_mm = []
    for what, mod, rtl in (("start", sched.start, res.start), ("end", sched.end, res.end),
                           ("retire", sched.retire, res.retire)):
        mod = np.asarray(mod[:n], np.int64)
        rtl = np.asarray(rtl[:n], np.int64)
        bad = np.nonzero(mod != rtl)[0]
        for k in bad[:50]:
            cyc_mm.append((int(min(mod[k], rtl[k])), int(k), what, int(mod[k]), int(rtl[k])))
    cyc_mm.sort()
    for c, k, what, a, b in cyc_mm:
        eng = OPS[int(sched.op[k])].engine.name
        mm.append(Mismatch(what, f"instruction {k} ({_op(instrs, k)}, {eng} engine): {what} cycle RTL {b} "
                                 f"!= cycle model {a}", k, c))
    if res.cycles != sched.total_cycles and res.status == "done":
        mm.append(Mismatch("cycles", f"total cycles (EXEC_CYCLE) RTL {res.cycles} != cycle model "
                                     f"{sched.total_cycles}"))
    counters = sched.counters()
    for k, v in res.counters.items():
        if counters.get(k) != v:
            mm.append(Mismatch("counter", f"counter {k}: RTL {v} != cycle model {counters.get(k)}"))
    bank = {e: v["bank"] for e, v in sched.engine_stalls().items()}
    rtl_stalls = getattr(res, "bank_stalls", {})
    rep.bank_stalls = int(sum(rtl_stalls.values()))
    for k, v in rtl_stalls.items():      # LSTALL ... MSTALL, 32-bit RTL counters
        want = bank.get(_STALL_ENGINE.get(k[0], ""), 0) & 0xFFFFFFFF
        if want != v:
            mm.append(Mismatch("counter", f"bank-stall counter {k}: RTL {v} != cycle model {want} "
                                          "(docs/bank-ports.md)"))
    nbytes = 0
    for r in sorted(res.ddr):
        want = machine.ddr(r)
        got = res.ddr[r]
        nbytes += len(want)
        diff = np.nonzero(want != got)[0]
        if len(diff):
            a = int(diff[0])
            writers = _savers(instrs, r, a)
            mm.append(Mismatch("ddr", f"DDR REG_{r}: {len(diff)} byte(s) differ; first at offset {a:#x}: RTL "
                                      f"{int(got[a])} != cycle model {int(want[a])}"
                                      + (f" (written by instruction(s) {writers[:5]})" if writers else ""),
                               writers[-1] if writers else None))
    rep.ddr_bytes = nbytes
    return rep


def _savers(instrs, reg, addr):
    out = []
    for k, ins in enumerate(instrs):
        if ins.op != "SAVE" or ins.fields["reg_id"] != reg:
            continue
        f = ins.fields
        lo = f["ddr_addr"]
        hi = lo + (f["length"] - 1) * f["jump_write"] + f["channel"]
        if lo <= addr < hi:
            out.append(k)
    return out


def through_end(instrs):
    for k, ins in enumerate(instrs):
        if ins.op == "END":
            return instrs[:k + 1]
    return list(instrs)


def initial_machine(target, sizes, init) -> DpuMachine:
    """A zero-bank DpuMachine with registers `sizes` and the initial DDR images `init` written."""
    m = DpuMachine(target, dict(sizes), init_fill="zero")
    for r, d in init.items():
        m.write_ddr(r, 0, np.asarray(d, np.int8))
    return m


def rtl_job(name, instrs, sizes, init, sched, max_cycles: int | None = None):
    """The hw.harness.Job of a program that ends with its first END; the cycle bound comes from its
    schedule (twice the cycle model's total plus slack), so a broken RTL cannot hang the run."""
    from opendpu.hw.harness import Job
    bound = int(sched.total_cycles) * 2 + 10_000 if max_cycles is None else max_cycles
    return Job(encode(instrs), dict(sizes), {r: np.asarray(d, np.int8) for r, d in init.items()},
               ninstr=len(sched), max_cycles=bound, name=name, expect_cycles=int(sched.total_cycles))


def _stage(progress, prefix):
    """A progress callback that prefixes `what` with the stage name (None stays None)."""
    if progress is None:
        return None
    return lambda done, total, what: progress(done, total, f"{prefix}: {what}")


def cosim_programs(target, programs, backend: str = "verilator", log=None, timeout=None,
                   progress=None) -> list[CosimReport]:
    """Co-simulate several programs in one RTL simulator process.

    `programs` is a list of (name, instructions, reg_sizes, reg_init); reg_init maps reg -> int8 bytes.
    Banks keep their contents from one program to the next, as on the hardware (the bench resets the
    core's registers but not its memories), so the model of program k starts from the banks that
    program k-1 left; the first program starts from zero banks in both.

    `progress(done, total, what)` (optional) follows the stages in turn, `total` changing with the
    stage: "cycle model" (per program), "build" (hw.harness.build), "rtl" (hw.harness.run_jobs: per job
    and per simulated cycles), "compare" (per program).
    """
    from opendpu.hw.harness import build, ddr_needed, run_jobs
    t = get_target(target) if not isinstance(target, Target) else target
    prepared = []
    jobs = []
    need = 1 << 20
    banks = None
    programs = list(programs)
    model = _stage(progress, "cycle model")
    for k, (name, instrs, sizes, init) in enumerate(programs):
        if model:
            model(k, len(programs), name)
        instrs = through_end(instrs)
        m = initial_machine(t, sizes, init)
        if banks is not None:
            m.banks[...] = banks
        t0 = time.time()
        sched = simulate(to_arrays(instrs), t, machine=m)
        banks = m.banks.copy()
        prepared.append((name, instrs, sched, m, time.time() - t0))
        jobs.append(rtl_job(name, instrs, sizes, init, sched))
        need = max(need, ddr_needed(sizes))
    if model:
        model(len(programs), len(programs), "done")
    b = build(t, backend, ddr_bytes=need, log=log, progress=_stage(progress, "build"))
    results = run_jobs(b, jobs, timeout=timeout, progress=_stage(progress, "rtl"))
    reps = []
    cmp = _stage(progress, "compare")
    for k, ((name, instrs, sched, m, msec), res) in enumerate(zip(prepared, results)):
        if cmp:
            cmp(k, len(prepared), name)
        rep = compare(name, t, instrs, sched, m, res, backend)
        rep.rtl_seconds = res.wall_seconds
        rep.model_seconds = msec
        reps.append(rep)
    if cmp:
        cmp(len(prepared), len(prepared), "done")
    return reps


def subgraph_program(dsg, inputs):
    """(instructions, reg_sizes, initial DDR images) of a DPU subgraph with `inputs` written."""
    m = dsg.new_machine(init_fill="zero")
    dsg.write_inputs(m, dsg.check_inputs(inputs))
    init = {r: m.ddr(r).copy() for r in dsg.reg_sizes}
    return list(dsg.instructions), dict(dsg.reg_sizes), init


def check_target_matches(program_target: Target, target: Target, where: str) -> None:
    a, b = program_target, target
    if (a.pp, a.cp, a.alu_pp, a.bank_depth, a.img_bg) != (b.pp, b.cp, b.alu_pp, b.bank_depth, b.img_bg):
        raise TargetError(f"{where} was compiled for {a.name or a.describe()}; it cannot run on "
                         f"{b.name or b.describe()} (different bank layout)")


__all__ = ["CosimReport", "Mismatch", "compare", "cosim_programs", "rtl_job", "subgraph_program",
           "check_target_matches", "dump_waves"]


def waves_names(name: str) -> tuple[str, str]:
    """The VCD and .gtkw file names `dump_waves` writes for the program `name` (known before any run)."""
    stem = "".join(ch if ch.isalnum() else "_" for ch in name)[:60]
    return f"cosim_{stem}.vcd", f"cosim_{stem}.gtkw"


def dump_waves(target, program, rep: CosimReport, out_dir="waveforms", backend="verilator", margin=200,
               progress=None) -> str:
    """Re-run one program with VCD tracing around the first divergence; returns the VCD path.
    `progress` as in `cosim_programs` (stages "build" and "rtl"; the traced build is a separate one)."""
    from pathlib import Path
    from opendpu.hw.harness import build, ddr_needed, run_jobs
    name, instrs, sizes, init = program
    instrs = through_end(instrs)
    first = rep.first
    c = first.cycle if first and first.cycle is not None else max(rep.model_cycles - margin, 0)
    lo, hi = max(0, c - margin), c + margin
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vcd_name, gtkw_name = waves_names(name)
    vcd = (out / vcd_name).resolve()
    b = build(target, backend, ddr_bytes=ddr_needed(sizes), trace=True, progress=_stage(progress, "build"))
    job = rtl_job(name, instrs, sizes, init, simulate(to_arrays(instrs), target), max_cycles=hi + 10)
    run_jobs(b, [job], plusargs=[f"+vcd={vcd}", f"+vcd_from={lo}", f"+vcd_to={hi}"],
             progress=_stage(progress, "rtl"))
    sigs = ["tb_top.dut.cyc", "tb_top.dut.tr_start_v", "tb_top.dut.tr_end_v", "tb_top.dut.tr_ret_v",
            "tb_top.ddr_rd__en", "tb_top.ddr_rd__addr", "tb_top.ap_done"]
    (out / gtkw_name).write_text(
        f"[dumpfile] \"{vcd}\"\n" + "".join(f"{s}\n" for s in sigs))
    return str(vcd)
