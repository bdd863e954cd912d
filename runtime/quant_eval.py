"""`quantize --evaluate` over a pool of workers: the float model and its DPU fake-quant beside it on a data set.

The same numbers as `QuantResult.evaluate` (top-1 agreement, output SQNR, accuracies with labels) for any worker
count: the data is cut into the same batches whatever the workers (onnxruntime's results depend on nothing else),
each worker unpickles the quantization result once (the pool initializer), and the metrics are computed here on
the outputs concatenated in sample order.
"""
from __future__ import annotations

import time

import numpy as np

from opendpu.quant.quantize import evaluation_metrics
from opendpu.runtime.pool import check_workers, map_chunks, throughput

__all__ = ["evaluate"]

BATCH = 64              # samples per onnxruntime call, as QuantResult.evaluate


def _outputs(res, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first output of the float model and of the DPU fake-quant model on one batch."""
    out = res.prep.outputs[0]
    return res.run(x, "float", [out])[out], res.run(x, "dpu", [out])[out]


def evaluate(res, x: np.ndarray, y: np.ndarray | None = None, workers: int = 1, progress=None) -> dict:
    """Float vs quantized outputs of QuantResult `res` on (x, y), with `workers` processes; the report of
    `QuantResult.evaluate` plus its throughput (images/s of wall time)."""
    workers = min(check_workers(workers), max(1, -(-len(x) // BATCH)))
    t0 = time.perf_counter()
    parts = [x[i:i + BATCH] for i in range(0, len(x), BATCH)]
    if workers == 1:
        outs = []
        for k, p in enumerate(parts):
            outs.append(_outputs(res, p))
            if progress:
                progress(min(len(x), (k + 1) * BATCH), len(x), "samples")
    else:
        import copy
        import pickle
        bare = copy.copy(res)
        bare._sessions = {}             # onnxruntime sessions do not pickle; each worker makes its own
        outs = map_chunks(_batch, parts, workers, _load, (pickle.dumps(bare),), progress=progress,
                          sizes=[len(p) for p in parts])
    seconds = time.perf_counter() - t0
    rep = evaluation_metrics(np.concatenate([o[0] for o in outs]), np.concatenate([o[1] for o in outs]), y)
    rep["throughput"] = throughput(len(x), seconds, workers)
    return rep


_RES: list = []


def _load(blob: bytes) -> None:
    """Pool initializer: the quantization result, once per worker."""
    import pickle
    _RES[:] = [pickle.loads(blob)]


def _batch(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pool task: one batch's outputs."""
    return _outputs(_RES[0], x)
