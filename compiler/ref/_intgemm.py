"""Exact int8 x int8 matrix products for the golden's convolutions, on onnxruntime's MatMulInteger (issue 32).

A product of int8 data and int8 weights is an integer of magnitude <= 2^14; a sum of K of them is below 2^31 for
K < 2^17, so an int32 accumulator holds it exactly.  onnxruntime's MatMulInteger computes
sum_k (a_mk - za) * (b_ko - zb) in int32; with the data offset to uint8 (a = x + 128, za = 128) and the weights
as int8 (zb = 0), or offset too (b = w + 128, zb = 128), it is exactly sum_k x_mk * w_ko.  Its kernels use the
CPU's int8 dot products (VNNI), four times the float32 rate.

One caveat decides the form: on x86 CPUs without VNNI, the uint8 x int8 kernel adds pairs of products in
saturating int16 (vpmaddubsw), which is not exact; uint8 x uint8 widens to int16 first and is.  `_kind()` picks
uint8 x int8 only where the CPU has VNNI *and* a worst-case probe (products at +-2^14 in pairs, where saturation
would show) comes back exact, else uint8 x uint8 under the same probe, else none (the caller keeps its float
products).  tests/test_ref_fast.py compares the result with the integer path at the boundaries.

Nothing here is shared with the executor (sim/) or the compiler: the golden's own arithmetic.
"""

from __future__ import annotations

import functools
import os
import weakref

import numpy as np

_MAX_K = (1 << 31) // (1 << 14) - 1          # K * 2^14 < 2^31: the int32 accumulator cannot overflow


def _threads() -> int:
    """Threads of each product: OMP_NUM_THREADS when set (runtime/pool.py sets it in workers), else the cores."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return max(1, os.cpu_count() or 1)


def _session(b: np.ndarray, zb: int, threads: int):
    """An onnxruntime session of y[M, O] = MatMulInteger(a[M, K] uint8, b[K, O] (constant), 128, zb)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper as oh, numpy_helper
    K, O = b.shape
    btype = TensorProto.UINT8 if b.dtype == np.uint8 else TensorProto.INT8
    g = oh.make_graph(
        [oh.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])], "intgemm",
        [oh.make_tensor_value_info("a", TensorProto.UINT8, ["M", K])],
        [oh.make_tensor_value_info("y", TensorProto.INT32, ["M", O])],
        [numpy_helper.from_array(np.ascontiguousarray(b), "b"), oh.make_tensor("za", TensorProto.UINT8, [], [128]),
         oh.make_tensor("zb", btype, [], [zb])])
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, onnx.IR_VERSION, 9)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    # one pool per layer: idle pools must not spin (measured, ResNet-50 per image: 34 ms; spinning, 1,050 ms)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _cpu_has_vnni() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return " avx512_vnni" in flags or " avx_vnni" in flags


def _probe(signed_weights: bool) -> bool:
    """MatMulInteger of this form is exact on the products that would saturate an int16 pair sum, and on random
    full-range data."""
    r = np.random.default_rng(0)
    K, O = 96, 8
    x = np.full((4, K), 127, dtype=np.int8)
    x[1] = -128
    x[2] = r.integers(-128, 128, K)
    x[3, ::2] = -128
    w = np.empty((K, O), dtype=np.int8)
    w[:, 0], w[:, 1], w[:, 2] = 127, -128, np.where(np.arange(K) % 2, 127, -128)
    w[:, 3:] = r.integers(-128, 128, (K, O - 3))
    try:
        got = IntGemm(w.T.copy(), signed_weights)(x.view(np.uint8) ^ np.uint8(0x80))
    except Exception:  # noqa: BLE001 - an onnxruntime without the kernel: the caller keeps float products
        return False
    return bool(np.array_equal(got, x.astype(np.int64) @ w.astype(np.int64)))


@functools.lru_cache(maxsize=1)
def _kind() -> bool | None:
    """True: uint8 x int8 products; False: uint8 x uint8; None: no exact MatMulInteger on this machine."""
    if _cpu_has_vnni() and _probe(True):
        return True
    return False if _probe(False) else None


class IntGemm:
    """y[M, O] int32 = x[M, K] . w[O, K]^T for int8 data passed as uint8 (x + 128, i.e. x.view(uint8) ^ 0x80) and
    int8 weights w [O, K], exactly (K < 2^17)."""

    def __init__(self, w: np.ndarray, signed_weights: bool, threads: int = 1):
        if w.dtype != np.int8 or w.ndim != 2 or w.shape[1] > _MAX_K:
            raise ValueError("IntGemm takes int8 weights [O, K] with K < 2^17")
        b = w.T if signed_weights else (w.T.view(np.uint8) ^ np.uint8(0x80))
        self._sess = _session(b, 0 if signed_weights else 128, threads)
        # max_o sum_k |w_ok| (exact in int64): 128 times it bounds every |y| of a row of int8 data
        self.l1 = int(np.abs(w.astype(np.int64)).sum(axis=1).max()) if w.size else 0

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return self._sess.run(None, {"a": a})[0]


_PREPARED: dict[int, tuple[weakref.ref, IntGemm | None]] = {}
# Preparing a product costs a few ms (an onnxruntime session), the float32 product of ~2^27 multiply-adds. A weight
# array gets one on its first use only when its product is at least this large; else on its second use (a model
# run again: every later run takes the int8 form), so one-off layers keep the float BLAS product.
EAGER_MACS = 1 << 27
THREADED_MACS = 1 << 24           # products shorter than this run on one thread (MobileNet v2: 19 -> 13 ms)


def for_weights(w: np.ndarray, k: int, macs: int = 0) -> IntGemm | None:
    """The IntGemm of conv weights w (int8, OHWI, one group; K = kh*kw*I = k), prepared once per weight array
    for as long as the array lives (a graph's constants are read once per runner), from the first use when the
    product has at least EAGER_MACS multiply-adds (`macs`), else from the second; None when not prepared (yet),
    when no exact MatMulInteger is available or when K is too long for int32."""
    kind = _kind()
    if kind is None or w.dtype != np.int8 or k > _MAX_K:
        return None
    key = id(w)
    hit = _PREPARED.get(key)
    seen = hit is not None and hit[0]() is w
    if seen and hit is not None and hit[1] is not None:
        return hit[1]
    # a second thread pays off only on products long enough to hide its wake-up (an idle pool does not spin)
    threads = _threads() if macs >= THREADED_MACS else 1
    g = IntGemm(np.ascontiguousarray(w.reshape(w.shape[0], k)), kind, threads) \
        if seen or macs >= EAGER_MACS else None
    if seen and hit is not None:
        _PREPARED[key] = (hit[0], g)
        return g
    try:
        ref = weakref.ref(w, lambda _r: _PREPARED.pop(key, None))
    except TypeError:                       # not weak-referenceable: used once, not kept
        return g
    _PREPARED[key] = (ref, g)
    return g
