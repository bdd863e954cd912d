"""Placement rules of the data-movement ops (LOAD/SAVE addressing or ELEW copies, §7.8): concat, reshape,
transpose, upsample, tile, strided_slice, argmax (compiler/rules.py states the rules)."""
from __future__ import annotations

import math
from fractions import Fraction

from opendpu.compiler.rules_common import (ARGMAX_MAX_CHANNELS, CONV_CG_MAX, ELEW_CG_MAX, OpDesc, Placement, _bool,
                                           _check_channels, _Cpu, _dpu, _ic, _in, _need, _nhwc, _out)
from opendpu.isa.target import Target


def _axis(op: OpDesc, default: int, rank: int | None) -> int:
    try:
        a = int(op.attrs.get("axis", default))
    except (TypeError, ValueError):
        raise _Cpu(f"attribute axis {op.attrs.get('axis')!r} is not an integer") from None
    if a < 0 and rank:
        a += rank
    return a


def _concat(op: OpDesc, t: Target) -> Placement:
    s = _out(op) or _in(op)
    rank = len(s) if s else None
    a = _axis(op, 0, rank)
    _need(a != 0, "concat along the batch axis", "concatenate along H, W or C")
    if a < 0:                       # negative and rank unknown: -1 is the channel axis
        _need(a == -1, f"concat axis {a} with unknown rank")
    elif rank is not None:
        _need(a < rank, f"concat axis {a} out of range for a {rank}-D tensor")
    names = {4: {1: "H", 2: "W"}, 3: {1: "W"}}.get(rank or 4, {})
    which = "channels" if (a == -1 or (rank and a == rank - 1)) else names.get(a, f"axis {a}")
    return _dpu("load/save", f"concat along {which}: producers write into the output image (§7.8)")


def _reshape(op: OpDesc, t: Target) -> Placement:
    x, y = _in(op), _out(op)
    if x and y:
        _need(math.prod(x) == math.prod(y), f"reshape {x} -> {y} changes the element count")
        _need(x[0] == y[0], f"reshape {x} -> {y} moves data across the batch dimension",
              "keep the batch dimension first and unchanged")
    return _dpu("load/save", "no instructions: the output aliases the input's DDR image (§7.8)")


def _transpose(op: OpDesc, t: Target) -> Placement:
    x = _in(op)
    order = op.attrs.get("order", op.attrs.get("perm"))
    if order is None:
        order = list(range(len(x)))[::-1] if x else None
    _need(order is not None, "transpose without order or input shape")
    assert order is not None                                  # _need raised otherwise (for the type checker)
    order = [int(v) for v in order]
    _need(sorted(order) == list(range(len(order))), f"transpose order {order} is not a permutation")
    if order == sorted(order):
        return _dpu("load/save", "identity transpose: no instructions")
    _need(x is not None and len(x) == len(order), f"transpose {order} changes the memory order "
                                                  f"(input shape unknown)")
    assert x is not None
    moved = [a for a in order if x[a] != 1]
    _need(moved == sorted(moved), f"transpose {order} of {x} changes the memory order",
          "keep the NHWC order (do the transpose in CPU post-processing)")
    return _dpu("load/save", f"transpose {order} only moves size-1 axes: no instructions")


def _upsample(op: OpDesc, t: Target) -> Placement:
    mode = str(op.attrs.get("mode", "NEAREST")).upper()
    _need(mode == "NEAREST", f"upsample mode {mode} is not supported (NEAREST only)",
          "use mode='nearest' with an integer scale")
    for k in ("align_corners", "half_pixel_centers"):
        _need(not _bool(op.attrs.get(k, False)), f"upsample {k}=True is not supported",
              f"use {k}=False")
    x, y = _nhwc(_in(op)), _nhwc(_out(op))
    if x and y:
        _need(x[0] == y[0] and x[3] == y[3], f"upsample {x} -> {y} changes batch or channels")
        _need(min(x[1], x[2]) > 0, f"upsample input {x} has an empty dimension")
        sh, sw = Fraction(y[1], x[1]), Fraction(y[2], x[2])
    elif op.attrs.get("scale") is not None:
        sc = op.attrs["scale"]
        vals = [sc, sc] if isinstance(sc, (int, float)) else list(sc)
        _need(len(vals) == 2, f"upsample scale {vals} needs [w, h]")
        try:
            sw, sh = (Fraction(float(v)) for v in vals)
        except (TypeError, ValueError, OverflowError):      # not a number, NaN, inf
            raise _Cpu(f"upsample scale {vals} is not a pair of finite numbers") from None
    else:
        raise _Cpu("upsample without scale or shapes")
    _need(sh.denominator == 1 and sw.denominator == 1 and sh >= 1 and sw >= 1,
          f"upsample scale {float(sw):g}x{float(sh):g} is not a positive integer",
          "use an integer scale factor")
    ish, isw = int(sh), int(sw)
    c = x[3] if x else _ic(op)
    if c is not None:
        _check_channels("upsample", c, ELEW_CG_MAX, t)
        lines = -(-ish // t.pp) * isw * -(-c // t.cp)                      # UG1414 resize NEAREST
        _need(lines <= t.bank_depth, f"upsample scale {isw}x{ish}: ceil({ish}/PP={t.pp})*{isw}*ceil({c}/{t.cp}) "
                                     f"= {lines} > bank_depth {t.bank_depth}", "use a smaller scale")
    return _dpu("eltwise", f"nearest x{isw}x{ish}: ELEW copies (§7.8)")


def _tile(op: OpDesc, t: Target) -> Placement:
    try:
        s = int(op.attrs.get("stride", op.attrs.get("scale", 1)))          # tile-fix stride, reorg scale
    except (TypeError, ValueError):
        raise _Cpu(f"tile stride {op.attrs.get('stride', op.attrs.get('scale'))!r} is not an integer") from None
    _need(s >= 1, f"tile stride {s} < 1")
    rev = _bool(op.attrs.get("reverse", False))
    x = _nhwc(_in(op))
    c = x[3] if x else None
    lim = CONV_CG_MAX * t.cp
    if c is not None:
        if rev:                                                              # UG1414 reorg
            _need(c % (s * s) == 0, f"tile channels {c} not divisible by stride^2 = {s * s}")
            _need(c <= lim, f"tile input channels {c} > 256*CP = {lim}", "use fewer channels")
        else:
            assert x is not None                              # c is only known from x
            _need(x[1] % s == 0 and x[2] % s == 0, f"tile H, W = {x[1]}, {x[2]} not divisible by {s}")
            _need(s * s * c <= lim, f"tile stride^2*channels = {s * s * c} > 256*CP = {lim}",
                  "use fewer channels")
    return _dpu("load/save", f"{'depth-to-space' if rev else 'space-to-depth'} by addressing (§7.8)")


def _strided_slice(op: OpDesc, t: Target) -> Placement:
    x = _in(op)
    strides = op.attrs.get("strides")
    if strides is not None:
        st = [int(v) for v in strides]
        _need(all(v >= 1 for v in st), f"strided_slice strides {st} must be >= 1")
        _need(not st or st[0] == 1, f"strided_slice batch stride {st[0]} != 1")
        rank = len(x) if x else 4
        cs = st[rank - 1] if len(st) >= rank else 1
        _need(cs == 1, f"strided_slice channel stride {cs} != 1", "slice channels with stride 1")
    return _dpu("load/save", "LOAD/SAVE addressing")


def _argmax(op: OpDesc, t: Target) -> Placement:
    _need(t.argmax, f"argmax: target {t.name or t.describe()} has no SAVE argmax")
    x = _in(op)
    rank = len(x) if x else None
    a = _axis(op, -1, rank)
    _need(a == -1 or (rank is not None and a == rank - 1), f"argmax along axis {a}, not the channel axis")
    c = x[-1] if x else None
    if c is not None:
        _need(c <= ARGMAX_MAX_CHANNELS, f"argmax over {c} channels > {ARGMAX_MAX_CHANNELS}")
    return _dpu("load/save", "SAVE argmax (§6.3)")
