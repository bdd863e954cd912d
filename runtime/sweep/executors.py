"""Where a sweep's points are evaluated: a local pool of worker processes, or a Ray cluster. Both run
`evaluate.run_task` and call `finished(task, result, seconds)` per point; a worker that dies costs a retry, and a
point that still fails is a failed row. Points that share a compiled program run after the first one that compiles
it (`first_wave`), so no program is compiled twice."""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from .evaluate import Task, base_row, run_task
from .spec import SweepError


def first_wave(todo: list[Task]) -> tuple[list[Task], list[Task]]:
    """The first task of each compile key (they compile), and the rest (they reuse a compiled program)."""
    seen: set[str] = set()
    first: list[Task] = []
    rest: list[Task] = []
    for t in todo:
        (rest if t.key in seen else first).append(t)
        seen.add(t.key)
    return first, rest


def run_local(todo: list[Task], srcs: dict, finished, workers: int | None, retries: int) -> None:
    """A local pool of worker processes, one pipe each (no shared queue: a worker killed mid-point cannot leave a
    lock held). A worker that dies is replaced and its point runs again, at most `retries` more times, after
    which the point is a failed row. Ctrl-C kills the workers; every finished point is already stored."""
    workers = workers or max(1, min(os.cpu_count() or 1, 8))
    if workers == 1:
        for t in todo:
            t0 = time.perf_counter()
            finished(t, run_task(t, srcs.get(t.model_hash)), time.perf_counter() - t0)
        return
    pool = _Pool(workers)
    try:
        for wave in first_wave(todo):
            pool.run(wave, srcs, finished, retries)
    finally:
        pool.close()


def _worker(conn) -> None:
    """A pool worker: (task, src) in, the point's result out, until None or the pipe closes."""
    _ignore_sigint()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task, src = msg
        conn.send(run_task(task, src))


class _Pool:
    def __init__(self, n: int):
        import multiprocessing as mp
        self.ctx: Any = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        self.n = n
        self.idle: list = []                       # (conn, process)
        self.busy: dict = {}                       # conn -> (process, task, t0)
        self.tries: dict[str, int] = {}

    def _spawn(self) -> None:
        a, b = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(b,), daemon=True)
        p.start()
        b.close()
        self.idle.append((a, p))

    def run(self, tasks: list[Task], srcs: dict, finished, retries: int) -> None:
        from multiprocessing.connection import wait
        queue = list(reversed(tasks))
        while queue or self.busy:
            while queue and (self.idle or len(self.busy) < self.n):
                if not self.idle:
                    self._spawn()
                conn, p = self.idle.pop()
                t = queue.pop()
                try:
                    conn.send((t, srcs.get(t.model_hash)))
                except (BrokenPipeError, OSError):        # died while idle: replace it, keep the point
                    queue.append(t)
                    p.kill()
                    continue
                self.busy[conn] = (p, t, time.perf_counter())
            by_sentinel = {p.sentinel: c for c, (p, _, _) in self.busy.items()}
            for r in wait(list(self.busy) + list(by_sentinel)):
                conn = by_sentinel.get(r, r)
                if conn not in self.busy:
                    continue
                p, t, t0 = self.busy[conn]
                try:
                    res = conn.recv() if conn.poll() else None
                except (EOFError, OSError):
                    res = None
                if res is not None:
                    del self.busy[conn]
                    self.idle.append((conn, p))
                    finished(t, res, time.perf_counter() - t0)
                    continue
                if p.is_alive():                          # woken by the pipe without a full message yet
                    continue
                del self.busy[conn]                       # the worker died on this point
                conn.close()
                self.tries[t.hash] = self.tries.get(t.hash, 0) + 1
                if self.tries[t.hash] > retries:
                    row = base_row(t)
                    row.update(reason=f"worker died {self.tries[t.hash]} times on this point (exit code "
                                      f"{p.exitcode})")
                    finished(t, {**row, "layers": []}, time.perf_counter() - t0)
                else:
                    queue.append(t)

    def close(self) -> None:
        procs = [p for _, p in self.idle] + [p for p, _, _ in self.busy.values()]
        for c, _ in self.idle:
            try:
                c.send(None)
            except OSError:
                pass
        for p, _, _ in self.busy.values():          # interrupted mid-point: nothing to wait for
            p.kill()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which cancels the sweep (finished points stay stored)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_ray(todo: list[Task], srcs: dict, finished, address: str | None, retries: int) -> None:
    """Ray tasks: the graphs go to the object store once; a task whose worker dies is retried by Ray
    (max_retries), and a point that still fails is a failed row."""
    try:
        import ray
    except ImportError:
        raise SweepError("--executor ray needs the ray package (pip install ray==2.60.0)") from None
    started_here = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise SweepError(f"--executor ray: cannot connect to {address or 'a new local instance'}: {e}") \
                from None
        started_here = True
    try:
        remote = ray.remote(max_retries=retries, retry_exceptions=False)(run_task)
        refs = {h: ray.put(_read(p)) for h, p in srcs.items()}
        for wave in first_wave(todo):
            futs = {remote.remote(t, refs[t.model_hash]): (t, time.perf_counter()) for t in wave}
            waiting = list(futs)
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=1)
                for r in ready:
                    t, t0 = futs[r]
                    try:
                        res = ray.get(r)
                    except ray.exceptions.RayError as e:
                        row = base_row(t)
                        row.update(reason=f"ray: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                        res = {**row, "layers": []}
                    finished(t, res, time.perf_counter() - t0)
    finally:
        if started_here:
            ray.shutdown()

