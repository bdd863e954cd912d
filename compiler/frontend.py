"""Front ends: every quantized input the compiler accepts becomes one canonical graph, the `*-fix` form.

The canonical form is what our quantizer writes (`opendpu quantize` -> `<net>_int.xmodel`, quant/xir_out.py):
`data-fix`, `const-fix` (int8 `data` bytes, tensor `fix_point`), `conv2d-fix`, `depthwise-conv2d-fix`,
`transposed-conv2d-fix`, `pool-fix`, `eltwise-fix`, `concat-fix`, `upsample-fix`, `tile-fix`,
`hard-sigmoid-fix`, `reshape-fix`, `strided_slice-fix`, and float CPU ops fed through `fix2float` / `float2fix`;
NHWC tensors, root subgraph only.

Three forms are read (`detect_form`):

``fix``       the canonical form itself; `canonicalize` only validates it.
``vai_q``     the form AMD's quantizers write (vai_q_pytorch / vai_q_tensorflow2) and `vai_c_xir -x` reads: float XIR
              ops with each quantization point a separate `fix` op (attrs `fix_point`, `bit_width`, `if_signed`,
              `round_mode`) after the input, after every weight/bias `const` and after each activation.
              `from_vai_q` fuses every `fix` into the op before it (the op's output tensor takes the fix point and
              the fix op's tensor name; the op keeps its own name), folds relu / relu6 / leaky-relu (slope 26/256)
              into the conv / eltwise / dense op they follow (`nonlinear`, as the quantizer writes it), quantizes
              each `const` with its fix op's fix point and round mode into an int8 `const-fix`, lowers a dense
              `matmul` into the conv our quantizer uses for dense layers (TransferMatMulToConv2d: a flattened 4-D
              input becomes an HxW conv whose OHWI weights absorb the flatten order, NCHW after a `transpose`
              [0,3,1,2], NHWC without one; a 2-D input goes through a `<name>_to4d` reshape into a 1x1 conv; the
              result is reshaped back by `<name>_reshape`), and folds a zero `pad` into the conv it feeds. Every other
              op stays a float CPU op, fed by `fix2float` (named `<producer>_fix2float`) and read back through
              `float2fix` (the fix op that follows it). An op with attribute ``device: "CPU"`` is never fused: it is
              the placement mark quant/vai_q_out.py writes for ops our quantizer placed on the CPU; the front end
              consumes the mark (a float op is a CPU op in the canonical form).
``compiled``  an xmodel with DPU subgraphs (AMD's or ours). `from_compiled` recovers the quantized graph: the ops of
              every subgraph with `upload` / `download` removed, the subgraph tree dropped, each `const-fix` given its
              int8 `data` from the DPU subgraph's `reg_id_to_parameter_value` at the const tensor's `reg_id` /
              `ddr_addr` (AMD strips the data attributes: all 312 const-fix ops of the five shared models have empty
              `data`), and the compiler's placement attributes (`reg_id`, `ddr_addr`, `location`, `stride`,
              `workload`, `device` of DPU ops, ...) removed.

`canonicalize(graph)` dispatches on the form and validates the result (every op type known, static shapes, batch 1,
the attributes each `*-fix` op needs); every problem is a `FrontendError` that names the graph and the op.
"""
from __future__ import annotations

from collections import OrderedDict
from fractions import Fraction
from typing import Any, Iterable

import numpy as np

from opendpu.compiler.fixpoint import (LEAKY_ALPHA, XIR_ROUND_MODES, FixPointError, hsigmoid_fields, round_values,
                                       slope_encoding, slope_fits_alu)
from opendpu.compiler.xir import dpu_abi as abi
from opendpu.compiler.xir.graph import (DATA_TYPE_CODES, FIX_POINT_RANGE, Attrs, Graph, Op, Tensor, XModelError)
from opendpu.isa.errors import OpenDpuError

__all__ = ["FrontendError", "FORMS", "FIX_OPS", "detect_form", "from_vai_q", "from_compiled", "canonicalize",
           "validate", "load"]


class FrontendError(OpenDpuError, ValueError):
    """An input graph the front end cannot turn into the canonical form; the message names the graph and the op."""


FORMS = ("fix", "vai_q", "compiled")
XINT = DATA_TYPE_CODES["XINT"]
FLOAT = DATA_TYPE_CODES["FLOAT"]

CONV_FIX = ("conv2d-fix", "depthwise-conv2d-fix", "transposed-conv2d-fix")
# the quantized ops of the canonical form (their outputs are int8 fixed-point tensors)
FIX_OPS = frozenset({"data-fix", "const-fix", *CONV_FIX, "pool-fix", "eltwise-fix", "concat-fix", "upsample-fix",
                     "hard-sigmoid-fix", "reshape-fix", "strided_slice-fix", "tile-fix", "float2fix"})
NONLINEARS = ("NONE", "RELU", "RELU6", "LEAKYRELU", "PRELU")        # what the golden and the DPU know
ELTWISE_TYPES = ("ADD", "MUL", "LEAKY-RELU", "PRELU")
HSIGMOID_OUT_FP = 7          # hard-sigmoid output in [0, 1]: fix point 7, as the quantizer (quant.quantize)

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

# attributes a compiled xmodel adds that the canonical graph must not carry (the compiler decides them again)
COMPILED_OP_ATTRS = ("workload", "workload_on_arch", "channel_augmentation")
COMPILED_TENSOR_ATTRS = ("reg_id", "ddr_addr", "location", "stride", "strides")
COMPILED_GRAPH_ATTRS = ("files_md5sum", "libs_info")


def _short(v: Any, n: int = 60) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 1] + "…"


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _int_or_none(v: Any) -> int | None:
    """v as an int if it is an integer (not a bool), else None."""
    return int(v) if _is_int(v) else None


def _t(op: Op) -> Tensor:
    """The output tensor of op (every op the front end reads has one)."""
    if op.output is None:
        raise FrontendError(f"op {op.name!r} ({op.type}) has no output tensor")
    return op.output


def _where(graph: Graph, source: str | None) -> str:
    return source or f"graph {graph.name!r}"


def copy_attrs(src: Attrs, drop: Iterable[str] = ()) -> Attrs:
    """A copy of `src` (values and recorded AttrValue cases) without the names in `drop`."""
    skip = set(drop)
    out = Attrs()
    for k, v in src.items():
        if k not in skip:
            out.set(k, list(v) if isinstance(v, list) else v, src.kinds.get(k))
    return out


def copy_tensor(t: Tensor, name: str | None = None, drop: Iterable[str] = ()) -> Tensor:
    return Tensor(name or t.name, [int(d) for d in t.shape], t.data_type, t.bit_width, copy_attrs(t.attrs, drop))


def fix_tensor(name: str, shape: Iterable[int], fp: int, round_mode: str = "DPU_ROUND") -> Tensor:
    """An XINT8 tensor with the quantizer's four fix attributes (quant/xir_out.py fix_tensor)."""
    t = Tensor(name, [int(d) for d in shape], XINT, 8)
    t.attrs.set("fix_point", int(fp))
    t.attrs.set("bit_width", 8)
    t.attrs.set("if_signed", True)
    t.attrs.set("round_mode", round_mode)
    return t


def float_tensor(name: str, shape: Iterable[int]) -> Tensor:
    return Tensor(name, [int(d) for d in shape], FLOAT, 32)


class _Names:
    """Op and tensor names for a graph being built from another: the source graph's names are reserved (a new name
    never takes one), a source name is claimed once by the op or tensor that keeps it, and a new name that is taken
    gets _1, _2, ..."""

    def __init__(self, reserved_ops: Iterable[str] = (), reserved_tensors: Iterable[str] = ()):
        self.reserved_ops, self.reserved_tensors = set(reserved_ops), set(reserved_tensors)
        self.used_ops: set[str] = set()
        self.used_tensors: set[str] = set()

    @staticmethod
    def _alloc(base: str, reserved: set[str], used: set[str]) -> str:
        name, k = base, 1
        while name in used or name in reserved:
            name = f"{base}_{k}"
            k += 1
        used.add(name)
        return name

    def op(self, base: str) -> str:
        """A new op name."""
        return self._alloc(base, self.reserved_ops, self.used_ops)

    def tensor(self, base: str) -> str:
        """A new tensor name."""
        return self._alloc(base, self.reserved_tensors, self.used_tensors)

    def claim_op(self, name: str) -> str:
        """A source op's own name (a new one if it is taken already)."""
        if name in self.used_ops:
            return self._alloc(name, self.reserved_ops, self.used_ops)
        self.used_ops.add(name)
        return name

    def claim_tensor(self, name: str) -> str:
        """A source tensor's own name (a new one if it is taken already)."""
        if name in self.used_tensors:
            return self._alloc(name, self.reserved_tensors, self.used_tensors)
        self.used_tensors.add(name)
        return name


# ---------------------------------------------------------------------------------------------------
# form detection
# ---------------------------------------------------------------------------------------------------

def detect_form(graph: Graph, source: str | None = None) -> str:
    """"fix" (the canonical `*-fix` form), "vai_q" (float ops + `fix` ops, AMD's quantizers), "compiled" (has DPU
    subgraphs), or FrontendError for a float graph without any quantization."""
    types = {op.type for op in graph.ops.values()}
    if any(s.device == "DPU" for s in graph.root.walk()) or types & {"upload", "download"}:
        return "compiled"
    if any(t.endswith("-fix") for t in types) or types & {"fix2float", "float2fix"}:
        return "fix"
    if "fix" in types:
        return "vai_q"
    first = ", ".join(f"{op.type} {op.name!r}" for op in list(graph.ops.values())[:3]) or "no ops"
    raise FrontendError(f"{_where(graph, source)}: not quantized: no fix ops / fix points ({len(graph.ops)} float "
                        f"ops: {first}{', ...' if len(graph.ops) > 3 else ''}); run `opendpu quantize` first")


# ---------------------------------------------------------------------------------------------------
# vai_q -> canonical
# ---------------------------------------------------------------------------------------------------

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


def _nl(v: Any) -> str:
    return str(v or "NONE").upper()


def _as_float(v: Any) -> float | None:
    try:
        return float(v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v)
    except (TypeError, ValueError, IndexError):
        return None


class _FromVaiQ:
    def __init__(self, g: Graph, source: str | None):
        self.g, self.where = g, _where(g, source)
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
        t = op.type
        if self.cpu(op) and t in FUSABLE_TYPES:
            return self.float_op(op)
        h = {"data": self.k_data, "const": self.k_const, "fix": self.k_fix, "matmul": self.k_matmul,
             "add": self.k_eltwise, "mul": self.k_eltwise, "concat": self.k_concat, "upsample": self.k_upsample,
             "resize": self.k_upsample, "reorg": self.k_reorg, "hard-sigmoid": self.k_hsigmoid,
             "hard-swish": self.k_hswish}.get(t)
        if h is None:
            if t in VAI_Q_CONV:
                h = self.k_conv
            elif t in VAI_Q_POOL:
                h = self.k_pool
            elif t in VAI_Q_ACTS:
                h = self.k_act
            elif t in VAI_Q_RESHAPES:
                h = self.k_reshape
            else:
                h = self.float_op
        h(op)

    def k_data(self, op: Op) -> None:
        f = self.only(op.name)
        if f is None or f.type != "fix" or self.cpu(f) or op.input_ops():
            return self.float_op(op)
        a = copy_attrs(op.attrs)
        a.set("data_type", "XINT8")
        if "shape" not in a:
            a.set("shape", self.shape(op))
        self.emit(op.name, "data-fix", {}, a, self.out_tensor(op, (None, f)))
        self.finish(op, (None, f), op.name)

    def k_const(self, op: Op) -> None:
        f = self.only(op.name)
        if f is None or f.type != "fix" or self.cpu(f):
            self.pending[op.name] = op
            self.floated[op.name] = op.name
            return
        fx = _FixParams(f, self.where)
        v = self.const_values(op) * 2.0 ** fx.fp
        q = np.clip(round_values(v, XIR_ROUND_MODES[fx.round_mode]), -128, 127).astype(np.int8)
        a = copy_attrs(op.attrs)
        a.set("data", q.tobytes())
        a.set("data_type", "XINT8")
        if "shape" not in a:
            a.set("shape", self.shape(op))
        self.emit(op.name, "const-fix", {}, a, self.out_tensor(op, (None, f)))
        self.finish(op, (None, f), op.name)

    def k_fix(self, op: Op) -> None:
        ins = op.input_ops()
        if len(ins) != 1:
            raise self.err(op, f"takes one input, has {len(ins)}")
        p = ins[0]
        fx = _FixParams(op, self.where)
        if p in self.fixed:
            src = self.fixed[p]
            st = _t(self.out.ops[src])
            if st.fix_point == fx.fp:
                self.fixed[op.name] = src               # a re-quantization that changes nothing
                return
            # a fix of a quantized value with another fix point: a fix-point shift (single-input ELEW)
            a = Attrs([("type", "ADD"), ("nonlinear", "NONE")])
            self.emit(op.name, "eltwise-fix", {"input": [src]}, a,
                      fx.tensor(self.names.claim_tensor(_t(op).name), self.shape(op)))
            self.fixed[op.name] = op.name
            return
        src = self.float_of(p)
        self.emit(op.name, "float2fix", {"input": [src]}, fx.attrs(),
                  fx.tensor(self.names.claim_tensor(_t(op).name), self.shape(op)))
        self.fixed[op.name] = op.name

    def k_conv(self, op: Op) -> None:
        if "input" not in op.inputs or "weights" not in op.inputs:
            raise self.err(op, f"needs arguments input and weights (has {list(op.inputs)})")
        pad = self.pads.get(op.name)
        if pad is not None:
            src, _, absorbed = pad
            fixes = [self.g.ops[a] for a in absorbed if self.g.ops[a].type == "fix"]
            if src not in self.fixed or any(_FixParams(f, self.where).fp != self.fp_of(self.fixed[src])
                                            for f in fixes):
                self.flush(absorbed)             # not a pure zero padding of a quantized value: convert it as it is
                pad = None
        x = [self.fixed[pad[0]]] if pad is not None else self.fixed_in(op)
        w = self.const_fix_in(op, "weights")
        b = self.const_fix_in(op, "bias")
        chain = self.fix_chain(op, acts=True)
        base_nl = _nl(op.attrs.get("nonlinear"))
        if chain is not None and chain[0] is not None and base_nl != "NONE":
            chain = None                          # the conv already has an activation: cannot take another
        if x is None or w is None or ("bias" in op.inputs and b is None) or chain is None:
            if pad is not None:
                self.flush(pad[2])
            return self.float_op(op)
        a = copy_attrs(op.attrs, ("nonlinear", "LEAKYRELU_alpha", "device"))
        if pad is not None:
            old = a.get("pad", [0, 0, 0, 0])
            if not isinstance(old, list) or len(old) != 4 or not all(_is_int(v) for v in old):
                raise self.err(op, f"attribute pad = {_short(old)} is not [left, right, top, bottom]")
            a.set("pad", [int(o) + p for o, p in zip(old, pad[1])])
            self.done.update(pad[2])
        act = self.act_attrs(chain[0]) if chain[0] is not None else Attrs([("nonlinear", base_nl)])
        assert act is not None
        for k, v in act.items():
            a.set(k, v)
        ins: dict[str, list[str]] = {"input": x, "weights": [w]}
        if b is not None:
            ins["bias"] = [b]
        self.emit(op.name, VAI_Q_CONV[op.type], ins, a, self.out_tensor(op, chain))
        self.finish(op, chain, op.name)

    def k_matmul(self, op: Op) -> None:
        """A dense layer as the conv our quantizer uses (quant/prepare.py _dense, TransferMatMulToConv2d): over the
        4-D tensor a flatten read (the flatten order folded into the OHWI weights), else over the 2-D input
        reshaped by `<name>_to4d`; the conv's [1, 1, 1, N] output is reshaped back by `<name>_reshape`."""
        args = op.inputs.get("input", [])
        if not args:
            raise self.err(op, f"needs argument input (has {list(op.inputs)})")
        ta, tb = op.attrs.get("transpose_a", False), op.attrs.get("transpose_b", False)
        if not isinstance(ta, (bool, np.bool_)) or not isinstance(tb, (bool, np.bool_)):
            raise self.err(op, f"attributes transpose_a / transpose_b = {_short(ta)} / {_short(tb)} are not booleans")
        bias_src = op.inputs["bias"] if "bias" in op.inputs else args[2:]
        w_src = args[1] if len(args) >= 2 else None
        w = self.fixed.get(w_src) if w_src is not None else None
        b = self.fixed.get(bias_src[0]) if len(bias_src) == 1 else None
        chain = self.fix_chain(op, acts=True)
        plan = self.dense.get(op.name)
        ok = (chain is not None and not ta and len(args) in (2, 3) and len(bias_src) <= 1
              and w is not None and self.out.ops[w].type == "const-fix" and len(_t(self.out.ops[w]).shape) == 2
              and self.g.consumers(w_src or "") == [op.name] and not self.out.consumers(w)
              and (not bias_src or (b is not None and self.out.ops[b].type == "const-fix"))
              and len(self.shape(op)) == 2 and self.shape(op)[0] == 1)
        if plan is not None and not (ok and plan[0] in self.fixed):
            self.flush(plan[2])
            plan = None
        if ok and plan is None:
            a_in = self.fixed.get(args[0])
            ok = a_in is not None and len(_t(self.out.ops[a_in]).shape) == 2
        if not ok:
            return self.float_op(op)
        assert w is not None and chain is not None
        w_op = self.out.ops[w]
        wq = np.frombuffer(w_op.attrs["data"], np.int8).reshape(_t(w_op).shape)
        wm = wq if tb else wq.T                                # [out, in]
        N, K = (int(d) for d in wm.shape)
        if plan is not None:
            x = self.fixed[plan[0]]
            _, H, W, C = (int(d) for d in _t(self.out.ops[x]).shape)
            if H * W * C != K:
                raise self.err(op, f"weights {list(wq.shape)} (transpose_b {bool(tb)}) do not match the flattened "
                                   f"input {[1, H, W, C]}")
            w4 = wm.reshape(N, C, H, W).transpose(0, 2, 3, 1) if plan[1] == "nchw" else wm.reshape(N, H, W, C)
            self.done.update(plan[2])
        else:
            a_in = self.fixed[args[0]]
            t_in = _t(self.out.ops[a_in])
            if int(t_in.shape[1]) != K:
                raise self.err(op, f"input {list(t_in.shape)} does not match weights {list(wq.shape)} (transpose_b "
                                   f"{bool(tb)})")
            H = W = 1
            w4 = wm.reshape(N, 1, 1, K)
            x = self.names.op(f"{op.name}_to4d")
            self.emit(x, "reshape-fix", {"input": [a_in]}, Attrs([("shape", [1, 1, 1, K])]),
                      fix_tensor(self.names.tensor(x), [1, 1, 1, K], self.fp_of(a_in),
                                 t_in.attrs.get("round_mode", "DPU_ROUND")))
        w4 = np.ascontiguousarray(w4)
        w_op.attrs.set("data", w4.tobytes())
        w_op.attrs.set("shape", [int(d) for d in w4.shape])
        _t(w_op).shape = [int(d) for d in w4.shape]
        a = Attrs([("kernel", [W, H]), ("stride", [1, 1]), ("pad", [0, 0, 0, 0]), ("pad_mode", "FLOOR"),
                   ("dilation", [1, 1]), ("group", 1)])
        act = self.act_attrs(chain[0])
        assert act is not None
        for k, v in act.items():
            a.set(k, v)
        conv_ins: dict[str, list[str]] = {"input": [x], "weights": [w]}
        if b is not None:
            conv_ins["bias"] = [b]
        fx = _FixParams(chain[1], self.where)
        if plan is None:                  # the quantizer writes <name>_to4d before the layer's weights
            self.move_before(x, min((w, b) if b is not None else (w,), key=list(self.out.ops).index))
        self.emit(op.name, "conv2d-fix", conv_ins, a, fx.tensor(self.names.claim_tensor(op.name), [1, 1, 1, N]))
        r = self.names.op(f"{op.name}_reshape")
        self.emit(r, "reshape-fix", {"input": [op.name]}, Attrs([("shape", self.shape(op))]),
                  self.out_tensor(op, chain))
        self.finish(op, chain, r)

    def k_eltwise(self, op: Op) -> None:
        xs = self.fixed_in(op, n=None)
        chain = self.fix_chain(op, acts=True)
        if xs is None or chain is None:
            return self.float_op(op)
        a = copy_attrs(op.attrs, ("device",))
        a.set("type", "ADD" if op.type == "add" else "MUL")
        act = self.act_attrs(chain[0])
        assert act is not None
        for k, v in act.items():
            a.set(k, v)
        self.emit(op.name, "eltwise-fix", {"input": xs}, a, self.out_tensor(op, chain))
        self.finish(op, chain, op.name)

    def k_pool(self, op: Op) -> None:
        x = self.fixed_in(op)
        chain = self.fix_chain(op, acts=False)
        typ = VAI_Q_POOL[op.type]
        a = copy_attrs(op.attrs, ("device", "count_include_invalid"))
        if typ == "AVG":
            pads = op.attrs.get("pad", [0, 0, 0, 0])
            if chain is None or (not op.attrs.get("count_include_pad", True) and isinstance(pads, list) and any(pads)) \
                    or (not op.attrs.get("count_include_invalid", True) and str(op.attrs.get("pad_mode", "FLOOR"))
                        .upper() == "CEIL"):
                x = None                           # the DPU divides by the full window: not this op's divisor
            a.set("count_include_pad", True)
        if x is None or (chain is None and typ != "MAX"):
            return self.float_op(op)
        a.set("type", typ)
        self.emit(op.name, "pool-fix", {"input": x}, a, self.out_tensor(op, chain, x[0]))
        self.finish(op, chain, op.name)

    def k_concat(self, op: Op) -> None:
        xs = self.fixed_in(op, n=None)
        chain = self.fix_chain(op, acts=False)
        if xs is None or (chain is None and len({self.fp_of(x) for x in xs}) != 1):
            return self.float_op(op)
        self.emit(op.name, "concat-fix", {"input": xs}, copy_attrs(op.attrs, ("device",)),
                  self.out_tensor(op, chain, xs[0]))
        self.finish(op, chain, op.name)

    def k_upsample(self, op: Op) -> None:
        ins = op.inputs.get("input", op.input_ops()[:1])
        x = [self.fixed[ins[0]]] if ins and ins[0] in self.fixed else None
        chain = self.fix_chain(op, acts=False)
        mode = str(op.attrs.get("mode", "NEAREST")).upper()
        if x is None or mode != "NEAREST" or op.attrs.get("align_corners", False) \
                or op.attrs.get("half_pixel_centers", False) or len(_t(op).shape) != 4:
            return self.float_op(op)
        if op.type == "upsample":
            a = copy_attrs(op.attrs, ("device",))
        else:
            ih, iw = _t(self.out.ops[x[0]]).shape[1:3]
            oh, ow = self.shape(op)[1:3]
            a = Attrs([("mode", "NEAREST"), ("scale", [ow / iw, oh / ih]), ("align_corners", False),
                       ("half_pixel_centers", False)])
        self.emit(op.name, "upsample-fix", {"input": x}, a, self.out_tensor(op, chain, x[0]))
        self.finish(op, chain, op.name)

    def k_reorg(self, op: Op) -> None:
        """reorg (attrs scale, reverse; tile-fix's channel order, docs/decisions.md) -> tile-fix (stride, reverse)."""
        x = self.fixed_in(op)
        chain = self.fix_chain(op, acts=False)
        s, rev = op.attrs.get("scale", op.attrs.get("stride")), op.attrs.get("reverse", False)
        if x is None or not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 1 \
                or not isinstance(rev, (bool, np.bool_)) or len(_t(op).shape) != 4:
            return self.float_op(op)
        self.emit(op.name, "tile-fix", {"input": x}, Attrs([("stride", int(s)), ("reverse", bool(rev))]),
                  self.out_tensor(op, chain, x[0]))
        self.finish(op, chain, op.name)

    def k_hsigmoid(self, op: Op) -> None:
        x = self.fixed_in(op)
        chain = self.fix_chain(op, acts=False)
        if x is None or chain is None:
            return self.float_op(op)
        t = self.out_tensor(op, chain)
        a = copy_attrs(op.attrs, ("device", "hsigmoid_in", "shift_hsigmoid"))
        for k, v in zip(("hsigmoid_in", "shift_hsigmoid"),
                        hsigmoid_fields(self.fp_of(x[0]), int(t.attrs["fix_point"]), check=False)):
            a.set(k, v)
        self.emit(op.name, "hard-sigmoid-fix", {"input": x}, a, t)
        self.finish(op, chain, op.name)

    def k_hswish(self, op: Op) -> None:
        """x * hard-sigmoid(x) as our quantizer writes it: hard-sigmoid-fix (fix point 7) and eltwise-fix MUL."""
        x = self.fixed_in(op)
        chain = self.fix_chain(op, acts=False)
        if x is None or chain is None:
            return self.float_op(op)
        hs = self.names.op(f"{op.name}_hsigmoid")
        fields = hsigmoid_fields(self.fp_of(x[0]), HSIGMOID_OUT_FP, check=False)
        self.emit(hs, "hard-sigmoid-fix", {"input": x}, Attrs(zip(("hsigmoid_in", "shift_hsigmoid"), fields)),
                  fix_tensor(self.names.tensor(hs), self.shape(op), HSIGMOID_OUT_FP))
        self.emit(op.name, "eltwise-fix", {"input": [x[0], hs]}, Attrs([("type", "MUL"), ("nonlinear", "NONE")]),
                  self.out_tensor(op, chain))
        self.finish(op, chain, op.name)

    def k_reshape(self, op: Op) -> None:
        ins = op.inputs.get("input", op.input_ops()[:1])
        x = [self.fixed[ins[0]]] if ins and ins[0] in self.fixed else None
        if x is None:
            return self.float_op(op)
        chain = self.fix_chain(op, acts=False)
        a = copy_attrs(op.attrs, ("device", "start_axis", "end_axis", "axis", "axes"))
        a.set("shape", self.shape(op))
        self.emit(op.name, "reshape-fix", {"input": x}, a, self.out_tensor(op, chain, x[0]))
        self.finish(op, chain, op.name)

    def k_act(self, op: Op) -> None:
        """An activation no conv / eltwise took: a single-input eltwise-fix (quant/xir_out.py k_act)."""
        x = self.fixed_in(op)
        chain = self.fix_chain(op, acts=False)
        if x is None:
            return self.float_op(op)
        if op.type == "leaky-relu":
            alpha = _as_float(op.attrs.get("alpha", 0.01))
            if alpha is None:
                raise self.err(op, f"attribute alpha = {_short(op.attrs.get('alpha'))} is not a number")
            if Fraction(alpha) == LEAKY_ALPHA:
                m, s = 26, 8                        # the quantizer's encoding of 26/256
            else:
                try:
                    m, s = slope_encoding(alpha)
                except FixPointError:
                    return self.float_op(op)
                if not slope_fits_alu(m, s):
                    return self.float_op(op)
            if chain is None:                       # a leaky slope changes the value: needs an output fix point
                return self.float_op(op)
            a = Attrs([("type", "LEAKY-RELU"), ("prelu_in", m), ("prelu_shift", s)])
        else:
            a = Attrs([("type", "ADD"), ("nonlinear", "RELU" if op.type == "relu" else "RELU6")])
        self.emit(op.name, "eltwise-fix", {"input": x}, a, self.out_tensor(op, chain, x[0]))
        self.finish(op, chain, op.name)


def from_vai_q(graph: Graph, source: str | None = None) -> Graph:
    """The canonical `*-fix` graph of a graph in AMD's quantizer form (float XIR ops + `fix` ops); see the module
    docstring for what is fused. `source` (a file name) prefixes error messages."""
    return _FromVaiQ(graph, source).run()


# ---------------------------------------------------------------------------------------------------
# compiled -> canonical
# ---------------------------------------------------------------------------------------------------

def from_compiled(graph: Graph, source: str | None = None) -> Graph:
    """The quantized graph inside a compiled xmodel: every op of its subgraphs without `upload` / `download`,
    const-fix data recovered from the DPU subgraphs' parameter blobs, the compiler's placement attributes
    removed and the subgraph tree dropped (root only)."""
    where = _where(graph, source)
    try:
        order = graph.toposort()
    except XModelError as e:
        raise FrontendError(f"{where}: {e}") from None
    out = Graph(graph.name)
    out.attrs = copy_attrs(graph.attrs, COMPILED_GRAPH_ATTRS)
    out.op_defs = list(graph.op_defs)
    alias: dict[str, str] = {}
    params: dict[str, abi.RegisterMap] = {}

    def blob_data(op: Op) -> bytes:
        t = _t(op)
        try:
            sg = graph.subgraph_of(op.name)
        except XModelError:
            raise FrontendError(f"{where}: const op {op.name!r} has no data and is in no subgraph") from None
        if sg.name not in params:
            if sg.device != "DPU":
                raise FrontendError(f"{where}: const op {op.name!r} has no data and its subgraph {sg.name!r} is "
                                    f"not a DPU subgraph (no parameter blob)")
            try:
                params[sg.name] = abi.read_registers(sg)
            except XModelError as e:
                raise FrontendError(f"{where}: {e}") from None
        regs = params[sg.name]
        reg, addr = _int_or_none(t.attrs.get("reg_id")), _int_or_none(t.attrs.get("ddr_addr"))
        if reg is None or addr is None:
            raise FrontendError(f"{where}: const op {op.name!r} has no data and no reg_id / ddr_addr to find it in "
                                f"the parameter blob")
        blob = regs.params.get(reg)
        if blob is None:
            raise FrontendError(f"{where}: const op {op.name!r}: REG_{reg} of subgraph {sg.name!r} has no "
                                f"parameter blob (context {regs.context.get(reg, 'unknown')})")
        try:
            n = int(np.prod(t.shape, dtype=np.int64)) * t.numpy_dtype.itemsize
        except XModelError as e:
            raise FrontendError(f"{where}: const op {op.name!r}: {e}") from None
        if addr + n > len(blob):
            raise FrontendError(f"{where}: const op {op.name!r}: bytes [{addr}, {addr + n}) lie beyond the "
                                f"{len(blob)}-byte REG_{reg} parameter blob of subgraph {sg.name!r}")
        return bytes(blob[addr: addr + n])

    for n in order:
        op = graph.ops[n]
        if op.output is None:
            raise FrontendError(f"{where}: op {n!r} ({op.type}) has no output tensor")
        if op.type in ("upload", "download"):
            ins = op.input_ops()
            if len(ins) != 1:
                raise FrontendError(f"{where}: op {n!r} ({op.type}) takes one input, has {len(ins)}")
            src = alias.get(ins[0], ins[0])
            alias[n] = src
            if op.type == "download" and graph.consumers(ins[0]) == [n]:
                _t(out.ops[src]).name = _t(op).name      # the producer's tensor takes the user-facing name
            continue
        is_float = _t(op).data_type == FLOAT
        drop = COMPILED_OP_ATTRS + (() if is_float and op.attrs.get("device") == "CPU" else ("device",))
        a = copy_attrs(op.attrs, drop)
        if op.type in ("const-fix", "const") and not op.attrs.get("data"):
            a.set("data", blob_data(op), "bytes_value")
        args = OrderedDict((arg, [alias.get(p, p) for p in ps]) for arg, ps in op.inputs.items())
        try:
            out.add_op(n, op.type, args, a, copy_tensor(_t(op), drop=COMPILED_TENSOR_ATTRS))
        except XModelError as e:
            raise FrontendError(f"{where}: {e}") from None
    out._link_subgraphs()
    try:
        out.validate()
    except XModelError as e:
        raise FrontendError(f"{where}: the recovered graph is not valid: {e}") from None
    return out


# ---------------------------------------------------------------------------------------------------
# validation of the canonical form
# ---------------------------------------------------------------------------------------------------

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


def canonicalize(graph: Graph, source: str | None = None) -> Graph:
    """The canonical `*-fix` graph of any accepted input (a canonical graph is validated and returned as is)."""
    form = detect_form(graph, source)
    if form == "vai_q":
        graph = from_vai_q(graph, source)
    elif form == "compiled":
        graph = from_compiled(graph, source)
    validate(graph, source)
    return graph


def load(path: str) -> Graph:
    """Read an xmodel of any accepted form and return its canonical graph (errors name the file)."""
    try:
        g = Graph.load(path)
    except XModelError as e:
        raise FrontendError(str(e)) from None
    return canonicalize(g, path)
