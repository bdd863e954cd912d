"""Integer weights and biases of the conv-like layers, with the bias fix point kept inside the DPU's
shift_bias range (spec §7.2, compiler.fixpoint). Shared by the PTQ flow (quantize.py) and fast finetune
(finetune.py), which re-derives them after tuning; neither imports the other for it."""
from __future__ import annotations

import numpy as np

from opendpu.compiler import fixpoint as F
from opendpu.quant import calib as C

CONV_KINDS = ("conv", "dwconv", "tconv")


def quantize_conv_params(prep, cfg, qp, adjustments: list) -> None:
    """Fill qp.w_q, qp.b_fp and qp.b_q of every quantized conv-like node from its weight fix point and its
    input's fix point; a bias fix point moved into `bias_fix_point_range` is logged in `adjustments`."""
    for n in prep.nodes:
        if n.kind not in CONV_KINDS or not n.quantized:
            continue
        fpw = qp.w_fp[n.name]
        qp.w_q[n.name] = C.quantize(n.weight, fpw, 8, cfg.weight_round)
        lo, hi = F.bias_fix_point_range(qp.act_fp[n.inputs[0]], fpw)
        nat = C.weight_fix_point(n.bias, method=cfg.wmethod, bit_width=8, round_mode=cfg.weight_round) \
            if np.any(n.bias) else hi
        fpb = min(max(nat, lo), hi)
        if fpb != nat and np.any(n.bias):
            adjustments.append({"tensor": n.name + "_bias", "from": nat, "to": fpb,
                                "rule": "shift_bias = fp_in + fp_w - fp_bias + 1 must be in 0..20"})
        qp.b_fp[n.name] = fpb
        qp.b_q[n.name] = C.quantize(n.bias, fpb, 8, cfg.weight_round)
