"""A readable listing of mc_code: one line per instruction, with static-check findings and layer names.

It uses both isa/program.py (`decode_lenient`) and the static check isa/check.py, which builds on
program.py; kept apart from both so that the three form no import cycle.
"""
from __future__ import annotations

from .check import check_program
from .program import decode_lenient
from .target import get_target


def disasm(mc, target=None, reg_sizes: dict[int, int] | None = None, layer_of=None) -> str:
    """Readable listing of mc_code: one line per instruction, `index  TEXT`, where TEXT is the assembly of
    `to_text` (or `<invalid: reason> [words]` for words that do not decode; the listing goes on).

    With `target` (an isa.target.Target), the static check (isa.check.check_program, with `reg_sizes` if
    given, else without the register/DDR-bounds checks) annotates each instruction the executor would reject
    with `; ! field=value: message`; undecodable entries are left out of that check. `layer_of[i]` (a
    sequence or mapping; None entries allowed) adds `; layer NAME`. A stream that does not end with END gets
    a last `; !` line."""
    if target is not None:
        target = get_target(target)             # a Target, preset name, fingerprint or arch.json
    entries = decode_lenient(mc)
    notes: dict[int, list[str]] = {}
    if target is not None:
        valid = [(d.index, d.instruction) for d in entries if d.instruction is not None]
        # the executor stops at the first END: check up to it, as the machine would run it
        for k, (_, ins) in enumerate(valid):
            if ins.op == "END":
                valid = valid[:k + 1]
                break
        if valid:
            for p in check_program([ins for _, ins in valid], target, reg_sizes):
                fld = f"{p.field}={p.value}: " if p.field is not None else ""
                notes.setdefault(valid[p.index][0], []).append(f"{fld}{p.message}")
    width = max(5, len(str(len(entries))))
    lines = []
    for d in entries:
        if d.instruction is not None:
            body = d.instruction.to_text()
        else:
            body = f"<invalid: {d.error}>" + (" [" + " ".join(f"0x{w:08X}" for w in d.words) + "]" if d.words else "")
        parts = [f"{d.index:>{width}}  {body}"]
        name = _layer_name(layer_of, d.index)
        if name is not None:
            parts.append(f"; layer {name}")
        if d.note:
            parts.append(f"; ! {d.note}")
        parts += [f"; ! {m}" for m in notes.get(d.index, ())]
        lines.append("  ".join(parts))
    last = next((d for d in reversed(entries) if d.instruction is not None or d.words), None)
    if last is None or last.instruction is None or last.instruction.op != "END":
        lines.append(f"{'':>{width}}  ; ! stream of {len(entries)} instructions does not end with END")
    return "".join(line + "\n" for line in lines)


def _layer_name(layer_of, i: int) -> str | None:
    if layer_of is None:
        return None
    try:
        v = layer_of[i]
    except (IndexError, KeyError):
        return None
    return None if v is None else str(v)


__all__ = ["disasm"]
