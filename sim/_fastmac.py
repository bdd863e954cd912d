"""Vectorised exact multiply-accumulate of CONV (spec §6.4) and ALU dwconv (§6.8), the fast path of `sim._kernels`.

Why float32 is exact here. Every operand is an int8 read from a bank (padding and `channel_offset` make zeros),
so one product has |x·w| ≤ 128·128 = 2^14. A partial sum of n ≤ CHUNK = 1024 products is an integer with
|s| ≤ 1024·2^14 = 2^24, and float32 represents every integer of magnitude ≤ 2^24 exactly. Hence *every*
intermediate value of a chunk's sum — whatever order the additions run in and whether a multiply and an add are
fused — is an exact integer: the result equals the integer dot product bit for bit. That is what lets LLVM
reassociate the sum (`fastmath`: the loop is vectorised and interleaved over 16 float32 lanes); for real
numbers it would change results, for these integers it cannot. Chunk sums (each ≤ 2^24) are added in float64,
exact up to 2^53, far above the largest CONV accumulator (16·16·4096 products of ≤ 2^14: |acc| ≤ 2^34, spec §6.4).
The bias never enters floating point: `_kernels._conv` forms `2·acc + bias·2^shift_bias` (≤ 2^35 + 2^27) in
int64 from the accumulator returned here, then applies the exact integer rounding of spec §6.1.

Layout (made by the caller from the gathered tile): X float32 [rows_in, cols_in·IC], one tile row per input row
with the IC channels of each column adjacent, so the (kx, i) window of output column x in kernel row ky is the
contiguous run X[h·stride_h + ky, x·stride_w·IC : x·stride_w·IC + kernel_w·IC]. W float32 [OCP, kernel_h,
kernel_w·IC] with the same (kx, i) order. The kernel computes 4 output pixels (of any rows) × 4 output channels
per pass (16 independent dot products: 8 vector loads feed 16 vector multiply-adds), and single pixels /
channels at the edges. A dot product, not a GEMM library call: the instruction's 16 output channels make a
matrix too narrow for BLAS to pay off, and Numba reaches BLAS only through SciPy, which is no dependency.

Measured on the 2-core AMD EPYC (AVX-512) machine: ~35–42 GMAC/s for reductions of ≥ 256 products, ~10 GMAC/s
for 64, against ~10 GMAC/s of the scalar int64 loops it replaces (which stay as `DpuMachine(fast=False)`).

The same bound covers the products of the ALU dwconv with int8 weights (`dw_acc`, channels as lanes, float32 per
CHUNK kernel positions; its bias is added in int64 too). The mode with 16-bit weights (dwconv_w16b0: products up
to 2^22) keeps the integer loops.
"""
from __future__ import annotations

import numpy as np
from numba import njit

CHUNK = 1024          # products per float32 partial sum: 1024 · 2^14 = 2^24, the float32 exact-integer limit


@njit(cache=True, fastmath=True)
def _dot4x4(xa, xb, xc, xd, w0, w1, w2, w3, n, acc, t0, o0):
    """acc[t0+t, o0+j] += Σ_q x_t[q]·w_j[q] over q < n (n ≤ CHUNK: exact, see the module docstring)."""
    s00 = np.float32(0)
    s01 = np.float32(0)
    s02 = np.float32(0)
    s03 = np.float32(0)
    s10 = np.float32(0)
    s11 = np.float32(0)
    s12 = np.float32(0)
    s13 = np.float32(0)
    s20 = np.float32(0)
    s21 = np.float32(0)
    s22 = np.float32(0)
    s23 = np.float32(0)
    s30 = np.float32(0)
    s31 = np.float32(0)
    s32 = np.float32(0)
    s33 = np.float32(0)
    for q in range(n):
        a = xa[q]
        b = xb[q]
        c = xc[q]
        d = xd[q]
        p0 = w0[q]
        p1 = w1[q]
        p2 = w2[q]
        p3 = w3[q]
        s00 += a * p0
        s01 += a * p1
        s02 += a * p2
        s03 += a * p3
        s10 += b * p0
        s11 += b * p1
        s12 += b * p2
        s13 += b * p3
        s20 += c * p0
        s21 += c * p1
        s22 += c * p2
        s23 += c * p3
        s30 += d * p0
        s31 += d * p1
        s32 += d * p2
        s33 += d * p3
    acc[t0, o0] += s00
    acc[t0, o0 + 1] += s01
    acc[t0, o0 + 2] += s02
    acc[t0, o0 + 3] += s03
    acc[t0 + 1, o0] += s10
    acc[t0 + 1, o0 + 1] += s11
    acc[t0 + 1, o0 + 2] += s12
    acc[t0 + 1, o0 + 3] += s13
    acc[t0 + 2, o0] += s20
    acc[t0 + 2, o0 + 1] += s21
    acc[t0 + 2, o0 + 2] += s22
    acc[t0 + 2, o0 + 3] += s23
    acc[t0 + 3, o0] += s30
    acc[t0 + 3, o0 + 1] += s31
    acc[t0 + 3, o0 + 2] += s32
    acc[t0 + 3, o0 + 3] += s33


@njit(cache=True, fastmath=True)
def _dot1x4(xa, w0, w1, w2, w3, n, acc, t, o0):
    """acc[t, o0+j] += Σ_q xa[q]·w_j[q] over q < n (n ≤ CHUNK)."""
    s0 = np.float32(0)
    s1 = np.float32(0)
    s2 = np.float32(0)
    s3 = np.float32(0)
    for q in range(n):
        a = xa[q]
        s0 += a * w0[q]
        s1 += a * w1[q]
        s2 += a * w2[q]
        s3 += a * w3[q]
    acc[t, o0] += s0
    acc[t, o0 + 1] += s1
    acc[t, o0 + 2] += s2
    acc[t, o0 + 3] += s3


@njit(cache=True, fastmath=True)
def _dot1(xa, w0, n):
    """Σ_q xa[q]·w0[q] over q < n (n ≤ CHUNK), exact."""
    s = np.float32(0)
    for q in range(n):
        s += xa[q] * w0[q]
    return s


@njit(cache=True, inline="always")
def _run(X, p, ky, length, sh, step, q0, n):
    """The n products of output pixel p (= h·length + x) in kernel row ky from position q0 of its window."""
    b = (p % length) * step + q0
    return X[(p // length) * sh + ky, b:b + n]


@njit(cache=True)
def _pixel_tiles(X, W, ky, L, P, length, sh, step, ocp, acc):
    """acc[p, o] += Σ_{q<L} X[h·sh + ky, x·step + q]·W[o, ky, q] for the P = vpp·length output pixels p = h·length + x:
    tiles of 4 pixels (from any rows) × 4 channels, reductions in chunks of CHUNK products."""
    o4 = ocp - ocp % 4
    for p0 in range(0, P, 4):
        nt = min(4, P - p0)
        for q0 in range(0, L, CHUNK):
            n = min(CHUNK, L - q0)
            for o in range(0, o4, 4):
                w0 = W[o, ky, q0:q0 + n]
                w1 = W[o + 1, ky, q0:q0 + n]
                w2 = W[o + 2, ky, q0:q0 + n]
                w3 = W[o + 3, ky, q0:q0 + n]
                if nt == 4:
                    _dot4x4(_run(X, p0, ky, length, sh, step, q0, n), _run(X, p0 + 1, ky, length, sh, step, q0, n),
                            _run(X, p0 + 2, ky, length, sh, step, q0, n), _run(X, p0 + 3, ky, length, sh, step, q0, n),
                            w0, w1, w2, w3, n, acc, p0, o)
                else:
                    for t in range(nt):
                        _dot1x4(_run(X, p0 + t, ky, length, sh, step, q0, n), w0, w1, w2, w3, n, acc, p0 + t, o)
            for o in range(o4, ocp):
                w0 = W[o, ky, q0:q0 + n]
                for t in range(nt):
                    acc[p0 + t, o] += _dot1(_run(X, p0 + t, ky, length, sh, step, q0, n), w0, n)


MERGE = 128           # kernel rows shorter than this are concatenated (one reduction over kernel_h rows)


@njit(cache=True)
def conv_acc(X, W, A, vpp, length, ocp, ic, kh, kw, sh, sw):
    """A[h, x·ocp + o] = Σ_{ky,kx,i} X[h·sh+ky, (x·sw+kx)·ic + i] · W[o, ky, kx·ic + i], exact, as int64.

    Output pixels of all vpp rows form one list, so short strips still fill whole 4-pixel tiles. Rows of
    kernel_w·IC < MERGE products are concatenated over the kernel_h rows of each output pixel (an im2col along
    the height, e.g. the 7×1 first layer after channel augmentation), so that one reduction is long enough to
    vectorise."""
    L = kw * ic
    step = sw * ic
    P = vpp * length
    acc = np.zeros((P, ocp), np.float64)
    if kh > 1 and L < MERGE:
        K = kh * L
        R = np.empty((P, K), np.float32)
        for h in range(vpp):
            for x in range(length):
                for ky in range(kh):
                    R[h * length + x, ky * L:(ky + 1) * L] = X[h * sh + ky, x * step:x * step + L]
        _pixel_tiles(R, W.reshape(ocp, 1, K), 0, K, P, 1, 1, 0, ocp, acc)
    else:
        for ky in range(kh):
            _pixel_tiles(X, W, ky, L, P, length, sh, step, ocp, acc)
    for h in range(vpp):
        for x in range(length):
            for o in range(ocp):
                A[h, x * ocp + o] = np.int64(acc[h * length + x, o])


@njit(cache=True)
def dw_acc(X, W, A, vpp, length, ic, kh, kw, kd, sh, sw):
    """ALU dwconv accumulators (spec §6.8, int8 weights): A[h, x·ic + c] = Σ_{ky,kx,d} X[h·sh+ky, (x·sw+kx)·ic·kd +
    d·ic + c] · W[(ky·kw + kx)·kd + d, c], exact, as int64. The channels are the vector lanes; each lane sums up to
    CHUNK products in float32 (exact, module docstring) before the float64 total takes them."""
    ick = ic * kd
    a32 = np.zeros(ic, np.float32)
    a64 = np.zeros(ic, np.float64)
    for h in range(vpp):
        for x in range(length):
            a32[:] = 0
            a64[:] = 0
            n = 0
            for ky in range(kh):
                row = X[h * sh + ky]
                for kx in range(kw):
                    for d in range(kd):
                        p = (x * sw + kx) * ick + d * ic
                        xs = row[p:p + ic]
                        wr = W[(ky * kw + kx) * kd + d]
                        for c in range(ic):
                            a32[c] += xs[c] * wr[c]
                        n += 1
                        if n == CHUNK:
                            for c in range(ic):
                                a64[c] += a32[c]
                            a32[:] = 0
                            n = 0
            for c in range(ic):
                A[h, x * ic + c] = np.int64(a64[c] + a32[c])
