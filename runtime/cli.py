"""`opendpu` command line: run, check, disasm, xmodel, targets (xdputil-like), quantize, compile, build, compare."""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import sys
import time

import numpy as np

from opendpu.compiler.outdir import DirOutput, check_dir, check_file
from opendpu.compiler.xir.graph import dump_stem
from opendpu.runtime.cli_checks import (SEED, CliError, float_range, input_dir, input_file, input_path, int_range,
                                load_array, names_arg, shape_arg, load_bin, load_npz, timing_overrides, timing_value)

__all__ = ["main", "build_parser", "CliError"]


def _load_graph(path: str):
    from opendpu.compiler.xir.graph import Graph
    input_file(path, "model")
    return Graph.load(path)


def _stem(path: str) -> str:
    """A model file's name without its suffix: the net its outputs belong to (compiler.outdir)."""
    return os.path.splitext(os.path.basename(path))[0]


def _shown(a, path: str, out: str) -> str:
    """`path` (below the output directory `out`) as the user will find it: inside `build` a verb writes into
    build's temporary directory, published under `a.shown_dir` when all steps succeed."""
    shown = getattr(a, "shown_dir", None)
    return os.path.join(shown, os.path.relpath(path, out)) if shown else path


def _write_dump(dirname: str, name: str, arr: np.ndarray) -> str:
    os.makedirs(dirname, exist_ok=True)
    stem = os.path.join(dirname, dump_stem(name))
    a = np.ascontiguousarray(arr)
    a.tofile(stem + ".bin")
    np.savetxt(stem + ".txt", a.reshape(-1), fmt="%d" if a.dtype.kind in "iu" else "%.8g")
    return stem + ".bin"


def _md5(arr: np.ndarray) -> str:
    return hashlib.md5(np.ascontiguousarray(arr).tobytes()).hexdigest()


_GOLDEN_SUFFIXES = ("", "_aquant", "_int8", "_fix")


def _golden_files(gdir: str) -> list[str]:
    return sorted(f for f in os.listdir(gdir) if f.endswith(".bin") and os.path.isfile(os.path.join(gdir, f)))


def _golden_index(files: list[str]) -> dict[str, str]:
    """dump stem (without the golden suffix) -> file name; an exact stem wins over a suffixed one."""
    idx: dict[str, str] = {}
    for suffix in reversed(_GOLDEN_SUFFIXES):
        for f in files:
            stem = f[:-4]
            if suffix and stem.endswith(suffix):
                idx[stem[: -len(suffix)]] = f
            elif not suffix:
                idx[stem] = f
    return idx


def _load_plugins(paths) -> None:
    """--op-plugin: import each module file; it registers custom CPU ops with runtime.register_op."""
    import importlib.util
    from opendpu.runtime.ops import registered_ops, registry_snapshot, restore_registry
    for p in paths or []:
        input_file(p, "--op-plugin")
        if not p.endswith(".py"):
            raise CliError(f"--op-plugin {p}: expected a Python module file (.py)")
        before = set(registered_ops())
        saved = registry_snapshot()
        name = "opendpu_op_plugin_" + "".join(c if c.isalnum() else "_" for c in os.path.basename(p)[:-3])
        try:
            spec = importlib.util.spec_from_file_location(name, p)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        except SystemExit as e:     # sys.exit() / exit() / raise SystemExit in the module: not opendpu's exit
            restore_registry(saved)         # a module that fails half-way leaves no op registered, no module
            sys.modules.pop(name, None)
            raise CliError(f"--op-plugin {p}: importing it called sys.exit({e.code!r}); a plugin module must only "
                           f"register ops (runtime.register_op), not exit") from None
        except Exception as e:  # noqa: BLE001 - the user's module: report it, with its location
            restore_registry(saved)
            sys.modules.pop(name, None)
            tb = e.__traceback__
            line = ""
            while tb is not None:
                if tb.tb_frame.f_code.co_filename == os.path.abspath(p) or tb.tb_frame.f_code.co_filename == p:
                    line = f" (line {tb.tb_lineno})"
                tb = tb.tb_next
            raise CliError(f"--op-plugin {p}: importing it raised {type(e).__name__}: {e}{line}") from None
        new = sorted(set(registered_ops()) - before)
        if not new:
            _warn(f"--op-plugin {p} registered no op (call runtime.register_op(op_type, fn) in the module)")
        else:
            print(f"op plugin {p}: registered {', '.join(new)}")


_VERB = ["opendpu"]


def _warn(msg: str) -> None:
    print(f"{_VERB[0]}: warning: {msg}", file=sys.stderr)


def _check_cpu_ops(g) -> None:
    """Every CPU op must have an implementation before anything runs (a custom op needs --op-plugin)."""
    from opendpu.runtime.ops import unimplemented_ops
    names = [n for sg in g.toposort_child_subgraphs() if sg.device == "CPU" for n in g.toposort(sg.all_ops())]
    if not g.root.children:
        names = [n for n in g.toposort() if g.ops[n].type not in ("data", "data-fix")]
    missing = unimplemented_ops(g, names)
    if missing:
        n, t = missing[0]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CliError(f"CPU op {n!r} has type {t!r}, which opendpu does not implement{more}; register it in a "
                       f"module and pass --op-plugin MODULE.py (the module calls runtime.register_op({t!r}, fn))")


def _select_dpu_subgraphs(g, model: str, name: str | None = None) -> list:
    """The DPU subgraphs of a graph (only `name` when given); an error naming the model when there are none."""
    from opendpu.runtime.dpu import dpu_subgraphs
    sgs = dpu_subgraphs(g)
    if not sgs:
        raise CliError(f"{model} has no DPU subgraph")
    if name:
        chosen = [s for s in sgs if s.name == name]
        if not chosen:
            raise CliError(f"--subgraph {name!r}: no DPU subgraph of that name in {model} "
                           f"(DPU subgraphs: {[s.name for s in sgs]})")
        return chosen
    return sgs


def _warm_kernels() -> float:
    """Compile (or load from the cache) the simulator kernels, reporting it apart from the work's timing."""
    from opendpu.sim import warm_kernels
    msg = []

    def log(s):
        msg.append(s)
        print(s, file=sys.stderr, flush=True)
    dt = warm_kernels(log=log)
    if msg:
        print(f"compiled simulator kernels in {dt:.1f} s (cached for the next runs)", file=sys.stderr)
    return dt


# ---- run ------------------------------------------------------------------------------------------
def _run_inputs(a, specs) -> list[np.ndarray]:
    """The arrays given with -i, one per graph input (or one .npz keyed by tensor/op name)."""
    paths = a.input or []
    if not paths:
        raise CliError(f"no input: {a.model} takes {len(specs)} input(s) "
                       f"{[f'{s.name} {list(s.dims)}' for s in specs]}; give -i FILE per input")
    if len(paths) == 1 and paths[0].endswith(".npz"):
        z = load_npz(paths[0], "input")
        xs = []
        for s in specs:
            key = s.name if s.name in z else (s.op_name if s.op_name in z else None)
            if key is None:
                raise CliError(f"input {paths[0]} has no array for input {s.name!r} (keys: {list(z)})")
            xs.append(z[key])
        extra = set(z) - {s.name for s in specs} - {s.op_name for s in specs}
        if extra:
            raise CliError(f"input {paths[0]}: arrays {sorted(extra)} are not inputs of {a.model} "
                           f"(inputs: {[s.name for s in specs]})")
        return xs
    if len(paths) != len(specs):
        raise CliError(f"{a.model} takes {len(specs)} input(s) {[s.name for s in specs]}, got {len(paths)} -i; "
                       f"give one -i per input (.npy or .bin) or one .npz with arrays named by tensor")
    xs = []
    for s, p in zip(specs, paths):
        if p.endswith(".bin"):
            if s.dtype != "xint8":
                raise CliError(f"input {p}: a .bin is raw int8 fixed point, but input {s.name!r} is float32; "
                               f"give an .npy")
            x = load_bin(p, int(np.prod(s.dims)), "input").reshape(s.dims)
        elif p.endswith(".npz"):
            raise CliError(f"input {p}: an .npz must be the only -i (arrays named by tensor)")
        else:
            x = load_array(p, "input")
        xs.append(x)
    return xs


def cmd_run(a) -> int:
    from opendpu.runtime.dpu import RuntimeErrorDPU
    from opendpu.runtime.runner import GraphRunner, layout_name
    # ---- validate everything before any work
    input_file(a.model, "model")
    ins = list(a.input or [])
    for p in ins:
        input_file(p, "input")
    if a.backend == "ref" and (a.timing or a.clock_mhz is not None or a.board):
        raise CliError("--timing, --clock-mhz and --board apply to the timed backends (sim, rtl), not to --backend "
                       "ref")
    tm = {**_board_timing(a), **timing_overrides(a.timing, a.clock_mhz)}     # given to the program's own array
    inputs_all = [a.model] + ins + list(a.op_plugin or [])
    if a.output:
        check_file(a.output, suffixes=(".npz",), inputs=inputs_all, what="-o")
    if a.dump:
        check_dir(a.dump, force=a.force, inputs=inputs_all, what="--dump directory")
    gfiles = []
    if a.golden:
        input_dir(a.golden, "--golden directory")
        gfiles = _golden_files(a.golden)
        if not gfiles:
            raise CliError(f"--golden directory {a.golden} holds no golden .bin file; nothing would be compared")
    _load_plugins(a.op_plugin)
    g = _load_graph(a.model)
    if a.dump:                  # every tensor the dump may hold: names fit, and none replaces a file not opendpu's
        check_dir(a.dump, force=a.force, inputs=inputs_all, what="--dump directory",
                  names=sorted({dump_stem(op.output.name) + e for op in g.ops.values() for e in (".bin", ".txt")}))
    _check_cpu_ops(g)
    gr = GraphRunner(g, backend=a.backend, target=a.target, timing=tm)
    specs = gr.get_inputs()
    xs = _run_inputs(a, specs)
    prepared = []
    for s, x in zip(specs, xs):
        try:
            prepared.append(gr.prepare_input(s, x, a.layout))
        except RuntimeErrorDPU as e:
            raise CliError(str(e)) from None
        how = "transposed from NCHW" if (a.layout == "nchw" and np.ndim(x) == 4) else "as given"
        print(f"input {s.name}: {np.asarray(x).dtype} {list(np.shape(x))} -> {list(s.dims)} "
              f"{layout_name(s.dims)} ({how})" + (f", quantized with fix_point {s.fix_point}"
                                                  if s.dtype == "xint8" and np.asarray(x).dtype != np.int8 else ""))
    if a.board and gr.runners:
        print(_board(a).applied_to([r.target for r in gr.runners.values()]))
    # ---- work
    if a.backend != "ref" and gr.runners:
        _warm_kernels()
    from opendpu.runtime.progress import progress_bar
    with progress_bar("RTL build and run", enabled=a.backend == "rtl") as prog:
        for r in gr.runners.values():
            r.progress = prog
        t0 = time.perf_counter()
        res = gr.run(prepared, keep_values=True, layers=bool(a.dump or a.golden))
        dt = time.perf_counter() - t0
    print(f"ran {a.model} on backend {a.backend} in {dt * 1e3:.2f} ms (host time"
          + (", including the RTL build" if a.backend == "rtl" else "") + ")")
    for name, r in gr.runners.items():
        st = r.stats
        if "cycles" in st:
            print(f"  DPU subgraph {name}: {st['cycles']} cycles = {st['latency_ms']:.3f} ms at "
                  f"{st['clock_mhz']:g} MHz on {r.target.name}")
    outs = gr.output_values(res, raw=a.raw)
    for name, (v, fp) in outs.items():
        flat = v.reshape(-1)
        extra = f", argmax {int(np.argmax(flat))}" if 0 < flat.size <= 1000 else ""
        what = (f"raw int8, fix_point {fp}" if v.dtype == np.int8 else
                (f"dequantized with fix_point {fp}" if fp is not None else "float"))
        print(f"  output {name}: shape {list(v.shape)} {v.dtype} ({what}){extra}")
    if a.output:
        arrays = {name: v for name, (v, _) in outs.items()}
        if a.raw:
            arrays.update({f"{name}.fix_point": np.array(fp, np.int32) for name, (v, fp) in outs.items()
                           if fp is not None})
        _atomic_write(a.output, lambda tmp: np.savez(tmp, **arrays), "output")
        print(f"wrote {a.output} ({len(outs)} output(s), "
              + ("raw int8 with '<name>.fix_point' arrays" if a.raw else "float32 real values") + ")")
    rc = 0
    if a.dump or a.golden:
        layer_vals: dict[str, np.ndarray] = {}
        for op_name, v in res.values.items():          # observable values: inputs, CPU and DPU-subgraph outputs
            if np.asarray(v).dtype == np.int8 and op_name in g.ops:
                layer_vals[g.ops[op_name].output.name] = v
        for sgname, lv in res.layers.items():
            for op_name, v in lv.items():
                layer_vals[g.ops[op_name].output.name] = v
        for sgname, outs_ in res.dpu_outputs.items():
            layer_vals.update(outs_)
        if a.dump:
            with DirOutput(a.dump, force=a.force, inputs=inputs_all, what="--dump directory",
                           net=_stem(a.model)) as tmpd:
                for name, v in layer_vals.items():
                    _write_dump(tmpd, name, v)
            print(f"wrote {len(layer_vals)} tensors (.bin + .txt) to {a.dump}")
        if a.golden:
            rc = _compare_golden(g, a.golden, gfiles, layer_vals)
    return rc


def _compare_golden(g, gdir: str, gfiles: list[str], layer_vals: dict) -> int:
    """Compare every golden file with the value of its tensor; account for every file and every tensor."""
    idx = _golden_index(gfiles)
    model_tensors = {dump_stem(op.output.name): op.output.name for op in g.ops.values()}
    fails = compared = 0
    used: set[str] = set()
    for name, v in layer_vals.items():
        f = idx.get(dump_stem(name))
        if f is None:
            continue
        used.add(f)
        gold = np.fromfile(os.path.join(gdir, f), dtype=np.int8)
        ok = gold.size == v.size and np.array_equal(gold, np.asarray(v).astype(np.int8).reshape(-1))
        compared += 1
        fails += not ok
        print(f"XLNX_GOLDEN_DIR: compare data {'success !' if ok else 'fail ! '}layer_name {name} "
              f"dump_md5 {_md5(v)} golden_md5 {_md5(gold)}")
    on_chip = unrelated = 0
    for f in gfiles:
        if f in used:
            continue
        stem = f[:-4]
        bases = [stem[: len(stem) - len(suf)] for suf in _GOLDEN_SUFFIXES if stem.endswith(suf)]
        if any(b in model_tensors for b in bases):
            on_chip += 1
        else:
            unrelated += 1
    without = sum(1 for n in layer_vals if idx.get(dump_stem(n)) is None)
    print(f"compared {compared} of {len(gfiles)} golden files; {on_chip} kept on chip (not observable); "
          f"{without} without a golden; {unrelated} not of this model"
          + (f"; {fails} mismatching" if fails else ""))
    if compared == 0:
        raise CliError(f"--golden {gdir}: compared 0 of {len(gfiles)} golden files (none names a tensor of this "
                       f"model that this backend observes)")
    return 1 if fails else 0


# ---- check ----------------------------------------------------------------------------------------
def _check_target(dpu, spec) -> None:
    from opendpu.isa.target import get_target
    t = get_target(spec)
    if t.fingerprint != dpu.fingerprint:
        raise CliError(f"--target {spec}: subgraph {dpu.name!r} was compiled for {dpu.target.name}, not {t.name} "
                       f"(VART_GRAPH_FINGERPRINT_ERROR)")


def cmd_check(a) -> int:
    from opendpu.runtime.dpu import DpuSubgraph
    from opendpu.runtime.layers import run_tracked
    from opendpu.runtime.progress import progress_bar
    input_file(a.model, "model")
    _load_plugins(a.op_plugin)
    g = _load_graph(a.model)
    dpus = [DpuSubgraph(g, sg) for sg in _select_dpu_subgraphs(g, a.model)]
    for dpu in dpus:
        if a.target is not None:
            _check_target(dpu, a.target)
        dpu.validate()
    _warm_kernels()
    rng = np.random.default_rng(a.seed)
    bad = 0
    for dpu in dpus:
        machine = dpu.new_machine(seed=a.seed)
        compared = mism = 0
        first = None
        layers_ok: set[str] = set()
        t0 = time.perf_counter()
        with progress_bar(f"check {dpu.name[:40]}", enabled=len(dpu.instructions) * a.n > 20000) as prog:
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
                if prog:
                    prog(k + 1, a.n, "inputs")
        dt = time.perf_counter() - t0
        status = "PASS" if mism == 0 else "FAIL"
        bad += mism != 0
        print(f"{status} {dpu.name}: target {dpu.target.name}, {len(dpu.instructions)} instructions, "
              f"{a.n} inputs, {compared} bytes compared, {mism} mismatching"
              + f", {len(layers_ok)} stored layers matched"
              + (f", first mismatching layer {first}" if first else "")
              + f" ({dt:.2f} s)")
    return 1 if bad else 0


# ---- races -------------------------------------------------------------------------------------------------
def cmd_races(a) -> int:
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
            print(f"  {r.kind} instruction {i} ({d.instructions[i].op}) -> instruction {j} "
                  f"({d.instructions[j].op}) on {space.describe(r.key)}: no token path orders them")
    return 1 if bad else 0


# ---- disasm / xmodel / targets -----------------------------------------------------------------------
def cmd_disasm(a) -> int:
    from opendpu.runtime.disasm import disasm_subgraph
    g = _load_graph(a.model)
    sgs = _select_dpu_subgraphs(g, a.model, a.subgraph)
    out = sys.stdout
    for sg in sgs:
        text = disasm_subgraph(g, sg)
        out.write(f"# subgraph {sg.name}\n")
        out.write(text if text.endswith("\n") else text + "\n")
    return 0


def cmd_xmodel(a) -> int:
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


def cmd_targets(a) -> int:
    from opendpu.isa.target import PRESETS, Target
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


# ---- profile / sweep / cosim ------------------------------------------------------------------------------
def _atomic_write(path: str, fn, what: str) -> None:
    """fn(tmp) writes a new uniquely named hidden sibling with the same suffix, renamed onto `path`: a failure
    leaves no partial file, and no file of the user's is ever used as the temporary."""
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".opendpu-tmp-{os.getpid()}-{os.urandom(4).hex()}{os.path.splitext(path)[1]}")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))      # ordinary permissions (umask)
        fn(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise CliError(f"cannot write the {what} to {path}: {e.strerror or e}") from None
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


def _write_announced(path: str, fn, what: str) -> None:
    """Write through a temporary sibling, then rename (`_atomic_write`); then say so."""
    _atomic_write(path, fn, what)
    print(f"wrote {what} to {path}")


def _board(a):
    """--board: the board profile (isa/boards.py), None without --board; an unknown name is a mistake."""
    from opendpu.isa.boards import get_board
    from opendpu.isa.target import TargetError
    if not getattr(a, "board", None):
        return None
    try:
        return get_board(a.board)
    except TargetError as e:
        raise CliError(f"--board {a.board}: {e}") from None


def _board_timing(a) -> dict:
    """--board: the timing the board sets (clock, cores, DDR, host overhead, calibrated DPU timing); {} without
    --board. It is given to the program's own array, whatever it is (the rule of `sweep`, docs/decisions.md): a
    board's DPU is built for the design, so any array runs there with the board's clock, DDR and host."""
    b = _board(a)
    return b.timing() if b is not None else {}


def cmd_profile(a) -> int:
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
        print(f"board {a.board}: {tmg.cores} core(s) at {tmg.clock_mhz:g} MHz, host {tmg.frame_overhead_us} us per "
              f"DPU run, DDR {tmg.board_ddr_mbps} MB/s x {tmg.ddr_efficiency_pct} %: {tp.fps:.1f} fps "
              f"({'DDR-bound' if tp.ddr_bound else 'compute-bound'}; {tp.latency_ms:.3f} ms per frame per core, "
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


def _arch_sweep_wanted(a) -> str | None:
    """The sweep's mode (docs/sweeps.md "Modes"): None for the timing-only sweep of one compiled program (one
    compiled .xmodel, every --param a timing field, no --spec), else why it is an architecture sweep (compile per
    point). Options decide nothing: one that the chosen mode does not use is an error (sweep_cli)."""
    from opendpu.runtime.archsweep import ARCH_PARAMS
    if a.spec:
        return "--spec is given"
    if len(a.models) != 1:
        return f"{len(a.models)} models" if a.models else "no MODEL argument"
    m = a.models[0]
    if m.startswith("zoo:"):
        return f"{m} is a zoo model"
    if not m.endswith(".xmodel"):
        return f"{m} is not a compiled .xmodel"
    arch = [k for k in (s.split("=", 1)[0].strip() for s in a.param or []) if k in ARCH_PARAMS]
    if arch:
        return f"--param {arch[0]} is an architecture parameter"
    from opendpu.compiler.frontend import detect_form
    a.model = m                          # errors name the file
    a.sweep_graph = _load_graph(m)      # a missing or damaged file is reported as such, in either mode
    form = detect_form(a.sweep_graph, m)
    return None if form == "compiled" else f"{m} is a quantized xmodel, not a compiled one"


def cmd_sweep(a) -> int:
    why = _arch_sweep_wanted(a)
    if why:
        from opendpu.runtime.sweep_cli import cmd_arch_sweep
        return cmd_arch_sweep(a, why)
    a.model = a.models[0]
    return _timing_sweep(a)


def _timing_sweep(a) -> int:
    from opendpu.isa.target import get_target
    from opendpu.runtime.dpu import DpuSubgraph
    from opendpu.runtime.progress import progress_bar
    from opendpu.runtime.sweep_cli import TIMING_MODE, timing_mode_conflict
    from opendpu.sim.sweep import SWEEP_COLUMNS, sweep
    input_file(a.model, "model")
    if not a.param:
        raise CliError("give at least one --param NAME=V1,V2,... (a timing parameter, e.g. ddr_latency=40,80)")
    axes: dict = {}
    for spec in a.param:
        if "=" not in spec:
            raise CliError(f"--param {spec!r}: expected NAME=V1,V2,... (e.g. ddr_latency=40,80)")
        k, vals = (x.strip() for x in spec.split("=", 1))
        if k in axes:
            raise CliError(f"--param {k} is given twice; list all its values in one --param {k}=V1,V2,...")
        parts = [v.strip() for v in vals.split(",")]
        if not vals or any(not v for v in parts):
            raise CliError(f"--param {spec!r}: empty value")
        axes[k] = [timing_value(k, v, "--param") for v in parts]
        if len(set(axes[k])) != len(axes[k]):
            raise CliError(f"--param {k}: a value is repeated ({vals})")
    conflict = timing_mode_conflict(a)
    if conflict:
        raise CliError(conflict)
    npoints = int(np.prod([len(v) for v in axes.values()]))
    if npoints > 100000:
        raise CliError(f"--param: {npoints} points (the cartesian product) is too many; at most 100000")
    if a.csv:
        check_file(a.csv, suffixes=(".csv",), inputs=[a.model], what="--csv")
    g = getattr(a, "sweep_graph", None) or _load_graph(a.model)
    dpus = [DpuSubgraph(g, sg) for sg in _select_dpu_subgraphs(g, a.model)]
    t = dpus[0].target
    if a.target:
        t = get_target(a.target)
        if any(d.fingerprint != t.fingerprint for d in dpus):
            raise CliError(f"--target {a.target}: {a.model} was compiled for {dpus[0].target.name} "
                           f"(VART_GRAPH_FINGERPRINT_ERROR)")
    if len({d.fingerprint for d in dpus}) > 1:
        raise CliError(f"{a.model}: DPU subgraphs were compiled for different targets; sweep one model per target")
    for d in dpus:
        d.validate(t)
    print(f"sweep: {TIMING_MODE}: {a.model}, {npoints} point(s) of {', '.join(axes)} (no recompilation)",
          flush=True)
    _warm_kernels()
    with progress_bar(f"sweep {npoints} points", enabled=npoints > 1) as prog:
        rows = sweep([d.arrays for d in dpus], t, axes, progress=prog)
    cols = list(axes) + [c for c in SWEEP_COLUMNS if c != "point"]
    print(" ".join(f"{c:>14s}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:14.4g}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in cols))
    if a.csv:
        import csv

        def write(p):
            with open(p, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=cols)
                w.writeheader()
                w.writerows({c: r[c] for c in cols} for r in rows)
        _write_announced(a.csv, write, f"{len(rows)} rows as CSV")
    return 0


def cmd_cosim(a) -> int:
    """RTL vs cycle model on an xmodel's DPU subgraphs, or on random generated programs."""
    from opendpu.isa.target import get_target
    from opendpu.runtime.progress import progress_bar
    from opendpu.runtime.cosim import check_target_matches, cosim_programs, dump_waves, subgraph_program, waves_names
    if a.bank_conflicts and not a.random:
        raise CliError("--bank-conflicts applies to --random programs only")
    if a.model and a.random:
        raise CliError(f"give either an xmodel ({a.model}) or --random N, not both")
    if not a.model and not a.random:
        raise CliError("give an xmodel, or --random N with --target")
    if a.model:
        input_file(a.model, "model")
        if a.instructions is not None:
            raise CliError("--instructions applies to --random programs only")
    elif a.subgraph:
        raise CliError("--subgraph applies to an xmodel, not to --random programs")
    tm = timing_overrides(a.timing)
    if a.waves:
        check_dir(a.waves, force=a.force, inputs=[a.model] if a.model else [], what="--waves directory")
    programs = []
    if a.random:
        if not a.target:
            raise CliError("--random needs --target (a preset, fingerprint or arch.json)")
        from opendpu.sim.progen import random_program
        t = get_target(a.target)
        t = t.with_timing(**tm) if tm else t
        n = a.instructions if a.instructions is not None else 60
        for i in range(a.random):
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


# ---- quantize / inspect / zoo ---------------------------------------------------------------------
def _npz_or_npy(path: str, what: str):
    """(x, y or None) from an .npz (arrays 'x' and optional 'y'), else the path (an .npy or folder of .npy)."""
    if path.endswith(".npz") and os.path.isfile(path):
        z = load_npz(path, what)
        if "x" not in z:
            raise CliError(f"{what} {path}: needs an array named 'x' (and optionally labels 'y'); has {list(z)}")
        return z["x"], z.get("y")
    if os.path.isfile(path):
        return load_array(path, what), None
    return path, None


def _onnx_input_shape(path: str, input_shape: list[int] | None = None) -> list[int]:
    """[1, C, H, W] of an ONNX model's first input (batch fixed to 1), checked as the quantizer checks it; dynamic
    dimensions come from `input_shape` (--input-shape)."""
    from opendpu.quant.onnx_in import _static_input_shapes, load_onnx
    shp = _static_input_shapes(load_onnx(path), path, input_shape)[0][1]
    if input_shape is not None and (len(input_shape) != len(shp) or list(input_shape[1:]) != shp[1:]):
        given = ",".join(map(str, input_shape))
        decl = _dynamic_input(path) or ",".join(map(str, shp))
        hint = ""
        if len(input_shape) == 4 and len(shp) == 4 and input_shape[3] == shp[1]:
            hint = (f"; {given} reads as NHWC, but --input-shape takes the ONNX model's own layout: "
                    f"{input_shape[0]},{input_shape[3]},{input_shape[1]},{input_shape[2]}")
        raise CliError(f"--input-shape {given} does not match the model input {decl} (NCHW) of {path}{hint}")
    return shp


def _dynamic_input(model: str) -> str | None:
    """'N,1,H,W': the declared shape of an ONNX model's input when a dimension after the batch is dynamic (a
    dim_param name, '?' when unnamed); None when those are static, or for an input the quantizer refuses with its
    own message (_onnx_input_shape)."""
    from opendpu.quant.onnx_in import _declared_dims, load_onnx
    m = load_onnx(model)                    # a bad model is reported as such, before the data is read
    inits = {i.name for i in m.graph.initializer}
    vis = [vi for vi in m.graph.input if vi.name not in inits]
    if len(vis) != 1 or vis[0].type.WhichOneof("value") != "tensor_type":
        return None
    decl = _declared_dims(vis[0].type.tensor_type, None)
    if all(v is not None for v, _ in decl[1:]):
        return None
    return ",".join(str(v) if v is not None else (p or "?") for v, p in decl)


def _calib_shape(model: str, calib: str) -> list[int] | None:
    """For a model with dynamic input dimensions and no --input-shape: [1] + the shape of one calibration sample
    (an .npy / .npz file of [N, C, H, W], or a folder's first file, [N, C, H, W] or one [C, H, W] sample); None when
    the model's shape is static or the data says nothing."""
    decl = _dynamic_input(model)
    if decl is None:
        return None
    path = calib
    if os.path.isdir(calib):
        files = sorted(f for f in os.listdir(calib) if f.endswith((".npy", ".npz")))
        if not files:
            return None                     # calib_arrays names the empty folder
        path = os.path.join(calib, files[0])
    if not os.path.isfile(path):
        return None
    from opendpu.quant.quantize import _load_array
    x = _load_array(path, "calibration data")
    rank = len(decl.split(","))
    if x.ndim == rank:
        return [1] + [int(d) for d in x.shape[1:]]
    if x.ndim == rank - 1 and os.path.isdir(calib):
        return [1] + [int(d) for d in x.shape]
    return None


def cmd_quantize(a) -> int:
    from opendpu.quant.quantize import QuantConfig, calib_arrays, output_names, quantize
    input_file(a.model, "model")
    input_path(a.calib, "--calib")
    ins = [a.model, a.calib]
    if a.quant_info:
        ins.append(input_file(a.quant_info, "--quant-info"))
    if a.evaluate:
        ins.append(input_file(a.evaluate, "--evaluate"))
    check_dir(a.output, force=a.force, inputs=ins, what="output directory (-o)", names=output_names(a.model))
    cfg = QuantConfig(method=a.method, weight_method=a.weight_method, statistic=a.statistic,
                      percentile=a.percentile, batch_size=a.batch_size, calib_limit=a.calib_limit,
                      replace_sigmoid=a.replace_sigmoid, replace_silu=a.replace_silu, bias_corr=a.bias_corr,
                      fast_finetune=a.fast_finetune, nodes_to_exclude=tuple(a.exclude_nodes or ()), seed=a.seed,
                      cle=not a.no_cle)
    from_data = None if a.input_shape else _calib_shape(a.model, a.calib)
    shape = _onnx_input_shape(a.model, a.input_shape or from_data)
    # checked before any work; errors name the file. Constant data is refused unless no calibration runs
    x = calib_arrays(a.calib, shape, cfg.calib_limit, check_values=not a.quant_info)
    ev_data = None
    if a.evaluate:                          # checked before calibration, so a bad evaluation set costs nothing
        from opendpu.quant.onnx_in import QuantError
        from opendpu.quant.quantize import eval_arrays, output_classes
        ex, ey = _npz_or_npy(a.evaluate, "--evaluate")
        try:
            classes = output_classes(a.model, shape) if ey is not None else None
            ev_data = eval_arrays(ex, shape, ey, classes)
        except QuantError as e:
            raise CliError(f"--evaluate {a.evaluate}: {e}") from None
    if from_data:
        print(f"input shape {_dynamic_input(a.model)} (NCHW) of {a.model} taken from the calibration data "
              f"{a.calib}: {','.join(map(str, shape))}; --input-shape N,C,H,W sets it")
    if not a.quant_info:
        from opendpu.quant.quantize import calib_warnings
        for w in calib_warnings(x, f"calibration data {a.calib}"):
            _warn(w)
    t0 = time.perf_counter()
    from opendpu.runtime.progress import progress_bar
    with progress_bar("calibration") as prog:
        res = quantize(a.model, x, target=a.target, config=cfg, quant_info=a.quant_info, input_shape=shape,
                       progress=(lambda i, n: prog(i, n, "batches")) if prog else None)
    ev = res.evaluate(*ev_data) if ev_data else None
    paths = res.write(a.output, calib_x=x, evaluate=ev, force=a.force, inputs=ins, xmodel_format=a.format)
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
    for k in ("xmodel", "onnx", "quant_info", "golden", "report", "report_json"):
        if k in paths:
            print(f"wrote {k:10s} {_shown(a, paths[k], a.output)}")
    return 0


def _inspect_targets(spec: str) -> list:
    """inspect's --target T[,T...]: each a preset, fingerprint or arch.json, resolved before any work."""
    from opendpu.isa.target import TargetError, get_target
    names = [spec] if os.path.isfile(spec) else [s.strip() for s in spec.split(",")]
    if not all(names):
        raise CliError(f"--target {spec!r}: an empty target name; give T or T1,T2,... (presets, fingerprints or "
                       f"arch.json files)")
    out: list = []
    for s in names:
        try:
            t = get_target(s)
        except TargetError as e:
            raise CliError(f"--target {s}: INSPECTOR_INPUT_FORMAT: {e}") from None
        if any(t.name == u.name for u in out):
            raise CliError(f"--target {spec}: target {t.name} is named twice")
        out.append(t)
    return out


def cmd_inspect(a) -> int:
    """DPU or CPU for every op of a float ONNX model (the rules) or a quantized xmodel (the compiler's partition),
    per target; the summary opens with each target's DPU coverage."""
    from opendpu.compiler.partition import format_coverage, target_label
    from opendpu.quant.inspect import (format_inspect, format_partition, inspect_coverage, inspect_model,
                                       place_prepared)
    input_file(a.model, "model")
    if a.image_format:
        raise CliError(f"--image-format {a.image_format}: graph images are not generated by opendpu (the text "
                       f"report inspect_<target>.txt is); drop the option")
    targets = _inspect_targets(a.target)
    names = [f"inspect_{t.name}.txt" for t in targets]
    check_dir(a.output, force=a.force, inputs=[a.model], what="output directory (-o)", names=names)
    reports = []                # (target, coverage, full text, text at --verbose)
    if a.model.endswith(".xmodel"):
        from opendpu.compiler.frontend import canonicalize, detect_form
        from opendpu.compiler.partition import coverage, partition
        if a.input_shape:
            raise CliError(f"--input-shape applies to ONNX models; {a.model} keeps the shapes it was quantized with")
        g = _load_graph(a.model)
        if detect_form(g, a.model) == "compiled":
            raise CliError(f"{a.model} is a compiled xmodel; inspect takes a float ONNX model or a quantized xmodel "
                           f"(opendpu quantize's *_int.xmodel)")
        cg = canonicalize(g)
        for t in targets:
            part = partition(cg, t)
            reports.append((t, coverage(part), format_partition(t, part, 2), format_partition(t, part, a.verbose)))
    else:
        decl = None if a.input_shape else _dynamic_input(a.model)
        if decl:                # the rule of every verb: --input-shape, else the calibration data; inspect has none
            dyn = [f"dimension {i} ({d})" for i, d in enumerate(decl.split(",")) if i and not d.isdigit()]
            raise CliError(f"{a.model}: input shape {decl} (NCHW): {' and '.join(dyn)} "
                           f"{'are' if len(dyn) > 1 else 'is'} dynamic; give --input-shape N,C,H,W (NCHW) (quantize "
                           f"and build take it from their calibration data; inspect reads no data)")
        shape = _onnx_input_shape(a.model, a.input_shape)
        _, prep, rows0 = inspect_model(a.model, targets[0], shape)
        for t in targets:
            rows = rows0 if t is targets[0] else place_prepared(prep, t)
            reports.append((t, inspect_coverage(prep, rows), format_inspect(t, prep, rows, 2),
                            format_inspect(t, prep, rows, a.verbose)))
    if a.verbose:
        for *_, text in reports:
            print(text, end="")
    with DirOutput(a.output, force=a.force, inputs=[a.model], what="output directory (-o)",
                   net=_stem(a.model)) as tmp:
        for name, (_, _, full, _) in zip(names, reports):
            with open(os.path.join(tmp, name), "w") as f:
                f.write(full)
    for t, cov, *_ in reports:
        print(format_coverage(cov, target_label(t)))
    for name in names:
        print(f"wrote {os.path.join(a.output, name)}")
    return 0


def cmd_zoo(a) -> int:
    from opendpu.quant import zoo
    names = a.names or list(zoo.NAMES)
    for n in names:
        if n not in zoo.NAMES:
            raise CliError(f"unknown zoo model {n!r}; choose from {', '.join(zoo.NAMES)}")
    if len(set(names)) != len(names):
        raise CliError(f"a zoo model is named twice: {' '.join(names)}")
    if a.export:
        check_dir(a.export, force=a.force, what="--export directory", names=[f"{n}.onnx" for n in names])
    built: dict = {}
    rows = zoo.summary(names, a.size, models=built)
    print(f"{'model':14s} {'input':16s} {'GMACs':>7s} {'GOPs':>7s} {'params':>11s} {'published GOPs':>14s} "
          f"{'published params':>16s}")
    for r in rows:
        pg = r.get("published_gops")
        pp = r.get("published_params")
        print(f"{r['name']:14s} {r['input']:16s} {r['macs'] / 1e9:7.3f} {r['gops']:7.3f} {r['params']:11,d} "
              f"{(f'{pg:.3f}' if pg else '-'):>14s} {(f'{pp:,}' if pp else '-'):>16s}")
    if a.export:
        import onnx
        with DirOutput(a.export, force=a.force, what="--export directory",
                       net=lambda rel: rel[:-len(".onnx")]) as tmp:     # each exported model is a net of its own
            for n in names:
                onnx.save(built[n], os.path.join(tmp, f"{n}.onnx"))
        for n in names:
            print(f"wrote {os.path.join(a.export, n + '.onnx')}")
    return 0


# ---- compile / build ------------------------------------------------------------------------------------
def _compile_target(a):
    """The target of `compile`: -a arch.json or --target (a preset, fingerprint or arch.json), exactly one."""
    from opendpu.isa.target import get_target
    if a.arch and a.target:
        raise CliError(f"give either -a {a.arch} or --target {a.target}, not both")
    if not a.arch and not a.target:
        raise CliError("give the target: -a ARCH.json or --target NAME (e.g. DPUCZDX8G_ISA1_B4096)")
    if a.arch:
        input_file(a.arch, "-a arch.json")
    return get_target(a.arch or a.target)


def cmd_compile(a) -> int:
    """vai_c_xir: a quantized xmodel -> DIR/NAME.xmodel, DIR/NAME_org.xmodel, DIR/meta.json, DIR/report.json/.txt."""
    from opendpu.compiler.pipeline import check_dump_after, check_graph, check_name, output_names, parse_options
    from opendpu.compiler.partition import format_coverage, target_label
    from opendpu.compiler.pipeline import compile as compile_graph
    input_file(a.xmodel, "-x model")
    target = _compile_target(a)
    name = check_name(a.net_name)
    opts = parse_options(a.options) if a.options is not None else {}
    dumps = check_dump_after(a.dump_after)
    inputs = [a.xmodel] + ([a.arch] if a.arch else []) + ([a.target] if a.target and os.path.isfile(a.target) else [])
    check_dir(a.output_dir, force=a.force, inputs=inputs, what="output directory (-o)",
              names=output_names(name, dumps))
    g = _load_graph(a.xmodel)
    check_graph(g, a.recompile, opts)
    from opendpu.runtime.costmodel import cycle_model
    res = compile_graph(g, target, name=name, recompile=a.recompile, dump_after=dumps, log=print, cycles=cycle_model,
                        **opts)
    with DirOutput(a.output_dir, force=a.force, inputs=inputs, what="output directory (-o)", net=name) as tmp:
        written = [os.path.basename(p) for p in res.write(tmp)]       # files() serialises the graph: once
    print(format_coverage(res.meta["coverage"], target_label(target)))
    for f in written:
        print(f"wrote {_shown(a, os.path.join(a.output_dir, f), a.output_dir)}")
    return 0


def _verb_args(argv: list[str]):
    """Another verb's parsed arguments (its code path runs inside this verb); its usage errors are ours."""
    try:
        return build_parser().parse_args(argv)
    except _UsageError as e:
        raise CliError(f"{e.prog}: {e}") from None


def cmd_build(a) -> int:
    """quantize + compile + check in one step, all outputs under one directory (published only when all succeed)."""
    from opendpu.compiler.partition import format_coverage, target_label
    from opendpu.compiler.pipeline import check_name, output_names, parse_options
    from opendpu.isa.target import get_target
    from opendpu.quant.quantize import output_names as quant_names
    input_file(a.model, "model")
    input_path(a.calib, "--calib")
    target = get_target(a.target)
    stem = os.path.splitext(os.path.basename(a.model))[0]
    name = check_name(a.net_name or stem)
    if a.options is not None:
        parse_options(a.options)
    inputs = [a.model, a.calib] + ([a.target] if os.path.isfile(a.target) else [])
    if a.evaluate:
        inputs.append(input_path(a.evaluate, "--evaluate") or a.evaluate)
    check_dir(a.output, force=a.force, inputs=inputs, what="output directory (-o)",
              names=[f"quantized/{f}" for f in quant_names(a.model)] + [f"compiled/{f}" for f in output_names(name)]
              + ["accuracy.json"])
    # the three verbs' own arguments, checked before any work; their paths are set inside the output below
    q = _verb_args(["quantize", a.model, "--calib", a.calib, "--target", a.target, "-o", "quantized",
                    "--seed", str(a.seed)] + (["--method", a.method] if a.method else [])
                   + (["--input-shape", ",".join(map(str, a.input_shape))] if a.input_shape else [])
                   + (["--replace-sigmoid"] if a.replace_sigmoid else [])
                   + (["--replace-silu", a.replace_silu] if a.replace_silu else [])
                   + (["--fast-finetune"] if a.fast_finetune else [])
                   + (["--bias-corr"] if a.bias_corr else [])
                   + (["--no-cle"] if a.no_cle else [])
                   + (["--exclude-nodes", ",".join(a.exclude_nodes)] if a.exclude_nodes else []))
    c = _verb_args(["compile", "-x", "quantized.xmodel", "--target", a.target, "-o", "compiled", "-n", name]
                   + (["--options", a.options] if a.options is not None else []))
    k = _verb_args(["check", f"{name}.xmodel", "-n", str(a.check_n), "--seed", str(a.seed)])
    ev_data, ev_what = _build_eval_data(a, q)
    out = DirOutput(a.output, force=a.force, inputs=inputs, what="output directory (-o)", net=name)
    with out as tmp:
        q.output, c.output_dir = os.path.join(tmp, "quantized"), os.path.join(tmp, "compiled")
        q.shown_dir, c.shown_dir = os.path.join(a.output, "quantized"), os.path.join(a.output, "compiled")
        q.fn(q)
        found = sorted(f for f in os.listdir(q.output) if f.endswith("_int.xmodel"))
        if len(found) != 1:
            raise CliError(f"quantize wrote {len(found)} *_int.xmodel files, expected one")
        c.xmodel = os.path.join(q.output, found[0])
        print(f"== compile {found[0]}")
        c.fn(c)
        with open(os.path.join(c.output_dir, "meta.json")) as f:
            cov = json.load(f)["coverage"]
        print("== check (sim against ref on random inputs)")
        k.model = os.path.join(c.output_dir, f"{name}.xmodel")
        rc = int(k.fn(k) or 0)
        verdict = _build_verdict(a, tmp, ev_data, ev_what, q.output)
    print(format_coverage(cov, target_label(target)))
    from opendpu.runtime.verdict import NOISE_DB, format_verdict
    for line in format_verdict(verdict):
        print(line)
    if verdict["collapsed"]:
        _warn(f"an output of the INT8 model does not follow the float model (SQNR {verdict['_low']:.1f} dB, "
              f"below {NOISE_DB:g} dB: the error power is half the signal's or more, e.g. a constant or near-zero "
              f"output); this build is not accurate")
    print(f"wrote {a.output}/quantized ({found[0]}, ...) and {a.output}/compiled ({name}.xmodel, {name}_org.xmodel, "
          f"meta.json) and {a.output}/accuracy.json" + ("" if rc == 0 else "; the check found mismatches (exit 1)"))
    if verdict["below_floor"]:
        print(f"opendpu build: accuracy below --min-sqnr {a.min_sqnr:g} dB: smallest output SQNR "
              + ("not measured" if verdict.get("not_measured") else f"{verdict['_low']:.2f} dB")
              + " (exit 1)")
        rc = 1
    return rc


def _build_eval_data(a, q):
    """build's verdict data, checked before any work: (x, y) of --evaluate, else the held-out calibration samples
    (then `q.calib_limit` keeps them out of calibration); and the words naming them."""
    from opendpu.quant.onnx_in import QuantError
    from opendpu.quant.quantize import calib_arrays, eval_arrays
    from opendpu.runtime.verdict import HOLDOUT_MIN, holdout
    shape = _onnx_input_shape(a.model, a.input_shape or _calib_shape(a.model, a.calib))
    if a.evaluate:
        ex, ey = _npz_or_npy(a.evaluate, "--evaluate")
        try:
            x, y = eval_arrays(ex, shape, ey)
        except QuantError as e:
            raise CliError(f"--evaluate {a.evaluate}: {e}") from None
        return (x, y), f"samples of {a.evaluate}"
    x = calib_arrays(a.calib, shape)                # checked as a whole (constant data refused) before any split
    n = len(x)
    h = holdout(n)
    if h == 0:
        return (x, None), (f"calibration samples (fewer than {HOLDOUT_MIN}: none held out, so this measures the "
                           f"calibration set itself)")
    q.calib_limit = n - h
    return (x[n - h:], None), f"held-out samples (the last {h} of {n}; calibrated on the first {n - h})"


def _build_verdict(a, tmp: str, ev_data, ev_what: str, qdir: str) -> dict:
    """Compare the compiled model in `tmp` with the float model, name the first collapsing layer of the quantize
    report, and write `accuracy.json` into `tmp` (published with the build)."""
    from opendpu.runtime.compare import Comparison, CompareError
    from opendpu.runtime.verdict import first_collapse, not_measured, verdict
    print("== accuracy (float onnxruntime against the compiled model on ref)")
    with open(os.path.join(qdir, "report.json")) as f:
        collapse = first_collapse(json.load(f))
    try:
        c = Comparison(a.model, tmp, ev_data, backend="ref")
        for w in c.warnings:
            _warn(w)
        v = verdict(c.run(), ev_what, collapse, a.min_sqnr)
    except CompareError as e:           # e.g. a model onnxruntime cannot load: the build stands, unmeasured
        v = not_measured(str(e).strip().splitlines()[0], ev_what, collapse, a.min_sqnr)
    with open(os.path.join(tmp, "accuracy.json"), "w") as f:
        json.dump({k: x for k, x in v.items() if not k.startswith("_")}, f, indent=1)
        f.write("\n")
    return v


# ---- compare -----------------------------------------------------------------------------------------------
def cmd_compare(a) -> int:
    """Float onnxruntime beside the compiled xmodel on sim / ref: task metric and per-output SQNR."""
    from opendpu.runtime.compare import Comparison, format_report, to_json
    input_file(a.model, "model")
    input_path(a.build_dir, "build directory")
    input_path(a.data, "--data")
    if a.json:
        check_file(a.json, suffixes=(".json",), inputs=[a.model, a.data], what="--json")
    c = Comparison(a.model, a.build_dir, a.data, task=a.task, backend=a.backend, limit=a.limit,
                   score_threshold=a.score_threshold, iou=a.iou)
    for w in c.warnings:
        _warn(w)
    if a.backend == "sim" and c.runner.runners:
        _warm_kernels()
    from opendpu.runtime.progress import progress_bar
    with progress_bar("compare") as prog:
        rep = c.run(progress=prog)
    print(format_report(rep), end="")
    if a.json:
        def write(path):
            with open(path, "w") as f:
                f.write(to_json(rep))
        _write_announced(a.json, write, "JSON report")
    return 0


# ---- the parser --------------------------------------------------------------------------------------------
class _UsageError(Exception):
    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (`opendpu VERB: error: ...`, exit 2) instead of usage + error."""

    def error(self, message):
        raise _UsageError(self.prog, message)

    def parse_args(self, args=None, namespace=None):
        ns, extras = self.parse_known_args(args, namespace)
        if extras:        # reported by the top parser: name the verb they were given to
            cmd = getattr(ns, "cmd", None)
            raise _UsageError(f"{self.prog} {cmd}" if cmd else self.prog,
                              f"unrecognized arguments: {' '.join(extras)}")
        return ns


class _Fmt(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown where there is one (not for flags and unset options); example epilogues kept verbatim."""

    def _get_help_string(self, action):
        if action.default in (None, False) or isinstance(action, argparse._VersionAction):
            return action.help
        return super()._get_help_string(action)


_EXAMPLES = {
    "run": """examples:
  opendpu run model.xmodel -i image.npy -o out.npz              # float NHWC input, float outputs
  opendpu run model.xmodel -i image_nchw.npy --layout nchw     # transpose an NCHW image explicitly
  opendpu run model.xmodel -i x.npy --raw -o out.npz            # int8 outputs + '<name>.fix_point'
  opendpu run q/model_int.xmodel --backend ref -i q/golden/input_aquant.bin --golden q/golden
  opendpu run tf2_custom_op.xmodel -i x.npy --op-plugin mylayer.py
""",
    "check": "examples:\n  opendpu check yolox_nano_b512.xmodel -n 2",
    "disasm": "examples:\n  opendpu disasm dpu_mnist_classifier.xmodel | less",
    "races": "examples:\n  opendpu races yolox_nano_b512.xmodel --limit 5",
    "xmodel": "examples:\n  opendpu xmodel dpu_mnist_classifier.xmodel -v",
    "profile": """examples:
  opendpu profile model.xmodel --trace t.json --plot p.png --csv layers.csv
  opendpu profile model.xmodel --timing ddr_latency=80 --clock-mhz 250
  opendpu profile b3136/net.xmodel --board kr260                # the board's timing on the program's B3136""",
    "sweep": """modes (the first line of the output names the mode):
  timing-only   one compiled .xmodel, every --param a timing field, no --spec: times that program for each
                point, no recompilation; prints the rows, --csv F writes them; --target checks the model's target
  architecture  anything else (zoo:NAME, .onnx, a quantized .xmodel, several models, --spec, or an architecture
                --param: preset, board, pp, cp, alu_pp, bank_depth, img_bg): compiles each model per point; needs
                -o DIR; takes --spec --samples --seed --constraint --calib --cache --plot --heatmap --breakdown
                --executor --address --workers --verify-rtl
  An option of the other mode is an error naming the mode (adding -o never switches the mode).

examples:
  opendpu sweep zoo:resnet50 zoo:mobilenet_v2 --param preset=B512,B1024,B4096 --param board=zcu102,kv260 -o sw
  opendpu sweep net.onnx --calib c.npy --param pp=2,4,8 --param cp=8,12,16 --constraint 'dsp <= 1248' -o sw --plot sw
  opendpu sweep --spec sweep.toml -o sw --executor ray --address 10.0.0.1:6379
  opendpu sweep model.xmodel --param ddr_bytes_per_cycle=8,16,32 --param clock_mhz=200,300 --csv s.csv""",
    "cosim": """examples:
  opendpu cosim dpu_mnist_classifier.xmodel
  opendpu cosim --random 5 --target DPUCZDX8G_ISA1_B512 --instructions 100 --waves wave_dir""",
    "quantize": """examples:
  opendpu quantize model.onnx --calib calib.npy --target DPUCZDX8G_ISA1_B4096 -o q
  opendpu quantize model.onnx --calib data.npz --evaluate test.npz --method maxmin -o q""",
    "inspect": "examples:\n  opendpu inspect model.onnx --target DPUCZDX8G_ISA1_B512 -o insp\n"
               "  opendpu inspect q/net_int.xmodel --target B512,B4096 -o insp    # coverage per target",
    "compile": """examples:
  opendpu compile -x q/digits_cnn_int.xmodel --target DPUCZDX8G_ISA1_B4096 -o c -n digits
  opendpu compile -x q/net_int.xmodel -a arch.json -o c -n net --options '{"output_ops": "fc"}'
  opendpu compile -x c/digits.xmodel --recompile --target DPUCZDX8G_ISA1_B512 -o c512 -n digits""",
    "build": "examples:\n  opendpu build model.onnx --calib calib.npy --target DPUCZDX8G_ISA1_B4096 -o out",
    "compare": """examples:
  opendpu compare model.onnx out --data test.npz                 # out = opendpu build -o; top-1 agreement + SQNR
  opendpu compare yolov8n.onnx out --data images.npy --task detect --score-threshold 0.3 --json acc.json""",
    "zoo": "examples:\n  opendpu zoo resnet18 mobilenet_v2 --size 224 --export models",
    "targets": "examples:\n  opendpu targets --json",
}


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("opendpu")
    except Exception:  # noqa: BLE001 - not installed as a distribution (a source checkout)
        return "0.1.0"


_OUT_RULE = ("created, or opendpu's own: marker .opendpu-output with each file's size and hash; replaced per net: "
             "a rerun removes only the files its own earlier run wrote that are unchanged, each printed; files of "
             "other nets and files opendpu did not write are never deleted")


def _clock_mhz_type():
    """--clock-mhz: a float in the range Timing accepts (isa.target.TIMING_BOUNDS, the one source of the limits)."""
    from opendpu.isa.target import TIMING_BOUNDS
    return float_range(*TIMING_BOUNDS["clock_mhz"], lo_open=False)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="opendpu", description="Open emulator of the AMD DPUCZDX8G (ISA1)", formatter_class=_Fmt)
    p.add_argument("--version", action="version", version=f"opendpu {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="VERB")
    CLOCK_MHZ = _clock_mhz_type()

    def verb(name, help_):
        return sub.add_parser(name, help=help_, description=help_, epilog=_EXAMPLES.get(name), formatter_class=_Fmt)

    def force(x):
        x.add_argument("--force", action="store_true",
                       help="also write into a non-empty directory opendpu did not write, and replace a file there "
                            "that has the name of one of this run's outputs but is not opendpu's unchanged output "
                            "(each replacement is printed); nothing else is deleted or changed")

    def plugin(x):
        x.add_argument("--op-plugin", action="append", metavar="MODULE.py",
                       help="import this module first; it registers custom CPU ops with runtime.register_op")

    r = verb("run", "run an xmodel end to end")
    r.add_argument("model", help="the .xmodel")
    r.add_argument("-i", "--input", action="append", metavar="FILE",
                   help="input .npy (float = real values, int8 = fixed point) or .bin (raw int8), one per graph "
                        "input in the model's layout; or one .npz with arrays named by tensor")
    r.add_argument("-o", "--output", metavar="OUT.npz", help="write the graph outputs by tensor name to this .npz")
    r.add_argument("--layout", choices=("nhwc", "nchw"), default="nhwc",
                   help="layout of 4-D inputs; nchw is transposed to the DPU's NHWC")
    r.add_argument("--raw", action="store_true",
                   help="outputs as raw int8 fixed point (the .npz also holds '<name>.fix_point'); default: float")
    r.add_argument("--backend", choices=("ref", "sim", "rtl"), default="sim",
                   help="ref = XIR reference ops, sim = cycle model, rtl = the Amaranth RTL in Verilator")
    r.add_argument("--target", help="preset name, fingerprint or arch.json (must match the model)")
    r.add_argument("--dump", metavar="DIR", help="write every observable tensor (.bin + .txt) into this directory "
                                                 "(" + _OUT_RULE + "; the net is the model's file stem)")
    r.add_argument("--golden", metavar="DIR", help="compare per layer with the golden .bin files in this directory")
    r.add_argument("--clock-mhz", type=CLOCK_MHZ, help="core clock for the reported latency (sim/rtl)")
    r.add_argument("--timing", action="append", metavar="KEY=VALUE", help="override a timing parameter (sim/rtl)")
    r.add_argument("--board", help="board profile (zcu102, zcu104, kv260, kr260): its clock and the DPU timing fitted "
                                   "on silicon for the reported cycles, given to the program's own array whatever it "
                                   "is (sim/rtl; docs/calibration.md); --timing / --clock-mhz override it")
    plugin(r)
    force(r)
    r.set_defaults(fn=cmd_run)
    c = verb("check", "compare sim and ref on random inputs for every DPU subgraph")
    c.add_argument("model")
    c.add_argument("-n", type=int_range(1, 100000), default=2, help="random inputs per subgraph")
    c.add_argument("--seed", type=SEED, default=0)
    c.add_argument("--target", help="preset name, fingerprint or arch.json (must match the model)")
    plugin(c)
    c.set_defaults(fn=cmd_check)
    rc = verb("races", "token race check: conflicting accesses of different engines that no token path orders")
    rc.add_argument("model")
    rc.add_argument("--subgraph", help="only this DPU subgraph")
    rc.add_argument("--limit", type=int_range(1, 100000), default=20, help="report at most this many races per "
                                                                          "subgraph")
    rc.set_defaults(fn=cmd_races)
    d = verb("disasm", "print the DPU instructions in text assembly (index, instruction, layer, findings)")
    d.add_argument("model")
    d.add_argument("--subgraph", help="only this DPU subgraph")
    d.set_defaults(fn=cmd_disasm)
    x = verb("xmodel", "summary of graph, subgraphs, DPU attributes and registers")
    x.add_argument("model")
    x.add_argument("-v", "--verbose", action="store_true", help="list the ops of DPU subgraphs too")
    x.set_defaults(fn=cmd_xmodel)
    pr = verb("profile", "cycle-model profile: vaitrace text summary, trace, plot, JSON/CSV")
    pr.add_argument("model")
    pr.add_argument("--target", help="preset, fingerprint or arch.json (may carry a 'timing' object); "
                                     "must match the model's fingerprint")
    pr.add_argument("--clock-mhz", type=CLOCK_MHZ, help="core clock (default from the target)")
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
    plugin(pr)
    pr.set_defaults(fn=cmd_profile)
    sw = verb("sweep", "sweep DPU configurations (compile and time models per point: fps, resources, Pareto) or "
                       "the timing parameters of one compiled program")
    sw.add_argument("models", nargs="*", metavar="MODEL",
                    help="models: .onnx, quantized or compiled .xmodel (recompiled per point), zoo:NAME[@SIZE]; one "
                         "compiled .xmodel with timing --param only (no --spec) is the timing-only mode")
    sw.add_argument("--param", action="append", metavar="NAME=V1,V2,...",
                    help="a parameter and its values (preset, board, pp, cp, alu_pp, bank_depth, img_bg or a timing "
                         "field); several --param give the cartesian product")
    sw.add_argument("--spec", metavar="SWEEP.toml", help="a sweep file: [[model]], [[space]], constraints, seed "
                                                          "(docs/sweeps.md); the same file gives the same points")
    sw.add_argument("--samples", type=int_range(1, 10**6), metavar="N",
                    help="N random points of the --param grid (at most the grid's size)")
    sw.add_argument("--seed", type=int_range(0, 2**32 - 1),
                    help="seed of random points, of the random calibration samples and of --verify-rtl inputs "
                         "(default 0, or the spec's seed)")
    sw.add_argument("--constraint", action="append", metavar="EXPR",
                    help="e.g. 'dsp <= 1248' (a KV260) or 'bram36 <= 144'; constraints on resources and array "
                         "parameters drop points before compiling (an error when they drop every point), others "
                         "(fps, latency_ms, ...) keep them off the Pareto front (a line says when no point meets them)")
    sw.add_argument("--calib", metavar="DATA", help="calibration data for the .onnx MODEL arguments (.npy/.npz/"
                                                    "folder; default: random N(0,1) samples, cycles do not depend "
                                                    "on values)")
    sw.add_argument("-o", "--output", metavar="DIR", help="sweep directory: per-point results (resumable), "
                                                          "sweep.csv/.json/.parquet, pareto.csv, summary.md/.html")
    sw.add_argument("--cache", metavar="DIR", help="compile cache directory, created if missing (default "
                                                    "~/.cache/opendpu/sweep)")
    sw.add_argument("--executor", choices=("local", "ray"),
                    help="local process pool (default local) or a Ray cluster (--address)")
    sw.add_argument("--address", metavar="HOST:PORT", help="with --executor ray: the Ray cluster's address "
                                                           "(default: start a local one)")
    sw.add_argument("--workers", type=int_range(1, 256), metavar="N", help="local worker processes (default: CPUs; "
                                                                          "not with --executor ray)")
    sw.add_argument("--plot", metavar="DIR", help="write the figures (Pareto, heatmap, bottleneck breakdown) into "
                                                  "this directory (inside -o, or a new/empty one or opendpu's)")
    sw.add_argument("--heatmap", metavar="PX,PY", help="with --plot: the two swept parameters of the heatmap")
    sw.add_argument("--breakdown", metavar="HASH", help="with --plot: the point (hash) of the per-layer bottleneck "
                                                        "figure")
    sw.add_argument("--verify-rtl", type=int_range(0, 100), metavar="K",
                    help="co-simulate K points of the first model's Pareto front on the RTL")
    sw.add_argument("--target", help="timing-only mode: preset, fingerprint or arch.json (must match the model)")
    sw.add_argument("--csv", metavar="S.csv", help="timing-only mode: write the rows as CSV")
    sw.set_defaults(fn=cmd_sweep)
    cs = verb("cosim", "co-simulate the RTL against the cycle model (bytes and cycles)")
    cs.add_argument("model", nargs="?", help="xmodel (every DPU subgraph, random inputs)")
    cs.add_argument("--target", help="preset, fingerprint or arch.json (must match the model's bank layout)")
    cs.add_argument("--timing", action="append", metavar="KEY=VALUE", help="override a timing parameter")
    cs.add_argument("--subgraph", help="only this DPU subgraph")
    cs.add_argument("--random", type=int_range(1, 10000), metavar="N",
                    help="N (at least 1) random programs (sim.progen) instead of an xmodel")
    cs.add_argument("--bank-conflicts", action="store_true",
                    help="random programs crowd their image accesses onto two banks of group 0, so the bank-port "
                         "arbiter is exercised (docs/bank-ports.md)")
    cs.add_argument("--instructions", type=int_range(2, 100000), default=None,
                    help="about this many instructions per random program (default 60; a final SAVE and END "
                         "are added)")
    cs.add_argument("--seed", type=SEED, default=0, help="input / program seed (reproducible)")
    cs.add_argument("--rtl-sim", default="verilator", choices=("verilator", "cocotb-verilator", "cocotb-icarus"),
                    help="RTL simulator flow (cocotb-icarus is ~46x slower; cocotb-verilator builds very slowly, "
                         "docs/rtl.md)")
    cs.add_argument("--waves", metavar="DIR", nargs="?", const="waveforms",
                    help="on a mismatch, dump a VCD window around the first divergence into DIR (" + _OUT_RULE
                         + ")")
    force(cs)
    cs.set_defaults(fn=cmd_cosim)
    q = verb("quantize", "INT8 power-of-two post-training quantization (vai_q semantics)")
    q.add_argument("model", help="float ONNX model (opset 13+)")
    q.add_argument("--calib", required=True, help="calibration data: .npy [N,C,H,W], .npz ('x'), or a folder of .npy")
    q.add_argument("--method", default="diffs", choices=("maxmin", "percentile", "mse", "entropy", "diffs"),
                   help="activation calibration method (diffs as vai_q_pytorch)")
    q.add_argument("--weight-method", choices=("maxmin", "diffs", "mse"), help="weights/bias method")
    q.add_argument("--statistic", choices=("modal", "max", "mean", "median"), help="per-batch reduction for diffs")
    q.add_argument("--percentile", type=float_range(0, 100), default=99.9999,
                   help="percentile for --method percentile, in (0, 100]")
    q.add_argument("--target", help="preset name, fingerprint or arch.json: DPU/CPU placement and its reasons")
    q.add_argument("-o", "--output", default="quantize_result",
                   help="output directory (" + _OUT_RULE + "; the net is the model's file stem; quant_info.json, "
                        "golden/ and report.* are written by every net: the newest one's are kept)")
    q.add_argument("--quant-info", help="reuse the fix points of this quant_info.json (skip calibration)")
    q.add_argument("--batch-size", type=int_range(1, 65536), default=8)
    q.add_argument("--calib-limit", type=int_range(1), help="use at most N calibration samples")
    q.add_argument("--replace-sigmoid", action="store_true", help="sigmoid -> hard-sigmoid")
    q.add_argument("--replace-silu", choices=("hardswish",), help="SiLU x*sigmoid(x) -> hard-swish, on the DPU (an "
                   "approximation: compare the accuracy with and without it); by default sigmoid stays on the CPU")
    q.add_argument("--bias-corr", action="store_true", help="bias correction")
    q.add_argument("--no-cle", action="store_true", help="no cross-layer equalization (on by default, as in vai_q; "
                   "the report lists the equalized layer pairs)")
    q.add_argument("--fast-finetune", action="store_true", help="layer-wise AdaQuant-style fast finetune")
    q.add_argument("--exclude-nodes", type=names_arg, metavar="NAME[,NAME]",
                   help="ONNX nodes (or their output tensors) kept float on the CPU, as vai_q_onnx's nodes_to_exclude "
                        "(names as `opendpu inspect` lists them)")
    q.add_argument("--evaluate", help="dataset (.npz with x and optional labels y): float vs quantized")
    q.add_argument("--seed", type=SEED, default=0)
    q.add_argument("--input-shape", type=shape_arg, metavar="N,C,H,W",
                   help="the input shape (NCHW) for a model whose input has dynamic dimensions")
    q.add_argument("--format", default="xir", choices=("xir", "vai_q"),
                   help="xmodel form: xir (*-fix ops, default) or vai_q (float ops + fix ops, as AMD's quantizers "
                        "write it for vai_c_xir)")
    force(q)
    q.set_defaults(fn=cmd_quantize)
    ip = verb("inspect", "DPU/CPU placement of every op of a float ONNX model or a quantized xmodel, with reasons "
                         "and the DPU coverage (share of MACs and ops on the DPU) per target")
    ip.add_argument("model", help="float ONNX model, or a quantized .xmodel (the compiler's own partition)")
    ip.add_argument("--target", required=True, metavar="T[,T...]",
                    help="preset name, fingerprint or arch.json; several separated by commas")
    ip.add_argument("-o", "--output", default="quantize_result",
                    help="directory for inspect_<target>.txt (" + _OUT_RULE + "; the net is the model's file stem)")
    ip.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                    help="0 quiet, 1 CPU ops, 2 every op")
    ip.add_argument("--image-format", help="not supported (graph images are not generated); an error if given")
    ip.add_argument("--input-shape", type=shape_arg, metavar="N,C,H,W",
                    help="the input shape (NCHW) for a model whose input has dynamic dimensions")
    force(ip)
    ip.set_defaults(fn=cmd_inspect)
    z = verb("zoo", "model zoo: MACs/GOPs/params of the generated topologies; export ONNX")
    z.add_argument("names", nargs="*")
    z.add_argument("--size", type=int_range(32, 1024), help="input size (default: the published one)")
    z.add_argument("--export", metavar="DIR", help="write the float ONNX models here (" + _OUT_RULE + "; each model "
                                                   "is a net of its own: an earlier export of other models is kept)")
    force(z)
    z.set_defaults(fn=cmd_zoo)
    cp = verb("compile", "compile a quantized xmodel for a DPU target (vai_c_xir): NAME.xmodel, NAME_org.xmodel, "
                         "meta.json")
    cp.add_argument("-x", "--xmodel", required=True, help="the quantized xmodel (opendpu quantize's *_int.xmodel); "
                                                          "with --recompile a compiled one")
    cp.add_argument("-a", "--arch", metavar="ARCH.json", help="arch.json naming the target or its fingerprint")
    cp.add_argument("--target", help="preset name, fingerprint or arch.json (instead of -a)")
    cp.add_argument("-o", "--output_dir", "--output-dir", dest="output_dir", required=True,
                    help="output directory (" + _OUT_RULE + "; other nets' NAME.xmodel are kept, as vai_c_xir does; "
                         "meta.json and report.* are written by every net: the newest one's are kept)")
    cp.add_argument("-n", "--net_name", "--net-name", dest="net_name", required=True,
                    help="name of the compiled model: the output file stem")
    cp.add_argument("--options", metavar="JSON", help="vai_c options: input_shape, output_ops, prefetch, hd_opt")
    cp.add_argument("--recompile", action="store_true", help="-x is a compiled xmodel: compile its graph again")
    cp.add_argument("--dump-after", action="append", metavar="PASS",
                    help="also write the compile context after this pass as dump_after_PASS.json")
    force(cp)
    cp.set_defaults(fn=cmd_compile)
    b = verb("build", "quantize + compile + check an ONNX model in one step")
    b.add_argument("model", help="float ONNX model")
    b.add_argument("--calib", required=True, help="calibration data (as for quantize)")
    b.add_argument("--target", required=True, help="preset name, fingerprint or arch.json")
    b.add_argument("-o", "--output", required=True, help="output directory: quantized/ and compiled/ inside ("
                   + _OUT_RULE + "; the net is -n)")
    b.add_argument("-n", "--net_name", "--net-name", dest="net_name", help="compiled model name (default: the ONNX "
                                                                           "file stem)")
    b.add_argument("--options", metavar="JSON", help="vai_c options for the compile step")
    b.add_argument("--method", help="activation calibration method (as for quantize; default: quantize's)")
    b.add_argument("--replace-sigmoid", action="store_true", help="as for quantize: sigmoid -> hard-sigmoid on the "
                                                                  "DPU (an approximation; off by default)")
    b.add_argument("--replace-silu", choices=("hardswish",), help="as for quantize: SiLU -> hard-swish on the DPU")
    b.add_argument("--fast-finetune", action="store_true", help="as for quantize")
    b.add_argument("--bias-corr", action="store_true", help="as for quantize: bias correction")
    b.add_argument("--no-cle", action="store_true", help="as for quantize: no cross-layer equalization")
    b.add_argument("--exclude-nodes", type=names_arg, metavar="NAME[,NAME]",
                   help="as for quantize: ONNX nodes kept float on the CPU")
    b.add_argument("--check-n", type=int_range(1, 100000), default=2, help="random inputs per DPU subgraph for the "
                                                                          "check")
    b.add_argument("--seed", type=SEED, default=0)
    b.add_argument("--input-shape", type=shape_arg, metavar="N,C,H,W",
                   help="the input shape (NCHW) for a model whose input has dynamic dimensions")
    b.add_argument("--evaluate", metavar="DATA", help="data for the accuracy verdict (.npz with x and optional y, "
                   ".npy or folder); default: held-out calibration samples (docs/accuracy.md)")
    b.add_argument("--min-sqnr", type=float_range(-math.inf, math.inf), metavar="DB",
                   help="exit 1 (after writing the outputs) when an output's SQNR against float is below DB")
    force(b)
    b.set_defaults(fn=cmd_build)
    cm = verb("compare", "accuracy of a compiled model against its float ONNX model: task metric and per-output SQNR")
    cm.add_argument("model", metavar="MODEL.onnx", help="the float ONNX model the build was made from")
    cm.add_argument("build_dir", metavar="BUILD_DIR", help="output of opendpu build (or compile), or a compiled "
                                                           ".xmodel")
    cm.add_argument("--data", required=True, help="samples: .npy [N,C,H,W], .npz ('x', optional labels 'y') or a "
                                                  "folder of .npy")
    cm.add_argument("--task", default="auto", choices=("auto", "classify", "detect", "raw"),
                    help="auto = classify for one [1, K] output, else raw (SQNR only); detect = YOLOv8-style "
                         "[1, 4+nc, N] output")
    cm.add_argument("--limit", type=int_range(1), metavar="N", help="use at most N samples")
    cm.add_argument("--score-threshold", type=float_range(0, 1), default=0.25,
                    help="detect: keep boxes whose best class score is at least this")
    cm.add_argument("--iou", type=float_range(0, 1), default=0.5,
                    help="detect: IoU at which a float and a DPU detection of the same class match")
    cm.add_argument("--backend", choices=("sim", "ref"), default="sim",
                    help="sim = cycle model, ref = XIR reference ops")
    cm.add_argument("--json", metavar="OUT.json", help="also write the report as JSON")
    cm.set_defaults(fn=cmd_compare)
    t = verb("targets", "list the ISA1 presets")
    t.add_argument("--json", action="store_true")
    t.set_defaults(fn=cmd_targets)
    return p


def main(argv: list[str] | None = None) -> int:
    from opendpu.compiler.xir.graph import XModelError
    from opendpu.isa.errors import OpenDpuError
    from opendpu.runtime.dpu import RuntimeErrorDPU
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return 2
    _VERB[0] = f"opendpu {args.cmd}"
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:
        return 0
    except OpenDpuError as e:                   # every package error (isa/errors.py)
        msg = " ".join(str(e).split("\n")).strip() or type(e).__name__
        model = getattr(args, "model", None)
        if isinstance(e, (XModelError, RuntimeErrorDPU)) and model and model not in msg:
            msg = f"{model}: {msg}"             # name the file the damaged subgraph came from
        print(f"opendpu {args.cmd}: error: {msg}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"opendpu {args.cmd}: error: out of memory (the model or the data is larger than this machine can "
              f"hold)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"opendpu {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug: one line for the user, the traceback on request
        if os.environ.get("OPENDPU_DEBUG"):
            raise
        msg = " ".join(str(e).split("\n")).strip()
        print(f"opendpu {args.cmd}: internal error: {type(e).__name__}: {msg} (a bug in opendpu; rerun with "
              f"OPENDPU_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
