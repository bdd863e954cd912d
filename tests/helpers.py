"""Helpers shared by the test files: hand-built instructions and their packed words."""
from opendpu.isa.fields import FIELDS
from opendpu.isa.program import Instruction


def ins(op: str, **kw) -> Instruction:
    """An instruction with every field at its smallest legal value, overridden by kw."""
    fl = {f.name: (1 if f.minus_one else 0) for f in FIELDS[op]}
    for k, v in kw.items():
        assert k in fl, f"{op} has no field {k}"
        fl[k] = int(v)
    return Instruction(op, 0, 0, fl)


def instr_value(i: Instruction) -> int:
    """The instruction's words packed as the RTL's `instr` bus (word w at bits [32w, 32w+32))."""
    return sum(w << (32 * k) for k, w in enumerate(i.words()))
