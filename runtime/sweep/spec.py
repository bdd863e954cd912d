"""A sweep's specification (docs/sweeps.md): the parameters, the models, the spaces and the constraints.

A sweep is models x points. A point sets architecture parameters (a preset, a board profile, or pp / cp / alu_pp /
bank_depth / img_bg) and any `Timing` field. Everything here is checked (types, ranges, files) before any work; the
row columns of a result are defined here too, since constraints name them.
"""
from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opendpu.isa.boards import get_board
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import PRESETS, Target, Timing, get_target

ARCH_PARAMS = ("preset", "board", "pp", "cp", "alu_pp", "bank_depth", "img_bg")
TIMING_PARAMS = tuple(Timing.__dataclass_fields__)
PARAMS = ARCH_PARAMS + TIMING_PARAMS
RESOURCE_METRICS = ("dsp", "lut", "ff", "bram36")
ROW_COLUMNS = ("model", "point", "hash", "status", "reason", "target", "preset", "board", "pp", "cp", "alu_pp",
               "bank_depth", "img_bg", "clock_mhz", "cores", "params", "cycles", "latency_ms", "fps", "ddr_bound",
               "fps_single", "fps_bound", "ops", "gops", "mac_util", "ddr_read_bytes", "ddr_write_bytes", "ddr_mbps",
               "onchip_bytes", "onchip_pct", "bottleneck", "layers_conv", "layers_misc", "layers_load", "layers_save",
               "dsp", "lut", "ff", "bram36", "instructions", "dpu_subgraphs", "cpu_ops", "compile_s", "eval_s",
               "compile_cached", "meets_constraints")
NUMERIC_METRICS = ("cycles", "latency_ms", "fps", "fps_single", "ops", "gops", "mac_util", "ddr_read_bytes",
                   "ddr_write_bytes", "ddr_mbps", "onchip_bytes", "onchip_pct", "dsp", "lut", "ff", "bram36",
                   "instructions", "dpu_subgraphs", "cpu_ops", "pp", "cp", "alu_pp", "bank_depth", "img_bg",
                   "clock_mhz", "cores")
SPACE_MODES = ("grid", "random", "list")
MAX_POINTS = 1_000_000


class SweepError(OpenDpuError, ValueError):
    """A bad sweep specification or a sweep that cannot give any result; the CLI reports it (exit 2)."""


# ---- specification ---------------------------------------------------------------------------------------------
@dataclass
class ModelSpec:
    """One model of a sweep: a zoo topology (`zoo`, `size`), an ONNX file (`calib`: .npy/.npz/folder, else random
    N(0,1) samples: cycles do not depend on values), a quantized xmodel or a compiled one (recompiled)."""

    label: str
    source: str                  # "zoo:<name>" or a file path
    size: Any = None             # zoo input size: int or [H, W]
    calib: str | None = None


@dataclass
class Space:
    """A grid (cartesian product of `axes`), `samples` random points of that grid, or an explicit `points` list."""

    mode: str = "grid"
    axes: dict[str, list] = field(default_factory=dict)
    samples: int = 0
    points: list[dict] = field(default_factory=list)


@dataclass
class Constraint:
    name: str
    op: str
    value: float

    def ok(self, v) -> bool:
        if v is None:
            return False
        return {"<=": v <= self.value, "<": v < self.value, ">=": v >= self.value, ">": v > self.value,
                "==": v == self.value, "!=": v != self.value}[self.op]

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.value:g}"


@dataclass
class SweepSpec:
    models: list[ModelSpec]
    spaces: list[Space]
    constraints: list[Constraint] = field(default_factory=list)
    options: dict = field(default_factory=dict)      # compiler options (vai_c --options)
    seed: int = 0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*([-+0-9.eE]+)\s*$")


def parse_constraint(text: str) -> Constraint:
    """'dsp <= 1248' -> Constraint; the name is a numeric result column (NUMERIC_METRICS)."""
    m = _CONSTRAINT.match(str(text))
    if not m:
        raise SweepError(f"constraint {text!r}: expected NAME OP NUMBER with OP one of <= < >= > == != "
                         f"(e.g. 'dsp <= 1248')")
    name, op, val = m.groups()
    if name not in NUMERIC_METRICS:
        raise SweepError(f"constraint {text!r}: unknown quantity {name!r}; known: {', '.join(NUMERIC_METRICS)}")
    try:
        v = float(val)
    except ValueError:
        raise SweepError(f"constraint {text!r}: {val!r} is not a number") from None
    return Constraint(name, op, v)


def parse_model(text: str, size=None, calib: str | None = None, label: str | None = None) -> ModelSpec:
    """'zoo:resnet50', 'zoo:yolov3@416', 'zoo:yolov3@512x256' or a path (.onnx / .xmodel). Checks the name, the
    size (zoo models only), the calibration data's path (ONNX files only) and the label; the file's contents are
    checked by `validate_model`."""
    from opendpu.quant import zoo
    if not isinstance(text, str):
        raise SweepError(f"model {text!r}: expected a path or zoo:NAME (a string)")
    if label is not None and (not isinstance(label, str) or not label.strip()):
        raise SweepError(f"model {text}: name {label!r} must be a non-empty string")
    if calib is not None and (not isinstance(calib, str) or not calib):
        raise SweepError(f"model {text}: calib {calib!r} must be a path (a non-empty string)")
    s = text.strip()
    if s.startswith("zoo:"):
        name, _, sz = s[4:].partition("@")
        if calib is not None:
            raise SweepError(f"model {s}: calib is for ONNX files; a zoo model is quantized on random samples "
                             f"(zoo:digits on its own images)")
        if name == "digits":                     # the shipped digits CNN (8x8 load_digits images)
            if sz or size is not None:
                raise SweepError(f"model {s!r}: the digits CNN has a fixed 8x8 input")
            return ModelSpec(label or "digits", "zoo:digits")
        if name not in zoo.NAMES:
            raise SweepError(f"model {s!r}: unknown zoo model {name!r}; known: digits, {', '.join(zoo.NAMES)}")
        if sz:
            if size is not None:
                raise SweepError(f"model {s!r}: the size is given twice (@{sz} and size = {size!r})")
            try:
                size = [int(v) for v in sz.lower().split("x")] if "x" in sz.lower() else int(sz)
            except ValueError:
                raise SweepError(f"model {s!r}: input size {sz!r} is not N or HxW") from None
        if size is not None:
            try:
                zoo._check_hw(size)
            except (OpenDpuError, ValueError) as e:
                raise SweepError(f"model {s}: {e}") from None
            size = list(size) if isinstance(size, (list, tuple)) else size
        return ModelSpec(label or (name if size is None else f"{name}@{_size_text(size)}"), f"zoo:{name}", size)
    if not s:
        raise SweepError("model: empty name; give a path (.onnx, .xmodel) or zoo:NAME")
    if size is not None:
        raise SweepError(f"model {s}: size is for zoo models; a file has its own input shape")
    if not os.path.lexists(s):
        raise SweepError(f"model {s}: no such file")
    if os.path.isdir(s):
        raise SweepError(f"model {s}: is a directory, not a model file")
    if not s.endswith((".onnx", ".xmodel")):
        raise SweepError(f"model {s}: not an xmodel or ONNX file (give a .xmodel, a .onnx or zoo:NAME)")
    if calib is not None:
        if not s.endswith(".onnx"):
            raise SweepError(f"model {s}: calib is for ONNX files; an xmodel is already quantized")
        if not os.path.exists(calib):
            raise SweepError(f"model {s}: calibration data {calib}: no such file or folder")
    return ModelSpec(label or os.path.splitext(os.path.basename(s))[0], s, None, calib)


def validate_model(m: ModelSpec) -> None:
    """The model file's contents, before any work: an xmodel loads and is quantized or compiled; an ONNX file is
    an ONNX model (the quantizer's own loader and messages) with one static NCHW input, and its calibration data
    fits that input. Zoo models are built (and checked) when prepared."""
    if m.source.startswith("zoo:"):
        return
    if not os.path.isfile(m.source) or not os.access(m.source, os.R_OK):
        raise SweepError(f"model {m.source}: not a readable file")
    if m.source.endswith(".xmodel"):
        from opendpu.compiler.frontend import detect_form
        from opendpu.compiler.xir.graph import Graph
        try:
            detect_form(Graph.load(m.source), m.source)
        except (OpenDpuError, ValueError, OSError) as e:
            msg = " ".join(str(e).split())
            raise SweepError(msg if m.source in msg else f"model {m.source}: {msg}") from None
        return
    from opendpu.quant.onnx_in import load_onnx
    from opendpu.quant.quantize import calib_arrays
    try:
        model = load_onnx(m.source)
    except (OpenDpuError, ValueError, OSError) as e:
        raise SweepError(" ".join(str(e).split())) from None
    shape = input_shape(model, m)
    if m.calib:
        try:
            calib_arrays(m.calib, shape, limit=16)
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"model {m.label}: {e}") from None


def input_shape(model, m: ModelSpec) -> list[int]:
    """The ONNX model's one input as [1, C, H, W]; a sweep takes single-input models with a static shape."""
    ins = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(ins) != 1:
        raise SweepError(f"model {m.label}: {len(ins)} graph inputs; a sweep takes single-input models")
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in ins[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or min(dims[1:]) < 1:
        raise SweepError(f"model {m.label}: input shape {dims} is not a static [N, C, H, W]")
    return [1, *dims[1:]]


def _size_text(size) -> str:
    return "x".join(map(str, size)) if isinstance(size, (list, tuple)) else str(size)


def _check_values(name: str, vals, where: str) -> list:
    """The values of one parameter axis, typed and range-checked one by one (a preset, board or Timing value)."""
    if name not in PARAMS:
        raise SweepError(f"{where}: unknown parameter {name!r}; known: {', '.join(PARAMS)}")
    if not isinstance(vals, list):
        vals = [vals]
    if not vals:
        raise SweepError(f"{where}: parameter {name} has no values (an empty space)")
    out = []
    for v in vals:
        out.append(_check_value(name, v, where))
    if len(set(map(repr, out))) != len(out):
        raise SweepError(f"{where}: parameter {name}: a value is repeated ({vals})")
    return out


def _check_value(name: str, v, where: str):
    if name == "preset":
        try:
            name = get_target(str(v)).name if str(v).upper().startswith(("B", "DPUCZDX8G")) else _bad_preset(v)
            if name not in PRESETS:
                _bad_preset(v)
            return name.rsplit("_", 1)[1]                 # B512 ... B4096
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"{where}: preset {v!r}: {e}") from None
    if name == "board":
        try:
            return get_board(str(v)).name
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"{where}: {e}") from None
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise SweepError(f"{where}: parameter {name}: {v!r} is not a number")
    if isinstance(v, str):
        try:
            v = float(v) if name == "clock_mhz" else int(v, 0)
        except ValueError:
            raise SweepError(f"{where}: parameter {name}: {v!r} is not a number") from None
    if isinstance(v, float) and not np.isfinite(v):
        raise SweepError(f"{where}: parameter {name}: {v!r} is not a finite number")
    if name in TIMING_PARAMS:
        if name != "clock_mhz":
            if float(v) != int(v):
                raise SweepError(f"{where}: parameter {name}: {v!r} is not an integer")
            v = int(v)
        else:
            v = float(v)
        try:
            Timing().replace(**{name: v})
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"{where}: {e}") from None
        return v
    if float(v) != int(v):
        raise SweepError(f"{where}: parameter {name}: {v!r} is not an integer")
    v = int(v)
    # the array's own range checks (Target.parametric), on a PP8/CP8 base that any legal value fits
    kw = {"pp": 8, "cp": 8, name: v}
    try:
        Target.parametric(kw.pop("pp"), kw.pop("cp"), **kw)
    except (OpenDpuError, ValueError) as e:
        raise SweepError(f"{where}: parameter {name}: {e}") from None
    return v


def _bad_preset(v):
    raise SweepError(f"unknown preset {v!r}; presets: {', '.join(p.rsplit('_', 1)[1] for p in PRESETS)}")


def space_from_dict(d: dict, where: str) -> Space:
    """A [[space]] table: parameter lists, and optionally mode = grid|random|list, samples, points. Every key that
    the space's mode would ignore is an error (samples outside mode random, parameters beside a points list, more
    samples than the grid has points)."""
    if not isinstance(d, dict):
        raise SweepError(f"{where}: expected a [[space]] table of parameters, not {_kind(d)}")
    d = dict(d)
    mode = d.pop("mode", None)
    has_samples = "samples" in d
    samples = d.pop("samples", 0)
    points = d.pop("points", None)
    if mode is None:
        mode = "list" if points is not None else ("random" if has_samples else "grid")
    if not isinstance(mode, str) or mode not in SPACE_MODES:
        raise SweepError(f"{where}: mode {mode!r}; choose from {', '.join(SPACE_MODES)}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise SweepError(f"{where}: samples {samples!r} must be an integer >= 1")
    if mode == "random" and samples < 1:
        raise SweepError(f"{where}: mode random needs samples >= 1")
    if mode != "random" and has_samples:
        raise SweepError(f"{where}: samples is only for mode = \"random\" (this space is mode = \"{mode}\")")
    axes = {k: _check_values(k, v, where) for k, v in d.items()}
    pts = []
    if mode == "list":
        if not isinstance(points, list) or not points:
            raise SweepError(f"{where}: mode list needs a non-empty points = [{{...}}, ...]")
        if axes:
            raise SweepError(f"{where}: mode list takes its points from points = [...]; the parameter(s) "
                             f"{', '.join(axes)} beside it would be ignored: put them in each point, or in a "
                             f"[[space]] of their own")
        for i, p in enumerate(points):
            if not isinstance(p, dict) or not p:
                raise SweepError(f"{where}: points[{i}] must be a non-empty table of parameters")
            pts.append({k: _check_values(k, [v], f"{where} points[{i}]")[0] for k, v in p.items()})
    elif points is not None:
        raise SweepError(f"{where}: points is only for mode = \"list\"")
    elif not axes:
        raise SweepError(f"{where}: no parameters (an empty space)")
    if mode == "random":
        n = int(np.prod([len(v) for v in axes.values()], dtype=object))
        if samples > n:
            if where == "--param":
                raise SweepError(f"--samples {samples}: the --param grid has only {n} point(s); give at most {n}, or "
                                 f"leave --samples out to sweep the whole grid")
            raise SweepError(f"{where}: samples = {samples} is more than the {n} point(s) of its grid; give at most "
                             f"{n}, or mode = \"grid\" for the whole grid")
    return Space(mode, axes, samples, pts)


def _kind(v) -> str:
    """What a TOML value is, for messages: 'a string', 'an integer', 'a list', 'a table', ..."""
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(v), f"a {type(v).__name__}")


_TOP_KEYS = {"model", "space", "constraints", "seed", "options"}
_MODEL_KEYS = {"zoo", "path", "size", "calib", "name"}


def load_spec(path: str) -> SweepSpec:
    """A sweep file (TOML): [[model]] tables, [[space]] tables, constraints = [...], seed, options; every key and
    value is checked (types, ranges, files) before any work."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise SweepError(f"sweep file {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SweepError(f"sweep file {path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); a "
                         f"sweep file is TOML, which is UTF-8") from None
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SweepError(f"sweep file {path}: not valid TOML: {e}") from None
    except RecursionError:                   # tomllib recurses once per nesting level of an array or table
        raise SweepError(f"sweep file {path}: arrays or tables nested too deeply to read (a sweep file nests at "
                         f"most 3 levels)") from None
    return spec_from_dict(d, path)


def _tables(d: dict, key: str, where: str) -> list[dict]:
    """The [[key]] tables of a sweep file (a list of tables)."""
    v = d.get(key, [])
    if isinstance(v, dict):
        raise SweepError(f"{where}: {key} must be [[{key}]] tables (double brackets: one per {key}), not a single "
                         f"[{key}] table")
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise SweepError(f"{where}: {key} must be [[{key}]] tables, not {_kind(v)}"
                         + (" of other values" if isinstance(v, list) else ""))
    return v


def spec_from_dict(d: dict, where: str = "sweep") -> SweepSpec:
    """A sweep specification from a parsed sweep file (or a dict of the same form), every key type-checked.
    Relative paths (`path`, `calib`) are relative to the file."""
    if not isinstance(d, dict):
        raise SweepError(f"{where}: expected a table of sweep keys, not {_kind(d)}")
    bad = sorted(set(d) - _TOP_KEYS)
    if bad:
        raise SweepError(f"{where}: unknown key(s) {', '.join(bad)}; known: {', '.join(sorted(_TOP_KEYS))}")
    here = os.path.dirname(os.path.abspath(where)) if where != "sweep" else None
    models = []
    for i, m in enumerate(_tables(d, "model", where)):
        w = f"{where}: model[{i}]"
        badk = sorted(set(m) - _MODEL_KEYS)
        if badk:
            raise SweepError(f"{w}: unknown key(s) {', '.join(badk)}; known: {', '.join(sorted(_MODEL_KEYS))}")
        if ("zoo" in m) == ("path" in m):
            raise SweepError(f"{w}: give exactly one of zoo = NAME or path = FILE")
        for k in ("zoo", "path", "calib", "name"):
            if k in m and (not isinstance(m[k], str) or not m[k].strip()):
                raise SweepError(f"{w}: {k} must be a non-empty string, not {_kind(m[k])} ({m[k]!r})")
        if "size" in m and not (isinstance(m["size"], int) and not isinstance(m["size"], bool)
                                or isinstance(m["size"], list) and len(m["size"]) == 2
                                and all(isinstance(v, int) and not isinstance(v, bool) for v in m["size"])):
            raise SweepError(f"{w}: size must be an integer or [H, W], not {_kind(m['size'])} ({m['size']!r})")
        src = f"zoo:{m['zoo']}" if "zoo" in m else m["path"]
        calib = m.get("calib")
        if here is not None:
            if "path" in m and not os.path.isabs(src):
                src = os.path.join(here, src)
            if calib is not None and not os.path.isabs(calib):
                calib = os.path.join(here, calib)
        try:
            models.append(parse_model(src, m.get("size"), calib, m.get("name")))
        except SweepError as e:
            raise SweepError(f"{w}: {e}") from None
    spaces = [space_from_dict(s, f"{where}: space[{i}]") for i, s in enumerate(_tables(d, "space", where))]
    cons = d.get("constraints", [])
    if isinstance(cons, str):
        cons = [cons]
    if not isinstance(cons, list) or not all(isinstance(c, str) for c in cons):
        raise SweepError(f"{where}: constraints must be a string or a list of strings like \"dsp <= 1248\", not "
                         f"{_kind(cons)}" + (" of other values" if isinstance(cons, list) else ""))
    seed = d.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**32 - 1:
        raise SweepError(f"{where}: seed {seed!r} must be an integer in 0..{2**32 - 1}")
    opts = d.get("options", {})
    if not isinstance(opts, dict):
        raise SweepError(f"{where}: options must be a table of compiler options ([options]), not {_kind(opts)}")
    try:
        cs = [parse_constraint(c) for c in cons]
    except SweepError as e:
        raise SweepError(f"{where}: {e}") from None
    return SweepSpec(models, spaces, cs, _check_options(opts, where), seed)


def _check_options(opts: dict, where: str) -> dict:
    from opendpu.compiler.pipeline import check_options
    try:
        return check_options(dict(opts))
    except (OpenDpuError, ValueError) as e:
        raise SweepError(f"{where}: compiler options: {e}") from None

