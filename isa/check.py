"""Static check of an ISA1 program against a target and its DDR register sizes (spec §2, §5.3, §6).

`check_program` finds, without executing anything, every instruction that the functional executor
(`sim.executor.DpuMachine.run`, kernel `sim._kernels.run_range`) would reject: DDR registers that are not
allocated, LOAD reads / SAVE writes past the end of their register (LOAD: unmasked bytes only, as the
channel-augmentation rule of spec §6.2 masks the rest), bank ids the target lacks or non-image banks where
only image banks are allowed, kernel/stride limits, activation codes, valid_pixel_parallel, ALU exec_mode,
ELEW type/num/ids/jump_bank, legacy (POOL/DWCONV) instructions, SAVE argmax, channel-augmentation
pad_start/pad_end, the 4-pass limit of input gathering, shift_bias, stride_offset_in, instructions executed
before any INIT, and the emulator's tile limit.

It mirrors the executor exactly: instructions are taken in program order up to the first END, INIT state
is tracked (an INIT that is itself rejected leaves the state unchanged, as in the executor), and each
instruction reports at most one problem, the one the executor would raise for it (its checks run in the
executor's order). So for a program run from a fresh machine, the first problem is the executor's
ExecError: same instruction, field, value and message text (`Problem.text == str(ExecError)`).
Messages come from `problem_message`, which the executor uses as well.

The error kinds below are the numbers the executor's kernels report (sim/_kernels.py imports them from here).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple

import numpy as np

from .fields import FIELD_INDEX, FIELDS, MAX_FIELDS, OPS
from .program import OP_INDEX, Instruction, IsaError, ProgramArrays, to_arrays
from .target import Target

NUM_REGS = 8
# Largest working tile (elements) the emulator allocates for one CONV/ALU/ELEW; real programs stay far below
# (YOLOX-nano: < 2^20). Larger instructions are legal encodings but raise E_TOO_BIG. sim/_kernels.py reads it here.
MAX_TILE = 1 << 26

# ---- error kinds (the numbers the executor reports; sim/_kernels.py imports them) -----------------------------
KIND_NAMES = ("none", "bank_any", "bank_img", "reg", "mode_avg", "pad_start", "pad_end", "ddr_read",
              "ddr_write", "argmax_target", "argmax_ch", "noinit", "vpp", "kernel", "stride", "soi",
              "shift_bias", "act", "pass", "exec_mode", "alu_1x1", "kd", "elew_type", "elew_num", "elew_id",
              "jump_bank", "legacy", "too_big", "stride_out")
(E_NONE, E_BANK_ANY, E_BANK_IMG, E_REG, E_MODE_AVG, E_PAD_START, E_PAD_END, E_DDR_READ, E_DDR_WRITE,
 E_ARGMAX_TARGET, E_ARGMAX_CH, E_NOINIT, E_VPP, E_KERNEL, E_STRIDE, E_SOI, E_SHIFT_BIAS, E_ACT, E_PASS,
 E_EXEC_MODE, E_ALU_1X1, E_KD, E_ELEW_TYPE, E_ELEW_NUM, E_ELEW_ID, E_JUMP_BANK, E_LEGACY,
 E_TOO_BIG, E_STRIDE_OUT) = range(len(KIND_NAMES))

ACT_NAMES = {0: "none", 1: "ReLU", 3: "leaky ReLU", 4: "ReLU6"}


# ---- messages (shared with sim/executor.py) -------------------------------------------------------------
def location(index: int, op: str, field: str | None, value: int | None) -> str:
    """'instruction {index} ({op})' plus ': field {field}={value}' when a field is named."""
    where = f"instruction {index} ({op})"
    if field is not None:
        where += f": field {field}={value}"
    return where


def allocated_str(regs: Iterable[int]) -> str:
    r = [f"REG_{k}" for k in sorted(regs)]
    return ", ".join(r) if r else "none"


class _Record(NamedTuple):
    """An executor error record as its message sees it (see `problem_message`)."""

    t: Target
    mn: str
    v: int
    lo: int
    hi: int
    aux: int
    allocated: Iterable[int]
    jump_bank: int | None


def _act_message(r: _Record) -> str:
    allowed = r.t.alu_nonlinear if r.aux else r.t.conv_nonlinear
    eng = "ALU" if r.aux else "CONV"
    return (f"activation code {r.v} is not supported by the {eng} engine of {r.t.name} "
            f"(allowed: {', '.join(f'{a} ({ACT_NAMES[a]})' for a in allowed)})")


def _noinit_message(r: _Record) -> str:
    init = "ALUINIT" if r.aux else "CONVINIT"
    return f"{r.mn} executed before any {init} (no {init} state, spec §5.3)"


# error kind -> its message (without the location); one entry per kind of KIND_NAMES but E_NONE
_MESSAGES: dict[int, Callable[[_Record], str]] = {
    E_BANK_ANY: lambda r: f"bank id {r.v} does not exist on {r.t.name} (allowed {r.lo}..{r.hi})",
    E_BANK_IMG: lambda r: (f"bank {r.v} is not an image bank; {r.mn} may only use image banks {r.lo}..{r.hi} "
                           f"(VB0..VB{r.t.img_bg - 1}, spec §2.2)"),
    E_REG: lambda r: f"DDR register REG_{r.v} is not allocated (allocated: {allocated_str(r.allocated)})",
    E_MODE_AVG: lambda r: "mean-subtraction LOAD (mode_avg != 0) is not supported on ISA1 targets (allowed 0..0)",
    E_PAD_START: lambda r: f"channel-augmentation pad_start must be smaller than channel (allowed {r.lo}..{r.hi})",
    E_PAD_END: lambda r: (f"channel-augmentation end padding masks every byte of item {r.aux} "
                          f"(first zeroed byte index {r.hi} must be > 0; check pad_end/pad_idx/jump_read)"),
    E_DDR_READ: lambda r: (f"reads REG_{r.aux} up to byte offset {r.lo - 1} (unmasked bytes only), past the end "
                           f"of the register (allowed offsets 0..{r.hi - 1}, size {r.hi})"),
    E_DDR_WRITE: lambda r: (f"writes REG_{r.aux} bytes [{r.v}, {r.lo}) but the register has {r.hi} bytes "
                            f"(ddr_addr+(length-1)*jump_write+channel = {r.lo} must be <= {r.hi})"),
    E_ARGMAX_TARGET: lambda r: f"SAVE argmax is not available on {r.t.name} (argmax bit 1 must be clear, allowed 0..1)",
    E_ARGMAX_CH: lambda r: f"value-mode argmax over more than 128 channels (allowed {r.lo}..{r.hi})",
    E_NOINIT: _noinit_message,
    E_VPP: lambda r: (f"valid_pixel_parallel exceeds {'ALU_PP' if r.aux else 'PP'} of {r.t.name} "
                      f"(allowed {r.lo}..{r.hi})"),
    E_KERNEL: lambda r: f"kernel size above the target limit (allowed {r.lo}..{r.hi})",
    E_STRIDE: lambda r: f"stride above the target limit (allowed {r.lo}..{r.hi})",
    E_STRIDE_OUT: lambda r: (f"stride_out above the target limit (allowed {r.lo}..{r.hi}: spec §3.2 stride_out_h; "
                             f"the bank write queue holds that many lines)"),
    E_SOI: lambda r: f"stride_offset_in must be smaller than stride_h (allowed {r.lo}..{r.hi})",
    E_SHIFT_BIAS: lambda r: f"shift_bias too large (allowed {r.lo}..{r.hi})",
    E_ACT: _act_message,
    E_PASS: lambda r: (f"input row {r.aux} lies in bank-group pass {r.v}; only 4 pass addresses exist "
                       f"(allowed passes {r.lo}..{r.hi}; (bank_id_in mod PP) + "
                       f"ceil((stride_offset_in+rows_in)/stride_h) must be <= 4*PP)"),
    E_EXEC_MODE: lambda r: f"ALU exec_mode {r.v} is illegal on ISA1 (allowed {r.lo}..{r.hi})",
    E_ALU_1X1: lambda r: f"ALU exec_mode {r.aux} requires kernel 1x1 and stride 1 (allowed {r.lo}..{r.hi})",
    E_KD: lambda r: f"ALU exec_mode {r.aux} requires kernel_d 1 (allowed {r.lo}..{r.hi})",
    E_ELEW_TYPE: lambda r: f"elew_type {r.v} is illegal (allowed {r.lo}..{r.hi}: 0 add, 1 multiply)",
    E_ELEW_NUM: lambda r: f"ELEW multiply needs exactly 2 inputs (allowed {r.lo}..{r.hi})",
    E_ELEW_ID: lambda r: (f"ELEW reads input id {r.aux} but no ELEWINIT with id {r.aux} was executed "
                          f"(ids {r.lo}..{r.hi} are needed)"),
    E_JUMP_BANK: lambda r: (f"ELEWINIT id {r.aux} has jump_bank {r.jump_bank}; jump_bank*valid_pixel_parallel "
                            f"must be <= PP {r.t.pp} (allowed {r.lo}..{r.hi})"),
    E_LEGACY: lambda r: f"{r.mn} is not usable on ISA1 targets (no pool/dwconv engine, spec §3.4)",
    E_TOO_BIG: lambda r: (f"working tile of {r.aux} elements exceeds the emulator limit of {MAX_TILE} "
                          f"(the instruction is encodable but far beyond any compiled program)"),
}


def problem_message(kind: int, op: str, target: Target, value: int, lo: int, hi: int, aux: int,
                    allocated: Iterable[int], jump_bank: int | None = None) -> str:
    """The text of an executor error record [kind, op, value, lo, hi, aux] (without the location).

    `allocated`: the allocated DDR register numbers; `jump_bank`: jump_bank of ELEWINIT id `aux`
    (E_JUMP_BANK only)."""
    msg = _MESSAGES.get(kind)
    if msg is None:
        return f"error kind {kind} (value {value}, range {lo}..{hi})"
    return msg(_Record(target, op, value, lo, hi, aux, allocated, jump_bank))


@dataclass(frozen=True)
class Problem:
    """One instruction the executor would reject.

    `message` is the text after the location; `text` (= str(problem)) is the whole message, identical to
    the executor's ExecError for the same instruction. `kind` is one of the E_* numbers (KIND_NAMES)."""

    index: int
    op: str
    field: str | None
    value: int | None
    message: str
    kind: int
    lo: int = 0
    hi: int = 0
    aux: int = 0

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.kind] if 0 <= self.kind < len(KIND_NAMES) else str(self.kind)

    @property
    def text(self) -> str:
        return f"{location(self.index, self.op, self.field, self.value)}: {self.message}"

    def __str__(self) -> str:
        return self.text


class ProgramCheckError(IsaError):
    """A program that the executor would reject (first problem of `check_program`).

    Attributes as ExecError: `index`, `op`, `field`, `value`; plus `kind` and `problem`."""

    def __init__(self, problem: Problem, prefix: str = ""):
        self.problem = problem
        self.index = problem.index
        self.op = problem.op
        self.field = problem.field
        self.value = problem.value
        self.kind = problem.kind
        ValueError.__init__(self, prefix + problem.text)


# ---- the check -----------------------------------------------------------------------------------------
def _cols(op: str, *names: str) -> tuple[int, ...]:
    return tuple(FIELD_INDEX[op][n] for n in names)


_LOAD, _SAVE, _CONVINIT, _CONV, _ALUINIT, _ALU, _ELEWINIT, _ELEW, _END = (OP_INDEX[n] for n in (
    "LOAD", "SAVE", "CONVINIT", "CONV", "ALUINIT", "ALU", "ELEWINIT", "ELEW", "END"))
_LEGACY_OPS = tuple(OP_INDEX[n] for n in ("POOLINIT", "POOL", "DWINIT", "DPTWISE"))

(LD_BANK_ADDR, LD_BANK_ID, LD_JW, LD_JR, LD_LENGTH, LD_CHANNEL, LD_PAD_IDX, LD_REG, LD_CONST, LD_BCAST,
 LD_MODE_AVG, LD_PAD_END, LD_PAD_START, LD_DDR) = _cols(
    "LOAD", "bank_addr", "bank_id", "jump_write", "jump_read", "length", "channel", "pad_idx", "reg_id",
    "const_value", "broadcast", "mode_avg", "pad_end", "pad_start", "ddr_addr")
SV_BANK_ID, SV_JW, SV_ARGMAX, SV_LENGTH, SV_CHANNEL, SV_REG, SV_CONST_EN, SV_DDR = _cols(
    "SAVE", "bank_id", "jump_write", "argmax", "length", "channel", "reg_id", "const_en", "ddr_addr")
CI_ACT, CI_SB, CI_SOI, CI_VPP, CI_KH, CI_SH, CI_KW, CI_SW, CI_SO = _cols(
    "CONVINIT", "act_type", "shift_bias", "stride_offset_in", "valid_pixel_parallel", "kernel_h", "stride_h",
    "kernel_w", "stride_w", "stride_out")
CV_CG, CV_BIDI, CV_LEN, CV_BIDO = _cols("CONV", "channel_group", "bank_id_in", "length", "bank_id_out")
AI_KW, AI_KH, AI_MODE, AI_SOI, AI_SW, AI_SH, AI_LEN, AI_CG, AI_SB, AI_ACT, AI_SO = _cols(
    "ALUINIT", "kernel_w", "kernel_h", "exec_mode", "stride_offset_in", "stride_w", "stride_h", "length",
    "channel_group", "shift_bias", "act_type", "stride_out")
AL_BIDO, AL_BIDI, AL_VPP, AL_KD = _cols("ALU", "bank_id_out", "bank_id_in", "valid_pixel_parallel", "kernel_d")
EI_BIDI, EI_ID, EI_JB = _cols("ELEWINIT", "bank_id_in", "id", "jump_bank")
EW_LEN, EW_TYPE, EW_BIDO, EW_NUM, EW_VPP, EW_CG = _cols(
    "ELEW", "length", "elew_type", "bank_id_out", "num", "valid_pixel_parallel", "channel_group")


class _Records:
    """Per instruction the first failing check: [kind, column, value, lo, hi, aux, jump_bank]."""

    def __init__(self, n: int):
        self.kind = np.zeros(n, np.int64)
        self.col = np.full(n, -1, np.int64)
        self.val = np.zeros(n, np.int64)
        self.lo = np.zeros(n, np.int64)
        self.hi = np.zeros(n, np.int64)
        self.aux = np.zeros(n, np.int64)
        self.jb = np.zeros(n, np.int64)

    def put(self, rows, mask, kind, col, val=0, lo=0, hi=0, aux=0, jb=0) -> None:
        """Record `kind` for rows[mask] that have no earlier failing check."""
        if not len(rows):
            return
        m = np.asarray(mask, bool) & (self.kind[rows] == 0)
        if not m.any():
            return
        r = rows[m]
        self.kind[r] = kind
        for dst, x in ((self.col, col), (self.val, val), (self.lo, lo), (self.hi, hi), (self.aux, aux),
                       (self.jb, jb)):
            dst[r] = np.broadcast_to(np.asarray(x, np.int64), rows.shape)[m]

    def clean(self, rows) -> np.ndarray:
        return self.kind[rows] == 0


def _reg_table(reg_sizes: Mapping[int, int]) -> np.ndarray:
    size = np.full(NUM_REGS, -1, np.int64)
    for k, s in reg_sizes.items():
        k, s = int(k), int(s)
        if not 0 <= k < NUM_REGS:
            raise ValueError(f"DDR register REG_{k} does not exist (REG_0..REG_{NUM_REGS - 1})")
        if s < 0:
            raise ValueError(f"DDR register REG_{k}: negative size {s}")
        size[k] = s
    return size


def _last_valid(mask: np.ndarray) -> np.ndarray:
    """For every row i, the largest j <= i with mask[j] (-1 if none)."""
    idx = np.where(mask, np.arange(len(mask)), -1)
    return np.maximum.accumulate(idx) if len(idx) else idx


def _geometry(rec: _Records, rows, f, kh, kw, sh, sw, soi, sb, kmax: int, smax: int) -> None:
    """Kernel/stride limits, stride_offset_in < stride_h, shift_bias <= 20 (CONVINIT / ALUINIT)."""
    for c in (kh, kw):
        rec.put(rows, f[:, c] > kmax, E_KERNEL, c, f[:, c], 1, kmax)
    for c in (sh, sw):
        rec.put(rows, f[:, c] > smax, E_STRIDE, c, f[:, c], 1, smax)
    rec.put(rows, f[:, soi] >= f[:, sh], E_SOI, soi, f[:, soi], 0, f[:, sh] - 1)
    rec.put(rows, f[:, sb] > 20, E_SHIFT_BIAS, sb, f[:, sb], 0, 20)


def _act_ok(act: np.ndarray, allowed: tuple[int, ...]) -> np.ndarray:
    """act_type codes the engine accepts: Target.conv_nonlinear / alu_nonlinear (the same list the message names)."""
    return np.isin(act, allowed)


def _pass(rec: _Records, rows, col, bank_in, soi, rows_in, sh, pp: int) -> None:
    """Input gathering reaches at most 4 pass addresses (kernel `_pass_check`)."""
    t = soi + rows_in - 1
    slot = bank_in % pp + t // np.maximum(sh, 1)
    rec.put(rows, slot // pp >= 4, E_PASS, col, slot // pp, 0, 3, rows_in - 1)


def _check_load(rec: _Records, L, fl, size, t: Target, known_regs: bool) -> None:
    f = fl[L]
    bank = f[:, LD_BANK_ID]
    rec.put(L, bank >= t.num_banks, E_BANK_ANY, LD_BANK_ID, bank, 0, t.num_banks - 1)
    rec.put(L, f[:, LD_MODE_AVG] != 0, E_MODE_AVG, LD_MODE_AVG, f[:, LD_MODE_AVG], 0, 0)
    const = f[:, LD_BCAST] == 7
    reg = f[:, LD_REG]
    rs = size[np.clip(reg, 0, NUM_REGS - 1)]
    if known_regs:
        rec.put(L, ~const & (rs < 0), E_REG, LD_REG, reg, 0, 7)
    ch, jr = f[:, LD_CHANNEL], f[:, LD_JR]
    length, addr = f[:, LD_LENGTH], f[:, LD_DDR]
    ps, pe, pidx = f[:, LD_PAD_START], f[:, LD_PAD_END], f[:, LD_PAD_IDX]
    w = t.cp
    cw = (ch + w - 1) // w * w
    aug = (jr <= ch) & (ch <= 64)
    rec.put(L, aug & (ps >= ch), E_PAD_START, LD_PAD_START, ps, 0, ch - 1)
    zmin = cw - pe - jr * (pidx - 1)
    rec.put(L, aug & (zmin <= 0), E_PAD_END, LD_PAD_END, pe, 0, zmin, length - 1)
    if not known_regs:
        return
    todo = rec.clean(L) & ~const
    # Plain items (no augmentation, or an end padding that never reaches below `channel`): every item
    # reads bytes [0, channel) at ddr_addr + it*jump_read, so the first one past the end is found directly.
    plain = todo & (~aug | (zmin >= ch))
    need = rs - addr - ch                        # item `it` fits iff it*jump_read <= need
    jr1 = np.maximum(jr, 1)
    it0 = np.where(need < 0, 0, np.where(jr > 0, need // jr1 + 1, length))
    rec.put(L, plain & (it0 < length), E_DDR_READ, LD_DDR, addr, addr + it0 * jr + ch, rs, reg)
    # Channel augmentation with end masking: item by item (kernel `_load_span`).
    for k in np.nonzero(todo & ~plain)[0]:
        n_it, c, j, p_s, p_e = int(length[k]), int(ch[k]), int(jr[k]), int(ps[k]), int(pe[k])
        first_end = n_it - int(pidx[k])
        it = np.arange(n_it, dtype=np.int64)
        lo = np.maximum(0, p_s - it * j)
        hi = np.full(n_it, c, np.int64)
        e = it >= first_end
        hi[e] = np.minimum(c, int(cw[k]) - (p_e + j * (it[e] - first_end)))
        end = int(addr[k]) + it * j + hi
        bad = (lo < hi) & (end > rs[k])
        if bad.any():
            b = int(np.argmax(bad))
            rec.put(L[k:k + 1], True, E_DDR_READ, LD_DDR, addr[k], end[b], rs[k], reg[k])


def _check_save(rec: _Records, S, fl, size, t: Target, known_regs: bool) -> None:
    f = fl[S]
    nimg = t.num_img_banks
    bank = f[:, SV_BANK_ID]
    rec.put(S, bank >= nimg, E_BANK_IMG, SV_BANK_ID, bank, 0, nimg - 1)
    reg = f[:, SV_REG]
    rs = size[np.clip(reg, 0, NUM_REGS - 1)]
    ch = f[:, SV_CHANNEL]
    if known_regs:
        rec.put(S, rs < 0, E_REG, SV_REG, reg, 0, 7)
        addr = f[:, SV_DDR]
        end = addr + (f[:, SV_LENGTH] - 1) * f[:, SV_JW] + ch
        rec.put(S, end > rs, E_DDR_WRITE, SV_DDR, addr, end, rs, reg)
    am = f[:, SV_ARGMAX]
    arg = (f[:, SV_CONST_EN] == 0) & ((am & 2) != 0)
    if not t.argmax:
        rec.put(S, arg, E_ARGMAX_TARGET, SV_ARGMAX, am, 0, 1)
    rec.put(S, arg & ((am & 1) != 0) & (ch > 128), E_ARGMAX_CH, SV_CHANNEL, ch, 1, 128)


def _as_program_arrays(prog) -> ProgramArrays:
    if isinstance(prog, ProgramArrays):
        return prog
    if isinstance(prog, (list, tuple)) and all(isinstance(i, Instruction) for i in prog):
        return to_arrays(list(prog))
    raise TypeError(f"expected ProgramArrays or a list of Instruction, got {type(prog).__name__}")


def check_program(prog, target: Target, reg_sizes: Mapping[int, int] | None) -> list[Problem]:
    """Every instruction of `prog` (ProgramArrays or list of Instruction) that the executor would reject,
    in program order, one Problem per instruction; instructions after the first END are not executed and
    not checked. `reg_sizes` maps register number -> bytes (as for DpuMachine); None = unknown, which skips
    the register and DDR-bounds checks (then the result is not the executor's verdict)."""
    arr = _as_program_arrays(prog)
    op = np.asarray(arr.op, np.int64)
    fl = np.asarray(arr.fields, np.int64)
    if op.ndim != 1 or fl.ndim != 2 or fl.shape[0] != len(op) or fl.shape[1] < MAX_FIELDS:
        raise ValueError(f"ProgramArrays: op must be [N] and fields [N, {MAX_FIELDS}], got {op.shape} and "
                         f"{fl.shape}")
    if len(op) and (int(op.min()) < 0 or int(op.max()) >= len(OPS)):
        raise ValueError(f"ProgramArrays.op holds values outside 0..{len(OPS) - 1}")
    known_regs = reg_sizes is not None
    size = _reg_table(reg_sizes or {})
    ends = np.nonzero(op == _END)[0]
    n = int(ends[0]) + 1 if len(ends) else len(op)
    op, fl = op[:n], fl[:n]
    t = target
    pp, cp, nimg = t.pp, t.cp, t.num_img_banks
    rec = _Records(n)
    rows = {o: np.nonzero(op == o)[0] for o in range(len(OPS))}

    _check_load(rec, rows[_LOAD], fl, size, t, known_regs)
    _check_save(rec, rows[_SAVE], fl, size, t, known_regs)

    # INITs (stateless checks; a rejected INIT does not change the state)
    C = rows[_CONVINIT]
    f = fl[C]
    rec.put(C, f[:, CI_VPP] > pp, E_VPP, CI_VPP, f[:, CI_VPP], 1, pp, 0)
    _geometry(rec, C, f, CI_KH, CI_KW, CI_SH, CI_SW, CI_SOI, CI_SB, t.conv_kernel_max, t.conv_stride_max)
    rec.put(C, f[:, CI_SO] > t.conv_stride_out_h_max, E_STRIDE_OUT, CI_SO, f[:, CI_SO], 1, t.conv_stride_out_h_max)
    rec.put(C, ~_act_ok(f[:, CI_ACT], t.conv_nonlinear), E_ACT, CI_ACT, f[:, CI_ACT], 0, 0, 0)
    A = rows[_ALUINIT]
    f = fl[A]
    mode = f[:, AI_MODE]
    mode_max = max(t.alu_exec_modes)
    rec.put(A, mode > mode_max, E_EXEC_MODE, AI_MODE, mode, 0, mode_max)
    _geometry(rec, A, f, AI_KH, AI_KW, AI_SH, AI_SW, AI_SOI, AI_SB, t.alu_kernel_max, t.alu_stride_max)
    rec.put(A, f[:, AI_SO] > t.alu_stride_out_h_max, E_STRIDE_OUT, AI_SO, f[:, AI_SO], 1, t.alu_stride_out_h_max)
    rec.put(A, ~_act_ok(f[:, AI_ACT], t.alu_nonlinear), E_ACT, AI_ACT, f[:, AI_ACT], 0, 0, 1)
    m147 = (mode == 1) | (mode == 4) | (mode == 7)
    for c in (AI_KH, AI_KW, AI_SH, AI_SW):
        rec.put(A, m147 & (f[:, c] != 1), E_ALU_1X1, c, f[:, c], 1, 1, mode)
    EI = rows[_ELEWINIT]
    rec.put(EI, fl[EI, EI_BIDI] >= nimg, E_BANK_IMG, EI_BIDI, fl[EI, EI_BIDI], 0, nimg - 1)
    ok = rec.kind == 0
    last_ci = _last_valid(ok & (op == _CONVINIT))
    last_ai = _last_valid(ok & (op == _ALUINIT))
    last_ei = [_last_valid(ok & (op == _ELEWINIT) & (fl[:, EI_ID] == d)) for d in range(4)]

    # CONV with the state of the last accepted CONVINIT
    V = rows[_CONV]
    f = fl[V]
    s = last_ci[V]
    st = fl[np.maximum(s, 0)]
    rec.put(V, s < 0, E_NOINIT, -1, 0, 0, 0, 0)
    for c in (CV_BIDI, CV_BIDO):
        rec.put(V, f[:, c] >= nimg, E_BANK_IMG, c, f[:, c], 0, nimg - 1)
    sh, kh = st[:, CI_SH], st[:, CI_KH]
    rows_in = (st[:, CI_VPP] - 1) * sh + kh
    cols_in = (f[:, CV_LEN] - 1) * st[:, CI_SW] + st[:, CI_KW]
    _pass(rec, V, CV_BIDI, f[:, CV_BIDI], st[:, CI_SOI], rows_in, sh, pp)
    tile = rows_in * cols_in * (f[:, CV_CG] * cp)
    rec.put(V, tile > MAX_TILE, E_TOO_BIG, CV_LEN, f[:, CV_LEN], 1, 0, tile)

    # ALU with the state of the last accepted ALUINIT
    U = rows[_ALU]
    f = fl[U]
    s = last_ai[U]
    st = fl[np.maximum(s, 0)]
    rec.put(U, s < 0, E_NOINIT, -1, 0, 0, 0, 1)
    vpp = f[:, AL_VPP]
    rec.put(U, vpp > t.alu_pp, E_VPP, AL_VPP, vpp, 1, t.alu_pp, 1)
    for c in (AL_BIDI, AL_BIDO):
        rec.put(U, f[:, c] >= nimg, E_BANK_IMG, c, f[:, c], 0, nimg - 1)
    mode = st[:, AI_MODE]
    kd = f[:, AL_KD]
    m147 = (mode == 1) | (mode == 4) | (mode == 7)
    rec.put(U, m147 & (kd != 1), E_KD, AL_KD, kd, 1, 1, mode)
    kd = np.where((mode == 2) | (mode == 3) | (mode == 5), 1, kd)
    sh, kh = st[:, AI_SH], st[:, AI_KH]
    rows_in = (vpp - 1) * sh + kh
    cols_in = (st[:, AI_LEN] - 1) * st[:, AI_SW] + st[:, AI_KW]
    _pass(rec, U, AL_BIDI, f[:, AL_BIDI], st[:, AI_SOI], rows_in, sh, pp)
    tile = rows_in * cols_in * (st[:, AI_CG] * cp * kd)
    rec.put(U, tile > MAX_TILE, E_TOO_BIG, AL_VPP, vpp, 1, 0, tile)

    # ELEW with the ELEWINIT descriptors accepted so far
    E = rows[_ELEW]
    f = fl[E]
    vpp, et, num = f[:, EW_VPP], f[:, EW_TYPE], f[:, EW_NUM]
    rec.put(E, vpp > t.alu_pp, E_VPP, EW_VPP, vpp, 1, t.alu_pp, 1)
    rec.put(E, et > 1, E_ELEW_TYPE, EW_TYPE, et, 0, 1)
    rec.put(E, (et == 1) & (num != 2), E_ELEW_NUM, EW_NUM, num, 2, 2)
    rec.put(E, f[:, EW_BIDO] >= nimg, E_BANK_IMG, EW_BIDO, f[:, EW_BIDO], 0, nimg - 1)
    for k in range(4):
        s = last_ei[k][E]
        active = num > k
        rec.put(E, active & (s < 0), E_ELEW_ID, EW_NUM, num, 0, num - 1, k)
        jb = fl[np.maximum(s, 0), EI_JB]
        rec.put(E, active & (s >= 0) & (jb * vpp > pp), E_JUMP_BANK, EW_VPP, vpp, 1, pp // np.maximum(jb, 1),
                k, jb)
    tile = vpp * f[:, EW_LEN] * (f[:, EW_CG] * cp)
    rec.put(E, tile > MAX_TILE, E_TOO_BIG, EW_LEN, f[:, EW_LEN], 1, 0, tile)

    for o in _LEGACY_OPS:
        rec.put(rows[o], True, E_LEGACY, -1)

    allocated = [k for k in range(NUM_REGS) if size[k] >= 0]
    out = []
    for row in np.nonzero(rec.kind)[0]:
        i = int(row)
        kind, col = int(rec.kind[i]), int(rec.col[i])
        mn = OPS[int(op[i])].mnemonic
        fname = FIELDS[mn][col].name if col >= 0 else None
        v, lo, hi, aux = int(rec.val[i]), int(rec.lo[i]), int(rec.hi[i]), int(rec.aux[i])
        msg = problem_message(kind, mn, t, v, lo, hi, aux, allocated, int(rec.jb[i]))
        out.append(Problem(i, mn, fname, v if fname is not None else None, msg, kind, lo, hi, aux))
    return out


def validate_program(prog, target: Target, reg_sizes: Mapping[int, int] | None, prefix: str = "") -> None:
    """Raise ProgramCheckError (an IsaError) for the first problem `check_program` finds."""
    problems = check_program(prog, target, reg_sizes)
    if problems:
        raise ProgramCheckError(problems[0], prefix)


__all__ = ["Problem", "ProgramCheckError", "check_program", "validate_program", "problem_message", "location",
           "KIND_NAMES", "MAX_TILE"]
