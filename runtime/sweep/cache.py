"""The sweep's two caches, keyed by content: quantized models (`prepare_model`) and compiled programs
(`load_or_compile`, keyed by `compile_key`). Both keys include a hash of the sources the entry depends on
(`source_hash`), so an edit of the quantizer or of the compiler never serves a stale entry.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import pickle
from dataclasses import dataclass
from typing import Callable

import numpy as np

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import Target, Timing

from .spec import ModelSpec, SweepError, input_shape

# Timing fields the cycle model does not read (milliseconds, the multi-core and host model, the watchdog): a point
# that changes only these reuses the compiled program of its configuration.
MODEL_ONLY_TIMING = ("clock_mhz", "dsp_clock_mult", "cores", "board_ddr_mbps", "ddr_efficiency_pct",
                     "frame_overhead_us", "host_frame_us", "host_us_per_mb", "cpu_threads", "cpu_mhz",
                     "host_load_pct",
                     "watchdog_cycles")


# ---- source hashes ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def source_hash(packages: tuple[str, ...], suffixes: tuple[str, ...] = (".py",)) -> str:
    """16 hex digits of sha256 over the source files of the opendpu `packages` (e.g. ("compiler", "isa")) whose
    names end in `suffixes`: each file's path relative to the source root, then its bytes, in sorted order. Any
    edit there changes it: the caches put it in their keys. Computed once per process."""
    h = hashlib.sha256()
    for pkg in packages:
        spec = importlib.util.find_spec(f"opendpu.{pkg}")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"opendpu.{pkg}: no such package")
        top = os.path.abspath(list(spec.submodule_search_locations)[0])
        root = os.path.dirname(top)
        for dp, dns, fns in sorted(os.walk(top)):
            dns.sort()
            for fn in sorted(fns):
                if fn.endswith(suffixes):
                    full = os.path.join(dp, fn)
                    h.update(os.path.relpath(full, root).encode())
                    with open(full, "rb") as f:
                        h.update(f.read())
    return h.hexdigest()[:16]


def compiler_version() -> str:
    """The sources a compiled program depends on: the compiler, the ISA and the cycle model it decides by."""
    return source_hash(("compiler", "isa", "sim"), (".py", ".proto"))


def quant_version() -> str:
    """The sources a quantized model depends on: the quantizer."""
    return source_hash(("quant",))


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opendpu", "sweep")


def atomic_write(path: str, data: bytes) -> None:
    """Write through a temporary sibling, then rename: a reader never sees a partial file (caches, the store)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# ---- compiled programs -----------------------------------------------------------------------------------------
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


@dataclass
class CompiledModel:
    """A compiled (model, configuration): the timing summaries of its DPU subgraphs and what the CPU runs."""

    summaries: list                   # runtime.profile.ProgramSummary, in graph order
    cpu_ops: list[tuple[str, str]]    # (op, reason) placed on the CPU
    onchip_lines: int                 # distinct bank lines the programs write (all subgraphs, the largest)
    compile_s: float
    io_bytes: int = 0                 # the graph's input and output tensors (runtime.profile.host_io_bytes)


_ARTIFACTS: dict[str, CompiledModel] = {}


def load_or_compile(key: str, cache_dir: str | None, build: Callable[[], CompiledModel]
                    ) -> tuple[CompiledModel, bool]:
    """The compiled model for `key` from the per-process memo, the cache directory, or `build()` (then stored
    atomically). Returns (compiled, was_cached)."""
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
    c = build()
    if path:
        atomic_write(path, pickle.dumps(c, protocol=pickle.HIGHEST_PROTOCOL))
    _remember(key, c)
    return c, False


def _remember(key: str, c: CompiledModel) -> None:
    if len(_ARTIFACTS) >= 64:
        _ARTIFACTS.pop(next(iter(_ARTIFACTS)))
    _ARTIFACTS[key] = c


# ---- quantized models ------------------------------------------------------------------------------------------
@dataclass
class PreparedModel:
    label: str
    hash: str                     # content hash of the quantized (or compiled) graph
    path: str                     # its serialized graph on disk


def prepare_model(m: ModelSpec, cache_dir: str, seed: int = 0, log: Callable[[str], None] | None = None
                  ) -> PreparedModel:
    """The model's graph to compile: an xmodel as given, an ONNX model (zoo or file) quantized once
    (runtime.flow.quantize_step) and cached by the hash of the ONNX bytes, the calibration data and the quantizer's
    sources."""
    if m.source.endswith(".xmodel"):
        return _given_xmodel(m)
    from opendpu.quant.quantize import QuantConfig
    from opendpu.runtime.flow import quantize_step
    model = _onnx_model(m)
    calib = _calibration(model, m, seed)
    h = hashlib.sha256(model.SerializeToString(deterministic=True))
    h.update(calib.tobytes())
    h.update(quant_version().encode())
    key = h.hexdigest()[:16]
    path = os.path.join(cache_dir, f"quant-{key}.xmodel")
    if not os.path.isfile(path):
        if log:
            log(f"quantizing {m.label} ({len(calib)} calibration samples)")
        try:
            res = quantize_step(model, calib, config=QuantConfig(method="maxmin"))
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"model {m.label}: quantization failed: {e}") from None
        atomic_write(path, res.xmodel().serialize())
    with open(path, "rb") as f:
        mh = hashlib.sha256(f.read()).hexdigest()[:16]
    return PreparedModel(m.label, mh, path)


def _given_xmodel(m: ModelSpec) -> PreparedModel:
    """A quantized or compiled xmodel, used as it is (after a check that it loads and has either form)."""
    from opendpu.compiler.frontend import detect_form
    from opendpu.compiler.xir.graph import Graph
    try:
        detect_form(Graph.load(m.source), m.source)
    except (OpenDpuError, ValueError, OSError) as e:
        raise SweepError(f"model {m.source}: {e}") from None
    with open(m.source, "rb") as f:
        h = hashlib.sha256(f.read()).hexdigest()[:16]
    return PreparedModel(m.label, h, os.path.abspath(m.source))


def _onnx_model(m: ModelSpec):
    """The ONNX model of a zoo name or a file (the quantizer's loader and messages; validate_model ran it first)."""
    import onnx

    from opendpu.quant import zoo
    try:
        if m.source == "zoo:digits":
            return onnx.load(zoo.DIGITS_ONNX)
        if m.source.startswith("zoo:"):
            return zoo.build(m.source[4:], tuple(m.size) if isinstance(m.size, list) else m.size)
        from opendpu.quant.onnx_in import load_onnx
        return load_onnx(m.source)
    except (OpenDpuError, ValueError, OSError, onnx.onnx_cpp2py_export.checker.ValidationError) as e:
        raise SweepError(f"model {m.source}: {e}") from None


def _calibration(model, m: ModelSpec, seed: int) -> np.ndarray:
    """The calibration samples: zoo:digits' own images, the model's calib data, else 4 random N(0,1) samples
    (cycles do not depend on values)."""
    from opendpu.quant import zoo
    from opendpu.quant.quantize import calib_arrays
    shape = input_shape(model, m)
    if m.source == "zoo:digits":
        return zoo.digits_data()[0][:40]
    if m.calib:
        try:
            return calib_arrays(m.calib, shape, limit=16)
        except (OpenDpuError, ValueError) as e:
            raise SweepError(f"model {m.label}: {e}") from None
    return np.random.default_rng(seed).normal(0, 1, (4, *shape[1:])).astype(np.float32)
