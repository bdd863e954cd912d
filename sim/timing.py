"""Cycle model of one DPUCZDX8G core (docs/microarchitecture.md): when every instruction runs.

`simulate(program, target)` gives a `Schedule`: per-instruction fetch, dispatch, start, end and retire
cycles, stalls by cause, DDR traffic per register, engine busy time and the host-visible counters of the
register map (spec §2.7). With a `DpuMachine` it also executes the program functionally, in the order in
which the instructions start in the schedule, so results are checked under the timed order. A program
whose tokens can never be satisfied raises `DeadlockError` naming the blocked instructions; a run longer
than `Timing.watchdog_cycles` raises `WatchdogError`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.fields import OPS, Engine
from opendpu.isa.program import Instruction, OP_INDEX, ProgramArrays, to_arrays
from opendpu.isa.target import Target

from . import _kernels as K
from . import _timing as T
from . import ports as P
from .executor import DpuMachine, ExecError, _target_params, checked_arrays

_END = OP_INDEX["END"]


class DeadlockError(OpenDpuError, RuntimeError):
    """No engine can make progress: every non-empty queue waits for a token that cannot come."""

    def __init__(self, msg: str, blocked: list[dict], schedule: "Schedule"):
        super().__init__(msg)
        self.blocked = blocked
        self.schedule = schedule


class WatchdogError(OpenDpuError, RuntimeError):
    """The run exceeded Timing.watchdog_cycles."""


def timing_vector(target: Target) -> np.ndarray:
    tm = target.timing
    v = np.zeros(T.NTM, np.int64)
    v[T.TM_FETCH_LAT] = tm.fetch_latency
    v[T.TM_FIFO] = tm.fetch_fifo_words
    v[T.TM_QUEUE] = tm.queue_depth
    v[T.TM_DDR_LAT] = tm.ddr_latency
    v[T.TM_DDR_BPC] = tm.ddr_bytes_per_cycle
    v[T.TM_PORTS] = tm.ddr_ports
    v[T.TM_LD_SETUP] = tm.load_setup
    v[T.TM_SV_SETUP] = tm.save_setup
    v[T.TM_CONV_LAT] = tm.conv_latency
    v[T.TM_ALU_LAT] = tm.alu_latency
    v[T.TM_ELEW_LAT] = tm.elew_latency
    v[T.TM_INIT] = tm.init_cycles
    v[T.TM_END] = tm.end_cycles
    v[T.TM_WATCHDOG] = tm.watchdog_cycles
    v[T.TM_WLINES] = tm.weight_load_lines
    return v


@dataclass
class Schedule:
    """The timed execution of one program (all times in core cycles from ap_start)."""

    target: Target
    op: np.ndarray
    engine: np.ndarray
    cost: np.ndarray
    fetch: np.ndarray
    dispatch: np.ndarray
    start: np.ndarray
    end: np.ndarray
    retire: np.ndarray
    stall_token: np.ndarray
    stall_queue: np.ndarray
    stall_ddr: np.ndarray
    port: np.ndarray
    ddr_reg: np.ndarray
    ddr_read: np.ndarray
    ddr_write: np.ndarray
    token_source: np.ndarray      # [N, 4]: instruction whose signal each wait consumed, per producer engine
    complete: bool = True
    stall_bank: np.ndarray | None = None   # cycles in [start, end) the instruction lost the bank-port arbitration
    extra: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.op)

    @property
    def total_cycles(self) -> int:
        """Cycles from ap_start until END retires (ap_done), i.e. the EXEC_CYCLE register."""
        if not len(self.op):
            return 0
        ends = np.nonzero(self.op == _END)[0]
        if len(ends):
            return int(self.retire[ends[0]])
        return int(self.retire.max())

    @property
    def clock_mhz(self) -> float:
        return float(self.target.timing.clock_mhz)

    @property
    def latency_ms(self) -> float:
        return self.total_cycles / (self.clock_mhz * 1e3)

    def engine_busy(self) -> dict[str, int]:
        """Cycles in which each engine executes at least one instruction (union of [start, end))."""
        out = {}
        for e in Engine:
            m = self.engine == e
            out[e.name] = _union_length(self.start[m], self.end[m])
        return out

    def __post_init__(self):
        if self.stall_bank is None:
            self.stall_bank = np.zeros(len(self.op), np.int64)

    def _bank_stalls(self) -> np.ndarray:
        """`stall_bank`, never None after __post_init__."""
        assert self.stall_bank is not None, "Schedule.__post_init__ fills stall_bank"
        return self.stall_bank

    def engine_stalls(self) -> dict[str, dict[str, int]]:
        """Per engine: cycles its instructions waited for tokens / DDR ports; dispatch waits on a full queue;
        cycles its running instructions lost the bank-port arbitration (`bank`, docs/bank-ports.md)."""
        out = {}
        stall_bank = self._bank_stalls()
        for e in Engine:
            m = self.engine == e
            out[e.name] = dict(token=int(self.stall_token[m].sum()), ddr=int(self.stall_ddr[m].sum()),
                             queue_full=int(self.stall_queue[m].sum()), bank=int(stall_bank[m].sum()),
                             instructions=int(m.sum()))
        return out

    def save_unit_bank_stalls(self) -> dict[int, int]:
        """Bank-stall cycles per SAVE unit (AXI port hp_id mod ddr_ports)."""
        m = self.port >= 0
        stall_bank = self._bank_stalls()
        return {int(u): int(stall_bank[m & (self.port == u)].sum()) for u in np.unique(self.port[m])}

    def ddr_bytes(self) -> dict[str, dict[int, int]]:
        rd, wr = {}, {}
        for r in range(8):
            m = self.ddr_reg == r
            b = int(self.ddr_read[m].sum())
            if b:
                rd[r] = b
            b = int(self.ddr_write[m].sum())
            if b:
                wr[r] = b
        return {"read": rd, "write": wr}

    def counters(self) -> dict[str, int]:
        """Host register map after the run (spec §2.7): per-engine START/END = instructions started /
        completed by that engine (our decision, docs/decisions.md), EXEC_CYCLE = total cycles (64 bit)."""
        out = {}
        for e in Engine:                                # LSTART, LEND, SSTART, ... CEND, MSTART, MEND
            m = self.engine == e
            out[f"{e.name[0]}START"] = int(m.sum())
            out[f"{e.name[0]}END"] = int(m.sum())
        cyc = self.total_cycles
        out["EXEC_CYCLE_LO"] = cyc & 0xFFFFFFFF
        out["EXEC_CYCLE_HI"] = cyc >> 32
        return out

    def summary(self) -> dict:
        return dict(target=self.target.name, clock_mhz=self.clock_mhz, instructions=len(self),
                    total_cycles=self.total_cycles, latency_ms=self.latency_ms,
                    sum_of_costs=int(self.cost.sum()), engine_busy=self.engine_busy(),
                    stalls=self.engine_stalls(),
                    ddr_bytes={k: {f"REG_{r}": b for r, b in v.items()} for k, v in self.ddr_bytes().items()},
                    counters=self.counters(), timing=self.target.timing.to_dict())

    def instruction_rows(self) -> list[dict]:
        """One row per instruction, stable column names (CSV)."""
        rows = []
        stall_bank = self._bank_stalls()
        for i in range(len(self)):
            rows.append(dict(index=i, op=OPS[int(self.op[i])].mnemonic, engine=Engine(int(self.engine[i])).name,
                             fetch=int(self.fetch[i]), dispatch=int(self.dispatch[i]), start=int(self.start[i]),
                             end=int(self.end[i]), retire=int(self.retire[i]), cost=int(self.cost[i]),
                             stall_token=int(self.stall_token[i]), stall_queue=int(self.stall_queue[i]),
                             stall_ddr=int(self.stall_ddr[i]), stall_bank=int(stall_bank[i]),
                             ddr_reg=int(self.ddr_reg[i]),
                             ddr_read=int(self.ddr_read[i]), ddr_write=int(self.ddr_write[i])))
        return rows


def _union_length(s: np.ndarray, e: np.ndarray) -> int:
    if not len(s):
        return 0
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    reach = np.maximum.accumulate(e)
    prev = np.concatenate(([s[0]], reach[:-1]))
    return int(np.maximum(0, e - np.maximum(s, prev)).sum())


def _as_arrays(program) -> ProgramArrays:
    if isinstance(program, ProgramArrays):
        return program
    if isinstance(program, (list, tuple)) and (not program or isinstance(program[0], Instruction)):
        return to_arrays(list(program))
    raise TypeError(f"expected ProgramArrays or a list of Instruction, got {type(program).__name__}")


def simulate(program, target: Target, machine: DpuMachine | None = None) -> Schedule:
    """Time `program` on `target` (through its first END); execute it on `machine` too if one is given.

    Timing depends only on the instruction fields, never on data, so timing-only mode (no machine) is
    what sweeps use. Functional execution happens in schedule start order (ties in program order).
    """
    prog = _as_arrays(program)
    op, fl = checked_arrays(prog)
    if len(prog.dpdon) != len(op) or len(prog.dpdby) != len(op):
        raise ValueError(f"ProgramArrays: dpdon/dpdby must have {len(op)} entries")
    ends = np.nonzero(op == _END)[0]
    n = int(ends[0]) + 1 if len(ends) else len(op)
    tp = _target_params(target)
    tm = timing_vector(target)
    cost = np.zeros(n, np.int64)
    port = np.zeros(n, np.int64)
    ddr_reg = np.zeros(n, np.int64)
    ddr_rd = np.zeros(n, np.int64)
    ddr_wr = np.zeros(n, np.int64)
    err = np.zeros(3, np.int64)
    T.costs(op, fl, n, tp, tm, cost, port, ddr_reg, ddr_rd, ddr_wr, err)
    if err[0] != T.CE_NONE:
        i, mn = int(err[1]), OPS[int(err[2])].mnemonic
        if err[0] == T.CE_NOINIT:
            init = "CONVINIT" if mn == "CONV" else "ALUINIT"
            raise ExecError(i, mn, None, f"{mn} before any {init} (no {init} state, spec §5.3)")
        raise ExecError(i, mn, None, f"{mn} is not usable on ISA1 targets (no pool/dwconv engine, spec §3.4)")
    eng = T.ENGINE_OF_OP[op[:n]]
    words = T.WORDS_OF_OP[op[:n]]
    on = np.ascontiguousarray(prog.dpdon[:n], dtype=np.int64)
    by = np.ascontiguousarray(prog.dpdby[:n], dtype=np.int64)
    if target.num_banks > 63:
        raise ValueError(f"the bank-port model needs num_banks <= 63, target has {target.num_banks}")
    kind = np.zeros(n, np.int64)
    prm = np.zeros((n, P.NPRM), np.int64)
    rfoot = np.zeros(n, np.int64)
    wfoot = np.zeros(n, np.int64)
    P.trace_params(op, fl, n, tp, tm, kind, prm, rfoot, wfoot)
    bp = int(tm[T.TM_DDR_BPC] * tm[T.TM_PORTS])
    arrs = [np.zeros(n, np.int64) for _ in range(8)]
    info = np.zeros(10, np.int64)
    tok = np.zeros((2, T.NENG, T.NENG), np.int64)
    src = np.full((n, T.NENG), -1, np.int64)
    st_bank = np.zeros(n, np.int64)
    status = T.schedule(eng, on, by, words, cost, port, n, tm, *arrs, info, tok, src, kind, prm, rfoot, wfoot,
                        fl, bp, int(tp[K.T_CP]), st_bank)
    fetch, disp, start, end, ret, st_tok, st_q, st_ddr = arrs
    if status == T.ST_INTERNAL:
        raise AssertionError(f"cycle model: instruction {int(info[6])} would start before the resolved time")
    sched = Schedule(target, op[:n].copy(), eng, cost, fetch, disp, start, end, ret, st_tok, st_q, st_ddr,
                     port, ddr_reg, ddr_rd, ddr_wr, src, complete=status == T.ST_OK, stall_bank=st_bank)
    sched.extra["arbitration"] = dict(calls=int(info[7]), jumps=int(info[8]), steps=int(info[9]))
    if status == T.ST_DEADLOCK:
        raise _deadlock(sched, info, tok, on, tm)
    if status == T.ST_WATCHDOG:
        h = int(info[6])
        ret[h] = max(int(ret[h]), int(end[h]))
        raise WatchdogError(f"watchdog: instruction {h} ({OPS[int(op[h])].mnemonic}) retires at cycle "
                            f"{int(ret[h])}, beyond watchdog_cycles={target.timing.watchdog_cycles}")
    if machine is not None:
        execute_in_start_order(machine, prog, sched)
    return sched


def execute_in_start_order(machine: DpuMachine, program, sched: Schedule) -> None:
    """Execute `program` on `machine` in the start order of its schedule `sched` (from `simulate` of the same
    program and target; ties in program order), as `simulate(program, target, machine)` does. A schedule depends
    only on the instruction fields, so a caller running one program on many inputs times it once."""
    prog = _as_arrays(program)
    n = len(sched.op)
    idx = np.arange(n)
    order = np.lexsort((idx, sched.start))
    if sched.op[-1] == _END:                   # END retires last (done); keep it last for the executor
        order = np.concatenate((order[order != n - 1], [n - 1]))
    p = ProgramArrays(prog.op[order], prog.dpdon[order], prog.dpdby[order], prog.fields[order])
    machine.run(p, index_map=order)


def _deadlock(sched: Schedule, info, tok, dpdon, tm) -> DeadlockError:
    nd, nsched = int(info[0]), int(info[5])
    blocked, parts = [], []
    for e in Engine:
        name = e.name
        h = int(info[1 + e])
        if h < 0 or h >= nd:
            continue
        waits = []
        for p in Engine:
            if p != e and (int(dpdon[h]) >> p) & 1 and tok[1, p, e] <= tok[0, p, e]:
                waits.append(dict(producer=p.name, token=int(tok[0, p, e]) + 1, signalled=int(tok[1, p, e])))
        mn = OPS[int(sched.op[h])].mnemonic
        blocked.append(dict(index=h, op=mn, engine=name, waits=waits))
        w = "; ".join(f"token #{x['token']} {x['producer']}->{name} (only {x['signalled']} signalled)"
                      for x in waits)
        parts.append(f"instruction {h} ({mn}) at the head of the {name} queue waits for {w}")
    if nd < len(sched.op):
        en = Engine(int(sched.engine[nd])).name
        mn = OPS[int(sched.op[nd])].mnemonic
        blocked.append(dict(index=nd, op=mn, engine=en, waits=[], queue_full=True))
        parts.append(f"dispatch is stuck at instruction {nd} ({mn}): the {en} queue is full "
                     f"(depth {int(tm[T.TM_QUEUE])})")
    msg = (f"deadlock: {nsched} of {len(sched.op)} instructions started, then no engine can proceed: "
           + "; ".join(parts))
    return DeadlockError(msg, blocked, sched)


def instruction_traces(program, target, lines: bool = False) -> list[tuple]:
    """Per instruction (through the first END): (reads, writes) bank-port request masks (sim/ports.py) for
    every engine time τ < cost; raises AssertionError if a request run of sim/ports.request is wrong.
    With lines=True each entry is (reads, writes, nl): nl[b] = lines one write of the instruction puts
    into bank b (docs/bank-ports.md §2 write queue; 0 for a bank it does not write)."""
    prog = _as_arrays(program)
    op, fl = checked_arrays(prog)
    ends = np.nonzero(op == _END)[0]
    n = int(ends[0]) + 1 if len(ends) else len(op)
    tp = _target_params(target)
    tm = timing_vector(target)
    cost = np.zeros(n, np.int64)
    z = [np.zeros(n, np.int64) for _ in range(4)]
    err = np.zeros(3, np.int64)
    T.costs(op, fl, n, tp, tm, cost, *z, err)
    kind = np.zeros(n, np.int64)
    prm = np.zeros((n, P.NPRM), np.int64)
    rf = np.zeros(n, np.int64)
    wf = np.zeros(n, np.int64)
    P.trace_params(op, fl, n, tp, tm, kind, prm, rf, wf)
    bp = target.timing.ddr_bytes_per_cycle * target.timing.ddr_ports
    out: list[tuple] = []
    for i in range(n):
        rd = np.zeros(cost[i], np.int64)
        wr = np.zeros(cost[i], np.int64)
        bad = P.expand(kind[i], prm[i], fl[i], cost[i], bp, target.cp, rd, wr, True)
        if bad >= 0:
            raise AssertionError(f"instruction {i}: request run not constant at tau {bad}")
        if lines:
            nl = np.array([P.write_lines(prm[i], b) if kind[i] in (P.KD_CONV, P.KD_ALU) else
                           int((wf[i] >> b) & 1) for b in range(64)], np.int64)
            out.append((rd, wr, nl))
        else:
            out.append((rd, wr))
    return out


__all__ = ["simulate", "instruction_traces", "Schedule", "DeadlockError", "WatchdogError", "timing_vector"]
