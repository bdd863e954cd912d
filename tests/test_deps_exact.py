"""isa.deps.ExactTokenPlanner: tokens on the conflicting instruction itself (not on the producer engine's latest
instruction), with vector clocks for orders that already hold transitively. Checked by hand on small programs,
and on random programs (sim.progen) re-tokened by both planners: race-free at line / byte granularity
(find_races), balanced signals and waits, no deadlock on the cycle model, fewer cycles."""
from __future__ import annotations

import pytest

from opendpu.isa.deps import ExactTokenPlanner, TokenError, TokenPlanner, bit, find_races, token_counts
from opendpu.isa.fields import Engine
from opendpu.isa.footprint import InitState, footprint, program_footprints
from opendpu.isa.program import Instruction
from opendpu.isa.target import Target
from opendpu.sim.progen import random_program
from opendpu.sim.timing import simulate
from tests.helpers import ins

L, S, C, M = bit(Engine.LOAD), bit(Engine.SAVE), bit(Engine.CONV), bit(Engine.MISC)
TARGETS = {
    "B512": Target.from_name("B512"),
    "B4096": Target.from_name("B4096"),
    "P4_8_D512": Target.parametric(4, 8, 2, bank_depth=512),
    "PP2_CP4_D512": Target.parametric(2, 4, bank_depth=512),
}


def _program(planner, instrs):
    return [Instruction(x.op, on, by, x.fields) for x, on, by in zip(instrs, planner.dpdon, planner.dpdby)]


def test_waits_on_the_conflicting_instruction():
    """B512, CONVINIT 1x1. a: LOAD bank 0 lines 0-1. b: CONV reads them, writes bank 4 lines 100-101. c: LOAD bank 0
    lines 8-9. d: CONV reads those, writes bank 5 line 100. e: SAVE reads bank 4 lines 100-101: RAW on b only, so
    it waits on b (TokenPlanner waits on d, the CONV engine's latest). f: LOAD over bank 0 lines 0-1: WAR on b
    only, so it waits on b too, not on d."""
    t = TARGETS["B512"]
    st = InitState(conv=ins("CONVINIT").fields)
    a = ins("LOAD", bank_id=0, bank_addr=0, length=2, channel=8, reg_id=0)
    b = ins("CONV", bank_id_in=0, bank_addr_in=0, length=2, bank_id_out=4, bank_addr_out=100)
    c = ins("LOAD", bank_id=0, bank_addr=8, length=2, channel=8, reg_id=0, ddr_addr=64)
    d = ins("CONV", bank_id_in=0, bank_addr_in=8, length=1, bank_id_out=5, bank_addr_out=100)
    e = ins("SAVE", bank_id=4, bank_addr=100, length=2, channel=8, reg_id=1)
    f = ins("LOAD", bank_id=0, bank_addr=0, length=2, channel=8, reg_id=0, ddr_addr=128)
    prog = [a, b, c, d, e, f]
    fps = [footprint(x, st, t) for x in prog]
    ex, old = ExactTokenPlanner(t, 8, 64), TokenPlanner(t, 8, 64)
    steps = [ex.add(x.op, fp) for x, fp in zip(prog, fps)]
    for x, fp in zip(prog, fps):
        old.add(x.op, fp)
    assert [s.waits for s in steps] == [(), (0,), (), (2,), (1,), (1,)]
    assert ex.dpdby[1] == C | S | L and ex.dpdby[3] == C           # b signals SAVE and LOAD, d signals nobody
    assert ex.dpdon[4] == S | C and ex.dpdon[5] == L | C
    assert old.dpdby[3] & S and not old.dpdby[1] & S                # the engine-latest rule waits on d
    for pl in (ex, old):
        p = _program(pl, prog)
        sig, wai = token_counts(p)
        assert sig == wai
        assert find_races(p, fps, t) == []


def test_transitive_order_needs_no_token():
    """a: LOAD bank 0. b: CONV reads a (waits on a). c: SAVE reads b's output (waits on b). e: another SAVE of b's
    output: ordered after b through c (in-order engine), so no token. m: LOAD over b's output lines: WAR on c and
    e, WAW on b; one token on e (the latest need) orders it after b as well (e's clock holds b)."""
    t = TARGETS["B512"]
    st = InitState(conv=ins("CONVINIT").fields)
    a = ins("LOAD", bank_id=0, bank_addr=0, length=2, channel=8, reg_id=0)
    b = ins("CONV", bank_id_in=0, bank_addr_in=0, length=2, bank_id_out=4, bank_addr_out=100)
    c = ins("SAVE", bank_id=4, bank_addr=100, length=2, channel=8, reg_id=1)
    e = ins("SAVE", bank_id=4, bank_addr=100, length=2, channel=8, reg_id=1, ddr_addr=256)
    m = ins("LOAD", bank_id=4, bank_addr=100, length=2, channel=8, reg_id=0)     # WAR on c and e, WAW on b
    prog = [a, b, c, e, m]
    fps = [footprint(x, st, t) for x in prog]
    ex = ExactTokenPlanner(t, 8, 64)
    steps = [ex.add(x.op, fp) for x, fp in zip(prog, fps)]
    assert steps[3].waits == ()                                      # e: through c (in-order SAVE engine)
    # m: WAR on the SAVEs (latest: e) covers b (e's clock holds b through c's wait): one token, on e
    assert steps[4].waits == (3,) and ex.dpdon[4] == L | S
    p = _program(ex, prog)
    assert find_races(p, fps, t) == [] and token_counts(p)[0] == token_counts(p)[1]


def test_save_pair_signals_from_the_second_save():
    """A need on the first SAVE of a pair (hp_id 0, dpdby 0000) is placed on its partner; nothing may wait on the
    SAVE engine while the pair is open; the second SAVE may not need a wait of its own."""
    t = TARGETS["B512"]
    st = InitState()
    ld = ins("LOAD", bank_id=0, length=1, channel=8)
    s1 = ins("SAVE", bank_id=0, channel=8, ddr_addr=0)
    s2 = ins("SAVE", bank_id=1, channel=8, ddr_addr=64)
    ex = ExactTokenPlanner(t)
    ex.add("LOAD", footprint(ld, st, t))
    f1, f2 = footprint(s1, st, t), footprint(s2, st, t)
    union = tuple(x | y for x, y in zip(ex.keys(f1), ex.keys(f2)))
    one = ex.add("SAVE", keys=union, pair=0)
    assert (one.dpdon, one.dpdby, one.waits) == (L | S, 0, (0,))
    with pytest.raises(TokenError):
        ex.add("LOAD", footprint(ld, st, t))                        # over s1's lines: would wait inside the pair
    two = ex.add("SAVE", f2, pair=1)
    assert (two.dpdon, two.dpdby) == (0, S)
    late = ex.add("LOAD", footprint(ld, st, t))                     # WAR on s1 only: the token is on s2
    assert late.waits == (2,) and ex.dpdby[2] == S | L and ex.dpdby[1] == 0
    ex2 = ExactTokenPlanner(t)
    ex2.add("SAVE", f1, pair=0)
    ex2.add("LOAD", footprint(ins("LOAD", bank_id=1, length=1, channel=8, reg_id=1), st, t))
    with pytest.raises(TokenError, match="wait of its own"):
        ex2.add("SAVE", f2, pair=1)


def _retoken(p, t, planner_cls):
    """The program's instructions re-tokened by `planner_cls` (its SAVE pairs kept: hp_id 0 waits for both)."""
    fps = program_footprints(p.instructions, t, p.reg_sizes)
    pl = planner_cls(t, line_chunk=8, ddr_chunk=64)
    ins_ = p.instructions
    i, last_save = 0, max(k for k, x in enumerate(ins_) if x.op == "SAVE")
    while i < len(ins_):
        x = ins_[i]
        if x.op == "END":
            pl.add("END", wait=False)
        elif x.op == "SAVE" and x.fields.get("hp_id") == 0 and i + 1 < len(ins_) and ins_[i + 1].op == "SAVE" \
                and ins_[i + 1].fields.get("hp_id") == 1 and ins_[i].dpdby == 0:
            (r1, w1), (r2, w2) = pl.keys(fps[i]), pl.keys(fps[i + 1])
            pl.add("SAVE", keys=(r1 | r2, w1 | w2), pair=0)
            pl.add("SAVE", keys=(r2, w2), pair=1)
            i += 2
            continue
        else:
            pl.add(x.op, fps[i])
            if i == last_save:
                pl.order_after_all(i)
        i += 1
    return [Instruction(x.op, on, by, x.fields) for x, on, by in zip(ins_, pl.dpdon, pl.dpdby)], fps


@pytest.mark.parametrize("tname", sorted(TARGETS))
def test_random_programs_race_free_and_faster(tname):
    """Random programs re-tokened exactly: no race at line / byte granularity, as many signals as waits on every
    engine pair, no deadlock on the cycle model, and in total fewer cycles than with the engine-latest rule (the
    control: with the cross-engine bits cleared the same programs race)."""
    t = TARGETS[tname]
    cycles = {ExactTokenPlanner: 0, TokenPlanner: 0}
    stripped = 0
    for seed in range(6):
        p = random_program(t, n=90, seed=seed)
        for cls in cycles:
            prog, fps = _retoken(p, t, cls)
            assert find_races(prog, fps, t) == [], (seed, cls.__name__)
            sig, wai = token_counts(prog)
            assert sig == wai
            cycles[cls] += simulate(prog, t).total_cycles             # raises DeadlockError on a deadlock
            if cls is ExactTokenPlanner:
                own = [Instruction(x.op, x.dpdon & bit(x.engine), x.dpdby & bit(x.engine), x.fields) for x in prog]
                stripped += len(find_races(own, fps, t))
    assert cycles[ExactTokenPlanner] < cycles[TokenPlanner], cycles
    assert stripped > 0


@pytest.mark.parametrize("tname", sorted(TARGETS))
def test_add_all_places_the_tokens_add_places(tname):
    """`add_all` (one compiled pass over the keys) against `add` step by step on random programs with SAVE pairs:
    the same dpdon / dpdby on every instruction; and the same TokenErrors."""
    t = TARGETS[tname]
    compared = pairs = 0
    for seed in range(8):
        p = random_program(t, n=120, seed=100 + seed)
        fps = program_footprints(p.instructions, t, p.reg_sizes)
        one = ExactTokenPlanner(t, line_chunk=8, ddr_chunk=64)
        steps, ins_ = [], p.instructions
        last_save = max(k for k, x in enumerate(ins_) if x.op == "SAVE")
        i = 0
        while i < len(ins_):
            x = ins_[i]
            if x.op == "SAVE" and i + 1 < last_save and ins_[i + 1].op == "SAVE" and x.fields["bank_id"] != \
                    ins_[i + 1].fields["bank_id"] and seed % 2:
                (r1, w1), (r2, w2) = one.keys(fps[i]), one.keys(fps[i + 1])
                steps += [("SAVE", (r1 | r2, w1 | w2), 0), ("SAVE", (r2, w2), 1)]
                i += 2
                continue
            steps.append((x.op, (set(), set()) if x.op == "END" else one.keys(fps[i]), None))
            i += 1
        err_one = err_batch = None
        try:
            for op, keys, pair in steps:
                if op == "END":
                    one.add("END", wait=False)
                else:
                    one.add(op, keys=keys, pair=pair)
                if len(one) - 1 == last_save:
                    one.order_after_all(last_save)
        except TokenError as e:
            err_one = str(e)
        batch = ExactTokenPlanner(t, line_chunk=8, ddr_chunk=64)
        try:
            batch.add_all(steps, last_save)
        except TokenError as e:
            err_batch = str(e)
        assert err_batch == err_one, (tname, seed)
        if err_one is None:
            assert (batch.dpdon, batch.dpdby) == (one.dpdon, one.dpdby), (tname, seed)
            compared += 1
        pairs += sum(pair is not None for _, _, pair in steps)
    assert compared >= 6 and pairs > 0
    t = TARGETS["B512"]
    st = InitState()
    s1, s2 = ins("SAVE", bank_id=0, channel=8, ddr_addr=0), ins("SAVE", bank_id=1, channel=8, ddr_addr=64)
    ld = ins("LOAD", bank_id=1, length=1, channel=8, reg_id=1)
    ex = ExactTokenPlanner(t)
    k = [ex.keys(footprint(x, st, t)) for x in (s1, ld, s2)]
    with pytest.raises(TokenError, match="wait of its own"):
        ExactTokenPlanner(t).add_all([("SAVE", k[0], 0), ("LOAD", k[1], None), ("SAVE", k[2], 1)])
    with pytest.raises(TokenError, match="new planner"):
        ex.add("LOAD", footprint(ld, st, t))
        ex.add_all([("LOAD", k[1], None)])


@pytest.mark.parametrize("tname", sorted(TARGETS))
def test_dense_keys_are_the_key_sets(tname):
    """`DenseKeys.of_footprints` renumbers `KeySpace.footprint_keys` densely without changing which accesses
    share a key: per instruction as many distinct keys, and every two accesses share a key exactly when their key
    sets do; `last_conflict` finds the instruction a set test finds; `permuted` reorders. (The key rule itself is
    checked by hand in tests/test_footprint.py `test_keyspace_chunks`.)"""
    import numpy as np

    from opendpu.isa.deps import DenseKeys, KeySpace
    t = TARGETS[tname]
    for seed, (lc, dc) in enumerate([(8, 64), (1, 1), (8, 64)]):
        p = random_program(t, n=80, seed=300 + seed)
        fps = program_footprints(p.instructions, t, p.reg_sizes)
        space = KeySpace(t, line_chunk=lc, ddr_chunk=dc)
        sets = [space.footprint_keys(f) for f in fps]
        dk = DenseKeys.of_footprints(space, fps)
        dense = [dk.sets(k) for k in range(len(fps))]
        acc = [s for rw in sets for s in rw]
        dacc = [s for rw in dense for s in rw]
        assert [len(s) for s in acc] == [len(s) for s in dacc]
        for i in range(len(acc)):
            for j in range(i + 1, len(acc)):
                assert acc[i].isdisjoint(acc[j]) == dacc[i].isdisjoint(dacc[j]), (seed, i, j)
        assert sum(len(s) for s in acc) > 100
        mark = np.zeros(dk.total, np.int8)
        region = np.arange(len(fps) - 1, dtype=np.int64)
        for h in range(0, len(fps), 7):
            rh, wh = sets[h]
            want = 0
            for q in range(len(region) - 1, -1, -1):
                rx, wx = sets[int(region[q])]
                if not (wh.isdisjoint(rx) and wh.isdisjoint(wx) and rh.isdisjoint(wx)):
                    want = q + 1
                    break
            assert dk.last_conflict(h, region, 0, mark) == want and not mark.any()
        order = list(range(len(fps)))[::-1]
        assert [dk.permuted(order).sets(k) for k in range(len(fps))] == dense[::-1]
