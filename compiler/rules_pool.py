"""Placement rules of max and average pools (ALU exec_mode 3 / 2; compiler/rules.py states the rules)."""
from __future__ import annotations

from opendpu.compiler import poolsplit
from opendpu.compiler.fixpoint import MULTI_FACTOR_MAX, avg_pool_factor
from opendpu.compiler.rules_common import (_ACT_TEXT, ALU_CG_MAX, ALU_PAD_LT_MAX, ALU_PAD_RB_MAX, OpDesc, Placement,
                                           _bool, _check_channels, _check_kernel, _check_pads, _check_rows,
                                           _check_stride, _dpu, _in, _need, _nhwc, _norm_nl, _out, _pads, _pair)
from opendpu.isa.target import ALU_TYPES, Target


def _pool(op: OpDesc, t: Target) -> Placement:
    kind = str(op.attrs.get("type", "MAX")).upper()
    kind = "AVG" if kind in ("AVE", "AVERAGE", "MEAN") else kind
    _need(kind in ("MAX", "AVG"), f"pool type {kind} is not supported by the ALU (MAX, AVG)")
    what = f"{kind.lower()} pool"
    x, y = _nhwc(_in(op)), _nhwc(_out(op))
    glob = _bool(op.attrs.get("global", False))
    nl = _norm_nl(op.attrs.get("nonlinear", "NONE"))
    _need(nl == "NONE", f"{what}: {_ACT_TEXT.get(nl, nl)} is not fused on the ALU pool modes",
          "keep the activation as a separate op")
    if glob:
        _need(x is not None, f"global {what} without an input shape")
        assert x is not None                                  # _need raised otherwise (for the type checker)
        kh, kw = x[1], x[2]
        sh, sw = kh, kw
        pads = [0, 0, 0, 0]
    else:
        kw, kh = _pair(op, "kernel", None)
        sw, sh = _pair(op, "stride", (kw, kh))
        pads = _pads(op, kw, kh, sw, sh)
    _check_kernel(what, kw, kh, t.alu_kernel_max,
                  f"use pooling windows of at most {t.alu_kernel_max}")            # §3.4 alu_limit
    _check_stride(what, sw, sh, t.alu_stride_max)                                # §3.4 alu_limit
    note = ""
    if not glob and x is not None:
        # windows that overrun the padded input (ceil mode): from out_shape, else the ceil formula
        oh: int | None
        ow: int | None
        if y is not None:
            oh, ow = y[1], y[2]
        elif _bool(op.attrs.get("ceil_mode", False)) or str(op.attrs.get("pad_mode", "")).upper() == "CEIL":
            oh, ow = (_ceil_out(x[1], kh, sh, pads[2], pads[3]), _ceil_out(x[2], kw, sw, pads[0], pads[1]))
        else:
            oh = ow = None
        if oh is not None and ow is not None:
            ov_h = (oh - 1) * sh + kh - (pads[2] + x[1] + pads[3])
            ov_w = (ow - 1) * sw + kw - (pads[0] + x[2] + pads[1])
            if max(ov_h, ov_w) > 0:
                _need(kind == "MAX", f"{what} window overruns the padded input by {max(ov_w, 0)}x"
                                     f"{max(ov_h, 0)} (ceil_mode); the DPU divides by the full kernel",
                      "use ceil_mode=False, or pad the input so that every window fits")
                pads = [pads[0], pads[1] + max(ov_w, 0), pads[2], pads[3] + max(ov_h, 0)]
                note = f", ceil-mode overrun padded (+{max(ov_w, 0)} right, +{max(ov_h, 0)} bottom)"
            if oh == 1:
                sh = max(sh, kh)                  # a single output row: any stride will do
    if kind == "AVG" and any(pads):
        cip = op.attrs.get("count_include_pad")
        _need(cip is None or _bool(cip), f"{what} count_include_pad=False with padding {pads}; the DPU "
                                         f"always divides by the full kernel",
              "use count_include_pad=True, or remove the padding")
    _check_pads(what, pads, kw, kh, 1, 1, ALU_PAD_LT_MAX, ALU_PAD_RB_MAX)         # §3.4 pad_limit
    lines = -(-kh // t.pp) * kw                                                  # UG1414 pool kernel
    one_out = glob or (x is not None and (kh, kw) == (x[1], x[2]) and not any(pads))
    if kind == "AVG" and one_out and not poolsplit.fits(kh, kw, t.pp, t.bank_depth):
        sp = poolsplit.plan(kh, kw, t.pp, t.bank_depth)                         # compiler.poolsplit
        if sp is not None:
            _check_channels(what, x[3] if x else None, ALU_CG_MAX, t)
            return _dpu("alu", f"ALU {ALU_TYPES[2]} (exec_mode 2) in two passes: {sp.c}x{sp.a} stride {sp.c}x{sp.a}, "
                               f"then {sp.d}x{sp.b} global (window ceil({kh}/PP={t.pp})*{kw} = {lines} lines > "
                               f"bank_depth {t.bank_depth}; not bit-exact to one pass, compiler.poolsplit)")
    _need(lines <= t.bank_depth, f"{what} window ceil({kh}/PP={t.pp})*{kw} = {lines} > bank_depth "
                                 f"{t.bank_depth}", "use a smaller pooling window")
    if not glob:
        _check_rows(what, kh, sh, t)                                             # §6.8 gathering
    _check_channels(what, x[3] if x else None, ALU_CG_MAX, t)                   # ALU channel_group
    if kind == "AVG":
        n, m = avg_pool_factor(kh, kw)                                           # §7.4
        _need(n <= MULTI_FACTOR_MAX, f"{what} {kw}x{kh}: multi_factor {n} > {MULTI_FACTOR_MAX} "
                                     f"(1/{kh * kw} ~ {n}/2^{m})", "use another pooling window")
        return _dpu("alu", f"ALU {ALU_TYPES[2]} (exec_mode 2), multi_factor {n} (1/{kh * kw} ~ {n}/2^{m})"
                           f"{note}")
    return _dpu("alu", f"ALU {ALU_TYPES[3]} (exec_mode 3){note}")


def _ceil_out(n: int, k: int, s: int, p0: int, p1: int) -> int:
    o = -(-(n + p0 + p1 - k) // s) + 1
    if (o - 1) * s >= n + p0:              # the last window must start inside the input (PyTorch rule)
        o -= 1
    return o
