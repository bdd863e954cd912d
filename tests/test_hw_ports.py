"""Bank ports and their arbitration in the RTL (docs/bank-ports.md), in Amaranth's simulator.

A test top holds every engine (CONV, MISC, LOAD, two SAVE units) on one BankArray, each frozen by its
grant as in the core, with a byte-addressed DDR model in the testbench. The testbench starts each
engine's instructions at chosen cycles (no control), records every start, end and refused cycle, and
compares every bank and DDR byte with the functional executor run on the same instructions in the order
given (each case keeps concurrent instructions on disjoint data, or orders them the way the hardware
does). The stall counts are worked out by hand in each case from the engine timelines of
docs/microarchitecture.md §3 and the priority CONV > MISC > LOAD > SAVE 0 > SAVE 1; every `end` must come
at start + cost + stalls (cost from the cycle model's formula).

Target: PP 2, CP 4, ALU_PP 2, W 4, depth 64: image banks 0, 1 (group 0) and 2, 3 (group 1), CONVW 4-7,
DWCONVW 8, BIAS 9. DDR bytes per cycle 16 >= W, so LOAD and SAVE items take one cycle per line. stride_out can put both
rows of a CONV / ALU into one bank: write queues of 1 entry, so conv_latency >= 4 + 1 and alu_latency >=
6 + 1 (hw/params.min_latency); this target uses exactly those.
"""
import os

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module

from opendpu.isa.program import to_arrays
from opendpu.isa.target import Target
from opendpu.sim.executor import DpuMachine
from opendpu.sim.timing import simulate

from opendpu.hw import iface
from opendpu.hw.banks import (BankArray, connect_conv, connect_load, connect_load_ddr, connect_misc,
                              connect_save, connect_save_ddr, freeze, write_lines)
from opendpu.hw.conv import ConvEngine
from opendpu.hw.loadsave import LoadEngine, SaveUnit
from opendpu.hw.misc import MiscEngine
from opendpu.hw.params import HwParams
from opendpu.hw.simutil import run_sim

from helpers import ins, instr_value

T = Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=64).with_timing(
    ddr_latency=3, load_setup=1, save_setup=1, conv_latency=5, alu_latency=7, elew_latency=6, init_cycles=1,
    ddr_bytes_per_cycle=16, ddr_ports=2)
ENGINES = ("conv", "misc", "load", "save0", "save1")
DDR_SIZE = 1024


class PortsTop(Elaboratable):
    """Every engine on one BankArray, frozen by its grant (as in hw/core.py); DDR ports exposed."""

    def __init__(self, p: HwParams):
        self.p = p
        self.banks = BankArray(p)
        self.conv, self.misc, self.load = ConvEngine(p), MiscEngine(p), LoadEngine(p)
        self.saves = [SaveUnit(p) for _ in range(p.ddr_ports)]
        self.ddr_rd = iface.ddr_read(p).create()
        self.ddr_wr = [iface.ddr_write(p).create() for _ in range(p.ddr_ports)]
        self.eng = {"conv": self.conv, "misc": self.misc, "load": self.load,
                    **{f"save{u}": s for u, s in enumerate(self.saves)}}
        self.go = {"conv": self.banks.conv_go, "misc": self.banks.misc_go, "load": self.banks.load_go,
                   **{f"save{u}": self.banks.save_go[u] for u in range(p.ddr_ports)}}

    def elaborate(self, platform):
        m = Module()
        m.submodules.banks = b = self.banks
        for name, e in self.eng.items():
            m.submodules[name] = freeze(e, self.go[name])
        connect_conv(m, self.conv, b)
        connect_misc(m, self.misc, b)
        connect_load(m, self.load, b)
        connect_load_ddr(m, self.load, self.ddr_rd, b.load_go)
        for u, s in enumerate(self.saves):
            connect_save(m, s, b, u)
            connect_save_ddr(m, s, self.ddr_wr[u], b.save_go[u])
        return m


def run(sched, seed=0, name="ports", extra=20):
    """Run `sched` = [(engine, earliest start cycle, Instruction)] (executor order) on the RTL top and on
    the executor; returns per instruction (start, end, cost) and per engine the refused cycles."""
    p = HwParams.of(T)
    W, D, nb = T.bank_width, T.bank_depth, T.num_banks
    rng = np.random.default_rng(seed)
    pre = rng.integers(-128, 128, size=(nb, D * W), dtype=np.int8)
    ddr0 = rng.integers(-128, 128, size=DDR_SIZE, dtype=np.int8)
    prog = [i for _, _, i in sched]
    mach = DpuMachine(T, {0: DDR_SIZE}, init_fill="zero")
    mach.banks[:] = pre
    mach.write_ddr(0, 0, ddr0)
    mach.run(to_arrays(prog))
    want_banks, want_ddr = mach.banks.copy(), mach.ddr(0).copy()
    costs = [int(c) for c in simulate(to_arrays(prog), T).cost]

    top = PortsTop(p)
    queues = {e: [(k, s, i) for k, (e2, s, i) in enumerate(sched) if e2 == e] for e in ENGINES}
    start, end = {}, {}
    refused = {e: [] for e in ENGINES}
    got = {}
    ddr = bytearray(ddr0.view(np.uint8).tobytes())

    async def tb(ctx):
        u8 = pre.view(np.uint8).reshape(nb, D, W)
        for b in range(nb):
            for ln in range(D):
                ctx.set(top.banks.line(b, ln), int.from_bytes(u8[b, ln].tobytes(), "little"))
        for e in top.eng.values():
            for k in range(8):
                if hasattr(e, "ddr_base"):
                    ctx.set(e.ddr_base[k], 0)
        running = {e: None for e in ENGINES}
        horizon = max(s for _, s, _ in sched) + sum(costs) + extra
        rd_pending = None
        for cyc in range(horizon):
            # DDR read data of the previous cycle's read; garbage when there was none (hold registers)
            if rd_pending is None:
                ctx.set(top.ddr_rd.data, int.from_bytes(rng.bytes(W), "little"))
            else:
                a = rd_pending
                ctx.set(top.ddr_rd.data, int.from_bytes(bytes(ddr[a:a + W]).ljust(W, b"\0"), "little"))
            for e in ENGINES:
                ctl = top.eng[e].ctl
                if ctx.get(ctl.end):
                    assert running[e] is not None, f"spurious end of {e} at cycle {cyc}"
                    end[running[e]] = cyc
                    running[e] = None
                go = top.go[e]
                if go is not None and not ctx.get(go):
                    assert running[e] is not None, f"{e} refused while idle at cycle {cyc}"
                    refused[e].append(cyc)
                q = queues[e]
                if running[e] is None and q and cyc >= q[0][1]:
                    k, _, i = q.pop(0)
                    ctx.set(ctl.instr, instr_value(i))
                    ctx.set(ctl.start, 1)
                    assert go is None or ctx.get(go), f"{e} started in a refused cycle {cyc}"
                    start[k] = cyc
                    running[e] = k
                else:
                    ctx.set(ctl.start, 0)
                    ctx.set(ctl.instr, 0)
            rd_pending = ctx.get(top.ddr_rd.addr) if ctx.get(top.ddr_rd.en) else None
            for w in top.ddr_wr:
                if ctx.get(w.en):
                    a, data, mask = ctx.get(w.addr), ctx.get(w.data), ctx.get(w.mask)
                    for j in range(p.ddr_wr_bytes):
                        if mask >> j & 1:
                            ddr[a + j] = data >> (8 * j) & 0xFF
            await ctx.tick()
        assert all(r is None for r in running.values()) and not any(queues.values()), "instructions left"
        got["banks"] = np.zeros_like(pre)
        for b in range(nb):
            row = b"".join(ctx.get(top.banks.line(b, ln)).to_bytes(W, "little") for ln in range(D))
            got["banks"][b] = np.frombuffer(row, np.int8)

    run_sim(top, tb, name=name)
    diff = np.argwhere(got["banks"] != want_banks)
    assert not len(diff), (f"{len(diff)} bank bytes differ; first bank {diff[0][0]} line {diff[0][1] // W}: "
                           f"rtl {got['banks'][tuple(diff[0])]} executor {want_banks[tuple(diff[0])]}")
    gd = np.frombuffer(bytes(ddr), np.int8)
    bad = np.nonzero(gd != want_ddr)[0]
    assert not len(bad), f"{len(bad)} DDR bytes differ, first at {bad[0]}"
    assert (want_banks != pre).any() or (want_ddr != ddr0).any()    # the instructions did something
    res = {k: (start[k], end[k], costs[k]) for k in range(len(sched))}
    return res, refused


def check_ends(res, refused, sched):
    """Every end is start + cost + the engine's refused cycles inside [start, end)."""
    for k, (s, e, c) in res.items():
        eng = sched[k][0]
        st = sum(1 for x in refused[eng] if s <= x < e)
        assert e == s + c + st, f"instruction {k} ({eng}): end {e} != {s} + {c} + {st}"


# ---- instructions ----------------------------------------------------------------------------------
def convinit(vpp=2, stride_out=1, jump_write_endl=1, kernel=1):
    return ins("CONVINIT", jump_read=1, shift_cut=6, act_type=0, jump_read_endl=1, shift_bias=1,
               stride_out=stride_out, jump_write=1, stride_offset_in=0, valid_pixel_parallel=vpp,
               kernel_h=kernel, stride_h=1, jump_write_endl=jump_write_endl, stride_offset_out=0,
               kernel_w=kernel, stride_w=1)


def conv(bank_in, addr_in, bank_out, addr_out, length):
    """1x1 CONV, one line group: `length` steps, one per cycle; step j reads line addr_in + j of the two
    banks of bank_in's group and (4 cycles later) writes line addr_out + j of the two banks of bank_out's."""
    return ins("CONV", bank_addr_in=addr_in, bank_addr_out=addr_out, channel_group=1, bank_addr_weights=3,
               bank_id_in=bank_in, length=length, bank_addr_bias=5, bank_id_out=bank_out,
               bank_addr_in_1=addr_in, bank_addr_in_2=addr_in, bank_addr_in_3=addr_in)


def aluinit(mode, length, kw=2):
    return ins("ALUINIT", kernel_w=kw, kernel_h=1, exec_mode=mode, stride_w=kw, stride_h=1, length=length,
               channel_group=1, stride_out=1, shift_cut=4, shift_bias=0, act_type=0, jump_read_endl=1,
               jump_read=1, multi_factor=1, jump_write_endl=1, jump_write=1, jump_read_weights=1)


def alu(bank_in, addr_in, bank_out, addr_out, **kw):
    return ins("ALU", bank_addr_out=addr_out, bank_id_out=bank_out, bank_addr_in=addr_in, bank_id_in=bank_in,
               valid_pixel_parallel=2, bank_addr_in_1=addr_in, bank_addr_in_2=addr_in, bank_addr_in_3=addr_in,
               bank_addr_weights=7, bank_addr_bias=11, kernel_d=1, **kw)


def load(bank, addr, lines, ddr_addr):
    return ins("LOAD", bank_addr=addr, bank_id=bank, jump_write=lines, jump_read=4 * lines + 4, length=1,
               channel=4 * lines, ddr_addr=ddr_addr)


def save(bank, addr, lines, ddr_addr, hp=0):
    return ins("SAVE", bank_addr=addr, bank_id=bank, jump_read=lines, jump_write=4 * lines, length=1,
               channel=4 * lines, ddr_addr=ddr_addr, hp_id=hp)


# ---- hand cases ----------------------------------------------------------------------------------------
def test_structure_one_read_one_write_port_per_bank():
    """Every bank memory has exactly one read port and one write port (block RAM, simple dual port);
    stride_out 2 can put two output rows of one CONV into one bank, so each image bank has a write queue
    of write_lines() - 1 = 1 entry."""
    from amaranth.hdl import Fragment
    p = HwParams.of(T)
    banks = BankArray(p)
    Fragment.get(banks, None)
    assert banks.lines == write_lines(p) == 2
    for b, mem in enumerate(banks.mems):
        assert len(mem.read_ports) == 1, (b, len(mem.read_ports))
        assert len(mem.write_ports) == 1, (b, len(mem.write_ports))
    # the wide weight path: each CONVW bank is two half-depth memories, each with one read and one write port
    wide = BankArray(HwParams.of(T.with_timing(weight_load_lines=2)))
    Fragment.get(wide, None)
    convw = range(T.convw_base, T.convw_base + T.ocp)
    assert [b for b, mem in enumerate(wide.mems) if mem is None] == list(convw) and sorted(wide.halves) == list(convw)
    for b, hv in wide.halves.items():
        for mem in hv:
            assert mem.depth == T.bank_depth // 2 and len(mem.read_ports) == 1 and len(mem.write_ports) == 1, b


def test_min_latency_covers_the_write_queue():
    """conv_latency / alu_latency below pipeline depth + (write_lines - 1) are refused."""
    from opendpu.hw.params import HwError, min_latency
    assert min_latency(T)["conv_latency"] == 5 and min_latency(T)["alu_latency"] == 7
    for k in ("conv_latency", "alu_latency"):
        with pytest.raises(HwError, match="write-queue"):
            HwParams.of(T.with_timing(**{k: min_latency(T)[k] - 1}))
    one = Target.parametric(pp=1, cp=4, alu_pp=1, bank_depth=64)       # one row: no queue
    assert min_latency(one)["conv_latency"] == 4 and min_latency(one)["alu_latency"] == 6


def test_conv_and_misc_read_one_bank_misc_stalls():
    """CONV (1x1, 10 steps, cycles 7-16) reads banks 0, 1 while an ALU max pool (8 steps from cycle 4)
    reads banks 0, 1 too. MISC's steps run in cycles 4, 5, 6; from cycle 7 CONV wins both banks, so MISC
    is refused in cycles 7..16 = 10 cycles and finishes its steps in 17..21: end = 3 + (6 + 8) + 10 = 27.
    MISC's step-3 data (read in cycle 6) reaches it through its hold register, because CONV re-uses
    the read ports while MISC is frozen. (alu_latency 7: end = 3 + (7 + 8) + 10 = 28.)"""
    sched = [("conv", 0, convinit()), ("misc", 0, aluinit(3, 4)),
             ("misc", 3, alu(0, 32, 2, 40)), ("conv", 6, conv(0, 0, 2, 0, 10))]
    res, refused = run(sched, seed=1, name="ports_conv_misc")
    assert res[2][0] == 3 and res[3][0] == 6
    assert refused["misc"] == list(range(7, 17))
    assert res[2][1] == 28
    assert res[3][1] == 6 + 5 + 10                 # CONV, first in priority, is not refused
    assert not refused["conv"] and not refused["load"] and not refused["save0"] and not refused["save1"]
    check_ends(res, refused, sched)


def test_conv_and_misc_share_the_bias_port():
    """ALU mode 0 (depthwise, bias) from cycle 3: its first step issues in cycle 4 and reads the BIAS line
    in cycle 5 (S1). A CONV started in cycle 4 reads its BIAS line in cycle 5 too, and reads group 1
    (banks 2, 3) while MISC reads group 0: the only conflict is the BIAS port in cycle 5, so MISC
    stalls exactly 1 cycle. Each later output line's bias read (kw = 2: cycles of odd steps) no longer
    meets CONV's single bias read."""
    sched = [("conv", 0, convinit()), ("misc", 0, aluinit(0, 3)),
             ("misc", 3, alu(0, 20, 3, 50)), ("conv", 4, conv(2, 0, 0, 50, 6))]
    res, refused = run(sched, seed=2, name="ports_bias")
    assert res[2][0] == 3 and res[3][0] == 4
    assert refused["misc"] == [5]
    assert res[2][1] == 3 + 7 + 6 + 1
    check_ends(res, refused, sched)


def test_load_and_conv_write_one_bank_load_stalls():
    """CONV from cycle 10 writes banks 2, 3 in cycles 14..23 (10 columns). A LOAD of 5 lines into bank 2
    starts in cycle 12: DDR reads from 13, its first bank write would be in cycle 14 and is refused until
    CONV's last write (cycle 23): 10 stall cycles; the 5 writes follow in 24..28. Its DDR data of cycle
    13 is held while it is frozen (the DDR model returns garbage in cycles without a read)."""
    sched = [("conv", 0, convinit()), ("conv", 10, conv(0, 0, 2, 0, 10)), ("load", 12, load(2, 30, 5, 64))]
    res, refused = run(sched, seed=3, name="ports_load_conv")
    assert res[1][0] == 10 and res[2][0] == 12
    assert refused["load"] == list(range(14, 24))
    assert res[2][1] == 12 + res[2][2] + 10
    check_ends(res, refused, sched)


@pytest.mark.parametrize("load_bank,stalls", [(2, 20), (3, 0)])
def test_stride_out_2_conv_one_cycle_columns(load_bank, stalls):
    """CONVINIT stride_out 2: both output rows of every column go to bank 2 (lines w and 32 + w). The 1x1
    CONV (from cycle 10, 10 columns of one step) writes its first column in cycle 14: row 0's line in 14,
    row 1's from the queue in 15, when the port is busy, so the CONV's next write is refused in 15 (the
    whole CONV freezes) and granted in 16: the CONV writes in 14, 16, ..., 32 and is refused in 15, 17,
    ..., 31 (9 cycles), end = 10 + (5 + 10) + 9 = 34 (the last queued line is written in 33). A LOAD into
    bank 2 from cycle 12 (first write wanted in 14) finds the port taken by the CONV or its queue in
    every cycle 14..33 (20 stalls) and writes its 5 lines in 34..38; a LOAD into bank 3 is never refused."""
    sched = [("conv", 0, convinit(stride_out=2, jump_write_endl=32)), ("conv", 10, conv(0, 0, 2, 0, 10)),
             ("load", 12, load(load_bank, 20, 5, 64))]
    res, refused = run(sched, seed=7, name=f"ports_stride_out_{load_bank}")
    assert refused["conv"] == list(range(15, 32, 2))
    assert res[1][1] == 34 and res[1][2] == 15
    assert refused["load"] == list(range(14, 14 + stalls))
    assert res[2][1] == 12 + res[2][2] + stalls
    check_ends(res, refused, sched)


@pytest.mark.parametrize("load_bank,refusals", [(2, [22, 23, 31, 32, 40, 41]), (3, [])])
def test_stride_out_2_conv_3x3_never_waits_load_refused_in_drain_cycles(load_bank, refusals):
    """3x3 CONV, stride_out 2, cg 1 (9 steps per column), length 3, from cycle 10: columns written in
    cycles 10 + 3 + 9 (w+1) = 22, 31, 40, the queued row-1 lines in 23, 32, 41. The CONV is never refused
    (its next write comes 9 cycles later): end = 10 + 5 + 27 = 42. A LOAD of 26 lines into bank 2 from
    cycle 12 (writes wanted every cycle from 14) is refused exactly in the CONV's write cycles and the
    drain cycles; into bank 3 never."""
    sched = [("conv", 0, convinit(stride_out=2, jump_write_endl=32, kernel=3)),
             ("conv", 10, conv(0, 0, 2, 0, 3)), ("load", 12, load(load_bank, 36, 26, 64))]
    res, refused = run(sched, seed=8, name=f"ports_stride_out_3x3_{load_bank}")
    assert not refused["conv"] and res[1][1] == 42
    assert refused["load"] == refusals
    assert res[2][1] == 12 + res[2][2] + len(refusals)
    check_ends(res, refused, sched)


def test_two_save_units_read_one_bank():
    """SAVE unit 1 reads bank 1 (4 lines) from cycle 5: reads in 6, 7. SAVE unit 0 starts in cycle 7
    on the same bank and, first in priority, reads in 8..11; unit 1 is refused in 8..11 (4 cycles) and
    reads its last 2 lines in 12, 13. Its line of cycle 7 is kept by its hold register while unit 0's
    reads pass through the shared port."""
    sched = [("save1", 5, save(1, 10, 4, 100, hp=1)), ("save0", 7, save(1, 40, 4, 200))]
    res, refused = run(sched, seed=4, name="ports_two_saves")
    assert res[0][0] == 5 and res[1][0] == 7
    assert refused["save1"] == [8, 9, 10, 11] and not refused["save0"]
    assert res[0][1] == 5 + res[0][2] + 4
    check_ends(res, refused, sched)


def test_read_and_write_of_one_bank_do_not_conflict():
    """LOAD (from cycle 3) writes lines 0..3 of bank 0 in cycles 5..8 while SAVE unit 0 (from cycle 4)
    reads the same lines of bank 0 in the same cycles: separate ports, nobody is refused, and the SAVE
    sees the old lines (read-first), as the executor running the SAVE before the LOAD."""
    sched = [("save0", 4, save(0, 0, 4, 300)), ("load", 3, load(0, 0, 4, 400))]
    res, refused = run(sched, seed=5, name="ports_rw_load_save")
    assert res[0][0] == 4 and res[1][0] == 3
    assert not any(refused.values()), refused
    check_ends(res, refused, sched)


def test_compute_engines_read_what_the_other_writes_without_conflict():
    """CONV (steps 3..12) reads banks 0, 1 and writes banks 2, 3 (cycles 6..15); an ALU max pool (steps
    4..11) reads banks 2, 3 and writes banks 0, 1 (other lines): reads and writes of one bank in one
    cycle use its two ports, so neither engine is refused."""
    sched = [("conv", 0, convinit()), ("misc", 0, aluinit(3, 4)),
             ("misc", 3, alu(2, 30, 0, 40)), ("conv", 2, conv(0, 10, 2, 0, 10))]
    res, refused = run(sched, seed=6, name="ports_rw_conv_misc")
    assert res[2][0] == 3 and res[3][0] == 2
    assert not any(refused.values()), refused
    check_ends(res, refused, sched)


def test_harness_detects_a_wrong_stall_expectation():
    """The end rule is checked against the observed refusals: a forged refusal list fails it."""
    sched = [("save1", 5, save(1, 10, 4, 100, hp=1)), ("save0", 7, save(1, 40, 4, 200))]
    res, refused = run(sched, seed=4, name="ports_two_saves_neg")
    refused = dict(refused, save1=refused["save1"][:-1])
    with pytest.raises(AssertionError, match="end"):
        check_ends(res, refused, sched)


# ---- whole core (Verilator): the stall counters of the register map --------------------------------
def test_core_stall_counters_explain_every_delay():
    """Random programs on the whole core (Verilator bench): every DDR byte equals the executor's; per
    engine, the bank-stall counter read over the register bus (LSTALL 0x1B0 ... MSTALL 0x1BC) equals the
    sum over its instructions of end - start - cost, each term >= 0; a program
    without stalls is cycle-exact with the cycle model, and any other difference is in cycles only."""
    from opendpu.isa.fields import OPS, Engine
    from opendpu.hw.harness import build, ddr_needed, run_jobs
    from opendpu.runtime.cosim import compare, initial_machine, rtl_job, through_end
    from opendpu.sim.progen import random_program
    small = Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=256)
    name = {Engine.LOAD: "LSTALL", Engine.CONV: "CSTALL", Engine.SAVE: "SSTALL", Engine.MISC: "MSTALL"}
    prepared, jobs, need, banks = [], [], 1 << 20, None
    for s in range(8):
        g = random_program(small, 40, seed=s)
        instrs = through_end(g.instructions)
        m = initial_machine(small, g.reg_sizes, g.reg_init)
        if banks is not None:
            m.banks[...] = banks                    # the bench keeps banks from one program to the next
        sched = simulate(to_arrays(instrs), small, machine=m)
        banks = m.banks.copy()
        prepared.append((instrs, sched, m))
        jobs.append(rtl_job(f"seed {s}", instrs, g.reg_sizes, g.reg_init, sched))
        need = max(need, ddr_needed(g.reg_sizes))
    results = run_jobs(build(small, ddr_bytes=need), jobs)
    total = 0
    for (instrs, sched, m), res in zip(prepared, results):
        rep = compare("p", small, instrs, sched, m, res)
        assert res.status == "done" and res.sts == 0
        extra = dict.fromkeys(name.values(), 0)
        for k, i in enumerate(instrs[:-1]):         # the END is not an engine instruction
            d = int(res.end[k]) - int(res.start[k]) - int(sched.cost[k])
            assert d >= 0, (k, i.op, d)
            extra[name[OPS[int(sched.op[k])].engine]] += d
        assert res.bank_stalls == extra, (res.bank_stalls, extra)
        if not sum(extra.values()):
            assert rep.ok, rep.summary()
        assert {mm.kind for mm in rep.mismatches} <= {"start", "end", "retire", "cycles"}, rep.summary()
        total += sum(extra.values())
    assert total > 0                                # the random programs do contend for banks
