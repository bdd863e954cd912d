"""ISA1 instructions: typed objects, mc_code encode/decode, and the text assembly (spec §4).

`decode` turns mc_code bytes (little-endian 32-bit words) into `Instruction`s; `encode` is its inverse.
`to_text`/`from_text` use the `NAME dpdon dpdby field value …` form of spec §4.4.
`decode_lenient` reads on past undecodable words; isa/disasm.py lists them (with instruction indices,
layer names and static-check findings) for reading, not for re-assembly.
`decode_arrays` gives the same content as flat numpy arrays for the executor and the cycle model.
Every malformed input raises `IsaError` naming the instruction index, the field and its allowed range.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .errors import OpenDpuError
from .fields import BY_NAME, BY_OPCODE, FIELD_INDEX, FIELDS, MAX_FIELDS, TEXT_ORDER, OPS, Engine

MNEMONICS = tuple(o.mnemonic for o in OPS)


def _reserved_masks() -> dict[str, list[int]]:
    """Per mnemonic and word, the bits no field occupies (reserved; must be 0, spec §1.3)."""
    out = {}
    for o in OPS:
        used = [0] * o.words
        used[0] = 0xFFF00000                      # opcode, dpdon, dpdby
        for f in FIELDS[o.mnemonic]:
            used[f.word] |= ((1 << f.width) - 1) << f.lsb
        out[o.mnemonic] = [~u & 0xFFFFFFFF for u in used]
    return out


RESERVED = _reserved_masks()
# Compact opcode index used by the array form: position of the mnemonic in OPS.
OP_INDEX = {o.mnemonic: i for i, o in enumerate(OPS)}


class IsaError(OpenDpuError, ValueError):
    """Malformed instruction stream, field value or assembly line."""

    def __init__(self, msg: str, index: int | None = None):
        self.index = index
        super().__init__(msg if index is None else f"instruction {index}: {msg}")


def _dpd_str(v: int) -> str:
    """dpdon/dpdby as 4 binary digits, MISC first (spec §4.4)."""
    return format(v, "04b")


@dataclass
class Instruction:
    """One ISA1 instruction with logical (not stored-minus-one) field values."""

    op: str
    dpdon: int = 0
    dpdby: int = 0
    fields: dict[str, int] = field(default_factory=dict)

    def __getattr__(self, name: str) -> int:
        f = self.__dict__.get("fields")
        if f is not None and name in f:
            return f[name]
        raise AttributeError(name)

    @property
    def engine(self) -> Engine:
        return BY_NAME[self.op].engine

    def validate(self, index: int | None = None) -> None:
        if self.op not in FIELDS:
            raise IsaError(f"unknown mnemonic {self.op!r} (known: {', '.join(MNEMONICS)})", index)
        for nm, v in (("dpdon", self.dpdon), ("dpdby", self.dpdby)):
            if not (isinstance(v, (int, np.integer)) and 0 <= v <= 15):
                raise IsaError(f"{self.op} field {nm} = {v!r} out of range 0..15", index)
        want = FIELD_INDEX[self.op]
        extra = set(self.fields) - set(want)
        if extra:
            raise IsaError(f"{self.op} has no field {sorted(extra)[0]!r} (fields: {', '.join(want)})", index)
        for f in FIELDS[self.op]:
            if f.name not in self.fields:
                raise IsaError(f"{self.op} field {f.name} is missing", index)
            v = self.fields[f.name]
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not f.lo <= v <= f.hi:
                raise IsaError(f"{self.op} field {f.name} = {v!r} out of range {f.lo}..{f.hi}", index)

    def words(self, index: int | None = None) -> list[int]:
        self.validate(index)
        info = BY_NAME[self.op]
        w = [0] * info.words
        w[0] = (info.opcode << 28) | (self.dpdon << 24) | (self.dpdby << 20)
        for f in FIELDS[self.op]:
            v = int(self.fields[f.name]) - (1 if f.minus_one else 0)
            w[f.word] |= v << f.lsb
        return w

    def to_text(self) -> str:
        parts = [self.op, _dpd_str(self.dpdon), _dpd_str(self.dpdby)]
        for nm in TEXT_ORDER[self.op]:
            parts += [nm, str(int(self.fields[nm]))]
        return " ".join(parts)


def _decode_one(words: np.ndarray, pos: int, idx: int | None) -> tuple[Instruction, int]:
    """The instruction at word `pos` of `words` and its length in words; IsaError (naming instruction
    `idx`) for an unknown opcode, a truncated instruction or reserved bits that are set."""
    n = len(words)
    w0 = int(words[pos])
    opc = w0 >> 28
    info = BY_OPCODE.get(opc)
    if info is None:
        raise IsaError(f"unknown opcode 0x{opc:X} at word {pos} (byte offset {4 * pos})", idx)
    if pos + info.words > n:
        raise IsaError(f"{info.mnemonic} needs {info.words} words but the stream ends after "
                       f"{n - pos} (truncated at byte {4 * n})", idx)
    ws = [int(x) for x in words[pos:pos + info.words]]
    for k, (w, m) in enumerate(zip(ws, RESERVED[info.mnemonic])):
        if w & m:
            raise IsaError(f"{info.mnemonic} word {k} sets reserved bits 0x{w & m:08X} (reserved bits "
                           f"must be 0)", idx)
    fl = {}
    for f in FIELDS[info.mnemonic]:
        fl[f.name] = ((ws[f.word] >> f.lsb) & ((1 << f.width) - 1)) + (1 if f.minus_one else 0)
    return Instruction(info.mnemonic, (w0 >> 24) & 15, (w0 >> 20) & 15, fl), info.words


def decode(mc: bytes | bytearray | memoryview | np.ndarray, require_end: bool = True) -> list[Instruction]:
    """mc_code bytes -> instructions. Unknown opcodes, truncation and a missing END raise IsaError."""
    words = _as_words(mc)
    out: list[Instruction] = []
    pos = 0
    n = len(words)
    while pos < n:
        idx = len(out)
        ins, nw = _decode_one(words, pos, idx)
        out.append(ins)
        pos += nw
        if ins.op == "END":
            if pos != n:
                raise IsaError(f"END at word {pos - 1} is followed by {n - pos} more words", idx)
    if require_end and (not out or out[-1].op != "END"):
        raise IsaError(f"stream of {len(out)} instructions does not end with END", len(out))
    return out


@dataclass
class Decoded:
    """One entry of `decode_lenient`: an instruction, or the words that could not be decoded (`error`)."""

    index: int                      # instruction index (an undecodable entry counts as one instruction)
    word: int                       # position of its first word in the stream
    words: tuple[int, ...]          # its raw words
    instruction: Instruction | None
    error: str | None = None        # why the words are not an instruction (decode's IsaError text)
    note: str | None = None         # a stream-level problem found at this entry (e.g. words after END)


def decode_lenient(mc) -> list[Decoded]:
    """Like `decode`, but never stops: an unknown opcode becomes a one-word invalid entry, reserved bits
    an invalid entry of the opcode's length, a truncated tail one invalid entry; words after END are
    decoded on (END carries a note), as are trailing bytes that do not fill a word."""
    b = mc.tobytes() if isinstance(mc, np.ndarray) and mc.dtype == np.uint32 else bytes(mc)
    nwhole = len(b) // 4 * 4
    words = np.frombuffer(b[:nwhole], dtype="<u4")
    out: list[Decoded] = []
    pos, n = 0, len(words)
    while pos < n:
        idx = len(out)
        try:
            ins, nw = _decode_one(words, pos, None)
            err = None
        except IsaError as e:
            ins, err = None, str(e)
            info = BY_OPCODE.get(int(words[pos]) >> 28)
            nw = 1 if info is None else min(info.words, n - pos)
        d = Decoded(idx, pos, tuple(int(x) for x in words[pos:pos + nw]), ins, err)
        if ins is not None and ins.op == "END" and pos + nw != n:
            d.note = f"END at word {pos} is followed by {n - pos - nw} more words"
        out.append(d)
        pos += nw
    if nwhole != len(b):
        out.append(Decoded(len(out), n, (), None, f"mc_code length {len(b)} bytes is not a multiple of 4 "
                                                  f"(truncated stream)"))
    return out


def _as_words(mc) -> np.ndarray:
    if isinstance(mc, np.ndarray) and mc.dtype == np.uint32:
        return mc
    b = bytes(mc)
    if len(b) % 4:
        raise IsaError(f"mc_code length {len(b)} bytes is not a multiple of 4 (truncated stream)",
                       None)
    return np.frombuffer(b, dtype="<u4")


def encode(instrs: list[Instruction], require_end: bool = True) -> bytes:
    """Instructions -> mc_code bytes (little-endian words)."""
    if require_end and (not instrs or instrs[-1].op != "END"):
        raise IsaError(f"program of {len(instrs)} instructions does not end with END", len(instrs))
    words: list[int] = []
    for i, ins in enumerate(instrs):
        if ins.op == "END" and i != len(instrs) - 1:
            raise IsaError("END is not the last instruction", i)
        words += ins.words(i)
    return np.asarray(words, dtype="<u4").tobytes()


def to_text(instrs: list[Instruction]) -> str:
    return "".join(ins.to_text() + "\n" for ins in instrs)


def parse_line(line: str, index: int | None = None) -> Instruction | None:
    """One assembly line -> Instruction (None for blank/comment/DUMP pseudo-op lines)."""
    s = line.split(";", 1)[0].strip()          # `; layer …` / `; ! …` annotations of `isa.disasm` are comments
    if not s or s.startswith("#"):
        return None
    tok = s.split()
    if tok[0].isdigit():                        # the instruction index `isa.disasm` prints first
        tok = tok[1:]
        if not tok:
            raise IsaError(f"line {s!r} holds an instruction index but no instruction", index)
    op = tok[0]
    if op.startswith("<invalid"):
        raise IsaError(f"the listing marks this word invalid: {s}", index)
    if op.startswith("DUMP"):
        return None          # simulator-only pseudo-ops (spec §4.5) are accepted and ignored
    if op not in FIELDS:
        raise IsaError(f"unknown mnemonic {op!r} (known: {', '.join(MNEMONICS)})", index)
    if len(tok) < 3:
        raise IsaError(f"{op}: expected '{op} dpdon dpdby field value ...'", index)
    dpd = []
    for nm, t in (("dpdon", tok[1]), ("dpdby", tok[2])):
        if len(t) != 4 or set(t) - {"0", "1"}:
            raise IsaError(f"{op} field {nm} = {t!r} must be 4 binary digits (MISC CONV SAVE LOAD)", index)
        dpd.append(int(t, 2))
    rest = tok[3:]
    if len(rest) % 2:
        raise IsaError(f"{op}: field {rest[-1]!r} has no value", index)
    fl: dict[str, int] = {}
    for k, v in zip(rest[::2], rest[1::2]):
        if k in fl:
            raise IsaError(f"{op} field {k} appears twice", index)
        if k not in FIELD_INDEX[op]:
            raise IsaError(f"{op} has no field {k!r} (fields: {', '.join(TEXT_ORDER[op])})", index)
        try:
            fl[k] = int(v, 10)
        except ValueError:
            raise IsaError(f"{op} field {k} = {v!r} is not a decimal integer", index) from None
    ins = Instruction(op, dpd[0], dpd[1], fl)
    ins.validate(index)
    return ins


def from_text(text: str, require_end: bool = True) -> list[Instruction]:
    out: list[Instruction] = []
    for ln, line in enumerate(text.splitlines()):
        try:
            ins = parse_line(line, len(out))
        except IsaError as e:
            raise IsaError(f"line {ln + 1}: {e}", e.index) from None
        if ins is not None:
            out.append(ins)
    if require_end and (not out or out[-1].op != "END"):
        raise IsaError(f"program of {len(out)} instructions does not end with END", len(out))
    return out


@dataclass
class ProgramArrays:
    """Flat form of a program: op index (into isa.fields.OPS), dpdon, dpdby, logical field values.

    `fields[i, j]` is field j of instruction i in the order of isa.fields.FIELDS[mnemonic].
    """

    op: np.ndarray        # int32 [N]
    dpdon: np.ndarray     # int32 [N]
    dpdby: np.ndarray     # int32 [N]
    fields: np.ndarray    # int64 [N, MAX_FIELDS]

    def __len__(self) -> int:
        return len(self.op)


def decode_arrays(mc, require_end: bool = True) -> ProgramArrays:
    """mc_code -> ProgramArrays (validated exactly as `decode`)."""
    return to_arrays(decode(mc, require_end))


def to_arrays(instrs: list[Instruction]) -> ProgramArrays:
    n = len(instrs)
    op = np.zeros(n, np.int32)
    on = np.zeros(n, np.int32)
    by = np.zeros(n, np.int32)
    fl = np.zeros((n, MAX_FIELDS), np.int64)
    for i, ins in enumerate(instrs):
        op[i] = OP_INDEX[ins.op]
        on[i] = ins.dpdon
        by[i] = ins.dpdby
        for j, f in enumerate(FIELDS[ins.op]):
            fl[i, j] = ins.fields[f.name]
    return ProgramArrays(op, on, by, fl)
