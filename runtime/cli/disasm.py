"""`opendpu disasm`: the DPU instructions of a compiled xmodel in text assembly."""
from __future__ import annotations

import sys

from opendpu.runtime.cli.common import _load_graph, _select_dpu_subgraphs, add_verb


def register(sub) -> None:
    d = add_verb(sub, "disasm", "print the DPU instructions in text assembly (index, instruction, layer, findings)")
    d.add_argument("model", help="a compiled .xmodel")
    d.add_argument("--subgraph", help="only this DPU subgraph")
    d.set_defaults(fn=run)


def run(a) -> int:
    from opendpu.runtime.disasm import disasm_subgraph
    g = _load_graph(a.model)
    sgs = _select_dpu_subgraphs(g, a.model, a.subgraph)
    out = sys.stdout
    for sg in sgs:
        text = disasm_subgraph(g, sg)
        out.write(f"# subgraph {sg.name}\n")
        out.write(text if text.endswith("\n") else text + "\n")
    return 0
