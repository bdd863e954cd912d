"""The emission context of one DPU subgraph: the instruction stream, the on-chip line allocators (image groups,
CONVW, BIAS, DWCONVW rings), the CONST blob, the switches that shape the emission and the per-layer plans recorded
on the way; and the helpers that cut emitted instructions out of the stream and put them back (strip pipelining,
fusion) or take a refused emission back whole."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from opendpu.compiler.codegen.ir import DDR_ALIGN, REG_WORKSPACE, CodegenError, FMap, ceil_div
from opendpu.compiler.codegen.limits import CONV_ADDR_LINES
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.fields import FIELDS
from opendpu.isa.program import Instruction
from opendpu.isa.target import Target

# The cycle count of an instruction stream on a target (default: `plans.timing_cycles`, sim.timing).
Cycles = Callable[[Target, list[Instruction]], int]
Seg = list[tuple[Instruction, int]]          # instructions cut out of the stream, with their layers


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
        a = ceil_div(self.ptr, align) * align
        return 0 if a + n > self.depth else a


@dataclass
class Ctx:
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
    aug: bool = False                 # channel augmentation allowed (decided per layer by the cost model)
    pipeline: bool = False            # software-pipelined strip order (ordering.strips)
    param_align: int = 1              # start of each parameter ring allocation (TOKEN_LINES with prefetch_layers)
    fuse_conv: bool = True            # a CONV consumer may be fused with its producer (fusion.fused)
    cascade: bool = False             # large stride-1 max pools as cascades of 5x5 / 3x3 pools (alu.pool_cascade)
    cycles: Cycles | None = None      # the cycle model the per-layer choices are made by; None: no choice is made
    decisions: list | None = None     # the real emission's LayerPlans (plans.decide); None in scratch contexts

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


def new_ctx(t: Target) -> Ctx:
    depth = min(t.bank_depth, CONV_ADDR_LINES)
    return Ctx(None, t, Stream(), depth, [Ring(depth), Ring(depth)], Ring(depth), Ring(depth), Ring(depth))


def cut(c: Ctx, emit: Callable[[], Any]) -> tuple[Any, Seg]:
    """Run `emit` and take the instructions it appended back out of the stream: (its result, the instructions
    with their layers)."""
    i0 = len(c.s.ins)
    r = emit()
    seg = list(zip(c.s.ins[i0:], c.s.layer_of[i0:]))
    del c.s.ins[i0:], c.s.layer_of[i0:]
    return r, seg


def put(c: Ctx, seg: Seg) -> None:
    for x, layer in seg:
        c.s.ins.append(x)
        c.s.layer_of.append(layer)


def emit_or_undo(c: Ctx, emit: Callable[[], None]) -> bool:
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
