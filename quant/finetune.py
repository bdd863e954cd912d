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
  After tuning, the activations are calibrated again on the calibration data with the tuned float weights
  (quantize's `_recalibrate`: its own calibration, fix-point rules, integer weights and biases); the SQNR check runs
  on that model, and a revert restores the PTQ fix points too.
* Memory (docs/quantizer.md "Fast finetune and bias correction: memory and defaults"): every layer's output
  positions are drawn up front; the samples stream through the float and DPU models cfg.batch_size at a time,
  with sessions that return only the tensors the current group of layers reads, and only the im2col rows of the
  sampled positions are kept (float32; at most ROW_BUDGET bytes of them, more layers take another pass). The tuned
  weights are applied after every group, so the rows are those of the untuned models whatever the grouping.
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
    inp = prep.input_nodes[0].name
    srcs = sorted({n.inputs[0] for n in convs})
    ask = [s for s in srcs if s != inp]
    sess = _session_for(prep, "float", None, ask)
    sums: dict = {n.name: None for n in convs}
    count = 0
    for xb in _batches(x, cfg.batch_size):
        vals = dict(zip(ask, sess.run([value_name(prep, s, "float") for s in ask], {inp: xb}))) if ask else {}
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


def _layers(prep) -> list:
    """The layers fast finetune tunes: the quantized conv and depthwise convs, in graph order."""
    return [n for n in prep.nodes if n.kind in ("conv", "dwconv") and n.quantized]


def sample_positions(rng: np.random.Generator, layers: list, n_samples: int, rows: int) -> dict[str, np.ndarray]:
    """Every layer's sampled output positions [R, 3] of (sample, oy, ox), R = min(1.5·rows, all positions), drawn
    up front in graph order (the first `rows` tune, the rest are held out)."""
    out = {}
    for n in layers:
        oh, ow = n.shape[2], n.shape[3]
        total = n_samples * oh * ow
        R = min(rows + rows // 2, total)
        flat = rng.choice(total, size=R, replace=False)
        out[n.name] = np.stack([flat // (oh * ow), (flat // ow) % oh, flat % ow], axis=1)
    return out


def _cin(n) -> int:
    """Input channels of a conv (group 1) or depthwise conv: the C of its im2col rows."""
    return int(n.weight.shape[1] if n.kind == "conv" else n.weight.shape[0])


def _row_bytes(n, pos: np.ndarray) -> int:
    """float32 bytes of one layer's sampled rows, float and quantized inputs together."""
    kh, kw = n.attrs["kernel"]
    return 2 * 4 * len(pos) * _cin(n) * int(kh) * int(kw)


def _groups(layers: list, pos: dict, budget: int) -> list[list]:
    """Consecutive layers whose rows together stay within `budget` bytes (a layer alone may exceed it)."""
    groups: list[list] = [[]]
    size = 0
    for n in layers:
        b = _row_bytes(n, pos[n.name])
        if groups[-1] and size + b > budget:
            groups.append([])
            size = 0
        groups[-1].append(n)
        size += b
    return groups


def _session_for(prep, mode: str, qp, names: list[str]):
    """A session of the float or DPU model whose graph outputs are only the values `names` (one model output when
    none is asked), so onnxruntime returns nothing else."""
    m = emit_onnx(prep, mode, qp, all_outputs=bool(names))
    keep = {value_name(prep, s, mode) for s in names}
    outs = [o for o in m.graph.output if o.name in keep] or [m.graph.output[0]]
    del m.graph.output[:]
    m.graph.output.extend(outs)
    return _lean_session(m)


def _lean_session(model):
    """`emit.session` without onnxruntime's memory arena (see there)."""
    return session(model, arena=False)


def collect_rows(prep, qp, xs: np.ndarray, layers: list, pos: dict, batch: int) -> tuple[dict, dict]:
    """The im2col rows [R, C, kh, kw] (float32) of `layers`' inputs at their sampled positions, in the float model
    (first dict) and in the DPU fake-quant model (second), streaming `xs` through both models `batch` samples at a
    time: only these rows and one batch's activations are ever held."""
    inp = prep.input_nodes[0].name
    srcs = sorted({n.inputs[0] for n in layers})
    out: tuple[dict, dict] = ({}, {})
    for k, mode in enumerate(("float", "dpu")):
        ask = [s for s in srcs if not (s == inp and mode == "float")]
        sess = _session_for(prep, mode, qp if mode == "dpu" else None, ask)
        rows = out[k]
        for n in layers:
            rows[n.name] = np.empty((len(pos[n.name]), _cin(n), *n.attrs["kernel"]), np.float32)
        for i0 in range(0, len(xs), batch):
            xb = np.ascontiguousarray(xs[i0:i0 + batch], np.float32)
            vals = dict(zip(ask, sess.run([value_name(prep, s, mode) for s in ask], {inp: xb}))) if ask else {}
            if mode == "float":
                vals[inp] = xb
            for n in layers:
                p = pos[n.name]
                sel = np.nonzero((p[:, 0] >= i0) & (p[:, 0] < i0 + len(xb)))[0]
                if len(sel):
                    q = p[sel].copy()
                    q[:, 0] -= i0
                    rows[n.name][sel] = _rows(vals[n.inputs[0]], n, q)
            del vals
        del sess
    return out


def _output_sqnr(ref: dict, test: dict) -> float:
    """SQNR (dB) of all model outputs together, `test` against `ref`."""
    s = sum(float(np.sum(np.asarray(v, np.float64) ** 2)) for v in ref.values())
    e = sum(float(np.sum((np.asarray(ref[k], np.float64) - np.asarray(test[k], np.float64)) ** 2)) for k in ref)
    return float("inf") if e == 0 else 10 * np.log10(max(s, 1e-30) / e)


ROW_BUDGET = 256 << 20     # bytes of sampled im2col rows held at once; more layers take another pass over the data


def _outputs(res, xs: np.ndarray, mode: str, batch: int) -> dict[str, np.ndarray]:
    """The model outputs on xs, `batch` samples at a time (a session of the outputs alone, not `res.run`'s, which
    computes every op's output)."""
    prep = res.prep
    sess = _session_for(prep, mode, res.qp if mode == "dpu" else None, [])
    inp = prep.input_nodes[0].name
    names = [value_name(prep, o, mode) for o in prep.outputs]
    parts = [sess.run(names, {inp: np.ascontiguousarray(xs[i:i + batch], np.float32)})
             for i in range(0, len(xs), batch)]
    return {o: np.concatenate([p[k] for p in parts]) for k, o in enumerate(prep.outputs)}


def _snapshot(res) -> dict:
    qp = res.qp
    return {"qp": {k: dict(getattr(qp, k)) for k in ("act_fp", "w_fp", "b_fp", "w_q", "b_q")},
            "adjustments": list(res.adjustments), "observers": dict(res.observers),
            "weights": {n.name: (n.weight, n.bias) for n in res.prep.nodes if n.kind in ("conv", "dwconv")}}


def _restore(res, s: dict) -> None:
    for k, v in s["qp"].items():
        setattr(res.qp, k, v)
    res.adjustments[:] = s["adjustments"]
    res.observers.clear()
    res.observers.update(s["observers"])
    for n in res.prep.nodes:
        if n.name in s["weights"]:
            n.weight, n.bias = s["weights"][n.name]
    res._sessions.clear()


def _tune_layer(n, cfg, fpw: int, Xf: np.ndarray, Xq: np.ndarray, rows: int) -> tuple[dict, tuple | None]:
    """AdaQuant on one layer's sampled rows (the first `rows` tune, the rest decide): the layer's log line and its
    tuned (weights, bias) when the held-out error went down, else None. The node itself is not changed (the float
    model stays the one every layer's rows are sampled from)."""
    Xf, Xq = Xf.astype(np.float64), Xq.astype(np.float64)
    R = len(Xf)
    W0 = n.weight.astype(np.float64)
    b0 = n.bias.astype(np.float64)
    alpha = n.attrs.get("alpha")
    Rt = min(rows, R) if R - min(rows, R) >= 16 else R
    train = _layer_problem(n, Xf[:Rt], Xq[:Rt], W0, b0, alpha)
    held = _layer_problem(n, Xf[Rt:], Xq[Rt:], W0, b0, alpha) if Rt < R else train
    del Xf, Xq
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
    new = (W.astype(np.float32), b.astype(np.float32)) if keep else None
    return {"layer": n.name, "mse_ptq": base, "mse_tuned": tuned, "kept": bool(keep)}, new


def fast_finetune(res, x: np.ndarray, rows: int = 1024, samples: int = 64, recalibrate=None,
                  row_budget: int = ROW_BUDGET) -> list[dict]:
    """Tune every quantized conv / depthwise layer of a QuantResult (see the module docstring); updates weights,
    re-derives the integer weights and biases and, given `recalibrate(res)` (quantize's own, which calibrates the
    activations on all the calibration data with the tuned weights), recalibrates. Returns a per-layer log.

    Memory: the first `samples` of x stream through the float and DPU models cfg.batch_size at a time; only the
    im2col rows of each layer's sampled positions are kept (float32, `collect_rows`), at most `row_budget` bytes
    of them at once (layers beyond take another pass), never a whole activation map of every sample."""
    prep, qp, cfg = res.prep, res.qp, res.config
    rng = np.random.default_rng(cfg.seed)
    xs = x[:samples]
    bs = cfg.batch_size
    saved = _snapshot(res)
    float_out = _outputs(res, xs, "float", bs)
    before = _output_sqnr(float_out, _outputs(res, xs, "dpu", bs))
    layers = _layers(prep)
    pos = sample_positions(rng, layers, len(xs), rows)
    log = []
    tuned = {}
    held = 0
    for group in _groups(layers, pos, row_budget):
        Xf, Xq = collect_rows(prep, qp, xs, group, pos, bs)
        held = max(held, sum(a.size for a in Xf.values()) + sum(a.size for a in Xq.values()))
        for n in group:
            line, new = _tune_layer(n, cfg, qp.w_fp[n.name], Xf.pop(n.name), Xq.pop(n.name), rows)
            log.append(line)
            if new is not None:
                tuned[n.name] = new
        del Xf, Xq
    for n in layers:                        # only now: every group's rows came from the untuned models
        if n.name in tuned:
            n.weight, n.bias = tuned[n.name]
    quantize_conv_params(prep, cfg, qp, [])
    if recalibrate is not None:
        recalibrate(res)
    res._sessions.clear()
    after = _output_sqnr(float_out, _outputs(res, xs, "dpu", bs))
    if after < before:
        _restore(res, saved)
        for r in log:
            r["kept"] = False
        res.notes.append(f"fast finetune: reverted; the tuned layers lowered the outputs' SQNR against the float "
                         f"model from {before:.2f} to {after:.2f} dB on the tuning samples")
    res.finetune_sqnr = {"before_db": before, "after_db": after, "reverted": bool(after < before)}
    res.finetune_rows_held = held          # float32 elements of sampled rows held at the peak (memory bound)
    res.notes.append(f"fast finetune: {sum(r['kept'] for r in log)} of {len(log)} layers improved")
    res.finetune_log = log
    return log
