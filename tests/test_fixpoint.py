"""compiler.fixpoint against independent references: the golden's own derivation (compiler.ref, which keeps
it), the spec's arithmetic written out here with Python integers and Fractions, and hand-computed values."""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from opendpu.compiler import fixpoint as F
from opendpu.compiler.ref import avg_pool_factor as golden_avg_pool_factor
from opendpu.compiler.ref import dpu_round as golden_dpu_round
from opendpu.compiler.ref import evaluate
from opendpu.compiler.ref import ops as golden_ops

FP = range(-8, 17)          # the fix points the exhaustive checks sweep (real models: about -4..12)


def rhu(num: int, k: int) -> int:
    """floor(num / 2^k + 1/2) for integers (spec §6.1 integer form), any k."""
    return (num + (1 << (k - 1))) >> k if k > 0 else num << -k


def sat8(v: int) -> int:
    return max(-128, min(127, v))


def conv_attrs(nonlinear="NONE", **extra):
    a = {"kernel": [1, 1], "stride": [1, 1], "dilation": [1, 1], "pad": [0, 0, 0, 0], "nonlinear": nonlinear,
         "pad_mode": "FLOOR", "group": 1}
    a.update(extra)
    return a


# --------------------------------------------------------------------------------------------------
# rounding
# --------------------------------------------------------------------------------------------------

TIES = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]


@pytest.mark.parametrize("mode, want", [
    ("half_even", [-2, -2, 0, 0, 2, 2]),
    ("half_up", [-2, -1, 0, 1, 2, 3]),       # the DPU (spec §6.1: 2.5 -> 3, -2.5 -> -2)
    ("half_down", [-2, -1, 0, 0, 1, 2]),
    ("std_round", [-3, -2, -1, 1, 2, 3]),
    ("floor", [-3, -2, -1, 0, 1, 2]),
])
def test_round_modes_on_ties(mode, want):
    r = F.round_values(np.array(TIES), mode)
    assert r.dtype == np.float64 and r.tolist() == want
    assert not np.signbit(r[r == 0]).any()                  # no -0.0


def test_dpu_round_mode_is_half_up_and_unknown_modes_fail():
    assert F.DPU_ROUND_MODE == "half_up"
    assert F.round_values(np.array(TIES)).tolist() == [-2, -1, 0, 1, 2, 3]   # the default mode
    with pytest.raises(F.FixPointError, match="unknown round mode 'banker'"):
        F.round_values([1.0], "banker")


def _exact_round(x: float, mode: str) -> int:
    """Round x = n/d exactly with integers: x = q + r/d, 0 <= r < d, then each mode's tie rule."""
    n, d = x.as_integer_ratio()
    q, r = divmod(n, d)
    if mode == "floor":
        return q
    if 2 * r != d:
        return q + (2 * r > d)
    return {"half_even": q + (q & 1), "half_up": q + 1, "half_down": q + (x < 0), "std_round": q + (x > 0)}[mode]


_near_ties = st.builds(lambda k, d: math.nextafter(k + 0.5, math.inf if d > 0 else -math.inf) if d else k + 0.5,
                       st.integers(-300, 300), st.sampled_from([-1, 0, 1]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e6, 1e6), _near_ties), min_size=1, max_size=20),
       st.sampled_from(F.ROUND_MODES))
def test_round_values_exact(xs, mode):
    assert F.round_values(np.array(xs), mode).tolist() == [_exact_round(x, mode) for x in xs]


SPECIAL = [0.49999999999999994, -0.49999999999999994, 0.5, -0.5, 126.5, 127.5, -128.5, -128.50000000000003,
           1e300, -1e300, np.inf, -np.inf, np.nan, 2.0 ** 60, -(2.0 ** 53) - 1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-300, 300), _near_ties, st.integers(-300, 300).map(lambda k: k / 4)),
                min_size=1, max_size=32))
def test_dpu_round_agrees_with_golden(xs):
    v = np.array(xs + SPECIAL, np.float64)
    got = F.dpu_round(v)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, golden_dpu_round(v))


def test_dpu_round_agrees_with_golden_integer_form():
    # golden dpu_round(n, shift) rounds n / 2^shift exactly; ldexp is exact for these n and shifts
    rng = np.random.default_rng(5)
    n = np.concatenate([rng.integers(-(1 << 40), 1 << 40, 4000), np.arange(-1024, 1025)])
    for shift in range(-8, 31):
        np.testing.assert_array_equal(F.dpu_round(np.ldexp(n.astype(np.float64), -shift)),
                                      golden_dpu_round(n, shift), err_msg=f"shift {shift}")


def test_dpu_quantize_hand_values():
    # fix point 2: x*4 = 1.2 -> 1, 2.5 -> 3, -2.5 -> -2, -1.5 -> -1, 1000 -> 127, -1000 -> -128
    x = np.array([0.3, 0.625, -0.625, -0.375, 250.0, -250.0], np.float32)
    assert F.dpu_quantize(x, 2).tolist() == [1, 3, -2, -1, 127, -128]
    # fix point -1: x/2 = 2.5 -> 3; the one double below 1/2 that floor(v + 0.5) rounds up stays 0
    assert F.dpu_quantize(np.array([5.0, 2 * 0.49999999999999994]), -1).tolist() == [3, 0]


def test_runner_input_quantization_uses_it():
    from opendpu.runtime.runner import dpu_round_quantize
    x = np.array([0.3, 0.625, -0.625, -0.375, 250.0, -250.0, np.nan])
    assert dpu_round_quantize(x, 2).tolist() == [1, 3, -2, -1, 127, -128, 0]


@pytest.mark.parametrize("xir", sorted(F.XIR_ROUND_MODES))
def test_xir_round_mode_names_match_the_golden(xir):
    rng = np.random.default_rng(1)
    x = np.concatenate([np.array(TIES) / 4, rng.integers(-600, 600, 500) / 8, rng.normal(0, 20, 500)])
    for fp in (-1, 0, 2, 3):
        y = evaluate("float2fix", [x], {"fix_point": fp, "bit_width": 8, "if_signed": True, "round_mode": xir},
                     [None], fp, x.shape)
        want = np.clip(F.round_values(np.ldexp(x, fp), F.XIR_ROUND_MODES[xir]), -128, 127)
        np.testing.assert_array_equal(y, want)


# --------------------------------------------------------------------------------------------------
# conv / depthwise shifts
# --------------------------------------------------------------------------------------------------

def test_conv_shifts_agree_with_the_golden_exhaustively():
    """Every (fp_in, fp_w, fp_out, fp_bias) in -8..16: the golden's (sc, sb_eff) is (shift_cut,
    shift_bias - 1), and the checked form rejects exactly the combinations outside the fields."""
    ctx_of = golden_ops._Ctx
    n = 0
    for fi, fw, fo, fb in itertools.product(FP, FP, FP, FP):
        sc, sb_eff, fp_out = golden_ops._conv_shifts(ctx_of("conv2d-fix", "", [], {}, [fi, fw, fb], fo, ()), True)
        f_sc, f_sb = F.conv_shifts(fi, fw, fo, fb, check=False)
        assert (f_sc, f_sb) == (sc, sb_eff + 1) and fp_out == fo, (fi, fw, fo, fb)
        legal = 0 <= fi + fw - fo <= 63 and fi + fw - fb + 1 <= 20
        if legal:
            assert F.conv_shifts(fi, fw, fo, fb) == (f_sc, f_sb)
            n += 1
        else:
            with pytest.raises(F.FixPointError):
                F.conv_shifts(fi, fw, fo, fb)
    assert n > 100_000
    # without a bias: no shift_bias (the golden then ignores it)
    assert F.conv_shifts(3, 7, 6) == (4, None)
    assert golden_ops._conv_shifts(ctx_of("conv2d-fix", "", [], {}, [3, 7], 6, ()), False)[0] == 4


def test_golden_bias_limit_implies_field_limit():
    """Only fi + fw - fb matters: wherever the golden refuses the bias shift (sb_eff > 50), the DPU field check
    (shift_bias <= 20) refuses it too; checked over every difference, with both sides counted."""
    refused = 0
    for d in range(-70, 71):
        fi, fw, fb = d, 0, 0
        try:
            golden_ops._conv_shifts(golden_ops._Ctx("conv2d-fix", "", [], {}, [fi, fw, fb], 0, ()), True)
        except golden_ops.RefError:
            refused += 1
            with pytest.raises(F.FixPointError, match="shift_bias"):
                F.shift_bias(fi, fw, fb)
    assert refused == 70 - 50                      # d = 51..70: the golden's limit, hand-counted


def test_shift_range_checks_hand_values():
    assert F.shift_cut(4, 6, 3) == 7
    assert F.shift_cut(0, 0, -63) == 63
    for fo in (1, -64):
        with pytest.raises(F.FixPointError, match="shift_cut"):
            F.shift_cut(0, 0, fo)
    assert F.shift_cut(0, 0, 1, check=False) == -1
    assert F.shift_bias(3, 5, 9) == 0                     # fp_bias = fp_in + fp_w + 1
    assert F.shift_bias(3, 5, -11) == 20
    with pytest.raises(F.FixPointError, match="shift_bias .* 21 is above 20"):
        F.shift_bias(3, 5, -12)
    assert F.shift_bias(3, 5, -12, check=False) == 21
    # spec §7.2 C1, conv2_1 of detector A: fp_in -2, fp_w 7, fp_bias 7 -> sb + 1 = -1, encoded 0
    assert F.shift_bias(-2, 7, 7) == 0
    assert F.bias_fix_point_range(-2, 7) == (-14, 6)      # shift_bias 20 .. 0
    assert F.conv_fp_out_max(-2, 7) == 5                  # shift_cut 0


@settings(max_examples=150, deadline=None)
@given(fi=st.integers(-8, 16), fw=st.integers(-8, 16), sc=st.integers(0, 63), sb=st.integers(-6, 19),
       nl=st.sampled_from(["NONE", "RELU", "LEAKYRELU"]), depthwise=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_fields_reproduce_the_golden_conv(fi, fw, sc, sb, nl, depthwise, seed):
    """The golden conv / depthwise conv equals the DPU arithmetic of spec §6.4 / §6.8 mode 0, written out
    here with Python integers, run with fixpoint's shift_cut and shift_bias (C1 clamp included)."""
    fo, fb = fi + fw - sc, fi + fw - sb
    f_sc, f_sb = F.conv_shifts(fi, fw, fo, fb)
    rng = np.random.default_rng(seed)
    ch = 3
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 256, 1).repeat(ch, axis=3) if depthwise else \
        np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 256, 1)
    w = rng.integers(-128, 128, (1, 1, 1, ch) if depthwise else (ch, 1, 1, 1)).astype(np.int8)
    b = rng.integers(-128, 128, ch).astype(np.int8)
    extra = {"LEAKYRELU_alpha": float(F.LEAKY_ALPHA)} if nl == "LEAKYRELU" else {}
    op = "depthwise-conv2d-fix" if depthwise else "conv2d-fix"
    y = evaluate(op, [x, w, b], conv_attrs(nl, **extra), [fi, fw, fb], fo, (1, 1, 256, ch))
    k = f_sc + 1
    for c in range(ch):
        wc = int(w.reshape(-1)[c])
        for j, xv in enumerate(range(-128, 128)):
            a = 2 * xv * wc + (int(b[c]) << f_sb)
            if nl == "LEAKYRELU" and a < 0:
                want = rhu(26 * a, k + 8)                   # §6.1: slope 26/256
            else:
                want = rhu(a, k)
                if nl == "RELU":
                    want = max(want, 0)
            assert int(y[0, 0, j, c]) == sat8(want), (c, xv)


# --------------------------------------------------------------------------------------------------
# pooling and eltwise
# --------------------------------------------------------------------------------------------------

def test_avg_pool_factor_spec_table_and_hand_values():
    # §7.4 table
    assert {k: F.avg_pool_factor(*k) for k in [(3, 3), (5, 5), (6, 6), (7, 7), (14, 14)]} == \
        {(3, 3): (7, 6), (5, 5): (10, 8), (6, 6): (7, 8), (7, 7): (21, 10), (14, 14): (21, 12)}
    assert F.avg_pool_factor(1, 1) == (1, 0)              # 1/1 exactly at s = 0
    assert F.avg_pool_factor(2, 2) == (1, 2)              # powers of two are exact
    assert F.avg_pool_factor(16, 16) == (1, 8)
    # A = 3: s < ceil(log2(384)) = 9; s = 8: 256/3 = 85.3 -> 85, error 1/768; s = 7: 43/128 is worse (1/384)
    assert F.avg_pool_factor(1, 3) == (85, 8)
    # A = 5: 256/5 = 51.2 -> 51 (error 1/1280); s = 9 gives 102/512, the same error, not strictly smaller
    assert F.avg_pool_factor(5, 1) == (51, 8)
    # A = 7: s < 10; 512/7 = 73.14 -> 73, error |73/512 - 1/7| = 1/3584
    assert F.avg_pool_factor(1, 7) == (73, 9)
    with pytest.raises(F.FixPointError):
        F.avg_pool_factor(0, 3)


def test_avg_pool_factor_agrees_with_the_golden():
    for kh in range(1, 17):
        for kw in range(1, 17):
            assert F.avg_pool_factor(kh, kw) == golden_avg_pool_factor(kh, kw), (kh, kw)


def test_pool_and_eltwise_shift_codes():
    # §7.4 [validated]: avg 7x7 (M 10) with fix-point changes +1, +2 -> shift_cut codes 17, 16
    assert [F.pool_shift_cut(d - 10) for d in (1, 2)] == [17, 16]
    assert [F.pool_shift_cut(e) for e in (0, 7, -1, -55)] == [0, 7, 9, 63]
    for e in (8, -56):
        with pytest.raises(F.FixPointError):
            F.pool_shift_cut(e)
    # §7.5 / §7.8 [validated]: shift_write codes 1, 17, 18 for d = 1, -1, -2
    assert [F.elew_shift_write(d) for d in (0, 1, -1, -2, 15, -15)] == [0, 1, 17, 18, 15, 31]
    for d in (16, -16):
        with pytest.raises(F.FixPointError):
            F.elew_shift_write(d)
    assert F.elew_fp_out_max(3) == 18


# --------------------------------------------------------------------------------------------------
# hard-sigmoid, leaky ReLU, PReLU
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fi, fo", [(2, 7), (4, 7), (0, 7), (6, 5), (3, 3)])
def test_hsigmoid_fields_reproduce_the_golden(fi, fo):
    """§6.8 mode 7 with fixpoint's fields, by hand, equals the golden hard-sigmoid-fix, with the fields as
    attributes and without them (the golden's own default derivation)."""
    hin, shs = F.hsigmoid_fields(fi, fo)
    assert (hin, shs) == (fi, 14 + fi - fo)
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 1, 256)
    want = [sat8(rhu(min(1 << 32, max(0, v * 2731 + (3 * 2731 << hin))), shs)) for v in range(-128, 128)]
    for attrs in ({"hsigmoid_in": hin, "shift_hsigmoid": shs}, {}):
        y = evaluate("hard-sigmoid-fix", [x], attrs, [fi], fo, x.shape)
        assert y.reshape(-1).tolist() == want


def test_hsigmoid_hand_values_and_ranges():
    assert F.hsigmoid_fields(2, 7) == (2, 9)            # §7.6 [validated]: tf2_custom_op
    assert F.HSIGMOID_SLOPE == 2731 / 16384 and abs(F.HSIGMOID_SLOPE - 1 / 6) < 1e-4
    for fi, fo in ((-1, 7), (21, 30), (0, 15)):
        with pytest.raises(F.FixPointError):
            F.hsigmoid_fields(fi, fo)
    assert F.hsigmoid_fields(-1, 7, check=False) == (-1, 6)


def test_slope_encoding_hand_values():
    assert F.LEAKY_ALPHA == Fraction(26, 256)
    assert F.slope_encoding(26 / 256) == (13, 7)
    assert F.slope_encoding(-0.25) == (-1, 2)
    assert F.slope_encoding(0.0) == (0, 0)
    assert F.slope_encoding(Fraction(-128, 1)) == (-128, 0)
    m, s = F.slope_encoding(0.1)                          # the double nearest 0.1 is m/2^55
    assert (m, s) == (3602879701896397, 55) and not F.slope_fits_alu(m, s)
    assert F.slope_fits_alu(13, 7) and F.slope_fits_alu(-128, 0) and F.slope_fits_alu(127, 31)
    assert not F.slope_fits_alu(128, 0) and not F.slope_fits_alu(-129, 0) and not F.slope_fits_alu(1, 32)
    with pytest.raises(F.FixPointError, match="not m/2"):
        F.slope_encoding(Fraction(1, 3))
    assert [F.alu_shift_code(r) for r in (0, 3, 31, -1, -31)] == [32, 35, 63, 1, 31]
    for r in (32, -32):
        with pytest.raises(F.FixPointError):
            F.alu_shift_code(r)


def _alu_prelu(x: int, slope: int, code_p: int, code_n: int) -> int:
    """Spec §6.8 prelu / leakyrelu of one value, with the shift codes decoded as the ALU does."""
    def dec(code):
        return code - 32 if code >= 32 else -code
    t = x * slope if x < 0 else x
    return sat8(rhu(t, dec(code_n) if t < 0 else dec(code_p)))


@pytest.mark.parametrize("fi, fo", [(4, 4), (4, 5), (3, 1), (0, 6), (7, 2)])
def test_prelu_codes_reproduce_the_golden(fi, fo):
    """ALU leaky_relu with multi_factor prelu_in and fixpoint's shift codes equals the golden eltwise LEAKY-RELU;
    ALU prelu with per-channel int8 slopes >= 0 equals the golden PRELU (for a negative slope the two pick
    different shifts, see fixpoint.prelu_shift_codes)."""
    x = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 1, 256)
    p, n = F.prelu_shift_codes(8, fi, fo)
    y = evaluate("eltwise-fix", [x], {"type": "LEAKY-RELU", "prelu_in": 26, "prelu_shift": 8}, [fi], fo, x.shape)
    assert y.reshape(-1).tolist() == [_alu_prelu(v, 26, p, n) for v in range(-128, 128)]
    alpha = np.random.default_rng(fi * 16 + fo).integers(0, 128, 8).astype(np.int8)
    xc = np.arange(-128, 128, dtype=np.int8).reshape(1, 1, 32, 8)
    p, n = F.prelu_shift_codes(6, fi, fo)
    y = evaluate("eltwise-fix", [xc, alpha], {"type": "PRELU", "prelu_shift": 6}, [fi, 6], fo, xc.shape)
    want = [[_alu_prelu(int(v), int(alpha[c]), p, n) for c, v in enumerate(row)] for row in xc.reshape(32, 8)]
    assert y.reshape(32, 8).tolist() == want


def test_dequantize_hand_values():
    """fix2float: q * 2^-fix_point, hand-computed, including a negative fix point."""
    from opendpu.compiler.fixpoint import dequantize
    got = dequantize(np.array([-128, 1, 127], np.int8), 3)
    assert got.dtype == np.float32 and got.tolist() == [-16.0, 0.125, 15.875]
    assert dequantize(np.array([-3, 5], np.int8), -2).tolist() == [-12.0, 20.0]
