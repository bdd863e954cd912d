"""Validation of the canonical `*-fix` form (`validate`): known op types, static shapes, batch 1, root subgraph
only, and the attributes and arguments each `*-fix` op needs; one `k_<type>` check per quantized op type."""
from __future__ import annotations

import numpy as np

from opendpu.compiler.frontend_common import FrontendError, _as_float, _int_or_none, _is_int, _nl, _short, _t, _where
from opendpu.compiler.xir.graph import Graph, Op, XModelError

CONV_FIX = ("conv2d-fix", "depthwise-conv2d-fix", "transposed-conv2d-fix")
# the quantized ops of the canonical form (their outputs are int8 fixed-point tensors)
FIX_OPS = frozenset({"data-fix", "const-fix", *CONV_FIX, "pool-fix", "eltwise-fix", "concat-fix", "upsample-fix",
                     "hard-sigmoid-fix", "reshape-fix", "strided_slice-fix", "tile-fix", "float2fix"})
NONLINEARS = ("NONE", "RELU", "RELU6", "LEAKYRELU", "PRELU")        # what the golden and the DPU know
ELTWISE_TYPES = ("ADD", "MUL", "LEAKY-RELU", "PRELU")


def tile_shape(x: list[int], stride: int, reverse: bool) -> list[int] | None:
    """The NHWC output shape of a tile-fix of input shape x (spec §7.9), None when stride or shape do not fit."""
    if stride < 1 or len(x) != 4:
        return None
    n, h, w, c = x
    if reverse:
        return [n, h * stride, w * stride, c // (stride * stride)] if c % (stride * stride) == 0 else None
    return [n, h // stride, w // stride, c * stride * stride] if h % stride == 0 and w % stride == 0 else None


class _Check:
    def __init__(self, g: Graph, source: str | None):
        self.g, self.where = g, _where(g, source)

    def err(self, op: Op, msg: str) -> FrontendError:
        return FrontendError(f"{self.where}: op {op.name!r} ({op.type}): {msg}")

    def ints(self, op: Op, key: str, n: int, lo: int, required: bool = True) -> list[int] | None:
        v = op.attrs.get(key)
        if v is None:
            if required:
                raise self.err(op, f"missing attribute {key} ({n} integers)")
            return None
        if not isinstance(v, list) or len(v) != n or not all(_is_int(x) and x >= lo for x in v):
            raise self.err(op, f"attribute {key} = {_short(v)} is not a list of {n} integers >= {lo}")
        return [int(x) for x in v]

    def int_attr(self, op: Op, key: str, required: bool = True) -> int | None:
        v = op.attrs.get(key)
        if v is None and not required:
            return None
        iv = _int_or_none(v)
        if iv is None:
            raise self.err(op, f"attribute {key} = {_short(v)} is not an integer")
        return iv

    def producers(self, op: Op, arg: str, n_min: int, n_max: int | None) -> list[Op]:
        ps = op.inputs.get(arg, [])
        if len(ps) < n_min or (n_max is not None and len(ps) > n_max):
            want = f"{n_min}" if n_max == n_min else f"{n_min}..{n_max if n_max is not None else 'n'}"
            raise self.err(op, f"argument {arg!r} has {len(ps)} inputs, expected {want}")
        return [self.g.ops[p] for p in ps]

    def fixed_input(self, op: Op, p: Op) -> None:
        if p.output is None or not _t(p).is_fixed:
            raise self.err(op, f"input {p.name!r} ({p.type}) is not a fixed-point tensor; a float value enters the "
                               f"DPU through float2fix")

    def nonlinear(self, op: Op) -> None:
        nl = op.attrs.get("nonlinear", "NONE")
        if not isinstance(nl, str) or _nl(nl) not in NONLINEARS:
            raise self.err(op, f"attribute nonlinear = {_short(nl)} is not one of {', '.join(NONLINEARS)}")
        if _nl(nl) == "PRELU":
            self.int_attr(op, "prelu_in")
            self.int_attr(op, "prelu_shift")
        if _nl(nl) == "LEAKYRELU" and "LEAKYRELU_alpha" in op.attrs and _as_float(op.attrs["LEAKYRELU_alpha"]) is None:
            raise self.err(op, f"attribute LEAKYRELU_alpha = {_short(op.attrs['LEAKYRELU_alpha'])} is not a number")

    def run(self) -> None:
        g = self.g
        if g.root.children:
            raise FrontendError(f"{self.where}: has a subgraph tree ({len(g.root.children)} subgraphs); the "
                                f"canonical graph is not partitioned")
        if not g.ops:
            raise FrontendError(f"{self.where}: has no ops")
        for op in g.ops.values():
            self.op(op)

    def op(self, op: Op) -> None:
        t = _t(op)
        if t is None:
            raise self.err(op, "has no output tensor")
        shape = list(t.shape)
        if op.type not in ("const", "const-fix") and any(int(d) < 1 for d in shape):
            raise self.err(op, f"shape {shape} is not static (every dimension must be >= 1)")
        if op.type in ("data", "data-fix") and shape and int(shape[0]) != 1:     # every feature map follows
            raise self.err(op, f"batch {shape[0]} (shape {shape}); the compiler takes batch 1")
        ins = [self.g.ops[p] for p in op.input_ops()]
        if op.type not in FIX_OPS:
            if t.is_fixed:
                raise self.err(op, f"produces a fixed-point tensor ({t.dtype_name}) but has no DPU form; the "
                                   f"quantized op types are {', '.join(sorted(FIX_OPS))}")
            for p in ins:
                if p.output is not None and _t(p).is_fixed and op.type != "fix2float":
                    raise self.err(op, f"float op reads the fixed-point tensor of {p.name!r} ({p.type}) directly; "
                                       f"a fix2float must convert it")
            if op.type == "fix2float" and (len(ins) != 1 or not _t(ins[0]).is_fixed):
                raise self.err(op, "needs one fixed-point input")
            return
        if not t.is_fixed or t.bit_width != 8:
            raise self.err(op, f"output tensor is {t.dtype_name}, expected XINT8")
        try:
            fp = t.fix_point
        except XModelError as e:
            raise self.err(op, str(e)) from None
        if fp is None:
            raise self.err(op, f"output tensor {t.name!r} has no fix_point")
        getattr(self, "k_" + op.type.replace("-", "_"))(op, ins)

    def k_data_fix(self, op: Op, ins: list[Op]) -> None:
        if ins:
            raise self.err(op, f"a graph input takes no inputs, has {len(ins)}")

    def k_const_fix(self, op: Op, ins: list[Op]) -> None:
        data = op.attrs.get("data")
        n = int(np.prod(_t(op).shape, dtype=np.int64)) if _t(op).shape else 1
        if not isinstance(data, (bytes, bytearray)) or len(data) != n:
            got = f"{len(data)} bytes" if isinstance(data, (bytes, bytearray)) else type(data).__name__
            raise self.err(op, f"data is {got}; shape {list(_t(op).shape)} needs {n} int8 bytes")
        sh = op.attrs.get("shape")
        if sh is not None and [int(d) for d in sh] != [int(d) for d in _t(op).shape]:
            raise self.err(op, f"attribute shape {sh} differs from the tensor shape {list(_t(op).shape)}")

    def _conv(self, op: Op, ins: list[Op]) -> None:
        (x,) = self.producers(op, "input", 1, 1)
        (w,) = self.producers(op, "weights", 1, 1)
        bs = self.producers(op, "bias", 0, 1)
        self.fixed_input(op, x)
        for c in [w] + bs:
            if c.type != "const-fix":
                raise self.err(op, f"weights and bias must be const-fix ops; {c.name!r} is {c.type}")
        if len(_t(w).shape) != 4:
            raise self.err(op, f"weights {w.name!r} have shape {list(_t(w).shape)}, expected 4-D OHWI")
        k = self.ints(op, "kernel", 2, 1)
        self.ints(op, "stride", 2, 1)
        self.ints(op, "pad", 4, 0, required=False)
        self.ints(op, "dilation", 2, 1, required=False)
        g = self.int_attr(op, "group", required=False)
        if g is not None and g < 1:
            raise self.err(op, f"attribute group = {g} is not >= 1")
        assert k is not None
        if [int(_t(w).shape[2]), int(_t(w).shape[1])] != k:
            raise self.err(op, f"kernel {k} ([w, h]) does not match the weights {list(_t(w).shape)} (OHWI)")
        if len(_t(x).shape) != 4 or len(_t(op).shape) != 4:
            raise self.err(op, f"input {list(_t(x).shape)} and output {list(_t(op).shape)} must be 4-D NHWC")
        self.nonlinear(op)

    k_conv2d_fix = k_depthwise_conv2d_fix = k_transposed_conv2d_fix = _conv

    def k_pool_fix(self, op: Op, ins: list[Op]) -> None:
        (x,) = self.producers(op, "input", 1, 1)
        self.fixed_input(op, x)
        typ = op.attrs.get("type", "MAX")
        if not isinstance(typ, str) or typ.upper() not in ("MAX", "AVG"):
            raise self.err(op, f"attribute type = {_short(typ)} is not MAX or AVG")
        glob = op.attrs.get("global", False)
        if not isinstance(glob, (bool, np.bool_)):
            raise self.err(op, f"attribute global = {_short(glob)} is not a boolean")
        if not glob:
            self.ints(op, "kernel", 2, 1)
            self.ints(op, "stride", 2, 1, required=False)
            self.ints(op, "pad", 4, 0, required=False)
        if len(_t(x).shape) != 4:
            raise self.err(op, f"input {list(_t(x).shape)} must be 4-D NHWC")

    def k_eltwise_fix(self, op: Op, ins: list[Op]) -> None:
        xs = self.producers(op, "input", 1, None)
        for x in xs:
            self.fixed_input(op, x)
        typ = op.attrs.get("type", "ADD")
        if not isinstance(typ, str) or typ.upper() not in ELTWISE_TYPES:
            raise self.err(op, f"attribute type = {_short(typ)} is not one of {', '.join(ELTWISE_TYPES)}")
        if typ.upper() in ("LEAKY-RELU", "PRELU") and len(xs) == 1:
            self.int_attr(op, "prelu_in")
            self.int_attr(op, "prelu_shift")
        self.nonlinear(op)

    def k_concat_fix(self, op: Op, ins: list[Op]) -> None:
        xs = self.producers(op, "input", 1, None)
        for x in xs:
            self.fixed_input(op, x)
        ax = self.int_attr(op, "axis")
        nd = len(_t(op).shape)
        assert ax is not None
        if not -nd <= ax < nd:
            raise self.err(op, f"attribute axis = {ax} is out of range for a {nd}-D tensor")

    def k_upsample_fix(self, op: Op, ins: list[Op]) -> None:
        (x,) = self.producers(op, "input", 1, 1)
        self.fixed_input(op, x)
        mode = op.attrs.get("mode", "NEAREST")
        if not isinstance(mode, str) or mode.upper() != "NEAREST":
            raise self.err(op, f"attribute mode = {_short(mode)}; the DPU upsamples NEAREST only")
        if len(_t(x).shape) != 4 or len(_t(op).shape) != 4:
            raise self.err(op, f"input {list(_t(x).shape)} and output {list(_t(op).shape)} must be 4-D NHWC")

    def k_hard_sigmoid_fix(self, op: Op, ins: list[Op]) -> None:
        (x,) = self.producers(op, "input", 1, 1)
        self.fixed_input(op, x)
        self.int_attr(op, "hsigmoid_in", required=False)
        self.int_attr(op, "shift_hsigmoid", required=False)

    def k_reshape_fix(self, op: Op, ins: list[Op]) -> None:
        xs = self.producers(op, "input", 1, 2)
        self.fixed_input(op, xs[0])
        a = int(np.prod(_t(xs[0]).shape, dtype=np.int64))
        b = int(np.prod(_t(op).shape, dtype=np.int64))
        if a != b:
            raise self.err(op, f"reshapes {list(_t(xs[0]).shape)} ({a} values) to {list(_t(op).shape)} "
                               f"({b} values)")

    def k_strided_slice_fix(self, op: Op, ins: list[Op]) -> None:
        (x,) = self.producers(op, "input", 1, 1)
        self.fixed_input(op, x)
        xs, ys = [int(v) for v in _t(x).shape], [int(v) for v in _t(op).shape]
        begin = [int(v) for v in op.attrs.get("begin", [])]
        end = [int(v) for v in op.attrs.get("end", [])]
        strides = [int(v) for v in op.attrs.get("strides", [1] * len(begin))]
        if not (len(begin) == len(end) == len(strides) <= len(xs)) or len(ys) != len(xs):
            raise self.err(op, f"begin {begin}, end {end}, strides {strides} do not fit a {len(xs)}-D input")
        got = [len(range(*slice(b, e, s).indices(d))) if s else -1 for b, e, s, d in zip(begin, end, strides, xs)]
        if got + xs[len(got):] != ys:
            raise self.err(op, f"slicing {xs} by begin {begin}, end {end}, strides {strides} gives {got}, "
                               f"not the output shape {ys}")

    def k_tile_fix(self, op: Op, ins: list[Op]) -> None:
        (x,) = self.producers(op, "input", 1, 1)
        self.fixed_input(op, x)
        s = self.int_attr(op, "stride")
        assert s is not None
        rev = op.attrs.get("reverse", False)
        if s < 1:
            raise self.err(op, f"attribute stride = {s} is not a positive integer")
        if not isinstance(rev, (bool, np.bool_)):
            raise self.err(op, f"attribute reverse = {_short(rev)} is not a boolean")
        xs, ys = [int(v) for v in _t(x).shape], [int(v) for v in _t(op).shape]
        if tile_shape(xs, s, bool(rev)) != ys:
            raise self.err(op, f"{'depth-to-space' if rev else 'space-to-depth'} by stride {s} cannot turn "
                               f"{xs} into {ys}")

    def k_float2fix(self, op: Op, ins: list[Op]) -> None:
        if len(ins) != 1 or _t(ins[0]).is_fixed:
            raise self.err(op, "needs one float input")
        self.int_attr(op, "fix_point", required=False)


def validate(graph: Graph, source: str | None = None) -> None:
    """Check a canonical graph: known op types (a fixed-point output only from a `*-fix` op or float2fix, a float
    op reading quantized values only through fix2float), static shapes, batch 1, root subgraph only, and the
    attributes and arguments each `*-fix` op needs. FrontendError names the op."""
    _Check(graph, source).run()
