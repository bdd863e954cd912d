"""Vectorised exact multiply-accumulate of CONV (spec §6.4) and ALU dwconv (§6.8), the fast path of `sim._kernels`.

Why float32 is exact here. Every operand is an int8 read from a bank (padding and `channel_offset` make zeros),
so one product has |x·w| ≤ 128·128 = 2^14. A partial sum of n ≤ CHUNK = 1024 products is an integer with
|s| ≤ 1024·2^14 = 2^24, and float32 represents every integer of magnitude ≤ 2^24 exactly. Hence *every*
intermediate value of a chunk's sum — whatever order the additions run in and whether a multiply and an add are
fused — is an exact integer: the result equals the integer dot product bit for bit, whatever the vector code.
Chunk sums (each ≤ 2^24) are added in float64,
exact up to 2^53, far above the largest CONV accumulator (16·16·4096 products of ≤ 2^14: |acc| ≤ 2^34, spec §6.4).
The bias never enters floating point: `_kernels._conv` forms `2·acc + bias·2^shift_bias` (≤ 2^35 + 2^27) in
int64 from the accumulator returned here, then applies the exact integer rounding of spec §6.1.

Layout (made by the caller from the gathered tile): X float32 [rows_in, cols_in·IC], one tile row per input row
with the IC channels of each column adjacent, so the (kx, i) window of output column x in kernel row ky is the
contiguous run X[h·stride_h + ky, x·stride_w·IC : x·stride_w·IC + kernel_w·IC]. W float32 [OCP, kernel_h,
kernel_w·IC] with the same (kx, i) order, transposed by `conv_acc` to [kernel_h, kernel_w·IC, OCP] so that the
OCP output channels of one product are adjacent. The kernel (`_tile8x16`) takes 8 output pixels (of any rows) ×
16 output channels per pass: each product position q loads one vector of 16 weights and multiplies it by each
pixel's x[q], into 8 vector accumulators (an outer product per q; no horizontal sums, so short reductions of 16–64
products run nearly as fast as long ones). Its 128 accumulators are written out as scalars because Numba has no
vector type; LLVM's SLP vectoriser packs each pixel's 16 into one vector multiply-add. A kernel, not a GEMM
library call: the instruction's 16 output channels make a matrix too narrow for BLAS to pay off, and Numba reaches
BLAS only through SciPy, which is no dependency.

Measured on the 2-core AMD EPYC (AVX-512) machine, ResNet-50 shapes: ~45–50 GMAC/s for reductions of ≥ 256
products, ~25–40 for 48–192, ~10 for 16 (the previous 4×4 dot-product kernel: 35–42, ~10–20 and ~3), against
~10 GMAC/s of the scalar int64 loops (which stay as `DpuMachine(fast=False)`).

The same bound covers the products of the ALU dwconv with int8 weights (`dw_acc`, channels as lanes, float32 per
CHUNK kernel positions; its bias is added in int64 too). The mode with 16-bit weights (dwconv_w16b0: products up
to 2^22) keeps the integer loops.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import config

CHUNK = 1024          # products per float32 partial sum: 1024 · 2^14 = 2^24, the float32 exact-integer limit
NP = 8                # output pixels per tile
LANES = 16            # output channels per tile (one 512-bit vector of float32)


@njit(cache=True, fastmath={"contract"})
def _tile8x16(x0, x1, x2, x3, x4, x5, x6, x7, Wk, q0, n, o0, acc, p0):
    """acc[p0+t, o0+j] += Σ_{q<n} x_t[q]·Wk[q0+q, o0+j] for 8 pixels t × 16 channels j (n ≤ CHUNK: exact)."""
    z = np.float32(0)
    s00 = s01 = s02 = s03 = s04 = s05 = s06 = s07 = s08 = s09 = s0a = s0b = s0c = s0d = s0e = s0f = z
    s10 = s11 = s12 = s13 = s14 = s15 = s16 = s17 = s18 = s19 = s1a = s1b = s1c = s1d = s1e = s1f = z
    s20 = s21 = s22 = s23 = s24 = s25 = s26 = s27 = s28 = s29 = s2a = s2b = s2c = s2d = s2e = s2f = z
    s30 = s31 = s32 = s33 = s34 = s35 = s36 = s37 = s38 = s39 = s3a = s3b = s3c = s3d = s3e = s3f = z
    s40 = s41 = s42 = s43 = s44 = s45 = s46 = s47 = s48 = s49 = s4a = s4b = s4c = s4d = s4e = s4f = z
    s50 = s51 = s52 = s53 = s54 = s55 = s56 = s57 = s58 = s59 = s5a = s5b = s5c = s5d = s5e = s5f = z
    s60 = s61 = s62 = s63 = s64 = s65 = s66 = s67 = s68 = s69 = s6a = s6b = s6c = s6d = s6e = s6f = z
    s70 = s71 = s72 = s73 = s74 = s75 = s76 = s77 = s78 = s79 = s7a = s7b = s7c = s7d = s7e = s7f = z
    for q in range(n):
        w = Wk[q0 + q, o0:o0 + 16]
        w0, w1, w2, w3 = w[0], w[1], w[2], w[3]
        w4, w5, w6, w7 = w[4], w[5], w[6], w[7]
        w8, w9, wa, wb = w[8], w[9], w[10], w[11]
        wc, wd, we, wf = w[12], w[13], w[14], w[15]
        a = x0[q]
        s00, s01, s02, s03 = s00 + a * w0, s01 + a * w1, s02 + a * w2, s03 + a * w3
        s04, s05, s06, s07 = s04 + a * w4, s05 + a * w5, s06 + a * w6, s07 + a * w7
        s08, s09, s0a, s0b = s08 + a * w8, s09 + a * w9, s0a + a * wa, s0b + a * wb
        s0c, s0d, s0e, s0f = s0c + a * wc, s0d + a * wd, s0e + a * we, s0f + a * wf
        a = x1[q]
        s10, s11, s12, s13 = s10 + a * w0, s11 + a * w1, s12 + a * w2, s13 + a * w3
        s14, s15, s16, s17 = s14 + a * w4, s15 + a * w5, s16 + a * w6, s17 + a * w7
        s18, s19, s1a, s1b = s18 + a * w8, s19 + a * w9, s1a + a * wa, s1b + a * wb
        s1c, s1d, s1e, s1f = s1c + a * wc, s1d + a * wd, s1e + a * we, s1f + a * wf
        a = x2[q]
        s20, s21, s22, s23 = s20 + a * w0, s21 + a * w1, s22 + a * w2, s23 + a * w3
        s24, s25, s26, s27 = s24 + a * w4, s25 + a * w5, s26 + a * w6, s27 + a * w7
        s28, s29, s2a, s2b = s28 + a * w8, s29 + a * w9, s2a + a * wa, s2b + a * wb
        s2c, s2d, s2e, s2f = s2c + a * wc, s2d + a * wd, s2e + a * we, s2f + a * wf
        a = x3[q]
        s30, s31, s32, s33 = s30 + a * w0, s31 + a * w1, s32 + a * w2, s33 + a * w3
        s34, s35, s36, s37 = s34 + a * w4, s35 + a * w5, s36 + a * w6, s37 + a * w7
        s38, s39, s3a, s3b = s38 + a * w8, s39 + a * w9, s3a + a * wa, s3b + a * wb
        s3c, s3d, s3e, s3f = s3c + a * wc, s3d + a * wd, s3e + a * we, s3f + a * wf
        a = x4[q]
        s40, s41, s42, s43 = s40 + a * w0, s41 + a * w1, s42 + a * w2, s43 + a * w3
        s44, s45, s46, s47 = s44 + a * w4, s45 + a * w5, s46 + a * w6, s47 + a * w7
        s48, s49, s4a, s4b = s48 + a * w8, s49 + a * w9, s4a + a * wa, s4b + a * wb
        s4c, s4d, s4e, s4f = s4c + a * wc, s4d + a * wd, s4e + a * we, s4f + a * wf
        a = x5[q]
        s50, s51, s52, s53 = s50 + a * w0, s51 + a * w1, s52 + a * w2, s53 + a * w3
        s54, s55, s56, s57 = s54 + a * w4, s55 + a * w5, s56 + a * w6, s57 + a * w7
        s58, s59, s5a, s5b = s58 + a * w8, s59 + a * w9, s5a + a * wa, s5b + a * wb
        s5c, s5d, s5e, s5f = s5c + a * wc, s5d + a * wd, s5e + a * we, s5f + a * wf
        a = x6[q]
        s60, s61, s62, s63 = s60 + a * w0, s61 + a * w1, s62 + a * w2, s63 + a * w3
        s64, s65, s66, s67 = s64 + a * w4, s65 + a * w5, s66 + a * w6, s67 + a * w7
        s68, s69, s6a, s6b = s68 + a * w8, s69 + a * w9, s6a + a * wa, s6b + a * wb
        s6c, s6d, s6e, s6f = s6c + a * wc, s6d + a * wd, s6e + a * we, s6f + a * wf
        a = x7[q]
        s70, s71, s72, s73 = s70 + a * w0, s71 + a * w1, s72 + a * w2, s73 + a * w3
        s74, s75, s76, s77 = s74 + a * w4, s75 + a * w5, s76 + a * w6, s77 + a * w7
        s78, s79, s7a, s7b = s78 + a * w8, s79 + a * w9, s7a + a * wa, s7b + a * wb
        s7c, s7d, s7e, s7f = s7c + a * wc, s7d + a * wd, s7e + a * we, s7f + a * wf
    r = acc[p0 + 0, o0:o0 + 16]
    r[0], r[1], r[2], r[3] = r[0] + s00, r[1] + s01, r[2] + s02, r[3] + s03
    r[4], r[5], r[6], r[7] = r[4] + s04, r[5] + s05, r[6] + s06, r[7] + s07
    r[8], r[9], r[10], r[11] = r[8] + s08, r[9] + s09, r[10] + s0a, r[11] + s0b
    r[12], r[13], r[14], r[15] = r[12] + s0c, r[13] + s0d, r[14] + s0e, r[15] + s0f
    r = acc[p0 + 1, o0:o0 + 16]
    r[0], r[1], r[2], r[3] = r[0] + s10, r[1] + s11, r[2] + s12, r[3] + s13
    r[4], r[5], r[6], r[7] = r[4] + s14, r[5] + s15, r[6] + s16, r[7] + s17
    r[8], r[9], r[10], r[11] = r[8] + s18, r[9] + s19, r[10] + s1a, r[11] + s1b
    r[12], r[13], r[14], r[15] = r[12] + s1c, r[13] + s1d, r[14] + s1e, r[15] + s1f
    r = acc[p0 + 2, o0:o0 + 16]
    r[0], r[1], r[2], r[3] = r[0] + s20, r[1] + s21, r[2] + s22, r[3] + s23
    r[4], r[5], r[6], r[7] = r[4] + s24, r[5] + s25, r[6] + s26, r[7] + s27
    r[8], r[9], r[10], r[11] = r[8] + s28, r[9] + s29, r[10] + s2a, r[11] + s2b
    r[12], r[13], r[14], r[15] = r[12] + s2c, r[13] + s2d, r[14] + s2e, r[15] + s2f
    r = acc[p0 + 3, o0:o0 + 16]
    r[0], r[1], r[2], r[3] = r[0] + s30, r[1] + s31, r[2] + s32, r[3] + s33
    r[4], r[5], r[6], r[7] = r[4] + s34, r[5] + s35, r[6] + s36, r[7] + s37
    r[8], r[9], r[10], r[11] = r[8] + s38, r[9] + s39, r[10] + s3a, r[11] + s3b
    r[12], r[13], r[14], r[15] = r[12] + s3c, r[13] + s3d, r[14] + s3e, r[15] + s3f
    r = acc[p0 + 4, o0:o0 + 16]
    r[0], r[1], r[2], r[3] = r[0] + s40, r[1] + s41, r[2] + s42, r[3] + s43
    r[4], r[5], r[6], r[7] = r[4] + s44, r[5] + s45, r[6] + s46, r[7] + s47
    r[8], r[9], r[10], r[11] = r[8] + s48, r[9] + s49, r[10] + s4a, r[11] + s4b
    r[12], r[13], r[14], r[15] = r[12] + s4c, r[13] + s4d, r[14] + s4e, r[15] + s4f
    r = acc[p0 + 5, o0:o0 + 16]
    r[0], r[1], r[2], r[3] = r[0] + s50, r[1] + s51, r[2] + s52, r[3] + s53
    r[4], r[5], r[6], r[7] = r[4] + s54, r[5] + s55, r[6] + s56, r[7] + s57
    r[8], r[9], r[10], r[11] = r[8] + s58, r[9] + s59, r[10] + s5a, r[11] + s5b
    r[12], r[13], r[14], r[15] = r[12] + s5c, r[13] + s5d, r[14] + s5e, r[15] + s5f
    r = acc[p0 + 6, o0:o0 + 16]
    r[0], r[1], r[2], r[3] = r[0] + s60, r[1] + s61, r[2] + s62, r[3] + s63
    r[4], r[5], r[6], r[7] = r[4] + s64, r[5] + s65, r[6] + s66, r[7] + s67
    r[8], r[9], r[10], r[11] = r[8] + s68, r[9] + s69, r[10] + s6a, r[11] + s6b
    r[12], r[13], r[14], r[15] = r[12] + s6c, r[13] + s6d, r[14] + s6e, r[15] + s6f
    r = acc[p0 + 7, o0:o0 + 16]
    r[0], r[1], r[2], r[3] = r[0] + s70, r[1] + s71, r[2] + s72, r[3] + s73
    r[4], r[5], r[6], r[7] = r[4] + s74, r[5] + s75, r[6] + s76, r[7] + s77
    r[8], r[9], r[10], r[11] = r[8] + s78, r[9] + s79, r[10] + s7a, r[11] + s7b
    r[12], r[13], r[14], r[15] = r[12] + s7c, r[13] + s7d, r[14] + s7e, r[15] + s7f


# The tile kernel is compiled once, before the first program runs (`ensure_compiled`, called by DpuMachine.run and
# so by sim.warm_kernels; not at import, which must not compile), with LLVM's SLP vectoriser, which packs each
# pixel's 16 scalar lanes into one vector multiply-add (Numba turns the SLP pass off by default). Only this function
# gets it: the switch is restored right after, so no other kernel (quant.calib's float reductions among them) is
# compiled differently. SLP only regroups independent lane operations, never reorders a sum, and exactness does not
# depend on it anyway.
_TILE_SIG = (types.float32[::1],) * NP + (types.float32[:, ::1], types.int64, types.int64, types.int64,
                                           types.float64[:, ::1], types.int64)


def ensure_compiled() -> None:
    """Compile (or load from the Numba cache) the tile kernel with SLP, once per process; the kernels that call it
    must not be compiled before this (they would compile it without SLP)."""
    if _tile8x16.overloads:
        return
    old = config.SLP_VECTORIZE
    config.SLP_VECTORIZE = 1
    try:
        _tile8x16.compile(_TILE_SIG)
    finally:
        config.SLP_VECTORIZE = old


@njit(cache=True)
def outer_acc(X, Wq, A, vpp, length, ocp, ic, kh, kw, sh, sw):
    """`conv_acc` by outer products (`_tile8x16`) from weights already transposed to Wq [kh, kw·ic, nb·LANES] (zero
    lanes from ocp up). Output pixels of all vpp rows form one list (h·length + x), taken NP at a time (the last
    tile repeats the last pixel; its extra rows are dropped), and output channels LANES at a time. X must be
    C-contiguous."""
    L = kw * ic
    step = sw * ic
    P = vpp * length
    nb = Wq.shape[2] // LANES
    cols = X.shape[1]
    Xf = X.reshape(-1)
    acc = np.zeros((P + NP, nb * LANES), np.float64)
    off = np.empty(NP, np.int64)
    for p0 in range(0, P, NP):
        for ky in range(kh):
            for t in range(NP):
                p = min(p0 + t, P - 1)
                off[t] = ((p // length) * sh + ky) * cols + (p % length) * step
            Wk = Wq[ky]
            for q0 in range(0, L, CHUNK):
                n = min(CHUNK, L - q0)
                for ob in range(nb):
                    _tile8x16(Xf[off[0] + q0:], Xf[off[1] + q0:], Xf[off[2] + q0:], Xf[off[3] + q0:],
                              Xf[off[4] + q0:], Xf[off[5] + q0:], Xf[off[6] + q0:], Xf[off[7] + q0:],
                              Wk, q0, n, ob * LANES, acc, p0)
    for h in range(vpp):
        for x in range(length):
            for o in range(ocp):
                A[h, x * ocp + o] = np.int64(acc[h * length + x, o])


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
def _conv_acc_dot(X, W, A, vpp, length, ocp, ic, kh, kw, sh, sw):
    """`conv_acc` by dot products (4 pixels × 4 channels per pass, a horizontal sum at the end of each).

    Output pixels of all vpp rows form one list, so short strips still fill whole 4-pixel tiles. Rows of
    kernel_w·IC < MERGE products are concatenated over the kernel_h rows of each output pixel (an im2col along
    the height), so that one reduction is long enough to vectorise."""
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


@njit(cache=True, inline="always")
def use_outer(L, P):
    """The kernel choice of `conv_acc` (L = kernel_w·IC products per kernel row, P output pixels): outer products
    unless long rows over few pixels make transposing the weights cost more than the outer products save (measured
    on ResNet-50's CONVs: the faster kernel for all but a few percent of the time)."""
    return L < 128 or (P >= 64 and L <= 512)


@njit(cache=True)
def conv_acc(X, W, A, vpp, length, ocp, ic, kh, kw, sh, sw):
    """A[h, x·ocp + o] = Σ_{ky,kx,i} X[h·sh+ky, (x·sw+kx)·ic + i] · W[o, ky, kx·ic + i], exact, as int64, by either
    kernel (`use_outer`); `sim._kernels._conv` takes Wq for `outer_acc` from the mirror of `sim._weightcache`."""
    L = kw * ic
    if use_outer(L, vpp * length):
        Wq = np.zeros((kh, L, (ocp + LANES - 1) // LANES * LANES), np.float32)
        for ky in range(kh):
            for q in range(L):
                for o in range(ocp):
                    Wq[ky, q, o] = W[o, ky, q]
        outer_acc(X, Wq, A, vpp, length, ocp, ic, kh, kw, sh, sw)
    else:
        _conv_acc_dot(X, W, A, vpp, length, ocp, ic, kh, kw, sh, sw)


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
