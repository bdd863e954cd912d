"""Downsample back-propagation: compute a tensor only where strided 1x1 consumers read it (docs/compiler.md).

A 1x1 conv with stride s and no padding reads only the pixels (s*i, s*j) of its input. When every consumer of a
tensor reads it that way, its producer can compute just those pixels: a stride-1 conv becomes a stride-s conv
(its output at (i, j) is the old output at (s*i, s*j), whatever its kernel and padding), an eltwise op becomes the
same op on its inputs' picked pixels, and the consumers become stride 1. AMD's compiler does the same on ResNet-50
(UG1414's vaitrace table names the rows `..._downsample_bp_by_fake_downsample_N`). An eltwise input that is also
read elsewhere at full resolution gets an explicit pick, a 1x1 max pool with stride s (exact: one value per window,
same fix point). Every value the graph's outputs depend on is unchanged, bit for bit; the work of the rewritten
ops shrinks by s*s (on the Caffe ResNet-50: 7.716 -> 6.985 GOP). Only FLOOR-mode windows are moved: there a
stride-s output has ceil(n / s) pixels, exactly the picked ones.
"""
from __future__ import annotations

import copy
from collections import OrderedDict

from opendpu.compiler.xir.graph import Attrs, Graph, Op, Tensor


def _pair(v, default):
    if v is None:
        return list(default)
    return [int(x) for x in v]


def _pick_stride(g: Graph, consumer: str, producer: str) -> int | None:
    """s if `consumer` reads `producer` only at the pixels (s*i, s*j), s > 1 (a 1x1 conv or pool with stride s
    on both axes and no padding, `producer` as its only feature-map input); else None."""
    op = g.ops[consumer]
    if op.type not in ("conv2d-fix", "pool-fix") or op.inputs.get("input") != [producer]:
        return None
    if any(producer in v for k, v in op.inputs.items() if k != "input"):
        return None
    if _pair(op.attrs.get("kernel"), (0, 0)) != [1, 1] or any(_pair(op.attrs.get("pad"), (0, 0, 0, 0))):
        return None
    if op.type == "pool-fix" and (op.attrs.get("global") or str(op.attrs.get("type", "")).upper() != "MAX"):
        return None
    if op.type == "conv2d-fix" and (_pair(op.attrs.get("dilation"), (1, 1)) != [1, 1] or op.attrs.get("group", 1) != 1):
        return None
    if not _floor(op):
        return None
    sh, sw = _pair(op.attrs.get("stride"), (1, 1))
    if sh != sw or sh < 2:
        return None
    src, dst = g.ops[producer].output, op.output
    if src is None or dst is None or len(src.shape) != 4 or len(dst.shape) != 4 \
            or list(dst.shape[1:3]) != _strided_shape(list(src.shape), sh)[1:3]:
        return None                                   # reads other pixels than (s*i, s*j) for every i, j < ceil(n/s)
    return sh


def _floor(op: Op) -> bool:
    """FLOOR pad mode (the canonical graph's only one for convs and pools), or none given."""
    return str(op.attrs.get("pad_mode", "FLOOR")).upper() == "FLOOR"


def _strided_shape(shape: list[int], s: int) -> list[int]:
    n, h, w, c = shape
    return [n, -(-h // s), -(-w // s), c]


def _unstride(g: Graph, consumer: str, producer: str) -> str | None:
    """Make `consumer` read `producer` at stride 1; a pick pool is removed (its consumers read `producer`).
    Returns the removed op's name, if any."""
    op = g.ops[consumer]
    if op.type == "pool-fix":
        for c in g.consumers(consumer):
            cop = g.ops[c]
            for k, v in cop.inputs.items():
                cop.inputs[k] = [producer if x == consumer else x for x in v]
        del g.ops[consumer]
        g._consumers = None
        return consumer
    op.attrs.set("stride", [1, 1], op.attrs.kind("stride"))
    return None


def _add_pick(g: Graph, x: str, s: int, name: str) -> str:
    """A 1x1 max pool with stride s on `x` (the pixels (s*i, s*j) of x, same fix point), inserted after x."""
    t = g.ops[x].output
    assert t is not None
    out = Tensor(name, _strided_shape(list(t.shape), s), t.data_type, t.bit_width, _attrs(t.attrs))
    g.add_op(name, "pool-fix", {"input": [x]},
             {"type": "MAX", "kernel": [1, 1], "stride": [s, s], "pad": [0, 0, 0, 0], "pad_mode": "FLOOR",
              "global": False}, out)
    # keep the toposort order readable: move the pick right after its producer
    order = list(g.ops)
    order.remove(name)
    order.insert(order.index(x) + 1, name)
    g.ops = type(g.ops)((k, g.ops[k]) for k in order)
    g._consumers = None
    return name


def _attrs(a: Attrs) -> Attrs:
    b = Attrs(a)
    b.kinds = dict(a.kinds)
    return b


def clone(g: Graph) -> Graph:
    """A copy of `g` whose ops, attributes, inputs and tensors can be edited without touching `g` (attribute
    values, e.g. const data, are shared: nothing here edits them in place)."""
    h = Graph(g.name)
    h.attrs = _attrs(g.attrs)
    h.op_defs = list(g.op_defs)
    h.root = copy.deepcopy(g.root)
    for name, op in g.ops.items():
        t = op.output
        out = None if t is None else Tensor(t.name, list(t.shape), t.data_type, t.bit_width, _attrs(t.attrs))
        h.ops[name] = Op(op.name, op.type, _attrs(op.attrs), OrderedDict((k, list(v)) for k, v in op.inputs.items()),
                         out)
    return h


def downsample_bp(g: Graph, protected: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Rewrite `g` in place (module docstring); `protected` ops (graph outputs) keep their resolution. Returns
    one line per rewritten op."""
    done: list[str] = []
    for _ in range(len(g.ops) + 1):                          # each round rewrites one producer; bounded
        hit = None
        for name in reversed(g.toposort()):
            op = g.ops[name]
            cons = g.consumers(name)
            if name in protected or not cons or op.output is None or len(op.output.shape) != 4:
                continue
            strides = {_pick_stride(g, c, name) for c in cons}
            if len(strides) != 1 or None in strides:
                continue
            s = strides.pop()
            assert s is not None
            if op.type == "conv2d-fix" or op.type == "depthwise-conv2d-fix":
                if (_pair(op.attrs.get("stride"), (1, 1)) != [1, 1] or _pair(op.attrs.get("dilation"), (1, 1)) != [1, 1]
                        or not _floor(op)):
                    continue
                hit = (name, s, "conv")
            elif op.type == "eltwise-fix":
                hit = (name, s, "eltwise")
            if hit:
                break
        if hit is None:
            return done
        name, s, kind = hit
        op = g.ops[name]
        assert op.output is not None
        old = list(op.output.shape)
        op.output.shape = _strided_shape(old, s)
        removed = [r for c in list(g.consumers(name)) if (r := _unstride(g, c, name))]
        if kind == "conv":
            op.attrs.set("stride", [s, s], op.attrs.kind("stride"))
            done.append(f"{name}: stride {s} ({old[1]}x{old[2]} -> {op.output.shape[1]}x{op.output.shape[2]})"
                        + (f", pick {', '.join(removed)} removed" if removed else ""))
        else:
            picks = {}
            for k, v in op.inputs.items():
                new = []
                for x in v:
                    if x not in picks:
                        picks[x] = _add_pick(g, x, s, _free_name(g, f"{x}_downsample_bp"))
                    new.append(picks[x])
                op.inputs[k] = new
            g._consumers = None
            done.append(f"{name}: on the stride-{s} picks of {', '.join(picks)} ({old[1]}x{old[2]} -> "
                        f"{op.output.shape[1]}x{op.output.shape[2]})")
    raise AssertionError("downsample_bp did not converge")    # pragma: no cover - one producer per round


def _free_name(g: Graph, base: str) -> str:
    name, k = base, 1
    while name in g.ops:
        name, k = f"{base}_{k}", k + 1
    return name
