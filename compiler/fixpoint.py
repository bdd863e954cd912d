"""The fix-point service: DPU rounding and the instruction fields that follow from tensor fix points.

One place for the arithmetic that the quantizer, the profiler, the runtime and the compiler's instruction
selector must agree on (spec §6.1, §6.4, §6.7, §6.8, §7). The golden (`compiler.ref`) keeps its own,
independent derivation and tests/test_fixpoint.py checks that the two agree; this module never imports
the golden and the golden never imports it. Imports: numpy, the standard library and `opendpu.isa` only.

Rounding (DECISION: one function, the vai_q mode names)
    `round_values(x, mode)` is exact for every finite float64 and knows five modes, named as in vai_q
    (nndct ``fix_neuron`` methods), the names the quantizer's config and quant_info already use:
        half_even  ties to the even integer              (nndct -1; XIR PY3_ROUND)
        half_up    ties toward +inf: -2.5 -> -2, 2.5 -> 3 (nndct 2; XIR DPU_ROUND; spec §6.1 dpu_round)
        half_down  ties toward zero: -2.5 -> -2, 2.5 -> 2 (nndct 6)
        std_round  ties away from zero: -2.5 -> -3        (nndct 3; C round; XIR STD_ROUND as the golden
                   reads it. Spec §7.1 calls STD_ROUND half-to-even; no real model uses it.)
        floor      toward -inf                            (nndct 4)
    The DPU rounds ``half_up`` (`DPU_ROUND_MODE`); `dpu_round` adds the int8 saturation of §6.1 and
    `dpu_quantize` the scaling by 2^fix_point. `XIR_ROUND_MODES` maps the XIR ``round_mode`` attribute
    values to these names.

Conv / depthwise shifts (§6.4, §7.2, §7.3)
    The DPU computes ``(2*acc + bias*2^shift_bias) / 2^(shift_cut+1)`` with
        shift_cut  = fp_in + fp_w - fp_out                 field 0..63
        shift_bias = max(0, fp_in + fp_w - fp_bias + 1)    field 0..20 (the executor's limit)
    The ``max(0, .)`` is correction C1: AMD's compiler encodes a negative value as 0 and leaves the bias
    bytes alone, so the DPU then weights the bias by 2^-(fp_in+fp_w+1) instead of 2^-fp_bias.
    Relation to the other forms of the same rule:
      * the golden computes the exponent ``sb_eff = max(sb, -1)``, sb = fp_in + fp_w - fp_bias, and forms
        ``2*acc + bias*2^(sb_eff+1)``: sb_eff + 1 == shift_bias for every fix point (C1 either way);
      * the profiler matches these *field values* against CONVINIT/ALUINIT, so it needs
        ``max(0, sb + 1)`` unchecked (``check=False``): a layer whose fields are out of range still gets a
        signature (it just matches no instruction);
      * the quantizer never produces the clamp: it picks fp_bias in `bias_fix_point_range`, where
        0 <= shift_bias <= 20 holds without it, and keeps fp_out <= `conv_fp_out_max` (shift_cut >= 0).

Other encodings: avg-pool divisor (N, M) and the pool shift_cut code (§7.4), ELEW shift_write (§7.5),
hard-sigmoid fields (§7.6), leaky/PReLU slopes and ALU shift codes (§6.1, §6.8, §7.7).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.fields import FIELDS

__all__ = [
    "FixPointError", "ROUND_MODES", "DPU_ROUND_MODE", "XIR_ROUND_MODES", "round_values", "dpu_round", "dpu_quantize",
    "SHIFT_CUT_MAX", "SHIFT_BIAS_MAX", "shift_cut", "shift_bias", "conv_shifts", "conv_fp_out_max",
    "bias_fix_point_range", "AVG_POOL_TABLE", "avg_pool_factor", "pool_shift_cut", "ELEW_SHIFT_WRITE_MAX",
    "elew_shift_write", "elew_fp_out_max", "HSIGMOID_MUL", "HSIGMOID_SHIFT", "HSIGMOID_SLOPE", "hsigmoid_fields",
    "LEAKY_ALPHA", "MULTI_FACTOR_MIN", "MULTI_FACTOR_MAX", "PRELU_SHIFT_MAX", "slope_encoding", "slope_fits_alu",
    "alu_shift_code", "prelu_shift_codes",
]


class FixPointError(OpenDpuError, ValueError):
    """A fix-point combination has no legal field encoding; the message names the field and the rule."""


def _field(instr: str, name: str):
    """An instruction field of the spec §4.3 tables (isa.fields)."""
    return next(f for f in FIELDS[instr] if f.name == name)


# --------------------------------------------------------------------------------------------------
# rounding (§6.1, §7.1)
# --------------------------------------------------------------------------------------------------

ROUND_MODES = ("half_even", "half_up", "half_down", "std_round", "floor")   # order = quant.calib kernel codes
DPU_ROUND_MODE = "half_up"
XIR_ROUND_MODES = {"DPU_ROUND": "half_up", "PY3_ROUND": "half_even", "STD_ROUND": "std_round"}


def round_values(x, mode: str = DPU_ROUND_MODE) -> np.ndarray:
    """Round to integers with one of ROUND_MODES; float64 result, exact for every finite input (no -0.0)."""
    if mode not in ROUND_MODES:
        raise FixPointError(f"unknown round mode {mode!r}; expected one of {ROUND_MODES}")
    x = np.asarray(x, dtype=np.float64)
    if mode == "half_even":
        r = np.rint(x)
    elif mode == "floor":
        r = np.floor(x)
    else:
        a = np.abs(x)
        fa = np.floor(a)
        ra = a - fa                       # exact for a >= 0 (a < 1, or Sterbenz)
        up = fa + (ra >= 0.5)             # |x| rounded, ties away from zero
        down = fa + (ra > 0.5)            # |x| rounded, ties toward zero
        neg = x < 0
        if mode == "std_round":
            r = np.where(neg, -up, up)
        elif mode == "half_down":
            r = np.where(neg, -down, down)
        else:                             # half_up: ties toward +inf
            r = np.where(neg, -down, up)
    return r + 0.0                        # no negative zeros


def dpu_round(v) -> np.ndarray:
    """§6.1 dpu_round of a float array: round half toward +inf, saturate to int8 (NaN -> 0, +-inf saturate)."""
    v = np.asarray(v, dtype=np.float64)
    v = np.clip(np.where(np.isnan(v), 0.0, v), -129.0, 128.0)     # saturates alike, keeps inf out
    return np.clip(round_values(v, DPU_ROUND_MODE), -128, 127).astype(np.int8)


def dpu_quantize(x, fix_point: int) -> np.ndarray:
    """float -> int8 as the DPU's host side quantizes an input: dpu_round(x * 2^fix_point) (§7.1)."""
    return dpu_round(np.ldexp(np.asarray(x, dtype=np.float64), int(fix_point)))


def dequantize(q, fix_point: int) -> np.ndarray:
    """int8 fixed point -> float32 real values q * 2^-fix_point (fix2float, §7.1); exact in float32."""
    return np.ldexp(np.asarray(q, dtype=np.float32), -int(fix_point))


# --------------------------------------------------------------------------------------------------
# conv / depthwise shifts (§6.4, §7.2, §7.3)
# --------------------------------------------------------------------------------------------------

SHIFT_CUT_MAX = _field("CONVINIT", "shift_cut").hi       # 63 (6-bit field; ALUINIT's is the same)
SHIFT_BIAS_MAX = 20        # §6.4 / §6.8: the executor rejects CONVINIT/ALUINIT shift_bias > 20

assert SHIFT_CUT_MAX == _field("ALUINIT", "shift_cut").hi == 63
assert SHIFT_BIAS_MAX <= min(_field("CONVINIT", "shift_bias").hi, _field("ALUINIT", "shift_bias").hi)


def shift_cut(fp_in: int, fp_w: int, fp_out: int, *, check: bool = True) -> int:
    """CONVINIT / ALUINIT dwconv shift_cut = fp_in + fp_w - fp_out; with `check`, FixPointError outside 0..63."""
    sc = int(fp_in) + int(fp_w) - int(fp_out)
    if check and not 0 <= sc <= SHIFT_CUT_MAX:
        raise FixPointError(f"shift_cut = fp_in + fp_w - fp_out = {fp_in} + {fp_w} - {fp_out} = {sc} is "
                            f"outside 0..{SHIFT_CUT_MAX}")
    return sc


def shift_bias(fp_in: int, fp_w: int, fp_bias: int, *, check: bool = True) -> int:
    """shift_bias = max(0, fp_in + fp_w - fp_bias + 1) (the +1 of §7.2, clamp C1); with `check`,
    FixPointError above 20."""
    sb = max(0, int(fp_in) + int(fp_w) - int(fp_bias) + 1)
    if check and sb > SHIFT_BIAS_MAX:
        raise FixPointError(f"shift_bias = fp_in + fp_w - fp_bias + 1 = {fp_in} + {fp_w} - {fp_bias} + 1 = {sb} "
                            f"is above {SHIFT_BIAS_MAX}")
    return sb


def conv_shifts(fp_in: int, fp_w: int, fp_out: int, fp_bias: int | None = None, *,
                check: bool = True) -> tuple[int, int | None]:
    """(shift_cut, shift_bias) of a conv-like op; shift_bias is None without a bias."""
    sb = None if fp_bias is None else shift_bias(fp_in, fp_w, fp_bias, check=check)
    return shift_cut(fp_in, fp_w, fp_out, check=check), sb


def conv_fp_out_max(fp_in: int, fp_w: int) -> int:
    """The largest output fix point of a conv-like op: shift_cut >= 0."""
    return int(fp_in) + int(fp_w)


def bias_fix_point_range(fp_in: int, fp_w: int) -> tuple[int, int]:
    """(lo, hi): the bias fix points with 0 <= fp_in + fp_w - fp_bias + 1 <= 20, i.e. a legal shift_bias
    that needs no C1 clamp (fp_bias may exceed fp_in + fp_w by at most 1)."""
    top = int(fp_in) + int(fp_w) + 1
    return top - SHIFT_BIAS_MAX, top


# --------------------------------------------------------------------------------------------------
# pooling (§7.4)
# --------------------------------------------------------------------------------------------------

AVG_POOL_TABLE = {(3, 3): (7, 6), (5, 5): (10, 8), (6, 6): (7, 8), (7, 7): (21, 10), (14, 14): (21, 12)}


def avg_pool_factor(kh: int, kw: int) -> tuple[int, int]:
    """(N, M) with N/2^M approximating 1/(kh*kw): the §7.4 table, else the first s with the strictly
    smallest |N_s/2^s - 1/A|, N_s = 2^s/A rounded half away from zero, s < ceil(log2(A*128))."""
    if (kh, kw) in AVG_POOL_TABLE:
        return AVG_POOL_TABLE[(kh, kw)]
    a = int(kh) * int(kw)
    if a <= 0:
        raise FixPointError(f"bad avg-pool kernel {kh}x{kw}")
    # |N/2^s - 1/A| = |N*A - 2^s| / (A * 2^s); the common 1/A drops out, so compare e/2^s in integers
    best_e, best_s, best = a, 0, (0, 0)          # the initial error 1 = A / (A * 2^0)
    for s in range((a * 128 - 1).bit_length()):
        n = ((1 << (s + 1)) + a) // (2 * a)     # floor(2^s/A + 1/2): half away from zero for 2^s/A > 0
        e = abs(n * a - (1 << s))
        if e << best_s < best_e << s:
            best_e, best_s, best = e, s, (n, s)
    return best


POOL_EXP_MAX = 7             # largest left-shift exponent of an ALU pool shift_cut code (codes 0..7)


def pool_shift_cut(e: int) -> int:
    """ALU pool shift_cut code of the exponent e (multiply by 2^e): e if 0 <= e <= 7, else 8 - e (§7.4, §6.8).
    MAX: e = fp_out - fp_in; AVG: e = fp_out - fp_in - M."""
    e = int(e)
    code = e if e >= 0 else 8 - e
    if e > POOL_EXP_MAX or code > SHIFT_CUT_MAX:
        raise FixPointError(f"pool exponent {e} has no shift_cut code (-{SHIFT_CUT_MAX - 8}..7)")
    return code


# --------------------------------------------------------------------------------------------------
# eltwise (§7.5)
# --------------------------------------------------------------------------------------------------

ELEW_SHIFT_WRITE_MAX = 15    # |d| of the ELEW shift_write code (5-bit field, sign in bit 4)

assert 16 + ELEW_SHIFT_WRITE_MAX == _field("ELEW", "shift_write").hi


def elew_shift_write(d: int) -> int:
    """ELEW shift_write code of d = fp_out - min fp_i (ADD) or fp_out - sum fp_i (MUL): d if 0 <= d <= 15,
    else 16 - d for -15 <= d < 0."""
    d = int(d)
    if abs(d) > ELEW_SHIFT_WRITE_MAX:
        raise FixPointError(f"ELEW fix-point change {d} is outside -{ELEW_SHIFT_WRITE_MAX}..{ELEW_SHIFT_WRITE_MAX}")
    return d if d >= 0 else 16 - d


def elew_fp_out_max(ref_fp: int) -> int:
    """The largest ELEW output fix point for the reference fix point (min of the ADD inputs, sum for MUL)."""
    return int(ref_fp) + ELEW_SHIFT_WRITE_MAX


# --------------------------------------------------------------------------------------------------
# hard-sigmoid (§6.8 exec_mode 7, §7.6)
# --------------------------------------------------------------------------------------------------

HSIGMOID_MUL = 2731          # 2731 / 2^14 ~ 1/6
HSIGMOID_SHIFT = 14
HSIGMOID_SLOPE = HSIGMOID_MUL / 2.0 ** HSIGMOID_SHIFT


def hsigmoid_fields(fp_in: int, fp_out: int, *, check: bool = True) -> tuple[int, int]:
    """(hsigmoid_in, shift_hsigmoid) = (fp_in, 14 + fp_in - fp_out): the ALU's shift_bias and shift_cut of
    y = round(min(2^32, max(0, x*2731 + 3*2731*2^hsigmoid_in)) / 2^shift_hsigmoid). With `check`, both must
    fit their ALUINIT fields (shift_bias 0..20, shift_cut 0..63)."""
    hin, shs = int(fp_in), HSIGMOID_SHIFT + int(fp_in) - int(fp_out)
    if check and not (0 <= hin <= SHIFT_BIAS_MAX and 0 <= shs <= SHIFT_CUT_MAX):
        raise FixPointError(f"hard-sigmoid fix points in {fp_in} / out {fp_out}: hsigmoid_in {hin} "
                            f"(0..{SHIFT_BIAS_MAX}) or shift_hsigmoid {shs} (0..{SHIFT_CUT_MAX}) out of range")
    return hin, shs


# --------------------------------------------------------------------------------------------------
# leaky ReLU / PReLU (§6.1, §6.8, §7.7)
# --------------------------------------------------------------------------------------------------

LEAKY_ALPHA = Fraction(26, 256)      # the slope hard-wired in CONV / ALU act_type 3 (§6.1)
# multi_factor is an 8-bit field the executor reads as signed int8 (§6.8, §9.10)
MULTI_FACTOR_MAX = (1 << (_field("ALUINIT", "multi_factor").width - 1)) - 1
MULTI_FACTOR_MIN = -MULTI_FACTOR_MAX - 1
PRELU_SHIFT_MAX = _field("ALUINIT", "shift_prelu_n").hi - 32      # 31: codes are 32 + r for r >= 0


def slope_encoding(alpha) -> tuple[int, int]:
    """(m, s) with alpha == m / 2^s exactly and s minimal (a float is always dyadic); FixPointError for a
    non-dyadic or non-finite value."""
    try:
        f = Fraction(alpha)
    except (ValueError, OverflowError, TypeError):          # NaN, inf, not a number
        raise FixPointError(f"slope {alpha!r} is not a finite number") from None
    d = f.denominator
    if d & (d - 1):
        raise FixPointError(f"slope {alpha!r} is not m/2^s")
    return f.numerator, d.bit_length() - 1


def slope_fits_alu(m: int, s: int) -> bool:
    """True if the slope m/2^s fits ALU leaky_relu: m in the signed multi_factor byte, 0 <= s <= 31."""
    return MULTI_FACTOR_MIN <= m <= MULTI_FACTOR_MAX and 0 <= s <= PRELU_SHIFT_MAX


def alu_shift_code(r: int) -> int:
    """ALU shift_prelu_p / shift_prelu_n code of a right shift r (left if negative): 32 + r, or -r (§7.7)."""
    r = int(r)
    if not -PRELU_SHIFT_MAX <= r <= PRELU_SHIFT_MAX:
        raise FixPointError(f"ALU prelu shift {r} is outside -{PRELU_SHIFT_MAX}..{PRELU_SHIFT_MAX}")
    return 32 + r if r >= 0 else -r


def prelu_shift_codes(prelu_shift: int, fp_in: int, fp_out: int) -> tuple[int, int]:
    """(shift_prelu_p, shift_prelu_n) of ALU leaky_relu / prelu for slope m/2^prelu_shift (§7.7): the
    positive branch shifts right by fp_in - fp_out, the negative one by prelu_shift + fp_in - fp_out.
    Exact for slopes m >= 0 only: the ALU picks the shift by the sign of x*m (§6.8), the reference by the
    sign of x, so for x < 0 and m < 0 the DPU uses the positive-branch shift."""
    r_p = int(fp_in) - int(fp_out)
    return alu_shift_code(r_p), alu_shift_code(int(prelu_shift) + r_p)
