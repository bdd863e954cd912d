"""Placement rules of element-wise ops (ELEW) and of the standalone activations (ELEW or ALU; compiler/rules.py
states the rules)."""
from __future__ import annotations

import math

from opendpu.compiler.fixpoint import MULTI_FACTOR_MAX, PRELU_SHIFT_MAX, slope_encoding, slope_fits_alu
from opendpu.compiler.rules_common import (ALU_CG_MAX, ELEW_CG_MAX, ELEW_NUM_MAX, OpDesc, Placement, _check_channels,
                                           _Cpu, _dpu, _fused, _ic, _in, _need, _nhwc, _out, _shape)
from opendpu.isa.target import ALU_TYPES, Target


def _eltwise(op: OpDesc, t: Target) -> Placement:
    kind = str(op.attrs.get("type", "ADD")).upper()
    if kind in ("LEAKY-RELU", "LEAKYRELU"):
        return _leaky(op, t)
    if kind == "PRELU":
        return _prelu(op, t)
    what = f"eltwise {kind}"
    _need(kind in ("ADD", "MUL"), f"eltwise {kind} is not supported by the ELEW engine (add, mult only)")
    n = len(op.in_shapes)
    if kind == "ADD":
        _need(n <= ELEW_NUM_MAX, f"{what} with {n} inputs > {ELEW_NUM_MAX} (ELEW num field)",
              f"split into a tree of adds with at most {ELEW_NUM_MAX} inputs")
    elif n:
        _need(n == 2, f"{what} with {n} inputs != 2 (ELEW multiply takes 2)", "multiply two tensors at a time")
    shapes = [_nhwc(_shape(s)) for s in op.in_shapes]
    y = _nhwc(_out(op))
    if y is None and shapes and all(s is not None for s in shapes):
        y = [max(s[i] for s in shapes if s is not None) for i in range(4)]
    if y is not None:
        for s, raw in zip(shapes, op.in_shapes):
            _need(s is not None, f"{what} input shape {list(raw)} is not 1..4-D")
            assert s is not None                              # _need raised otherwise (for the type checker)
            if s == y:
                continue
            ok = s[3] == y[3] and s[0] in (1, y[0]) and s[1] in (1, y[1]) and s[2] in (1, y[2])
            _need(ok, f"{what} broadcasts {list(raw)} to {y} along channels; ELEW can only repeat rows "
                      f"(share_pp) and columns (jump_read 0)", "broadcast only over H and W")
        _check_channels(what, y[3], ELEW_CG_MAX, t)                       # ELEW channel_group 1..256
    act = _fused("eltwise", op, t, what)                                  # §6.7 act_type 1 bit
    bc = " with row/column broadcast" if y is not None and any(s != y for s in shapes) else ""
    return _dpu("eltwise", f"ELEW {'add' if kind == 'ADD' else 'multiply'}{bc}{act}")


def _alpha_of(op: OpDesc):
    a = op.attrs.get("alpha", op.attrs.get("LEAKYRELU_alpha"))
    return 0.01 if a is None else a          # XIR / ONNX default, as compiler.ref


def _leaky(op: OpDesc, t: Target) -> Placement:
    a = _alpha_of(op)
    try:
        m, s = slope_encoding(float(a))                      # floats are dyadic: a = m / 2^s
    except (TypeError, ValueError):
        raise _Cpu(f"leaky-relu alpha {a!r} is not a number") from None
    _need(slope_fits_alu(m, s),
          f"leaky-relu alpha {float(a):g} is not m/2^s with |m| <= {MULTI_FACTOR_MAX} (ALU multi_factor) "
          f"and s <= {PRELU_SHIFT_MAX}",
          "use negative_slope=0.1015625 (26/256)")
    _check_channels("leaky-relu", _ic(op), ALU_CG_MAX, t)
    return _dpu("alu", f"ALU {ALU_TYPES[4]} (exec_mode 4), multi_factor {m}, slope {m}/2^{s}")


def _prelu(op: OpDesc, t: Target) -> Placement:
    c = _ic(op)
    ws = _shape(op.weight_shape) if op.weight_shape is not None else (_in(op, 1) if len(op.in_shapes) > 1 else None)
    if ws is not None and c is not None:
        k = math.prod(ws)
        _need(k in (1, c), f"prelu slope shape {ws} is not per-channel ({c}) or shared",
              "use one slope per channel")
    _check_channels("prelu", c, ALU_CG_MAX, t)
    return _dpu("alu", f"ALU {ALU_TYPES[1]} (exec_mode 1), int8 slopes in DWCONVW")


def _relu(op: OpDesc, t: Target) -> Placement:
    _check_channels("relu", _ic(op), ELEW_CG_MAX, t)
    return _dpu("eltwise", "ELEW single-input add with ReLU (or fused into the producer)")


def _relu6(op: OpDesc, t: Target) -> Placement:
    _check_channels("relu6", _ic(op), ALU_CG_MAX, t)
    return _dpu("alu", f"ALU {ALU_TYPES[0]} 1x1 identity with ReLU6 (or fused into the producer)")


def _hsigmoid(op: OpDesc, t: Target) -> Placement:
    _check_channels("hard-sigmoid", _ic(op), ALU_CG_MAX, t)
    return _dpu("alu", f"ALU {ALU_TYPES[7]} (exec_mode 7)")


def _hswish(op: OpDesc, t: Target) -> Placement:
    _check_channels("hard-swish", _ic(op), ALU_CG_MAX, t)
    return _dpu("alu", f"ALU {ALU_TYPES[7]} (exec_mode 7) + ELEW multiply")
