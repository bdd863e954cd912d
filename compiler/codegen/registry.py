"""The code generator's per-kind tables, filled by the modules that implement each kind (as the golden's
`compiler.ref.ops` registers per op type):

* `LEGALITY`: XIR type -> `check(graph, op, target) -> kind`, or CodegenError with the reason (`legality`);
* `LOWERINGS`: kind -> `lower(c, graph, op, ins, out) -> [job, ...]`, the layer jobs of one op (`conv`, `alu`,
  `elew`, `copy`); a lowering emits nothing;
* `EMITTERS`: job type -> `emit(c, job)`, its instructions (with the job's per-layer decisions);
* `FITS`: job type -> `fits(c, job)`, CodegenError when no tiling of the job fits the target (legality asks it
  instead of emitting).
"""
from __future__ import annotations

from typing import Any, Callable

LEGALITY: dict[str, Callable[..., str]] = {}
LOWERINGS: dict[str, Callable[..., list]] = {}
EMITTERS: dict[type, Callable[..., None]] = {}
FITS: dict[type, Callable[..., None]] = {}


def legal(*types: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    def reg(fn: Callable[..., str]) -> Callable[..., str]:
        for t in types:
            assert t not in LEGALITY, f"{t} registered twice"
            LEGALITY[t] = fn
        return fn
    return reg


def lowering(*kinds: str) -> Callable[[Callable[..., list]], Callable[..., list]]:
    def reg(fn: Callable[..., list]) -> Callable[..., list]:
        for k in kinds:
            assert k not in LOWERINGS, f"{k} registered twice"
            LOWERINGS[k] = fn
        return fn
    return reg


def emitter(job_type: type, fits: Callable[..., None]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def reg(fn: Callable[..., Any]) -> Callable[..., Any]:
        EMITTERS[job_type] = fn
        FITS[job_type] = fits
        return fn
    return reg
