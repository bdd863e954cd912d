"""Block tests of the RTL CONV engine (hw/conv.py) in Amaranth's simulator.

A test top holds the engine and the BankArray. Every bank is preloaded with random bytes; random but
legal CONVINIT / CONV sequences are issued through `ctl`; afterwards every byte of every bank must equal
the functional executor's (sim/executor.DpuMachine, same preload), and every `end` must come exactly
`cost` cycles after its `start`, with cost worked out here from docs/microarchitecture.md §3:
CONVINIT = init_cycles, CONV = conv_latency + length*kernel_h*kernel_w*channel_group.
"""
import os
import time

os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

import numpy as np
import pytest
from amaranth.hdl import Elaboratable, Module

from opendpu.isa.program import Instruction, to_arrays
from opendpu.isa.target import Target, get_target
from opendpu.sim.executor import DpuMachine

from opendpu.hw.banks import BankArray, connect_conv, freeze
from opendpu.hw.conv import ConvEngine
from opendpu.hw.params import HwParams
from opendpu.hw.simutil import run_sim

from helpers import instr_value


class ConvTop(Elaboratable):
    def __init__(self, p):
        self.p = p
        self.eng = ConvEngine(p)
        self.banks = BankArray(p)

    def elaborate(self, platform):
        m = Module()
        m.submodules.eng = freeze(self.eng, self.banks.conv_go)   # as in the core (write-queue refusals)
        m.submodules.banks = self.banks
        connect_conv(m, self.eng, self.banks)
        return m


def hand_cost(t: Target, ins: Instruction, init: dict) -> int:
    if ins.op == "CONVINIT":
        return t.timing.init_cycles
    f = ins.fields
    return t.timing.conv_latency + f["length"] * init["kernel_h"] * init["kernel_w"] * f["channel_group"]


# ---- random legal instructions ---------------------------------------------------------------------
def rand_convinit(rng, t: Target, big=False):
    pp = t.pp
    kh = int(rng.integers(1, 6 if big else 4))
    kw = int(rng.integers(1, 6 if big else 4))
    sh = int(rng.integers(1, 4))
    sw = int(rng.integers(1, 4))
    soi = int(rng.integers(0, sh))
    vpp = int(rng.integers(1, pp + 1))
    so = 1 if rng.random() < 0.4 else int(rng.integers(1, t.conv_stride_out_h_max + 1))
    soo = int(rng.integers(0, 8)) if rng.random() < 0.3 else int(rng.integers(0, so))
    acts = [a for a in t.conv_nonlinear]
    # random int8 data: 2*acc has a spread of about 2*74^2*sqrt(terms); aim the outputs at about +-40
    k = int(round(np.log2(2 * 74 ** 2 * np.sqrt(kh * kw * 1.5 * t.cp) / 40)))
    sc = k - 1 + int(rng.integers(-1, 2)) if rng.random() < 0.8 else int(rng.integers(0, 64))
    sb = int(rng.integers(0, 10)) if rng.random() < 0.8 else int(rng.integers(0, 21))
    return dict(jump_read=int(rng.integers(1, 5)), shift_cut=sc, act_type=int(rng.choice(acts)),
                jump_read_endl=int(rng.integers(1, 1024)), shift_bias=sb,
                stride_out=so, jump_write=int(rng.integers(1, 4)), stride_offset_in=soi,
                valid_pixel_parallel=vpp, kernel_h=kh, stride_h=sh, jump_write_endl=int(rng.integers(1, 1024)),
                stride_offset_out=soo, kernel_w=kw, stride_w=sw)


def out_lines(t: Target, ci: dict, f: dict):
    """(bank, line) of every output write of a CONV (spec §6.4 placement)."""
    pp, D = t.pp, t.bank_depth
    gb = f["bank_id_out"] // pp * pp
    res = []
    so, soo, jwe, jw = ci["stride_out"], ci["stride_offset_out"], ci["jump_write_endl"], ci["jump_write"]
    for h in range(ci["valid_pixel_parallel"]):
        tt = h + soo
        slot = f["bank_id_out"] % pp + tt // so
        row0 = f["bank_addr_out"] + slot // pp * so * jwe + tt % so * jwe
        for x in range(f["length"]):
            res.append((gb + slot % pp, (row0 + x * jw) % D))
    return res


def rand_conv(rng, t: Target, ci: dict, big=False):
    """A CONV legal for the executor whose output lines are distinct and lie in the other image group
    than its input (so no CONV reads what it writes: the RTL writes column w while reading column w+1)."""
    pp = t.pp
    kh, sh, soi, vpp = ci["kernel_h"], ci["stride_h"], ci["stride_offset_in"], ci["valid_pixel_parallel"]
    rows_in = (vpp - 1) * sh + kh
    for _ in range(200):
        gi = int(rng.integers(0, t.img_bg))
        go = (gi + 1) % t.img_bg
        off = int(rng.integers(0, pp))
        if off + (soi + rows_in - 1) // sh >= 4 * pp:
            continue
        length = int(rng.integers(1, 6 if big else 4))
        cg = int(rng.integers(1, 4 if big else 3))
        pads = [int(rng.integers(0, 16)) for _ in range(4)] if rng.random() < 0.1 else [
            int(rng.integers(0, kh)) if rng.random() < 0.4 else 0,
            int(rng.integers(0, ci["kernel_w"])) if rng.random() < 0.4 else 0,
            kh - 1 - (int(rng.integers(0, kh)) if rng.random() < 0.4 else 0),
            ci["kernel_w"] - 1 - (int(rng.integers(0, ci["kernel_w"])) if rng.random() < 0.4 else 0)]
        f = dict(bank_addr_in=int(rng.integers(0, 4096)), pad_top=pads[0], pad_left=pads[1],
                 bank_addr_out=int(rng.integers(0, 4096)), pad_bottom=pads[2], pad_right=pads[3],
                 channel_group=cg, bank_addr_weights=int(rng.integers(0, 4096)),
                 bank_id_in=gi * pp + off, length=length, bank_addr_bias=int(rng.integers(0, 4096)),
                 bank_id_out=go * pp + int(rng.integers(0, pp)), bank_addr_in_1=int(rng.integers(0, 4096)),
                 bank_addr_in_2=int(rng.integers(0, 4096)), bank_addr_in_3=int(rng.integers(0, 4096)),
                 channel_offset=int(rng.integers(0, min(32, cg * t.cp + 2))) if rng.random() < 0.3 else 0)
        ol = out_lines(t, ci, f)
        if len(set(ol)) == len(ol):
            return f
    raise RuntimeError("no CONV with distinct output lines found")


def rand_program(rng, t: Target, n_conv: int, big=False):
    prog, ci = [], None
    for _ in range(n_conv):
        if ci is None or rng.random() < 0.4:
            ci = rand_convinit(rng, t, big)
            prog.append(Instruction("CONVINIT", 0, 0, ci))
        prog.append(Instruction("CONV", 0, 0, rand_conv(rng, t, ci, big)))
    return prog


# ---- the co-simulation -----------------------------------------------------------------------------
def run_case(t: Target, prog, seed: int, name: str, gaps=None, ref_prog=None, patch=None):
    """Run `prog` on the RTL and on the executor (`ref_prog` if given, to check that the comparison can
    fail); compare all banks and the end cycles."""
    rng = np.random.default_rng(seed)
    p = HwParams.of(t)
    W, D, nb = t.bank_width, t.bank_depth, t.num_banks
    pre = rng.integers(-128, 128, size=(nb, D * W), dtype=np.int8)
    if patch is not None:
        patch(pre)

    mach = DpuMachine(t, {}, init_fill="zero")
    mach.banks[:] = pre
    mach.run(to_arrays(ref_prog or prog))
    want = mach.banks.copy()

    # start cycles: each start at (previous end) + gap, gap 0 = in the end cycle itself (a CONV whose
    # write finds its bank's write queue busy is refused and frozen: its end comes that many cycles later)
    if gaps is None:
        gaps = [int(rng.integers(0, 3)) if rng.random() < 0.5 else 0 for _ in prog]
    costs, init = [], None
    for ins in prog:
        if ins.op == "CONVINIT":
            init = ins.fields
        costs.append(hand_cost(t, ins, init))

    top = ConvTop(p)
    got = np.zeros_like(pre)
    ends, starts, refused = [], [], []

    async def tb(ctx):
        u = pre.view(np.uint8).reshape(nb, D, W).astype(object)
        for b in range(nb):
            for line in range(D):
                ctx.set(top.banks.line(b, line), int(sum(int(u[b, line, i]) << (8 * i) for i in range(W))))
        ctl = top.eng.ctl
        cyc = 0
        k = 0
        next_start = 2
        horizon = 2 + 2 * sum(costs) + sum(gaps) + 10
        while cyc < horizon:
            if ctx.get(ctl.end):
                ends.append(cyc)
                next_start = cyc + gaps[k - 1]
            if not ctx.get(top.banks.conv_go):
                refused.append(cyc)
            if k < len(prog) and cyc == next_start:
                ctx.set(ctl.start, 1)
                ctx.set(ctl.instr, instr_value(prog[k]))
                starts.append(cyc)
                next_start = -1
                k += 1
            else:
                ctx.set(ctl.start, 0)
                ctx.set(ctl.instr, 0xFFFF_FFFF << 64 | 0xDEAD_BEEF)   # garbage outside start cycles
            await ctx.tick()
            cyc += 1
        for b in range(nb):
            for line in range(D):
                v = ctx.get(top.banks.line(b, line))
                got[b, line * W:(line + 1) * W] = np.frombuffer(v.to_bytes(W, "little"), np.int8)

    run_sim(top, tb, name=name)
    assert len(starts) == len(prog), (starts, ends)
    stalls = [sum(1 for x in refused if s <= x < e) for s, e in zip(starts, ends)]
    assert len(refused) == sum(stalls), (refused, starts, ends)             # refused only while running
    assert ends == [s + c + st for s, c, st in zip(starts, costs, stalls)], (starts, costs, stalls, ends)
    diff = np.argwhere(got != want)
    if len(diff):
        b, i = diff[0]
        raise AssertionError(f"{len(diff)} bank bytes differ; first: bank {b} line {i // W} byte {i % W}: "
                             f"rtl {got[b, i]} executor {want[b, i]}\nprogram: {[x.fields for x in prog]}")
    # the test must see real output: some output line differs from the preload
    assert (want != pre).any()


def small(pp=2, cp=4, alu_pp=2, **timing):
    """A small target with the smallest conv_latency the RTL allows (pipeline 4 + write queue) unless given."""
    from opendpu.hw.params import min_latency
    t = Target.parametric(pp=pp, cp=cp, alu_pp=alu_pp, bank_depth=64)
    return t.with_timing(**{"conv_latency": min_latency(t)["conv_latency"], "init_cycles": 1, **timing})


@pytest.mark.parametrize("seed", range(1, 9))
def test_conv_random_pp2_cp4(seed):
    t = small()
    rng = np.random.default_rng(seed)
    run_case(t, rand_program(rng, t, 4), seed, f"conv_pp2_s{seed}")


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_conv_preset_shaped_pp4_cp8(seed):
    t = small(pp=4, cp=8, conv_latency=9, init_cycles=2)
    rng = np.random.default_rng(seed)
    run_case(t, rand_program(rng, t, 4, big=True), seed, f"conv_pp4_cp8_s{seed}")


@pytest.mark.parametrize("seed", [31, 32])
def test_conv_reads_split_weight_banks(seed):
    """With the wide weight path each CONVW bank is two memories (even and odd lines); CONV reads every line
    from its half (weight lines at any parity: random bank_addr_weights)."""
    t = small(weight_load_lines=2)
    rng = np.random.default_rng(seed)
    run_case(t, rand_program(rng, t, 4), seed, f"conv_wide_s{seed}")


def test_conv_odd_shape_pp3_cp5():
    """PP not a power of two (generic bank/pass arithmetic), CP odd."""
    t = small(pp=3, cp=5, alu_pp=1, conv_latency=6, init_cycles=3)
    rng = np.random.default_rng(21)
    run_case(t, rand_program(rng, t, 4), 21, "conv_pp3_cp5")


def test_conv_back_to_back_and_arithmetic_corners():
    """Starts in the end cycle; act none/ReLU/leaky/ReLU6; shift_cut 0 and >= 48; shift_bias 20;
    channel_offset across line groups; pads given as out-of-range values; vpp = PP; passes 1..3."""
    t = small()
    pp = t.pp
    base = dict(jump_read=1, shift_cut=7, act_type=0, jump_read_endl=3, shift_bias=20, stride_out=2,
                jump_write=1, stride_offset_in=1, valid_pixel_parallel=2, kernel_h=3, stride_h=2,
                jump_write_endl=5, stride_offset_out=1, kernel_w=2, stride_w=1)
    conv = dict(bank_addr_in=60, pad_top=1, pad_left=1, bank_addr_out=62, pad_bottom=1, pad_right=0,
                channel_group=3, bank_addr_weights=63, bank_id_in=pp - 1, length=2, bank_addr_bias=63,
                bank_id_out=pp, bank_addr_in_1=10, bank_addr_in_2=20, bank_addr_in_3=30, channel_offset=6)
    prog = []
    for act, sc in ((0, 7), (1, 0), (3, 9), (4, 6), (3, 50), (0, 63), (1, 12)):
        prog.append(Instruction("CONVINIT", 0, 0, {**base, "act_type": act, "shift_cut": sc}))
        prog.append(Instruction("CONV", 0, 0, dict(conv)))
        conv["bank_addr_out"] = (conv["bank_addr_out"] + 17) % 4096
        conv["bank_addr_in"] = (conv["bank_addr_in"] + 5) % 4096
    # rows reach pass 3: slots 1..7 of a PP=2 group (bank_addr_in_1..3 all used)
    prog.append(Instruction("CONVINIT", 0, 0, {**base, "kernel_h": 6, "stride_h": 1, "stride_offset_in": 0,
                                               "stride_out": 1, "stride_offset_out": 0, "shift_cut": 9}))
    prog.append(Instruction("CONV", 0, 0, {**conv, "bank_id_in": 1, "pad_bottom": 5, "pad_top": 0}))
    prog.append(Instruction("CONV", 0, 0, {**conv, "pad_top": 15, "pad_bottom": 15, "pad_right": 15,
                                           "channel_offset": 31, "length": 1, "channel_group": 1}))
    ci = None
    for ins in prog:
        if ins.op == "CONVINIT":
            ci = ins.fields
        else:
            ol = out_lines(t, ci, ins.fields)
            assert len(set(ol)) == len(ol)
    run_case(t, prog, 5, "conv_corners", gaps=[0] * len(prog))


def test_conv_saturation_and_activation_boundaries():
    """1x1 CONVs that see only input channel 0 (channel_offset = CP-1), so y = f(x*w + b) exactly
    (shift_cut 0, shift_bias 1): pre-activation values sweep across 127/128, -128/-129, ReLU's 0 and
    ReLU6's 96/97; leaky sweeps 26*a/2^9 across -128; shift_cut 3 gives rounding ties."""
    t = small()
    pp, cp, W = t.pp, t.cp, t.bank_width
    cases = [  # act, shift_cut, shift_bias, weights, biases, x window
        (0, 0, 1, [1, 1, 1, 1], [120, 119, 0, -120], range(-9, 10)),
        (1, 0, 1, [1, 1, 1, 1], [120, 119, 0, -120], range(-9, 10)),
        (4, 0, 1, [1, 1, 1, 1], [90, 88, 0, 120], range(-9, 10)),
        (3, 0, 1, [10, 10, 10, 1], [20, 10, 0, 0], range(-128, -109)),
        (3, 0, 1, [10, 10, 10, 1], [20, 10, 0, 0], range(100, 119)),
        (0, 3, 0, [1, 2, 3, -1], [8, 7, -8, -7], range(-9, 10)),
    ]
    def patch(pre):
        for j, (_, _, _, ws, bs, xs) in enumerate(cases):
            for c, x in enumerate(xs):          # input bank j % PP, lines 20*(j // PP) + c, byte 0
                pre[j % pp, (20 * (j // pp) + c) * W] = x
            for o in range(cp):
                pre[t.convw_base + o, j * W] = ws[o]         # CONVW bank o, line j, byte 0
                pre[t.bias_bank, j * W + o] = bs[o]          # BIAS line j
    prog = []
    for j, (act, sc, sb, ws, bs, xs) in enumerate(cases):
        prog.append(Instruction("CONVINIT", 0, 0, dict(
            jump_read=1, shift_cut=sc, act_type=act, jump_read_endl=1, shift_bias=sb, stride_out=1,
            jump_write=1, stride_offset_in=0, valid_pixel_parallel=1, kernel_h=1, stride_h=1,
            jump_write_endl=1, stride_offset_out=0, kernel_w=1, stride_w=1)))
        prog.append(Instruction("CONV", 0, 0, dict(
            bank_addr_in=20 * (j // pp), pad_top=0, pad_left=0, bank_addr_out=20 * (j // pp) + 1, pad_bottom=0,
            pad_right=0, channel_group=1, bank_addr_weights=j, bank_id_in=j % pp, length=len(xs),
            bank_addr_bias=j, bank_id_out=pp + j % pp, bank_addr_in_1=0, bank_addr_in_2=0, bank_addr_in_3=0,
            channel_offset=cp - 1)))
    # the sweeps reach the boundaries (v = x*w + b for shift_cut 0, shift_bias 1)
    v = {(c[0], x * w + b) for c in cases[:3] for x in c[5] for w, b in zip(c[3], c[4])}
    assert {(0, 127), (0, 128), (0, -128), (0, -129), (1, -1), (1, 0), (1, 1), (4, 96), (4, 97)} <= v
    lk = {(52 * (x * w + b) + 256) // 512 for x in cases[3][5] for w, b in zip(cases[3][3], cases[3][4])}
    assert {-128, -129} <= lk
    run_case(t, prog, 9, "conv_boundaries", patch=patch)


def test_conv_slow_timing():
    """A longer conv_latency and init_cycles (the tail counter), gaps between instructions."""
    t = small(conv_latency=23, init_cycles=5)
    rng = np.random.default_rng(7)
    run_case(t, rand_program(rng, t, 2), 7, "conv_slow", gaps=[3, 0, 1, 2])


def test_conv_detects_wrong_result():
    """Sanity of the harness: the RTL runs shift_cut + 1 of the executor's program; the comparison fails."""
    t = small()
    rng = np.random.default_rng(3)
    prog = rand_program(rng, t, 1)
    rtl_prog = [Instruction(i.op, 0, 0, dict(i.fields)) for i in prog]
    rtl_prog[0].fields["shift_cut"] = (rtl_prog[0].fields["shift_cut"] + 1) % 64
    with pytest.raises(AssertionError, match="bank bytes differ"):
        run_case(t, rtl_prog, 3, "conv_mismatch", ref_prog=prog)


@pytest.mark.parametrize("name", ["DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B4096"])
def test_conv_verilog(name):
    from amaranth.back import verilog
    p = HwParams.of(get_target(name).with_timing(conv_latency=16))
    t0 = time.time()
    v = verilog.convert(ConvEngine(p), name="conv_engine")
    dt = time.time() - t0
    assert "module conv_engine" in v
    print(f"{name}: verilog {len(v)} chars in {dt:.1f}s")
