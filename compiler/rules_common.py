"""The placement rules' shared pieces (compiler/rules.py states the rules): the ISA limits read from `isa.fields`,
the op description and the placement, the attribute and shape readers, and the checks several op kinds share
(kernel, stride, pads, window rows, channels, weight lines, fused nonlinear)."""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from opendpu.compiler.fixpoint import LEAKY_ALPHA
from opendpu.isa.fields import FIELDS
from opendpu.isa.target import Target


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
