"""Placement rules of the convolutions (CONV engine; depthwise on the ALU) and of dense layers, which run as 1x1
convolutions (compiler/rules.py states the rules)."""
from __future__ import annotations

from dataclasses import replace

from opendpu.compiler.rules_common import (ALU_CG_MAX, ALU_PAD_LT_MAX, ALU_PAD_RB_MAX, CONV_CG_MAX, OpDesc, Placement,
                                           _check_channels, _check_kernel, _check_pads, _check_rows, _check_stride,
                                           _check_weight_lines, _Cpu, _dpu, _fused, _ic, _in, _ints, _kernel, _need,
                                           _out, _pads, _pair, _shape)
from opendpu.isa.target import ALU_TYPES, Target


def _conv_channels(op: OpDesc, t: Target, transposed: bool):
    """(ic, oc, placement): a conv with group = C_in is placed as depthwise; any other group ≠ 1 is refused."""
    ic = _ic(op)
    ws = _shape(op.weight_shape)
    y = _out(op)
    oc = y[-1] if y else (ws[0] if ws else None)
    g = int(op.attrs.get("group", 1) or 1)
    if g != 1:
        if ic is not None and g == ic and (oc is None or oc % ic == 0):
            return ic, oc, _grouped_as_depthwise(op, t, ic, oc, transposed=transposed)
        raise _Cpu(f"conv groups {g} not 1 or C_in" + (f" ({ic})" if ic is not None else ""),
                   "use groups=1, or groups=C_in (a depthwise convolution)")
    return ic, oc, None


def _conv2d(op: OpDesc, t: Target) -> Placement:
    what = "conv"
    ic, oc, dw_place = _conv_channels(op, t, transposed=False)
    if dw_place is not None:
        return dw_place
    kw, kh = _kernel(op)
    sw, sh = _pair(op, "stride", 1)
    dw, dh = _pair(op, "dilation", 1)
    _check_kernel(what, kw, kh, t.conv_kernel_max)                       # §3.4 conv_limit "1-16"
    _check_stride(what, sw, sh, t.conv_stride_max)                       # §3.4 conv_limit "1-8"
    _need(min(dw, dh) >= 1, f"{what} dilation {dw}x{dh} < 1")
    _check_channels(what, ic, CONV_CG_MAX, t, "input channels")          # CONV channel_group 1..256
    _check_channels(what, oc, CONV_CG_MAX, t, "output channels")         # UG1414 oc ≤ 256·cp
    _check_weight_lines(what, kw, kh, ic, t, "CONVW")                    # UG1414 / §6.4 weight layout
    if ic is not None and max(dw, dh) > 1:                               # UG1414 dilation·ic ≤ 256·cp
        lim = CONV_CG_MAX * t.cp
        _need(max(dw, dh) * ic <= lim, f"{what} dilation {max(dw, dh)} * input channels {ic} = "
                                       f"{max(dw, dh) * ic} > {CONV_CG_MAX}*CP = {lim}",
              "reduce the dilation or the input channels")
    _check_pads(what, _pads(op, kw, kh, sw, sh, dw, dh), kw, kh, dw, dh)  # UG1414 pad ≤ (k−1)·d
    _check_rows(what, kh, sh, t)                                         # §6.4 gathering
    act = _fused("conv", op, t, what)                                    # §6.1, §7.2
    return _dpu("conv", f"CONV engine{act}")


def _grouped_as_depthwise(op: OpDesc, t: Target, ic: int, oc: int | None, transposed: bool) -> Placement:
    ws = _shape(op.weight_shape)
    mult = (oc // ic) if oc else 1
    new_ws = [mult, ws[1], ws[2], ic] if ws and len(ws) == 4 else None
    typ = "transposed-depthwise-conv2d" if transposed else "depthwise-conv2d"
    attrs = {k: v for k, v in op.attrs.items() if k != "group"}
    p = _depthwise(replace(op, type=typ, attrs=attrs, weight_shape=new_ws), t, transposed)
    return _dpu(p.engine, f"group == C_in: {p.reason}")


def _depthwise(op: OpDesc, t: Target, transposed: bool = False) -> Placement:
    what = "transposed-depthwise" if transposed else "depthwise"
    x = _in(op)
    ws = _shape(op.weight_shape)
    y = _out(op)
    c = x[-1] if x else (ws[-1] if ws and len(ws) == 4 else None)
    mult = ws[0] if ws and len(ws) == 4 else (y[-1] // c if (y and c and y[-1] % c == 0) else 1)
    if y and c and not ws and y[-1] % c:
        raise _Cpu(f"{what} output channels {y[-1]} not a multiple of C_in {c}")
    _need(mult == 1, f"{what} channel multiplier {mult} != 1",
          "use a channel multiplier of 1 (depthwise conv followed by a 1x1 conv)")
    kw, kh = _kernel(op)
    sw, sh = _pair(op, "stride", 1)
    dw, dh = _pair(op, "dilation", 1)
    _need(min(dw, dh) >= 1, f"{what} dilation {dw}x{dh} < 1")
    if transposed:
        kw_, kh_ = _transposed_phase_kernel(op, what, kw, kh, sw, sh, dw, dh, t.alu_kernel_max)
        pads = _pads(op, kw, kh, 1, 1)
        _check_pads(what, pads, kw, kh, 1, 1, ALU_PAD_LT_MAX, ALU_PAD_RB_MAX)
        _check_weight_lines(what, kw_, kh_, c, t, "DWCONVW")
        _check_rows(what, kh_, 1, t)
        eng = f"ALU dwconv (exec_mode 0) per stride phase, sub-kernel {kw_}x{kh_}"
    else:
        _check_kernel(what, kw, kh, t.alu_kernel_max)                    # §3.4 alu_limit "1-256"
        _check_stride(what, sw, sh, t.alu_stride_max)                    # §3.4 alu_limit "1-256"
        _check_pads(what, _pads(op, kw, kh, sw, sh, dw, dh), kw, kh, dw, dh,
                    ALU_PAD_LT_MAX, ALU_PAD_RB_MAX)                      # §3.4 pad_limit, UG1414
        _check_weight_lines(what, kw, kh, c, t, "DWCONVW")              # §6.8 / UG1414
        _check_rows(what, kh, sh, t)                                     # §6.8 gathering
        if c is not None and max(dw, dh) > 1:                            # UG1414 dilation·ic ≤ 256·cp
            lim = ALU_CG_MAX * t.cp
            _need(max(dw, dh) * c <= lim, f"{what} dilation {max(dw, dh)} * channels {c} = "
                                          f"{max(dw, dh) * c} > {ALU_CG_MAX}*CP = {lim}",
                  "reduce the dilation or the channels")
        eng = f"ALU {ALU_TYPES[0]} (exec_mode 0)"
    _check_channels(what, c, ALU_CG_MAX, t)                              # ALU channel_group 1..256
    act = _fused("alu", op, t, what)                                     # §6.1, §7.3
    return _dpu("alu", f"{eng}{act}")


def _transposed_phase_kernel(op, what, kw, kh, sw, sh, dw, dh, kmax) -> tuple[int, int]:
    """Checks common to both transposed convs; returns the per-phase sub-kernel (ceil(k/s))."""
    opad = op.attrs.get("output_padding")
    if opad is not None:
        vals = _ints(opad, 2, "output_padding")
        _need(not any(vals), "ConvTranspose output_padding must be 0",
              "use output_padding=0 (pad the output explicitly)")
    _need(dw == 1 and dh == 1, f"{what} dilation {dw}x{dh} != 1", "use dilation 1")
    _need(min(kw, kh) >= 1, f"{what} kernel {kw}x{kh} < 1")
    _need(min(sw, sh) >= 1, f"{what} stride {sw}x{sh} < 1")
    _need(kw >= sw and kh >= sh, f"{what} kernel {kw}x{kh} smaller than stride {sw}x{sh}",
          "use a kernel at least as large as the stride")
    kw_, kh_ = -(-kw // sw), -(-kh // sh)
    _need(max(kw_, kh_) <= kmax, f"{what} kernel/stride {kw}/{sw} x {kh}/{sh} -> {kw_}x{kh_} > {kmax}",
          f"keep ceil(kernel/stride) <= {kmax}")
    return kw_, kh_


def _transposed_conv2d(op: OpDesc, t: Target) -> Placement:
    what = "transposed-conv"
    ic, oc, dw_place = _conv_channels(op, t, transposed=True)
    if dw_place is not None:
        return dw_place
    kw, kh = _kernel(op)
    sw, sh = _pair(op, "stride", 1)
    dw, dh = _pair(op, "dilation", 1)
    kw_, kh_ = _transposed_phase_kernel(op, what, kw, kh, sw, sh, dw, dh, t.conv_kernel_max)  # UG1414
    _check_pads(what, _pads(op, kw, kh, 1, 1), kw, kh)                   # UG1414 pad 0..k−1
    _check_channels(what, ic, CONV_CG_MAX, t, "input channels")
    _check_channels(what, oc, CONV_CG_MAX, t, "output channels")
    _check_weight_lines(what, kw_, kh_, ic, t, "CONVW")
    _check_rows(what, kh_, 1, t)
    act = _fused("conv", op, t, what)
    return _dpu("conv", f"CONV engine per stride phase, sub-kernel {kw_}x{kh_}{act}")


def _depthwise_entry(op: OpDesc, t: Target) -> Placement:
    return _depthwise(op, t, transposed=False)


def _tdepthwise_entry(op: OpDesc, t: Target) -> Placement:
    return _depthwise(op, t, transposed=True)


def _matmul(op: OpDesc, t: Target) -> Placement:
    ws = _shape(op.weight_shape)
    _need(ws is not None, f"{op.type} of two activations (no constant weights)")
    assert ws is not None                                     # _need raised otherwise (for the type checker)
    x = _in(op)
    k = x[-1] if x else ws[-1]
    n = ws[0]
    attrs = {k_: v for k_, v in op.attrs.items() if k_ in ("nonlinear", "LEAKYRELU_alpha")}
    attrs.update(kernel=[1, 1], stride=[1, 1])
    conv = OpDesc(op.name, "conv2d", attrs, [[1, 1, 1, k]], [1, 1, 1, n], [n, 1, 1, k])   # weights [out, in]
    try:
        p = _conv2d(conv, t)
    except _Cpu as e:
        raise _Cpu(f"{op.type} as 1x1 conv2d: {e.reason}", e.hint) from None
    return _dpu(p.engine, f"as 1x1 conv2d: {p.reason}")
