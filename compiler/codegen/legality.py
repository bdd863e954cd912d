"""Legality: which kind an op lowers to (`classify`), or why it cannot run on the DPU, one check per XIR type
registered with `@legal` (as the golden's `compiler.ref.ops` registers its ops); and `unsupported`, the
partitioner's question (compiler.partition): the op's kind, its lowering's jobs, and for each job whether some
tiling of it fits the target (`registry.FITS`, the planners' own checks), without emitting an instruction."""
from __future__ import annotations

from fractions import Fraction

from opendpu.compiler.codegen import alu, conv, copies, elew  # noqa: F401  (they fill the registries)
from opendpu.compiler.codegen.context import new_ctx
from opendpu.compiler.codegen.ir import (REG_IN, REG_OUT, CodegenError, arg, conv_act, data_inputs, dense, fix_point,
                                         int8_data, nonlinear, pair, tensor)
from opendpu.compiler.codegen.kinds import (ALIAS, ALIAS_TYPES, CONCAT, CONV, DWCONV, ELEW, HSIGMOID, LEAKY, NO_CODE,
                                            POOL, PRELU, RELU6, SKIP, SKIP_TYPES, TCONV, TILE, UPSAMPLE, VIEW)
from opendpu.compiler.codegen.limits import ELEW_INPUTS_MAX, SHIFT_READ_MAX
from opendpu.compiler.codegen.memory import slice_box
from opendpu.compiler.codegen.registry import FITS, LEGALITY, LOWERINGS, legal
from opendpu.compiler.fixpoint import FixPointError, elew_shift_write, hsigmoid_fields, slope_encoding, slope_fits_alu
from opendpu.compiler.frontend import tile_shape
from opendpu.compiler.xir.graph import Graph, Op
from opendpu.isa.target import Target


def classify(graph: Graph, op: Op, t: Target) -> str:
    """The lowering kind of an op (`kinds`), or CodegenError with the reason."""
    if op.type in SKIP_TYPES:
        return SKIP
    if op.type in ALIAS_TYPES:
        return ALIAS
    if tensor(op).fix_point is None:
        raise CodegenError(f"op {op.name!r} ({op.type}) has no output fix point")
    check = LEGALITY.get(op.type)
    if check is None:
        raise CodegenError(f"op {op.name!r}: {op.type} is not compiled for the DPU")
    return check(graph, op, t)


def unsupported(graph: Graph, op_name: str, target: Target) -> str | None:
    """None if `generate` can compile this op for `target`, else why not (the op then runs on the CPU)."""
    op = graph.ops[op_name]
    try:
        kind = classify(graph, op, target)
        if kind not in NO_CODE:
            check_fits(graph, op, kind, target)
    except (CodegenError, FixPointError) as e:
        return str(e)
    return None


def check_fits(graph: Graph, op: Op, kind: str, t: Target) -> None:
    """The op alone (dense images): its lowering's jobs, each checked by its tiling planner; CodegenError if none
    fits the target."""
    c = new_ctx(t)
    fm = {i: dense(REG_IN, 0, tensor(graph.ops[i]).shape, fix_point(graph.ops[i])) for i in data_inputs(op)}
    ins = [fm[i] for i in data_inputs(op) if graph.ops[i].type not in SKIP_TYPES]
    for job in LOWERINGS[kind](c, graph, op, ins, dense(REG_OUT, 0, tensor(op).shape, fix_point(op))):
        FITS[type(job)](c, job)


# ---- one check per XIR type ------------------------------------------------------------------------------------
@legal("conv2d-fix", "transposed-conv2d-fix")
def _conv(graph: Graph, op: Op, t: Target) -> str:
    if pair(op, "dilation", [1, 1]) != (1, 1):
        raise CodegenError(f"op {op.name!r}: dilated convolution is not implemented by the compiler yet")
    if int(op.get("group", 1) or 1) != 1:
        raise CodegenError(f"op {op.name!r}: grouped convolution (group {op.get('group')}) is not compiled")
    if op.type == "transposed-conv2d-fix" and any(int(v) for v in op.get("output_padding", [0, 0]) or [0, 0]):
        raise CodegenError(f"op {op.name!r}: transposed conv output_padding is not compiled")
    conv_act(op, t, fix_point(op), "conv")
    return CONV if op.type == "conv2d-fix" else TCONV


@legal("depthwise-conv2d-fix")
def _dwconv(graph: Graph, op: Op, t: Target) -> str:
    if pair(op, "dilation", [1, 1]) != (1, 1):
        raise CodegenError(f"op {op.name!r}: dilated depthwise convolution is not implemented yet")
    w = arg(graph, op, "weights")
    if w is None or int(tensor(w).shape[0]) != 1:
        raise CodegenError(f"op {op.name!r}: depthwise multiplier must be 1")
    conv_act(op, t, fix_point(op), "alu")
    return DWCONV


@legal("pool-fix")
def _pool(graph: Graph, op: Op, t: Target) -> str:
    ptype = str(op.get("type", "MAX")).upper()
    if ptype not in ("MAX", "AVG"):
        raise CodegenError(f"op {op.name!r}: pool type {ptype}")
    return POOL


def _leaky(op: Op) -> str:
    m, s = slope_encoding(Fraction(int(op.get("prelu_in")), 1 << int(op.get("prelu_shift"))))
    if m < 0 or not slope_fits_alu(m, s):
        raise CodegenError(f"op {op.name!r}: leaky-relu slope {m}/2^{s} is negative or does not fit the ALU")
    return LEAKY


def _prelu(graph: Graph, op: Op, ins: list[str]) -> str:
    a = graph.ops[ins[1]] if len(ins) > 1 else arg(graph, op, "weights")
    if a is None or a.type not in ("const-fix", "const"):
        raise CodegenError(f"op {op.name!r}: PReLU slopes must be a constant")
    if int(int8_data(a).min()) < 0:
        raise CodegenError(f"op {op.name!r}: negative PReLU slopes (the ALU picks the shift by the sign "
                           f"of x*alpha, the reference by the sign of x; spec §6.8 vs §7.7)")
    return PRELU


@legal("eltwise-fix")
def _eltwise(graph: Graph, op: Op, t: Target) -> str:
    et = str(op.get("type", "ADD")).upper()
    ins = data_inputs(op)
    if et in ("LEAKY-RELU", "LEAKYRELU"):
        return _leaky(op)
    if et == "PRELU":
        return _prelu(graph, op, ins)
    if et not in ("ADD", "MUL"):
        raise CodegenError(f"op {op.name!r}: eltwise type {et}")
    y = tuple(int(v) for v in tensor(op).shape)
    for i in ins:
        s_ = tuple(int(v) for v in tensor(graph.ops[i]).shape)
        if s_ != y and not (len(s_) == len(y) == 4 and s_[3] == y[3] and s_[0] == 1
                            and s_[1] in (1, y[1]) and s_[2] in (1, y[2])):
            raise CodegenError(f"op {op.name!r}: eltwise broadcast {list(s_)} -> {list(y)} (only rows and "
                               f"columns of 1 are repeated by ELEW)")
    if not 1 <= len(ins) <= ELEW_INPUTS_MAX or (et == "MUL" and len(ins) != 2):
        raise CodegenError(f"op {op.name!r}: eltwise {et} of {len(ins)} inputs")
    nl = nonlinear(op)
    if nl == "RELU6" and et == "ADD" and len(ins) == 1 and fix_point(graph.ops[ins[0]]) - fix_point(op) in range(0, 64):
        return RELU6
    if nl not in ("NONE", "RELU"):
        raise CodegenError(f"op {op.name!r}: nonlinear {nl} on ELEW")
    fps = [fix_point(graph.ops[i]) for i in ins]
    try:
        if et == "ADD":
            if max(fps) - min(fps) > SHIFT_READ_MAX:
                raise CodegenError(f"op {op.name!r}: input fix points differ by more than {SHIFT_READ_MAX}")
            elew_shift_write(fix_point(op) - min(fps))
        else:
            elew_shift_write(fix_point(op) - sum(fps))
    except FixPointError as e:
        raise CodegenError(f"op {op.name!r}: {e}") from None
    return ELEW


@legal("concat-fix")
def _concat(graph: Graph, op: Op, t: Target) -> str:
    dims = list(tensor(op).shape)
    ax = int(op.get("axis", -1))
    if ax < 0:
        ax += len(dims)
    if ax == 0 or ax >= len(dims) or len(dims) != 4 and ax != len(dims) - 1:
        raise CodegenError(f"op {op.name!r}: concat along axis {ax} of a {len(dims)}-D tensor")
    for i in data_inputs(op):
        d = fix_point(op) - fix_point(graph.ops[i])
        if abs(d) > SHIFT_READ_MAX:
            raise CodegenError(f"op {op.name!r}: input fix point differs by {d}")
    return CONCAT


def _rescalable(graph: Graph, op: Op) -> None:
    """A copy that changes the fix point goes through a rescaling ELEW: the change within its shift range."""
    if abs(fix_point(op) - fix_point(graph.ops[data_inputs(op)[0]])) > SHIFT_READ_MAX:
        raise CodegenError(f"op {op.name!r}: fix point change too large")


@legal("upsample-fix")
def _upsample(graph: Graph, op: Op, t: Target) -> str:
    x = tuple(tensor(graph.ops[data_inputs(op)[0]]).shape)
    y = tuple(tensor(op).shape)
    if len(x) != 4 or y[1] % x[1] or y[2] % x[2]:
        raise CodegenError(f"op {op.name!r}: upsample {list(x)} -> {list(y)} is not an integer scale")
    _rescalable(graph, op)
    return UPSAMPLE


@legal("tile-fix")
def _tile(graph: Graph, op: Op, t: Target) -> str:
    xi = [int(v) for v in tensor(graph.ops[data_inputs(op)[0]]).shape]
    yi = [int(v) for v in tensor(op).shape]
    s, rev = int(op.get("stride", 0) or 0), bool(op.get("reverse", False))
    if xi[:1] != [1] or tile_shape(xi, s, rev) != yi:
        raise CodegenError(f"op {op.name!r}: tile stride {op.get('stride')} reverse {rev} from {xi} to {yi}")
    _rescalable(graph, op)
    return TILE


@legal("hard-sigmoid-fix")
def _hsigmoid(graph: Graph, op: Op, t: Target) -> str:
    fin, fout = fix_point(graph.ops[data_inputs(op)[0]]), fix_point(op)
    try:
        hsigmoid_fields(fin, fout)
    except FixPointError as e:
        raise CodegenError(f"op {op.name!r}: {e}") from None
    return HSIGMOID


@legal("strided_slice-fix")
def _strided_slice(graph: Graph, op: Op, t: Target) -> str:
    slice_box(graph, op)
    return VIEW
