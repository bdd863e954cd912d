"""Memory planning in DDR: what a DPU subgraph reads and writes (its interface), and where every feature map's
image lives: graph inputs in REG_IN, outputs in REG_OUT, intermediates in the workspace (REG_1), concat members
written in place into their concat's image, reshapes sharing their source's image, strided slices as views of
their input's image, slack before images a channel-augmented conv reads with left padding.

`SubgraphPlan` (the `plan` step) is the analysis: kinds, interface, members, aliases, slack; `MemoryPlan` is one
emission's allocation state over it (the images of intermediates are allocated on first use, in emission order,
so an intermediate kept on chip by a fusion gets none)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from opendpu.compiler.codegen.loadsave import AUG_MASK_BYTES
from opendpu.compiler.codegen.ir import (DDR_ALIGN, REG_IN, REG_OUT, REG_WORKSPACE, CodegenError, FMap, ceil_div,
                                         concat_axis, data_inputs, dense, fix_point, hwc, member_view, pads, pair,
                                         tensor)
from opendpu.compiler.codegen.kinds import ALIAS, CONCAT, CONV, MEMBER_KINDS, SKIP, SKIP_TYPES
from opendpu.compiler.program import DdrImage
from opendpu.compiler.xir.graph import Graph, Op
from opendpu.isa.target import Target


def slice_box(graph: Graph, op: Op) -> tuple[tuple[int, int, int], tuple[int, int]]:
    """((y0, x0, c0), (stride_h, stride_w)) of a strided_slice-fix realised as a view of its input's image
    (LOAD addressing: offset, pixel and row strides); CodegenError for slices a view cannot express."""
    x = [int(v) for v in tensor(graph.ops[data_inputs(op)[0]]).shape]
    y = [int(v) for v in tensor(op).shape]
    begin = [int(v) for v in op.get("begin", [])]
    strides = [int(v) for v in op.get("strides", [1] * len(begin))]
    if len(x) != 4 or len(begin) != 4 or len(strides) != 4:
        raise CodegenError(f"op {op.name!r}: strided_slice of a {len(x)}-D tensor with {len(begin)} bounds "
                           f"(a view needs 4-D NHWC begin/end/strides)")
    if x[0] != 1 or begin[0] != 0 or strides[0] != 1 or strides[3] != 1 or min(strides) < 1:
        raise CodegenError(f"op {op.name!r}: strided_slice begin {begin} strides {strides}: the batch must stay "
                           f"whole and the channel stride be 1")
    b = [min(max(v if v >= 0 else v + d, 0), d) for v, d in zip(begin, x)]
    for ax in (1, 2, 3):
        if b[ax] + (y[ax] - 1) * strides[ax] >= x[ax]:
            raise CodegenError(f"op {op.name!r}: strided_slice {begin}/{strides} of {x} cannot give {y}")
    if fix_point(op) != fix_point(graph.ops[data_inputs(op)[0]]):
        raise CodegenError(f"op {op.name!r}: strided_slice changes the fix point (a view cannot rescale)")
    return (b[1], b[2], b[3]), (strides[1], strides[2])


def slice_view(graph: Graph, op: Op, src: FMap) -> FMap:
    """The image of a strided_slice-fix: a window of its input's image (no instructions)."""
    (y0, x0, c0), (sh, sw) = slice_box(graph, op)
    h, w, ch = hwc(tensor(op).shape)
    return FMap(src.reg, src.at(y0, x0, c0), h, w, ch, src.pix * sw, src.row * sh, src.fp)


def image(n: str, f: FMap, dims) -> DdrImage:
    d = tuple(int(v) for v in dims)
    if len(d) == 4:
        st: tuple[int, ...] = (f.h * f.row, f.row, f.pix, 1)
    else:
        st = tuple(int(math.prod(d[i + 1:])) for i in range(len(d)))
        if not f.dense:
            raise CodegenError(f"tensor {n!r}: a {len(d)}-D tensor must be dense")
    return DdrImage(n, f.reg, f.addr, d, st, f.fp)


@dataclass(frozen=True)
class SubgraphPlan:
    """The plan step of one DPU subgraph: the ops' kinds, the ops that emit (`compute`, topological order), the
    interface (inputs produced outside, outputs read outside or graph outputs), the concat members written in
    place (`member_of`: op -> (concat, offset along its axis)), the reshapes (`alias_of`: op -> source) and the
    images that get slack before them."""

    name: str
    target: Target
    ops: frozenset[str]
    kinds: dict[str, str]
    compute: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    member_of: dict[str, tuple[str, int]]
    alias_of: dict[str, str]
    slack: frozenset[str]

    def to_dict(self) -> dict:
        """The plan as JSON-able data (`--dump-after codegen_plan`)."""
        return {"name": self.name, "kinds": dict(self.kinds), "inputs": list(self.inputs),
                "outputs": list(self.outputs), "concat_members": {k: list(v) for k, v in self.member_of.items()},
                "aliases": dict(self.alias_of), "slack": sorted(self.slack)}


def _slack(graph: Graph, compute: list[str], kinds: dict[str, str]) -> set[str]:
    """Images read by a conv that may be channel-augmented with left padding: the first LOAD item of a row starts
    pl*IC bytes before the row (masked, never read; spec §6.2), so they get DDR_ALIGN bytes of slack before them."""
    slack: set[str] = set()
    for n in compute:
        op = graph.ops[n]
        if kinds[n] == CONV and data_inputs(op):
            x = data_inputs(op)[0]
            kw_, _ = pair(op, "kernel", [1, 1])
            sw_, _ = pair(op, "stride", [1, 1])
            pl_ = pads(op)[0]
            if pl_ > 0 and 2 <= kw_ and sw_ <= kw_ and kw_ * hwc(tensor(graph.ops[x]).shape)[2] <= AUG_MASK_BYTES:
                slack.add(x)
    return slack


def _members(graph: Graph, ops: set[str], compute: list[str], kinds: dict[str, str],
             out_set: set[str]) -> dict[str, tuple[str, int]]:
    """Concat members written in place: a compute op in the subgraph whose only role is feeding the concat."""
    member_of: dict[str, tuple[str, int]] = {}
    for n in compute:
        if kinds[n] != CONCAT:
            continue
        c0 = 0
        axis = concat_axis(graph.ops[n])
        for i in data_inputs(graph.ops[n]):
            io = graph.ops[i]
            ok = (i in ops and kinds.get(i) in MEMBER_KINDS and i not in out_set and i not in member_of
                  and fix_point(io) == fix_point(graph.ops[n])
                  and all(kinds.get(cn) != ALIAS for cn in graph.consumers(i)))
            if ok:
                member_of[i] = (n, c0)
            c0 += hwc(tensor(io).shape)[axis]
    return member_of


def plan_subgraph(graph: Graph, op_names: list[str], target: Target, name: str, kinds: dict[str, str],
                  slack_for_aug: bool) -> SubgraphPlan:
    """The plan step: the interface, members, aliases and slack of the ops `op_names` of kinds `kinds`."""
    ops = set(op_names)
    order = [n for n in graph.toposort() if n in ops]
    compute = [n for n in order if kinds[n] != SKIP]
    if not compute:
        raise CodegenError(f"subgraph {name!r} has no op to compile")
    inputs: list[str] = []
    for n in compute:
        for i in graph.ops[n].input_ops():
            if i not in ops and graph.ops[i].type not in SKIP_TYPES and i not in inputs:
                inputs.append(i)
    outputs = [n for n in compute if not graph.consumers(n) or any(cn not in ops for cn in graph.consumers(n))]
    alias_of = {n: data_inputs(graph.ops[n])[0] for n in compute if kinds[n] == ALIAS}
    member_of = _members(graph, ops, compute, kinds, set(outputs))
    slack = _slack(graph, compute, kinds) if slack_for_aug else set()
    return SubgraphPlan(name, target, frozenset(ops), dict(kinds), tuple(compute), tuple(inputs), tuple(outputs),
                        member_of, alias_of, frozenset(slack))


@dataclass
class MemoryPlan:
    """One emission's DDR images over a `SubgraphPlan`: register sizes so far and op -> image."""

    graph: Graph
    plan: SubgraphPlan
    sizes: dict[int, int] = field(default_factory=lambda: {REG_IN: 0, REG_OUT: 0, REG_WORKSPACE: 0})
    fm: dict[str, FMap] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Inputs, then outputs (their registers); then a reshape shares its source's image (in reverse order, so
        chains of aliases share one image) unless the source is an interface tensor, a concat member or an output
        itself."""
        g, p = self.graph, self.plan
        for i in p.inputs:
            o = g.ops[i]
            dims = tuple(int(v) for v in tensor(o).shape)
            self.fm[i] = dense(REG_IN, self.alloc(REG_IN, math.prod(dims), DDR_ALIGN if i in p.slack else 0), dims,
                               fix_point(o))
        for n in p.outputs:
            self.place(n)
        for n in reversed(p.compute):
            a_src = p.alias_of.get(n)
            if (a_src is None or a_src not in p.ops or a_src in p.outputs or a_src in p.member_of
                    or a_src in self.fm):
                continue
            f = self.place(n)
            self.fm[a_src] = dense(f.reg, f.addr, tensor(g.ops[a_src]).shape, fix_point(g.ops[a_src]))

    def alloc(self, reg: int, nbytes: int, pre: int = 0) -> int:
        a = ceil_div(self.sizes[reg], DDR_ALIGN) * DDR_ALIGN + pre
        self.sizes[reg] = a + nbytes
        return a

    def workspace(self, nbytes: int) -> int:
        return self.alloc(REG_WORKSPACE, nbytes)

    def place(self, n: str) -> FMap:
        """The image of op n's output (allocated on first use)."""
        if n in self.fm:
            return self.fm[n]
        o = self.graph.ops[n]
        dims = tuple(int(v) for v in tensor(o).shape)
        if n in self.plan.member_of:
            cat, c0 = self.plan.member_of[n]
            f = member_view(self.place(cat), concat_axis(self.graph.ops[cat]), c0, dims, fix_point(o))
        else:
            reg = REG_OUT if n in self.plan.outputs else REG_WORKSPACE
            f = dense(reg, self.alloc(reg, math.prod(dims), DDR_ALIGN if n in self.plan.slack else 0), dims,
                      fix_point(o))
        self.fm[n] = f
        return f

    def image(self, n: str) -> DdrImage:
        return image(n, self.fm[n], tensor(self.graph.ops[n]).shape)

    def to_dict(self) -> dict:
        """The images placed so far (JSON-able)."""
        return {"sizes": {str(k): v for k, v in self.sizes.items()},
                "images": {n: {"reg": f.reg, "addr": f.addr, "hwc": [f.h, f.w, f.c], "pix": f.pix, "row": f.row,
                               "fp": f.fp} for n, f in self.fm.items()}}
