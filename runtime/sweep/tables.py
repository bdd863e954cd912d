"""Sweep rows as tables: the row helpers, Pareto fronts and the table files (CSV / JSON / Parquet).

The sweep engine (evaluate.py) gives one flat row per (DPU configuration x model) point, with the columns of
spec.ROW_COLUMNS; this module and figures.py / report.py only read those rows (and each point's full result with its
`layers`) and write files. Nothing of sim, hw or compiler.
"""
from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# Parquet type of every row column, so that a column that is None in every row still gets a stable type.
# bram36 is a float: BRAM18 halves make it a multiple of 0.5.
COLUMN_TYPES: dict[str, str] = {
    **{c: "string" for c in ("model", "point", "hash", "status", "reason", "target", "preset", "board", "params",
                             "bottleneck", "fps_bound")},
    **{c: "int64" for c in ("pp", "cp", "alu_pp", "bank_depth", "img_bg", "cores", "cycles", "ops",
                            "ddr_read_bytes", "ddr_write_bytes", "onchip_bytes", "layers_conv", "layers_misc",
                            "layers_load", "layers_save", "dsp", "lut", "ff", "instructions", "dpu_subgraphs",
                            "cpu_ops")},
    **{c: "float64" for c in ("clock_mhz", "latency_ms", "fps", "fps_single", "gops", "mac_util", "ddr_mbps",
                              "onchip_pct", "bram36", "compile_s", "eval_s")},
    **{c: "bool" for c in ("ddr_bound", "compile_cached", "meets_constraints")},
}


# ---------------------------------------------------------------------------------------------------------- helpers

def num(v: Any) -> float | None:
    """A finite float of v, or None (None, NaN, inf, non-numbers, bools)."""
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def is_ok(r: dict) -> bool:
    return r.get("status") == "ok"


def feasible(r: dict) -> bool:
    """An ok row that meets the constraints (a missing / None meets_constraints means no constraints)."""
    return is_ok(r) and r.get("meets_constraints") is not False


def models_of(rows: Iterable[dict]) -> list[str]:
    """Model labels in order of first appearance."""
    return list(dict.fromkeys(str(r.get("model", "")) for r in rows))


def params_of(r: dict) -> dict:
    """The swept parameters of a row (its `params` JSON string, or a dict); {} when absent or unreadable."""
    p = r.get("params")
    if isinstance(p, dict):
        return p
    if isinstance(p, str) and p:
        try:
            d = json.loads(p)
        except ValueError:
            return {}
        return d if isinstance(d, dict) else {}
    return {}


def swept_parameters(rows: Iterable[dict]) -> list[str]:
    """Names of the swept parameters (keys of the rows' `params`), in order of first appearance."""
    out: dict[str, None] = {}
    for r in rows:
        out.update(dict.fromkeys(params_of(r)))
    return list(out)


def param_value(r: dict, name: str) -> Any:
    p = params_of(r)
    return p[name] if name in p else r.get(name)


def sorted_values(vals: Iterable[Any]) -> list[Any]:
    """Distinct values, numerically sorted when all are numbers, else in natural order (B512 before B1024)."""
    distinct = list(dict.fromkeys(vals))
    if all(num(v) is not None for v in distinct):
        return sorted(distinct, key=float)
    return sorted(distinct, key=lambda v: [(0, int(x), "") if x.isdigit() else (1, 0, x)
                                           for x in re.split(r"(\d+)", str(v))])


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


# ---------------------------------------------------------------------------------------------------- Pareto front

def pareto_front(rows: Sequence[dict], x: str = "dsp", y: str = "fps", minimize_x: bool = True,
                 maximize_y: bool = True) -> list[dict]:
    """Pareto-optimal rows per model: the ok rows that meet the constraints, with finite x and y, that no other such
    row of the same model matches in both objectives and beats in one. Rows with identical (x, y) are one design:
    only the first by `point` (string order, then input order) stays on the front. Returns the fronts of all
    models (models in order of first appearance), each sorted by x ascending."""
    out: list[dict] = []
    for model in models_of(rows):
        cand = []
        for i, r in enumerate(rows):
            if str(r.get("model", "")) != model or not feasible(r):
                continue
            xv, yv = num(r.get(x)), num(r.get(y))
            if xv is None or yv is None:
                continue
            cx = xv if minimize_x else -xv              # costs: lower is better in both
            cy = -yv if maximize_y else yv
            cand.append((cx, cy, str(r.get("point", "")), i, xv, yv, r))
        cand.sort(key=lambda c: c[:4])
        best_cy = math.inf
        front = []
        for cx, cy, _, i, xv, yv, r in cand:
            # every earlier candidate has a lower cx, or the same cx and a cy no higher: r is dominated (or an
            # identical later duplicate) iff one of them has cy <= r's
            if cy < best_cy:
                front.append((xv, yv, r))
                best_cy = cy
        front.sort(key=lambda f: (f[0], f[1]))
        out.extend(r for _, _, r in front)
    return out


# ------------------------------------------------------------------------------------------------------ table files

def _cell_json(v: Any) -> Any:
    """v with NaN / inf (which JSON lacks) as None and numpy scalars as Python ones, through dicts and lists."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, np.generic):
        return _cell_json(v.item())
    if isinstance(v, dict):
        return {k: _cell_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_cell_json(x) for x in v]
    return v


def write_csv(rows: Sequence[dict], path: str, columns: Sequence[str]) -> None:
    """CSV with a header of `columns`; a missing or None cell is empty, dicts / lists are written as JSON."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            cells = []
            for c in columns:
                v = r.get(c)
                cells.append("" if v is None else json.dumps(v) if isinstance(v, (dict, list)) else v)
            w.writerow(cells)


def write_json(rows: Sequence[dict], path: str, columns: Sequence[str], extra: dict | None = None) -> None:
    """A JSON object {"columns": [...], "rows": [{column: value}], **extra}; missing cells and NaN / inf are null."""
    doc: dict[str, Any] = {"columns": list(columns),
                           "rows": [{c: _cell_json(r.get(c)) for c in columns} for r in rows]}
    doc.update(_cell_json(extra or {}))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")


def _infer_type(values: Sequence[Any]) -> str:
    """Parquet type of a column that COLUMN_TYPES does not know, from its non-None values (string if mixed / none)."""
    vals = [v for v in values if v is not None]
    if vals and all(isinstance(v, (bool, np.bool_)) for v in vals):
        return "bool"
    if vals and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in vals):
        return "int64"
    if vals and all(num(v) is not None or isinstance(v, (float, np.floating)) for v in vals):
        return "float64"
    return "string"


def _coerce(v: Any, kind: str, col: str) -> Any:
    """v as a Python value of the Parquet type kind (None stays None); ValueError when it does not fit."""
    if v is None:
        return None
    if isinstance(v, np.generic):
        v = v.item()
    if kind == "string":
        return v if isinstance(v, str) else json.dumps(v) if isinstance(v, (dict, list)) else str(v)
    if kind == "bool":
        if isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return bool(v)
    elif kind == "int64":
        if isinstance(v, int):
            return int(v)
        if isinstance(v, float):
            if not math.isfinite(v):
                return None
            if v.is_integer():
                return int(v)
    elif kind == "float64":
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    raise ValueError(f"column {col!r}: {v!r} is not a {kind} value")


def write_parquet(rows: Sequence[dict], path: str, columns: Sequence[str]) -> None:
    """Parquet with an explicit schema: the COLUMN_TYPES type of each column (inferred for unknown columns), so that
    an all-None column keeps its type; missing cells are null."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pa_types = {"string": pa.string(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_()}
    fields, arrays = [], []
    for c in columns:
        raw = [r.get(c) for r in rows]
        kind = COLUMN_TYPES.get(c) or _infer_type(raw)
        fields.append(pa.field(c, pa_types[kind], nullable=True))
        arrays.append(pa.array([_coerce(v, kind, c) for v in raw], type=pa_types[kind]))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    pq.write_table(table, path)
