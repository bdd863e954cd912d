"""The bank lines and DDR bytes each ISA1 instruction reads and writes (spec §2.3, §6), given the INIT state.

A compiler places dpdon/dpdby tokens (isa/deps.py) and a fuzzer keeps its programs race-free from these
footprints. The addressing follows the executor's kernels (sim/_kernels.py) line for line:

* LOAD   reads the unmasked DDR bytes of every item (channel-augmentation masking, §6.2; none for
         broadcast 7) and writes ceil(channel/W) lines per item (bank_write zero-fills the last line).
* SAVE   reads ceil(channel/W) lines per item (none with const_en) and writes `channel` DDR bytes per item
         (1 byte for argmax).
* CONV   reads the input rows/columns that are not padding (§6.4: padded positions are overwritten by zero
         and do not count as reads), ceil((IC - channel_offset)/W) lines per pixel, the kernel_h*kernel_w*cg
         weight lines of every CONVW bank and one BIAS line; writes one line per output pixel.
* ALU    reads the unpadded input (maxreduce: all of it), cg*kernel_d lines per pixel, the weight lines of
         its mode (dwconv: kernel_d*cg per kernel position; w16b0: every other line; prelu: cg) and cg BIAS
         lines (dwconv with bias); writes cg lines per output pixel (§6.8).
* ELEW   reads `length` pixels of cg lines per input and row (one row for share_pp) and writes cg lines
         per output pixel (§6.7).
* INITs and END touch no memory (§5.3, §5.4).

Bank footprints are in whole lines: a read of a partial line (CONV with channel_offset) counts the whole
line, which over-approximates by less than one line per pixel. DDR footprints are exact bytes.
Every access is a strided run of `blocks` blocks of `width` lines (bytes) each, block k starting at
`start + k*step`; bank lines wrap modulo the bank depth, as every bank access does (§2.3).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, NamedTuple, Sequence

import numpy as np

from .fields import FIELDS, OPS
from .program import Instruction, IsaError, ProgramArrays
from .target import Target, load_augmented


class FootprintError(IsaError):
    """An instruction whose footprint is undefined: no INIT state, a legacy op, a pass or DDR range the
    executor rejects."""


class Lines(NamedTuple):
    """`blocks` blocks of `width` consecutive lines of bank `bank`; block k starts at line start + k*step
    (all modulo the bank depth)."""

    bank: int
    start: int
    blocks: int
    step: int
    width: int


class Bytes(NamedTuple):
    """`blocks` blocks of `width` consecutive bytes of DDR register `reg`; block k starts at start + k*step."""

    reg: int
    start: int
    blocks: int
    step: int
    width: int


def _blocks(start: int, count: int, step: int, width: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) of each block of a run, merged where blocks touch or overlap (step <= width: one hull)."""
    if count <= 0 or width <= 0:
        return
    if step <= width:
        yield start, start + (count - 1) * step + width
        return
    for k in range(count):
        s = start + k * step
        yield s, s + width


def _merge(spans: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Sort and merge half-open (space, lo, hi) spans that touch or overlap."""
    spans.sort()
    out: list[list[int]] = []
    for s, lo, hi in spans:
        if out and out[-1][0] == s and lo <= out[-1][2]:
            if hi > out[-1][2]:
                out[-1][2] = hi
        else:
            out.append([s, lo, hi])
    return [(s, lo, hi) for s, lo, hi in out]


@dataclass(frozen=True)
class Access:
    """What one instruction reads (or writes): bank-line runs and DDR-byte runs."""

    lines: tuple[Lines, ...] = ()
    ddr: tuple[Bytes, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.lines) or bool(self.ddr)

    def bank_ranges(self, depth: int) -> list[tuple[int, int, int]]:
        """(bank, first line, last line) inclusive, each within 0..depth-1 (a run past the last line wraps
        and is split), sorted and merged."""
        spans: list[tuple[int, int, int]] = []
        for bank, start, count, step, width in self.lines:
            for lo, hi in _blocks(start, count, step, width):
                if hi - lo >= depth:
                    spans.append((bank, 0, depth))
                    continue
                a = lo % depth
                b = a + (hi - lo)
                if b <= depth:
                    spans.append((bank, a, b))
                else:
                    spans.append((bank, a, depth))
                    spans.append((bank, 0, b - depth))
        return [(b, lo, hi - 1) for b, lo, hi in _merge(spans)]

    def ddr_ranges(self) -> list[tuple[int, int, int]]:
        """(reg, start, end) half-open byte ranges, sorted and merged."""
        spans = [(reg, lo, hi) for reg, start, count, step, width in self.ddr
                 for lo, hi in _blocks(start, count, step, width)]
        return _merge(spans)

    def bank_lines(self, depth: int) -> set[tuple[int, int]]:
        """The set of (bank, line) pairs."""
        return {(b, ln) for b, lo, hi in self.bank_ranges(depth) for ln in range(lo, hi + 1)}

    def bank_mask(self, num_banks: int, depth: int) -> np.ndarray:
        """bool [num_banks, depth]: True on every line in the footprint."""
        m = np.zeros((num_banks, depth), bool)
        for b, lo, hi in self.bank_ranges(depth):
            m[b, lo:hi + 1] = True
        return m

    def ddr_mask(self, reg: int, size: int) -> np.ndarray:
        """bool [size]: True on every byte of register `reg` in the footprint (clipped to the size)."""
        m = np.zeros(size, bool)
        for r, lo, hi in self.ddr_ranges():
            if r == reg:
                m[max(lo, 0):max(min(hi, size), 0)] = True
        return m

    def ddr_bytes(self) -> int:
        """Bytes transferred, counted per block (a byte in two overlapping blocks counts twice) — the
        executor's LOAD/SAVE byte statistics count the same way."""
        return sum(count * width for _, _, count, _, width in self.ddr)


NOTHING = Access()


@dataclass(frozen=True)
class Footprint:
    """Bank lines and DDR bytes one instruction reads and writes."""

    reads: Access = NOTHING
    writes: Access = NOTHING


EMPTY = Footprint()


@dataclass
class InitState:
    """The state the INIT instructions set (spec §5.3): the fields of the last CONVINIT and ALUINIT, and the
    ELEWINIT descriptors by id (they persist until overwritten, as in the executor)."""

    conv: Mapping[str, int] | None = None
    alu: Mapping[str, int] | None = None
    elew: dict[int, Mapping[str, int]] = field(default_factory=dict)

    def update(self, op: str, fields: Mapping[str, int]) -> None:
        """Apply an instruction: CONVINIT, ALUINIT and ELEWINIT replace their state; others do nothing."""
        if op == "CONVINIT":
            self.conv = fields
        elif op == "ALUINIT":
            self.alu = fields
        elif op == "ELEWINIT":
            self.elew[fields["id"]] = fields

    def copy(self) -> "InitState":
        return InitState(self.conv, self.alu, dict(self.elew))


# ---- per opcode ------------------------------------------------------------------------------------------
def _load(f: Mapping[str, int], t: Target) -> Footprint:
    w = t.cp
    ch, length, jr = f["channel"], f["length"], f["jump_read"]
    nl = -(-ch // w)
    writes = Access((Lines(f["bank_id"], f["bank_addr"], length, f["jump_write"], nl),))
    if f["broadcast"] == 7:                       # constant fill: no DDR read
        return Footprint(NOTHING, writes)
    reg, addr = f["reg_id"], f["ddr_addr"]
    if not load_augmented(ch, jr):                # no channel augmentation: every byte is read
        return Footprint(Access((), (Bytes(reg, addr, length, jr, ch),)), writes)
    # channel augmentation (spec §6.2): items before `nhead` lose leading bytes, items from first_end on
    # lose trailing bytes; the items between are whole.
    pad_start, pad_end = f["pad_start"], f["pad_end"]
    cw = nl * w
    first_end = length - f["pad_idx"]              # may be negative: then every item loses trailing bytes
    nhead = min(-(-pad_start // jr), length)
    runs = []
    for it in list(range(nhead)) + list(range(max(first_end, nhead), length)):
        lo = max(0, pad_start - it * jr)
        hi = ch
        if it >= first_end:
            hi = min(hi, cw - (pad_end + jr * (it - first_end)))
        if lo < hi:
            runs.append(Bytes(reg, addr + it * jr + lo, 1, 0, hi - lo))
    if first_end > nhead:
        runs.append(Bytes(reg, addr + nhead * jr, first_end - nhead, jr, ch))
    return Footprint(Access((), tuple(runs)), writes)


def _save(f: Mapping[str, int], t: Target) -> Footprint:
    ch, length = f["channel"], f["length"]
    const_en = f["const_en"] != 0
    reads = NOTHING if const_en else Access((Lines(f["bank_id"], f["bank_addr"], length, f["jump_read"],
                                                   -(-ch // t.cp)),))
    nb = 1 if (not const_en and f["argmax"] & 2) else ch          # argmax writes one byte per item
    return Footprint(reads, Access((), (Bytes(f["reg_id"], f["ddr_addr"], length, f["jump_write"], nb),)))


def _input_rows(t: Target, bank_id: int, soi: int, sh: int, jre: int, jr: int, bases: Sequence[int],
                rows: range, x_lo: int, x_hi: int, nl: int) -> list[Lines]:
    """Input gathering (spec §6.4): tile row r of `rows` lies in bank gb + slot mod PP, pass slot // PP, at
    base[pass] + (t mod stride_h)*jump_read_endl; columns x_lo..x_hi-1 step jump_read, nl lines each."""
    if nl <= 0 or x_hi <= x_lo:
        return []
    pp = t.pp
    gb = bank_id - bank_id % pp
    b0 = bank_id - gb
    out = []
    for r in rows:
        tt = soi + r
        slot = b0 + tt // sh
        ps = slot // pp
        if ps >= 4:
            raise FootprintError(f"input row {r} falls in pass {ps} (at most 4 passes, spec §6.4)")
        out.append(Lines(gb + slot % pp, bases[ps] + (tt % sh) * jre + x_lo * jr, x_hi - x_lo, jr, nl))
    return out


def _output_rows(t: Target, bank_id: int, bao: int, vpp: int, length: int, so: int, soo: int, jw: int,
                 jwe: int, nl: int) -> list[Lines]:
    """Output placement (spec §6.4): row h in bank gb + slot mod PP at bao + (slot // PP)*so*jwe +
    (t mod so)*jwe, pixels step jump_write, nl lines each."""
    pp = t.pp
    gb = bank_id - bank_id % pp
    out = []
    for h in range(vpp):
        tt = h + soo
        slot = bank_id % pp + tt // so
        out.append(Lines(gb + slot % pp, bao + (slot // pp) * so * jwe + (tt % so) * jwe, length, jw, nl))
    return out


def _bases(f: Mapping[str, int]) -> tuple[int, int, int, int]:
    return f["bank_addr_in"], f["bank_addr_in_1"], f["bank_addr_in_2"], f["bank_addr_in_3"]


def _conv(f: Mapping[str, int], st: Mapping[str, int], t: Target) -> Footprint:
    cp = t.cp
    kh, kw, sh, sw = st["kernel_h"], st["kernel_w"], st["stride_h"], st["stride_w"]
    vpp, cg, length = st["valid_pixel_parallel"], f["channel_group"], f["length"]
    rows_in = (vpp - 1) * sh + kh
    cols_in = (length - 1) * sw + kw
    nread = max(cg * cp - f["channel_offset"], 0)
    rows = range(f["pad_top"], min(rows_in, rows_in - kh + f["pad_bottom"] + 1))
    x_hi = min(cols_in, cols_in - kw + f["pad_right"] + 1)
    lines = _input_rows(t, f["bank_id_in"], st["stride_offset_in"], sh, st["jump_read_endl"], st["jump_read"],
                        _bases(f), rows, f["pad_left"], x_hi, -(-nread // cp))
    lines += [Lines(t.convw_base + o, f["bank_addr_weights"], 1, 0, kh * kw * cg) for o in range(t.ocp)]
    lines.append(Lines(t.bias_bank, f["bank_addr_bias"], 1, 0, 1))
    out = _output_rows(t, f["bank_id_out"], f["bank_addr_out"], vpp, length, st["stride_out"],
                       st["stride_offset_out"], st["jump_write"], st["jump_write_endl"], 1)
    return Footprint(Access(tuple(lines)), Access(tuple(out)))


def _alu(f: Mapping[str, int], st: Mapping[str, int], t: Target) -> Footprint:
    mode = st["exec_mode"]
    kh, kw, sh, sw = st["kernel_h"], st["kernel_w"], st["stride_h"], st["stride_w"]
    cg, length = st["channel_group"], st["length"]
    vpp = f["valid_pixel_parallel"]
    kd = 1 if mode in (2, 3, 5) else f["kernel_d"]
    rows_in = (vpp - 1) * sh + kh
    cols_in = (length - 1) * sw + kw
    if mode == 5:                                 # maxreduce: no padding
        rows, x_lo, x_hi = range(rows_in), 0, cols_in
    else:
        rows = range(f["pad_top"], min(rows_in, rows_in - kh + f["pad_bottom"] + 1))
        x_lo, x_hi = f["pad_left"], min(cols_in, cols_in - kw + f["pad_right"] + 1)
    lines = _input_rows(t, f["bank_id_in"], st["stride_offset_in"], sh, st["jump_read_endl"], st["jump_read"],
                        _bases(f), rows, x_lo, x_hi, cg * kd)
    baw, jrw, dw = f["bank_addr_weights"], st["jump_read_weights"], t.dwconvw_bank
    if mode in (0, 6):                            # kernel_d blocks of cg lines per kernel position
        lines.append(Lines(dw, baw, kh * kw, jrw, kd * cg))
    elif mode == 8:                               # one 16-bit weight per channel group: every other line
        lines += [Lines(dw, baw + p * jrw, kd * cg, 2, 1) for p in range(kh * kw)]
    elif mode == 1:                               # PReLU slopes
        lines.append(Lines(dw, baw, 1, 0, cg))
    if mode == 0:
        lines.append(Lines(t.bias_bank, f["bank_addr_bias"], 1, 0, cg))
    out = _output_rows(t, f["bank_id_out"], f["bank_addr_out"], vpp, length, st["stride_out"],
                       st["stride_offset_out"], st["jump_write"], st["jump_write_endl"], cg)
    return Footprint(Access(tuple(lines)), Access(tuple(out)))


def _elew(f: Mapping[str, int], elew: Mapping[int, Mapping[str, int]], t: Target) -> Footprint:
    pp = t.pp
    vpp, cg, length = f["valid_pixel_parallel"], f["channel_group"], f["length"]
    lines = []
    for k in range(f["num"]):
        d = elew.get(k)
        if d is None:
            raise FootprintError(f"ELEW input {k} has no ELEWINIT descriptor")
        bidi, jb = d["bank_id_in"], d["jump_bank"]
        gb = bidi - bidi % pp
        for r in range(1 if d["share_pp"] else vpp):        # share_pp: every row reads the same row
            if d["share_pp"]:
                bank, wrap = bidi, 0
            else:
                slot = bidi - gb + r * jb
                bank, wrap = gb + slot % pp, slot // pp
            lines.append(Lines(bank, d["bank_addr_in"] + wrap * d["jump_read_endl"], length, d["jump_read"], cg))
    bido = f["bank_id_out"]
    gb = bido - bido % pp
    out = []
    for r in range(vpp):                          # one output row per bank (spec §6.7)
        slot = bido - gb + r
        out.append(Lines(gb + slot % pp, f["bank_addr_out"] + (slot // pp) * f["jump_write_endl"], length,
                         f["jump_write"], cg))
    return Footprint(Access(tuple(lines)), Access(tuple(out)))


_NO_MEMORY = frozenset(("CONVINIT", "ALUINIT", "ELEWINIT", "END"))


def footprint_of(op: str, fields: Mapping[str, int], state: InitState, target: Target,
                 reg_sizes: Mapping[int, int] | None = None) -> Footprint:
    """`footprint` from a mnemonic and its logical field values."""
    if op == "LOAD":
        fp = _load(fields, target)
    elif op == "SAVE":
        fp = _save(fields, target)
    elif op == "CONV":
        if state.conv is None:
            raise FootprintError("CONV before any CONVINIT")
        fp = _conv(fields, state.conv, target)
    elif op == "ALU":
        if state.alu is None:
            raise FootprintError("ALU before any ALUINIT")
        fp = _alu(fields, state.alu, target)
    elif op == "ELEW":
        fp = _elew(fields, state.elew, target)
    elif op in _NO_MEMORY:
        return EMPTY
    else:
        raise FootprintError(f"{op} is a legacy instruction that ISA1 targets do not execute (spec §6.6)")
    if reg_sizes is not None:
        for acc, what in ((fp.reads, "reads"), (fp.writes, "writes")):
            for reg, start, count, step, width in acc.ddr:
                size = reg_sizes.get(reg)
                if size is None:
                    raise FootprintError(f"{op} {what} DDR register REG_{reg}, which is not allocated")
                end = start + (count - 1) * step + width
                if end > size:
                    raise FootprintError(f"{op} {what} bytes up to {end} of REG_{reg} ({size} bytes)")
    return fp


def footprint(instr: Instruction, init_state: InitState, target: Target,
              reg_sizes: Mapping[int, int] | None = None) -> Footprint:
    """The bank lines and DDR bytes `instr` reads and writes when executed with `init_state` (the CONVINIT /
    ALUINIT / ELEWINIT state before it). `reg_sizes` (reg -> bytes), when given, bounds-checks the DDR
    ranges: an access the executor would reject raises FootprintError. INITs and END give EMPTY."""
    return footprint_of(instr.op, instr.fields, init_state, target, reg_sizes)


def _instructions(prog: Sequence[Instruction] | ProgramArrays) -> Iterable[tuple[str, Mapping[str, int]]]:
    if isinstance(prog, ProgramArrays):
        for o, row in zip(prog.op.tolist(), prog.fields.tolist()):
            mn = OPS[o].mnemonic
            yield mn, {fd.name: row[j] for j, fd in enumerate(FIELDS[mn])}
    else:
        for ins in prog:
            yield ins.op, ins.fields


def program_footprints(prog: Sequence[Instruction] | ProgramArrays, target: Target,
                       reg_sizes: Mapping[int, int] | None = None) -> list[Footprint]:
    """The footprint of every instruction of `prog` in program order, tracking the INIT state as the
    executor does; instructions after the first END are included (they are not executed, but get their
    footprints all the same). FootprintError names the instruction index."""
    state = InitState()
    out = []
    for i, (op, f) in enumerate(_instructions(prog)):
        try:
            out.append(footprint_of(op, f, state, target, reg_sizes))
        except FootprintError as e:
            raise FootprintError(str(e), i) from None
        state.update(op, f)
    return out


__all__ = ["Access", "Bytes", "EMPTY", "Footprint", "FootprintError", "InitState", "Lines", "NOTHING",
           "footprint", "footprint_of", "program_footprints"]
