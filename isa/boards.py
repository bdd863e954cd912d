"""Board profiles: the DPU configuration of a board's reference design (arch, cores, clock) and its DDR.

`--board NAME` sets `Target.timing` clock_mhz, cores, board_ddr_mbps, ddr_efficiency_pct, frame_overhead_us, the host
side (host_frame_us, host_us_per_mb, cpu_threads, cpu_mhz, host_load_pct), and the DPU timing calibrated on silicon:
ddr_latency and conv_latency (fitted) and weight_load_lines (the wide weight path); docs/calibration.md gives the
sources and the fits.
A board names the arch preset of its reference design, the default array; its timing applies to any array (a B3136
design on a KR260 is a real user's setup): `profile` and `run` give it to the program's own array, `sweep` to each
point's (docs/decisions.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from .target import Target, TargetError, get_target

# The board as a pipeline (sim/multicore.py), fitted on the Vitis AI 2.5 Model Zoo's single- and multi-thread fps
# of the training families (runtime/boardfit.py; docs/calibration.md, 2026-11-28): the share of the board's peak DDR
# bandwidth the cores' streams achieve together (controller, refresh, turnaround, interleaving), the time per DPU run
# in which a core does not compute (job submission, cache maintenance of the run's buffers, completion interrupt),
# and the CPU time of a frame with every thread busy in % of its single-thread host work and overheads.
DDR_EFFICIENCY_PCT = 52
FRAME_OVERHEAD_US = 170
HOST_LOAD_PCT = 180
# The DPU's own timing on silicon. UG1414's vaitrace ResNet-50 table (Figure 37) profiles an older core, named
# DPU020X8G in its rows, one job per layer: fitted there (docs/calibration.md, the grid of benchmarks/
# bench_calibration.py), DDR read latency 30 cycles and a CONV pipeline fill and drain of 128, with weight LOADs of two
# CONVW lines per cycle (its stage-5 rows need more than one). The boards' profiles are the Vitis AI 2.5 reference
# designs: the same DDR latency and wide weight path, and the CONV fill and drain fitted on the 2.5 Model Zoo's fps
# (runtime/boardfit.py, table 4 of the benchmark: one-core periods of the KV260 isolate the DPU). Single-core rules the
# RTL implements from the Target.
UG1414_DPU_TIMING = {"ddr_latency": 30, "conv_latency": 128, "weight_load_lines": 2}
DPU_TIMING = {"ddr_latency": 30, "conv_latency": 16, "weight_load_lines": 2}
# The host side (sim/multicore.py): work per frame on one Cortex-A53 thread, fixed and per 10^6 bytes of the graph's
# input and output tensors, at 1,200 MHz, fitted on the one-core board's single- minus multi-thread period (the
# host work in series), on the boards' four A53 cores.
HOST_FRAME_US = 178
HOST_US_PER_MB = 2393
CPU_THREADS = 4


@dataclass(frozen=True)
class Board:
    name: str
    arch: str               # preset of the reference design's DPU
    cores: int
    clock_mhz: float
    ddr_mbps: int           # peak bandwidth of the PS DDR the cores share (bus width x transfer rate)
    source: str
    cpu_mhz: int = 1200     # the Cortex-A53 cores' clock

    def timing(self) -> dict:
        """The Target.timing fields the board sets: its clock, cores and DDR, the host overhead, and the DPU timing
        calibrated on silicon (DPU_TIMING)."""
        return {"clock_mhz": self.clock_mhz, "cores": self.cores, "board_ddr_mbps": self.ddr_mbps,
                "ddr_efficiency_pct": DDR_EFFICIENCY_PCT, "frame_overhead_us": FRAME_OVERHEAD_US,
                "host_frame_us": HOST_FRAME_US, "host_us_per_mb": HOST_US_PER_MB, "cpu_threads": CPU_THREADS,
                "cpu_mhz": self.cpu_mhz, "host_load_pct": HOST_LOAD_PCT, **DPU_TIMING}

    def ships(self, t: Target) -> bool:
        """Is `t` the array of the board's reference design (same PP, ICP/OCP, ALU parallelism; other options of
        that size, e.g. an AMD arch.json's feature bits, are the same DPU configured so)?"""
        a = get_target(self.arch)
        return (t.pp, t.cp, t.alu_pp) == (a.pp, a.cp, a.alu_pp)

    def applied_to(self, targets) -> str:
        """One line saying that the board's timing is applied to the program's array(s) `targets`, and whether that
        array is the one the board ships."""
        names = list(dict.fromkeys(t.name for t in targets))
        what = f"{', '.join(names)} array{'s' if len(names) > 1 else ''}"
        own = all(self.ships(t) for t in targets)
        return (f"board {self.name}: timing of the board applied to the program's {what}"
                + (", the board's own" if own else f" (the board ships {self.arch})"))

    def target(self, base: Target | str | None = None) -> Target:
        """`base` (default: the board's arch preset), of any array, with the board's timing."""
        t = get_target(base if base is not None else self.arch)
        return t.with_timing(**self.timing())


BOARDS: dict[str, Board] = {b.name: b for b in (
    Board("zcu102", "DPUCZDX8G_ISA1_B4096", 3, 281.0, 19200,
          "PG338/UG1354 reference design 3 x B4096 at 281 MHz; PS DDR4 64-bit at 2400 MT/s, the PS "
          "controller's maximum (DS925); A53 at 1,200 MHz"),
    Board("zcu104", "DPUCZDX8G_ISA1_B4096", 2, 300.0, 19200,
          "UG1354 reference design 2 x B4096 at 300 MHz; PS DDR4 64-bit at 2400 MT/s (DS925); A53 at 1,200 MHz"),
    Board("kv260", "DPUCZDX8G_ISA1_B4096", 1, 300.0, 19200,
          "Vitis AI KV260 DPU design 1 x B4096 at 300 MHz; K26 SOM DDR4 64-bit at 2400 MT/s (DS987, DS925); "
          "A53 at 1,333 MHz (the -2LV part's maximum, DS925)", cpu_mhz=1333),
    Board("kr260", "DPUCZDX8G_ISA1_B4096", 1, 300.0, 19200,
          "same K26 SOM and DPU design as the KV260 (DS987)", cpu_mhz=1333),
)}


def get_board(name: str) -> Board:
    b = BOARDS.get(str(name).lower())
    if b is None:
        raise TargetError(f"unknown board {name!r}; known: {', '.join(BOARDS)}")
    return b
