"""Instruction field extraction in hardware, generated from the ISA1 field tables (isa/fields.py)."""
from __future__ import annotations

from amaranth.hdl import Value

from opendpu.isa.fields import BY_NAME, FIELDS


def header(words: Value) -> dict[str, Value]:
    """opcode, dpdon and dpdby of word 0 (spec §4.1)."""
    return {"opcode": words[28:32], "dpdon": words[24:28], "dpdby": words[20:24]}


def fields(op: str, words: Value) -> dict[str, Value]:
    """Logical field values of instruction `op` held in `words` (word w at bits [32w, 32w+32)).

    "Stored minus one" fields come back incremented (one bit wider), so every value is the logical
    value of spec §1.3.
    """
    out = {}
    for f in FIELDS[op]:
        raw = words[32 * f.word + f.lsb: 32 * f.word + f.lsb + f.width]
        out[f.name] = (raw + 1) if f.minus_one else raw
    return out


def raw(op: str, words: Value, name: str) -> Value:
    """The stored bits of field `name` of `op` (minus-one fields not incremented)."""
    for f in FIELDS[op]:
        if f.name == name:
            return words[32 * f.word + f.lsb: 32 * f.word + f.lsb + f.width]
    raise KeyError(f"{op} has no field {name!r}")


def opcode(op: str) -> int:
    """The opcode of mnemonic `op`."""
    return BY_NAME[op].opcode
