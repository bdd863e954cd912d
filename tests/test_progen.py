"""Tests of the random program generator (sim/progen.py): legality on the executor, token bookkeeping,
race-freedom under random token-respecting schedules, deliberately broken tokens, and scale."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opendpu.isa.fields import BY_NAME
from opendpu.isa.program import ProgramArrays, decode, encode
from opendpu.isa.target import Target
from opendpu.sim.progen import BREAK_KINDS, GeneratedProgram, break_tokens, random_program
from work_count import count_work

TARGETS = {
    "B512": Target.from_name("B512"),
    "B1024": Target.from_name("B1024"),
    "B4096": Target.from_name("B4096"),
    "P4_8_D512": Target.parametric(4, 8, 2, bank_depth=512),
}
ENG = {m: o.engine for m, o in BY_NAME.items()}
SAVE = 1


# ---- independent reference models of the token rules (spec §5.2) ---------------------------------------
def check_tokens(instrs) -> list[list[int]]:
    """Program-order counters: the k-th wait on (P, C) needs k signals on (P, C) from earlier instructions.
    Returns the left-over tokens per pair."""
    sig = [[0] * 4 for _ in range(4)]
    wai = [[0] * 4 for _ in range(4)]
    for i, ins in enumerate(instrs):
        c = ENG[ins.op]
        for p in range(4):
            if p != c and ins.dpdon >> p & 1:
                wai[p][c] += 1
                assert sig[p][c] >= wai[p][c], f"instruction {i} ({ins.op}) waits on {p}->{c} before its signal"
        for x in range(4):
            if x != c and ins.dpdby >> x & 1:
                sig[c][x] += 1
    return [[sig[p][c] - wai[p][c] for c in range(4)] for p in range(4)]


def schedule(instrs, rng: random.Random) -> tuple[list[int], bool]:
    """Zero-latency run of four in-order engines with token counters: each step executes the head of a
    random engine whose cross-engine tokens are all available and delivers its signals at once. END may
    only run when every other queue is empty. Returns (order, completed); not completed = deadlock."""
    queues = [[] for _ in range(4)]
    for i, ins in enumerate(instrs):
        queues[ENG[ins.op]].append(i)
    head = [0] * 4
    tok = [[0] * 4 for _ in range(4)]
    order: list[int] = []
    while True:
        ready = []
        for e in range(4):
            if head[e] == len(queues[e]):
                continue
            ins = instrs[queues[e][head[e]]]
            if ins.op == "END" and any(head[x] < len(queues[x]) for x in range(4) if x != e):
                continue
            if all(tok[p][e] > 0 for p in range(4) if p != e and ins.dpdon >> p & 1):
                ready.append(e)
        if not ready:
            break
        e = ready[int(rng.random() * len(ready))]
        i = queues[e][head[e]]
        head[e] += 1
        ins = instrs[i]
        for p in range(4):
            if p != e and ins.dpdon >> p & 1:
                tok[p][e] -= 1
        for x in range(4):
            if x != e and ins.dpdby >> x & 1:
                tok[e][x] += 1
        order.append(i)
    return order, len(order) == len(instrs)


def permuted(a: ProgramArrays, order) -> ProgramArrays:
    o = np.asarray(order)
    return ProgramArrays(a.op[o], a.dpdon[o], a.dpdby[o], a.fields[o])


def final_state(p: GeneratedProgram, arrays: ProgramArrays):
    m = p.machine()
    m.run(arrays)
    assert m.ended and m.pc == len(arrays)
    return m.banks.copy(), {r: m.ddr(r).copy() for r in p.reg_sizes}


def same_state(a, b) -> bool:
    return np.array_equal(a[0], b[0]) and all(np.array_equal(a[1][r], b[1][r]) for r in a[1])


# ---- legality ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tname", list(TARGETS))
def test_programs_legal_roundtrip_and_run(tname):
    t = TARGETS[tname]
    for seed in range(60):
        n = 5 + (seed * 7) % 120
        p = random_program(t, n=n, seed=seed)
        ins = p.instructions
        assert ins[-1].op == "END" and sum(i.op == "END" for i in ins) == 1
        assert ins[-1].dpdon == ins[-1].dpdby == 0b0010
        assert n <= len(ins) <= n + 8
        assert decode(encode(ins)) == ins
        assert not {i.op for i in ins} & {"POOL", "POOLINIT", "DWINIT", "DPTWISE"}
        m = p.machine()
        m.run(p.arrays)                        # raises ExecError on any illegal instruction
        assert m.ended and m.pc == len(ins)
        left = check_tokens(ins)
        assert all(v == 0 for row in left for v in row), left


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(TARGETS)), st.integers(0, 200), st.integers(0, 2**32 - 1), st.booleans())
def test_hypothesis_programs(tname, n, seed, pairs):
    p = random_program(TARGETS[tname], n=n, seed=seed, save_pairs=pairs)
    assert decode(encode(p.instructions)) == p.instructions
    m = p.machine()
    m.run(p.arrays)
    assert m.ended
    check_tokens(p.instructions)


def test_deterministic_and_seed_sensitive():
    t = TARGETS["B1024"]
    a, b = random_program(t, 80, seed=3), random_program(t, 80, seed=3)
    assert a.instructions == b.instructions
    assert all(np.array_equal(a.reg_init[r], b.reg_init[r]) for r in a.reg_init)
    assert random_program(t, 80, seed=4).instructions != a.instructions


def test_own_bits_and_save_pairs():
    """Own-engine bit in dpdon and dpdby everywhere except SAVE pairs (hp_id 0: dpdby 0000; hp_id 1,
    1-4 instructions later: dpdon 0000, dpdby includes SAVE); the two SAVEs use different banks."""
    npairs = 0
    for seed in range(40):
        ins = random_program(TARGETS["B4096"], n=80, seed=seed).instructions
        for i, x in enumerate(ins[:-1]):
            b = 1 << ENG[x.op]
            if x.op == "SAVE" and x.dpdby == 0:
                npairs += 1
                assert x.hp_id == 0 and x.dpdon & b
                nxt = [j for j in range(i + 1, len(ins)) if ins[j].op == "SAVE"][0]
                y = ins[nxt]
                assert 1 <= nxt - i <= 4 and y.dpdon == 0 and y.dpdby & b and y.hp_id == 1
                assert y.bank_id != x.bank_id
                if y.reg_id == x.reg_id:
                    ex = x.ddr_addr + (x.length - 1) * x.jump_write + x.channel
                    ey = y.ddr_addr + (y.length - 1) * y.jump_write + y.channel
                    assert ex <= y.ddr_addr or ey <= x.ddr_addr
            elif x.op == "SAVE" and x.dpdon == 0:
                continue
            else:
                assert x.dpdon & b and x.dpdby & b, (i, x)
    assert npairs > 20
    # without pairs every instruction carries its own bits
    ins = random_program(TARGETS["B4096"], n=200, seed=1, save_pairs=False).instructions
    assert all(x.dpdon & (1 << ENG[x.op]) and x.dpdby & (1 << ENG[x.op]) for x in ins)


def test_coverage_of_kinds_and_modes():
    """Over a batch of programs every legal kind and the main variants occur."""
    seen = set()
    for seed in range(60):
        t = TARGETS["B1024"] if seed % 2 else TARGETS["B512"]
        for x in random_program(t, n=80, seed=seed).instructions:
            seen.add(x.op)
            if x.op == "ALUINIT":
                seen.add(("mode", x.exec_mode))
            elif x.op == "ELEW":
                seen.add(("elew", x.elew_type, x.num))
            elif x.op == "LOAD":
                seen.add("bcast" if x.broadcast == 7 else "load")
                if x.jump_read <= x.channel <= 64 and (x.pad_start or x.pad_end):
                    seen.add("augment")
                seen.add(("loadgroup", t.bank_group_of(x.bank_id)[:2]))
            elif x.op == "SAVE":
                if x.argmax & 2:
                    seen.add("argmax")
                if x.const_en:
                    seen.add("const_en")
                if x.jump_write > x.channel:
                    seen.add("strided")
            elif x.op == "CONVINIT":
                seen.add(("act", x.act_type))
                seen.add(("cstride", x.stride_h))
    need = {"LOAD", "SAVE", "CONVINIT", "CONV", "ALUINIT", "ALU", "ELEWINIT", "ELEW", "END", "bcast",
            "augment", "argmax", "const_en", "strided", ("loadgroup", "VB"), ("loadgroup", "CO"),
            ("loadgroup", "DW"), ("loadgroup", "BI"), ("elew", 0, 1), ("elew", 0, 2), ("elew", 1, 2),
            ("cstride", 1), ("cstride", 2), ("act", 0), ("act", 1), ("act", 3), ("act", 4)}
    need |= {("mode", m) for m in (0, 1, 2, 3, 4, 6, 7)}
    assert need <= seen, need - seen


def test_mix_and_errors():
    p = random_program(TARGETS["B512"], n=60, seed=2, mix={"CONV": 1.0})
    ops = {x.op for x in p.instructions}
    assert ops <= {"CONVINIT", "CONV", "SAVE", "END"} and "CONV" in ops
    m = p.machine()
    m.run(p.arrays)
    with pytest.raises(ValueError):
        random_program(TARGETS["B512"], n=10, mix={"POOL": 1.0})
    with pytest.raises(ValueError):
        random_program(TARGETS["B512"], n=10, mix={"LOAD": 0.0})
    p0 = random_program(TARGETS["B512"], n=0, seed=0)
    assert [x.op for x in p0.instructions] == ["SAVE", "END"]


# ---- race freedom ------------------------------------------------------------------------------------
@pytest.mark.parametrize("tname", list(TARGETS))
def test_race_free_under_random_schedules(tname):
    """Any token-respecting schedule of the in-order engines gives the program-order bytes."""
    t = TARGETS[tname]
    rng = random.Random(11)
    for seed in range(30):
        p = random_program(t, n=10 + (7 * seed) % 90, seed=100 + seed)
        ref = final_state(p, p.arrays)
        for _ in range(6):
            order, done = schedule(p.instructions, rng)
            assert done and order[-1] == len(p.instructions) - 1      # END retires last
            assert same_state(ref, final_state(p, permuted(p.arrays, order))), (tname, seed, order)


def test_race_check_is_sensitive():
    """Control: with every cross-engine token bit cleared, some schedule changes the result."""
    rng = random.Random(5)
    diffs = 0
    for seed in range(6):
        p = random_program(TARGETS["B1024"], n=40, seed=seed)
        a = p.arrays
        own = np.array([1 << ENG[x.op] for x in p.instructions], np.int32)
        stripped = ProgramArrays(a.op, a.dpdon & own, a.dpdby & own, a.fields)
        instrs = [type(x)(x.op, int(on), int(by), x.fields)
                  for x, on, by in zip(p.instructions, stripped.dpdon, stripped.dpdby)]
        ref = final_state(p, a)
        for _ in range(3):
            order, done = schedule(instrs, rng)
            assert done
            diffs += not same_state(ref, final_state(p, permuted(stripped, order)))
    assert diffs > 0


# ---- broken tokens -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", BREAK_KINDS)
def test_break_tokens_deadlock(kind):
    rng = random.Random(0)
    for tname, t in TARGETS.items():
        for seed in range(8):
            p = random_program(t, n=10 + 7 * seed, seed=seed)
            before = [(x.dpdon, x.dpdby) for x in p.instructions]
            broken = break_tokens(p, kind, seed=seed)
            assert [(x.dpdon, x.dpdby) for x in p.instructions] == before     # input untouched
            assert broken[-1].op == "END" and decode(encode(broken)) == broken
            for _ in range(3):
                order, done = schedule(broken, rng)
                assert not done, (tname, seed, kind)
                assert len(broken) - 1 not in order              # END never runs
    with pytest.raises(ValueError):
        break_tokens(p, "nope")


# ---- scale -------------------------------------------------------------------------------------------
# Work is counted (tests/work_count.py: Python lines, Python calls, C calls), never timed: the same on every machine.
# The wall-clock figures are printed by benchmarks/bench_checks.py.
def test_large_program_linear_time():
    """Generating 10x the instructions costs at most 1.2 x 10x the work (linear time: the token planner's pending
    footprints are reset by every synchronisation, nothing scans the program so far)."""
    t = TARGETS["B4096"]
    random_program(t, n=20, seed=0)          # first use: imports and the compiled kernels' loading are not counted
    with count_work() as small:
        random_program(t, n=500, seed=9)
    with count_work() as large:
        p = random_program(t, n=5000, seed=9)
    assert 5000 <= len(p.instructions) <= 5010
    print(f"500 instructions: {small}; 5000 instructions: {large}")
    assert large.total <= 1.2 * 10 * small.total, (str(small), str(large))
    check_tokens(p.instructions)
    m = p.machine()
    m.run(p.arrays)
    assert m.ended


def test_many_small_programs_cost_what_their_instructions_cost():
    """The fixed cost of a program (generator set-up, register contents, final SAVE and END) is small: 150 programs
    of 10-80 instructions cost at most 1.25x the work per instruction of one 5000-instruction program, and an empty
    program less than 5 instructions do."""
    t = TARGETS["B512"]
    random_program(t, n=20, seed=0)          # first use: not counted
    with count_work() as large:
        n_large = len(random_program(t, n=5000, seed=9).instructions)
    per_instruction = large.total / n_large
    with count_work() as empty:
        random_program(t, n=0, seed=1)
    with count_work() as many:
        n = sum(len(random_program(t, n=10 + s % 71, seed=s).instructions) for s in range(150))
    print(f"per instruction {per_instruction:.0f}; empty program {empty}; 150 programs, {n} instructions: {many}")
    assert empty.total < 5 * per_instruction, (str(empty), per_instruction)
    assert many.total <= 1.25 * per_instruction * n, (str(many), per_instruction, n)


def test_no_races_at_the_generators_granularity():
    """Every conflict of the isa.footprint footprints at the granularity the generator compares (16 lines,
    64 DDR bytes) is token-ordered, under the happens-before rule of isa.deps.find_races."""
    from opendpu.isa.deps import find_races
    from opendpu.isa.footprint import program_footprints
    for t in TARGETS.values():
        for seed in range(8):
            p = random_program(t, n=100, seed=300 + seed)
            fps = program_footprints(p.instructions, t, p.reg_sizes)
            assert find_races(p.instructions, fps, t, line_chunk=min(16, t.bank_depth), ddr_chunk=64) == []


# ---- bank-port fuzzing mode ----------------------------------------------------------------------------
@pytest.mark.parametrize("tname", list(TARGETS))
def test_bank_conflict_mode_valid_and_race_free(tname):
    """random_program(bank_conflicts=True): legal on the executor, tokens balanced, race-free under random
    schedules and at the generator's granularity."""
    from opendpu.isa.deps import find_races
    from opendpu.isa.footprint import program_footprints
    t = TARGETS[tname]
    rng = random.Random(3)
    for seed in range(12):
        p = random_program(t, n=60, seed=500 + seed, bank_conflicts=True)
        assert decode(encode(p.instructions)) == p.instructions
        ref = final_state(p, p.arrays)
        left = check_tokens(p.instructions)
        assert all(v == 0 for row in left for v in row), left
        for _ in range(3):
            order, done = schedule(p.instructions, rng)
            assert done and same_state(ref, final_state(p, permuted(p.arrays, order)))
        fps = program_footprints(p.instructions, t, p.reg_sizes)
        assert find_races(p.instructions, fps, t, line_chunk=min(16, t.bank_depth), ddr_chunk=64) == []


def test_bank_conflict_mode_conflicts_more():
    """On the same seeds the cycle model finds more than 1.5x the bank-port stall cycles and stalled
    instructions with bank_conflicts=True than with the default generator (sum over TARGETS; measured
    2.0x and 2.0x)."""
    from opendpu.sim.timing import simulate
    cyc = {False: 0, True: 0}
    ins = {False: 0, True: 0}
    for t in TARGETS.values():
        for seed in range(12):
            for crowd in (False, True):
                s = simulate(random_program(t, n=60, seed=500 + seed, bank_conflicts=crowd).instructions, t)
                cyc[crowd] += int(s.stall_bank.sum())
                ins[crowd] += int((s.stall_bank > 0).sum())
    assert cyc[True] > 1.5 * cyc[False] and ins[True] > 1.5 * ins[False], (cyc, ins)


def test_bank_conflict_mode_off_keeps_programs():
    """The default generator draws the same numbers as before the mode existed (encoded programs hashed
    from the generator of the main branch before issue 15)."""
    import hashlib
    for tname, want in (("B512", "3e4bd047b9d490de"), ("B4096", "d79b1555efd740b5")):
        p = random_program(TARGETS[tname], 40, seed=7)
        assert hashlib.sha256(encode(p.instructions)).hexdigest()[:16] == want
