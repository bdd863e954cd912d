"""quant/calib.py: fixed-point arithmetic and fix-point calibration (expected values computed by hand)."""
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from opendpu.quant import calib as C
from opendpu.quant.calib import CalibError
from work_count import count_work

TIES = [-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]


# ---------------------------------------------------------------- rounding / quantize ------------
@pytest.mark.parametrize("mode,expected", [
    ("half_even", [-2, -2, 0, 0, 2, 2]),
    ("half_up", [-2, -1, 0, 1, 2, 3]),       # ties toward +inf (DPU)
    ("half_down", [-2, -1, 0, 0, 1, 2]),     # ties toward zero (nndct method 6)
    ("std_round", [-3, -2, -1, 1, 2, 3]),    # ties away from zero (C round)
    ("floor", [-3, -2, -1, 0, 1, 2]),
])
def test_round_ties(mode, expected):
    r = C.round_values(np.array(TIES), mode)
    assert r.dtype == np.float64
    assert r.tolist() == expected


@pytest.mark.parametrize("mode", C.ROUND_MODES)
def test_round_non_ties_and_near_ties(mode):
    # every mode except floor rounds non-ties to nearest; values one ulp from a tie must not flip
    below = np.nextafter(0.5, 0)            # 0.49999999999999994
    x = np.array([-2.6, -2.4, 2.4, 2.6, below, -below, 1.5 + 2**-52, -1.5 - 2**-52])
    r = C.round_values(x, mode).tolist()
    if mode == "floor":
        assert r == [-3, -3, 2, 2, 0, -1, 1, -2]
    else:
        assert r == [-3, -2, 2, 3, 0, 0, 2, -2]


def _ref_round(x, mode):
    f = Fraction(x)
    fl = math.floor(f)
    d = f - fl
    if mode == "floor" or d < Fraction(1, 2):
        return fl
    if d > Fraction(1, 2):
        return fl + 1
    return {"half_even": fl + (fl % 2), "half_up": fl + 1, "half_down": fl + (1 if f < 0 else 0),
            "std_round": fl + (0 if f < 0 else 1)}[mode]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e6, 1e6, allow_nan=False),
                          st.integers(-2000, 2000).map(lambda k: k / 2),
                          st.integers(-2000, 2000).map(lambda k: np.nextafter(k / 2, np.inf))),
                 min_size=1, max_size=20),
       st.sampled_from(C.ROUND_MODES))
def test_round_matches_exact_reference(xs, mode):
    got = C.round_values(np.array(xs, dtype=np.float64), mode)
    assert got.tolist() == [_ref_round(x, mode) for x in xs]


def test_quantize_saturation_and_narrow_range():
    x = np.array([1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 127 / 128, -127 / 128, np.inf, -np.inf])
    q = C.quantize(x, 7)
    assert q.dtype == np.int8
    assert q.tolist() == [127, -128, 127, -128, 64, -64, 127, -127, 127, -128]
    qn = C.quantize(x, 7, narrow_range=True)
    assert qn.tolist() == [127, -127, 127, -127, 64, -64, 127, -127, 127, -127]
    # 4-bit range [-8, 7]; fp = -2 means step 4
    assert C.quantize([30.0, -40.0, 6.0, -6.0, 2.0, -2.0], -2, bit_width=4).tolist() == [7, -8, 2, -1, 1, 0]
    assert C.quantize([0.5], 15, bit_width=16).dtype == np.int16
    assert C.quantize([0.5], 15, bit_width=16).tolist() == [16384]
    assert C.quantize([1e9], 0, bit_width=32).dtype == np.int32
    assert C.quantize([1e12], 0, bit_width=32).tolist() == [2**31 - 1]
    # rounding mode is applied (fp=1: 1.25 -> 2.5)
    assert C.quantize([1.25, -1.25], 1, round_mode="half_up").tolist() == [3, -2]
    assert C.quantize([1.25, -1.25], 1, round_mode="std_round").tolist() == [3, -3]
    assert C.quantize([1.25, -1.25], 1, round_mode="half_even").tolist() == [2, -2]
    with pytest.raises(CalibError):
        C.quantize([np.nan], 3)
    with pytest.raises(CalibError):
        C.quantize([1.0], 3, bit_width=1)
    with pytest.raises(CalibError):
        C.quantize([1.0], 3, round_mode="banker")


def test_dequantize_and_fake_quant():
    d = C.dequantize(np.array([127, -128, 1], np.int8), 7)
    assert d.dtype == np.float32
    assert d.tolist() == [0.9921875, -1.0, 0.0078125]
    assert C.dequantize([3], -2).tolist() == [12.0]
    fq = C.fake_quant(np.array([0.3, -5.0, 0.99999]), 7)
    assert fq.dtype == np.float32
    assert fq.tolist() == [38 / 128, -1.0, 0.9921875]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-300, 300, allow_nan=False, width=32), min_size=1, max_size=50),
       st.integers(-3, 12), st.sampled_from(C.ROUND_MODES), st.booleans(), st.sampled_from([4, 8, 16]))
def test_fake_quant_properties(xs, fp, mode, narrow, bw):
    x = np.array(xs, dtype=np.float32)
    fq = C.fake_quant(x, fp, bw, mode, narrow)
    assert np.array_equal(C.fake_quant(fq, fp, bw, mode, narrow), fq)          # idempotent
    hi = 2 ** (bw - 1) - 1
    lo = -hi if narrow else -hi - 1
    inside = (x >= lo * 2.0 ** -fp) & (x <= hi * 2.0 ** -fp)
    err = np.abs(x.astype(np.float64) - fq.astype(np.float64))
    bound = 2.0 ** -fp if mode == "floor" else 2.0 ** -(fp + 1)
    assert np.all(err[inside] <= bound)
    q = C.quantize(x, fp, bw, mode, narrow)
    assert q.min() >= lo and q.max() <= hi


# ---------------------------------------------------------------- maxmin fix point ---------------
def test_maxmin_fix_point_by_hand():
    assert C.maxmin_fix_point(1.0) == 6            # 1*64 = 64 <= 127, 1*128 = 128 > 127
    assert C.maxmin_fix_point(0.99) == 7           # 0.99*128 = 126.72 <= 127
    assert C.maxmin_fix_point(127 / 128) == 7      # exactly 127
    assert C.maxmin_fix_point(np.nextafter(127 / 128, 1)) == 6
    assert C.maxmin_fix_point(127.0) == 0
    assert C.maxmin_fix_point(128.0) == -1
    assert C.maxmin_fix_point(1000.0) == -3        # 1000/8 = 125 <= 127, 1000/4 = 250
    assert C.maxmin_fix_point(1.0, bit_width=16) == 14   # 16384 <= 32767 < 32768
    assert C.maxmin_fix_point(1.0, bit_width=4) == 2     # 4 <= 7 < 8
    # cap (vai_q max_fix_position): 12 for <= 8 bits, 15 above
    assert C.maxmin_fix_point(1e-6) == 12
    assert C.maxmin_fix_point(1e-6, max_fp=None) == 26   # 1e-6*2^26 = 67.1, *2^27 = 134.2
    assert C.maxmin_fix_point(1e-6, bit_width=16) == 15
    assert C.maxmin_fix_point(1e-6, max_fp=9) == 9
    # absmax 0: the cap, or bit_width-1 without a cap
    assert C.maxmin_fix_point(0.0) == 12
    assert C.maxmin_fix_point(0.0, bit_width=16) == 15
    assert C.maxmin_fix_point(0.0, max_fp=None) == 7
    assert C.maxmin_fix_point(1e-310, max_fp=None) > 1000   # subnormal input is handled
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(CalibError):
            C.maxmin_fix_point(bad)


# ---------------------------------------------------------------- weights ------------------------
def test_weight_fix_point_diffs_prefers_one_step_up():
    # outlier 1.0 -> maxmin fp 6. The small values are odd multiples of 1/128.
    # fp 6: 1.0 exact; each small value is a tie at step 1/64 -> |err| = 1/128, sq = 1/16384 each
    #       -> E6 = N/16384
    # fp 7: 1.0 clips to 127/128 -> sq = 1/16384; small values exact -> E7 = 1/16384
    # fp 8: 1.0 clips to 127/256 -> sq = (129/256)^2 = 0.254 -> E8 >> E7 (fp 9, 10 are worse still)
    small = np.array([1, -3, 5, -7, 3, 1], dtype=np.float64) / 128        # N = 6
    w = np.concatenate([[1.0], small])
    for mode in C.ROUND_MODES[:4]:
        assert C.weight_fix_point(w, "diffs", round_mode=mode) == 7
        assert C.weight_fix_point(w, "mse", round_mode=mode) == 7
    assert C.weight_fix_point(w, "maxmin") == 6
    assert C.weight_fix_point(w, "percentile") == 7    # falls back to diffs
    assert C.weight_fix_point(w, "entropy") == 7
    # N = 1: E6 = E7 = 1/16384 exactly -> the tie goes to the smaller fp
    assert C.weight_fix_point(np.array([1.0, 1 / 128]), "diffs") == 6
    # float32 input and odd shapes give the same answer
    assert C.weight_fix_point(w.astype(np.float32).reshape(7, 1), "diffs") == 7
    # all-zero tensor -> cap
    assert C.weight_fix_point(np.zeros(5)) == 12
    assert C.weight_fix_point(np.zeros(5), bit_width=16, max_fp=None) == 15


def test_weight_fix_point_errors():
    with pytest.raises(CalibError, match="conv1.weight"):
        C.weight_fix_point(np.array([1.0, np.nan]), name="conv1.weight")
    with pytest.raises(CalibError, match="METHOD|method"):
        C.weight_fix_point(np.ones(3), method="kl")
    with pytest.raises(CalibError):
        C.weight_fix_point(np.zeros(0))


def _numpy_sse(x, fp, mode, narrow=False):
    return float(((x.astype(np.float64) - C.fake_quant(x, fp, 8, mode, narrow).astype(np.float64)) ** 2).sum())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", C.ROUND_MODES)
def test_diffs_search_matches_numpy_definition(dtype, mode):
    rng = np.random.default_rng(5)
    x = (rng.laplace(0, 1, 20000)).astype(dtype)
    x[:200] = np.round(x[:200] * 16) / 16 + 1 / 32          # many exact ties at fp 4, 5
    m = C.maxmin_fix_point(np.abs(x).max())
    errs = [_numpy_sse(x, fp, mode) for fp in range(m, m + 5)]
    want = m + int(np.argmin(errs))
    assert C.weight_fix_point(x, "diffs", round_mode=mode) == want
    o = C.make_observer("t", "diffs", round_mode=mode)
    o.update(x)
    assert o.fix_point() == want


# ---------------------------------------------------------------- observers ----------------------
def test_observer_maxmin_running_max():
    o = C.make_observer("act", "maxmin")
    assert o.statistic == "max"
    for b in (np.array([0.1, -0.3]), np.array([-0.6, 0.4]), np.array([[0.2, 0.0], [-0.05, 0.01]])):
        o.update(b)
    assert o.absmax == 0.6
    assert o.fix_point() == 7                          # 0.6*128 = 76.8, *256 = 153.6
    assert o.state()["batch_fix_points"] == [8, 7, 9]  # 0.3*256=76.8; 0.6*128; 0.2*512=102.4
    o.update(np.array([3.0]))                          # 3*32 = 96, *64 = 192
    assert o.fix_point() == 5 and o.absmax == 3.0
    om = C.make_observer("act", "maxmin", statistic="median")
    for a in (0.3, 0.2, 0.6):                           # fps 8, 9, 7 -> median 8
        om.update(np.array([a]))
    assert om.fix_point() == 8


def _uniform_batch(fp, rng, n=4000):
    # uniform in [-0.9, 0.9] * 2^(7-fp): diffs = maxmin = fp (any larger fp clips a large share)
    return (rng.uniform(-0.9, 0.9, n) * 2.0 ** (7 - fp)).astype(np.float32)


@pytest.mark.parametrize("fps,statistic,expected", [
    ([6, 8, 8, 5], "modal", 8),
    ([7, 7, 6, 6, 8], "modal", 6),          # tie 7/6 -> smaller
    ([6, 8, 8, 5], "max", 5),               # largest range = smallest fp
    ([6, 8, 8, 5], "mean", 7),              # 27/4 = 6.75
    ([6, 7], "mean", 6),                    # 6.5 -> smaller
    ([6, 8, 8, 5, 9], "median", 8),
    ([6, 8, 8, 5], "median", 7),            # (6+8)/2
    ([6, 7, 9, 5], "median", 6),            # (6+7)/2 = 6.5 -> smaller
])
def test_diffs_statistics(fps, statistic, expected):
    rng = np.random.default_rng(1)
    o = C.make_observer("layer1.out", "diffs", statistic=statistic)
    for fp in fps:
        o.update(_uniform_batch(fp, rng))
    st_ = o.state()
    assert st_["batch_fix_points"] == fps
    assert o.fix_point() == expected
    assert st_["fix_point"] == expected
    json.dumps(st_)


def test_diffs_zero_batch_and_empty_batch():
    o = C.make_observer("z", "diffs")
    o.update(np.zeros((2, 3), np.float32))
    o.update(np.zeros(0, np.float32))                 # ignored
    assert o.batches == 1 and o.fix_point() == 12


def _laplace_sample():
    return np.random.default_rng(3).laplace(0, 1, 400_000).astype(np.float32)


def test_mse_entropy_on_heavy_tails():
    x = _laplace_sample()
    m = C.maxmin_fix_point(np.abs(x).max())
    for method in ("mse", "entropy", "diffs"):
        o = C.make_observer("lap", method)
        for b in np.array_split(x, 4):
            o.update(b)
        assert o.fix_point() >= m
    # mse for Laplace(1): clipping at 127/16 = 7.9 beats no clipping (E4 < E3, see exact sums)
    o = C.make_observer("lap", "mse")
    o.update(x)
    assert m == 3 and o.fix_point() == 4
    exact = [_numpy_sse(x, fp, "half_up") for fp in range(m, m + 5)]
    est = o._mse_fp()[1]
    assert np.allclose(est, exact, rtol=1e-3)
    # one far outlier: every error-minimising method clips it
    g = np.random.default_rng(4).standard_normal(200_000).astype(np.float32)
    g[17] = 50.0
    m = C.maxmin_fix_point(50.0)
    assert m == 1
    for method in ("mse", "entropy", "diffs"):
        o = C.make_observer("g", method)
        o.update(g)
        assert o.fix_point() > m, method


@pytest.mark.parametrize("method", ["mse", "entropy", "diffs", "percentile", "maxmin"])
def test_uniform_picks_maxmin(method):
    x = np.random.default_rng(6).uniform(-0.9, 0.9, 300_000).astype(np.float32)
    o = C.make_observer("u", method)
    o.update(x)
    assert o.fix_point() == 7 == C.maxmin_fix_point(np.abs(x).max())


def test_percentile_known_value():
    # |x| = k/1e6 for k = 1..1e6, half of them negated: the p-th percentile is p/100
    v = np.arange(1, 1_000_001) / 1e6
    v[::2] *= -1
    o = C.make_observer("p", "percentile", percentile=25.0)
    o.update(v)
    _, w, _ = o.histogram()
    assert w == 2.0 / 2048                                     # R = 2 (absmax 1.0)
    assert abs(o.value_at_percentile() - 0.25) <= w
    assert abs(o.value_at_percentile(99.0) - 0.99) <= w
    assert abs(o.value_at_percentile(25.05) - 0.2505) < 1e-5   # interpolated inside the bin
    assert o.fix_point() == 8                                  # 0.25*256 = 64, *512 = 128 > 127
    # 0.4965*256 = 127.1 > 127 -> 7 (the bin's left edge 508*w = 127/256 would give 8)
    o2 = C.make_observer("p", "percentile", percentile=49.65)
    o2.update(v)
    assert o2.fix_point() == 7
    # outliers above the percentile are ignored: 0.1 % of the data at 40..50
    x = np.concatenate([np.linspace(-0.6, 0.6, 999_000), np.linspace(40, 50, 1000)])
    o = C.make_observer("p", "percentile", percentile=99.8)
    o.update(x)
    assert abs(o.value_at_percentile() - 0.6 * 998 / 999) <= 50 * 2 / 2048 * 2
    assert o.fix_point() == 7                                  # ~0.6*128 = 76.8; maxmin would give 1
    o100 = C.make_observer("p", "percentile", percentile=100.0)
    o100.update(x)
    assert o100.value_at_percentile() == 50.0
    assert o100.fix_point() == 1
    # exact zeros count toward the percentile
    oz = C.make_observer("z", "percentile", percentile=50.0)
    oz.update(np.concatenate([np.zeros(600), np.ones(400)]))
    assert oz.value_at_percentile() == 0.0 and oz.fix_point() == 12


def test_histogram_rebinning_is_exact():
    rng = np.random.default_rng(7)
    batches = [rng.standard_normal(20_000).astype(np.float32) * s for s in (0.01, 0.3, 1.0, 7.0, 300.0)]
    batches.insert(0, np.zeros(100, np.float32))               # all-zero first batch
    batches[3][:50] = 0.0
    for method in ("mse", "entropy", "percentile"):
        inc = C.make_observer("h", method)
        for b in batches:
            inc.update(b)
        one = C.make_observer("h", method)
        one.update(np.concatenate(batches))
        hi, wi, zi = inc.histogram()
        ho, wo, zo = one.histogram()
        top = max(float(np.abs(b).max()) for b in batches)
        assert 1000 < top < 2048                                   # -> R = 2048
        assert wi == wo == 2048 / 2048 and zi == zo == 150
        assert np.array_equal(hi, ho)
        assert hi.sum() + zi == sum(b.size for b in batches)
        assert inc.fix_point() == one.fix_point()
        if method == "percentile":
            assert abs(inc.value_at_percentile(90) - one.value_at_percentile(90)) <= wi
    # a jump larger than the whole histogram collapses everything into bin 0
    o = C.make_observer("h", "mse", bins=16)
    o.update(np.array([0.1, -0.2, 0.3]))
    o.update(np.array([1000.0]))
    h, w, _ = o.histogram()
    assert w == 1024 / 16 and h[0, 0] == 2 and h[1, 0] == 1 and h[0, 15] == 1


def test_entropy_skips_candidates_finer_than_a_bin():
    # 256 bins over R = 64 (w = 1/4). maxmin fp 1: T = 128 * 2^-fp = 64, 32, 16, 8, 4 -> i = 256, 128,
    # 64, 32, 16 bins. Only i >= 128 (fp 1, 2) can show rounding loss; fp 2 clips just the outlier.
    g = np.random.default_rng(0).standard_normal(200_000).astype(np.float32)
    g[17] = 50.0
    o = C.make_observer("e", "entropy", bins=256)
    o.update(g)
    assert o.histogram()[1] == 0.25
    assert o.fix_point() == 2
    assert [fp for fp, _ in o._entropy_fp()[1]] == [1, 2]


def test_kernel_rounding_matches_round_values():
    x = np.array(TIES + [-0.49999999999999994, 0.49999999999999994, -3.7, 3.2])
    for code, mode in enumerate(C.ROUND_MODES):
        assert [C._round_scalar(float(v), code) for v in x] == C.round_values(x, mode).tolist()


def test_histogram_layout():
    o = C.make_observer("h", "mse", bins=8)
    o.update(np.array([0.5, -0.25, -0.25, 0.0, 0.0, 0.99, -0.01], np.float32))
    h, w, z = o.histogram()                      # R = 1, w = 1/8
    assert w == 0.125 and z == 2
    assert h[0].tolist() == [0, 0, 0, 0, 1, 0, 0, 1]
    assert h[1].tolist() == [1, 0, 2, 0, 0, 0, 0, 0]


def test_histogram_memory_is_fixed():
    o = C.make_observer("h", "entropy", bins=256)
    for k in range(20):
        o.update(np.random.default_rng(k).standard_normal(1000) * (k + 1))
    h, _, _ = o.histogram()
    assert h.shape == (2, 256) and o.state()["batches"] == 20


# ---------------------------------------------------------------- errors -------------------------
def test_nan_inf_name_tensor_and_batch():
    o = C.make_observer("backbone.relu3", "diffs")
    o.update(np.ones(4, np.float32))
    bad = np.ones(4, np.float32)
    bad[2] = np.nan
    with pytest.raises(CalibError, match=r"backbone\.relu3.*batch 1"):
        o.update(bad)
    for method in C.METHODS:
        ob = C.make_observer("t9", method)
        with pytest.raises(CalibError, match="t9.*batch 0.*NaN/Inf"):
            ob.update(np.array([1.0, -np.inf]))


@pytest.mark.parametrize("method,statistic", [("maxmin", "modal"), ("mse", "modal"), ("entropy", "modal"),
                                              ("percentile", "modal"), ("diffs", "mode"), ("maxmin", "avg")])
def test_bad_method_statistic_combos(method, statistic):
    with pytest.raises(CalibError, match="x1"):
        C.make_observer("x1", method, statistic=statistic)


def test_unknown_method_lists_methods():
    with pytest.raises(CalibError) as ei:
        C.make_observer("x2", "kl_divergence")
    for m in C.METHODS:
        assert m in str(ei.value)
    with pytest.raises(CalibError):
        C.Observer("x2", method="minmax")


def test_other_parameter_errors():
    for kw in ({"bins": 1000}, {"percentile": 0}, {"percentile": 101}, {"bit_width": 40},
               {"round_mode": "nearest"}):
        with pytest.raises(CalibError):
            C.make_observer("x3", "mse", **kw)
    # non-modal statistics are accepted and ignored by histogram methods
    assert C.make_observer("x3", "mse", statistic="max").statistic == "max"


def test_fix_point_before_update():
    for method in C.METHODS:
        o = C.make_observer("head.out", method)
        with pytest.raises(CalibError, match="head.out.*NO_CALIBRATION"):
            o.fix_point()
        assert o.state()["fix_point"] is None


def test_state_is_json():
    for method in C.METHODS:
        o = C.make_observer("s", method)
        o.update(np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float16))
        s = json.loads(json.dumps(o.state()))
        assert s["method"] == method and s["batches"] == 1 and s["fix_point"] == o.fix_point()


PASSES = {"maxmin": 1, "diffs": 1 + C.DIFFS_SCOPE, "percentile": 2, "mse": 2, "entropy": 2}


def test_update_cost(monkeypatch):
    """update() is a fixed number of passes of the compiled kernels over the data (max |x|; DIFFS_SCOPE squared-error
    sums for diffs; one histogram for the histogram methods) and its Python work does not depend on the data's size
    (tests/work_count.py): 8 M values cost what 12 do (a loop over them in Python would be millions of lines). Wall
    times: benchmarks/bench_checks.py."""
    import numba
    visited = []
    for k in ("_absmax_kernel", "_sse_kernel", "_hist_kernel"):
        kernel = getattr(C, k)
        assert isinstance(kernel, numba.core.registry.CPUDispatcher), k      # compiled, not a Python loop

        def counted(flat, *args, _kernel=kernel):
            visited.append(flat.size)
            return _kernel(flat, *args)
        monkeypatch.setattr(C, k, counted)
    x = np.random.default_rng(0).standard_normal((10, 64, 112, 112), dtype=np.float32)   # 8 M values
    for method in C.METHODS:
        o = C.make_observer("speed", method)
        o.update(x)                                              # first use (range set, kernels loaded): not counted
        visited.clear()
        with count_work() as big:
            o.update(x)
        assert sum(visited) == PASSES[method] * x.size, (method, visited)
        with count_work() as small:
            o.update(x[:1, :1, :1, :12])
        print(f"{method}: 8 M values {big}, 12 values {small}")
        assert big.total <= 1.5 * small.total, (method, str(big), str(small))
