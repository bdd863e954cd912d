"""Amaranth-simulator helpers for block-level tests: one call runs a testbench, optionally with waves.

Set OPENDPU_WAVES=1 (or pass waves=True) to write waveforms/<name>.vcd and a matching .gtkw save file
(open with `gtkwave waveforms/<name>.gtkw` or `surfer waveforms/<name>.vcd`).
"""
from __future__ import annotations

import os
from pathlib import Path

from amaranth.sim import Simulator

WAVE_DIR = Path(__file__).resolve().parent.parent / "waveforms"


def waves_requested() -> bool:
    return os.environ.get("OPENDPU_WAVES", "") not in ("", "0")


def run_sim(dut, testbench, name: str, traces=(), waves: bool | None = None, period: float = 1e-8):
    """Simulate `dut` (an Elaboratable) with the async `testbench(ctx)` on a clock in domain sync."""
    sim = Simulator(dut)
    sim.add_clock(period)
    sim.add_testbench(testbench)
    if waves if waves is not None else waves_requested():
        WAVE_DIR.mkdir(exist_ok=True)
        with sim.write_vcd(str(WAVE_DIR / f"{name}.vcd"), str(WAVE_DIR / f"{name}.gtkw"), traces=list(traces)):
            sim.run()
    else:
        sim.run()
