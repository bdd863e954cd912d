"""The key bookkeeping of `deps.ExactTokenPlanner.add_all` as one compiled pass: for every planner step, per engine
the latest earlier instruction it conflicts with (the `need` of `ExactTokenPlanner.add`), from keys already made
dense. It is a function of the keys alone (the tokens do not enter it), so it can run before the token placement."""
from __future__ import annotations

from opendpu.isa.numba_cache import set_numba_cache_dir

set_numba_cache_dir()          # one Numba cache for every opendpu kernel

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402


@njit(cache=True)
def exact_needs(eng: np.ndarray, ptr: np.ndarray, keys: np.ndarray, total: int) -> np.ndarray:
    """need[s, P]: the latest step of engine P whose write step s reads or writes, or whose read step s writes
    (-1: none). Step s reads keys[ptr[2s]:ptr[2s+1]] and writes keys[ptr[2s+1]:ptr[2s+2]] (dense key indices below
    `total`), and becomes their latest writer / reader of engine eng[s]."""
    n = eng.shape[0]
    wr = np.full((4, total), -1, np.int64)
    rd = np.full((4, total), -1, np.int64)
    need = np.full((n, 4), -1, np.int64)
    for s in range(n):
        for j in range(ptr[2 * s], ptr[2 * s + 1]):
            k = keys[j]
            for p in range(4):
                if wr[p, k] > need[s, p]:
                    need[s, p] = wr[p, k]
        for j in range(ptr[2 * s + 1], ptr[2 * s + 2]):
            k = keys[j]
            for p in range(4):
                if wr[p, k] > need[s, p]:
                    need[s, p] = wr[p, k]
                if rd[p, k] > need[s, p]:
                    need[s, p] = rd[p, k]
        e = eng[s]
        for j in range(ptr[2 * s + 1], ptr[2 * s + 2]):
            wr[e, keys[j]] = s
        for j in range(ptr[2 * s], ptr[2 * s + 1]):
            rd[e, keys[j]] = s
    return need
