"""The golden's fast kernels (compiler/ref/_fast.py: BLAS in float32 / float64, vectorised rounding) against its
integer paths (compiler.ref.ops.FAST = False: int64 post-processing, per-kernel-position products, int64 eltwise),
issue 32 item 5: 0 mismatching bytes.

Hypothesis draws layers at the float32-exactness boundary: reductions kh*kw*C around 2^24 / 2^14 = 1,024 terms and
far above it (float32 chunks summed in float64), operands at their extremes (-128 everywhere makes every product
+2^14, so the accumulator reaches K * 2^14 exactly), uint8 and int16 activations (other product bounds), biases
at their extremes, every bias shift from the §7.2 clamp (-1) up, output shifts from left shifts to 20, all
nonlinearities and round modes.
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opendpu.compiler.ref import _fast, _intgemm, evaluate
from opendpu.compiler.ref import ops as ref_ops

SETTINGS = dict(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def both(op_type, inputs, attrs, in_fix, out_fix, out_shape):
    """(fast, integer) results of one op."""
    fast = evaluate(op_type, inputs, attrs, in_fix, out_fix, out_shape)
    old = ref_ops.FAST
    ref_ops.FAST = False
    try:
        slow = evaluate(op_type, inputs, attrs, in_fix, out_fix, out_shape)
    finally:
        ref_ops.FAST = old
    return fast, slow


@contextlib.contextmanager
def float_products(on: bool):
    """With on=True, int8 convolutions take the float32 / float64 BLAS products, else onnxruntime's exact int32
    MatMulInteger (_intgemm) from the first use of any weights, so that both fast forms meet the integer path."""
    old, eager = _intgemm.for_weights, _intgemm.EAGER_MACS
    if on:
        _intgemm.for_weights = lambda w, k, macs=0: None
    else:
        _intgemm.EAGER_MACS = 0                   # the int8 form from the first use of a weight array
    try:
        yield
    finally:
        _intgemm.for_weights, _intgemm.EAGER_MACS = old, eager


def assert_same(fast, slow):
    assert fast.dtype == slow.dtype == np.int8
    bad = int(np.count_nonzero(fast != slow))
    assert bad == 0, f"{bad} of {fast.size} bytes differ"


@st.composite
def operand(draw, shape, dtype=np.int8):
    """An integer array of `shape`: all at one extreme, one extreme with 10 % random values (sums past 2^24 with
    their low bits set: what float32 would round), alternating extremes, extremes mixed with random values, or
    uniform random."""
    info = np.iinfo(dtype)
    lo, hi = int(info.min), int(info.max)
    mode = draw(st.sampled_from(["lo", "hi", "lo_noisy", "hi_noisy", "lo_noisy", "alt", "mixed", "random"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if mode == "lo":
        a = np.full(shape, lo)
    elif mode == "hi":
        a = np.full(shape, hi)
    elif mode in ("lo_noisy", "hi_noisy"):
        a = np.where(rng.random(shape) < 0.9, lo if mode == "lo_noisy" else hi, rng.integers(lo, hi + 1, shape))
    elif mode == "alt":
        a = np.where(np.indices(shape).sum(axis=0) % 2 == 0, lo, hi)
    elif mode == "mixed":
        a = np.where(rng.random(shape) < 0.8, rng.choice([lo, hi], shape), rng.integers(lo, hi + 1, shape))
    else:
        a = rng.integers(lo, hi + 1, shape)
    return a.astype(dtype)


NONLINEAR = st.sampled_from(["NONE", "RELU", "RELU6", "LEAKYRELU", "PRELU"])
ROUND = st.sampled_from([None, None, None, "STD_ROUND", "PY3_ROUND"])
X_DTYPE = st.sampled_from([np.int8, np.int8, np.int8, np.uint8, np.int16])


@st.composite
def conv_case(draw, long_reductions: bool):
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    # reduction length K = kh*kw*C per group: around 1,024 and far above (up to ~9,000)
    k_target = draw(st.sampled_from([1000, 1024, 1025, 1031, 2048, 2049, 4100, 9000] if long_reductions
                                    else [1, 7, 64, 300, 1024]))
    groups = draw(st.sampled_from([1, 1, 1, 2, 3]))
    ig = max(1, k_target // (kh * kw) + draw(st.integers(-1, 1)))
    og = draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    pt, pb, pl, pr = (draw(st.integers(0, 2)) for _ in range(4))
    H, W = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    oh = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (W + pl + pr - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        pb += dh * (kh - 1)
        pr += dw * (kw - 1)
        oh = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
        ow = (W + pl + pr - dw * (kw - 1) - 1) // sw + 1
    N = draw(st.integers(1, 2))
    x = draw(operand((N, H, W, ig * groups), draw(X_DTYPE)))
    w = draw(operand((og * groups, kh, kw, ig)))
    return x, w, groups, (kh, kw), (sh, sw), (dh, dw), (pt, pb, pl, pr), (N, oh, ow, og * groups)


@st.composite
def fix_points(draw):
    """(fp_in, fp_w, fp_bias, fp_out): output shift sc = fp_in + fp_w - fp_out from -3 (a left shift) to 20, bias
    shift sb = fp_in + fp_w - fp_bias from -3 (clamped to -1, §7.2) to 20."""
    fp_in, fp_w = draw(st.integers(-2, 8)), draw(st.integers(0, 9))
    sc, sb = draw(st.integers(-3, 20)), draw(st.integers(-3, 20))
    return fp_in, fp_w, fp_in + fp_w - sb, fp_in + fp_w - sc


def conv_attrs(kernel_hw, stride_hw, dil_hw, pads, groups, nl, mode, draw_alpha):
    (kh, kw), (sh, sw), (dh, dw), (pt, pb, pl, pr) = kernel_hw, stride_hw, dil_hw, pads
    a = {"kernel": [kw, kh], "stride": [sw, sh], "dilation": [dw, dh], "pad": [pl, pr, pt, pb],
         "group": groups, "nonlinear": nl}
    if nl == "LEAKYRELU":
        a["LEAKYRELU_alpha"] = draw_alpha
    if nl == "PRELU":
        a["prelu_in"], a["prelu_shift"] = 26, 8
    if mode is not None:
        a["round_mode"] = mode
    return a


def check_conv(data, long_reductions):
    x, w, groups, kernel_hw, stride_hw, dil_hw, pads, out_shape = data.draw(conv_case(long_reductions))
    fp_in, fp_w, fp_b, fp_out = data.draw(fix_points())
    nl, mode = data.draw(NONLINEAR), data.draw(ROUND)
    alpha = data.draw(st.sampled_from([26 / 256, 0.1, 0.125]))
    inputs = [x, w]
    in_fix = [fp_in, fp_w]
    if data.draw(st.booleans()):
        inputs.append(data.draw(operand((out_shape[3],))))
        in_fix.append(fp_b)
    attrs = conv_attrs(kernel_hw, stride_hw, dil_hw, pads, groups, nl, mode, alpha)
    with float_products(data.draw(st.booleans())):
        assert_same(*both("conv2d-fix", inputs, attrs, in_fix, fp_out, out_shape))


@settings(**SETTINGS)
@given(st.data())
def test_conv2d_long_reductions_fast_equals_integer(data):
    check_conv(data, long_reductions=True)


@settings(**SETTINGS)
@given(st.data())
def test_conv2d_short_reductions_fast_equals_integer(data):
    check_conv(data, long_reductions=False)


@settings(**SETTINGS)
@given(st.data())
def test_depthwise_and_transposed_fast_equals_integer(data):
    op = data.draw(st.sampled_from(["depthwise-conv2d-fix", "transposed-conv2d-fix",
                                    "transposed-depthwise-conv2d-fix", "conv2d-fix"]))
    kh, kw = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7))
    sh, sw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    C, M = data.draw(st.integers(1, 9)), data.draw(st.sampled_from([1, 1, 2]))
    H, W, N = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7)), data.draw(st.integers(1, 2))
    x = data.draw(operand((N, H, W, C), data.draw(X_DTYPE)))
    if op == "transposed-conv2d-fix":
        w = data.draw(operand((C * M, kh, kw, C)))
        groups = 1
    elif op == "conv2d-fix":                           # depthwise written as a grouped conv (one channel a group)
        w = data.draw(operand((C * M, kh, kw, 1)))
        groups = C
    else:
        w = data.draw(operand((M, kh, kw, C)))
        groups = 1
    if op.startswith("transposed"):
        pt, pb, pl, pr = (data.draw(st.integers(0, k - 1)) for k in (kh, kh, kw, kw))
        oh, ow = (H - 1) * sh + kh - pt - pb, (W - 1) * sw + kw - pl - pr
        dil = (1, 1)
    else:
        pt, pb, pl, pr = (data.draw(st.integers(0, 2)) for _ in range(4))
        dil = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
        oh = max(1, (H + pt + pb - dil[0] * (kh - 1) - 1) // sh + 1)
        ow = max(1, (W + pl + pr - dil[1] * (kw - 1) - 1) // sw + 1)
    if oh < 1 or ow < 1:
        return
    fp_in, fp_w, fp_b, fp_out = data.draw(fix_points())
    nl, mode = data.draw(NONLINEAR), data.draw(ROUND)
    inputs, in_fix = [x, w], [fp_in, fp_w]
    if data.draw(st.booleans()):
        inputs.append(data.draw(operand((C * M,))))
        in_fix.append(fp_b)
    attrs = conv_attrs((kh, kw), (sh, sw), dil, (pt, pb, pl, pr), groups, nl, mode, 26 / 256)
    with float_products(data.draw(st.booleans())):
        assert_same(*both(op, inputs, attrs, in_fix, fp_out, (N, oh, ow, C * M)))


@settings(**SETTINGS)
@given(st.data())
def test_eltwise_add_fast_equals_integer(data):
    n = data.draw(st.integers(1, 4))
    shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 5)),
             data.draw(st.integers(1, 6)))
    dt = data.draw(st.sampled_from([np.int8, np.int8, np.int16, np.uint8]))
    xs = [data.draw(operand(shape, dt)) for _ in range(n)]
    fps = [data.draw(st.integers(-4, 12)) for _ in range(n)]
    fp_out = min(fps) + data.draw(st.integers(-40, 12))          # shifts far right (k > 30) to left shifts
    attrs = {"type": "ADD", "nonlinear": data.draw(st.sampled_from(["NONE", "RELU", "RELU6"]))}
    mode = data.draw(ROUND)
    if mode is not None:
        attrs["round_mode"] = mode
    assert_same(*both("eltwise-fix", xs, attrs, fps, fp_out, shape))


def test_accumulator_at_two_to_the_24():
    """K = 1,024 products of (-128)(-128) make exactly 2^24 (the last float32-exact integer of the single-product
    path); K = 1,025 needs two float32 chunks; both give the exact integer result."""
    for k in (1024, 1025, 4097):
        x = np.full((1, 1, 1, k), -128, np.int8)
        w = np.full((1, 1, 1, k), -128, np.int8)
        attrs = conv_attrs((1, 1), (1, 1), (1, 1), (0, 0, 0, 0), 1, "NONE", None, None)
        # fp_out chosen so that the result is acc / 2^(sc) with sc = 24 - 6: 2^24 * k / 1024 / 2^18 = 64 * k / 1024
        fast, slow = both("conv2d-fix", [x, w], attrs, [0, 0], -18, (1, 1, 1, 1))
        assert_same(fast, slow)
        assert int(fast[0, 0, 0, 0]) == min(127, (k * 16384 + (1 << 17)) >> 18)


def int_conv_acc(xp, w, groups, out_hw, stride_hw, dil_hw):
    """The exact accumulator of a conv in int64 (np.einsum on int64: no floating point), [N, OH, OW, O]."""
    oh, ow = out_hw
    (sh, sw), (dh, dw) = stride_hw, dil_hw
    O, kh, kw, ig = w.shape
    og = O // groups
    acc = np.zeros((xp.shape[0], oh, ow, O), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            sl = xp[:, ky * dh:ky * dh + (oh - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw, :]
            for g in range(groups):
                acc[..., g * og:(g + 1) * og] += np.einsum(
                    "nhwc,oc->nhwo", sl[..., g * ig:(g + 1) * ig].astype(np.int64),
                    w[g * og:(g + 1) * og, ky, kx, :].astype(np.int64))
    return acc


@settings(**SETTINGS)
@given(st.data())
def test_conv_accumulator_is_the_exact_integer(data):
    """The float accumulator of _fast.ConvGemm (float32 chunks of at most 2^24 / P terms, summed in float64) holds
    exactly the int64 sum, for reductions around and far above 1,024 terms with operands at their extremes."""
    x, w, groups, kernel_hw, stride_hw, dil_hw, (pt, pb, pl, pr), out_shape = data.draw(conv_case(True))
    xp = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    oh, ow = out_shape[1:3]
    gemm = _fast.ConvGemm(xp, w, groups, (oh, ow), stride_hw, dil_hw)
    split = data.draw(st.integers(0, oh))                          # two row blocks, as the op's row blocking
    got = np.concatenate([gemm.rows(0, split), gemm.rows(split, oh)] if 0 < split < oh else [gemm.rows(0, oh)],
                         axis=1)
    want = int_conv_acc(xp, w, groups, (oh, ow), stride_hw, dil_hw)
    assert np.all(np.abs(want) <= gemm.acc_bound)
    assert np.array_equal(got.astype(np.int64), want) and np.array_equal(got, want.astype(got.dtype))


@settings(**SETTINGS)
@given(st.data())
def test_finish_rounds_exactly(data):
    """_fast.finish_dpu_round on accumulators placed around every rounding tie of the int8 range (so that every
    low bit matters) equals the integer post-processing of ops.py, for float32 and float64 accumulators."""
    sc = data.draw(st.sampled_from([-3, -1, 0, 1, 4, 7, 10, 13, 14, 15, 16, 17, 20, 30, 45, 50]))
    sb = data.draw(st.integers(-1, 20))
    nl = data.draw(NONLINEAR)
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))
    O = 6
    bias = data.draw(operand((O,))).astype(np.int64) if data.draw(st.booleans()) else None
    # results -T..T around the saturation bounds; |acc| stays below 2^52 (the accumulators _fast forms are exact)
    T = min(data.draw(st.sampled_from([1, 2, 131])), max(1, 2 ** (50 - sc) if sc <= 50 else 1))
    target = rng.integers(-T, T + 1, (40, O))
    b2 = np.zeros(O, np.int64) if bias is None else bias << (sb + 1)
    jitter = rng.integers(-2, 3, (40, O)) + np.where(rng.random((40, O)) < 0.5, (1 << sc) if sc >= 0 else 0, 0)
    a = (target << (sc + 1)) if sc >= -1 else target >> -(sc + 1)
    acc = (a + jitter - b2) // 2                                   # 2*acc + bias*2^(sb+1) = a + jitter
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    bound = int(np.abs(acc).max()) + data.draw(st.sampled_from([0, 1, 1 << 20]))
    if dtype == np.float32 and bound > (1 << 24):
        dtype = np.float64
    slope = (26, 8) if nl in ("LEAKYRELU", "PRELU") else None
    ctx = ref_ops._Ctx("conv2d-fix", "", [], {}, [], 0, ())
    want = ref_ops._finish_conv(ctx, acc, bias, sc, sb, 0, nl, 26 / 256, slope if nl == "PRELU" else None,
                                "DPU_ROUND")
    got = _fast.finish_dpu_round(acc.astype(dtype), bound, bias, sc, sb, nl, 0, slope)
    if got is not None:
        assert_same(got, want)


@pytest.mark.slow
@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_conv2d_fast_equals_integer_many(data):
    check_conv(data, long_reductions=data.draw(st.booleans()))


@pytest.mark.parametrize("signed", [True, False])
def test_intgemm_exact_at_the_int32_limit(signed):
    """onnxruntime's MatMulInteger in the form _intgemm uses, at K = 2^17 - 1 with every product +2^14 (the sum
    2^31 - 2^14, one step below int32 overflow) and at the pair-saturation case of int16 kernels, against int64."""
    if signed and not _intgemm._cpu_has_vnni():
        pytest.skip("uint8 x int8 is used only on CPUs with VNNI")
    K = _intgemm._MAX_K
    x = np.full((3, K), -128, dtype=np.int8)
    x[1, ::2] = 127
    x[2] = np.random.default_rng(1).integers(-128, 128, K)
    w = np.full((4, K), -128, dtype=np.int8)
    w[1] = 127
    w[2, 1::2] = 127
    w[3] = np.random.default_rng(2).integers(-128, 128, K)
    got = _intgemm.IntGemm(w, signed)(x.view(np.uint8) ^ np.uint8(0x80))
    want = x.astype(np.int64) @ w.astype(np.int64).T
    assert want.max() == K << 14
    assert got.dtype == np.int32 and np.array_equal(got, want)


def test_intgemm_prepared_on_second_use_or_when_large():
    """A small layer's weights get the onnxruntime product from their second use (a model run again), a large
    one's from the first; the preparation lives as long as the weight array."""
    if _intgemm._kind() is None:
        pytest.skip("no exact MatMulInteger on this machine")
    w = np.ones((4, 1, 1, 8), np.int8)
    assert _intgemm.for_weights(w, 8, macs=100) is None
    g = _intgemm.for_weights(w, 8, macs=100)
    assert g is not None and _intgemm.for_weights(w, 8, macs=100) is g
    big = np.ones((4, 1, 1, 8), np.int8)
    assert _intgemm.for_weights(big, 8, macs=_intgemm.EAGER_MACS) is not None
    n = len(_intgemm._PREPARED)
    del w, g
    assert len(_intgemm._PREPARED) == n - 1


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 2), st.integers(1, 5), st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.integers(1, 2),
       st.integers(1, 2), st.integers(1, 20), st.integers(0, 2))
def test_im2col_uint8_kernel_equals_numpy(n, kh, kw, sh, sw, dh, dw, c, r0):
    """The golden's one-pass uint8 patch gathering (_kernels.im2col, the operand of the int8 products) equals the
    definition of the patch matrix, written out element by element: row (n, r, x), column (ky, kx, c)."""
    oh, ow = 3, 4
    hp, wp = (r0 + oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    xp = np.random.default_rng(c).integers(0, 256, (n, hp, wp, c), dtype=np.uint8)
    got = _fast._im2col(xp, r0, r0 + oh, ow, (kh, kw), (sh, sw), (dh, dw), np.uint8)
    want = np.array([[xp[b, (r0 + r) * sh + ky * dh, x * sw + kx * dw, ch]             # the definition, element
                      for ky in range(kh) for kx in range(kw) for ch in range(c)]       # by element
                     for b in range(n) for r in range(oh) for x in range(ow)], dtype=np.uint8)
    assert got.dtype == np.uint8 and got.shape == want.shape and np.array_equal(got, want)
