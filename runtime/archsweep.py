"""Architecture sweeps: compile and time models over DPU configurations (docs/sweeps.md).

A sweep is models x points. A point sets architecture parameters (a preset, a board profile, or pp / cp /
alu_pp / bank_depth / img_bg) and any `Timing` field. Each (model, point) is compiled for the point's target,
cached by a content hash of (quantized graph, target, timing the cycle model reads, compiler sources, options),
then timed on the timing-only cycle model. Its row gives cycles, latency, fps with cores and DDR contention
(sim/multicore.py), GOP/s, MAC utilisation, DDR bytes and bandwidth, on-chip memory use, the bounding engine per
layer and the estimated FPGA resources (hw/resources.py). A point that fails is a row with its reason.

Results are stored one JSON file per (model, point) hash under the sweep directory, so a re-run skips finished
points; the same code evaluates a point in a local process pool or on Ray (`run`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import pickle
import random
import re
import sys
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from opendpu.isa.boards import BOARDS, get_board
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.fields import Engine
from opendpu.isa.target import PRESETS, Target, Timing, get_target

ARCH_PARAMS = ("preset", "board", "pp", "cp", "alu_pp", "bank_depth", "img_bg")
TIMING_PARAMS = tuple(Timing.__dataclass_fields__)
PARAMS = ARCH_PARAMS + TIMING_PARAMS
# Timing fields the cycle model does not read (milliseconds, the multi-core and host model, the watchdog): a point
# that changes only these reuses the compiled program of its configuration.
MODEL_ONLY_TIMING = ("clock_mhz", "dsp_clock_mult", "cores", "board_ddr_mbps", "ddr_efficiency_pct",
                     "frame_overhead_us", "watchdog_cycles")
RESOURCE_METRICS = ("dsp", "lut", "ff", "bram36")
ROW_COLUMNS = ("model", "point", "hash", "status", "reason", "target", "preset", "board", "pp", "cp", "alu_pp",
               "bank_depth", "img_bg", "clock_mhz", "cores", "params", "cycles", "latency_ms", "fps", "ddr_bound",
               "ops", "gops", "mac_util", "ddr_read_bytes", "ddr_write_bytes", "ddr_mbps", "onchip_bytes",
               "onchip_pct", "bottleneck", "layers_conv", "layers_misc", "layers_load", "layers_save", "dsp", "lut",
               "ff", "bram36", "instructions", "dpu_subgraphs", "cpu_ops", "compile_s", "eval_s", "compile_cached",
               "meets_constraints")
NUMERIC_METRICS = ("cycles", "latency_ms", "fps", "ops", "gops", "mac_util", "ddr_read_bytes", "ddr_write_bytes",
                   "ddr_mbps", "onchip_bytes", "onchip_pct", "dsp", "lut", "ff", "bram36", "instructions",
                   "dpu_subgraphs", "cpu_ops", "pp", "cp", "alu_pp", "bank_depth", "img_bg", "clock_mhz", "cores")
SPACE_MODES = ("grid", "random", "list")
MAX_POINTS = 1_000_000
RESULT_VERSION = 1
MARKER = "opendpu-sweep.json"          # marks a directory as a sweep's own (safe to add results to)


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
    shape = _input_shape(model, m)
    if m.calib:
        try:
            calib_arrays(m.calib, shape, limit=16)
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"model {m.label}: {e}") from None


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


# ---- points ----------------------------------------------------------------------------------------------------
def expand(spec: SweepSpec) -> list[dict]:
    """Every point of the spec's spaces in order, duplicates dropped (the same spec gives the same points)."""
    if not spec.spaces:
        raise SweepError("the sweep has no parameter space; give --param NAME=V1,V2,... or a [[space]] table")
    out: dict[str, dict] = {}
    rng = random.Random(spec.seed)
    for sp in spec.spaces:
        if sp.mode == "list":
            pts = [dict(p) for p in sp.points]
        else:
            names = list(sp.axes)
            n = int(np.prod([len(sp.axes[k]) for k in names], dtype=object))
            if sp.mode == "random" and sp.samples < n:
                idx = sorted(rng.sample(range(n), sp.samples))
                pts = [_nth(sp.axes, names, i) for i in idx]
            else:
                if n > MAX_POINTS:
                    raise SweepError(f"a grid of {n} points is too many (at most {MAX_POINTS}); sample it with "
                                     f"mode = \"random\"")
                pts = [dict(zip(names, v)) for v in itertools.product(*(sp.axes[k] for k in names))]
        for p in pts:
            out.setdefault(point_id(p), p)
    if len(out) > MAX_POINTS:
        raise SweepError(f"{len(out)} points is too many (at most {MAX_POINTS})")
    return list(out.values())


def _nth(axes: dict, names: list[str], i: int) -> dict:
    p = {}
    for k in reversed(names):
        vals = axes[k]
        i, r = divmod(i, len(vals))
        p[k] = vals[r]
    return {k: p[k] for k in names}


def point_id(p: dict) -> str:
    """'preset=DPUCZDX8G_ISA1_B512;clock_mhz=300.0': the point's parameters in PARAMS order."""
    return ";".join(f"{k}={p[k]}" for k in PARAMS if k in p)


def build_target(p: dict) -> Target:
    """The point's Target: the preset (or the board's arch), with pp/cp/alu_pp/bank_depth/img_bg overrides, then
    the board's timing (clock, cores, DDR, host overhead) and the point's timing fields. In a sweep a board gives
    its timing to any array (a B2304 on a KV260 is a legal design); its own array is the default."""
    base = p.get("preset") or (get_board(p["board"]).arch if "board" in p else None)
    over = {k: p[k] for k in ("pp", "cp", "alu_pp", "bank_depth", "img_bg") if k in p}
    if base is not None:
        t = get_target(base)
        if over:                 # the preset's features kept; ALU_PP follows a new PP unless given
            kw = {f.name: getattr(t, f.name) for f in dataclasses.fields(t)
                  if f.name not in ("pp", "cp", "name", "fingerprint", "timing")}
            if "pp" in over:
                kw.pop("alu_pp")
            kw.update(over)
            t = Target.parametric(kw.pop("pp", t.pp), kw.pop("cp", t.cp), **kw)
    else:
        if "pp" not in over or "cp" not in over:
            raise SweepError(f"point {point_id(p)}: give a preset, a board, or both pp and cp")
        t = Target.parametric(over.pop("pp"), over.pop("cp"), **over)
    tm = dict(get_board(p["board"]).timing()) if "board" in p else {}
    tm.update({k: p[k] for k in TIMING_PARAMS if k in p})
    return t.with_timing(**tm) if tm else t


def resources(t: Target) -> dict:
    """Estimated DSP48 / LUT / FF / BRAM36 of all the target's cores (hw/resources.py, PG338 low RAM, high DSP)."""
    from opendpu.hw.resources import estimate
    r = estimate(t)
    n = t.timing.cores
    return {"dsp": r["dsp"] * n, "lut": r["lut"] * n, "ff": r["ff"] * n, "bram36": r["bram36"] * n}


# ---- compile cache ---------------------------------------------------------------------------------------------
_SOURCE_HASH: str | None = None


def compiler_version() -> str:
    """A hash of the sources a compiled program depends on: the compiler, the ISA and the cycle model it decides
    by (any edit there invalidates the compile cache)."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for pkg in ("compiler", "isa", "sim"):
            for dp, dns, fns in sorted(os.walk(os.path.join(root, pkg))):
                dns.sort()
                for fn in sorted(fns):
                    if fn.endswith((".py", ".proto")):
                        full = os.path.join(dp, fn)
                        h.update(os.path.relpath(full, root).encode())
                        with open(full, "rb") as f:
                            h.update(f.read())
        _SOURCE_HASH = h.hexdigest()[:16]
    return _SOURCE_HASH


def compile_target(t: Target) -> Target:
    """The target a point compiles for: its array and the timing the cycle model reads (model-only fields at their
    defaults, so points that differ only in clock, cores or board DDR share one compiled program)."""
    d = Timing()
    return t.with_timing(**{k: getattr(d, k) for k in MODEL_ONLY_TIMING})


def compile_key(model_hash: str, t: Target, options: dict) -> str:
    ct = compile_target(t)
    arch = {f.name: getattr(ct, f.name) for f in dataclasses.fields(ct) if f.name not in ("timing", "name")}
    blob = json.dumps({"model": model_hash, "arch": arch, "timing": ct.timing.to_dict(), "options": options,
                       "compiler": compiler_version()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opendpu", "sweep")


@dataclass
class CompiledModel:
    """A compiled (model, configuration): the timing summaries of its DPU subgraphs and what the CPU runs."""

    summaries: list                   # runtime.profile.ProgramSummary, in graph order
    cpu_ops: list[tuple[str, str]]    # (op, reason) placed on the CPU
    onchip_lines: int                 # distinct bank lines the programs write (all subgraphs, the largest)
    compile_s: float


def _onchip_lines(arrays, t: Target) -> int:
    """Distinct bank lines written by a program (isa.footprint): how much of the banks it uses."""
    from opendpu.isa.footprint import program_footprints
    used = np.zeros((t.num_banks, t.bank_depth), bool)
    for fp in program_footprints(arrays, t):
        for ln in fp.writes.lines:
            for k in range(ln.blocks):
                s = (ln.start + k * ln.step) % t.bank_depth
                e = s + ln.width
                if ln.bank < t.num_banks:
                    used[ln.bank, s:min(e, t.bank_depth)] = True
                    if e > t.bank_depth:
                        used[ln.bank, :e - t.bank_depth] = True
    return int(used.sum())


def compile_point(graph_bytes_or_path, t: Target, options: dict) -> CompiledModel:
    """Compile a quantized (or compiled: recompiled) graph for `t` with the cycle model as the cost function."""
    from opendpu.compiler.frontend import detect_form
    from opendpu.compiler.pipeline import compile as compile_graph
    from opendpu.runtime.costmodel import cycle_model
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    from opendpu.runtime.profile import summarize_subgraph
    t0 = time.perf_counter()
    g = _graph(graph_bytes_or_path)
    res = compile_graph(g, t, recompile=detect_form(g) == "compiled", cycles=cycle_model, **options)
    out = res.graph
    sums, lines = [], 0
    for sg in dpu_subgraphs(out):
        d = DpuSubgraph(out, sg)
        sums.append(summarize_subgraph(d))
        lines = max(lines, _onchip_lines(d.arrays, t))
    cpu = [(str(c["name"]), " ".join(str(c["reason"]).split())) for c in res.meta["coverage"]["cpu_ops"]]
    return CompiledModel(sums, cpu, lines, time.perf_counter() - t0)


_GRAPHS: dict[str, Any] = {}


def _graph(src):
    """The quantized graph of a model source (a path, or serialized bytes from the Ray object store), memoised."""
    from opendpu.compiler.xir.graph import Graph
    key = src if isinstance(src, str) else hashlib.sha256(src).hexdigest()
    g = _GRAPHS.get(key)
    if g is None:
        g = Graph.load(src) if isinstance(src, str) else Graph.deserialize(src)
        _GRAPHS.clear()
        _GRAPHS[key] = g
    return g


_ARTIFACTS: dict[str, CompiledModel] = {}


def load_or_compile(key: str, cache_dir: str | None, src, t: Target, options: dict) -> tuple[CompiledModel, bool]:
    """The compiled model for `key` from the per-process memo, the cache directory, or a fresh compile (then
    stored atomically). Returns (compiled, was_cached)."""
    c = _ARTIFACTS.get(key)
    if c is not None:
        return c, True
    path = os.path.join(cache_dir, f"{key}.pkl") if cache_dir else None
    if path and os.path.isfile(path):
        try:
            with open(path, "rb") as f:
                c = pickle.load(f)
            if isinstance(c, CompiledModel):
                _remember(key, c)
                return c, True
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            pass                                   # a damaged or stale entry: compile again and overwrite it
    c = compile_point(src, compile_target(t), options)
    if path:
        _atomic_write(path, pickle.dumps(c, protocol=pickle.HIGHEST_PROTOCOL))
    _remember(key, c)
    return c, False


def _remember(key: str, c: CompiledModel) -> None:
    if len(_ARTIFACTS) >= 64:
        _ARTIFACTS.pop(next(iter(_ARTIFACTS)))
    _ARTIFACTS[key] = c


def _atomic_write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# ---- one point -------------------------------------------------------------------------------------------------
@dataclass
class Task:
    """One (model, point): everything a worker needs (picklable; `src` is a path or the graph's bytes)."""

    model: str
    model_hash: str
    point: dict
    hash: str
    target: Target | None
    key: str
    cache_dir: str | None
    options: dict
    reason: str = ""                   # a point that cannot be built: its reason (no work)


def base_row(task: Task) -> dict:
    t, p = task.target, task.point
    row: dict[str, Any] = dict.fromkeys(ROW_COLUMNS)
    row.update(model=task.model, point=point_id(p), hash=task.hash, status="failed", reason=task.reason,
               preset=p.get("preset", ""), board=p.get("board", ""),
               params=json.dumps(p, sort_keys=False), meets_constraints=True)
    if t is not None:
        row.update(target=t.name, pp=t.pp, cp=t.cp, alu_pp=t.alu_pp, bank_depth=t.bank_depth, img_bg=t.img_bg,
                   clock_mhz=t.timing.clock_mhz, cores=t.timing.cores, **resources(t))
    return row


def evaluate(task: Task, src) -> dict:
    """Compile (or take from the cache) and time one point; a failure is a row with status "failed" and its
    reason. Returns the point's full result: the row plus per-layer `layers`."""
    row = base_row(task)
    if task.target is None:
        return {**row, "layers": []}
    t0 = time.perf_counter()
    try:
        comp, cached = load_or_compile(task.key, task.cache_dir, src, task.target, task.options)
    except (OpenDpuError, ValueError, AssertionError, RecursionError, MemoryError) as e:
        first = " ".join(str(e).split())[:400]
        row.update(reason=f"compile: {type(e).__name__}: {first}", eval_s=time.perf_counter() - t0)
        return {**row, "layers": []}
    row.update(compile_cached=cached, compile_s=comp.compile_s, cpu_ops=len(comp.cpu_ops))
    if not comp.summaries:
        why = "; ".join(f"{o}: {r}" for o, r in comp.cpu_ops[:3])
        row.update(reason=f"no DPU subgraph: every op runs on the CPU ({why})", eval_s=time.perf_counter() - t0)
        return {**row, "layers": []}
    try:
        row_m, layers = measure(comp, task.target)
    except (OpenDpuError, ValueError) as e:
        row.update(reason=f"timing: {type(e).__name__}: {e}", eval_s=time.perf_counter() - t0)
        return {**row, "layers": []}
    row.update(row_m, status="ok", reason="", eval_s=time.perf_counter() - t0)
    return {**row, "layers": layers}


def measure(comp: CompiledModel, t: Target) -> tuple[dict, list[dict]]:
    """The metrics of a compiled model on target `t` (its timing): the timing-only cycle model per DPU subgraph,
    in graph order, one DPU run each; fps with cores, host overhead and DDR contention (sim/multicore.py)."""
    from opendpu.runtime.profile import Profile, profile_summary
    subs = [profile_summary(s, t) for s in comp.summaries]
    prof = Profile("", subs, t.timing.cores)
    thr = prof.throughput()
    cycles = prof.total_cycles
    ops = sum(s.workload for s in subs)
    ms = cycles / (t.timing.clock_mhz * 1e3)
    layers, by_engine = [], dict.fromkeys((e.name for e in Engine), 0)
    counts = dict.fromkeys((e.name for e in Engine), 0)
    for sp in subs:
        for ly, b in zip(sp.layers, sp.bounding_engines()):
            layers.append({"subgraph": sp.name, "name": ly.name, "cycles": ly.cycles, "ops": ly.workload,
                           "bound": b})
            if b is not None:
                by_engine[b] += ly.cycles
                counts[b] += 1
    rd = sum(s.ld_wb + s.ld_fm for s in subs)
    wr = sum(s.st_fm for s in subs)
    cap = t.num_banks * t.bank_depth
    row = {"cycles": cycles, "latency_ms": ms, "fps": thr.fps, "ddr_bound": bool(thr.ddr_bound), "ops": ops,
           "gops": ops / ms / 1e6 if ms else 0.0,
           "mac_util": ops / (cycles * t.peak_ops_per_cycle) if cycles else 0.0,
           "ddr_read_bytes": rd, "ddr_write_bytes": wr, "ddr_mbps": (rd + wr) * thr.fps / 1e6,
           "onchip_bytes": comp.onchip_lines * t.bank_width, "onchip_pct": 100.0 * comp.onchip_lines / cap,
           "bottleneck": max(by_engine, key=lambda k: by_engine[k]) if cycles else None,
           "layers_conv": counts["CONV"], "layers_misc": counts["MISC"], "layers_load": counts["LOAD"],
           "layers_save": counts["SAVE"], "instructions": sum(len(s.arrays.op) for s in comp.summaries),
           "dpu_subgraphs": len(subs)}
    return row, layers


def run_task(task: Task, src) -> dict:
    """Worker entry point (pool and Ray alike): evaluate, never raise (an unexpected error is the point's
    reason, with the traceback's last line)."""
    try:
        return evaluate(task, src)
    except Exception as e:                           # noqa: BLE001 - one point's bug must not stop the sweep
        tb = traceback.format_exc().strip().splitlines()
        row = base_row(task)
        row.update(reason=f"internal error: {type(e).__name__}: {e} ({tb[-3].strip() if len(tb) > 2 else ''})")
        return {**row, "layers": []}


# ---- models ----------------------------------------------------------------------------------------------------
@dataclass
class PreparedModel:
    label: str
    hash: str                     # content hash of the quantized (or compiled) graph
    path: str                     # its serialized graph on disk


def prepare_model(m: ModelSpec, cache_dir: str, seed: int = 0, log: Callable[[str], None] | None = None
                  ) -> PreparedModel:
    """The model's graph to compile: an xmodel as given, an ONNX model (zoo or file) quantized once and cached by
    the hash of the ONNX bytes, the calibration data and the quantizer's sources."""
    from opendpu.compiler.xir.graph import Graph
    if m.source.endswith(".xmodel"):
        try:
            g = Graph.load(m.source)
            from opendpu.compiler.frontend import detect_form
            detect_form(g, m.source)
        except (OpenDpuError, ValueError, OSError) as e:
            raise SweepError(f"model {m.source}: {e}") from None
        with open(m.source, "rb") as f:
            h = hashlib.sha256(f.read()).hexdigest()[:16]
        return PreparedModel(m.label, h, os.path.abspath(m.source))
    import onnx

    from opendpu.quant import zoo
    from opendpu.quant.quantize import QuantConfig, calib_arrays, quantize
    try:
        if m.source == "zoo:digits":
            model = onnx.load(zoo.DIGITS_ONNX)
        elif m.source.startswith("zoo:"):
            model = zoo.build(m.source[4:], tuple(m.size) if isinstance(m.size, list) else m.size)
        else:
            from opendpu.quant.onnx_in import load_onnx
            model = load_onnx(m.source)          # the quantizer's loader and messages (validate_model ran it first)
    except (OpenDpuError, ValueError, OSError, onnx.onnx_cpp2py_export.checker.ValidationError) as e:
        raise SweepError(f"model {m.source}: {e}") from None
    shape = _input_shape(model, m)
    if m.source == "zoo:digits":
        calib = zoo.digits_data()[0][:40]
    elif m.calib:
        try:
            calib = calib_arrays(m.calib, shape, limit=16)
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"model {m.label}: {e}") from None
    else:
        calib = np.random.default_rng(seed).normal(0, 1, (4, *shape[1:])).astype(np.float32)
    h = hashlib.sha256(model.SerializeToString(deterministic=True))
    h.update(calib.tobytes())
    h.update(_quant_version().encode())
    key = h.hexdigest()[:16]
    path = os.path.join(cache_dir, f"quant-{key}.xmodel")
    if not os.path.isfile(path):
        if log:
            log(f"quantizing {m.label} ({len(calib)} calibration samples)")
        try:
            res = quantize(model, calib, config=QuantConfig(method="maxmin"))
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"model {m.label}: quantization failed: {e}") from None
        _atomic_write(path, res.xmodel().serialize())
    with open(path, "rb") as f:
        mh = hashlib.sha256(f.read()).hexdigest()[:16]
    return PreparedModel(m.label, mh, path)


def _input_shape(model, m: ModelSpec) -> list[int]:
    ins = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(ins) != 1:
        raise SweepError(f"model {m.label}: {len(ins)} graph inputs; a sweep takes single-input models")
    dims = [d.dim_value if d.HasField("dim_value") else 0 for d in ins[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or min(dims[1:]) < 1:
        raise SweepError(f"model {m.label}: input shape {dims} is not a static [N, C, H, W]")
    return [1, *dims[1:]]


_QVER: str | None = None


def _quant_version() -> str:
    global _QVER
    if _QVER is None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        h = hashlib.sha256()
        for dp, dns, fns in sorted(os.walk(os.path.join(root, "quant"))):
            dns.sort()
            for fn in sorted(fns):
                if fn.endswith(".py"):
                    with open(os.path.join(dp, fn), "rb") as f:
                        h.update(f.read())
        _QVER = h.hexdigest()[:16]
    return _QVER


# ---- the sweep -------------------------------------------------------------------------------------------------
PRE_CONSTRAINT_NAMES = RESOURCE_METRICS + ("pp", "cp", "alu_pp", "bank_depth", "img_bg", "clock_mhz", "cores")


def pre_constraints(spec: SweepSpec) -> list[Constraint]:
    """The constraints decided by a point's parameters alone (resources, array, clock, cores): they drop points
    before any compile. The others (fps, latency_ms, ...) need the compiled program."""
    return [c for c in spec.constraints if c.name in PRE_CONSTRAINT_NAMES]


def _point_values(t: Target) -> dict:
    return {"pp": t.pp, "cp": t.cp, "alu_pp": t.alu_pp, "bank_depth": t.bank_depth, "img_bg": t.img_bg,
            "clock_mhz": t.timing.clock_mhz, "cores": t.timing.cores, **resources(t)}


def build_points(spec: SweepSpec) -> list[tuple[dict, Target | None, str]]:
    """Every point of the spec with its target (or None and why not), checked before any work: at least one point
    is a valid configuration, and the constraints on resources and array parameters keep at least one."""
    points = expand(spec)
    built: list[tuple[dict, Target | None, str]] = []
    for p in points:
        try:
            built.append((p, build_target(p), ""))
        except (OpenDpuError, ValueError) as e:
            built.append((p, None, f"configuration: {e}"))
    if all(t is None for _, t, _ in built):
        raise SweepError(f"no point of the space is a valid configuration ({len(points)} points); the first: "
                         f"{point_id(built[0][0])}: {built[0][2]}")
    pre = pre_constraints(spec)
    if pre:
        vals = [_point_values(t) for _, t, _ in built if t is not None]
        if not any(all(c.ok(v[c.name]) for c in pre) for v in vals):
            parts = []
            for c in pre:
                xs = [v[c.name] for v in vals]
                parts.append(f"{c} excludes {sum(not c.ok(x) for x in xs)} of {len(xs)} ({c.name} in the space: "
                             f"{min(xs):g}..{max(xs):g})")
            raise SweepError("the constraints exclude every point, before any compile: " + "; ".join(parts))
    return built


def plan(spec: SweepSpec, models: list[PreparedModel], cache_dir: str | None,
         built: list[tuple[dict, Target | None, str]] | None = None) -> tuple[list[Task], list[dict]]:
    """The tasks of a sweep (model x point), and the points excluded by a resource constraint (rows, not run).
    A point whose target cannot be built is a task with its reason (a failed row). `built`: build_points(spec),
    when the caller has it already."""
    if built is None:
        built = build_points(spec)
    pre = pre_constraints(spec)
    tasks, excluded = [], []
    for m in models:
        for p, t, why in built:
            h = hashlib.sha256(json.dumps([RESULT_VERSION, m.hash, point_id(p), spec.options, compiler_version()],
                                          sort_keys=True).encode()).hexdigest()[:16]
            task = Task(m.label, m.hash, p, h, t, compile_key(m.hash, t, spec.options) if t else "", cache_dir,
                        spec.options, why)
            if t is not None and pre:
                row = base_row(task)
                bad = [c for c in pre if not c.ok(row[c.name])]
                if bad:
                    row.update(status="excluded", reason="constraint " + ", ".join(
                        f"{c} ({c.name} = {row[c.name]:g})" for c in bad), meets_constraints=False)
                    excluded.append(row)
                    continue
            tasks.append(task)
    return tasks, excluded


class Store:
    """A sweep directory: one JSON result per point hash (points/), the per-point log (sweep.log, JSON lines), the
    spec that made it; results are written atomically, so an interrupted sweep keeps every finished point."""

    def __init__(self, root: str):
        self.root = root
        self.points = os.path.join(root, "points")

    def check(self) -> None:
        """Refuse a path that is a file or a directory with other contents than a sweep's."""
        if os.path.exists(self.root):
            if not os.path.isdir(self.root):
                raise SweepError(f"sweep directory {self.root} is a file")
            if os.listdir(self.root) and not os.path.isfile(os.path.join(self.root, MARKER)):
                raise SweepError(f"sweep directory {self.root} exists and is not a sweep's (no {MARKER}); choose "
                                 f"a new or empty directory, nothing was written")

    def open(self, spec_text: str) -> None:
        self.check()
        os.makedirs(self.points, exist_ok=True)
        mk = os.path.join(self.root, MARKER)
        if not os.path.isfile(mk):
            _atomic_write(mk, json.dumps({"opendpu_sweep": RESULT_VERSION}).encode())
        with open(os.path.join(self.root, "sweep.spec.json"), "w") as f:
            f.write(spec_text)

    def path(self, h: str) -> str:
        return os.path.join(self.points, f"{h}.json")

    def get(self, h: str) -> dict | None:
        try:
            with open(self.path(h)) as f:
                r = json.load(f)
            return r if isinstance(r, dict) and r.get("hash") == h else None
        except (OSError, ValueError):
            return None

    def put(self, result: dict) -> None:
        _atomic_write(self.path(result["hash"]), json.dumps(result, default=_json_default).encode())

    def log(self, entry: dict) -> None:
        with open(os.path.join(self.root, "sweep.log"), "a") as f:
            f.write(json.dumps(entry, default=_json_default) + "\n")


def _json_default(v):
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")


@dataclass
class SweepResult:
    rows: list[dict]
    results: dict[str, dict]           # hash -> full result
    computed: int                      # points evaluated in this run
    reused: int                        # points taken from the directory (an earlier run)
    excluded: int


def run(spec: SweepSpec, models: list[PreparedModel], store: Store, cache_dir: str | None,
        executor: str = "local", workers: int | None = None, address: str | None = None,
        progress: Callable[[int, int, str], None] | None = None, retries: int = 2,
        on_result: Callable[[dict], None] | None = None) -> SweepResult:
    """Evaluate every task not already in `store`; rows in task order (excluded points last)."""
    tasks, excluded = plan(spec, models, cache_dir)
    done: dict[str, dict] = {}
    for t in tasks:
        r = store.get(t.hash)
        if r is not None:
            done[t.hash] = r
    todo = [t for t in tasks if t.hash not in done]
    reused = len(done)
    srcs = {m.hash: m.path for m in models}
    total = len(tasks)
    k = [reused]

    def finished(task: Task, res: dict, seconds: float) -> None:
        store.put(res)
        store.log({"time": time.time(), "model": task.model, "point": point_id(task.point), "hash": task.hash,
                   "status": res["status"], "reason": res["reason"], "compile_cached": res.get("compile_cached"),
                   "seconds": round(seconds, 3)})
        done[task.hash] = res
        k[0] += 1
        if progress is not None:
            progress(k[0], total, f"{task.model} {point_id(task.point)}")
        if on_result is not None:
            on_result(res)

    if progress is not None:
        progress(reused, total, "resumed" if reused else "start")
    # points sharing a compiled program run after the first one that compiles it (no duplicate compiles)
    order = sorted(range(len(todo)), key=lambda i: (todo[i].key, i))
    todo = [todo[i] for i in order]
    if executor == "local":
        _run_local(todo, srcs, finished, workers, retries)
    elif executor == "ray":
        _run_ray(todo, srcs, finished, address, retries)
    else:
        raise SweepError(f"executor {executor!r}; choose local or ray")
    rows = []
    for t in tasks:
        r = done[t.hash]
        rows.append({c: r.get(c) for c in ROW_COLUMNS})
    post = [c for c in spec.constraints]
    for r in rows:
        if r["status"] == "ok":
            r["meets_constraints"] = all(c.ok(r[c.name]) for c in post)
    rows += excluded
    return SweepResult(rows, dict(done), len(todo), reused, len(excluded))


def _first_wave(todo: list[Task]) -> tuple[list[Task], list[Task]]:
    """The first task of each compile key (they compile), and the rest (they reuse a compiled program)."""
    seen, first, rest = set(), [], []
    for t in todo:
        (rest if t.key in seen else first).append(t)
        seen.add(t.key)
    return first, rest


def _run_local(todo: list[Task], srcs: dict, finished, workers: int | None, retries: int) -> None:
    """A local pool of worker processes, one pipe each (no shared queue: a worker killed mid-point cannot leave a
    lock held). A worker that dies is replaced and its point runs again, at most `retries` more times, after
    which the point is a failed row. Ctrl-C kills the workers; every finished point is already stored."""
    workers = workers or max(1, min(os.cpu_count() or 1, 8))
    if workers == 1:
        for t in todo:
            t0 = time.perf_counter()
            finished(t, run_task(t, srcs.get(t.model_hash)), time.perf_counter() - t0)
        return
    pool = _Pool(workers)
    try:
        for wave in _first_wave(todo):
            pool.run(wave, srcs, finished, retries)
    finally:
        pool.close()


def _worker(conn) -> None:
    """A pool worker: (task, src) in, the point's result out, until None or the pipe closes."""
    _ignore_sigint()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task, src = msg
        conn.send(run_task(task, src))


class _Pool:
    def __init__(self, n: int):
        import multiprocessing as mp
        self.ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        self.n = n
        self.idle: list = []                       # (conn, process)
        self.busy: dict = {}                       # conn -> (process, task, t0)
        self.tries: dict[str, int] = {}

    def _spawn(self) -> None:
        a, b = self.ctx.Pipe()
        p = self.ctx.Process(target=_worker, args=(b,), daemon=True)
        p.start()
        b.close()
        self.idle.append((a, p))

    def run(self, tasks: list[Task], srcs: dict, finished, retries: int) -> None:
        from multiprocessing.connection import wait
        queue = list(reversed(tasks))
        while queue or self.busy:
            while queue and (self.idle or len(self.busy) < self.n):
                if not self.idle:
                    self._spawn()
                conn, p = self.idle.pop()
                t = queue.pop()
                try:
                    conn.send((t, srcs.get(t.model_hash)))
                except (BrokenPipeError, OSError):        # died while idle: replace it, keep the point
                    queue.append(t)
                    p.kill()
                    continue
                self.busy[conn] = (p, t, time.perf_counter())
            by_sentinel = {p.sentinel: c for c, (p, _, _) in self.busy.items()}
            for r in wait(list(self.busy) + list(by_sentinel)):
                conn = by_sentinel.get(r, r)
                if conn not in self.busy:
                    continue
                p, t, t0 = self.busy[conn]
                try:
                    res = conn.recv() if conn.poll() else None
                except (EOFError, OSError):
                    res = None
                if res is not None:
                    del self.busy[conn]
                    self.idle.append((conn, p))
                    finished(t, res, time.perf_counter() - t0)
                    continue
                if p.is_alive():                          # woken by the pipe without a full message yet
                    continue
                del self.busy[conn]                       # the worker died on this point
                conn.close()
                self.tries[t.hash] = self.tries.get(t.hash, 0) + 1
                if self.tries[t.hash] > retries:
                    row = base_row(t)
                    row.update(reason=f"worker died {self.tries[t.hash]} times on this point (exit code "
                                      f"{p.exitcode})")
                    finished(t, {**row, "layers": []}, time.perf_counter() - t0)
                else:
                    queue.append(t)

    def close(self) -> None:
        procs = [p for _, p in self.idle] + [p for p, _, _ in self.busy.values()]
        for c, _ in self.idle:
            try:
                c.send(None)
            except OSError:
                pass
        for p, _, _ in self.busy.values():          # interrupted mid-point: nothing to wait for
            p.kill()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which cancels the sweep (finished points stay stored)."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_ray(todo: list[Task], srcs: dict, finished, address: str | None, retries: int) -> None:
    """Ray tasks: the graphs go to the object store once; a task whose worker dies is retried by Ray
    (max_retries), and a point that still fails is a failed row."""
    try:
        import ray
    except ImportError:
        raise SweepError("--executor ray needs the ray package (pip install ray==2.60.0)") from None
    started_here = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise SweepError(f"--executor ray: cannot connect to {address or 'a new local instance'}: {e}") \
                from None
        started_here = True
    try:
        remote = ray.remote(max_retries=retries, retry_exceptions=False)(run_task)
        refs = {h: ray.put(_read(p)) for h, p in srcs.items()}
        for wave in _first_wave(todo):
            futs = {remote.remote(t, refs[t.model_hash]): (t, time.perf_counter()) for t in wave}
            waiting = list(futs)
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=1)
                for r in ready:
                    t, t0 = futs[r]
                    try:
                        res = ray.get(r)
                    except ray.exceptions.RayError as e:
                        row = base_row(t)
                        row.update(reason=f"ray: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                        res = {**row, "layers": []}
                    finished(t, res, time.perf_counter() - t0)
    finally:
        if started_here:
            ray.shutdown()


__all__ = ["ARCH_PARAMS", "TIMING_PARAMS", "PARAMS", "ROW_COLUMNS", "NUMERIC_METRICS", "SweepError", "SweepSpec",
           "ModelSpec", "Space", "Constraint", "Task", "Store", "SweepResult", "load_spec", "spec_from_dict",
           "parse_model", "validate_model", "parse_constraint", "space_from_dict", "expand", "point_id", "build_target",
           "build_points", "pre_constraints", "resources",
           "compile_key", "compiler_version", "prepare_model", "plan", "run", "evaluate", "measure",
           "default_cache_dir", "BOARDS"]
