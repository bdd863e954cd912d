"""`opendpu sweep`: DPU configuration sweeps (docs/sweeps.md) as a library and a verb.

The library: `spec` (parameters, models, spaces, constraints; `load_spec`), `points` (points, targets, resources),
`cache` (the quantized-model and compile caches, one `source_hash`), `evaluate` (one point), `executors` (local pool,
Ray), `store` (the sweep directory) and `driver` (plan, run). The outputs: `tables` (rows, Pareto fronts, CSV / JSON /
Parquet), `figures` and `report` (figures and summary, with matplotlib). The command line: `cli` (the verb's parser
and the choice of mode), `arch` (the architecture mode), `timing` (the timing-only mode of one compiled program) and
`rtl` (--verify-rtl).

The library's names are attributes of this package, imported on first use: the verb's parser, built for every
`opendpu` command, imports `sweep.cli` without paying for the rest.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "cache": ("CompiledModel", "PreparedModel", "compile_key", "compile_target", "compiler_version",
              "default_cache_dir", "prepare_model", "quant_version", "source_hash"),
    "evaluate": ("Task", "measure"),
    "points": ("build_points", "build_target", "expand", "point_id", "pre_constraints", "resources"),
    "driver": ("SweepResult", "plan", "run"),
    "spec": ("ARCH_PARAMS", "NUMERIC_METRICS", "PARAMS", "ROW_COLUMNS", "TIMING_PARAMS", "Constraint", "ModelSpec",
             "Space", "SweepError", "SweepSpec", "load_spec", "parse_constraint", "parse_model", "space_from_dict",
             "spec_from_dict", "validate_model"),
    "store": ("Store",),
}
_WHERE = {name: mod for mod, names in _EXPORTS.items() for name in names}
# the same names, as a literal (linters and `from opendpu.runtime.sweep import *`)
__all__ = ["ARCH_PARAMS", "CompiledModel", "Constraint", "ModelSpec", "NUMERIC_METRICS", "PARAMS", "PreparedModel",
           "ROW_COLUMNS", "Space", "Store", "SweepError", "SweepResult", "SweepSpec", "TIMING_PARAMS", "Task",
           "build_points", "build_target", "compile_key", "compile_target", "compiler_version", "default_cache_dir",
           "expand", "load_spec", "measure", "parse_constraint", "parse_model", "plan", "point_id",
           "pre_constraints", "prepare_model", "quant_version", "resources", "run", "source_hash", "space_from_dict",
           "spec_from_dict", "validate_model"]

if TYPE_CHECKING:
    from .cache import (CompiledModel, PreparedModel, compile_key, compile_target, compiler_version,
                        default_cache_dir, prepare_model, quant_version, source_hash)
    from .evaluate import Task, measure
    from .points import build_points, build_target, expand, point_id, pre_constraints, resources
    from .driver import SweepResult, plan, run
    from .spec import (ARCH_PARAMS, NUMERIC_METRICS, PARAMS, ROW_COLUMNS, TIMING_PARAMS, Constraint, ModelSpec,
                       Space, SweepError, SweepSpec, load_spec, parse_constraint, parse_model, space_from_dict,
                       spec_from_dict, validate_model)
    from .store import Store


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
