"""`opendpu cosim`: the RTL (Verilator or cocotb) against the cycle model, byte and cycle exact, on an xmodel's DPU
subgraphs or on random generated programs."""
from __future__ import annotations

import os
import time

import numpy as np

from opendpu.compiler.outdir import check_dir
from opendpu.runtime.cli.common import (_OUT_RULE, CliError, _load_graph, _select_dpu_subgraphs, _stem,
                                            _warm_kernels, add_force, add_seed, add_verb, input_file, int_range,
                                            timing_overrides)


def register(sub) -> None:
    cs = add_verb(sub, "cosim", "co-simulate the RTL against the cycle model (bytes and cycles)")
    cs.add_argument("model", nargs="?", help="a compiled .xmodel (every DPU subgraph, random inputs); or none with "
                                             "--samples N")
    cs.add_argument("--target", help="preset, fingerprint or arch.json (must match the model's bank layout)")
    cs.add_argument("--timing", action="append", metavar="KEY=VALUE", help="override a timing parameter")
    cs.add_argument("--subgraph", help="only this DPU subgraph")
    cs.add_argument("--samples", "--random", dest="samples", type=int_range(1, 10000), metavar="N",
                    help="N (at least 1) random programs (sim.progen) instead of an xmodel (--random: the older "
                         "spelling)")
    cs.add_argument("--bank-conflicts", action="store_true",
                    help="random programs crowd their image accesses onto two banks of group 0, so the bank-port "
                         "arbiter is exercised (docs/bank-ports.md)")
    cs.add_argument("--instructions", type=int_range(2, 100000), default=None, metavar="N",
                    help="about this many instructions per random program (default: 60; a final SAVE and END "
                         "are added)")
    add_seed(cs, "the inputs / random programs")
    cs.add_argument("--rtl-sim", default="verilator", choices=("verilator", "cocotb-verilator", "cocotb-icarus"),
                    help="RTL simulator flow (cocotb-icarus is ~46x slower; cocotb-verilator builds very slowly, "
                         "docs/rtl.md)")
    cs.add_argument("--waves", metavar="DIR", nargs="?", const="waveforms",
                    help="on a mismatch, dump a VCD window around the first divergence into DIR (default DIR: "
                         "waveforms; " + _OUT_RULE + ")")
    add_force(cs)
    cs.set_defaults(fn=run)


def run(a) -> int:
    """RTL vs cycle model on an xmodel's DPU subgraphs, or on random generated programs."""
    from opendpu.isa.target import get_target
    from opendpu.runtime.progress import progress_bar
    from opendpu.runtime.cosim import check_target_matches, cosim_programs, dump_waves, subgraph_program, waves_names
    if a.bank_conflicts and not a.samples:
        raise CliError("--bank-conflicts applies to random programs (--samples/--random N) only")
    if a.model and a.samples:
        raise CliError(f"give either an xmodel ({a.model}) or --samples/--random N random programs, not both")
    if not a.model and not a.samples:
        raise CliError("give an xmodel, or --samples/--random N random programs with --target")
    if a.model:
        input_file(a.model, "model")
        if a.instructions is not None:
            raise CliError("--instructions applies to random programs (--samples/--random N) only")
    elif a.subgraph:
        raise CliError("--subgraph applies to an xmodel, not to random programs (--samples/--random N)")
    tm = timing_overrides(a.timing)
    if a.waves:
        check_dir(a.waves, force=a.force, inputs=[a.model] if a.model else [], what="--waves directory")
    programs = []
    if a.samples:
        if not a.target:
            raise CliError("--samples/--random needs --target (a preset, fingerprint or arch.json)")
        from opendpu.sim.progen import random_program
        t = get_target(a.target)
        t = t.with_timing(**tm) if tm else t
        n = a.instructions if a.instructions is not None else 60
        for i in range(a.samples):
            gp = random_program(t, n, seed=a.seed + i, bank_conflicts=a.bank_conflicts)
            kind = ", bank-conflict mode" if a.bank_conflicts else ""
            programs.append((f"random seed {a.seed + i} ({len(gp.instructions)} instructions{kind})", gp.instructions,
                             gp.reg_sizes, gp.reg_init))
        groups = [(t, programs)]
    else:
        from opendpu.runtime.dpu import DpuSubgraph
        g = _load_graph(a.model)
        rng = np.random.default_rng(a.seed)
        groups = []
        for sg in _select_dpu_subgraphs(g, a.model, a.subgraph):
            dsg = DpuSubgraph(g, sg)
            t = dsg.target
            if a.target:
                want = get_target(a.target)
                check_target_matches(dsg.target, want, f"subgraph {sg.name!r}")
                t = want
            t = t.with_timing(**tm) if tm else t
            dsg.validate(t)
            xs = [rng.integers(-128, 128, size=s.dims, dtype=np.int8) for s in dsg.inputs]
            instrs, sizes, init = subgraph_program(dsg, xs)
            groups.append((t, [(sg.name, instrs, sizes, init)]))
    if a.waves:                 # the window files any program may write: checked before any run
        check_dir(a.waves, force=a.force, inputs=[a.model] if a.model else [], what="--waves directory",
                  names=sorted({n for _, progs in groups for p in progs for n in waves_names(p[0])}))
    _warm_kernels()
    bad = 0
    for t, progs in groups:
        t0 = time.perf_counter()
        with progress_bar(f"cosim on {a.rtl_sim}") as prog:
            reps = cosim_programs(t, progs, backend=a.rtl_sim, progress=prog)
        dt = time.perf_counter() - t0
        for rep, prog_ in zip(reps, progs):
            print(rep.summary())
            if not rep.ok:
                bad += 1
                if a.waves:
                    os.makedirs(a.waves, exist_ok=True)
                    path = dump_waves(t, prog_, rep, a.waves, backend=a.rtl_sim)
                    from opendpu.compiler.outdir import record
                    record(a.waves, list(waves_names(prog_[0])), net=_stem(a.model) if a.model else "random")
                    print(f"wrote the waveform window to {path} (+ .gtkw)")
        print(f"{len(reps)} program(s) on {t.name or t.describe()}: {sum(r.ok for r in reps)} match; "
              f"{dt:.1f} s wall including build")
    return 1 if bad else 0
