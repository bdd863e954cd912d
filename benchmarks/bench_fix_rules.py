"""Output SQNR against the float model (onnxruntime on the original ONNX) under the old fix-point rule (every pool
and every concat producer shares one fix point: QuantConfig(align_pool=True, align_concat=True)) and the rule of
AMD's programs (the defaults: avg pools keep their own output fix point, concat producers with other consumers keep
theirs). docs/quantizer.md "DPU fix-point rules" has the table this prints.

Models: zoo topologies with global average pools and concats (synthetic weights, N(0,1) inputs), the squeeze-excite
+ unaligned-concat block of tests/test_fix_point_rules.py and the rich test model of tests/test_quant.py (SE block,
3x3 avg pool, GAP). Calibration and evaluation inputs are disjoint deterministic N(0,1) sets. The INT8 side is the
DPU fake-quant model (`QuantResult.run(x, "dpu")`), which equals the `ref` runner bit for bit."""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _models(names: list[str], size: int):
    from opendpu.quant import zoo
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    for name in names:
        if name == "se_concat":
            from test_fix_point_rules import se_concat_model
            yield name, se_concat_model(), (8, 16, 16)
        elif name == "rich":
            from test_quant import rich_model
            yield name, rich_model(), (3, 16, 16)
        else:
            yield f"{name} {size}", zoo.build(name, size), (3, size, size)


def sqnr(f: np.ndarray, q: np.ndarray) -> float:
    f = f.astype(np.float64)
    return float(10 * np.log10(np.mean(f ** 2) / max(np.mean((f - q) ** 2), 1e-30)))


def main() -> int:
    from opendpu.quant.emit import session
    from opendpu.quant.quantize import QuantConfig, quantize
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="mobilenet_v2,resnet18,squeezenet,inception_v1,yolov3,se_concat,rich")
    ap.add_argument("--size", type=int, default=64, help="zoo input size")
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--eval", type=int, default=16)
    ap.add_argument("--method", default="diffs")
    ap.add_argument("--no-cle", action="store_true", help="with QuantConfig(cle=False) where the option exists")
    a = ap.parse_args()
    extra = {"cle": False} if a.no_cle and "cle" in {f.name for f in fields(QuantConfig)} else {}
    print(f"method {a.method}, {a.calib} calibration / {a.eval} evaluation inputs N(0,1), {extra or 'defaults'}")
    print(f"{'model':22s} {'output':10s} {'old rule dB':>11s} {'new rule dB':>11s} {'gain dB':>8s}  fix points changed")
    for name, m, shp in _models(a.models.split(","), a.size):
        rng = np.random.default_rng(0)
        xc = rng.normal(0, 1, (a.calib,) + shp).astype(np.float32)
        xe = rng.normal(0, 1, (a.eval,) + shp).astype(np.float32)
        s = session(m)
        outs = [o.name for o in m.graph.output]
        flt = {o: np.concatenate([s.run([o], {m.graph.input[0].name: xe[i:i + 1]})[0] for i in range(len(xe))])
               for o in outs}
        got = {}
        fps = {}
        for rule, cfg in (("old", dict(align_pool=True, align_concat=True)), ("new", {})):
            res = quantize(m, xc, config=QuantConfig(method=a.method, **cfg, **extra))
            fps[rule] = dict(res.qp.act_fp)
            q = res.run(xe, "dpu", list(res.prep.outputs))
            got[rule] = [q[n] for n in res.prep.outputs]
        changed = sorted(k for k in fps["new"] if fps["new"][k] != fps["old"].get(k))
        for j, o in enumerate(outs):
            f = flt[o]
            so, sn = sqnr(f, got["old"][j].reshape(f.shape)), sqnr(f, got["new"][j].reshape(f.shape))
            desc = ", ".join(f"{k} {fps['old'][k]}->{fps['new'][k]}" for k in changed[:6]) + \
                (f" (+{len(changed) - 6})" if len(changed) > 6 else "")
            print(f"{name:22s} {o[:10]:10s} {so:11.2f} {sn:11.2f} {sn - so:8.2f}  {desc if j == 0 else ''}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
