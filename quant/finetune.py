"""Accuracy tools: bias correction and fast finetune (AdaQuant-style), both optional and seedable.

* Bias correction (Nagel et al. 2019, empirical form): the expected output shift that weight quantization
  causes, E[conv(x, W − W_q)] per output channel, is added to the bias. The expectation uses the float
  inputs of each layer over the calibration set (mean input patch, exact at the borders).
* Fast finetune (Hubara et al. 2020, AdaQuant, "parallel" form): layer by layer, the weights and bias are
  tuned with Adam and a straight-through estimator so that act(X_q·Q(W) + b) matches the float layer's
  act(X_f·W + b) on sampled output positions, where X_q are the layer's inputs in the quantized model and
  X_f in the float model. The weight fix point is kept; a layer keeps its tuned weights only if its error on
  held-out positions (a third more, not tuned on) went down: with 1024 rows and hundreds of weights per output
  channel, the error on the tuning rows themselves always falls (overfitting). Layer-wise gains need not
  add up (each layer is tuned on the PTQ model's inputs), so the whole result is checked too: when the model
  outputs' SQNR against the float model on the tuning samples goes down, every layer is restored.
"""
from __future__ import annotations

import numpy as np

from opendpu.compiler.fixpoint import LEAKY_ALPHA
from opendpu.quant import calib as C
from opendpu.quant.conv_params import quantize_conv_params
from opendpu.quant.emit import emit_onnx, session, value_name

_LEAKY = float(LEAKY_ALPHA)       # the DPU slope, for a LeakyReLU without an alpha attribute


def _batches(x: np.ndarray, bs: int):
    for i in range(0, len(x), bs):
        yield x[i:i + bs]


def _mean_patch(x: np.ndarray, n) -> np.ndarray:
    """Mean over samples and output positions of the (zero-padded) input window: [C, kh, kw]."""
    kh, kw = n.attrs["kernel"]
    sh, sw = n.attrs["strides"]
    dh, dw = n.attrs.get("dilations", [1, 1])
    t, l, b, r = n.attrs["pads"]
    oh, ow = n.shape[2], n.shape[3]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (t, max(b, 0)), (l, max(r, 0))))
    out = np.zeros((x.shape[1], kh, kw))
    for ky in range(kh):
        for kx in range(kw):
            sl = xp[:, :, ky * dh: ky * dh + (oh - 1) * sh + 1: sh, kx * dw: kx * dw + (ow - 1) * sw + 1: sw]
            out[:, ky, kx] = sl.sum(axis=(0, 2, 3)) / (x.shape[0] * oh * ow)
    return out


def bias_correction(prep, cfg, x: np.ndarray) -> list[dict]:
    """Add E[conv(x, W − W_q)] to every conv/depthwise bias (before the biases are quantized)."""
    convs = [n for n in prep.nodes if n.kind in ("conv", "dwconv")]
    if not convs:
        return []
    sess = session(emit_onnx(prep, "float", None, all_outputs=True))
    inp = prep.input_nodes[0].name
    srcs = sorted({n.inputs[0] for n in convs})
    ask = [s for s in srcs if s != inp]
    sums = {n.name: None for n in convs}
    count = 0
    for xb in _batches(x, cfg.batch_size):
        vals = dict(zip(ask, sess.run([value_name(prep, s, "float") for s in ask], {inp: xb})))
        vals[inp] = xb
        for n in convs:
            mp = _mean_patch(vals[n.inputs[0]], n) * len(xb)
            sums[n.name] = mp if sums[n.name] is None else sums[n.name] + mp
        count += len(xb)
    log = []
    for n in convs:
        mp = sums[n.name] / count
        fpw = C.weight_fix_point(n.weight, method=cfg.wmethod, bit_width=8, round_mode=cfg.weight_round)
        wq = C.dequantize(C.quantize(n.weight, fpw, 8, cfg.weight_round), fpw).astype(np.float64)
        dW = n.weight.astype(np.float64) - wq
        if n.kind == "conv":
            delta = np.einsum("oikl,ikl->o", dW, mp)
        else:
            delta = np.einsum("ckl,ckl->c", dW[:, 0], mp)
        n.bias = (n.bias.astype(np.float64) + delta).astype(np.float32)
        log.append({"layer": n.name, "max_abs_shift": float(np.max(np.abs(delta)))})
    return log


def _act(v: np.ndarray, act: str, alpha) -> np.ndarray:
    if act == "RELU":
        return np.maximum(v, 0)
    if act == "RELU6":
        return np.clip(v, 0, 6)
    if act == "LEAKYRELU":
        return np.where(v < 0, v * (alpha or _LEAKY), v)
    return v


def _act_grad(v: np.ndarray, act: str, alpha) -> np.ndarray:
    if act == "RELU":
        return (v > 0).astype(v.dtype)
    if act == "RELU6":
        return ((v > 0) & (v < 6)).astype(v.dtype)
    if act == "LEAKYRELU":
        return np.where(v < 0, alpha or _LEAKY, 1.0)
    return np.ones_like(v)


def _rows(x: np.ndarray, n, pos: np.ndarray) -> np.ndarray:
    """im2col rows of input x (NCHW) at the sampled (sample, oy, ox) positions: [R, C, kh, kw]."""
    kh, kw = n.attrs["kernel"]
    sh, sw = n.attrs["strides"]
    dh, dw = n.attrs.get("dilations", [1, 1])
    t, l, b, r = n.attrs["pads"]
    xp = np.pad(x, ((0, 0), (0, 0), (t, max(b, 0) + kh * dh), (l, max(r, 0) + kw * dw)))
    ky = np.arange(kh) * dh
    kx = np.arange(kw) * dw
    s, oy, ox = pos[:, 0], pos[:, 1], pos[:, 2]
    yy = (oy * sh)[:, None] + ky[None, :]
    xx = (ox * sw)[:, None] + kx[None, :]
    return xp[s[:, None, None], :, yy[:, :, None], xx[:, None, :]].transpose(0, 3, 1, 2)


class _layer_problem:
    """One layer's tuning problem on sampled output positions: the float target act(X_f·W0 + b0) and the forward /
    backward of X_q·W + b (a dense im2col product for conv, per channel for depthwise)."""

    def __init__(self, n, Xf, Xq, W0, b0, alpha):
        R = Xf.shape[0]
        if n.kind == "conv":
            Xf2, self.Xq = Xf.reshape(R, -1), Xq.reshape(R, -1)
            self.target = _act(Xf2 @ W0.reshape(W0.shape[0], -1).T + b0, n.act, alpha)
        else:
            C_ = W0.shape[0]
            Xf2, self.Xq = Xf.reshape(R, C_, -1), Xq.reshape(R, C_, -1)
            self.target = _act(np.einsum("rck,ck->rc", Xf2, W0.reshape(C_, -1)) + b0, n.act, alpha)
        self.conv, self.shape = n.kind == "conv", W0.shape

    def fwd(self, W, b):
        if self.conv:
            return self.Xq @ W.reshape(W.shape[0], -1).T + b
        return np.einsum("rck,ck->rc", self.Xq, W.reshape(W.shape[0], -1)) + b

    def back(self, g):
        if self.conv:
            return (g.T @ self.Xq).reshape(self.shape), g.sum(0)
        return np.einsum("rc,rck->ck", g, self.Xq).reshape(self.shape), g.sum(0)


def _output_sqnr(ref: dict, test: dict) -> float:
    """SQNR (dB) of all model outputs together, `test` against `ref`."""
    s = sum(float(np.sum(np.asarray(v, np.float64) ** 2)) for v in ref.values())
    e = sum(float(np.sum((np.asarray(ref[k], np.float64) - np.asarray(test[k], np.float64)) ** 2)) for k in ref)
    return float("inf") if e == 0 else 10 * np.log10(max(s, 1e-30) / e)


def fast_finetune(res, x: np.ndarray, rows: int = 1024, samples: int = 64) -> list[dict]:
    """Tune every conv / depthwise layer of a QuantResult (see the module docstring); updates weights,
    re-derives the integer weights and biases and returns a per-layer log."""
    prep, qp, cfg = res.prep, res.qp, res.config
    rng = np.random.default_rng(cfg.seed)
    xs = x[:samples]
    saved = {n.name: (n.weight, n.bias) for n in prep.nodes if n.kind in ("conv", "dwconv")}
    float_out = res.run(xs, "float")
    before = _output_sqnr(float_out, res.run(xs, "dpu"))
    convs = [n for n in prep.nodes if n.kind in ("conv", "dwconv")]
    inp = prep.input_nodes[0].name
    need = sorted({n.inputs[0] for n in convs})
    fvals = {inp: xs}
    qvals = {inp: None}
    fs = session(emit_onnx(prep, "float", None, all_outputs=True))
    qs = session(emit_onnx(prep, "dpu", qp, all_outputs=True))
    ask = [s for s in need if s != inp]
    fo = fs.run([value_name(prep, s, "float") for s in ask], {inp: xs})
    qo = qs.run([value_name(prep, s, "dpu") for s in ask + [inp]], {inp: xs})
    fvals.update(zip(ask, fo))
    qvals.update(zip(ask + [inp], qo))
    log = []
    for n in convs:
        fpw = qp.w_fp[n.name]
        N, oh, ow = xs.shape[0], n.shape[2], n.shape[3]
        total = N * oh * ow
        R = min(rows + rows // 2, total)         # rows to tune on, then a held-out third that decides
        flat = rng.choice(total, size=R, replace=False)
        pos = np.stack([flat // (oh * ow), (flat // ow) % oh, flat % ow], axis=1)
        Xf = _rows(fvals[n.inputs[0]].astype(np.float64), n, pos)
        Xq = _rows(qvals[n.inputs[0]].astype(np.float64), n, pos)
        W0 = n.weight.astype(np.float64)
        b0 = n.bias.astype(np.float64)
        alpha = n.attrs.get("alpha")
        Rt = min(rows, R) if R - min(rows, R) >= 16 else R
        train = _layer_problem(n, Xf[:Rt], Xq[:Rt], W0, b0, alpha)
        held = _layer_problem(n, Xf[Rt:], Xq[Rt:], W0, b0, alpha) if Rt < R else train
        lo, hi = -128 * 2.0 ** -fpw, 127 * 2.0 ** -fpw

        def wq_of(W):
            return C.dequantize(C.quantize(W, fpw, 8, cfg.weight_round), fpw).astype(np.float64)

        def loss_of(prob, W, b):
            v = prob.fwd(wq_of(W), b)
            return float(np.mean((_act(v, n.act, alpha) - prob.target) ** 2)), v

        base, _ = loss_of(held, W0, b0)
        W, b = W0.copy(), b0.copy()
        mW, vW, mb, vb = np.zeros_like(W), np.zeros_like(W), np.zeros_like(b), np.zeros_like(b)
        lr = 0.003 * 2.0 ** -fpw                 # a small fraction of an LSB per step (AdaQuant-like)
        for it in range(1, cfg.finetune_iters + 1):
            _, v = loss_of(train, W, b)
            g = 2 * (_act(v, n.act, alpha) - train.target) * _act_grad(v, n.act, alpha) / v.size
            gW, gb = train.back(g)
            gW = gW * ((W >= lo) & (W <= hi))                   # straight-through inside the range
            for p, gp, m, s in ((W, gW, mW, vW), (b, gb, mb, vb)):
                m *= 0.9
                m += 0.1 * gp
                s *= 0.999
                s += 0.001 * gp * gp
                p -= lr * (m / (1 - 0.9 ** it)) / (np.sqrt(s / (1 - 0.999 ** it)) + 1e-12)
        tuned, _ = loss_of(held, W, b)
        keep = tuned < base
        if keep:
            n.weight = W.astype(np.float32)
            n.bias = b.astype(np.float32)
        log.append({"layer": n.name, "mse_ptq": base, "mse_tuned": tuned, "kept": bool(keep)})
    quantize_conv_params(prep, cfg, qp, [])
    res._sessions.clear()
    after = _output_sqnr(float_out, res.run(xs, "dpu"))
    if after < before:
        for n in prep.nodes:
            if n.name in saved:
                n.weight, n.bias = saved[n.name]
        quantize_conv_params(prep, cfg, qp, [])
        res._sessions.clear()
        for r in log:
            r["kept"] = False
        res.notes.append(f"fast finetune: reverted; the tuned layers lowered the outputs' SQNR against the float "
                         f"model from {before:.2f} to {after:.2f} dB on the tuning samples")
    res.finetune_sqnr = {"before_db": before, "after_db": after, "reverted": after < before}
    res.notes.append(f"fast finetune: {sum(r['kept'] for r in log)} of {len(log)} layers improved")
    res.finetune_log = log
    return log
