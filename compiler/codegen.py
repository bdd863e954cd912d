"""Code generation for one DPU subgraph: quantized `*-fix` ops -> ISA1 instructions (spec §6, §7).

Every layer runs DDR to DDR (docs/compiler.md): its inputs are LOADed from their DDR images row by row into
image bank group VB0, the CONV / ALU / ELEW instructions write group VB1, and SAVEs store the output rows into
the output's DDR image. A layer is cut into strips of output rows (halo input rows included) and, when a row
does not fit, into column tiles; each strip's buffers alternate between two places in the bank ring so the
LOADs of strip k+1 can run while strip k computes. Output channels are computed in OCP-wide slices (the inner
loop); weights are loaded once per layer (per group of slices when they do not fit a CONVW bank) with one LOAD
per CONVW bank, laid out in the CONST blob exactly as LOAD reads them. Program order is the reference semantics;
dependency tokens are placed afterwards from the instructions' footprints (`isa.deps.TokenPlanner`), so the
program is race-free by construction.

Names follow the spec: bank_addr_in, shift_cut, jump_read_endl, valid_pixel_parallel, ...
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Callable

import numpy as np

from opendpu.compiler.fixpoint import (FixPointError, LEAKY_ALPHA, avg_pool_factor, conv_shifts, elew_shift_write,
                                       hsigmoid_fields, pool_shift_cut, prelu_shift_codes, slope_encoding,
                                       slope_fits_alu)
from opendpu.compiler.program import DdrImage, DpuProgram, Layer
from opendpu.compiler.xir.dpu_abi import CONST, INTERFACE, WORKSPACE, Register, RegisterMap
from opendpu.compiler.xir.graph import Graph, Op, Tensor
from opendpu.isa.deps import TokenPlanner
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.fields import FIELDS
from opendpu.isa.footprint import InitState, footprint_of
from opendpu.isa.program import Instruction
from opendpu.isa.target import Target

REG_CONST, REG_WORKSPACE, REG_IN, REG_OUT = 0, 1, 2, 3
ADDR_FIELD_LINES = 4096          # 12-bit bank address fields of LOAD / SAVE / CONV (spec §4.3)
DDR_ALIGN = 64
MAX_ITEMS = 1024                 # LOAD / SAVE length
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

    def alloc(self, n: int, what: str) -> int:
        if n > self.depth:
            raise CodegenError(f"{what} needs {n} lines of a bank, more than the {self.depth} available")
        if self.ptr + n > self.depth:
            self.ptr = 0
        a = self.ptr
        self.ptr += n
        return a


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
    """Output rows of a strip: row j at bank `group + j % PP`, line `base + (j // PP)*E + col*lpp`."""

    group: int
    base: int
    E: int
    lpp: int          # lines per output pixel


def _save_rows(c: _Ctx, out: FMap, tile: Tile, ob: OutBuf, c0: int, nch: int) -> None:
    """SAVE the tile's output rows (channels [c0, c0+nch) of `out`, starting at line offset 0 of each pixel)."""
    t = c.target
    for j in range(tile.rows):
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


def _strip(c: _Ctx, name: str, inp: FMap, tile: Tile, sh: int, cg: int, lpp: int) -> tuple[InBuf, OutBuf]:
    """Allocate a strip's input buffer (VB0) and output buffer (VB1, `lpp` lines per pixel) in the rings and LOAD
    the strip's input rows."""
    t = c.target
    E, lines = _in_lines(t, tile, sh, cg)
    ib = InBuf(t.img_base(0), c.img[0].alloc(lines, f"layer {name!r} input"), E, cg, sh, lines)
    Eo = tile.cols * lpp
    ob = OutBuf(t.img_base(1), c.img[1].alloc(_ceil(tile.rows, t.pp) * Eo, f"layer {name!r} output"), Eo, lpp)
    _load_rows(c, inp, tile, ib)
    return ib, ob


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


# ---- CONV layers -----------------------------------------------------------------------------------------------

@dataclass
class ConvJob:
    name: str
    inp: FMap
    out: FMap
    win: Window
    w: np.ndarray          # [OC, kh, kw, IC] int8
    b: np.ndarray          # [OC] int8
    shift_cut: int
    shift_bias: int
    act: int


def _conv(c: _Ctx, job: ConvJob) -> None:
    t = c.target
    oc, kh, kw, ic = job.w.shape
    K = kh * kw
    cg = _ceil(ic, t.cp)
    n_sl = _ceil(oc, t.cp)
    lines_slice = K * cg
    if cg > 256:
        raise CodegenError(f"layer {job.name!r}: {ic} input channels = {cg} channel groups > 256 (CONV "
                           f"channel_group); one CONV must read all input channels")
    if lines_slice > c.depth:
        raise CodegenError(f"layer {job.name!r}: the weights of one output channel need {lines_slice} CONVW lines "
                           f"(kernel {kw}x{kh} x {cg} channel groups), more than bank_depth {c.depth}")
    per_group = max(1, min(n_sl, c.depth // lines_slice, c.depth // 2))
    # bias: one LOAD of all OC bytes (slice s at line base + s)
    b_off = c.const(job.b.astype(np.int8).tobytes())
    b_base = c.bias.alloc(n_sl, f"layer {job.name!r} bias")
    c.s.add("LOAD", bank_addr=b_base, bank_id=t.bias_bank, jump_write=1, jump_read=oc, length=1, channel=oc,
            pad_idx=1, reg_id=REG_CONST, ddr_addr=b_off)
    win = job.win
    vb_max = _block_rows(t, win, t.pp)
    for g0 in range(0, n_sl, per_group):
        nsg = min(per_group, n_sl - g0)
        # weights of slices g0..g0+nsg: CONVW bank o holds, per slice, K items of IC bytes (cg lines each)
        w_base = c.convw.alloc(nsg * lines_slice, f"layer {job.name!r} weights")
        for o in range(t.cp):
            chans = [s * t.cp + o for s in range(g0, g0 + nsg) if s * t.cp + o < oc]
            if not chans:
                continue
            data = np.ascontiguousarray(job.w[chans].reshape(len(chans) * K, ic))
            off = c.const(data.tobytes())
            items = len(chans) * K
            for i0 in range(0, items, MAX_ITEMS):
                n = min(MAX_ITEMS, items - i0)
                c.s.add("LOAD", bank_addr=w_base + i0 * cg, bank_id=t.convw_base + o, jump_write=cg, jump_read=ic,
                        length=n, channel=ic, pad_idx=1, reg_id=REG_CONST, ddr_addr=off + i0 * ic)
        c0 = g0 * t.cp
        nch = min(oc, (g0 + nsg) * t.cp) - c0
        rows, cols, vb = _plan_tiles(c, job.name, win, cg, 1, nsg, vb_max, 1024, 1024)
        state: dict[str, int] = {}
        for tile in _tiles(win, rows, cols):
            ib, ob = _strip(c, job.name, job.inp, tile, win.sh, cg, nsg)
            E, Eo = ib.E, ob.E
            for j0 in range(0, tile.rows, vb):
                vpp = min(vb, tile.rows - j0)
                init = dict(jump_read=cg, shift_cut=job.shift_cut, act_type=job.act,
                            jump_read_endl=E if E <= 1024 else 1, shift_bias=job.shift_bias, stride_out=1,
                            jump_write=nsg, stride_offset_in=0, valid_pixel_parallel=vpp, kernel_h=kh,
                            stride_h=win.sh, jump_write_endl=Eo if Eo <= 1024 else 1, stride_offset_out=0,
                            kernel_w=kw, stride_w=win.sw)
                if init != state:
                    c.s.add("CONVINIT", **init)
                    state = init
                pads = _pads_of_block(win, job.inp.h, job.inp.w, tile, j0, vpp)
                inf = _clip_addr(_in_fields(t, ib, j0), ADDR_FIELD_LINES)
                p_out, b_out = divmod(j0, t.pp)
                for sl in range(nsg):
                    c.s.add("CONV", **inf, **pads, bank_addr_out=ob.base + p_out * Eo + sl, channel_group=cg,
                            bank_addr_weights=w_base + sl * lines_slice, length=tile.cols,
                            bank_addr_bias=b_base + g0 + sl, bank_id_out=ob.group + b_out,
                            channel_offset=cg * t.cp - ic)
            _save_rows(c, job.out, tile, ob, c0, nch)
    c.workload += 2 * oc * ic * K * win.ho * win.wo


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


def _alu(c: _Ctx, job: AluJob) -> None:
    """ALU layer; when a row of all channels does not fit (e.g. a global pool of 7x7x2048), the channels are
    processed in chunks of whole channel groups, each with its own weights and bias."""
    t = c.target
    ch = job.inp.c
    cg_all = _ceil(ch, t.cp)
    win = job.win
    vb_max = _block_rows(t, win, t.alu_pp)
    kpos = 0 if job.weights is None else job.weights.reshape(-1, ch).shape[0]
    chunk = _channel_chunk(c, job.name, win, cg_all, 1, vb_max, kpos)
    for g0 in range(0, cg_all, chunk):
        c0, c1 = g0 * t.cp, min(ch, (g0 + chunk) * t.cp)
        sub = replace(job, inp=replace(job.inp, addr=job.inp.addr + c0, c=c1 - c0),
                      out=replace(job.out, addr=job.out.addr + c0, c=c1 - c0),
                      weights=None if job.weights is None else job.weights[..., c0:c1],
                      bias=None if job.bias is None else job.bias[c0:c1])
        _alu_chunk(c, sub, vb_max)
    c.workload += 2 * ch * win.kh * win.kw * win.ho * win.wo


def _alu_chunk(c: _Ctx, job: AluJob, vb_max: int) -> None:
    t = c.target
    ch = job.inp.c
    cg = _ceil(ch, t.cp)
    win = job.win
    w_addr = b_addr = 0
    if job.weights is not None:
        wl = np.ascontiguousarray(job.weights.reshape(-1, ch))
        off = c.const(wl.tobytes())
        w_addr = c.dwconvw.alloc(wl.shape[0] * cg, f"layer {job.name!r} weights")
        c.s.add("LOAD", bank_addr=w_addr, bank_id=t.dwconvw_bank, jump_write=cg, jump_read=ch, length=wl.shape[0],
                channel=ch, pad_idx=1, reg_id=REG_CONST, ddr_addr=off)
    if job.bias is not None:
        off = c.const(np.ascontiguousarray(job.bias).astype(np.int8).tobytes())
        b_addr = c.bias.alloc(cg, f"layer {job.name!r} bias")
        c.s.add("LOAD", bank_addr=b_addr, bank_id=t.bias_bank, jump_write=1, jump_read=ch, length=1, channel=ch,
                pad_idx=1, reg_id=REG_CONST, ddr_addr=off)
    rows, cols, vb = _plan_tiles(c, job.name, win, cg, 1, cg, vb_max, 8192, 2048)
    state: dict[str, int] = {}
    for tile in _tiles(win, rows, cols):
        ib, ob = _strip(c, job.name, job.inp, tile, win.sh, cg, cg)
        E, Eo = ib.E, ob.E
        init = dict(kernel_w=win.kw, kernel_h=win.kh, exec_mode=job.mode, stride_offset_out=0, stride_offset_in=0,
                    stride_w=win.sw, stride_h=win.sh, length=tile.cols, channel_offset=cg * t.cp - ch,
                    channel_group=cg, stride_out=1, jump_read_endl=E, jump_read=cg, jump_write_endl=Eo,
                    jump_write=cg, jump_read_weights=cg, **job.init)
        for j0 in range(0, tile.rows, vb):
            vpp = min(vb, tile.rows - j0)
            if init != state:
                c.s.add("ALUINIT", **init)
                state = init
            pads = _pads_of_block(win, job.inp.h, job.inp.w, tile, j0, vpp)
            p_out, b_out = divmod(j0, t.pp)
            c.s.add("ALU", **_clip_addr(_in_fields(t, ib, j0), 1 << 14), **pads, bank_addr_out=ob.base + p_out * Eo,
                    bank_id_out=ob.group + b_out, valid_pixel_parallel=vpp, bank_addr_weights=w_addr, kernel_d=1,
                    bank_addr_bias=b_addr)
        _save_rows(c, job.out, tile, ob, 0, ch)


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
        E, lines = _in_lines(t, tile, 1, cg)
        bufs = []
        for k, fm in enumerate(job.inps):
            # a broadcast input (H or W of 1, spec §6.7 share_pp / jump_read 0) holds only its real rows / columns
            rb, cb = fm.h == 1 and job.out.h > 1, fm.w == 1 and job.out.w > 1
            sub = _tile(Window(1, 1, 1, 1, 0, 0, fm.h, fm.w), 0 if rb else tile.y0, 1 if rb else tile.rows,
                        0 if cb else tile.x0, 1 if cb else tile.cols)
            Ek, lk = _in_lines(t, sub, 1, cg)
            ib = InBuf(t.img_base(0), c.img[0].alloc(lk, f"layer {job.name!r} input {k}"), Ek, cg, 1, lk)
            _load_rows(c, fm, sub, ib)
            bufs.append((ib, rb, cb))
        Eo = tile.cols * cg
        ob = OutBuf(t.img_base(1), c.img[1].alloc(_ceil(tile.rows, t.pp) * Eo, f"layer {job.name!r} output"),
                    Eo, cg)
        for j0 in range(0, tile.rows, vb):
            vpp = min(vb, tile.rows - j0)
            p, b = divmod(j0, t.pp)
            for k, (ib, rb, cb) in enumerate(bufs):
                c.s.add("ELEWINIT", share_pp=int(rb), bank_id_in=ib.group + (0 if rb else b),
                        bank_addr_in=ib.base + (0 if rb else p * ib.E), jump_read_endl=ib.E, id=k, jump_bank=1,
                        jump_read=0 if cb else cg, shift_read=job.shift_read[k])
            c.s.add("ELEW", length=tile.cols, act_type=job.act, elew_type=job.elew_type, bank_id_out=ob.group + b,
                    bank_addr_out=ob.base + p * Eo, jump_write_endl=Eo, num=n, valid_pixel_parallel=vpp,
                    jump_write=cg, shift_write=job.shift_write, channel_group=cg)
        _save_rows(c, job.out, tile, ob, 0, ch)


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


def generate(graph: Graph, op_names: list[str], target: Target, name: str = "subgraph",
             log: Callable[[str], None] | None = None) -> DpuProgram:
    """Compile the ops `op_names` of `graph` (one DPU subgraph) for `target` (module docstring)."""
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
    fm: dict[str, FMap] = {}
    dense = _dense

    sizes = {REG_IN: 0, REG_OUT: 0, REG_WORKSPACE: 0}

    def alloc(reg: int, nbytes: int) -> int:
        a = _ceil(sizes[reg], DDR_ALIGN) * DDR_ALIGN
        sizes[reg] = a + nbytes
        return a

    c.ws_alloc = lambda nbytes: alloc(REG_WORKSPACE, nbytes)
    for i in inputs:
        o = graph.ops[i]
        dims = tuple(int(v) for v in _t(o).shape)
        fm[i] = dense(REG_IN, alloc(REG_IN, math.prod(dims)), dims, _fp(o))
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
                                                        "hsigmoid", "upsample")
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
            f = dense(reg, alloc(reg, math.prod(dims)), dims, _fp(o))
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
    for n in compute:
        op = graph.ops[n]
        k = kinds[n]
        c.s.layer = len(layers)
        first = len(c.s.ins)
        lops = [n] + [i for i in op.input_ops() if i in ops and graph.ops[i].type in SKIP_TYPES]
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
    instrs = _tokens(t, c.s.ins, {REG_CONST: max(1, len(c.blob)), **{r: max(1, v) for r, v in sizes.items()}})
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
                       "workspace_bytes": sizes[REG_WORKSPACE]})
    if log:
        log(f"{name}: {len(layers)} layers, {len(instrs)} instructions, {len(c.blob)} parameter bytes, "
            f"{sizes[REG_WORKSPACE]} workspace bytes")
    return prog


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
            _conv(c, ConvJob(op.name, x, out, win, w, b, sc, sb or 0, act))
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
        _alu(c, AluJob(op.name, ins[0], out, win, mode,
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
        _alu(c, AluJob(op.name, x, out, win, mode,
                       dict(init, shift_bias=0, act_type=0, shift_prelu_p=0, shift_prelu_n=0)))
        return
    if kind == "leaky":
        x = ins[0]
        m, s = slope_encoding(Fraction(int(op.get("prelu_in")), 1 << int(op.get("prelu_shift"))))
        sp, sn = prelu_shift_codes(s, x.fp, fp_out)
        win = Window(1, 1, 1, 1, 0, 0, out.h, out.w)
        _alu(c, AluJob(op.name, x, out, win, 4, dict(shift_cut=0, shift_bias=0, act_type=0, multi_factor=m & 0xFF,
                                                     shift_prelu_p=sp, shift_prelu_n=sn)))
        return
    if kind == "hsigmoid":
        x = ins[0]
        hin, shs = hsigmoid_fields(x.fp, fp_out)
        win = Window(1, 1, 1, 1, 0, 0, out.h, out.w)
        _alu(c, AluJob(op.name, x, out, win, 7, dict(shift_cut=shs, shift_bias=hin, act_type=0, multi_factor=0,
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
        _elew(c, ElewJob(op.name, ins, out, sr, sw_, 0 if et == "ADD" else 1, 1 if _nonlinear(op) == "RELU" else 0))
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
    if kind == "relu6":
        x = ins[0]
        # ALU dwconv 1x1 with weight 1 (fix point 0) and ReLU6: y = round(relu6(x * 2^(fp_out - fp_in)))
        sc = x.fp - fp_out
        win = Window(1, 1, 1, 1, 0, 0, out.h, out.w)
        _alu(c, AluJob(op.name, x, out, win, 6, dict(shift_cut=sc, shift_bias=0, act_type=4 if fp_out <= 4 else 1,
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
        _alu(c, AluJob(op.name, x, out, win, 1, dict(shift_cut=0, shift_bias=0, act_type=0, multi_factor=0,
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


def _tokens(t: Target, ins: list[Instruction], reg_sizes: dict[int, int]) -> list[Instruction]:
    """Place dpdon/dpdby from the footprints (isa.deps.TokenPlanner); the last SAVE waits for all work. Adjacent
    SAVEs of different banks go out as pairs (hp_id 0 waits for both, hp_id 1 signals for both), except the last
    SAVE, which must carry the final waits itself."""
    planner = TokenPlanner(t, line_chunk=8, ddr_chunk=64)
    state = InitState()
    last_save = max(i for i, x in enumerate(ins) if x.op == "SAVE")
    out = list(ins)
    i = 0
    while i < len(ins):
        x = ins[i]
        if x.op == "END":
            planner.add("END", wait=False)
            i += 1
            continue
        fp = footprint_of(x.op, x.fields, state, t, reg_sizes)
        state.update(x.op, x.fields)
        if i + 1 < last_save and _pairable(x, ins[i + 1]):
            y = ins[i + 1]
            fp2 = footprint_of(y.op, y.fields, state, t, reg_sizes)
            (r1, w1), (r2, w2) = planner.keys(fp), planner.keys(fp2)
            planner.add("SAVE", keys=(r1 | r2, w1 | w2), pair=0)
            planner.add("SAVE", keys=(r2, w2), pair=1)
            out[i] = replace(x, fields=dict(x.fields, hp_id=0))
            out[i + 1] = replace(y, fields=dict(y.fields, hp_id=1))
            i += 2
            continue
        planner.add(x.op, fp)
        if i == last_save:
            planner.order_after_all(i)
        i += 1
    return [replace(x, dpdon=planner.dpdon[k], dpdby=planner.dpdby[k]) for k, x in enumerate(out)]


__all__ = ["CodegenError", "DdrImage", "FMap", "generate", "unsupported"]
