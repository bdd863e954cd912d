"""No test asserts a wall-clock duration (issue 29): on a loaded 2-core machine (CI) such a test fails good code.

A test that guards a complexity property counts work instead (tests/work_count.py: lines, calls; or the calls, passes,
instructions of the code under test); the durations themselves are benchmark figures (benchmarks/bench_checks.py,
`make bench`). Printing a duration in a test is fine, and so is a deadline that only bounds a wait (polling a log
until a subprocess has started, `timeout=` of a subprocess).

`scan(source)` is the lint: an `ast` pass over one file that finds
* every reading of a clock: `time.time/perf_counter/monotonic/process_time/thread_time` (and their `_ns` forms,
  `clock_gettime`), `timeit.timeit/repeat/default_timer`, `datetime.now/utcnow/today`, whatever the import spelling
  (`import time as t`, `from time import perf_counter as pc`, `from datetime import datetime`);
* the values derived from one, per function scope (flow-insensitive): names and attributes assigned (`=`, `+=`,
  `:=`, tuple unpacking, `for` targets) from an expression that holds a clock reading or such a value through
  arithmetic, `abs/round/min/max/sum/float/int`, `statistics.*`/`np.*` reductions, subscripts, `.total_seconds()`,
  comprehensions; lists that `.append/.extend` one; and the calls of this file's functions that `return` one;
and reports as a duration assertion
* an `assert` whose test (not its message) uses such a value;
* a call of an `assert*` function or method (`self.assertLess`, `np.testing.assert_allclose`) or of `pytest.approx`
  with such an argument;
* an `if` on such a value whose body raises or calls `pytest.fail`;
* a Hypothesis `deadline=` other than None (a per-example wall-clock limit; tests/conftest.py sets none).
A value handed to a constructor or another function (`Outcome(..., time.perf_counter() - t0)`) is not followed:
what the code under test does with a time is its own business.

Run as a script to lint files: `python tests/test_no_duration_asserts.py [FILE.py ...]` (default: tests/*.py).
"""
from __future__ import annotations

import ast
import os
import sys
import textwrap
from dataclasses import dataclass

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))

CLOCK_FUNCS = {
    "time": {"time", "perf_counter", "monotonic", "process_time", "thread_time", "time_ns", "perf_counter_ns",
             "monotonic_ns", "process_time_ns", "thread_time_ns", "clock_gettime", "clock_gettime_ns"},
    "timeit": {"timeit", "repeat", "default_timer"},
    "datetime": {"now", "utcnow", "today"},           # datetime.datetime.now(), date.today()
}
DATETIME_CLASSES = {"datetime", "date"}
# functions that keep a number a number: a duration in, a duration out
NUMERIC = {"abs", "round", "float", "int", "min", "max", "sum", "sorted", "median", "mean", "fmean", "stdev",
           "percentile", "quantile", "amin", "amax", "array", "asarray", "total_seconds", "copy", "item"}
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclass(frozen=True)
class Finding:
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.line}: {self.why}: {self.text}"


def _dotted(node: ast.AST) -> str | None:
    """'a.b.c' for a Name / Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Imports(ast.NodeVisitor):
    """The names this file binds to the clock modules, their clock functions and the datetime classes."""

    def __init__(self):
        self.modules: dict[str, str] = {}          # local name -> "time" / "timeit" / "datetime"
        self.funcs: set[str] = set()               # local names of clock functions (from time import perf_counter)
        self.dt_classes: set[str] = set()          # local names of datetime.datetime / datetime.date

    def visit_Import(self, node):
        for a in node.names:
            if a.name in CLOCK_FUNCS:
                self.modules[a.asname or a.name] = a.name

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        for a in node.names:
            local = a.asname or a.name
            if mod == "datetime" and a.name in DATETIME_CLASSES:
                self.dt_classes.add(local)
            elif mod in CLOCK_FUNCS and a.name in CLOCK_FUNCS[mod]:
                self.funcs.add(local)


class _Scanner:
    def __init__(self, tree: ast.Module, source: str):
        self.tree = tree
        self.source = source
        self.imp = _Imports()
        self.imp.visit(tree)
        self.timer_funcs: set[str] = set()         # this file's functions that return a duration
        self.findings: list[Finding] = []

    # -- what is a clock reading, what is derived from one ----------------------------------------------------------
    def is_clock_call(self, node: ast.AST) -> bool:
        if not isinstance(node, ast.Call):
            return False
        f = node.func
        if isinstance(f, ast.Name):
            return f.id in self.imp.funcs or f.id in self.timer_funcs
        name = _dotted(f)
        if name is None:
            return False
        head, _, attr = name.rpartition(".")
        if not head:
            return False
        mod = self.imp.modules.get(head.split(".")[0])
        if mod == "datetime":                      # datetime.datetime.now(), datetime.date.today()
            return head.count(".") == 1 and head.split(".")[1] in DATETIME_CLASSES and attr in CLOCK_FUNCS["datetime"]
        if mod is not None and "." not in head:
            return attr in CLOCK_FUNCS[mod]
        return head in self.imp.dt_classes and attr in CLOCK_FUNCS["datetime"]

    def timed(self, node: ast.AST | None, tainted: set[str]) -> bool:
        """Does expression `node` hold a clock reading or a value derived from one?"""
        if node is None:
            return False
        if self.is_clock_call(node):
            return True
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = _dotted(node)
            if name is not None and name in tainted:
                return True
            return isinstance(node, ast.Attribute) and self.timed(node.value, tainted)
        if isinstance(node, ast.BinOp):
            return self.timed(node.left, tainted) or self.timed(node.right, tainted)
        if isinstance(node, ast.UnaryOp):
            return self.timed(node.operand, tainted)
        if isinstance(node, ast.Compare):
            return any(self.timed(x, tainted) for x in [node.left, *node.comparators])
        if isinstance(node, ast.BoolOp):
            return any(self.timed(x, tainted) for x in node.values)
        if isinstance(node, ast.IfExp):
            return self.timed(node.body, tainted) or self.timed(node.orelse, tainted)
        if isinstance(node, ast.NamedExpr):
            return self.timed(node.value, tainted)
        if isinstance(node, (ast.Subscript, ast.Starred)):
            return self.timed(node.value, tainted)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(self.timed(x, tainted) for x in node.elts)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self.timed(node.elt, tainted) or any(self.timed(g.iter, tainted) for g in node.generators)
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in NUMERIC:
                args = [*node.args, *(k.value for k in node.keywords)]
                if isinstance(f, ast.Attribute) and name in ("total_seconds", "copy", "item"):
                    args.append(f.value)
                return any(self.timed(a, tainted) for a in args)
        return False

    # -- scopes ---------------------------------------------------------------------------------------------------
    @staticmethod
    def _own_nodes(scope: ast.AST):
        """The nodes of `scope` outside its nested functions and classes (their bodies are scopes of their own)."""
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            n = stack.pop()
            yield n
            if not isinstance(n, SCOPES):
                stack.extend(ast.iter_child_nodes(n))

    def _bind(self, target: ast.AST, value: ast.AST | None, tainted: set[str], timed_value: bool) -> bool:
        """Taint `target` when `timed_value`; tuples pairwise. Returns whether something new was tainted."""
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                return any([self._bind(t, v, tainted, self.timed(v, tainted))
                            for t, v in zip(target.elts, value.elts)])
            return any([self._bind(t, None, tainted, timed_value) for t in target.elts])
        if isinstance(target, ast.Starred):
            return self._bind(target.value, None, tainted, timed_value)
        name = _dotted(target)
        if timed_value and name is not None and name not in tainted:
            tainted.add(name)
            return True
        return False

    def _taint(self, scope: ast.AST, inherited: set[str]) -> set[str]:
        tainted = set(inherited)
        nodes = list(self._own_nodes(scope))
        changed = True
        while changed:
            changed = False
            for n in nodes:
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        changed |= self._bind(t, n.value, tainted, self.timed(n.value, tainted))
                elif isinstance(n, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and n.value is not None:
                    changed |= self._bind(n.target, n.value, tainted, self.timed(n.value, tainted))
                elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
                    changed |= self._bind(n.target, None, tainted, self.timed(n.iter, tainted))
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                      and n.func.attr in ("append", "extend", "insert", "add")
                      and any(self.timed(a, tainted) for a in n.args)):
                    changed |= self._bind(n.func.value, None, tainted, True)
        return tainted

    def _scopes(self, node: ast.AST, inherited: set[str]):
        """(scope, tainted names) for the module and every function / class in it, outer scopes first."""
        tainted = self._taint(node, inherited)
        yield node, tainted
        for n in self._own_nodes(node):
            if isinstance(n, SCOPES):
                yield from self._scopes(n, tainted)

    # -- the checks -----------------------------------------------------------------------------------------------
    def _find_timer_funcs(self) -> None:
        """This file's functions that return a duration (`return time.time() - t0`), to a fixed point."""
        while True:
            before = len(self.timer_funcs)
            for scope, tainted in self._scopes(self.tree, set()):
                if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                        isinstance(n, ast.Return) and self.timed(n.value, tainted) for n in self._own_nodes(scope)):
                    self.timer_funcs.add(scope.name)
            if len(self.timer_funcs) == before:
                return

    def _report(self, node: ast.AST, why: str) -> None:
        text = (ast.get_source_segment(self.source, node) or "").splitlines()[0][:120]
        self.findings.append(Finding(node.lineno, text, why))

    @staticmethod
    def _fails(body: list[ast.stmt]) -> bool:
        for st in body:
            for n in ast.walk(st):
                if isinstance(n, ast.Raise):
                    return True
                if isinstance(n, ast.Call) and (_dotted(n.func) or "").split(".")[-1] == "fail":
                    return True
        return False

    def run(self) -> list[Finding]:
        self._find_timer_funcs()
        for scope, tainted in self._scopes(self.tree, set()):
            for n in self._own_nodes(scope):
                if isinstance(n, ast.Assert) and self._uses(n.test, tainted):
                    self._report(n, "assert on a wall-clock duration")
                elif isinstance(n, ast.If) and self._uses(n.test, tainted) and self._fails(n.body):
                    self._report(n, "a test fails on a wall-clock duration")
                elif isinstance(n, ast.Call):
                    name = _dotted(n.func) or ""
                    last = name.split(".")[-1]
                    args = [*n.args, *(k.value for k in n.keywords)]
                    if (last.startswith("assert") or last.startswith("fail") or name.endswith("approx")) and any(
                            self._uses(a, tainted) for a in args):
                        self._report(n, f"{last}() on a wall-clock duration")
                    for k in n.keywords:
                        if k.arg == "deadline" and not (isinstance(k.value, ast.Constant) and k.value.value is None):
                            self._report(n, "a Hypothesis deadline (a per-example wall-clock limit)")
        return sorted(set(self.findings), key=lambda f: f.line)

    def _uses(self, node: ast.AST, tainted: set[str]) -> bool:
        """Does any part of `node` hold a duration (a clock reading, a tainted name, a timer function's result)?"""
        return any(self.timed(n, tainted) for n in ast.walk(node) if isinstance(n, (ast.expr,)))


def scan(source: str) -> list[Finding]:
    """The duration assertions in one Python source (module docstring)."""
    tree = ast.parse(source)
    return _Scanner(tree, source).run()


def python_files() -> list[str]:
    """Every Python file under tests/."""
    out = []
    for d, _, files in os.walk(TESTS):
        out += [os.path.join(d, f) for f in files if f.endswith(".py")]
    return sorted(out)


# ---- the guard ------------------------------------------------------------------------------------------------
def test_no_test_asserts_a_duration():
    found = []
    for path in python_files():
        with open(path, encoding="utf-8") as f:
            found += [f"{os.path.relpath(path, os.path.dirname(TESTS))}:{x}" for x in scan(f.read())]
    assert not found, ("tests assert wall-clock durations, which fail on a loaded machine; count work instead "
                       "(tests/work_count.py) and move the figure to benchmarks/:\n" + "\n".join(found))


# ---- the lint on planted sources --------------------------------------------------------------------------------
# The planted sources spell the keyword ASSERT (made `assert` by `planted`), so that a grep of tests/ for duration
# assertions finds none: they are strings to scan, not tests.
PLANTED = {
    "difference in a name": """
        import time
        def test_x():
            t0 = time.perf_counter()
            work()
            dt = time.perf_counter() - t0
            ASSERT dt < 2
    """,
    "difference in the assert": """
        import time
        def test_x():
            t0 = time.time()
            work()
            ASSERT time.time() - t0 < 3
    """,
    "from-import with an alias": """
        from time import perf_counter as pc
        def test_x():
            start = pc()
            work()
            ASSERT pc() - start < 1.0, "too slow"
    """,
    "module alias, monotonic, <=": """
        import time as tm
        def test_x():
            start = tm.monotonic()
            work()
            elapsed = tm.monotonic() - start
            ASSERT elapsed <= 5, elapsed
    """,
    "_ns clock and a unit conversion": """
        import time
        def test_x():
            t0 = time.perf_counter_ns()
            work()
            ms = (time.perf_counter_ns() - t0) / 1e6
            ASSERT ms < 100
    """,
    "process_time, reversed comparison": """
        import time
        def test_x():
            c0 = time.process_time()
            work()
            ASSERT 0.5 > time.process_time() - c0
    """,
    "timeit": """
        import timeit
        def test_x():
            ASSERT timeit.timeit(work, number=3) < 0.5
    """,
    "timeit.default_timer imported": """
        from timeit import default_timer as timer
        def test_x():
            t = timer()
            work()
            ASSERT timer() - t < 2.0
    """,
    "datetime": """
        from datetime import datetime
        def test_x():
            t0 = datetime.now()
            work()
            ASSERT (datetime.now() - t0).total_seconds() < 2
    """,
    "datetime module": """
        import datetime
        def test_x():
            t0 = datetime.datetime.now()
            work()
            took = datetime.datetime.now() - t0
            ASSERT took.total_seconds() < 2
    """,
    "walrus": """
        import time
        def test_x():
            t0 = time.time()
            work()
            ASSERT (dt := time.time() - t0) < 1, dt
    """,
    "augmented sum": """
        import time
        def test_x():
            total = 0.0
            for _ in range(3):
                t0 = time.perf_counter()
                work()
                total += time.perf_counter() - t0
            ASSERT total / 3 < 0.1
    """,
    "list of durations, min": """
        import time
        def test_x():
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                work()
                ts.append(time.perf_counter() - t0)
            best = min(ts)
            ASSERT best < 0.1
    """,
    "a timer function of the file": """
        import time
        def timed(f):
            t0 = time.perf_counter()
            f()
            return time.perf_counter() - t0
        def test_x():
            ASSERT timed(work) < 1
    """,
    "a tuple-returning timer": """
        import time
        def test_x():
            t0, r = time.perf_counter(), work()
            dt = time.perf_counter() - t0
            ASSERT r and dt < 1
    """,
    "unittest assert method": """
        import time, unittest
        class T(unittest.TestCase):
            def setUp(self):
                self.t0 = time.time()
            def test_x(self):
                work()
                self.ASSERTLess(time.time() - self.t0, 2)
    """,
    "attribute holding a duration": """
        import time
        class Bench:
            def run(self):
                t0 = time.time()
                work()
                self.seconds = time.time() - t0
                ASSERT self.seconds < 1
    """,
    "pytest.approx": """
        import time, pytest
        def test_x():
            t0 = time.time()
            work()
            ASSERT time.time() - t0 == pytest.approx(1.0, abs=0.5)
    """,
    "numpy testing": """
        import time
        import numpy as np
        def test_x():
            t0 = time.monotonic()
            work()
            np.testing.ASSERT_array_less(time.monotonic() - t0, 2.0)
    """,
    "if ... pytest.fail": """
        import time, pytest
        def test_x():
            t0 = time.time()
            work()
            if time.time() - t0 > 2:
                pytest.fail("slow")
    """,
    "if ... raise": """
        import time
        def test_x():
            t0 = time.time()
            work()
            dt = time.time() - t0
            if dt > 2:
                raise AssertionError(dt)
    """,
    "module-level start, used in a test": """
        import time
        START = time.time()
        def test_x():
            ASSERT time.time() - START < 600
    """,
    "closure": """
        import time
        def test_x():
            t0 = time.time()
            def check():
                ASSERT time.time() - t0 < 1
            check()
    """,
    "a Hypothesis deadline": """
        from hypothesis import given, settings, strategies as st
        @settings(max_examples=10, deadline=500)
        @given(st.integers())
        def test_x(i):
            pass
    """,
    "test_progen.py before issue 29": """
        import time
        def test_many_small_programs_fast():
            t = TARGETS["B512"]
            t0 = time.perf_counter()
            for s in range(500):
                random_program(t, n=10 + s % 71, seed=s)
            ASSERT time.perf_counter() - t0 < 3.0
    """,
    "test_program_check.py before issue 29": """
        import time
        def test_shared_models_pass_the_check(name):
            for sg in dpu_subgraphs(g):
                t0 = time.perf_counter()
                ps = check_program(arr, dpu.target, dpu.reg_sizes)
                dt = time.perf_counter() - t0
                ASSERT ps == [], f"{sg.name}: {ps[:3]}"
                ASSERT dt < 1.0, f"{sg.name}: {len(arr)} instructions checked in {dt:.2f} s"
    """,
}

LEGITIMATE = {
    "printing a duration": """
        import time
        def test_x():
            t0 = time.perf_counter()
            r = work()
            dt = time.perf_counter() - t0
            print(f"work in {dt:.1f} s; {time.perf_counter() - t0:.2f} s with the print")
            assert r == 3
    """,
    "a duration only in the message": """
        import time
        def test_x():
            t0 = time.perf_counter()
            ps = work()
            took = time.perf_counter() - t0
            assert ps == [], f"{len(ps)} problems after {took:.2f} s"
    """,
    "a bounded polling deadline (tests/test_sweep.py)": """
        import time, subprocess, signal
        def test_x(log, argv):
            p = subprocess.Popen(argv)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and (not log.exists() or not log.read_text().strip()):
                time.sleep(0.01)
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=120)
            assert p.returncode == 130, err
    """,
    "a time handed to a record (tests/test_fuzz_onnx.py)": """
        import time
        def run_case(case):
            t0 = time.perf_counter()
            n = work(case)
            return Outcome("ok", "", "run", time.perf_counter() - t0, n)
        def test_x():
            out = run_case(1)
            assert out.kind == "ok" and out.programs == 2
    """,
    "the same name for something else in another test": """
        import time
        def test_a():
            t0 = time.time()
            print(time.time() - t0)
        def test_b():
            t0 = 5
            assert t0 < 10
    """,
    "no deadline, subprocess timeouts": """
        import subprocess
        from hypothesis import settings
        settings.register_profile("ci", deadline=None)
        @settings(max_examples=10, deadline=None)
        def test_x():
            r = subprocess.run(["true"], timeout=60)
            assert r.returncode == 0
    """,
    "a module named like a clock function": """
        from mylib import time_model
        def test_x():
            assert time_model.time() < 3      # not the time module
    """,
}


def planted(name: str) -> str:
    return textwrap.dedent(PLANTED[name]).replace("ASSERT", "assert")


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_lint_finds_a_planted_duration_assertion(name):
    found = scan(planted(name))
    assert found, name


@pytest.mark.parametrize("name", sorted(LEGITIMATE))
def test_the_lint_lets_legitimate_timing_pass(name):
    assert scan(textwrap.dedent(LEGITIMATE[name])) == []


def test_the_lint_points_at_the_assertion():
    """The finding names the line of the duration assertion, not the other assert of the loop."""
    src = planted("test_program_check.py before issue 29")
    lines = [(i + 1, line.strip()) for i, line in enumerate(src.splitlines()) if "dt < 1.0" in line]
    assert len(lines) == 1
    assert [(f.line, f.text) for f in scan(src)] == lines


def main(argv: list[str]) -> int:
    paths = argv or python_files()
    bad = 0
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for x in scan(f.read()):
                print(f"{path}:{x}")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
