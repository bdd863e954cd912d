"""DPU/CPU placement rules for DPUCZDX8G ISA1: the one rule set shared by the quantizer's inspector
and the compiler.

`place(op, target)` decides, for one op in XIR terms (`OpDesc`, NHWC, XIR attribute names; a trailing
"-fix" in the type is ignored), whether the DPU of `target` can execute it and on which engine, or why
it must run on the CPU, with a hint in the style of UG1414 on how to change the model. `limits(target)`
lists the numeric limits in force; `format_report` writes an ``inspect_<target>.txt``-style text.

Sources: the ISA spec (``dpuczdx8g-isa1.md``; "§" below), its field ranges (`isa.fields`, spec §4.3),
the `Target` (every size, depth, parallelism and feature flag), and UG1414 Table 28 (the
DPUCZDX8G_ISA1_B4096 column, with cp/bank_depth/bank_num read from the target; spec §3.4 quotes the
conv rules). Sizes in messages are printed ``w x h`` (the XIR attribute order); pads are
``[left, right, top, bottom]``.

Rules
-----
conv2d (CONV engine, §3.4 conv_limit, §6.4, §7.2, UG1414):
  * kernel w, h in 1..target.conv_kernel_max (16); stride w, h in 1..target.conv_stride_max (8);
  * weights of one output channel fit one CONVW bank: kw·kh·ceil(ic/CP) ≤ bank_depth (UG1414);
  * ic ≤ 256·CP (CONV channel_group field 1..256; UG1414 "In Size"); oc ≤ 256·CP (UG1414 "Out Size");
  * dilation·ic ≤ 256·CP (UG1414); each pad ≤ (k−1)·dilation (UG1414);
  * group 1; group == C_in is a depthwise convolution (depthwise rules; multiplier must be 1); any
    other group → CPU;
  * fused nonlinear: act_type must be in target.conv_nonlinear (§6.1): NONE, RELU, RELU6 always;
    LEAKYRELU only with CV_LKRL and LEAKYRELU_alpha == 26/256 exactly (§6.1, §7.2); PRELU, HSIGMOID,
    HSWISH are never fused on CONV (§7.2) → CPU, hint: keep the activation as a separate op (ALU).
  * RELU6 is always accepted: act 4 when fp_out ≤ 4, otherwise act 1 gives the reference result (the
    reference clamps at 96 only for fp_out ≤ 4, §7.2).
depthwise-conv2d (ALU dwconv, exec_mode 0/6, §3.4 alu_limit/pad_limit, §6.8, §7.3, UG1414):
  * kernel 1..alu_kernel_max (256), stride 1..alu_stride_max (256); channel multiplier 1 (§7.9);
  * pads: left/top ≤ 15 (4-bit ALU fields = prototxt pad_limit "0-15"), right/bottom ≤ 255 (8-bit
    fields = pad_limit "0-255"), every pad ≤ (k−1)·dilation. DECISION: the target description's
    pad_limit is used, not UG1414's symmetric min(k−1, 15);
  * C ≤ 256·CP (ALU channel_group field); weights kw·kh·ceil(C/CP) ≤ bank_depth (one DWCONVW bank,
    §6.8 weight-line formula, = UG1414 "In Size"); dilation·C ≤ 256·CP (UG1414);
  * fused nonlinear from target.alu_nonlinear: NONE, RELU, RELU6; LEAKYRELU only with DW_LKRL and
    alpha 26/256; PRELU/HSIGMOID/HSWISH not fused (§7.3; UG1414 lists them, the ISA1 ALU has no code).
transposed-conv2d (CONV, §7.8/§7.9, UG1414): output_padding must be 0; dilation must be 1 (DECISION);
  realised as stride² phases, each a stride-1 CONV with kernel ceil(k/s): needs s ≤ k and
  ceil(k/s) ≤ 16 (UG1414 "kernel/stride in [1,16]"); no separate stride limit (DECISION); pads
  0..k−1 (UG1414); weights per phase ceil(kw/sw)·ceil(kh/sh)·ceil(ic/CP) ≤ bank_depth (DECISION:
  phases are loaded one at a time); ic, oc ≤ 256·CP; nonlinear as conv2d; group == C_in → transposed
  depthwise.
transposed-depthwise-conv2d: same phase rule with the ALU kernel limit (ceil(k/s) ≤ 256), pads as
  depthwise, multiplier 1, weights per phase in DWCONVW, nonlinear as depthwise.
window rows (§6.4 / §6.8 gathering check, CONV and ALU): one instruction reads its window rows from at
  most 4 passes over the PP image banks with stride_h sub-rows per bank, so ceil(kh/sh) ≤ 4·PP.
  DECISION: enforced for conv, depthwise and non-global pools (it only bites for ALU kernels taller
  than 4·PP at small strides, or for PP=2 cores); a pool with a single output row (global) may use
  any stride, so it is exempt. Splitting windows over several instructions is not assumed.
pool (ALU max_pool 3 / avg_pool 2, §6.8, §7.4, UG1414):
  * type MAX or AVG; kernel/stride in the ALU ranges; pads as depthwise; C ≤ 256·CP;
  * UG1414: ceil(kh/PP)·kw ≤ bank_depth; no fused nonlinear (the ALU pool modes apply none);
  * AVG: multi_factor N of avg_pool_factor(kh, kw) ≤ 127 (signed 8-bit field, §7.4, §9.10);
    count_include_pad == False with a non-zero pad → CPU (the reference/DPU always divides by the full
    kernel, §7.9);
  * global: kernel = input H×W, stride irrelevant;
  * fix points are not known here: the ALU takes any change whose exponent (MAX fp_out − fp_in, AVG
    fp_out − fp_in − M) has a shift_cut code, −55…7 (§7.4); an avg pool keeps its own output fix point
    (quant.solve_fix_points keeps the exponent ≤ 7), and codegen sends one outside the range to the CPU;
  * ceil_mode / windows that overrun the padded input (from out_shape, or from the ceil formula):
    MAX → DPU with the overrun added to the bottom/right pad (−128 padding never wins, §7.4; the pad
    limits still apply); AVG → CPU (the float model divides border windows by the clipped size).
eltwise (ELEW, §6.7, §7.5): ADD with 1..4 inputs (ELEW num field 1..4; DECISION: more inputs → CPU,
  since a chain of ELEWs rounds in between); MUL with exactly 2 inputs (§6.7 "multiply requires
  num == 2"); C ≤ 256·CP; nonlinear NONE or RELU (ELEW act_type is 1 bit); broadcasting (DECISION):
  an operand may have H == 1 and/or W == 1 with the same C (ELEWINIT share_pp repeats a row,
  jump_read 0 repeats a column; unexercised by real programs), e.g. squeeze-excite [1,1,1,C] scaling;
  broadcasting along C → CPU. Types LEAKY-RELU / PRELU are the standalone activations below.
concat (data movement, §7.8): along H, W or C (DECISION: any non-batch axis; producers write into the
  output's DDR/bank image at an offset); along the batch axis → CPU. A fix-point change costs one ELEW.
reshape / flatten / squeeze / unsqueeze / identity (§7.8: no instructions, aliases the NHWC DDR image):
  DPU when the element count and the batch dimension are unchanged (DECISION).
transpose: DPU only as a layout no-op (the axes of size > 1 keep their order); otherwise CPU (DECISION).
upsample / resize: NEAREST only, integer scale ≥ 1, align_corners and half_pixel_centers false (as
  the reference, §7.9); ELEW copies (§7.8); UG1414: ceil(scale_h/PP)·scale_w·ceil(C/CP) ≤ bank_depth;
  C ≤ 256·CP. BILINEAR → CPU (UG1414's pad + depthwise-transposed-conv rewrite is not done).
tile / reorg (§7.8, UG1414 reorg): reverse → C ≤ 256·CP; not reverse → stride²·C ≤ 256·CP.
strided_slice (UG1414): batch and channel strides 1, strides ≥ 1 → LOAD/SAVE addressing.
hard-sigmoid → ALU exec_mode 7 (§7.6); hard-swish → ALU hard-sigmoid + ELEW multiply;
relu → ELEW single-input ADD with ReLU (DECISION; validated pattern §6.7); relu6 → ALU 1×1 identity
  dwconv with act ReLU6 (DECISION); leaky-relu → ALU leaky_relu exec_mode 4: alpha must be m/2^s with
  |m| ≤ 127 (multi_factor) and s ≤ 31 (shift code, §7.7), XIR default alpha 0.01 as in the reference;
  prelu → ALU exec_mode 1 (per-channel int8 slopes, one slope per channel or one for all).
argmax → SAVE argmax (§6.3): target.argmax, channel axis, C ≤ 128.
softmax, sigmoid, tanh, exp, pad and every unknown type → CPU "<type> is not supported by the DPU
  (DPUCZDX8G ISA1 has no <type> engine)". DECISION: a standalone pad is CPU (hint: fold a zero pad into
  the next conv/pool's pad attribute).
data → device "USER" (graph input, host buffer); const → DPU "load/save" (weights/bias are loaded).
matmul / inner-product / gemm / dense with constant weights → conv2d 1×1 (UG1414 "transformed into
  conv2d"); with two activation inputs → CPU.
Feature-map sizes: no limit (DECISION). The spec has none per op: widths and heights are tiled over
instructions (CONV length 1..1024, ALU/ELEW 1..2048 columns, PP / ALU_PP rows each) and DDR images are
addressed by LOAD/SAVE; only the window and weight rules above bound a single instruction.
Missing attributes: a value that cannot be read (e.g. no kernel and no weight shape) puts the op on the
CPU with the reason; unknown shapes skip the checks that need them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction

from opendpu.compiler.fixpoint import (LEAKY_ALPHA, MULTI_FACTOR_MAX, PRELU_SHIFT_MAX, avg_pool_factor,
                                       slope_encoding, slope_fits_alu)
from opendpu.compiler import poolsplit
from opendpu.isa.fields import FIELDS
from opendpu.isa.target import ALU_TYPES, Target

__all__ = ["OpDesc", "Placement", "place", "limits", "inspect_table", "format_report",
           "fusable_nonlinear", "LEAKY_ALPHA"]


# ---- ISA constants (field ranges of spec §4.3, read from isa.fields) ---------------------------------

def _field(instr: str, name: str):
    for f in FIELDS[instr]:
        if f.name == name:
            return f
    raise KeyError(f"{instr}.{name}")


CONV_CG_MAX = _field("CONV", "channel_group").hi            # 256 input channel groups per CONV
ALU_CG_MAX = _field("ALUINIT", "channel_group").hi          # 256
ELEW_CG_MAX = _field("ELEW", "channel_group").hi            # 256
ELEW_NUM_MAX = _field("ELEW", "num").hi                     # 4 inputs
ELEW_ACT_CODES = tuple(range(_field("ELEW", "act_type").hi + 1))   # (0, 1): none, ReLU
ALU_PAD_LT_MAX = _field("ALU", "pad_left").hi               # 15 (== _field("ALU", "pad_top").hi)
ALU_PAD_RB_MAX = _field("ALU", "pad_right").hi              # 255 (== pad_bottom)
# MULTI_FACTOR_MAX (127: multi_factor is read as signed int8, §6.8, §9.10), PRELU_SHIFT_MAX (31: ALU shift
# codes are "32 + r", §7.7) and LEAKY_ALPHA (26/256, §6.1) come from compiler.fixpoint.
# passes over the image bank group: bank_addr_in, _in_1, _in_2, _in_3 (§6.4)
GATHER_PASSES = sum(1 for f in FIELDS["CONV"] if f.name.startswith("bank_addr_in"))   # 4
ARGMAX_MAX_CHANNELS = 128      # §6.3: the simulator keeps the argmax index in a signed byte

assert _field("ALU", "pad_top").hi == ALU_PAD_LT_MAX and _field("ALU", "pad_bottom").hi == ALU_PAD_RB_MAX

# act_type codes of §6.1 by XIR nonlinear name
_ACT_CODE = {"NONE": 0, "RELU": 1, "PRELU": 2, "LEAKYRELU": 3, "RELU6": 4, "HSIGMOID": 5, "HSWISH": 6}
_ACT_TEXT = {"NONE": "none", "RELU": "ReLU", "PRELU": "PReLU", "LEAKYRELU": "LeakyReLU", "RELU6": "ReLU6",
             "HSIGMOID": "hard-sigmoid", "HSWISH": "hard-swish"}
_NL_ALIASES = {"": "NONE", "LEAKY-RELU": "LEAKYRELU", "LEAKY_RELU": "LEAKYRELU", "HARD-SIGMOID": "HSIGMOID",
               "HARDSIGMOID": "HSIGMOID", "HARD-SWISH": "HSWISH", "HARDSWISH": "HSWISH"}


# ---- data types ----------------------------------------------------------------------------------

@dataclass
class OpDesc:
    """An op in XIR terms (NHWC layout), independent of ONNX."""
    name: str
    type: str                 # XIR op type, with or without "-fix"
    attrs: dict = field(default_factory=dict)         # XIR attribute names (kernel/stride/dilation [w,h],
    #                                                   pad [left,right,top,bottom], group, nonlinear, ...)
    in_shapes: list = field(default_factory=list)     # NHWC shapes of the data inputs (not weights)
    out_shape: list = field(default_factory=list)
    weight_shape: list | None = None                  # OHWI (depthwise: [mult, kh, kw, C])


@dataclass(frozen=True)
class Placement:
    device: str        # "DPU", "CPU" (or "USER" for graph inputs)
    engine: str        # "conv", "alu", "eltwise", "load/save"; "" for CPU/USER
    reason: str        # CPU: why; DPU: what it maps to
    hint: str = ""     # how to change the model to get it onto the DPU


class _Cpu(Exception):
    def __init__(self, reason: str, hint: str = ""):
        super().__init__(reason)
        self.reason, self.hint = reason, hint


def _need(cond: bool, reason: str, hint: str = "") -> None:
    if not cond:
        raise _Cpu(reason, hint)


def _dpu(engine: str, reason: str) -> Placement:
    return Placement("DPU", engine, reason)


# ---- attribute / shape helpers -------------------------------------------------------------------

def _ints(v, n: int, what: str) -> tuple[int, ...]:
    try:
        if isinstance(v, (int, float)) or (hasattr(v, "ndim") and v.ndim == 0):
            vals = [v] * n
        else:
            vals = list(v)
            if n == 4 and len(vals) == 2:          # [w, h] -> left=right=w, top=bottom=h
                vals = [vals[0], vals[0], vals[1], vals[1]]
        out = tuple(int(x) for x in vals)
        if any(float(x) != int(x) for x in vals):
            raise ValueError
    except (TypeError, ValueError):
        raise _Cpu(f"attribute {what} {v!r} is not {n} integers") from None
    if len(out) != n:
        raise _Cpu(f"attribute {what} {list(out)} needs {n} values")
    return out


def _pair(op: OpDesc, key: str, default) -> tuple[int, int]:
    v = op.attrs.get(key)
    if v is None:
        if default is None:
            raise _Cpu(f"attribute {key} missing")
        v = default
    a, b = _ints(v, 2, key)
    return a, b


def _bool(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes")
    return bool(v)


def _shape(s) -> list[int] | None:
    if s is None:
        return None
    try:
        s = [int(d) for d in s]
    except (TypeError, ValueError):
        return None
    return s or None


def _in(op: OpDesc, i: int = 0) -> list[int] | None:
    return _shape(op.in_shapes[i]) if len(op.in_shapes) > i else None


def _out(op: OpDesc) -> list[int] | None:
    return _shape(op.out_shape)


def _nhwc(s: list[int] | None) -> list[int] | None:
    """A shape as 4-D NHWC ([N,C] -> [N,1,1,C], [N,W,C] -> [N,1,W,C], [C] -> [1,1,1,C]); None if > 4-D."""
    if s is None or len(s) > 4:
        return None
    if len(s) == 1:
        return [1, 1, 1, s[0]]
    if len(s) == 2:
        return [s[0], 1, 1, s[1]]
    if len(s) == 3:
        return [s[0], 1, s[1], s[2]]
    return list(s)


def _ic(op: OpDesc) -> int | None:
    x = _in(op)
    if x:
        return x[-1]
    ws = _shape(op.weight_shape)
    return ws[-1] if ws else None


def _kernel(op: OpDesc) -> tuple[int, int]:
    """(kw, kh) from attrs["kernel"] [w, h], else from the OHWI weight shape."""
    if op.attrs.get("kernel") is not None:
        return _pair(op, "kernel", None)
    ws = _shape(op.weight_shape)
    if ws and len(ws) == 4:
        return ws[2], ws[1]
    raise _Cpu("attribute kernel missing (and no weight shape)")


def _pads(op: OpDesc, kw: int, kh: int, sw: int, sh: int, dw: int = 1, dh: int = 1) -> list[int]:
    """[left, right, top, bottom]; SAME without explicit pads is derived from the shapes as the reference."""
    if op.attrs.get("pad") is not None:
        return list(_ints(op.attrs["pad"], 4, "pad"))
    x, y = _nhwc(_in(op)), _nhwc(_out(op))
    if str(op.attrs.get("pad_mode", "")).upper() == "SAME" and x and y:
        th = max((y[1] - 1) * sh + dh * (kh - 1) + 1 - x[1], 0)
        tw = max((y[2] - 1) * sw + dw * (kw - 1) + 1 - x[2], 0)
        return [tw // 2, tw - tw // 2, th // 2, th - th // 2]
    return [0, 0, 0, 0]


def _norm_nl(v) -> str:
    s = str(v if v is not None else "NONE").strip().upper()
    return _NL_ALIASES.get(s, s)


_SIDES = (("left", 0, "w"), ("right", 1, "w"), ("top", 2, "h"), ("bottom", 3, "h"))


# ---- shared checks -------------------------------------------------------------------------------

def _check_kernel(what: str, kw: int, kh: int, kmax: int, hint: str = "") -> None:
    _need(min(kw, kh) >= 1, f"{what} kernel {kw}x{kh} < 1")
    _need(max(kw, kh) <= kmax, f"{what} kernel {kw}x{kh} > {kmax}",
          hint or f"use kernels of at most {kmax}x{kmax} (e.g. stack smaller convolutions)")


def _check_stride(what: str, sw: int, sh: int, smax: int, hint: str = "") -> None:
    _need(min(sw, sh) >= 1, f"{what} stride {sw}x{sh} < 1")
    _need(max(sw, sh) <= smax, f"{what} stride {sw}x{sh} > {smax}",
          hint or f"use strides of at most {smax} (e.g. a smaller stride followed by pooling)")


def _check_pads(what: str, pads, kw: int, kh: int, dw: int = 1, dh: int = 1,
                lt_max: int | None = None, rb_max: int | None = None) -> None:
    """Every pad in 0..(k-1)*dilation (UG1414); optional ALU field limits (§3.4 pad_limit)."""
    k = {"w": (kw, dw), "h": (kh, dh)}
    for side, i, axis in _SIDES:
        p = pads[i]
        kk, d = k[axis]
        _need(p >= 0, f"{what} pad_{side} {p} < 0", "crop explicitly instead of a negative pad")
        lim = (kk - 1) * d
        formula = f"(kernel_{axis}-1)*dilation_{axis}" if d != 1 else f"kernel_{axis}-1"
        _need(p <= lim, f"{what} pad_{side} {p} > {formula} = {lim}",
              f"reduce pad_{side} to at most {lim} (pad the input explicitly on the CPU side otherwise)")
        fmax = lt_max if side in ("left", "top") else rb_max
        if fmax is not None:
            _need(p <= fmax, f"{what} pad_{side} {p} > {fmax} (ALU pad_{side} field, pad_limit)",
                  f"reduce pad_{side} to at most {fmax}")


def _check_rows(what: str, kh: int, sh: int, t: Target) -> None:
    """§6.4/§6.8: window rows come from ≤ 4 passes over the PP image banks, stride_h sub-rows each."""
    slots = -(-kh // sh)
    lim = GATHER_PASSES * t.pp
    _need(slots <= lim, f"{what} window of {kh} rows at stride {sh} spans {slots} bank rows > "
                        f"{GATHER_PASSES}*PP = {lim}",
          f"use a kernel height of at most {lim * sh} at stride {sh}")


def _check_channels(what: str, c: int | None, cg_max: int, t: Target, label: str = "channels") -> None:
    if c is None:
        return
    lim = cg_max * t.cp
    _need(c <= lim, f"{what} {label} {c} > {cg_max}*CP = {lim}",
          f"use at most {lim} {label} (split the layer)")


def _check_weight_lines(what: str, kw: int, kh: int, c: int | None, t: Target, bank: str) -> None:
    if c is None:
        return
    cg = -(-c // t.cp)
    n = kw * kh * cg
    _need(n <= t.bank_depth, f"{what} weights {kw}*{kh}*ceil({c}/{t.cp}) = {n} lines > bank_depth "
                             f"{t.bank_depth} ({bank} bank)",
          "reduce the kernel size or the input channels: kernel_w*kernel_h*ceil(ic/CP) <= bank_depth")


def fusable_nonlinear(engine: str, nonlinear, target: Target, alpha=None) -> str | None:
    """None if XIR `nonlinear` can be fused into `engine` ("conv", "alu", "eltwise") on `target`,
    else the reason (§6.1 act_type support, §7.2 leaky slope)."""
    t = target
    nl = _norm_nl(nonlinear)
    eng = {"conv": "CONV", "alu": "ALU", "eltwise": "ELEW"}[engine]
    if nl not in _ACT_CODE:
        return f"unknown nonlinear {nonlinear!r}"
    codes = {"conv": t.conv_nonlinear, "alu": t.alu_nonlinear, "eltwise": ELEW_ACT_CODES}[engine]
    if _ACT_CODE[nl] not in codes:
        if nl == "LEAKYRELU" and engine != "eltwise":
            flag = "CV_LKRL" if engine == "conv" else "DW_LKRL"
            return f"LeakyReLU is not fused on the {eng} engine: target {t.name or t.describe()} lacks {flag}"
        names = ", ".join(_ACT_TEXT[n] for n, c in _ACT_CODE.items() if c in codes)
        return f"{_ACT_TEXT[nl]} is not fused on the {eng} engine (ISA1 {eng} activations: {names})"
    if nl == "LEAKYRELU":
        if alpha is None:
            return "LeakyReLU without LEAKYRELU_alpha"
        try:
            a = Fraction(float(alpha))
        except (TypeError, ValueError, OverflowError):          # OverflowError: inf
            return f"LeakyReLU alpha {alpha!r} is not a number"
        if a != LEAKY_ALPHA:
            return (f"LeakyReLU alpha {float(alpha):g} != 26/256 (0.1015625), the slope hard-wired in the "
                    f"{eng} engine")
    return None


def _nl_hint(nl: str, engine: str) -> str:
    if nl == "LEAKYRELU":
        return ("use LeakyReLU(negative_slope=0.1015625) (= 26/256) on a target with the leaky option, "
                "or keep it as a separate op (ALU leaky_relu)")
    if nl in ("PRELU", "HSIGMOID", "HSWISH", "RELU6"):
        return f"keep {_ACT_TEXT[nl]} as a separate op (it maps to the ALU) instead of fusing it"
    return "keep the activation as a separate op"


def _fused(engine: str, op: OpDesc, t: Target, what: str) -> str:
    """Check the fused nonlinear; returns the text for the DPU reason ('' or ', ReLU fused')."""
    nl = _norm_nl(op.attrs.get("nonlinear", "NONE"))
    why = fusable_nonlinear(engine, nl, t, op.attrs.get("LEAKYRELU_alpha"))
    if why:
        raise _Cpu(f"{what}: {why}", _nl_hint(nl, engine))
    if nl == "NONE":
        return ""
    if nl == "LEAKYRELU":
        return ", LeakyReLU (26/256) fused"
    return f", {_ACT_TEXT[nl]} fused"


# ---- convolutions --------------------------------------------------------------------------------

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


# ---- pooling -------------------------------------------------------------------------------------

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


# ---- element-wise and activations ----------------------------------------------------------------

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


# ---- data movement -------------------------------------------------------------------------------

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


_UNSUPPORTED_HINTS = {
    "softmax": "keep softmax at the end of the model (it runs on the CPU)",
    "sigmoid": "use Hardsigmoid (ALU hard-sigmoid) instead",
    "swish": "use Hardswish (ALU hard-sigmoid + ELEW multiply) instead",
    "silu": "use Hardswish (ALU hard-sigmoid + ELEW multiply) instead",
    "pad": "fold a zero (CONSTANT 0) pad into the pad attribute of the following conv/pool",
}

_RULES = {
    "conv2d": _conv2d,
    "depthwise-conv2d": _depthwise_entry,
    "transposed-conv2d": _transposed_conv2d,
    "transposed-depthwise-conv2d": _tdepthwise_entry,
    "pool": _pool,
    "eltwise": _eltwise,
    "concat": _concat,
    "reshape": _reshape,
    "transpose": _transpose,
    "upsample": _upsample,
    "tile": _tile,
    "strided_slice": _strided_slice,
    "hard-sigmoid": _hsigmoid,
    "hard-swish": _hswish,
    "relu": _relu,
    "relu6": _relu6,
    "leaky-relu": _leaky,
    "prelu": _prelu,
    "argmax": _argmax,
    "matmul": _matmul,
}

# alias -> (canonical type, attrs implied by the alias)
_ALIASES = {
    "conv": ("conv2d", {}), "dwconv2d": ("depthwise-conv2d", {}),
    "depthwise-transposed-conv2d": ("transposed-depthwise-conv2d", {}),
    "conv2d-transpose": ("transposed-conv2d", {}),
    "maxpool2d": ("pool", {"type": "MAX"}), "avgpool2d": ("pool", {"type": "AVG"}),
    "add": ("eltwise", {"type": "ADD"}), "mul": ("eltwise", {"type": "MUL"}),
    "hsigmoid": ("hard-sigmoid", {}), "hswish": ("hard-swish", {}), "hardswish": ("hard-swish", {}),
    "hardsigmoid": ("hard-sigmoid", {}), "leakyrelu": ("leaky-relu", {}),
    "flatten": ("reshape", {}), "squeeze": ("reshape", {}), "unsqueeze": ("reshape", {}),
    "identity": ("reshape", {}), "resize": ("upsample", {}), "reorg": ("tile", {}),
    "strided-slice": ("strided_slice", {}), "inner-product": ("matmul", {}), "gemm": ("matmul", {}),
    "dense": ("matmul", {}),
}


def _canonical(typ: str) -> tuple[str, dict]:
    t = str(typ).strip().lower()
    if t.endswith("-fix"):
        t = t[:-4]
    if t in _RULES or t in ("data", "const", "upload", "download"):
        return t, {}
    k = t.replace("_", "-")
    if k in _ALIASES:
        return _ALIASES[k]
    if k in _RULES:
        return k, {}
    return t, {}


def place(op: OpDesc, target: Target) -> Placement:
    """Where `op` runs on `target`: DPU engine and what it maps to, or CPU and why (with a hint)."""
    t, implied = _canonical(op.type)
    if implied:
        op = replace(op, attrs={**op.attrs, **{k: v for k, v in implied.items() if k not in op.attrs}})
    if t == "data":
        return Placement("USER", "", "graph input (host buffer)")
    if t == "const":
        return Placement("DPU", "load/save", "constant (weights/bias, loaded by LOAD)")
    if t in ("upload", "download"):
        return _dpu("load/save", f"{t}: host <-> DPU boundary, no instructions")
    if t == "onnx-op":          # an ONNX node the quantizer kept in float: its own reason
        why = str(op.attrs.get("cpu_reason") or "it has no DPU form")
        return Placement("CPU", "", f"ONNX {op.attrs.get('onnx_op_type', '?')}: {why}")
    rule = _RULES.get(t)
    if rule is None:
        return Placement("CPU", "", f"{t} is not supported by the DPU (DPUCZDX8G ISA1 has no {t} engine)",
                         _UNSUPPORTED_HINTS.get(t, ""))
    try:
        return rule(op, target)
    except _Cpu as e:
        return Placement("CPU", "", e.reason, e.hint)


def inspect_table(ops: list[OpDesc], target: Target) -> list[Placement]:
    return [place(op, target) for op in ops]


# ---- limits and report ---------------------------------------------------------------------------

def limits(target: Target) -> dict:
    """The numeric limits in force for `target` (ranges are (lo, hi) tuples)."""
    t = target
    return {
        "pp": t.pp, "cp": t.cp, "alu_pp": t.alu_pp, "bank_depth": t.bank_depth,
        "conv_kernel": (1, t.conv_kernel_max),
        "conv_stride": (1, t.conv_stride_max),
        "conv_weight_lines": t.bank_depth,                  # kw*kh*ceil(ic/CP) <=
        "conv_max_in_channels": CONV_CG_MAX * t.cp,
        "conv_max_out_channels": CONV_CG_MAX * t.cp,
        "conv_max_dilation_x_ic": CONV_CG_MAX * t.cp,
        "conv_nonlinear": tuple(n for n, c in _ACT_CODE.items() if c in t.conv_nonlinear),
        "leaky_alpha": float(LEAKY_ALPHA),
        "window_max_bank_rows": GATHER_PASSES * t.pp,       # ceil(kh/sh) <=
        "alu_kernel": (1, t.alu_kernel_max),
        "alu_stride": (1, t.alu_stride_max),
        "alu_pad_left_top": (0, ALU_PAD_LT_MAX),
        "alu_pad_right_bottom": (0, ALU_PAD_RB_MAX),
        "alu_max_channels": ALU_CG_MAX * t.cp,
        "alu_weight_lines": t.bank_depth,                   # kw*kh*ceil(C/CP) <= (DWCONVW)
        "alu_nonlinear": tuple(n for n, c in _ACT_CODE.items() if c in t.alu_nonlinear),
        "avg_pool_max_multi_factor": MULTI_FACTOR_MAX,
        "pool_window_lines": t.bank_depth,                  # ceil(kh/PP)*kw <=
        "elew_add_inputs": (1, ELEW_NUM_MAX),
        "elew_mul_inputs": (2, 2),
        "elew_max_channels": ELEW_CG_MAX * t.cp,
        "elew_nonlinear": tuple(n for n, c in _ACT_CODE.items() if c in ELEW_ACT_CODES),
        "upsample_lines": t.bank_depth,                     # ceil(s_h/PP)*s_w*ceil(C/CP) <=
        "argmax_max_channels": ARGMAX_MAX_CHANNELS if t.argmax else 0,
    }


def _fmt_limit(v) -> str:
    if isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, int) for x in v):
        return f"{v[0]}..{v[1]}"
    if isinstance(v, tuple):
        return ", ".join(str(x) for x in v) or "-"
    return str(v)


def format_report(ops: list[OpDesc], placements: list[Placement] | None, target: Target) -> str:
    """An inspect_<target>.txt-style report: target, fingerprint, limits, then one line per op."""
    t = target
    if placements is None:
        placements = inspect_table(ops, t)
    if len(placements) != len(ops):
        raise ValueError(f"{len(ops)} ops but {len(placements)} placements")
    fp = f"0x{t.fingerprint:016X}" if t.fingerprint is not None else "(none)"
    lines = ["# opendpu inspector report",
             f"target: {t.name or t.describe()}",
             f"fingerprint: {fp}",
             f"size: {t.size_name} (PP {t.pp}, CP {t.cp}, ALU_PP {t.alu_pp}, bank_depth {t.bank_depth}, "
             f"CV_LKRL {int(t.cv_lkrl)}, DW_LKRL {int(t.dw_lkrl)}, argmax {int(t.argmax)})",
             "limits:"]
    lim = limits(t)
    kw = max(len(k) for k in lim)
    lines += [f"  {k.ljust(kw)}  {_fmt_limit(v)}" for k, v in lim.items()]
    counts: dict[str, int] = {}
    for p in placements:
        counts[p.device] = counts.get(p.device, 0) + 1
    lines.append(f"ops: {len(ops)} (" + ", ".join(f"{d} {n}" for d, n in sorted(counts.items())) + ")")
    if ops:
        wn = max(len(o.name) for o in ops)
        wt = max(len(o.type) for o in ops)
        wd = max(len(p.device) for p in placements)
        for o, p in zip(ops, placements):
            s = f"{o.name.ljust(wn)}  {o.type.ljust(wt)}  {p.device.ljust(wd)}  {p.reason}"
            if p.hint:
                s += f"  [hint: {p.hint}]"
            lines.append(s)
    return "\n".join(lines) + "\n"
