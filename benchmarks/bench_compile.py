"""Compiled zoo models (issue 13): compile time, DPU cycles, latency, fps and MAC utilisation, and the functional
`sim` time of the compiled ResNet-50 beside onnxruntime's int8 ResNet-50.

Tables printed:
  1. compile time of every model on B4096 (goal: ResNet-50 <= 10 s on 2 cores), with instructions, DPU subgraphs,
     CPU ops;
  2. for every model on every target: DPU cycles (sim.timing.simulate with the target's default timing, DPU
     subgraphs run one after another; CPU ops not counted), latency and fps at 300 MHz (batch 1, one core), MAC
     utilisation = workload (DpuProgram.workload, 2 ops per MAC) / (cycles x peak ops per cycle); also as CSV
     (--csv, stable columns CSV_COLUMNS);
  3. ResNet-50: wall time per inference of the compiled xmodel on the `sim` backend (GraphRunner: the cycle model
     with functional execution) beside onnxruntime on the int8 QDQ and QOperator models that
     onnxruntime.quantization makes from the same float ONNX (goal: sim <= 2x onnxruntime int8).

Models are the zoo's float ONNX (quant/zoo.py, deterministic random weights) at their published input size,
quantized with 4 random N(0,1) calibration images (maxmin); nothing is downloaded and nothing is cached on disk.
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))         # tests/compile_helpers.py

from compile_helpers import PRESET_KEYS, compile_model, graph_inputs, quantized, target  # noqa: E402
from opendpu.isa.program import to_arrays  # noqa: E402
from opendpu.quant import zoo  # noqa: E402
from opendpu.sim.timing import simulate  # noqa: E402

CLOCK_MHZ = 300.0
CSV_COLUMNS = ("model", "input_size", "target", "peak_ops_per_cycle", "dpu_subgraphs", "cpu_ops", "instructions",
               "workload_gops", "compile_s", "dpu_cycles", "latency_ms", "fps", "mac_util_pct")


def measure(name: str, size: int, key: str) -> dict:
    g = quantized(name, size)
    t = target(key)
    c = compile_model(g, t, name)
    cycles = sum(int(simulate(to_arrays(p.instructions), t).total_cycles) for p in c.programs.values())
    work = sum(p.workload for p in c.programs.values())
    lat = cycles / (CLOCK_MHZ * 1e6)
    cpu_ops = sum(len(s.all_ops()) for s in c.xmodel.toposort_child_subgraphs() if s.device == "CPU")
    return {"model": name, "input_size": size, "target": key, "peak_ops_per_cycle": t.peak_ops_per_cycle,
            "dpu_subgraphs": len(c.programs), "cpu_ops": cpu_ops,
            "instructions": sum(len(p.instructions) for p in c.programs.values()),
            "workload_gops": round(work / 1e9, 3), "compile_s": round(c.seconds, 2), "dpu_cycles": cycles,
            "latency_ms": round(lat * 1e3, 3), "fps": round(1 / lat, 1) if cycles else 0.0,
            "mac_util_pct": round(100 * work / (cycles * t.peak_ops_per_cycle), 1) if cycles else 0.0}


def _median_time(fn, reps: int) -> tuple[float, float]:
    fn()                                                      # warm-up (kernels, caches, allocations)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def ort_rows(size: int, reps: int, calib: int) -> list[tuple[str, float, float]]:
    """onnxruntime on the float ResNet-50 and on its int8 QDQ / QOperator models (quant_pre_process, then
    quantize_static with S8S8 and U8S8, `calib` random calibration images, per-tensor); the CPU provider with one
    intra-op thread per core."""
    import logging

    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.getLogger().setLevel(logging.ERROR)           # onnxruntime.quantization's advice on the root logger

    rng = np.random.default_rng(0)
    xs = rng.normal(0, 1, (calib, 1, 3, size, size)).astype(np.float32)
    x = rng.normal(0, 1, (1, 3, size, size)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"input": v} for v in xs])

        def get_next(self):
            return next(self.it, None)

    rows = []
    with tempfile.TemporaryDirectory() as d:
        fp = os.path.join(d, "resnet50.onnx")
        onnx.save(zoo.build("resnet50", size), fp)
        pre = os.path.join(d, "resnet50_pre.onnx")
        quant_pre_process(fp, pre)                            # shape inference + graph optimisation (BN folded)
        models = [("onnxruntime float32", fp)]
        for fmt in (QuantFormat.QDQ, QuantFormat.QOperator):
            for act in (QuantType.QInt8, QuantType.QUInt8):
                out = os.path.join(d, f"r50_{fmt.name}_{act.name}.onnx")
                t0 = time.perf_counter()
                quantize_static(pre, out, Reader(), quant_format=fmt, activation_type=act, weight_type=QuantType.QInt8)
                a = "S8S8" if act == QuantType.QInt8 else "U8S8"
                print(f"  onnxruntime.quantization {fmt.name} {a}: {time.perf_counter() - t0:.1f} s", flush=True)
                models.append((f"onnxruntime int8 {fmt.name} {a}", out))
        for label, path in models:
            so = ort.SessionOptions()
            so.intra_op_num_threads = os.cpu_count() or 1
            s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
            med, best = _median_time(lambda s=s: s.run(None, {"input": x}), reps)
            rows.append((label, med, best))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(zoo.NAMES), help="comma-separated zoo names (default: all)")
    ap.add_argument("--targets", default=",".join(PRESET_KEYS),
                    help="comma-separated presets (B512 ... B4096) or PP2 / PP8 (default: every preset)")
    ap.add_argument("--size", type=int, help="input size for every model (default: each model's published size)")
    ap.add_argument("--csv", metavar="OUT.csv", help="also write table 2 as CSV")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per backend in table 3 (median)")
    ap.add_argument("--calib", type=int, default=4, help="calibration images for onnxruntime.quantization")
    ap.add_argument("--no-ort", action="store_true", help="skip table 3")
    a = ap.parse_args()
    names = [n for n in a.models.split(",") if n]
    keys = [k for k in a.targets.split(",") if k]
    for n in names:
        if n not in zoo.NAMES:
            ap.error(f"unknown model {n!r}; choose from {', '.join(zoo.NAMES)}")
    for k in keys:
        target(k)
    print(f"machine: {os.cpu_count()} cores; clock for latency/fps {CLOCK_MHZ:g} MHz; targets {', '.join(keys)}")

    rows = []
    for n in names:
        size = a.size or zoo.DEFAULT_SIZE[n]
        t0 = time.perf_counter()
        quantized(n, size)
        print(f"{n} {size}x{size}: quantized in {time.perf_counter() - t0:.1f} s", flush=True)
        for k in keys:
            r = measure(n, size, k)
            rows.append(r)
            print(f"  {k:6s} {r['instructions']:7d} instructions, compile {r['compile_s']:6.2f} s, "
                  f"{r['dpu_cycles']:10d} cycles", flush=True)
        quantized.cache_clear()

    print("\nTable 1: compile time on B4096 (goal: resnet50 <= 10 s)")
    b4 = [r for r in rows if r["target"] == "B4096"]
    if not b4:
        print("  (B4096 not among --targets)")
    else:
        print(f"{'model':13s} {'size':>4s} {'subgraphs':>9s} {'cpu ops':>7s} {'instr':>7s} {'compile s':>9s}")
        for r in b4:
            print(f"{r['model']:13s} {r['input_size']:4d} {r['dpu_subgraphs']:9d} {r['cpu_ops']:7d} "
                  f"{r['instructions']:7d} {r['compile_s']:9.2f}")

    print(f"\nTable 2: DPU cycles, latency and fps at {CLOCK_MHZ:g} MHz, MAC utilisation")
    print(f"{'model':13s} {'size':>4s} {'target':6s} {'sg':>2s} {'cpu':>3s} {'instr':>6s} {'GOP':>7s} "
          f"{'compile s':>9s} {'cycles':>10s} {'ms':>8s} {'fps':>8s} {'util %':>6s}")
    for r in rows:
        print(f"{r['model']:13s} {r['input_size']:4d} {r['target']:6s} {r['dpu_subgraphs']:2d} {r['cpu_ops']:3d} "
              f"{r['instructions']:6d} {r['workload_gops']:7.3f} {r['compile_s']:9.2f} {r['dpu_cycles']:10d} "
              f"{r['latency_ms']:8.3f} {r['fps']:8.1f} {r['mac_util_pct']:6.1f}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
            w.writeheader()
            w.writerows(rows)
        print(f"wrote {a.csv}")

    if not a.no_ort:
        from opendpu.runtime.runner import GraphRunner
        size = a.size or zoo.DEFAULT_SIZE["resnet50"]
        key = "B4096" if "B4096" in keys else keys[0]
        print(f"\nTable 3: ResNet-50 {size}x{size}, wall time per inference (median of {a.reps}, after one warm-up)")
        c = compile_model(quantized("resnet50", size), target(key), "resnet50")
        runner = GraphRunner(c.xmodel, backend="sim")
        x = graph_inputs(c.graph, 0)
        sim_med, sim_best = _median_time(lambda: runner.run(x), a.reps)
        o = ort_rows(size, a.reps, a.calib)
        print(f"{'runtime':46s} {'median ms':>9s} {'best ms':>8s} {'sim / this':>10s}")
        print(f"{'opendpu sim: GraphRunner on the ' + key + ' xmodel':46s} {sim_med * 1e3:9.1f} {sim_best * 1e3:8.1f}")
        for label, med, best in o:
            print(f"{label:46s} {med * 1e3:9.1f} {best * 1e3:8.1f} {sim_med / med:10.2f}")
        int8 = [med for label, med, _ in o if "int8" in label]
        print(f"goal sim <= 2x onnxruntime int8: sim / fastest int8 = {sim_med / min(int8):.2f}, "
              f"sim / slowest int8 = {sim_med / max(int8):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
