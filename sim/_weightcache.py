"""A float32 mirror of the CONV weight banks in the transposed layout of `sim._fastmac.outer_acc` (the fast path of
`sim._kernels`).

The outer-product kernel wants the weights of one CONV as Wq[q, o] (the OCP output channels of a product
position adjacent); the banks hold them as OCP rows, one per output channel (spec §2.2, §6.4). Transposing them
for every CONV cost about as much as a fifth of ResNet-50's arithmetic, and a layer's CONVs over successive strips
read the same weight lines again (55 % of ResNet-50's weight bytes, 38–66 % on MobileNet v2 and YOLOX-nano, B4096).
So the executor keeps, for one `run_range` call, the mirror WT[line·w + b, o] = banks[convw_base + o][line·w + b]
(w = CP bytes per line, lanes above OCP zero) and a validity flag per bank line:

* a CONV converts only the lines of its weight range that are not valid yet, then reads WT[baw·w : baw·w + n]
  in place (a weight range that wraps around the bank end is converted into a fresh array instead);
* every LOAD into a CONV weight bank clears the flags of the lines it may have written, `[bank_addr,
  bank_addr + (length−1)·jump_write + ⌈channel / w⌉)` modulo DEPTH, after it executes. LOAD is the only
  instruction that writes those banks (CONV, ALU and ELEW outputs are checked to be image banks, spec §6).

Banks changed from Python between `run` calls cannot be seen here, so the flags live for one `run_range` call,
like the input tile of `sim._tilecache`.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from opendpu.isa.fields import FIELD_INDEX

_LD = FIELD_INDEX["LOAD"]
LD_BANK, LD_ADDR, LD_LEN, LD_CH, LD_JW = (_LD[n] for n in ("bank_id", "bank_addr", "length", "channel", "jump_write"))


@njit(cache=True, inline="always")
def _stale_run(valid, line, end):
    """(first, stop) of the first run of lines not yet converted in [line, end); first == stop == end when none."""
    while line < end and valid[line] != 0:
        line += 1
    stop = line
    while stop < end and valid[stop] == 0:
        stop += 1
    return line, stop


@njit(cache=True)
def weights(banks, wt, valid, wbase, baw, n, ocp, depth, w):
    """Wq [n, lanes] of the n weight bytes from line baw of the ocp weight banks (zero lanes from ocp up)."""
    nl = n // w
    line0 = baw % depth
    nlanes = wt.shape[1]
    if line0 + nl > depth:                      # wraps around the bank end: a fresh transposed copy
        Wq = np.zeros((n, nlanes), np.float32)
        tot = depth * w
        p = line0 * w
        for o in range(ocp):
            brow = banks[wbase + o]
            for k in range(n):
                Wq[k, o] = brow[(p + k) % tot]
        return Wq
    line = line0
    while True:                                 # runs of lines not converted yet: one pass per channel each
        line, l1 = _stale_run(valid, line, line0 + nl)
        if line == l1:
            break
        for o in range(nlanes):
            dst = wt[line * w:l1 * w, o]
            if o < ocp:
                src = banks[wbase + o][line * w:l1 * w]
                for k in range(dst.size):
                    dst[k] = src[k]
            else:
                for k in range(dst.size):
                    dst[k] = 0
        for j in range(line, l1):
            valid[j] = 1
        line = l1
    return wt[line0 * w:line0 * w + n]


@njit(cache=True)
def invalidate_after_load(f, valid, wbase, ocp, depth, w):
    """Clear the flags of the lines LOAD f (just executed) may have written, if it wrote a CONV weight bank."""
    bank = f[LD_BANK]
    if bank < wbase or bank >= wbase + ocp:
        return
    span = (f[LD_LEN] - 1) * f[LD_JW] + (f[LD_CH] + w - 1) // w
    if span >= depth:
        valid[:] = 0
        return
    a = f[LD_ADDR] % depth
    for k in range(span):
        valid[(a + k) % depth] = 0


@njit(cache=True, inline="always")
def _byte_sum(v):
    """The sum of the four signed bytes of the int32 word held in int64 v (sign-extended)."""
    return ((v << 56) >> 56) + ((v << 48) >> 56) + ((v << 40) >> 56) + ((v << 32) >> 56)


@njit(cache=True)
def weights_vnni(banks, wt32, wsl, valid, wbase, baw, n, ocp, depth, w, wsum):
    """The int8 form for `sim._vnni` (CP a multiple of 4, so a line is whole quads): Wv [n/4, lanes] int32 words of
    the n weight bytes from line baw (the 4 bytes of quad k of output channel o in word [k, o], in order; lanes
    from ocp up zero), and wsum[o] = the sum of those n bytes of channel o, from per-line sums kept beside the
    mirror (wsl [depth, lanes]). The mirror is wt32 [depth·w/4, lanes]."""
    nl = n // w
    line0 = baw % depth
    nlanes = wt32.shape[1]
    w4 = w // 4
    wsum[:] = 0
    if line0 + nl > depth:                      # wraps around the bank end: a fresh copy
        Wv = np.zeros((n // 4, nlanes), np.int32)
        tot = depth * w4
        p = line0 * w4
        for o in range(ocp):
            brow = banks[wbase + o].view(np.int32)
            for k in range(n // 4):
                v = brow[(p + k) % tot]
                Wv[k, o] = v
                wsum[o] += _byte_sum(np.int64(v))
        return Wv
    line = line0
    while True:                                 # runs of lines not converted yet: one pass per channel each
        line, l1 = _stale_run(valid, line, line0 + nl)
        if line == l1:
            break
        for o in range(ocp):
            src = banks[wbase + o].view(np.int32)[line * w4:l1 * w4]
            dst = wt32[line * w4:l1 * w4, o]
            for k in range(src.size):
                dst[k] = src[k]
        for j in range(line, l1):               # per-line sums from the mirror's rows: whole rows of lanes at a time
            s = wsl[j]
            s[:] = 0
            for k in range(j * w4, (j + 1) * w4):
                row = wt32[k]
                for o in range(nlanes):
                    s[o] += _byte_sum(np.int64(row[o]))
        for j in range(line, l1):
            valid[j] = 1
        line = l1
    for line in range(line0, line0 + nl):
        for o in range(ocp):
            wsum[o] += wsl[line, o]
    return wt32[line0 * w4:line0 * w4 + n // 4]
