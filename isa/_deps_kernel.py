"""Compiled passes behind `deps.KeySpace`, `deps.DenseKeys` and `deps.ExactTokenPlanner.add_dense`: footprint runs
expanded into keys (the one rule for which bank-line and DDR chunks an access touches), and for every planner step,
per engine the latest earlier instruction it conflicts with (the `need` of `ExactTokenPlanner.add`). Needs are a
function of the keys alone (the tokens do not enter them), so they are computed before the token placement."""
from __future__ import annotations

from opendpu.isa.numba_cache import set_numba_cache_dir

set_numba_cache_dir()          # one Numba cache for every opendpu kernel

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402


@njit(cache=True)
def _rows(count, step, width, chunk):
    """1 when a run's gaps are shorter than a chunk (its hull has the same keys), else its number of blocks."""
    return 1 if (count == 1 or step - width < chunk) else count


@njit(cache=True)
def _span(start, count, step, width, r, rows):
    """[lo, hi) of block r of a run, or of its hull when rows is 1."""
    if rows == 1:
        return start, start + (count - 1) * step + width
    return start + r * step, start + r * step + width


@njit(cache=True)
def _line_spans(start, count, step, width, lc, nch, out):
    """[a, b) chunk spans (within 0..nch) of a run of lines modulo the depth, into out; their number. A run whose
    gaps are shorter than a chunk is its hull; a span of nch chunks or more is the whole bank."""
    if count <= 0 or width <= 0:
        return 0
    k = 0
    rows = _rows(count, step, width, lc)
    for r in range(rows):
        lo, hi = _span(start, count, step, width, r, rows)
        c0 = lo // lc
        n = (hi - 1) // lc - c0 + 1
        if n >= nch:
            out[0, 0], out[0, 1] = 0, nch
            return 1
        c0 %= nch
        if c0 + n <= nch:
            out[k, 0], out[k, 1] = c0, c0 + n
            k += 1
        else:
            out[k, 0], out[k, 1] = c0, nch
            out[k + 1, 0], out[k + 1, 1] = 0, c0 + n - nch
            k += 2
    return k


@njit(cache=True)
def expand(run_ptr, runs, nch, lc, dc):
    """The keys of segments (`deps.KeySpace`'s encoding): segment g's runs are runs[run_ptr[g]:run_ptr[g+1]], rows
    (kind, bank or reg, start, count, step, width), kind 0 bank lines (key bank·nch + chunk of lc lines, >= 0), 1
    DDR bytes (key -1 - (reg << 40) - chunk of dc bytes, < 0). Returns (ptr, keys): segment g's keys are
    keys[ptr[g]:ptr[g+1]] (a key twice where two runs overlap)."""
    nseg = run_ptr.shape[0] - 1
    ptr = np.zeros(nseg + 1, np.int64)
    buf = np.empty((2 * 8192, 2), np.int64)
    for phase in range(2):
        keys = np.empty(ptr[nseg] if phase else 0, np.int64)
        pos = 0
        for g in range(nseg):
            for q in range(run_ptr[g], run_ptr[g + 1]):
                kind, a, start, count, step, width = runs[q, 0], runs[q, 1], runs[q, 2], runs[q, 3], runs[q, 4], \
                    runs[q, 5]
                if count <= 0 or width <= 0:
                    continue
                if kind == 0:
                    rows = _rows(count, step, width, lc)
                    if 2 * rows > buf.shape[0]:
                        buf = np.empty((2 * rows, 2), np.int64)
                    m = _line_spans(start, count, step, width, lc, nch, buf)
                    for j in range(m):
                        for c in range(buf[j, 0], buf[j, 1]):
                            if phase:
                                keys[pos] = a * nch + c
                            pos += 1
                else:
                    rows = _rows(count, step, width, dc)
                    for r in range(rows):
                        lo, hi = _span(start, count, step, width, r, rows)
                        for c in range(lo // dc, (hi - 1) // dc + 1):
                            if phase:
                                keys[pos] = -1 - (a << 40) - c
                            pos += 1
            if not phase:
                ptr[g + 1] = pos
    return ptr, keys


@njit(cache=True)
def permute(ptr, keys, order):
    """The segments of instructions order[0], order[1], ... (two segments each: reads, writes), renumbered."""
    n = order.shape[0]
    nptr = np.zeros(2 * n + 1, np.int64)
    for i in range(n):
        k = order[i]
        nptr[2 * i + 1] = nptr[2 * i] + ptr[2 * k + 1] - ptr[2 * k]
        nptr[2 * i + 2] = nptr[2 * i + 1] + ptr[2 * k + 2] - ptr[2 * k + 1]
    nkeys = np.empty(nptr[2 * n], np.int64)
    for i in range(n):
        k = order[i]
        nkeys[nptr[2 * i]:nptr[2 * i + 2]] = keys[ptr[2 * k]:ptr[2 * k + 2]]
    return nptr, nkeys


@njit(cache=True)
def last_conflict(ptr, keys, mark, h, region, floor):
    """1 + the last position p >= floor of `region` whose instruction conflicts with instruction h (h writes what
    it reads or writes, or reads what it writes), else floor. `mark` is zeroed scratch of the key-space size."""
    for j in range(ptr[2 * h], ptr[2 * h + 1]):
        mark[keys[j]] |= 1
    for j in range(ptr[2 * h + 1], ptr[2 * h + 2]):
        mark[keys[j]] |= 2
    e = floor
    for p in range(region.shape[0] - 1, floor - 1, -1):
        x = region[p]
        hit = False
        for j in range(ptr[2 * x], ptr[2 * x + 1]):
            if mark[keys[j]] & 2:
                hit = True
                break
        if not hit:
            for j in range(ptr[2 * x + 1], ptr[2 * x + 2]):
                if mark[keys[j]]:
                    hit = True
                    break
        if hit:
            e = p + 1
            break
    for j in range(ptr[2 * h], ptr[2 * h + 2]):
        mark[keys[j]] = 0
    return e


@njit(cache=True)
def exact_needs(eng, lo, hi, ptr, keys, total):
    """need[s, P]: the latest step of engine P whose write step s reads or writes, or whose read step s writes
    (-1: none). Step s reads the read segments of instructions lo[s]..hi[s]-1 and writes their write segments
    (instruction k: reads keys[ptr[2k]:ptr[2k+1]], writes keys[ptr[2k+1]:ptr[2k+2]]), and becomes their latest
    writer / reader of engine eng[s]."""
    n = eng.shape[0]
    wr = np.full((4, total), -1, np.int64)
    rd = np.full((4, total), -1, np.int64)
    need = np.full((n, 4), -1, np.int64)
    for s in range(n):
        for k in range(lo[s], hi[s]):
            for j in range(ptr[2 * k], ptr[2 * k + 1]):
                c = keys[j]
                for p in range(4):
                    if wr[p, c] > need[s, p]:
                        need[s, p] = wr[p, c]
            for j in range(ptr[2 * k + 1], ptr[2 * k + 2]):
                c = keys[j]
                for p in range(4):
                    if wr[p, c] > need[s, p]:
                        need[s, p] = wr[p, c]
                    if rd[p, c] > need[s, p]:
                        need[s, p] = rd[p, c]
        e = eng[s]
        for k in range(lo[s], hi[s]):
            for j in range(ptr[2 * k + 1], ptr[2 * k + 2]):
                wr[e, keys[j]] = s
            for j in range(ptr[2 * k], ptr[2 * k + 1]):
                rd[e, keys[j]] = s
    return need
