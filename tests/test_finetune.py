"""Fast finetune with bounded memory and recalibration (quant/finetune.py; issue 30 part 4, docs/quantizer.md "Fast
finetune and bias correction: memory and defaults"). The samples stream through the float and DPU models a batch
at a time and only the sampled im2col rows are held: they equal the rows of whole activation maps, so the per-layer
decisions are those of the former in-memory version; after tuning, the activations are calibrated again with the
tuned weights. tests/test_quant.py has the older finetune and bias-correction tests."""
import numpy as np
import pytest

from opendpu.quant import finetune as FT
from opendpu.quant import quantize as Q
from opendpu.quant.emit import emit_onnx, session, value_name
from opendpu.quant.quantize import QuantConfig, quantize
from tests.test_quant import calib, rich_model

# The former in-memory fast_finetune (every activation map of every sample) on rich_model(), calib(32) with this
# config: held-out MSE after tuning per layer, and which layers kept their tuned weights.
OLD_CFG = dict(finetune_iters=500, seed=1, align_pool=True, cle=False)
OLD_LOG = [("conv1", False, 0.00019090277022870342), ("conv2", False, 0.005310991541527196),
           ("dw3", False, 0.0066247607091336), ("conv4", True, 0.0008957711871701782),
           ("se_fc1", True, 4.13702329412694e-05), ("se_fc2", True, 4.095848054000502e-05),
           ("fc", True, 2.6519704610105922e-06)]


def _sqnr(ref: dict, test: dict) -> float:
    s = sum(float(np.sum(v.astype(np.float64) ** 2)) for v in ref.values())
    e = sum(float(np.sum((ref[k].astype(np.float64) - test[k]) ** 2)) for k in ref)
    return 10 * np.log10(s / e)


def _whole_maps(prep, qp, x, mode):
    """Every op's output on all of x at once (what the former fast_finetune held)."""
    inp = prep.input_nodes[0].name
    s = session(emit_onnx(prep, mode, qp if mode == "dpu" else None, all_outputs=True))
    names = [n.name for n in prep.nodes if not (n.kind == "input" and mode == "float")]
    out = dict(zip(names, s.run([value_name(prep, n, mode) for n in names], {inp: x})))
    if mode == "float":
        out[inp] = x
    return out


def test_streamed_rows_equal_the_rows_of_whole_maps():
    x = calib(20)
    res = quantize(rich_model(), x)
    prep, qp = res.prep, res.qp
    layers = FT._layers(prep)
    assert [n.kind for n in layers].count("dwconv") == 1 and len(layers) == 7
    pos = FT.sample_positions(np.random.default_rng(0), layers, len(x), 64)
    assert all(len(p) == min(96, len(x) * n.shape[2] * n.shape[3]) for n, p in zip(layers, pos.values()))
    Xf, Xq = FT.collect_rows(prep, qp, x, layers, pos, batch=3)         # 3 does not divide 20
    for rows, mode in ((Xf, "float"), (Xq, "dpu")):
        full = _whole_maps(prep, qp, x, mode)
        for n in layers:
            want = FT._rows(full[n.inputs[0]].astype(np.float64), n, pos[n.name])
            assert rows[n.name].dtype == np.float32
            np.testing.assert_array_equal(rows[n.name], want, err_msg=f"{mode} {n.name}")
    # only the sampled rows are held: R x C_in x kh x kw per layer, float and quantized
    kh_kw = {n.name: int(np.prod(n.attrs["kernel"])) for n in layers}
    held = sum(a.size for a in Xf.values()) + sum(a.size for a in Xq.values())
    assert held == 2 * sum(len(pos[n.name]) * FT._cin(n) * kh_kw[n.name] for n in layers)
    assert held * 4 == sum(FT._row_bytes(n, pos[n.name]) for n in layers)


def test_per_layer_decisions_are_the_in_memory_versions():
    x = calib(32)
    ft = quantize(rich_model(), x, config=QuantConfig(fast_finetune=True, **OLD_CFG))
    got = [(r["layer"], r["kept"], r["mse_tuned"]) for r in ft.finetune_log]
    assert [g[:2] for g in got] == [o[:2] for o in OLD_LOG]
    np.testing.assert_allclose([g[2] for g in got], [o[2] for o in OLD_LOG], rtol=1e-9)
    # one layer per pass (a budget below any layer's rows): the same decisions, and only one layer's rows held
    layers = FT._layers(ft.prep)
    small = quantize(rich_model(), x, config=QuantConfig(**OLD_CFG))
    FT.fast_finetune(small, x, row_budget=1)
    assert small.finetune_log == ft.finetune_log
    pos = FT.sample_positions(np.random.default_rng(1), layers, 32, 1024)
    assert small.finetune_rows_held == max(FT._row_bytes(n, pos[n.name]) for n in layers) // 4
    assert ft.finetune_rows_held == sum(FT._row_bytes(n, pos[n.name]) for n in layers) // 4   # one pass here


def test_finetune_does_not_lower_the_output_sqnr():
    m, x = rich_model(), calib(32)
    plain = quantize(m, x, config=QuantConfig(**OLD_CFG))
    ft = quantize(m, x, config=QuantConfig(fast_finetune=True, **OLD_CFG))
    ref = plain.run(x, "float")                  # the float model before tuning (tuning changes ft's float weights)
    s_ptq, s_ft = _sqnr(ref, plain.run(x, "dpu")), _sqnr(ref, ft.run(x, "dpu"))
    assert s_ft >= s_ptq
    assert s_ptq == pytest.approx(ft.finetune_sqnr["before_db"], abs=1e-9)
    assert s_ft == pytest.approx(max(ft.finetune_sqnr["before_db"], ft.finetune_sqnr["after_db"]), abs=1e-9)
    assert any(r["kept"] for r in ft.finetune_log) and not ft.finetune_sqnr["reverted"]


def test_fix_points_are_recalibrated_with_the_tuned_weights(monkeypatch):
    """A 'tuning' that halves the first conv halves every activation range after it: the activation fix points move
    up by one, and equal those of a fresh quantization of the tuned float model; the weight fix point the tuned
    weights were rounded on stays. Reverted, everything is PTQ's again."""
    m, x = rich_model(), calib(32)
    plain = quantize(m, x, config=QuantConfig(cle=False))

    def tune(n, cfg, fpw, Xf, Xq, rows):
        new = (n.weight * 0.5, n.bias * 0.5) if n.name == "conv1" else None
        return {"layer": n.name, "mse_ptq": 1.0, "mse_tuned": 0.5, "kept": new is not None}, new

    monkeypatch.setattr(FT, "_tune_layer", tune)
    sq = iter([10.0, 20.0])
    monkeypatch.setattr(FT, "_output_sqnr", lambda ref, test: next(sq))
    ft = quantize(m, x, config=QuantConfig(cle=False, fast_finetune=True))
    assert not ft.finetune_sqnr["reverted"]
    assert all(ft.qp.act_fp[k] == plain.qp.act_fp[k] + 1 for k in ("conv1", "pool1"))
    fresh = quantize(ft.float_onnx(), x, config=QuantConfig(cle=False))
    assert ft.qp.act_fp == fresh.qp.act_fp
    assert ft.qp.w_fp["conv1"] == plain.qp.w_fp["conv1"]
    assert set(ft.observers) == set(plain.observers)
    np.testing.assert_array_equal(ft.qp.b_q["conv2"], fresh.qp.b_q["conv2"])
    # the same with a lower SQNR after tuning: reverted, fix points, observers and the xmodel are PTQ's
    sq = iter([20.0, 10.0])
    monkeypatch.setattr(FT, "_output_sqnr", lambda ref, test: next(sq))
    rv = quantize(m, x, config=QuantConfig(cle=False, fast_finetune=True))
    assert rv.finetune_sqnr["reverted"] and rv.qp.act_fp == plain.qp.act_fp
    assert {k: o.fix_point() for k, o in rv.observers.items()} == {k: o.fix_point() for k, o in plain.observers.items()}
    assert rv.xmodel().serialize() == plain.xmodel().serialize()


def test_quant_info_fix_points_are_not_recalibrated(monkeypatch):
    """With a quant_info file the fix points are given: fast finetune keeps them."""
    m, x = rich_model(), calib(24)
    plain = quantize(m, x, config=QuantConfig(cle=False))
    called = []
    monkeypatch.setattr(Q, "_recalibrate", lambda *a, **k: called.append(1))
    ft = quantize(m, x, config=QuantConfig(cle=False, fast_finetune=True, finetune_iters=20),
                  quant_info=plain.quant_info())
    assert not called and ft.qp.act_fp == plain.qp.act_fp
    quantize(m, x, config=QuantConfig(cle=False, fast_finetune=True, finetune_iters=20))
    assert called == [1]
