"""Fixed-point arithmetic and calibration (fix-point selection) with vai_q semantics.

Contract: /work/shared/reference/quantizer.md §2. Definitions chosen here (facts taken from the open
vai_q_pytorch sources, Xilinx/Vitis-AI ``src/vai_quantizer/vai_q_pytorch``; no code copied):

Fixed point
    value = q * 2^-fp, q = clamp(round(x * 2^fp), lo, hi), hi = 2^(bw-1) - 1, lo = -2^(bw-1)
    (``narrow_range``: lo = -hi). ``fp`` may be negative (|x| > 2^(bw-1) needs fp < 0).

Rounding (``round_values``; the same rules as the nndct ``fix_neuron`` kernel; the one implementation and
the mode names live in ``compiler.fixpoint``, shared with the runtime and the compiler)
    half_even  ties to the even integer                       (nndct method -1)
    half_up    ties toward +inf: -2.5 -> -2, 2.5 -> 3           (nndct 2, "DPU round")
    half_down  ties toward zero: -2.5 -> -2, 2.5 -> 2           (nndct 6; note: toward zero, not -inf)
    std_round  ties away from zero (C ``round``): -2.5 -> -3    (nndct 3)
    floor      toward -inf                                      (nndct 4)

Fix-point cap
    vai_q_pytorch clamps every chosen fix position to ``max_fix_position`` = 12 when bw <= 8 and to
    15 otherwise (option ``nndct_max_fix_position``). Every public selector here takes ``max_fp``:
    ``"auto"`` (default) applies that cap (``default_max_fix_point``), an int sets another cap,
    ``None`` disables it.

``maxmin_fix_point(absmax)`` ("non-overflow")
    The largest fp with absmax * 2^fp <= hi, then capped. absmax == 0 has no finite answer: it
    returns the cap (12 for int8, matching vai_q, whose search returns 18 for an all-zero tensor
    and then caps it), or bw-1 when ``max_fp=None``.
    Difference to vai_q's ``diffs_fix_pos``: vai_q uses max(x_max/(2^(bw-1)-0.5), x_min/(-2^(bw-1)-0.5))
    as the step, i.e. it tolerates values that round to hi (up to hi+0.5). Here the strict rule
    (no value is ever clipped at the maxmin position) is used; the two differ only when
    absmax * 2^(fp+1) falls in (hi, hi+0.5].

Candidate set for error-minimising methods
    fp in [m, m+4] with m = the maxmin fix point of the data in question (vai_q "scope" 5:
    offsets 0..4). Positions below m only add rounding error without removing clipping, so they
    are never candidates. Ties between candidates go to the smaller fp (vai_q keeps the first
    strict minimum; the smaller fp never clips more).

Methods (activations, ``Observer``)
    maxmin      running max |x| over all batches -> maxmin_fix_point. With statistic 'mean' or
                'median' the per-batch maxmin positions are reduced instead ('max' = running max).
    diffs       vai_q_pytorch default. Per batch: the candidate fp minimising the L2 error
                sum((x - fake_quant(x, fp))^2) over that batch, quantised with the observer's round
                mode and range (vai_q ``diffs_fix_pos``: sum of squared differences, verified), then
                capped. Batches are reduced by ``statistic`` (below). A tie is off by half a step
                whichever way it goes, so among the nearest modes the round mode cannot change a
                squared error (or the choice); only floor differs.
    mse         a histogram of x over the whole calibration set (below); the candidate fp
                minimising the estimated total squared error. Each histogram bin is assumed to hold
                values spread uniformly inside it; the error of a bin is the mean squared error of
                ``MSE_SUBPOINTS`` evenly spaced points inside the bin (clipping and rounding error
                both included; positive and negative values are kept apart so lo/hi are exact).
                Exact zeros are counted separately and cost nothing.
    entropy     KL-divergence calibration (TensorRT style) restricted to power-of-two thresholds:
                for candidate fp the threshold is T = 2^(bw-1) * 2^-fp (= (hi+1) * 2^-fp), i.e.
                i = T / bin_width bins of the |x| histogram (exact zeros excluded; this replaces
                vai_q's ``bins[0] = bins[1]`` trick). Reference P = the first i bins with all mass
                beyond T added to bin i-1; candidate Q = the first i bins (without the outlier mass)
                merged into L = min(2^(bw-1), i) equal groups, each group's mass spread evenly over its
                non-empty bins. Bins with P > 0 but Q = 0 get the probability of half a sample
                (0.5 / count; then Q is renormalised), so clipping mass is always penalised;
                KL(P||Q) = sum P log(P/Q). Candidates with i < 2^(bw-1) (quantisation
                finer than a histogram bin, so rounding error is invisible) are skipped unless none
                is left, in which case only m is considered (with the default 2048 bins and int8,
                m..m+3 always qualify). Smallest KL wins, ties -> smaller fp.
    percentile  the p-th percentile (default 99.9999) of |x| over all calibration data, read from
                the histogram with linear interpolation inside the bin (vai_q reads the bin's left
                edge) -> maxmin_fix_point of that value.
    Note: in vai_q_pytorch itself, with scale_type "poweroftwo" the methods percentile, mse and
    entropy all fall back to the diffs search (only float-scale quantizers use the histograms).
    Here they are genuine power-of-two variants, as listed above.

Statistics (``calib_statistic_method``) reduce per-batch fix positions (diffs, and maxmin with
mean/median). They are defined on the per-batch scale 2^-fp, so "larger" means a larger range:
    modal   the most frequent fp; ties -> the smaller fp (scipy ``stats.mode``, used by vai_q)
    max     the largest scale = the smallest fp (covers every batch's range)
    mean    the mean of the fps (geometric mean of the scales), rounded; .5 -> the smaller fp
    median  the median of the fps (even count: mean of the middle pair), rounded; .5 -> the smaller fp
vai_q rule (QUANT_CONFIG): 'modal' is only valid with 'diffs'. Defaults (``statistic=None``):
diffs -> modal, maxmin -> max. The histogram methods use all data at once, so a statistic does not apply; any
non-modal value is accepted and ignored (recorded in ``state``).

Histogram (mse, entropy, percentile): two rows of ``bins`` counts (x > 0 and x < 0 by |x|) over
[0, R), R a power of two strictly above the running max |x|, plus a count of exact zeros. When a
larger value arrives, R doubles (as often as needed) and adjacent bin pairs are merged, which is
exact: the result is bit-identical to histogramming all data at once with the final R. Memory is
fixed (2 * bins int64). Power-of-two R and bins make every threshold 2^k fall on a bin edge.

Weights (``weight_fix_point``): maxmin -> maxmin_fix_point; diffs/mse -> the L2 search above on
the whole tensor (vai_q quantises parameters with diffs and method 3 = std_round: pass
``round_mode="std_round"`` for vai_q parity; the default here is half_even per the project brief);
percentile/entropy fall back to diffs.

Errors: ``CalibError`` (a ValueError). NaN/Inf data raise, naming the tensor and the 0-based batch
index (vai_q warns TENSOR_VALUE_INVALID and skips the tensor; an emulator wants the failure); ``fix_point``
before any ``update`` raises a NO_CALIBRATION error. Empty batches are ignored (vai_q returns early on numel() == 0).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from opendpu.compiler import fixpoint as F
from opendpu.compiler.fixpoint import ROUND_MODES
from opendpu.isa.numba_cache import set_numba_cache_dir
from opendpu.quant.onnx_in import QuantError

set_numba_cache_dir()          # one Numba cache for every opendpu kernel
from numba import njit  # noqa: E402

METHODS = ("maxmin", "percentile", "mse", "entropy", "diffs")
STATISTICS = ("modal", "max", "mean", "median")

DIFFS_SCOPE = 5          # candidates m .. m+4 (vai_q scope 5)
MSE_SUBPOINTS = 16       # evaluation points per histogram bin for the mse estimate
_MODE_CODE = {m: i for i, m in enumerate(ROUND_MODES)}
_AUTO = "auto"


class CalibError(QuantError):
    """Calibration / fixed-point error; the message names the tensor and the problem. A QuantError (hence a
    ValueError), so whatever reports quantizer errors reports these too."""


# ------------------------------------------------------------------------------------------------
# parameter checks and fixed-point basics
# ------------------------------------------------------------------------------------------------
def _check_bw(bit_width, who="bit_width"):
    if isinstance(bit_width, bool) or not isinstance(bit_width, (int, np.integer)) or not 2 <= bit_width <= 32:
        raise CalibError(f"{who}: bit_width must be an integer in [2, 32], got {bit_width!r}")
    return int(bit_width)


def _check_mode(mode, who="round_mode"):
    if mode not in _MODE_CODE:
        raise CalibError(f"{who}: unknown round mode {mode!r}; expected one of {ROUND_MODES}")
    return mode


def _qrange(bit_width, narrow_range):
    hi = (1 << (bit_width - 1)) - 1
    return (-hi if narrow_range else -hi - 1), hi


def default_max_fix_point(bit_width: int) -> int:
    """vai_q_pytorch's cap on fix positions: 12 for bit widths <= 8, else 15."""
    return 12 if bit_width <= 8 else 15


def _resolve_cap(max_fp, bit_width):
    if max_fp is None:
        return None
    if isinstance(max_fp, str):
        if max_fp != _AUTO:
            raise CalibError(f"max_fp must be 'auto', None or an int, got {max_fp!r}")
        return default_max_fix_point(bit_width)
    return int(max_fp)


def _apply_cap(fp, cap):
    return int(fp) if cap is None else min(int(fp), cap)


def round_values(x, mode: str) -> np.ndarray:
    """Round to integers with one of ROUND_MODES (compiler.fixpoint.round_values, a CalibError for an unknown
    mode); float64 result, exact for every finite input."""
    return F.round_values(x, _check_mode(mode))


def _int_dtype(bit_width):
    return np.int8 if bit_width <= 8 else np.int16 if bit_width <= 16 else np.int32


def quantize(x, fp: int, bit_width=8, round_mode="half_up", narrow_range=False) -> np.ndarray:
    """q = clamp(round(x * 2^fp), lo, hi) as int8 / int16 / int32 (by bit width). NaN raises, +-Inf saturates."""
    bw = _check_bw(bit_width, "quantize")
    _check_mode(round_mode, "quantize")
    x = np.asarray(x, dtype=np.float64)
    if np.isnan(x).any():
        raise CalibError("quantize: input contains NaN")
    lo, hi = _qrange(bw, narrow_range)
    with np.errstate(over="ignore"):
        v = np.ldexp(x, int(fp))          # exact scaling by 2^fp
    r = np.clip(round_values(np.clip(v, lo - 1, hi + 1), round_mode), lo, hi)
    return r.astype(_int_dtype(bw))


def dequantize(q, fp: int) -> np.ndarray:
    """q * 2^-fp as float32."""
    return np.ldexp(np.asarray(q, dtype=np.float64), -int(fp)).astype(np.float32)


def fake_quant(x, fp, bit_width=8, round_mode="half_up", narrow_range=False) -> np.ndarray:
    """dequantize(quantize(x)) as float32."""
    return dequantize(quantize(x, fp, bit_width, round_mode, narrow_range), fp)


def _maxmin_raw(absmax, bit_width):
    """Uncapped largest fp with absmax * 2^fp <= hi; None for absmax == 0."""
    if absmax == 0:
        return None
    hi = (1 << (bit_width - 1)) - 1
    # absmax in [2^(e-1), 2^e) -> absmax * 2^(bw-1-e) in [2^(bw-2), 2^(bw-1)): right, or one too high
    fp = bit_width - 1 - math.frexp(absmax)[1]
    if math.ldexp(absmax, fp) > hi:                # ldexp is exact
        fp -= 1
    return fp


def maxmin_fix_point(absmax: float, bit_width=8, *, max_fp=_AUTO) -> int:
    """The largest fp with absmax * 2^fp <= hi (no value overflows), capped by ``max_fp``.

    absmax == 0 -> the cap (12 for bw <= 8, 15 otherwise), or bit_width-1 with ``max_fp=None``.
    """
    bw = _check_bw(bit_width, "maxmin_fix_point")
    absmax = float(absmax)
    if not math.isfinite(absmax) or absmax < 0:
        raise CalibError(f"maxmin_fix_point: absmax must be finite and >= 0, got {absmax!r}")
    cap = _resolve_cap(max_fp, bw)
    raw = _maxmin_raw(absmax, bw)
    if raw is None:
        return bw - 1 if cap is None else cap
    return _apply_cap(raw, cap)


# ------------------------------------------------------------------------------------------------
# numba kernels (one pass each over the flat data)
# ------------------------------------------------------------------------------------------------
@njit(inline="always")
def _round_scalar(v, mode):
    """round_values for one float64 (branch-free selects so the loops vectorise; exact)."""
    if mode == 0:                                  # half_even
        return np.rint(v)
    if mode == 4:                                  # floor
        return np.floor(v)
    a = abs(v)
    fa = np.floor(a)
    ra = a - fa                                    # exact
    up = fa + (1.0 if ra >= 0.5 else 0.0)          # |v| rounded, ties away from zero
    dn = fa + (1.0 if ra > 0.5 else 0.0)           # |v| rounded, ties toward zero
    if mode == 3:                                  # std_round
        return np.copysign(up, v)
    if mode == 2:                                  # half_down
        return np.copysign(dn, v)
    return up if v >= 0 else -dn                   # half_up


@njit(cache=True)
def _absmax_kernel(flat):
    """(max |x|, number of NaN/Inf values)."""
    m = 0.0
    bad = 0
    for i in range(flat.size):
        a = abs(np.float64(flat[i]))
        m = max(m, a)
        bad += not (a < np.inf)                    # NaN or Inf
    return m, bad


@njit(inline="always", fastmath={"reassoc", "contract", "nsz"})
def _sse_loop(flat, scale, inv, mode, flo, fhi):
    acc = 0.0
    for i in range(flat.size):
        x = np.float64(flat[i])
        q = min(max(_round_scalar(x * scale, mode), flo), fhi)
        e = x - q * inv                            # q * inv is exact
        acc += e * e
    return acc


@njit(cache=True, fastmath={"reassoc", "contract", "nsz"})
def _sse_kernel(flat, scale, inv, mode, flo, fhi):
    """sum((x - clamp(round(x*scale), flo, fhi) * inv)^2). Each branch inlines the loop with a
    constant mode, so the rounding branches fold away and the loop vectorises."""
    if mode == 0:
        return _sse_loop(flat, scale, inv, 0, flo, fhi)
    if mode == 1:
        return _sse_loop(flat, scale, inv, 1, flo, fhi)
    if mode == 2:
        return _sse_loop(flat, scale, inv, 2, flo, fhi)
    if mode == 3:
        return _sse_loop(flat, scale, inv, 3, flo, fhi)
    return _sse_loop(flat, scale, inv, 4, flo, fhi)


@njit(cache=True)
def _hist_kernel(flat, hist, scale):
    """Count |x| into hist[0] (x >= 0) / hist[1] (x < 0), bin floor(|x|*scale) (last bin catches the
    top); exact zeros are counted in hist[0, 0] as well and the zero count is returned."""
    n = hist.shape[1]
    h = hist.reshape(-1)
    zeros = 0
    blk = 4096
    idx = np.empty(blk, np.int64)
    for s in range(0, flat.size, blk):
        e = min(s + blk, flat.size)
        for i in range(s, e):                      # vectorisable part
            x = np.float64(flat[i])
            j = min(np.int64(abs(x) * scale), n - 1)
            idx[i - s] = j + n * (x < 0)
            zeros += x == 0
        for i in range(e - s):                     # scatter
            h[idx[i]] += 1
    return zeros


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _flat(x, name, what="batch"):
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        raise CalibError(f"tensor {name!r}: {what} has unsupported dtype {a.dtype}")
    if a.dtype != np.float32 and a.dtype != np.float64:
        a = a.astype(np.float32 if a.dtype.itemsize <= 2 else np.float64)
    return np.ascontiguousarray(a).reshape(-1)


def _absmax_checked(flat, name, where):
    if flat.size == 0:
        return 0.0
    m, bad = _absmax_kernel(flat)
    if bad:
        raise CalibError(f"tensor {name!r}: {where} contains {bad} NaN/Inf value(s); "
                         "calibration data must be finite (TENSOR_VALUE_INVALID)")
    return float(m)


def _diffs_search(flat, absmax, bit_width, round_mode, narrow_range):
    """Uncapped diffs fix point of one tensor (None for all-zero data)."""
    m = _maxmin_raw(absmax, bit_width)
    if m is None:
        return None
    lo, hi = _qrange(bit_width, narrow_range)
    code = _MODE_CODE[round_mode]
    sse = [_sse_kernel(flat, math.ldexp(1.0, fp), math.ldexp(1.0, -fp), code, float(lo), float(hi))
           for fp in range(m, m + DIFFS_SCOPE)]
    return m + int(np.argmin(sse))                 # argmin: first minimum -> smaller fp on ties


def _reduce_fps(fps, statistic):
    fps = [int(f) for f in fps]
    if statistic == "modal":
        cnt = Counter(fps)
        best = max(cnt.values())
        return min(f for f, c in cnt.items() if c == best)
    if statistic == "max":
        return min(fps)
    if statistic == "mean":
        return _round_half_down(sum(fps), len(fps))
    s = sorted(fps)                                # median; an even count averages the middle pair
    n = len(s)
    return _round_half_down(s[(n - 1) // 2] + s[n // 2], 2)


def _round_half_down(num, den):
    """round(num/den) with .5 going down (exact integer arithmetic)."""
    return (2 * num + den - 1) // (2 * den)        # floor(num/den + 1/2 - 1/(2 den))


def weight_fix_point(w, method="diffs", bit_width=8, round_mode="half_even", narrow_range=False, *,
                     max_fp=_AUTO, name="weights") -> int:
    """Fix point of a weight / bias tensor (see module docstring); percentile and entropy -> diffs."""
    if method not in METHODS:
        raise CalibError(f"tensor {name!r}: unknown method {method!r}; expected one of {METHODS}")
    bw = _check_bw(bit_width, f"tensor {name!r}")
    _check_mode(round_mode, f"tensor {name!r}")
    cap = _resolve_cap(max_fp, bw)
    flat = _flat(w, name, "tensor")
    if flat.size == 0:
        raise CalibError(f"tensor {name!r}: empty tensor has no fix point")
    absmax = _absmax_checked(flat, name, "tensor")
    if method == "maxmin":
        raw = _maxmin_raw(absmax, bw)
    else:
        raw = _diffs_search(flat, absmax, bw, round_mode, narrow_range)
    if raw is None:
        return bw - 1 if cap is None else cap
    return _apply_cap(raw, cap)


# ------------------------------------------------------------------------------------------------
# observer
# ------------------------------------------------------------------------------------------------
class Observer:
    """Accumulates one activation tensor's statistics over calibration batches and picks its fix point.

    ``statistic=None`` selects the method's default (diffs: modal, maxmin: max, histogram methods:
    not applicable). See the module docstring for every method's definition.
    """

    def __init__(self, name: str, method="diffs", bit_width=8, round_mode="half_up", percentile=99.9999,
                 statistic=None, narrow_range=False, bins=2048, *, max_fp=_AUTO):
        self.name = str(name)
        if method not in METHODS:
            raise CalibError(f"tensor {self.name!r}: unknown calibration method {method!r}; "
                             f"expected one of {METHODS}")
        if statistic is None:
            statistic = {"diffs": "modal", "maxmin": "max"}.get(method)
        elif statistic not in STATISTICS:
            raise CalibError(f"tensor {self.name!r}: unknown calib_statistic_method {statistic!r}; "
                             f"expected one of {STATISTICS}")
        if statistic == "modal" and method != "diffs":
            raise CalibError(f"tensor {self.name!r}: QUANT_CONFIG: calib_statistic_method 'modal' is only "
                             f"valid with method 'diffs', not {method!r}")
        self.method = method
        self.statistic = statistic
        self.bit_width = _check_bw(bit_width, f"tensor {self.name!r}")
        self.round_mode = _check_mode(round_mode, f"tensor {self.name!r}")
        self.narrow_range = bool(narrow_range)
        p = float(percentile)
        if not 0.0 < p <= 100.0:
            raise CalibError(f"tensor {self.name!r}: percentile must be in (0, 100], got {percentile!r}")
        self.percentile = p
        bins = int(bins)
        if bins < 2 or bins & (bins - 1):
            raise CalibError(f"tensor {self.name!r}: bins must be a power of two >= 2, got {bins}")
        self.bins = bins
        self.max_fp = _resolve_cap(max_fp, self.bit_width)
        self._batches = 0
        self._absmax = 0.0
        self._batch_fps: list[int] = []
        self._hist = None          # int64 [2, bins] for histogram methods
        self._range = None         # R (power of two) once a nonzero value was seen
        self._zeros = 0

    # -- accumulation --------------------------------------------------------------------------------
    def update(self, x: np.ndarray) -> None:
        """Add one calibration batch (any shape)."""
        flat = _flat(x, self.name, f"batch {self._batches}")
        if flat.size == 0:
            return
        bmax = _absmax_checked(flat, self.name, f"batch {self._batches}")
        if self.method == "diffs":
            raw = _diffs_search(flat, bmax, self.bit_width, self.round_mode, self.narrow_range)
            self._batch_fps.append(self._finish(raw))
        elif self.method == "maxmin":
            self._batch_fps.append(self._finish(_maxmin_raw(bmax, self.bit_width)))
        else:
            self._hist_add(flat, bmax)
        self._absmax = max(self._absmax, bmax)
        self._batches += 1

    def _finish(self, raw):
        if raw is None:
            return self.bit_width - 1 if self.max_fp is None else self.max_fp
        return _apply_cap(raw, self.max_fp)

    def _hist_add(self, flat, bmax):
        if self._hist is None:
            self._hist = np.zeros((2, self.bins), dtype=np.int64)
        if bmax > 0:
            e = math.frexp(bmax)[1]                # bmax < 2^e
            if self._range is None:
                self._range = math.ldexp(1.0, e)
            elif bmax >= self._range:
                f = 1 << (e - math.frexp(self._range)[1] + 1)  # growth factor (power of two)
                self._rebin(f)
                self._range = math.ldexp(1.0, e)
        if self._range is None:                    # all zeros so far
            self._zeros += int(flat.size)
            return
        z = int(_hist_kernel(flat, self._hist, self.bins / self._range))
        self._hist[0, 0] -= z                      # exact zeros are kept apart
        self._zeros += z

    def _rebin(self, f):
        """Grow the range by the power-of-two factor f, merging groups of f adjacent bins."""
        n = self.bins
        h = self._hist
        if f >= n:
            merged = h.sum(axis=1, keepdims=True)
        else:
            merged = h.reshape(2, n // f, f).sum(axis=2)
        new = np.zeros_like(h)
        new[:, :merged.shape[1]] = merged
        self._hist = new

    # -- results -----------------------------------------------------------------------------------------
    @property
    def absmax(self) -> float:
        """Running max |x| over all batches (0.0 before any update)."""
        return self._absmax

    @property
    def batches(self) -> int:
        return self._batches

    def histogram(self):
        """(counts [2, bins] for x>0 / x<0 by |x|, bin width, exact-zero count) or None."""
        if self._hist is None:
            return None
        width = (self._range / self.bins) if self._range is not None else 0.0
        return self._hist.copy(), width, self._zeros

    def _require(self):
        if self._batches == 0:
            raise CalibError(f"tensor {self.name!r}: NO_CALIBRATION: fix_point() requested before any "
                             "update(); run calibration batches first")

    def value_at_percentile(self, p=None) -> float:
        """The p-th percentile of |x| over all data (histogram, linear inside the bin)."""
        self._require()
        if self._hist is None:
            raise CalibError(f"tensor {self.name!r}: method {self.method!r} keeps no histogram")
        p = self.percentile if p is None else float(p)
        h = self._hist[0] + self._hist[1]
        total = self._zeros + int(h.sum())
        rank = p / 100.0 * total
        if rank <= self._zeros or self._range is None:
            return 0.0
        cum = np.cumsum(h)
        need = rank - self._zeros
        j = int(np.searchsorted(cum, need, side="left"))
        j = min(j, self.bins - 1)
        before = float(cum[j - 1]) if j > 0 else 0.0
        frac = (need - before) / float(h[j]) if h[j] else 1.0
        w = self._range / self.bins
        return min((j + min(max(frac, 0.0), 1.0)) * w, self._absmax)

    def _candidates(self):
        m = _maxmin_raw(self._absmax, self.bit_width)
        return [m + k for k in range(DIFFS_SCOPE)]

    def _mse_fp(self):
        lo, hi = _qrange(self.bit_width, self.narrow_range)
        w = self._range / self.bins
        pts = (np.arange(self.bins)[:, None] + (np.arange(MSE_SUBPOINTS) + 0.5) / MSE_SUBPOINTS) * w
        counts = self._hist.astype(np.float64)
        errs = []
        for fp in self._candidates():
            tot = 0.0
            for row, sign in ((0, 1.0), (1, -1.0)):
                x = sign * pts
                q = np.clip(round_values(np.ldexp(x, fp), self.round_mode), lo, hi)
                e = ((x - np.ldexp(q, -fp)) ** 2).mean(axis=1)
                tot += float(counts[row] @ e)
            errs.append(tot)
        return self._candidates()[int(np.argmin(errs))], errs

    def _entropy_fp(self):
        h = (self._hist[0] + self._hist[1]).astype(np.float64)
        w = self._range / self.bins
        nlev = 1 << (self.bit_width - 1)
        cands = []
        for fp in self._candidates():
            i = math.ldexp(nlev * 1.0, -fp) / w      # threshold in bins (a power of two)
            if i >= 1:
                cands.append((fp, int(i)))
        good = [c for c in cands if c[1] >= nlev]
        cands = good if good else cands[:1]
        kls = []
        for fp, i in cands:
            hh = h if i <= h.size else np.concatenate([h, np.zeros(i - h.size)])
            ref = hh[:i].copy()
            ref[-1] += hh[i:].sum()
            nl = min(nlev, i)
            blocks = hh[:i].reshape(nl, i // nl)
            nz = blocks > 0
            cnt = nz.sum(axis=1)
            mass = blocks.sum(axis=1)
            per = np.divide(mass, cnt, out=np.zeros_like(mass), where=cnt > 0)
            cand = np.where(nz, per[:, None], 0.0).ravel()
            kls.append(_kl(ref, cand, 0.5 / ref.sum()))
        best = int(np.argmin(kls))
        return cands[best][0], [(fp, kl) for (fp, _), kl in zip(cands, kls)]

    def fix_point(self) -> int:
        """The chosen fix point (raises CalibError before any update)."""
        self._require()
        if self.method in ("diffs", "maxmin"):
            if self.method == "maxmin" and self.statistic == "max":
                return self._finish(_maxmin_raw(self._absmax, self.bit_width))
            return _reduce_fps(self._batch_fps, self.statistic)
        if self._range is None:                    # all data was zero
            return self._finish(None)
        if self.method == "percentile":
            v = self.value_at_percentile()
            return self._finish(_maxmin_raw(v, self.bit_width))
        if self.method == "mse":
            return self._finish(self._mse_fp()[0])
        return self._finish(self._entropy_fp()[0])

    def state(self) -> dict:
        """JSON-able summary."""
        st = {
            "name": self.name, "method": self.method, "statistic": self.statistic,
            "bit_width": self.bit_width, "round_mode": self.round_mode, "narrow_range": self.narrow_range,
            "max_fp": self.max_fp, "batches": self._batches, "absmax": float(self._absmax),
            "fix_point": self.fix_point() if self._batches else None,
        }
        if self.method in ("diffs", "maxmin"):
            st["batch_fix_points"] = [int(f) for f in self._batch_fps]
        else:
            st["bins"] = self.bins
            st["zeros"] = int(self._zeros)
            st["bin_width"] = float(self._range / self.bins) if self._range is not None else None
            if self.method == "percentile":
                st["percentile"] = self.percentile
                st["threshold"] = float(self.value_at_percentile()) if self._batches else None
        return st


def make_observer(name, method, **kw) -> Observer:
    """Validated Observer factory (unknown method / statistic, modal with non-diffs -> CalibError)."""
    if method not in METHODS:
        raise CalibError(f"tensor {name!r}: unknown calibration method {method!r}; expected one of {METHODS}")
    return Observer(name, method=method, **kw)


def _kl(p, q, eps):
    """KL(p||q) of two count vectors after normalisation. Bins where p > 0 but q == 0 (only possible
    in the last bin, which holds the clipped mass) get probability eps in q before q is renormalised."""
    p = p / p.sum()
    qs = q.sum()
    if qs <= 0:
        return math.inf
    q = q / qs
    hole = (p > 0) & (q == 0)
    if hole.any():
        q = (q + eps * hole) / (1.0 + eps * int(hole.sum()))
    m = p > 0
    return float(np.sum(p[m] * np.log(p[m] / q[m])))
