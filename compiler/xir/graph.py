"""XIR-style graph IR and .xmodel I/O (spec §8).

A `Graph` holds ops in insertion order, each with one output `Tensor`, and a `Subgraph` tree that
partitions the ops. Attributes are plain Python values; the AttrValue case of every attribute read
from a file is remembered, so `save(load(f))` decodes to the same content as `f`.
"""
from __future__ import annotations

import heapq
import os
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from google.protobuf.message import DecodeError

from opendpu.isa.errors import OpenDpuError

from . import xir_pb2 as pb

# Tensor.data_type codes (spec §8.1).
DATA_TYPES = {0: "INT", 1: "UINT", 2: "XINT", 3: "XUINT", 4: "FLOAT", 5: "BFLOAT", 6: "UNKNOWN"}
DATA_TYPE_CODES = {v: k for k, v in DATA_TYPES.items()}


class XModelError(OpenDpuError, ValueError):
    """A file that is not a readable xmodel, or a graph that breaks the XIR rules."""


# Sanity limits a loaded graph must respect (a corrupted or hostile file is refused with XModelError instead of
# failing later with MemoryError/OverflowError). XIR dims are int32; one tensor holds at most 2**32 elements
# (DPU DDR addresses are 32-bit); a fix point beyond ±64 cannot scale an 8..32-bit value within float32 range.
MAX_DIM = (1 << 31) - 1
MAX_TENSOR_ELEMENTS = 1 << 32
FIX_POINT_RANGE = (-64, 64)
MAX_REG_SIZE = 1 << 32
MAX_XMODEL_BYTES = 1 << 32



def reg_id_of(key) -> int | None:
    """The register id of a `REG_<n>` key of the reg_id_to_* maps (ASCII digits only), or None."""
    m = re.fullmatch(r"REG_([0-9]+)", key) if isinstance(key, str) else None
    return int(m.group(1)) if m else None

def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _short(v, n: int = 40) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 1] + "…"


# ---------------------------------------------------------------------------------------------
# AttrValue <-> Python
# ---------------------------------------------------------------------------------------------
_SCALAR = ("bool_value", "int32_value", "uint32_value", "int64_value", "uint64_value", "float_value",
           "double_value", "string_value")
_VEC = ("bool_vec_value", "int32_vec_value", "uint32_vec_value", "int64_vec_value", "uint64_vec_value",
        "float_vec_value", "double_vec_value", "string_vec_value")
_MAP_SCALAR = ("map_string_2_int32_value", "map_string_2_uint32_value", "map_string_2_int64_value",
               "map_string_2_uint64_value", "map_string_2_string_value")
_MAP_VEC = ("map_string_2_int32_vec_value", "map_string_2_uint32_vec_value", "map_string_2_int64_vec_value",
            "map_string_2_uint64_vec_value", "map_string_2_string_vec_value")
ATTR_KINDS = (_SCALAR + ("bytes_value",) + _VEC + ("bytes_vec_value",) + _MAP_SCALAR
              + ("map_string_2_bytes_value",) + _MAP_VEC)


def attr_to_py(av: pb.AttrValue) -> tuple[str | None, Any]:
    """AttrValue -> (kind, python value). Kind is the oneof case name (None if unset)."""
    kind = av.WhichOneof("value")
    if kind is None:
        return None, None
    v = getattr(av, kind)
    if kind in _SCALAR:
        return kind, v
    if kind == "bytes_value":
        return kind, bytes(v.value)
    if kind in _VEC:
        return kind, list(v.value)
    if kind == "bytes_vec_value":
        return kind, [bytes(b.value) for b in v.value]
    if kind in _MAP_SCALAR:
        return kind, dict(v.value)
    if kind == "map_string_2_bytes_value":
        return kind, {k: bytes(b.value) for k, b in v.value.items()}
    if kind in _MAP_VEC:
        return kind, {k: list(b.value) for k, b in v.value.items()}
    raise XModelError(f"unknown AttrValue case {kind}")


def infer_kind(value: Any) -> str:
    """AttrValue case for a Python value that has none recorded (XIR's C++ type conventions)."""
    if isinstance(value, (bool, np.bool_)):
        return "bool_value"
    if isinstance(value, (int, np.integer)):
        return "int32_value" if -(1 << 31) <= int(value) < (1 << 31) else "int64_value"
    if isinstance(value, (float, np.floating)):
        return "float_value"
    if isinstance(value, str):
        return "string_value"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes_value"
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value)
        if all(isinstance(x, (bool, np.bool_)) for x in items) and items:
            return "bool_vec_value"
        if all(isinstance(x, (int, np.integer)) for x in items):
            return "int32_vec_value"
        if all(isinstance(x, (int, float, np.integer, np.floating)) for x in items):
            return "float_vec_value"
        if all(isinstance(x, str) for x in items):
            return "string_vec_value"
        if all(isinstance(x, (bytes, bytearray)) for x in items):
            return "bytes_vec_value"
    if isinstance(value, dict):
        vals = list(value.values())
        if all(isinstance(x, str) for x in vals):
            return "map_string_2_string_value"
        if all(isinstance(x, (bytes, bytearray)) for x in vals):
            return "map_string_2_bytes_value"
        if all(isinstance(x, (int, np.integer)) for x in vals):
            return "map_string_2_int32_value"
        if all(isinstance(x, (list, tuple)) and all(isinstance(y, (int, np.integer)) for y in x) for x in vals):
            return "map_string_2_int32_vec_value"
        if all(isinstance(x, (list, tuple)) and all(isinstance(y, str) for y in x) for x in vals):
            return "map_string_2_string_vec_value"
    raise XModelError(f"cannot store attribute value of type {type(value).__name__} in an xmodel")


def py_to_attr(kind: str, value: Any, out: pb.AttrValue) -> None:
    """Fill `out` (an AttrValue) with `value` as case `kind`."""
    if kind in _SCALAR:
        if kind == "string_value":
            out.string_value = str(value)
        elif kind == "bool_value":
            out.bool_value = bool(value)
        elif kind in ("float_value", "double_value"):
            setattr(out, kind, float(value))
        else:
            setattr(out, kind, int(value))
    elif kind == "bytes_value":
        out.bytes_value.value = bytes(value)
    elif kind in _VEC:
        tgt = getattr(out, kind)
        tgt.SetInParent()
        tgt.value.extend([x.item() if isinstance(x, np.generic) else x for x in value])
    elif kind == "bytes_vec_value":
        out.bytes_vec_value.SetInParent()
        for b in value:
            out.bytes_vec_value.value.add().value = bytes(b)
    elif kind in _MAP_SCALAR:
        tgt = getattr(out, kind)
        tgt.SetInParent()
        for k, v in value.items():
            tgt.value[k] = v.item() if isinstance(v, np.generic) else v
    elif kind == "map_string_2_bytes_value":
        out.map_string_2_bytes_value.SetInParent()
        for k, v in value.items():
            out.map_string_2_bytes_value.value[k].value = bytes(v)
    elif kind in _MAP_VEC:
        tgt = getattr(out, kind)
        tgt.SetInParent()
        for k, v in value.items():
            tgt.value[k].value.extend(v)
    else:
        raise XModelError(f"unknown attribute kind {kind!r}")


class Attrs(OrderedDict):
    """Attribute dict that remembers the AttrValue case of each entry for faithful write-back."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.kinds: dict[str, str] = {}

    def set(self, name: str, value: Any, kind: str | None = None) -> None:
        self[name] = value
        if kind is not None:
            if kind not in ATTR_KINDS:
                raise XModelError(f"attribute {name}: unknown kind {kind!r}")
            self.kinds[name] = kind
        else:
            self.kinds.pop(name, None)

    def kind(self, name: str) -> str:
        return self.kinds.get(name) or infer_kind(self[name])

    @classmethod
    def from_proto(cls, m) -> "Attrs":
        a = cls()
        for k in sorted(m.keys()):
            kind, v = attr_to_py(m[k])
            if kind is None:
                continue
            a.set(k, v, kind)
        return a

    def to_proto(self, m, where: str) -> None:
        for k, v in self.items():
            try:
                py_to_attr(self.kind(k), v, m[k])
            except (TypeError, ValueError) as e:
                raise XModelError(f"{where}: attribute {k!r} = {v!r:.60}: {e}") from None


# ---------------------------------------------------------------------------------------------
# IR
# ---------------------------------------------------------------------------------------------
@dataclass
class Tensor:
    """An op's output tensor: name, shape, XIR data type, bit width and attributes. Holds no data."""

    name: str
    shape: list[int]
    data_type: int = 2                  # XINT
    bit_width: int = 8
    attrs: Attrs = field(default_factory=Attrs)

    @property
    def dtype_name(self) -> str:
        """'XINT8', 'FLOAT32', … (XIR's printed form)."""
        return f"{DATA_TYPES.get(self.data_type, 'UNKNOWN')}{self.bit_width}"

    @property
    def is_fixed(self) -> bool:
        return self.data_type in (2, 3)

    @property
    def fix_point(self) -> int | None:
        """Fractional bits (spec §7.1): `fix_point`, else the quantizer's `quant_out_quantize_pos`."""
        for k in ("fix_point", "quant_out_quantize_pos"):
            if k in self.attrs:
                v = self.attrs[k]
                if not _is_int(v):
                    raise XModelError(f"tensor {self.name!r}: attribute {k} = {_short(v)} is not an integer")
                return int(v)
        return None

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype holding this tensor's values (sub-byte and odd widths widened to 8/16/32/64 bits)."""
        bw = self.bit_width
        if self.data_type == 5:                     # BFLOAT16 has no numpy type: held as float32
            return np.dtype(np.float32)
        if self.data_type == 4:
            if bw not in (16, 32, 64):
                raise XModelError(f"tensor {self.name!r}: FLOAT with bit width {bw} (expected 16, 32 or 64)")
            return np.dtype(f"float{bw}")
        if self.data_type not in (0, 1, 2, 3):
            raise XModelError(f"tensor {self.name!r}: data type {self.data_type} ({self.dtype_name}) has no numpy "
                              f"equivalent")
        if not 1 <= bw <= 64:
            raise XModelError(f"tensor {self.name!r}: bit width {bw} out of range 1..64")
        bits = next(b for b in (8, 16, 32, 64) if bw <= b)
        signed = self.data_type in (0, 2)
        return np.dtype(f"{'int' if signed else 'uint'}{bits}")

    def get(self, name: str, default=None):
        return self.attrs.get(name, default)


@dataclass
class Op:
    """One XIR op: type, attributes, named input args (lists of producer op names) and one output."""

    name: str
    type: str
    attrs: Attrs = field(default_factory=Attrs)
    inputs: "OrderedDict[str, list[str]]" = field(default_factory=OrderedDict)
    output: Tensor | None = None

    def input_ops(self) -> list[str]:
        return [n for ns in self.inputs.values() for n in ns]

    def get(self, name: str, default=None):
        return self.attrs.get(name, default)

    @property
    def device(self) -> str | None:
        return self.attrs.get("device")


@dataclass
class Subgraph:
    """A node of the subgraph tree. A leaf's `ops` name the ops it holds; a parent holds the union."""

    name: str
    ops: list[str] = field(default_factory=list)
    attrs: Attrs = field(default_factory=Attrs)
    children: list["Subgraph"] = field(default_factory=list)
    parent: "Subgraph | None" = field(default=None, repr=False, compare=False)
    graph: "Graph | None" = field(default=None, repr=False, compare=False)

    @property
    def device(self) -> str | None:
        return self.attrs.get("device")

    @property
    def is_leaf(self) -> bool:
        return not self.children

    def all_ops(self) -> list[str]:
        """Every op in this subtree (the stored op list of a parent may be empty in real files)."""
        if not self.children:
            return list(self.ops)
        out: list[str] = list(self.ops)
        seen = set(out)
        for c in self.children:
            for n in c.all_ops():
                if n not in seen:
                    seen.add(n)
                    out.append(n)
        return out

    def walk(self) -> Iterable["Subgraph"]:
        yield self
        for c in self.children:
            yield from c.walk()

    def find(self, name: str) -> "Subgraph | None":
        for s in self.walk():
            if s.name == name:
                return s
        return None

    def get(self, name: str, default=None):
        return self.attrs.get(name, default)


def _check_tensor(op: Op) -> None:
    """Shape, data type, bit width, fix point and DDR-location attributes of an op's output tensor."""
    t = op.output
    if t is None:
        return
    where = f"op {op.name!r} ({op.type}): output tensor {t.name!r}"
    shape = list(t.shape)
    for i, d in enumerate(shape):
        if not _is_int(d):
            raise XModelError(f"{where}: dimension {i} is {_short(d)}, not an integer")
        if d < 0:
            raise XModelError(f"{where}: dimension {i} is negative ({d})")
        if d > MAX_DIM:
            hint = " (a negative number stored as uint32?)" if d >= 1 << 31 else ""
            raise XModelError(f"{where}: dimension {i} is {d}, beyond the XIR limit {MAX_DIM}{hint}")
    n = 1
    for d in shape:
        n *= int(d)
    if n > MAX_TENSOR_ELEMENTS:
        raise XModelError(f"{where}: shape {shape} has {n} elements, more than the {MAX_TENSOR_ELEMENTS} (2**32) "
                          f"an xmodel tensor may hold")
    if t.data_type not in DATA_TYPES:
        raise XModelError(f"{where}: unknown data type code {t.data_type} (known: "
                          f"{', '.join(f'{k} {v}' for k, v in DATA_TYPES.items())})")
    if not 1 <= t.bit_width <= 64:
        raise XModelError(f"{where}: bit width {t.bit_width} out of range 1..64")
    if t.data_type == 4 and t.bit_width not in (16, 32, 64):
        raise XModelError(f"{where}: FLOAT with bit width {t.bit_width} (expected 16, 32 or 64)")
    lo, hi = FIX_POINT_RANGE
    for k in ("fix_point", "quant_out_quantize_pos"):
        if k in t.attrs:
            v = t.attrs[k]
            if not _is_int(v):
                raise XModelError(f"{where}: attribute {k} = {_short(v)} is not an integer")
            if not lo <= v <= hi:
                raise XModelError(f"{where}: attribute {k} = {v} is out of range {lo}..{hi}")
    for k in ("reg_id", "ddr_addr"):
        if k in t.attrs:
            v = t.attrs[k]
            if not _is_int(v):
                raise XModelError(f"{where}: attribute {k} = {_short(v)} is not an integer")
            if not 0 <= v < MAX_REG_SIZE:
                raise XModelError(f"{where}: attribute {k} = {v} is out of range 0..{MAX_REG_SIZE - 1}")
    if "stride" in t.attrs:
        st = t.attrs["stride"]
        if not isinstance(st, list) or not all(_is_int(x) and 0 <= x < MAX_REG_SIZE for x in st):
            raise XModelError(f"{where}: attribute stride = {_short(st)} is not a list of non-negative integers")
        if len(st) != len(shape):
            raise XModelError(f"{where}: attribute stride {st} has {len(st)} entries for the {len(shape)}-D shape "
                              f"{shape}")


_SUBGRAPH_ATTR_TYPES = {
    "device": (str, "a string"), "dpu_fingerprint": (int, "an integer"), "mc_code": (bytes, "bytes"),
    "dpu_name": (str, "a string"), "children_topological_sort": (list, "a list of subgraph names"),
    "reg_id_to_size": (dict, "a map REG_n -> size"), "reg_id_to_parameter_value": (dict, "a map REG_n -> bytes"),
    "reg_id_to_context_type": (dict, "a map REG_n -> context type"),
    "reg_id_to_context_type_v2": (dict, "a map REG_n -> context type"),
}


def _check_subgraph(sg: Subgraph) -> None:
    """Types of the subgraph attributes the runtime reads (a DPU subgraph's program, registers, fingerprint)."""
    where = f"subgraph {sg.name!r}"
    for k, (typ, what) in _SUBGRAPH_ATTR_TYPES.items():
        if k not in sg.attrs:
            continue
        v = sg.attrs[k]
        ok = _is_int(v) if typ is int else isinstance(v, typ)
        if not ok:
            raise XModelError(f"{where}: attribute {k} is {type(v).__name__} {_short(v)}, expected {what}")
    if sg.attrs.get("dpu_fingerprint") is not None and not 0 <= sg.attrs["dpu_fingerprint"] < 1 << 64:
        raise XModelError(f"{where}: dpu_fingerprint {sg.attrs['dpu_fingerprint']} does not fit in 64 bits")
    names = sg.attrs.get("children_topological_sort")
    if names is not None and not all(isinstance(n, str) for n in names):
        raise XModelError(f"{where}: children_topological_sort holds non-string entries")
    for k in ("reg_id_to_size", "reg_id_to_parameter_value", "reg_id_to_context_type", "reg_id_to_context_type_v2"):
        m = sg.attrs.get(k)
        if not m:
            continue
        for reg, v in m.items():
            if reg_id_of(reg) is None:
                raise XModelError(f"{where}: {k} has a bad register key {_short(reg)} (expected REG_<n>)")
            if k == "reg_id_to_size" and (not _is_int(v) or not 0 <= v <= MAX_REG_SIZE):
                raise XModelError(f"{where}: {k}[{reg}] = {_short(v)} is not a size in 0..{MAX_REG_SIZE} bytes")
            if k == "reg_id_to_parameter_value" and not isinstance(v, (bytes, bytearray)):
                raise XModelError(f"{where}: {k}[{reg}] is {type(v).__name__}, not bytes")
            if k.startswith("reg_id_to_context_type") and not isinstance(v, str):
                raise XModelError(f"{where}: {k}[{reg}] is {type(v).__name__}, not a context type string")


class Graph:
    """Ops (insertion-ordered), graph attributes, op definitions and the subgraph tree."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.ops: "OrderedDict[str, Op]" = OrderedDict()
        self.attrs = Attrs()
        self.op_defs: list[pb.OpDef] = []
        self.root = Subgraph("root")
        self._consumers: dict[str, list[str]] | None = None

    # ---- construction ------------------------------------------------------------------------
    def add_op(self, name: str, type: str, inputs: dict[str, list[str]] | None = None,
               attrs: dict | None = None, output: Tensor | None = None) -> Op:
        if name in self.ops:
            raise XModelError(f"XIR_OP_NAME_CONFLICT: op {name!r} already exists")
        ins = OrderedDict((k, list(v)) for k, v in (inputs or {}).items())
        for arg, producers in ins.items():
            for p in producers:
                if p not in self.ops:
                    raise XModelError(f"op {name!r} ({type}): input {arg!r} names unknown op {p!r}")
        a = attrs if isinstance(attrs, Attrs) else Attrs(attrs or {})
        op = Op(name, type, a, ins, output or Tensor(name, []))
        self.ops[name] = op
        self._consumers = None
        return op

    # ---- queries -----------------------------------------------------------------------------
    def op(self, name: str) -> Op:
        try:
            return self.ops[name]
        except KeyError:
            raise XModelError(f"graph {self.name!r} has no op {name!r}") from None

    def producer_of_tensor(self, tensor_name: str) -> Op:
        for op in self.ops.values():
            if op.output is not None and op.output.name == tensor_name:
                return op
        raise XModelError(f"graph {self.name!r} has no tensor {tensor_name!r}")

    def consumers(self, name: str) -> list[str]:
        if self._consumers is None:
            c: dict[str, list[str]] = {n: [] for n in self.ops}
            for op in self.ops.values():
                for p in op.input_ops():
                    if op.name not in c[p]:
                        c[p].append(op.name)
            self._consumers = c
        return self._consumers.get(name, [])

    def toposort(self, names: Iterable[str] | None = None) -> list[str]:
        """Producers before consumers, ties in insertion order; a cycle raises XModelError."""
        sel = list(self.ops) if names is None else [n for n in self.ops if n in set(names)]
        selset = set(sel)
        indeg = {n: len({p for p in self.ops[n].input_ops() if p in selset}) for n in sel}   # Add(x, x): one edge
        order = {n: i for i, n in enumerate(sel)}
        out = []
        heap = [(order[n], n) for n in sel if indeg[n] == 0]
        heapq.heapify(heap)
        while heap:
            _, n = heapq.heappop(heap)
            out.append(n)
            for c in self.consumers(n):
                if c in selset:
                    indeg[c] -= 1
                    if indeg[c] == 0:
                        heapq.heappush(heap, (order[c], c))
        if len(out) != len(sel):
            raise XModelError(f"graph {self.name!r} has a cycle among ops "
                              f"{sorted(set(sel) - set(out))[:5]}")
        return out

    def subgraph_of(self, op_name: str, level: int = 1) -> Subgraph:
        """The subgraph at depth `level` (1 = child of root) that contains op_name."""
        for c in self.root.children:
            if op_name in set(c.all_ops()):
                if level == 1:
                    return c
                for cc in c.walk():
                    if cc is not c and cc.is_leaf and op_name in cc.ops:
                        return cc
        raise XModelError(f"op {op_name!r} is in no subgraph")

    def toposort_child_subgraphs(self, sg: Subgraph | None = None) -> list[Subgraph]:
        """Children of `sg` (default root) in dependency order (XIR toposort_child_subgraph)."""
        sg = sg or self.root
        kids = list(sg.children)
        if "children_topological_sort" in sg.attrs:
            by = {c.name: c for c in kids}
            names = sg.attrs["children_topological_sort"]
            if set(names) == set(by):
                return [by[n] for n in names]
        owner = {}
        for c in kids:
            for n in c.all_ops():
                owner[n] = c.name
        deps: dict[str, set[str]] = {c.name: set() for c in kids}
        for c in kids:
            for n in c.all_ops():
                for p in self.ops[n].input_ops():
                    if owner.get(p) not in (None, c.name):
                        deps[c.name].add(owner[p])
        out = []
        done: set[str] = set()
        pending = list(kids)
        while pending:
            progress = False
            for c in list(pending):
                if deps[c.name] <= done:
                    out.append(c)
                    done.add(c.name)
                    pending.remove(c)
                    progress = True
            if not progress:
                raise XModelError(f"XIR_SUBGRAPH_HAS_CYCLE: children of {sg.name!r}: "
                                  f"{[c.name for c in pending][:5]}")
        return out

    def validate(self) -> None:
        """Check the XIR rules a loader relies on: known producers, no cycle, a partitioning tree, and values
        every reader can use (tensor shapes, types and fix points, interface and DPU subgraph attribute types)."""
        for op in self.ops.values():
            if not op.name:
                raise XModelError("an op has an empty name")
            if not op.type:
                raise XModelError(f"op {op.name!r} has an empty type")
            _check_tensor(op)
            if "data" in op.attrs and not isinstance(op.attrs["data"], (bytes, bytearray)):
                raise XModelError(f"op {op.name!r} ({op.type}): attribute data is a {type(op.attrs['data']).__name__}, "
                                  f"not bytes")
        for sg in self.root.walk():
            _check_subgraph(sg)
        for op in self.ops.values():
            for p in op.input_ops():
                if p not in self.ops:
                    raise XModelError(f"op {op.name!r} ({op.type}) reads unknown op {p!r}")
        self.toposort()
        seen: dict[str, str] = {}
        for c in self.root.children:
            for n in c.all_ops():
                if n not in self.ops:
                    raise XModelError(f"subgraph {c.name!r} names unknown op {n!r}")
                if n in seen:
                    raise XModelError(f"op {n!r} is in two subgraphs ({seen[n]!r}, {c.name!r})")
                seen[n] = c.name

    # ---- protobuf ----------------------------------------------------------------------------
    @classmethod
    def from_proto(cls, g: pb.Graph) -> "Graph":
        graph = cls(g.graph_name)
        graph.attrs = Attrs.from_proto(g.graph_attr)
        for n in g.op_node:
            t = n.output_tensor
            tensor = Tensor(t.tensor_name, list(t.tensor_dim), t.data_type, t.tensor_bit_width,
                            Attrs.from_proto(t.tensor_attr))
            ins: OrderedDict[str, list[str]] = OrderedDict()
            for a in n.args:
                ins.setdefault(a.arg_name, []).extend(a.arg_ops)
            if n.op_name in graph.ops:
                raise XModelError(f"XIR_MULTI_DEFINED_OP: op {n.op_name!r} defined twice")
            graph.ops[n.op_name] = Op(n.op_name, n.op_type, Attrs.from_proto(n.op_attr), ins, tensor)
        graph.op_defs = [pb.OpDef.FromString(d.SerializeToString()) for d in g.op_defs]

        def conv(s: pb.SubGraph, parent) -> Subgraph:
            sg = Subgraph(s.subgraph_name, list(s.op_name), Attrs.from_proto(s.subg_attr), [], parent)
            sg.children = [conv(c, sg) for c in s.subg_child]
            return sg

        graph.root = conv(g.subg_root, None)
        graph._link_subgraphs()
        return graph

    def _link_subgraphs(self) -> None:
        """Let every subgraph find its graph (VART's create_runner takes a subgraph alone)."""
        for s in self.root.walk():
            s.graph = self

    def to_proto(self) -> pb.Graph:
        g = pb.Graph()
        g.graph_name = self.name
        self.attrs.to_proto(g.graph_attr, f"graph {self.name!r}")
        for op in self.ops.values():
            n = g.op_node.add()
            n.op_name = op.name
            n.op_type = op.type
            op.attrs.to_proto(n.op_attr, f"op {op.name!r}")
            for arg, producers in op.inputs.items():
                a = n.args.add()
                a.arg_name = arg
                a.arg_ops.extend(producers)
            t = op.output
            if t is not None:
                n.output_tensor.tensor_name = t.name
                n.output_tensor.tensor_dim.extend(int(d) for d in t.shape)
                n.output_tensor.data_type = t.data_type
                n.output_tensor.tensor_bit_width = t.bit_width
                t.attrs.to_proto(n.output_tensor.tensor_attr, f"tensor {t.name!r}")

        def conv(sg: Subgraph, out: pb.SubGraph) -> None:
            out.subgraph_name = sg.name
            out.op_name.extend(sg.ops)
            sg.attrs.to_proto(out.subg_attr, f"subgraph {sg.name!r}")
            for c in sg.children:
                conv(c, out.subg_child.add())

        conv(self.root, g.subg_root)
        for d in self.op_defs:
            g.op_defs.add().CopyFrom(d)
        return g

    def serialize(self) -> bytes:
        return self.to_proto().SerializeToString(deterministic=True)   # map order fixed: reproducible bytes

    def save(self, path: str) -> None:
        data = self.serialize()
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    @classmethod
    def deserialize(cls, data: bytes, source: str = "<bytes>") -> "Graph":
        """A Graph from serialized bytes; anything unreadable or inconsistent is an XModelError that names
        `source` and what is wrong (never a protobuf, numpy or Python error)."""
        if not data:
            raise XModelError(f"{source}: not an xmodel (empty file)")
        g = pb.Graph()
        try:
            g.ParseFromString(data)
        except (DecodeError, ValueError, RuntimeError, RecursionError) as e:
            why = " ".join(str(e).split()) or type(e).__name__
            raise XModelError(f"{source}: not an xmodel (protobuf decode failed: {why})") from None
        if not g.graph_name and not g.op_node:
            raise XModelError(f"{source}: not an xmodel (no graph name and no ops)")
        try:
            graph = cls.from_proto(g)
            graph.validate()
        except XModelError as e:
            raise XModelError(f"{source}: {e}") from None
        except RecursionError:
            raise XModelError(f"{source}: subgraph tree nested too deeply") from None
        return graph

    @classmethod
    def load(cls, path: str) -> "Graph":
        if os.path.isdir(path):
            raise XModelError(f"cannot read xmodel {path}: is a directory, not a file")
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_XMODEL_BYTES + 1)
        except FileNotFoundError:
            raise XModelError(f"cannot read xmodel {path}: no such file") from None
        except OSError as e:
            raise XModelError(f"cannot read xmodel {path}: {e.strerror or e}") from None
        if len(data) > MAX_XMODEL_BYTES:
            raise XModelError(f"xmodel {path} is larger than {MAX_XMODEL_BYTES} bytes")
        return cls.deserialize(data, path)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.ops)} ops, {len(self.root.children)} subgraphs)"


def dump_stem(name: str) -> str:
    """Tensor / layer name -> dump file stem, as UG1414's golden dumps ('/' -> '_')."""
    return name.replace("/", "_")


def load(path: str) -> Graph:
    return Graph.load(path)
