"""Evaluating a data set over a pool of worker processes: `compare`, `run` and `quantize --evaluate` share it.

Each worker loads the model once (the pool initializer) and then takes chunks of samples; results come back in
chunk order, so whatever the worker count, the caller sees the same sequence and folds it in the same order: the
numbers are identical for any `--workers`. Workers are started with 'spawn', not 'fork': the parent has
onnxruntime's and Numba's thread pools running, which a forked child would inherit in an undefined state. Numba
kernels come from its on-disk cache, so a worker does not JIT again.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from opendpu.isa.errors import OpenDpuError

__all__ = ["default_workers", "check_workers", "chunks", "map_chunks", "throughput", "WorkerError"]


class WorkerError(OpenDpuError):
    """A worker process died (killed, out of memory, or a script without an `if __name__ == "__main__"` guard)."""


def default_workers() -> int:
    """The default worker count: the machine's cores."""
    return max(1, os.cpu_count() or 1)


def check_workers(workers: Any, what: str = "workers") -> int:
    """`workers` as an int >= 1, or ValueError naming it (a library caller's mistake, before any work)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"{what} {workers!r} must be an integer >= 1")
    return workers


def chunks(n: int, workers: int, most: int = 16) -> list[range]:
    """Sample index ranges: small enough that every worker gets several (a progress bar that moves, a balanced
    end), at most `most` samples each (a chunk's results travel back in one message)."""
    size = max(1, min(most, n // (4 * workers) if workers > 1 else most))
    return [range(i, min(n, i + size)) for i in range(0, n, size)]


_LIMITS: list = []      # the worker's BLAS / OpenMP thread limits, kept for the life of the process


def _start(threads: int, init: Callable, args: tuple) -> None:
    """Worker start: Ctrl-C is the parent's; the compute libraries share the cores with the other workers. numpy's
    BLAS is loaded by then, so its threads are limited through threadpoolctl (OpenBLAS's waiting threads make the
    `ref` backend several times slower when more threads than cores are busy; benchmarks/bench_functional.py)."""
    import signal

    from threadpoolctl import threadpool_limits
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(k, str(threads))
    _LIMITS.append(threadpool_limits(limits=threads))
    init(*args)


def map_chunks(fn: Callable, items: Sequence, workers: int, init: Callable, init_args: tuple = (),
               progress=None, sizes: Sequence[int] | None = None, what: str = "samples") -> list:
    """[fn(item) for item in items], computed by `workers` spawned processes each started with init(*init_args)
    (module-level functions, picklable arguments). `progress(done, total, what)` counts `sizes` (default 1 per
    item) as chunks finish. A worker's exception is raised here; the pending chunks are cancelled."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool
    sizes = list(sizes) if sizes is not None else [1] * len(items)
    total, done = sum(sizes), 0
    out: list = [None] * len(items)
    threads = max(1, (os.cpu_count() or 1) // workers)
    ex = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), initializer=_start,
                             initargs=(threads, init, init_args))
    try:
        pending = {ex.submit(fn, it): k for k, it in enumerate(items)}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                k = pending.pop(f)
                try:
                    out[k] = f.result()
                except BrokenProcessPool:
                    raise WorkerError(f"a worker process died while evaluating {what} (of {workers} workers; "
                                      f"killed or out of memory?): rerun with 1 worker to work in this process"
                                      ) from None
                done += sizes[k]
                if progress:
                    progress(done, total, what)
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
    return out


def throughput(samples: int, seconds: float, workers: int) -> dict:
    """The report's throughput entry: images per second of wall time, with the worker count."""
    return {"workers": workers, "seconds": round(seconds, 3),
            "images_per_s": round(samples / seconds, 2) if seconds > 0 else None}
