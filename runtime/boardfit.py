"""Board throughput against the Vitis AI 2.5 Model Zoo's published fps (issue 33, docs/calibration.md).

`../shared/reference/model-zoo-2.5-fps.csv` gives, for 128 models on three boards (ZCU102 3 x B4096 at 281 MHz,
ZCU104 2 x B4096 at 300 MHz, KV260 1 x B4096 at 300 MHz), the end-to-end fps of one thread (one frame at a time)
and of many threads. `TOPOLOGIES` names the rows whose network we can build faithfully from published architecture
facts (quant/zoo.py), with the family the row belongs to; every other row is left out, and `UNMATCHED` says why for
the well-known ones. The board model is sim/multicore.py; this module compiles each topology once (through the
sweep's caches), times it on each board, fits the few global parameters on the training families and reports the
held-out error.
"""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field

import numpy as np

from opendpu.isa.boards import BOARDS, Board
from opendpu.isa.target import Target
from opendpu.sim.multicore import Throughput, demand_trace, throughput

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "reference",
                     "model-zoo-2.5-fps.csv")


@dataclass(frozen=True)
class Topology:
    row: str            # the table's `model` column
    zoo: str            # sweep model spec: zoo:NAME[@SIZE]
    family: str
    why: str            # what makes it faithful


# Rows with a faithful topology. GOPs in the table's standard name against ours (quant/zoo.py counts) are in
# docs/calibration.md; every one is within 3 % but the SqueezeNet row, whose name gives MACs (351.7 M = torchvision's
# SqueezeNet 1.1, 0.352 G multiply-adds).
TOPOLOGIES = (
    Topology("resnet50_pt", "zoo:resnet50", "resnet50", "torchvision ResNet-50 (v1.5), 8.2 G"),
    Topology("mlperf_resnet50_tf", "zoo:resnet50", "resnet50", "MLPerf ResNet-50 v1.5 = torchvision's, 8.19 G"),
    Topology("resnet50_tf2", "zoo:resnet50_caffe", "resnet50",
             "Keras ResNet50: the stride on the first 1x1, as Caffe's, 7.76 G (ours 7.72)"),
    Topology("resnet_v1_50_tf", "zoo:resnet50_tf", "resnet50", "TF-slim resnet_v1_50, 6.97 G"),
    Topology("personreid-res50_pt", "zoo:resnet50@256x128", "personreid",
             "a person re-identification network on a ResNet-50 backbone at 256x128, 5.3 G (ours 5.34)"),
    Topology("resnet_v1_101_tf", "zoo:resnet101_tf", "resnet-deep", "TF-slim resnet_v1_101, 14.4 G"),
    Topology("resnet_v1_152_tf", "zoo:resnet152_tf", "resnet-deep", "TF-slim resnet_v1_152, 21.83 G"),
    Topology("chen_color_resnet18_pt", "zoo:resnet18", "resnet18", "ResNet-18 classifier, 3.63 G"),
    Topology("vehicle_make_resnet18_pt", "zoo:resnet18", "resnet18", "ResNet-18 classifier, 3.63 G"),
    Topology("vehicle_type_resnet18_pt", "zoo:resnet18", "resnet18", "ResNet-18 classifier, 3.63 G"),
    Topology("mobilenet_v1_1_0_224_tf", "zoo:mobilenet_v1", "mobilenet_v1", "MobileNet v1 1.0, 1.14 G"),
    Topology("mobilenet_1_0_224_tf2", "zoo:mobilenet_v1", "mobilenet_v1", "MobileNet v1 1.0, 1.15 G"),
    Topology("mobilenet_v1_0_5_160_tf", "zoo:mobilenet_v1_050", "mobilenet_v1", "MobileNet v1 0.5 at 160, 150 M"),
    Topology("mobilenet_v1_0_25_128_tf", "zoo:mobilenet_v1_025", "mobilenet_v1", "MobileNet v1 0.25 at 128, 27 M"),
    Topology("mobilenet_v2_1_0_224_tf", "zoo:mobilenet_v2", "mobilenet_v2", "MobileNet v2 1.0, 602 M"),
    Topology("mobilenet_v2_1_4_224_tf", "zoo:mobilenet_v2_140", "mobilenet_v2", "MobileNet v2 1.4, 1.16 G"),
    Topology("Inception_v1_tf", "zoo:inception_v1", "inception", "TF-slim Inception v1 = torchvision GoogLeNet, 3 G"),
    Topology("Inception_v3_tf", "zoo:inception_v3", "inception_v3", "Inception v3 at 299, 11.45 G (ours 11.43)"),
    Topology("Inception_v3_tf2", "zoo:inception_v3", "inception_v3", "Inception v3 at 299, 11.5 G"),
    Topology("Inception_v3_pt", "zoo:inception_v3", "inception_v3", "torchvision Inception v3 at 299, 11.4 G"),
    Topology("SqueezeNet_pt", "zoo:squeezenet", "squeezenet", "torchvision SqueezeNet 1.1 (351.7 M MACs)"),
    Topology("vgg_16_tf", "zoo:vgg16", "vgg", "VGG-16, 30.96 G"),
    Topology("vgg_19_tf", "zoo:vgg19", "vgg", "VGG-19, 39.28 G"),
    Topology("yolov3_voc_tf", "zoo:yolov3_voc", "yolov3", "darknet YOLOv3, VOC head, 65.63 G"),
    Topology("yolov3_coco_tf2", "zoo:yolov3", "yolov3", "darknet YOLOv3, COCO head, 65.9 G"),
)

# Well-known rows left out, and why (the rest of the 128 are application networks whose layer shapes are not
# published: detection / segmentation heads, re-identification, medical, point clouds).
UNMATCHED = {
    "resnet50_pruned_0_*_pt, resnet_v1_50_pruned_*_tf, ofa_*": "pruned or searched widths not published per layer",
    "resnet_v2_*_tf": "pre-activation units: a BN + ReLU before each conv does not fold; not built",
    "Inception_v4, Inception_resnet_v2, inception_v2": "not built yet (published, long)",
    "inception_v3_pruned_*": "pruned widths not published per layer",
    "personreid-res18_pt": "1.1 G at 176x80 is not ResNet-18's 1.02 G: a modified network",
    "efficientnet*, mobilenet_edge*, mobilenet_v3*": "squeeze-excite / swish variants not built",
}

# The training families (the rest are held out): ResNet-50 in its four framework variants and MobileNet v1 at its
# widths and input sizes, 24 of the 75 (model, board) points, so the fit sees large and small models, compute-, DDR-
# and host-bound points and three input sizes.
TRAIN_FAMILIES = ("resnet50", "mobilenet_v1")


@dataclass
class Measured:
    row: str
    board: str
    single: float
    multi: float


def load_table(path: str = TABLE) -> list[Measured]:
    """The table's rows of the three boards (fps as published)."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["board"] not in BOARDS:
                raise ValueError(f"{path}: row {r['model']!r} names board {r['board']!r}, not one of {sorted(BOARDS)}")
            out.append(Measured(r["model"], r["board"], float(r["e2e_fps_single_thread"]),
                                float(r["e2e_fps_multi_thread"])))
    return out


@dataclass
class Frame:
    """One compiled topology: what the board model needs of it."""
    zoo: str
    summaries: list                  # runtime.profile.ProgramSummary per DPU subgraph
    io_bytes: int
    gops: float = 0.0
    schedules: dict = field(default_factory=dict)     # cycle-model timing -> [Schedule]
    traces: dict = field(default_factory=dict)        # (timing, overhead) -> demand trace


def compile_frames(specs, target: Target, cache_dir: str, log=print) -> dict[str, Frame]:
    """Each zoo spec compiled for `target`'s array (quantized and compiled once through the sweep's caches)."""
    from opendpu.runtime.sweep.cache import compile_key, compile_target, load_or_compile, prepare_model
    from opendpu.runtime.sweep.evaluate import compile_point
    from opendpu.runtime.sweep.spec import parse_model
    out = {}
    for spec in dict.fromkeys(specs):
        m = parse_model(spec)
        pm = prepare_model(m, cache_dir, log=log)
        key = compile_key(pm.hash, target, {})
        comp, cached = load_or_compile(key, cache_dir, lambda: compile_point(pm.path, compile_target(target), {}))
        if log:
            log(f"  {spec}: {'cached' if cached else f'compiled in {comp.compile_s:.1f} s'}")
        out[spec] = Frame(spec, comp.summaries, comp.io_bytes, sum(s.workload for s in comp.summaries) / 1e9)
    return out


def board_target(board: Board, base: Target, **params) -> Target:
    """The board's timing on `base`'s array, with `params` (fitted values) over the board's defaults."""
    return board.target(base).with_timing(**params)


def estimate(frame: Frame, t: Target) -> Throughput:
    """The board estimate of one frame of `frame` on `t` (a board's timing); schedules are cached per cycle-model
    timing."""
    from opendpu.runtime.profile import profile_summary
    from opendpu.runtime.sweep.cache import compile_target
    key = (t.timing.clock_mhz, tuple(sorted(compile_target(t).timing.to_dict().items())))   # what the cycle model reads
    if key not in frame.schedules:
        frame.schedules[key] = [profile_summary(s, t).schedule for s in frame.summaries]
    sch = frame.schedules[key]
    tkey = (key, t.timing.frame_overhead_us)
    if tkey not in frame.traces:
        frame.traces[tkey] = demand_trace(sch, t.timing.clock_mhz, t.timing.frame_overhead_us)
    cycles = sum(s.total_cycles for s in sch)
    nbytes = sum(int(s.ddr_read.sum() + s.ddr_write.sum()) for s in sch)
    return throughput(cycles, nbytes, t, runs=len(sch), trace=frame.traces[tkey], io_bytes=frame.io_bytes)


@dataclass
class Point:
    topo: Topology
    meas: Measured
    est: Throughput | None = None

    @property
    def err_single(self) -> float:
        return self.est.fps_single / self.meas.single - 1 if self.est else math.nan

    @property
    def err_multi(self) -> float:
        return self.est.fps / self.meas.multi - 1 if self.est else math.nan


def points(table: list[Measured]) -> list[Point]:
    """The (model, board) points of the faithful topologies."""
    by_row = {t.row: t for t in TOPOLOGIES}
    return [Point(by_row[m.row], m) for m in table if m.row in by_row]


def evaluate(pts: list[Point], frames: dict[str, Frame], base: Target, params: dict) -> list[Point]:
    for p in pts:
        t = board_target(BOARDS[p.meas.board], base, **params)
        p.est = estimate(frames[p.topo.zoo], t)
    return pts


def score(pts: list[Point]) -> dict:
    """Share of points within 10 % and 20 %, single and multi-thread, and the mean |ln(ours / measured)|."""
    out: dict[str, float] = {"points": len(pts)}
    for k in ("single", "multi"):
        e = np.array([getattr(p, f"err_{k}") for p in pts])
        out[f"{k}_within_10"] = int((np.abs(e) <= 0.10).sum())
        out[f"{k}_within_20"] = int((np.abs(e) <= 0.20).sum())
        out[f"{k}_mean_abs_ln"] = float(np.mean(np.abs(np.log1p(e)))) if len(e) else 0.0
        out[f"{k}_worst"] = float(e[np.argmax(np.abs(e))]) if len(e) else 0.0
    return out


def fit_host(pts: list[Point], frames: dict[str, Frame]) -> dict:
    """host_frame_us and host_us_per_mb from the one-core board's rows, independent of the DPU model: with one core
    the multi-thread period is the core's (DPU runs and their overheads: the host work overlaps it), and one frame
    alone pays the host work on top, so host = 1 / single - 1 / multi. Least squares on the relative error
    (non-negative), at the reference CPU clock."""
    from opendpu.sim.multicore import HOST_REF_MHZ
    rows, rhs = [], []
    for p in pts:
        b = BOARDS[p.meas.board]
        if b.cores != 1:
            continue
        h = (1e6 / p.meas.single - 1e6 / p.meas.multi) * b.cpu_mhz / HOST_REF_MHZ
        if h <= 0:
            continue
        io = frames[p.topo.zoo].io_bytes / 1e6
        rows.append(np.array([1.0, io]) / h)
        rhs.append(1.0)
    if not rows:
        return {"host_frame_us": 0, "host_us_per_mb": 0}
    x = _nnls(np.array(rows), np.array(rhs))
    return {"host_frame_us": int(round(x[0])), "host_us_per_mb": int(round(x[1]))}


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares a @ x = b with x >= 0, by trying every set of free variables (a handful of columns here) and
    keeping the best feasible solution."""
    n = a.shape[1]
    best, best_x = math.inf, np.zeros(n)
    for mask in range(1, 1 << n):
        cols = [j for j in range(n) if mask >> j & 1]
        xs = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (xs < 0).any():
            continue
        x = np.zeros(n)
        x[cols] = xs
        r = float(np.sum((a @ x - b) ** 2))
        if r < best:
            best, best_x = r, x
    return best_x


# conv_latency from 16 up: the RTL's CONV pipeline needs at least 11 cycles on a PP-8 array (hw/params.py
# min_latency) and the boards' timing must stay realisable by it (cosim); 16 is the Target default.
FIT_GRID = {"conv_latency": (16, 24, 32, 48, 64, 96, 128), "frame_overhead_us": range(0, 801, 10),
            "ddr_efficiency_pct": range(20, 101, 1), "host_load_pct": range(100, 401, 5)}


def mean_abs_ln(pts: list[Point]) -> float:
    """Mean |ln(ours / measured)| over the single- and multi-thread fps of evaluated points."""
    e = []
    for p in pts:
        assert p.est is not None, "evaluate() first"
        e += [abs(math.log(p.est.fps / p.meas.multi)), abs(math.log(p.est.fps_single / p.meas.single))]
    return float(np.mean(e))


def fit_rest(pts: list[Point], frames: dict[str, Frame], base: Target, params: dict, rounds: int = 3) -> dict:
    """The DPU's conv_latency, frame_overhead_us, ddr_efficiency_pct and host_load_pct (the host parameters fixed):
    coordinate descent over FIT_GRID on the mean |ln(ours / measured)| of the single- and multi-thread fps of `pts`.
    The programs are re-timed, not recompiled, for each conv_latency (the compiler decides by the cycle model, so
    the boards' programs are compiled again for the value chosen; bench_calibration then scores those)."""
    cur = {"conv_latency": base.timing.conv_latency, "frame_overhead_us": 0, "ddr_efficiency_pct": 50,
           "host_load_pct": 100, **params}
    for _ in range(rounds):
        before = dict(cur)
        for k, grid in FIT_GRID.items():
            best: tuple[float, int] = (math.inf, cur[k])
            for v in grid:
                evaluate(pts, frames, base, {**cur, k: v})
                m = mean_abs_ln(pts)
                if m < best[0] - 1e-12:
                    best = (m, v)
            cur[k] = best[1]
        if cur == before:
            break
    return cur


def fit(train: list[Point], frames: dict[str, Frame], base: Target) -> dict:
    """Every global parameter of the board model from the training points."""
    return fit_rest(train, frames, base, fit_host(train, frames))
