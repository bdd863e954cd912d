"""Disassembly of a DPU subgraph: `isa.disasm.disasm` with the subgraph's target, register sizes and the
xmodel layer of every instruction.

Layer names come from the compiler's exact instruction -> layer map when the program carries one
(`opendpu_layer_map`, programs compiled by opendpu), else from the profiler's attribution (runtime/profile.py:
the layers are the child subgraphs in `children_topological_sort` order; compute instructions fill their ops in
order, LOADs/SAVEs follow the tokens) on a timing-only schedule. A program whose schedule cannot be built (e.g. a
CONV before any CONVINIT, a deadlock), or whose mc_code does not decode, is listed without layer names.
"""
from __future__ import annotations

from opendpu.compiler.xir.graph import Graph, Subgraph, XModelError
from opendpu.isa.disasm import disasm
from opendpu.isa.target import Target, TargetError
from opendpu.runtime.dpu import DpuSubgraph, RuntimeErrorDPU, _reg_map


def layer_names(dpu: DpuSubgraph) -> list[str | None] | None:
    """Layer (child subgraph) name of every instruction through the first END, or None when the program's
    schedule cannot be built or the subgraph has no layers."""
    from opendpu.runtime.profile import _attribute, _layers_of, exact_layer_map
    from opendpu.sim.executor import ExecError
    from opendpu.sim.timing import DeadlockError, WatchdogError, simulate
    exact = exact_layer_map(dpu)
    if exact is not None:               # compiled by opendpu: the compiler's own map, no schedule needed
        return list(exact)
    layers = _layers_of(dpu)
    if not layers:
        return None
    try:
        sched = simulate(dpu.arrays, dpu.target)
    except (ExecError, DeadlockError, WatchdogError):
        return None
    lay = _attribute(dpu, sched, layers)
    return [layers[int(k)].name if 0 <= int(k) < len(layers) else None for k in lay]


def _fallback(sg: Subgraph) -> tuple[Target | None, dict[int, int] | None, bytes]:
    """Target, register sizes and mc_code of a subgraph that DpuSubgraph refuses (e.g. bad mc_code)."""
    try:
        target = Target.from_fingerprint(int(sg.attrs["dpu_fingerprint"]))
    except (KeyError, TypeError, ValueError, TargetError):
        target = None
    try:
        sizes = {k: int(v) for k, v in _reg_map(sg, "reg_id_to_size").items()}
    except (RuntimeErrorDPU, TypeError, ValueError):
        sizes = None
    return target, sizes, bytes(sg.attrs.get("mc_code") or b"")


def disasm_subgraph(graph: Graph, subgraph: Subgraph | DpuSubgraph, header: bool = False) -> str:
    """Listing of one DPU subgraph (a Subgraph of `graph` or a DpuSubgraph): per instruction its index, its
    assembly (or `<invalid: reason>`), `; layer NAME` and `; ! ...` static-check findings (isa.disasm.disasm).
    `header` adds a first line `# subgraph NAME (TARGET, N instructions)`."""
    if isinstance(subgraph, DpuSubgraph):
        dpu, sg = subgraph, subgraph.sg
    else:
        sg = subgraph
        try:
            dpu = DpuSubgraph(graph, sg)
        except (RuntimeErrorDPU, XModelError):
            dpu = None
    target: Target | None
    sizes: dict[int, int] | None
    if dpu is not None:
        target, sizes, mc = dpu.target, dict(dpu.reg_sizes), dpu.mc_code
        names = layer_names(dpu)
    else:
        target, sizes, mc = _fallback(sg)
        names = None
    text = disasm(mc, target, sizes, names)
    if header:
        n = sum(1 for line in text.splitlines() if line.strip() and not line.lstrip().startswith(";"))
        tname = target.name if target is not None else "unknown target"
        text = f"# subgraph {sg.name} ({tname}, {n} instructions)\n" + text
    return text


__all__ = ["disasm_subgraph", "layer_names"]
