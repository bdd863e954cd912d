"""Throughput of N DPU cores sharing a board's DDR (docs/calibration.md). Model only: the RTL is one core.

Each core runs the same program on its own frames (VART's multi-threaded runners, PG338's fps). One core takes
T cycles per frame (`simulate`, its ports bound its own DDR traffic) plus the host's `frame_overhead_us` per DPU
run, and moves D bytes (reads + writes). The cores together cannot move more than the board's effective
bandwidth, BW = board_ddr_mbps x ddr_efficiency_pct, so

    fps = min(cores / (T / clock + runs x frame_overhead), BW / D)

the roofline of the shared DDR: the cores' DDR phases are taken to interleave perfectly until the bus saturates.
With board_ddr_mbps = 0 (no board) the cores do not contend.
"""
from __future__ import annotations

from dataclasses import dataclass

from opendpu.isa.target import Target


@dataclass(frozen=True)
class Throughput:
    cores: int
    clock_mhz: float
    cycles: int              # one frame on one core
    overhead_us: float       # host time per frame (runs x frame_overhead_us)
    ddr_bytes: int           # one frame: DDR reads + writes
    fps_compute: float       # cores / latency: no DDR contention
    fps_ddr: float           # effective board bandwidth / bytes per frame (inf without a board limit)

    @property
    def latency_ms(self) -> float:
        """One frame on one core: DPU time plus the host's overhead."""
        return self.cycles / (self.clock_mhz * 1e3) + self.overhead_us / 1e3

    @property
    def fps(self) -> float:
        return min(self.fps_compute, self.fps_ddr)

    @property
    def ddr_bound(self) -> bool:
        return self.fps_ddr < self.fps_compute

    @property
    def ddr_mbps(self) -> float:
        """DDR traffic of all cores at `fps` (MB/s, 1e6 bytes)."""
        return self.fps * self.ddr_bytes / 1e6

    def to_dict(self) -> dict:
        return {"cores": self.cores, "clock_mhz": self.clock_mhz, "cycles": self.cycles,
                "overhead_us": self.overhead_us, "latency_ms": self.latency_ms,
                "ddr_bytes": self.ddr_bytes, "fps_compute": self.fps_compute, "fps_ddr": self.fps_ddr,
                "fps": self.fps, "ddr_bound": self.ddr_bound, "ddr_mbps": self.ddr_mbps}


def throughput(cycles: int, ddr_bytes: int, target: Target, runs: int = 1) -> Throughput:
    """fps of `target.timing.cores` cores, each taking `cycles` DPU cycles in `runs` DPU runs (one per DPU
    subgraph) and moving `ddr_bytes` per frame."""
    tm = target.timing
    over = runs * tm.frame_overhead_us
    sec = cycles / (tm.clock_mhz * 1e6) + over / 1e6
    fps_c = tm.cores / sec if sec > 0 else 0.0
    bw = tm.board_ddr_mbps * 1e6 * tm.ddr_efficiency_pct / 100.0
    fps_d = bw / ddr_bytes if (tm.board_ddr_mbps and ddr_bytes) else float("inf")
    return Throughput(tm.cores, tm.clock_mhz, int(cycles), float(over), int(ddr_bytes), fps_c, fps_d)
