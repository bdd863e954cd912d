"""`opendpu check`: every DPU subgraph on the cycle model's executor against the XIR reference, on random inputs."""
from __future__ import annotations

from opendpu.runtime.cli.common import (_check_target, _load_graph, _load_plugins, _select_dpu_subgraphs,
                                            _warm_kernels, add_plugin, add_seed, add_verb, input_file, int_range)


def register(sub) -> None:
    c = add_verb(sub, "check", "compare sim and ref on random inputs for every DPU subgraph")
    c.add_argument("model", help="a compiled .xmodel")
    c.add_argument("--samples", "-n", dest="samples", type=int_range(1, 100000), default=2, metavar="N",
                   help="random inputs per DPU subgraph (-n: the older spelling)")
    add_seed(c, "the random inputs")
    c.add_argument("--target", help="preset name, fingerprint or arch.json (must match the model)")
    add_plugin(c)
    c.set_defaults(fn=run)


def run(a) -> int:
    from opendpu.runtime.dpu import DpuSubgraph
    from opendpu.runtime.flow import check_subgraphs
    from opendpu.runtime.progress import progress_bar
    input_file(a.model, "model")
    _load_plugins(a.op_plugin)
    g = _load_graph(a.model)
    dpus = [DpuSubgraph(g, sg) for sg in _select_dpu_subgraphs(g, a.model)]
    for dpu in dpus:
        if a.target is not None:
            _check_target(dpu, a.target)
        dpu.validate()
    checks = check_subgraphs(dpus, a.samples, a.seed, progress=progress_bar, warm=_warm_kernels, log=print)
    return 0 if all(c.ok for c in checks) else 1
