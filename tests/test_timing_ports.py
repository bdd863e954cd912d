"""Bank ports (docs/bank-ports.md): request traces of single instructions and arbitration stalls in the
schedule, with every number worked out by hand in the test from the contract and the engine timings of
sim/ports.py's docstring (which were checked cycle by cycle against the RTL's BankArray enables).

Target T16 = B4096 (PP 8, CP = W = 16, ALU_PP 4, image banks 0..15, BIAS bank 33) with the small timing
numbers of tests/test_timing.py: fetch_latency 5 (word j is in the FIFO at cycle 5 + j), queue 4,
ddr_latency 7, 4 bytes per cycle and port, 2 ports, load_setup 3, save_setup 2, conv_latency 11,
alu_latency 13, elew_latency 17, init_cycles 1.
"""
import numpy as np
import pytest

from opendpu.isa.fields import Engine
from opendpu.isa.target import Target
from opendpu.sim import ports
from opendpu.sim.progen import random_program
from opendpu.sim.timing import instruction_traces, simulate
from test_timing import END, mk  # noqa: E402  (the hand-built instructions of the timing tests)

L, S, C, M = 1, 2, 4, 8
TM = dict(fetch_latency=5, fetch_fifo_words=32, queue_depth=4, ddr_latency=7, ddr_bytes_per_cycle=4,
          ddr_ports=2, load_setup=3, save_setup=2, conv_latency=11, alu_latency=13, elew_latency=17,
          init_cycles=1, end_cycles=1)
T16 = Target.from_name("B4096").with_timing(**TM)
BIAS = 33




def sets(trace):
    """{τ: (read banks, write banks)} of the non-empty τ of one instruction's trace."""
    rd, wr = trace
    return {t: (set(ports.mask_banks(rd[t])), set(ports.mask_banks(wr[t])))
            for t in range(len(rd)) if rd[t] or wr[t]}


# ---- request traces ---------------------------------------------------------------------------------
def test_trace_conv_rows_bias_writes():
    # kernel 2x1, vpp 2, cg 1, length 2: K = 2, N = 4 steps in τ 1..4. bank_id_in 6 (group 0, slot 6):
    # ky 0 -> slots 6, 7; ky 1 -> slots 7, 0 (wraps in the group). BIAS in τ 1. Columns written in
    # τ = 3 + K = 5 and 3 + 2K = 7, rows 0, 1 of bank_id_out 9: banks 9, 10. Cost 11 + 4 = 15.
    ci = mk("CONVINIT", kernel_h=2, valid_pixel_parallel=2)
    cv = mk("CONV", bank_id_in=6, bank_id_out=9, length=2, channel_group=1)
    tr = instruction_traces([ci, cv, END()], T16)
    assert len(tr[1][0]) == 15
    assert sets(tr[1]) == {1: ({6, 7, BIAS}, set()), 2: ({7, 0}, set()), 3: ({6, 7}, set()), 4: ({7, 0}, set()),
                           5: (set(), {9, 10}), 7: (set(), {9, 10})}
    assert sets(tr[0]) == {} and sets(tr[2]) == {}


def test_trace_conv_stride_padding_ignored():
    # stride_h 2, soi 1, kernel 3, vpp 3, bank_id_in 4 (PP 8): ky -> slot (1 + ky) // 2 = 0, 1, 1:
    # ky 0 rows in slots 4,5,6; ky 1, 2 in 5,6,7. Padding does not change the requests. K = 3·1·1.
    ci = mk("CONVINIT", kernel_h=3, stride_h=2, stride_offset_in=1, valid_pixel_parallel=3)
    cv = mk("CONV", bank_id_in=4, bank_id_out=0, length=1, channel_group=1, pad_top=2, pad_bottom=0)
    tr = sets(instruction_traces([ci, cv, END()], T16)[1])
    assert tr == {1: ({4, 5, 6, BIAS}, set()), 2: ({5, 6, 7}, set()), 3: ({5, 6, 7}, set()), 6: (set(), {0, 1, 2})}


def test_trace_alu_mode0_bias_per_output_line():
    # exec_mode 0, kernel 2x1, cg 2, length 1: KK = 2, output lines l = 0, 1 (g), N = 4 steps in τ 1..4;
    # step j: ky = j mod 2 -> rows of slots 3,4 (ky 0) or 4,5 (ky 1). BIAS in τ = 2 + l·KK = 2, 4.
    # Lines written in τ = 5 + (l+1)·KK = 7, 9: rows 0, 1 of bank_id_out 12 -> banks 12, 13. Cost 13 + 4.
    ai = mk("ALUINIT", exec_mode=0, kernel_h=2, channel_group=2, length=1)
    al = mk("ALU", bank_id_in=3, bank_id_out=12, valid_pixel_parallel=2, pad_top=1, pad_bottom=0)
    tr = instruction_traces([ai, al, END()], T16)[1]
    assert len(tr[0]) == 17
    assert sets(tr) == {1: ({3, 4}, set()), 2: ({4, 5, BIAS}, set()), 3: ({3, 4}, set()), 4: ({4, 5, BIAS}, set()),
                        7: (set(), {12, 13}), 9: (set(), {12, 13})}
    # other modes read no BIAS
    ai2 = mk("ALUINIT", exec_mode=3, kernel_h=2, channel_group=2, length=1)
    assert all(BIAS not in r for r, _ in sets(instruction_traces([ai2, al, END()], T16)[1]).values())


def test_trace_elew_share_pp_and_jump_bank():
    # input 0: share_pp on bank 5 (all rows one bank); input 1: bank 2, jump_bank 2: rows 2, 4, 6.
    # num 2, cg 1, length 2: N = 4 steps, k = j mod 2. Output lines in τ = 5 + 2·(q+1) = 7, 9, rows
    # r < 3 of bank_id_out 14: slots 6, 7, 0 of group 8 -> banks 14, 15, 8. Cost 17 + 4 = 21.
    e0 = mk("ELEWINIT", id=0, share_pp=1, bank_id_in=5)
    e1 = mk("ELEWINIT", id=1, bank_id_in=2, jump_bank=2)
    ew = mk("ELEW", num=2, valid_pixel_parallel=3, channel_group=1, length=2, bank_id_out=14)
    tr = instruction_traces([e0, e1, ew, END()], T16)[2]
    assert len(tr[0]) == 21
    assert sets(tr) == {1: ({5}, set()), 2: ({2, 4, 6}, set()), 3: ({5}, set()), 4: ({2, 4, 6}, set()),
                        7: (set(), {14, 15, 8}), 9: (set(), {14, 15, 8})}


def test_trace_load_masked_items_and_broadcast():
    # channel 24, jump_read 8 <= 24 <= 64: augmentation; pad_start 20: item bytes b = 4, 12, 20, 24;
    # lines = 2; 8 DDR bytes per cycle (2 ports x 4): cycles max(2, ceil(b/8)) = 2, 2, 3, 3, items start
    # in τ 1, 3, 5, 8; lines written one cycle after their read: τ 2,3 | 4,5 | 6,7 | 9,10.
    # Cost 3 + 7 + 10 = 20.
    ld = mk("LOAD", bank_id=4, channel=24, jump_read=8, pad_start=20, length=4, jump_write=2)
    tr = instruction_traces([ld, END()], T16)[0]
    assert len(tr[0]) == 20
    assert sets(tr) == {t: (set(), {4}) for t in (2, 3, 4, 5, 6, 7, 9, 10)}
    # broadcast: lines written in the loop cycle itself, 2 items x 2 lines: τ 1..4; cost 3 + 2·2
    bc = mk("LOAD", bank_id=7, channel=20, length=2, broadcast=7, jump_write=2)
    tr = instruction_traces([bc, END()], T16)[0]
    assert len(tr[0]) == 7 and sets(tr) == {t: (set(), {7}) for t in (1, 2, 3, 4)}
    # a LOAD of a parameter bank (CONVW 16) has no arbitrated request
    assert sets(instruction_traces([mk("LOAD", bank_id=16, channel=16), END()], T16)[0]) == {}


def test_trace_save_plain_argmax_const():
    # plain, channel 8: 1 line, ceil(8/4) = 2 beats -> item of 2 cycles, read in its first: τ 1, 3, 5.
    sv = mk("SAVE", bank_id=3, channel=8, length=3, jump_write=8)
    assert sets(instruction_traces([sv, END()], T16)[0]) == {t: ({3}, set()) for t in (1, 3, 5)}
    # argmax, channel 40: 3 lines, 1 byte = 1 beat -> 3 cycles per item, all reading: τ 1..6
    am = mk("SAVE", bank_id=3, channel=40, length=2, argmax=2)
    assert sets(instruction_traces([am, END()], T16)[0]) == {t: ({3}, set()) for t in range(1, 7)}
    # const_en reads no bank
    assert sets(instruction_traces([mk("SAVE", bank_id=3, channel=40, const_en=1), END()], T16)[0]) == {}


# ---- arbitration in the schedule ------------------------------------------------------------------
# Program [CONVINIT, CONV, ALUINIT, ALU, END]: words 0-3, 4-8, 9-14, 15-19, 20. CONVINIT F 8, d 9, s 10,
# e 11. CONV F 13, d 14, s 15. ALUINIT F 19, d 20, s 21, e 22. ALU F 24, d 25, s 26.
# CONV: kernel 1x1, vpp 4, bank_id_in 0, cg 1, length 40: reads banks 0..3 in τ 1..40 = cycles 16..55
# (BIAS in 16), writes banks 8..11 in τ 4..43 = cycles 19..58; cost 11 + 40 = 51, e 66.
# ALU: exec_mode 2, 1x1, cg 1, length 5, vpp 1: reads its bank in τ 1..5, writes bank 12 in τ 6..10;
# cost 13 + 5 = 18.
def _conv_alu(alu_bank):
    ci = mk("CONVINIT", C, C, valid_pixel_parallel=4)
    cv = mk("CONV", C, C | S, bank_id_in=0, bank_id_out=8, length=40, channel_group=1)
    ai = mk("ALUINIT", M, M, exec_mode=2, length=5)
    al = mk("ALU", M, M | S, bank_id_in=alu_bank, bank_id_out=12, valid_pixel_parallel=1)
    return simulate([ci, cv, ai, al, END(S | C | M)], T16)


def test_conv_alu_same_read_bank_stalls_alu():
    # ALU reads bank 0 from τ 1 = cycle 27, while the CONV (higher priority) reads banks 0..3 until
    # cycle 55: the ALU is not granted in cycles 27..55 (29 cycles), then runs τ 1..17 in 56..72.
    # e = 26 + 18 + 29 = 73.
    s = _conv_alu(0)
    assert list(s.start[:4]) == [10, 15, 21, 26]
    assert s.end[1] == 66 and s.stall_bank[1] == 0          # CONV is not stalled
    assert s.end[3] == 73 and s.stall_bank[3] == 29
    assert s.engine_stalls()["MISC"]["bank"] == 29 and s.engine_stalls()["CONV"]["bank"] == 0
    assert s.instruction_rows()[3]["stall_bank"] == 29
    # END waits for both retires: max(66, 73) -> starts 73, total 74
    assert s.total_cycles == 74


def test_disjoint_banks_never_stall():
    # ALU reads bank 4 (CONV reads 0..3) and writes bank 12 (CONV writes 8..11): e = 26 + 18 = 44.
    s = _conv_alu(4)
    assert s.end[3] == 44 and not s.stall_bank.any()


def test_load_conv_same_write_bank():
    # tests/test_timing.py::test_tokens_pair_in_order with both CONVs writing bank 0, LOAD 1's bank.
    # LOAD (cost 3 + 7 + 4·2 = 18; 4 items of 1 line and 2 DDR cycles: writes in τ 2, 4, 6, 8).
    # LOAD 1 starts 29: writes wanted in cycles 31, 33, 35, 37. CONV a starts 29 (kernel 1x1, cg 1,
    # length 1: K = 1) and writes bank 0 in τ 4 = cycle 33: the LOAD is not granted in 33, writes in 34,
    # 36, 38 instead: e = 29 + 18 + 1 = 48 (stall_bank 1). CONV b waits for that retire: s = 48, its
    # stall_token 48 - 41 = 7.
    ld = mk("LOAD", L, L | C, bank_id=0, length=4, channel=16, jump_write=1, reg_id=0)
    ci = mk("CONVINIT", C, C, kernel_h=1, kernel_w=1)
    cv = mk("CONV", C | L, C, length=1, channel_group=1)
    cvl = mk("CONV", C | L, C | S, length=1, channel_group=1)
    s = simulate([ld, ld, ci, cv, cvl, END(S | C)], T16)
    assert list(s.retire[:2]) == [29, 48]
    assert list(s.stall_bank[:2]) == [0, 1]
    assert list(s.start[3:5]) == [29, 48]
    assert list(s.stall_token[3:5]) == [4, 7]
    assert s.engine_stalls()["LOAD"]["bank"] == 1


def test_two_saves_one_bank():
    # 16 bytes per cycle: a SAVE item of channel 16 is 1 line = 1 beat, so a SAVE reads its bank in
    # τ 1..length. SAVE a (hp 0, own bit): F 9, d 10, s 11, length 20: reads cycles 12..31, cost
    # 2 + 20 + 7 = 29, e 40. SAVE b (hp 1, dpdon 0): F 14, d 15, s 16, length 3, same bank 5: unit 1 is
    # below unit 0, so it is not granted in 17..31 (15 cycles) and reads in 32..34: e = 16 + 12 + 15 = 43.
    t = T16.with_timing(ddr_bytes_per_cycle=16)
    a = mk("SAVE", S, 0, bank_id=5, length=20, channel=16, jump_write=16, reg_id=3, hp_id=0)
    b = mk("SAVE", 0, S, bank_id=5, length=3, channel=16, jump_write=16, reg_id=3, ddr_addr=1024, hp_id=1)
    s = simulate([a, b, END()], t)
    assert list(s.start[:2]) == [11, 16]
    assert list(s.end[:2]) == [40, 43] and list(s.stall_bank[:2]) == [0, 15]
    assert list(s.retire[:2]) == [40, 43]
    assert s.save_unit_bank_stalls() == {0: 0, 1: 15}
    # other banks: b ends at 16 + 12 = 28, retires in order after a: 40
    b2 = mk("SAVE", 0, S, bank_id=6, length=3, channel=16, jump_write=16, reg_id=3, ddr_addr=1024, hp_id=1)
    s2 = simulate([a, b2, END()], t)
    assert list(s2.end[:2]) == [40, 28] and list(s2.retire[:2]) == [40, 40] and not s2.stall_bank.any()


def test_read_and_write_of_one_bank_do_not_conflict():
    # CONV (as above) reads banks 0..3 in cycles 16..55; a LOAD (words 9-13: F 18, d 19, s 20) writes
    # bank 0 in τ 2, 4, 6, 8 = cycles 22..28 (item of 1 line, 2 DDR cycles): separate ports, no stall,
    # e = 20 + 18 = 38.
    ci = mk("CONVINIT", C, C, valid_pixel_parallel=4)
    cv = mk("CONV", C, C | S, bank_id_in=0, bank_id_out=8, length=40, channel_group=1)
    ld = mk("LOAD", L, L | S, bank_id=0, length=4, channel=16, jump_write=1)
    s = simulate([ci, cv, ld, END(S | C | L)], T16)
    assert s.start[2] == 20 and s.end[2] == 38 and not s.stall_bank.any()


def test_stalled_engine_does_not_block_lower_ones():
    # ALU (vpp 2, bank_id_in 3: reads banks 3, 4) is stalled by the CONV's reads of banks 0..3 in cycles
    # 27..55. A SAVE of bank 4 (unit 0, below MISC) reads in those cycles anyway: the stalled ALU's
    # request does not count. Program [CONVINIT, CONV, ALUINIT, ALU, SAVE, END]: SAVE words 20-24,
    # F 29, d 30, s 31, length 3 at 16 bytes per cycle: reads 32..34, e = 31 + 2 + 3 + 7 = 43.
    # The ALU: 29 stall cycles as before, e = 26 + 18 + 29 = 73.
    t = T16.with_timing(ddr_bytes_per_cycle=16)
    ci = mk("CONVINIT", C, C, valid_pixel_parallel=4)
    cv = mk("CONV", C, C | S, bank_id_in=0, bank_id_out=8, length=40, channel_group=1)
    ai = mk("ALUINIT", M, M, exec_mode=2, length=5)
    al = mk("ALU", M, M | S, bank_id_in=3, bank_id_out=12, valid_pixel_parallel=2)
    sv = mk("SAVE", S, 0, bank_id=4, length=3, channel=16, jump_write=16, reg_id=3)
    s = simulate([ci, cv, ai, al, sv, END(S | C | M)], t)
    assert s.start[4] == 31 and s.end[4] == 43 and s.stall_bank[4] == 0
    assert s.end[3] == 73 and s.stall_bank[3] == 29


# ---- consistency with a per-cycle replay ------------------------------------------------------------
def _replay_ends(instrs, target, sched):
    """Per-cycle arbitration (contract §2-3) over the expanded traces, with the schedule's start cycles:
    a granted write of n lines to a bank keeps its write port busy for the next n - 1 cycles, in which
    every write request to the bank is refused. Returns the end cycle of every instruction."""
    from opendpu.isa.fields import Engine
    tr = instruction_traces(instrs, target, lines=True)
    nu = 3 + target.timing.ddr_ports
    unit = {Engine.CONV: 0, Engine.MISC: 1, Engine.LOAD: 2}
    q = [[] for _ in range(nu)]
    for k in np.argsort(sched.start, kind="stable"):
        e = Engine(int(sched.engine[k]))
        u = unit.get(e, 3 + int(sched.port[k]) if sched.port[k] >= 0 else -1)
        if u >= 0:
            q[u].append(int(k))
    pos, tau, end = [0] * nu, {}, {}
    busy_until = [0] * 64
    t = 0
    while any(pos[u] < len(q[u]) for u in range(nu)):
        used_r = 0
        used_w = sum(1 << b for b in range(64) if busy_until[b] > t)
        for u in range(nu):
            if pos[u] >= len(q[u]) or sched.start[q[u][pos[u]]] > t:
                continue
            k = q[u][pos[u]]
            tk = tau.get(k, 0)
            r, w = int(tr[k][0][tk]), int(tr[k][1][tk])
            if (r & used_r) or (w & used_w):
                continue
            used_r |= r
            used_w |= w
            for b in ports.mask_banks(w):
                if tr[k][2][b] > 1:
                    busy_until[b] = t + int(tr[k][2][b])
            tau[k] = tk + 1
            if tk + 1 == sched.cost[k]:
                end[k] = t + 1
                pos[u] += 1
        t += 1
    return end


@pytest.mark.parametrize("tname,conflicts", [("small", False), ("small", True), ("B512", True), ("B4096", False)])
def test_schedule_matches_per_cycle_replay(tname, conflicts):
    t = (Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=256) if tname == "small"
         else Target.from_name(tname))
    stalled = multi = 0
    for seed in range(6):
        g = random_program(t, 50, seed=seed, bank_conflicts=conflicts)
        s = simulate(g.instructions, t)
        ends = _replay_ends(g.instructions, t, s)
        for k, e in ends.items():
            assert e == s.end[k], (seed, k)
        assert (s.end - s.start - s.cost == s.stall_bank).all()
        stalled += int((s.stall_bank > 0).sum())
        multi += sum(int((x[2] > 1).any()) for x in instruction_traces(g.instructions, t, lines=True))
    assert stalled > 0 and multi > 0          # stalls, and writes of several lines into one bank, occur


# ---- the write queue (docs/bank-ports.md §2: several lines of one bank in one write) ---------------
# Program [CONVINIT, CONV, END] as above: CONV s 15. CONVINIT stride_out 2, vpp 2, bank_id_out 8 (slot 0):
# rows h = 0, 1 go to slot (0 + h div 2) = 0, so every column writes 2 lines into bank 8.
def _so_conv(kernel, length, vpp=2, so=2):
    ci = mk("CONVINIT", C, C, valid_pixel_parallel=vpp, stride_out=so, kernel_h=kernel, kernel_w=kernel,
            jump_write_endl=16)
    cv = mk("CONV", C, C | S, bank_id_in=0, bank_id_out=8, length=length, channel_group=1)
    return ci, cv


def test_write_queue_lines_of_one_write():
    ci, cv = _so_conv(1, 5)
    tr = instruction_traces([ci, cv, END()], T16, lines=True)[1]
    assert tr[2][8] == 2 and tr[2].sum() == 2                    # 2 lines into bank 8, nothing else
    ci3 = mk("CONVINIT", valid_pixel_parallel=3, stride_out=2, stride_offset_out=1, jump_write_endl=16)
    cv3 = mk("CONV", bank_id_out=14, length=1, channel_group=1)
    # soo 1: rows 0, 1, 2 -> slots (6 + (1 + h) div 2) mod 8 = 6, 7, 7: banks 14 (1 line), 15 (2 lines)
    tr = instruction_traces([ci3, cv3, END()], T16, lines=True)[1]
    assert tr[2][14] == 1 and tr[2][15] == 2 and tr[2].sum() == 3


def test_stride_out_2_conv_one_cycle_columns_waits_for_its_queue():
    # 1x1, cg 1: K = 1, columns written in τ = 4 .. 8 (length 5), one every cycle. Each write puts 2
    # lines into bank 8: the second line keeps the port busy the next cycle, so every write after the
    # first is refused once: 4 stall cycles (the whole CONV freezes). e = 15 + (11 + 5) + 4 = 35.
    s = simulate([*_so_conv(1, 5), END(S | C)], T16)
    assert s.start[1] == 15 and s.cost[1] == 16
    assert s.stall_bank[1] == 4 and s.end[1] == 35
    assert s.engine_stalls()["CONV"]["bank"] == 4
    # stride_out 1 (rows in banks 8, 9, one line each): no stall, e = 31
    s1 = simulate([*_so_conv(1, 5, so=1), END(S | C)], T16)
    assert s1.stall_bank[1] == 0 and s1.end[1] == 31


def test_stride_out_2_conv_3x3_never_waits():
    # 3x3, cg 1: K = 9, columns written in τ = 12, 21, 30; the queue drains in τ 13, 22, 31: no stall.
    # e = 15 + 11 + 27 = 53.
    s = simulate([*_so_conv(3, 3), END(S | C)], T16)
    assert s.stall_bank[1] == 0 and s.end[1] == 53


@pytest.mark.parametrize("vpp,bank,stalls", [(2, 8, 6), (1, 8, 3), (2, 9, 0)])
def test_load_refused_while_the_queue_drains(vpp, bank, stalls):
    # The 3x3 CONV above writes bank 8 in cycles 15 + 12, 21, 30 = 27, 36, 45 (its queue drains in 28, 37,
    # 46). A LOAD (words 9-13: F 18, d 19, s 20; 16 DDR bytes per cycle: one cycle per 16-byte item, cost
    # 3 + 7 + 30 = 40) writes bank `bank` in τ 2..31, from cycle 22 on. Into bank 8 it is refused in the
    # CONV's write cycles and in the drain cycles: 27, 28, 36, 37, 45, 46 = 6 stalls, e = 20 + 40 + 6 =
    # 66. With vpp 1 the CONV writes 1 line (no queue): refused in 27, 36, 45 only, e = 63. Into bank 9
    # (not written by the CONV): e = 60.
    t = T16.with_timing(ddr_bytes_per_cycle=16)
    ci, cv = _so_conv(3, 3, vpp=vpp)
    ld = mk("LOAD", L, L | S, bank_id=bank, length=30, channel=16, jump_write=1)
    s = simulate([ci, cv, ld, END(S | C | L)], t)
    assert list(s.start[1:3]) == [15, 20]
    assert s.end[1] == 53 and s.stall_bank[1] == 0
    assert s.stall_bank[2] == stalls and s.end[2] == 60 + stalls
    ends = _replay_ends([ci, cv, ld, END(S | C | L)], t, s)
    assert ends[2] == s.end[2] and ends[1] == s.end[1]


def test_write_queue_random_mixes_match_the_replay():
    """Random CONV (1x1 / 3x3, stride_out 1..4), ALU (stride_out 1..4) and LOAD mixes on T16 without
    tokens between them (each engine's last instruction signals END), so they overlap freely: the
    schedule's ends equal the per-cycle replay's, and CONVs do wait for busy write ports."""
    t = T16.with_timing(ddr_bytes_per_cycle=16)
    rng = np.random.default_rng(3)
    conv_stalls = 0
    for seed in range(12):
        prog, last = [], {}
        for _ in range(int(rng.integers(6, 14))):
            kind = rng.choice(["conv", "alu", "load"])
            if kind == "conv":
                so = int(rng.integers(1, 5))
                k = int(rng.choice([1, 1, 3]))
                prog.append(mk("CONVINIT", valid_pixel_parallel=int(rng.integers(1, 9)), stride_out=so,
                               stride_offset_out=int(rng.integers(0, so)), kernel_h=k, kernel_w=k,
                               jump_write_endl=16))
                prog.append(mk("CONV", bank_id_in=int(rng.integers(0, 16)), bank_id_out=int(rng.integers(0, 16)),
                               length=int(rng.integers(1, 8)), channel_group=int(rng.integers(1, 3))))
                last["C"] = len(prog) - 1
            elif kind == "alu":
                so = int(rng.integers(1, 5))
                prog.append(mk("ALUINIT", exec_mode=2, length=int(rng.integers(1, 8)), stride_out=so,
                               stride_offset_out=int(rng.integers(0, so)), kernel_w=int(rng.integers(1, 3))))
                prog.append(mk("ALU", bank_id_in=int(rng.integers(0, 16)), bank_id_out=int(rng.integers(0, 16)),
                               valid_pixel_parallel=int(rng.integers(1, 5))))
                last["M"] = len(prog) - 1
            else:
                prog.append(mk("LOAD", bank_id=int(rng.integers(0, 16)), length=int(rng.integers(1, 12)),
                               channel=16, jump_write=1))
                last["L"] = len(prog) - 1
        on = S
        for e, k in last.items():
            bit = {"C": C, "M": M, "L": L}[e]
            prog[k] = mk(prog[k].op, 0, bit | S, **prog[k].fields)
            on |= bit
        prog.append(END(on))
        s = simulate(prog, t)
        ends = _replay_ends(prog, t, s)
        for k, e in ends.items():
            assert e == s.end[k], (seed, k, prog[k].op)
        assert (s.end - s.start - s.cost == s.stall_bank).all()
        conv_stalls += int(s.stall_bank[s.engine == Engine.CONV].sum())
    assert conv_stalls > 0
