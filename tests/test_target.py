"""Targets: preset fingerprints (spec §3.3, typed in by hand here), decoding, arch.json, parametric targets."""
import json

import pytest

from opendpu.isa.target import PRESETS, Target, TargetError, get_target

SPEC_33 = {  # name: (PP, CP, ALU_PP, fingerprint) from spec §3.3
    "DPUCZDX8G_ISA1_B512": (4, 8, 2, 0x0101000056010200),
    "DPUCZDX8G_ISA1_B800": (4, 10, 2, 0x0101000056010201),
    "DPUCZDX8G_ISA1_B1024": (8, 8, 4, 0x0101000056010402),
    "DPUCZDX8G_ISA1_B1152": (4, 12, 2, 0x0101000056010203),
    "DPUCZDX8G_ISA1_B1600": (8, 10, 4, 0x0101000056010404),
    "DPUCZDX8G_ISA1_B2304": (8, 12, 4, 0x0101000056010405),
    "DPUCZDX8G_ISA1_B3136": (8, 14, 4, 0x0101000056010406),
    "DPUCZDX8G_ISA1_B4096": (8, 16, 4, 0x0101000056010407),
}
SPEC_22_BANKS = {  # name: (CONVW first, DWCONVW, BIAS) from spec §2.2
    "DPUCZDX8G_ISA1_B512": (8, 16, 17), "DPUCZDX8G_ISA1_B800": (8, 18, 19), "DPUCZDX8G_ISA1_B1024": (16, 24, 25),
    "DPUCZDX8G_ISA1_B1152": (8, 20, 21), "DPUCZDX8G_ISA1_B1600": (16, 26, 27), "DPUCZDX8G_ISA1_B2304": (16, 28, 29),
    "DPUCZDX8G_ISA1_B3136": (16, 30, 31), "DPUCZDX8G_ISA1_B4096": (16, 32, 33)}


@pytest.mark.parametrize("name", PRESETS)
def test_presets_match_spec(name):
    pp, cp, alu, fp = SPEC_33[name]
    t = Target.from_name(name)
    assert (t.pp, t.cp, t.alu_pp, t.fingerprint) == (pp, cp, alu, fp)
    assert (t.convw_base, t.dwconvw_bank, t.bias_bank) == SPEC_22_BANKS[name]
    assert t.peak_ops_per_cycle == int(name.split("_B")[1])
    # the generator of §3.2 reproduces the registered fingerprint from the parameters
    assert Target.parametric(pp, cp, alu).fingerprint == fp
    assert Target.from_fingerprint(fp).name == name


def test_decode_example_from_spec():
    t = Target.from_fingerprint(0x0101000016010407)       # older B4096 revision (YOLOX B4096 build)
    assert (t.pp, t.cp, t.alu_pp, t.img_bg, t.ld_augm, t.cv_lkrl, t.dw_lkrl, t.argmax) == \
        (8, 16, 4, 2, True, True, False, False)
    assert t.name == "DPUCZDX8G_ISA1_B4096_0101000016010407"
    u = Target.from_fingerprint("0x101000016010404")      # DPU-PYNQ Ultra96 arch.json = B1600 without bit 30
    assert (u.pp, u.cp, u.alu_pp) == (8, 10, 4)


@pytest.mark.parametrize("bad,msg", [(0x0201000056010407, "DPU type 2"), (0x0100000056010407, "ISA version 0"),
                                     (0x010100005601040C, "ARCH index 12"), ("0xZZ", "not a number")])
def test_bad_fingerprints(bad, msg):
    with pytest.raises(TargetError, match=msg):
        Target.from_fingerprint(bad)


def test_arch_json_both_forms(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"target": "DPUCZDX8G_ISA1_B1024"}))
    b.write_text(json.dumps({"fingerprint": "0x101000056010402"}))
    ta, tb = Target.from_arch_json(str(a)), Target.from_arch_json(str(b))
    assert ta == tb and ta.name == "DPUCZDX8G_ISA1_B1024"
    for form in ("target", "fingerprint"):
        p = tmp_path / f"w_{form}.json"
        ta.write_arch_json(str(p), form)
        assert get_target(str(p)) == ta
    (tmp_path / "c.json").write_text("{}")
    with pytest.raises(TargetError, match="needs a 'target' or a 'fingerprint'"):
        Target.from_arch_json(str(tmp_path / "c.json"))
    with pytest.raises(TargetError, match="unknown target 'B9999'"):
        get_target("B9999")


def test_parametric_targets():
    t = Target.parametric(2, 4, 2)                          # ARCH 11: encodable tiny core
    assert t.fingerprint == 0x010100005601020B and t.num_banks == 2 * 2 + 4 + 2
    u = Target.parametric(4, 8, 2, bank_depth=1024)          # depth not encodable -> no fingerprint
    assert u.fingerprint is None and "D1024" in u.name and u.bank_depth == 1024
    with pytest.raises(TargetError, match="pixel_parallel 9"):
        Target.parametric(9, 8)


def test_arch_json_timing_object(tmp_path):
    import json
    p = tmp_path / "arch.json"
    p.write_text(json.dumps({"target": "B1024", "timing": {"clock_mhz": 250, "ddr_latency": 90}}))
    t = Target.from_arch_json(str(p))
    assert (t.pp, t.cp) == (8, 8) and t.timing.clock_mhz == 250 and t.timing.ddr_latency == 90
    assert t.timing.queue_depth == 4                       # unchanged defaults
    p.write_text(json.dumps({"target": "B1024", "timing": {"clock_mhz": "fast"}}))
    with pytest.raises(TargetError, match="clock_mhz must be >= 1 and <= 2000"):
        Target.from_arch_json(str(p))
    p.write_text(json.dumps({"target": "B1024", "timing": {"ddr_latncy": 3}}))
    with pytest.raises(TargetError, match="unknown timing parameter"):
        Target.from_arch_json(str(p))


def test_clock_range_is_physical_and_in_one_place():
    """clock_mhz is 1..2000 MHz (isa.target.TIMING_BOUNDS): every route to a clock (Timing, --clock-mhz, --timing,
    sweeps) refuses 1e-30 (whose latency printed as 5.7e31 ms) and 1e6 by that one range."""
    import argparse

    from opendpu.isa.target import TIMING_BOUNDS, Timing
    from opendpu.runtime.cli import _clock_mhz_type
    from opendpu.runtime.cli.checks import CliError, timing_value
    assert TIMING_BOUNDS["clock_mhz"] == (1.0, 2000.0)
    assert Timing(clock_mhz=1).clock_mhz == 1 and Timing(clock_mhz=2000.0).clock_mhz == 2000.0
    conv = _clock_mhz_type()
    assert conv("1") == 1.0 and conv("2000") == 2000.0
    for bad in (1e-30, 0.999, 2000.5, 1e6):
        with pytest.raises(TargetError, match=f"clock_mhz must be >= 1 and <= 2000 .*got {bad!r}"):
            Timing(clock_mhz=bad)
        with pytest.raises(argparse.ArgumentTypeError, match=r"out of range \(must be in \[1, 2000\]\)"):
            conv(repr(bad))
        with pytest.raises(CliError, match=f"--timing clock_mhz={bad!r}: out of range"):
            timing_value("clock_mhz", repr(bad))
