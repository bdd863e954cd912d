"""What every verb of the `opendpu` command line shares: the parser class and its one-line errors, the help
formatter, the verb/option builders that carry the conventions (docs: tests/test_cli_conventions.py), the output
rule's text, and the helpers several verbs use (loading a model, choosing DPU subgraphs, warming the simulator's
kernels, atomic writes, boards, op plugins, ONNX input shapes).

The conventions (issue 31 item 7): the model is positional; the output is -o/--output; one option name per concept
(`--samples` for how many random things are drawn, `--limit` for at most N of what is given, `--seed` with one
range, `--target`); every argument has help and every default is shown. Older spellings stay as aliases
(`LEGACY_ALIASES`), so existing scripts keep working.
"""
from __future__ import annotations

import argparse
import os
import sys

from opendpu.runtime.cli.checks import (SEED, SEED_MAX, CliError, float_range, input_dir, input_file, input_path,
                                            int_range, load_array, load_bin, load_npz, names_arg, shape_arg,
                                            timing_overrides, timing_value)

__all__ = ["CliError", "SEED", "SEED_MAX", "float_range", "input_dir", "input_file", "input_path", "int_range",
           "load_array", "load_bin", "load_npz", "names_arg", "shape_arg", "timing_overrides", "timing_value",
           "LEGACY_ALIASES", "_EXAMPLES", "_Fmt", "_OUT_RULE", "_Parser", "_UsageError", "_VERB", "_atomic_write",
           "_board", "_board_timing", "_check_cpu_ops", "_check_target", "_clock_mhz_type", "_load_graph",
           "_load_plugins", "_select_dpu_subgraphs", "_stem", "_version", "_warm_kernels", "_warn",
           "_write_announced", "add_force", "add_plugin", "add_seed", "add_verb"]


# ---- the parser ------------------------------------------------------------------------------------------------
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


def _shows_default(action) -> bool:
    """Whether the help shows the action's default: every real value, 0 and 0.0 included (not None, not a flag's
    False, not the help/version actions' SUPPRESS)."""
    d = action.default
    return not (d is None or d is False or d is argparse.SUPPRESS or isinstance(action, argparse._VersionAction))


class _Fmt(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every default shown (0 included), not for flags and unset options; example epilogues kept verbatim."""

    def _get_help_string(self, action):
        if not _shows_default(action):
            return action.help
        return super()._get_help_string(action)


# {verb: {old option string: the canonical one}}: older spellings kept so that existing scripts work
LEGACY_ALIASES = {
    "check": {"-n": "--samples"},
    "build": {"--check-n": "--samples"},
    "cosim": {"--random": "--samples"},
    "compile": {"-x": "model", "--xmodel": "model", "--output_dir": "--output", "--output-dir": "--output"},
    "zoo": {"--export": "--output"},
}


def add_verb(sub, name: str, help_: str):
    """A verb's subparser: its help, the shared formatter and its examples."""
    return sub.add_parser(name, help=help_, description=help_, epilog=_EXAMPLES.get(name), formatter_class=_Fmt)


def add_force(p) -> None:
    p.add_argument("--force", action="store_true",
                   help="also write into a non-empty directory opendpu did not write, and replace a file there that "
                        "has the name of one of this run's outputs but is not opendpu's unchanged output (each "
                        "replacement is printed); nothing else is deleted or changed")


def add_plugin(p) -> None:
    p.add_argument("--op-plugin", action="append", metavar="MODULE.py",
                   help="import this module first; it registers custom CPU ops with runtime.register_op")


def add_seed(p, what: str) -> None:
    """--seed: one range (0..SEED_MAX) for every verb."""
    p.add_argument("--seed", type=SEED, default=0, metavar="S", help=f"seed of {what} (0..{SEED_MAX}; reproducible)")


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


_EXAMPLES = {
    "run": """examples:
  opendpu run model.xmodel -i image.npy -o out.npz              # float NHWC input, float outputs
  opendpu run model.xmodel -i image_nchw.npy --layout nchw     # transpose an NCHW image explicitly
  opendpu run model.xmodel -i x.npy --raw -o out.npz            # int8 outputs + '<name>.fix_point'
  opendpu run q/model_int.xmodel --backend ref -i q/golden/input_aquant.bin --golden q/golden
  opendpu run tf2_custom_op.xmodel -i x.npy --op-plugin mylayer.py
""",
    "check": "examples:\n  opendpu check yolox_nano_b512.xmodel --samples 2",
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
  opendpu cosim --samples 5 --target DPUCZDX8G_ISA1_B512 --instructions 100 --waves wave_dir""",
    "quantize": """examples:
  opendpu quantize model.onnx --calib calib.npy --target DPUCZDX8G_ISA1_B4096 -o q
  opendpu quantize model.onnx --calib data.npz --evaluate test.npz --method maxmin -o q""",
    "inspect": "examples:\n  opendpu inspect model.onnx --target DPUCZDX8G_ISA1_B512 -o insp\n"
               "  opendpu inspect q/net_int.xmodel --target B512,B4096 -o insp    # coverage per target",
    "compile": """examples:
  opendpu compile q/digits_cnn_int.xmodel --target DPUCZDX8G_ISA1_B4096 -o c      # c/digits_cnn.xmodel
  opendpu compile -x q/net_int.xmodel -a arch.json -o c -n net --options '{"output_ops": "fc"}'
  opendpu compile c/digits_cnn.xmodel --recompile --target DPUCZDX8G_ISA1_B512 -o c512""",
    "build": "examples:\n  opendpu build model.onnx --calib calib.npy --target DPUCZDX8G_ISA1_B4096 -o out",
    "compare": """examples:
  opendpu compare model.onnx out --data test.npz                 # out = opendpu build -o; top-1 agreement + SQNR
  opendpu compare yolov8n.onnx out --data images.npy --task detect --score-threshold 0.3 --json acc.json""",
    "zoo": "examples:\n  opendpu zoo resnet18 mobilenet_v2 --size 224 -o models\n"
           "  opendpu zoo yolov3@416 digits           # NAME@SIZE (or @HxW) as in sweep zoo:NAME@SIZE",
    "targets": "examples:\n  opendpu targets --json",
}


# ---- messages ----------------------------------------------------------------------------------------------------
_VERB = ["opendpu"]         # "opendpu VERB" once main() has parsed the verb: warnings name it


def _warn(msg: str) -> None:
    print(f"{_VERB[0]}: warning: {msg}", file=sys.stderr)


# ---- models and subgraphs ----------------------------------------------------------------------------------------
def _load_graph(path: str):
    from opendpu.compiler.xir.graph import Graph
    input_file(path, "model")
    return Graph.load(path)


def _stem(path: str) -> str:
    """A model file's name without its suffix: the net its outputs belong to (compiler.outdir)."""
    return os.path.splitext(os.path.basename(path))[0]


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


def _check_target(dpu, spec) -> None:
    from opendpu.isa.target import get_target
    t = get_target(spec)
    if t.fingerprint != dpu.fingerprint:
        raise CliError(f"--target {spec}: subgraph {dpu.name!r} was compiled for {dpu.target.name}, not {t.name} "
                       f"(VART_GRAPH_FINGERPRINT_ERROR)")


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
            if spec is None or spec.loader is None:
                raise ImportError(f"no module loader for {p}")
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


# ---- boards --------------------------------------------------------------------------------------------------
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


# ---- writing -------------------------------------------------------------------------------------------------
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


# ---- ONNX inputs (quantize, inspect, build) -----------------------------------------------------------------
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
    from opendpu.runtime.flow import onnx_input_shape
    shp = onnx_input_shape(path, input_shape)
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

