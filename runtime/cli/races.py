"""`opendpu races`: the token race check of every DPU subgraph (isa.deps)."""
from __future__ import annotations

import time

from opendpu.runtime.cli.common import _load_graph, _select_dpu_subgraphs, add_verb, int_range


def register(sub) -> None:
    rc = add_verb(sub, "races", "token race check: conflicting accesses of different engines that no token path "
                                "orders")
    rc.add_argument("model", help="a compiled .xmodel")
    rc.add_argument("--subgraph", help="only this DPU subgraph")
    rc.add_argument("--limit", type=int_range(1, 100000), default=20, metavar="N",
                    help="report at most this many races per subgraph")
    rc.set_defaults(fn=run)


def run(a) -> int:
    """Token race check of every DPU subgraph: conflicting accesses that the dpdon/dpdby tokens leave unordered."""
    from opendpu.isa.deps import KeySpace, find_races
    from opendpu.isa.footprint import program_footprints
    from opendpu.runtime.dpu import DpuSubgraph
    g = _load_graph(a.model)
    dpus = [DpuSubgraph(g, sg) for sg in _select_dpu_subgraphs(g, a.model, a.subgraph)]
    for d in dpus:
        d.validate()
    bad = 0
    for d in dpus:
        t0 = time.perf_counter()
        fps = program_footprints(d.instructions, d.target, d.reg_sizes)
        races = find_races(d.instructions, fps, d.target, limit=a.limit)
        dt = time.perf_counter() - t0
        space = KeySpace(d.target)
        head = f"{d.name}: {len(d.instructions)} instructions on {d.target.name}"
        if not races:
            print(f"RACE-FREE {head}: every conflicting access (exact bank lines and DDR bytes) is ordered by "
                  f"tokens ({dt:.2f} s)")
            continue
        bad += 1
        more = f" (first {a.limit})" if len(races) >= a.limit else ""
        print(f"RACES {head}: {len(races)} unordered conflict(s){more} ({dt:.2f} s)")
        for r in races:
            if r.kind == "wait":
                print(f"  {r}")
                continue
            i, j = r.first, r.second
            assert r.key is not None                    # a conflict (not a wait) names its line or byte
            print(f"  {r.kind} instruction {i} ({d.instructions[i].op}) -> instruction {j} "
                  f"({d.instructions[j].op}) on {space.describe(r.key)}: no token path orders them")
    return 1 if bad else 0
