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

Modules: each family's rules live in `rules_conv` (conv2d, depthwise, transposed, matmul), `rules_pool`,
`rules_eltwise` (eltwise and the standalone activations) and `rules_move` (data movement), on the limits, readers
and shared checks of `rules_common`; this module holds the kind registry (`_RULES` and the type aliases), `place`,
`limits` and the report.
"""
from __future__ import annotations

from dataclasses import replace

from opendpu.compiler.fixpoint import LEAKY_ALPHA, MULTI_FACTOR_MAX
from opendpu.compiler.rules_common import (_ACT_CODE, ALU_CG_MAX, ALU_PAD_LT_MAX, ALU_PAD_RB_MAX, ARGMAX_MAX_CHANNELS,
                                           CONV_CG_MAX, ELEW_ACT_CODES, ELEW_CG_MAX, ELEW_NUM_MAX, GATHER_PASSES,
                                           OpDesc, Placement, _Cpu, _dpu, fusable_nonlinear)
from opendpu.compiler.rules_conv import (_conv2d, _depthwise_entry, _matmul, _tdepthwise_entry,
                                         _transposed_conv2d)
from opendpu.compiler.rules_eltwise import _eltwise, _hsigmoid, _hswish, _leaky, _prelu, _relu, _relu6
from opendpu.compiler.rules_move import _argmax, _concat, _reshape, _strided_slice, _tile, _transpose, _upsample
from opendpu.compiler.rules_pool import _pool
from opendpu.isa.target import Target

__all__ = ["OpDesc", "Placement", "place", "limits", "inspect_table", "format_report",
           "fusable_nonlinear", "LEAKY_ALPHA"]


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
