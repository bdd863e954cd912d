"""One-pass integer kernels of the golden's post-processing (issue 32): the DPU rounding of a convolution's
accumulator to int8, in int64 arithmetic, element by element (numpy would take six passes over the layer).

Exactness: every value is an int64 formed from the exact accumulator (an integer array, or a float array holding
integers, which converts exactly), the per-channel bias term and the rounding offset; the caller guarantees they
stay below 2^62 in magnitude (`finish_bound_ok`). The formulas are those of compiler/ref/ops.py's integer path
(spec §6.1, §7.2): a = 2*acc + bias*2^(sb_eff+1); y = sat(floor((a + 2^(k-1)) / 2^k)) with k = sc + 1 >= 1, and
for a leaky slope p / 2^m on a < 0: y = sat(floor((a*p + 2^(k+m-1)) / 2^(k+m))). tests/test_ref_fast.py compares
them with that path.
"""
from __future__ import annotations

import numpy as np

from opendpu.isa.numba_cache import set_numba_cache_dir

set_numba_cache_dir()          # one Numba cache for every opendpu kernel

from numba import njit  # noqa: E402

_LIMIT = 1 << 62


def finish_bound_ok(acc_bound: int, b2max: int, k: int, p: int, m: int) -> bool:
    """Every int64 value finish_rows forms stays below 2^62: |2*acc| + |b2| (+ the offset), times |p| for a slope."""
    a = 2 * acc_bound + b2max
    return 1 <= k <= 61 and 0 <= m <= 30 and a * max(1, abs(p)) + (1 << (k + m)) < _LIMIT


@njit(cache=True, nogil=True)
def finish_rows(acc, b2, k, lo, hi, leaky, p, m, out):  # pragma: no cover - compiled by Numba
    """out[i, o] = the int8 DPU rounding of acc[i, o] (2-D, any integer or integral float dtype) with the
    per-channel bias term b2[o] = bias*2^(sb_eff+1) (int64), shift k, clip window [lo, hi], leaky slope p/2^m."""
    M, O = acc.shape
    half = np.int64(1) << (k - 1)
    km = k + m
    half_m = np.int64(1) << (km - 1)
    for i in range(M):
        for o in range(O):
            a = 2 * np.int64(acc[i, o]) + b2[o]
            if leaky and a < 0:
                y = (a * p + half_m) >> km
            else:
                y = (a + half) >> k
            if y < lo:
                y = lo
            elif y > hi:
                y = hi
            out[i, o] = y


@njit(cache=True, nogil=True)
def eltwise_add2(x0, x1, s0, s1, k, lo, out):  # pragma: no cover - compiled by Numba
    """out = sat(round(((4*x0) >> s0) + ((4*x1) >> s1)) / 2^k)) on flat int8 arrays (_fast.eltwise_add_dpu_round's
    formula for two inputs): k >= 1 rounds half up, k == 0 keeps the sum, k < 0 shifts left (the sum clipped to
    +-256 first, where any left shift of 8 or more already saturates), then the window [lo, 127]."""
    for i in range(out.size):
        s = ((np.int64(x0[i]) << 2) >> s0) + ((np.int64(x1[i]) << 2) >> s1)
        if k > 30:
            s = 0
        elif k >= 1:
            s = (s + (np.int64(1) << (k - 1))) >> k
        elif k < 0:
            if s > 256:
                s = 256
            elif s < -256:
                s = -256
            s = s << min(-k, 8)
        if s < lo:
            s = lo
        elif s > 127:
            s = 127
        out[i] = s


@njit(cache=True, nogil=True)
def depthwise_int8(xp, w, oh, ow, sh, sw, dh, dw, out):  # pragma: no cover - compiled by Numba
    """out[n, y, x, c*M + m] = sum_{ky, kx} xp[n, y*sh + ky*dh, x*sw + kx*dw, c] * w[m, ky, kx, c] in int32 (the
    padded int8 NHWC xp, int8 w [M, kh, kw, C]; kh*kw products of at most 2^14 each: exact below 2^17 taps)."""
    N, _, _, C = xp.shape
    M, kh, kw, _ = w.shape
    acc = np.empty(C, np.int32)
    for n in range(N):
        for y in range(oh):
            for x in range(ow):
                for m in range(M):
                    acc[:] = 0
                    for ky in range(kh):
                        for kx in range(kw):
                            row = xp[n, y * sh + ky * dh, x * sw + kx * dw]
                            wt = w[m, ky, kx]
                            for c in range(C):
                                acc[c] += np.int32(row[c]) * np.int32(wt[c])
                    for c in range(C):
                        out[n, y, x, c * M + m] = acc[c]


@njit(cache=True, nogil=True)
def im2col(xp, r0, nr, ow, kh, kw, sh, sw, dh, dw, out):  # pragma: no cover - compiled by Numba
    """out[(n·nr + r)·ow + x, (ky·kw + kx)·C + c] = xp[n, (r0 + r)·sh + ky·dh, x·sw + kx·dw, c] for the padded NHWC
    xp and out (both C-contiguous): the patches of output rows r0 .. r0+nr-1 in (ky, kx, c) order, by flat indices,
    one run of C bytes per kernel position."""
    N, H, W, C = xp.shape
    xf = xp.reshape(-1)
    of = out.reshape(-1)
    K = kh * kw * C
    for n in range(N):
        for r in range(nr):
            y0 = (r0 + r) * sh
            for x in range(ow):
                j = ((n * nr + r) * ow + x) * K
                for ky in range(kh):
                    b = ((n * H + y0 + ky * dh) * W + x * sw) * C
                    for kx in range(kw):
                        i = b + kx * dw * C
                        dst = of[j:j + C]               # slices, then 0-based indices: a vectorised copy
                        src = xf[i:i + C]
                        for c in range(C):
                            dst[c] = src[c]
                        j += C
