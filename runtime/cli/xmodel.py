"""`opendpu xmodel`: a summary of an xmodel's graph, subgraphs, DPU attributes and registers."""
from __future__ import annotations

from opendpu.runtime.cli.common import _load_graph, add_verb


def register(sub) -> None:
    x = add_verb(sub, "xmodel", "summary of graph, subgraphs, DPU attributes and registers")
    x.add_argument("model", help="an .xmodel (quantized or compiled)")
    x.add_argument("-v", "--verbose", action="store_true", help="list the ops of DPU subgraphs too")
    x.set_defaults(fn=run)


def run(a) -> int:
    from opendpu.runtime.dpu import DpuSubgraph
    g = _load_graph(a.model)
    lines = [f"graph {g.name}: {len(g.ops)} ops, {len(g.root.children)} subgraphs"]
    for sg in g.toposort_child_subgraphs():      # everything is read first: a bad subgraph prints nothing
        ops = g.toposort(sg.all_ops())
        lines.append(f"subgraph {sg.name}  device={sg.device}  ops={len(ops)}")
        if sg.device == "DPU":
            d = DpuSubgraph(g, sg)
            lines.append(f"  dpu_name={sg.get('dpu_name')} fingerprint=0x{d.fingerprint:016X} target={d.target.name}")
            lines.append(f"  instructions={len(d.instructions)} mc_code={len(d.mc_code)} B "
                         f"workload={sg.get('workload')}")
            for r in sorted(d.reg_sizes):
                lines.append(f"  REG_{r}: {d.reg_context.get(r, '?'):10s} {d.reg_sizes[r]} B"
                             + (f" (parameters {len(d.params[r])} B)" if r in d.params else ""))
            for kind, ts in (("input ", d.inputs), ("output", d.outputs)):
                for t in ts:
                    lines.append(f"  {kind} {t.name} {list(t.dims)} {t.dtype} fix_point={t.fix_point} "
                                 f"REG_{t.reg_id}+{t.ddr_addr}")
        if a.verbose or sg.device != "DPU":
            for n in ops:
                op = g.ops[n]
                t = op.output
                lines.append(f"    {op.type:22s} {n}  -> {list(t.shape)} {t.dtype_name}"
                             + (f" fix_point={t.fix_point}" if t.fix_point is not None else ""))
    print("\n".join(lines))
    return 0
