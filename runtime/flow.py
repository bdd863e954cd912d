"""The library flow: a float ONNX model -> quantized graph -> compiled graph -> check -> accuracy verdict, in memory.

`build()` chains the steps `opendpu build` runs and returns a `BuildResult` holding every product (the quantizer's
result, the quantized and compiled graphs, the compile report, the per-subgraph check and the accuracy verdict);
nothing is written. The steps are functions of their own (`quantize_step`, `compile_step`, `check_step`,
`accuracy_step`) for callers that need part of the chain: the sweep quantizes once per model and compiles per
point, `--verify-rtl` compiles and co-simulates, the tests compile zoo topologies. `write_build()` writes a result
the way `opendpu build -o DIR` does (compiler.outdir's output rule: marker `.opendpu-output`, only opendpu's own
unchanged files replaced). Writing and printing are the CLI's; the flow reports through the callables it is given
(`log` for lines of progress, `warn` for warnings, `progress` for progress bars).

    from opendpu.runtime.flow import build
    r = build("net.onnx", calib, "DPUCZDX8G_ISA1_B512")
    r.compiled.graph.save("net.xmodel"); print(r.ok, r.verdict["min_sqnr_db"])
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from opendpu.isa.errors import OpenDpuError

__all__ = ["BuildResult", "FlowError", "SubgraphCheck", "accuracy_step", "build", "check_step", "check_subgraphs",
           "compile_step", "onnx_input_shape", "output_names", "quantize_step", "quantize_summary", "quantized_graph",
           "write_build"]

Log = Callable[[str], None]


class FlowError(OpenDpuError, ValueError):
    """A step of the flow cannot run on what it was given (e.g. a compiled graph without DPU subgraphs to check)."""


# ---- quantize ----------------------------------------------------------------------------------------------
def onnx_input_shape(model, given: list[int] | None = None) -> list[int]:
    """[1, C, H, W] of an ONNX model's first input (batch 1), checked as the quantizer checks it; dynamic
    dimensions come from `given`."""
    from opendpu.quant.onnx_in import _static_input_shapes, load_onnx
    return list(_static_input_shapes(load_onnx(model), _source(model), given)[0][1])


def _source(model) -> str:
    return os.fspath(model) if isinstance(model, (str, os.PathLike)) else "model"


def quantize_step(model, calib, target=None, config=None, *, input_shape: list[int] | None = None,
                  quant_info=None, progress=None):
    """quant.quantize with a progress bar: `progress(title, enabled)` is a context manager giving a
    `(done, total, what)` callback or None (runtime.progress.progress_bar). Returns the QuantResult."""
    from opendpu.quant.quantize import quantize
    with (progress or _no_progress)("calibration", True) as prog:
        return quantize(model, calib, target=target, config=config, quant_info=quant_info, input_shape=input_shape,
                        progress=(lambda i, n: prog(i, n, "batches")) if prog else None)


def quantized_graph(res):
    """The quantized xmodel graph of a QuantResult, as NAME_int.xmodel holds it (serialized and read back, so the
    compiler sees exactly what a later `opendpu compile` of the file sees)."""
    from opendpu.compiler.xir.graph import Graph
    return Graph.deserialize(res.xmodel().serialize())


def quantize_summary(res, model: str, seconds: float) -> list[str]:
    """The lines `opendpu quantize` prints for a result: the op count, the CPU ops with their reasons, the notes."""
    nodes = res.prep.nodes
    cpu = [n for n in nodes if n.device == "CPU"]
    return ([f"quantized {model} ({len(nodes)} ops, {len(cpu)} on the CPU) with method {res.config.method} on "
             f"{res.calib_samples} calibration samples in {seconds:.1f} s"]
            + [f"  CPU  {n.name}: {n.reason}" for n in cpu] + [f"  {note}" for note in res.notes])


@contextlib.contextmanager
def _no_progress(title: str, enabled: bool = True):
    yield None


# ---- compile -----------------------------------------------------------------------------------------------
def compile_step(graph, target, *, name: str | None = None, options: dict | None = None,
                 recompile: bool | None = None, dump_after=(), log: Log | None = None):
    """Compile a quantized graph (recompile a compiled one: `recompile` None decides by the graph's form) for
    `target` with vai_c's `options`, deciding by the one cycle model; the checks of `opendpu compile` first
    (pipeline.check_graph). Returns the compiler's CompileResult."""
    from opendpu.compiler.frontend import detect_form
    from opendpu.compiler.pipeline import check_graph, compile as compile_graph
    from opendpu.runtime.costmodel import cycle_model
    opts = dict(options or {})
    if recompile is None:
        recompile = detect_form(graph) == "compiled"
    check_graph(graph, recompile, opts)
    return compile_graph(graph, target, name=name, recompile=recompile, dump_after=dump_after, log=log,
                         cycles=cycle_model, **opts)


# ---- check -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SubgraphCheck:
    """One DPU subgraph run on the cycle model's executor against the XIR reference on random inputs."""

    name: str
    target: str
    instructions: int
    samples: int
    bytes_compared: int
    mismatching: int
    layers_matched: int
    first_mismatch: str | None
    seconds: float

    @property
    def ok(self) -> bool:
        """Every compared byte equal, and some were compared (a subgraph with no output bytes proves nothing)."""
        return self.mismatching == 0 and self.bytes_compared > 0

    def line(self) -> str:
        """The line `opendpu check` prints."""
        return (f"{'PASS' if self.ok else 'FAIL'} {self.name}: target {self.target}, {self.instructions} "
                f"instructions, {self.samples} inputs, {self.bytes_compared} bytes compared, {self.mismatching} "
                f"mismatching, {self.layers_matched} stored layers matched"
                + (f", first mismatching layer {self.first_mismatch}" if self.first_mismatch else "")
                + f" ({self.seconds:.2f} s)")


def check_subgraphs(dpus, samples: int = 2, seed: int = 0, *, progress=None, warm: Callable[[], Any] | None = None,
                    log: Log | None = None) -> tuple[SubgraphCheck, ...]:
    """Run validated DpuSubgraphs on `samples` random int8 inputs each (one generator seeded by `seed`), sim against
    ref, every stored layer compared. `warm()` runs once first (default: sim.warm_kernels, silent); `log` gets each
    subgraph's line as it finishes."""
    from opendpu.runtime.layers import run_tracked
    from opendpu.sim import warm_kernels
    (warm or warm_kernels)()
    rng = np.random.default_rng(seed)
    out = []
    for dpu in dpus:
        machine = dpu.new_machine(seed=seed)
        compared = mism = 0
        first = None
        layers_ok: set[str] = set()
        t0 = time.perf_counter()
        with (progress or _no_progress)(f"check {dpu.name[:40]}", len(dpu.instructions) * samples > 20000) as prog:
            for k in range(samples):
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
                    prog(k + 1, samples, "inputs")
        c = SubgraphCheck(dpu.name, dpu.target.name, len(dpu.instructions), samples, compared, mism, len(layers_ok),
                          first, time.perf_counter() - t0)
        if log:
            log(c.line())
        out.append(c)
    return tuple(out)


def check_step(graph, samples: int = 2, seed: int = 0, *, what: str = "the compiled graph", progress=None,
               warm: Callable[[], Any] | None = None, log: Log | None = None) -> tuple[SubgraphCheck, ...]:
    """`check_subgraphs` over every DPU subgraph of a compiled graph (each validated first)."""
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    dpus = [DpuSubgraph(graph, sg) for sg in dpu_subgraphs(graph)]
    if not dpus:
        raise FlowError(f"{what} has no DPU subgraph")
    for d in dpus:
        d.validate()
    return check_subgraphs(dpus, samples, seed, progress=progress, warm=warm, log=log)


# ---- accuracy ----------------------------------------------------------------------------------------------
def accuracy_step(onnx, compiled, data, where: str, collapse: dict | None = None, min_sqnr: float | None = None,
                  warn: Log | None = None) -> dict:
    """The verdict (runtime.verdict, accuracy.json) of the compiled graph on the reference ops against the float
    ONNX model on `data` ((x, y or None)); `where` names the data, `collapse` is the quantize report's first
    collapsing layer. A float model onnxruntime cannot run gives the "not measured" verdict."""
    from opendpu.runtime.compare import CompareError, Comparison
    from opendpu.runtime.verdict import not_measured, verdict
    try:
        c = Comparison(onnx, compiled, data, backend="ref")
        for w in c.warnings:
            if warn:
                warn(w)
        return verdict(c.run(), where, collapse, min_sqnr)
    except CompareError as e:           # e.g. a model onnxruntime cannot load: the build stands, unmeasured
        return not_measured(str(e).strip().splitlines()[0], where, collapse, min_sqnr)


def _collapse(res, x: np.ndarray) -> dict | None:
    """The first collapsing layer of the quantize report (the per-layer SQNR rows its report.json holds)."""
    from opendpu.runtime.verdict import first_collapse
    rows = res.layer_errors(x[: min(len(x), 8)])
    return first_collapse({"layers": rows, "adjustments": res.adjustments, "config": dataclasses.asdict(res.config)})


def _verdict_data(x: np.ndarray, evaluate, evaluate_name: str) -> tuple[np.ndarray, tuple, str]:
    """(calibration samples, verdict data (x, y), its description): `evaluate` (x, y) when given, else the held-out
    last samples of `x` (runtime.verdict.holdout), kept out of calibration."""
    from opendpu.runtime.verdict import HOLDOUT_MIN, holdout
    if evaluate is not None:
        return x, tuple(evaluate), f"samples of {evaluate_name}"
    n = len(x)
    h = holdout(n)
    if h == 0:
        return x, (x, None), (f"calibration samples (fewer than {HOLDOUT_MIN}: none held out, so this measures the "
                              f"calibration set itself)")
    return x[:n - h], (x[n - h:], None), f"held-out samples (the last {h} of {n}; calibrated on the first {n - h})"


# ---- the whole flow ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BuildResult:
    """Everything `build` made, in memory."""

    model: str                      # the ONNX model (path, or "model" for a ModelProto)
    name: str                       # the net name: the compiled files' stem
    quant: Any                      # quant.quantize.QuantResult
    calib: np.ndarray               # the samples calibrated on (the golden input and the report rows come from them)
    quantized: Any                  # the quantized graph (NAME_int.xmodel)
    compiled: Any                   # compiler.pipeline.CompileResult: .graph is the compiled xmodel, .report()
    checks: tuple[SubgraphCheck, ...]
    verdict: dict | None            # runtime.verdict (accuracy.json), None when not asked for

    @property
    def ok(self) -> bool:
        """Every DPU subgraph matched the reference (the accuracy floor is the verdict's `below_floor`)."""
        return all(c.ok for c in self.checks)

    @property
    def coverage(self) -> dict:
        return self.compiled.meta["coverage"]


def build(onnx, calib, target, quant_config=None, options: dict | None = None, *, name: str | None = None,
          input_shape: list[int] | None = None, samples: int = 2, seed: int = 0, evaluate=None,
          evaluate_name: str = "the evaluation data", accuracy: bool = True, min_sqnr: float | None = None,
          log: Log | None = None, warn: Log | None = None, progress=None,
          warm: Callable[[], Any] | None = None) -> BuildResult:
    """Quantize the float ONNX model `onnx` (path or ModelProto) on `calib` (an array [N,C,H,W] or a .npy/.npz/
    folder) for `target` (a Target, preset name, fingerprint or arch.json) with `quant_config` (QuantConfig), compile
    it with vai_c's `options` into net `name` (default: the ONNX file stem), check every DPU subgraph on `samples`
    random inputs (`seed`), and, with `accuracy`, measure the compiled model against the float one on `evaluate`
    ((x, y or None) arrays, named `evaluate_name`) or, without it, on held-out calibration samples
    (runtime.verdict.holdout; then only the others calibrate). `min_sqnr` sets the verdict's floor. `input_shape`
    is the NCHW input for a model with dynamic dimensions."""
    from opendpu.compiler.pipeline import check_name
    from opendpu.compiler.xir.graph import dump_stem
    from opendpu.isa.target import get_target
    from opendpu.quant.quantize import QuantConfig, calib_arrays, calib_warnings
    say = log or (lambda s: None)
    t = target if hasattr(target, "fingerprint") else get_target(target)
    src = _source(onnx)
    if accuracy and src == "model":
        raise FlowError("the accuracy verdict runs the float model from its file: give the ONNX model as a path, or "
                        "accuracy=False")
    net = check_name(name or (os.path.splitext(os.path.basename(src))[0] if src != "model" else "model"))
    cfg = quant_config or QuantConfig()
    shape = onnx_input_shape(onnx, input_shape)
    x_all = calib_arrays(calib, shape)                # checked as a whole (constant data refused) before any split
    x, data, where = _verdict_data(x_all, evaluate, evaluate_name) if accuracy else (x_all, None, "")
    if len(x) != len(x_all):
        cfg = dataclasses.replace(cfg, calib_limit=len(x) if cfg.calib_limit is None else min(cfg.calib_limit, len(x)))
    x = x[:cfg.calib_limit] if cfg.calib_limit else x
    for w in calib_warnings(x, f"calibration data {calib}" if isinstance(calib, (str, os.PathLike))
                            else "calibration data"):
        if warn:
            warn(w)
    t0 = time.perf_counter()
    res = quantize_step(onnx, x, target=t, config=cfg, input_shape=shape, progress=progress)
    for line in quantize_summary(res, src, time.perf_counter() - t0):
        say(line)
    qg = quantized_graph(res)
    say(f"== compile {dump_stem(res.model_name)}_int.xmodel")
    cr = compile_step(qg, t, name=net, options=options, recompile=False, log=log)
    say("== check (sim against ref on random inputs)")
    compiled = _reloaded(cr.graph)
    checks = check_step(compiled, samples, seed, what=f"{net}.xmodel", progress=progress, warm=warm, log=log)
    verdict = None
    if accuracy:
        say("== accuracy (float onnxruntime against the compiled model on ref)")
        verdict = accuracy_step(onnx, compiled, data, where, _collapse(res, x), min_sqnr, warn)
    return BuildResult(src, net, res, x, qg, cr, checks, verdict)


def _reloaded(g):
    """The compiled graph as its .xmodel file reads back (what `opendpu check` and `compare` run)."""
    from opendpu.compiler.xir.graph import Graph
    return Graph.deserialize(g.serialize())


# ---- writing -----------------------------------------------------------------------------------------------
def output_names(onnx, name: str) -> list[str]:
    """The files `write_build` writes (relative to the output directory), known before any work."""
    from opendpu.compiler.pipeline import output_names as compile_names
    from opendpu.quant.quantize import output_names as quant_names
    return ([f"quantized/{f}" for f in quant_names(onnx)] + [f"compiled/{f}" for f in compile_names(name)]
            + ["accuracy.json"])


def write_build(r: BuildResult, out_dir: str, *, force: bool = False, inputs=(), log: Log | None = print
                ) -> dict[str, str]:
    """Write a build as `opendpu build -o out_dir` does: quantized/ (the quantizer's outputs), compiled/ (the
    compiler's), accuracy.json (the verdict), published together by compiler.outdir's rule (nothing is left when
    writing fails; only opendpu's own unchanged files are replaced, each removal passed to `log`). Returns the
    written paths by kind: "quantized" and "compiled" (directories), their files, "accuracy"."""
    from opendpu.compiler.outdir import DirOutput
    out = DirOutput(out_dir, force=force, inputs=inputs, what="output directory (-o)", net=r.name, log=log)
    with out as tmp:
        qpaths = r.quant.write(os.path.join(tmp, "quantized"), calib_x=r.calib, inputs=inputs)
        cdir = os.path.join(tmp, "compiled")
        with DirOutput(cdir, inputs=list(inputs), what="output directory (-o)", net=r.name, log=log) as ctmp:
            cfiles = [os.path.basename(p) for p in r.compiled.write(ctmp)]
        if r.verdict is not None:
            with open(os.path.join(tmp, "accuracy.json"), "w") as f:
                json.dump({k: x for k, x in r.verdict.items() if not k.startswith("_")}, f, indent=1)
                f.write("\n")
    paths = {f"quantized/{k}": os.path.join(out_dir, "quantized", os.path.relpath(v, os.path.join(tmp, "quantized")))
             for k, v in qpaths.items()}
    paths.update({f"compiled/{f}": os.path.join(out_dir, "compiled", f) for f in cfiles})
    paths.update(quantized=os.path.join(out_dir, "quantized"), compiled=os.path.join(out_dir, "compiled"))
    if r.verdict is not None:
        paths["accuracy"] = os.path.join(out_dir, "accuracy.json")
    return paths
