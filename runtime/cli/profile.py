"""`opendpu profile`: the cycle model's profile of a compiled xmodel (vaitrace-like summary, trace, figures)."""
from __future__ import annotations

import csv
import os

from opendpu.compiler.outdir import check_file
from opendpu.runtime.cli.common import (CliError, _board, _board_timing, _check_target, _clock_mhz_type,
                                            _load_graph, _load_plugins, _select_dpu_subgraphs, _warm_kernels,
                                            _write_announced, add_plugin, add_verb, input_file, timing_overrides)


def register(sub) -> None:
    pr = add_verb(sub, "profile", "cycle-model profile: vaitrace text summary, trace, plot, JSON/CSV")
    pr.add_argument("model", help="a compiled .xmodel")
    pr.add_argument("--target", help="preset, fingerprint or arch.json (may carry a 'timing' object); "
                                     "must match the model's fingerprint")
    pr.add_argument("--clock-mhz", type=_clock_mhz_type(), metavar="MHZ", help="core clock (default from the target)")
    pr.add_argument("--timing", action="append", metavar="KEY=VALUE",
                    help="override a timing parameter (docs/microarchitecture.md), e.g. ddr_latency=80")
    pr.add_argument("--trace", metavar="T.json", help="write a Chrome/Perfetto trace JSON (one track per engine)")
    pr.add_argument("--json", metavar="P.json", help="write the profile as JSON")
    pr.add_argument("--csv", metavar="P.csv", help="write the DPU summary rows as CSV")
    pr.add_argument("--instructions", metavar="I.csv", help="write one CSV row per instruction")
    pr.add_argument("--plot", metavar="P.png", help="write the figure: engine lanes with layer bands, per-layer "
                                                  "cycles coloured by the bounding engine (.png/.svg/.pdf)")
    pr.add_argument("--txt", metavar="P.txt", help="also write the text summary to this file")
    pr.add_argument("--roofline", metavar="R.png", help="write the per-layer roofline: ops per DDR byte against "
                                                        "achieved GOP/s under the peak and DDR roofs")
    pr.add_argument("--board", help="board profile: clock, cores, DDR, host overhead and the DPU timing fitted on "
                                    "silicon (zcu102, zcu104, kv260, kr260; docs/calibration.md), given to the "
                                    "program's own array whatever it is (a B3136 design on a KR260); also prints the "
                                    "board's fps with all its cores")
    pr.add_argument("--compare", metavar="OTHER.xmodel", help="a second program of the same graph (AMD's, or "
                                                              "another configuration): layer-by-layer side by side")
    pr.add_argument("--compare-csv", metavar="S.csv", help="write the side-by-side rows as CSV")
    add_plugin(pr)
    pr.set_defaults(fn=run)


def run(a) -> int:
    from opendpu.runtime.profile import PLOT_FORMATS, format_side_by_side, profile_graph, side_by_side
    input_file(a.model, "model")
    if a.compare:
        input_file(a.compare, "--compare model")
    # the board's timing, for the program's own array; --timing / --clock-mhz override it
    tm = {**_board_timing(a), **timing_overrides(a.timing, a.clock_mhz)}
    inputs = [a.model] + ([a.target] if a.target and os.path.isfile(a.target) else []) + list(a.op_plugin or []) \
        + ([a.compare] if a.compare else [])
    outs = (("trace", (".json",)), ("json", (".json",)), ("csv", (".csv",)), ("instructions", (".csv",)),
            ("plot", tuple("." + f for f in PLOT_FORMATS)), ("roofline", tuple("." + f for f in PLOT_FORMATS)),
            ("txt", (".txt",)), ("compare_csv", (".csv",)))
    seen: dict[str, str] = {}
    for opt, suffixes in outs:
        path = getattr(a, opt)
        if path:
            flag = "--" + opt.replace("_", "-")
            check_file(path, suffixes=suffixes, inputs=inputs, what=flag)
            key = os.path.abspath(path)
            if key in seen:
                raise CliError(f"{flag} {path}: the same file is also the {seen[key]} output")
            seen[key] = flag
    if a.compare_csv and not a.compare:
        raise CliError("--compare-csv needs --compare OTHER.xmodel")
    _load_plugins(a.op_plugin)
    g = _load_graph(a.model)
    from opendpu.runtime.dpu import DpuSubgraph
    dpus = [DpuSubgraph(g, sg) for sg in _select_dpu_subgraphs(g, a.model)]
    from opendpu.isa.target import get_target
    tgt = get_target(a.target) if a.target else None
    for dpu in dpus:
        if a.target:
            _check_target(dpu, a.target)
        dpu.validate(tgt)
    other = None
    if a.compare:
        other = _load_graph(a.compare)
        odpus = [DpuSubgraph(other, sg) for sg in _select_dpu_subgraphs(other, a.compare)]
        for d in odpus:
            d.validate(None)
    _warm_kernels()
    prof = profile_graph(g, target=tgt, timing=tm, model=os.path.basename(a.model))
    text = prof.table()
    print(text)
    for sp in prof.subgraphs:
        s = sp.schedule
        busy = s.engine_busy()
        q = sp.attribution_quality()
        print(f"\n{sp.name}: {len(s)} instructions on {sp.target.name}, {s.total_cycles} cycles, "
              f"{s.latency_ms:.3f} ms at {s.clock_mhz:g} MHz; engine busy "
              + ", ".join(f"{k} {100 * v / max(1, s.total_cycles):.0f}%" for k, v in busy.items())
              + f"; layer attribution matched {q['matched']}/{q['compute_ops']} compute ops")
        bank = {k: v["bank"] for k, v in s.engine_stalls().items() if v["bank"]}
        if bank:                            # cycles lost to the bank-port arbitration (docs/bank-ports.md)
            print("  bank-port stalls: " + ", ".join(f"{k} {v}" for k, v in bank.items()) + " cycles")
    if a.board:
        board = _board(a)
        print("\n" + board.applied_to([sp.target for sp in prof.subgraphs]))
        tp = prof.throughput()
        tmg = prof.subgraphs[0].target.timing
        print(f"board {a.board}: {tmg.cores} core(s) at {tmg.clock_mhz:g} MHz, {tmg.frame_overhead_us} us per DPU "
              f"run; host {tp.host_us:.0f} us per frame ({tp.io_bytes / 1e3:.1f} kB in and out) on {tmg.cpu_threads} "
              f"thread(s) at {tmg.cpu_mhz} MHz; DDR {tmg.board_ddr_mbps} MB/s x {tmg.ddr_efficiency_pct} %")
        print(f"board {a.board}: single-thread {tp.fps_single:.1f} fps ({tp.latency_ms:.3f} ms per frame: DPU "
              f"{tp.dpu_ms:.3f} + host {tp.host_us / 1e3:.3f}); multi-thread {tp.fps:.1f} fps ({tp.bound}-bound; "
              f"{tp.ddr_bytes / 1e6:.2f} MB per frame, {tp.ddr_mbps:.0f} MB/s of DDR) [docs/calibration.md]")
    side = None
    if other is not None:
        oprof = profile_graph(other, timing=tm, model=os.path.basename(a.compare))
        try:
            side = side_by_side(prof, oprof)
        except ValueError as e:
            raise CliError(f"--compare {a.compare}: {e}") from None
        both = sum(1 for r in side[:-1] if r["rt_ms_a"] is not None and r["rt_ms_b"] is not None)
        print("\n" + format_side_by_side(side, a.model, a.compare))
        print(f"{both} layer(s) in both programs, {len(side) - 1 - both} in one only")
        if a.board:
            print(f"--compare {a.compare}: " + _board(a).applied_to([sp.target for sp in oprof.subgraphs]))

    def write_txt(p):
        with open(p, "w") as f:
            f.write(text + "\n")

    def write_side(p):
        from opendpu.runtime.profile import SIDE_COLUMNS
        with open(p, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(SIDE_COLUMNS))
            w.writeheader()
            for r in side or []:
                w.writerow({k: ("" if r[k] is None else r[k]) for k in SIDE_COLUMNS})
    for path, fn, what in ((a.trace, prof.write_trace, "Perfetto trace"), (a.json, prof.write_json, "JSON"),
                           (a.csv, prof.write_csv, "CSV"),
                           (a.instructions, prof.write_instructions_csv, "per-instruction CSV"),
                           (a.plot, prof.plot, "plot"), (a.roofline, prof.roofline, "roofline"),
                           (a.txt, write_txt, "text summary"), (a.compare_csv, write_side, "side-by-side CSV")):
        if path:
            _write_announced(path, fn, what)
    return 0
