"""`opendpu zoo`: the model zoo's topologies (MACs, GOPs, parameters against the published figures) and their
float ONNX export. A model is named as the sweep names it (`sweep zoo:NAME@SIZE`): NAME, NAME@S or NAME@HxW, and
`digits` (the shipped digits CNN); the sweep's own parser (runtime.sweep.spec.parse_model) reads it."""
from __future__ import annotations

import os

from opendpu.compiler.outdir import DirOutput, check_dir
from opendpu.runtime.cli.common import _OUT_RULE, CliError, add_force, add_verb, int_range


def register(sub) -> None:
    z = add_verb(sub, "zoo", "model zoo: MACs/GOPs/params of the generated topologies; export ONNX")
    z.add_argument("names", nargs="*", metavar="NAME[@SIZE]",
                   help="zoo models as `sweep zoo:NAME@SIZE` names them: NAME, NAME@S or NAME@HxW, or digits (the "
                        "shipped digits CNN); default: every generated topology")
    z.add_argument("--size", type=int_range(32, 1024), metavar="S",
                   help="input size of the models named without @SIZE (default: each one's published size)")
    z.add_argument("-o", "--output", "--export", dest="output", metavar="DIR",
                   help="write the float ONNX models here as NAME.onnx (" + _OUT_RULE + "; each model is a net of "
                        "its own: an earlier export of other models is kept; --export: the older spelling)")
    add_force(z)
    z.set_defaults(fn=run)


def _specs(a) -> list:
    """The named models as sweep ModelSpecs (zoo:NAME, size), checked before anything is built."""
    from opendpu.quant import zoo
    from opendpu.runtime.sweep.spec import SweepError, parse_model
    specs = []
    for n in a.names or list(zoo.NAMES):
        size = a.size if "@" not in n and n != "digits" else None
        try:
            specs.append(parse_model(f"zoo:{n}", size=size))
        except SweepError as e:
            raise CliError(str(e)) from None
    names = [m.source[4:] for m in specs]
    if len(set(names)) != len(names):
        raise CliError(f"a zoo model is named twice: {' '.join(a.names or names)}")
    return specs


def _row(m, built: dict) -> dict:
    """The summary row of one model spec (zoo.summary's), its ModelProto put in `built`."""
    import onnx

    from opendpu.quant import zoo
    name = m.source[4:]
    if name != "digits":
        (row,) = zoo.summary([name], tuple(m.size) if isinstance(m.size, list) else m.size, models=built)
        return row
    model = built[name] = onnx.load(zoo.DIGITS_ONNX)
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"name": name, "input": "x".join(map(str, dims)), **zoo.count(model), "published_gops": None,
            "published_params": None}


def run(a) -> int:
    specs = _specs(a)
    names = [m.source[4:] for m in specs]
    if a.output:
        check_dir(a.output, force=a.force, what="output directory (-o/--export)", names=[f"{n}.onnx" for n in names])
    built: dict = {}
    rows = [_row(m, built) for m in specs]
    print(f"{'model':14s} {'input':16s} {'GMACs':>7s} {'GOPs':>7s} {'params':>11s} {'published GOPs':>14s} "
          f"{'published params':>16s}")
    for r in rows:
        pg = r.get("published_gops")
        pp = r.get("published_params")
        print(f"{r['name']:14s} {r['input']:16s} {r['macs'] / 1e9:7.3f} {r['gops']:7.3f} {r['params']:11,d} "
              f"{(f'{pg:.3f}' if pg else '-'):>14s} {(f'{pp:,}' if pp else '-'):>16s}")
    if a.output:
        import onnx
        with DirOutput(a.output, force=a.force, what="output directory (-o/--export)",
                       net=lambda rel: rel[:-len(".onnx")]) as tmp:     # each exported model is a net of its own
            for n in names:
                onnx.save(built[n], os.path.join(tmp, f"{n}.onnx"))
        for n in names:
            print(f"wrote {os.path.join(a.output, n + '.onnx')}")
    return 0
