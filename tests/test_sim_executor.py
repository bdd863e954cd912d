"""Tests of the functional executor (sim/): hand-computed single-instruction programs, error paths,
and a two-seed determinism check on the real MNIST program (spec §2.3, §6)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from opendpu.isa.program import OP_INDEX, Instruction, decode_arrays, to_arrays
from opendpu.isa.target import Target

from helpers import ins
from opendpu.sim import DpuMachine, ExecError

MODELS = os.environ.get("OPENDPU_MODELS",
                        os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
MNIST = os.path.join(MODELS, "dpu_mnist_classifier.xmodel")
if not os.path.exists(MNIST):
    MNIST = "/work/shared/models/dpu_mnist_classifier.xmodel"


# ---- helpers ---------------------------------------------------------------------------------------



def prog(*instrs: Instruction):
    return to_arrays(list(instrs))


def rdround(v):
    """dpu_round of spec §6.1 on floats (exact for the small values used here)."""
    return np.clip(np.floor(np.asarray(v, np.float64) + 0.5), -128, 127).astype(np.int64)


def line_bytes(m: DpuMachine, bank: int, line: int, n: int) -> np.ndarray:
    t = m.target
    tot = t.bank_depth * t.bank_width
    p = (line % t.bank_depth) * t.bank_width
    return m.banks[bank, (p + np.arange(n)) % tot].astype(np.int64)


def set_bytes(m: DpuMachine, bank: int, line: int, data) -> None:
    t = m.target
    tot = t.bank_depth * t.bank_width
    p = (line % t.bank_depth) * t.bank_width
    data = np.asarray(data, np.int64)
    m.banks[bank, (p + np.arange(data.size)) % tot] = data.astype(np.int8)


def layout_pos(t: Target, y: int, x: int, bank0: int, a0: int, s: int, e: int, j: int):
    """Bank and line of pixel (y, x) of a region written with row stride s (spec §2.4)."""
    gb = (bank0 // t.pp) * t.pp
    slot = (bank0 - gb) + y // s
    return gb + slot % t.pp, a0 + (slot // t.pp) * s * e + (y % s) * e + x * j


def put_image(m: DpuMachine, img: np.ndarray, nbytes: int, bank0: int, a0: int, s: int, e: int, j: int, fill=None):
    """Store img [H, W, C] with nbytes per pixel (channels >= C get `fill`, random if None)."""
    h, w, c = img.shape
    rng = np.random.default_rng(99)
    for y in range(h):
        for x in range(w):
            px = rng.integers(-100, 100, nbytes) if fill is None else np.full(nbytes, fill)
            px[:c] = img[y, x]
            b, ln = layout_pos(m.target, y, x, bank0, a0, s, e, j)
            set_bytes(m, b, ln, px)


def get_image(m: DpuMachine, h: int, w: int, c: int, bank0: int, a0: int, s: int, e: int, j: int):
    out = np.zeros((h, w, c), np.int64)
    for y in range(h):
        for x in range(w):
            b, ln = layout_pos(m.target, y, x, bank0, a0, s, e, j)
            out[y, x] = line_bytes(m, b, ln, c)
    return out


def tile_args(t: Target, y0: int, s: int, e: int, j: int, a0: int, pad_left: int):
    """bank_id_in, stride_offset_in and 4 pass addresses for a tile whose first row is image row y0
    (may be negative = top padding) of a region stored with bank0 = 0 (spec §2.4 convention)."""
    slot0 = y0 // s
    soi = y0 - slot0 * s
    p0 = slot0 // t.pp
    addrs = [(a0 + (p0 + k) * s * e - pad_left * j) % t.bank_depth for k in range(4)]
    return slot0 % t.pp, soi, addrs


def out_args(t: Target, y0: int, s: int, e: int, a0: int, bank0: int):
    """bank_id_out and bank_addr_out (stride_offset_out 0) for output row y0 of a region."""
    b, ln = layout_pos(t, y0, 0, bank0, a0, s, e, 1)
    assert y0 % s == 0
    return b, ln


# ---- dpu_round, LOAD, SAVE -------------------------------------------------------------------------
T512 = Target.from_name("B512")          # PP 4, CP 8, ALU_PP 2, banks: img 0-7, CONVW 8-15, DW 16, BIAS 17


def test_load_wrap_zero_fill_plain():
    m = DpuMachine(T512, {1: 64}, init_fill="random", seed=3)
    data = np.arange(1, 41, dtype=np.int8)
    m.write_ddr(1, 0, data)
    # jump_read 20 > channel 12: no channel augmentation; items of 12 bytes = 1.5 lines
    m.run(prog(ins("LOAD", bank_id=5, bank_addr=2047, jump_write=2, jump_read=20, length=2, channel=12,
                   reg_id=1, ddr_addr=0)))
    np.testing.assert_array_equal(line_bytes(m, 5, 2047, 8), np.arange(1, 9))
    np.testing.assert_array_equal(line_bytes(m, 5, 0, 8), [9, 10, 11, 12, 0, 0, 0, 0])
    np.testing.assert_array_equal(line_bytes(m, 5, 1, 8), np.arange(21, 29))
    np.testing.assert_array_equal(line_bytes(m, 5, 2, 8), [29, 30, 31, 32, 0, 0, 0, 0])
    assert m.stats["load_bytes"] == {1: 24}
    assert m.stats["counts"] == {"LOAD": 1}


def test_load_channel_augmentation_mask():
    # W = 8; channel 6, jump_read 2 (<= channel <= 64): augmentation active.
    # pad_start 3: item0 masks c < 3, item1 masks c < 1. pad_idx 2 -> items 2, 3 are end items:
    # item2: n1 = pad_end 3 -> z = 8 - 3 = 5 -> masks c >= 5; item3: n1 = 3 + 2 -> z = 3 -> c >= 3.
    # Register of 9 bytes: item3 reads DDR 6..8 unmasked (6+6=12 would be out of range).
    m = DpuMachine(T512, {2: 9}, init_fill="random", seed=1)
    m.write_ddr(2, 0, np.arange(10, 19, dtype=np.int8))
    m.run(prog(ins("LOAD", bank_id=9, bank_addr=10, jump_write=1, jump_read=2, length=4, channel=6, reg_id=2,
                   ddr_addr=0, pad_start=3, pad_end=3, pad_idx=2)))
    d = np.arange(10, 19)
    exp = [
        [0, 0, 0, d[3], d[4], d[5]],
        [0, d[3], d[4], d[5], d[6], d[7]],
        [d[4], d[5], d[6], d[7], d[8], 0],
        [d[6], d[7], d[8], 0, 0, 0],
    ]
    for it in range(4):
        np.testing.assert_array_equal(line_bytes(m, 9, 10 + it, 8), exp[it] + [0, 0])


def test_load_broadcast_const():
    m = DpuMachine(T512, {0: 16}, init_fill="random", seed=2)
    m.run(prog(ins("LOAD", bank_id=17, bank_addr=4, jump_write=1, jump_read=1000, length=2, channel=5,
                   reg_id=0, ddr_addr=0, broadcast=7, const_value=0xF0)))
    for ln in (4, 5):
        np.testing.assert_array_equal(line_bytes(m, 17, ln, 8), [-16] * 5 + [0, 0, 0])


def test_save_plain_const_argmax():
    m = DpuMachine(T512, {3: 64}, init_fill="zero")
    set_bytes(m, 2, 2047, [5, -3, 7, 7, 1, 0, -9, 2])
    set_bytes(m, 2, 0, [-1, -2, -3, -4, -5, -6, -7, -8])
    set_bytes(m, 2, 1, [1, 2, 3, 4, 5, 6, 7, 8])
    # plain: 10 bytes from line 2047 (wraps to line 0), one item
    m.run(prog(ins("SAVE", bank_id=2, bank_addr=2047, length=1, channel=10, reg_id=3, ddr_addr=0)))
    np.testing.assert_array_equal(m.read_ddr(3, 0, 10), [5, -3, 7, 7, 1, 0, -9, 2, -1, -2])
    # const: 2 items of 3 bytes, 4 apart
    m.run(prog(ins("SAVE", bank_id=2, bank_addr=0, length=2, channel=3, jump_write=4, reg_id=3, ddr_addr=16,
                   const_en=1, const_value=0x7E)))
    np.testing.assert_array_equal(m.read_ddr(3, 16, 8), [126, 126, 126, 0, 126, 126, 126, 0])
    # argmax index (ties keep the lowest index) and value; one byte per item
    m.run(prog(ins("SAVE", bank_id=2, bank_addr=2047, jump_read=2, length=2, channel=8, reg_id=3, ddr_addr=32,
                   argmax=2)))
    np.testing.assert_array_equal(m.read_ddr(3, 32, 3), [2, 7, 0])
    m.run(prog(ins("SAVE", bank_id=2, bank_addr=2047, jump_read=2, length=2, channel=8, reg_id=3, ddr_addr=40,
                   argmax=3)))
    np.testing.assert_array_equal(m.read_ddr(3, 40, 3), [7, 8, 0])
    assert m.stats["save_bytes"] == {3: 10 + 6 + 2 + 2}


# ---- CONV ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("act", [0, 1, 3])
def test_conv_3x3_padding(act):
    t = Target.parametric(2, 4, 2)       # PP 2, CP 4: img 0-3, CONVW 4-7, DWCONVW 8, BIAS 9
    rng = np.random.default_rng(act)
    H, W, C, OC = 4, 5, 6, 4
    cg, ic = 2, 8
    img = rng.integers(-128, 128, (H, W, C))
    wts = rng.integers(-128, 128, (OC, 3, 3, ic))        # channels 6, 7 are garbage (channel_offset 2)
    bias = rng.integers(-128, 128, OC)
    sb, sc = 3, 9
    m = DpuMachine(t, {}, init_fill="random", seed=11)
    A0, E, J = 0, W * cg, cg                            # input region: bank0 0, stride 1
    put_image(m, img, ic, 0, A0, 1, E, J)                # channels 6, 7 of each pixel hold garbage
    BAW, BAB = 2040, 7                                   # weights wrap past line 2047
    for o in range(OC):
        for ky in range(3):
            for kx in range(3):
                set_bytes(m, t.convw_base + o, BAW + (ky * 3 + kx) * cg, wts[o, ky, kx])
    set_bytes(m, t.bias_bank, BAB, bias)
    OA0, OE = 100, W                                      # output region: bank0 2, stride 1, 1 line/pixel
    instrs = [ins("CONVINIT", jump_read=J, jump_read_endl=E, shift_cut=sc, shift_bias=sb, act_type=act,
                  stride_out=1, jump_write=1, jump_write_endl=OE, valid_pixel_parallel=2, kernel_h=3,
                  kernel_w=3, stride_h=1, stride_w=1)]
    for y0 in (0, 2):
        pt = 1 if y0 == 0 else 0
        pb = 2 if y0 == 0 else 1                          # last valid row index in the last window
        bid, soi, addrs = tile_args(t, y0 - 1, 1, E, J, A0, 1)
        assert soi == 0
        bo, ao = out_args(t, y0, 1, OE, OA0, bank0=2)
        instrs.append(ins("CONV", bank_addr_in=addrs[0], bank_addr_in_1=addrs[1], bank_addr_in_2=addrs[2],
                          bank_addr_in_3=addrs[3], bank_id_in=bid, pad_top=pt, pad_left=1, pad_bottom=pb,
                          pad_right=1, channel_group=cg, length=W, bank_addr_weights=BAW, bank_addr_bias=BAB,
                          bank_id_out=bo, bank_addr_out=ao, channel_offset=ic - C))
    m.run(prog(*instrs))
    got = get_image(m, H, W, OC, 2, OA0, 1, OE, 1)
    # independent reference: zero-padded correlation over the 6 real channels
    xp = np.zeros((H + 2, W + 2, C), np.int64)
    xp[1:-1, 1:-1] = img
    acc = np.zeros((H, W, OC), np.int64)
    for ky in range(3):
        for kx in range(3):
            acc += np.einsum("hwc,oc->hwo", xp[ky:ky + H, kx:kx + W], wts[:, ky, kx, :C])
    v = (2 * acc + bias * 2.0 ** sb) / 2.0 ** (sc + 1)
    if act == 1:
        v = np.maximum(v, 0)
    if act == 3:
        v = np.where(v < 0, v * 26 / 256, v)
    np.testing.assert_array_equal(got, rdround(v))
    assert m.stats["counts"] == {"CONVINIT": 1, "CONV": 2}


def test_conv_stride2_relu6_and_saturation():
    t = Target.parametric(2, 4, 2)
    rng = np.random.default_rng(5)
    H, W, C, OC = 5, 5, 4, 4
    img = rng.integers(-128, 128, (H, W, C))
    wts = rng.integers(-128, 128, (OC, 2, 2, C))
    bias = np.array([100, -100, 0, 5])
    sb, sc = 12, 10
    m = DpuMachine(t, {}, init_fill="random", seed=1)
    # input stored with row stride 2 (as a consumer with stride_h 2 reads it)
    A0, E, J = 50, W, 1
    put_image(m, img, 4, 0, A0, 2, E, J)
    for o in range(OC):
        for ky in range(2):
            for kx in range(2):
                set_bytes(m, t.convw_base + o, 0 + ky * 2 + kx, wts[o, ky, kx])
    set_bytes(m, t.bias_bank, 0, bias)
    # 2x2 / stride 2, no padding; output 2x2 (rows 0, 1 with vpp 2); ReLU6
    bid, soi, addrs = tile_args(t, 0, 2, E, J, A0, 0)
    m.run(prog(ins("CONVINIT", jump_read=J, jump_read_endl=E, shift_cut=sc, shift_bias=sb, act_type=4,
                   stride_out=1, jump_write=1, jump_write_endl=2, valid_pixel_parallel=2, kernel_h=2, kernel_w=2,
                   stride_h=2, stride_w=2, stride_offset_in=soi),
               ins("CONV", bank_addr_in=addrs[0], bank_addr_in_1=addrs[1], bank_addr_in_2=addrs[2],
                   bank_addr_in_3=addrs[3], bank_id_in=bid, pad_bottom=1, pad_right=1, channel_group=1, length=2,
                   bank_id_out=2, bank_addr_out=7)))
    got = get_image(m, 2, 2, OC, 2, 7, 1, 2, 1)
    acc = np.zeros((2, 2, OC), np.int64)
    for ky in range(2):
        for kx in range(2):
            acc += np.einsum("hwc,oc->hwo", img[ky:ky + 4:2, kx:kx + 4:2], wts[:, ky, kx])
    v = np.minimum(np.maximum((2 * acc + bias * 2.0 ** sb) / 2.0 ** (sc + 1), 0), 96)
    np.testing.assert_array_equal(got, rdround(v))


# ---- ALU -------------------------------------------------------------------------------------------
TA = Target.parametric(2, 4, 2)


def _alu_setup(img, s_in=1, nbytes=4, seed=0):
    m = DpuMachine(TA, {}, init_fill="random", seed=seed)
    h, w, c = img.shape
    put_image(m, img, nbytes, 0, 0, s_in, w * (nbytes // 4), nbytes // 4)
    return m


def _alu_run(m, img_shape, kh, kw, sh, sw, pads, mode, out_h, out_w, cg=1, in_lines=None, kd=1, **init):
    """Run one ALU instruction per pair of output rows; return the output image [out_h, out_w, cg*4].
    The input has `in_lines` lines per pixel (default cg), stored with row stride sh."""
    H, W, _ = img_shape
    pt, pb_cnt, pl, pr_cnt = pads
    J = cg if in_lines is None else in_lines
    E = W * J
    OE = out_w * cg
    base = dict(kernel_w=kw, kernel_h=kh, exec_mode=mode, stride_w=sw, stride_h=sh, length=out_w,
                channel_group=cg, stride_out=1, jump_read=J, jump_read_endl=E, jump_write=cg,
                jump_write_endl=OE)
    base.update(init)
    instrs = []
    for y0 in range(0, out_h, 2):
        vpp = min(2, out_h - y0)
        iy0 = y0 * sh - pt
        rows_in = (vpp - 1) * sh + kh
        ptop = max(0, -iy0)
        # last valid row index in the last window
        last_row_img = iy0 + rows_in - 1
        pbot = kh - 1 - max(0, last_row_img - (H - 1))
        bid, soi, addrs = tile_args(TA, iy0, sh, E, J, 0, pl)   # input stored with row stride sh
        cols_in = (out_w - 1) * sw + kw
        pright = kw - 1 - max(0, (cols_in - pl) - W)
        instrs.append(ins("ALUINIT", stride_offset_in=soi, **base))
        bo, ao = out_args(TA, y0, 1, OE, 500, bank0=2)
        instrs.append(ins("ALU", bank_addr_out=ao, bank_id_out=bo, bank_addr_in=addrs[0], bank_addr_in_1=addrs[1],
                          bank_addr_in_2=addrs[2], bank_addr_in_3=addrs[3], bank_id_in=bid,
                          valid_pixel_parallel=vpp, pad_top=ptop, pad_bottom=pbot, pad_left=pl, pad_right=pright,
                          bank_addr_weights=30, bank_addr_bias=40, kernel_d=kd))
    m.run(prog(*instrs))
    return get_image(m, out_h, out_w, cg * 4, 2, 500, 1, OE, cg)


def _windows(img, kh, kw, sh, sw, pads, pv, out_h, out_w):
    pt, pb, pl, pr = pads
    H, W, C = img.shape
    xp = np.full((H + pt + pb + kh, W + pl + pr + kw, C), pv, np.int64)
    xp[pt:pt + H, pl:pl + W] = img
    win = np.zeros((out_h, out_w, kh, kw, C), np.int64)
    for y in range(out_h):
        for x in range(out_w):
            win[y, x] = xp[y * sh:y * sh + kh, x * sw:x * sw + kw]
    return win


def test_alu_maxpool_pad_minus128_and_shift():
    rng = np.random.default_rng(1)
    img = rng.integers(-120, -1, (4, 4, 4))                 # all negative: padding with 0 would win
    m = _alu_setup(img)
    got = _alu_run(m, img.shape, 3, 3, 1, 1, (1, 1, 1, 1), 3, 4, 4, shift_cut=9)   # e_cut = -1
    win = _windows(img, 3, 3, 1, 1, (1, 1, 1, 1), -128, 4, 4)
    np.testing.assert_array_equal(got, rdround(win.max(axis=(2, 3)) / 2.0))


def test_alu_maxpool_stride2_positive_shift():
    rng = np.random.default_rng(2)
    img = rng.integers(-128, 128, (4, 6, 4))
    m = _alu_setup(img, s_in=2)
    got = _alu_run(m, img.shape, 2, 2, 2, 2, (0, 0, 0, 0), 3, 2, 3, shift_cut=1)     # e_cut = +1
    win = _windows(img, 2, 2, 2, 2, (0, 0, 0, 0), -128, 2, 3)
    np.testing.assert_array_equal(got, rdround(win.max(axis=(2, 3)) * 2.0))


def test_alu_avgpool():
    rng = np.random.default_rng(3)
    img = rng.integers(-128, 128, (3, 3, 4))
    m = _alu_setup(img)
    # 3x3 / stride 1, pad 1: y = round(sum * 28 / 256); multi_factor 28, shift_cut code 16 -> e_cut = -8
    got = _alu_run(m, img.shape, 3, 3, 1, 1, (1, 1, 1, 1), 2, 3, 3, multi_factor=28, shift_cut=16)
    win = _windows(img, 3, 3, 1, 1, (1, 1, 1, 1), 0, 3, 3)
    np.testing.assert_array_equal(got, rdround(win.sum(axis=(2, 3)) * 28 / 256.0))
    # negative multi_factor (signed int8 reinterpretation): 0xF0 = -16, e_cut = -4 -> -sum
    m = _alu_setup(img)
    got = _alu_run(m, img.shape, 3, 3, 1, 1, (1, 1, 1, 1), 2, 3, 3, multi_factor=0xF0, shift_cut=12)
    np.testing.assert_array_equal(got, rdround(-win.sum(axis=(2, 3)) * 1.0))


def test_alu_dwconv_bias_relu():
    rng = np.random.default_rng(4)
    img = rng.integers(-128, 128, (4, 5, 4))
    m = _alu_setup(img)
    wt = rng.integers(-128, 128, (3, 3, 4))
    bias = rng.integers(-128, 128, 4)
    for ky in range(3):
        for kx in range(3):
            set_bytes(m, TA.dwconvw_bank, 30 + (ky * 3 + kx), wt[ky, kx])
    set_bytes(m, TA.bias_bank, 40, bias)
    sb, sc = 2, 7
    got = _alu_run(m, img.shape, 3, 3, 1, 1, (1, 1, 1, 1), 0, 4, 5, shift_bias=sb, shift_cut=sc, act_type=1,
                   jump_read_weights=1)
    win = _windows(img, 3, 3, 1, 1, (1, 1, 1, 1), 0, 4, 5)
    acc = (win * wt).sum(axis=(2, 3))
    v = np.maximum((2 * acc + bias * 2.0 ** sb) / 2.0 ** (sc + 1), 0)
    np.testing.assert_array_equal(got, rdround(v))
    # dwconv_no_bias (6): v = acc / 2^shift_cut, no activation
    m2 = _alu_setup(img)
    for ky in range(3):
        for kx in range(3):
            set_bytes(m2, TA.dwconvw_bank, 30 + (ky * 3 + kx), wt[ky, kx])
    got = _alu_run(m2, img.shape, 3, 3, 1, 1, (1, 1, 1, 1), 6, 4, 5, shift_cut=sc, jump_read_weights=1)
    np.testing.assert_array_equal(got, rdround(acc / 2.0 ** sc))


def test_alu_dwconv_kernel_d2():
    # KD = 2 blocks of IC = 4 channels per input pixel (2 lines); both blocks accumulate into 4 outputs
    rng = np.random.default_rng(12)
    img = rng.integers(-128, 128, (3, 4, 8))
    m = _alu_setup(img, nbytes=8)
    wt = rng.integers(-128, 128, (3, 3, 2, 4))
    bias = rng.integers(-128, 128, 4)
    for ky in range(3):
        for kx in range(3):
            for d in range(2):      # wline = baw + pos*jump_read_weights + d*cg
                set_bytes(m, TA.dwconvw_bank, 30 + (ky * 3 + kx) * 2 + d, wt[ky, kx, d])
    set_bytes(m, TA.bias_bank, 40, bias)
    got = _alu_run(m, img.shape, 3, 3, 1, 1, (1, 1, 1, 1), 0, 3, 4, in_lines=2, kd=2, shift_bias=1, shift_cut=8,
                   jump_read_weights=2)
    win = _windows(img, 3, 3, 1, 1, (1, 1, 1, 1), 0, 3, 4).reshape(3, 4, 3, 3, 2, 4)
    acc = (win * wt).sum(axis=(2, 3, 4))
    np.testing.assert_array_equal(got, rdround((2 * acc + bias * 2.0) / 2.0 ** 9))


def test_alu_dwconv_w16b0():
    # 16-bit weights, one per channel group: bytes 0-1 of line wline + 2*g; v = acc / 2^shift_cut
    rng = np.random.default_rng(13)
    img = rng.integers(-128, 128, (2, 3, 8))
    m = _alu_setup(img, nbytes=8)
    w16 = rng.integers(-3000, 3000, (3, 3, 2))
    for ky in range(3):
        for kx in range(3):
            for g in range(2):
                v = int(w16[ky, kx, g]) & 0xFFFF
                lo, hi = v & 0xFF, v >> 8
                set_bytes(m, TA.dwconvw_bank, 30 + (ky * 3 + kx) * 4 + 2 * g,
                          [lo - 256 if lo > 127 else lo, hi - 256 if hi > 127 else hi])
    got = _alu_run(m, img.shape, 3, 3, 1, 1, (1, 1, 1, 1), 8, 2, 3, cg=2, shift_cut=14, jump_read_weights=4)
    win = _windows(img, 3, 3, 1, 1, (1, 1, 1, 1), 0, 2, 3)
    acc = (win * np.repeat(w16, 4, axis=2)).sum(axis=(2, 3))
    np.testing.assert_array_equal(got, rdround(acc / 2.0 ** 14))


def test_alu_maxreduce():
    rng = np.random.default_rng(14)
    img = rng.integers(-128, 128, (4, 4, 4))
    m = _alu_setup(img, s_in=2)
    got = _alu_run(m, img.shape, 2, 2, 2, 2, (0, 0, 0, 0), 5, 2, 2, shift_cut=2)
    win = _windows(img, 2, 2, 2, 2, (0, 0, 0, 0), -128, 2, 2)
    np.testing.assert_array_equal(got, rdround(win.max(axis=(2, 3)) * 4.0))


def test_alu_hsigmoid_leaky_prelu():
    img = np.arange(-128, 128, 4).reshape(4, 4, 4)
    # hsigmoid: v = min(2^32, max(0, x*2731 + 3*2731*2^sb)) / 2^sc
    m = _alu_setup(img)
    got = _alu_run(m, img.shape, 1, 1, 1, 1, (0, 0, 0, 0), 7, 4, 4, shift_bias=4, shift_cut=9)
    v = np.clip(img * 2731 + 3 * 2731 * 2 ** 4, 0, 2 ** 32) / 2.0 ** 9
    np.testing.assert_array_equal(got, rdround(v))
    # leaky relu (mode 4): alpha = multi_factor 26, negative branch >> 8 (code 40), positive unchanged (32)
    m = _alu_setup(img)
    got = _alu_run(m, img.shape, 1, 1, 1, 1, (0, 0, 0, 0), 4, 4, 4, multi_factor=26, shift_prelu_n=40,
                   shift_prelu_p=32)
    np.testing.assert_array_equal(got, rdround(np.where(img < 0, img * 26 / 256.0, img)))
    # prelu (mode 1): per-channel slopes from DWCONVW; positive branch scaled x2 (code 1 = left shift 1)
    m = _alu_setup(img)
    alpha = np.array([3, -5, 64, 0])
    set_bytes(m, TA.dwconvw_bank, 30, alpha)
    got = _alu_run(m, img.shape, 1, 1, 1, 1, (0, 0, 0, 0), 1, 4, 4, shift_prelu_n=34, shift_prelu_p=1)
    t_ = np.where(img < 0, img * alpha, img)
    np.testing.assert_array_equal(got, rdround(np.where(t_ < 0, t_ / 4.0, t_ * 2.0)))


# ---- ELEW and rounding -----------------------------------------------------------------------------
def _elew_machine(a, b=None):
    m = DpuMachine(T512, {}, init_fill="random", seed=7)
    for r in range(a.shape[0]):
        for j in range(a.shape[1]):
            set_bytes(m, r, 10 + j, a[r, j])
            if b is not None:
                set_bytes(m, 4 + r, 20 + 2 * j, b[r, j])
    return m


def test_elew_add_shift_read_write_relu():
    rng = np.random.default_rng(8)
    a = rng.integers(-128, 128, (2, 3, 8))
    b = rng.integers(-128, 128, (2, 3, 8))
    for sw, act in ((17, 0), (1, 0), (0, 1), (18, 1)):
        m = _elew_machine(a, b)
        m.run(prog(ins("ELEWINIT", id=0, bank_id_in=0, bank_addr_in=10, jump_read=1, shift_read=0),
                   ins("ELEWINIT", id=1, bank_id_in=4, bank_addr_in=20, jump_read=2, shift_read=1),
                   ins("ELEW", num=2, elew_type=0, act_type=act, shift_write=sw, bank_id_out=1, bank_addr_out=300,
                       jump_write=1, length=3, valid_pixel_parallel=2, channel_group=1)))
        got = np.array([[line_bytes(m, 1 + r, 300 + j, 8) for j in range(3)] for r in range(2)])
        S = a * 4 + np.floor(b * 4 / 2.0)
        v = S * 2.0 ** sw / 4 if sw < 16 else S / 2.0 ** (sw - 16) / 4
        if act:
            v = np.maximum(v, 0)
        np.testing.assert_array_equal(got, rdround(v), err_msg=f"shift_write {sw}")


def test_elew_multiply_and_state_persistence():
    rng = np.random.default_rng(9)
    a = rng.integers(-128, 128, (2, 2, 8))
    b = rng.integers(-128, 128, (2, 2, 8))
    m = _elew_machine(a, b)
    p = prog(ins("ELEWINIT", id=0, bank_id_in=0, bank_addr_in=10, jump_read=1),
             ins("ELEWINIT", id=1, bank_id_in=4, bank_addr_in=20, jump_read=2),
             ins("ELEW", num=2, elew_type=1, shift_write=5, bank_id_out=2, bank_addr_out=300, jump_write=1, length=2,
                 valid_pixel_parallel=2),
             ins("ELEW", num=2, elew_type=1, shift_write=20, bank_id_out=2, bank_addr_out=400, jump_write=1,
                 length=2, valid_pixel_parallel=2))
    m.run(p, 0, 3)
    m.run(p, 3)                       # second ELEW re-uses the stored descriptors
    prod = (a * 4) * (b * 4)
    for base, v in ((300, prod * 2.0 ** 5 / 16), (400, prod / 2.0 ** 4 / 16)):
        got = np.array([[line_bytes(m, 2 + r, base + j, 8) for j in range(2)] for r in range(2)])
        np.testing.assert_array_equal(got, rdround(v))


def test_dpu_round_ties_and_saturation():
    x = np.array([5, -5, 3, -3, 1, -1, 100, -100], np.int64)
    m = DpuMachine(T512, {}, init_fill="zero")
    set_bytes(m, 0, 0, x)
    # one input: v = (4x) / 2^(17-16) / 4 = x / 2  -> ties 2.5 -> 3, -2.5 -> -2, 0.5 -> 1, -0.5 -> 0
    m.run(prog(ins("ELEWINIT", id=0, bank_id_in=0, bank_addr_in=0, jump_read=1),
               ins("ELEW", num=1, shift_write=17, bank_id_out=1, bank_addr_out=0, jump_write=1, length=1),
               ins("ELEW", num=1, shift_write=1, bank_id_out=1, bank_addr_out=1, jump_write=1, length=1)))
    np.testing.assert_array_equal(line_bytes(m, 1, 0, 8), [3, -2, 2, -1, 1, 0, 50, -50])
    np.testing.assert_array_equal(line_bytes(m, 1, 1, 8), [10, -10, 6, -6, 2, -2, 127, -128])


# ---- error paths -----------------------------------------------------------------------------------
CI_OK = dict(valid_pixel_parallel=1, kernel_h=1, kernel_w=1)
AI_OK = dict(exec_mode=3)


@pytest.mark.parametrize("instrs,bad,op,field,words", [
    ([ins("LOAD", bank_id=40, reg_id=0)], 0, "LOAD", "bank_id", ["40", "0..17"]),
    ([ins("LOAD", bank_id=0, reg_id=5)], 0, "LOAD", "reg_id", ["REG_5", "REG_0"]),
    ([ins("LOAD", bank_id=0, reg_id=0, ddr_addr=60, channel=8)], 0, "LOAD", "ddr_addr", ["REG_0", "64"]),
    ([ins("LOAD", bank_id=0, reg_id=0, mode_avg=1)], 0, "LOAD", "mode_avg", ["ISA1"]),
    ([ins("SAVE", bank_id=8, reg_id=0)], 0, "SAVE", "bank_id", ["image bank", "0..7"]),
    ([ins("SAVE", bank_id=0, reg_id=0, ddr_addr=10, length=4, jump_write=16, channel=8)], 0, "SAVE", "ddr_addr",
     ["REG_0", "66", "64"]),
    ([ins("LOAD", bank_id=0, reg_id=0), ins("CONV")], 1, "CONV", None, ["CONVINIT"]),
    ([ins("CONVINIT", **dict(CI_OK, valid_pixel_parallel=5))], 0, "CONVINIT", "valid_pixel_parallel", ["1..4"]),
    ([ins("CONVINIT", **dict(CI_OK, stride_h=9))], 0, "CONVINIT", "stride_h", ["1..8"]),
    ([ins("CONVINIT", **dict(CI_OK, shift_bias=21))], 0, "CONVINIT", "shift_bias", ["0..20"]),
    ([ins("CONVINIT", **dict(CI_OK, act_type=2))], 0, "CONVINIT", "act_type", ["2"]),
    ([ins("CONVINIT", **dict(CI_OK, stride_h=2, stride_offset_in=2))], 0, "CONVINIT", "stride_offset_in",
     ["0..1"]),
    ([ins("CONVINIT", valid_pixel_parallel=4, kernel_h=16, kernel_w=1),
      ins("CONV", bank_id_in=3, bank_id_out=0)], 1, "CONV", "bank_id_in", ["pass", "0..3"]),
    ([ins("CONVINIT", **CI_OK), ins("CONV", bank_id_in=0, bank_id_out=12)], 1, "CONV", "bank_id_out", ["0..7"]),
    ([ins("ALU")], 0, "ALU", None, ["ALUINIT"]),
    ([ins("ALUINIT", exec_mode=9)], 0, "ALUINIT", "exec_mode", ["0..8"]),
    ([ins("ALUINIT", exec_mode=7, kernel_w=3)], 0, "ALUINIT", "kernel_w", ["1..1"]),
    ([ins("ALUINIT", **AI_OK), ins("ALU", valid_pixel_parallel=3)], 1, "ALU", "valid_pixel_parallel", ["1..2"]),
    ([ins("ELEWINIT", id=0), ins("ELEW", num=1, elew_type=1)], 1, "ELEW", "num", ["2..2"]),
    ([ins("ELEWINIT", id=0), ins("ELEW", num=2)], 1, "ELEW", "num", ["id 1"]),
    ([ins("ELEWINIT", id=0, jump_bank=3), ins("ELEW", num=1, valid_pixel_parallel=2)], 1, "ELEW",
     "valid_pixel_parallel", ["jump_bank", "1..1"]),
    ([ins("ELEWINIT", id=0, bank_id_in=16)], 0, "ELEWINIT", "bank_id_in", ["0..7"]),
    ([ins("LOAD", bank_id=0, reg_id=0), ins("POOLINIT")], 1, "POOLINIT", None, ["not usable on ISA1"]),
    ([ins("DPTWISE")], 0, "DPTWISE", None, ["not usable on ISA1"]),
    ([ins("ALUINIT", exec_mode=3, kernel_w=256, kernel_h=256, stride_w=256, stride_h=256, length=2048),
      ins("ALU")], 1, "ALU", "valid_pixel_parallel", ["emulator limit"]),
])
def test_errors(instrs, bad, op, field, words):
    m = DpuMachine(T512, {0: 64}, init_fill="zero")
    with pytest.raises(ExecError) as ei:
        m.run(prog(*instrs))
    e = ei.value
    msg = str(e)
    assert e.index == bad and e.op == op and e.field == field, msg
    assert f"instruction {bad} ({op})" in msg
    if field is not None:
        assert f"field {field}=" in msg
    for w in words:
        assert w in msg, msg


def test_conv_leaky_needs_target_support():
    t = Target.parametric(2, 4, 2, cv_lkrl=False)
    m = DpuMachine(t, {}, init_fill="zero")
    with pytest.raises(ExecError, match=r"act_type=3.*allowed: 0 \(none\), 1 \(ReLU\), 4 \(ReLU6\)"):
        m.run(prog(ins("CONVINIT", act_type=3)))


def test_masked_load_bytes_may_lie_outside_register():
    # pad_start 4 masks the 4 leading bytes of item 0; the read starts at offset 0 - the unmasked bytes are
    # inside; the register's exact size (10) ends right at the last unmasked byte of the last item.
    m = DpuMachine(T512, {0: 10}, init_fill="zero")
    m.run(prog(ins("LOAD", bank_id=0, reg_id=0, jump_read=2, channel=6, length=3, pad_start=4, pad_end=2,
                   pad_idx=1)))
    # item 2: z = 8 - 2 = 6 -> nothing masked at the end; reads 4..9: fits exactly
    with pytest.raises(ExecError, match="REG_0"):
        m.run(prog(ins("LOAD", bank_id=0, reg_id=0, jump_read=2, channel=6, length=4, pad_start=4, pad_end=2,
                       pad_idx=1)))


# ---- real program: MNIST ---------------------------------------------------------------------------
def _mnist():
    if not os.path.exists(MNIST):
        pytest.skip("MNIST xmodel not available")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "compiler", "xir"))
    import xir_pb2
    g = xir_pb2.Graph()
    with open(MNIST, "rb") as f:
        g.ParseFromString(f.read())
    for s in g.subg_root.subg_child:
        a = s.subg_attr
        if a["device"].string_value == "DPU":
            sizes = {int(k[4:]): v for k, v in a["reg_id_to_size"].map_string_2_int32_value.value.items()}
            params = {int(k[4:]): v.value
                      for k, v in a["reg_id_to_parameter_value"].map_string_2_bytes_value.value.items()}
            ctx = {int(k[4:]): v for k, v in a["reg_id_to_context_type_v2"].map_string_2_string_value.value.items()}
            return (Target.from_fingerprint(a["dpu_fingerprint"].uint64_value),
                    decode_arrays(a["mc_code"].bytes_value.value), sizes, params, ctx)
    pytest.skip("no DPU subgraph")


def _mnist_machine(t, sizes, params, ctx, seed, x):
    m = DpuMachine(t, sizes, init_fill="random", seed=seed)
    for k, c in ctx.items():
        if c == "CONST":
            m.write_ddr(k, 0, params[k])
    m.write_ddr(2, 0, x)           # input_1_upload_0: REG_2, ddr_addr 0, 28x28x1
    return m


def test_mnist_two_seeds_and_chunked_run():
    t, p, sizes, params, ctx = _mnist()
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, 784, dtype=np.int8)
    outs = []
    for seed in (0, 1):
        m = _mnist_machine(t, sizes, params, ctx, seed, x)
        m.run(p)
        assert m.ended and m.pc == len(p)
        outs.append({k: m.ddr(k).copy() for k in sizes if ctx[k] != "CONST"})
        assert m.stats["counts"]["CONV"] == 17
    for k in outs[0]:
        np.testing.assert_array_equal(outs[0][k], outs[1][k])
    # chunked execution: stop after every SAVE and at a few arbitrary points
    m = _mnist_machine(t, sizes, params, ctx, 5, x)
    cuts = sorted(set([0, 7, 50, 111, len(p)] + [i + 1 for i in range(len(p)) if p.op[i] == OP_INDEX["SAVE"]]))
    for a, b in zip(cuts[:-1], cuts[1:]):
        m.run(p, a, b)
    for k in outs[0]:
        np.testing.assert_array_equal(m.ddr(k), outs[0][k])
    assert outs[0][3].any()


def test_failed_load_has_no_partial_effect():
    m = DpuMachine(T512, {0: 20}, init_fill="random", seed=4)
    before = m.banks.copy()
    with pytest.raises(ExecError, match=r"instruction 0 \(LOAD\): field ddr_addr=4"):
        m.run(prog(ins("LOAD", bank_id=3, reg_id=0, ddr_addr=4, jump_read=8, channel=8, length=3)))
    np.testing.assert_array_equal(m.banks, before)
    assert m.pc == 0 and not m.ended
