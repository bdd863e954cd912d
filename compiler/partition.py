"""Partition a canonical quantized graph into USER, DPU and CPU subgraphs (vai_c's partition step, UG1414).

Every op is placed first:
* `data` / `data-fix` ops are graph inputs: one USER subgraph each.
* `const` / `const-fix` ops (weights, biases, constant operands) go with the subgraph of their consumers.
* `fix2float` / `float2fix` and every float op (a type without `-fix`) run on the CPU: they compute in float.
* a `*-fix` op goes to the DPU when `compiler.rules.place` puts it there *and* the code generator can compile it
  (`compiler.codegen.unsupported` returns None: the legality registry's check of its kind and the tiling planners'
  check of its jobs, nothing emitted); otherwise to the CPU, with the reason.

Then the placed ops are grouped, in topological order: an op joins the subgraph of its producers of the same
device when that creates no cycle between subgraphs (a DPU op whose path to another DPU op passes through a CPU op
is not merged with it, nor are two subgraphs joined by a path through another one). What remains connected of the
DPU ops forms the DPU subgraphs, likewise for the CPU. `Partition.summary()` is vai_c's
"Total device subgraph number N, DPU subgraph number M"; `Partition.cpu_ops` lists each CPU op with its reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from opendpu.compiler.rules import OpDesc, Placement, place
from opendpu.compiler.xir.graph import Graph, Op
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import Target

USER, DPU, CPU = "USER", "DPU", "CPU"
DATA_TYPES = ("data", "data-fix")
CONST_TYPES = ("const", "const-fix")
BOUNDARY_TYPES = ("upload", "download")       # written by the compiler; never in a graph it compiles
_WEIGHT_ARGS = ("weights", "bias")            # inputs of conv-like ops that are not feature maps


class PartitionError(OpenDpuError, ValueError):
    """A graph that cannot be partitioned (a compiled graph, a const shared across devices, ...)."""


# the code generator's refusal hook: (graph, op name, target) -> None when it can compile the op, else a reason
Unsupported = Callable[[Graph, str, Target], "str | None"]


def op_desc(graph: Graph, op: Op) -> OpDesc:
    """A graph op as `compiler.rules.OpDesc`: XIR type and attributes, NHWC shapes of its feature-map inputs (every
    input but `weights` / `bias`), output shape and weight shape (OHWI; depthwise [mult, kh, kw, C])."""
    ins = [p for arg, ps in op.inputs.items() if arg not in _WEIGHT_ARGS for p in ps]
    w = op.inputs.get("weights") or []
    return OpDesc(op.name, op.type, dict(op.attrs), [shape_of(graph, p) for p in ins], shape_of(graph, op.name),
                  shape_of(graph, w[0]) if w else None)


def shape_of(graph: Graph, name: str) -> list[int]:
    """The shape of op `name`'s output tensor ([] when it has none)."""
    t = graph.ops[name].output
    return [int(d) for d in t.shape] if t is not None else []


@dataclass(frozen=True)
class OpPlacement:
    device: str                 # USER, DPU or CPU; "" for a const (it follows its consumers)
    reason: str                 # DPU: what it maps to; CPU: why not the DPU
    hint: str = ""
    engine: str = ""


def _is_fix(op: Op) -> bool:
    return op.type.endswith("-fix") and op.type not in DATA_TYPES + CONST_TYPES


def place_op(graph: Graph, name: str, target: Target, unsupported: Unsupported) -> OpPlacement:
    """Where one op runs, and why (see the module docstring)."""
    op = graph.ops[name]
    t = op.type
    if t in BOUNDARY_TYPES:
        raise PartitionError(f"op {name!r} is an {t} op: the graph is already compiled (recompile it from its "
                             f"DPU subgraphs instead)")
    if t in DATA_TYPES:
        return OpPlacement(USER, "graph input (host buffer)")
    if t in CONST_TYPES:
        return OpPlacement("", "constant: goes with its consumers")
    if t == "fix2float":
        return OpPlacement(CPU, "fix2float: fixed point -> float32 for the float CPU ops after it")
    if t == "float2fix":
        return OpPlacement(CPU, "float2fix: float32 -> fixed point (DPU rounding) for the ops after it")
    p: Placement = place(op_desc(graph, op), target)
    if not _is_fix(op):
        if p.device == CPU:
            return OpPlacement(CPU, p.reason, p.hint)
        return OpPlacement(CPU, f"float op {t}: not quantized (it computes in float32 on the CPU)",
                           "quantize it (the quantizer leaves an op in float when its rules put it on the CPU)")
    if p.device != DPU:
        return OpPlacement(CPU, p.reason, p.hint)
    out = op.output
    if out is None or not out.is_fixed:
        return OpPlacement(CPU, f"{t} with a {out.dtype_name if out is not None else 'missing'} output tensor "
                                f"(the DPU writes fixed-point tensors)")
    why = unsupported(graph, name, target)
    if why:
        return OpPlacement(CPU, f"the code generator cannot compile it: {why}", engine=p.engine)
    return OpPlacement(DPU, p.reason, engine=p.engine)


@dataclass
class SubgraphPlan:
    """One child of the root subgraph: its name, device and ops (topological order, consts before their first
    consumer)."""

    name: str
    device: str
    ops: list[str]


@dataclass
class Partition:
    graph: Graph
    target: Target
    subgraphs: list[SubgraphPlan]                       # topological order of the subgraphs
    placement: dict[str, OpPlacement] = field(default_factory=dict)
    subgraph_of: dict[str, str] = field(default_factory=dict)   # op -> subgraph name

    @property
    def dpu_subgraphs(self) -> list[SubgraphPlan]:
        return [s for s in self.subgraphs if s.device == DPU]

    @property
    def cpu_ops(self) -> list[tuple[str, str, OpPlacement]]:
        """(op name, op type, placement) of every op on the CPU, in graph order."""
        return [(n, self.graph.ops[n].type, self.placement[n]) for n in self.graph.toposort()
                if self.placement[n].device == CPU]

    def summary(self) -> str:
        return (f"Total device subgraph number {len(self.subgraphs)}, "
                f"DPU subgraph number {len(self.dpu_subgraphs)}")

    def report(self) -> list[str]:
        """The partition log: the summary, one line per subgraph, one line per CPU op with its reason."""
        lines = [self.summary()]
        for s in self.subgraphs:
            lines.append(f"  {s.device:4s} {s.name}: {len(s.ops)} ops")
        for n, t, p in self.cpu_ops:
            lines.append(f"  CPU op {n} ({t}): {p.reason}" + (f" [hint: {p.hint}]" if p.hint else ""))
        return lines

    def to_dict(self) -> dict:
        return {"summary": self.summary(),
                "subgraphs": [{"name": s.name, "device": s.device, "ops": list(s.ops)} for s in self.subgraphs],
                "cpu_ops": [{"op": n, "type": t, "reason": p.reason, "hint": p.hint} for n, t, p in self.cpu_ops]}


class _Groups:
    """Union-find over op groups of one device, with the cycle test of the quotient graph."""

    def __init__(self, graph: Graph, index: dict[str, int]):
        self.g, self.index = graph, index
        self.parent: dict[int, int] = {}
        self.members: dict[int, list[str]] = {}
        self.device: dict[int, str] = {}
        self.of: dict[str, int] = {}

    def find(self, k: int) -> int:
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def group(self, op: str) -> int | None:
        k = self.of.get(op)
        return None if k is None else self.find(k)

    def new(self, op: str, device: str) -> int:
        k = len(self.parent)
        self.parent[k] = k
        self.members[k] = [op]
        self.device[k] = device
        self.of[op] = k
        return k

    def _succ(self, k: int) -> set[int]:
        out = set()
        for m in self.members[k]:
            for c in self.g.consumers(m):
                gc = self.group(c)
                if gc is not None:
                    out.add(gc)
        return out

    def creates_cycle(self, merged: set[int]) -> bool:
        """Would joining the groups `merged` into one make a path from it back to itself through another group?"""
        stack = [s for k in merged for s in self._succ(k) if s not in merged]
        seen = set(stack)
        while stack:
            k = stack.pop()
            for s in self._succ(k):
                if s in merged:
                    return True
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
        return False

    def union(self, ks: list[int]) -> int:
        root = min(ks)
        for k in ks:
            if k != root:
                self.parent[k] = root
                self.members[root].extend(self.members.pop(k))
        return root


def _name(prefix_op: str, taken: set[str]) -> str:
    base = f"subgraph_{prefix_op}"
    name, k = base, 1
    while name in taken:
        name = f"{base}_{k}"
        k += 1
    taken.add(name)
    return name


def _representative(graph: Graph, ops: list[str], device: str) -> str:
    """The op a subgraph is named after (as vai_c): the first compute op of a DPU subgraph, the first op of a CPU
    subgraph that is no fix2float / float2fix (else its first op)."""
    body = [n for n in ops if graph.ops[n].type not in CONST_TYPES] or ops
    if device == CPU:
        main = [n for n in body if graph.ops[n].type not in ("fix2float", "float2fix")]
        return (main or body)[0]
    return body[0]


def default_unsupported() -> Unsupported:
    """The code generator's own refusal hook (`compiler.codegen.unsupported`: legality, without emitting)."""
    from opendpu.compiler.codegen import unsupported
    return unsupported


def partition(graph: Graph, target: Target, unsupported: Unsupported | None = None) -> Partition:
    """Place every op of `graph` (a canonical `*-fix` graph, root subgraph only) and group the ops into USER, DPU
    and CPU subgraphs without cycles between them. `unsupported` is the code generator's refusal hook (default
    `compiler.codegen.unsupported`)."""
    check = unsupported or default_unsupported()
    order = graph.toposort()
    index = {n: i for i, n in enumerate(order)}
    placement = {n: place_op(graph, n, target, check) for n in order}
    groups = _Groups(graph, index)
    for n in order:
        dev = placement[n].device
        if dev == "" or dev == USER:
            continue
        mine = groups.new(n, dev)
        cands: list[int] = []
        for p in graph.ops[n].input_ops():
            gp = groups.group(p)
            if gp is not None and groups.device[gp] == dev and gp not in cands:
                cands.append(gp)
        if not cands:
            continue
        if not groups.creates_cycle(set(cands) | {mine}):
            groups.union(cands + [mine])
            continue
        for c in cands:                      # all at once would close a cycle: join the first group that does not
            if not groups.creates_cycle({c, mine}):
                groups.union([c, mine])
                break
    # USER subgraphs (one per data op), then consts with their consumers' group
    sub_of_op: dict[str, tuple] = {}   # op -> ("user", data op) or ("group", group id)
    for n in order:
        if placement[n].device == USER:
            sub_of_op[n] = ("user", n)
        elif placement[n].device:
            sub_of_op[n] = ("group", groups.group(n))
    for n in order:
        if placement[n].device != "":
            continue
        homes = {sub_of_op[c] for c in graph.consumers(n)}
        if not homes:
            raise PartitionError(f"const op {n!r} has no consumer; remove it from the graph")
        if len(homes) > 1:
            names = sorted(graph.consumers(n))
            raise PartitionError(f"const op {n!r} feeds ops {names[:4]} of different subgraphs; give each of them "
                                 f"its own copy of the constant")
        sub_of_op[n] = homes.pop()
    # the subgraphs: ops in graph order, consts first-used order; subgraphs in topological order
    ops_of: dict[tuple, list[str]] = {}
    for n in order:
        ops_of.setdefault(sub_of_op[n], []).append(n)
    keys = list(ops_of)
    owner = {n: k for k, ns in ops_of.items() for n in ns}
    deps = {k: {owner[p] for n in ops_of[k] for p in graph.ops[n].input_ops() if owner[p] != k} for k in keys}
    done: set = set()
    ordered: list = []
    pending = list(keys)            # ties of the topological sort: USER subgraphs first (as vai_c), then graph order
    pending.sort(key=lambda k: (k[0] != "user", min(index[n] for n in ops_of[k])))
    while pending:
        k = next((k for k in pending if deps[k] <= done), None)
        if k is None:               # the grouping never closes a cycle; this is a bug if it happens
            raise PartitionError(f"the subgraphs of {graph.name!r} form a cycle")
        ordered.append(k)
        done.add(k)
        pending.remove(k)
    taken: set[str] = set()
    plans = []
    for k in ordered:
        dev = USER if k[0] == "user" else groups.device[k[1]]
        ops = ops_of[k]
        plans.append(SubgraphPlan(_name(_representative(graph, ops, dev), taken), dev, ops))
    part = Partition(graph, target, plans, placement)
    part.subgraph_of = {n: s.name for s in plans for n in s.ops}
    return part


# ---- DPU coverage: MACs and ops on the DPU ------------------------------------------------------------------
PSEUDO_TYPES = DATA_TYPES + CONST_TYPES + BOUNDARY_TYPES + ("fix", "fix2float", "float2fix")   # not counted as ops
_CONV_TYPES = ("conv2d", "conv")
_DW_TYPES = ("depthwise-conv2d", "dwconv2d")
_TCONV_TYPES = ("transposed-conv2d", "conv2d-transpose")
_TDW_TYPES = ("transposed-depthwise-conv2d", "depthwise-transposed-conv2d")
_DENSE_TYPES = ("matmul", "inner-product", "gemm", "dense")


def _base_type(t: str) -> str:
    t = str(t).strip().lower()
    return (t[:-4] if t.endswith("-fix") else t).replace("_", "-")


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _kernel_hw(d: OpDesc) -> tuple[int, int]:
    """(kh, kw) from attrs["kernel"] ([w, h]), else from the OHWI weight shape; (0, 0) when neither is readable."""
    k = d.attrs.get("kernel")
    try:
        if k is not None:
            kv = [int(v) for v in (k if isinstance(k, (list, tuple)) else [k, k])]
            return kv[1], kv[0]
        if d.weight_shape and len(d.weight_shape) == 4:
            return int(d.weight_shape[1]), int(d.weight_shape[2])
    except (TypeError, ValueError, IndexError):
        pass
    return 0, 0


def op_macs(d: OpDesc) -> int:
    """Multiply-accumulates of one op (NHWC `OpDesc`): conv out·kh·kw·Cin/group, depthwise out·kh·kw, transposed
    conv in·kh·kw·Cout (depthwise: ·Cout/Cin), dense out·K; 0 for every other op (pools, eltwise, moves, ...)."""
    t = _base_type(d.type)
    out = [int(v) for v in d.out_shape or []]
    x = [int(v) for v in d.in_shapes[0]] if d.in_shapes and d.in_shapes[0] else []
    if t == "onnx-op":              # an ONNX node kept on the CPU: the quantizer counted its MACs
        try:
            return max(0, int(d.attrs.get("macs", 0) or 0))
        except (TypeError, ValueError):
            return 0
    if not out:
        return 0
    kh, kw = _kernel_hw(d)
    try:
        group = max(1, int(d.attrs.get("group", 1) or 1))
    except (TypeError, ValueError):
        group = 1
    if t in _CONV_TYPES:
        cin = x[-1] if x else (int(d.weight_shape[-1]) * group if d.weight_shape else 0)
        return _prod(out) * kh * kw * cin // group
    if t in _DW_TYPES:
        return _prod(out) * kh * kw
    if t in _TCONV_TYPES + _TDW_TYPES:
        if not x:
            return 0
        per_in = out[-1] // x[-1] if t in _TDW_TYPES else out[-1] // group
        return _prod(x) * kh * kw * per_in
    if t in _DENSE_TYPES and x:
        rows = _prod(out) // out[-1] if out[-1] else 0
        return _prod(out) * (_prod(x) // rows) if rows else 0
    return 0


def coverage_of(rows) -> dict:
    """DPU coverage of placed ops, `rows` = (OpDesc, device, reason) in graph order: MACs and ops (pseudo ops such
    as data / const / fix2float skipped) in total and on the DPU, percentages, and every CPU op with its reason."""
    macs_total = macs_dpu = ops_total = ops_dpu = 0
    cpu = []
    for d, device, reason in rows:
        if _base_type(d.type) in PSEUDO_TYPES or d.attrs.get("layout_only"):   # NCHW<->NHWC around a CPU op
            continue
        m = op_macs(d)
        ops_total += 1
        macs_total += m
        if device == DPU:
            ops_dpu += 1
            macs_dpu += m
        elif device == CPU:
            cpu.append({"name": d.name, "type": d.type, "reason": reason})
    return {"macs_total": macs_total, "macs_dpu": macs_dpu,
            "macs_dpu_pct": 100.0 * macs_dpu / macs_total if macs_total else None,
            "ops_total": ops_total, "ops_dpu": ops_dpu,
            "ops_dpu_pct": 100.0 * ops_dpu / ops_total if ops_total else None,
            "cpu_ops": cpu}


def coverage(part: Partition) -> dict:
    """The DPU coverage of a partitioned graph (`coverage_of` over its ops and their placements); meta.json's
    "coverage"."""
    g = part.graph
    return coverage_of((op_desc(g, g.ops[n]), part.placement[n].device, part.placement[n].reason)
                       for n in g.toposort())


def target_label(target: Target) -> str:
    """A target's short name for the coverage line: B4096 for the preset DPUCZDX8G_ISA1_B4096, else its name."""
    size = target.size_name
    return size if target.name in ("", f"DPUCZDX8G_ISA1_{size}") else target.name


def _pct_text(p: float) -> str:
    """A percentage with one decimal that never shows 100.0 or 0.0 unless it is exact."""
    if 99.95 <= p < 100:
        return ">99.9"
    if 0 < p < 0.05:
        return "<0.1"
    return f"{p:.1f}"


def _mac_text(dpu: int, total: int) -> str:
    unit, div = next(((u, v) for u, v in (("GMAC", 1e9), ("MMAC", 1e6), ("kMAC", 1e3)) if total >= v), ("MAC", 1))
    return f"{dpu / div:.3g} {unit} of {total / div:.3g}"


def format_coverage(cov: dict, label: str, limit: int = 5) -> str:
    """The one-line coverage summary: `DPU coverage (B4096): 99.2 % of MACs (1.23 GMAC of 1.24), 57/60 ops; 3 ops
    on the CPU: softmax (reason), ...` (at most `limit` CPU ops named)."""
    if cov["macs_total"]:
        macs = f"{_pct_text(cov['macs_dpu_pct'])} % of MACs ({_mac_text(cov['macs_dpu'], cov['macs_total'])})"
    else:
        macs = "no MACs"
    s = f"DPU coverage ({label}): {macs}, {cov['ops_dpu']}/{cov['ops_total']} ops"
    cpu = cov["cpu_ops"]
    if not cpu:
        return s + ", none on the CPU"
    shown = []
    for c in cpu[:limit]:
        r = " ".join(str(c["reason"]).split())
        shown.append(f"{c['name']} ({r[:97] + '...' if len(r) > 100 else r})")
    more = f", and {len(cpu) - limit} more" if len(cpu) > limit else ""
    return s + f"; {len(cpu)} op{'s' if len(cpu) != 1 else ''} on the CPU: " + ", ".join(shown) + more


__all__ = ["partition", "place_op", "op_desc", "shape_of", "Partition", "SubgraphPlan", "OpPlacement", "PartitionError",
           "USER", "DPU", "CPU", "PSEUDO_TYPES", "op_macs", "coverage", "coverage_of", "format_coverage",
           "target_label"]
