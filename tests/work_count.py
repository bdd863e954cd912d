"""Counting work instead of timing it: a test that guards a complexity property (linear time, a vectorised checker,
a compiled kernel) counts what the code does, which is the same on every machine, and never asserts a wall-clock
duration (tests/test_no_duration_asserts.py; the durations themselves are in benchmarks/bench_checks.py).

`count_work()` counts, while it is active on this thread, the Python source lines executed, the Python function
calls and the calls of C functions (builtins, numpy's functions and methods). A loop written in Python shows up as
lines, a numpy call or a compiled (Numba) kernel as one C call or a few lines whatever the size of its data, so:
* work that grows linearly with the input size: `work(10 n) / work(n)` stays near 10;
* a vectorised routine: its work does not depend on the number of elements at all.
The counts are deterministic for deterministic code. A coverage tracer that is active is suspended meanwhile.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Work:
    lines: int = 0          # Python source lines executed
    calls: int = 0          # Python function calls (including generator resumptions)
    c_calls: int = 0        # calls of C functions (builtins, numpy)

    @property
    def total(self) -> int:
        return self.lines + self.calls + self.c_calls

    def __str__(self) -> str:
        return f"{self.total} ({self.lines} lines, {self.calls} Python calls, {self.c_calls} C calls)"


@contextmanager
def count_work():
    """Count the work done inside the `with` block on this thread (module docstring); yields a `Work`."""
    w = Work()

    def trace(frame, event, arg):
        if event == "line":
            w.lines += 1
        elif event == "call":
            w.calls += 1
        return trace

    def profile(frame, event, arg):
        if event == "c_call":
            w.c_calls += 1

    old_trace, old_profile = sys.gettrace(), sys.getprofile()
    sys.settrace(trace)
    sys.setprofile(profile)
    try:
        yield w
    finally:
        sys.setprofile(old_profile)
        sys.settrace(old_trace)
