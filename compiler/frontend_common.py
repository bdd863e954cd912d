"""The front end's shared pieces: its error, the tensor and attribute copies every converter makes, and the name
allocator of a graph built from another (compiler/frontend.py describes the forms and the conversions)."""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from opendpu.compiler.xir.graph import DATA_TYPE_CODES, Attrs, Graph, Op, Tensor
from opendpu.isa.errors import OpenDpuError


class FrontendError(OpenDpuError, ValueError):
    """An input graph the front end cannot turn into the canonical form; the message names the graph and the op."""


XINT = DATA_TYPE_CODES["XINT"]
FLOAT = DATA_TYPE_CODES["FLOAT"]


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


def _nl(v: Any) -> str:
    return str(v or "NONE").upper()


def _as_float(v: Any) -> float | None:
    try:
        return float(v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v)
    except (TypeError, ValueError, IndexError):
        return None

