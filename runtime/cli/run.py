"""`opendpu run`: an xmodel end to end on ref, sim or rtl (xdputil-like), with per-layer dumps and golden checks."""
from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from opendpu.compiler.outdir import DirOutput, check_dir, check_file
from opendpu.compiler.xir.graph import dump_stem
from opendpu.runtime.cli.common import (_OUT_RULE, CliError, _atomic_write, _board, _board_timing, _check_cpu_ops,
                                            _clock_mhz_type, _load_graph, _load_plugins, _stem, _warm_kernels,
                                            add_force, add_plugin, add_verb, input_dir, input_file, load_array,
                                            int_range, load_bin, load_npz, timing_overrides)
from opendpu.runtime.pool import default_workers


def register(sub) -> None:
    r = add_verb(sub, "run", "run an xmodel end to end")
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
    r.add_argument("--clock-mhz", type=_clock_mhz_type(), metavar="MHZ",
                   help="core clock for the reported latency (sim/rtl)")
    r.add_argument("--timing", action="append", metavar="KEY=VALUE", help="override a timing parameter (sim/rtl)")
    r.add_argument("--board", help="board profile (zcu102, zcu104, kv260, kr260): its clock and the DPU timing fitted "
                                   "on silicon for the reported cycles, given to the program's own array whatever it "
                                   "is (sim/rtl; docs/calibration.md); --timing / --clock-mhz override it")
    r.add_argument("--workers", type=int_range(1, 1024), default=default_workers(), metavar="N",
                   help="processes sharing a batch (inputs holding N images; 1 = in this process); the outputs do "
                        "not depend on it")
    add_plugin(r)
    add_force(r)
    r.set_defaults(fn=run)


def _write_dump(dirname: str, name: str, arr: np.ndarray) -> str:
    os.makedirs(dirname, exist_ok=True)
    stem = os.path.join(dirname, dump_stem(name))
    a = np.ascontiguousarray(arr)
    a.tofile(stem + ".bin")
    np.savetxt(stem + ".txt", a.reshape(-1), fmt="%d" if a.dtype.kind in "iu" else "%.8g")
    return stem + ".bin"


def _md5(arr: np.ndarray) -> str:
    import hashlib
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


def run(a) -> int:
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
    try:
        n = gr.batch_of(xs, a.layout)
    except RuntimeErrorDPU as e:
        raise CliError(str(e)) from None
    if n > 1:
        return _run_batch(a, gr, xs, n, tm)
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
        if "cycles" in st and r.target is not None:         # a timed DPU subgraph
            print(f"  DPU subgraph {name}: {st['cycles']} cycles = {st['latency_ms']:.3f} ms at "
                  f"{st['clock_mhz']:g} MHz on {r.target.name}")
    outs = gr.output_values(res, raw=a.raw)
    for name, (v, fp) in outs.items():
        flat = v.reshape(-1)
        extra = f", argmax {int(np.argmax(flat))}" if 0 < flat.size <= 1000 else ""
        print(f"  output {name}: shape {list(v.shape)} {v.dtype} ({_what(v, fp)}){extra}")
    _write_outputs(a, outs, "")
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


# ---- a batch: N images through the one program, over a pool of workers ---------------------------------------
def _run_batch(a, gr, xs: list, n: int, tm: dict) -> int:
    """Inputs holding n images each: checked image by image before any work, run in chunks (in this process, or
    by --workers processes each loading the model once), the outputs stacked along the leading dimension."""
    from opendpu.runtime.dpu import RuntimeErrorDPU
    from opendpu.runtime.pool import chunks, map_chunks, throughput
    from opendpu.runtime.progress import progress_bar
    from opendpu.runtime.runner import layout_name
    if a.dump or a.golden:
        raise CliError(f"--dump and --golden take one image; the inputs hold a batch of {n}")
    specs = gr.get_inputs()
    prepared = []
    for s, x in zip(specs, xs):
        b = s.dims[0]
        try:                                    # every image checked (shape, NaN) before any work
            prepared.append(np.concatenate([gr.prepare_input(s, x[i * b:(i + 1) * b], a.layout) for i in range(n)]))
        except RuntimeErrorDPU as e:
            raise CliError(str(e)) from None
        print(f"input {s.name}: {np.asarray(x).dtype} {list(np.shape(x))} -> a batch of {n} x {list(s.dims)} "
              f"{layout_name(s.dims)}" + (f", quantized with fix_point {s.fix_point}"
                                          if s.dtype == "xint8" and np.asarray(x).dtype != np.int8 else ""))
    if a.board and gr.runners:
        print(_board(a).applied_to([r.target for r in gr.runners.values()]))
    workers = 1 if a.backend == "rtl" else min(a.workers, n)       # one RTL build, in this process
    if a.backend != "ref" and gr.runners:
        _warm_kernels()                         # here, so the workers find the kernels in Numba's cache
    parts = chunks(n, workers)
    sl = [[p[r.start * s.dims[0]:r.stop * s.dims[0]] for p, s in zip(prepared, specs)] for r in parts]
    t0 = time.perf_counter()
    with progress_bar(f"run ({workers} worker{'s' if workers > 1 else ''})") as prog:
        if workers == 1:
            results = []
            for r, ins in zip(parts, sl):
                results.append(_batch_chunk_on(gr, ins, a.raw))
                if prog:
                    prog(r.stop, n, "images")
        else:
            results = map_chunks(_batch_chunk, sl, workers, _batch_load,
                                 (a.model, a.backend, a.target, tm, list(a.op_plugin or []), a.raw),
                                 progress=prog, sizes=[len(r) for r in parts], what="images")
    dt = time.perf_counter() - t0
    tp = throughput(n, dt, workers)
    print(f"ran {a.model} on backend {a.backend}: {n} images in {dt:.2f} s ({tp['images_per_s']} images/s, "
          f"{workers} worker{'s' if workers > 1 else ''}; host time)")
    for name, st in results[-1][1].items():          # timed DPU subgraphs, for the last image
        print(f"  DPU subgraph {name}: {st['cycles']} cycles = {st['latency_ms']:.3f} ms at {st['clock_mhz']:g} MHz "
              f"on {st['target']} per image")
    outs = {name: (np.concatenate([res[0][name][0] for res in results]), fp)
            for name, (_, fp) in results[0][0].items()}
    for name, (v, fp) in outs.items():
        per = v.reshape(n, -1)
        extra = f", argmax per image {per.argmax(1).tolist()}" if 0 < per.shape[1] <= 1000 and n <= 32 else ""
        print(f"  output {name}: shape {list(v.shape)} {v.dtype} ({_what(v, fp)}){extra}")
    _write_outputs(a, outs, f" of {n} images")
    return 0


def _what(v: np.ndarray, fp) -> str:
    return (f"raw int8, fix_point {fp}" if v.dtype == np.int8 else
            (f"dequantized with fix_point {fp}" if fp is not None else "float"))


def _write_outputs(a, outs: dict, of: str) -> None:
    """-o: the outputs as one .npz (raw int8 with '<name>.fix_point' arrays, or float32 real values)."""
    if not a.output:
        return
    arrays: dict[str, Any] = {name: v for name, (v, _) in outs.items()}
    if a.raw:
        arrays.update({f"{name}.fix_point": np.array(fp, np.int32) for name, (v, fp) in outs.items()
                       if fp is not None})
    _atomic_write(a.output, lambda tmp: np.savez(tmp, **arrays), "output")
    print(f"wrote {a.output} ({len(outs)} output(s){of}, "
          + ("raw int8 with '<name>.fix_point' arrays" if a.raw else "float32 real values") + ")")


def _batch_chunk_on(gr, ins: list, raw: bool) -> tuple[dict, dict]:
    """(the graph outputs of a chunk of images, as output_values gives them; each timed DPU subgraph's stats)."""
    res = gr.run(ins, keep_values=True)
    stats = {name: dict(cycles=r.stats["cycles"], latency_ms=r.stats["latency_ms"], clock_mhz=r.stats["clock_mhz"],
                        target=r.target.name) for name, r in gr.runners.items()
             if "cycles" in r.stats and r.target is not None}
    return gr.output_values(res, raw=raw), stats


_WORKER: dict = {}


def _batch_load(model: str, backend: str, target, timing: dict, plugins: list[str], raw: bool) -> None:
    """Pool initializer: the op plugins, the model and its runner, once per worker."""
    from opendpu.runtime.runner import GraphRunner
    _load_plugins(plugins)
    _WORKER["raw"] = raw
    _WORKER["runner"] = gr = GraphRunner(_load_graph(model), backend=backend, target=target, timing=timing)
    if backend != "ref" and gr.runners:
        from opendpu.sim import warm_kernels
        warm_kernels()                          # from Numba's disk cache, once per worker


def _batch_chunk(ins: list) -> tuple[dict, dict]:
    """Pool task: a chunk of the batch on this worker's runner."""
    return _batch_chunk_on(_WORKER["runner"], ins, _WORKER["raw"])
