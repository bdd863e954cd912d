"""Block-level tests of the LOAD engine and a SAVE unit (hw/loadsave.py) against the functional executor.

A test top holds LoadEngine + SaveUnit + BankArray; a Python DDR model (flat bytearray, 1-cycle read
latency, masked writes) serves the engines. Random LOAD/SAVE sequences run on the RTL and on DpuMachine;
every bank byte and every DDR byte must match, and each instruction's `end` must arrive exactly at
s + cost, with cost computed here from docs/microarchitecture.md §3.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module

from opendpu.hw.banks import BankArray, connect_load, connect_save
from opendpu.hw.loadsave import LoadEngine, SaveUnit
from opendpu.hw.params import HwError, HwParams
from opendpu.hw.simutil import run_sim

from helpers import ins, instr_value
from opendpu.isa.program import Instruction, to_arrays
from opendpu.isa.target import Target
from opendpu.sim import DpuMachine, ExecError
from opendpu.sim.timing import simulate


# ---- reference costs (docs/microarchitecture.md §3, masking of spec §6.2) ----------------------------
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def load_unmasked(f: dict, W: int) -> list[int]:
    """Unmasked byte count of each LOAD item, from the spec §6.2 pseudocode."""
    ch, jr, length = f["channel"], f["jump_read"], f["length"]
    out = []
    for i in range(length):
        masked = [False] * ch
        if jr <= ch <= 64:
            first_end = length - f["pad_idx"]
            for c in range(max(0, f["pad_start"] - i * jr)):
                masked[c] = True
            if i >= first_end:
                z = cdiv(ch, W) * W - (f["pad_end"] + jr * (i - first_end))
                for c in range(max(z, 0), ch):
                    masked[c] = True
        out.append(masked.count(False))
    return out


def cost_of(ins: Instruction, t: Target) -> int:
    tm, W, f = t.timing, t.bank_width, ins.fields
    if ins.op == "LOAD":
        lines = cdiv(f["channel"], W)
        if f["broadcast"] == 7:
            return tm.load_setup + f["length"] * lines
        ch = f["channel"]
        if (tm.weight_load_lines == 2 and t.convw_base <= f["bank_id"] < t.convw_base + t.ocp
                and not f["jump_read"] <= ch <= 64):     # (spec §6.2 augmentation, written out by hand here)
            lines = cdiv(lines, 2)                          # the wide weight path: two lines per cycle
        bp = tm.ddr_bytes_per_cycle * tm.ddr_ports
        return tm.load_setup + tm.ddr_latency + sum(max(cdiv(b, bp), lines) for b in load_unmasked(f, W))
    ch = f["channel"]
    if f["const_en"]:
        n, lines = ch, 0
    elif f["argmax"] & 2:
        n, lines = 1, cdiv(ch, W)
    else:
        n, lines = ch, cdiv(ch, W)
    return tm.save_setup + f["length"] * max(cdiv(n, tm.ddr_bytes_per_cycle), lines) + tm.ddr_latency


def test_reference_cost_hand_example():
    """The hand formula on the executor's augmentation example (run_case also checks it against the
    cycle model, sim/timing.simulate, on every random instruction)."""
    t = Target.parametric(2, 4, 2, bank_depth=64)
    # augmentation example of the executor tests: W=4, channel 6, jr 2, pad_start 3, pad_end 3, pad_idx 2
    f = ins("LOAD", jump_read=2, length=4, channel=6, pad_start=3, pad_end=3, pad_idx=2).fields
    # cw = 8: item0 c<3 masked (3 left); item1 c<1 (5); item2 z=5 (5); item3 z=3 (3)
    assert load_unmasked(f, 4) == [3, 5, 5, 3]
    assert cost_of(ins("LOAD", jump_read=2, length=4, channel=6, pad_start=3, pad_end=3, pad_idx=2), t) == \
        4 + 60 + 4 * 2


# ---- instructions ----------------------------------------------------------------------------------
def rand_load(rng, t: Target, regs: dict, kind: str) -> Instruction:
    W = t.bank_width
    reg = int(rng.choice(list(regs)))
    size = regs[reg]
    kw = dict(bank_id=int(rng.integers(0, t.num_banks)), bank_addr=int(rng.integers(0, 4096)),
              jump_write=int(rng.integers(1, 4)), length=int(rng.integers(1, 6)), reg_id=reg,
              const_value=int(rng.integers(0, 256)))
    if kind == "param":                                     # CONVW / DWCONVW / BIAS banks
        kw["bank_id"] = int(rng.integers(t.convw_base, t.num_banks))
    if kind in ("plain", "param", "bcast"):
        ch = int(rng.integers(1, 3 * W + 2))
        kw.update(channel=ch, jump_read=int(rng.integers(ch + 1, ch + 8)))
    elif kind == "overlap":                                 # jump_read < channel, nothing masked
        ch = int(rng.integers(65, 72)) if rng.random() < 0.5 else int(rng.integers(2, 3 * W + 2))
        kw.update(channel=ch, jump_read=int(rng.integers(1, ch)), length=int(rng.integers(1, 4)))
        if ch <= 64:                                        # augmentation active but no padding
            kw.update(pad_idx=1)
    elif kind == "aug":
        ch = int(rng.integers(2, min(64, 4 * W) + 1))
        kw.update(channel=ch, jump_read=int(rng.integers(1, min(ch, 6) + 1)),
                  pad_start=int(rng.integers(0, min(ch, 8))), pad_end=int(rng.integers(0, 7)),
                  pad_idx=int(rng.integers(1, 4)), length=int(rng.integers(2, 7)))
    if kind == "bcast" or (kind == "aug" and rng.random() < 0.25):
        kw["broadcast"] = 7                                 # (masked bytes of a broadcast stay 0)
    elif rng.random() < 0.1:
        kw["broadcast"] = int(rng.integers(0, 7))           # not 7: an ordinary DDR load
    span = (kw["length"] - 1) * kw["jump_read"] + kw["channel"]
    kw["ddr_addr"] = int(rng.integers(0, max(1, size - span + 1)))
    return ins("LOAD", **kw)


def rand_save(rng, t: Target, regs: dict, kind: str) -> Instruction:
    W = t.bank_width
    reg = int(rng.choice(list(regs)))
    size = regs[reg]
    ch = int(rng.integers(1, 3 * W + 2))
    kw = dict(bank_id=int(rng.integers(0, t.num_img_banks)), bank_addr=int(rng.integers(0, 4096)),
              jump_read=int(rng.integers(1, 4)), length=int(rng.integers(1, 5)), channel=ch, reg_id=reg,
              hp_id=int(rng.integers(0, 4)), const_value=int(rng.integers(0, 256)))
    kw["jump_write"] = int(rng.integers(ch, ch + 6)) if rng.random() < 0.8 else int(rng.integers(1, ch + 1))
    if kind == "argmax":
        kw["argmax"] = int(rng.choice([2, 3]))
        kw["channel"] = ch = int(rng.integers(1, 4 * W + 1))
        kw["jump_write"] = int(rng.integers(1, 4))
    elif kind == "const":
        kw["const_en"] = 1
        kw["argmax"] = int(rng.integers(0, 4))              # ignored under const_en
    span = (kw["length"] - 1) * kw["jump_write"] + ch
    kw["ddr_addr"] = int(rng.integers(0, max(1, size - span + 1)))
    return ins("SAVE", **kw)


KINDS = [("LOAD", "plain"), ("LOAD", "plain"), ("LOAD", "overlap"), ("LOAD", "aug"), ("LOAD", "aug"),
         ("LOAD", "bcast"), ("LOAD", "param"), ("SAVE", "plain"), ("SAVE", "plain"), ("SAVE", "argmax"),
         ("SAVE", "argmax"), ("SAVE", "const")]


# ---- the test top and the DDR model -----------------------------------------------------------------
class Top(Elaboratable):
    def __init__(self, p: HwParams):
        self.p = p
        self.ld = LoadEngine(p)
        self.sv = SaveUnit(p)
        self.banks = BankArray(p)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ld = self.ld
        m.submodules.sv = self.sv
        m.submodules.banks = self.banks
        connect_load(m, self.ld, self.banks)
        connect_save(m, self.sv, self.banks, self.p.ddr_ports - 1)
        return m


def line_int(row: np.ndarray, line: int, W: int) -> int:
    return int.from_bytes(row[line * W:(line + 1) * W].view(np.uint8).tobytes(), "little")


def run_case(t: Target, n_instr: int, seed: int, name: str, kinds=KINDS, small_values: bool = False,
             gaps=(0, 0, 1, 3), fixed=None, reg_sizes=None):
    """Random LOAD/SAVE sequence (or the `fixed` instructions) on the RTL and on DpuMachine; returns
    (instructions, cycles)."""
    p = HwParams.of(t)
    W, depth = t.bank_width, t.bank_depth
    rng = np.random.default_rng(seed)
    regs = reg_sizes or {int(k): int(rng.integers(150, 400)) for k in rng.choice(8, size=3, replace=False)}
    m = DpuMachine(t, regs, init_fill="zero")
    lo, hi = (-3, 4) if small_values else (-128, 128)
    m.banks[:] = rng.integers(lo, hi, m.banks.shape).astype(np.int8)
    for k, size in regs.items():
        m.write_ddr(k, 0, rng.integers(lo, hi, size).astype(np.int8))
    # physical DDR: registers at unaligned bases with garbage around them
    flat_size = 64 + sum(size + int(rng.integers(40, 100)) for size in regs.values())
    flat = bytearray(rng.integers(0, 256, flat_size).astype(np.uint8).tobytes())
    bases = [0] * 8
    pos = int(rng.integers(1, 40))
    for k in sorted(regs):
        bases[k] = pos
        pos += regs[k] + int(rng.integers(40, 100))
    for k in range(8):
        if k not in regs:
            bases[k] = int(rng.integers(0, 1 << 32))        # never used
    for k, size in regs.items():
        flat[bases[k]:bases[k] + size] = m.ddr(k).view(np.uint8).tobytes()
    banks0 = m.banks.copy()

    # instruction list: random instructions the executor accepts, applied to the reference machine
    instrs = []
    for i in fixed or ():
        m.run(to_arrays([i]))
        instrs.append(i)
    order = [kinds[j] for j in rng.permutation(len(kinds))]
    while len(instrs) < n_instr:
        eng, kind = order[len(instrs) % len(order)]         # round robin: every kind is covered
        i = rand_load(rng, t, regs, kind) if eng == "LOAD" else rand_save(rng, t, regs, kind)
        try:
            m.run(to_arrays([i]))
        except ExecError:
            continue
        instrs.append(i)
    costs = [cost_of(i, t) for i in instrs]
    assert costs == [int(c) for c in simulate(to_arrays(instrs), t).cost], "hand cost != cycle model"
    exp_flat = bytearray(flat)
    for k, size in regs.items():
        exp_flat[bases[k]:bases[k] + size] = m.ddr(k).view(np.uint8).tobytes()

    top = Top(p)
    ld, sv, banks = top.ld, top.sv, top.banks
    result = {}

    def rand_bits(n):
        return int.from_bytes(rng.bytes(cdiv(n, 8)), "little") & ((1 << n) - 1)

    async def tb(ctx):
        for b in range(t.num_banks):
            for ln in range(depth):
                ctx.set(banks.line(b, ln), line_int(banks0[b].copy(), ln, W))
        for k in range(8):
            ctx.set(ld.ddr_base[k], bases[k])
            ctx.set(sv.ddr_base[k], bases[k])
        cycle = 0
        q = list(instrs)
        cur = None                     # (engine name, start cycle, cost)
        next_start = 1
        n_done = 0
        written = [0]                  # DDR bytes written by the running SAVE
        while q or cur is not None:
            # the end pulses of this cycle (combinational from the engines' state)
            for nm, eng in (("LOAD", ld), ("SAVE", sv)):
                if ctx.get(eng.ctl.end):
                    assert cur is not None and cur[0] == nm, f"spurious {nm} end at cycle {cycle}"
                    assert cycle == cur[1] + cur[2], \
                        f"{nm} #{n_done} ended at {cycle - cur[1]} cycles, expected cost {cur[2]}"
                    if nm == "SAVE":            # DDR traffic of §3: length * n bytes, each written once
                        f = instrs[n_done].fields
                        n = 1 if (f["argmax"] & 2 and not f["const_en"]) else f["channel"]
                        assert written[0] == f["length"] * n, \
                            f"SAVE #{n_done} wrote {written[0]} bytes, expected {f['length'] * n}"
                    written[0] = 0
                    cur = None
                    n_done += 1
                    next_start = cycle + int(rng.choice(gaps))
            if cur is None and q and cycle >= next_start:
                i = q.pop(0)
                eng = ld if i.op == "LOAD" else sv
                ctx.set(eng.ctl.instr, instr_value(i))
                ctx.set(eng.ctl.start, 1)
                cur = (i.op, cycle, costs[len(instrs) - len(q) - 1])
            else:
                ctx.set(ld.ctl.start, 0)
                ctx.set(sv.ctl.start, 0)
                ctx.set(ld.ctl.instr, rand_bits(192))      # garbage while idle
                ctx.set(sv.ctl.instr, rand_bits(192))
            _, _, r_en, r_addr, w_en, w_addr, w_data, w_mask, b_en = await ctx.tick().sample(
                ld.ddr_rd.en, ld.ddr_rd.addr, sv.ddr_wr.en, sv.ddr_wr.addr, sv.ddr_wr.data, sv.ddr_wr.mask,
                ld.bank_wr.en)
            # writes must belong to the running instruction of their engine, before its end cycle
            if b_en:
                assert cur is not None and cur[0] == "LOAD" and cycle < cur[1] + cur[2], \
                    f"LOAD bank write outside its instruction at cycle {cycle}"
            if w_en:
                assert cur is not None and cur[0] == "SAVE" and cycle < cur[1] + cur[2], \
                    f"SAVE DDR write outside its instruction at cycle {cycle}"
                written[0] += bin(w_mask).count("1")
                for j in range(p.ddr_wr_bytes):
                    if (w_mask >> j) & 1:
                        a = w_addr + j
                        assert a < flat_size, f"SAVE writes past the DDR model at {a:#x}"
                        flat[a] = (w_data >> (8 * j)) & 0xFF
            cycle += 1
            RW = p.ddr_rd_bytes
            if r_en:
                raw = bytes(flat[r_addr:r_addr + RW]) if r_addr < flat_size else b""
                raw = raw + bytes(rng.integers(0, 256, RW - len(raw)).astype(np.uint8))
                ctx.set(ld.ddr_rd.data, int.from_bytes(raw, "little"))
            else:
                ctx.set(ld.ddr_rd.data, rand_bits(8 * RW))    # no read: the port holds garbage
            assert cycle < 200_000
        # a few idle cycles: no stray end or writes
        for _ in range(3):
            assert not ctx.get(ld.ctl.end) and not ctx.get(sv.ctl.end)
            assert not ctx.get(ld.bank_wr.en) and not ctx.get(sv.ddr_wr.en)
            await ctx.tick()
        got = np.zeros_like(m.banks)
        for b in range(t.num_banks):
            row = bytearray()
            for ln in range(depth):
                row += ctx.get(banks.line(b, ln)).to_bytes(W, "little")
            got[b] = np.frombuffer(bytes(row), np.int8)
        result["banks"] = got
        result["cycles"] = cycle

    run_sim(top, tb, name=name)
    for b in range(t.num_banks):
        bad = np.nonzero(result["banks"][b] != m.banks[b])[0]
        assert bad.size == 0, (f"bank {b}: {bad.size} bytes differ, first at line {bad[0] // W} byte "
                               f"{bad[0] % W}: rtl {result['banks'][b][bad[0]]} exec {m.banks[b][bad[0]]}")
    diff = np.nonzero(np.frombuffer(bytes(flat), np.uint8) != np.frombuffer(bytes(exp_flat), np.uint8))[0]
    assert diff.size == 0, f"{diff.size} DDR bytes differ, first at {diff[0]:#x}: rtl {flat[diff[0]]} " \
                           f"exec {exp_flat[diff[0]]}"
    return instrs, result["cycles"]


def kinds_of(instrs, W: int):
    out = set()
    for i in instrs:
        f = i.fields
        if i.op == "LOAD":
            out.add("bcast" if f["broadcast"] == 7 else "load")
            if sum(load_unmasked(f, W)) < f["length"] * f["channel"]:
                out.add("aug")              # some bytes masked by channel augmentation
        else:
            out.add("const" if f["const_en"] else ("argmax" if f["argmax"] & 2 else "save"))
    return out


# ---- tests -------------------------------------------------------------------------------------------
T_SMALL = Target.parametric(2, 4, 2, bank_depth=64)                 # W 4, banks 0-3 img, 4-7 CONVW, 8, 9


def test_small_default_timing():
    instrs, _ = run_case(T_SMALL, 40, seed=1, name="loadsave_small")
    assert {"load", "bcast", "aug", "save", "const", "argmax"} <= kinds_of(instrs, 4)


def test_small_ties_and_masking():
    """Few distinct byte values: argmax ties everywhere; augmentation-heavy mix; back-to-back starts."""
    t = T_SMALL.with_timing(ddr_latency=5, load_setup=2, save_setup=1)
    kinds = [("LOAD", "aug"), ("LOAD", "aug"), ("LOAD", "overlap"), ("SAVE", "argmax"), ("SAVE", "argmax"),
             ("SAVE", "plain")]
    run_case(t, 40, seed=2, name="loadsave_ties", kinds=kinds, small_values=True, gaps=(0,))


def test_preset_shaped():
    """PP 4, CP 8 (B512 shape) with default timing."""
    run_case(Target.parametric(4, 8, 2, bank_depth=64), 30, seed=3, name="loadsave_pp4cp8")


def test_narrow_ddr_one_port():
    """B = 4 < W = 8, one port: DDR beats outnumber lines (LOAD and SAVE); minimal setups / latency."""
    t = Target.parametric(4, 8, 2, bank_depth=64).with_timing(ddr_bytes_per_cycle=4, ddr_ports=1,
                                                               load_setup=1, save_setup=0, ddr_latency=3)
    run_case(t, 30, seed=4, name="loadsave_narrow")


def test_wide_ddr_odd_width():
    """W = 6 (not a power of two), B = 32 > W (const SAVE beats of 32 bytes), three ports."""
    t = Target.parametric(2, 6, 1, bank_depth=64).with_timing(ddr_bytes_per_cycle=32, ddr_ports=3,
                                                               load_setup=7, save_setup=3, ddr_latency=9)
    run_case(t, 30, seed=5, name="loadsave_wide")


def test_wide_weight_path():
    """weight_load_lines 2: a DDR LOAD into a CONVW bank writes two lines per cycle (lines of an item at either
    parity, odd line counts, bank wrap), through the split CONVW memories; augmentation and broadcast LOADs into
    CONVW, and LOADs into the other banks, keep one line per cycle (hand cost, checked against the cycle model)."""
    t = Target.parametric(2, 4, 2, bank_depth=64).with_timing(weight_load_lines=2, ddr_latency=5, load_setup=2)
    fixed = [ins("LOAD", bank_id=t.convw_base, bank_addr=63, jump_write=3, jump_read=200, length=2, channel=21,
                 reg_id=0, ddr_addr=3)]
    # 21 bytes = 6 lines in 3 cycles per item (the first from line 63: the second line wraps to line 0)
    assert cost_of(fixed[0], t) == 2 + 5 + 2 * 3
    kinds = [("LOAD", "param"), ("LOAD", "param"), ("LOAD", "param"), ("LOAD", "aug"), ("LOAD", "plain"),
             ("SAVE", "plain")]
    instrs, _ = run_case(t, 40, seed=8, name="loadsave_wide_weights", kinds=kinds, fixed=fixed,
                         reg_sizes={0: 400, 1: 300, 5: 300})
    wide = [i for i in instrs if i.op == "LOAD" and
            t.load_lines_per_cycle(i.fields["bank_id"], i.fields["channel"], i.fields["jump_read"],
                                   i.fields["broadcast"]) == 2]
    assert len(wide) >= 5 and any(cdiv(i.fields["channel"], 4) % 2 for i in wide)


def test_width_one():
    """CP 1: one-byte lines, every multi-byte item spans many lines."""
    t = Target.parametric(1, 1, 1, bank_depth=16).with_timing(ddr_latency=3, load_setup=1, save_setup=0)
    run_case(t, 25, seed=7, name="loadsave_w1")


def test_large_fields():
    """Field extremes: channel 16384 / 4096, jumps of 65536 bytes, long argmax (index > 255), bank wrap."""
    t = Target.parametric(2, 8, 1, bank_depth=64).with_timing(ddr_latency=7, load_setup=2, save_setup=2)
    fixed = [
        ins("LOAD", bank_id=0, bank_addr=4095, jump_write=1024, jump_read=65536, length=1, channel=16384,
            reg_id=0, ddr_addr=5),
        ins("LOAD", bank_id=3, bank_addr=33, jump_write=1024, jump_read=65536, length=2, channel=100,
            reg_id=0, ddr_addr=13),
        ins("LOAD", bank_id=1, bank_addr=3, jump_write=1, jump_read=77, length=1024, channel=1, reg_id=0,
            ddr_addr=7),
        ins("SAVE", bank_id=0, bank_addr=4000, jump_read=1024, jump_write=65536, length=2, channel=4096,
            reg_id=2, ddr_addr=3),
        ins("SAVE", bank_id=1, bank_addr=17, jump_read=3, jump_write=65536, length=2, channel=4096,
            reg_id=2, ddr_addr=1, argmax=2),
        ins("SAVE", bank_id=2, bank_addr=0, jump_read=1, jump_write=1, length=1024, channel=1, reg_id=2,
            ddr_addr=11, const_en=1, const_value=0x81),
        ins("LOAD", bank_id=t.bias_bank, bank_addr=60, jump_write=1024, length=3, channel=700, reg_id=0,
            broadcast=7, const_value=0x5A, jump_read=3),
    ]
    run_case(t, 0, seed=6, name="loadsave_large", fixed=fixed, reg_sizes={0: 65536 + 16400, 2: 65536 + 4200})


def test_refuses_unrealisable_timing():
    with pytest.raises(HwError, match="load_setup"):
        HwParams.of(T_SMALL.with_timing(load_setup=0))
    with pytest.raises(HwError, match="ddr_latency"):
        HwParams.of(T_SMALL.with_timing(ddr_latency=2))
    with pytest.raises(HwError, match="weight_load_lines 2 .* bank_depth 1 must be >= 2"):
        HwParams.of(Target.parametric(1, 1, 1, bank_depth=1).with_timing(weight_load_lines=2))


def test_weight_load_lines_out_of_range_is_a_clear_error():
    from opendpu.isa.target import TargetError
    for v in (0, 3):
        with pytest.raises(TargetError, match=f"timing weight_load_lines must be >= 1 and <= 2; {v} is out of range"):
            T_SMALL.with_timing(weight_load_lines=v)


@pytest.mark.parametrize("preset", ["DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B4096"])
def test_verilog(preset, monkeypatch):
    from amaranth.back import verilog
    monkeypatch.setenv("AMARANTH_USE_YOSYS", "builtin")
    p = HwParams.of(preset)
    for cls in (LoadEngine, SaveUnit):
        t0 = time.time()
        v = verilog.convert(cls(p), name=cls.__name__)
        assert f"module {cls.__name__}" in v
        print(f"{preset} {cls.__name__}: {len(v.splitlines())} lines of Verilog in {time.time() - t0:.1f} s")


def test_verilog_does_not_grow_with_the_array(monkeypatch):
    """The export's work is the netlist it writes: the LOAD and SAVE engines of B4096 (8x the MACs, 2x the banks'
    width of B512) are within 1.3x the Verilog lines of B512's (only port widths grow; nothing is unrolled per bank,
    line or channel). Export times: benchmarks/bench_checks.py."""
    from amaranth.back import verilog
    monkeypatch.setenv("AMARANTH_USE_YOSYS", "builtin")
    for cls in (LoadEngine, SaveUnit):
        lines = {preset: len(verilog.convert(cls(HwParams.of(preset)), name=cls.__name__).splitlines())
                 for preset in ("DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B4096")}
        assert lines["DPUCZDX8G_ISA1_B4096"] <= 1.3 * lines["DPUCZDX8G_ISA1_B512"], (cls.__name__, lines)
