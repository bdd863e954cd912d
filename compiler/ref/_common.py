"""What the reference executor's two op modules share: its error, the evaluation context and op registry,
and the convolution geometry (padding, windows, exact accumulation) that both the quantized ops (ops.py)
and the float ops (float_ops.py) build on. A module of its own so that those two import it, not each other.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from opendpu.isa.errors import OpenDpuError


class RefError(OpenDpuError, ValueError):
    """An op cannot be evaluated; the message names the op type (and op name) and the problem."""


# --------------------------------------------------------------------------------------------------
# round modes (the rounding itself is in ops.py)
# --------------------------------------------------------------------------------------------------

DPU_ROUND = "DPU_ROUND"      # half towards +inf
STD_ROUND = "STD_ROUND"      # std::round: half away from zero
PY3_ROUND = "PY3_ROUND"      # half to even

_ROUND_MODES = {
    "DPU_ROUND": DPU_ROUND, "DPU": DPU_ROUND,
    "STD_ROUND": STD_ROUND, "STD": STD_ROUND,
    "PY3_ROUND": PY3_ROUND, "PY3": PY3_ROUND,
}


# --------------------------------------------------------------------------------------------------
# evaluation context and registry
# --------------------------------------------------------------------------------------------------

class _Ctx:
    def __init__(self, op_type, name, inputs, attrs, in_fix, out_fix, out_shape):
        self.op_type = op_type
        self.name = name
        self.inputs = inputs
        self.attrs = attrs
        self.in_fix = in_fix
        self.out_fix = out_fix
        self.out_shape = out_shape

    # -- errors ---------------------------------------------------------------------------------
    def error(self, msg: str) -> RefError:
        who = f"{self.op_type} '{self.name}'" if self.name else self.op_type
        return RefError(f"{who}: {msg}")

    # -- inputs ---------------------------------------------------------------------------------
    def need_inputs(self, lo: int, hi: int | None = None) -> None:
        n = len(self.inputs)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if hi == lo else (f"at least {lo}" if hi is None else f"{lo}..{hi}")
            raise self.error(f"expects {want} inputs, got {n}")

    def int_input(self, i: int, small: bool = False) -> np.ndarray:
        """Input i as an int64 array (small=True: keep an int8/int16/uint8 dtype as is)."""
        a = np.asarray(self.inputs[i])
        if small and a.dtype in (np.int8, np.int16):
            return a
        if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.integer)
                                       or np.issubdtype(a.dtype, np.floating)):
            raise self.error(f"input {i} has unsupported dtype {a.dtype}")
        if np.issubdtype(a.dtype, np.floating):
            if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
                raise self.error(f"input {i} must hold integers (quantized data), got {a.dtype}")
        return a.astype(np.int64)

    def float_input(self, i: int) -> np.ndarray:
        return np.asarray(self.inputs[i]).astype(np.float64)

    def fix(self, i: int, what: str = "input") -> int:
        if i >= len(self.in_fix) or self.in_fix[i] is None:
            raise self.error(f"missing fix point of {what} {i}")
        return int(self.in_fix[i])

    def ofix(self) -> int:
        if self.out_fix is None:
            raise self.error("missing output fix point")
        return int(self.out_fix)

    # -- attributes -----------------------------------------------------------------------------
    def attr(self, key, default=None):
        return self.attrs.get(key, default)

    def ints(self, key, default=None, n=None) -> list[int]:
        v = self.attrs.get(key, default)
        if v is None:
            raise self.error(f"missing attribute '{key}'")
        if np.isscalar(v):
            v = [v]
        try:
            out = [int(x) for x in v]
        except (TypeError, ValueError):
            raise self.error(f"attribute '{key}' must be a list of ints, got {v!r}") from None
        if n is not None and len(out) != n:
            raise self.error(f"attribute '{key}' must have {n} values, got {out}")
        return out

    def int_attr(self, key, default=None) -> int:
        v = self.attrs.get(key, default)
        if v is None:
            raise self.error(f"missing attribute '{key}'")
        if not np.isscalar(v):
            v = list(v)
            if len(v) != 1:
                raise self.error(f"attribute '{key}' must be an int, got {v!r}")
            v = v[0]
        return int(v)

    def str_attr(self, key, default=None) -> str:
        v = self.attrs.get(key, default)
        if v is None:
            raise self.error(f"missing attribute '{key}'")
        if isinstance(v, bytes):
            v = v.decode()
        return str(v)

    def bool_attr(self, key, default=False) -> bool:
        v = self.attrs.get(key, default)
        if isinstance(v, (str, bytes)):
            s = v.decode() if isinstance(v, bytes) else v
            return s.strip().lower() in ("1", "true", "yes")
        return bool(v)

    def round_mode(self, default: str = DPU_ROUND) -> str:
        v = self.attrs.get("round_mode", None)
        if v is None or v == "":
            return default
        if isinstance(v, bytes):
            v = v.decode()
        m = _ROUND_MODES.get(str(v).upper())
        if m is None:
            raise self.error(f"unknown round_mode {v!r}")
        return m


_HANDLERS: dict[str, Callable[[_Ctx], np.ndarray]] = {}


def _register(*names: str):
    def deco(fn):
        for nm in names:
            _HANDLERS[nm] = fn
        return fn
    return deco


# --------------------------------------------------------------------------------------------------
# convolution geometry and accumulation
# --------------------------------------------------------------------------------------------------

def _pad_hw(x: np.ndarray, top: int, bottom: int, left: int, right: int, value) -> np.ndarray:
    """Pad (positive) or crop (negative) H and W of an NHWC array."""
    if top < 0:
        x = x[:, -top:]
        top = 0
    if bottom < 0:
        x = x[:, :x.shape[1] + bottom]
        bottom = 0
    if left < 0:
        x = x[:, :, -left:]
        left = 0
    if right < 0:
        x = x[:, :, :x.shape[2] + right]
        right = 0
    if top or bottom or left or right:
        x = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=value)
    return x


def _fit_window(ctx: _Ctx, x: np.ndarray, out_hw, kernel_hw, stride_hw, dil_hw, pads, value):
    """Pad x (NHWC) by pads=(top, bottom, left, right); extend/crop bottom/right so that exactly
    out_hw windows fit (windows past the padded input see `value`, i.e. ceil-mode / output
    padding)."""
    top, _bottom, left, _right = pads
    oh, ow = out_hw
    kh, kw = kernel_hw
    sh, sw = stride_hw
    dh, dw = dil_hw
    H, W = x.shape[1], x.shape[2]
    if oh <= 0 or ow <= 0:
        raise ctx.error(f"empty output {out_hw}")
    need_h = (oh - 1) * sh + dh * (kh - 1) + 1
    need_w = (ow - 1) * sw + dw * (kw - 1) + 1
    # only the rows/columns that some window touches matter: the bottom/right padding is whatever
    # makes exactly out_hw windows fit (extra attribute padding is never read; missing padding is
    # ceil-mode / output padding and reads `value`)
    bottom = need_h - (top + H)
    right = need_w - (left + W)
    if top >= need_h or left >= need_w or top + H <= 0 or left + W <= 0:
        # no window touches the input (e.g. a pad of a kernel or more on a 1x1 map): every window sees only
        # `value`, as ONNX and the DPU's zero padding define it (a conv gives its bias)
        return np.full((x.shape[0], need_h, need_w, x.shape[3]), value, dtype=x.dtype)
    return _pad_hw(x, top, bottom, left, right, value)


def _absmax(a: np.ndarray) -> int:
    if a.size == 0:
        return 1
    return max(1, abs(int(a.min())), abs(int(a.max())))


def _conv_acc_chunks(ctx: _Ctx, x: np.ndarray, w: np.ndarray, groups: int, out_hw,
                     stride_hw, dil_hw, pads, exact: bool = True):
    """Yield (n, row0, row1, acc) with acc int64 [row1-row0, OW, O] for the conv of the integer
    NHWC x with the integer OHWI w (I = C/groups).  The products are summed in float32 when every
    partial sum is provably an integer below 2^24, else in float64 (below 2^53): exact.
    With exact=False (float convs) x and w may be float and acc is float64."""
    N, H, W, C = x.shape
    O, kh, kw, Ig = w.shape
    if C != Ig * groups or O % groups:
        raise ctx.error(f"channels do not match: input C={C}, weights {list(w.shape)}, "
                        f"group={groups}")
    oh, ow = out_hw
    sh, sw = stride_hw
    dh, dw = dil_hw
    xp = _fit_window(ctx, x, out_hw, (kh, kw), stride_hw, dil_hw, pads, 0)
    ftype: type[np.floating] = np.float64
    if exact:
        # exactness: |acc| <= kh*kw*Ig*128*128 (plus any partial sum); float32 exact below 2^24
        bound = kh * kw * Ig * _absmax(x) * _absmax(w)
        ftype = np.float32 if bound < (1 << 24) else np.float64
        if bound >= (1 << 53):
            raise ctx.error("accumulator could exceed 2^53")
    Og = O // groups
    wf = w.astype(ftype)
    rows_per_chunk = max(1, (1 << 22) // max(1, ow * O))
    for n in range(N):
        xn = xp[n].astype(ftype)
        for r0 in range(0, oh, rows_per_chunk):
            r1 = min(oh, r0 + rows_per_chunk)
            nr = r1 - r0
            acc = np.zeros((nr * ow, O), dtype=ftype)
            for ky in range(kh):
                y0 = r0 * sh + ky * dh
                for kx in range(kw):
                    x0 = kx * dw
                    sl = xn[y0:y0 + (nr - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw, :]
                    sl = sl.reshape(nr * ow, C)
                    if groups == 1:
                        acc += sl @ wf[:, ky, kx, :].T
                    else:
                        for g in range(groups):
                            acc[:, g * Og:(g + 1) * Og] += (
                                sl[:, g * Ig:(g + 1) * Ig] @ wf[g * Og:(g + 1) * Og, ky, kx, :].T)
            yield n, r0, r1, (acc.astype(np.int64) if exact else acc).reshape(nr, ow, O)


def _dw_acc_rows(xp: np.ndarray, w: np.ndarray, r0: int, r1: int, ow: int, stride_hw, dil_hw,
                 dtype=np.int64):
    """Depthwise acc for output rows r0..r1-1 of the padded int NHWC xp and int w [M, kh, kw, C]
    -> int64 [N, r1-r0, OW, C*M] (output channel c*M + m uses w[m, :, :, c]); float convs pass
    dtype=np.float64."""
    N, C = xp.shape[0], xp.shape[3]
    M, kh, kw, _ = w.shape
    sh, sw = stride_hw
    dh, dw = dil_hw
    nr = r1 - r0
    acc = np.zeros((N, nr, ow, C, M), dtype=dtype)
    for ky in range(kh):
        y0 = r0 * sh + ky * dh
        for kx in range(kw):
            sl = xp[:, y0:y0 + (nr - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw, :]
            acc += sl.astype(dtype)[..., None] * w[:, ky, kx, :].T.astype(dtype)
    return acc.reshape(N, nr, ow, C * M)


def _conv_geometry(ctx: _Ctx, x_hw, kernel_hw, transposed: bool = False):
    kw_, kh_ = ctx.ints("kernel", [kernel_hw[1], kernel_hw[0]], 2)
    if (kh_, kw_) != tuple(kernel_hw):
        raise ctx.error(f"attribute kernel {[kw_, kh_]} (w, h) does not match weights "
                        f"{kernel_hw[0]}x{kernel_hw[1]} (h x w)")
    sw, sh = ctx.ints("stride", [1, 1], 2)
    dw, dh = ctx.ints("dilation", [1, 1], 2)
    if min(sw, sh, dw, dh) < 1:
        raise ctx.error("stride and dilation must be >= 1")
    pad = ctx.attrs.get("pad", None)
    if pad is None:
        pad_mode = str(ctx.attrs.get("pad_mode", "FLOOR")).upper()
        if pad_mode == "SAME" and not transposed:
            oh, ow = ctx.out_shape[1], ctx.out_shape[2]
            th = max((oh - 1) * sh + dh * (kh_ - 1) + 1 - x_hw[0], 0)
            tw = max((ow - 1) * sw + dw * (kw_ - 1) + 1 - x_hw[1], 0)
            pad = [tw // 2, tw - tw // 2, th // 2, th - th // 2]
        else:
            pad = [0, 0, 0, 0]
    pl, pr, pt, pb = ctx.ints("pad", pad, 4) if "pad" in ctx.attrs else [int(p) for p in pad]
    return (sh, sw), (dh, dw), (pt, pb, pl, pr)


def _zero_insert(x: np.ndarray, sh: int, sw: int) -> np.ndarray:
    N, H, W, C = x.shape
    z = np.zeros((N, (H - 1) * sh + 1, (W - 1) * sw + 1, C), dtype=x.dtype)
    z[:, ::sh, ::sw, :] = x
    return z


def _transpose_input(ctx, x, kernel_hw, strides, dils, pads):
    """§7.9: insert stride-1 zeros, pad d*(k-1)-pad per side, then a stride-1 conv (unflipped)."""
    sh, sw = strides
    dh, dw = dils
    kh, kw = kernel_hw
    pt, pb, pl, pr = pads
    xz = _zero_insert(x, sh, sw)
    eh, ew = dh * (kh - 1), dw * (kw - 1)
    return xz, (1, 1), (eh - pt, eh - pb, ew - pl, ew - pr)
