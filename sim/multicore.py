"""A board as a pipeline: host threads, DPU cores and the DDR they share (issue 33, docs/calibration.md). Model only:
the RTL is one core.

Per frame the board does two kinds of work:

* **host work** on the CPU (pre-processing of the input, VART bookkeeping, post-processing of the outputs):
  `host_frame_us` plus `host_us_per_mb` per 10^6 bytes of the graph's input and output tensors, at the reference
  CPU clock HOST_REF_MHZ (scaled by the board's `cpu_mhz`); one frame's host work runs on one thread, and
  `cpu_threads` threads run frames in parallel;
* **DPU work** on one of `cores` cores: each DPU run (one per DPU subgraph) takes its cycles from the cycle model
  plus `frame_overhead_us` in which the core is not computing (job submission, cache maintenance of the run's
  buffers, the completion interrupt).

*Single-thread* fps (one frame at a time, as Vitis AI's single-thread test) is 1 / (host + DPU), the two in series.
*Multi-thread* fps is the pipeline's bottleneck: min(cpu_threads / CPU time per frame, the cores' throughput). The
CPU time per frame is the host work plus the runs' overheads (the CPU side of submission and cache maintenance),
times `host_load_pct` / 100 (with every thread busy the A53s share their L2 and the DDR). The cores' throughput
comes from a **fluid simulation of the shared DDR** (`shared_ddr_fps`): each core runs the same frame
over and over, offset from the others by 1/cores of a frame; each frame is the one-core DDR demand trace of the
cycle model (bytes per time bin, `demand_trace`); in a bin where the cores together ask for more than the board's
effective bandwidth (board_ddr_mbps x ddr_efficiency_pct), the bandwidth is shared max-min fairly and each core
slows down in proportion. Cores in compute phases run at full speed. This is the per-cycle shared-DDR simulation
coarsened to bins (a frame is TRACE_BINS bins); a roofline (perfect interleaving until the bus saturates) is its limit
for a flat trace, and is optimistic for bursty ones (weight loads of several cores colliding).

With board_ddr_mbps = 0 (no board) the cores do not contend and the host costs nothing unless set.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opendpu.isa.target import Target

HOST_REF_MHZ = 1200.0        # the host costs are given at this CPU clock (the ZCU102 / ZCU104 Cortex-A53)
TRACE_BINS = 128             # bins of one frame's DDR demand trace


@dataclass(frozen=True)
class Throughput:
    cores: int
    clock_mhz: float
    cycles: int              # one frame on one core
    overhead_us: float       # DPU-side overhead per frame (runs x frame_overhead_us)
    ddr_bytes: int           # one frame: DDR reads + writes
    fps_compute: float       # cores / (DPU time + overhead): no DDR contention
    fps_ddr: float           # the cores' throughput with the shared DDR (the fluid simulation; inf without a board)
    host_us: float = 0.0     # host work per frame on one thread (at the board's CPU clock)
    fps_host: float = float("inf")   # cpu_threads / CPU time per frame under load
    io_bytes: int = 0        # the graph's input and output tensors, the bytes the host work grows with

    @property
    def dpu_ms(self) -> float:
        """One frame's DPU runs on one core, with their overheads, without contention."""
        return self.cycles / (self.clock_mhz * 1e3) + self.overhead_us / 1e3

    @property
    def latency_ms(self) -> float:
        """One frame alone: host work and DPU runs in series."""
        return self.dpu_ms + self.host_us / 1e3

    @property
    def fps_single(self) -> float:
        """Single-thread fps: one frame at a time."""
        return 1e3 / self.latency_ms if self.latency_ms > 0 else 0.0

    @property
    def fps(self) -> float:
        """Multi-thread fps: the pipeline's bottleneck."""
        return min(self.fps_compute, self.fps_ddr, self.fps_host)

    @property
    def bound(self) -> str:
        """What limits `fps`: "host", "ddr" (the cores slowed by the shared DDR) or "dpu"."""
        f = self.fps
        if f == self.fps_host and self.fps_host < min(self.fps_compute, self.fps_ddr):
            return "host"
        return "ddr" if self.fps_ddr < self.fps_compute * 0.999 else "dpu"

    @property
    def ddr_bound(self) -> bool:
        return self.bound == "ddr"

    @property
    def ddr_mbps(self) -> float:
        """DDR traffic of all cores at `fps` (MB/s, 1e6 bytes)."""
        return self.fps * self.ddr_bytes / 1e6

    def to_dict(self) -> dict:
        return {"cores": self.cores, "clock_mhz": self.clock_mhz, "cycles": self.cycles,
                "overhead_us": self.overhead_us, "host_us": self.host_us, "io_bytes": self.io_bytes,
                "dpu_ms": self.dpu_ms, "latency_ms": self.latency_ms, "ddr_bytes": self.ddr_bytes,
                "fps_compute": self.fps_compute, "fps_ddr": self.fps_ddr, "fps_host": self.fps_host,
                "fps_single": self.fps_single, "fps": self.fps, "bound": self.bound, "ddr_bound": self.ddr_bound,
                "ddr_mbps": self.ddr_mbps}


def demand_trace(schedules, clock_mhz: float, overhead_us: float = 0.0, bins: int = TRACE_BINS) -> np.ndarray:
    """One frame on one core as [bins] DDR bytes per bin of equal duration: the DPU runs `schedules` (each a
    sim.timing.Schedule, in order) with `overhead_us` of no DDR traffic after each; an instruction's bytes are
    spread evenly over its [start, end)."""
    clk = clock_mhz * 1e6
    gap = overhead_us * 1e-6 * clk                            # cycles
    spans = [float(s.total_cycles) + gap for s in schedules]
    total = sum(spans)
    if total <= 0:
        return np.zeros(bins)
    edges = np.linspace(0.0, total, bins + 1)
    out = np.zeros(bins)
    t0 = 0.0
    for s, span in zip(schedules, spans):
        b = (s.ddr_read + s.ddr_write).astype(np.float64)
        m = b > 0
        st = s.start[m].astype(np.float64) + t0
        en = np.maximum(s.end[m].astype(np.float64) + t0, st + 1.0)
        bm = b[m]
        for c in range(0, len(st), 8192):                   # in chunks: [instructions, bins] stays a few MB
            sl = slice(c, c + 8192)
            # the share of [st, en) in each bin: cumulative coverage of the interval at every edge, differenced
            cov = np.clip((edges[None, :] - st[sl, None]) / (en[sl] - st[sl])[:, None], 0.0, 1.0)
            out += (bm[sl, None] * np.diff(cov, axis=1)).sum(axis=0)
        t0 += span
    return out


def shared_ddr_fps(trace: np.ndarray, frame_s: float, cores: int, bw_bytes_s: float, frames: int = 10) -> float:
    """Frames per second of `cores` cores each running the frame of `trace` (bytes per bin; a frame takes frame_s
    seconds on an uncontended core) back to back, started 1/cores of a frame apart, with the bins' traffic sharing
    bw_bytes_s max-min fairly (a core asking for less than its fair share gets what it asks; the rest share the
    remainder). The rate is the cores' total progress (in frames, fractional) per second from the moment every core
    has finished its first frame (a warm-up) to the moment every core has finished `frames`, capped by the exact
    bounds cores / frame_s and bw_bytes_s / bytes per frame."""
    nb = len(trace)
    if cores < 1 or frame_s <= 0 or nb == 0:
        return 0.0
    if not np.isfinite(bw_bytes_s) or bw_bytes_s <= 0 or not trace.any():
        return cores / frame_s
    dt_bin = frame_s / nb
    rate = trace / dt_bin                                     # bytes per second each bin asks for at full speed
    if cores * rate.max() <= bw_bytes_s:                      # never contended
        return cores / frame_s
    if rate.min() == rate.max():                              # flat: every core slowed alike, the roofline exactly
        return min(cores / frame_s, bw_bytes_s / float(trace.sum()))
    # per core: position (bin index over all frames) and the fraction of the current bin left
    pos = [(k * nb) // cores for k in range(cores)]
    left = [1.0] * cores
    start = list(pos)

    def progress() -> float:                                  # frames done by all cores together (fractional)
        return sum(pos[i] - start[i] + 1.0 - left[i] for i in range(cores)) / nb

    t, t0, p0 = 0.0, -1.0, 0.0                               # t0 < 0: not measuring yet
    while True:
        done = min(pos[i] - start[i] for i in range(cores)) // nb
        if t0 < 0 and done >= 1:                          # every core past its first frame: measure from here
            t0, p0 = t, progress()
        if done >= frames:
            break
        want = [rate[p % nb] for p in pos]
        alloc = [0.0] * cores                                 # max-min fair shares of the bandwidth
        cap, n = bw_bytes_s, cores
        for i in sorted(range(cores), key=lambda i: want[i]):
            alloc[i] = min(want[i], cap / n)
            cap -= alloc[i]
            n -= 1
        speed = [1.0 if want[i] <= 0 else min(1.0, alloc[i] / want[i]) for i in range(cores)]
        step = min(left[i] * dt_bin / speed[i] for i in range(cores))     # to the first core leaving its bin
        t += step
        for i in range(cores):
            left[i] -= step * speed[i] / dt_bin
            if left[i] <= 1e-9:
                pos[i] += 1
                left[i] = 1.0
    # the window's ends cut frames at arbitrary points (a compute phase counts time, not bytes): within a frame per
    # core of the truth, and never above the two exact bounds
    return min((progress() - p0) / (t - t0), cores / frame_s, bw_bytes_s / float(trace.sum()))


def host_us(io_bytes: int, target: Target) -> float:
    """Host work of one frame on one thread at the board's CPU clock."""
    tm = target.timing
    base = tm.host_frame_us + tm.host_us_per_mb * io_bytes / 1e6
    return base * HOST_REF_MHZ / tm.cpu_mhz if base else 0.0


def throughput(cycles: int, ddr_bytes: int, target: Target, runs: int = 1, trace: np.ndarray | None = None,
               io_bytes: int = 0) -> Throughput:
    """The board estimate of a frame of `runs` DPU runs taking `cycles` DPU cycles and moving `ddr_bytes`, on
    `target`'s board timing. `trace`: the frame's DDR demand (`demand_trace`, with the overheads); without it the
    demand is taken as flat over the frame (the roofline)."""
    tm = target.timing
    over = runs * tm.frame_overhead_us
    sec = cycles / (tm.clock_mhz * 1e6) + over / 1e6
    fps_c = tm.cores / sec if sec > 0 else 0.0
    bw = tm.board_ddr_mbps * 1e6 * tm.ddr_efficiency_pct / 100.0
    if not (tm.board_ddr_mbps and ddr_bytes) or sec <= 0:
        fps_d = float("inf")
    else:
        tr = trace if trace is not None and trace.any() else np.full(TRACE_BINS, ddr_bytes / TRACE_BINS)
        fps_d = shared_ddr_fps(tr, sec, tm.cores, bw)
        if fps_d >= fps_c * 0.999:                          # the DDR does not slow the cores down
            fps_d = float("inf")
    h = host_us(io_bytes, target)
    cpu = (h + over) * tm.host_load_pct / 100.0               # CPU time per frame with every thread busy
    fps_h = tm.cpu_threads * 1e6 / cpu if h > 0 else float("inf")
    return Throughput(tm.cores, tm.clock_mhz, int(cycles), float(over), int(ddr_bytes), fps_c, fps_d, h, fps_h,
                      int(io_bytes))
