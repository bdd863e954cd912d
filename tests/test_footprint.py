"""Footprints (isa/footprint.py) against the executor, and the token service (isa/deps.py).

The executor is the reference: run one instruction at a time and diff the banks and DDR. Every byte it
changes must lie in footprint(i).writes; and with every byte outside footprint(i).reads randomised, the
instruction must write the same values over footprint(i).writes (which also shows that every line and byte
in the writes is really written). The executor's LOAD/SAVE byte counters must equal the footprint's DDR
byte counts. Hand-computed LOAD/SAVE footprints come from the spec pseudocode (§6.2, §6.3).
"""
from __future__ import annotations

import copy
import random

import numpy as np
import pytest

from opendpu.isa.deps import (KeySpace, TokenError, TokenPlanner, bit, cross, engines_of, find_races, mask,
                              token_counts)
from opendpu.isa.fields import Engine
from opendpu.isa.footprint import (Access, Bytes, FootprintError, InitState, Lines, footprint,
                                   program_footprints)
from opendpu.isa.program import Instruction
from opendpu.isa.target import Target
from opendpu.sim.progen import random_program
from tests.conftest import model_path
from tests.helpers import ins

TARGETS = {
    "B512": Target.from_name("B512"),
    "B4096": Target.from_name("B4096"),
    "P4_8_D512": Target.parametric(4, 8, 2, bank_depth=512),
}


# ---- the executor as reference -----------------------------------------------------------------------
def _bytes_moved(m) -> tuple[int, int]:
    st = m.stats
    return sum(st["load_bytes"].values()), sum(st["save_bytes"].values())


def _lines_of(m, t: Target) -> np.ndarray:
    return m.banks.reshape(t.num_banks, t.bank_depth, t.bank_width)


def step_and_check(m, arrays, i: int, instr: Instruction, fp, t: Target, reg_sizes, rng=None) -> None:
    """Execute instruction i on machine m and check it against its footprint: changed bytes lie in the
    writes, LOAD/SAVE byte counts match; with `rng`, also run it on a copy whose bytes outside the reads
    are random and compare the two over the writes."""
    D, nb = t.bank_depth, t.num_banks
    other = None
    if rng is not None:
        other = copy.deepcopy(m)
        keep = fp.reads.bank_mask(nb, D)
        lines = _lines_of(other, t)
        lines[~keep] = rng.integers(-128, 128, size=(int((~keep).sum()), t.bank_width), dtype=np.int8)
        for r, size in reg_sizes.items():
            d = other.ddr(r)
            free = ~fp.reads.ddr_mask(r, size)
            d[free] = rng.integers(-128, 128, size=int(free.sum()), dtype=np.int8)
    before = _lines_of(m, t).copy()
    ddr_before = {r: m.ddr(r).copy() for r in reg_sizes}
    ld0, sv0 = _bytes_moved(m)
    m.run(arrays, i, i + 1)
    wmask = fp.writes.bank_mask(nb, D)
    changed = (_lines_of(m, t) != before).any(axis=2)
    assert not (changed & ~wmask).any(), (i, instr.op, np.argwhere(changed & ~wmask)[:4].tolist())
    wddr = {r: fp.writes.ddr_mask(r, reg_sizes[r]) for r in {reg for reg, _, _ in fp.writes.ddr_ranges()}}
    for r in reg_sizes:
        if r not in wddr:
            assert np.array_equal(m.ddr(r), ddr_before[r]), (i, instr.op, r)
            continue
        dch = m.ddr(r) != ddr_before[r]
        assert not (dch & ~wddr[r]).any(), (i, instr.op, r, np.flatnonzero(dch & ~wddr[r])[:4].tolist())
    ld1, sv1 = _bytes_moved(m)
    if instr.op == "LOAD":
        assert ld1 - ld0 == fp.reads.ddr_bytes(), (i, ld1 - ld0, fp.reads.ddr_bytes())
    if instr.op == "SAVE":
        assert sv1 - sv0 == fp.writes.ddr_bytes(), (i, sv1 - sv0, fp.writes.ddr_bytes())
    if other is not None:
        other.run(arrays, i, i + 1)
        assert np.array_equal(_lines_of(other, t)[wmask], _lines_of(m, t)[wmask]), (i, instr.op)
        for r, w in wddr.items():
            assert np.array_equal(other.ddr(r)[w], m.ddr(r)[w]), (i, instr.op, r)


# ---- hand-computed footprints (spec §6.2, §6.3) ----------------------------------------------------------
def test_load_footprint_by_hand():
    """B512 (W = 8 bytes, DEPTH 2048). channel 12 = 2 lines per item; jump_read 5 <= channel: channel
    augmentation with pad_start 7, pad_end 4, pad_idx 2, so first_end_item = 4 - 2 = 2 and cw = 16.
    Leading bytes masked: item 0: 7, item 1: 7 - 5 = 2. Trailing: item 2: z = 16 - 4 = 12 (none),
    item 3: z = 16 - (4 + 5) = 7. Unmasked DDR bytes: [107,112), [107,117), [110,122), [115,122) = 5+10+12+7
    = 34 bytes, union [107, 122). Lines 2040+3i, 2 each: 2040-41, 2043-44, 2046-47, 2049-50 -> 1-2."""
    t = TARGETS["B512"]
    ld = ins("LOAD", bank_id=2, bank_addr=2040, jump_write=3, length=4, channel=12, jump_read=5, pad_start=7,
             pad_end=4, pad_idx=2, reg_id=1, ddr_addr=100)
    fp = footprint(ld, InitState(), t, {1: 200})
    assert fp.reads.ddr_ranges() == [(1, 107, 122)]
    assert fp.reads.ddr_bytes() == 34
    assert fp.reads.lines == () and fp.writes.ddr == ()
    assert fp.writes.bank_ranges(2048) == [(2, 1, 2), (2, 2040, 2041), (2, 2043, 2044), (2, 2046, 2047)]
    # constant fill: no DDR read at all
    assert not footprint(ins("LOAD", broadcast=7, channel=8, reg_id=5, ddr_addr=10**6), InitState(), t).reads
    # and the executor agrees on the bytes it reads and the lines it writes
    m = _machine(t, {1: 200})
    m.write_ddr(1, 0, np.arange(1, 201, dtype=np.int64).astype(np.int8))
    step_and_check(m, _arrays([ld]), 0, ld, fp, t, {1: 200}, np.random.default_rng(0))


def test_save_footprint_by_hand():
    """B512: channel 10 = 2 lines per item, lines 2046 + 2i -> 2046-47, 0-1, 2-3; DDR items every 16 bytes
    from 40: [40,50), [56,66), [72,82); argmax index mode writes 1 byte per item; const_en reads nothing."""
    t = TARGETS["B512"]
    f = dict(bank_id=5, bank_addr=2046, jump_read=2, length=3, channel=10, jump_write=16, reg_id=2, ddr_addr=40)
    fp = footprint(ins("SAVE", **f), InitState(), t, {2: 82})
    assert fp.reads.bank_ranges(2048) == [(5, 0, 3), (5, 2046, 2047)]
    assert fp.writes.ddr_ranges() == [(2, 40, 50), (2, 56, 66), (2, 72, 82)]
    assert fp.writes.ddr_bytes() == 30
    am = footprint(ins("SAVE", argmax=2, **f), InitState(), t)
    assert am.writes.ddr_ranges() == [(2, 40, 41), (2, 56, 57), (2, 72, 73)]
    ce = footprint(ins("SAVE", const_en=1, **f), InitState(), t)
    assert not ce.reads and ce.writes.ddr_ranges() == fp.writes.ddr_ranges()
    with pytest.raises(FootprintError):                  # [72, 82) does not fit in 81 bytes
        footprint(ins("SAVE", **f), InitState(), t, {2: 81})


def test_conv_footprint_by_hand():
    """B512 (PP 4): CONVINIT 3x3, stride 2, vpp 2, jump_read 1, jump_read_endl 40; CONV length 2 from bank 3
    (slot 3), cg 1, pad_top 1 / pad_bottom 1 (last valid row index 1: one padded row at each end).
    rows_in = (2-1)*2+3 = 5, rows 1..3 are read (§6.4: 1 <= r < 5-3+1+1). Row r: t = r, slot 3 + r//2,
    sub-row r%2: row 1 -> bank 3, pass 0, line 100+40 = 140; row 2 -> slot 4 = bank 0, pass 1, line 200;
    row 3 -> bank 0, line 240; cols_in = (2-1)*2+3 = 5 columns each. Weights: lines 30..30+9-1 of all 8
    CONVW banks; bias: line 9. Output (stride_out 1): row h in bank 4+h, lines 7 and 7+2 (jump_write 2)."""
    t = TARGETS["B512"]
    st = InitState(conv=ins("CONVINIT", kernel_h=3, kernel_w=3, stride_h=2, stride_w=2, valid_pixel_parallel=2,
                            jump_read=1, jump_read_endl=40, jump_write=2, jump_write_endl=64).fields)
    cv = ins("CONV", bank_id_in=3, bank_addr_in=100, bank_addr_in_1=200, length=2, channel_group=1,
             pad_top=1, pad_bottom=1, pad_right=2, bank_id_out=4, bank_addr_out=7, bank_addr_weights=30,
             bank_addr_bias=9)
    fp = footprint(cv, st, t)
    want = [(3, 140, 144), (0, 200, 204), (0, 240, 244)]
    want += [(b, 30, 38) for b in range(t.convw_base, t.convw_base + t.ocp)] + [(t.bias_bank, 9, 9)]
    assert fp.reads.bank_ranges(2048) == sorted(want)
    assert fp.writes.bank_ranges(2048) == [(4, 7, 7), (4, 9, 9), (5, 7, 7), (5, 9, 9)]
    with pytest.raises(FootprintError):
        footprint(cv, InitState(), t)                    # no CONVINIT
    ci = ins("CONVINIT", **st.conv)
    m = _machine(t, {0: 16})
    m.run(_arrays([ci, cv]), 0, 1)
    step_and_check(m, _arrays([ci, cv]), 1, cv, fp, t, {0: 16}, np.random.default_rng(0))


@pytest.mark.parametrize("mode", (0, 8, 6))
def test_alu_footprint_by_hand(mode):
    """B512, ALUINIT kernel 1x2, stride 1, length 2, cg 1, jump_read 2, jump_read_weights 4; ALU kernel_d 2,
    vpp 1, no padding. cols_in = (2-1)*1+2 = 3: input pixels at lines 50, 52, 54 of bank 0, kernel_d*cg = 2
    lines each -> 50..55 (§6.8). Weights (DWCONVW = bank 16), kernel positions p = 0, 1 at 20 + 4p:
    dwconv (0, 6): kernel_d*cg = 2 lines each -> 20-21, 24-25; w16b0 (8): one 16-bit weight per channel
    group, lines 20+4p + 2k for k < kernel_d*cg -> 20, 22, 24, 26. Bias (bank 17, mode 0 only): cg lines
    from 5. Output: bank 4, lines 300, 301."""
    t = TARGETS["B512"]
    ai = ins("ALUINIT", exec_mode=mode, kernel_h=1, kernel_w=2, length=2, channel_group=1, jump_read=2,
             jump_read_endl=10, jump_read_weights=4, jump_write=1, jump_write_endl=10, shift_cut=6)
    al = ins("ALU", bank_id_in=0, bank_addr_in=50, kernel_d=2, pad_bottom=0, pad_right=1, bank_addr_weights=20,
             bank_addr_bias=5, bank_id_out=4, bank_addr_out=300)
    fp = footprint(al, InitState(alu=ai.fields), t)
    want = [(0, 50, 55)]
    want += [(16, 20, 20), (16, 22, 22), (16, 24, 24), (16, 26, 26)] if mode == 8 else [(16, 20, 21), (16, 24, 25)]
    want += [(17, 5, 5)] if mode == 0 else []
    assert fp.reads.bank_ranges(2048) == want
    assert fp.writes.bank_ranges(2048) == [(4, 300, 301)]
    m = _machine(t, {0: 16})
    m.run(_arrays([ai, al]), 0, 1)
    step_and_check(m, _arrays([ai, al]), 1, al, fp, t, {0: 16}, np.random.default_rng(mode))


def test_elew_footprint_by_hand():
    """B512 (PP 4), ELEW vpp 2, length 3, cg 1, jump_write 2: output rows in banks 3 and 0 (slot 4 wraps,
    line offset jump_write_endl 100): lines 10, 12, 14 of bank 3 and 110, 112, 114 of bank 0. Input 0 from
    bank 2 with jump_bank 2: rows in banks 2 and 0 (slot 4: + jump_read_endl 7), jump_read 1 -> 40..42,
    47..49; input 1 with share_pp: one row, bank 5, jump_read 0 -> line 60 only."""
    t = TARGETS["B512"]
    e0 = ins("ELEWINIT", id=0, bank_id_in=2, bank_addr_in=40, jump_bank=2, jump_read=1, jump_read_endl=7)
    e1 = ins("ELEWINIT", id=1, bank_id_in=5, bank_addr_in=60, share_pp=1, jump_read=0)
    ew = ins("ELEW", num=2, valid_pixel_parallel=2, length=3, channel_group=1, bank_id_out=3, bank_addr_out=10,
             jump_write=2, jump_write_endl=100)
    st = InitState()
    st.update("ELEWINIT", e0.fields)
    st.update("ELEWINIT", e1.fields)
    fp = footprint(ew, st, t)
    assert fp.reads.bank_ranges(2048) == [(0, 47, 49), (2, 40, 42), (5, 60, 60)]
    assert fp.writes.bank_ranges(2048) == [(0, 110, 110), (0, 112, 112), (0, 114, 114), (3, 10, 10), (3, 12, 12),
                                           (3, 14, 14)]
    m = _machine(t, {0: 16})
    m.run(_arrays([e0, e1, ew]), 0, 2)
    step_and_check(m, _arrays([e0, e1, ew]), 2, ew, fp, t, {0: 16}, np.random.default_rng(1))


def test_errors_and_empty():
    t = TARGETS["B512"]
    for op in ("CONVINIT", "ALUINIT", "ELEWINIT", "END"):
        fp = footprint(ins(op), InitState(), t)
        assert not fp.reads and not fp.writes
    with pytest.raises(FootprintError):
        footprint(ins("POOL"), InitState(), t)
    with pytest.raises(FootprintError):
        footprint(ins("ELEW", num=2), InitState(), t)    # no ELEWINIT descriptors
    with pytest.raises(FootprintError, match="instruction 1"):
        program_footprints([ins("CONVINIT"), ins("ALU"), ins("END")], t)
    with pytest.raises(FootprintError, match="not allocated"):
        footprint(ins("LOAD", reg_id=3, channel=8), InitState(), t, {0: 100})
    # a run longer than the bank covers it once; a wrapped run is split
    acc = Access((Lines(1, 2047, 3, 1, 1), Lines(2, 5, 1, 0, 5000)))
    assert acc.bank_ranges(2048) == [(1, 0, 1), (1, 2047, 2047), (2, 0, 2047)]
    assert Access((), (Bytes(0, 10, 3, 2, 4),)).ddr_ranges() == [(0, 10, 18)]


# ---- random programs ---------------------------------------------------------------------------------
def _machine(t, reg_sizes):
    from opendpu.sim.executor import DpuMachine
    return DpuMachine(t, reg_sizes, init_fill="random", seed=3)


def _arrays(instrs):
    from opendpu.isa.program import to_arrays
    return to_arrays(instrs)


@pytest.mark.parametrize("tname", list(TARGETS))
def test_random_programs_writes_and_reads(tname):
    """Every instruction of 3 generated programs per target (about 200 instructions), each checked for
    writes (diff) and reads (randomised surroundings)."""
    t = TARGETS[tname]
    rng = np.random.default_rng(7)
    ops = set()
    for seed in range(3):
        p = random_program(t, n=60, seed=40 + seed)
        fps = program_footprints(p.instructions, t, p.reg_sizes)
        m = p.machine()
        for i, (x, fp) in enumerate(zip(p.instructions, fps)):
            ops.add(x.op)
            step_and_check(m, p.arrays, i, x, fp, t, p.reg_sizes, rng)
    assert {"LOAD", "SAVE", "CONV", "ALU", "ELEW"} <= ops


# ---- the shared models -----------------------------------------------------------------------------------
SMALL = ("dpu_mnist_classifier", "tf2_custom_op")
LARGE = ("pointpillars_custom_op", "yolox_nano_b4096", "yolox_nano_b512")


def _subgraphs(name):
    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    g = Graph.load(model_path(name))
    return [DpuSubgraph(g, sg) for sg in dpu_subgraphs(g)]


def _prepared_machine(d, seed=0):
    m = d.new_machine(seed=seed)
    rng = np.random.default_rng(seed)
    d.write_inputs(m, [rng.integers(-128, 128, size=s.dims, dtype=np.int8) for s in d.inputs])
    return m


def _sample(instrs, rng: random.Random, head: int, per_op: int) -> list[int]:
    """The first `head` instructions and up to `per_op` random instances of every mnemonic."""
    by_op: dict[str, list[int]] = {}
    for i, x in enumerate(instrs):
        by_op.setdefault(x.op, []).append(i)
    pick = set(range(min(head, len(instrs))))
    for idx in by_op.values():
        pick.update(rng.sample(idx, min(per_op, len(idx))))
    return sorted(pick)


@pytest.mark.parametrize("name", SMALL)
def test_small_models_every_instruction(name):
    """MNIST and the custom-op MNIST: every instruction, writes by diff and reads by randomisation."""
    rng = np.random.default_rng(1)
    for d in _subgraphs(name):
        fps = program_footprints(d.instructions, d.target, d.reg_sizes)
        m = _prepared_machine(d)
        for i, (x, fp) in enumerate(zip(d.instructions, fps)):
            step_and_check(m, d.arrays, i, x, fp, d.target, d.reg_sizes, rng)


PREFIX = 6000


@pytest.mark.parametrize("name", LARGE)
def test_large_models_sampled(name):
    """PointPillars (2 subgraphs, 33k + 20k instructions) and YOLOX-nano B4096 / B512 (12k / 23k), the first
    6000 instructions of each subgraph (every mnemonic the subgraph uses occurs there): their footprints;
    the first 40 and 10 random instances of every mnemonic are executed alone and diffed (the rest run in
    bulk between them); reads are checked by randomisation on the first 3 of those per mnemonic. Each step
    copies and compares all DDR, so the 32 MB PointPillars RPN subgraph gets a quarter of the samples."""
    srng = random.Random(5)
    rng = np.random.default_rng(2)
    for d in _subgraphs(name):
        prefix = d.instructions[:PREFIX]
        assert {x.op for x in prefix} == {x.op for x in d.instructions} - {"END"}
        fps = program_footprints(prefix, d.target, d.reg_sizes)
        scale = max(1, sum(d.reg_sizes.values()) >> 23)           # 1 per 8 MB of DDR
        picks = _sample(prefix, srng, 40 // scale, max(3, 10 // scale))
        m = _prepared_machine(d)
        done = 0
        nread: dict[str, int] = {}
        for i in picks:
            if i > done:
                m.run(d.arrays, done, i)
            x = d.instructions[i]
            nread[x.op] = nread.get(x.op, 0) + 1
            step_and_check(m, d.arrays, i, x, fps[i], d.target, d.reg_sizes, rng if nread[x.op] <= 3 else None)
            done = i + 1


# ---- the token service -----------------------------------------------------------------------------------
def test_bits():
    assert [bit(e) for e in Engine] == [1, 2, 4, 8]
    assert mask([Engine.LOAD, Engine.MISC]) == 0b1001
    assert engines_of(0b0110) == (Engine.SAVE, Engine.CONV)
    assert cross(0b0111, Engine.SAVE) == 0b0101


def test_planner_by_hand():
    """B512, CONVINIT 1x1. a: LOAD writes bank 0 lines 0-3. b: CONV reads bank 0 lines 0-1 (RAW: waits on a),
    writes bank 4 lines 100-101. c: CONV reads bank 0 line 1 (ordered after a through b: no token), writes
    bank 5 line 100. d: SAVE reads bank 4 lines 100-101 (RAW on b: waits on CONV's latest, c). e: LOAD
    writes bank 4 line 101, which d read (WAR: waits on d) and b wrote (WAW: waits on c)."""
    t = TARGETS["B512"]
    tok = TokenPlanner(t)
    st = InitState(conv=ins("CONVINIT").fields)
    a = ins("LOAD", bank_id=0, bank_addr=0, length=4, channel=8, reg_id=0)
    b = ins("CONV", bank_id_in=0, bank_addr_in=0, length=2, bank_id_out=4, bank_addr_out=100)
    c = ins("CONV", bank_id_in=0, bank_addr_in=1, length=1, bank_id_out=5, bank_addr_out=100)
    d = ins("SAVE", bank_id=4, bank_addr=100, length=2, channel=8, reg_id=1)
    e = ins("LOAD", bank_id=4, bank_addr=101, length=1, channel=8, reg_id=0)
    steps = [tok.add(x.op, footprint(x, st, t)) for x in (a, b, c)]
    L, S, C = bit(Engine.LOAD), bit(Engine.SAVE), bit(Engine.CONV)
    assert tok.order_after(Engine.LOAD, 2) is None          # a already signals CONV: c is ordered through b
    steps += [tok.add(x.op, footprint(x, st, t)) for x in (d, e)]
    assert [s.waits for s in steps] == [(), (0,), (), (2,), (3, 2)]
    assert tok.dpdon == [L, C | L, C, S | C, L | S | C]
    assert tok.dpdby == [L | C, C, C | S | L, S | L, L]
    prog = [Instruction(x.op, on, by, x.fields) for x, on, by in zip((a, b, c, d, e), tok.dpdon, tok.dpdby)]
    sig, wai = token_counts(prog)
    assert sig == wai
    assert find_races(prog, [footprint(x, st, t) for x in (a, b, c, d, e)], t) == []


def test_planner_save_pair():
    t = TARGETS["B512"]
    tok = TokenPlanner(t)
    ld = ins("LOAD", bank_id=0, length=1, channel=8)
    s1 = ins("SAVE", bank_id=0, channel=8, ddr_addr=0)
    s2 = ins("SAVE", bank_id=1, channel=8, ddr_addr=64)
    tok.add("LOAD", footprint(ld, InitState(), t))
    f1, f2 = footprint(s1, InitState(), t), footprint(s2, InitState(), t)
    union = tuple(a | b for a, b in zip(tok.keys(f1), tok.keys(f2)))
    one = tok.add("SAVE", keys=union, pair=0)
    assert (one.dpdon, one.dpdby, one.waits) == (0b0011, 0, (0,))
    assert tok.pair_open
    with pytest.raises(TokenError):                          # a LOAD over s1's lines cannot wait on s1
        tok.add("LOAD", footprint(ld, InitState(), t))
    with pytest.raises(TokenError):
        tok.order_after(Engine.SAVE, 0)
    two = tok.add("SAVE", f2, pair=1)
    assert (two.dpdon, two.dpdby) == (0, 0b0010) and not tok.pair_open
    late = tok.add("LOAD", footprint(ld, InitState(), t))   # now waits on the pair through s2
    assert late.waits == (2,) and tok.dpdby[2] == 0b0011
    # a second SAVE that needs a wait of its own (on a LOAD issued inside the pair) is refused
    tok2 = TokenPlanner(t)
    tok2.add("SAVE", f1, pair=0)
    tok2.add("LOAD", footprint(ins("LOAD", bank_id=1, length=1, channel=8, reg_id=1), InitState(), t))
    with pytest.raises(TokenError, match="wait of its own"):
        tok2.add("SAVE", f2, pair=1)


def test_keyspace_chunks():
    t = TARGETS["B512"]
    ks = KeySpace(t, line_chunk=16, ddr_chunk=64)
    nch = 2048 // 16
    # lines 2040..2059 of bank 3 wrap: chunks 127 and 0
    assert ks.keys(Access((Lines(3, 2040, 1, 0, 20),))) == {3 * nch + 127, 3 * nch}
    # blocks every 100 lines, 2 wide: gaps of 98 lines, separate chunks 0, 6, 12
    assert ks.keys(Access((Lines(0, 0, 3, 100, 2),))) == {0, 6, 12}
    fine = KeySpace(t)
    a = Access((), (Bytes(2, 10, 2, 100, 3),))
    assert len(fine.keys(a)) == 6 and fine.keys(a).isdisjoint(fine.keys(Access((), (Bytes(2, 13, 1, 0, 97),))))
    # a run spanning nch chunks or more (3 blocks of 1000 lines back to back: 3000 lines) is the whole bank
    assert ks.keys(Access((Lines(1, 5, 3, 1000, 1000),))) == set(range(nch, 2 * nch))
    # blocks 20 wide every 30 lines: gaps of 10 < 16, so the hull 100..179 = chunks 6..11
    assert ks.keys(Access((Lines(2, 100, 3, 30, 20),))) == set(range(2 * nch + 6, 2 * nch + 12))
    # DDR with 64-byte chunks: bytes 60..67 of REG_1 touch chunks 0 and 1; 3 rows of 8 bytes every 1000 bytes are
    # separate chunks 0, 15, 31; an empty run has none
    enc = [-1 - (1 << 40) - c for c in (0, 1)]
    assert ks.keys(Access((), (Bytes(1, 60, 1, 0, 8),))) == set(enc)
    assert ks.keys(Access((), (Bytes(1, 0, 3, 1000, 8),))) == {-1 - (1 << 40) - c for c in (0, 15, 31)}
    assert ks.keys(Access((Lines(0, 0, 0, 1, 4),), (Bytes(1, 0, 2, 8, 0),))) == set()
    with pytest.raises(ValueError):
        KeySpace(t, line_chunk=3)


@pytest.mark.parametrize("tname", list(TARGETS))
def test_generated_tokens_have_no_races(tname):
    """Programs from sim.progen (tokens placed by TokenPlanner on 16-line / 64-byte chunks) are race-free at
    exact (line and byte) granularity; with the cross-engine bits cleared they are not."""
    t = TARGETS[tname]
    stripped_races = 0
    for seed in range(6):
        p = random_program(t, n=80, seed=seed)
        fps = program_footprints(p.instructions, t, p.reg_sizes)
        assert find_races(p.instructions, fps, t) == []
        own = [Instruction(x.op, x.dpdon & bit(x.engine), x.dpdby & bit(x.engine), x.fields)
               for x in p.instructions]
        stripped_races += len(find_races(own, fps, t))
    assert stripped_races > 0


@pytest.mark.parametrize("name", SMALL)
def test_real_streams_have_no_races(name):
    """AMD's own tokens order every conflict of these footprints (spec §5.2: 0 violations in real streams,
    padded positions not counted as reads); clearing the cross-engine bits breaks that."""
    for d in _subgraphs(name):
        fps = program_footprints(d.instructions, d.target, d.reg_sizes)
        assert find_races(d.instructions, fps, d.target) == []
        own = [Instruction(x.op, x.dpdon & bit(x.engine), x.dpdby & bit(x.engine), x.fields)
               for x in d.instructions]
        assert find_races(own, fps, d.target)


@pytest.mark.slow
def test_real_streams_have_no_races_yolox():
    for d in _subgraphs("yolox_nano_b4096"):
        fps = program_footprints(d.instructions, d.target, d.reg_sizes)
        assert find_races(d.instructions, fps, d.target) == []
