"""Functional (bit-exact) emulation speed beside onnxruntime (issue 32 item 4).

For ResNet-50 and MobileNet v2 (zoo, 224x224, quantized with the repo's quantizer as benchmarks/bench_compile.py
does: 4 random N(0,1) calibration images, maxmin; compiled for B4096) and YOLOX-nano (AMD's B4096 xmodel in the
shared models directory, ../shared/models/yolox_nano_b4096.xmodel), all in one process:

  * per-image wall time (median of --reps runs after one warm-up) of the compiled model on the `ref` backend (the
    XIR golden, compiler/ref) and on the `sim` backend (the executor running the DPU program), GraphRunner.run on
    one random int8 image; with the BLAS's default threads and again limited to one BLAS thread (threadpoolctl:
    OpenBLAS's threads wait actively, so with another busy process on a 2-core machine two threads are slower
    than one). The golden's int8 products on onnxruntime (compiler/ref/_intgemm.py) keep their own threads in
    both rows (the cores for products of >= 2^24 MACs, else one);
  * onnxruntime (CPU provider, one intra-op thread per core) on the float zoo model and on its int8 models from
    onnxruntime.quantization.quantize_static (QDQ and QOperator, U8S8 and S8S8, per-tensor, --calib random
    calibration images); YOLOX-nano has no float ONNX here, so its onnxruntime columns are n/a;
  * the ratio of every row to the fastest onnxruntime int8 model (issue 32's goal: ref <= 2x, sim <= 4x);
  * images/s of runtime.compare.compare (float onnxruntime beside the xmodel on ref / sim) over --images random
    images, with 1 worker (in process) and with 2 worker processes (`compare(..., workers=2)`, issue 32 item 3;
    worker start-up included).  YOLOX-nano: n/a (no float ONNX to compare with).

Output: one table per model and a fixed last line per model:
  RESULT <model>: ref <ms> ms (<x> fastest int8) sim <ms> ms (<x>) ort-int8 <ms> ms (<label>) compare-ref <i/s> ...
Numbers are noisy on a loaded machine: the load average is printed with every table.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))         # tests/compile_helpers.py

from bench_timing import _median as median_time  # noqa: E402  (the median-of-reps timer after one warm-up)
from compile_helpers import compile_model, graph_inputs, quantized, target  # noqa: E402
from opendpu.compiler.xir.graph import Graph  # noqa: E402
from opendpu.quant import zoo  # noqa: E402
from opendpu.runtime.runner import GraphRunner  # noqa: E402

SHARED = os.environ.get("OPENDPU_SHARED", os.path.join(HERE, "..", "..", "shared"))
MODELS = ("resnet50", "mobilenet_v2", "yolox_nano")
SHARED_XMODELS = {"yolox_nano": "yolox_nano_b4096.xmodel"}        # models without a float ONNX here
TARGET = "B4096"
NA = "n/a"


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# ---- onnxruntime baselines ----------------------------------------------------------------------------------
def ort_models(onnx_path: str, work: str, size: int, calib: int) -> list[tuple[str, str]]:
    """[(label, path)]: the float model and its int8 QDQ / QOperator x U8S8 / S8S8 models (quant_pre_process,
    then quantize_static with `calib` random N(0,1) calibration images, per-tensor), as bench_compile.ort_rows."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    logging.getLogger().setLevel(logging.ERROR)           # onnxruntime.quantization's advice on the root logger
    name = onnx.load(onnx_path).graph.input[0].name
    xs = np.random.default_rng(0).normal(0, 1, (calib, 1, 3, size, size)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{name: v} for v in xs])

        def get_next(self):
            return next(self.it, None)

    base = os.path.splitext(os.path.basename(onnx_path))[0]
    pre = os.path.join(work, base + "_pre.onnx")
    quant_pre_process(onnx_path, pre)                     # shape inference + graph optimisation (BN folded)
    out = [("onnxruntime float32", onnx_path)]
    for fmt in (QuantFormat.QDQ, QuantFormat.QOperator):
        for act in (QuantType.QUInt8, QuantType.QInt8):
            a = "S8S8" if act == QuantType.QInt8 else "U8S8"
            path = os.path.join(work, f"{base}_{fmt.name}_{a}.onnx")
            quantize_static(pre, path, Reader(), quant_format=fmt, activation_type=act, weight_type=QuantType.QInt8)
            out.append((f"onnxruntime int8 {fmt.name} {a}", path))
    return out


def ort_session(path: str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ort_times(models: list[tuple[str, str]], size: int, reps: int) -> list[tuple[str, float]]:
    x = np.random.default_rng(1).normal(0, 1, (1, 3, size, size)).astype(np.float32)
    rows = []
    for label, path in models:
        s = ort_session(path)
        feed = {s.get_inputs()[0].name: x}
        rows.append((label, median_time(lambda s=s, feed=feed: s.run(None, feed), reps)))
    return rows


# ---- compare throughput (issue 32 item 3) ----------------------------------------------------------------------
def compare_images_per_s(onnx_path: str, xmodel_path: str, data: np.ndarray, backend: str, workers: int) -> float:
    """Images/s of runtime.compare.compare over `data` on `backend` with `workers` processes (wall time, worker
    start-up included)."""
    from opendpu.runtime.compare import compare
    t0 = time.perf_counter()
    rep = compare(onnx_path, xmodel_path, data, task="raw", backend=backend, workers=workers)
    dt = time.perf_counter() - t0
    if rep.get("samples") != len(data):
        raise RuntimeError(f"compare ran {rep.get('samples')} samples, not {len(data)}")
    return len(data) / dt


# ---- one model ----------------------------------------------------------------------------------------------
def build(name: str, work: str) -> tuple[Graph, str | None, str, int | None]:
    """(compiled xmodel graph, float ONNX path or None, compiled xmodel path, ONNX input size or None)."""
    if name in SHARED_XMODELS:
        path = os.path.join(SHARED, "models", SHARED_XMODELS[name])
        if not os.path.isfile(path):
            raise SystemExit(f"{name}: shared model {path} not found (set OPENDPU_SHARED)")
        return Graph.load(path), None, path, None
    size = zoo.DEFAULT_SIZE[name]
    t0 = time.perf_counter()
    g = quantized(name, size)
    t1 = time.perf_counter()
    c = compile_model(g, target(TARGET), name)
    print(f"{name} {size}x{size}: quantized in {t1 - t0:.1f} s, compiled for {TARGET} in {c.seconds:.1f} s",
          flush=True)
    onnx_path = os.path.join(work, f"{name}.onnx")
    import onnx
    onnx.save(zoo.build(name, size), onnx_path)
    xpath = os.path.join(work, f"{name}_{TARGET}.xmodel")
    c.xmodel.save(xpath)
    quantized.cache_clear()
    return c.xmodel, onnx_path, xpath, size


def fmt_ms(v: float | None) -> str:
    return NA if v is None else f"{v * 1e3:.1f}"


def fmt_ratio(v: float | None, base: float | None) -> str:
    return NA if v is None or base is None else f"{v / base:.2f}x"


def fmt_ips(v: float | None, why: str = NA) -> str:
    return why if v is None else f"{v:.2f}"


def bench_model(name: str, a, work: str) -> str:
    xg, onnx_path, xpath, size = build(name, work)
    x = graph_inputs(xg, 0)
    times: list[tuple[str, float | None]] = []
    for backend in a.backends:
        r = GraphRunner(xg, backend=backend)
        times.append((f"opendpu {backend}: GraphRunner on the {TARGET} xmodel",
                      median_time(lambda r=r: r.run(x), a.reps)))
        if a.one_blas_thread:
            from threadpoolctl import threadpool_limits
            with threadpool_limits(limits=1, user_api="blas"):
                times.append((f"opendpu {backend}, 1 BLAS thread", median_time(lambda r=r: r.run(x), a.reps)))
    ort: list[tuple[str, float | None]] = []
    if onnx_path is not None and size is not None and not a.no_ort:
        ort = list(ort_times(ort_models(onnx_path, work, size, a.calib), size, a.reps))
    elif onnx_path is None:
        ort = [(f"onnxruntime {k}", None) for k in ("float32", "int8 QDQ U8S8", "int8 QDQ S8S8",
                                                   "int8 QOperator U8S8", "int8 QOperator S8S8")]
    int8 = [(lbl, t) for lbl, t in ort if "int8" in lbl and t is not None]
    fastest = min(int8, key=lambda r: r[1]) if int8 else None
    base = fastest[1] if fastest else None

    print(f"\n{name} ({'zoo ' + str(size) + 'x' + str(size) if size else 'shared ' + os.path.basename(xpath)}), "
          f"per image, median of {a.reps} after a warm-up; load average {load()}")
    if onnx_path is None:
        print("  (no float ONNX model of it here: onnxruntime columns and compare are n/a)")
    print(f"  {'runtime':52s} {'median ms':>10s} {'/ fastest int8':>14s}")
    for label, t in times + ort:
        print(f"  {label:52s} {fmt_ms(t):>10s} {fmt_ratio(t, base):>14s}")

    ips: dict[tuple[str, int], float | None] = {}
    if onnx_path is not None and a.images > 0:
        data = np.random.default_rng(2).normal(0, 1, (a.images, 3, size, size)).astype(np.float32)
        print(f"  compare over {a.images} images (runtime.compare.compare, images/s):")
        for backend in a.compare_backends:
            for w in (1, 2):
                ips[backend, w] = compare_images_per_s(onnx_path, xpath, data, backend, w)
            print(f"    {backend:4s}: 1 worker {fmt_ips(ips[backend, 1])}, "
                  f"2 workers {fmt_ips(ips[backend, 2])}", flush=True)
    d = dict(times)
    parts = [f"RESULT {name}:"]
    for backend in a.backends:
        t = d[f"opendpu {backend}: GraphRunner on the {TARGET} xmodel"]
        parts.append(f"{backend} {fmt_ms(t)} ms ({fmt_ratio(t, base)})")
        if a.one_blas_thread:
            t = d[f"opendpu {backend}, 1 BLAS thread"]
            parts.append(f"{backend}-1t {fmt_ms(t)} ms ({fmt_ratio(t, base)})")
    parts.append(f"ort-int8 {fmt_ms(base)} ms ({fastest[0].replace('onnxruntime int8 ', '') if fastest else NA})")
    for backend in a.compare_backends:
        parts.append(f"compare-{backend} {fmt_ips(ips.get((backend, 1)))}/"
                     f"{fmt_ips(ips.get((backend, 2)))} img/s (1/2 workers)")
    parts.append(f"load {load()}")
    return " ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated (default: {','.join(MODELS)})")
    ap.add_argument("--backends", default="ref,sim", help="opendpu backends timed per image (default: ref,sim)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs per row (median; default 5)")
    ap.add_argument("--calib", type=int, default=4, help="calibration images for onnxruntime.quantization")
    ap.add_argument("--images", type=int, default=256, help="images of the compare run (0: skip; default 256)")
    ap.add_argument("--compare-backends", default="ref,sim", help="backends of the compare run (default: ref,sim)")
    ap.add_argument("--no-ort", action="store_true", help="skip the onnxruntime rows")
    ap.add_argument("--no-one-blas-thread", dest="one_blas_thread", action="store_false",
                    help="skip the rows timed with BLAS limited to one thread (threadpoolctl): on a loaded machine "
                         "a multi-threaded BLAS slows down several times, one thread does not")
    a = ap.parse_args()
    a.backends = [b for b in a.backends.split(",") if b]
    a.compare_backends = [b for b in a.compare_backends.split(",") if b] if a.images > 0 else []
    names = [n for n in a.models.split(",") if n]
    for n in names:
        if n not in zoo.NAMES and n not in SHARED_XMODELS:
            ap.error(f"unknown model {n!r}; choose from {', '.join(zoo.NAMES + tuple(SHARED_XMODELS))}")
    print(f"machine: {os.cpu_count()} cores, load average {load()}", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as work:
        for n in names:
            results.append(bench_model(n, a, work))
            print(results[-1], flush=True)
    print()
    for r in results:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
