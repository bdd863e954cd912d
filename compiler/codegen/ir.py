"""The code generator's data: feature-map images in DDR (`FMap`), window geometry (`Window`, `Tile`), on-chip strip
buffers (`InBuf`, `OutBuf`), the layer jobs a lowering produces (`ConvJob`, `AluJob`, `ElewJob`, `CopyJob`) and the
accessors of the quantized graph they are read from. Names follow the spec (bank_addr_in, shift_cut, ...)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from opendpu.compiler.fixpoint import LEAKY_ALPHA
from opendpu.compiler.xir.graph import Graph, Op, Tensor
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import Target

REG_CONST, REG_WORKSPACE, REG_IN, REG_OUT = 0, 1, 2, 3
REG_SCRATCH = 5                  # placeholder images of the decisions' scratch emissions (never in a program)
TOKEN_LINES = 8                  # line_chunk of the dependency planner (ordering.tokens)
DDR_ALIGN = 64


class CodegenError(OpenDpuError, ValueError):
    """An op or layer the code generator cannot compile for this target; the message names it and the limit."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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


def dense(reg: int, addr: int, dims, fp: int) -> FMap:
    h, w, ch = hwc(dims)
    return FMap(reg, addr, h, w, ch, ch, w * ch, fp)


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


# ---- layer jobs: what a lowering produces, what the emitters turn into instructions ----------------------------
@dataclass(frozen=True)
class Aug:
    """A conv whose kw kernel columns are folded into the channels: the bank pixel of output column X holds the
    input pixels X*sw - pl + [0, kw) (kw*IC bytes, read as one LOAD item with jump_read sw*IC); the layer runs
    as a kh x 1 conv with stride_w 1 and the LOAD masks zero the left / right padding."""

    src: FMap          # the real input image (pixels contiguous: pix == c)
    kw: int
    sw: int
    pl: int


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
    decide: bool = True    # channel augmentation and weight buffering chosen per layer (False: transposed phases)


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
    cascade: tuple[int, ...] = ()         # a max pool's stride-1 cascade stages (alu.pool_cascade), if any


@dataclass
class ElewJob:
    name: str
    inps: list[FMap]
    out: FMap
    shift_read: list[int]
    shift_write: int
    elew_type: int
    act: int


@dataclass
class CopyJob:
    """LOAD the rows of `inp` and SAVE each into every FMap of `outs` (same H, W, C; any strides)."""
    name: str
    inp: FMap
    outs: list[FMap]


Job = ConvJob | AluJob | ElewJob | CopyJob


# ---- the quantized graph ---------------------------------------------------------------------------------------
def tensor(op: Op) -> Tensor:
    """The output tensor of an op (every op of a quantized graph has one)."""
    if op.output is None:
        raise CodegenError(f"op {op.name!r} ({op.type}) has no output tensor")
    return op.output


def int8_data(op: Op) -> np.ndarray:
    """The int8 data of a const-fix op."""
    data = op.get("data")
    if data is None:
        raise CodegenError(f"const op {op.name!r} has no data")
    shape = [int(v) for v in op.get("shape", tensor(op).shape)]
    a = np.frombuffer(bytes(data), dtype=np.int8)
    if a.size != math.prod(shape):
        raise CodegenError(f"const op {op.name!r}: {a.size} bytes for shape {shape}")
    return a.reshape(shape)


def fix_point(op: Op) -> int:
    fp = tensor(op).fix_point
    if fp is None:
        raise CodegenError(f"op {op.name!r} ({op.type}): output tensor has no fix_point (not quantized)")
    return int(fp)


def pair(op: Op, key: str, default) -> tuple[int, int]:
    v = [int(x) for x in op.get(key, default)]
    return v[0], v[1]


def pads(op: Op) -> tuple[int, int, int, int]:
    """[left, right, top, bottom]; pad_mode SAME without pads as XIR (the window geometry does the rest)."""
    p = op.get("pad")
    if p is None:
        return 0, 0, 0, 0
    p = [int(x) for x in p]
    return p[0], p[1], p[2], p[3]


def arg(graph: Graph, op: Op, name: str, i: int = 0) -> Op | None:
    names = op.inputs.get(name) or []
    return graph.ops[names[i]] if i < len(names) else None


def data_inputs(op: Op) -> list[str]:
    return list(op.inputs.get("input") or [])


def nonlinear(op: Op) -> str:
    nl = str(op.get("nonlinear", "NONE") or "NONE").upper().replace("-", "").replace("_", "")
    return "NONE" if nl == "" else nl


def concat_axis(op: Op) -> int:
    """Concat axis as an index into (H, W, C) of the batch-1 image."""
    rank = len(tensor(op).shape)
    ax = int(op.get("axis", -1))
    if ax < 0:
        ax += rank
    return 2 if ax == rank - 1 else ax - 1


def member_view(out: FMap, axis: int, off: int, dims, fp: int) -> FMap:
    """The part of a concat's image that one member fills (offset `off` along H, W or C)."""
    h, w, ch = hwc(dims)
    addr = out.addr + off * (out.row, out.pix, 1)[axis]
    return FMap(out.reg, addr, h, w, ch, out.pix, out.row, fp)


def conv_act(op: Op, target: Target, fp_out: int, engine: str) -> int:
    """The act_type of an op's fused nonlinear on the CONV (`engine` "conv") or ALU ("alu") engine."""
    nl = nonlinear(op)
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
