"""Functional bit-exact executor of DPUCZDX8G ISA1 programs (spec §6).

Importing `sim` fixes where Numba keeps its compiled kernels: NUMBA_CACHE_DIR defaults to
`$XDG_CACHE_HOME/opendpu/numba` (else `~/.cache/opendpu/numba`); a NUMBA_CACHE_DIR set by the user wins.
The kernels (`sim._kernels`, `sim._timing`) are compiled on first use, once per machine, and loaded from
that cache afterwards; `warm_kernels()` does that work up front so callers can report it apart from the
time of an inference.
"""
from __future__ import annotations

import time

from opendpu.isa.numba_cache import default_numba_cache_dir, set_numba_cache_dir  # noqa: E402,F401

set_numba_cache_dir()

from .executor import DpuMachine, ExecError  # noqa: E402,F401


def _dispatchers() -> dict:
    """The jitted entry points the sim backend calls from Python (their callees compile with them)."""
    from . import _kernels, _timing
    return {"run_range": _kernels.run_range, "costs": _timing.costs, "schedule": _timing.schedule}


def kernels_status() -> dict:
    """{kernel: {"compiled": bool, "cache_hits": n, "cache_misses": n}} of this process, from Numba's
    dispatcher statistics (a miss is a real compile; a hit is a load from the on-disk cache), plus
    "cache_dir": the directory in use."""
    from numba.core import config
    out = {"cache_dir": config.CACHE_DIR or None}
    for name, d in _dispatchers().items():
        st = d.stats
        out[name] = {"compiled": bool(d.overloads), "cache_hits": int(sum(st.cache_hits.values())),
                     "cache_misses": int(sum(st.cache_misses.values()))}
    return out


def warm_kernels(log=None) -> float:
    """Make every kernel of the sim backend ready (compiled, or loaded from the Numba cache) by timing and
    executing a one-instruction program (END); the signatures are the ones real programs use.

    `log(msg)` is called once, with "compiling simulator kernels (first run only)…", when and only when
    Numba starts a real compile (a cache miss). Returns the seconds spent when a compile happened, 0.0
    when everything came from the cache or was already loaded in this process."""
    from numba.core import event

    from opendpu.isa.program import Instruction
    from opendpu.isa.target import get_target
    from .timing import simulate

    compiled: list[bool] = []

    class _OnCompile(event.Listener):
        def on_start(self, ev):
            if not compiled:
                compiled.append(True)
                if log is not None:
                    log("compiling simulator kernels (first run only)…")

        def on_end(self, ev):
            pass

    t0 = time.perf_counter()
    with event.install_listener("numba:compile", _OnCompile()):
        t = get_target("DPUCZDX8G_ISA1_B512")
        m = DpuMachine(t, {0: 4096}, init_fill="zero")
        simulate([Instruction("END")], t, machine=m)
    return time.perf_counter() - t0 if compiled else 0.0
