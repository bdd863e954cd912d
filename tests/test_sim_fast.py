"""Issue 32 item 5 (sim half): the vectorised exact arithmetic of the executor (sim._fastmac, sim._tilecache: the
default) against the scalar integer loops it replaced (DpuMachine(fast=False)), 0 mismatching bytes in banks and DDR.

* CONV and ALU dwconv layers drawn at the float32-exactness boundary: reductions around and past the 1,024-product
  chunk (kernel_w·IC up to 3,072, kernel_h up to 16, dwconv windows up to 2,560 positions), operands all −128 /
  all 127 / random extremes, extreme biases, every legal shift_bias (0…20), shift_cut and activation, padding,
  channel_offset, strides and line wrap;
* the accumulators themselves against int64 numpy references (rounding would hide low-bit errors);
* the reused CONV input tile against every kind of bank write in between (each check fails when its
  invalidation is removed);
* random whole programs (sim.progen) with a CONV-heavy mix."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opendpu.isa.program import to_arrays
from opendpu.isa.target import Target, get_target
from opendpu.sim import DpuMachine
from opendpu.sim import _fastmac, _vnni
from opendpu.sim._fastmac import CHUNK, LANES, _conv_acc_dot, conv_acc, dw_acc, outer_acc, use_outer
from opendpu.sim._vnni import conv_acc_vnni
from opendpu.sim.progen import random_program

from helpers import ins

_fastmac.ensure_compiled()          # the tile kernel with SLP before outer_acc compiles it (as DpuMachine.run does)

B4096 = get_target("DPUCZDX8G_ISA1_B4096")          # PP 8, CP 16, leaky ReLU on CONV
SMALL = Target.parametric(2, 4, bank_depth=512)     # CP 4, a 512-line bank: addresses wrap often
ODD = Target.parametric(4, 10)                      # CP 10 (B800-like widths): 10 output channels = 2 tiles + 2


def _fill(rng: np.random.Generator, kind: str, shape) -> np.ndarray:
    if kind == "min":
        return np.full(shape, -128, np.int8)
    if kind == "max":
        return np.full(shape, 127, np.int8)
    if kind == "extreme":
        return rng.choice(np.array([-128, 127], np.int8), size=shape)
    return rng.integers(-128, 128, size=shape, dtype=np.int8)


def _modes(t: Target) -> tuple:
    """Every fast arithmetic the target can use, then the scalar loops: "vnni" (int8 dot products; runs in portable
    vector code on a CPU without VNNI, so this test is the same everywhere) where CP is a multiple of 4, and
    "float32"."""
    return (("vnni",) if t.cp % 4 == 0 else ()) + ("float32", False)


def _same(ms: list[DpuMachine]) -> None:
    """Every fast machine left the same banks, DDR and statistics as the scalar one (the last)."""
    for m in ms[:-1]:
        assert int((m.banks != ms[-1].banks).sum()) == 0, m.fast
        assert int((m._ddr != ms[-1]._ddr).sum()) == 0, m.fast
        assert m.stats == ms[-1].stats, m.fast


def _both(t: Target, banks: np.ndarray, instrs) -> tuple[DpuMachine, DpuMachine]:
    """(a fast machine, the scalar one) after running `instrs`; every fast mode is checked equal to the scalar."""
    p = to_arrays(list(instrs))
    out = []
    for fast in _modes(t):
        m = DpuMachine(t, {}, init_fill="zero", fast=fast)
        m.banks[...] = banks
        m.run(p)
        out.append(m)
    _same(out)
    return out[0], out[-1]


@st.composite
def conv_layers(draw):
    t = draw(st.sampled_from([B4096, B4096, SMALL, ODD]))
    pp, cp = t.pp, t.cp
    kh = draw(st.integers(1, 16 if t is B4096 else 5))
    kw = draw(st.integers(1, 16 if t is B4096 else 5))
    sh = draw(st.integers(1, 4))
    sw = draw(st.integers(1, 4))
    soi = draw(st.integers(0, sh - 1))
    vpp = draw(st.integers(1, pp))
    # input channels: around the 1,024-product chunk of one kernel row (kw·IC), and short rows that get merged
    lmax = min(256, max(1, 3072 // (kw * cp)))           # channel_group is an 8-bit field (1..256)
    near = 1024 // (kw * cp)
    hi = min(lmax, near + 2)
    cg = draw(st.one_of(st.integers(1, 3), st.integers(min(hi, max(1, near - 1)), hi), st.integers(1, lmax)))
    length = draw(st.integers(1, 12))
    rows_in = (vpp - 1) * sh + kh
    # keep every input row in passes 0..3 (spec §6.4)
    bid_max = min(pp - 1, 4 * pp - 1 - (soi + rows_in - 1) // sh)
    if bid_max < 0:
        vpp, rows_in = 1, kh
        bid_max = min(pp - 1, 4 * pp - 1 - (soi + rows_in - 1) // sh)
    depth = t.bank_depth
    addr = st.integers(0, depth - 1)
    f = dict(bank_id_in=draw(st.integers(0, max(0, bid_max))), bank_addr_in=draw(addr), bank_addr_in_1=draw(addr),
             bank_addr_in_2=draw(addr), bank_addr_in_3=draw(addr), bank_addr_weights=draw(addr),
             bank_addr_bias=draw(addr), bank_id_out=draw(st.integers(pp, 2 * pp - 1)), bank_addr_out=draw(addr),
             channel_group=cg, length=length, pad_top=draw(st.integers(0, min(15, kh - 1))),
             pad_left=draw(st.integers(0, min(15, kw - 1))), pad_bottom=draw(st.integers(0, kh - 1)),
             pad_right=draw(st.integers(0, kw - 1)), channel_offset=draw(st.sampled_from([0, 0, 1, cp - 1])))
    init = dict(kernel_h=kh, kernel_w=kw, stride_h=sh, stride_w=sw, stride_offset_in=soi, valid_pixel_parallel=vpp,
                jump_read=draw(st.integers(1, 64)), jump_read_endl=draw(st.integers(1, 512)),
                jump_write=draw(st.integers(1, 8)), jump_write_endl=draw(st.integers(1, 256)),
                stride_out=draw(st.integers(1, min(2, t.conv_stride_out_h_max))), stride_offset_out=0,
                shift_bias=draw(st.integers(0, 20)), shift_cut=draw(st.integers(0, 40)),
                act_type=draw(st.sampled_from([0, 1, 3, 4] if t.cv_lkrl else [0, 1, 4])))
    kinds = draw(st.tuples(*[st.sampled_from(["random", "min", "max", "extreme"])] * 3))
    seed = draw(st.integers(0, 2 ** 16))
    return t, init, f, kinds, seed


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_layers())
def test_fast_conv_equals_scalar_at_the_exactness_boundary(layer):
    t, init, f, (kx, kw_, kb), seed = layer
    rng = np.random.default_rng(seed)
    nbytes = t.bank_depth * t.bank_width
    banks = np.empty((t.num_banks, nbytes), np.int8)
    banks[:t.num_img_banks] = _fill(rng, kx, (t.num_img_banks, nbytes))
    banks[t.convw_base:t.convw_base + t.cp] = _fill(rng, kw_, (t.cp, nbytes))
    banks[t.dwconvw_bank] = _fill(rng, "random", nbytes)
    banks[t.bias_bank] = _fill(rng, kb, nbytes)
    fast, slow = _both(t, banks, [ins("CONVINIT", **init), ins("CONV", **f), ins("END")])
    assert int((fast.banks != slow.banks).sum()) == 0
    assert fast.stats == slow.stats


def _acc_reference(X, W, vpp, length, ocp, ic, kh, kw, sh, sw) -> np.ndarray:
    """Independent int64 accumulators: A[h, x*ocp + o] = sum over (ky, kx, i) of X * W (numpy, no floats)."""
    Xi, Wi = X.astype(np.int64), W.astype(np.int64).reshape(ocp, kh, kw, ic)
    A = np.zeros((vpp, length, ocp), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            for x in range(length):
                c0 = (x * sw + kx) * ic
                A[:, x, :] += Xi[ky:ky + (vpp - 1) * sh + 1:sh, c0:c0 + ic] @ Wi[:, ky, kx, :].T
    return A.reshape(vpp, length * ocp)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(1, 16), st.integers(1, 3), st.integers(1, 3), st.integers(1, 8),
       st.integers(1, 9), st.sampled_from([8, 10, 16, 32]), st.sampled_from([1, 2, 4, 8, 63, 64, 65, 130, 192]),
       st.sampled_from([(127, 127), (-128, -128), (-128, 127), ("pos", "pos"), ("pos", "neg"), (None, None)]),
       st.integers(0, 99))
def test_conv_accumulators_exact(kh, kw, sh, sw, vpp, length, ocp, cg, vals, seed):
    """The accumulators themselves (before rounding hides low bits) equal an int64 reference. Same-sign large
    operands ("pos": random 100…127, "neg": −128…−100) make every chunk sum as large as a chunk allows and odd
    (1,024 products of ≥ 10,000 are > 2^23), so a longer float32 chunk, a float32 running total or a lost product
    shows up here; constant extremes (±127, −128) hit the largest magnitudes."""
    if kw * cg * ocp * kh > 40000:                      # keep the reference quick
        cg = max(1, 40000 // (kw * ocp * kh))
    ic = cg * ocp
    rows_in, cols_in = (vpp - 1) * sh + kh, (length - 1) * sw + kw
    rng = np.random.default_rng(seed)

    def fill(v, shape):
        if v is None:
            return rng.integers(-128, 128, shape).astype(np.float32)
        if v == "pos":
            return rng.integers(100, 128, shape).astype(np.float32)
        if v == "neg":
            return rng.integers(-128, -99, shape).astype(np.float32)
        return np.full(shape, v, np.float32)
    X, W = fill(vals[0], (rows_in, cols_in * ic)), fill(vals[1], (ocp, kh, kw * ic))
    ref = _acc_reference(X, W, vpp, length, ocp, ic, kh, kw, sh, sw)
    A = np.empty((vpp, length * ocp), np.int64)
    conv_acc(X, W, A, vpp, length, ocp, ic, kh, kw, sh, sw)
    np.testing.assert_array_equal(A, ref)
    # both kernels, whichever conv_acc picks: dot products, and outer products over LANES-wide channel blocks
    # (weights transposed as sim._kernels reads them, zero lanes above ocp; ocp 32 makes two blocks)
    A[...] = 0
    _conv_acc_dot(X, W, A, vpp, length, ocp, ic, kh, kw, sh, sw)
    np.testing.assert_array_equal(A, ref)
    Wq = np.zeros((kh, kw * ic, -(-ocp // LANES) * LANES), np.float32)
    Wq[:, :, :ocp] = W.transpose(1, 2, 0)
    A[...] = 0
    outer_acc(X, Wq, A, vpp, length, ocp, ic, kh, kw, sh, sw)
    np.testing.assert_array_equal(A, ref)
    if ic % 4 == 0:                                     # the int8 dot-product kernel (CP a multiple of 4)
        A[...] = 0
        conv_acc_vnni(*_vnni_operands(X, W), A, vpp, length, ocp, ic, kh, kw, sh, sw)
        np.testing.assert_array_equal(A, ref)


def _vnni_operands(X: np.ndarray, W: np.ndarray):
    """(Xu, Wv, wsum) of sim._vnni from a tile X [rows, cols·ic] and weights W [ocp, kh, kw·ic] (int values)."""
    ocp = W.shape[0]
    lanes = -(-ocp // LANES) * LANES
    Xu = np.ascontiguousarray(X.astype(np.int8).view(np.uint8) ^ 0x80)
    Wb = np.zeros((W[0].size // 4, lanes, 4), np.int8)
    Wb[:, :ocp, :] = W.reshape(ocp, -1, 4).astype(np.int8).transpose(1, 0, 2)
    wsum = np.zeros(lanes, np.int64)
    wsum[:ocp] = W.reshape(ocp, -1).astype(np.int64).sum(1)
    return Xu, Wb.view(np.int32).reshape(-1, lanes), wsum


def test_vnni_kernel_past_the_int32_run():
    """sim._vnni: a reduction of 16·16·272 = 69,632 products (> 2^16, so the int32 lanes must be flushed into int64
    once) of the largest offset product, (127 + 128)·(−128), and of mixed extremes: equal to int64 numpy. And the
    portable form of the tile kernel (what runs without VNNI) equals the host's on random bytes."""
    kh = kw = 16
    ic = 272
    for x, w in ((127, -128), (-128, 127), (None, None)):
        rng = np.random.default_rng(3)
        X = rng.choice(np.array([-128, 127]), (kh, kw * ic)) if x is None else np.full((kh, kw * ic), x)
        W = rng.choice(np.array([-128, 127]), (16, kh, kw * ic)) if w is None else np.full((16, kh, kw * ic), w)
        A = np.empty((1, 16), np.int64)
        conv_acc_vnni(*_vnni_operands(X, W), A, 1, 1, 16, ic, kh, kw, 1, 1)
        np.testing.assert_array_equal(A[0], W.reshape(16, -1).astype(np.int64) @ X.reshape(-1).astype(np.int64))
    rng = np.random.default_rng(4)
    Xu = rng.integers(0, 256, 8 * 1000, dtype=np.uint8)
    Wv = rng.integers(-128, 128, 200 * 32 * 4, dtype=np.int8)
    offs = np.arange(8, dtype=np.int64) * 1000
    a, b = np.zeros((8, 16), np.int32), np.ones((8, 16), np.int32)
    # two kernel rows of 100 quads, 600 bytes apart in X; lanes 16..31 of weight rows 32 lanes wide
    _vnni.tile8(Xu, offs, Wv, 64, 128, 100, 2, 600, 1, a)
    _vnni.tile8_generic(Xu, offs, Wv, 64, 128, 100, 2, 600, 1, b)     # init: b's ones are not added
    xs = np.concatenate([Xu.reshape(8, 1000)[:, :400], Xu.reshape(8, 1000)[:, 600:]], axis=1).astype(np.int64)
    ref = xs @ Wv.reshape(200, 2, 16, 4)[:, 1].transpose(0, 2, 1).reshape(800, 16).astype(np.int64)
    np.testing.assert_array_equal(a, ref)
    np.testing.assert_array_equal(b, ref)
    _vnni.tile8(Xu, offs, Wv, 64, 128, 100, 2, 600, 0, a)      # without init the sums add to acc
    np.testing.assert_array_equal(a, 2 * ref)


def test_fast_mode_names_and_refusals():
    """DpuMachine(fast=...): True picks the host's best for the array ("vnni" only where CP is a multiple of 4 and
    the CPU has VNNI); an unknown name, or "vnni" on an array whose lines are not whole 4-byte groups, is refused
    by name before any work."""
    assert DpuMachine(B4096, {}, fast=True).fast == ("vnni" if _vnni.HAVE_VNNI else "float32")
    assert DpuMachine(ODD, {}, fast=True).fast == "float32"
    assert DpuMachine(B4096, {}, fast=False).fast is False
    with pytest.raises(ValueError, match="fast must be True, False, 'float32' or 'vnni', not 'int8'"):
        DpuMachine(B4096, {}, fast="int8")
    with pytest.raises(ValueError, match="needs CP a multiple of 4 .*CP 10"):
        DpuMachine(ODD, {}, fast="vnni")


def test_kernel_choice():
    """Both kernels are reachable from the executor (the choice only trades speed: each is checked above)."""
    assert use_outer(64, 8) and use_outer(512, 64) and not use_outer(1024, 112) and not use_outer(512, 21)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 48), st.integers(1, 40), st.integers(1, 2), st.integers(1, 3), st.integers(1, 4),
       st.integers(1, 6), st.sampled_from([8, 16, 48]),
       st.sampled_from([(127, 127), (-128, -128), ("pos", "pos"), ("pos", "neg"), (None, None)]), st.integers(0, 99))
def test_dwconv_accumulators_exact(kh, kw, kd, sh, vpp, length, ic, vals, seed):
    """ALU dwconv accumulators against int64: windows up to 48·40·2 = 3,840 positions cross the 1,024-product
    float32 chunk of each channel lane."""
    sw = sh
    rows_in, cols_in = (vpp - 1) * sh + kh, (length - 1) * sw + kw
    rng = np.random.default_rng(seed)

    def fill(v, shape):
        if v is None:
            return rng.integers(-128, 128, shape)
        if v == "pos":
            return rng.integers(100, 128, shape)
        if v == "neg":
            return rng.integers(-128, -99, shape)
        return np.full(shape, v)
    X, W = fill(vals[0], (rows_in, cols_in * ic * kd)), fill(vals[1], (kh * kw * kd, ic))
    A = np.empty((vpp, length * ic), np.int64)
    dw_acc(X.astype(np.float32), W.astype(np.float32), A, vpp, length, ic, kh, kw, kd, sh, sw)
    ref = np.zeros((vpp, length, ic), np.int64)
    Xr = X.reshape(rows_in, cols_in, kd, ic)
    Wr = W.reshape(kh, kw, kd, ic)
    for ky in range(kh):
        for kx in range(kw):
            ref += np.einsum("hxdc,dc->hxc", Xr[ky:ky + (vpp - 1) * sh + 1:sh, kx:kx + (length - 1) * sw + 1:sw],
                             Wr[ky, kx]).astype(np.int64)
    np.testing.assert_array_equal(A, ref.reshape(vpp, -1))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 32), st.integers(1, 40), st.integers(1, 2), st.integers(1, 3), st.integers(0, 2),
       st.sampled_from([0, 6]), st.integers(0, 20), st.integers(0, 40), st.sampled_from([0, 1, 4]),
       st.integers(1, 4), st.integers(1, 6), st.integers(1, 3),
       st.tuples(*[st.sampled_from(["random", "min", "max", "extreme"])] * 3), st.integers(0, 2 ** 16),
       st.integers(0, 2047), st.integers(0, 2047))
def test_fast_dwconv_equals_scalar(kh, kw, kd, sh, soi, mode, sb, sc, act, vpp, length, cg, kinds, seed, a_in, a_w):
    """Whole ALU dwconv instructions (modes 0 and 6, B4096; windows up to 32·40·2 = 2,560 positions) with extreme
    operands and biases, every legal shift_bias, pads and channel_offset: the fast machine leaves the same banks
    as the scalar one."""
    t = B4096
    soi = min(soi, sh - 1)
    rows_in = (vpp - 1) * sh + kh
    if (soi + rows_in - 1) // sh >= 4 * t.pp:
        vpp = 1
    rng = np.random.default_rng(seed)
    nbytes = t.bank_depth * t.bank_width
    banks = np.empty((t.num_banks, nbytes), np.int8)
    banks[:t.num_img_banks] = _fill(rng, kinds[0], (t.num_img_banks, nbytes))
    banks[t.dwconvw_bank] = _fill(rng, kinds[1], nbytes)
    banks[t.bias_bank] = _fill(rng, kinds[2], nbytes)
    init = dict(kernel_h=kh, kernel_w=kw, exec_mode=mode, stride_h=sh, stride_w=sh, stride_offset_in=soi,
                length=length, channel_group=cg, channel_offset=int(rng.integers(0, 3)), stride_out=1,
                shift_cut=sc, shift_bias=sb, act_type=act, jump_read=cg * kd, jump_read_endl=int(rng.integers(1, 4000)),
                jump_write=cg, jump_write_endl=int(rng.integers(1, 4000)), jump_read_weights=cg * kd)
    f = dict(bank_id_in=0, bank_addr_in=a_in, bank_addr_in_1=(a_in + 700) % 2048, bank_addr_in_2=(a_in + 1400) % 2048,
             bank_addr_in_3=(a_in + 333) % 2048, bank_id_out=8, bank_addr_out=int(rng.integers(0, 2048)),
             valid_pixel_parallel=vpp, kernel_d=kd, bank_addr_weights=a_w, bank_addr_bias=int(rng.integers(0, 2048)),
             pad_top=int(rng.integers(0, min(15, kh - 1) + 1)), pad_left=int(rng.integers(0, min(15, kw - 1) + 1)),
             pad_bottom=int(rng.integers(0, kh)), pad_right=int(rng.integers(0, kw)))
    fast, slow = _both(t, banks, [ins("ALUINIT", **init), ins("ALU", **f), ins("END")])
    assert int((fast.banks != slow.banks).sum()) == 0
    assert fast.stats == slow.stats


def test_chunk_is_the_float32_exactness_limit():
    """Every partial sum of CHUNK int8 products is an integer of magnitude ≤ 2^24, exact in float32."""
    assert CHUNK * 128 * 128 <= 2 ** 24


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_layers(), st.lists(st.tuples(st.sampled_from(["LOAD", "CONV", "ELEW"]), st.integers(0, 3),
                                         st.one_of(st.integers(-1, 2), st.integers(-8, 40)), st.integers(1, 6)),
                               max_size=3), st.booleans())
def test_reused_input_tile_sees_every_write(layer, writers, self_overwrite):
    """sim._tilecache: CONVs with the same input (another output-channel group each) reuse the gathered tile
    unless a LOAD, CONV or ELEW in between wrote one of its lines. Writers aim at the tile's own input lines
    (pass base + offset, sometimes just outside), and the first CONV may overwrite its own input: the fast
    machine must still equal the scalar one byte for byte."""
    t, init, f, kinds, seed = layer
    rng = np.random.default_rng(seed)
    pp, depth = t.pp, t.bank_depth
    nbytes = depth * t.bank_width
    banks = _fill(rng, "random", (t.num_banks, nbytes))
    bases = [f["bank_addr_in"], f["bank_addr_in_1"], f["bank_addr_in_2"], f["bank_addr_in_3"]]
    g0 = (f["bank_id_in"] // pp) * pp
    first = dict(f)
    if self_overwrite:                                    # output rows land on the input lines
        first.update(bank_id_out=f["bank_id_in"], bank_addr_out=bases[0])
    instrs = [ins("CONVINIT", **init), ins("CONV", **first)]
    for kind, pas, off, n in writers:
        bank = g0 + int(rng.integers(0, pp))
        line = (bases[pas] + off) % depth
        if kind == "LOAD":
            instrs.append(ins("LOAD", bank_id=bank, bank_addr=line, length=n, channel=t.cp * n, jump_read=t.cp * n,
                              jump_write=n, reg_id=0, ddr_addr=0))
        elif kind == "ELEW":
            instrs += [ins("ELEWINIT", id=0, bank_id_in=g0 + pp % (2 * pp) if g0 == 0 else 0, bank_addr_in=7,
                           jump_read=1),
                       ins("ELEW", num=1, bank_id_out=bank, bank_addr_out=line, length=n, jump_write=1,
                           valid_pixel_parallel=1, channel_group=1)]
        else:
            instrs.append(ins("CONV", **dict(f, bank_id_out=bank, bank_addr_out=line, bank_addr_weights=5)))
    instrs.append(ins("CONV", **dict(f, bank_addr_weights=(f["bank_addr_weights"] + 3) % depth,
                                     bank_addr_bias=9, bank_addr_out=(f["bank_addr_out"] + 1) % depth)))
    instrs.append(ins("END"))
    p = to_arrays(instrs)
    out = []
    for fast in _modes(t):
        m = DpuMachine(t, {0: 4096}, init_fill="zero", fast=fast)
        m.banks[...] = banks
        m.write_ddr(0, 0, _fill(np.random.default_rng(seed + 1), "random", 4096))
        m.run(p)
        out.append(m)
    _same(out)


@pytest.mark.parametrize("writer, line", [
    ("LOAD", 12), ("LOAD", 14), ("LOAD", 9), ("LOAD_WRAP", 0), ("ELEW", 13), ("ELEW", 20), ("CONV", 10),
    ("ALU", 11), ("ALU", 30), ("SAVE", 12)])
def test_reused_tile_exact_writes(writer, line):
    """A 1x1 CONV reads bank 0 lines 10..13 (2046..2049 -> 2046, 2047, 0, 1 for LOAD_WRAP); one instruction (or,
    for CONV, that CONV itself) writes one line in or next to that range, then a CONV with the same input and
    other weights runs. Writes inside must
    drop the cached tile, writes outside (and SAVEs, which only read) may keep it: fast == scalar either way."""
    t = B4096
    base = 2046 if writer == "LOAD_WRAP" else 10
    init = dict(kernel_h=1, kernel_w=1, stride_h=1, stride_w=1, valid_pixel_parallel=1, jump_read=1,
                jump_read_endl=1, jump_write=1, jump_write_endl=1, stride_out=1, shift_cut=6)
    f = dict(bank_id_in=0, bank_addr_in=base, channel_group=1, length=4, bank_addr_weights=0, bank_id_out=8,
             bank_addr_out=0, pad_bottom=0, pad_right=0)
    w = {"LOAD": [ins("LOAD", bank_id=0, bank_addr=line, length=1, channel=16, jump_read=16, reg_id=0, ddr_addr=0)],
         "LOAD_WRAP": [ins("LOAD", bank_id=0, bank_addr=line, length=1, channel=16, jump_read=16, reg_id=0)],
         "ELEW": [ins("ELEWINIT", id=0, bank_id_in=9, bank_addr_in=50, jump_read=1),
                  ins("ELEW", num=1, bank_id_out=0, bank_addr_out=line, length=1, jump_write=1, shift_write=1)],
         "CONV": [],                                    # the first CONV itself writes into its input
         "ALU": [ins("ALUINIT", exec_mode=3, length=1, channel_group=1, jump_read=1, jump_write=1),
                 ins("ALU", bank_id_in=9, bank_addr_in=60, bank_id_out=0, bank_addr_out=line)],
         "SAVE": [ins("SAVE", bank_id=0, bank_addr=line, length=1, channel=16, reg_id=0, ddr_addr=64)]}[writer]
    first = dict(f, bank_id_out=0, bank_addr_out=line) if writer == "CONV" else f
    instrs = [ins("CONVINIT", **init), ins("CONV", **first), *w,
              ins("CONV", **dict(f, bank_addr_weights=1, bank_addr_bias=1, bank_addr_out=4)), ins("END")]
    out = []
    for fast in _modes(t):
        m = DpuMachine(t, {0: 4096}, init_fill="random", seed=4, fast=fast)
        m.write_ddr(0, 0, np.arange(4096).astype(np.int8))
        m.run(to_arrays(instrs))
        out.append(m)
    _same(out)


@pytest.mark.parametrize("wbank, line, base", [
    (0, 20, 20), (15, 21, 20), (7, 19, 20), (3, 22, 20), (-1, 20, 20), (5, 0, 2047), (5, 2047, 2046), (9, 1, 0),
    (2, 2047, 0)])
def test_weight_mirror_sees_every_load(wbank, line, base):
    """sim._weightcache: a CONV (1x1, 32 input channels: the outer-product kernel, weight lines base, base+1) runs
    twice with the same weights, a LOAD of new bytes into CONV weight bank `wbank` (-1: an image bank) at `line`
    in between. Lines of the range must be converted again, others may stay; 2047 wraps the range around the bank
    end (2,048 lines: a fresh copy): fast == scalar either way, and the second CONV's output must change when the
    LOAD hit."""
    t = B4096
    init = dict(kernel_h=1, kernel_w=1, stride_h=1, stride_w=1, valid_pixel_parallel=8, jump_read=2,
                jump_read_endl=2, jump_write=1, jump_write_endl=1, stride_out=1, shift_cut=4)
    f = dict(bank_id_in=0, bank_addr_in=100, channel_group=2, length=8, bank_addr_weights=base, bank_id_out=8,
             bank_addr_out=0, pad_bottom=0, pad_right=0)
    bank = t.convw_base + wbank if wbank >= 0 else 1
    instrs = [ins("CONVINIT", **init), ins("CONV", **f),
              ins("LOAD", bank_id=bank, bank_addr=line, length=1, channel=16, jump_read=16, reg_id=0, ddr_addr=0),
              ins("CONV", **dict(f, bank_addr_out=64)), ins("END")]
    assert _fastmac.use_outer(2 * t.cp, 8 * 8)
    out = []
    for fast in _modes(t):
        m = DpuMachine(t, {0: 4096}, init_fill="random", seed=5, fast=fast)
        m.write_ddr(0, 0, np.full(4096, 77, np.int8))
        m.run(to_arrays(instrs))
        out.append(m)
    _same(out)
    assert t.bank_depth == 2048
    hit = wbank >= 0 and line in (base, (base + 1) % t.bank_depth)
    first, second = out[-1].banks[8:16, :8 * 16], out[-1].banks[8:16, 64 * 16:72 * 16]   # 8 rows x 8 pixels
    assert (first != second).any() == hit


def test_longest_reduction_all_extremes():
    """One 16x16 kernel over 512 input channels (131,072 products per output, 128 chunks) with every operand
    -128: the accumulator 2^31 per output is far beyond float32 and exact in both paths."""
    t = B4096
    nbytes = t.bank_depth * t.bank_width
    banks = np.full((t.num_banks, nbytes), -128, np.int8)
    init = dict(kernel_h=16, kernel_w=16, stride_h=1, stride_w=1, valid_pixel_parallel=1, jump_read=32,
                jump_read_endl=32, jump_write=1, jump_write_endl=1, stride_out=1, shift_bias=20, shift_cut=30,
                act_type=0)
    f = dict(bank_id_in=0, bank_addr_in=0, bank_addr_in_1=0, bank_addr_in_2=0, bank_addr_in_3=0, channel_group=32,
             length=2, bank_addr_weights=0, bank_addr_bias=0, bank_id_out=8, bank_addr_out=0, pad_bottom=15,
             pad_right=15)
    fast, slow = _both(t, banks, [ins("CONVINIT", **init), ins("CONV", **f), ins("END")])
    assert int((fast.banks != slow.banks).sum()) == 0
    acc = 16 * 16 * 512 * 128 * 128                      # 2^31, exact integer reference
    a = 2 * acc + (-128) * 2 ** 20
    expect = (a + 2 ** 30) >> 31                          # rhu(a / 2^(shift_cut+1)) = rhu(1.9375) = 2
    assert expect == 2
    assert (fast.banks[8, :2 * 16] == expect).all()       # both output pixels, lines 0 and 1 of bank 8


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10 ** 6), st.sampled_from(["B512", "B1152", "B4096"]))
def test_fast_equals_scalar_on_random_programs(seed, key):
    t = get_target(f"DPUCZDX8G_ISA1_{key}")
    g = random_program(t, n=80, seed=seed, mix={"LOAD": 0.3, "SAVE": 0.1, "CONV": 0.4, "ALU": 0.1, "ELEW": 0.1})
    ms = []
    for fast in _modes(t):
        m = g.machine()
        m.fast = fast
        m.run(g.arrays)
        ms.append(m)
    _same(ms)
