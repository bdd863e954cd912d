"""vai_q -> canonical: the converter that walks AMD's quantizer form (float XIR ops + `fix` ops) in order and builds
the canonical `*-fix` graph (compiler/frontend.py's docstring says what is fused).

`_FromVaiQ` holds the conversion's state (which source op's value lives in which canonical op, as int8 or as
float), the helpers every op handler uses (fix chains, fused activations, float fallback through fix2float), and
the pre-pass that plans the patterns absorbing earlier ops (flatten / transpose into a dense layer, a zero pad
into a conv). The per-op handlers are a registry, `frontend_vaiq_ops.HANDLERS`, passed in: an op type without a
handler stays a float CPU op.
"""
from __future__ import annotations

from collections import OrderedDict
from fractions import Fraction
from typing import Callable, Iterable, Mapping

import numpy as np

from opendpu.compiler.fixpoint import LEAKY_ALPHA, XIR_ROUND_MODES
from opendpu.compiler.frontend_common import (FrontendError, _as_float, _int_or_none, _is_int, _Names, _short, _t,
                                              _where, copy_attrs, copy_tensor, fix_tensor, float_tensor)
from opendpu.compiler.xir.graph import FIX_POINT_RANGE, Attrs, Graph, Op, Tensor, XModelError

# vai_q op types -> canonical op
VAI_Q_CONV = {"conv2d": "conv2d-fix", "depthwise-conv2d": "depthwise-conv2d-fix",
              "transposed-conv2d": "transposed-conv2d-fix"}
VAI_Q_POOL = {"maxpool2d": "MAX", "avgpool2d": "AVG"}
VAI_Q_ACTS = ("relu", "relu6", "leaky-relu")
VAI_Q_RESHAPES = ("reshape", "flatten", "squeeze")
# op types the front end would fuse: an op of these types marked device "CPU" stays float (and loses the mark)
FUSABLE_TYPES = frozenset({*VAI_Q_CONV, *VAI_Q_POOL, *VAI_Q_ACTS, *VAI_Q_RESHAPES, "matmul", "add", "mul", "concat",
                           "upsample", "resize", "reorg", "hard-sigmoid", "hard-swish", "transpose", "pad",
                           "fix"})


class _FixParams:
    """The quantization of one `fix` op: fix point, round mode (XIR name), bit width, signedness (checked)."""

    def __init__(self, op: Op, where: str):
        a = op.attrs
        fp = a.get("fix_point", _t(op).attrs.get("fix_point") if op.output is not None else None)
        lo, hi = FIX_POINT_RANGE
        fpi = _int_or_none(fp)
        if fpi is None or not lo <= fpi <= hi:
            raise FrontendError(f"{where}: op {op.name!r} ({op.type}): attribute fix_point = {_short(fp)} is not an "
                                f"integer in {lo}..{hi}")
        bw = a.get("bit_width", 8)
        if not _is_int(bw) or int(bw) != 8:
            raise FrontendError(f"{where}: op {op.name!r} ({op.type}): bit_width {_short(bw)}; the DPU takes 8-bit "
                                f"tensors (quantize with bit width 8)")
        signed = a.get("if_signed", True)
        if not isinstance(signed, (bool, np.bool_)) or not signed:
            raise FrontendError(f"{where}: op {op.name!r} ({op.type}): if_signed {_short(signed)}; the DPU takes "
                                f"signed int8 tensors")
        rm = a.get("round_mode", "DPU_ROUND")
        if not isinstance(rm, str) or rm.upper() not in XIR_ROUND_MODES:
            raise FrontendError(f"{where}: op {op.name!r} ({op.type}): round_mode {_short(rm)} is not one of "
                                f"{', '.join(XIR_ROUND_MODES)}")
        self.fp, self.round_mode = fpi, rm.upper()

    def tensor(self, name: str, shape: Iterable[int]) -> Tensor:
        return fix_tensor(name, shape, self.fp, self.round_mode)

    def attrs(self) -> Attrs:
        """The attributes of a float2fix op (quant/xir_out.py fixed_of)."""
        return Attrs([("fix_point", self.fp), ("bit_width", 8), ("if_signed", True), ("round_mode", self.round_mode)])


class _FromVaiQ:
    """One conversion of one graph; `run` returns the canonical graph."""

    def __init__(self, g: Graph, source: str | None, handlers: Mapping[str, Handler]):
        self.g, self.where, self.handlers = g, _where(g, source), handlers
        try:
            self.order = g.toposort()
        except XModelError as e:
            raise FrontendError(f"{self.where}: {e}") from None
        self.out = Graph(g.name)
        self.out.attrs = copy_attrs(g.attrs)
        self.out.op_defs = list(g.op_defs)
        self.names = _Names(g.ops, (op.output.name for op in g.ops.values() if op.output is not None))
        self.fixed: dict[str, str] = {}       # vai_q op -> canonical op holding its value as int8
        self.floated: dict[str, str] = {}     # vai_q op -> canonical op holding its value as float
        self.done: set[str] = set()           # vai_q ops already converted as part of another op's pattern
        self.pending: dict[str, Op] = {}      # float consts, emitted before their first consumer
        self.to_float: dict[str, str] = {}    # canonical fixed op -> its fix2float
        self.deferred: dict[str, str] = {}    # vai_q op -> the consumer that may absorb it (matmul, conv)
        self.dense: dict[str, tuple[str, str | None, list[str]]] = {}   # matmul -> (source op, order, absorbed)
        self.pads: dict[str, tuple[str, list[int], list[str]]] = {}     # conv -> (source op, [l, r, t, b], absorbed)

    # ---- helpers ----------------------------------------------------------------------------------
    def err(self, op: Op, msg: str) -> FrontendError:
        return FrontendError(f"{self.where}: op {op.name!r} ({op.type}): {msg}")

    def cons(self, name: str) -> list[str]:
        return self.g.consumers(name)

    def only(self, name: str) -> Op | None:
        c = self.cons(name)
        return self.g.ops[c[0]] if len(c) == 1 else None

    @staticmethod
    def cpu(op: Op) -> bool:
        return op.attrs.get("device") == "CPU"

    def emit(self, name: str, typ: str, inputs: dict[str, list[str]], attrs: Attrs, out: Tensor) -> str:
        self.names.used_ops.add(name)
        self.names.used_tensors.add(out.name)
        try:
            self.out.add_op(name, typ, inputs, attrs, out)
        except XModelError as e:
            raise FrontendError(f"{self.where}: {e}") from None
        return name

    def move_before(self, name: str, before: str) -> None:
        """Move the converted op `name` to just before `before` (both already emitted; order only)."""
        ops = self.out.ops
        moved = ops.pop(name)
        items = list(ops.items())
        i = [k for k, _ in items].index(before)
        ops.clear()
        ops.update(items[:i] + [(name, moved)] + items[i:])
        self.out._consumers = None

    def fp_of(self, canon: str) -> int:
        fp = _t(self.out.ops[canon]).fix_point
        assert fp is not None
        return fp

    def shape(self, op: Op) -> list[int]:
        return [int(d) for d in _t(op).shape]

    def fix_chain(self, op: Op, acts: bool) -> tuple[Op | None, Op] | None:
        """(activation op or None, fix op) when op's only consumer is a fix op, or (acts) an activation whose only
        consumer is one; None otherwise (the op's value is not quantized)."""
        c = self.only(op.name)
        if c is None or self.cpu(c) or c.input_ops() != [op.name]:
            return None
        if c.type == "fix":
            return None, c
        if acts and c.type in VAI_Q_ACTS and self.act_attrs(c) is not None:
            f = self.only(c.name)
            if f is not None and f.type == "fix" and not self.cpu(f) and f.input_ops() == [c.name]:
                return c, f
        return None

    def act_attrs(self, act: Op | None) -> Attrs | None:
        """`nonlinear` (and `LEAKYRELU_alpha`) of a fusable activation, as quant/xir_out.py act_attrs writes them;
        None for an activation the DPU cannot fuse (a leaky slope other than 26/256)."""
        if act is None:
            return Attrs([("nonlinear", "NONE")])
        if act.type == "relu":
            return Attrs([("nonlinear", "RELU")])
        if act.type == "relu6":
            return Attrs([("nonlinear", "RELU6")])
        alpha = _as_float(act.attrs.get("alpha", 0.01))
        if alpha is None:
            raise self.err(act, f"attribute alpha = {_short(act.attrs.get('alpha'))} is not a number")
        if Fraction(alpha) != LEAKY_ALPHA:
            return None
        return Attrs([("nonlinear", "LEAKYRELU"), ("LEAKYRELU_alpha", alpha)])

    def fixed_in(self, op: Op, arg: str = "input", n: int | None = 1) -> list[str] | None:
        """The canonical int8 producers of argument `arg`, or None if any of them is not quantized."""
        ps = op.inputs.get(arg, [])
        if not ps or (n is not None and len(ps) != n):
            return None
        return [self.fixed[p] for p in ps] if all(p in self.fixed for p in ps) else None

    def const_fix_in(self, op: Op, arg: str) -> str | None:
        ps = op.inputs.get(arg, [])
        if len(ps) != 1 or ps[0] not in self.fixed:
            return None
        c = self.fixed[ps[0]]
        return c if self.out.ops[c].type == "const-fix" else None

    def const_values(self, op: Op) -> np.ndarray:
        t = _t(op)
        data = op.attrs.get("data")
        if not isinstance(data, (bytes, bytearray)):
            raise self.err(op, f"attribute data is {type(data).__name__}, not bytes")
        try:
            dt = t.numpy_dtype
        except XModelError as e:
            raise self.err(op, str(e)) from None
        n = int(np.prod(t.shape, dtype=np.int64)) if t.shape else 1
        if len(data) != n * dt.itemsize:
            raise self.err(op, f"{len(data)} bytes of data for shape {list(t.shape)} of {dt} ({n * dt.itemsize} "
                               f"bytes)")
        a = np.frombuffer(bytes(data), dtype=dt).reshape([int(d) for d in t.shape]).astype(np.float64)
        if not np.all(np.isfinite(a)):
            raise self.err(op, "data holds NaN or Inf")
        return a

    # ---- values -----------------------------------------------------------------------------------
    def float_of(self, p: str) -> str:
        """The canonical op holding vai_q op p's value as float: the op itself, a pending const, or a fix2float."""
        if p in self.pending:
            c = self.pending.pop(p)
            self.emit(c.name, c.type, {}, copy_attrs(c.attrs), copy_tensor(_t(c)))
            return self.floated[p]
        if p in self.floated:
            return self.floated[p]
        if p not in self.fixed:
            raise FrontendError(f"{self.where}: op {p!r} has no converted value (unsupported graph shape)")
        src = self.fixed[p]
        if src not in self.to_float:
            t = _t(self.out.ops[src])
            name = self.names.op(f"{src}_fix2float")
            self.emit(name, "fix2float", {"input": [src]},
                      Attrs([("fix_point", t.fix_point), ("bit_width", 8), ("if_signed", True)]),
                      float_tensor(self.names.tensor(name), t.shape))
            self.to_float[src] = name
        return self.to_float[src]

    def float_op(self, op: Op) -> None:
        """Keep `op` as a float CPU op: float inputs (fix2float of quantized ones), attributes as they are (the
        device mark of a fusable op type is consumed)."""
        ins = OrderedDict((arg, [self.float_of(p) for p in ps]) for arg, ps in op.inputs.items())
        drop = ("device",) if op.type in FUSABLE_TYPES and self.cpu(op) else ()
        self.emit(op.name, op.type, ins, copy_attrs(op.attrs, drop), copy_tensor(_t(op)))
        self.floated[op.name] = op.name

    def finish(self, op: Op, chain: tuple[Op | None, Op] | None, canon: str) -> None:
        act, f = chain if chain is not None else (None, None)
        self.fixed[op.name] = canon
        for x in (act, f):
            if x is not None:
                self.done.add(x.name)
                self.fixed[x.name] = canon

    def out_tensor(self, op: Op, chain: tuple[Op | None, Op] | None, same_as: str | None = None,
                   name: str | None = None) -> Tensor:
        """The fused op's int8 tensor: named after the fix op's tensor, quantized as the fix op says; without a
        fix (a value-preserving op) the input's quantization under the op's own tensor name."""
        if chain is not None:
            f = chain[1]
            if self.shape(f) != self.shape(op):
                raise self.err(f, f"shape {self.shape(f)} differs from its input {op.name!r} {self.shape(op)}")
            return _FixParams(f, self.where).tensor(name or self.names.claim_tensor(_t(f).name), self.shape(op))
        assert same_as is not None
        t = _t(self.out.ops[same_as])
        rm = t.attrs.get("round_mode", "DPU_ROUND")
        return fix_tensor(name or self.names.claim_tensor(_t(op).name), self.shape(op), self.fp_of(same_as), rm)

    # ---- pre-pass: patterns that absorb earlier ops --------------------------------------------------
    def plan(self) -> None:
        for n in self.order:
            op = self.g.ops[n]
            if op.type == "matmul" and not self.cpu(op):
                self.plan_dense(op)
            if op.type in ("conv2d", "depthwise-conv2d") and not self.cpu(op):
                self.plan_pad(op)

    def plan_dense(self, m: Op) -> None:
        ins = m.inputs.get("input", [])
        if not ins:
            return
        r = self.g.ops[ins[0]]
        if r.type not in ("flatten", "reshape") or self.cpu(r) or self.cons(r.name) != [m.name] \
                or len(_t(r).shape) != 2 or len(r.input_ops()) < 1:
            return
        s = self.g.ops[r.input_ops()[0]]
        if s.type == "transpose" and not self.cpu(s) and self.cons(s.name) == [r.name] \
                and list(s.attrs.get("order", [])) == [0, 3, 1, 2] and len(s.input_ops()) == 1:
            src, order, absorbed = s.input_ops()[0], "nchw", [s.name, r.name]
        else:
            src, order, absorbed = s.name, "nhwc", [r.name]
        if len(_t(self.g.ops[src]).shape) != 4:
            return
        self.dense[m.name] = (src, order, absorbed)
        for a in absorbed:
            self.deferred[a] = m.name

    def plan_pad(self, c: Op) -> None:
        """A zero `pad` of H and W (optionally followed by a fix) that feeds only this conv: folded into its pad."""
        ins = c.inputs.get("input", [])
        if len(ins) != 1:
            return
        p, after = self.g.ops[ins[0]], [c.name]
        if p.type == "fix":
            if self.cpu(p) or self.cons(p.name) != [c.name] or len(p.input_ops()) != 1:
                return
            after = [p.name]
            p = self.g.ops[p.input_ops()[0]]
        if p.type != "pad" or self.cpu(p) or self.cons(p.name) != after[:1] or len(p.input_ops()) != 1:
            return
        mode = p.attrs.get("mode", "CONSTANT")
        vals = p.attrs.get("constant_values", [0.0])
        vals = vals if isinstance(vals, list) else [vals]
        pads = p.attrs.get("paddings")
        if str(mode).upper() != "CONSTANT" or any(_as_float(v) != 0.0 for v in vals) or not isinstance(pads, list) \
                or len(pads) != 8 or not all(_is_int(v) and v >= 0 for v in pads) or any(pads[i] for i in (0, 1, 6, 7)):
            return
        t, b, left, right = (int(v) for v in pads[2:6])     # XIR paddings: [before, after] per NHWC dimension
        absorbed = [p.name] + [a for a in after if a != c.name]
        self.pads[c.name] = (p.input_ops()[0], [left, right, t, b], absorbed)
        for a in absorbed:
            self.deferred[a] = c.name

    def flush(self, names: list[str]) -> None:
        """Convert deferred ops the consumer could not absorb, as ordinary ops."""
        for n in names:
            self.deferred.pop(n, None)
        for n in names:
            if n not in self.done:
                self.convert(self.g.ops[n])

    # ---- conversion -------------------------------------------------------------------------------
    def run(self) -> Graph:
        self.plan()
        for n in self.order:
            if n in self.done or n in self.deferred:
                continue
            self.convert(self.g.ops[n])
        for n in self.order:                  # consts nobody reads are dropped; a graph output const is kept
            if n in self.pending and not self.cons(n):
                self.float_of(n)
        self.out._link_subgraphs()
        try:
            self.out.validate()
        except XModelError as e:
            raise FrontendError(f"{self.where}: the converted graph is not valid: {e}") from None
        return self.out

    def convert(self, op: Op) -> None:
        if op.output is None:
            raise self.err(op, "has no output tensor")
        if self.cpu(op) and op.type in FUSABLE_TYPES:
            return self.float_op(op)
        self.handlers.get(op.type, _FromVaiQ.float_op)(self, op)


# a handler converts one op of its type (or keeps it float): frontend_vaiq_ops.HANDLERS
Handler = Callable[[_FromVaiQ, Op], None]
