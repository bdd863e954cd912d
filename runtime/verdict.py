"""The accuracy verdict of `opendpu build` (issue 30 part 5): the compiled INT8 model against the float ONNX model
on samples not used for calibration, and the first layer where the quantizer's per-layer SQNR collapses.

Hold-out rule: with N >= HOLDOUT_MIN calibration samples and no --evaluate data, the last max(2, N // 8) samples
are kept apart and the quantizer calibrates on the rest; below that every sample calibrates and the verdict is
measured on the calibration samples (and says so)."""
from __future__ import annotations

import math

HOLDOUT_MIN = 16          # fewer calibration samples than this: nothing is held out
COLLAPSE_DB = 10.0        # a layer below this SQNR (dB) has collapsed
DROP_DB = 10.0            # ... or one below DROP_CEIL_DB that is this much below its input's
DROP_CEIL_DB = 20.0
INPUT_CAP_DB = 60.0       # an input's SQNR counted at most this (an exact input is not a 10 dB cliff)
NOISE_DB = 3.0            # an output below this (error power over half the signal's) does not follow float: warned


def holdout(n: int) -> int:
    """How many of `n` calibration samples (the last ones) are held out for the verdict; 0 below HOLDOUT_MIN."""
    return max(2, n // 8) if n >= HOLDOUT_MIN else 0


def first_collapse(report: dict) -> dict | None:
    """The first layer (topological order of the quantize report's `layers`) whose SQNR is below COLLAPSE_DB, or
    below DROP_CEIL_DB and more than DROP_DB below its lowest input's; with the likely reasons and what helps."""
    rows = report.get("layers") or []
    sq = {r["layer"]: r["sqnr_db"] for r in rows}
    for r in rows:
        s = r["sqnr_db"]
        if s is None or math.isinf(s):
            continue
        ins = [min(sq[i], INPUT_CAP_DB) for i in r.get("inputs") or () if i in sq and sq[i] is not None]
        ref = min(ins) if ins else None
        if not (s < COLLAPSE_DB or (s < DROP_CEIL_DB and ref is not None and ref - s > DROP_DB)):
            continue
        name = r["layer"]
        why = []
        if r.get("device") == "CPU":
            why.append("a CPU op")
        w = r.get("weight_fix_point")
        if w is not None:
            why.append(f"weights at fix point {w} (step 2^{-w}, range ±{128 * 2.0 ** -w:.4g})")
        b = r.get("bias_fix_point")
        if b is not None:
            why.append(f"bias at fix point {b} (range ±{128 * 2.0 ** -b:.4g})")
        if r.get("fix_point") is not None:
            why.append(f"output fix point {r['fix_point']}")
        for a in report.get("adjustments") or ():
            if a.get("tensor") in (name, name + "_weights"):
                why.append(f"{a['tensor']} fix point {a['from']} -> {a['to']} by a rule ({a['rule']})")
        lsb = r.get("max_err_lsb")
        if lsb is not None and lsb >= 16:
            why.append(f"max error {lsb:.0f} LSB of its output")
        cle = (report.get("config") or {}).get("cle", True)
        helps = [f"--exclude-nodes {name} (keep it float on the CPU)",
                 "CLE (on by default)" if cle else "CLE (drop --no-cle)", "--fast-finetune"]
        return {"layer": name, "kind": r.get("kind"), "sqnr_db": s, "input_sqnr_db": ref, "reasons": why,
                "helps": helps}
    return None


def verdict(rep: dict, where: str, collapse: dict | None, min_sqnr: float | None) -> dict:
    """The verdict dict (accuracy.json) from a `Comparison.run()` report."""
    outs = [{"name": o["name"], "sqnr_db": o["sqnr_db"] if math.isfinite(o["sqnr_db"]) else None,
             "exact": o["sqnr_db"] == math.inf, "float_all_zero": o["sqnr_db"] == -math.inf}
            for o in rep["outputs"]]
    low = min((o["sqnr_db"] for o in rep["outputs"]), default=math.inf)
    v = {"samples": rep["samples"], "data": where, "backend": rep["backend"], "task": rep["task"],
         "outputs": outs, "min_sqnr_db": low if math.isfinite(low) else None, "_low": low,
         "collapsed": low < NOISE_DB, "first_collapse": collapse, "min_sqnr_floor": min_sqnr,
         "below_floor": min_sqnr is not None and low < min_sqnr}
    if rep["task"] == "classify":
        v["top1_agreeing"] = rep["metric"]["agreeing"]
    return v


def not_measured(why: str, where: str, collapse: dict | None, min_sqnr: float | None) -> dict:
    """The verdict when the float model cannot be run beside the compiled one (a floor is then not met)."""
    return {"samples": 0, "data": where, "backend": "ref", "task": None, "outputs": [], "min_sqnr_db": None,
            "collapsed": False, "first_collapse": collapse, "min_sqnr_floor": min_sqnr,
            "below_floor": min_sqnr is not None, "not_measured": why}


def format_verdict(v: dict) -> list[str]:
    """The summary lines: the verdict, then the collapsing layer (if any) and its reasons and remedies."""
    outs = "; ".join(f"output '{o['name']}' SQNR " + ("inf (exact)" if o["exact"] else "-inf (float output all "
                                                      "zero)" if o["float_all_zero"] else f"{o['sqnr_db']:.1f} dB")
                     for o in v["outputs"])
    line = f"accuracy vs float (compiled model on {v['backend']}) on {v['samples']} {v['data']}: {outs}"
    if v.get("not_measured"):
        line = f"accuracy vs float: not measured: {v['not_measured']}"
    elif "top1_agreeing" in v:
        line += f"; top-1 agreement {v['top1_agreeing']}/{v['samples']}"
    lines = [line]
    c = v["first_collapse"]
    if c is not None:
        lines.append(f"  first collapsing layer (quantize report): {c['layer']} ({c['kind']}) SQNR "
                     f"{c['sqnr_db']:.1f} dB" + ("" if c["input_sqnr_db"] is None
                                                 else f", its input {c['input_sqnr_db']:.1f} dB")
                     + ("; " + "; ".join(c["reasons"]) if c["reasons"] else ""))
        lines.append("  what helps: " + ", ".join(c["helps"]))
    return lines
