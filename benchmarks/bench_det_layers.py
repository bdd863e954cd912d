"""Layer by layer: why PP-OCRv4 det collapses without cross-layer equalization (issue 30; docs/quantizer.md "Why
PP-OCRv4 det collapses without CLE").

Quantizes `ch_PP-OCRv4_det_infer.onnx` (the pinned rapidocr-onnxruntime==1.4.4 wheel) on `--calib` rendered pages
(tests/ocr_data.py, seed `--seed` + 1000, as benchmarks/bench_ocr.py) with CLE off and on, runs the float model and
the quantizer's INT8 emulation (QuantResult.run, "dpu": fake-quant of the DPU's arithmetic) on `--eval` other pages
(seed + 2000; 8 as bench_ocr) and prints, per prepared layer in graph order, for each of the two builds:

* `SQNR`: the layer's INT8 output against its float output, each with its own inputs as the model runs them (the
  quantize report's per-layer SQNR, `QuantResult.layer_errors`, summed over the evaluation pages);
* `wfp`: the weight fix point; `spr`: the spread of the per-output-channel weight ranges, log2(max / min) over the
  live channels (range above 2^-20 of the largest, as quant/cle.py counts them); `0ch`: output channels whose INT8
  weights are all zero at that fix point, of all channels;
* `fp`: the activation (output) fix point; `rms`: the float output's RMS in LSBs of that fix point (how many
  INT8 levels the signal spans); `sat%`: the share of INT8 outputs at the rails (-128 or 127);

then, per build, the detector's figures on the evaluation pages: mean IoU of the binarised text map (p > 0.3) of
INT8 against float and the output SQNR. `--exclude-each A,B,...` adds CLE-off builds with one ONNX node each kept
float (QuantConfig.nodes_to_exclude), one summary line each; `--exclude` keeps nodes float in every build;
`--capped` adds a CLE-off build with vai_q's weight fix-point cap of 12 everywhere (QuantConfig.weight_fp_lift
False): the collapse as it was before the quantizer lifted the cap where it zeroes a layer.
`--rows all|changed|head` picks the table rows (head: from the FPN's concat on). One build at a time (a 320×640 det
quantize peaks near 6 GB)."""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

import ocr_data  # noqa: E402  (tests/ocr_data.py)
from opendpu.quant.conv_params import CONV_KINDS  # noqa: E402
from opendpu.runtime.compare import _sqnr as _db  # noqa: E402  (SQNR in dB from summed squares)

DET_THRESH = 0.3                    # rapidocr config.yaml Det.thresh
DEAD = 2.0 ** -20                   # quant/cle.py: a channel below this share of the largest range is dead




def weight_stats(res, n) -> dict:
    """Weight fix point, per-output-channel range spread (log2), all-zero INT8 channels."""
    w = n.weight
    axis = 1 if n.kind == "tconv" else 0            # tconv [Cin, Cout, kh, kw]; conv / dwconv [O, ...]
    r = np.abs(np.moveaxis(w, axis, 0)).reshape(w.shape[axis], -1).max(1)
    live = r[r > DEAD * r.max()] if r.max() > 0 else r
    spread = float(np.log2(live.max() / live.min())) if live.size and live.min() > 0 else float("nan")
    wq = res.qp.w_q[n.name]
    zero = int(np.sum(np.abs(np.moveaxis(wq, axis, 0)).reshape(wq.shape[axis], -1).max(1) == 0))
    return {"wfp": res.qp.w_fp[n.name], "spread": spread, "zero_ch": zero, "channels": int(w.shape[axis]),
            "bfp": res.qp.b_fp.get(n.name)}


def layer_table(res, xe: np.ndarray) -> tuple[dict[str, dict], np.ndarray, np.ndarray]:
    """Per-layer rows (SQNR, fix points, saturation, ...) over the pages xe, one page at a time; and the model's
    first output, float and INT8, stacked."""
    names = [n.name for n in res.prep.nodes if n.kind != "input"]
    acc = {k: {"sig": 0.0, "err": 0.0, "sat": 0, "cnt": 0} for k in names}
    out = res.prep.outputs[0]
    fo, qo = [], []
    for i in range(len(xe)):
        f = res.run(xe[i:i + 1], "float", names)
        q = res.run(xe[i:i + 1], "dpu", names)
        for k in names:
            a, b = f[k].astype(np.float64), q[k].astype(np.float64)
            s = acc[k]
            s["sig"] += float(np.sum(a * a))
            s["err"] += float(np.sum((a - b) ** 2))
            s["cnt"] += a.size
            fp = res.qp.act_fp.get(k)
            if fp is not None and res.prep.node(k).quantized:
                iq = np.round(b * 2.0 ** fp)
                s["sat"] += int(np.sum((iq >= 127) | (iq <= -128)))
        fo.append(f[out])
        qo.append(q[out])
        del f, q
    rows = {}
    for n in res.prep.nodes:
        if n.kind == "input":
            continue
        s = acc[n.name]
        fp = res.qp.act_fp.get(n.name) if n.quantized else None
        row = {"kind": n.kind, "device": n.device, "act": n.act, "sqnr": _db(s["sig"], s["err"]), "fp": fp,
               "rms_lsb": math.sqrt(s["sig"] / s["cnt"]) * 2.0 ** fp if fp is not None else None,
               "sat_pct": 100.0 * s["sat"] / s["cnt"] if fp is not None else None, "sources": list(n.sources)}
        if n.kind in CONV_KINDS and n.quantized:
            row.update(weight_stats(res, n))
        rows[n.name] = row
    return rows, np.concatenate(fo), np.concatenate(qo)


def det_figures(fl: np.ndarray, q: np.ndarray) -> dict:
    bf, bq = fl > DET_THRESH, q > DET_THRESH
    inter = (bf & bq).sum(axis=(1, 2, 3))
    union = (bf | bq).sum(axis=(1, 2, 3))
    iou = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
    e = fl.astype(np.float64) - q
    sig = float(np.sum(fl.astype(np.float64) ** 2))
    return {"iou": float(iou.mean()), "iou_min": float(iou.min()), "out_sqnr": _db(sig, float(np.sum(e * e))),
            "text_pct_float": float(bf.mean() * 100), "text_pct_int8": float(bq.mean() * 100),
            "max_prob_int8": float(q.max())}


def build(model: str, xc: np.ndarray, hw, target: str, cle: bool, exclude=(), seed: int = 0, capped: bool = False):
    """quantize (the quantizer's defaults but `cle` and `exclude`); `capped`: vai_q's weight fix-point cap of 12
    everywhere (QuantConfig.weight_fp_lift False; by default a layer the cap would mostly zero is lifted)."""
    from opendpu.quant import quantize as Q
    cfg = Q.QuantConfig(cle=cle, nodes_to_exclude=tuple(exclude), seed=seed, weight_fp_lift=not capped)
    t0 = time.perf_counter()
    res = Q.quantize(model, xc, target=target, config=cfg, input_shape=[1, 3, *hw])
    return res, time.perf_counter() - t0


def _f(v, fmt: str, width: int) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(width)
    if isinstance(v, float) and math.isinf(v):
        return ("inf" if v > 0 else "-inf").rjust(width)
    return format(v, fmt).rjust(width)


def _cols(r: dict | None) -> str:
    if r is None:
        return " " * 43
    zc = f"{r['zero_ch']}/{r['channels']}" if "zero_ch" in r else None
    return (f"{_f(r.get('wfp'), 'd', 3)} {_f(r.get('spread'), '.1f', 4)} {_f(zc, 's', 6)} {_f(r['fp'], 'd', 3)} "
            f"{_f(r['rms_lsb'], '.1f', 6)} {_f(r['sat_pct'], '.2f', 5)} {_f(r['sqnr'], '.1f', 6)}")


def print_table(off: dict, on: dict, rows: str) -> None:
    names = list(off)
    if rows == "head":
        cat = [k for k in names if off[k]["kind"] == "concat"]
        names = names[names.index(cat[-1]):] if cat else names
    hdr = f"{'wfp':>3s} {'spr':>4s} {'0ch':>6s} {'fp':>3s} {'rms':>6s} {'sat%':>5s} {'SQNR':>6s}"
    print(f"{'':52s} | {'CLE off':^43s} | {'CLE on':^43s}")
    print(f"{'layer':40s} {'kind':7s} {'act':3s} | {hdr} | {hdr}")
    for k in names:
        a, b = off[k], on.get(k)
        if rows == "changed" and b is not None and a.get("wfp") == b.get("wfp") and a["fp"] == b["fp"] \
                and abs(a["sqnr"] - b["sqnr"]) < 3:
            continue
        act = {"NONE": "", "RELU": "r", "RELU6": "r6", "LEAKYRELU": "lr"}.get(a["act"], a["act"][:3])
        print(f"{k[-40:]:40s} {a['kind'][:7]:7s} {act:3s} | {_cols(a)} | {_cols(b)}")


def show_fig(tag: str, fig: dict, secs: float) -> None:
    print(f"{tag:44s} IoU {fig['iou']:.3f} (min {fig['iou_min']:.3f})  output SQNR {fig['out_sqnr']:6.2f} dB  "
          f"text px float {fig['text_pct_float']:.2f} % INT8 {fig['text_pct_int8']:.2f} %  "
          f"max p {fig['max_prob_int8']:.3f}  ({secs:.0f} s)", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hw", default="320x640", help="page H x W (multiples of 32)")
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--eval", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default="DPUCZDX8G_ISA1_B4096")
    ap.add_argument("--rows", choices=("all", "changed", "head"), default="all")
    ap.add_argument("--exclude", default="", metavar="NAME[,NAME]", help="ONNX nodes kept float in every build")
    ap.add_argument("--exclude-each", default="", metavar="NAME[,NAME]",
                    help="extra CLE-off builds, one per node kept float (summary lines only)")
    ap.add_argument("--capped", action="store_true",
                    help="also a CLE-off build with vai_q's weight fix-point cap of 12 everywhere")
    ap.add_argument("--no-table", action="store_true", help="only the summary lines")
    a = ap.parse_args(argv)
    model = ocr_data.model_path(ocr_data.DET_MODEL)
    if model is None:
        print("bench_det_layers: ch_PP-OCRv4_det_infer.onnx not found: pip install --no-deps "
              "rapidocr-onnxruntime==1.4.4 (requirements-models.txt)", file=sys.stderr)
        return 2
    h, w = (int(v) for v in a.hw.lower().split("x"))
    hw = (h, w)
    xc = ocr_data.text_pages(a.calib, seed=a.seed + 1000, hw=hw)
    xe = ocr_data.text_pages(a.eval, seed=a.seed + 2000, hw=hw)
    excl = [s for s in a.exclude.split(",") if s]
    print(f"PP-OCRv4 det, {hw[0]}x{hw[1]} pages: {a.calib} calibration, {a.eval} evaluation; target {a.target}"
          + (f"; float in every build: {', '.join(excl)}" if excl else ""), flush=True)
    tables, figs = {}, {}
    for cle in (False, True):
        tag = "CLE " + ("on" if cle else "off")
        res, secs = build(model, xc, hw, a.target, cle, excl, a.seed)
        rows, fl, q = layer_table(res, xe)
        tables[cle], figs[cle] = rows, det_figures(fl, q)
        show_fig(tag, figs[cle], secs)
        del res
    extra = [(f"CLE off, float: {n}", [n], False) for n in a.exclude_each.split(",") if n]
    if a.capped:
        extra.append(("CLE off, vai_q's weight cap of 12 everywhere", [], True))
    for tag, more, capped in extra:
        res, secs = build(model, xc, hw, a.target, False, excl + more, a.seed, capped)
        out = res.prep.outputs[0]
        fl = np.concatenate([res.run(xe[i:i + 1], "float", [out])[out] for i in range(len(xe))])
        q = np.concatenate([res.run(xe[i:i + 1], "dpu", [out])[out] for i in range(len(xe))])
        show_fig(tag, det_figures(fl, q), secs)
        del res
    if not a.no_table:
        print()
        print("per layer (graph order): wfp weight fix point, spr log2 spread of the per-channel weight ranges, "
              "0ch all-zero INT8 channels, fp output fix point, rms float output RMS in LSB, sat% INT8 outputs at "
              "the rails, SQNR dB vs float (each with its own inputs)")
        print_table(tables[False], tables[True], a.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
