"""`opendpu compile` (vai_c_xir): a quantized xmodel -> DIR/NAME.xmodel, NAME_org.xmodel, meta.json, report.*"""
from __future__ import annotations

import os

from opendpu.compiler.outdir import DirOutput, check_dir
from opendpu.runtime.cli.common import _OUT_RULE, CliError, _load_graph, add_force, add_verb, input_file


def register(sub) -> None:
    cp = add_verb(sub, "compile", "compile a quantized xmodel for a DPU target (vai_c_xir): NAME.xmodel, "
                                  "NAME_org.xmodel, meta.json")
    cp.add_argument("model", nargs="?", metavar="MODEL",
                    help="the quantized xmodel (opendpu quantize's *_int.xmodel); with --recompile a compiled one")
    cp.add_argument("-x", "--xmodel", metavar="MODEL", help="the model, as vai_c_xir takes it (instead of MODEL)")
    cp.add_argument("-a", "--arch", metavar="ARCH.json", help="arch.json naming the target or its fingerprint")
    cp.add_argument("--target", help="preset name, fingerprint or arch.json (instead of -a)")
    cp.add_argument("-o", "--output", "--output_dir", "--output-dir", dest="output", required=True, metavar="DIR",
                    help="output directory (" + _OUT_RULE + "; other nets' NAME.xmodel are kept, as vai_c_xir does; "
                         "meta.json and report.* are written by every net: the newest one's are kept; --output_dir: "
                         "vai_c_xir's spelling)")
    cp.add_argument("-n", "--net_name", "--net-name", dest="net_name", metavar="NAME",
                    help="name of the compiled model, the output file stem (default: the model's file stem without "
                         "a trailing _int)")
    cp.add_argument("--options", metavar="JSON", help="vai_c options: input_shape, output_ops, prefetch, hd_opt")
    cp.add_argument("--recompile", action="store_true", help="MODEL is a compiled xmodel: compile its graph again")
    cp.add_argument("--dump-after", action="append", metavar="PASS",
                    help="also write the compile context after this pass as dump_after_PASS.json")
    add_force(cp)
    cp.set_defaults(fn=run)


def _model(a) -> tuple[str, str]:
    """(path, what) of the model: the positional MODEL or -x (vai_c_xir's), exactly one."""
    if a.model and a.xmodel:
        raise CliError(f"give the model once: MODEL ({a.model}) or -x ({a.xmodel}), not both")
    if not a.model and not a.xmodel:
        raise CliError("give the quantized model: opendpu compile MODEL ... (or -x MODEL, as vai_c_xir)")
    return (a.model, "model") if a.model else (a.xmodel, "-x model")


def _target(a):
    """The target: -a arch.json or --target (a preset, fingerprint or arch.json), exactly one."""
    from opendpu.isa.target import get_target
    if a.arch and a.target:
        raise CliError(f"give either -a {a.arch} or --target {a.target}, not both")
    if not a.arch and not a.target:
        raise CliError("give the target: -a ARCH.json or --target NAME (e.g. DPUCZDX8G_ISA1_B4096)")
    if a.arch:
        input_file(a.arch, "-a arch.json")
    return get_target(a.arch or a.target)


def net_name(path: str) -> str:
    """The default net name of a model file: its stem, without the `_int` opendpu quantize adds."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return stem[:-len("_int")] if stem.endswith("_int") and len(stem) > len("_int") else stem


def run(a) -> int:
    from opendpu.compiler.partition import format_coverage, target_label
    from opendpu.compiler.pipeline import check_dump_after, check_name, output_names, parse_options
    from opendpu.runtime.flow import compile_step
    model, what = _model(a)
    input_file(model, what)
    target = _target(a)
    name = check_name(a.net_name if a.net_name is not None else net_name(model))
    opts = parse_options(a.options) if a.options is not None else {}
    dumps = check_dump_after(a.dump_after)
    inputs = [model] + ([a.arch] if a.arch else []) + ([a.target] if a.target and os.path.isfile(a.target) else [])
    check_dir(a.output, force=a.force, inputs=inputs, what="output directory (-o)", names=output_names(name, dumps))
    g = _load_graph(model)
    res = compile_step(g, target, name=name, options=opts, recompile=a.recompile, dump_after=dumps, log=print)
    with DirOutput(a.output, force=a.force, inputs=inputs, what="output directory (-o)", net=name) as tmp:
        written = [os.path.basename(p) for p in res.write(tmp)]       # files() serialises the graph: once
    print(format_coverage(res.meta["coverage"], target_label(target)))
    for f in written:
        print(f"wrote {os.path.join(a.output, f)}")
    return 0
