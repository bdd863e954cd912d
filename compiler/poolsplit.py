"""Average pools with one output pixel whose window does not fit the image banks, in two passes (docs/compiler.md,
"Global pools").

An ALU average pool with a single output pixel (a global pool, or a pool whose kernel covers its input) needs every
input row of one channel group in the image banks at once: ceil(kernel_h / PP) * kernel_w lines (UG1414, checked by
`compiler.rules`; the code generator spreads the rows over the PP banks, `codegen._one_row_stride`). A squeeze-excite
block at high resolution exceeds that (PP-OCRv4 det at 640x640: 160x160 on B4096; 80x160 on B512). Such a pool is
computed as

    pass 1: an a x c average pool with stride a x c  -> a (kh/a) x (kw/c) map at the input's fix point
    pass 2: the global average pool of that map      -> the op's own output and fix point

with a | kh and c | kw, so the windows tile the input and the mean of the means is the mean. It is not bit-exact
to the one-pass op: pass 1 rounds each partial mean to the input's LSB (the finest fix point that can never
saturate, since a mean never leaves its inputs' range; there is no calibration data in the compiler), and both
passes use the ALU's divisor N/2^M. `plan` states the worst-case deviation from the exact mean (in output LSBs,
before the final rounding) for the split and, for comparison, for a one-pass pool; `split_pools` records it in the
compile log, and the compiled graph holds both passes, so `sim` equals `ref` on it byte for byte.

Splits are searched over every divisor pair; the chosen one fits the banks in both passes and has the smallest
stated deviation (then the fewest intermediate values).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from opendpu.compiler.fixpoint import MULTI_FACTOR_MAX, avg_pool_factor
from opendpu.compiler.xir.graph import Attrs, Graph, Tensor
from opendpu.isa.target import Target


@dataclass(frozen=True)
class PoolSplit:
    """kernel (kh, kw) = (a*b, c*d): pass 1 a x c (stride a x c), pass 2 b x d global."""
    kh: int
    kw: int
    a: int
    c: int
    bound_lsb: float          # worst-case |split - exact mean| in output LSBs per 2^(fp_out - fp_in), before rounding
    one_pass_lsb: float       # the same for a one-pass pool (the divisor approximation alone)

    @property
    def b(self) -> int:
        return self.kh // self.a

    @property
    def d(self) -> int:
        return self.kw // self.c

    def text(self, fp_in: int, fp_out: int) -> str:
        k = 2.0 ** (fp_out - fp_in)
        return (f"{self.kw}x{self.kh} average pool in two passes: {self.c}x{self.a} stride {self.c}x{self.a} "
                f"({self.d}x{self.b} partial means at fix point {fp_in}), then {self.d}x{self.b} global; "
                f"deviation from the exact mean <= {self.bound_lsb * k:.3g} output LSB before the final rounding "
                f"(one pass: {self.one_pass_lsb * k:.3g})")


def _ratio_err(kh: int, kw: int) -> tuple[float, float]:
    """(N*A/2^M, |N*A/2^M - 1|) of the ALU divisor of a kh x kw window."""
    n, m = avg_pool_factor(kh, kw)
    r = n * kh * kw / 2.0 ** m
    return r, abs(r - 1.0)


def fits(kh: int, kw: int, pp: int, depth: int) -> bool:
    """One channel group of a single-output kh x kw window in the image banks (its rows spread over the PP banks,
    ceil(kh/PP)*kw lines) and a multi_factor that the ALU field holds."""
    return -(-kh // pp) * kw <= depth and avg_pool_factor(kh, kw)[0] <= MULTI_FACTOR_MAX


def fits_strided(kh: int, kw: int, depth: int) -> bool:
    """The same for a kh x kw pool with stride kh x kw and several output rows: the rows of one output row are the
    stride_h sub-rows of one bank slot (spec §6.4), kh*kw lines."""
    return kh * kw <= depth and avg_pool_factor(kh, kw)[0] <= MULTI_FACTOR_MAX


def plan(kh: int, kw: int, pp: int, depth: int) -> PoolSplit | None:
    """The best two-pass split of a kh x kw single-output average pool, or None when none fits. The bound, per
    2^(fp_out - fp_in) output LSBs: pass 1 rounds to the input LSB (<= 1/2) after its divisor (relative error e1
    on values up to 128 LSBs); pass 2 scales that error by its divisor ratio r2 and adds its own relative error e2
    on values up to 128."""
    _, e0 = _ratio_err(kh, kw)
    best: tuple | None = None
    for a in range(1, kh + 1):
        if kh % a:
            continue
        for c in range(1, kw + 1):
            if kw % c or a * c == 1 or (a, c) == (kh, kw):
                continue
            b, d = kh // a, kw // c
            first = fits(a, c, pp, depth) if b == 1 else fits_strided(a, c, depth)
            if not (first and fits(b, d, pp, depth)):
                continue
            _, e1 = _ratio_err(a, c)
            r2, e2 = _ratio_err(b, d)
            bound = r2 * (0.5 + 128 * e1) + 128 * e2
            key = (round(bound, 12), b * d)
            if best is None or key < best[0]:
                best = (key, PoolSplit(kh, kw, a, c, bound, 128 * e0))
    return None if best is None else best[1]


def _pair(v, default) -> list[int]:
    return [int(x) for x in v] if v is not None else list(default)


def single_output_avg(g: Graph, name: str) -> tuple[int, int] | None:
    """(kh, kw) of an average pool-fix op with one output pixel whose window is its whole unpadded input, else
    None."""
    op = g.ops[name]
    if op.type != "pool-fix" or str(op.get("type", "MAX")).upper() not in ("AVG", "AVE", "AVERAGE", "MEAN"):
        return None
    src = g.ops[op.inputs["input"][0]].output if op.inputs.get("input") else None
    if src is None or op.output is None or len(src.shape) != 4 or list(op.output.shape[1:3]) != [1, 1]:
        return None
    h, w = int(src.shape[1]), int(src.shape[2])
    if not op.get("global", False):
        kw, kh = _pair(op.get("kernel"), (0, 0))
        if (kh, kw) != (h, w) or any(_pair(op.get("pad"), (0, 0, 0, 0))):
            return None
    return h, w


def split_pools(g: Graph, target: Target, protected: frozenset[str] = frozenset()) -> list[str]:
    """Rewrite `g` in place: every single-output average pool that the code generator cannot compile in one pass
    but can in two (module docstring) becomes pass 1 (a new op `<name>_pass1`) and pass 2 (the op itself, its name
    and output kept). Returns one line per split."""
    from opendpu.compiler.codegen import unsupported
    lines = []
    for name in list(g.toposort()):
        hw = single_output_avg(g, name)
        if hw is None or unsupported(g, name, target) is None:
            continue
        kh, kw = hw
        sp = plan(kh, kw, target.pp, target.bank_depth)
        if sp is None:
            continue
        op = g.ops[name]
        saved = copy.deepcopy(op)
        x = op.inputs["input"][0]
        src = g.ops[x].output
        assert src is not None and op.output is not None
        fp_in, fp_out = src.fix_point, op.output.fix_point
        if fp_in is None or fp_out is None:
            continue
        p1 = _free_name(g, f"{name}_pass1")
        ta = Attrs(src.attrs)
        ta.kinds = dict(src.attrs.kinds)
        t1 = Tensor(p1, [int(src.shape[0]), sp.b, sp.d, int(src.shape[3])], src.data_type, src.bit_width, ta)
        g.add_op(p1, "pool-fix", {"input": [x]},
                 {"type": "AVG", "kernel": [sp.c, sp.a], "stride": [sp.c, sp.a], "pad": [0, 0, 0, 0],
                  "pad_mode": "FLOOR", "global": False, "count_include_pad": True}, t1)
        kinds = {"kernel": "int32_vec_value", "stride": "int32_vec_value", "pad": "int32_vec_value",
                 "global": "bool_value"}
        op.inputs["input"] = [p1]
        op.attrs.set("global", True, kinds["global"])
        op.attrs.set("kernel", [sp.d, sp.b], kinds["kernel"])
        op.attrs.set("stride", [sp.d, sp.b], kinds["stride"])
        op.attrs.set("pad", [0, 0, 0, 0], kinds["pad"])
        order = list(g.ops)
        order.remove(p1)
        order.insert(order.index(name), p1)
        g.ops = type(g.ops)((k, g.ops[k]) for k in order)
        g._consumers = None
        why = unsupported(g, p1, target) or unsupported(g, name, target)
        if why:                                   # the plan's arithmetic and the code generator disagree: undo
            del g.ops[p1]
            g.ops[name] = saved
            g._consumers = None
            lines.append(f"{name}: not split ({sp.text(fp_in, fp_out)} does not compile: {why})")
            continue
        lines.append(f"{name}: {sp.text(fp_in, fp_out)}")
    return lines


def _free_name(g: Graph, base: str) -> str:
    name, k = base, 1
    while name in g.ops:
        name, k = f"{base}_{k}", k + 1
    return name


__all__ = ["PoolSplit", "fits", "fits_strided", "plan", "single_output_avg", "split_pools"]
