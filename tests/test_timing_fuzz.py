"""Cycle model on random valid programs (sim/progen.py): no crash, no false deadlock, broken token
patterns reported as deadlocks, timed-order execution equal to program order."""
import numpy as np
import pytest

from opendpu.isa.target import Target
from opendpu.sim.progen import break_tokens, random_program
from opendpu.sim.timing import DeadlockError, simulate

TARGETS = [Target.from_name("B4096"), Target.from_name("B512"), Target.from_name("B1024"),
           Target.parametric(4, 8, 2, bank_depth=512)]
N_PROGRAMS = 10_000


def test_ten_thousand_random_programs_schedule_without_deadlock():
    """10,000 valid programs (4 targets, 10..80 instructions, varied timing): every one completes, the
    total is bounded below by every engine's busy time, and every start respects dispatch and tokens."""
    rng = np.random.default_rng(0)
    for k in range(N_PROGRAMS):
        t = TARGETS[k % len(TARGETS)]
        if k % 7 == 0:
            t = t.with_timing(queue_depth=int(rng.integers(1, 5)), fetch_fifo_words=int(rng.integers(6, 40)),
                              ddr_latency=int(rng.integers(0, 100)), ddr_bytes_per_cycle=int(rng.integers(1, 65)))
        gp = random_program(t, n=int(rng.integers(10, 81)), seed=k)
        s = simulate(gp.arrays, t)
        assert s.complete
        busy = s.engine_busy()
        assert all(s.total_cycles >= b for b in busy.values()), k
        assert np.all(s.start > s.dispatch) and np.all(s.end >= s.start) and np.all(s.retire >= s.end), k


def test_broken_token_patterns_are_deadlocks_not_hangs():
    for k in range(200):
        t = TARGETS[k % len(TARGETS)]
        gp = random_program(t, n=30 + k % 40, seed=1000 + k)
        for kind in ("starve", "cycle"):
            bad = break_tokens(gp, kind, seed=k)
            with pytest.raises(DeadlockError) as ei:
                simulate(bad, t)
            assert ei.value.blocked and "deadlock:" in str(ei.value)
            assert all(0 <= b["index"] < len(bad) for b in ei.value.blocked)


def test_timed_order_execution_equals_program_order_on_random_programs():
    for k in range(150):
        t = TARGETS[k % len(TARGETS)]
        gp = random_program(t, n=20 + k % 60, seed=5000 + k)
        ref = gp.machine()
        ref.run(gp.arrays)
        m = gp.machine()
        s = simulate(gp.arrays, t, machine=m)
        assert s.complete
        assert np.array_equal(m._ddr, ref._ddr) and np.array_equal(m.banks, ref.banks), k


def test_synthetic_resnet50_sized_program():
    t = Target.from_name("B4096")
    gp = random_program(t, n=50_000, seed=11)
    s = simulate(gp.arrays, t)
    assert s.complete and len(s) >= 50_000
    assert s.total_cycles >= max(s.engine_busy().values())
