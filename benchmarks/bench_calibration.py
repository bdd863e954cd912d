"""Calibration of the cycle model against published silicon figures (issue 16, docs/calibration.md).

Table 1: UG1414's vaitrace ResNet-50 table (Figure 37) beside our profile of the zoo's Caffe ResNet-50 compiled for
B4096, row by row (runtime/calibration.py groups our layers onto AMD's rows), at the board's clock, with the fitted
per-row launch overhead of vaitrace's fine-grained mode; RT within 25 %, total RT, LdWB within 5 %.
Table 1b: our LdWB beside the LdWB implied by UG1414's newer profile of the same network (Figure 34's Mem IO).
Table 2: the fit of the DPU's global timing parameters (ddr_latency, conv_latency; never one parameter per layer) on
that table: each grid point compiled for its timing and compared; the board profiles carry the fit (isa/boards.py).
Table 3: PG338's fps table beside the fps of our compiled zoo models on the board (sim/multicore.py), out of sample.
Table 4: the board model (host threads, DPU cores, shared DDR) fitted on the training families of the Vitis AI 2.5
Model Zoo's single- and multi-thread fps (ZCU102, ZCU104, KV260) and scored on the held-out families
(runtime/boardfit.py), with a plot of predicted against measured fps.
Table 5: PG338's I/O bandwidth table (one core, average and peak MB/s) beside ours.

Models are the zoo's float ONNX with deterministic random weights (timing does not depend on weights), quantized with
4 random calibration images; nothing is downloaded.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))         # tests/compile_helpers.py

from compile_helpers import quantized  # noqa: E402
from opendpu.compiler.pipeline import compile as compile_graph  # noqa: E402
from opendpu.isa.boards import BOARDS, UG1414_DPU_TIMING, get_board  # noqa: E402
from opendpu.quant import zoo  # noqa: E402
from opendpu.runtime import boardfit as bf  # noqa: E402
from opendpu.runtime import calibration as cal  # noqa: E402
from opendpu.runtime.costmodel import cycle_model  # noqa: E402
from opendpu.runtime.profile import profile_graph, profile_summary  # noqa: E402
from opendpu.runtime.sweep.cache import default_cache_dir  # noqa: E402


GRID_DDR_LATENCY = (20, 30, 45, 60)
GRID_CONV_LATENCY = (16, 48, 64, 80, 96, 112, 128, 160)


def compiled(name: str, target, size=None):
    t0 = time.perf_counter()
    res = compile_graph(quantized(name, size or zoo.DEFAULT_SIZE[name]), target, name=name, cycles=cycle_model)
    return res.graph, time.perf_counter() - t0


def _fmt_point(p: bf.Point, train: bool) -> str:
    e = p.est
    return (f"{p.topo.row:28s} {p.meas.board:7s} {'train' if train else 'held':5s} {e.dpu_ms:7.2f} "
            f"{e.host_us / 1e3:6.2f} {p.meas.single:8.1f} {e.fps_single:8.1f} {100 * p.err_single:+6.1f}% "
            f"{p.meas.multi:8.1f} {e.fps:8.1f} {100 * p.err_multi:+6.1f}% {e.bound:>4s}")


def zoo25_table(t, cache: str, plot: str | None) -> dict:
    """Table 4: the board model fitted on the training families of the Vitis AI 2.5 Model Zoo's fps tables and
    scored on the held-out families."""
    pts = bf.points(bf.load_table())
    train = [p for p in pts if p.topo.family in bf.TRAIN_FAMILIES]
    held = [p for p in pts if p.topo.family not in bf.TRAIN_FAMILIES]
    print(f"\nTable 4: Vitis AI 2.5 Model Zoo fps (../shared/reference/model-zoo-2.5-fps.csv): {len(pts)} (model, "
          f"board) points with a faithful topology ({len(bf.TOPOLOGIES)} rows x 3 boards); training families "
          f"{', '.join(bf.TRAIN_FAMILIES)} ({len(train)} points), the other {len(held)} held out")
    frames = bf.compile_frames([tp.zoo for tp in bf.TOPOLOGIES], t, cache, log=lambda m: print(m, flush=True))
    t0 = time.perf_counter()
    params = bf.fit(train, frames, t)
    shipped = {k: getattr(t.timing, k) for k in params}
    print(f"fit ({time.perf_counter() - t0:.0f} s): " + ", ".join(f"{k} {v}" for k, v in params.items()))
    print("board profiles (isa/boards.py): " + ", ".join(f"{k} {v}" for k, v in shipped.items()))
    bf.evaluate(pts, frames, t, shipped)
    print(f"{'model':28s} {'board':7s} {'set':5s} {'DPU ms':>7s} {'host':>6s} {'st meas':>8s} {'st ours':>8s} "
          f"{'error':>7s} {'mt meas':>8s} {'mt ours':>8s} {'error':>7s} bound")
    for p in sorted(pts, key=lambda p: (p.topo.family not in bf.TRAIN_FAMILIES, p.topo.family, p.topo.row)):
        print(_fmt_point(p, p in train))
    s_train, s_held = bf.score(train), bf.score(held)
    for name, sc in (("training", s_train), ("held out", s_held)):
        n = sc["points"]
        print(f"{name}: single-thread {sc['single_within_20']}/{n} within 20 %, {sc['single_within_10']}/{n} within "
              f"10 % (worst {100 * sc['single_worst']:+.1f} %); multi-thread {sc['multi_within_20']}/{n} within 20 %, "
              f"{sc['multi_within_10']}/{n} within 10 % (worst {100 * sc['multi_worst']:+.1f} %)")
    one = [p for p in pts if p.meas.board == "kv260"]
    ratio = sorted((p.est.dpu_ms * p.meas.multi / 1e3, p.topo.row) for p in one)
    print("one core (kv260, multi-thread = DPU runs and overheads): ours / measured period, "
          + ", ".join(f"{r}: {x:.2f}" for x, r in ratio))
    if plot:
        _plot(pts, train, plot)
        print(f"wrote {plot}")
    return {"fit": params, "boards": shipped, "train": s_train, "held": s_held,
            "points": [{"model": p.topo.row, "zoo": p.topo.zoo, "family": p.topo.family, "board": p.meas.board,
                        "train": p in train, "single": p.meas.single, "multi": p.meas.multi,
                        "ours_single": p.est.fps_single, "ours_multi": p.est.fps, "bound": p.est.bound}
                       for p in pts]}


def _plot(pts, train, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, k in zip(axes, ("single", "multi")):
        for sel, mk, lab in ((train, "o", "training"), ([p for p in pts if p not in train], "^", "held out")):
            ax.scatter([getattr(p.meas, k) for p in sel],
                       [p.est.fps_single if k == "single" else p.est.fps for p in sel], marker=mk, label=lab, s=18)
        lo, hi = 10, 10000
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (0.8, 1.2):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"measured {k}-thread fps (Vitis AI 2.5 Model Zoo)")
        ax.set_ylabel(f"opendpu {k}-thread fps")
        ax.legend()
    fig.suptitle("board model vs the 2.5 Model Zoo (ZCU102, ZCU104, KV260); dotted: ±20 %")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)


def io_table(t, cache: str) -> dict:
    """Table 5: PG338's I/O bandwidth table (one core at full speed) beside ours."""
    print("\nTable 5: DDR bandwidth of one core at full speed (MB/s = 10^6 bytes/s) against PG338's I/O table; ours: "
          "average = DDR bytes / DPU time, peak = the largest rate over 1/128 of a frame (PG338 does not define its "
          f"window); at {t.timing.clock_mhz:g} MHz")
    print(f"{'PG338 model':16s} {'arch':6s} {'PG338 avg':>9s} {'ours':>7s} {'PG338 peak':>10s} {'ours':>7s}")
    rows = []
    for arch in ("B1152", "B4096"):
        ta = get_board("zcu102").target(f"DPUCZDX8G_ISA1_{arch}").with_timing(cores=1)
        specs = [z for z in cal.PG338_IO_ZOO.values() if z]
        frames = bf.compile_frames(specs, ta, cache, log=lambda m: print(m, flush=True))
        for pname, io in cal.PG338_IO.items():
            z = cal.PG338_IO_ZOO[pname]
            avg, peak = io[arch]
            if z is None:
                print(f"{pname:16s} {arch:6s} {avg:9.0f} {'-':>7s} {peak:10.0f} {'-':>7s}  (no faithful topology)")
                continue
            sch = [profile_summary(s, ta).schedule for s in frames[z].summaries]
            oa, op = cal.io_bandwidth(sch, ta.timing.clock_mhz)
            nbytes = sum(int(s.ddr_read.sum() + s.ddr_write.sum()) for s in sch)
            at = ""
            if arch == "B4096" and pname in cal.PG338_FPS:      # our bytes at PG338's own frame rate per core
                at = f"; our bytes at PG338's {cal.PG338_FPS[pname][1]:g} fps / 3 cores: " \
                     f"{nbytes * cal.PG338_FPS[pname][1] / 3 / 1e6:.0f}"
            print(f"{pname:16s} {arch:6s} {avg:9.0f} {oa:7.0f} {peak:10.0f} {op:7.0f}  ({z[4:]}: "
                  f"{100 * (oa / avg - 1):+.0f} % average, {nbytes / 1e6:.2f} MB per frame{at})")
            rows.append({"pg338": pname, "arch": arch, "zoo": z, "pg338_avg": avg, "pg338_peak": peak,
                         "ours_avg": oa, "ours_peak": op})
    return {"rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--board", default="zcu102", choices=sorted(BOARDS), help="board profile (default %(default)s)")
    ap.add_argument("--no-grid", action="store_true", help="skip table 2 (32 compiles of ResNet-50, a few minutes)")
    ap.add_argument("--no-pg338", action="store_true", help="skip table 3")
    ap.add_argument("--no-zoo25", action="store_true", help="skip tables 4 and 5 (about 20 compiles, cached)")
    ap.add_argument("--cache", metavar="DIR", help="compile cache (default: the sweep's, ~/.cache/opendpu/sweep)")
    ap.add_argument("--plot", metavar="OUT.png", default="build/calibration_fps.png",
                    help="table 4's predicted against measured fps (default %(default)s)")
    ap.add_argument("--json", metavar="OUT.json", help="also write the figures as JSON")
    a = ap.parse_args()
    board = get_board(a.board)
    t = board.target()
    out: dict = {"board": board.name, "timing": t.timing.to_dict()}
    print(f"board {board.name}: {board.cores} x {board.arch} at {board.clock_mhz:g} MHz, DDR {board.ddr_mbps} MB/s "
          f"x {t.timing.ddr_efficiency_pct} % ({board.source})\n")

    # UG1414's Figure 37 profiles the older DPU020X8G core: its own timing (isa/boards.py UG1414_DPU_TIMING)
    tu = t.with_timing(**UG1414_DPU_TIMING)
    g, sec = compiled("resnet50_caffe", tu)
    prof = profile_graph(g, target=tu)
    cmp = cal.compare_resnet50(prof.rows(), cal.layer_ops(prof))
    ov = cal.best_overhead(cmp)
    fitted = cal.with_overhead(cmp, ov)
    print(f"Table 1: UG1414 vaitrace ResNet-50 vs our resnet50_caffe on B4096 (compiled in {sec:.1f} s) with "
          f"UG1414's DPU timing {UG1414_DPU_TIMING}, per-row overhead {ov * 1e3:.0f} us (fitted)")
    print(cal.format_comparison(fitted))
    out["resnet50"] = {"overhead_ms": ov, "score": cal.score(fitted), "score_no_overhead": cal.score(cmp),
                       "rows": [dict(c.__dict__, rt_ratio=c.rt_ratio, ldwb_ok=c.ldwb_ok) for c in fitted]}

    f34 = cal.compare_fig34(prof.rows(), cal.layer_ops(prof))
    print("\nTable 1b: LdWB against UG1414's newer profile of the same ResNet-50 (Figure 34: Mem IO = LdWB + LdFM + "
          "StFM,\n10^6-byte MB; AMD's LdWB is Mem IO minus the maps loaded and stored once, bytes)")
    print(cal.format_fig34(f34))
    rt34 = cal.fig34_rt(fitted)
    within = sum(abs(ours / amd - 1) <= 0.25 for _, amd, ours in rt34)
    tot, tot_amd = sum(r[2] for r in rt34), sum(r[1] for r in rt34)
    print(f"RT against Figure 34's average times (out of sample; the {len(rt34)} rows computed alike, with the "
          f"fitted overhead): {within}/{len(rt34)} within 25 %, total {tot:.3f} ms against {tot_amd:.3f} "
          f"({100 * (tot / tot_amd - 1):+.1f} %)")
    out["resnet50_fig34"] = {"within_5pct": sum(c.rows for c in f34 if c.ok), "rows": sum(c.rows for c in f34),
                             "checks": [dict(c.__dict__, ok=c.ok) for c in f34],
                             "rt": [{"row": n, "amd_ms": a, "ours_ms": o} for n, a, o in rt34],
                             "rt_within_25pct": within, "rt_total_err_pct": 100 * (tot / tot_amd - 1)}

    if not a.no_grid:
        # each point compiled for its own timing (the compiler decides by the cycle model), then compared; the fit
        # is the smallest mean |ln(RT ours / RT UG1414)| with ddr_latency >= 30 cycles (107 ns at 281 MHz: below
        # that a DDR4 read through the PS interconnect is not plausible)
        print("\nTable 2: DPU timing fit (each point compiled for its timing, with its best per-row overhead)")
        print(f"{'ddr_latency':>11s} {'conv_latency':>12s} {'overhead us':>11s} {'RT in 25 %':>10s} {'total RT':>8s} "
              f"{'mean|ln|':>8s}")
        grid = []
        for lat, cl in itertools.product(GRID_DDR_LATENCY, GRID_CONV_LATENCY):
            tt = tu.with_timing(ddr_latency=lat, conv_latency=cl)
            gt, _ = compiled("resnet50_caffe", tt)
            pt = profile_graph(gt, target=tt)
            c = cal.compare_resnet50(pt.rows(), cal.layer_ops(pt))
            o = cal.best_overhead(c)
            s = cal.score(cal.with_overhead(c, o))
            grid.append({"ddr_latency": lat, "conv_latency": cl, "overhead_ms": o, **s})
            mark = " (UG1414)" if (lat, cl) == (tu.timing.ddr_latency, tu.timing.conv_latency) else ""
            print(f"{lat:11d} {cl:12d} {o * 1e3:11.0f} {s['rt_within']:4d}/{s['rows']:<5d} "
                  f"{s['total_rt_err_pct']:+7.1f}% {s['mean_abs_log_rt']:8.4f}{mark}", flush=True)
        best = min((r for r in grid if r["ddr_latency"] >= 30), key=lambda r: r["mean_abs_log_rt"])
        print(f"fit: ddr_latency {best['ddr_latency']}, conv_latency {best['conv_latency']} (UG1414_DPU_TIMING "
              f"has {tu.timing.ddr_latency}, {tu.timing.conv_latency}; the 2.5 boards' conv_latency is fitted in "
              f"table 4)")
        out["grid"] = grid
        out["fit"] = {"ddr_latency": best["ddr_latency"], "conv_latency": best["conv_latency"]}

    cache = a.cache or default_cache_dir()
    if not a.no_pg338:
        print(f"\nTable 3: PG338 fps vs ours on {board.name} ({board.cores} cores; sim/multicore.py with the board "
              f"profile fitted on the 2.5 tables below: PG338 is out of sample)")
        print(f"{'PG338 model':16s} {'GOPs':>6s} {'fps':>6s} {'zoo model':22s} {'GOPs':>6s} {'DPU ms':>7s} "
              f"{'MB/frame':>8s} {'fps ours':>8s} {'bound':>5s} {'error':>7s}")
        specs = {p: (f"zoo:{z}" + ("" if hw == (zoo.DEFAULT_SIZE[z],) * 2 else f"@{hw[0]}x{hw[1]}"))
                 for p, (z, hw) in ((p, e) for p, e in cal.PG338_ZOO.items() if e)}
        frames = bf.compile_frames(specs.values(), t, cache, log=lambda m: print(m, flush=True))
        rows = []
        for pname, (gops, fps) in cal.PG338_FPS.items():
            if pname not in specs:
                print(f"{pname:16s} {gops:6.3g} {fps:6.0f} {'(not built)':22s}")
                continue
            fr = frames[specs[pname]]
            tp = bf.estimate(fr, t)
            err = 100.0 * (tp.fps / fps - 1)
            print(f"{pname:16s} {gops:6.3g} {fps:6.0f} {specs[pname][4:]:22s} {fr.gops:6.3g} {tp.dpu_ms:7.3f} "
                  f"{tp.ddr_bytes / 1e6:8.2f} {tp.fps:8.1f} {tp.bound:>5s} {err:+6.1f}%")
            rows.append({"pg338": pname, "gops": gops, "pg338_fps": fps, "zoo": specs[pname], "zoo_gops": fr.gops,
                         **tp.to_dict(), "error_pct": err})   # tp's "fps" is ours
        print(f"within 20 %: {sum(abs(r['error_pct']) <= 20 for r in rows)}/{len(rows)}")
        out["pg338"] = {"rows": rows}

    if not a.no_zoo25:
        out["zoo25"] = zoo25_table(t, cache, a.plot)
        out["io"] = io_table(t, cache)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(f"\nwrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
