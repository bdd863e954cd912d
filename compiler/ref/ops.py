"""Independent whole-tensor reference ("golden") executor of quantized XIR ops.

Every op is computed from its XIR attributes and the fix points of its tensors, never from DPU
instruction fields.  Where the DPU's integer arithmetic differs from naive float math the DPU form
of the spec (docs: dpuczdx8g-isa1.md §6.1, §7) is followed, so that this golden and a correct DPU
emulator agree bit for bit:

* rounding ``dpu_round`` = round half towards +inf, then saturate to int8 (§6.1);
* conv / depthwise / transposed conv: ``(2*acc + 2*bias*2^sb) / 2^(sc+1)`` with the bias shift
  clamped to ``sb_eff = max(sb, -1)`` (§7.2 correction C1), leaky slope from ``LEAKYRELU_alpha``
  (26/256 on the DPU), ReLU6 clamps at 96 only if ``fp_out <= 4`` (§7.2);
* avg-pool: divisor approximation (N, M) and a float32 product (§7.4);
* eltwise ADD: inputs floored at 2 extra fractional bits like the DPU's ELEW (§6.7, §7.9);
* hard-sigmoid: the 2731/2^14 form (§7.6).

All integer arithmetic is exact (int64; float64/float32 matrix products are used only where every
partial sum is an integer provably below 2^53 / 2^24).  With ``FAST`` (the default) convolutions and eltwise
ADD run on the whole-layer kernels of _fast.py (im2col + BLAS, float32 chunks proven exact, rounding
vectorised in float); ``FAST = False`` selects the integer paths they replaced, which tests/test_ref_fast.py
compares them with.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Sequence

import numpy as np

from . import _fast, _kernels
from ._common import (DPU_ROUND, PY3_ROUND, STD_ROUND, RefError, _absmax, _conv_acc_chunks, _conv_geometry,
                      _Ctx, _dw_acc_rows, _fit_window, _HANDLERS, _register, _transpose_input)

__all__ = ["RefError", "dpu_round", "evaluate", "SUPPORTED"]

# True: convolutions (plain, grouped, depthwise, transposed) and eltwise ADD on the fast exact kernels of _fast.py
# (BLAS in float32 / float64 where its bounds prove every sum exact, vectorised post-processing).  False: the
# integer / per-kernel-position paths they replaced, kept only so that tests/test_ref_fast.py can compare the two.
FAST = True


# --------------------------------------------------------------------------------------------------
# rounding
# --------------------------------------------------------------------------------------------------

_SHIFT_CAP = 62          # right shifts beyond this give the same result for |n| < 2^60
_CLIP_BEFORE_LSHIFT = 1 << 30


def _round_shift(n: np.ndarray, k: int, mode: str = DPU_ROUND) -> np.ndarray:
    """round(n / 2^k) for an int64 array n and integer k (k <= 0 means an exact left shift).

    The result is *not* saturated.  Left shifts clip n first so that the result keeps its sign and
    saturates identically without int64 overflow."""
    n = np.asarray(n, dtype=np.int64)
    k = int(k)
    if k <= 0:
        s = min(-k, 24)
        if s == 0:
            return n
        return np.clip(n, -_CLIP_BEFORE_LSHIFT, _CLIP_BEFORE_LSHIFT) << s
    if k > _SHIFT_CAP:
        n = np.clip(n, -(1 << 59), 1 << 59)
        k = _SHIFT_CAP
    half = np.int64(1 << (k - 1))
    if mode == DPU_ROUND:
        return (n + half) >> k
    fl = n >> k
    rem = n - (fl << k)
    if mode == PY3_ROUND:
        up = (rem > half) | ((rem == half) & ((fl & 1) == 1))
    elif mode == STD_ROUND:
        up = (rem > half) | ((rem == half) & (n >= 0))
    else:  # pragma: no cover - guarded by _round_mode
        raise ValueError(f"unknown round mode {mode!r}")
    return fl + up.astype(np.int64)


def _round_float(v: np.ndarray, mode: str = DPU_ROUND) -> np.ndarray:
    """Exact rounding of a float array to integral float64 values (no saturation; NaN -> 0)."""
    v = np.asarray(v, dtype=np.float64)
    v = np.clip(np.where(np.isnan(v), 0.0, v), -2.0 ** 62, 2.0 ** 62)   # +-inf saturate
    if mode == PY3_ROUND:
        return np.rint(v)
    if mode == DPU_ROUND:
        f = np.floor(v)
        return f + ((v - f) >= 0.5)          # v - floor(v) is exact in binary floating point
    a = np.abs(v)
    f = np.floor(a)
    return np.copysign(f + ((a - f) >= 0.5), v)


def _sat(n: np.ndarray, lo: int = -128, hi: int = 127, dtype=np.int8) -> np.ndarray:
    return np.clip(n, lo, hi).astype(dtype)


def dpu_round(v, shift: int | None = None) -> np.ndarray:
    """§6.1 ``dpu_round``: round half towards +inf, then saturate to int8.

    ``dpu_round(v)`` takes a float array (or an integer array, taken as is).  The exact integer form
    ``dpu_round(n, shift)`` rounds the rational ``n / 2^shift`` (n integer, shift may be negative).
    """
    if shift is not None:
        return _sat(_round_shift(np.asarray(v, dtype=np.int64), shift, DPU_ROUND))
    a = np.asarray(v)
    if np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
        return _sat(a.astype(np.int64))
    r = _round_float(a, DPU_ROUND)
    return _sat(np.clip(r, -129.0, 128.0))


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------

def evaluate(op_type: str, inputs: Sequence[np.ndarray], attrs: dict | None,
             in_fix: Sequence[int | None] | None, out_fix: int | None,
             out_shape: Sequence[int], name: str = "") -> np.ndarray:
    """Evaluate one XIR op on whole tensors.

    op_type:   XIR op type, one of SUPPORTED (anything else raises RefError).
    inputs:    the op's inputs in XIR argument order; quantized data as integer (int8) arrays in the
               tensor's logical layout (feature maps NHWC, conv weights OHWI, depthwise weights
               [multiplier, kh, kw, C], bias 1-D); float data as float arrays.
    attrs:     the op's XIR attributes as plain Python values (kernel/stride/dilation are [w, h],
               pad is [left, right, top, bottom]).
    in_fix:    fix point of each input tensor (None for float tensors).
    out_fix:   fix point of the output tensor (None for float outputs).
    out_shape: shape of the output tensor (decides output sizes, e.g. ceil-mode pooling).
    Returns int8 for *-fix ops and float2fix (another integer type only for float2fix with
    bit_width > 8 or if_signed false), float32 for fix2float / fix / float ops; data-movement ops
    (reshape, transpose, strided_slice, upload, download, ...) keep integer-ness of the input.
    """
    handler = _HANDLERS.get(op_type)
    if handler is None:
        who = f"{op_type} '{name}'" if name else str(op_type)
        raise RefError(f"{who}: op type '{op_type}' is not supported by the reference executor; "
                       f"register an implementation for it with the graph runner (custom op)")
    try:
        shape = tuple(int(d) for d in out_shape)
    except (TypeError, ValueError):
        raise RefError(f"{op_type} '{name}': bad output shape {out_shape!r}") from None
    ctx = _Ctx(op_type, name, list(inputs), dict(attrs or {}),
               list(in_fix) if in_fix is not None else [], out_fix, shape)
    try:
        out = handler(ctx)
    except RefError:
        raise
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as e:
        raise ctx.error(f"{type(e).__name__}: {e}") from e
    if tuple(out.shape) != shape:
        raise ctx.error(f"computed output shape {tuple(out.shape)} differs from the output "
                        f"tensor shape {shape}")
    return out


# --------------------------------------------------------------------------------------------------
# activations on the exact rational value n / 2^k
# --------------------------------------------------------------------------------------------------

def _dyadic(ctx: _Ctx, value, what: str) -> tuple[int, int] | None:
    """value as p / 2^m with small p (exact), or None if that needs a huge numerator."""
    try:
        f = Fraction(value)
    except (TypeError, ValueError):
        raise ctx.error(f"{what} must be a number, got {value!r}") from None
    f = f.limit_denominator(1 << 62) if f.denominator > (1 << 62) else f
    q = f.denominator
    if q & (q - 1):
        return None
    if abs(f.numerator) >= (1 << 23):
        return None
    return f.numerator, q.bit_length() - 1


def _activate_round(ctx: _Ctx, n: np.ndarray, k: int, nonlinear: str, fp_out: int | None,
                    mode: str, alpha=None, prelu: tuple[int, int] | None = None) -> np.ndarray:
    """round(ACT(n / 2^k)) saturated to int8 (exact)."""
    nl = (nonlinear or "NONE").upper()
    if nl in ("NONE", ""):
        return _sat(_round_shift(n, k, mode))
    if nl == "RELU":
        return _sat(np.maximum(_round_shift(n, k, mode), 0))
    if nl == "RELU6":
        r = np.maximum(_round_shift(n, k, mode), 0)
        if fp_out is not None and fp_out <= 4:
            r = np.minimum(r, 96)
        return _sat(r)
    if nl in ("LEAKYRELU", "LEAKY-RELU", "PRELU"):
        if prelu is not None:
            p, m = prelu
        else:
            a = 26 / 256 if alpha is None else alpha
            pm = _dyadic(ctx, a, "LEAKYRELU_alpha")
            if pm is None:     # not a short dyadic number: float64 on the exact value
                v = n.astype(np.float64) / 2.0 ** k
                v = np.where(v < 0, v * float(a), v)
                return _sat(np.clip(_round_float(v, mode), -129, 128))
            p, m = pm
        pos = _round_shift(n, k, mode)
        neg = _round_shift(n * p, k + m, mode)
        return _sat(np.where(n < 0, neg, pos))
    raise ctx.error(f"nonlinear '{nonlinear}' is not supported by the reference executor")


# --------------------------------------------------------------------------------------------------
# convolution core (the geometry and accumulation are in _common.py)
# --------------------------------------------------------------------------------------------------

def _conv_shifts(ctx: _Ctx, has_bias: bool):
    fp_in = ctx.fix(0)
    fp_w = ctx.fix(1, "weights (input)")
    fp_out = ctx.ofix()
    sc = fp_in + fp_w - fp_out
    sb_eff = 0
    if has_bias:
        fp_b = ctx.fix(2, "bias (input)")
        sb = fp_in + fp_w - fp_b
        sb_eff = max(sb, -1)          # §7.2 correction C1
        if sb_eff > 50:
            raise ctx.error(f"bias shift {sb} (fp_in + fp_w - fp_bias) is out of range")
    return sc, sb_eff, fp_out


def _conv_nonlinear(ctx: _Ctx):
    nl = str(ctx.attrs.get("nonlinear", "NONE") or "NONE").upper()
    alpha = ctx.attrs.get("LEAKYRELU_alpha", None)
    prelu = None
    if nl == "PRELU":
        if "prelu_in" not in ctx.attrs or "prelu_shift" not in ctx.attrs:
            raise ctx.error("nonlinear PRELU needs attributes prelu_in and prelu_shift")
        prelu = (ctx.int_attr("prelu_in"), ctx.int_attr("prelu_shift"))
    if nl not in ("NONE", "", "RELU", "RELU6", "LEAKYRELU", "PRELU"):
        raise ctx.error(f"nonlinear '{nl}' is not supported by the reference executor")
    return nl, alpha, prelu


def _finish_conv(ctx, acc, bias, sc, sb_eff, fp_out, nl, alpha, prelu, mode):
    """a = 2*acc + bias*2^(sb_eff+1);  y = round(ACT(a / 2^(sc+1)))."""
    a = 2 * acc
    if bias is not None:
        a = a + (bias << (sb_eff + 1))
    return _activate_round(ctx, a, sc + 1, nl, fp_out, mode, alpha=alpha, prelu=prelu)


def _get_bias(ctx: _Ctx, n_out: int):
    if len(ctx.inputs) < 3 or ctx.inputs[2] is None:
        return None
    b = ctx.int_input(2).reshape(-1)
    if b.size != n_out:
        raise ctx.error(f"bias has {b.size} values, expected {n_out}")
    return b


def _check_4d(ctx: _Ctx, a: np.ndarray, what: str):
    if a.ndim != 4:
        raise ctx.error(f"{what} must be 4-D (NHWC / OHWI), got shape {list(a.shape)}")


def _conv_operands(ctx: _Ctx) -> tuple[np.ndarray, np.ndarray]:
    """Input and weights of a (depthwise / transposed) conv, checked to be 4-D with a 4-D output."""
    ctx.need_inputs(2, 3)
    x = ctx.int_input(0, small=True)
    w = ctx.int_input(1, small=True)
    _check_4d(ctx, x, "input")
    _check_4d(ctx, w, "weights")
    if len(ctx.out_shape) != 4:
        raise ctx.error(f"output must be 4-D, got {list(ctx.out_shape)}")
    return x, w


def _conv_like(ctx: _Ctx, transposed: bool) -> np.ndarray:
    x, w = _conv_operands(ctx)
    O, kh, kw, Ig = w.shape
    groups = ctx.int_attr("group", 1)
    if groups < 1:
        raise ctx.error(f"bad group {groups}")
    x, strides, dils, pads, bias, (sc, sb_eff, fp_out), (nl, alpha, prelu), mode = \
        _conv_setup(ctx, x, (kh, kw), O, transposed)
    N, oh, ow, oc = ctx.out_shape
    if oc != O or N != x.shape[0]:
        raise ctx.error(f"output shape {list(ctx.out_shape)} does not match input batch "
                        f"{x.shape[0]} / weights {list(w.shape)}")
    if FAST:
        if x.shape[3] != Ig * groups or O % groups:
            raise ctx.error(f"channels do not match: input C={x.shape[3]}, weights {list(w.shape)}, "
                            f"group={groups}")
        xp = _fit_window(ctx, x, (oh, ow), (kh, kw), strides, dils, pads, 0)
        if groups > 1 and Ig == 1:           # one input channel per group: the depthwise kernel
            wd = w[..., 0].reshape(groups, O // groups, kh, kw).transpose(1, 2, 3, 0)
            return _fast_depthwise(ctx, xp, wd, (oh, ow), strides, dils, bias, sc, sb_eff, fp_out,
                                   nl, alpha, prelu, mode)
        try:
            gemm = _fast.ConvGemm(xp, w, groups, (oh, ow), strides, dils)
        except ValueError as e:
            raise ctx.error(str(e)) from None
        out = np.empty((N, oh, ow, O), dtype=np.int8)
        for r0 in range(0, oh, gemm.row_block):
            r1 = min(oh, r0 + gemm.row_block)
            out[:, r0:r1] = _fast_finish(ctx, gemm.rows(r0, r1), gemm.acc_bound, bias, sc, sb_eff, fp_out,
                                         nl, alpha, prelu, mode)
        return out
    out = np.empty((N, oh, ow, O), dtype=np.int8)
    for n, r0, r1, acc in _conv_acc_chunks(ctx, x, w, groups, (oh, ow), strides, dils, pads):
        out[n, r0:r1] = _finish_conv(ctx, acc, bias, sc, sb_eff, fp_out, nl, alpha, prelu, mode)
    return out


def _fast_finish(ctx, acc, acc_bound, bias, sc, sb_eff, fp_out, nl, alpha, prelu, mode):
    """_finish_conv of a float accumulator holding exact integers: vectorised in float64 where _fast proves it
    exact (DPU_ROUND), else the integer path."""
    if mode == DPU_ROUND:
        slope = prelu
        if nl in ("LEAKYRELU", "LEAKY-RELU") and prelu is None:
            slope = _dyadic(ctx, 26 / 256 if alpha is None else alpha, "LEAKYRELU_alpha")
        y = _fast.finish_int(acc, acc_bound, bias, sc, sb_eff, nl, fp_out, slope)
        if y is None:
            y = _fast.finish_dpu_round(acc, acc_bound, bias, sc, sb_eff, nl, fp_out, slope)
        if y is not None:
            return y
    return _finish_conv(ctx, acc.astype(np.int64), bias, sc, sb_eff, fp_out, nl, alpha, prelu, mode)


def _fast_depthwise(ctx, xp, w, out_hw, strides, dils, bias, sc, sb_eff, fp_out, nl, alpha, prelu, mode):
    """Depthwise conv of the padded xp with w [M, kh, kw, C] on the exact float kernels of _fast."""
    N, C = xp.shape[0], xp.shape[3]
    M = w.shape[0]
    bound = _fast.depthwise_bound(xp, w)
    if bound >= (1 << 53):
        raise ctx.error("accumulator could exceed 2^53")
    out = np.empty((N, out_hw[0], out_hw[1], C * M), dtype=np.int8)
    if xp.dtype == w.dtype == np.int8 and w.shape[1] * w.shape[2] < (1 << 17):      # int32 in one Numba pass
        acc = np.empty(out.shape, dtype=np.int32)
        _kernels.depthwise_int8(xp, np.ascontiguousarray(w), out_hw[0], out_hw[1], strides[0], strides[1], dils[0],
                                dils[1], acc)
        return _fast_finish(ctx, acc, bound, bias, sc, sb_eff, fp_out, nl, alpha, prelu, mode)
    for r0, r1, acc in _fast.depthwise_blocks(xp, w, out_hw, strides, dils):
        out[:, r0:r1] = _fast_finish(ctx, acc, bound, bias, sc, sb_eff, fp_out, nl, alpha, prelu, mode)
    return out


def _conv_setup(ctx: _Ctx, x: np.ndarray, kernel_hw, n_out: int, transposed: bool):
    """Geometry, bias, shifts, nonlinearity and round mode shared by every conv-like op."""
    strides, dils, pads = _conv_geometry(ctx, x.shape[1:3], kernel_hw, transposed)
    bias = _get_bias(ctx, n_out)
    shifts = _conv_shifts(ctx, bias is not None)
    act = _conv_nonlinear(ctx)
    mode = ctx.round_mode()
    if transposed:
        x, strides, pads = _transpose_input(ctx, x, kernel_hw, strides, dils, pads)
    return x, strides, dils, pads, bias, shifts, act, mode


@_register("conv2d-fix")
def _op_conv2d_fix(ctx: _Ctx) -> np.ndarray:
    return _conv_like(ctx, transposed=False)


@_register("transposed-conv2d-fix")
def _op_tconv2d_fix(ctx: _Ctx) -> np.ndarray:
    return _conv_like(ctx, transposed=True)


def _dwconv_like(ctx: _Ctx, transposed: bool) -> np.ndarray:
    x, w = _conv_operands(ctx)
    M, kh, kw, C = w.shape
    x, strides, dils, pads, bias, (sc, sb_eff, fp_out), (nl, alpha, prelu), mode = \
        _conv_setup(ctx, x, (kh, kw), C * M, transposed)
    N, oh, ow, oc = ctx.out_shape
    if oc != C * M or N != x.shape[0]:
        raise ctx.error(f"output shape {list(ctx.out_shape)} does not match input / weights "
                        f"{list(w.shape)}")
    xp = _fit_window(ctx, x, (oh, ow), (kh, kw), strides, dils, pads, 0)
    if FAST:
        return _fast_depthwise(ctx, xp, w, (oh, ow), strides, dils, bias, sc, sb_eff, fp_out, nl, alpha, prelu,
                               mode)
    out = np.empty((N, oh, ow, oc), dtype=np.int8)
    rows = max(1, (1 << 21) // max(1, N * ow * oc))
    for r0 in range(0, oh, rows):
        r1 = min(oh, r0 + rows)
        acc = _dw_acc_rows(xp, w, r0, r1, ow, strides, dils)
        out[:, r0:r1] = _finish_conv(ctx, acc, bias, sc, sb_eff, fp_out, nl, alpha, prelu, mode)
    return out


@_register("depthwise-conv2d-fix")
def _op_dwconv2d_fix(ctx: _Ctx) -> np.ndarray:
    return _dwconv_like(ctx, transposed=False)


@_register("transposed-depthwise-conv2d-fix", "depthwise-transposed-conv2d-fix")
def _op_tdwconv2d_fix(ctx: _Ctx) -> np.ndarray:
    return _dwconv_like(ctx, transposed=True)


# --------------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------------

_AVG_TABLE = {(3, 3): (7, 6), (5, 5): (10, 8), (6, 6): (7, 8), (7, 7): (21, 10), (14, 14): (21, 12)}


def avg_pool_factor(kh: int, kw: int) -> tuple[int, int]:
    """(N, M) with N/2^M approximating 1/(kh*kw) (§7.4)."""
    if (kh, kw) in _AVG_TABLE:
        return _AVG_TABLE[(kh, kw)]
    A = kh * kw
    if A <= 0:
        raise ValueError(f"bad avg-pool kernel {kh}x{kw}")
    target = Fraction(1, A)
    best_err = Fraction(1)
    best = (0, 0)
    for s in range((A * 128 - 1).bit_length()):          # s < ceil(log2(A*128))
        q = Fraction(1 << s, A)
        N = (2 * q.numerator + q.denominator) // (2 * q.denominator)   # half away from zero (q>0)
        err = abs(Fraction(N, 1 << s) - target)
        if err < best_err:
            best_err = err
            best = (N, s)
    return best


def _window_reduce(xp: np.ndarray, out_hw, kernel_hw, stride_hw, fn, init):
    oh, ow = out_hw
    kh, kw = kernel_hw
    sh, sw = stride_hw
    acc = None
    for ky in range(kh):
        for kx in range(kw):
            sl = xp[:, ky:ky + (oh - 1) * sh + 1:sh, kx:kx + (ow - 1) * sw + 1:sw, :]
            acc = sl.copy() if acc is None else fn(acc, sl, out=acc)
    return acc


@_register("pool-fix")
def _op_pool_fix(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = ctx.int_input(0, small=True)
    _check_4d(ctx, x, "input")
    if len(ctx.out_shape) != 4:
        raise ctx.error(f"output must be 4-D, got {list(ctx.out_shape)}")
    N, H, W, C = x.shape
    typ = ctx.str_attr("type", "MAX").upper()
    if ctx.bool_attr("global", False):
        kh, kw, sh, sw = H, W, 1, 1
        pt = pb = pl = pr = 0
    else:
        kw, kh = ctx.ints("kernel", None, 2)
        sw, sh = ctx.ints("stride", [kw, kh], 2)
        pl, pr, pt, pb = ctx.ints("pad", [0, 0, 0, 0], 4)
    if min(kh, kw, sh, sw) < 1:
        raise ctx.error("kernel and stride must be >= 1")
    on, oh, ow, oc = ctx.out_shape
    if on != N or oc != C:
        raise ctx.error(f"output shape {list(ctx.out_shape)} does not match input {list(x.shape)}")
    d = ctx.ofix() - ctx.fix(0)
    mode = ctx.round_mode()
    if typ == "MAX":
        lowest = int(np.iinfo(x.dtype).min) if x.dtype != np.int64 else -128
        xp = _fit_window(ctx, x, (oh, ow), (kh, kw), (sh, sw), (1, 1), (pt, pb, pl, pr), lowest)
        m = _window_reduce(xp, (oh, ow), (kh, kw), (sh, sw), np.maximum, lowest)
        return _sat(_round_shift(m.astype(np.int64), -d, mode))
    if typ in ("AVG", "AVE", "AVERAGE", "MEAN"):
        wide = np.int32 if kh * kw * _absmax(x) < (1 << 31) else np.int64
        xp = _fit_window(ctx, x.astype(wide), (oh, ow), (kh, kw), (sh, sw), (1, 1),
                         (pt, pb, pl, pr), 0)
        s = _window_reduce(xp, (oh, ow), (kh, kw), (sh, sw), np.add, 0)
        nf, mf = avg_pool_factor(kh, kw)
        # the reference (and the DPU) form sum * N/2^M in IEEE single precision
        v = s.astype(np.float32) * np.float32(nf / 2.0 ** mf)
        v = v.astype(np.float64) * 2.0 ** d
        return _sat(np.clip(_round_float(v, mode), -129, 128))
    raise ctx.error(f"pool type '{typ}' is not supported (MAX, AVG)")


# --------------------------------------------------------------------------------------------------
# eltwise
# --------------------------------------------------------------------------------------------------

@_register("eltwise-fix")
def _op_eltwise_fix(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1)
    typ = ctx.str_attr("type", "ADD").upper()
    mode = ctx.round_mode()
    fp_out = ctx.ofix()
    nl = str(ctx.attrs.get("nonlinear", "NONE") or "NONE").upper()
    if typ in ("LEAKY-RELU", "LEAKYRELU", "PRELU"):
        return _eltwise_prelu(ctx, typ, fp_out, mode)
    xs = [ctx.int_input(i, small=FAST) for i in range(len(ctx.inputs))]
    fps = [ctx.fix(i) for i in range(len(xs))]
    try:
        xs = list(np.broadcast_arrays(*xs))
    except ValueError:
        raise ctx.error(f"input shapes {[list(x.shape) for x in xs]} do not broadcast") from None
    if FAST and typ == "ADD" and mode == DPU_ROUND:
        fmin = min(fps)
        y = _fast.eltwise_add_dpu_round(xs, [fp - fmin for fp in fps], 2 - (fp_out - fmin), nl)
        if y is not None:
            return y
    xs = [x.astype(np.int64, copy=False) for x in xs]
    if typ == "ADD":
        fmin = min(fps)
        # DPU ELEW: t_i = floor(x_i * 4 / 2^(fp_i - fmin)); value = sum(t) / 4 * 2^(fp_out - fmin)
        S = np.zeros(xs[0].shape, dtype=np.int64)
        for x, fp in zip(xs, fps):
            S += (x << 2) >> min(fp - fmin, 63)
        k = 2 - (fp_out - fmin)
        n = S
    elif typ == "MUL":
        if len(xs) > 8:
            raise ctx.error("MUL of more than 8 inputs would overflow int64")
        n = np.ones(xs[0].shape, dtype=np.int64)
        for x in xs:
            n = n * x
        k = sum(fps) - fp_out
    else:
        raise ctx.error(f"eltwise type '{typ}' is not supported (ADD, MUL, LEAKY-RELU, PRELU)")
    alpha = ctx.attrs.get("LEAKYRELU_alpha", None)
    prelu = None
    if nl == "PRELU":
        prelu = (ctx.int_attr("prelu_in"), ctx.int_attr("prelu_shift"))
    return _activate_round(ctx, n, k, nl, fp_out, mode, alpha=alpha, prelu=prelu)


def _eltwise_prelu(ctx: _Ctx, typ: str, fp_out: int, mode: str) -> np.ndarray:
    """§7.7: v = x * 2^(fp_out - fp_in) * (x < 0 ? slope : 1), slope = prelu_in / 2^prelu_shift
    (PRELU with a second input: per-channel int8 slopes, slope = alpha[c] / 2^prelu_shift)."""
    x = ctx.int_input(0)
    fp_in = ctx.fix(0)
    if typ == "PRELU" and len(ctx.inputs) >= 2:
        alpha = ctx.int_input(1)
        if "prelu_shift" in ctx.attrs:
            shift = ctx.int_attr("prelu_shift")
        else:
            shift = ctx.fix(1, "slope (input)")
        try:
            slope = np.broadcast_to(alpha, x.shape) if alpha.ndim > 1 or alpha.size == 1 \
                else np.broadcast_to(alpha.reshape((1,) * (x.ndim - 1) + (-1,)), x.shape)
        except ValueError:
            raise ctx.error(f"slopes {list(alpha.shape)} do not match input {list(x.shape)}") from None
    else:
        ctx.need_inputs(1, 1)
        slope = np.asarray(ctx.int_attr("prelu_in"), dtype=np.int64)
        shift = ctx.int_attr("prelu_shift")
    pos = _round_shift(x, fp_in - fp_out, mode)
    neg = _round_shift(x * slope, shift + fp_in - fp_out, mode)
    return _sat(np.where(x < 0, neg, pos))


# --------------------------------------------------------------------------------------------------
# data movement with rescale
# --------------------------------------------------------------------------------------------------

def _rescale(ctx: _Ctx, x: np.ndarray, fp_in: int | None) -> np.ndarray:
    """round(x * 2^(fp_out - fp_in)) saturated (identity when the fix points agree or are unknown)."""
    if fp_in is None or ctx.out_fix is None or int(fp_in) == int(ctx.out_fix):
        return _sat(x)
    return _sat(_round_shift(x, int(fp_in) - int(ctx.out_fix), ctx.round_mode()))


def _fix_or_none(ctx: _Ctx, i: int):
    return ctx.in_fix[i] if i < len(ctx.in_fix) else None


@_register("concat-fix")
def _op_concat_fix(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1)
    xs = [ctx.int_input(i) for i in range(len(ctx.inputs))]
    axis = ctx.int_attr("axis", 0)
    nd = xs[0].ndim
    if not -nd <= axis < nd:
        raise ctx.error(f"axis {axis} out of range for {nd}-D inputs")
    if ctx.out_fix is None:
        raise ctx.error("missing output fix point")
    parts = [_rescale(ctx, x, ctx.fix(i)) for i, x in enumerate(xs)]
    try:
        return np.concatenate(parts, axis=axis)
    except ValueError as e:
        raise ctx.error(f"cannot concatenate shapes {[list(x.shape) for x in xs]}: {e}") from None


@_register("upsample-fix")
def _op_upsample_fix(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 2)
    x = ctx.int_input(0)
    _check_4d(ctx, x, "input")
    mode = ctx.str_attr("mode", "NEAREST").upper()
    if mode != "NEAREST":
        raise ctx.error(f"upsample mode '{mode}' is not supported (NEAREST only)")
    if ctx.bool_attr("align_corners") or ctx.bool_attr("half_pixel_centers"):
        raise ctx.error("align_corners / half_pixel_centers are not supported")
    N, H, W, C = x.shape
    on, oh, ow, oc = ctx.out_shape
    if on != N or oc != C:
        raise ctx.error(f"output shape {list(ctx.out_shape)} does not match input {list(x.shape)}")
    iy = (np.arange(oh) * H) // oh
    ix = (np.arange(ow) * W) // ow
    y = x[:, iy][:, :, ix]
    return _rescale(ctx, y, ctx.fix(0))


@_register("tile-fix", "reorg")
def _op_tile_fix(ctx: _Ctx) -> np.ndarray:
    """tile-fix (`stride`) and its float form reorg (`scale`): the same permutation, no arithmetic."""
    ctx.need_inputs(1, 1)
    fixed = ctx.op_type == "tile-fix"
    x = ctx.int_input(0) if fixed else ctx.float_input(0)
    _check_4d(ctx, x, "input")
    s = ctx.int_attr("stride") if fixed else ctx.int_attr("scale")
    if s < 1:
        raise ctx.error(f"bad stride {s}")
    N, H, W, C = x.shape
    if ctx.bool_attr("reverse", False):
        if C % (s * s):
            raise ctx.error(f"channels {C} not divisible by stride^2 = {s * s}")
        co = C // (s * s)
        y = x.reshape(N, H, W, s, s, co).transpose(0, 1, 3, 2, 4, 5).reshape(N, H * s, W * s, co)
    else:
        if H % s or W % s:
            raise ctx.error(f"H, W = {H}, {W} not divisible by stride {s}")
        y = x.reshape(N, H // s, s, W // s, s, C).transpose(0, 1, 3, 2, 4, 5)
        y = y.reshape(N, H // s, W // s, s * s * C)
    return _rescale(ctx, y, _fix_or_none(ctx, 0)) if fixed else y.astype(np.float32)


@_register("hard-sigmoid-fix")
def _op_hsigmoid_fix(ctx: _Ctx) -> np.ndarray:
    """§7.6: round(min(2^32, max(0, x*2731 + 3*2731*2^hsigmoid_in)) / 2^shift_hsigmoid)."""
    ctx.need_inputs(1, 1)
    x = ctx.int_input(0)
    hin = ctx.attrs.get("hsigmoid_in", None)
    shs = ctx.attrs.get("shift_hsigmoid", None)
    hin = ctx.fix(0) if hin is None or int(hin) == -128 else int(hin)
    shs = 14 + ctx.fix(0) - ctx.ofix() if shs is None or int(shs) == -128 else int(shs)
    mode = ctx.round_mode()
    if hin >= 0:
        n = np.clip(x * 2731 + ((3 * 2731) << hin), 0, 1 << 32)
        k = shs
    else:                                     # scale everything by 2^-hin to stay integral
        n = np.clip((x * 2731 << -hin) + 3 * 2731, 0, 1 << (32 - hin))
        k = shs - hin
    return _sat(_round_shift(n, k, mode))


def _reshape_like(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 2)
    x = np.asarray(ctx.inputs[0])
    if x.size != int(np.prod(ctx.out_shape, dtype=np.int64)):
        raise ctx.error(f"cannot reshape {list(x.shape)} to {list(ctx.out_shape)}")
    return x.reshape(ctx.out_shape)


def _is_int(a) -> bool:
    return np.issubdtype(np.asarray(a).dtype, np.integer)


def _passthrough_dtype(ctx: _Ctx, y: np.ndarray) -> np.ndarray:
    """Data-movement ops keep the data type: int inputs stay int8 (rescaled if fix points
    differ), float inputs become float32."""
    if _is_int(ctx.inputs[0]):
        return _rescale(ctx, y.astype(np.int64), _fix_or_none(ctx, 0))
    return np.asarray(y, dtype=np.float32)


@_register("reshape-fix", "reshape", "flatten", "squeeze", "identity", "upload", "download")
def _op_reshape(ctx: _Ctx) -> np.ndarray:
    return _passthrough_dtype(ctx, _reshape_like(ctx))


@_register("transpose")
def _op_transpose(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = np.asarray(ctx.inputs[0])
    order = ctx.ints("order", list(range(x.ndim)[::-1]))
    if sorted(order) != list(range(x.ndim)):
        raise ctx.error(f"order {order} is not a permutation of {x.ndim} axes")
    return _passthrough_dtype(ctx, np.transpose(x, order))


@_register("strided_slice", "strided_slice-fix")
def _op_strided_slice(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = np.asarray(ctx.inputs[0])
    begin = ctx.ints("begin", [])
    end = ctx.ints("end", [])
    strides = ctx.ints("strides", [1] * len(begin))
    n = max(len(begin), len(end), len(strides))
    if n > x.ndim:
        raise ctx.error(f"{n} slice dimensions for a {x.ndim}-D input")
    sl = []
    for i in range(x.ndim):
        if i < n:
            b = begin[i] if i < len(begin) else None
            e = end[i] if i < len(end) else None
            s = strides[i] if i < len(strides) else 1
            if s == 0:
                raise ctx.error("stride 0")
            sl.append(slice(b, e, s))
        else:
            sl.append(slice(None))
    return _passthrough_dtype(ctx, x[tuple(sl)])


# --------------------------------------------------------------------------------------------------
# float <-> fix
# --------------------------------------------------------------------------------------------------

def _range(ctx: _Ctx) -> tuple[int, int, int]:
    bw = ctx.int_attr("bit_width", 8)
    if not 1 <= bw <= 32:
        raise ctx.error(f"bad bit_width {bw}")
    if ctx.bool_attr("if_signed", True):
        return -(1 << (bw - 1)), (1 << (bw - 1)) - 1, bw
    return 0, (1 << bw) - 1, bw


def _int_dtype(lo: int, hi: int):
    for dt in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return dt
    return np.int64


def _fp_attr(ctx: _Ctx, fallback) -> int:
    v = ctx.attrs.get("fix_point", None)
    if v is None:
        if fallback is None:
            raise ctx.error("missing attribute 'fix_point' and tensor fix point")
        return int(fallback)
    return int(v)


@_register("fix2float")
def _op_fix2float(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = ctx.int_input(0)
    lo, hi, _ = _range(ctx)
    fp = _fp_attr(ctx, _fix_or_none(ctx, 0))
    return (np.clip(x, lo, hi).astype(np.float64) * 2.0 ** (-fp)).astype(np.float32)


def _quantize(ctx: _Ctx, fp: int):
    x = ctx.float_input(0)
    lo, hi, _ = _range(ctx)
    r = _round_float(x * 2.0 ** fp, ctx.round_mode(DPU_ROUND))
    return np.clip(r, lo, hi), lo, hi


@_register("float2fix")
def _op_float2fix(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    fp = _fp_attr(ctx, ctx.out_fix)
    q, lo, hi = _quantize(ctx, fp)
    return q.astype(_int_dtype(lo, hi))


@_register("fix")
def _op_fix(ctx: _Ctx) -> np.ndarray:
    """XIR `fix`: quantize then dequantize; the output tensor is FLOAT32."""
    ctx.need_inputs(1, 1)
    fp = _fp_attr(ctx, ctx.out_fix)
    q, _, _ = _quantize(ctx, fp)
    return (q * 2.0 ** (-fp)).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# float ops
# --------------------------------------------------------------------------------------------------

@_register("softmax")
def _op_softmax(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = ctx.float_input(0)
    axis = ctx.int_attr("axis", -1)
    if not -x.ndim <= axis < x.ndim:
        raise ctx.error(f"axis {axis} out of range for a {x.ndim}-D input")
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(np.float32)


@_register("sigmoid")
def _op_sigmoid(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = ctx.float_input(0)
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


@_register("relu")
def _op_relu(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    return np.maximum(ctx.float_input(0), 0.0).astype(np.float32)


@_register("relu6")
def _op_relu6(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    return np.clip(ctx.float_input(0), 0.0, 6.0).astype(np.float32)


@_register("leaky-relu")
def _op_leaky_relu(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = ctx.float_input(0)
    alpha = float(ctx.attrs.get("alpha", 0.01))
    return np.where(x < 0, x * alpha, x).astype(np.float32)


# float (CPU) ops live in float_ops.py; importing it registers their handlers (it imports _common, not this module)
from . import float_ops as _float_ops  # noqa: E402,F401

SUPPORTED: frozenset[str] = frozenset(_HANDLERS)
