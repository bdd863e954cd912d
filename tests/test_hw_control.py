"""Block test of the RTL control (fetch, dispatch, queues, tokens, retire) in Amaranth's simulator.

The engines are replaced by the testbench: when the control starts instruction k in cycle s, the
testbench raises that engine's `end` in cycle s + cost_k + stall_bank_k (the bank-port stalls the cycle
model computes, docs/bank-ports.md). Every start and retire cycle the RTL control
produces must equal the cycle model's independent max-plus schedule (sim/timing.py).
"""
import os

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

import numpy as np
import pytest

from opendpu.isa.program import encode
from opendpu.isa.target import Target
from opendpu.sim.progen import random_program
from opendpu.sim.timing import simulate

from opendpu.hw.control import Control, n_ret_slots, n_end_slots
from opendpu.hw.params import HwParams
from opendpu.hw.simutil import run_sim


def run_control(target, instrs):
    p = HwParams.of(target)
    sched = simulate(instrs, target)
    words = np.frombuffer(encode(instrs), "<u4")
    dut = Control(p)
    res = {"start": {}, "ret": {}, "end": {}, "total": None}
    ports = p.ddr_ports
    ctls = {0: dut.load, 2: dut.conv, 3: dut.misc}

    async def tb(ctx):
        ctx.set(dut.instr_base, 0)
        ctx.set(dut.go, 1)
        await ctx.tick()
        ctx.set(dut.go, 0)
        pending = {}       # cycle -> list of end signals to raise
        prev_en, prev_addr = 0, 0
        limit = int(sched.total_cycles) + 50
        for c in range(limit):
            assert ctx.get(dut.cyc) == c
            ctx.set(dut.ifetch.data, int(words[prev_addr]) if prev_en and prev_addr < len(words) else 0)
            for s in [dut.load.end, dut.conv.end, dut.misc.end] + [dut.save[u].end for u in range(ports)]:
                ctx.set(s, 0)
            for s in pending.pop(c, []):
                ctx.set(s, 1)
            prev_en, prev_addr = ctx.get(dut.ifetch.en), ctx.get(dut.ifetch.addr)
            sv = ctx.get(dut.tr_start_v)
            for e in range(4):
                if sv >> e & 1:
                    k = ctx.get(dut.tr_start_idx[e])
                    res["start"][k] = c
                    # the engine's busy time: cost plus the cycles the bank arbiter refused it
                    cost = int(sched.cost[k]) + int(sched.stall_bank[k])
                    if e == 1:
                        if instrs[k].op == "END":
                            continue
                        hp = instrs[k].fields["hp_id"] % ports
                        sig = dut.save[hp].end
                    else:
                        sig = ctls[e].end
                    pending.setdefault(c + cost, []).append(sig)
            rv = ctx.get(dut.tr_ret_v)
            for j in range(n_ret_slots(p)):
                if rv >> j & 1:
                    res["ret"][ctx.get(dut.tr_ret_idx[j])] = c
            ev = ctx.get(dut.tr_end_v)
            for j in range(n_end_slots(p)):
                if ev >> j & 1:
                    res["end"][ctx.get(dut.tr_end_idx[j])] = c
            if ctx.get(dut.done):
                res["total"] = c
                break
            await ctx.tick()
        res["err"] = ctx.get(dut.err)

    run_sim(dut, tb, name="control")
    return sched, res


def check(sched, res):
    n = len(sched)
    assert res["total"] == sched.total_cycles, (res["total"], sched.total_cycles)
    assert res["err"] == 0
    for k in range(n):
        got = res["start"].get(k)
        assert got == sched.start[k], f"instruction {k}: start {got} != {sched.start[k]}"
        assert res["end"].get(k) == sched.end[k], f"instruction {k}: end {res['end'].get(k)} != {sched.end[k]}"
        assert res["ret"].get(k) == sched.retire[k], f"instruction {k}: retire {res['ret'].get(k)} != {sched.retire[k]}"


@pytest.mark.parametrize("seed", range(6))
def test_control_matches_cycle_model(seed):
    t = Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=64)
    if seed % 3 == 1:
        t = t.with_timing(queue_depth=2, fetch_fifo_words=8, fetch_latency=3, ddr_latency=5)
    if seed % 3 == 2:
        t = t.with_timing(ddr_ports=1, end_cycles=3, init_cycles=2, fetch_latency=1)
    g = random_program(t, 40, seed=seed)
    sched, res = run_control(t, g.instructions)
    check(sched, res)
