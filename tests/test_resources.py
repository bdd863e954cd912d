"""Resource model (hw/resources.py) against PG338's tables: the fit reproduces the presets it was not fitted on, the
coefficients are the hand-derived ones, and the bank arithmetic is checked by hand."""
import pytest

from opendpu.hw import resources as r
from opendpu.isa.target import Target, get_target


def test_holdout_presets_predicted_within_10_percent():
    rows = r.validate()
    held = [x for x in rows if x["held_out"]]
    assert {x["preset"] for x in held} == {"B1152", "B3136"} and len(held) == 8
    assert all(abs(x["error_pct"]) <= 10 for x in held), held
    # the training presets are reproduced too (the model is not over-parameterised: 3, 2, 1, 1 coefficients)
    assert all(abs(x["error_pct"]) < 0.5 for x in rows)


def test_coefficients_by_hand():
    """DSP (high) = MACs/4 + PP*OCP + 2: two int8 products per DSP at twice the clock, one accumulator DSP per
    output pixel and channel, 2 others; low DSP usage drops the accumulators. BRAM36 = 18-Kib halves / 2."""
    c = r.fit(["B512", "B800", "B1024", "B1600", "B2304", "B4096"])
    assert c["dsp_high"] == pytest.approx([0.25, 1.0, 2.0], abs=1e-9)
    assert c["dsp_low"] == pytest.approx([0.25, 2.0], abs=1e-9)
    assert c["bram_low"] == pytest.approx([1.0]) and c["bram_high"] == pytest.approx([1.0])


def test_bram_halves_by_hand():
    # B4096: 2*8 image + 16 CONVW + DWCONVW + BIAS = 34 banks of 2048 x 16 bytes = 256 Kib -> 15 halves (270 Kib)
    assert r.bram18_halves(get_target("B4096")) == 34 * 15
    # B512: 18 banks of 2048 x 8 bytes = 128 Kib -> 8 halves (7.1 rounded up)
    assert r.bram18_halves(get_target("B512")) == 18 * 8
    # a third image group (PG338's high RAM usage) on B1152: 3*4 + 12 + 2 = 26 banks of 192 Kib -> 11 halves
    assert r.bram18_halves(get_target("B1152"), 3) == 26 * 11 == 2 * 143


def test_estimate():
    e = r.estimate("B4096")
    assert (e["dsp"], e["bram36"], e["lut"]) == (642, 255.0, 40865)
    assert r.estimate("B4096", ram="high", dsp="low")["bram36"] == 315.0
    assert r.estimate("B4096", dsp="low")["dsp"] == 514 and r.estimate("B4096", dsp="low")["lut"] == 44583
    # our RTL's own synthesis points come back at their MACs
    assert r.estimate("B1024")["ff"] == 25520 and r.estimate("B512")["lut_ours"] == 66989
    # a parametric core: PP2 CP4, 512 lines: 32 MACs -> 8 + 8 + 2 DSP; 2*2 + 4 + 2 = 10 banks of 512 x 4 bytes
    # = 16 Kib -> 1 half each
    p = r.estimate(Target.parametric(2, 4, bank_depth=512))
    assert p["dsp"] == 18 and p["bram36"] == 5.0
    with pytest.raises(ValueError, match="ram and dsp usage are 'low' or 'high'"):
        r.estimate("B512", ram="medium")
