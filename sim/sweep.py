"""Timing-parameter sweeps of one compiled program (timing-only cycle model), SCALE-Sim style CSV rows.

A compiled program fixes the array (PP, CP, banks), so a sweep varies the `Timing` of its target:
clock, DDR latency and bandwidth, ports, queue depth, fetch, pipeline latencies, cores. Each point
gives total cycles, latency, throughput and per-engine busy fractions.
"""
from __future__ import annotations

import itertools

from opendpu.isa.fields import Engine
from opendpu.isa.target import Target, Timing

from .timing import simulate

SWEEP_COLUMNS = ("point", "total_cycles", "latency_ms", "fps", "ddr_read_bytes", "ddr_write_bytes") + tuple(
    f"busy_{e.name.lower()}" for e in Engine)


def parse_axis(spec: str) -> tuple[str, list]:
    """'ddr_bytes_per_cycle=8,16,32' -> ('ddr_bytes_per_cycle', [8, 16, 32]); names are Timing fields."""
    if "=" not in spec:
        raise ValueError(f"sweep axis {spec!r}: expected name=v1,v2,... (e.g. ddr_latency=40,80)")
    name, vals = spec.split("=", 1)
    name = name.strip()
    if name not in Timing.__dataclass_fields__:
        raise ValueError(f"sweep axis {name!r} is not a timing parameter; known: "
                         f"{', '.join(Timing.__dataclass_fields__)}")
    out = []
    for v in vals.split(","):
        try:
            out.append(float(v) if name == "clock_mhz" else int(v, 0))
        except ValueError:
            raise ValueError(f"sweep axis {name}: {v!r} is not a number") from None
    if not out:
        raise ValueError(f"sweep axis {name}: no values")
    return name, out


def sweep(programs, target: Target, axes: dict[str, list], progress=None) -> list[dict]:
    """Time every program (list of ProgramArrays run back to back, e.g. a model's DPU subgraphs) at each
    point of the cartesian product of `axes`; one row per point.

    `progress(done, total, what)` (optional) is called before each point (what = the point, e.g.
    "ddr_latency=40") and once at the end (done == total, what = "done")."""
    names = list(axes)
    rows = []
    points = list(itertools.product(*(axes[n] for n in names)))
    for i, vals in enumerate(points):
        point = dict(zip(names, vals))
        if progress is not None:
            progress(i, len(points), ";".join(f"{n}={v}" for n, v in point.items()))
        t = target.with_timing(**point)
        cyc = rd = wr = 0
        busy = dict.fromkeys((e.name for e in Engine), 0)
        ms = 0.0
        for p in programs:
            s = simulate(p, t)
            cyc += s.total_cycles
            ms += s.latency_ms
            b = s.ddr_bytes()
            rd += sum(b["read"].values())
            wr += sum(b["write"].values())
            for k, v in s.engine_busy().items():
                busy[k] += v
        row = {**point, "point": ";".join(f"{k}={v}" for k, v in point.items()), "total_cycles": cyc,
               "latency_ms": ms, "fps": t.timing.cores * 1e3 / ms if ms else 0.0, "ddr_read_bytes": rd,
               "ddr_write_bytes": wr}
        row.update({f"busy_{k.lower()}": v / cyc if cyc else 0.0 for k, v in busy.items()})
        rows.append(row)
    if progress is not None:
        progress(len(points), len(points), "done")
    return rows
