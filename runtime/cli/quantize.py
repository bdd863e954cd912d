"""`opendpu quantize`: INT8 power-of-two post-training quantization of a float ONNX model (vai_q semantics)."""
from __future__ import annotations

import time

from opendpu.compiler.outdir import check_dir
from opendpu.runtime.pool import default_workers
from opendpu.runtime.cli.common import (_OUT_RULE, CliError, _calib_shape, _dynamic_input, _npz_or_npy,
                                            _onnx_input_shape, _warn, add_force, add_seed, add_verb, float_range,
                                            input_file, input_path, int_range, names_arg, shape_arg)


def register(sub) -> None:
    q = add_verb(sub, "quantize", "INT8 power-of-two post-training quantization (vai_q semantics)")
    q.add_argument("model", help="float ONNX model (opset 13+)")
    q.add_argument("--calib", required=True, metavar="DATA",
                   help="calibration data: .npy [N,C,H,W], .npz ('x'), or a folder of .npy")
    q.add_argument("--method", default="diffs", choices=("maxmin", "percentile", "mse", "entropy", "diffs"),
                   help="activation calibration method (diffs as vai_q_pytorch)")
    q.add_argument("--weight-method", choices=("maxmin", "diffs", "mse"),
                   help="weights/bias method (default: diffs, maxmin when --method is maxmin)")
    q.add_argument("--statistic", choices=("modal", "max", "mean", "median"),
                   help="per-batch reduction for diffs (default: the method's own)")
    q.add_argument("--percentile", type=float_range(0, 100), default=99.9999, metavar="P",
                   help="percentile for --method percentile, in (0, 100]")
    q.add_argument("--target", help="preset name, fingerprint or arch.json: DPU/CPU placement and its reasons")
    q.add_argument("-o", "--output", default="quantize_result", metavar="DIR",
                   help="output directory (" + _OUT_RULE + "; the net is the model's file stem; quant_info.json, "
                        "golden/ and report.* are written by every net: the newest one's are kept)")
    q.add_argument("--quant-info", metavar="QUANT_INFO.json",
                   help="reuse the fix points of this quant_info.json (skip calibration)")
    q.add_argument("--batch-size", type=int_range(1, 65536), default=8, metavar="N",
                   help="calibration samples per batch")
    q.add_argument("--calib-limit", type=int_range(1), metavar="N", help="use at most N calibration samples")
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
    q.add_argument("--evaluate", metavar="DATA", help="dataset (.npz with x and optional labels y): float vs quantized")
    q.add_argument("--workers", type=int_range(1, 1024), default=default_workers(), metavar="N",
                   help="--evaluate: processes sharing the data set (1 = in this process); the numbers do not "
                        "depend on it")
    add_seed(q, "the quantizer (fast finetune's sample order)")
    q.add_argument("--input-shape", type=shape_arg, metavar="N,C,H,W",
                   help="the input shape (NCHW) for a model whose input has dynamic dimensions")
    q.add_argument("--format", default="xir", choices=("xir", "vai_q"),
                   help="xmodel form: xir (*-fix ops) or vai_q (float ops + fix ops, as AMD's quantizers write it "
                        "for vai_c_xir)")
    add_force(q)
    q.set_defaults(fn=run)


def run(a) -> int:
    from opendpu.quant.quantize import QuantConfig, calib_arrays, output_names
    from opendpu.runtime.flow import quantize_step, quantize_summary
    from opendpu.runtime.progress import progress_bar
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
    res = quantize_step(a.model, x, target=a.target, config=cfg, quant_info=a.quant_info, input_shape=shape,
                        progress=progress_bar)
    ev = None
    if ev_data:
        from opendpu.runtime.quant_eval import evaluate
        with progress_bar("evaluate") as prog:
            ev = evaluate(res, *ev_data, workers=a.workers, progress=prog)
    paths = res.write(a.output, calib_x=x, evaluate=ev, force=a.force, inputs=ins, xmodel_format=a.format)
    for line in quantize_summary(res, a.model, time.perf_counter() - t0):
        print(line)
    if ev:
        print("  evaluate: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in ev.items()
                                         if k != "throughput"))
        t = ev["throughput"]
        print(f"  evaluate throughput: {t['images_per_s']} images/s ({ev['samples']} samples in {t['seconds']:g} s, "
              f"{t['workers']} worker{'s' if t['workers'] > 1 else ''})")
    for k in ("xmodel", "onnx", "quant_info", "golden", "report", "report_json"):
        if k in paths:
            print(f"wrote {k:10s} {paths[k]}")
    return 0
