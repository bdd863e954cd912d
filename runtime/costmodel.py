"""The cycle model as the compiler's cost function (kept for callers of `cycle_model`).

`compiler.compile` decides by the one cycle model, `compiler.pipeline.timing_cycles` (sim.timing, bank-port
arbitration included), by default; `cycle_model` is that function.
"""
from __future__ import annotations

from opendpu.compiler.pipeline import timing_cycles as cycle_model

__all__ = ["cycle_model"]
