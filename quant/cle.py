"""Cross-layer equalization (CLE, Nagel et al. 2019, "Data-Free Quantization", the paper UG1414 cites).

Pure functions over the prepared float graph (`quant.prepare.Prepared`), applied after BatchNorm folding and before
weight quantization and calibration, as vai_q does (BN fold → CLE → weights → calibration). The DPU sees ordinary
weights: nothing below the quantizer changes.

A *pair* is two consecutive weighted layers (conv, depthwise conv, transposed conv; a dense layer is a conv here)
where output channel i of the first feeds only input channel i of the second, through ops f with
f(s·x) = s·f(x) for every s > 0 per channel:
  the first layer's fused activation or a separate `act` op: none, ReLU, LeakyReLU (one slope), PReLU (a slope per
  channel is still per channel), max / average pools (linear or max), and nothing with another reader (no concat,
  no add, no branch, no graph output between). Channel i of the first layer (weights and bias) is divided by s_i and
  input channel i of the second multiplied by s_i, with

      s_i = sqrt(r1_i · r2_i) / r2_i = sqrt(r1_i / r2_i)

  where r1_i = max |W1| over output channel i and r2_i = max |W2| over input channel i (the paper's r_i^(1), r_i^(2);
  vai_q's `cle_balance_method` "max"). Both ranges become sqrt(r1_i · r2_i). A layer in two pairs (the depthwise conv
  of an inverted residual) is pulled both ways, so the pass repeats `steps` times (vai_q_tensorflow2's `cle_steps`).
  The equalized float graph computes the same function (up to float rounding).

ReLU6 (`cle_to_relu6`, vai_q's forced CLE; default off as in vai_q): min(max(x/s, 0), 6)·s = min(max(x, 0), 6s), so
  through a ReLU6 channel i clips at 6·s_i instead of 6. The DPU has only the fixed clip at 6, so the forced mode
  keeps the ReLU6 where it is, as vai_q does, and the float model changes: the pair is recorded as inexact and the
  quantizer reports the float model's change on the calibration data.
Hard-swish is not positively homogeneous (x·relu6(x+3)/6 has a fixed knee at ±3): `equalize(..., hswish=True)`
  forces CLE through it for measurement only (docs/quantizer.md gives the numbers); the quantizer never does.
Bias absorption (paper §4.2, `absorb_bias`): after a ReLU whose output channel i never falls below c_i > 0 on the
  calibration data, relu(h − c) + c = relu(h), so c moves from the first layer's bias into the second's (b2 += W2·c).
  The paper estimates c from the BatchNorm statistics (β − 3γ); here c_i is the smallest value the calibration data
  gives (the folded BN is gone), and only where the second layer has no padding (padded zeros would stand for c).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from opendpu.quant.prepare import Prepared, QNode

WEIGHTED = ("conv", "dwconv", "tconv")
HOMOGENEOUS_ACTS = ("NONE", "RELU", "LEAKYRELU")
# A channel whose weight range is below DEAD x the tensor's largest is zero at 8 (and 16) bits either way: it keeps
# s = 1. Equalizing it would divide its bias by s ~ sqrt(1e-30 / r2) (PP-OCRv4 det has such channels, weights
# ~1e-30 and a bias): a constant channel of 1e12 that would set the whole tensor's fix point.
DEAD = 2.0 ** -20


@dataclass
class Pair:
    first: QNode
    second: QNode
    via: list[QNode] = field(default_factory=list)     # ops between the two (separate acts, pools, prelu, hswish)
    exact: bool = True                                   # False through ReLU6 / hard-swish (forced)
    scale: np.ndarray | None = None                      # the accumulated s (float64), one per channel

    def record(self, before: tuple[float, float], after: tuple[float, float]) -> dict:
        s = self.scale if self.scale is not None else np.ones(1)
        return {"first": self.first.name, "second": self.second.name,
                "via": ([self.first.act.lower()] if self.first.act != "NONE" else [])
                + [v.kind if v.kind != "act" else v.act.lower() for v in self.via],
                "channels": int(len(s)), "exact": self.exact,
                "scale_min": float(s.min()), "scale_max": float(s.max()),
                "spread_first": [round(before[0], 3), round(after[0], 3)],
                "spread_second": [round(before[1], 3), round(after[1], 3)]}


def _out_axis(n: QNode) -> int:
    return 1 if n.kind == "tconv" else 0


def _in_axis(n: QNode) -> int:
    return {"conv": 1, "dwconv": 0, "tconv": 0}[n.kind]


def _ranges(w: np.ndarray, axis: int) -> np.ndarray:
    a = np.moveaxis(np.abs(w.astype(np.float64)), axis, 0)
    return a.reshape(a.shape[0], -1).max(axis=1)


def _spread(r: np.ndarray) -> float:
    """log2 of the largest over the smallest live channel range (bits a per-tensor scale loses; dead channels,
    below DEAD x the largest, left out)."""
    r = r[r > DEAD * r.max()] if r.size else r
    return float(np.log2(r.max() / r.min())) if r.size else 0.0


def _bshape(w: np.ndarray, axis: int) -> list[int]:
    s = [1] * w.ndim
    s[axis] = -1
    return s


def find_pairs(prep: Prepared, relu6: bool = False, hswish: bool = False) -> list[Pair]:
    """The equalizable (first, second) layer pairs of `prep`, in graph order (both quantized, see the module doc)."""
    cons: dict[str, list[QNode]] = {}
    for n in prep.nodes:
        for i in n.inputs:
            cons.setdefault(i, []).append(n)
    outs = set(prep.outputs)
    acts = HOMOGENEOUS_ACTS + (("RELU6",) if relu6 else ())
    pairs = []
    for n1 in prep.nodes:
        if n1.kind not in WEIGHTED or not n1.quantized or n1.weight is None or n1.act not in acts:
            continue
        exact = n1.act != "RELU6"
        cur, via = n1, []
        while True:
            cs = cons.get(cur.name, [])
            if cur.name in outs or not cs:
                break
            if len(cs) == 2 and hswish:         # hard-swish: x -> hsigmoid -> mul(x, hsigmoid(x))
                h = next((c for c in cs if c.kind == "hsigmoid"), None)
                m = next((c for c in cs if c.kind == "eltwise" and c.attrs.get("type") == "MUL"), None)
                if h is not None and m is not None and set(m.inputs) == {cur.name, h.name} \
                        and [c.name for c in cons.get(h.name, [])] == [m.name] and h.name not in outs:
                    via += [h, m]
                    cur, exact = m, False
                    continue
            if len(cs) != 1:
                break
            c = cs[0]
            if c.kind in WEIGHTED and c.inputs == [cur.name] and c.quantized and c.weight is not None:
                if _ranges(n1.weight, _out_axis(n1)).size == _ranges(c.weight, _in_axis(c)).size:
                    pairs.append(Pair(n1, c, via, exact))
                break
            if c.kind == "act" and c.act in acts and c.inputs == [cur.name]:
                exact &= c.act != "RELU6"
            elif c.kind == "prelu" or (c.kind == "pool" and c.attrs.get("type") in ("MAX", "AVG")):
                pass
            else:
                break
            via.append(c)
            cur = c
    return pairs


def _weight(n: QNode) -> np.ndarray:
    """The weights of a conv-like node (every layer CLE pairs has them)."""
    assert n.weight is not None
    return n.weight


def equalize(prep: Prepared, steps: int = 10, relu6: bool = False, hswish: bool = False) -> list[dict]:
    """Equalize every pair of `prep` in place, `steps` passes; returns one record per pair (`Pair.record`): the
    layers, the ops between, the range of the scales, and the channel-range spread (log2 max/min) of both weight
    tensors before and after."""
    pairs = find_pairs(prep, relu6, hswish)
    if not pairs:
        return []
    before = {id(p): (_spread(_ranges(_weight(p.first), _out_axis(p.first))),
                      _spread(_ranges(_weight(p.second), _in_axis(p.second)))) for p in pairs}
    w = {}                                   # float64 working copies, written back once
    b = {}
    for p in pairs:
        for n in (p.first, p.second):
            if n.name not in w:
                w[n.name] = _weight(n).astype(np.float64)
                b[n.name] = n.bias.astype(np.float64) if n.bias is not None else None
    for _ in range(steps):
        for p in pairs:
            a1, a2 = _out_axis(p.first), _in_axis(p.second)
            w1, w2 = w[p.first.name], w[p.second.name]
            r1, r2 = _ranges(w1, a1), _ranges(w2, a2)
            s = np.ones_like(r1)
            ok = (r1 > DEAD * r1.max()) & (r2 > DEAD * r2.max())    # a dead channel keeps s = 1 (its bias!)
            s[ok] = np.sqrt(r1[ok] / r2[ok])
            w[p.first.name] = w1 / s.reshape(_bshape(w1, a1))
            if b[p.first.name] is not None:
                b[p.first.name] = b[p.first.name] / s
            w[p.second.name] = w2 * s.reshape(_bshape(w2, a2))
            p.scale = s if p.scale is None else p.scale * s
    for p in pairs:
        for n in (p.first, p.second):
            n.weight = w[n.name].astype(np.float32)
            bias = b[n.name]
            if bias is not None:
                n.bias = bias.astype(np.float32)
    return [p.record(before[id(p)], (_spread(_ranges(_weight(p.first), _out_axis(p.first))),
                                     _spread(_ranges(_weight(p.second), _in_axis(p.second))))) for p in pairs]


def absorb_candidates(prep: Prepared, records: list[dict]) -> list[tuple[QNode, QNode]]:
    """Pairs of `records` where bias absorption is exact wherever the data's minimum holds: the first layer's own
    ReLU directly into the second layer (nothing between), the second a conv or depthwise conv without padding."""
    out = []
    for r in records:
        n1, n2 = prep.node(r["first"]), prep.node(r["second"])
        if n1.act == "RELU" and n2.inputs == [n1.name] and n2.kind in ("conv", "dwconv") \
                and not any(n2.attrs.get("pads", [0])) and n1.bias is not None:
            out.append((n1, n2))
    return out


def absorb_bias(pairs: list[tuple[QNode, QNode]], mins: dict[str, np.ndarray]) -> list[dict]:
    """Move c_i = min over the data of the first layer's (ReLU) output channel i, when positive, into the second
    layer's bias: b1 -= c, b2 += W2·c. `mins[name]`: per-channel minimum of that layer's output. Returns one record
    per pair changed (channels moved, largest c)."""
    recs = []
    for n1, n2 in pairs:
        c = np.maximum(np.asarray(mins[n1.name], np.float64), 0.0)
        if not np.any(c > 0):
            continue
        w2 = _weight(n2).astype(np.float64)
        add = w2.sum(axis=(2, 3)) @ c if n2.kind == "conv" else w2[:, 0].sum(axis=(1, 2)) * c
        b2 = np.zeros(w2.shape[0]) if n2.bias is None else n2.bias.astype(np.float64)
        assert n1.bias is not None                  # absorb_candidates keeps layers with a bias
        n1.bias = (n1.bias.astype(np.float64) - c).astype(np.float32)
        n2.bias = (b2 + add).astype(np.float32)
        recs.append({"first": n1.name, "second": n2.name, "channels": int(np.sum(c > 0)), "max_shift": float(c.max())})
    return recs
