"""Fast exact kernels of the golden's quantized ops (issue 32): whole layers as one matrix product each, with the
integer post-processing (bias, DPU rounding, activation, saturation) in one pass.

* int8 x int8 convolutions in one group: onnxruntime's MatMulInteger in int32 (_intgemm.py: exact for K < 2^17,
  the form chosen by a worst-case probe on this CPU); everything else: BLAS in float32 / float64 (below).
* The rounding: _kernels.finish_rows in int64, one pass (finish_int); where its bound does not hold (e.g. a left
  shift), the float form finish_dpu_round; else ops.py's integer path.  Eltwise ADD of two int8 maps: one pass.

Exactness argument (every kernel here relies on it; tests/test_ref_fast.py checks it against the integer paths
of ops.py at the boundaries):

* Operands are integers: |x| <= X (X = 128 for int8 data, 255 for uint8, else the data's largest magnitude) and
  |w| <= Wm (128 for int8 weights, else the largest magnitude), so every product x*w is an integer with
  |x*w| <= P = X*Wm (2^14 for int8 x int8, 2^15 - 2^7 for uint8 x int8).
* A sum of k such products, in any order and with any blocking or fused multiply-adds (what BLAS does), has
  every partial sum an integer of magnitude <= k*P.  IEEE binary32 represents every integer up to 2^24, and an
  IEEE addition or FMA whose exact result is representable returns it; so the float32 sum is exact when
  k*P <= 2^24, i.e. for k <= 2^24 // P reduction terms (1,024 for int8 x int8, 514 for uint8 x int8).
* The same holds with the tighter bound X * sum_k |w_ko| for output channel o (every partial sum of that output is
  at most it); ConvGemm uses it, when the dtype bound K*P would need chunks, to keep one float32 product.
* Longer reductions are cut into chunks of at most that many terms: each chunk is one float32 product (exact),
  the chunk results are added in float64, exact while K*P < 2^53 (binary64 integers).  When a chunk would be
  shorter than _MIN_CHUNK terms (e.g. int16 data) the whole product is float64 (exact when K*P < 2^53).
* The bias never enters a product: with acc the exact sum, the DPU value is v = a / 2^k with
  a = 2*acc + bias*2^(sb+1) and k = sc + 1 (spec §6.1, §7.2), formed after the product as acc*2^-sc plus the
  per-channel bias*2^(sb-sc) (any integer bias; its largest magnitude B enters the bound below).  y =
  clip(floor(v + 1/2)) is computed as trunc(clip(v + 128.5)) - 128.  In float64 every value formed is exact
  while |a|*max(1, |p|) plus the offset, over the finest bit 2^-(k+m), stays below 2^53 with
  |a| <= 2*K*P + B*2^(sb+1) (checked per layer; else ops.py's integer path runs); leaky's slope p/2^m multiplies
  the exact v.  float32 post-processing (float32 accumulator, no leaky slope, sc <= 15) needs no bound on the
  sum: see finish_dpu_round.
* Depthwise: each output sums kh*kw products: int8 x int8 in int32 (_kernels.depthwise_int8, one pass); other
  dtypes here, float32 when kh*kw*P <= 2^24, else float64.
* Eltwise ADD: int32 (|4*x| <= 2^17 for int16 data; up to 2^13 inputs stay below 2^31).

Nothing here is shared with the executor (sim/) or the compiler: this is the golden's own arithmetic.
"""

from __future__ import annotations

import numpy as np

from . import _intgemm, _kernels

_F32_EXACT = 1 << 24             # every integer up to this magnitude is a float32
_F64_EXACT = 1 << 53             # ... a float64
_MIN_CHUNK = 64                  # float32 chunks shorter than this: use one float64 product instead
_BLOCK_ELEMS = 1 << 22           # im2col scratch per row block (float32 elements, 16 MB)
_DW_BLOCK_ELEMS = 1 << 18        # depthwise accumulator per row block (stays in cache)


def magnitude_bound(a: np.ndarray) -> int:
    """A bound on |a| for integer data: from the dtype for 8-bit arrays (no pass over the data), else the data."""
    if a.dtype == np.int8:
        return 128
    if a.dtype == np.uint8:
        return 255
    if a.size == 0:
        return 1
    return max(1, abs(int(a.min())), abs(int(a.max())))


def reduction_plan(k: int, product_bound: int) -> tuple[type, int]:
    """(dtype, chunk): sum k products of magnitude <= product_bound exactly.  float32 in chunks of `chunk` terms
    (chunk >= k: one product), or float64 in one product; raises ValueError if even float64 is not exact."""
    if k * product_bound >= _F64_EXACT:
        raise ValueError("accumulator could exceed 2^53")
    chunk = _F32_EXACT // max(1, product_bound)
    if chunk >= k:
        return np.float32, k
    if chunk >= _MIN_CHUNK:
        n = -(-k // chunk)
        return np.float32, -(-k // n)           # n chunks of equal length (<= chunk): no short last product
    return np.float64, k


# --------------------------------------------------------------------------------------------------
# convolution as a matrix product (im2col)
# --------------------------------------------------------------------------------------------------

def _im2col(xp: np.ndarray, r0: int, r1: int, ow: int, kernel_hw, stride_hw, dil_hw, dtype) -> np.ndarray:
    """Patches of output rows r0..r1-1 of the padded NHWC xp: [N*(r1-r0)*OW, kh*kw*C] in (ky, kx, c) order,
    i.e. matching OHWI weights flattened to [O, kh*kw*C]."""
    N, C = xp.shape[0], xp.shape[3]
    kh, kw = kernel_hw
    sh, sw = stride_hw
    dh, dw = dil_hw
    nr = r1 - r0
    if kh == kw == 1:
        sl = xp[:, r0 * sh:r0 * sh + (nr - 1) * sh + 1:sh, 0:(ow - 1) * sw + 1:sw, :]
        return np.ascontiguousarray(sl, dtype=dtype).reshape(N * nr * ow, C)
    if xp.dtype == dtype == np.uint8 and xp.flags.c_contiguous:
        out = np.empty((N * nr * ow, kh * kw * C), np.uint8)         # the int8 products' operand: one pass
        _kernels.im2col(xp, r0, nr, ow, kh, kw, sh, sw, dh, dw, out)
        return out
    buf = np.empty((N, nr, ow, kh, kw, C), dtype=dtype)
    for ky in range(kh):
        y0 = r0 * sh + ky * dh
        for kx in range(kw):
            x0 = kx * dw
            buf[:, :, :, ky, kx, :] = xp[:, y0:y0 + (nr - 1) * sh + 1:sh, x0:x0 + (ow - 1) * sw + 1:sw, :]
    return buf.reshape(N * nr * ow, kh * kw * C)


def _chunked_matmul(a: np.ndarray, bt: np.ndarray, chunk: int) -> np.ndarray:
    """a @ bt^T ([..., M, K] x [..., O, K] -> [..., M, O]) in float32 chunks of `chunk` reduction terms, the
    chunk results summed in float64 (see the module docstring).  bt is passed untransposed: BLAS takes the
    transpose flag, so the weights need only a dtype cast, no transposing copy."""
    k = a.shape[-1]
    if chunk >= k:
        return a @ np.swapaxes(bt, -1, -2)
    out = np.zeros(a.shape[:-1] + bt.shape[-2:-1], dtype=np.float64)
    for k0 in range(0, k, chunk):
        out += a[..., k0:k0 + chunk] @ np.swapaxes(bt[..., k0:k0 + chunk], -1, -2)
    return out


class ConvGemm:
    """One conv layer as a matrix product: the weights prepared once, then `rows(r0, r1)` gives the exact
    accumulator [N, r1-r0, OW, O] (float32 or float64 holding integers) of those output rows."""

    def __init__(self, xp: np.ndarray, w: np.ndarray, groups: int, out_hw, stride_hw, dil_hw):
        self.xp, self.groups, self.out_hw = xp, groups, out_hw
        self.stride_hw, self.dil_hw = stride_hw, dil_hw
        O, kh, kw, ig = w.shape
        self.kernel_hw = (kh, kw)
        k = kh * kw * ig
        C = xp.shape[3]
        self.row_block = max(1, _BLOCK_ELEMS // max(1, xp.shape[0] * out_hw[1] * kh * kw * C))
        # int8 x int8 in one group: onnxruntime's exact int32 MatMulInteger (_intgemm), on the data offset to uint8
        self.igemm = _intgemm.for_weights(w, k, xp.shape[0] * out_hw[0] * out_hw[1] * O * k) \
            if groups == 1 and xp.dtype == w.dtype == np.int8 else None
        if self.igemm is not None:
            self.xp = xp.view(np.uint8) ^ np.uint8(0x80)
            self.dtype: type = np.uint8
            self.chunk = k
            self.acc_bound = 128 * self.igemm.l1
            return
        xm, wm = magnitude_bound(xp), magnitude_bound(w)
        self.dtype, self.chunk = reduction_plan(k, xm * wm)
        self.acc_bound = k * xm * wm                        # |acc| <= acc_bound (exact integer)
        og = O // groups
        # [O, K] (or [G, Og, K]): OHWI flattened, in the patches' (ky, kx, c) order
        self.wmat = w.reshape(O, k) if groups == 1 else w.reshape(groups, og, k)
        self.wmat = self.wmat.astype(self.dtype)
        if self.chunk < k and self.dtype == np.float32 and k * wm <= _F32_EXACT:
            # the tighter bound X * max_o sum_k |w_ko| (every partial sum of output o is at most that): real
            # weights are mostly far from +-128, so a long reduction usually still fits one float32 product.
            # The row sums of |w| are integers <= k*wm <= 2^24: exact in float32.
            l1 = int((np.abs(self.wmat) @ np.ones(k, np.float32)).max())
            if xm * l1 <= _F32_EXACT:
                self.chunk, self.acc_bound = k, xm * l1

    def rows(self, r0: int, r1: int) -> np.ndarray:
        N = self.xp.shape[0]
        ow = self.out_hw[1]
        cols = _im2col(self.xp, r0, r1, ow, self.kernel_hw, self.stride_hw, self.dil_hw, self.dtype)
        if self.igemm is not None:
            acc = self.igemm(cols)                          # int32, exact
        elif self.groups == 1:
            acc = _chunked_matmul(cols, self.wmat, self.chunk)
        else:
            G = self.groups
            kh, kw = self.kernel_hw
            ig = self.xp.shape[3] // G
            cg = cols.reshape(-1, kh * kw, G, ig).transpose(2, 0, 1, 3).reshape(G, -1, kh * kw * ig)
            acc = _chunked_matmul(cg, self.wmat, self.chunk)                  # [G, M, Og]
            acc = acc.transpose(1, 0, 2).reshape(cols.shape[0], -1)
        return acc.reshape(N, r1 - r0, ow, -1)


# --------------------------------------------------------------------------------------------------
# depthwise
# --------------------------------------------------------------------------------------------------

def depthwise_blocks(xp: np.ndarray, w: np.ndarray, out_hw, stride_hw, dil_hw):
    """Yield (r0, r1, acc) with acc [N, r1-r0, OW, C*M] the exact depthwise accumulator of the padded int
    NHWC xp and w [M, kh, kw, C] (output channel c*M + m uses w[m, :, :, c]), float32 when kh*kw products fit
    2^24 (float64 otherwise), in row blocks that stay in cache.  |acc| <= depthwise_bound(xp, w)."""
    N, C = xp.shape[0], xp.shape[3]
    M, kh, kw, _ = w.shape
    oh, ow = out_hw
    sh, sw = stride_hw
    dh, dw = dil_hw
    dtype = np.float32 if kh * kw * magnitude_bound(xp) * magnitude_bound(w) <= _F32_EXACT else np.float64
    xf = xp.astype(dtype)
    # the weights of each tap repeated along a row, [M, kh, kw, OW, C]: the products then run over whole
    # (OW, C) rows (numpy's inner loop spans OW*C elements, not just the C of a broadcast weight vector)
    wf = np.ascontiguousarray(np.broadcast_to(w.astype(dtype)[:, :, :, None, :], (M, kh, kw, ow, C)))
    rows = max(1, _DW_BLOCK_ELEMS // max(1, N * ow * C * M))
    for r0 in range(0, oh, rows):
        r1 = min(oh, r0 + rows)
        nr = r1 - r0
        acc = np.empty((N, nr, ow, C, M), dtype=dtype)
        tmp = np.empty((N, nr, ow, C), dtype=dtype)
        for ky in range(kh):
            y0 = r0 * sh + ky * dh
            for kx in range(kw):
                sl = xf[:, y0:y0 + (nr - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw, :]
                for m in range(M):
                    if ky == kx == 0:                       # the first tap initialises the accumulator
                        np.multiply(sl, wf[m, ky, kx], out=acc[..., m])
                    else:
                        np.multiply(sl, wf[m, ky, kx], out=tmp)
                        acc[..., m] += tmp
        yield r0, r1, acc.reshape(N, nr, ow, C * M)


def depthwise_bound(xp: np.ndarray, w: np.ndarray) -> int:
    """kh*kw*X*Wm: a bound on |acc| of depthwise_blocks."""
    return w.shape[1] * w.shape[2] * magnitude_bound(xp) * magnitude_bound(w)


# --------------------------------------------------------------------------------------------------
# post-processing: bias, DPU rounding, activation, saturation
# --------------------------------------------------------------------------------------------------

def act_window(nl: str, fp_out: int | None) -> tuple[int, int]:
    """The int8 clip window [lo, hi] of a conv's nonlinearity after rounding (ops._activate_round): ReLU from 0,
    ReLU6 at 96 when fp_out <= 4 (spec §7.2)."""
    if nl in ("RELU", "RELU6"):
        return 0, 96 if nl == "RELU6" and fp_out is not None and fp_out <= 4 else 127
    return -128, 127


def finish_int(acc: np.ndarray, acc_bound: int, bias: np.ndarray | None, sc: int, sb_eff: int, nl: str,
               fp_out: int | None, slope: tuple[int, int] | None) -> np.ndarray | None:
    """The int8 DPU rounding of an exact accumulator [..., O] in one int64 pass (_kernels.finish_rows), or None
    when a value could leave int64's safe range or the nonlinearity is not one of NONE / RELU / RELU6 / a leaky
    slope p / 2^m (the caller then takes finish_dpu_round or the integer path)."""
    leaky = nl in ("LEAKYRELU", "PRELU")
    if nl not in ("NONE", "", "RELU", "RELU6") and not leaky:
        return None
    p, m = slope if leaky and slope is not None else (1, 0)
    if leaky and slope is None or sb_eff < -1:
        return None
    O = acc.shape[-1]
    if bias is None or bias.size == 0:
        b2, b2max = np.zeros(O, dtype=np.int64), 0
    else:
        bmax = int(np.abs(bias.astype(np.int64)).max())
        b2max = bmax << (sb_eff + 1)
        if b2max >= 1 << 62:
            return None
        b2 = bias.astype(np.int64).reshape(O) << (sb_eff + 1)
    k = sc + 1
    if not _kernels.finish_bound_ok(acc_bound, b2max, k, p, m if leaky else 0):
        return None
    lo, hi = act_window(nl, fp_out)
    a2 = acc.reshape(-1, O)
    out = np.empty(a2.shape, dtype=np.int8)
    _kernels.finish_rows(a2, b2, k, lo, hi, leaky, p, m if leaky else 0, out)
    return out.reshape(acc.shape)


def finish_dpu_round(acc: np.ndarray, acc_bound: int, bias: np.ndarray | None, sc: int, sb_eff: int,
                     nl: str, fp_out: int | None, slope: tuple[int, int] | None) -> np.ndarray | None:
    """int8 y = sat(round_half_up(ACT((2*acc + bias*2^(sb_eff+1)) / 2^(sc+1)))), or None when the float form
    cannot be proven exact (the caller then takes the integer path).  nl is NONE / RELU / RELU6 / LEAKYRELU /
    PRELU with `slope` = (p, m) for the latter two (slope p / 2^m).  A float32 acc may be overwritten.

    With v = a / 2^k the exact value (a = 2*acc + bias*2^(sb+1), k = sc + 1), y = clip(floor(v + 1/2)) is
    computed as trunc(clip(v + 128.5, lo + 128, hi + 128)) - 128 (uint8, then the top bit flipped), i.e.
    acc*2^-sc + c with the per-channel c = bias*2^(sb-sc) + 128.5.
    float64 (any acc): every value formed is exact (numerators below 2^53, checked below).
    float32 (acc float32 and exact, no leaky slope, sc <= 15, c exact in float32): acc*2^-sc is exact, and the sum
    is rounded once.  Only sums in the open window (lo + 128, hi + 129) decide the result by their value; there
    they are below 2^8 with their finest bit 2^-(sc+1), so at most 9 + sc <= 24 significant bits: exact.  Sums
    outside the window round (monotonically) to a value on the same side of the representable window ends, so
    the clip gives the same bound.  Hence the result is exact without the sum itself being exact."""
    if nl not in ("NONE", "", "RELU", "RELU6", "LEAKYRELU", "PRELU") or abs(sc) > 60:
        return None
    leaky = nl in ("LEAKYRELU", "PRELU")
    p, m = 1, 0
    if leaky:
        if slope is None or slope[1] < 0:
            return None
        p, m = slope
    bmax = 0 if bias is None or bias.size == 0 else int(np.abs(bias.astype(np.int64)).max())
    # the float64 values formed are acc/2^sc, bias*2^(sb-sc), a/2^k, a*p/2^e (e = k + m) and these + 128.5;
    # each is exact while its numerator over its finest bit stays below 2^53
    a_max = 2 * acc_bound + (bmax << (sb_eff + 1))
    k = sc + 1
    for q, e in ((1, k), (max(1, abs(p)), k + m)):
        num = a_max * q + (129 << e) if e >= 1 else 2 * ((a_max * q << -e) + 129)
        if num >= _F64_EXACT:
            return None
    lo, hi = act_window(nl, fp_out)
    bterm = None if bias is None else bias.astype(np.float64) * 2.0 ** (sb_eff - sc)     # exact
    c = 128.5 if bterm is None else bterm + 128.5
    t: np.ndarray | None = None
    if acc.dtype == np.float32 and not leaky and sc <= 15:
        c32 = np.float32(c) if bterm is None else bterm.astype(np.float32) + np.float32(128.5)
        if np.array_equal(c32, c):
            t = acc
            t *= np.float32(2.0 ** -sc)
            t += c32
    if t is None:
        t = np.multiply(acc, 2.0 ** -sc, dtype=np.float64)                 # acc / 2^sc  (exact)
        if leaky:
            if bterm is not None:
                t += bterm                                                  # a / 2^k
            np.multiply(t, p * 2.0 ** -m, out=t, where=t < 0)             # a*p / 2^(k+m) where a < 0
            t += 128.5
        else:
            t += c
    np.clip(t, lo + 128, hi + 128, out=t)
    u = t.astype(np.uint8)
    u ^= 0x80
    return u.view(np.int8)


# --------------------------------------------------------------------------------------------------
# eltwise ADD
# --------------------------------------------------------------------------------------------------

def eltwise_add_dpu_round(xs: list[np.ndarray], shifts: list[int], k: int, nl: str) -> np.ndarray | None:
    """int8 sat(round_half_up(ACT(sum_i floor(4*x_i / 2^shifts[i]) / 2^k))) for int8 / int16 inputs in int32
    (|4*x| <= 2^17, so the sum of up to 2^13 inputs and the rounding offset stay below 2^31), or None when the
    inputs or the nonlinearity need the general integer path (int64) of ops.py."""
    if nl not in ("NONE", "", "RELU") or len(xs) > (1 << 13) or any(x.dtype not in (np.int8, np.int16) for x in xs):
        return None
    if len(xs) == 2 and xs[0].shape == xs[1].shape and xs[0].dtype == xs[1].dtype == np.int8 \
            and all(0 <= sh <= 31 for sh in shifts):            # the common case in one pass (_kernels)
        out = np.empty(xs[0].shape, dtype=np.int8)
        _kernels.eltwise_add2(np.ascontiguousarray(xs[0]).reshape(-1), np.ascontiguousarray(xs[1]).reshape(-1),
                              shifts[0], shifts[1], k, 0 if nl == "RELU" else -128, out.reshape(-1))
        return out
    s = np.zeros(np.broadcast_shapes(*(x.shape for x in xs)), dtype=np.int32)
    for x, sh in zip(xs, shifts):
        t = x.astype(np.int32) << 2
        if sh:
            t >>= min(sh, 31)
        s += t
    lo = 0 if nl == "RELU" else -128
    if k > 30:                                # |s| <= 2^30 <= 2^(k-1): rounds to 0
        s[...] = 0
    elif k >= 1:
        s += np.int32(1 << (k - 1))
        s >>= k
    elif k < 0:
        np.clip(s, -256, 256, out=s)          # any |s| >= 1 already saturates after a left shift of 8 or more
        s <<= min(-k, 8)
    np.clip(s, lo, 127, out=s)
    return s.astype(np.int8)
