"""Block tests of the RTL MISC engine (hw/misc.py: ALUINIT/ALU, ELEWINIT/ELEW) in Amaranth's simulator.

A test top holds the engine and the BankArray. Every bank is preloaded with random bytes; legal
instruction sequences (random, fixed seeds, legality decided by the functional executor) are issued
through `ctl`, each `start` in the cycle of the previous `end` or a few idle cycles later. Afterwards
every byte of every bank must equal the executor's (sim/executor.DpuMachine, same preload), every `end`
must be one pulse exactly `cost` cycles after its `start` (cost worked out here from
docs/microarchitecture.md §3: INIT = init_cycles, ALU = alu_latency +
length*kernel_h*kernel_w*kernel_d*channel_group, ELEW = elew_latency + length*channel_group*num), and
every bank write must be issued strictly between the `start` and the `end` of an instruction.
"""
import os
import time

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module

from opendpu.isa.program import Instruction, to_arrays
from opendpu.isa.target import Target, get_target
from opendpu.sim.executor import DpuMachine, ExecError

from opendpu.hw.banks import BankArray, connect_misc, freeze
from opendpu.hw.misc import MiscEngine
from opendpu.hw.params import HwParams
from opendpu.hw.simutil import run_sim

from helpers import ins, instr_value


class MiscTop(Elaboratable):
    def __init__(self, p):
        self.p = p
        self.eng = MiscEngine(p)
        self.banks = BankArray(p)

    def elaborate(self, platform):
        m = Module()
        m.submodules.eng = freeze(self.eng, self.banks.misc_go)   # as in the core (write-queue refusals)
        m.submodules.banks = self.banks
        connect_misc(m, self.eng, self.banks)
        return m


def hand_costs(t: Target, prog: list[Instruction]) -> list[int]:
    """docs/microarchitecture.md §3, worked out from the logical field values."""
    tm = t.timing
    out, ai = [], None
    for i in prog:
        f = i.fields
        if i.op in ("ALUINIT", "ELEWINIT"):
            if i.op == "ALUINIT":
                ai = f
            out.append(tm.init_cycles)
        elif i.op == "ALU":
            out.append(tm.alu_latency + ai["length"] * ai["kernel_h"] * ai["kernel_w"] * f["kernel_d"]
                       * ai["channel_group"])
        elif i.op == "ELEW":
            out.append(tm.elew_latency + f["length"] * f["channel_group"] * f["num"])
        else:
            raise AssertionError(i.op)
    return out


def touched_lines(t: Target, prog: list[Instruction]):
    """Per ALU / ELEW of `prog`: the (bank, line) set it reads and the list it writes (spec §2.4, §6.7,
    §6.8)."""
    pp, D = t.pp, t.bank_depth
    out, ai, desc = [], None, {}
    for i in prog:
        f = i.fields
        if i.op == "ALUINIT":
            ai = f
        elif i.op == "ELEWINIT":
            desc[f["id"]] = f
        elif i.op == "ALU":
            mode = ai["exec_mode"]
            kd = 1 if mode in (2, 3, 5) else f["kernel_d"]
            vpp, cg, L = f["valid_pixel_parallel"], ai["channel_group"], ai["length"]
            kh, kw, sh, sw, soi = (ai[n] for n in ("kernel_h", "kernel_w", "stride_h", "stride_w", "stride_offset_in"))
            rows_in, cols_in = (vpp - 1) * sh + kh, (L - 1) * sw + kw
            if mode == 5:
                r_lo, r_hi, x_lo, x_hi = 0, rows_in, 0, cols_in
            else:
                r_lo, r_hi = f["pad_top"], min(rows_in, rows_in - kh + f["pad_bottom"] + 1)
                x_lo, x_hi = f["pad_left"], min(cols_in, cols_in - kw + f["pad_right"] + 1)
            bases = [f["bank_addr_in"], f["bank_addr_in_1"], f["bank_addr_in_2"], f["bank_addr_in_3"]]
            b, gb = f["bank_id_in"], f["bank_id_in"] // pp * pp
            rd, wr = set(), []
            for r in range(r_lo, r_hi):
                tt = soi + r
                slot = b - gb + tt // sh
                l0 = bases[slot // pp] + (tt % sh) * ai["jump_read_endl"]
                for x in range(x_lo, x_hi):
                    for q in range(cg * kd):
                        rd.add((gb + slot % pp, (l0 + x * ai["jump_read"] + q) % D))
            b, gb = f["bank_id_out"], f["bank_id_out"] // pp * pp
            so = ai["stride_out"]
            for h in range(vpp):
                tt = h + ai["stride_offset_out"]
                slot = b - gb + tt // so
                jwe = ai["jump_write_endl"]
                row0 = f["bank_addr_out"] + (slot // pp) * so * jwe + (tt % so) * jwe
                for w in range(L):
                    for g in range(cg):
                        wr.append((gb + slot % pp, (row0 + w * ai["jump_write"] + g) % D))
            out.append((rd, wr))
        elif i.op == "ELEW":
            rd, wr = set(), []
            vpp, cg = f["valid_pixel_parallel"], f["channel_group"]
            for k in range(f["num"]):
                d = desc[k]
                gb = d["bank_id_in"] // pp * pp
                for r in range(vpp):
                    if d["share_pp"]:
                        bank, wrap = d["bank_id_in"], 0
                    else:
                        slot = d["bank_id_in"] - gb + r * d["jump_bank"]
                        bank, wrap = gb + slot % pp, slot // pp
                    for j in range(f["length"]):
                        for g in range(cg):
                            line = d["bank_addr_in"] + wrap * d["jump_read_endl"] + j * d["jump_read"] + g
                            rd.add((bank, line % D))
            gb = f["bank_id_out"] // pp * pp
            for r in range(vpp):
                slot = f["bank_id_out"] - gb + r
                for j in range(f["length"]):
                    for g in range(cg):
                        wr.append((gb + slot % pp, (f["bank_addr_out"] + j * f["jump_write"]
                                                 + (slot // pp) * f["jump_write_endl"] + g) % D))
            out.append((rd, wr))
    return out


def legal(t: Target, prog: list[Instruction]) -> bool:
    """The executor accepts `prog`, and no ALU / ELEW writes a line it also reads or writes twice. The RTL
    streams (a line written early is seen by a later read of the same instruction, and two writes of
    one line land in loop order) while the executor reads the whole tile first and writes row by row;
    real programs never overlap an instruction's input and output, or two of its outputs."""
    m = DpuMachine(t, {}, init_fill="zero")
    try:
        m.run(to_arrays(prog))
    except ExecError:
        return False
    return all(not (rd & set(wr)) and len(set(wr)) == len(wr) for rd, wr in touched_lines(t, prog))


# ---- random legal instructions ---------------------------------------------------------------------
def rand_aluinit(rng, t: Target, mode: int, **over) -> dict:
    one = mode in (1, 4, 7)
    kh = 1 if one else int(rng.integers(1, 4))
    kw = 1 if one else int(rng.integers(1, 4))
    sh = 1 if one else int(rng.integers(1, 3))
    sw = 1 if one else int(rng.integers(1, 3))
    so = int(rng.integers(1, 3))
    cg = int(rng.integers(1, 3))
    acts = list(t.alu_nonlinear)
    f = dict(kernel_w=kw, kernel_h=kh, exec_mode=mode, stride_offset_out=int(rng.integers(0, 3)),
             stride_offset_in=int(rng.integers(0, sh)), stride_w=sw, stride_h=sh,
             length=int(rng.integers(1, 4)),
             channel_offset=int(rng.integers(0, 7)) if rng.random() < 0.5 else 0,
             channel_group=cg, stride_out=so, shift_prelu_n=int(rng.integers(0, 64)),
             shift_cut=int(rng.integers(0, 64)) if rng.random() < 0.3 else int(rng.integers(0, 12)),
             shift_bias=int(rng.integers(0, 21)), act_type=int(rng.choice(acts)),
             shift_prelu_p=int(rng.integers(0, 64)), jump_read_endl=int(rng.integers(1, 200)),
             jump_read=int(rng.integers(1, 6)), multi_factor=int(rng.integers(0, 256)),
             jump_write_endl=int(rng.integers(1, 200)), jump_write=int(rng.integers(1, 6)),
             jump_read_weights=int(rng.integers(0, 9)))
    f.update(over)
    return f


def rand_alu(rng, t: Target, ai: dict, **over) -> dict:
    kh, kw = ai["kernel_h"], ai["kernel_w"]
    nimg = t.num_img_banks
    f = dict(bank_addr_out=int(rng.integers(0, 1 << 14)), bank_id_out=int(rng.integers(0, nimg)),
             bank_addr_in=int(rng.integers(0, 1 << 14)), bank_id_in=int(rng.integers(0, nimg)),
             valid_pixel_parallel=int(rng.integers(1, t.alu_pp + 1)),
             pad_bottom=int(rng.integers(max(0, kh - 3), kh)), bank_addr_in_1=int(rng.integers(0, 1 << 14)),
             pad_right=int(rng.integers(max(0, kw - 3), kw)), pad_left=int(rng.integers(0, kw)),
             pad_top=int(rng.integers(0, kh)), bank_addr_in_2=int(rng.integers(0, 1 << 14)),
             bank_addr_weights=int(rng.integers(0, 1 << 14)),
             kernel_d=int(rng.integers(1, 3)) if ai["exec_mode"] not in (1, 4, 7) else 1,
             bank_addr_in_3=int(rng.integers(0, 1 << 14)), bank_addr_bias=int(rng.integers(0, 1 << 14)))
    f.update(over)
    return f


def rand_alu_pair(rng, t: Target, mode: int, ai_over=None, al_over=None):
    for _ in range(200):
        ai = ins("ALUINIT", **rand_aluinit(rng, t, mode, **(ai_over or {})))
        al = ins("ALU", **rand_alu(rng, t, ai.fields, **(al_over or {})))
        if legal(t, [ai, al]):
            return [ai, al]
    raise AssertionError("no legal ALU found")


def rand_elew_prog(rng, t: Target, et: int, num: int, **over) -> list[Instruction]:
    nimg = t.num_img_banks
    for _ in range(200):
        vpp = int(rng.integers(1, t.alu_pp + 1))
        inits = []
        for k in range(num):
            jb = int(rng.integers(1, max(1, t.pp // vpp) + 1))
            inits.append(ins("ELEWINIT", share_pp=int(rng.random() < 0.25), bank_id_in=int(rng.integers(0, nimg)),
                             bank_addr_in=int(rng.integers(0, 1 << 14)),
                             jump_read_endl=int(rng.integers(1, 300)), id=k, jump_bank=jb,
                             jump_read=int(rng.integers(0, 5)), shift_read=int(rng.integers(0, 16))))
        rng.shuffle(inits)
        sw = int(rng.integers(0, 32))
        f = dict(length=int(rng.integers(1, 4)), act_type=int(rng.integers(0, 2)), elew_type=et,
                 bank_id_out=int(rng.integers(0, nimg)), bank_addr_out=int(rng.integers(0, 1 << 14)),
                 jump_write_endl=int(rng.integers(1, 300)), num=num, valid_pixel_parallel=vpp,
                 jump_write=int(rng.integers(1, 5)), shift_write=sw, channel_group=int(rng.integers(1, 3)))
        f.update(over)
        prog = inits + [ins("ELEW", **f)]
        if legal(t, prog):
            return prog
    raise AssertionError("no legal ELEW found")


# ---- simulation ----------------------------------------------------------------------------------
def run_rtl(t: Target, prog: list[Instruction], seed: int, name: str, gap_rng=None, fill=None):
    """Run `prog` on the RTL (random preload from `seed`, then `fill(pre)` if given) and on DpuMachine;
    compare every bank byte, every end cycle and the write cycles."""
    p = HwParams.of(t)
    W, D, nb = p.width, p.depth, p.num_banks
    rng = np.random.default_rng(seed)
    pre = rng.integers(-128, 128, size=(nb, D * W)).astype(np.int8)
    if fill is not None:
        fill(pre)
    ref = DpuMachine(t, {}, init_fill="zero")
    ref.banks[:] = pre
    ref.run(to_arrays(prog))
    want = hand_costs(t, prog)
    gaps = [0 if gap_rng is None or gap_rng.random() < 0.6 else int(gap_rng.integers(1, 4)) for _ in prog]

    top = MiscTop(p)
    eng = top.eng
    lines = pre.view(np.uint8).reshape(nb, D, W)
    weights = 1 << (8 * np.arange(W, dtype=object))
    trace = []                    # per cycle: (start, end, any write issued, refused)
    starts = []

    async def tb(ctx):
        for b in range(nb):
            for ln in range(D):
                v = int(sum(int(x) * wgt for x, wgt in zip(lines[b, ln], weights)))
                if v:
                    ctx.set(top.banks.line(b, ln), v)

        async def tick(start=0):
            ctx.set(eng.ctl.start, start)
            trace.append((start, ctx.get(eng.ctl.end), any(ctx.get(eng.img_wr[h].en) for h in range(p.alu_pp)),
                          not ctx.get(top.banks.misc_go)))
            await ctx.tick()

        for k, i in enumerate(prog):
            for _ in range(gaps[k]):
                await tick()
            ctx.set(eng.ctl.instr, instr_value(i))
            starts.append(len(trace))
            await tick(1)
            while not ctx.get(eng.ctl.end):
                assert len(trace) - starts[-1] < 2 * want[k] + 50, f"{i.op} (#{k}) never ends"
                await tick()
        for _ in range(8):                        # idle tail: no late write, no second end pulse
            await tick()
        got = np.zeros((nb, D * W), np.uint8)
        for b in range(nb):
            for ln in range(D):
                v = ctx.get(top.banks.line(b, ln))
                got[b, ln * W:(ln + 1) * W] = [(v >> (8 * j)) & 0xFF for j in range(W)]
        run_rtl.got = got.view(np.int8)

    run_sim(top, tb, name=name)
    ends = [c for c, (_, e, _, _) in enumerate(trace) if e]
    # an ALU whose write finds its bank's write queue busy (stride_out > 1) is refused and frozen
    refused = [c for c, (_, _, _, r) in enumerate(trace) if r]
    stalls = [sum(1 for x in refused if s <= x < e) for s, e in zip(starts, ends)]
    assert len(refused) == sum(stalls), (refused, starts, ends)
    got_cost = [e - s - st for s, e, st in zip(starts, ends, stalls)]
    assert got_cost == want and len(ends) == len(prog), f"end cycles: RTL {got_cost}, docs formula {want}"
    busy = set()
    for s_, e_ in zip(starts, ends):
        busy.update(range(s_ + 1, e_))
    late = [c for c, (_, _, w, _) in enumerate(trace) if w and c not in busy]
    assert not late, f"bank writes issued outside (start, end) of their instruction, cycles {late}"
    got = run_rtl.got
    bad = np.argwhere(got != ref.banks)
    assert bad.size == 0, (f"{len(bad)} bytes differ; first (bank, byte) {tuple(bad[0])}: "
                           f"RTL {got[tuple(bad[0])]} executor {ref.banks[tuple(bad[0])]}\n"
                           + "\n".join(x.to_text() for x in prog))
    # the comparison is sensitive: the instructions wrote something
    assert (ref.banks != pre).any()


def small(alu_pp=2, pp=2, cp=4, **timing):
    t = Target.parametric(pp=pp, cp=cp, alu_pp=alu_pp, bank_depth=64, dw_lkrl=True)
    return t.with_timing(**timing) if timing else t


# ---- ALU -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", range(9))
def test_alu_mode_random(mode):
    """Every exec_mode: three random legal ALUINIT/ALU pairs (pads, strides, kd, cg, channel_offset, e_cut)."""
    t = small()
    rng = np.random.default_rng(100 + mode)
    prog = []
    for _ in range(3):
        prog += rand_alu_pair(rng, t, mode)
    run_rtl(t, prog, seed=mode, name=f"misc_alu_mode{mode}", gap_rng=rng)


@pytest.mark.parametrize("mode", [0, 3, 2])
def test_alu_pads_all_sides_stride2(mode):
    """Pads on all four sides, stride 2, stride_out 2 with offset, kernel 3x3, vpp = ALU_PP, cg 2,
    channel_offset (maxpool pads with -128)."""
    t = small(pp=4, cp=4, alu_pp=3)
    rng = np.random.default_rng(7 + mode)
    prog = rand_alu_pair(rng, t, mode,
                         dict(kernel_h=3, kernel_w=3, stride_h=2, stride_w=2, stride_offset_in=1, stride_out=2,
                              stride_offset_out=1, length=3, channel_group=2, channel_offset=3,
                              shift_cut=9 if mode != 0 else 6, act_type=0, jump_read=2, multi_factor=200),
                         dict(valid_pixel_parallel=3, pad_top=1, pad_left=2, pad_bottom=0, pad_right=1,
                              bank_id_in=1, bank_id_out=6, kernel_d=1))
    run_rtl(t, prog, seed=20 + mode, name=f"misc_alu_pads{mode}")


def test_alu_dwconv_kd2_leaky_w16():
    """dwconv with kernel_d 2 and leaky ReLU, dwconv_no_bias with ReLU6, dwconv_w16b0 with kd 2 and cg 2,
    vpp < ALU_PP, passes over the bank group (bank_id_in at the end of a group)."""
    t = small(pp=4, cp=4, alu_pp=3)
    rng = np.random.default_rng(33)
    prog = []
    prog += rand_alu_pair(rng, t, 0, dict(act_type=3, shift_cut=7, jump_read_weights=5, kernel_h=2, kernel_w=2,
                                          stride_h=2, stride_offset_in=1, channel_group=2),
                          dict(kernel_d=2, valid_pixel_parallel=2, bank_id_in=3))
    prog += rand_alu_pair(rng, t, 6, dict(act_type=4, shift_cut=3), dict(kernel_d=2, valid_pixel_parallel=1))
    prog += rand_alu_pair(rng, t, 8, dict(act_type=1, shift_cut=10, channel_group=2, jump_read_weights=7),
                          dict(kernel_d=2))
    prog += rand_alu_pair(rng, t, 8, dict(act_type=3, shift_cut=12), dict(kernel_d=1))
    run_rtl(t, prog, seed=5, name="misc_alu_dw")


def test_alu_pool_shifts_and_kd_noop():
    """Pool modes with negative e_cut codes (shift_cut >= 8), positive ones, multi_factor >= 128, and a
    kernel_d of 2 in the ALU (costs twice, computes with kd 1); maxreduce ignores pads and channel_offset."""
    t = small()
    rng = np.random.default_rng(44)
    prog = []
    for mode, sc, mf in ((2, 17, 21), (2, 3, 200), (2, 30, 77), (3, 9, 0), (3, 2, 0), (5, 12, 0), (5, 1, 0)):
        prog += rand_alu_pair(rng, t, mode, dict(shift_cut=sc, multi_factor=mf, channel_offset=2),
                              dict(kernel_d=2, pad_top=1, pad_left=1))
    run_rtl(t, prog, seed=6, name="misc_alu_pool")


def test_alu_elementwise_modes():
    """prelu / leakyrelu with both signs of the sp/sn shifts, hsigmoid with shift_bias up to 20."""
    t = small()
    rng = np.random.default_rng(55)
    prog = []
    for mode, spp, spn in ((1, 35, 5), (1, 2, 40), (4, 0, 33), (4, 60, 20)):
        prog += rand_alu_pair(rng, t, mode, dict(shift_prelu_p=spp, shift_prelu_n=spn, channel_offset=0))
    # realistic scalings (shift_cut = 14 + in_fix - out_fix), the 2^32 clamp (shift_bias 20 with
    # shift_cut 26..28 tells the clamp apart) and extreme codes
    for sb, sc in ((4, 11), (2, 9), (7, 14), (3, 12), (20, 27), (19, 26), (0, 0), (14, 33), (3, 63)):
        prog += rand_alu_pair(rng, t, 7, dict(shift_bias=sb, shift_cut=sc))
    run_rtl(t, prog, seed=7, name="misc_alu_elementwise")


def test_alu_hsigmoid_many_values():
    """hsigmoid over 768 values per scaling: scalings where 2730 or 2732 instead of 2731 changes 5-10% of
    the int8 inputs (most scalings hide such an error), the 2^32 clamp at shift_cut 25 (saturates) and
    33 (rounds to 1), and shift_cut 0 where only x = -3 gives an unsaturated 0."""
    t = Target.parametric(pp=2, cp=4, alu_pp=2, bank_depth=256)
    rng = np.random.default_rng(66)
    for k, (sb, sc) in enumerate(((0, 14), (3, 14), (5, 10), (20, 25), (20, 33), (0, 0))):
        prog = rand_alu_pair(rng, t, 7, dict(shift_bias=sb, shift_cut=sc, length=48, channel_group=2,
                                             channel_offset=0, jump_read=2, jump_write=2),
                             dict(valid_pixel_parallel=2, pad_top=0, pad_left=0))
        run_rtl(t, prog, seed=67 + k, name=f"misc_alu_hsigmoid{k}")


def test_alu_extreme_magnitudes():
    """dwconv_w16b0 with every input 127 and every weight -32640: |acc| = 18 * 127 * 32640 ~ 2^26, leaky
    26*acc ~ 2^31 shifted by shift_cut + 8 = 31..49 (the shift clamp must not bite), and the same
    positive; avgpool with every input -128 and multi_factor -128 (the largest sum * mf)."""
    t = small()
    p = HwParams.of(t)

    def fill(pre):
        pre[:p.num_img_banks] = 127
        pre[p.dwconvw_bank] = -128          # bytes 0x80 0x80: int16 -32640

    def fill_pos(pre):
        fill(pre)
        pre[p.dwconvw_bank] = 127           # int16 0x7F7F = 32639

    rng = np.random.default_rng(88)
    for k, (sc, f) in enumerate(((23, fill), (24, fill), (33, fill), (41, fill), (23, fill_pos), (27, fill_pos))):
        prog = rand_alu_pair(rng, t, 8, dict(act_type=3 if f is fill else 0, shift_cut=sc, kernel_h=3, kernel_w=3,
                                             channel_offset=0),
                             dict(kernel_d=2, pad_top=0, pad_left=0, pad_bottom=2, pad_right=2))
        run_rtl(t, prog, seed=90 + k, name=f"misc_alu_extreme{k}", fill=f)

    def fill_neg(pre):
        pre[:p.num_img_banks] = -128

    prog = rand_alu_pair(rng, t, 2, dict(multi_factor=128, shift_cut=20, kernel_h=3, kernel_w=3, channel_offset=0),
                         dict(pad_top=0, pad_left=0, pad_bottom=2, pad_right=2))
    run_rtl(t, prog, seed=99, name="misc_alu_extreme_avg", fill=fill_neg)


# ---- ELEW ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("et,num", [(0, 1), (0, 2), (0, 3), (0, 4), (1, 2)])
def test_elew_random(et, num):
    """add with num 1..4 and mult: share_pp, jump_bank, shift_read, both shift_write ranges, ReLU,
    jump_read 0, vpp < ALU_PP, cg 2; descriptors written in random id order."""
    t = small(pp=4, cp=4, alu_pp=3)
    rng = np.random.default_rng(200 + 10 * et + num)
    prog = []
    for _ in range(3):
        prog += rand_elew_prog(rng, t, et, num)
    run_rtl(t, prog, seed=et * 10 + num, name=f"misc_elew_{et}_{num}", gap_rng=rng)


def test_elew_share_pp_at_group_end():
    """share_pp inputs whose first bank is the last of its group (the non-shared rows would wrap) next to
    a jump_bank input that does wrap to the next pass (jump_read_endl)."""
    t = small(pp=4, cp=4, alu_pp=3)
    prog = [ins("ELEWINIT", share_pp=1, bank_id_in=7, bank_addr_in=5, jump_read_endl=9, id=0, jump_bank=1,
                jump_read=1, shift_read=1),
            ins("ELEWINIT", share_pp=0, bank_id_in=2, bank_addr_in=40, jump_read_endl=13, id=1, jump_bank=1,
                jump_read=2, shift_read=0),
            ins("ELEW", length=3, act_type=0, elew_type=0, bank_id_out=3, bank_addr_out=20, jump_write_endl=7,
                num=2, valid_pixel_parallel=3, jump_write=1, shift_write=2, channel_group=1),
            ins("ELEWINIT", share_pp=0, bank_id_in=5, bank_addr_in=3, jump_read_endl=21, id=0, jump_bank=2,
                jump_read=1, shift_read=2),
            ins("ELEW", length=2, act_type=1, elew_type=1, bank_id_out=0, bank_addr_out=50, jump_write_endl=3,
                num=2, valid_pixel_parallel=2, jump_write=2, shift_write=19, channel_group=2)]
    assert legal(t, prog)
    run_rtl(t, prog, seed=17, name="misc_elew_share")


def test_elew_reuses_descriptors():
    """A second ELEW reuses the stored descriptors; an ALU in between does not disturb them."""
    t = small()
    rng = np.random.default_rng(9)
    prog = rand_elew_prog(rng, t, 0, 2, shift_write=1)
    prog += rand_alu_pair(rng, t, 3)
    prog.append(ins("ELEW", **{**prog[2].fields, "bank_addr_out": 77, "shift_write": 18, "act_type": 1}))
    assert legal(t, prog)
    run_rtl(t, prog, seed=11, name="misc_elew_reuse")


# ---- timing corners and other shapes ---------------------------------------------------------------
def test_min_latency_and_long_init():
    """The smallest latencies hw/params.min_latency allows (alu_latency: pipeline 6 + write queue 1,
    elew_latency) and init_cycles 3."""
    from opendpu.hw.params import min_latency
    lat = min_latency(small())
    assert lat["alu_latency"] == 7
    t = small(alu_latency=lat["alu_latency"], elew_latency=lat["elew_latency"], init_cycles=3)
    rng = np.random.default_rng(12)
    prog = []
    for mode in (0, 1, 2, 3, 8):
        prog += rand_alu_pair(rng, t, mode, dict(length=1, kernel_h=1, kernel_w=1, channel_group=1),
                              dict(kernel_d=1))
    prog += rand_elew_prog(rng, t, 1, 2, length=1, channel_group=1)
    prog += rand_alu_pair(rng, t, 6)
    run_rtl(t, prog, seed=13, name="misc_minlat", gap_rng=rng)


def test_preset_shaped_pp4_cp8():
    """A B512-shaped core (PP 4, CP 8, ALU_PP 2) with a bank depth of 64."""
    t = Target.parametric(pp=4, cp=8, alu_pp=2, bank_depth=64)
    rng = np.random.default_rng(21)
    prog = rand_alu_pair(rng, t, 0) + rand_alu_pair(rng, t, 3) + rand_elew_prog(rng, t, 0, 2)
    run_rtl(t, prog, seed=22, name="misc_pp4cp8")


def test_alu_pp1():
    """ALU_PP 1 and a PP of 3 (not a power of two)."""
    t = Target.parametric(pp=3, cp=4, alu_pp=1, bank_depth=64)
    rng = np.random.default_rng(31)
    prog = rand_alu_pair(rng, t, 0) + rand_alu_pair(rng, t, 2) + rand_elew_prog(rng, t, 0, 2)
    run_rtl(t, prog, seed=32, name="misc_pp3")


def test_verilog_presets():
    """The engine converts to Verilog for B512 and B4096."""
    from amaranth.back import verilog
    for name in ("DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B4096"):
        p = HwParams.of(get_target(name))
        t0 = time.time()
        v = verilog.convert(MiscEngine(p), name="misc")
        assert "module misc" in v
        print(f"{name}: verilog {time.time() - t0:.1f}s, {len(v)} chars")
