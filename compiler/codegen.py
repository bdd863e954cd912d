"""Code generation for one DPU subgraph: quantized `*-fix` ops -> ISA1 instructions (spec §6, §7).

Every layer runs DDR to DDR (docs/compiler.md): its inputs are LOADed from their DDR images row by row into
image bank group VB0, the CONV / ALU / ELEW instructions write group VB1, and SAVEs store the output rows into
the output's DDR image. A layer is cut into strips of output rows (halo input rows included) and, when a row
does not fit, into column tiles; each strip's buffers alternate between two places in the bank ring so the
LOADs of strip k+1 can run while strip k computes. Output channels are computed in OCP-wide slices (the inner
loop); weights are loaded once per layer (per group of slices when they do not fit a CONVW bank) with one LOAD
per CONVW bank, laid out in the CONST blob exactly as LOAD reads them. Program order is the reference semantics;
it is a software pipeline (strip k's compute with strip k-1's SAVEs and strip k+1's LOADs between its instructions,
a layer's opening LOADs in the previous layer's tail), and dependency tokens are placed afterwards from the
instructions' footprints on the exact conflicting instruction (`isa.deps.ExactTokenPlanner`), so the program is
race-free by construction.

Names follow the spec: bank_addr_in, shift_cut, jump_read_endl, valid_pixel_parallel, ...
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np

from opendpu.compiler.fixpoint import (FixPointError, LEAKY_ALPHA, avg_pool_factor, conv_shifts, elew_shift_write,
                                       hsigmoid_fields, pool_shift_cut, prelu_shift_codes, slope_encoding,
                                       slope_fits_alu)
from opendpu.compiler.frontend import tile_shape
from opendpu.compiler.program import DdrImage, DpuProgram, Layer
from opendpu.compiler.xir.dpu_abi import CONST, INTERFACE, WORKSPACE, Register, RegisterMap
from opendpu.compiler.xir.graph import Graph, Op, Tensor
from opendpu.isa.deps import DenseKeys, ExactTokenPlanner, KeySpace, TokenPlanner
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.fields import FIELDS
from opendpu.isa.footprint import Footprint, InitState, footprint_of
from opendpu.isa.program import Instruction
from opendpu.isa.target import Target

REG_CONST, REG_WORKSPACE, REG_IN, REG_OUT = 0, 1, 2, 3
REG_SCRATCH = 5                  # placeholder images of the decisions' scratch emissions (never in a program)
TOKEN_LINES = 8                  # line_chunk of the dependency planner (_tokens)
ADDR_FIELD_LINES = 4096          # 12-bit bank address fields of LOAD / SAVE / CONV (spec §4.3)
DDR_ALIGN = 64
MAX_ITEMS = 1024                 # LOAD / SAVE length
LOAD_CHANNEL_MAX = 16384         # LOAD channel (bytes of one item)
MAX_SAVE_CHANNEL = 4096
ACT_CODE = {"NONE": 0, "RELU": 1, "PRELU": 2, "LEAKYRELU": 3, "RELU6": 4}

ALIAS_TYPES = {"reshape-fix", "reshape", "flatten", "flatten-fix", "squeeze", "identity", "identity-fix"}
SKIP_TYPES = {"const-fix", "const", "upload", "download"}


class CodegenError(OpenDpuError, ValueError):
    """An op or layer the code generator cannot compile for this target; the message names it and the limit."""


# ---- feature maps in DDR ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FMap:
    """A feature map image in DDR: NHWC (batch 1) with pixel stride `pix` and row stride `row` bytes."""

    reg: int
    addr: int
    h: int
    w: int
    c: int
    pix: int
    row: int
    fp: int

    def at(self, y: int, x: int, c: int = 0) -> int:
        return self.addr + y * self.row + x * self.pix + c

    @property
    def dense(self) -> bool:
        return self.pix == self.c and self.row == self.w * self.c


def hwc(dims) -> tuple[int, int, int]:
    """(H, W, C) of a batch-1 tensor of 1..4 dims (NHWC; lower ranks are rows of channels)."""
    d = [int(v) for v in dims]
    if not d or len(d) > 4 or (len(d) >= 2 and d[0] != 1):
        raise CodegenError(f"tensor dims {d}: batch must be 1 (1..4 dimensions)")
    if len(d) == 4:
        return d[1], d[2], d[3]
    if len(d) == 3:
        return 1, d[1], d[2]
    if len(d) == 2:
        return 1, 1, d[1]
    return 1, 1, d[0]


# ---- the instruction stream ------------------------------------------------------------------------------------

class Stream:
    """Instructions in program order with the layer each belongs to."""

    def __init__(self) -> None:
        self.ins: list[Instruction] = []
        self.layer_of: list[int] = []
        self.layer = 0

    def add(self, op: str, **fields: int) -> None:
        """Append `op`; fields not given take their smallest legal value (reserved / unused ones)."""
        f = {d.name: d.lo for d in FIELDS[op]}
        for k, v in fields.items():
            if k not in f:
                raise KeyError(f"{op} has no field {k}")
            f[k] = int(v)
        self.ins.append(Instruction(op, 0, 0, f))
        self.layer_of.append(self.layer)


class Ring:
    """A non-wrapping line allocator over `depth` lines of a bank (group): each allocation starts where the
    previous one ended, or at 0 when it would not fit before the end."""

    def __init__(self, depth: int) -> None:
        self.depth, self.ptr = depth, 0

    def alloc(self, n: int, what: str, align: int = 1) -> int:
        """`n` lines starting at a multiple of `align` (TOKEN_LINES keeps buffers out of each other's dependency
        keys, so a LOAD of the next strip does not wait for the engines still reading the previous one)."""
        if n > self.depth:
            raise CodegenError(f"{what} needs {n} lines of a bank, more than the {self.depth} available")
        a = self.peek(n, align)
        self.ptr = a + n
        return a

    def peek(self, n: int, align: int = 1) -> int:
        """The first line `alloc(n, ..., align)` would return, without allocating."""
        a = _ceil(self.ptr, align) * align
        return 0 if a + n > self.depth else a


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# ---- geometry of one windowed layer ----------------------------------------------------------------------------

@dataclass
class Window:
    """A sliding-window layer: output oy, ox reads input rows oy*sh - pt + [0, kh), columns ox*sw - pl + [0, kw).
    pt / pl may be negative (the window starts inside the input, e.g. transposed-conv phases)."""

    kh: int
    kw: int
    sh: int
    sw: int
    pt: int
    pl: int
    ho: int
    wo: int


@dataclass
class Tile:
    """Output rows [y0, y0+rows) and columns [x0, x0+cols) of one strip, with the input window it needs."""

    y0: int
    rows: int
    x0: int
    cols: int
    a: int            # first (virtual) input row
    nv: int           # virtual input rows
    b: int            # first (virtual) input column
    cv: int           # virtual input columns


def _tile(win: Window, y0: int, rows: int, x0: int, cols: int) -> Tile:
    a = y0 * win.sh - win.pt
    b = x0 * win.sw - win.pl
    return Tile(y0, rows, x0, cols, a, (rows - 1) * win.sh + win.kh, b, (cols - 1) * win.sw + win.kw)


@dataclass
class InBuf:
    """Where a strip's input rows live: virtual row q of the tile -> bank group slot q // sh, sub-row q % sh,
    pass p = slot // PP at line `base + p*sh*E + (q % sh)*E + col*cg` (spec §2.4 layout)."""

    group: int        # first bank id of the image group
    base: int
    E: int            # lines of one sub-row (virtual columns x cg)
    cg: int
    sh: int
    lines: int


def _in_lines(t: Target, tile: Tile, sh: int, cg: int) -> tuple[int, int]:
    """(E, lines per bank) of a strip's input buffer."""
    E = tile.cv * cg
    slots = _ceil(tile.nv, sh)
    return E, _ceil(slots, t.pp) * sh * E


# ---- the code generator ----------------------------------------------------------------------------------------

@dataclass
class _Ctx:
    graph: Graph | None
    target: Target
    s: Stream
    depth: int
    img: list[Ring]
    convw: Ring
    bias: Ring
    dwconvw: Ring
    blob: bytearray = field(default_factory=bytearray)
    workload: int = 0
    ws_alloc: Callable[[int], int] | None = None        # workspace bytes for temporaries (REG_1 offset)
    aug: bool = False                 # channel augmentation allowed (decided per layer by the cost estimate)
    capture: list | None = None       # when set, _run collects the layer jobs instead of emitting them
    pipeline: bool = False            # software-pipelined strip order (_strips)
    param_align: int = 1              # start of each parameter ring allocation (TOKEN_LINES with prefetch_layers)
    fuse_conv: bool = True            # a CONV consumer may be fused with its producer (_fused)
    cascade: bool = False             # large stride-1 max pools as cascades of 5x5 / 3x3 pools (_pool_cascade)
    cycles: "Cycles | None" = None    # the cycle model (injected by the runtime); None: the compiler's own _schedule
    decisions: list | None = None     # the real emission's per-layer choices (_decide); None in scratch contexts

    def temp(self, h: int, w: int, ch: int, fp: int) -> FMap:
        """A dense temporary feature map in the workspace."""
        addr = self.ws_alloc(h * w * ch) if self.ws_alloc else 0
        return FMap(REG_WORKSPACE, addr, h, w, ch, ch, w * ch, fp)

    def const(self, data: bytes) -> int:
        """Append bytes to the CONST blob (aligned); their DDR offset in REG_0."""
        pad = (-len(self.blob)) % DDR_ALIGN
        self.blob.extend(b"\0" * pad)
        off = len(self.blob)
        self.blob.extend(data)
        return off


def _t(op: Op) -> Tensor:
    """The output tensor of an op (every op of a quantized graph has one)."""
    if op.output is None:
        raise CodegenError(f"op {op.name!r} ({op.type}) has no output tensor")
    return op.output


def _int8(op: Op) -> np.ndarray:
    """The int8 data of a const-fix op."""
    data = op.get("data")
    if data is None:
        raise CodegenError(f"const op {op.name!r} has no data")
    shape = [int(v) for v in op.get("shape", _t(op).shape)]
    a = np.frombuffer(bytes(data), dtype=np.int8)
    if a.size != math.prod(shape):
        raise CodegenError(f"const op {op.name!r}: {a.size} bytes for shape {shape}")
    return a.reshape(shape)


def _fp(op: Op) -> int:
    fp = _t(op).fix_point
    if fp is None:
        raise CodegenError(f"op {op.name!r} ({op.type}): output tensor has no fix_point (not quantized)")
    return int(fp)


def _pairs(op: Op, key: str, default) -> tuple[int, int]:
    v = op.get(key, default)
    v = [int(x) for x in v]
    return v[0], v[1]


def _pads(op: Op) -> tuple[int, int, int, int]:
    """[left, right, top, bottom]; pad_mode SAME without pads as XIR (the window geometry does the rest)."""
    p = op.get("pad")
    if p is None:
        return 0, 0, 0, 0
    p = [int(x) for x in p]
    return p[0], p[1], p[2], p[3]


# ---- LOAD / SAVE helpers ---------------------------------------------------------------------------------------

def _load_rows(c: _Ctx, fm: FMap, tile: Tile, buf: InBuf) -> None:
    """LOAD the real input rows of a tile into `buf` (one LOAD per row and bank pass; padding is not loaded)."""
    t = c.target
    x_lo, x_hi = max(0, tile.b), min(fm.w, tile.b + tile.cv)
    if x_hi <= x_lo:
        return
    for q in range(tile.nv):
        y = tile.a + q
        if not 0 <= y < fm.h:
            continue
        slot, sub = divmod(q, buf.sh)
        p, bank = divmod(slot, t.pp)
        line0 = buf.base + p * buf.sh * buf.E + sub * buf.E + (x_lo - tile.b) * buf.cg
        for x in range(x_lo, x_hi, MAX_ITEMS):
            n = min(MAX_ITEMS, x_hi - x)
            c.s.add("LOAD", bank_addr=line0 + (x - x_lo) * buf.cg, bank_id=buf.group + bank, jump_write=buf.cg,
                    jump_read=fm.pix, length=n, channel=fm.c, pad_idx=1, reg_id=fm.reg, ddr_addr=fm.at(y, x))


@dataclass
class OutBuf:
    """Output rows of a strip: row j at bank `group + j % PP`, line `base + (j // PP)*E + col*lpp`. A fused
    producer writes into its consumer's input buffer instead (spec §2.4 with stride_out s): row j is virtual row
    q = q0 + j of that buffer, slot q // s (bank slot % PP, pass slot // PP), sub-row q % s, at line
    `base + pass*s*E + (q % s)*E + col + x*lpp`."""

    group: int
    base: int
    E: int
    lpp: int          # lines per output pixel
    s: int = 1        # stride_out
    q0: int = 0       # virtual row of output row 0 (padding rows of the consumer's window before it)
    col: int = 0      # line offset of output column 0

    def place(self, t: Target, j0: int) -> tuple[int, int, int]:
        """(bank_id_out, bank_addr_out, rows that fit before the bank group's end) of a block starting at row j0.
        A block starting on a sub-row other than 0 (the first real row below an odd number of the consumer's top
        padding rows) gets one row: the sub-row offset goes into bank_addr_out, and a one-row instruction writes its
        row at bank_addr_out whatever its stride_out (spec §6.4 placement with t = 0), so stride_offset_out (unproven)
        stays 0."""
        q = self.q0 + j0
        p, b = divmod(q // self.s, t.pp)
        sub = q % self.s
        return (self.group + b, self.base + p * self.s * self.E + sub * self.E + self.col,
                1 if sub else (t.pp - b) * self.s)


def _save_rows(c: _Ctx, out: FMap, tile: Tile, ob: OutBuf, c0: int, nch: int, rows: range | None = None) -> None:
    """SAVE the tile's output rows (all, or `rows`; channels [c0, c0+nch) of `out`, starting at line offset 0 of
    each pixel)."""
    t = c.target
    for j in (range(tile.rows) if rows is None else rows):
        p, bank = divmod(j, t.pp)
        for x in range(0, tile.cols, MAX_ITEMS):
            n = min(MAX_ITEMS, tile.cols - x)
            step = MAX_SAVE_CHANNEL // t.cp * t.cp          # whole lines per SAVE item
            for cc in range(0, nch, step):
                k = min(step, nch - cc)
                c.s.add("SAVE", bank_addr=ob.base + p * ob.E + x * ob.lpp + cc // t.cp, bank_id=ob.group + bank,
                        jump_read=ob.lpp, jump_write=out.pix, length=n, channel=k, reg_id=out.reg,
                        ddr_addr=out.at(tile.y0 + j, tile.x0 + x, c0 + cc))


# ---- strips and tiles ------------------------------------------------------------------------------------------

def _block_rows(t: Target, win: Window, engine_rows: int) -> int:
    """Rows per instruction: the largest divisor of PP that is <= the engine's rows and keeps the input window
    within 4 passes over the bank group (spec §6.4 gathering check), from any starting bank."""
    v = engine_rows
    while v > 1:
        if t.pp % v == 0 and (t.pp - 1) + _ceil((v - 1) * win.sh + win.kh, win.sh) <= 4 * t.pp:
            return v
        v -= 1
    return 1


def _plan_tiles(c: _Ctx, name: str, win: Window, cg_in: int, n_in: int, lpp_out: int, vb_max: int,
                e_max: int, len_max: int) -> tuple[int, int, int]:
    """(strip rows, tile columns, rows per instruction): full rows if they fit, else column tiles; strips as
    tall as fit. Each buffer gets half the usable depth (double buffering; `n_in` inputs share the input group),
    or, when nothing fits that way, the whole depth (single buffering) and fewer rows per instruction."""
    t = c.target

    def fits(rows: int, cols: int, in_budget: int, out_budget: int) -> bool:
        tile = _tile(win, 0, rows, 0, cols)
        E, lines = _in_lines(t, tile, win.sh, cg_in)
        if win.sh > 1 and E > e_max:
            return False
        out_lines = _ceil(rows, t.pp) * cols * lpp_out
        return lines <= in_budget and out_lines <= out_budget

    for share in (2, 1):
        in_budget, out_budget = c.depth // share // n_in, c.depth // share
        vb = vb_max
        while vb >= 1:
            if t.pp % vb == 0:
                cols = min(win.wo, len_max)
                while cols > 1 and not fits(vb, cols, in_budget, out_budget):
                    cols = max(1, min(cols - 1, cols * 3 // 4))
                if fits(vb, cols, in_budget, out_budget):
                    rows = vb
                    while rows + vb <= _ceil(win.ho, vb) * vb and fits(rows + vb, cols, in_budget, out_budget):
                        rows += vb
                    return rows, cols, vb
            vb -= 1
    raise CodegenError(f"layer {name!r}: one output row x 1 column does not fit the image banks (bank_depth "
                       f"{c.depth}): input channel groups {cg_in}, kernel {win.kw}x{win.kh}, stride "
                       f"{win.sw}x{win.sh}, {lpp_out} output lines per pixel")


def _tiles(win: Window, rows: int, cols: int):
    for y0 in range(0, win.ho, rows):
        for x0 in range(0, win.wo, cols):
            yield _tile(win, y0, min(rows, win.ho - y0), x0, min(cols, win.wo - x0))


def _pads_of_block(win: Window, h_in: int, w_in: int, tile: Tile, j0: int, vpp: int) -> dict[str, int]:
    """CONV/ALU pad fields of the block of output rows [j0, j0+vpp) of a tile (spec §6.4 encoding)."""
    top = tile.a + j0 * win.sh                  # first input row of the block's window
    bot = top + (vpp - 1) * win.sh + win.kh - 1
    right = tile.b + tile.cv - 1
    pt = max(0, -top)
    pb = max(0, bot - (h_in - 1))
    pl = max(0, -tile.b)
    pr = max(0, right - (w_in - 1))
    if pb > win.kh - 1 or pr > win.kw - 1 or pt > win.kh - 1 or pl > win.kw - 1:
        raise CodegenError(f"window padding {pl},{pr},{pt},{pb} exceeds the kernel {win.kw}x{win.kh}")
    return {"pad_top": pt, "pad_left": pl, "pad_bottom": win.kh - 1 - pb, "pad_right": win.kw - 1 - pr}


def _in_fields(t: Target, buf: InBuf, j0: int) -> dict[str, int]:
    """bank_id_in and the four pass base addresses of a block starting at output row j0 of the strip."""
    slot0 = j0                                    # virtual row j0*sh is sub-row 0 of slot j0
    p0, b0 = divmod(slot0, t.pp)
    step = buf.sh * buf.E
    return {"bank_id_in": buf.group + b0, "bank_addr_in": buf.base + p0 * step,
            "bank_addr_in_1": buf.base + (p0 + 1) * step, "bank_addr_in_2": buf.base + (p0 + 2) * step,
            "bank_addr_in_3": buf.base + (p0 + 3) * step}


def _clip_addr(f: dict[str, int], limit: int) -> dict[str, int]:
    """Pass bases beyond the buffer are never read (fewer passes); keep them encodable."""
    for k in ("bank_addr_in_1", "bank_addr_in_2", "bank_addr_in_3"):
        if f[k] >= limit:
            f[k] = f["bank_addr_in"]
    return f


def _channel_chunk(c: _Ctx, name: str, win: Window, cg_all: int, n_in: int, vb_max: int,
                   weight_lines_per_cg: int = 0) -> int:
    """Channel groups per chunk for an ALU / ELEW layer: all of them (at most 256, the channel_group field) if a
    row fits, else halved until one does (and the per-chunk weights fit the DWCONVW bank)."""
    chunk = min(cg_all, 256)
    while True:
        try:
            if weight_lines_per_cg * chunk > c.depth:
                raise CodegenError(f"layer {name!r}: {weight_lines_per_cg} kernel positions x {chunk} channel groups "
                                   f"of weights exceed the DWCONVW bank ({c.depth} lines)")
            _plan_tiles(c, name, win, chunk, n_in, chunk, vb_max, 8192, 2048)
            return chunk
        except CodegenError:
            if chunk == 1:
                raise
            chunk = _ceil(chunk, 2)


def _strip(c: _Ctx, name: str, inp: FMap, tile: Tile, sh: int, cg: int, lpp: int,
           aug: "Aug | None" = None, ib: "InBuf | None" = None) -> tuple[InBuf, OutBuf]:
    """Allocate a strip's input buffer (VB0) and output buffer (VB1, `lpp` lines per pixel) in the rings and LOAD
    the strip's input rows (channel-augmented items when `aug` is given); with `ib`, the input already on chip
    there (only the output buffer is allocated)."""
    t = c.target
    align = TOKEN_LINES if c.pipeline else 1        # consecutive strips' buffers share no dependency key
    if ib is None:
        ib = _in_buf(c, name, tile, sh, cg, inp, aug, align=align)
    Eo = tile.cols * lpp
    ob = OutBuf(t.img_base(1), c.img[1].alloc(_ceil(tile.rows, t.pp) * Eo, f"layer {name!r} output", align), Eo,
                lpp)
    return ib, ob


def _in_buf(c: _Ctx, name: str, tile: Tile, sh: int, cg: int, inp: FMap, aug: "Aug | None" = None,
            group: int = 0, align: int = 1) -> InBuf:
    """A strip's input buffer in image group `group`, filled by LOADs of `inp` (or of `aug.src`, augmented)."""
    t = c.target
    E, lines = _in_lines(t, tile, sh, cg)
    ib = InBuf(t.img_base(group), c.img[group].alloc(lines, f"layer {name!r} input", align), E, cg, sh, lines)
    if aug is None:
        _load_rows(c, inp, tile, ib)
    else:
        _load_aug(c, aug, tile, ib)
    return ib


def _cut(c: _Ctx, emit: Callable[[], Any]) -> tuple[Any, list[tuple[Instruction, int]]]:
    """Run `emit` and take the instructions it appended back out of the stream: (its result, the instructions
    with their layers)."""
    i0 = len(c.s.ins)
    r = emit()
    seg = list(zip(c.s.ins[i0:], c.s.layer_of[i0:]))
    del c.s.ins[i0:], c.s.layer_of[i0:]
    return r, seg


def _put(c: _Ctx, seg: list[tuple[Instruction, int]]) -> None:
    for x, layer in seg:
        c.s.ins.append(x)
        c.s.layer_of.append(layer)


_COMPUTE_OPS = ("CONV", "ALU", "ELEW")


def _interleave(c: _Ctx, comp: list[tuple[Instruction, int]], extra: list[tuple[Instruction, int]]) -> None:
    """Emit a strip's compute instructions with `extra` (LOADs / SAVEs) spread evenly after its CONV / ALU / ELEW
    instructions, so that each engine queue gets work in the order the engines can take it (the dispatcher stops
    behind a full queue, docs/microarchitecture.md §2)."""
    n = sum(1 for x, _ in comp if x.op in _COMPUTE_OPS)
    m, done, u = len(extra), 0, 0
    for x, layer in comp:
        c.s.ins.append(x)
        c.s.layer_of.append(layer)
        if x.op in _COMPUTE_OPS and n:
            u += 1
            due = _ceil(u * m, n)
            _put(c, extra[done:due])
            done = max(done, due)
    _put(c, extra[done:])


def _buf_span(t: Target, b: "InBuf | OutBuf", rows: int = 0) -> tuple[int, int, int]:
    """(bank group base, first line, lines) a strip buffer occupies; an OutBuf's lines from its `rows`."""
    if isinstance(b, InBuf):
        return b.group, b.base, b.lines
    return b.group, b.base, _ceil(rows, t.pp) * b.E


def _disjoint(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return a[0] != b[0] or a[1] + a[2] <= b[1] or b[1] + b[2] <= a[1]


def _strips(c: _Ctx, tiles: list[Tile], load: Callable[[Tile], tuple["InBuf", "OutBuf"]],
            compute: Callable[[Tile, "InBuf", "OutBuf"], None], save: Callable[[Tile, "OutBuf"], None]) -> None:
    """The strips of one layer. In the plain order each strip is LOADs, compute, SAVEs. With `c.pipeline` the
    program order is a software pipeline: strip k's compute instructions with the SAVEs of strip k-1 and the
    LOADs of strip k+1 spread between them (those touch other buffers, checked here, and other DDR bytes: a
    layer's input and output images never overlap, so the program's meaning is unchanged); with the tokens on
    the exact conflicting instruction (isa.deps.ExactTokenPlanner) strip k+1's LOADs run under strip k's compute
    and strip k-1's SAVEs under it too, instead of the dispatcher stopping behind a full SAVE queue that waits on
    strip k's last CONV. A boundary where the buffers overlap (single buffering) keeps the plain order."""
    t = c.target
    if not c.pipeline or len(tiles) < 2:
        for tile in tiles:
            ib, ob = load(tile)
            compute(tile, ib, ob)
            save(tile, ob)
        return
    cur = load(tiles[0])
    pending: list[tuple[Instruction, int]] = []         # the SAVEs of the previous strip, not emitted yet
    prev_ob: tuple[int, int, int] | None = None
    for k, tile in enumerate(tiles):
        ib, ob = cur
        _, comp = _cut(c, lambda: compute(tile, ib, ob))
        ob_span = _buf_span(t, ob, tile.rows)
        if pending:
            assert prev_ob is not None, "pending SAVEs are those of a previous strip, whose output span is prev_ob"
            if not _disjoint(ob_span, prev_ob):
                _put(c, pending)                          # strip k overwrites strip k-1's output: SAVE it first
                pending = []
        nxt: list[tuple[Instruction, int]] = []
        ahead = True                                      # strip k+1's LOADs may go among strip k's compute
        if k + 1 < len(tiles):
            cur, nxt = _cut(c, lambda: load(tiles[k + 1]))
            ib_span = _buf_span(t, cur[0])
            ahead = _disjoint(ib_span, _buf_span(t, ib)) and _disjoint(ib_span, ob_span)
        _, sv = _cut(c, lambda: save(tile, ob))
        if ahead:
            _interleave(c, comp, pending + nxt)
            pending = sv
        else:
            _interleave(c, comp, pending)
            _put(c, sv)
            _put(c, nxt)
            pending = []
        prev_ob = ob_span
    _put(c, pending)


def _blocks(t: Target, ob: OutBuf, rows: int, vb: int):
    """(first row, rows, bank_id_out, bank_addr_out) of the instructions that compute `rows` output rows of a
    strip, at most `vb` rows each; with stride_out s > 1 no block's rows wrap past the bank group, a block that
    starts on sub-row 1 has one row, and every other block but the last has a multiple of s rows
    (stride_offset_out stays 0)."""
    j0 = 0
    while j0 < rows:
        bank, addr, room = ob.place(t, j0)
        vpp = min(vb, rows - j0, room)
        if vpp < rows - j0 and vpp > ob.s:
            vpp -= vpp % ob.s
        yield j0, vpp, bank, addr
        j0 += vpp


# ---- channel augmentation (spec §6.2; vai-c-program-patterns §5) -----------------------------------------------

@dataclass(frozen=True)
class Aug:
    """A conv whose kw kernel columns are folded into the channels: the bank pixel of output column X holds the
    input pixels X*sw - pl + [0, kw) (kw*IC bytes, read as one LOAD item with jump_read sw*IC); the layer runs
    as a kh x 1 conv with stride_w 1 and the LOAD masks zero the left / right padding."""

    src: FMap          # the real input image (pixels contiguous: pix == c)
    kw: int
    sw: int
    pl: int


def _aug_ok(t: Target, x: FMap, kw: int, sw: int, pl: int) -> bool:
    """Channel augmentation can express this conv input: kw > 1 columns of contiguous pixels, kw*IC <= 64 (the
    LOAD masking range, spec §6.2), sw <= kw, left padding shorter than the kernel (every window starts inside
    the image or its padding, so no item is masked whole), pad_start / pad_end encodable, and slack before the
    image for the masked bytes of the first item."""
    ch = kw * x.c
    if kw < 2 or sw > kw or ch > 64 or x.pix != x.c or not 0 <= pl < kw:
        return False
    cw = _ceil(ch, t.cp) * t.cp
    return pl * x.c <= 31 and cw - ch + (kw - 1) * x.c <= 31 and x.addr >= pl * x.c


def _load_aug(c: _Ctx, aug: Aug, tile: Tile, buf: InBuf) -> None:
    """LOAD a channel-augmented tile: per real input row, items for the tile's output columns (virtual columns
    tile.b ...); pad_start zeroes the bytes left of the image, pad_end / pad_idx those right of it (spec §6.2)."""
    t = c.target
    s, ic = aug.src, aug.src.c
    ch = aug.kw * ic
    jr = aug.sw * ic
    cw = _ceil(ch, t.cp) * t.cp
    for q in range(tile.nv):
        y = tile.a + q
        if not 0 <= y < s.h:
            continue
        slot, sub = divmod(q, buf.sh)
        p, bank = divmod(slot, t.pp)
        line0 = buf.base + p * buf.sh * buf.E + sub * buf.E
        for x in range(tile.b, tile.b + tile.cv, MAX_ITEMS):
            n = min(MAX_ITEMS, tile.b + tile.cv - x)
            x_in = x * aug.sw - aug.pl                       # first input column of item 0
            pad_start = max(0, -x_in) * ic
            # right padding: items from i1 on overhang the image by r_i = r_i1 + sw*(i - i1) columns
            over = [(x + i) * aug.sw - aug.pl + aug.kw - s.w for i in range(n)]
            i1 = next((i for i, r in enumerate(over) if r > 0), n)
            pad_idx, pad_end = (n - i1, cw - ch + over[i1] * ic) if i1 < n else (1, 0)
            c.s.add("LOAD", bank_addr=line0 + (x - tile.b) * buf.cg, bank_id=buf.group + bank, jump_write=buf.cg,
                    jump_read=jr, length=n, channel=ch, pad_idx=pad_idx, pad_start=pad_start, pad_end=pad_end,
                    reg_id=s.reg, ddr_addr=s.at(y, 0) + x_in * ic)


def _aug_job(job: "ConvJob") -> "ConvJob":
    """The channel-augmented form of a conv job (weights w'[oc, ky, 0, kx*IC + ic] = w[oc, ky, kx, ic])."""
    win, x = job.win, job.inp
    oc, kh, kw, ic = job.w.shape
    return replace(job, inp=FMap(x.reg, x.addr, x.h, win.wo, kw * ic, kw * ic, win.wo * kw * ic, x.fp),
                   win=Window(kh, 1, win.sh, 1, win.pt, 0, win.ho, win.wo),
                   w=np.ascontiguousarray(job.w.reshape(oc, kh, 1, kw * ic)),
                   aug=Aug(x, kw, win.sw, win.pl))


# ---- CONV layers -----------------------------------------------------------------------------------------------

@dataclass
class ConvJob:
    name: str
    inp: FMap              # the input image (with `aug`: the virtual H x W_out image of kw*IC-byte pixels)
    out: FMap
    win: Window
    w: np.ndarray          # [OC, kh, kw, IC] int8
    b: np.ndarray          # [OC] int8
    shift_cut: int
    shift_bias: int
    act: int
    aug: Aug | None = None


@dataclass
class _ConvSetup:
    cg: int
    ic: int
    n_sl: int
    lines_slice: int
    per_group: int
    b_base: int
    vb_max: int


def _weight_lines(t: Target, job: "ConvJob") -> tuple[int, int]:
    """(CONVW lines of one output channel's weights, output-channel slices) of a conv."""
    oc, kh, kw, ic = job.w.shape
    return kh * kw * _ceil(ic, t.cp), _ceil(oc, t.cp)


def _per_group(c: _Ctx, lines_slice: int, n_sl: int, half: bool = False) -> int:
    """Output-channel slices per CONVW group: as many as the banks hold (at most half the depth in slices), or with
    `half` as many as half the bank depth holds (double buffering)."""
    per = max(1, min(n_sl, c.depth // lines_slice, c.depth // 2))
    return max(1, min(per, c.depth // 2 // lines_slice)) if half else per


def _conv_setup(c: _Ctx, job: ConvJob, half: bool = False) -> _ConvSetup:
    """Check the layer's limits and LOAD its bias (one LOAD of OC bytes; slice s at line base + s). `half`: weight
    groups of at most half the CONVW depth, so the next group's LOADs fill one half while the CONVs read the other."""
    t = c.target
    oc, kh, kw, ic = job.w.shape
    cg = _ceil(ic, t.cp)
    lines_slice, n_sl = _weight_lines(t, job)
    if cg > 256:
        raise CodegenError(f"layer {job.name!r}: {ic} input channels = {cg} channel groups > 256 (CONV "
                           f"channel_group); one CONV must read all input channels")
    if lines_slice > c.depth:
        raise CodegenError(f"layer {job.name!r}: the weights of one output channel need {lines_slice} CONVW lines "
                           f"(kernel {kw}x{kh} x {cg} channel groups), more than bank_depth {c.depth}")
    per_group = _per_group(c, lines_slice, n_sl, half)
    b_off = c.const(job.b.astype(np.int8).tobytes())
    b_base = c.bias.alloc(n_sl, f"layer {job.name!r} bias", c.param_align)
    c.s.add("LOAD", bank_addr=b_base, bank_id=t.bias_bank, jump_write=1, jump_read=oc, length=1, channel=oc,
            pad_idx=1, reg_id=REG_CONST, ddr_addr=b_off)
    return _ConvSetup(cg, ic, n_sl, lines_slice, per_group, b_base, _block_rows(t, job.win, t.pp))


def _conv_weights(c: _Ctx, job: ConvJob, st: _ConvSetup, g0: int, nsg: int) -> int:
    """LOAD the weights of slices g0..g0+nsg (CONVW bank o holds, per slice, K items of IC bytes, cg lines each);
    their first CONVW line."""
    t = c.target
    oc, kh, kw, ic = job.w.shape
    K, cg = kh * kw, st.cg
    w_base = c.convw.alloc(nsg * st.lines_slice, f"layer {job.name!r} weights", c.param_align)
    for o in range(t.cp):
        chans = [s * t.cp + o for s in range(g0, g0 + nsg) if s * t.cp + o < oc]
        if not chans:
            continue
        data = np.ascontiguousarray(job.w[chans].reshape(len(chans) * K, ic))
        off = c.const(data.tobytes())
        items = len(chans) * K
        if ic % t.cp == 0 and t.load_lines_per_cycle(t.convw_base + o, ic, ic, 0) < t.timing.weight_load_lines:
            # whole lines, contiguous in DDR and bank, but one item would take channel augmentation's single-line
            # path: LOAD them as long items instead, which the wide weight path writes two lines per cycle
            per = min(items, LOAD_CHANNEL_MAX // ic)
            for i0 in range(0, items, per):
                n = min(per, items - i0)
                c.s.add("LOAD", bank_addr=w_base + i0 * cg, bank_id=t.convw_base + o, jump_write=cg,
                        jump_read=n * ic, length=1, channel=n * ic, pad_idx=1, reg_id=REG_CONST,
                        ddr_addr=off + i0 * ic)
            continue
        for i0 in range(0, items, MAX_ITEMS):
            n = min(MAX_ITEMS, items - i0)
            c.s.add("LOAD", bank_addr=w_base + i0 * cg, bank_id=t.convw_base + o, jump_write=cg, jump_read=ic,
                    length=n, channel=ic, pad_idx=1, reg_id=REG_CONST, ddr_addr=off + i0 * ic)
    return w_base


def _conv_tile(c: _Ctx, job: ConvJob, st: _ConvSetup, tile: Tile, ib: InBuf, ob: OutBuf, w_base: int, g0: int,
               nsg: int, vb: int, state: dict, after: Callable[[int, int], None] | None = None) -> None:
    """The CONVs of one strip: blocks of <= vb output rows, all slices of the group per block (inner loop);
    `after(j0, rows)` follows each block."""
    t = c.target
    win = job.win
    oc, kh, kw, ic = job.w.shape
    cg, E, Eo = st.cg, ib.E, ob.E
    for j0, vpp, bank_out, addr_out in _blocks(t, ob, tile.rows, vb):
        init = dict(jump_read=cg, shift_cut=job.shift_cut, act_type=job.act,
                    jump_read_endl=E if E <= 1024 else 1, shift_bias=job.shift_bias, stride_out=ob.s,
                    jump_write=nsg, stride_offset_in=0, valid_pixel_parallel=vpp, kernel_h=kh,
                    stride_h=win.sh, jump_write_endl=Eo if Eo <= 1024 else 1, stride_offset_out=0,
                    kernel_w=kw, stride_w=win.sw)
        if init != state:
            c.s.add("CONVINIT", **init)
            state.clear()
            state.update(init)
        pads = _pads_of_block(win, job.inp.h, job.inp.w, tile, j0, vpp)
        inf = _clip_addr(_in_fields(t, ib, j0), ADDR_FIELD_LINES)
        for sl in range(nsg):
            c.s.add("CONV", **inf, **pads, bank_addr_out=addr_out + sl, channel_group=cg,
                    bank_addr_weights=w_base + sl * st.lines_slice, length=tile.cols,
                    bank_addr_bias=st.b_base + g0 + sl, bank_id_out=bank_out, channel_offset=cg * t.cp - ic)
        if after is not None:
            after(j0, vpp)


def _conv(c: _Ctx, job: ConvJob, half: bool = False) -> None:
    t = c.target
    st = _conv_setup(c, job, half)
    oc = job.w.shape[0]
    win = job.win
    groups = [(g0, min(st.per_group, st.n_sl - g0)) for g0 in range(0, st.n_sl, st.per_group)]
    w_next = _conv_weights(c, job, st, *groups[0])
    ahead: list[tuple[Instruction, int]] = []            # the next group's weight LOADs (double buffering)
    plans = [_plan_tiles(c, job.name, win, st.cg, 1, nsg, st.vb_max, 1024, 1024) for _, nsg in groups]
    tiles_of = [list(_tiles(win, r, k)) for r, k, _ in plans]
    # one strip, the same in every group: its input is LOADed once and stays in VB0 (only outputs are allocated
    # between the groups, in VB1), as AMD's programs read a small map once for all output channels
    keep = len(groups) > 1 and all(len(ts) == 1 and ts[0] == tiles_of[0][0] for ts in tiles_of)
    kept: list[InBuf] = []

    def load(tile: Tile, nsg: int) -> tuple[InBuf, OutBuf]:
        ib, ob = _strip(c, job.name, job.inp, tile, win.sh, st.cg, nsg, job.aug, kept[0] if kept else None)
        if keep and not kept:
            kept.append(ib)
        return ib, ob

    for gi, (g0, nsg) in enumerate(groups):
        if gi and not ahead:
            w_next = _conv_weights(c, job, st, g0, nsg)
        w_base = w_next
        ahead = []
        n_next = groups[gi + 1][1] * st.lines_slice if gi + 1 < len(groups) else 0
        # double buffering: the next group's weight LOADs (the other half of the CONVW ring) go after this group's
        # last input LOAD, spread among its CONVs, so the LOAD engine fills them while the CONVs run; unless the
        # ring would put them over this group's lines (then they open the next group, in place)
        if half and n_next and _disjoint((0, w_base, nsg * st.lines_slice),
                                         (0, c.convw.peek(n_next, c.param_align), n_next)):
            w_next, ahead = _cut(c, lambda: _conv_weights(c, job, st, *groups[gi + 1]))
        c0 = g0 * t.cp
        nch = min(oc, (g0 + nsg) * t.cp) - c0
        vb = plans[gi][2]
        state: dict[str, int] = {}
        _, seg = _cut(c, lambda: _strips(
            c, tiles_of[gi], lambda tile: load(tile, nsg),
            lambda tile, ib, ob: _conv_tile(c, job, st, tile, ib, ob, w_base, g0, nsg, vb, state),
            lambda tile, ob: _save_rows(c, job.out, tile, ob, c0, nch)))
        last = max((i for i, (x, _) in enumerate(seg) if x.op == "LOAD"), default=-1)
        _put(c, seg[:last + 1])
        _interleave(c, seg[last + 1:], ahead)
    c.workload += 2 * oc * job.w.shape[1] * job.w.shape[2] * st.ic * win.ho * win.wo


# ---- ALU layers (depthwise conv, pools, leaky / prelu, hard-sigmoid) -------------------------------------------

@dataclass
class AluJob:
    name: str
    inp: FMap
    out: FMap
    win: Window
    mode: int
    init: dict           # the ALUINIT fields that depend on the op (shifts, act, multi_factor, ...)
    weights: np.ndarray | None = None     # dwconv [kh, kw, C] / prelu [C] int8, into DWCONVW
    bias: np.ndarray | None = None        # [C] int8, into BIAS


def _alu_kpos(job: AluJob) -> int:
    return 0 if job.weights is None else job.weights.reshape(-1, job.inp.c).shape[0]


def _alu(c: _Ctx, job: AluJob) -> None:
    """ALU layer; when a row of all channels does not fit (e.g. a global pool of 7x7x2048), the channels are
    processed in chunks of whole channel groups, each with its own weights and bias."""
    t = c.target
    ch = job.inp.c
    cg_all = _ceil(ch, t.cp)
    win = job.win
    vb_max = _block_rows(t, win, t.alu_pp)
    chunk = _channel_chunk(c, job.name, win, cg_all, 1, vb_max, _alu_kpos(job))
    for g0 in range(0, cg_all, chunk):
        c0, c1 = g0 * t.cp, min(ch, (g0 + chunk) * t.cp)
        sub = replace(job, inp=replace(job.inp, addr=job.inp.addr + c0, c=c1 - c0),
                      out=replace(job.out, addr=job.out.addr + c0, c=c1 - c0),
                      weights=None if job.weights is None else job.weights[..., c0:c1],
                      bias=None if job.bias is None else job.bias[c0:c1])
        _alu_chunk(c, sub, vb_max)
    c.workload += 2 * ch * win.kh * win.kw * win.ho * win.wo


def _alu_params(c: _Ctx, job: AluJob) -> tuple[int, int]:
    """LOAD an ALU layer's weights (DWCONVW) and bias; their line addresses."""
    t = c.target
    ch = job.inp.c
    cg = _ceil(ch, t.cp)
    w_addr = b_addr = 0
    if job.weights is not None:
        wl = np.ascontiguousarray(job.weights.reshape(-1, ch))
        off = c.const(wl.tobytes())
        w_addr = c.dwconvw.alloc(wl.shape[0] * cg, f"layer {job.name!r} weights", c.param_align)
        c.s.add("LOAD", bank_addr=w_addr, bank_id=t.dwconvw_bank, jump_write=cg, jump_read=ch, length=wl.shape[0],
                channel=ch, pad_idx=1, reg_id=REG_CONST, ddr_addr=off)
    if job.bias is not None:
        off = c.const(np.ascontiguousarray(job.bias).astype(np.int8).tobytes())
        b_addr = c.bias.alloc(cg, f"layer {job.name!r} bias", c.param_align)
        c.s.add("LOAD", bank_addr=b_addr, bank_id=t.bias_bank, jump_write=1, jump_read=ch, length=1, channel=ch,
                pad_idx=1, reg_id=REG_CONST, ddr_addr=off)
    return w_addr, b_addr


def _alu_tile(c: _Ctx, job: AluJob, tile: Tile, ib: InBuf, ob: OutBuf, w_addr: int, b_addr: int, vb: int,
              state: dict, after: Callable[[int, int], None] | None = None) -> None:
    """The ALUs of one strip (blocks of <= vb output rows); `after(j0, rows)` follows each block."""
    t = c.target
    ch = job.inp.c
    cg = _ceil(ch, t.cp)
    win = job.win
    E, Eo = ib.E, ob.E
    init = dict(kernel_w=win.kw, kernel_h=win.kh, exec_mode=job.mode, stride_offset_out=0, stride_offset_in=0,
                stride_w=win.sw, stride_h=win.sh, length=tile.cols, channel_offset=cg * t.cp - ch,
                channel_group=cg, stride_out=ob.s, jump_read_endl=E, jump_read=cg, jump_write_endl=Eo,
                jump_write=cg, jump_read_weights=cg, **job.init)
    for j0, vpp, bank_out, addr_out in _blocks(t, ob, tile.rows, vb):
        if init != state:
            c.s.add("ALUINIT", **init)
            state.clear()
            state.update(init)
        pads = _pads_of_block(win, job.inp.h, job.inp.w, tile, j0, vpp)
        c.s.add("ALU", **_clip_addr(_in_fields(t, ib, j0), 1 << 14), **pads, bank_addr_out=addr_out,
                bank_id_out=bank_out, valid_pixel_parallel=vpp, bank_addr_weights=w_addr, kernel_d=1,
                bank_addr_bias=b_addr)
        if after is not None:
            after(j0, vpp)


def _alu_chunk(c: _Ctx, job: AluJob, vb_max: int) -> None:
    t = c.target
    ch = job.inp.c
    cg = _ceil(ch, t.cp)
    win = job.win
    w_addr, b_addr = _alu_params(c, job)
    rows, cols, vb = _plan_tiles(c, job.name, win, cg, 1, cg, vb_max, 8192, 2048)
    state: dict[str, int] = {}
    _strips(c, list(_tiles(win, rows, cols)),
            lambda tile: _strip(c, job.name, job.inp, tile, win.sh, cg, cg),
            lambda tile, ib, ob: _alu_tile(c, job, tile, ib, ob, w_addr, b_addr, vb, state),
            lambda tile, ob: _save_rows(c, job.out, tile, ob, 0, ch))


# ---- layer jobs, the cost estimate and the decisions built on it -----------------------------------------------

def _run(c: _Ctx, job: "ConvJob | AluJob") -> None:
    """Emit one CONV or ALU layer (channel-augmented when allowed and cheaper), or collect it (`c.capture`)."""
    if c.capture is not None:
        c.capture.append(job)
    elif isinstance(job, ConvJob):
        job = _choose_aug(c, job)
        _conv(c, job, _choose_half(c, job))
    else:
        _alu(c, job)


_COST_OPS = ("CONVINIT", "CONV", "ALUINIT", "ALU", "ELEW")


def _compute_cost(op: str, f: dict, tm, ks: list[int]) -> int:
    """docs/microarchitecture.md §3 cost of a compute instruction; `ks` carries the kernel positions of the
    latest CONVINIT (ks[0]) and ALUINIT (ks[1]) from one instruction to the next (both estimators share it)."""
    if op == "CONVINIT":
        ks[0] = f["kernel_h"] * f["kernel_w"]
        return tm.init_cycles
    if op == "CONV":
        return tm.conv_latency + f["length"] * ks[0] * f["channel_group"]
    if op == "ALUINIT":
        ks[1] = f["kernel_h"] * f["kernel_w"] * f["channel_group"] * f["length"]
        return tm.init_cycles
    if op == "ALU":
        return tm.alu_latency + ks[1] * f["kernel_d"]
    return tm.elew_latency + f["length"] * f["channel_group"] * f["num"]


def _load_cost(t: Target, f: dict) -> int:
    """A LOAD's busy cycles by the cycle model's §3 formula, its items taken at their full `channel` (channel
    augmentation's masked bytes are counted as read)."""
    tm = t.timing
    ch = f["channel"]
    lines = _ceil(_ceil(ch, t.cp), t.load_lines_per_cycle(f["bank_id"], ch, f["jump_read"], f["broadcast"]))
    if f["broadcast"] == 7:
        return tm.load_setup + f["length"] * lines
    return tm.load_setup + tm.ddr_latency + f["length"] * max(_ceil(ch, tm.ddr_bytes_per_cycle * tm.ddr_ports), lines)


def _estimate(t: Target, ins: list[Instruction], layer_of: list[int]) -> int:
    """Cycles of a stream by the cycle model's per-instruction costs (docs/microarchitecture.md §3, the target's
    Timing): per layer the busiest engine (engines overlap inside a layer; SAVEs are spread over the AXI ports),
    summed over the layers (a layer's consumer waits for its rows). The compiler may not import the cycle model
    (sim) itself; tests/test_codegen_quality.py checks the decisions against it."""
    tm = t.timing
    W, L, B, ports = t.cp, tm.ddr_latency, tm.ddr_bytes_per_cycle, tm.ddr_ports
    busy: dict[tuple[int, str], float] = {}
    ks = [0, 0]                       # the latest CONVINIT / ALUINIT kernel positions
    for x, layer in zip(ins, layer_of):
        f = x.fields
        op = x.op
        cost: float                                       # int cycles, except a SAVE's share of the AXI ports
        if op == "LOAD":
            cost = _load_cost(t, f)
        elif op == "SAVE":
            lines = _ceil(f["channel"], W)
            cost = (tm.save_setup + f["length"] * max(_ceil(f["channel"], B), lines) + L) / ports
        elif op in _COST_OPS:
            cost = _compute_cost(op, f, tm, ks)
        else:
            cost = tm.init_cycles
        key = (layer, op if op in ("LOAD", "SAVE") else ("CONV" if op.startswith("CONV") else "MISC"))
        busy[key] = busy.get(key, 0) + cost
    per_layer: dict[int, float] = {}
    for (layer, _), v in busy.items():
        per_layer[layer] = max(per_layer.get(layer, 0), v)
    return int(sum(per_layer.values()))


_WORDS = {"LOAD": 5, "SAVE": 5, "CONV": 5, "CONVINIT": 4, "ALUINIT": 6, "ALU": 5, "ELEWINIT": 3, "ELEW": 3,
          "END": 1}
_ENGINE = {"LOAD": 0, "SAVE": 1, "END": 1, "CONV": 2, "CONVINIT": 2, "ALU": 3, "ALUINIT": 3, "ELEW": 3,
           "ELEWINIT": 3}


def _schedule(t: Target, ins: list[Instruction]) -> int:
    """Total cycles of a tokened stream by the scheduling rules of the timing contract (docs/microarchitecture.md
    §2: fetch FIFO, in-order dispatch into queues of `queue_depth`, in-order engines, tokens released at the
    signaller's retire, SAVE pairs on their ports) with the §3 costs (LOAD items at their full `channel`, as
    `_estimate`). Every rule refers to earlier instructions only, so one forward pass gives the schedule. The
    compiler may not import the cycle model (sim); tests/test_codegen_quality.py compares the two."""
    tm = t.timing
    W, L, B, ports, Q = t.cp, tm.ddr_latency, tm.ddr_bytes_per_cycle, tm.ddr_ports, tm.queue_depth
    D, Lf = tm.fetch_fifo_words, tm.fetch_latency
    n = len(ins)
    d = [0] * n
    owner: list[int] = []            # word -> instruction
    A = Lf - 1
    d_prev = 0
    last_s = [0, 0, 0, 0]            # start of the previous instruction of each engine (SAVE: for pairs)
    last_e = [0, 0, 0, 0]
    last_r = [0, 0, 0, 0]
    queue: list[list[int]] = [[], [], [], []]      # starts of each engine's instructions, in order
    port_e = [0] * ports
    sig: dict[tuple[int, int], list[int]] = {}     # (P, C) -> retire times of P's signals, in order
    used: dict[tuple[int, int], int] = {}
    ks = [0, 0]                       # the latest CONVINIT / ALUINIT kernel positions
    total = 0
    for k, x in enumerate(ins):
        op, f = x.op, x.fields
        C = _ENGINE[op]
        for _ in range(_WORDS[op]):                 # fetch
            j = len(owner)
            c_j = Lf if j < D else d[owner[j - D]] + Lf
            A = max(A + 1, c_j)
            owner.append(k)
        dk = max(A + 1, d_prev + 1)
        qc = queue[C]
        if len(qc) >= Q:
            dk = max(dk, qc[-Q] + 1)
        d[k] = d_prev = dk
        if op == "LOAD":
            cost = _load_cost(t, f)
        elif op == "SAVE":
            cost = tm.save_setup + f["length"] * max(_ceil(f["channel"], B), _ceil(f["channel"], W)) + L
        elif op in _COST_OPS:
            cost = _compute_cost(op, f, tm, ks)
        elif op == "END":
            cost = tm.end_cycles
        else:
            cost = tm.init_cycles
        if C == 1:
            avail = last_r[1] if x.dpdon >> 1 & 1 else (last_s[1] + 1 if qc else 0)
        else:
            avail = last_e[C]
        s_k = max(dk + 1, avail)
        for P in range(4):
            if P != C and x.dpdon >> P & 1:
                m = used.get((P, C), 0)
                used[(P, C)] = m + 1
                s_k = max(s_k, sig[(P, C)][m])
        if op == "SAVE":
            p = f["hp_id"] % ports
            s_k = max(s_k, port_e[p])
            port_e[p] = s_k + cost
        e_k = s_k + cost
        r_k = max(e_k, last_r[C])
        last_s[C], last_e[C], last_r[C] = s_k, e_k, r_k
        qc.append(s_k)
        for P in range(4):
            if P != C and x.dpdby >> P & 1:
                sig.setdefault((C, P), []).append(r_k)
        total = max(total, r_k)
        if op == "END":
            return r_k
    return total


# The cycle count of an instruction stream on a target: the compiler's own `_schedule`, or the real cycle model with
# its bank-port arbitration (docs/bank-ports.md), which the compiler may not import: the runtime passes it in
# (runtime/costmodel.py) through `generate(cycles=...)` / `compiler.compile(cycles=...)`.
Cycles = Callable[[Target, list[Instruction]], int]


def _program_cost(t: Target, ins: list[Instruction], layer_of: list[int], prefetch: bool,
                  cycles: "Cycles | None" = None) -> int:
    """`cycles` (default `_schedule`) of a scratch stream after the same order and token passes as `generate`."""
    keys = _footprint_keys(t, ins, _scratch_regs(ins))
    if prefetch:
        order = _prefetch_layers(ins, layer_of, keys)
        ins, keys = [ins[k] for k in order], keys.permuted(order)
    return _cycles(cycles, t, _tokens(t, ins, True, keys) if any(x.op == "SAVE" for x in ins) else ins)


def _cycles(cycles: "Cycles | None", t: Target, ins: list[Instruction]) -> int:
    """`cycles(t, ins)`, or `_schedule` when none is given or the cycle model refuses a scratch stream (a clear
    OpenDpuError of its own, e.g. a stream cut before a layer's last token); the compiler then decides as before."""
    if cycles is not None:
        try:
            return int(cycles(t, ins))
        except OpenDpuError:
            pass
    return _schedule(t, ins)


def _layer_cost(c: _Ctx, *steps: Callable[["_Ctx"], None]) -> int:
    """Cycles of `steps` for a per-layer decision: with an injected cycle model (`c.cycles`), the tokened scratch
    stream on it, bank-port conflicts included (issue 15); otherwise the busiest-engine estimate `_cost`."""
    if c.cycles is not None:
        return _sched_cost(c, *steps)
    return _cost(c.target, *steps)


def _scratch_regs(ins: list[Instruction]) -> dict[int, int]:
    """Register sizes that hold every DDR access of a scratch stream."""
    size: dict[int, int] = {}
    for x in ins:
        if x.op in ("LOAD", "SAVE"):
            f = x.fields
            step = f["jump_read"] if x.op == "LOAD" else f["jump_write"]
            end = f["ddr_addr"] + (f["length"] - 1) * step + f["channel"] + 64
            size[f["reg_id"]] = max(size.get(f["reg_id"], 1), end)
    return size


def _cost(t: Target, *steps: Callable[["_Ctx"], None]) -> int:
    """Estimated cycles of emitting `steps` (one layer each) into a scratch context; CodegenError propagates."""
    c = _new_ctx(t)
    c.ws_alloc = lambda n: 0
    for k, step in enumerate(steps):
        c.s.layer = k
        step(c)
    return _estimate(t, c.s.ins, c.s.layer_of)


def _sched_cost(real: _Ctx, *steps: Callable[["_Ctx"], None]) -> int:
    """Cycles of `steps` (one layer each) emitted into a scratch context with `real`'s scheduling switches, after
    the order and token passes of `generate`, by `_schedule`; CodegenError propagates."""
    t = real.target
    c = _new_ctx(t)
    c.ws_alloc = lambda n: 0
    c.pipeline, c.param_align, c.fuse_conv = real.pipeline, real.param_align, real.fuse_conv
    for k, step in enumerate(steps):
        c.s.layer = k
        step(c)
    c.s.add("END")
    return _program_cost(t, c.s.ins, c.s.layer_of, real.param_align > 1, real.cycles)


def _decide(c: _Ctx, layer: str, what: str, costs: dict, chosen: str) -> None:
    """Record a choice of the real emission for the compile report: the estimated cycles of every form tried
    (None: the form cannot be emitted)."""
    if c.decisions is not None and c.capture is None:
        c.decisions.append({"layer": layer, "decision": what, "chosen": chosen, "cycles": costs})


def _choose_aug(c: _Ctx, job: "ConvJob") -> "ConvJob":
    """The channel-augmented form of a conv when augmentation is allowed, can express it and the estimate says
    it is faster (docs/compiler.md); else the job itself."""
    if not c.aug or job.aug is not None or job.win.kw < 2:
        return job
    if not _aug_ok(c.target, job.inp, job.win.kw, job.win.sw, job.win.pl):
        return job
    a = _aug_job(job)
    try:
        ca, cp = _layer_cost(c, lambda k: _conv(k, a)), _layer_cost(c, lambda k: _conv(k, job))
    except CodegenError:
        return job
    _decide(c, job.name, "channel_augmentation", {"augmented": ca, "plain": cp}, "augmented" if ca < cp else "plain")
    return a if ca < cp else job


def _choose_half(c: _Ctx, job: "ConvJob") -> bool:
    """Whether a conv whose weights take several CONVW groups loads them double-buffered (groups of at most half the
    bank depth: the next group's weight LOADs overlap the CONVs of this one, at the price of more groups, each
    reading the input again). Decided on the cycle model, which alone sees that overlap (docs/compiler.md)."""
    if c.cycles is None:
        return False
    lines_slice, n_sl = _weight_lines(c.target, job)
    whole = _per_group(c, lines_slice, n_sl)
    if whole >= n_sl or _per_group(c, lines_slice, n_sl, True) == whole:
        return False
    try:
        cw, ch = _layer_cost(c, lambda k: _conv(k, job)), _layer_cost(c, lambda k: _conv(k, job, True))
    except CodegenError:
        return False
    _decide(c, job.name, "weight_buffers", {"single": cw, "double": ch}, "double" if ch < cw else "single")
    return ch < cw


# ---- a producer and its only consumer in one superlayer (on-chip intermediate) ---------------------------------

ALU_KINDS = ("dwconv", "pool", "leaky", "hsigmoid", "relu6", "prelu")


def _strip_plan(c: _Ctx, ho: int, wo: int, vb_max: int, col_max: int,
                use: Callable[[int, int], "Sequence[int] | None"],
                shares: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(strip rows, columns, rows per instruction) of a superlayer's strips: the largest rows per instruction (a
    divisor of PP) for which some strip fits, as wide and then as tall as fits. `use(rows, cols)` gives the lines the
    strip takes in each image ring (None: a field overflows); each must fit `depth / share`, the first share that
    admits a strip wins (2 first: double buffering)."""
    t = c.target
    for share in shares:
        budget = c.depth // share

        def fits(rows: int, cols: int) -> bool:
            u = use(rows, cols)
            return u is not None and max(u) <= budget
        for vb in range(vb_max, 0, -1):
            if t.pp % vb:
                continue
            cols = min(wo, col_max)
            while cols > 1 and not fits(vb, cols):
                cols = max(1, min(cols - 1, cols * 3 // 4))
            if fits(vb, cols):
                rows = vb
                while rows + vb <= _ceil(ho, vb) * vb and fits(rows + vb, cols):
                    rows += vb
                return rows, cols, vb
    return None


def _fused(c: _Ctx, pjob: "ConvJob | AluJob", qjob: "AluJob | ConvJob", q_group: int = 0) -> None:
    """Producer P (CONV or ALU) and its only consumer Q (ALU, or CONV) strip by strip: for each strip of Q's output, P
    computes the rows and columns Q's windows read (recomputing overlapping halo rows, if any) straight into Q's
    input buffer in VB1 (stride_out = Q's stride_h, spec §2.4), Q reads them there and writes image group
    `q_group` (VB0 by default, beside P's input; VB1 or a third group keep Q's SAVEs off the banks P's next strip
    reads, docs/compiler.md), and only Q's rows are SAVEd. CodegenError when the pair does not fit this scheme."""
    t = c.target
    if not 0 <= q_group < len(c.img):
        raise CodegenError(f"fusion into {qjob.name!r}: no image group {q_group} on {t.name}")
    winQ = qjob.win
    ch = qjob.inp.c
    cg = _ceil(ch, t.cp)
    s = winQ.sh
    H, W = qjob.inp.h, qjob.inp.w
    is_conv = isinstance(pjob, ConvJob)
    q_conv = isinstance(qjob, ConvJob)
    if s > 2:
        raise CodegenError(f"fusion into {qjob.name!r}: stride_out {s} (> 2 is unproven, spec §2.4)")
    if not isinstance(qjob, ConvJob) and (cg > 256 or _alu_kpos(qjob) * cg > c.depth):
        raise CodegenError(f"fusion into {qjob.name!r}: channels do not fit one ALU pass")
    pwin = pjob.win
    if isinstance(pjob, ConvJob):
        st = _conv_setup(c, pjob)
        if st.per_group < st.n_sl or st.n_sl != cg:
            raise CodegenError(f"fusion of {pjob.name!r}: its weights do not fit one CONVW group")
        cg_p, vbP, e_max, len_max = st.cg, st.vb_max, 1024, 1024
        w_base = _conv_weights(c, pjob, st, 0, st.n_sl)
    else:
        cg_p, e_max, len_max = cg, 8192, 2048
        if _alu_kpos(pjob) * cg > c.depth:
            raise CodegenError(f"fusion of {pjob.name!r}: weights do not fit the DWCONVW bank")
        vbP = _block_rows(t, pwin, t.alu_pp)
        pw, pb = _alu_params(c, pjob)
    if vbP < s:
        raise CodegenError(f"fusion of {pjob.name!r}: {vbP} rows per instruction < stride_out {s}")
    if isinstance(qjob, ConvJob):
        # a CONV consumer: its weights must stay resident beside P's (one CONVW group each, no ring overlap)
        # Q's bias and weight LOADs are taken out of the stream and spread among P's first strip (Q needs them
        # only after it), which requires their lines to be none of P's
        stq, q_params = _cut(c, lambda: _conv_setup(c, qjob))
        q_wl = stq.n_sl * stq.lines_slice
        p_wl = st.n_sl * st.lines_slice if is_conv else 0
        if stq.per_group < stq.n_sl or p_wl + q_wl > c.depth:
            raise CodegenError(f"fusion into {qjob.name!r}: the two layers' weights do not fit the CONVW banks")
        wq_base, more = _cut(c, lambda: _conv_weights(c, qjob, stq, 0, stq.n_sl))
        q_params += more
        if is_conv and not _disjoint((0, w_base, p_wl), (0, wq_base, q_wl)):
            raise CodegenError(f"fusion into {qjob.name!r}: the two layers' weights overlap in the CONVW ring")
        if not c.pipeline or (is_conv and not _disjoint((0, st.b_base, st.n_sl), (0, stq.b_base, stq.n_sl))):
            _put(c, q_params)                             # in place: before P's instructions
            q_params = []
        vbQ_max, lpp_q, ch_out, len_q = stq.vb_max, stq.n_sl, qjob.w.shape[0], 1024
    else:
        qw, qb = _alu_params(c, qjob)
        vbQ_max, lpp_q, ch_out, len_q = _block_rows(t, winQ, t.alu_pp), cg, ch, 2048

    def lines(rows: int, cols: int) -> tuple[int, int, int] | None:
        """(P's input lines in VB0, the intermediate's lines in VB1, Q's output lines in group `q_group`) of a
        strip, None if a field overflows."""
        qt = _tile(winQ, 0, rows, 0, cols)
        Eq, q_lines = _in_lines(t, qt, s, cg)
        pt = _tile(pwin, 0, min(qt.nv, H), 0, min(qt.cv, W))
        Ep, p_lines = _in_lines(t, pt, pwin.sh, cg_p)
        if (pwin.sh > 1 and Ep > e_max) or (s > 1 and Eq > (1024 if is_conv or q_conv else 8192)) or Eq > 8192 \
                or pt.cols > len_max or cols > len_q:
            return None
        return p_lines, q_lines, _ceil(rows, t.pp) * cols * lpp_q

    def use(rows: int, cols: int) -> list[int] | None:
        ln = lines(rows, cols)
        if ln is None:
            return None
        u = [ln[0], ln[1]] + [0] * (len(c.img) - 2)
        u[q_group] += ln[2]
        return u

    # Q's output beside the intermediate (VB1) only with the half-depth budget: the ring then never wraps onto the
    # strip Q is still reading
    plan = _strip_plan(c, winQ.ho, winQ.wo, vbQ_max, 2048, use, (2, 1) if q_group != 1 else (2,))
    if plan is None:
        raise CodegenError(f"fusion of {pjob.name!r} and {qjob.name!r}: one strip does not fit the image banks")
    rows, cols, vbQ = plan
    state_p: dict[str, int] = {}
    state_q = state_p if is_conv == q_conv else {}    # two ALU (two CONV) layers share the ALUINIT (CONVINIT) state

    def prepare(qt: Tile):
        """Strip buffers: Q's input (VB1, written by P) and P's input (VB0, LOADed now)."""
        ya, yb = max(0, qt.a), min(H, qt.a + qt.nv)
        xa, xb = max(0, qt.b), min(W, qt.b + qt.cv)
        if yb <= ya or xb <= xa:
            raise CodegenError(f"fusion into {qjob.name!r}: a strip's windows lie in the padding")
        pt = _tile(pwin, ya, yb - ya, xa, xb - xa)
        Eq, q_lines = _in_lines(t, qt, s, cg)
        ibq = InBuf(t.img_base(1), c.img[1].alloc(q_lines, f"layer {qjob.name!r} input", TOKEN_LINES), Eq, cg, s,
                    q_lines)
        obp = OutBuf(ibq.group, ibq.base, Eq, cg, s, ya - qt.a, (xa - qt.b) * cg)
        p_aug = pjob.aug if isinstance(pjob, ConvJob) else None
        ibp = _in_buf(c, pjob.name, pt, pwin.sh, cg_p, pjob.inp, p_aug, 0, TOKEN_LINES)
        return pt, ibp, obp, ibq

    # software pipeline in program order: P computes strip k, the LOADs of strip k+1 follow, then Q's blocks of
    # strip k, each followed by the SAVEs of its rows (so no engine queue waits behind a strip's whole tail)
    tiles = list(_tiles(winQ, rows, cols))
    nxt = prepare(tiles[0])
    if not q_conv:
        q_params = []
    deferred: list = [[], None]                           # Q's SAVEs not emitted yet, and the lines they read
    for k, qt in enumerate(tiles):
        pt, ibp, obp, ibq = nxt
        if isinstance(pjob, ConvJob):
            _, pseg = _cut(c, lambda: _conv_tile(c, pjob, st, pt, ibp, obp, w_base, 0, st.n_sl, vbP, state_p))
        else:
            _, pseg = _cut(c, lambda: _alu_tile(c, pjob, pt, ibp, obp, pw, pb, vbP, state_p))
        if deferred[0] and not _disjoint(_buf_span(t, ibq), deferred[1]):
            _put(c, deferred[0])                          # P writes where Q's deferred rows are (Q's output in VB1)
            deferred[0] = []
        moved: list[tuple[Instruction, int]] = []
        if k + 1 < len(tiles):
            nxt, moved = _cut(c, lambda: prepare(tiles[k + 1]))
        n_q = _ceil(qt.rows, vbQ)
        if c.pipeline and moved:
            # a share of the next strip's LOADs among P's instructions too (P's strip waits for its own LOADs; a
            # run of P instructions behind a full queue would hold those LOADs back), when their lines are free
            n_p = sum(1 for x, _ in pseg if x.op in _COMPUTE_OPS)
            k_p = len(moved) * n_p // (n_p + n_q)
            nsp = _buf_span(t, nxt[1])
            if not (_disjoint(nsp, _buf_span(t, ibp)) and _disjoint(nsp, _buf_span(t, ibq))):
                k_p = 0
            if k_p and deferred[0] and not _disjoint(nsp, deferred[1]):
                _put(c, deferred[0])
                deferred[0] = []
            _interleave(c, pseg, q_params + moved[:k_p])
            q_params = []
            del moved[:k_p]
        else:
            _interleave(c, pseg, q_params)
            q_params = []
        Eo = qt.cols * lpp_q
        obq = OutBuf(t.img_base(q_group), c.img[q_group].alloc(_ceil(qt.rows, t.pp) * Eo, f"layer {qjob.name!r} output",
                                                    TOKEN_LINES), Eo, lpp_q)
        per = _ceil(len(moved), n_q) if moved else 0
        ob_span = _buf_span(t, obq, qt.rows)
        # the rings allocate without knowing what is live: Q's rows must not land on the strip Q reads or on the next
        # strip's input (LOADed among Q's blocks)
        if not _disjoint(ob_span, _buf_span(t, ibq)) or (k + 1 < len(tiles) and not _disjoint(ob_span,
                                                                                           _buf_span(t, nxt[1]))):
            raise CodegenError(f"fusion into {qjob.name!r}: its output rows would overwrite a strip buffer in use")
        nxt_span = _buf_span(t, nxt[1]) if k + 1 < len(tiles) else None
        if deferred[0] and not _disjoint(ob_span, deferred[1]):
            _put(c, deferred[0])                          # Q's blocks overwrite the deferred rows: SAVE them first
            deferred[0] = []

        def after(j0: int, n: int, qt: Tile = qt, obq: OutBuf = obq, ob_span=ob_span, nxt_span=nxt_span) -> None:
            """After Q's block: a share of the next strip's LOADs (they touch other lines and bytes, so moving them
            past Q's block keeps the program's meaning) and the SAVEs of Q's rows. With `c.pipeline` the SAVEs are
            those of the previous block (this block's wait for its ALU, and a full SAVE queue would stop the
            dispatcher before the LOADs behind it), unless the LOADs overwrite their lines."""
            _, sv = _cut(c, lambda: _save_rows(c, qjob.out, qt, obq, 0, ch_out, range(j0, j0 + n)))
            if not c.pipeline:
                _put(c, sv)
                _put(c, moved[:per])
            else:
                if deferred[0] and moved[:per] and not _disjoint(nxt_span, deferred[1]):
                    _put(c, deferred[0])
                    deferred[0] = []
                _put(c, moved[:per])
                _put(c, deferred[0])
                deferred[0], deferred[1] = sv, ob_span
            del moved[:per]

        if isinstance(qjob, ConvJob):
            _conv_tile(c, qjob, stq, qt, ibq, obq, wq_base, 0, stq.n_sl, vbQ, state_q, after=after)
        else:
            _alu_tile(c, qjob, qt, ibq, obq, qw, qb, vbQ, state_q, after=after)
        if moved and deferred[0]:
            assert nxt_span is not None, "only a next strip's LOADs are moved, so nxt_span is set"
            if not _disjoint(nxt_span, deferred[1]):
                _put(c, deferred[0])
                deferred[0] = []
        _put(c, moved)
    _put(c, deferred[0])
    kp = pjob.w.shape[1] * pjob.w.shape[2] * pjob.w.shape[3] if isinstance(pjob, ConvJob) else pwin.kh * pwin.kw
    kq = qjob.w.shape[1] * qjob.w.shape[2] * qjob.w.shape[3] if isinstance(qjob, ConvJob) else winQ.kh * winQ.kw
    c.workload += 2 * ch * kp * pwin.ho * pwin.wo + 2 * ch_out * kq * winQ.ho * winQ.wo


def _fuse_jobs(c: _Ctx, graph: Graph, p: Op, q: Op, kinds: dict[str, str], fm: dict[str, FMap],
               out: FMap, elew: bool = False) -> tuple | None:
    """(P's job, Q's job) of a producer / consumer pair, P's conv in its chosen (augmented or not) form; None if
    either is not a single CONV / ALU layer."""
    # where the unfused P would store its output: a register of its own (REG_SCRATCH), so that in the scratch
    # emissions the decisions schedule (_sched_cost) it shares no DDR byte with a real tensor; the fused form never
    # reads or writes it
    p_out = _dense(REG_SCRATCH, 0, _t(p).shape, _fp(p))
    jobs = []
    for op, o, env in ((p, p_out, fm), (q, out, {**fm, p.name: p_out})):
        c.capture = []
        try:
            _lower(c, graph, op, kinds[op.name], env, o)
            got = c.capture
        finally:
            c.capture = None
        if len(got) != 1:
            return None
        jobs.append(got[0])
    pj, qj = jobs
    if elew:
        if not isinstance(pj, ConvJob) or not isinstance(qj, ElewJob):
            return None
    elif not isinstance(qj, (AluJob, ConvJob)) or (isinstance(qj, ConvJob) and not c.fuse_conv):
        return None
    if isinstance(pj, ConvJob):
        pj = _choose_aug(c, pj)
    return pj, qj


def _try_fuse(c: _Ctx, pj: "ConvJob | AluJob", qj: "AluJob | ConvJob") -> bool:
    """Emit P and Q fused when that fits and the estimate says it is faster than P then Q through DDR."""
    t = c.target
    p_alone = (lambda k: _conv(k, pj)) if isinstance(pj, ConvJob) else (lambda k: _alu(k, pj))
    # a CONV pair: the busiest-engine estimate misses what the split layers overlap (strip pipeline, prefetch
    # across the two) and a fused pair in few strips does not; both forms are always scheduled
    conv_pair = isinstance(qj, ConvJob)

    def cost(t: Target, *steps: Callable[["_Ctx"], None]) -> int:
        return _sched_cost(c, *steps) if conv_pair else _layer_cost(c, *steps)
    # where Q's output goes: VB0 (beside P's input), VB1 (beside the intermediate) or a third image group; only the
    # cycle model sees the bank-port conflicts that tell them apart, so without it only VB0 is tried
    groups = range(len(c.img)) if c.cycles is not None else range(1)
    forms: dict[str, int | None] = {}
    for g in groups:
        def fused_in(k: "_Ctx", g: int = g) -> None:
            _fused(k, pj, qj, g)
        try:
            forms[_FUSED_FORM[g]] = cost(t, fused_in)
        except CodegenError:
            forms[_FUSED_FORM[g]] = None
    tried = {f: v for f, v in forms.items() if v is not None}
    if not tried:
        return False
    # on equal estimates the group farthest from P's input: the layer alone cannot show what Q's SAVEs, starved of
    # a bank port by P's reads, cost the layers after it (tf2_custom_op: 17,743 -> 17,676 cycles, docs/compiler.md)
    form = min(tried, key=lambda f: (tried[f], -_FUSED_FORM.index(f)))
    try:
        split = cost(t, p_alone, (lambda k: _conv(k, qj)) if isinstance(qj, ConvJob) else (lambda k: _alu(k, qj)))
    except CodegenError:
        split = None
    take = split is None or tried[form] < split
    # the scratch run starts with empty parameter rings; the real ones may wrap elsewhere and refuse the pair
    # (e.g. the two layers' weights overlapping in the CONVW ring): then it is undone and the layers go split
    g = _FUSED_FORM.index(form)
    if take and not _emit_or_undo(c, lambda: _fused(c, pj, qj, g)):
        take, forms[form] = False, None
    _decide(c, f"{pj.name} + {qj.name}", "fuse_conv" if conv_pair else "fuse",
            {**forms, "split": split}, form if take else "split")
    return take


# the forms of a fused pair by the image group of Q's output (the compile report's names)
_FUSED_FORM = ("fused", "fused, output in VB1", "fused, output in VB2")


def _emit_or_undo(c: _Ctx, emit: Callable[[], None]) -> bool:
    """Run `emit` on the real context; on CodegenError take back what it emitted (instructions, CONST bytes,
    ring allocations, workload) and return False."""
    rings = [c.convw, c.bias, c.dwconvw, *c.img]
    saved = (len(c.s.ins), len(c.blob), [r.ptr for r in rings], c.workload, c.s.layer,
             len(c.decisions) if c.decisions is not None else 0)
    try:
        emit()
    except CodegenError:
        n, nb, ptrs, wl, layer, nd = saved
        del c.s.ins[n:], c.s.layer_of[n:], c.blob[nb:]
        for r, p in zip(rings, ptrs):
            r.ptr = p
        c.workload, c.s.layer = wl, layer
        if c.decisions is not None:
            del c.decisions[nd:]
        return False
    return True


# ---- ELEW layers (eltwise add / mul, rescaled copies) ----------------------------------------------------------

@dataclass
class ElewJob:
    name: str
    inps: list[FMap]
    out: FMap
    shift_read: list[int]
    shift_write: int
    elew_type: int
    act: int


def _elew(c: _Ctx, job: ElewJob) -> None:
    """ELEW layer, in chunks of channel groups when all channels do not fit (ELEW channel_group <= 256)."""
    t = c.target
    ch = job.out.c
    cg_all = _ceil(ch, t.cp)
    win = Window(1, 1, 1, 1, 0, 0, job.out.h, job.out.w)
    chunk = _channel_chunk(c, job.name, win, cg_all, len(job.inps), _block_rows(t, win, t.alu_pp))
    for g0 in range(0, cg_all, chunk):
        c0, c1 = g0 * t.cp, min(ch, (g0 + chunk) * t.cp)
        _elew_chunk(c, replace(job, inps=[replace(f, addr=f.addr + c0, c=c1 - c0) for f in job.inps],
                               out=replace(job.out, addr=job.out.addr + c0, c=c1 - c0)))
    c.workload += len(job.inps) * ch * win.ho * win.wo


def _elew_chunk(c: _Ctx, job: ElewJob) -> None:
    t = c.target
    ch = job.out.c
    cg = _ceil(ch, t.cp)
    win = Window(1, 1, 1, 1, 0, 0, job.out.h, job.out.w)
    n = len(job.inps)
    rows, cols, vb = _plan_tiles(c, job.name, win, cg, n, cg, _block_rows(t, win, t.alu_pp), 8192, 2048)
    for tile in _tiles(win, rows, cols):
        bufs = []
        subs = []
        for fm in job.inps:
            # a broadcast input (H or W of 1, spec §6.7 share_pp / jump_read 0) holds only its real rows / columns
            rb, cb = fm.h == 1 and job.out.h > 1, fm.w == 1 and job.out.w > 1
            sub = _tile(Window(1, 1, 1, 1, 0, 0, fm.h, fm.w), 0 if rb else tile.y0, 1 if rb else tile.rows,
                        0 if cb else tile.x0, 1 if cb else tile.cols)
            subs.append((fm, sub, rb, cb, *_in_lines(t, sub, 1, cg)))
        # the strip's inputs as one block of the ring: allocated one by one, a wrap between two of them could put
        # the second over the first
        at = c.img[0].alloc(sum(s[5] for s in subs), f"layer {job.name!r} inputs")
        for fm, sub, rb, cb, Ek, lk in subs:
            ib = InBuf(t.img_base(0), at, Ek, cg, 1, lk)
            at += lk
            _load_rows(c, fm, sub, ib)
            bufs.append((ib, rb, cb))
        Eo = tile.cols * cg
        ob = OutBuf(t.img_base(1), c.img[1].alloc(_ceil(tile.rows, t.pp) * Eo, f"layer {job.name!r} output"),
                    Eo, cg)
        _elew_rows(c, job, tile, bufs, ob, vb)
        _save_rows(c, job.out, tile, ob, 0, ch)


def _elew_rows(c: _Ctx, job: ElewJob, tile: Tile, bufs: list[tuple[InBuf, bool, bool]], ob: OutBuf,
               vb: int) -> None:
    """The ELEWINITs and ELEWs of one strip, `vb` rows per ELEW: input k read from bufs[k] = (buffer, broadcast over
    rows, broadcast over columns; spec §6.7 share_pp / jump_read 0), the output written to `ob`."""
    t = c.target
    cg = _ceil(job.out.c, t.cp)
    for j0 in range(0, tile.rows, vb):
        vpp = min(vb, tile.rows - j0)
        p, b = divmod(j0, t.pp)
        for k, (ib, rb, cb) in enumerate(bufs):
            c.s.add("ELEWINIT", share_pp=int(rb), bank_id_in=ib.group + (0 if rb else b),
                    bank_addr_in=ib.base + (0 if rb else p * ib.E), jump_read_endl=ib.E, id=k, jump_bank=1,
                    jump_read=0 if cb else cg, shift_read=job.shift_read[k])
        c.s.add("ELEW", length=tile.cols, act_type=job.act, elew_type=job.elew_type, bank_id_out=ob.group + b,
                bank_addr_out=ob.base + p * ob.E, jump_write_endl=ob.E, num=len(bufs), valid_pixel_parallel=vpp,
                jump_write=cg, shift_write=job.shift_write, channel_group=cg)


def _conv_elew(c: _Ctx, pj: "ConvJob", qj: ElewJob, k: int) -> None:
    """A conv and the ELEW (add / multiply) that is the only reader of its output, as input k, strip by strip: the
    conv writes its rows into VB1, the ELEW reads them there with the rows of its other inputs LOADed beside the
    conv's input in VB0, and only the ELEW's rows are SAVEd. AMD's ResNet-50 program does this (UG1414's rows
    `res2b` etc. hold branch2c and the add). CodegenError when the pair does not fit this scheme."""
    t = c.target
    st = _conv_setup(c, pj)
    cg = st.n_sl
    H, W = qj.out.h, qj.out.w
    if st.per_group < st.n_sl:
        raise CodegenError(f"fusion of {pj.name!r}: its weights do not fit one CONVW group")
    if cg > 256 or (pj.out.h, pj.out.w, pj.out.c) != (H, W, qj.out.c) or \
            any((f.h, f.w, f.c) != (H, W, qj.out.c) for f in qj.inps):
        raise CodegenError(f"fusion into {qj.name!r}: the ELEW's inputs are not all the conv's shape")
    others = [f for i, f in enumerate(qj.inps) if i != k]
    win = pj.win
    ewin = Window(1, 1, 1, 1, 0, 0, H, W)
    vbE = _block_rows(t, ewin, t.alu_pp)

    def lines(rows: int, cols: int) -> tuple[int, int] | None:
        """(VB0 lines: the conv's input + the other inputs' rows, VB1 lines: the conv's rows + the ELEW's rows)."""
        tile = _tile(win, 0, rows, 0, cols)
        E, in_lines = _in_lines(t, tile, win.sh, st.cg)
        if (win.sh > 1 and E > 1024) or cols > 1024 or cols * cg > 8192:
            return None
        out = _ceil(rows, t.pp) * cols * cg
        return in_lines + len(others) * out, 2 * out

    plan = _strip_plan(c, win.ho, win.wo, st.vb_max, 1024, lines, (2, 1))
    if plan is None:
        raise CodegenError(f"fusion of {pj.name!r} and {qj.name!r}: one strip does not fit the image banks")
    rows, cols, vb = plan
    w_base = _conv_weights(c, pj, st, 0, cg)
    state: dict[str, int] = {}
    for tile in _tiles(win, rows, cols):
        E, in_lines = _in_lines(t, tile, win.sh, st.cg)
        Eo = tile.cols * cg
        out = _ceil(tile.rows, t.pp) * Eo
        # each ring's share of the strip as one block (a wrap between two allocations could overlap them)
        a0 = c.img[0].alloc(in_lines + len(others) * out, f"layer {pj.name!r} + {qj.name!r} inputs", TOKEN_LINES)
        ib = InBuf(t.img_base(0), a0, E, st.cg, win.sh, in_lines)
        if pj.aug is None:
            _load_rows(c, pj.inp, tile, ib)
        else:
            _load_aug(c, pj.aug, tile, ib)
        otile = _tile(ewin, tile.y0, tile.rows, tile.x0, tile.cols)
        bufs: list[InBuf] = []
        at = a0 + in_lines
        for f in others:
            bufs.append(InBuf(t.img_base(0), at, Eo, cg, 1, out))
            _load_rows(c, f, otile, bufs[-1])
            at += out
        a1 = c.img[1].alloc(2 * out, f"layer {pj.name!r} + {qj.name!r} outputs", TOKEN_LINES)
        ob = OutBuf(t.img_base(1), a1, Eo, cg)
        eb = OutBuf(t.img_base(1), a1 + out, Eo, cg)
        _conv_tile(c, pj, st, tile, ib, ob, w_base, 0, cg, vb, state)
        bufs.insert(k, InBuf(ob.group, ob.base, Eo, cg, 1, out))
        _elew_rows(c, qj, otile, [(b, False, False) for b in bufs], eb, vbE)
        _save_rows(c, qj.out, tile, eb, 0, qj.out.c)
    kp = pj.w.shape[1] * pj.w.shape[2] * pj.w.shape[3]
    c.workload += 2 * qj.out.c * kp * win.ho * win.wo + len(qj.inps) * qj.out.c * H * W


def _try_fuse_elew(c: _Ctx, pj: "ConvJob", qj: ElewJob, k: int) -> bool:
    """Emit a conv and its ELEW consumer fused when that fits and the estimate says it is faster than split."""
    try:
        fused = _layer_cost(c, lambda x: _conv_elew(x, pj, qj, k))
    except CodegenError:
        return False
    try:
        split = _layer_cost(c, lambda x: _conv(x, pj), lambda x: _elew(x, qj))
    except CodegenError:
        split = None
    take = split is None or fused < split
    fused_cost: int | None = fused
    if take and not _emit_or_undo(c, lambda: _conv_elew(c, pj, qj, k)):
        take, fused_cost = False, None
    _decide(c, f"{pj.name} + {qj.name}", "fuse_elew", {"fused": fused_cost, "split": split},
            "fused" if take else "split")
    return take


# ---- copies (concat members, reshapes at the interface, nearest upsampling) ------------------------------------

def _copy(c: _Ctx, name: str, inp: FMap, outs: list[FMap]) -> None:
    """LOAD the rows of `inp` and SAVE each into every FMap of `outs` (same H, W, C; any strides)."""
    t = c.target
    cg = _ceil(inp.c, t.cp)
    win = Window(1, 1, 1, 1, 0, 0, inp.h, inp.w)
    rows, cols, _ = _plan_tiles(c, name, win, cg, 1, 1, t.pp, 8192, MAX_ITEMS * 64)
    # the input buffer doubles as the output buffer (row j in bank j % PP, as SAVE reads it)
    for tile in _tiles(win, rows, cols):
        E, lines = _in_lines(t, tile, 1, cg)
        ib = InBuf(t.img_base(0), c.img[0].alloc(lines, f"layer {name!r} copy"), E, cg, 1, lines)
        _load_rows(c, inp, tile, ib)
        ob = OutBuf(ib.group, ib.base, E, cg)
        for o in outs:
            _save_rows(c, o, tile, ob, 0, inp.c)


# ---- the subgraph ----------------------------------------------------------------------------------------------

def _arg(graph: Graph, op: Op, name: str, i: int = 0) -> Op | None:
    names = op.inputs.get(name) or []
    return graph.ops[names[i]] if i < len(names) else None


def _data_inputs(op: Op) -> list[str]:
    return list(op.inputs.get("input") or [])


def _nonlinear(op: Op) -> str:
    nl = str(op.get("nonlinear", "NONE") or "NONE").upper().replace("-", "").replace("_", "")
    return "NONE" if nl == "" else nl


def unsupported(graph: Graph, op_name: str, target: Target) -> str | None:
    """None if `generate` can compile this op for `target`, else why not (the op then runs on the CPU)."""
    op = graph.ops[op_name]
    try:
        kind = _classify(graph, op, target)
        if kind not in ("skip", "alias", "view"):
            _dry_run(graph, op, kind, target)
    except (CodegenError, FixPointError) as e:
        return str(e)
    return None


def _new_ctx(t: Target) -> _Ctx:
    depth = min(t.bank_depth, ADDR_FIELD_LINES)
    return _Ctx(None, t, Stream(), depth, [Ring(depth), Ring(depth)], Ring(depth), Ring(depth), Ring(depth))


def _dense(reg: int, addr: int, dims, fp: int) -> FMap:
    h, w, ch = hwc(dims)
    return FMap(reg, addr, h, w, ch, ch, w * ch, fp)


def _dry_run(graph: Graph, op: Op, kind: str, t: Target) -> None:
    """Lower one op alone (dense images, no tokens): CodegenError if no tiling fits the target."""
    c = _new_ctx(t)
    fm = {i: _dense(REG_IN, 0, _t(graph.ops[i]).shape, _fp(graph.ops[i])) for i in _data_inputs(op)}
    _lower(c, graph, op, kind, fm, _dense(REG_OUT, 0, _t(op).shape, _fp(op)))


def _conv_act(op: Op, target: Target, fp_out: int, engine: str) -> int:
    nl = _nonlinear(op)
    if nl == "NONE":
        return 0
    if nl == "RELU":
        return 1
    if nl == "RELU6":
        return 4 if fp_out <= 4 else 1
    if nl == "LEAKYRELU":
        alpha = op.get("LEAKYRELU_alpha")
        ok = target.cv_lkrl if engine == "conv" else target.dw_lkrl
        if alpha is not None and Fraction(float(alpha)) == LEAKY_ALPHA and ok:
            return 3
    raise CodegenError(f"op {op.name!r}: nonlinear {nl} cannot be fused on the {engine.upper()} engine")


def _classify(graph: Graph, op: Op, t: Target) -> str:
    """The lowering kind of an op, or CodegenError with the reason."""
    typ = op.type
    if typ in SKIP_TYPES:
        return "skip"
    if typ in ALIAS_TYPES:
        return "alias"
    if _t(op).fix_point is None:
        raise CodegenError(f"op {op.name!r} ({typ}) has no output fix point")
    if typ in ("conv2d-fix", "transposed-conv2d-fix"):
        if _pairs(op, "dilation", [1, 1]) != (1, 1):
            raise CodegenError(f"op {op.name!r}: dilated convolution is not implemented by the compiler yet")
        if int(op.get("group", 1) or 1) != 1:
            raise CodegenError(f"op {op.name!r}: grouped convolution (group {op.get('group')}) is not compiled")
        if typ == "transposed-conv2d-fix" and any(int(v) for v in op.get("output_padding", [0, 0]) or [0, 0]):
            raise CodegenError(f"op {op.name!r}: transposed conv output_padding is not compiled")
        _conv_act(op, t, _fp(op), "conv")
        return "conv" if typ == "conv2d-fix" else "tconv"
    if typ == "depthwise-conv2d-fix":
        if _pairs(op, "dilation", [1, 1]) != (1, 1):
            raise CodegenError(f"op {op.name!r}: dilated depthwise convolution is not implemented yet")
        w = _arg(graph, op, "weights")
        if w is None or int(_t(w).shape[0]) != 1:
            raise CodegenError(f"op {op.name!r}: depthwise multiplier must be 1")
        _conv_act(op, t, _fp(op), "alu")
        return "dwconv"
    if typ == "pool-fix":
        ptype = str(op.get("type", "MAX")).upper()
        if ptype not in ("MAX", "AVG"):
            raise CodegenError(f"op {op.name!r}: pool type {ptype}")
        return "pool"
    if typ == "eltwise-fix":
        et = str(op.get("type", "ADD")).upper()
        ins = _data_inputs(op)
        if et in ("LEAKY-RELU", "LEAKYRELU"):
            m, s = slope_encoding(Fraction(int(op.get("prelu_in")), 1 << int(op.get("prelu_shift"))))
            if m < 0 or not slope_fits_alu(m, s):
                raise CodegenError(f"op {op.name!r}: leaky-relu slope {m}/2^{s} is negative or does not fit the ALU")
            return "leaky"
        if et == "PRELU":
            a = graph.ops[ins[1]] if len(ins) > 1 else _arg(graph, op, "weights")
            if a is None or a.type not in ("const-fix", "const"):
                raise CodegenError(f"op {op.name!r}: PReLU slopes must be a constant")
            if int(_int8(a).min()) < 0:
                raise CodegenError(f"op {op.name!r}: negative PReLU slopes (the ALU picks the shift by the sign "
                                   f"of x*alpha, the reference by the sign of x; spec §6.8 vs §7.7)")
            return "prelu"
        if et not in ("ADD", "MUL"):
            raise CodegenError(f"op {op.name!r}: eltwise type {et}")
        y = tuple(int(v) for v in _t(op).shape)
        for i in ins:
            s_ = tuple(int(v) for v in _t(graph.ops[i]).shape)
            if s_ != y and not (len(s_) == len(y) == 4 and s_[3] == y[3] and s_[0] == 1
                                and s_[1] in (1, y[1]) and s_[2] in (1, y[2])):
                raise CodegenError(f"op {op.name!r}: eltwise broadcast {list(s_)} -> {list(y)} (only rows and "
                                   f"columns of 1 are repeated by ELEW)")
        if not 1 <= len(ins) <= 4 or (et == "MUL" and len(ins) != 2):
            raise CodegenError(f"op {op.name!r}: eltwise {et} of {len(ins)} inputs")
        nl = _nonlinear(op)
        if nl == "RELU6" and et == "ADD" and len(ins) == 1 and _fp(graph.ops[ins[0]]) - _fp(op) in range(0, 64):
            return "relu6"
        if nl not in ("NONE", "RELU"):
            raise CodegenError(f"op {op.name!r}: nonlinear {nl} on ELEW")
        fps = [_fp(graph.ops[i]) for i in ins]
        try:
            if et == "ADD":
                if max(fps) - min(fps) > 15:
                    raise CodegenError(f"op {op.name!r}: input fix points differ by more than 15")
                elew_shift_write(_fp(op) - min(fps))
            else:
                elew_shift_write(_fp(op) - sum(fps))
        except FixPointError as e:
            raise CodegenError(f"op {op.name!r}: {e}") from None
        return "elew"
    if typ == "concat-fix":
        dims = list(_t(op).shape)
        ax = int(op.get("axis", -1))
        if ax < 0:
            ax += len(dims)
        if ax == 0 or ax >= len(dims) or len(dims) != 4 and ax != len(dims) - 1:
            raise CodegenError(f"op {op.name!r}: concat along axis {ax} of a {len(dims)}-D tensor")
        for i in _data_inputs(op):
            d = _fp(op) - _fp(graph.ops[i])
            if abs(d) > 15:
                raise CodegenError(f"op {op.name!r}: input fix point differs by {d}")
        return "concat"
    if typ == "upsample-fix":
        x = tuple(_t(graph.ops[_data_inputs(op)[0]]).shape)
        y = tuple(_t(op).shape)
        if len(x) != 4 or y[1] % x[1] or y[2] % x[2]:
            raise CodegenError(f"op {op.name!r}: upsample {list(x)} -> {list(y)} is not an integer scale")
        if abs(_fp(op) - _fp(graph.ops[_data_inputs(op)[0]])) > 15:
            raise CodegenError(f"op {op.name!r}: fix point change too large")
        return "upsample"
    if typ == "tile-fix":
        xi = [int(v) for v in _t(graph.ops[_data_inputs(op)[0]]).shape]
        yi = [int(v) for v in _t(op).shape]
        s, rev = int(op.get("stride", 0) or 0), bool(op.get("reverse", False))
        if xi[:1] != [1] or tile_shape(xi, s, rev) != yi:
            raise CodegenError(f"op {op.name!r}: tile stride {op.get('stride')} reverse {rev} from {xi} to {yi}")
        if abs(_fp(op) - _fp(graph.ops[_data_inputs(op)[0]])) > 15:
            raise CodegenError(f"op {op.name!r}: fix point change too large")
        return "tile"
    if typ == "hard-sigmoid-fix":
        fin, fout = _fp(graph.ops[_data_inputs(op)[0]]), _fp(op)
        try:
            hsigmoid_fields(fin, fout)
        except FixPointError as e:
            raise CodegenError(f"op {op.name!r}: {e}") from None
        return "hsigmoid"
    if typ == "strided_slice-fix":
        _slice_box(graph, op)
        return "view"
    raise CodegenError(f"op {op.name!r}: {typ} is not compiled for the DPU")


def _slice_box(graph: Graph, op: Op) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """((y0, x0, c0), (stride_h, stride_w)) of a strided_slice-fix realised as a view of its input's image
    (LOAD addressing: offset, pixel and row strides); CodegenError for slices a view cannot express."""
    x = [int(v) for v in _t(graph.ops[_data_inputs(op)[0]]).shape]
    y = [int(v) for v in _t(op).shape]
    begin = [int(v) for v in op.get("begin", [])]
    strides = [int(v) for v in op.get("strides", [1] * len(begin))]
    if len(x) != 4 or len(begin) != 4 or len(strides) != 4:
        raise CodegenError(f"op {op.name!r}: strided_slice of a {len(x)}-D tensor with {len(begin)} bounds "
                           f"(a view needs 4-D NHWC begin/end/strides)")
    if x[0] != 1 or begin[0] != 0 or strides[0] != 1 or strides[3] != 1 or min(strides) < 1:
        raise CodegenError(f"op {op.name!r}: strided_slice begin {begin} strides {strides}: the batch must stay "
                           f"whole and the channel stride be 1")
    b = [min(max(v if v >= 0 else v + d, 0), d) for v, d in zip(begin, x)]
    for ax in (1, 2, 3):
        if b[ax] + (y[ax] - 1) * strides[ax] >= x[ax]:
            raise CodegenError(f"op {op.name!r}: strided_slice {begin}/{strides} of {x} cannot give {y}")
    if _fp(op) != _fp(graph.ops[_data_inputs(op)[0]]):
        raise CodegenError(f"op {op.name!r}: strided_slice changes the fix point (a view cannot rescale)")
    return (b[1], b[2], b[3]), (strides[1], strides[2])


def _slice_view(graph: Graph, op: Op, src: FMap) -> FMap:
    """The image of a strided_slice-fix: a window of its input's image (no instructions)."""
    (y0, x0, c0), (sh, sw) = _slice_box(graph, op)
    h, w, ch = hwc(_t(op).shape)
    return FMap(src.reg, src.at(y0, x0, c0), h, w, ch, src.pix * sw, src.row * sh, src.fp)


@dataclass
class _Plan:
    fm: dict[str, FMap] = field(default_factory=dict)     # op name -> where its output lives


@dataclass(frozen=True)
class CodegenOptions:
    """The code generator's switches (vai_c `--options` keys of the same names, all on by default; docs/compiler.md):
    `channel_augmentation` lets convs with few input channels fold kw into the LOAD items, `fuse` lets a producer
    and its only (ALU) consumer share one superlayer with the intermediate on chip (each taken per layer when the
    cost model says it is faster); `exact_tokens`, `pipeline` and `prefetch_layers` are the scheduling
    optimisations; `fuse_conv` lets a producer be fused with its only CONV consumer; `pool_cascade` runs a large
    stride-1 max pool as a cascade of small ones."""
    channel_augmentation: bool = True
    fuse: bool = True
    exact_tokens: bool = True
    pipeline: bool = True
    prefetch_layers: bool = True
    fuse_conv: bool = True
    pool_cascade: bool = True

    @classmethod
    def from_options(cls, options: dict) -> "CodegenOptions":
        """From checked vai_c options: the keys named as the fields (absent: on); other keys are not this class's."""
        return cls(**{f.name: bool(options[f.name]) for f in fields(cls) if f.name in options})


CODEGEN_OPTIONS = tuple(f.name for f in fields(CodegenOptions))


def generate(graph: Graph, op_names: list[str], target: Target, name: str = "subgraph",
             log: Callable[[str], None] | None = None, options: CodegenOptions | None = None,
             cycles: "Cycles | None" = None) -> DpuProgram:
    """Compile the ops `op_names` of `graph` (one DPU subgraph) for `target` (module docstring) with `options`
    (`CodegenOptions`, all on by default). `cycles` is the cycle model to decide
    by (the runtime passes runtime.costmodel.cycle_model, which has the bank-port arbitration); None: the
    compiler's own estimates.

    Where a CONV consumer Q could be fused either with its producer or with its own ALU consumer (a contested
    pair), the ALU pair is taken; when the subgraph has such a pair the program is also generated the other way
    and the one `_schedule` finds faster is kept."""
    args = (graph, op_names, target, name, options or CodegenOptions(), cycles)
    prog, contested = _generate(*args, conv_first=False)
    if contested:
        alt, _ = _generate(*args, conv_first=True)
        ca, cp = _cycles(cycles, target, alt.instructions), _cycles(cycles, target, prog.instructions)
        if ca < cp:
            prog = alt
        prog.stats["decisions"].append({"layer": "(whole subgraph)", "decision": "contested pairs",
                                        "chosen": "producer + CONV consumer" if ca < cp else "CONV + ALU consumer",
                                        "cycles": {"producer + CONV consumer": ca, "CONV + ALU consumer": cp}})
    if log:
        st = prog.stats
        log(f"{name}: {len(prog.layers)} layers, {st['instructions']} instructions, {st['const_bytes']} parameter "
            f"bytes, {st['workspace_bytes']} workspace bytes")
    return prog


def _generate(graph: Graph, op_names: list[str], target: Target, name: str, opts: CodegenOptions,
              cycles: "Cycles | None", conv_first: bool) -> tuple[DpuProgram, bool]:
    """`generate` with the contested pairs decided one way (`conv_first`: producer + CONV consumer); also
    whether the subgraph has a contested pair."""
    channel_augmentation, fuse, exact_tokens = opts.channel_augmentation, opts.fuse, opts.exact_tokens
    pipeline, prefetch_layers, fuse_conv, pool_cascade = (opts.pipeline, opts.prefetch_layers, opts.fuse_conv,
                                                          opts.pool_cascade)
    contested = False
    t = target
    ops = set(op_names)
    order = [n for n in graph.toposort() if n in ops]
    kinds = {n: _classify(graph, graph.ops[n], t) for n in order}
    compute = [n for n in order if kinds[n] != "skip"]
    if not compute:
        raise CodegenError(f"subgraph {name!r} has no op to compile")
    # interface: inputs are data inputs produced outside; outputs are ops consumed outside or graph outputs
    inputs: list[str] = []
    for n in compute:
        for i in graph.ops[n].input_ops():
            if i not in ops and graph.ops[i].type not in SKIP_TYPES and i not in inputs:
                inputs.append(i)
    outputs = [n for n in compute if not graph.consumers(n) or any(cn not in ops for cn in graph.consumers(n))]

    c = _new_ctx(t)
    c.graph = graph
    c.aug = channel_augmentation
    c.pipeline = pipeline
    c.fuse_conv = fuse_conv
    c.cascade = pool_cascade
    c.decisions = []
    c.cycles = cycles
    c.param_align = TOKEN_LINES if prefetch_layers else 1   # one layer's parameters share no key with the next's
    fm: dict[str, FMap] = {}
    dense = _dense
    # images read by a conv that may be channel-augmented with left padding get DDR_ALIGN bytes of slack before
    # them: the first LOAD item of a row starts pl*IC bytes before the row (masked, never read; spec §6.2)
    slack: set[str] = set()
    if channel_augmentation:
        for n in compute:
            op = graph.ops[n]
            if kinds[n] == "conv" and _data_inputs(op):
                x = _data_inputs(op)[0]
                kw_, _ = _pairs(op, "kernel", [1, 1])
                sw_, _ = _pairs(op, "stride", [1, 1])
                pl_ = _pads(op)[0]
                if pl_ > 0 and 2 <= kw_ and sw_ <= kw_ and kw_ * hwc(_t(graph.ops[x]).shape)[2] <= 64:
                    slack.add(x)

    sizes = {REG_IN: 0, REG_OUT: 0, REG_WORKSPACE: 0}

    def alloc(reg: int, nbytes: int, pre: int = 0) -> int:
        a = _ceil(sizes[reg], DDR_ALIGN) * DDR_ALIGN + pre
        sizes[reg] = a + nbytes
        return a

    c.ws_alloc = lambda nbytes: alloc(REG_WORKSPACE, nbytes)
    for i in inputs:
        o = graph.ops[i]
        dims = tuple(int(v) for v in _t(o).shape)
        fm[i] = dense(REG_IN, alloc(REG_IN, math.prod(dims), DDR_ALIGN if i in slack else 0), dims, _fp(o))
    out_set = set(outputs)
    # aliases (reshape) share their input's image when the input is dense and not an interface tensor
    alias_of: dict[str, str] = {}
    for n in compute:
        if kinds[n] == "alias":
            src = _data_inputs(graph.ops[n])[0]
            alias_of[n] = src
    # concat members written in place: a compute op in the subgraph whose only role is feeding the concat
    member_of: dict[str, tuple[str, int]] = {}
    for n in compute:
        if kinds[n] != "concat":
            continue
        c0 = 0
        axis = _concat_axis(graph.ops[n])
        for i in _data_inputs(graph.ops[n]):
            io = graph.ops[i]
            ok = (i in ops and kinds.get(i) in ("conv", "tconv", "dwconv", "pool", "elew", "leaky", "prelu", "relu6",
                                                        "hsigmoid", "upsample", "tile")
                  and i not in out_set and i not in member_of and _fp(io) == _fp(graph.ops[n])
                  and all(kinds.get(cn) != "alias" for cn in graph.consumers(i)))
            if ok:
                member_of[i] = (n, c0)
            c0 += hwc(_t(io).shape)[axis]

    internal: list[DdrImage] = []

    def place(n: str) -> FMap:
        """The image of op n's output (allocated on first use)."""
        if n in fm:
            return fm[n]
        o = graph.ops[n]
        dims = tuple(int(v) for v in _t(o).shape)
        if n in member_of:
            cat, c0 = member_of[n]
            f = _member_view(place(cat), _concat_axis(graph.ops[cat]), c0, dims, _fp(o))
        else:
            reg = REG_OUT if n in out_set else REG_WORKSPACE
            f = dense(reg, alloc(reg, math.prod(dims), DDR_ALIGN if n in slack else 0), dims, _fp(o))
        fm[n] = f
        return f

    # outputs first (their registers); then a reshape shares its source's image (in reverse order, so chains of
    # aliases share one image) unless the source is an interface tensor, a concat member or an output itself
    for n in outputs:
        place(n)
    for n in reversed(compute):
        a_src = alias_of.get(n)
        if a_src is None or a_src not in ops or a_src in out_set or a_src in member_of or a_src in fm:
            continue
        f = place(n)
        fm[a_src] = dense(f.reg, f.addr, _t(graph.ops[a_src]).shape, _fp(graph.ops[a_src]))
    layers: list[Layer] = []
    done: set[str] = set()              # consumers already emitted with their producer
    pos_of = {m: j for j, m in enumerate(compute)}
    for n in compute:
        if n in done:
            continue
        op = graph.ops[n]
        k = kinds[n]
        c.s.layer = len(layers)
        first = len(c.s.ins)
        lops = [n] + [i for i in op.input_ops() if i in ops and graph.ops[i].type in SKIP_TYPES]
        cons = graph.consumers(n)

        def pair_layer(q: Op, qout: FMap, n: str = n, lops: list[str] = lops, first: int = first) -> None:
            """Op n and its consumer q, emitted fused, as one layer (q's output image is internal unless an output)."""
            qops = [q.name] + [i for i in q.input_ops() if i in ops and graph.ops[i].type in SKIP_TYPES]
            layers.append(Layer(n, lops + qops, first, len(c.s.ins) - first))
            done.add(q.name)
            if qout.reg == REG_WORKSPACE and q.name not in member_of:
                internal.append(_image(q.name, qout, _t(q).shape))

        def alu_pair(p: str) -> bool:
            """Is p's only consumer an ALU layer reading only p (a pair `_fused` takes first)?"""
            cs = graph.consumers(p)
            return (len(cs) == 1 and cs[0] in ops and kinds[cs[0]] in ALU_KINDS and p not in out_set
                    and [i for i in _data_inputs(graph.ops[cs[0]]) if graph.ops[i].type not in SKIP_TYPES] == [p])

        # a CONV consumer that has an ALU consumer of its own to fuse with is contested: the ALU pair wins unless
        # `conv_first` (weighing the two pairs by a schedule of the three layers alone chose worse on tf2_custom_op
        # and YOLOX, so `generate` compares whole programs)
        single = (fuse and k in ("conv",) + ALU_KINDS and n not in out_set and n not in fm and len(cons) == 1
                  and cons[0] in ops
                  and [i for i in _data_inputs(graph.ops[cons[0]]) if graph.ops[i].type not in SKIP_TYPES] == [n])
        conv_q = single and fuse_conv and kinds[cons[0]] == "conv"
        if conv_q and alu_pair(cons[0]):
            contested = True
            conv_q = conv_first
        if single and (kinds[cons[0]] in ALU_KINDS or conv_q):
            q = graph.ops[cons[0]]
            qout = place(q.name)
            jobs = _fuse_jobs(c, graph, op, q, kinds, fm, qout)
            if jobs is not None and _try_fuse(c, *jobs):
                pair_layer(q, qout)
                continue
        # a conv whose only reader is an ELEW whose other inputs are already computed: the two in one strip loop
        if (fuse and k == "conv" and n not in out_set and n not in fm and len(cons) == 1 and cons[0] in ops
                and kinds[cons[0]] == "elew"):
            q = graph.ops[cons[0]]
            qins = [i for i in _data_inputs(q) if graph.ops[i].type not in SKIP_TYPES]
            ready = all(i == n or i in inputs or (i in pos_of and pos_of[i] < pos_of[n] and kinds[i] != "alias")
                        for i in qins)
            if ready and qins.count(n) == 1:
                qout = place(q.name)
                jobs = _fuse_jobs(c, graph, op, q, kinds, fm, qout, elew=True)
                if jobs is not None and _try_fuse_elew(c, jobs[0], jobs[1], qins.index(n)):
                    pair_layer(q, qout)
                    continue
        view_only = False
        if k == "view":         # a window of its input's image; copied only where a dense image is needed
            v = _slice_view(graph, op, fm[_data_inputs(op)[0]])
            if n in fm:
                _copy(c, n, v, [fm[n]])
            else:
                fm[n], view_only = v, True
        out = place(n)
        if k == "view":
            pass
        elif k == "alias":
            sf = fm[_data_inputs(op)[0]]
            if sf.reg != out.reg or sf.addr != out.addr:
                _copy(c, n, dense(sf.reg, sf.addr, _t(op).shape, sf.fp) if sf.dense else sf, [out])
        else:
            _lower(c, graph, op, k, fm, out)
        if len(c.s.ins) > first or k not in ("alias", "view") or layers == []:
            layers.append(Layer(n, lops, first, len(c.s.ins) - first))
        else:
            layers[-1].ops.extend(lops)
        if out.reg == REG_WORKSPACE and n not in member_of and not view_only:
            internal.append(_image(n, out, _t(op).shape))
    if not c.s.ins:
        raise CodegenError(f"subgraph {name!r}: nothing to execute (only aliases)")
    # END
    c.s.add("END")
    c.s.layer_of[-1] = len(layers) - 1
    layers[-1].count += 1
    keys = _footprint_keys(t, c.s.ins, {REG_CONST: max(1, len(c.blob)), **{r: max(1, v) for r, v in sizes.items()}})
    if prefetch_layers:
        perm = _prefetch_layers(c.s.ins, c.s.layer_of, keys)
        c.s.ins = [c.s.ins[j] for j in perm]
        c.s.layer_of = [c.s.layer_of[j] for j in perm]
        keys = keys.permuted(perm)
        span: dict[int, list[int]] = {}
        for pos, li in enumerate(c.s.layer_of):
            span.setdefault(li, [pos, pos])[1] = pos
        for li, (a, b) in span.items():                  # a layer's hull (its opening LOADs moved up)
            layers[li].first, layers[li].count = a, b - a + 1
    instrs = _tokens(t, c.s.ins, exact_tokens, keys)
    regs = [Register(REG_CONST, CONST, max(1, len(c.blob)), bytes(c.blob))]
    if sizes[REG_WORKSPACE]:
        regs.append(Register(REG_WORKSPACE, WORKSPACE, sizes[REG_WORKSPACE]))
    if inputs:
        regs.append(Register(REG_IN, INTERFACE, sizes[REG_IN]))
    regs.append(Register(REG_OUT, INTERFACE, sizes[REG_OUT]))
    prog = DpuProgram(name, t, instrs, c.s.layer_of, layers, RegisterMap.of(regs),
                      [_image(i, fm[i], _t(graph.ops[i]).shape) for i in inputs],
                      [_image(o, fm[o], _t(graph.ops[o]).shape) for o in outputs], internal, c.workload,
                      {"instructions": len(instrs), "const_bytes": len(c.blob),
                       "workspace_bytes": sizes[REG_WORKSPACE], "decisions": c.decisions or []})
    return prog, contested


def _one_row_stride(t: Target, win: Window, depth: int) -> Window:
    """A window with one output row (a global pool) reads the same input rows whatever its stride_h, but the
    stride decides the bank layout of those rows (spec §6.4: slot q // stride_h, sub-row q % stride_h): at the
    op's own stride (= kernel_h) every row is a sub-row of slot 0 in one bank, kernel_h·cols lines of a single
    bank. stride_h = ceil(kernel_h / PP) spreads the rows over the PP banks, ceil(kernel_h / PP)·cols lines each
    (the UG1414 pool limit `compiler.rules` checks), within one gathering pass. The result is the same sum of the
    same window (docs/compiler.md, "Global pools"). The op's own stride is kept whenever one channel group of its
    rows fits the image banks, so the programs of pools that always fitted (AMD's 7x7 global pools) are unchanged."""
    if win.ho != 1 or win.sh <= _ceil(win.kh, t.pp):
        return win
    if _in_lines(t, _tile(win, 0, 1, 0, win.wo), win.sh, 1)[1] <= depth:
        return win
    return replace(win, sh=_ceil(win.kh, t.pp))


def _pool_cascade(op: Op, win: Window, x: FMap, mode: int, d: int) -> list[int]:
    """The kernel sizes of a cascade of stride-1 max pools equal to a k x k stride-1 max pool with padding
    (k-1)/2 on every side (the SPP pools): 5x5 stages, then a 3x3 one (k = 1 + 4a + 2b); [] when the pool is not of
    that form, changes the fix point (each stage would round), or the cascade reads no fewer kernel positions.
    *Why equal:* per axis, output p of the cascade is the max over the input within [p-(k-1)/2, p+(k-1)/2] (the
    windows compose), plus the padding value exactly when that range leaves the image (a stage window at q reaches
    the padding iff q is within its half-width of the edge, and composes to the same condition), whatever the
    padding value is; max is exact with shift_cut 0."""
    k = win.kh
    if (mode != 3 or d != 0 or op.get("global", False) or win.kw != k or k < 7 or k % 2 == 0 or win.sh != 1
            or win.sw != 1 or win.pt != (k - 1) // 2 or win.pl != (k - 1) // 2
            or tuple(_pads(op)) != ((k - 1) // 2,) * 4 or (win.ho, win.wo) != (x.h, x.w)):
        return []
    a, r = divmod(k - 1, 4)
    stages = [5] * a + ([3] if r else [])
    return stages if sum(s * s for s in stages) < k * k else []


def _cascade_step(job: "AluJob", stages: list[int]) -> Callable[["_Ctx"], None]:
    """Emit `job` (a max pool) as the stride-1 cascade `stages` through workspace temporaries."""
    def step(c: _Ctx) -> None:
        src = job.inp
        w0 = c.workload
        for i, k in enumerate(stages):
            dst = job.out if i == len(stages) - 1 else c.temp(src.h, src.w, src.c, src.fp)
            h = (k - 1) // 2
            _alu(c, replace(job, inp=src, out=dst, win=Window(k, k, 1, 1, h, h, src.h, src.w)))
            src = dst
        win = job.win                                 # the workload is the op's own, not the stages'
        c.workload = w0 + 2 * job.inp.c * win.kh * win.kw * win.ho * win.wo
    return step


def _concat_axis(op: Op) -> int:
    """Concat axis as an index into (H, W, C) of the batch-1 image."""
    rank = len(_t(op).shape)
    ax = int(op.get("axis", -1))
    if ax < 0:
        ax += rank
    return 2 if ax == rank - 1 else ax - 1


def _member_view(out: FMap, axis: int, off: int, dims, fp: int) -> FMap:
    """The part of a concat's image that one member fills (offset `off` along H, W or C)."""
    h, w, ch = hwc(dims)
    addr = out.addr + off * (out.row, out.pix, 1)[axis]
    return FMap(out.reg, addr, h, w, ch, out.pix, out.row, fp)


def _image(n: str, f: FMap, dims) -> DdrImage:
    d = tuple(int(v) for v in dims)
    if len(d) == 4:
        st: tuple[int, ...] = (f.h * f.row, f.row, f.pix, 1)
    else:
        st = tuple(int(math.prod(d[i + 1:])) for i in range(len(d)))
        if not f.dense:
            raise CodegenError(f"tensor {n!r}: a {len(d)}-D tensor must be dense")
    return DdrImage(n, f.reg, f.addr, d, st, f.fp)


def _lower(c: _Ctx, graph: Graph, op: Op, kind: str, fm: dict[str, FMap], out: FMap) -> None:
    t = c.target
    ins = [fm[i] for i in _data_inputs(op) if graph.ops[i].type not in SKIP_TYPES]    # a PReLU's slopes: const
    fp_out = out.fp
    if kind in ("conv", "tconv"):
        wop, bop = _arg(graph, op, "weights"), _arg(graph, op, "bias")
        assert wop is not None
        w = _int8(wop)
        fp_w = _fp(wop)
        oc = w.shape[0]
        b = _int8(bop).reshape(-1) if bop is not None else np.zeros(oc, np.int8)
        sc, sb = conv_shifts(ins[0].fp, fp_w, fp_out, _fp(bop) if bop is not None else None, check=True)
        act = _conv_act(op, t, fp_out, "conv")
        kw_, kh_ = _pairs(op, "kernel", [w.shape[2], w.shape[1]])
        sw, sh = _pairs(op, "stride", [1, 1])
        pl, pr, pt, pb = _pads(op)
        x = ins[0]
        if kind == "conv":
            win = Window(kh_, kw_, sh, sw, pt, pl, out.h, out.w)
            _run(c, ConvJob(op.name, x, out, win, w, b, sc, sb or 0, act))
            return
        # transposed: stride^2 phases, each a stride-1 conv with the sub-kernel on the original input
        P_h, P_w = kh_ - 1 - pt, kw_ - 1 - pl
        for py in range(sh):
            ky0 = (P_h - py) % sh
            kys = list(range(ky0, kh_, sh))
            hp = _ceil(out.h - py, sh)
            for px in range(sw):
                kx0 = (P_w - px) % sw
                kxs = list(range(kx0, kw_, sw))
                wp = _ceil(out.w - px, sw)
                if hp <= 0 or wp <= 0:
                    continue
                if not kys or not kxs:
                    raise CodegenError(f"op {op.name!r}: a transposed-conv phase has no kernel taps (stride > kernel)")
                dy = (py + ky0 - P_h) // sh
                dx = (px + kx0 - P_w) // sw
                sub = np.ascontiguousarray(w[:, kys][:, :, kxs])
                o = FMap(out.reg, out.at(py, px), hp, wp, out.c, out.pix * sw, out.row * sh, out.fp)
                win = Window(len(kys), len(kxs), 1, 1, -dy, -dx, hp, wp)
                _conv(c, ConvJob(f"{op.name}[phase {py},{px}]", x, o, win, sub, b, sc, sb or 0, act))
        return
    if kind == "dwconv":
        wop, bop = _arg(graph, op, "weights"), _arg(graph, op, "bias")
        assert wop is not None
        w = _int8(wop)[0]                       # [kh, kw, C]
        fp_w = _fp(wop)
        sc, sb = conv_shifts(ins[0].fp, fp_w, fp_out, _fp(bop) if bop is not None else None, check=True)
        act = _conv_act(op, t, fp_out, "alu")
        kw_, kh_ = _pairs(op, "kernel", [w.shape[1], w.shape[0]])
        sw, sh = _pairs(op, "stride", [1, 1])
        pl, pr, pt, pb = _pads(op)
        bias = _int8(bop).reshape(-1) if bop is not None else None
        mode = 0 if bias is not None else 6
        win = Window(kh_, kw_, sh, sw, pt, pl, out.h, out.w)
        _run(c, AluJob(op.name, ins[0], out, win, mode,
                       dict(shift_cut=sc, shift_bias=sb or 0, act_type=act, multi_factor=0, shift_prelu_p=0,
                            shift_prelu_n=0), w, bias))
        return
    if kind == "pool":
        x = ins[0]
        ptype = str(op.get("type", "MAX")).upper()
        if op.get("global", False):
            win = Window(x.h, x.w, x.h, x.w, 0, 0, 1, 1)
        else:
            kw_, kh_ = _pairs(op, "kernel", [1, 1])
            sw, sh = _pairs(op, "stride", [kw_, kh_])
            pl, pr, pt, pb = _pads(op)
            win = Window(kh_, kw_, sh, sw, pt, pl, out.h, out.w)
        win = _one_row_stride(t, win, c.depth)
        d = fp_out - x.fp
        try:
            if ptype == "MAX":
                init = dict(shift_cut=pool_shift_cut(d), multi_factor=0, mode=3)
            else:
                nf, mf = avg_pool_factor(win.kh, win.kw)
                init = dict(shift_cut=pool_shift_cut(d - mf), multi_factor=nf, mode=2)
        except FixPointError as e:
            raise CodegenError(f"op {op.name!r}: {e}") from None
        mode = init.pop("mode")
        full = dict(init, shift_bias=0, act_type=0, shift_prelu_p=0, shift_prelu_n=0)
        stages = _pool_cascade(op, win, x, mode, d)
        if stages and c.capture is None and c.cascade:
            job = AluJob(op.name, x, out, win, mode, full)
            cc, cs = _layer_cost(c, _cascade_step(job, stages)), _layer_cost(c, lambda k: _alu(k, job))
            _decide(c, op.name, "pool_cascade", {"cascade " + "/".join(map(str, stages)): cc, "single": cs},
                    "cascade " + "/".join(map(str, stages)) if cc < cs else "single")
            if cc < cs:
                _cascade_step(job, stages)(c)
                return
        _run(c, AluJob(op.name, x, out, win, mode, full))
        return
    if kind == "leaky":
        x = ins[0]
        m, s = slope_encoding(Fraction(int(op.get("prelu_in")), 1 << int(op.get("prelu_shift"))))
        sp, sn = prelu_shift_codes(s, x.fp, fp_out)
        win = Window(1, 1, 1, 1, 0, 0, out.h, out.w)
        _run(c, AluJob(op.name, x, out, win, 4, dict(shift_cut=0, shift_bias=0, act_type=0, multi_factor=m & 0xFF,
                                                     shift_prelu_p=sp, shift_prelu_n=sn)))
        return
    if kind == "hsigmoid":
        x = ins[0]
        hin, shs = hsigmoid_fields(x.fp, fp_out)
        win = Window(1, 1, 1, 1, 0, 0, out.h, out.w)
        _run(c, AluJob(op.name, x, out, win, 7, dict(shift_cut=shs, shift_bias=hin, act_type=0, multi_factor=0,
                                                     shift_prelu_p=0, shift_prelu_n=0)))
        return
    if kind == "elew":
        et = str(op.get("type", "ADD")).upper()
        fps = [f.fp for f in ins]
        if et == "ADD":
            lo = min(fps)
            sr = [f - lo for f in fps]
            sw_ = elew_shift_write(fp_out - lo)
        else:
            sr = [0] * len(fps)
            sw_ = elew_shift_write(fp_out - sum(fps))
        ej = ElewJob(op.name, ins, out, sr, sw_, 0 if et == "ADD" else 1, 1 if _nonlinear(op) == "RELU" else 0)
        if c.capture is not None:
            c.capture.append(ej)
        else:
            _elew(c, ej)
        return
    if kind == "concat":
        c0 = 0
        axis = _concat_axis(op)
        for i, f in zip(_data_inputs(op), ins):
            dst = _member_view(out, axis, c0, _t(graph.ops[i]).shape, out.fp)
            c0 += (f.h, f.w, f.c)[axis]
            if f.reg == dst.reg and f.addr == dst.addr and f.pix == dst.pix and f.row == dst.row:
                continue                      # written in place by its producer
            if f.fp == out.fp:
                _copy(c, op.name, f, [dst])
            else:
                _elew(c, ElewJob(f"{op.name}[{i}]", [f], dst, [0], elew_shift_write(out.fp - f.fp), 0, 0))
        return
    if kind == "upsample":
        x = ins[0]
        sh, sw = out.h // x.h, out.w // x.w
        if x.fp != out.fp:             # rescale into a workspace copy (single-input ELEW), then replicate it
            tmp = c.temp(x.h, x.w, x.c, out.fp)
            _elew(c, ElewJob(f"{op.name}[rescale]", [x], tmp, [0], elew_shift_write(out.fp - x.fp), 0, 0))
            x = tmp
        views = [FMap(out.reg, out.at(dy, dx), x.h, x.w, out.c, out.pix * sw, out.row * sh, out.fp)
                 for dy in range(sh) for dx in range(sw)]
        _copy(c, op.name, x, views)
        return
    if kind == "tile":
        # §7.9 tile-fix: s² copies, each between a strided view (every s-th pixel and row, from (dy, dx)) and a
        # block of C channels at offset (dy·s + dx)·C; LOAD and SAVE addressing only
        x = ins[0]
        s = int(op.get("stride"))
        if x.fp != out.fp:
            tmp = c.temp(x.h, x.w, x.c, out.fp)
            _elew(c, ElewJob(f"{op.name}[rescale]", [x], tmp, [0], elew_shift_write(out.fp - x.fp), 0, 0))
            x = tmp
        for dy in range(s):
            for dx in range(s):
                if bool(op.get("reverse", False)):              # depth-to-space: channel block -> pixel (dy, dx)
                    src = FMap(x.reg, x.at(0, 0, (dy * s + dx) * out.c), x.h, x.w, out.c, x.pix, x.row, x.fp)
                    dst = FMap(out.reg, out.at(dy, dx), x.h, x.w, out.c, out.pix * s, out.row * s, out.fp)
                else:                                           # space-to-depth: pixel (dy, dx) -> channel block
                    src = FMap(x.reg, x.at(dy, dx), out.h, out.w, x.c, x.pix * s, x.row * s, x.fp)
                    dst = FMap(out.reg, out.at(0, 0, (dy * s + dx) * x.c), out.h, out.w, x.c, out.pix, out.row,
                               out.fp)
                _copy(c, op.name, src, [dst])
        return
    if kind == "relu6":
        x = ins[0]
        # ALU dwconv 1x1 with weight 1 (fix point 0) and ReLU6: y = round(relu6(x * 2^(fp_out - fp_in)))
        sc = x.fp - fp_out
        win = Window(1, 1, 1, 1, 0, 0, out.h, out.w)
        _run(c, AluJob(op.name, x, out, win, 6, dict(shift_cut=sc, shift_bias=0, act_type=4 if fp_out <= 4 else 1,
                                                     multi_factor=0, shift_prelu_p=0, shift_prelu_n=0),
                       np.ones((1, 1, x.c), np.int8), None))
        return
    if kind == "prelu":
        x = ins[0]
        aop = graph.ops[_data_inputs(op)[1]] if len(_data_inputs(op)) > 1 else _arg(graph, op, "weights")
        assert aop is not None
        alpha = np.broadcast_to(_int8(aop).reshape(-1), (x.c,)).astype(np.int8)
        shift = int(op.get("prelu_shift", _fp(aop)))
        sp, sn = prelu_shift_codes(shift, x.fp, fp_out)
        win = Window(1, 1, 1, 1, 0, 0, out.h, out.w)
        _run(c, AluJob(op.name, x, out, win, 1, dict(shift_cut=0, shift_bias=0, act_type=0, multi_factor=0,
                                                     shift_prelu_p=sp, shift_prelu_n=sn), alpha.reshape(1, x.c)))
        return
    raise CodegenError(f"op {op.name!r}: no lowering for kind {kind}")


def _save_span(x: Instruction) -> tuple[int, int, int]:
    f = x.fields
    return f["reg_id"], f["ddr_addr"], f["ddr_addr"] + (f["length"] - 1) * f["jump_write"] + f["channel"]


def _pairable(a: Instruction, b: Instruction) -> bool:
    """Two adjacent SAVEs may go out as a pair on the two AXI ports (spec §5.2): different banks and disjoint
    DDR byte spans (interleaved strided writes are not paired)."""
    if a.op != "SAVE" or b.op != "SAVE" or a.fields["bank_id"] == b.fields["bank_id"]:
        return False
    ra, a0, a1 = _save_span(a)
    rb, b0, b1 = _save_span(b)
    return ra != rb or a1 <= b0 or b1 <= a0


_INIT_OPS = ("CONVINIT", "ALUINIT", "ELEWINIT")
PREFETCH_PER_SLOT = 3        # prefetched LOADs after one compute instruction: fewer than the 4-deep LOAD queue


def _footprint_keys(t: Target, ins: list[Instruction], reg_sizes: dict[int, int]) -> DenseKeys:
    """The read and write keys of every instruction in the token planner's key space (8-line / 64-byte chunks),
    dense (isa.deps.DenseKeys)."""
    space = KeySpace(t, line_chunk=TOKEN_LINES, ddr_chunk=64)
    state = InitState()
    fps: list[Footprint | None] = []
    for x in ins:
        if x.op == "END":
            fps.append(None)
            continue
        fps.append(footprint_of(x.op, x.fields, state, t, reg_sizes))
        state.update(x.op, x.fields)
    return DenseKeys.of_footprints(space, fps)


def _prefetch_layers(ins: list[Instruction], layer_of: list[int], keys: DenseKeys) -> list[int]:
    """Cross-layer prefetch (vai-c-program-patterns §7 item 4): the LOADs that open a layer (bias, weights, its
    first strip's rows: the LOADs before its first other non-INIT instruction) move up into the previous layer's
    tail, the instructions after the LOAD engine's last earlier LOAD, spread after its CONV / ALU / ELEW
    instructions (so the dispatcher is not held behind a full LOAD queue) and never above an instruction they
    conflict with (a SAVE of the rows they read, a reader of the lines they overwrite: keys at the planner's
    granularity), in their own order. Only LOADs move, and LOAD footprints do not depend on INIT state, so every
    instruction's meaning is unchanged. Returns the new order (indices into `ins`)."""
    out: list[int] = []
    last_load = -1                                       # position in `out` of the latest LOAD
    n = len(ins)
    mark = np.zeros(max(1, keys.total), np.int8)         # scratch of `last_conflict`
    i = 0
    while i < n:
        j = i
        while j < n and layer_of[j] == layer_of[i]:
            j += 1
        head: list[int] = []
        k = i
        while k < j and (ins[k].op == "LOAD" or ins[k].op in _INIT_OPS):
            if ins[k].op == "LOAD":
                head.append(k)
            k += 1
        r0 = last_load + 1
        if head and i > 0 and r0 < len(out):
            moved = set(head)
            region = out[r0:]
            region_a = np.asarray(region, np.int64)
            comp = [p for p, x in enumerate(region) if ins[x].op in _COMPUTE_OPS]
            slots: dict[int, list[int]] = {}             # region position before which LOADs go (len: the end)
            floor = 0
            for m, h in enumerate(head):
                # after the last region instruction h conflicts with (h writes what it reads or writes, or reads
                # what it writes)
                e = keys.last_conflict(h, region_a, floor, mark)
                want = comp[m * len(comp) // len(head)] + 1 if comp else len(region)
                pos = max(e, want)
                while pos < len(region) and (ins[region[pos - 1]].op not in _COMPUTE_OPS
                                             or len(slots.get(pos, ())) >= PREFETCH_PER_SLOT):
                    pos += 1                             # right after a compute instruction (or at the end)
                floor = pos
                slots.setdefault(pos, []).append(h)
            merged: list[int] = []
            for p in range(len(region) + 1):
                merged.extend(slots.get(p, ()))
                if p < len(region):
                    merged.append(region[p])
            out[r0:] = merged
            out.extend(x for x in range(i, j) if x not in moved)
        else:
            out.extend(range(i, j))
        for q in range(len(out) - 1, last_load, -1):
            if ins[out[q]].op == "LOAD":
                last_load = q
                break
        i = j
    return out


def _tokens(t: Target, ins: list[Instruction], exact: bool, keys: DenseKeys) -> list[Instruction]:
    """Place dpdon/dpdby from the footprint keys (isa.deps.TokenPlanner / ExactTokenPlanner); the last SAVE waits
    for all work. Adjacent SAVEs of different banks go out as pairs (hp_id 0 waits for both, hp_id 1 signals for
    both), except the last SAVE, which must carry the final waits itself."""
    planner = (ExactTokenPlanner if exact else TokenPlanner)(t, line_chunk=TOKEN_LINES, ddr_chunk=64)
    last_save = max(i for i, x in enumerate(ins) if x.op == "SAVE")
    out = list(ins)
    if isinstance(planner, ExactTokenPlanner):      # the same tokens as the loop below, in one compiled key pass
        ops: list[str] = []
        pairs: list[int | None] = []
        lo: list[int] = []
        hi: list[int] = []
        i = 0
        while i < len(ins):
            x = ins[i]
            if x.op != "END" and i + 1 < last_save and _pairable(x, ins[i + 1]):
                ops += ["SAVE", "SAVE"]                 # the first waits for both: the union of their keys
                pairs += [0, 1]
                lo += [i, i + 1]
                hi += [i + 2, i + 2]
                out[i] = replace(x, fields=dict(x.fields, hp_id=0))
                out[i + 1] = replace(ins[i + 1], fields=dict(ins[i + 1].fields, hp_id=1))
                i += 2
                continue
            ops.append(x.op)
            pairs.append(None)
            lo.append(i)
            hi.append(i if x.op == "END" else i + 1)
            i += 1
        planner.add_dense(ops, pairs, lo, hi, keys, last_save)
        return [replace(x, dpdon=planner.dpdon[k], dpdby=planner.dpdby[k]) for k, x in enumerate(out)]
    i = 0
    while i < len(ins):
        x = ins[i]
        if x.op == "END":
            planner.add("END", wait=False)
            i += 1
            continue
        if i + 1 < last_save and _pairable(x, ins[i + 1]):
            y = ins[i + 1]
            (r1, w1), (r2, w2) = keys.sets(i), keys.sets(i + 1)
            planner.add("SAVE", keys=(r1 | r2, w1 | w2), pair=0)
            planner.add("SAVE", keys=(r2, w2), pair=1)
            out[i] = replace(x, fields=dict(x.fields, hp_id=0))
            out[i + 1] = replace(y, fields=dict(y.fields, hp_id=1))
            i += 2
            continue
        planner.add(x.op, keys=keys.sets(i))
        if i == last_save:
            planner.order_after_all(i)
        i += 1
    return [replace(x, dpdon=planner.dpdon[k], dpdby=planner.dpdby[k]) for k, x in enumerate(out)]


__all__ = ["CODEGEN_OPTIONS", "CodegenError", "CodegenOptions", "DdrImage", "FMap", "generate", "unsupported"]
