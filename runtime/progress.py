"""Feedback for long work: one callback protocol and a progress bar that speaks it.

The protocol is `progress(done: int, total: int, what: str)`, with None meaning "silent". Functions that
take minutes accept it as an optional `progress=` keyword: `hw.harness.build` (stages),
`hw.harness.run_jobs` (jobs and simulated cycles), `runtime.cosim.cosim_programs` (its stages in turn, `what`
prefixed by the stage name; `total` changes with the stage) and `sim.sweep.sweep` (points).

    with progress_bar("cosim") as cb:
        reports = cosim_programs(target, programs, progress=cb)

On a terminal the bar is drawn by rich on stderr (spinner and elapsed time keep moving between calls).
When stderr is not a terminal (CI logs, pipes), plain lines are printed instead: at the first call, when
the stage or the total changes, when a stage of few steps advances, at the end of a stage, otherwise at
most every `interval` seconds; and a "still ..." line after `heartbeat` seconds without any line, so a
log shows life during a long single step (a Verilator build).
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

__all__ = ["progress_bar", "PlainProgress"]


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _stage(what: str) -> str | None:
    return what.split(":", 1)[0] if ":" in what else None


class PlainProgress:
    """The callback of the non-terminal mode: rate-limited plain lines on `stream`, plus a heartbeat
    thread (started by `start`, stopped by `stop`) that prints "still ..." after `heartbeat` idle
    seconds. `clock` is injectable for tests."""

    def __init__(self, desc: str, stream, interval: float = 5.0, heartbeat: float = 30.0, clock=time.monotonic,
                 quiet: float = 0.0):
        self.desc = desc
        self.quiet = quiet               # work that ends within this many seconds prints nothing
        self.stream = stream
        self.interval = interval
        self.heartbeat = heartbeat
        self.clock = clock
        self.t0 = clock()
        self.last_line: float | None = None                  # clock of the last printed line
        self.state: tuple[int, int, str] | None = None       # (done, total, what) of the last call
        self.printed: tuple[int, int, str] | None = None     # state of the last printed line
        # ((stage, total), done, clock) when the current stage was first shown
        self._stage_start: tuple[tuple[str | None, int], int, float] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
        self.last_line = self.clock()

    def _fmt(self, done, total, what) -> str:
        where = f" [{done}/{total}]" if total else ""
        now = self.clock()
        key = (_stage(what), total)
        if self._stage_start is None or self._stage_start[0] != key:
            self._stage_start = (key, done, now)
        eta = ""
        _, d0, t_s = self._stage_start
        if total and d0 < done < total and now - t_s >= 1.0:       # the stage's own rate (resumed work excluded)
            eta = f", ETA {(now - t_s) / (done - d0) * (total - done):.0f} s"
        return f"{self.desc}: {what}{where} ({now - self.t0:.0f} s{eta})"

    def __call__(self, done: int, total: int, what: str) -> None:
        with self._lock:
            prev = self.state
            self.state = (done, total, what)
            if self.clock() - self.t0 < self.quiet:
                return
            if prev is None or self.printed is None:
                show = True
            else:
                pdone, ptotal, pwhat = self.printed
                show = (total != ptotal or _stage(what) != _stage(pwhat)
                        or (done >= total and (done, total) != (pdone, ptotal))
                        or (done != pdone and total <= 10)
                        or (self.clock() - self.last_line >= self.interval and self.state != self.printed))
            if show:
                self.printed = self.state
                self._line(self._fmt(done, total, what))

    def _beat(self) -> None:
        while not self._stop.wait(min(self.heartbeat, 1.0)):
            with self._lock:
                if self.state is None or self.clock() - self.last_line < self.heartbeat:
                    continue
                done, total, what = self.state
                self._line(self._fmt(done, total, f"still {what}"))

    def start(self) -> None:
        self.last_line = self.clock()
        if self.heartbeat and self.heartbeat > 0:
            self._thread = threading.Thread(target=self._beat, name="opendpu-progress", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@contextmanager
def progress_bar(desc: str, enabled: bool = True, stream=None, interval: float = 5.0, heartbeat: float = 30.0,
                 quiet: float = 1.0):
    """Context manager giving a `progress(done, total, what)` callback (None when not `enabled`).

    Draws a rich progress bar on `stream` (default stderr) when it is a terminal; otherwise prints plain
    lines (see the module docstring), which is also the fallback when rich is not installed."""
    if not enabled:
        yield None
        return
    stream = sys.stderr if stream is None else stream
    if _isatty(stream):
        try:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                       TimeElapsedColumn, TimeRemainingColumn)
        except ImportError:
            pass
        else:
            with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), TimeRemainingColumn(), console=Console(file=stream)) as bar:
                task = bar.add_task(desc, total=None)

                def cb(done: int, total: int, what: str) -> None:
                    bar.update(task, completed=done, total=total or None,
                               description=f"{desc}: {what}" if what else desc)
                yield cb
            return
    plain = PlainProgress(desc, stream, interval=interval, heartbeat=heartbeat, quiet=quiet)
    plain.start()
    try:
        yield plain
    finally:
        plain.stop()
