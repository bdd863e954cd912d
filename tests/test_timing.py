"""Cycle model (docs/microarchitecture.md): every formula on hand-built programs, with the expected
cycle counts worked out by hand in each test. Also token, queue, port, deadlock and watchdog rules, and
the shared models."""
import numpy as np
import pytest

from opendpu.isa.fields import FIELDS
from opendpu.isa.program import Instruction, to_arrays
from opendpu.isa.target import Target, TargetError
from opendpu.sim.executor import DpuMachine, ExecError
from opendpu.sim.timing import DeadlockError, WatchdogError, simulate

L, S, C, M = 1, 2, 4, 8          # dpdon/dpdby bits: LOAD, SAVE, CONV, MISC

# Distinct small timing numbers so that each term of a formula is visible in the result.
TM = dict(fetch_latency=5, fetch_fifo_words=32, queue_depth=4, ddr_latency=7, ddr_bytes_per_cycle=4,
          ddr_ports=2, load_setup=3, save_setup=2, conv_latency=11, alu_latency=13, elew_latency=17,
          init_cycles=1, end_cycles=1)
T16 = Target.from_name("B4096").with_timing(**TM)          # PP 8, CP = W = 16


def mk(op, on=0, by=0, **kw):
    f = {fd.name: fd.lo for fd in FIELDS[op]}
    f.update(kw)
    return Instruction(op, on, by, f)


def END(on=S):
    return mk("END", on, S)


def time_one(x, engine_bit, target=T16, extra=()):
    """Program: [*extra, x, END]; x signals END's engine so that END waits for x."""
    x = Instruction(x.op, x.dpdon | engine_bit, x.dpdby | engine_bit | S, x.fields)
    prog = list(extra) + [x, END(S | engine_bit)]
    return simulate(prog, target)


def words_before(prog_ops):
    w = {"LOAD": 5, "SAVE": 5, "CONV": 5, "CONVINIT": 4, "ALUINIT": 6, "ALU": 5, "ELEWINIT": 3, "ELEW": 3,
         "END": 1}
    return sum(w[o] for o in prog_ops)


def check_single(s, cost, words):
    """x is instruction -2 (END last), `words` = words fetched through x: F = L_f + words - 1; when x is
    the first instruction, d = F + 1 and s = d + 1."""
    k = len(s) - 2
    lf = TM["fetch_latency"]
    assert s.cost[k] == cost
    assert s.fetch[k] == lf + words - 1
    if k == 0:
        assert (s.dispatch[0], s.start[0]) == (lf + words, lf + words + 1)
    assert s.end[k] == s.start[k] + cost
    # END waits (token) for x's retire; END costs end_cycles=1
    assert s.start[-1] == s.retire[k]
    assert s.total_cycles == s.retire[k] + 1


# ---- §3 cost formulas ---------------------------------------------------------------------------
def test_end_alone():
    s = simulate([END()], T16)
    # F = 5 (word 0 arrives after L_f), d = 6, s = 7, e = r = 8
    assert (s.fetch[0], s.dispatch[0], s.start[0], s.end[0]) == (5, 6, 7, 8)
    assert s.total_cycles == 8
    assert s.counters()["EXEC_CYCLE_LO"] == 8 and s.counters()["EXEC_CYCLE_HI"] == 0


def test_load_plain_cost():
    # 3 items of 40 bytes: beats ceil(40/(4*2)) = 5, lines ceil(40/16) = 3 -> 5 per item
    # cost = load_setup 3 + ddr_latency 7 + 3*5 = 25
    x = mk("LOAD", bank_id=0, length=3, channel=40, jump_read=40, jump_write=3, reg_id=1, ddr_addr=100)
    s = time_one(x, L)
    check_single(s, 25, 5)
    assert s.start[0] == 5 + 5 + 1          # F = 9, d = 10, s = 11
    assert s.total_cycles == 11 + 25 + 1
    assert s.ddr_bytes() == {"read": {1: 120}, "write": {}}


def test_load_bank_bound_cost():
    # 16-byte items: beats ceil(16/8) = 2, lines 1 -> 2 per item; with 64 B/cycle per port: 1 beat,
    # 1 line -> 1 per item.  cost = 3 + 7 + 4*2 = 18, then 3 + 7 + 4*1 = 14
    x = mk("LOAD", bank_id=2, length=4, channel=16, jump_read=16, reg_id=0)
    assert time_one(x, L).cost[0] == 18
    assert time_one(x, L, T16.with_timing(ddr_bytes_per_cycle=64)).cost[0] == 14


def test_load_augmented_masked_bytes():
    # channel 12, jump_read 3 (augmentation: jump_read <= channel <= 64), 4 items, pad_start 6,
    # pad_idx 1, pad_end 8. Unmasked bytes per item (spec §6.2, W=16 so ceil(12/16)*16 = 16):
    #   item0 [6,12)=6, item1 [3,12)=9, item2 [0,12)=12, item3 [0, 16-8=8)=8  -> 35 bytes read
    # beats per item ceil(b/8) = 1, 2, 2, 1; lines 1 -> 6 cycles; cost = 3 + 7 + 6 = 16
    x = mk("LOAD", bank_id=0, length=4, channel=12, jump_read=3, jump_write=1, pad_start=6, pad_idx=1,
           pad_end=8, reg_id=1, ddr_addr=10)
    s = time_one(x, L)
    check_single(s, 16, 5)
    assert s.ddr_read[0] == 35
    # the executor counts the same unmasked bytes independently
    m = DpuMachine(T16, {1: 64}, init_fill="zero")
    m.run(to_arrays([x, END()]))
    assert m.stats["load_bytes"] == {1: 35}


def test_load_wide_weight_path_cost():
    """weight_load_lines 2 (docs/microarchitecture.md §3): a DDR LOAD into a CONVW bank writes 2 lines per cycle."""
    wide = T16.with_timing(weight_load_lines=2, ddr_bytes_per_cycle=16)
    cw = T16.convw_base                                     # 16 (2 image groups of PP 8)
    # 2 items of 100 bytes into CONVW: lines ceil(100/16) = 7, beats ceil(100/(16*2)) = 4.
    # one line per cycle: 3 + 7 + 2*max(4, 7) = 24; two: ceil(7/2) = 4 -> 3 + 7 + 2*max(4, 4) = 18
    x = mk("LOAD", bank_id=cw + 5, length=2, channel=100, jump_read=100, jump_write=7, reg_id=1)
    assert time_one(x, L, T16.with_timing(ddr_bytes_per_cycle=16)).cost[0] == 24
    assert time_one(x, L, wide).cost[0] == 18
    # beats bound it when the DDR is narrower: 4 B per port -> ceil(100/8) = 13 per item either way
    assert time_one(x, L, wide.with_timing(ddr_bytes_per_cycle=4)).cost[0] == 3 + 7 + 2 * 13
    # not widened: an image bank, DWCONVW, BIAS (7 lines per item); channel augmentation into CONVW
    # (jump_read 40 <= channel 50 <= 64: lines 4, beats 2 -> 4 per item); a broadcast (3 + 2*7)
    for bank in (0, T16.dwconvw_bank, T16.bias_bank):
        y = mk("LOAD", bank_id=bank, length=2, channel=100, jump_read=100, jump_write=7, reg_id=1)
        assert time_one(y, L, wide).cost[0] == 24, bank
    aug = mk("LOAD", bank_id=cw, length=2, channel=50, jump_read=40, jump_write=4, reg_id=1)
    assert time_one(aug, L, wide).cost[0] == 3 + 7 + 2 * 4
    bc = mk("LOAD", bank_id=cw, length=2, channel=100, jump_read=100, jump_write=7, broadcast=7)
    assert time_one(bc, L, wide).cost[0] == 3 + 2 * 7
    # the rule as the compiler reads it from the Target
    assert [wide.load_lines_per_cycle(b, 100, 100, 0) for b in (0, cw, cw + 15, cw + 16)] == [1, 2, 2, 1]
    assert (wide.load_lines_per_cycle(cw, 50, 40, 0), wide.load_lines_per_cycle(cw, 100, 100, 7)) == (1, 1)
    assert T16.load_lines_per_cycle(cw, 100, 100, 0) == 1


def test_load_broadcast_cost():
    # broadcast 7: no DDR access, no latency; lines ceil(20/16) = 2 per item: 3 + 5*2 = 13
    x = mk("LOAD", bank_id=0, length=5, channel=20, jump_read=20, jump_write=2, broadcast=7, const_value=3)
    s = time_one(x, L)
    check_single(s, 13, 5)
    assert s.ddr_read[0] == 0


def test_save_costs():
    # plain: beats ceil(20/4) = 5, lines 2 -> 5 per item: 2 + 2*5 + 7 = 19
    x = mk("SAVE", bank_id=0, length=2, channel=20, jump_write=20, reg_id=3)
    s = time_one(x, 0)
    check_single(s, 19, 5)
    assert s.ddr_bytes()["write"] == {3: 40}
    # argmax: 1 byte per item -> beats 1, lines 2 -> 2 per item: 2 + 2*2 + 7 = 13
    s = time_one(mk("SAVE", bank_id=0, length=2, channel=20, jump_write=1, argmax=2, reg_id=3), 0)
    check_single(s, 13, 5)
    assert s.ddr_write[0] == 2
    # const_en: no bank read (lines 0), beats ceil(9/4) = 3: 2 + 2*3 + 7 = 15
    s = time_one(mk("SAVE", bank_id=0, length=2, channel=9, jump_write=9, const_en=1, reg_id=3), 0)
    check_single(s, 15, 5)


def test_conv_cost():
    # CONVINIT kernel 3x2; CONV length 5, channel_group 2: 11 + 5*3*2*2 = 71 (vpp does not matter)
    ci = mk("CONVINIT", C, C, kernel_h=3, kernel_w=2)
    cv = mk("CONV", length=5, channel_group=2, bank_id_out=8)
    s = time_one(cv, C, extra=[ci])
    assert s.cost[0] == 1                            # init_cycles
    assert s.start[0] == 5 + 4 + 1                   # F = 8, d = 9, s = 10
    check_single(s, 71, 9)
    assert s.start[1] == 5 + 9 + 1                   # F = 13, d = 14, s = 15 (CONVINIT ended at 11)
    cv8 = mk("CONVINIT", C, C, kernel_h=3, kernel_w=2, valid_pixel_parallel=1)
    assert time_one(cv, C, extra=[cv8]).cost[1] == 71


def test_alu_cost():
    # ALUINIT kernel 3x3, channel_group 2, length 4; ALU kernel_d 1 / 2:
    #   13 + 4*3*3*1*2 = 85 ; 13 + 4*3*3*2*2 = 157
    ai = mk("ALUINIT", M, M, kernel_h=3, kernel_w=3, channel_group=2, length=4, exec_mode=3)
    s = time_one(mk("ALU", kernel_d=1), M, extra=[ai])
    check_single(s, 85, 11)
    assert time_one(mk("ALU", kernel_d=2), M, extra=[ai]).cost[1] == 157


def test_elew_cost():
    # ELEW length 6, channel_group 3, num 2: 17 + 6*3*2 = 53
    e0 = mk("ELEWINIT", M, M, id=0)
    e1 = mk("ELEWINIT", M, M, id=1)
    s = time_one(mk("ELEW", length=6, channel_group=3, num=2), M, extra=[e0, e1])
    check_single(s, 53, 9)
    assert list(s.cost[:2]) == [1, 1]


def test_legacy_and_noinit_rejected():
    with pytest.raises(ExecError, match=r"instruction 0 \(CONV\).*CONVINIT"):
        simulate([mk("CONV"), END()], T16)
    with pytest.raises(ExecError, match=r"instruction 0 \(POOLINIT\).*not usable on ISA1"):
        simulate([mk("POOLINIT"), mk("POOL"), END()], T16)


# ---- §2 scheduling rules ---------------------------------------------------------------------------
def test_fetch_fifo_credit():
    # D = 6 words, L_f = 5: LOAD0 = words 0..4 arrive at 5..9, d0 = 10. Word 5 arrives at 10; word 6
    # needs the slot of word 0 (dispatched at 10): 10 + 5 = 15; words 7..9 at 16..18 -> F1 = 18, d1 = 19
    t = T16.with_timing(fetch_fifo_words=6)
    ld = mk("LOAD", L, L, bank_id=0, length=1, channel=16, reg_id=0)
    s = simulate([ld, ld, END()], t)
    assert (s.fetch[0], s.dispatch[0]) == (9, 10)
    assert (s.fetch[1], s.dispatch[1]) == (18, 19)
    # END (word 10): credit of word 4 (dispatched at 10) = 15, but A_9 + 1 = 19 -> F = 19, d = 20
    assert s.fetch[2] == 19 and s.dispatch[2] == 20


def test_queue_full_stalls_dispatch():
    # queue_depth 1. CONVINIT words 0-3 (F 8, d 9, s 10, e 11); CONV a words 4-8: F 13, d = max(14, 10,
    # s_CONVINIT + 1 = 11) = 14, s 15, e 15 + 71 = 86; CONV b: F 18, d = max(19, 15, s_a + 1 = 16) = 19,
    # s = e_a = 86, e 157; CONV c: F 23, d = max(24, 20, s_b + 1 = 87) = 87 -> stall_queue 63;
    # END (word 19, F 24) is dispatched after c: d = 88.
    t = T16.with_timing(queue_depth=1)
    ci = mk("CONVINIT", C, C, kernel_h=3, kernel_w=2)
    cv = mk("CONV", C, C, length=5, channel_group=2)
    last = mk("CONV", C, C | S, length=5, channel_group=2)
    s = simulate([ci, cv, cv, last, END(S | C)], t)
    assert list(s.dispatch) == [9, 14, 19, 87, 88]
    assert list(s.start[:4]) == [10, 15, 86, 157]
    assert s.stall_queue[3] == 63 and s.stall_queue[:3].sum() == 0
    assert s.total_cycles == 157 + 71 + 1


def test_token_wait_and_signal():
    # LOAD (cost 3 + 7 + 2 = 12) signals CONV; the CONV waits for it. LOAD: F 9, d 10, s 11, e = r = 23.
    # CONVINIT (no wait): words 5-8, F 13, d 14, s 15. CONV: words 9-13, F 18, d 19, ready at 20,
    # token at 23 -> s 23, stall_token 3.
    ld = mk("LOAD", L, L | C, bank_id=0, length=1, channel=16, reg_id=0)
    ci = mk("CONVINIT", C, C, kernel_h=1, kernel_w=1)
    cv = mk("CONV", C | L, C | S, length=1, channel_group=1)
    s = simulate([ld, ci, cv, END(S | C)], T16)
    assert s.retire[0] == 23
    assert s.start[2] == 23 and s.stall_token[2] == 3
    # without the token the CONV starts at 20
    cv0 = mk("CONV", C, C | S, length=1, channel_group=1)
    s0 = simulate([mk("LOAD", L, L, bank_id=0, length=1, channel=16, reg_id=0), ci, cv0, END(S | C)], T16)
    assert s0.start[2] == 20 and s0.stall_token[2] == 0


def test_tokens_pair_in_order():
    # two signals on LOAD->CONV; the k-th CONV wait is released by the k-th LOAD retire.
    # LOAD cost 3 + 7 + 4*2 = 18: LOAD0 s 11, r 29; LOAD1 (d 15) s 29, r 47.
    # CONVINIT words 10-13: F 18, d 19, s 20. CONV a words 14-18: F 23, d 24, ready 25, token 29 -> s 29
    # (stall 4), e 29 + 12 = 41. CONV b: F 28, d 29, ready = e_a = 41, token 47 -> s 47 (stall 6).
    # CONV a writes bank 8, not LOAD 1's bank 0 (no bank-port conflict; tests/test_timing_ports.py has the
    # same program writing bank 0).
    ld = mk("LOAD", L, L | C, bank_id=0, length=4, channel=16, jump_write=1, reg_id=0)
    ci = mk("CONVINIT", C, C, kernel_h=1, kernel_w=1)
    cv = mk("CONV", C | L, C, length=1, channel_group=1, bank_id_out=8)
    cvl = mk("CONV", C | L, C | S, length=1, channel_group=1, bank_id_out=8)
    s = simulate([ld, ld, ci, cv, cvl, END(S | C)], T16)
    assert list(s.retire[:2]) == [29, 47]
    assert list(s.start[3:5]) == [29, 47]
    assert list(s.stall_token[3:5]) == [4, 6]


def test_save_pair_overlap_port_and_in_order_retire():
    # SAVE a (hp 0, own bit): cost 2 + 1*4 + 7 = 13. SAVE b (hp 1, dpdon 0000) may start the cycle after a
    # starts; SAVE c (hp 0, no own bit) must wait for port 0 (a's end).
    a = mk("SAVE", S, 0, bank_id=0, length=1, channel=16, reg_id=3, hp_id=0)
    b = mk("SAVE", 0, S, bank_id=1, length=1, channel=16, reg_id=3, ddr_addr=16, hp_id=1)
    c = mk("SAVE", 0, S, bank_id=2, length=1, channel=16, reg_id=3, ddr_addr=32, hp_id=0)
    s = simulate([a, b, c, END()], T16)
    # a: F 9, d 10, s 11, e 24. b: F 14, d 15, s = max(16, s_a + 1) = 16, e 29. c: F 19, d 20,
    # ready 21, port 0 free at 24 -> s 24, stall_ddr 3, e 37. Retire in order: 24, 29, 37.
    assert list(s.start[:3]) == [11, 16, 24]
    assert list(s.end[:3]) == [24, 29, 37]
    assert s.stall_ddr[2] == 3
    assert s.engine_busy()["SAVE"] == 38 - 11          # union of the SAVE intervals and END [37, 38)
    # END (own bit): waits for the retire of all SAVEs
    assert s.start[3] == 37 and s.total_cycles == 38
    # retire is in order: a slow first SAVE holds back the signal of its faster partner
    a2 = mk("SAVE", S, 0, bank_id=0, length=4, channel=16, reg_id=3, hp_id=0)      # 2 + 16 + 7 = 25
    b2 = mk("SAVE", 0, S | C, bank_id=1, length=1, channel=16, reg_id=3, ddr_addr=64, hp_id=1)
    ci = mk("CONVINIT", C, C)
    cv = mk("CONV", C | S, C | S, length=1, channel_group=1)
    s2 = simulate([a2, b2, ci, cv, END(S | C)], T16)
    assert s2.end[1] < s2.end[0]
    assert s2.retire[1] == s2.end[0] == 36
    assert s2.start[3] == 36


def test_deadlock_missing_token_names_instruction():
    ci = mk("CONVINIT", C, C)
    cv = mk("CONV", C | M, C | S, length=1, channel_group=1)
    with pytest.raises(DeadlockError) as ei:
        simulate([ci, cv, END(S | C)], T16)
    msg = str(ei.value)
    assert "instruction 1 (CONV)" in msg and "token #1 MISC->CONV (only 0 signalled)" in msg
    assert "instruction 2 (END)" in msg          # END waits for the CONV's signal
    assert {b["index"] for b in ei.value.blocked} == {1, 2}


def test_deadlock_full_queue_at_dispatch():
    # queue depth 1: the first CONV waits for a MISC token; the second CONV cannot be dispatched, so the
    # ALU that would signal is never dispatched either.
    t = T16.with_timing(queue_depth=1)
    prog = [mk("CONVINIT", C, C), mk("CONV", C | M, C, length=1, channel_group=1),
            mk("CONV", C, C | S, length=1, channel_group=1),
            mk("ALUINIT", M, M), mk("ALU", M, M | C), END(S | C)]
    with pytest.raises(DeadlockError, match=r"dispatch is stuck at instruction 2 \(CONV\): the CONV queue is full"):
        simulate(prog, t)
    # with a deeper queue it completes
    assert simulate(prog, T16).total_cycles > 0


def test_watchdog():
    ci = mk("CONVINIT", C, C, kernel_h=16, kernel_w=16)
    cv = mk("CONV", C, C | S, length=1024, channel_group=256)
    with pytest.raises(WatchdogError, match=r"instruction 1 \(CONV\)"):
        simulate([ci, cv, END(S | C)], T16.with_timing(watchdog_cycles=10_000))


def test_timing_parameters_validated():
    with pytest.raises(TargetError, match="unknown timing parameter"):
        T16.with_timing(clock_ghz=1)
    with pytest.raises(TargetError, match="fetch_fifo_words must be >= 6"):
        T16.with_timing(fetch_fifo_words=3)
    with pytest.raises(TargetError, match="queue_depth must be >= 1"):
        T16.with_timing(queue_depth=0)


# ---- shared models ------------------------------------------------------------------------------------
def _dpu(path, k=0):
    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    g = Graph.load(path)
    return DpuSubgraph(g, dpu_subgraphs(g)[k])


def _fresh(d, x):
    m = d.new_machine()
    d.write_inputs(m, [x])
    return m


def test_mnist_bounds_and_weight_bytes(mnist_path):
    d = _dpu(mnist_path)
    s = simulate(d.arrays, d.target)
    assert len(s) == 230
    busy = s.engine_busy()
    assert all(s.total_cycles >= b for b in busy.values())
    assert s.total_cycles <= int(s.cost.sum())
    # LdWB: bytes LOADed from the CONST register; 693,962 by spec-level decoding of the program
    const_regs = [r for r, c in d.reg_context.items() if c == "CONST"]
    assert const_regs == [0]
    assert s.ddr_bytes()["read"][0] == 693_962
    # instructions start after dispatch, end after start, retire after end
    assert np.all(s.start > s.dispatch) and np.all(s.end > s.start) and np.all(s.retire >= s.end)
    c = s.counters()
    assert (c["LSTART"], c["CSTART"], c["SSTART"], c["MSTART"]) == (202, 21, 2, 5)


def test_timed_order_execution_matches_program_order(mnist_path):
    """Executing in schedule start order gives the program-order bytes; clearing the cross-engine tokens
    lets the schedule reorder dependent instructions and the bytes change (the check is sensitive)."""
    d = _dpu(mnist_path)
    x = np.random.default_rng(3).integers(-128, 128, d.inputs[0].dims, dtype=np.int8)
    ref = _fresh(d, x)
    ref.run(d.arrays)
    m = _fresh(d, x)
    s = simulate(d.arrays, d.target, machine=m)
    order = np.lexsort((np.arange(len(s)), s.start))
    assert (np.diff(order) < 0).sum() > 0                    # some instructions really run out of order
    assert np.array_equal(m.ddr(3), ref.ddr(3)) and np.array_equal(m.banks, ref.banks)
    a = d.arrays
    from opendpu.isa.program import ProgramArrays
    from opendpu.sim._timing import ENGINE_OF_OP
    ownbit = (1 << ENGINE_OF_OP[a.op]).astype(np.int32)
    cleared = ProgramArrays(a.op, a.dpdon & ownbit, a.dpdby & ownbit, a.fields)
    m2 = _fresh(d, x)
    simulate(cleared, d.target, machine=m2)
    assert not np.array_equal(m2.ddr(3), ref.ddr(3))


def test_timed_order_error_names_original_instruction(mnist_path):
    d = _dpu(mnist_path)
    a = d.arrays
    from opendpu.isa.fields import FIELD_INDEX
    from opendpu.isa.program import OP_INDEX, ProgramArrays
    f = a.fields.copy()
    k = int(np.nonzero(a.op == OP_INDEX["SAVE"])[0][0])
    f[k, FIELD_INDEX["SAVE"]["ddr_addr"]] = 10_000_000
    m = d.new_machine()
    with pytest.raises(ExecError, match=rf"instruction {k} \(SAVE\): field ddr_addr=10000000"):
        simulate(ProgramArrays(a.op, a.dpdon, a.dpdby, f), d.target, machine=m)


def test_malformed_program_arrays_are_rejected():
    from opendpu.isa.program import ProgramArrays
    a = to_arrays([mk("CONVINIT"), END()])
    with pytest.raises(ValueError, match=r"fields \[N, 22\]"):
        simulate(ProgramArrays(a.op, a.dpdon, a.dpdby, a.fields[:, :5]), T16)
    with pytest.raises(ValueError, match="op holds values outside"):
        simulate(ProgramArrays(a.op + 40, a.dpdon, a.dpdby, a.fields), T16)
    with pytest.raises(ValueError, match="dpdon/dpdby must have 2 entries"):
        simulate(ProgramArrays(a.op, a.dpdon[:1], a.dpdby, a.fields), T16)
