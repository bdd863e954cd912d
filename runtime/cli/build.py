"""`opendpu build`: quantize + compile + check + accuracy verdict of a float ONNX model in one step (runtime.flow),
all outputs under one directory, published only when every step succeeded."""
from __future__ import annotations

import math
import os

from opendpu.compiler.outdir import check_dir
from opendpu.runtime.cli.common import (_OUT_RULE, CliError, _calib_shape, _dynamic_input,
                                            _npz_or_npy, _onnx_input_shape,
                                            _warm_kernels, _warn, add_force, add_seed, add_verb, float_range,
                                            input_file, input_path, int_range, names_arg, shape_arg)


def register(sub) -> None:
    b = add_verb(sub, "build", "quantize + compile + check an ONNX model in one step")
    b.add_argument("model", help="float ONNX model")
    b.add_argument("--calib", required=True, metavar="DATA", help="calibration data (as for quantize)")
    b.add_argument("--target", required=True, help="preset name, fingerprint or arch.json")
    b.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory: quantized/ and compiled/ "
                   "inside (" + _OUT_RULE + "; the net is -n)")
    b.add_argument("-n", "--net_name", "--net-name", dest="net_name", metavar="NAME",
                   help="compiled model name (default: the ONNX file stem)")
    b.add_argument("--options", metavar="JSON", help="vai_c options for the compile step")
    b.add_argument("--method", choices=("maxmin", "percentile", "mse", "entropy", "diffs"),
                   help="activation calibration method (as for quantize; default: quantize's, diffs)")
    b.add_argument("--replace-sigmoid", action="store_true", help="as for quantize: sigmoid -> hard-sigmoid on the "
                                                                  "DPU (an approximation; off by default)")
    b.add_argument("--replace-silu", choices=("hardswish",), help="as for quantize: SiLU -> hard-swish on the DPU")
    b.add_argument("--fast-finetune", action="store_true", help="as for quantize")
    b.add_argument("--bias-corr", action="store_true", help="as for quantize: bias correction")
    b.add_argument("--no-cle", action="store_true", help="as for quantize: no cross-layer equalization")
    b.add_argument("--exclude-nodes", type=names_arg, metavar="NAME[,NAME]",
                   help="as for quantize: ONNX nodes kept float on the CPU")
    b.add_argument("--samples", "--check-n", dest="samples", type=int_range(1, 100000), default=2, metavar="N",
                   help="random inputs per DPU subgraph for the check (--check-n: the older spelling)")
    add_seed(b, "the quantizer and the check's random inputs")
    b.add_argument("--input-shape", type=shape_arg, metavar="N,C,H,W",
                   help="the input shape (NCHW) for a model whose input has dynamic dimensions")
    b.add_argument("--evaluate", metavar="DATA", help="data for the accuracy verdict (.npz with x and optional y, "
                   ".npy or folder); default: held-out calibration samples (docs/accuracy.md)")
    b.add_argument("--min-sqnr", type=float_range(-math.inf, math.inf), metavar="DB",
                   help="exit 1 (after writing the outputs) when an output's SQNR against float is below DB")
    add_force(b)
    b.set_defaults(fn=run)


def _config(a):
    """The quantizer's configuration, as `opendpu quantize` would build it from the same options (checked)."""
    from opendpu.quant.quantize import QuantConfig
    cfg = QuantConfig(seed=a.seed, replace_sigmoid=a.replace_sigmoid, replace_silu=a.replace_silu,
                      bias_corr=a.bias_corr, fast_finetune=a.fast_finetune,
                      nodes_to_exclude=tuple(a.exclude_nodes or ()), cle=not a.no_cle,
                      **({"method": a.method} if a.method else {}))
    cfg.validate()
    return cfg


def _evaluate(a, shape):
    """--evaluate's (x, y), checked before any work; None without it (the flow holds calibration samples out)."""
    from opendpu.quant.onnx_in import QuantError
    from opendpu.quant.quantize import eval_arrays
    if not a.evaluate:
        return None
    ex, ey = _npz_or_npy(a.evaluate, "--evaluate")
    try:
        return eval_arrays(ex, shape, ey)
    except QuantError as e:
        raise CliError(f"--evaluate {a.evaluate}: {e}") from None


def run(a) -> int:
    """Validate everything, run the flow (it prints its steps), write the outputs, print the verdict."""
    from opendpu.compiler.partition import format_coverage, target_label
    from opendpu.compiler.pipeline import check_name, parse_options
    from opendpu.isa.target import get_target
    from opendpu.runtime import flow
    from opendpu.runtime.progress import progress_bar
    input_file(a.model, "model")
    input_path(a.calib, "--calib")
    target = get_target(a.target)
    name = check_name(a.net_name or os.path.splitext(os.path.basename(a.model))[0])
    opts = parse_options(a.options) if a.options is not None else {}
    cfg = _config(a)
    inputs = [a.model, a.calib] + ([a.target] if os.path.isfile(a.target) else [])
    if a.evaluate:
        inputs.append(input_path(a.evaluate, "--evaluate") or a.evaluate)
    check_dir(a.output, force=a.force, inputs=inputs, what="output directory (-o)",
              names=flow.output_names(a.model, name))
    from_data = None if a.input_shape else _calib_shape(a.model, a.calib)
    shape = _onnx_input_shape(a.model, a.input_shape or from_data)
    ev = _evaluate(a, shape)
    if from_data:
        print(f"input shape {_dynamic_input(a.model)} (NCHW) of {a.model} taken from the calibration data "
              f"{a.calib}: {','.join(map(str, shape))}; --input-shape N,C,H,W sets it")
    r = flow.build(a.model, a.calib, target, cfg, opts, name=name, input_shape=shape, samples=a.samples, seed=a.seed,
                   evaluate=ev, evaluate_name=a.evaluate, min_sqnr=a.min_sqnr, log=print, warn=_warn,
                   progress=progress_bar, warm=_warm_kernels)
    paths = flow.write_build(r, a.output, force=a.force, inputs=inputs)
    for k in ("xmodel", "onnx", "quant_info", "golden", "report", "report_json"):
        if f"quantized/{k}" in paths:
            print(f"wrote {k:10s} {paths[f'quantized/{k}']}")
    for k, p in paths.items():
        if k.startswith("compiled/"):
            print(f"wrote {p}")
    assert r.verdict is not None                        # build measures accuracy (flow.build's default)
    _report(a, r, target, format_coverage, target_label)
    return 0 if r.ok and not r.verdict["below_floor"] else 1


def _report(a, r, target, format_coverage, target_label) -> None:
    """The closing lines: the coverage, the verdict (warned when an output does not follow float), what was written
    and why the exit status is 1."""
    from opendpu.runtime.verdict import NOISE_DB, format_verdict
    v = r.verdict
    print(format_coverage(r.coverage, target_label(target)))
    for line in format_verdict(v):
        print(line)
    if v["collapsed"]:
        _warn(f"an output of the INT8 model does not follow the float model (SQNR {v['_low']:.1f} dB, below "
              f"{NOISE_DB:g} dB: the error power is half the signal's or more, e.g. a constant or near-zero output); "
              f"this build is not accurate")
    from opendpu.compiler.xir.graph import dump_stem
    qx = f"{dump_stem(r.quant.model_name)}_int.xmodel"
    print(f"wrote {a.output}/quantized ({qx}, ...) and {a.output}/compiled ({r.name}.xmodel, {r.name}_org.xmodel, "
          f"meta.json) and {a.output}/accuracy.json" + ("" if r.ok else "; the check found mismatches (exit 1)"))
    if v["below_floor"]:
        print(f"opendpu build: accuracy below --min-sqnr {a.min_sqnr:g} dB: smallest output SQNR "
              + ("not measured" if v.get("not_measured") else f"{v['_low']:.2f} dB") + " (exit 1)")
