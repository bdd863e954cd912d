"""`opendpu` command line: run, check, disasm, xmodel, targets (xdputil-like)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

from compiler.xir.graph import dump_stem


class CliError(Exception):
    pass


def _load_graph(path: str):
    from compiler.xir.graph import Graph
    return Graph.load(path)




def _write_dump(dirname: str, name: str, arr: np.ndarray) -> str:
    os.makedirs(dirname, exist_ok=True)
    stem = os.path.join(dirname, dump_stem(name))
    a = np.ascontiguousarray(arr)
    a.tofile(stem + ".bin")
    np.savetxt(stem + ".txt", a.reshape(-1), fmt="%d" if a.dtype.kind in "iu" else "%.8g")
    return stem + ".bin"


def _md5(arr: np.ndarray) -> str:
    return hashlib.md5(np.ascontiguousarray(arr).tobytes()).hexdigest()


def _find_golden(gdir: str, name: str) -> str | None:
    stem = dump_stem(name)
    for suffix in ("", "_aquant", "_int8", "_fix"):
        p = os.path.join(gdir, stem + suffix + ".bin")
        if os.path.isfile(p):
            return p
    return None


# ---- run ------------------------------------------------------------------------------------------
def cmd_run(a) -> int:
    from runtime.runner import GraphRunner
    g = _load_graph(a.model)
    gr = GraphRunner(g, backend=a.backend, target=a.target, timing=_timing_overrides(a))
    specs = gr.get_inputs()
    inputs = []
    paths = a.input or []
    if len(paths) == 1 and paths[0].endswith(".npz") and len(specs) >= 1:
        z = np.load(paths[0])
        for s in specs:
            key = s.name if s.name in z else (s.op_name if s.op_name in z else None)
            if key is None:
                raise CliError(f"{paths[0]} has no array for input {s.name!r} (keys: {list(z.keys())})")
            inputs.append(z[key])
    else:
        if len(paths) != len(specs):
            raise CliError(f"{a.model} takes {len(specs)} input(s) {[s.name for s in specs]}; give one -i per input "
                           f"(.npy or .bin) or one .npz with arrays named by tensor")
        for s, p in zip(specs, paths):
            if p.endswith(".bin"):
                x = np.fromfile(p, dtype=s.np_dtype)
            else:
                try:
                    x = np.load(p)
                except (OSError, ValueError) as e:
                    raise CliError(f"cannot read input {p}: {e}") from None
            inputs.append(x)
    t0 = time.perf_counter()
    res = gr.run(inputs, keep_values=True, layers=bool(a.dump or a.golden))
    dt = time.perf_counter() - t0
    if a.output:
        np.savez(a.output, **res.outputs)
    print(f"ran {a.model} on backend {a.backend} in {dt * 1e3:.2f} ms (host time)")
    for name, r in gr.runners.items():
        st = r.stats
        if "cycles" in st:
            print(f"  DPU subgraph {name}: {st['cycles']} cycles = {st['latency_ms']:.3f} ms at "
                  f"{st['clock_mhz']:g} MHz on {r.target.name}")
    for name, v in res.outputs.items():
        flat = v.reshape(-1)
        extra = f", argmax {int(np.argmax(flat))}" if flat.size <= 1000 else ""
        print(f"  output {name}: shape {list(v.shape)} {v.dtype}{extra}")
    rc = 0
    if a.dump or a.golden:
        layer_vals: dict[str, np.ndarray] = {}
        for sgname, lv in res.layers.items():
            for op_name, v in lv.items():
                layer_vals[g.ops[op_name].output.name] = v
        for sgname, outs in res.dpu_outputs.items():
            layer_vals.update(outs)
        if a.dump:
            for name, v in layer_vals.items():
                _write_dump(a.dump, name, v)
            print(f"dumped {len(layer_vals)} tensors to {a.dump}")
        if a.golden:
            fails = 0
            for name, v in layer_vals.items():
                gp = _find_golden(a.golden, name)
                if gp is None:
                    continue
                gold = np.fromfile(gp, dtype=np.int8)
                ok = gold.size == v.size and np.array_equal(gold, v.astype(np.int8).reshape(-1))
                status = "success !" if ok else "fail ! "
                fails += not ok
                print(f"XLNX_GOLDEN_DIR: compare data {status}layer_name {name} dump_md5 {_md5(v)} "
                      f"golden_md5 {_md5(gold)}")
            rc = 1 if fails else 0
    return rc


# ---- check ----------------------------------------------------------------------------------------
def cmd_check(a) -> int:
    from runtime.dpu import DpuSubgraph, dpu_subgraphs
    from runtime.layers import run_tracked
    g = _load_graph(a.model)
    sgs = dpu_subgraphs(g)
    if not sgs:
        raise CliError(f"{a.model} has no DPU subgraph")
    rng = np.random.default_rng(a.seed)
    bad = 0
    for sg in sgs:
        dpu = DpuSubgraph(g, sg)
        if a.target is not None:
            from isa.target import get_target
            t = get_target(a.target)
            if t.fingerprint != dpu.fingerprint:
                raise CliError(f"subgraph {sg.name}: compiled for {dpu.target.name}, not {t.name}")
        machine = dpu.new_machine(seed=a.seed)
        compared = mism = 0
        first = None
        layers_ok: set[str] = set()
        t0 = time.perf_counter()
        for k in range(a.n):
            ins = [rng.integers(-128, 128, size=s.dims, dtype=np.int8) for s in dpu.inputs]
            ref_out, ref_vals = dpu.run_ref(ins, keep=True)
            sim_out, rep = run_tracked(dpu, machine, ins, ref_vals)
            for r, s in zip(ref_out, sim_out):
                compared += r.size
                mism += int(np.count_nonzero(r.astype(np.int8) != s))
            if first is None:
                first = rep.first_mismatch()
            layers_ok |= {n for n, st in rep.status.items() if st == "ok"}
        dt = time.perf_counter() - t0
        status = "PASS" if mism == 0 else "FAIL"
        bad += mism != 0
        print(f"{status} {sg.name}: target {dpu.target.name}, {len(dpu.instructions)} instructions, "
              f"{a.n} inputs, {compared} bytes compared, {mism} mismatching"
              + f", {len(layers_ok)} stored layers matched"
              + (f", first mismatching layer {first}" if first else "")
              + f" ({dt:.2f} s)")
    return 1 if bad else 0


# ---- disasm / xmodel / targets -----------------------------------------------------------------------
def cmd_disasm(a) -> int:
    from runtime.dpu import DpuSubgraph, dpu_subgraphs
    from isa.program import to_text
    g = _load_graph(a.model)
    sgs = dpu_subgraphs(g)
    if a.subgraph:
        sgs = [s for s in sgs if s.name == a.subgraph]
        if not sgs:
            raise CliError(f"no DPU subgraph named {a.subgraph!r}")
    out = sys.stdout
    for sg in sgs:
        dpu = DpuSubgraph(g, sg)
        if len(sgs) > 1:
            out.write(f"# subgraph {sg.name} ({dpu.target.name}, {len(dpu.instructions)} instructions)\n")
        out.write(to_text(dpu.instructions))
    return 0


def cmd_xmodel(a) -> int:
    from runtime.dpu import DpuSubgraph
    g = _load_graph(a.model)
    print(f"graph {g.name}: {len(g.ops)} ops, {len(g.root.children)} subgraphs")
    for sg in g.toposort_child_subgraphs():
        ops = g.toposort(sg.all_ops())
        print(f"subgraph {sg.name}  device={sg.device}  ops={len(ops)}")
        if sg.device == "DPU":
            d = DpuSubgraph(g, sg)
            print(f"  dpu_name={sg.get('dpu_name')} fingerprint=0x{d.fingerprint:016X} target={d.target.name}")
            print(f"  instructions={len(d.instructions)} mc_code={len(d.mc_code)} B workload={sg.get('workload')}")
            for r in sorted(d.reg_sizes):
                print(f"  REG_{r}: {d.reg_context.get(r, '?'):10s} {d.reg_sizes[r]} B"
                      + (f" (parameters {len(d.params[r])} B)" if r in d.params else ""))
            for t in d.inputs:
                print(f"  input  {t.name} {list(t.dims)} {t.dtype} fix_point={t.fix_point} REG_{t.reg_id}+{t.ddr_addr}")
            for t in d.outputs:
                print(f"  output {t.name} {list(t.dims)} {t.dtype} fix_point={t.fix_point} REG_{t.reg_id}+{t.ddr_addr}")
        if a.verbose or sg.device != "DPU":
            for n in ops:
                op = g.ops[n]
                t = op.output
                print(f"    {op.type:22s} {n}  -> {list(t.shape)} {t.dtype_name}"
                      + (f" fix_point={t.fix_point}" if t.fix_point is not None else ""))
    return 0


def _timing_overrides(a) -> dict:
    tm = {}
    for kv in a.timing or []:
        if "=" not in kv:
            raise CliError(f"--timing {kv!r}: expected key=value (e.g. ddr_latency=80)")
        k, v = kv.split("=", 1)
        try:
            tm[k.strip()] = float(v) if k.strip() == "clock_mhz" else int(v, 0)
        except ValueError:
            raise CliError(f"--timing {kv!r}: value must be a number") from None
    if getattr(a, "clock_mhz", None) is not None:
        tm["clock_mhz"] = a.clock_mhz
    return tm


def cmd_profile(a) -> int:
    from isa.target import get_target
    from runtime.profile import profile_graph
    g = _load_graph(a.model)
    tgt = get_target(a.target) if a.target else None
    prof = profile_graph(g, target=tgt, timing=_timing_overrides(a), model=os.path.basename(a.model))
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
    if a.txt:
        try:
            with open(a.txt, "w") as f:
                f.write(text + "\n")
        except OSError as e:
            raise CliError(f"cannot write the text summary to {a.txt}: {e.strerror or e}") from None
    for path, fn, what in ((a.trace, prof.write_trace, "Perfetto trace"), (a.json, prof.write_json, "JSON"),
                           (a.csv, prof.write_csv, "CSV"), (a.instructions, prof.write_instructions_csv,
                                                            "per-instruction CSV"), (a.plot, prof.plot, "plot")):
        if path:
            try:
                fn(path)
            except OSError as e:
                raise CliError(f"cannot write the {what} to {path}: {e.strerror or e}") from None
            print(f"wrote {what} to {path}")
    return 0


def cmd_sweep(a) -> int:
    from isa.target import get_target
    from runtime.dpu import DpuSubgraph, dpu_subgraphs
    from sim.sweep import SWEEP_COLUMNS, parse_axis, sweep
    g = _load_graph(a.model)
    dpus = [DpuSubgraph(g, sg) for sg in dpu_subgraphs(g)]
    if not dpus:
        raise CliError(f"{a.model} has no DPU subgraph")
    t = dpus[0].target
    if a.target:
        t = get_target(a.target)
        if any(d.fingerprint != t.fingerprint for d in dpus):
            raise CliError(f"--target {a.target}: {a.model} was compiled for {dpus[0].target.name} "
                           f"(VART_GRAPH_FINGERPRINT_ERROR)")
    if len({d.fingerprint for d in dpus}) > 1:
        raise CliError(f"{a.model}: DPU subgraphs were compiled for different targets; sweep one model per target")
    axes = {}
    for spec in a.param or []:
        try:
            k, v = parse_axis(spec)
        except ValueError as e:
            raise CliError(str(e)) from None
        axes[k] = v
    if not axes:
        raise CliError("give at least one --param name=v1,v2,... (a timing parameter)")
    rows = sweep([d.arrays for d in dpus], t, axes)
    cols = list(axes) + [c for c in SWEEP_COLUMNS if c != "point"]
    print(" ".join(f"{c:>14s}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:14.4g}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in cols))
    if a.csv:
        import csv
        try:
            with open(a.csv, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=cols)
                w.writeheader()
                w.writerows({c: r[c] for c in cols} for r in rows)
        except OSError as e:
            raise CliError(f"cannot write {a.csv}: {e.strerror or e}") from None
        print(f"wrote {len(rows)} rows to {a.csv}")
    return 0


def cmd_cosim(a) -> int:
    """RTL vs cycle model on an xmodel's DPU subgraphs, or on random generated programs."""
    from isa.target import get_target
    from sim.cosim import check_target_matches, cosim_programs, dump_waves, subgraph_program
    tm = _timing_overrides(a)
    programs = []
    if a.random:
        if not a.target:
            raise CliError("--random needs --target (a preset, fingerprint or arch.json)")
        from sim.progen import random_program
        t = get_target(a.target)
        t = t.with_timing(**tm) if tm else t
        for i in range(a.random):
            gp = random_program(t, a.instructions, seed=a.seed + i)
            programs.append((f"random seed {a.seed + i}", gp.instructions, gp.reg_sizes, gp.reg_init))
        groups = [(t, programs)]
    else:
        if not a.model:
            raise CliError("give an xmodel, or --random N with --target")
        from runtime.dpu import DpuSubgraph, dpu_subgraphs
        g = _load_graph(a.model)
        rng = np.random.default_rng(a.seed)
        groups = []
        for sg in dpu_subgraphs(g):
            if a.subgraph and sg.name != a.subgraph:
                continue
            dsg = DpuSubgraph(g, sg)
            t = dsg.target
            if a.target:
                want = get_target(a.target)
                check_target_matches(dsg.target, want, f"subgraph {sg.name!r}")
                t = want
            t = t.with_timing(**tm) if tm else t
            xs = [rng.integers(-128, 128, size=s.dims, dtype=np.int8) for s in dsg.inputs]
            instrs, sizes, init = subgraph_program(dsg, xs)
            groups.append((t, [(sg.name, instrs, sizes, init)]))
        if not groups:
            raise CliError(f"{a.model} has no DPU subgraph" + (f" named {a.subgraph!r}" if a.subgraph else ""))
    bad = 0
    for t, progs in groups:
        t0 = time.perf_counter()
        reps = cosim_programs(t, progs, backend=a.rtl_sim, log=lambda s: print(s, file=sys.stderr))
        dt = time.perf_counter() - t0
        for rep, prog in zip(reps, progs):
            print(rep.summary())
            if not rep.ok:
                bad += 1
                if a.waves:
                    path = dump_waves(t, prog, rep, a.waves, backend=a.rtl_sim)
                    print(f"  waveform window written to {path} (+ .gtkw)")
        print(f"{len(reps)} program(s) on {t.name or t.describe()}: {sum(r.ok for r in reps)} match; "
              f"{dt:.1f} s wall including build")
    return 1 if bad else 0


def cmd_targets(a) -> int:
    from isa.target import PRESETS, Target
    ts = [Target.from_name(n) for n in PRESETS]
    if a.json:
        print(json.dumps([t.to_dict() for t in ts], indent=1))
        return 0
    print(f"{'name':24s} {'fingerprint':18s} {'PP':>3s} {'CP':>3s} {'ALU_PP':>6s} {'depth':>5s} {'banks':>5s} "
          f"{'ops/cycle':>9s}")
    for t in ts:
        print(f"{t.name:24s} 0x{t.fingerprint:016X} {t.pp:3d} {t.cp:3d} {t.alu_pp:6d} {t.bank_depth:5d} "
              f"{t.num_banks:5d} {t.peak_ops_per_cycle:9d}")
    return 0


# ---- quantize / inspect / zoo ---------------------------------------------------------------------
def _npz_or_npy(path: str):
    """(x, y or None) from an .npz (arrays 'x' and optional 'y') or an .npy / folder of .npy."""
    if path.endswith(".npz") and os.path.isfile(path):
        z = np.load(path)
        if "x" not in z:
            raise CliError(f"{path}: needs an array named 'x' (and optionally labels 'y'); has {list(z.keys())}")
        return z["x"], (z["y"] if "y" in z else None)
    return path, None


def cmd_quantize(a) -> int:
    from quant.quantize import QuantConfig, calib_arrays, quantize
    cfg = QuantConfig(method=a.method, weight_method=a.weight_method, statistic=a.statistic,
                      percentile=a.percentile, batch_size=a.batch_size, calib_limit=a.calib_limit,
                      replace_sigmoid=a.replace_sigmoid, bias_corr=a.bias_corr, fast_finetune=a.fast_finetune,
                      seed=a.seed)
    calib, _ = _npz_or_npy(a.calib)
    t0 = time.perf_counter()
    last = [0.0]

    def progress(i, n):
        now = time.perf_counter()
        if now - last[0] > 2 or i == n:
            last[0] = now
            print(f"  calibration batch {i}/{n}", file=sys.stderr)
    res = quantize(a.model, calib, target=a.target, config=cfg, quant_info=a.quant_info, progress=progress)
    x = calib_arrays(calib, res.prep.input_nodes[0].shape, cfg.calib_limit)
    ev = None
    if a.evaluate:
        ex, ey = _npz_or_npy(a.evaluate)
        ex = calib_arrays(ex, res.prep.input_nodes[0].shape)
        ev = res.evaluate(ex, ey)
    paths = res.write(a.output, calib_x=x, evaluate=ev)
    dt = time.perf_counter() - t0
    nodes = res.prep.nodes
    cpu = [n for n in nodes if n.device == "CPU"]
    print(f"quantized {a.model} ({len(nodes)} ops, {len(cpu)} on the CPU) with method {cfg.method} on "
          f"{res.calib_samples} calibration samples in {dt:.1f} s")
    for n in cpu:
        print(f"  CPU  {n.name}: {n.reason}")
    for note in res.notes:
        print(f"  {note}")
    if ev:
        print("  evaluate: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in ev.items()))
    for k in ("xmodel", "onnx", "quant_info", "golden", "report"):
        if k in paths:
            print(f"  {k:10s} {paths[k]}")
    return 0


def cmd_inspect(a) -> int:
    from quant.inspect import format_inspect, inspect_model
    if a.image_format and a.image_format not in ("svg", "png"):
        raise CliError(f"INSPECTOR_OUTPUT_FORMAT: image format {a.image_format!r}; use svg or png")
    t, prep, rows = inspect_model(a.model, a.target)
    text = format_inspect(t, prep, rows, a.verbose)
    if a.verbose:
        print(text, end="")
    os.makedirs(a.output, exist_ok=True)
    path = os.path.join(a.output, f"inspect_{t.name}.txt")
    with open(path, "w") as f:
        f.write(format_inspect(t, prep, rows, 2))
    cpu = sum(p.device == "CPU" for _, p in rows)
    print(f"{len(rows)} ops: {len(rows) - cpu} DPU/USER, {cpu} CPU; details in {path}")
    return 0


def cmd_zoo(a) -> int:
    from quant import zoo
    names = a.names or list(zoo.NAMES)
    for n in names:
        if n not in zoo.NAMES:
            raise CliError(f"unknown zoo model {n!r}; choose from {', '.join(zoo.NAMES)}")
    rows = zoo.summary(names, a.size)
    print(f"{'model':14s} {'input':16s} {'GMACs':>7s} {'GOPs':>7s} {'params':>11s} {'published GOPs':>14s} "
          f"{'published params':>16s}")
    for r in rows:
        pg = r.get("published_gops")
        pp = r.get("published_params")
        print(f"{r['name']:14s} {r['input']:16s} {r['macs'] / 1e9:7.3f} {r['gops']:7.3f} {r['params']:11,d} "
              f"{(f'{pg:.3f}' if pg else '-'):>14s} {(f'{pp:,}' if pp else '-'):>16s}")
    if a.export:
        import onnx
        os.makedirs(a.export, exist_ok=True)
        for n in names:
            p = os.path.join(a.export, f"{n}.onnx")
            onnx.save(zoo.build(n, a.size), p)
            print(f"  wrote {p}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opendpu", description="Open emulator of the AMD DPUCZDX8G (ISA1)")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run an xmodel end to end")
    r.add_argument("model")
    r.add_argument("-i", "--input", action="append", help="input .npy/.bin (one per graph input) or one .npz")
    r.add_argument("-o", "--output", help="write graph outputs by tensor name to this .npz")
    r.add_argument("--backend", choices=("ref", "sim", "rtl"), default="sim",
                   help="ref = XIR reference ops, sim = cycle model, rtl = the Amaranth RTL in Verilator")
    r.add_argument("--target", help="preset name, fingerprint or arch.json (must match the model)")
    r.add_argument("--dump", help="write every DPU-subgraph and per-layer output (.bin + .txt) here")
    r.add_argument("--golden", help="compare per layer with the golden .bin files in this directory")
    r.add_argument("--clock-mhz", type=float, help="core clock for the reported latency (sim backend)")
    r.add_argument("--timing", action="append", metavar="KEY=VALUE", help="override a timing parameter")
    r.set_defaults(fn=cmd_run)
    c = sub.add_parser("check", help="compare sim and ref on random inputs for every DPU subgraph")
    c.add_argument("model")
    c.add_argument("-n", type=int, default=2, help="random inputs per subgraph (default 2)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--target")
    c.set_defaults(fn=cmd_check)
    d = sub.add_parser("disasm", help="print the DPU instructions in text assembly")
    d.add_argument("model")
    d.add_argument("--subgraph")
    d.set_defaults(fn=cmd_disasm)
    x = sub.add_parser("xmodel", help="summary of graph, subgraphs, DPU attributes and registers")
    x.add_argument("model")
    x.add_argument("-v", "--verbose", action="store_true", help="list the ops of DPU subgraphs too")
    x.set_defaults(fn=cmd_xmodel)
    pr = sub.add_parser("profile", help="cycle-model profile: vaitrace text summary, trace, plot, JSON/CSV")
    pr.add_argument("model")
    pr.add_argument("--target", help="preset, fingerprint or arch.json (may carry a 'timing' object); "
                                     "must match the model's fingerprint")
    pr.add_argument("--clock-mhz", type=float, help="core clock (default from the target, 300)")
    pr.add_argument("--timing", action="append", metavar="KEY=VALUE",
                    help="override a timing parameter (docs/microarchitecture.md), e.g. ddr_latency=80")
    pr.add_argument("--trace", help="write a Chrome/Perfetto trace JSON (one track per engine)")
    pr.add_argument("--json", help="write the profile as JSON")
    pr.add_argument("--csv", help="write the DPU summary rows as CSV")
    pr.add_argument("--instructions", help="write one CSV row per instruction")
    pr.add_argument("--plot", help="write an engine-utilisation figure (.png/.svg/.pdf)")
    pr.add_argument("--txt", help="also write the text summary to this file")
    pr.set_defaults(fn=cmd_profile)
    sw = sub.add_parser("sweep", help="timing-only sweep of timing parameters (cycles, latency, fps, busy)")
    sw.add_argument("model")
    sw.add_argument("--param", action="append", metavar="NAME=V1,V2,...",
                    help="a timing parameter and its values; several --param give the cartesian product")
    sw.add_argument("--target", help="preset, fingerprint or arch.json (timing base); must match the model")
    sw.add_argument("--csv", help="write the rows as CSV")
    sw.set_defaults(fn=cmd_sweep)
    cs = sub.add_parser("cosim", help="co-simulate the RTL against the cycle model (bytes and cycles)")
    cs.add_argument("model", nargs="?", help="xmodel (every DPU subgraph, random inputs)")
    cs.add_argument("--target", help="preset, fingerprint or arch.json (must match the model's bank layout)")
    cs.add_argument("--timing", action="append", metavar="KEY=VALUE", help="override a timing parameter")
    cs.add_argument("--subgraph", help="only this DPU subgraph")
    cs.add_argument("--random", type=int, default=0, metavar="N", help="N random programs (sim.progen) instead")
    cs.add_argument("--instructions", type=int, default=60, help="instructions per random program")
    cs.add_argument("--seed", type=int, default=0, help="input / program seed (reproducible)")
    cs.add_argument("--rtl-sim", default="verilator", choices=("verilator", "cocotb-verilator", "cocotb-icarus"),
                    help="RTL simulator flow (default verilator; cocotb-icarus is ~46x slower; cocotb-verilator builds very slowly, docs/rtl.md)")
    cs.add_argument("--waves", metavar="DIR", nargs="?", const="waveforms",
                    help="on a mismatch, dump a VCD window around the first divergence into DIR (default waveforms/)")
    cs.set_defaults(fn=cmd_cosim)
    q = sub.add_parser("quantize", help="INT8 power-of-two post-training quantization (vai_q semantics)")
    q.add_argument("model", help="float ONNX model (opset 13+)")
    q.add_argument("--calib", required=True, help="calibration data: .npy [N,C,H,W], .npz ('x'), or a folder of .npy")
    q.add_argument("--method", default="diffs", choices=("maxmin", "percentile", "mse", "entropy", "diffs"),
                   help="activation calibration method (default diffs, as vai_q_pytorch)")
    q.add_argument("--weight-method", choices=("maxmin", "diffs", "mse"), help="weights/bias method")
    q.add_argument("--statistic", choices=("modal", "max", "mean", "median"), help="per-batch reduction for diffs")
    q.add_argument("--percentile", type=float, default=99.9999)
    q.add_argument("--target", help="preset name, fingerprint or arch.json: DPU/CPU placement and its reasons")
    q.add_argument("-o", "--output", default="quantize_result", help="output directory (written atomically)")
    q.add_argument("--quant-info", help="reuse the fix points of this quant_info.json (skip calibration)")
    q.add_argument("--batch-size", type=int, default=8)
    q.add_argument("--calib-limit", type=int, help="use at most N calibration samples")
    q.add_argument("--replace-sigmoid", action="store_true", help="sigmoid -> hard-sigmoid")
    q.add_argument("--bias-corr", action="store_true", help="bias correction")
    q.add_argument("--fast-finetune", action="store_true", help="layer-wise AdaQuant-style fast finetune")
    q.add_argument("--evaluate", help="dataset (.npz with x and optional labels y): float vs quantized")
    q.add_argument("--seed", type=int, default=0)
    q.set_defaults(fn=cmd_quantize)
    ip = sub.add_parser("inspect", help="DPU/CPU placement of every op of a float ONNX model, with reasons")
    ip.add_argument("model")
    ip.add_argument("--target", required=True, help="preset name, fingerprint or arch.json")
    ip.add_argument("-o", "--output", default="quantize_result", help="directory for inspect_<target>.txt")
    ip.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                    help="0 quiet, 1 CPU ops (default), 2 every op")
    ip.add_argument("--image-format", help="svg or png (graph images are not generated; accepted for vai_q parity)")
    ip.set_defaults(fn=cmd_inspect)
    z = sub.add_parser("zoo", help="model zoo: MACs/GOPs/params of the generated topologies; export ONNX")
    z.add_argument("names", nargs="*")
    z.add_argument("--size", type=int, help="input size (default: the published one)")
    z.add_argument("--export", metavar="DIR", help="write the float ONNX models here")
    z.set_defaults(fn=cmd_zoo)
    t = sub.add_parser("targets", help="list the ISA1 presets")
    t.add_argument("--json", action="store_true")
    t.set_defaults(fn=cmd_targets)
    return p


def main(argv: list[str] | None = None) -> int:
    from compiler.xir.graph import XModelError
    from isa.program import IsaError
    from isa.target import TargetError
    from runtime.dpu import RuntimeErrorDPU
    from runtime.ops import OpError
    from sim.executor import ExecError
    from sim.timing import DeadlockError, WatchdogError
    from hw.params import HwError
    args = build_parser().parse_args(argv)
    errors = (CliError, XModelError, IsaError, TargetError, RuntimeErrorDPU, OpError, ExecError, DeadlockError,
              WatchdogError, HwError)
    if args.cmd in ("quantize", "inspect", "zoo"):
        from quant.onnx_in import QuantError
        errors = errors + (QuantError,)
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:
        return 0
    except errors as e:
        print(f"opendpu {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
