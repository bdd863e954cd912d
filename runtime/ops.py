"""CPU-side op evaluation for the runners: the XIR reference ops plus user-registered custom ops.

A custom op (the seeds' `Mylayer`, `PPScatterV2`, …) is registered from Python with
`register_op("Mylayer", fn)`, where `fn(op, inputs) -> np.ndarray` gets the `compiler.xir.graph.Op`
(attributes in `op.attrs`, output shape in `op.output.shape`) and the input arrays in argument order —
the Python counterpart of VART's `libvart_op_imp_<type>.so` `calculate(out, ins)`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from opendpu.compiler.xir.graph import Graph, Op, Tensor, XModelError
from opendpu.isa.errors import OpenDpuError

_REGISTRY: dict[str, Callable[[Op, list[np.ndarray]], np.ndarray]] = {}


class OpError(OpenDpuError, RuntimeError):
    """An op the runtime cannot evaluate; the message names the op and what to do."""


def output_of(op: Op) -> Tensor:
    """The output tensor of `op` (XIR allows an op without one; every op the runtime reads has one)."""
    if op.output is None:
        raise OpError(f"op {op.name!r} ({op.type}) has no output tensor")
    return op.output


def register_op(op_type: str, fn: Callable[[Op, list[np.ndarray]], np.ndarray]) -> None:
    """Register a Python implementation for an XIR op type (overrides the built-in one)."""
    if not callable(fn):
        raise TypeError(f"register_op({op_type!r}): implementation must be callable")
    _REGISTRY[op_type] = fn


def unregister_op(op_type: str) -> None:
    _REGISTRY.pop(op_type, None)


def registered_ops() -> list[str]:
    return sorted(_REGISTRY)


def registry_snapshot() -> dict:
    """The registry as it is (op type -> implementation), for `restore_registry` after a plugin failed."""
    return dict(_REGISTRY)


def restore_registry(snapshot: dict) -> None:
    """Undo every registration since `registry_snapshot()` (a plugin that failed half-way registers nothing)."""
    _REGISTRY.clear()
    _REGISTRY.update(snapshot)


def _identity(op: Op, ins: list[np.ndarray]) -> np.ndarray:
    return ins[0]


def _const(op: Op, ins: list[np.ndarray]) -> np.ndarray:
    data = op.attrs.get("data")
    if not data:
        raise OpError(f"const op {op.name!r} carries no data (stripped consts live in a DPU parameter blob)")
    if not isinstance(data, (bytes, bytearray)):
        raise OpError(f"const op {op.name!r}: attribute data is a {type(data).__name__}, not bytes")
    dt = output_of(op).numpy_dtype
    shape = [int(d) for d in output_of(op).shape]
    n = int(np.prod(shape)) if shape else 1
    if len(data) != n * dt.itemsize:
        raise OpError(f"const op {op.name!r}: {len(data)} bytes of data for shape {shape} of {dt} "
                      f"({n * dt.itemsize} bytes)")
    return np.frombuffer(bytes(data), dtype=dt).reshape(shape)


_BUILTIN = {"upload": _identity, "download": _identity, "identity": _identity, "const": _const,
            "const-fix": _const}


def _origin(fn) -> str:
    """' registered from FILE' for a user implementation (an --op-plugin module), '' for a built-in one."""
    if fn in _BUILTIN.values():
        return ""
    import inspect
    try:
        where: str | None = inspect.getfile(fn if inspect.isroutine(fn) else type(fn))
    except TypeError:                   # a built-in callable: no file, at most a module name
        where = getattr(fn, "__module__", None)
    return f" registered from {where}" if where else ""


def evaluate_op(graph: Graph, op: Op, inputs: list[np.ndarray]) -> np.ndarray:
    """Value of `op`'s output tensor given its input values (in `op.input_ops()` order)."""
    from opendpu.compiler.ref import ops as ref
    fn = _REGISTRY.get(op.type) or _BUILTIN.get(op.type)
    shape = tuple(int(d) for d in output_of(op).shape)
    if fn is not None:
        try:
            out = fn(op, list(inputs))
        except (OpError, XModelError):            # a built-in op's own error already names the op
            raise
        except SystemExit as e:  # sys.exit() in a registered implementation must not end the run as a success
            raise OpError(f"op {op.name!r} ({op.type}): the implementation{_origin(fn)} called sys.exit({e.code!r}); "
                          f"an op implementation returns an array or raises an exception") from None
        except Exception as e:   # a user implementation failing is reported with the op named
            msg = " ".join(str(e).split())
            raise OpError(f"op {op.name!r} ({op.type}): implementation{_origin(fn)} raised {type(e).__name__}: "
                          f"{msg}") from e
        try:
            out = np.asarray(out)
        except Exception as e:  # noqa: BLE001 - whatever a user implementation returned
            raise OpError(f"op {op.name!r} ({op.type}): implementation returned a {type(out).__name__}, not an "
                          f"array ({type(e).__name__})") from e
        if out.dtype.kind not in "biuf":
            raise OpError(f"op {op.name!r} ({op.type}): implementation returned dtype {out.dtype}, not numbers "
                          f"(the graph says {output_of(op).dtype_name})")
        if out.shape != shape:
            if out.size == int(np.prod(shape)):
                out = out.reshape(shape)
            else:
                raise OpError(f"op {op.name!r} ({op.type}): implementation returned shape {list(out.shape)}, "
                              f"the graph says {list(shape)}")
        return out.astype(output_of(op).numpy_dtype, copy=False)
    if op.type not in ref.SUPPORTED:
        raise OpError(f"op {op.name!r} has type {op.type!r}, which opendpu does not implement; register a "
                      f"Python implementation with runtime.register_op({op.type!r}, fn) where "
                      f"fn(op, inputs) -> numpy array of shape {list(shape)}")
    in_fix = [output_of(graph.ops[p]).fix_point if output_of(graph.ops[p]).is_fixed else None for p in op.input_ops()]
    out_fix = output_of(op).fix_point if output_of(op).is_fixed else None
    attrs = dict(op.attrs)
    try:
        return ref.evaluate(op.type, list(inputs), attrs, in_fix, out_fix, shape, name=op.name)
    except ref.RefError as e:
        raise OpError(str(e)) from None
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError, FloatingPointError,
            MemoryError) as e:
        # the reference op could not use this op's attributes or inputs (a corrupted or hand-edited xmodel);
        # the cause stays chained for OPENDPU_DEBUG tracebacks
        msg = " ".join(str(e).split())[:200]
        raise OpError(f"op {op.name!r} ({op.type}): cannot evaluate it with its attributes "
                      f"{sorted(op.attrs)[:8]} and input shapes {[list(np.shape(x)) for x in inputs]}: "
                      f"{type(e).__name__}: {msg}") from e


def unimplemented_ops(graph: Graph, op_names) -> list[tuple[str, str]]:
    """(op name, op type) of the ops in `op_names` that neither the reference nor a registered custom op can
    evaluate: checked before a run, so a missing custom op is reported before any work is done."""
    from opendpu.compiler.ref import ops as ref
    return [(n, graph.ops[n].type) for n in op_names
            if graph.ops[n].type not in _REGISTRY and graph.ops[n].type not in _BUILTIN
            and graph.ops[n].type not in ref.SUPPORTED]
