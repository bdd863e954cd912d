"""One vocabulary across the packages: the Engine enum, the OpenDpuError root, the table of executor messages."""
from __future__ import annotations

import ast
import importlib

import numpy as np
import pytest

from opendpu.isa import check
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.fields import BY_NAME, OPS, Engine
from opendpu.isa.program import Instruction
from opendpu.isa.target import get_target

from test_layering import module_files

# every error the packages raise on purpose, with the built-in base that `except` code may rely on
BUILTIN_BASE = {
    "opendpu.isa.program.IsaError": ValueError, "opendpu.isa.check.ProgramCheckError": ValueError,
    "opendpu.isa.target.TargetError": ValueError, "opendpu.sim.executor.ExecError": RuntimeError,
    "opendpu.sim.timing.DeadlockError": RuntimeError, "opendpu.sim.timing.WatchdogError": RuntimeError,
    "opendpu.compiler.xir.graph.XModelError": ValueError, "opendpu.compiler.ref._common.RefError": ValueError,
    "opendpu.compiler.outdir.OutputError": ValueError, "opendpu.runtime.dpu.RuntimeErrorDPU": RuntimeError,
    "opendpu.runtime.ops.OpError": RuntimeError, "opendpu.quant.onnx_in.QuantError": ValueError,
    "opendpu.quant.calib.CalibError": ValueError, "opendpu.hw.params.HwError": ValueError,
    "opendpu.runtime.cli.checks.CliError": Exception,
}


def test_engine_numbering():
    """The dpdon/dpdby bit numbering of spec §4.1: LOAD 0, SAVE 1, CONV 2, MISC 3; the text form prints MISC first."""
    assert [(e.name, int(e)) for e in Engine] == [("LOAD", 0), ("SAVE", 1), ("CONV", 2), ("MISC", 3)]
    assert [e.bit for e in Engine] == [1, 2, 4, 8]
    assert all(isinstance(o.engine, Engine) for o in OPS)
    assert {n: BY_NAME[n].engine for n in ("LOAD", "SAVE", "END", "CONV", "CONVINIT", "ALU", "ELEW", "POOL")} == {
        "LOAD": Engine.LOAD, "SAVE": Engine.SAVE, "END": Engine.SAVE, "CONV": Engine.CONV, "CONVINIT": Engine.CONV,
        "ALU": Engine.MISC, "ELEW": Engine.MISC, "POOL": Engine.MISC}
    assert Instruction("END", dpdon=Engine.MISC.bit, dpdby=Engine.LOAD.bit).to_text() == "END 1000 0001"


def test_engine_names_reach_the_schedule():
    """The cycle model labels engines by the enum: busy time, stalls, counters and rows."""
    from opendpu.sim.timing import simulate
    from helpers import ins
    t = get_target("DPUCZDX8G_ISA1_B512")
    s = simulate([ins("CONVINIT"), ins("END")], t)
    assert list(s.engine_busy()) == list(s.engine_stalls()) == [e.name for e in Engine]
    assert [r["engine"] for r in s.instruction_rows()] == ["CONV", "SAVE"]
    assert s.counters()["CSTART"] == s.counters()["SEND"] == 1 and s.counters()["LSTART"] == 0
    assert np.array_equal(s.engine, [Engine.CONV, Engine.SAVE])


def _error_classes() -> list[str]:
    """Every public class named *Error* defined in an opendpu module (found in the source, so a new one is seen)."""
    out = []
    for mod, path in module_files().items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        out += [f"{mod}.{n.name}" for n in tree.body
                if isinstance(n, ast.ClassDef) and "Error" in n.name and not n.name.startswith("_")]
    return out


def _load(qualname: str):
    mod, name = qualname.rsplit(".", 1)
    return getattr(importlib.import_module(mod), name)


def test_every_package_error_has_the_root():
    """Each package error is an OpenDpuError and keeps its built-in base."""
    found = _error_classes()
    assert set(BUILTIN_BASE) <= set(found)
    for q in found:
        cls = _load(q)
        assert issubclass(cls, OpenDpuError), q
    for q, base in BUILTIN_BASE.items():
        assert issubclass(_load(q), base), q


def test_cli_reports_any_package_error(monkeypatch, capsys):
    """main() catches the root: an error type its old tuple lacked (RefError) is one line and exit 2."""
    from opendpu.compiler.ref import RefError
    from opendpu.runtime import cli
    from opendpu.runtime.cli import targets

    def boom(a):
        raise RefError("conv2d-fix 'c1': missing fix point of input 0")

    monkeypatch.setattr(targets, "run", boom)
    assert cli.main(["targets"]) == 2
    assert capsys.readouterr().err == "opendpu targets: error: conv2d-fix 'c1': missing fix point of input 0\n"


def test_every_error_kind_has_a_message():
    """The message table covers each kind the executor records, and unknown kinds get the generic text."""
    assert set(check._MESSAGES) == set(range(1, len(check.KIND_NAMES)))
    t = get_target("DPUCZDX8G_ISA1_B512")
    assert check.problem_message(check.E_REG, "LOAD", t, 5, 0, 7, 0, [0, 2]) == \
        "DDR register REG_5 is not allocated (allocated: REG_0, REG_2)"
    assert check.problem_message(check.E_NOINIT, "ALU", t, 0, 0, 0, 1, []) == \
        "ALU executed before any ALUINIT (no ALUINIT state, spec §5.3)"
    assert check.problem_message(99, "ALU", t, 3, 1, 2, 0, []) == "error kind 99 (value 3, range 1..2)"


@pytest.mark.parametrize("kind", range(1, len(check.KIND_NAMES)))
def test_message_names_no_placeholder(kind):
    """Every entry formats to plain text: no unfilled braces, no 'None' from a missing value."""
    t = get_target("DPUCZDX8G_ISA1_B4096")
    msg = check.problem_message(kind, "CONV", t, 3, 1, 4, 1, [0], jump_bank=2)
    assert msg and "{" not in msg and "None" not in msg
