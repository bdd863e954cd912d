"""Numba kernels of the functional executor (spec §2.3, §6).

One jitted function, `run_range`, executes a range of instructions given as the flat arrays of
`isa.program.ProgramArrays`. Machine state lives in numpy arrays owned by `sim.executor.DpuMachine`:

* banks    int8 [num_banks, DEPTH*W]         flat bytes per bank (spec §2.3)
* ddr      int8 [total]                      all DDR registers, register k at reg_off[k]
* reg_size int64[8]                          exact byte size of each register, -1 = not allocated
* tp       int64[NTP]                        target constants (T_* indices below)
* conv_st / alu_st  int64[MAX_FIELDS+1]      fields of the last CONVINIT / ALUINIT, last slot = valid
* elew_st  int64[4, MAX_FIELDS], elew_ok int64[4]   ELEWINIT descriptors indexed by id (spec §5.3)
* counts   int64[len(OPS)], ld_bytes/sv_bytes int64[8]   statistics
* err      int64[8]   [kind, index, op, field column, value, lo, hi, aux]; kind 0 = no error
* status   int64[2]   [next instruction index, ended]

Field columns and opcode indices are taken from isa.fields / isa.program at import time and are
compile-time constants for numba.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from opendpu.isa.fields import FIELD_INDEX, MAX_FIELDS
from opendpu.isa.program import OP_INDEX

from . import _tilecache as _tc
from . import _weightcache as _wc
from ._fastmac import LANES, conv_acc, dw_acc, outer_acc, use_outer
from ._vnni import conv_acc_vnni

# ---- opcode indices -------------------------------------------------------------------------------
OP_LOAD = OP_INDEX["LOAD"]
OP_SAVE = OP_INDEX["SAVE"]
OP_CONVINIT = OP_INDEX["CONVINIT"]
OP_CONV = OP_INDEX["CONV"]
OP_ALUINIT = OP_INDEX["ALUINIT"]
OP_ALU = OP_INDEX["ALU"]
OP_ELEWINIT = OP_INDEX["ELEWINIT"]
OP_ELEW = OP_INDEX["ELEW"]
OP_END = OP_INDEX["END"]
OP_POOLINIT = OP_INDEX["POOLINIT"]
OP_POOL = OP_INDEX["POOL"]
OP_DWINIT = OP_INDEX["DWINIT"]
OP_DPTWISE = OP_INDEX["DPTWISE"]

FAST_FLOAT = 1                    # `fast` of run_range: 0 scalar loops, 1 float32 kernels (sim._fastmac),
FAST_VNNI = 2                     # 2 int8 dot products (sim._vnni; CP a multiple of 4)
STATE_VALID = MAX_FIELDS          # slot of conv_st / alu_st that flags "INIT seen"

# ---- target constants ------------------------------------------------------------------------------
(T_PP, T_CP, T_ALUPP, T_DEPTH, T_NIMG, T_CONVW, T_DWCONVW, T_BIAS, T_NBANKS, T_CVLK, T_DWLK, T_ARGMAX,
 T_CKMAX, T_CSMAX, T_AKMAX, T_ASMAX, T_CSOMAX, T_ASOMAX) = range(18)
NTP = 18

# ---- error kinds and the tile limit: isa.check owns them (it also builds the messages) ------------------
from opendpu.isa.check import (  # noqa: E402,F401 - module constants the jitted code reads as compile-time values
    E_ACT, E_ALU_1X1, E_ARGMAX_CH, E_ARGMAX_TARGET, E_BANK_ANY, E_BANK_IMG, E_DDR_READ, E_DDR_WRITE, E_ELEW_ID,
    E_ELEW_NUM, E_ELEW_TYPE, E_EXEC_MODE, E_JUMP_BANK, E_KD, E_KERNEL, E_LEGACY, E_MODE_AVG, E_NOINIT, E_NONE,
    E_PAD_END, E_PAD_START, E_PASS, E_REG, E_SHIFT_BIAS, E_SOI, E_STRIDE, E_STRIDE_OUT, E_TOO_BIG, E_VPP,
    MAX_TILE)


def _c(op, name):
    return FIELD_INDEX[op][name]


# LOAD
LD_BANK_ADDR, LD_BANK_ID, LD_JW, LD_JR = (_c("LOAD", n) for n in ("bank_addr", "bank_id", "jump_write",
                                                                     "jump_read"))
LD_LENGTH, LD_CHANNEL, LD_PAD_IDX, LD_REG = (_c("LOAD", n) for n in ("length", "channel", "pad_idx", "reg_id"))
LD_CONST, LD_BCAST, LD_MODE_AVG = (_c("LOAD", n) for n in ("const_value", "broadcast", "mode_avg"))
LD_PAD_END, LD_PAD_START, LD_DDR = (_c("LOAD", n) for n in ("pad_end", "pad_start", "ddr_addr"))
# SAVE
SV_BANK_ADDR, SV_BANK_ID, SV_JR, SV_JW = (_c("SAVE", n) for n in ("bank_addr", "bank_id", "jump_read",
                                                                     "jump_write"))
SV_ARGMAX, SV_LENGTH, SV_CHANNEL, SV_REG = (_c("SAVE", n) for n in ("argmax", "length", "channel", "reg_id"))
SV_CONST, SV_CONST_EN, SV_DDR = (_c("SAVE", n) for n in ("const_value", "const_en", "ddr_addr"))
# CONVINIT
CI_JR, CI_SC, CI_ACT, CI_JRE, CI_SB, CI_SO = (_c("CONVINIT", n) for n in (
    "jump_read", "shift_cut", "act_type", "jump_read_endl", "shift_bias", "stride_out"))
CI_JW, CI_SOI, CI_VPP, CI_KH, CI_SH = (_c("CONVINIT", n) for n in (
    "jump_write", "stride_offset_in", "valid_pixel_parallel", "kernel_h", "stride_h"))
CI_JWE, CI_SOO, CI_KW, CI_SW = (_c("CONVINIT", n) for n in (
    "jump_write_endl", "stride_offset_out", "kernel_w", "stride_w"))
# CONV
CV_BAI, CV_PT, CV_PL, CV_BAO, CV_PB, CV_PR, CV_CG, CV_BAW = (_c("CONV", n) for n in (
    "bank_addr_in", "pad_top", "pad_left", "bank_addr_out", "pad_bottom", "pad_right", "channel_group",
    "bank_addr_weights"))
CV_BIDI, CV_LEN, CV_BAB, CV_BIDO, CV_BAI1, CV_BAI2, CV_BAI3, CV_CO = (_c("CONV", n) for n in (
    "bank_id_in", "length", "bank_addr_bias", "bank_id_out", "bank_addr_in_1", "bank_addr_in_2",
    "bank_addr_in_3", "channel_offset"))
# ALUINIT
AI_KW, AI_KH, AI_MODE, AI_SOO, AI_SOI, AI_SW, AI_SH, AI_LEN = (_c("ALUINIT", n) for n in (
    "kernel_w", "kernel_h", "exec_mode", "stride_offset_out", "stride_offset_in", "stride_w", "stride_h",
    "length"))
AI_CO, AI_CG, AI_SO, AI_SPN, AI_SC, AI_SB, AI_ACT, AI_SPP = (_c("ALUINIT", n) for n in (
    "channel_offset", "channel_group", "stride_out", "shift_prelu_n", "shift_cut", "shift_bias", "act_type",
    "shift_prelu_p"))
AI_JRE, AI_JR, AI_MF, AI_JWE, AI_JW, AI_JRW = (_c("ALUINIT", n) for n in (
    "jump_read_endl", "jump_read", "multi_factor", "jump_write_endl", "jump_write", "jump_read_weights"))
# ALU
AL_BAO, AL_BIDO, AL_BAI, AL_BIDI, AL_VPP, AL_PB, AL_BAI1, AL_PR = (_c("ALU", n) for n in (
    "bank_addr_out", "bank_id_out", "bank_addr_in", "bank_id_in", "valid_pixel_parallel", "pad_bottom",
    "bank_addr_in_1", "pad_right"))
AL_PL, AL_PT, AL_BAI2, AL_BAW, AL_KD, AL_BAI3, AL_BAB = (_c("ALU", n) for n in (
    "pad_left", "pad_top", "bank_addr_in_2", "bank_addr_weights", "kernel_d", "bank_addr_in_3",
    "bank_addr_bias"))
# ELEWINIT
EI_SHARE, EI_BIDI, EI_BAI, EI_JRE, EI_ID, EI_JB, EI_JR, EI_SR = (_c("ELEWINIT", n) for n in (
    "share_pp", "bank_id_in", "bank_addr_in", "jump_read_endl", "id", "jump_bank", "jump_read", "shift_read"))
# ELEW
EW_LEN, EW_ACT, EW_TYPE, EW_BIDO, EW_BAO, EW_JWE, EW_NUM, EW_VPP, EW_JW, EW_SW, EW_CG = (
    _c("ELEW", n) for n in ("length", "act_type", "elew_type", "bank_id_out", "bank_addr_out",
                            "jump_write_endl", "num", "valid_pixel_parallel", "jump_write", "shift_write",
                            "channel_group"))
del _c


# ---- helpers -------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _fail(err, kind, i, op, col, value, lo, hi, aux):
    err[0] = kind
    err[1] = i
    err[2] = op
    err[3] = col
    err[4] = value
    err[5] = lo
    err[6] = hi
    err[7] = aux


@njit(cache=True, inline="always")
def _sat8(n):
    if n > 127:
        return 127
    if n < -128:
        return -128
    return n


@njit(cache=True, inline="always")
def _rhr(n, k):
    """rhu(n / 2^k) for integer n (|n| < 2^61); k <= 0 is a left shift by -k (spec §6.1)."""
    if k <= 0:
        return n << (-k)
    if k > 62:
        return 0
    return (n + (np.int64(1) << (k - 1))) >> k


@njit(cache=True, inline="always")
def _act_round(a, k, act):
    """dpu_round(ACT(a / 2^k)) in the exact integer forms of spec §6.1 (act 0, 1, 3, 4)."""
    if act == 3 and a < 0:
        return _sat8(_rhr(26 * a, k + 8))
    v = _rhr(a, k)
    if act == 1 or act == 4:
        if v < 0:
            v = 0
    if act == 4 and v > 96:
        v = 96
    return _sat8(v)


@njit(cache=True, inline="always")
def _dpu_round_f(v):
    if v > 127.0:
        return 127
    if v < -128.0:
        return -128
    return np.int64(np.floor(v + 0.5))


@njit(cache=True)
def _read(brow, line, n, out, o0, depth, w):
    """bank_read (spec §2.3) of n bytes of bank row `brow` (= banks[b]) starting at `line` into
    out[o0:o0+n] (any integer dtype)."""
    tot = depth * w
    p = (line % depth) * w
    if p + n <= tot:
        src = brow[p:p + n]
        dst = out[o0:o0 + n]
        for k in range(n):
            dst[k] = src[k]
    else:
        for k in range(n):
            out[o0 + k] = brow[(p + k) % tot]


@njit(cache=True)
def _write(brow, line, src, s0, n, depth, w):
    """bank_write (spec §2.3) of src[s0:s0+n] into bank row `brow` (= banks[b]); zero-fills the rest
    of the last line."""
    tot = depth * w
    p = (line % depth) * w
    if p + n <= tot:
        dst = brow[p:p + n]
        sv = src[s0:s0 + n]
        for k in range(n):
            dst[k] = sv[k]
    else:
        for k in range(n):
            brow[(p + k) % tot] = src[s0 + k]
    p += n
    while p % w != 0:
        brow[p % tot] = 0
        p += 1


# ---- LOAD / SAVE -------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _load_span(it, ch, aug, pad_start, pad_end, jr, first_end, cw):
    """[lo, hi): the unmasked bytes of LOAD item `it` (spec §6.2 channel-augmentation masking)."""
    lo = 0
    hi = ch
    if aug:
        lo = pad_start - it * jr
        if lo < 0:
            lo = 0
        if it >= first_end:
            z = cw - (pad_end + jr * (it - first_end))
            if z < hi:
                hi = z
    return lo, hi


@njit(cache=True)
def _load(i, f, banks, ddr, reg_off, reg_size, tp, ld_bytes, err, buf):
    depth = tp[T_DEPTH]
    w = tp[T_CP]
    bank = f[LD_BANK_ID]
    if bank >= tp[T_NBANKS]:
        _fail(err, E_BANK_ANY, i, OP_LOAD, LD_BANK_ID, bank, 0, tp[T_NBANKS] - 1, 0)
        return
    if f[LD_MODE_AVG] != 0:
        _fail(err, E_MODE_AVG, i, OP_LOAD, LD_MODE_AVG, f[LD_MODE_AVG], 0, 0, 0)
        return
    const = f[LD_BCAST] == 7
    reg = f[LD_REG]
    if not const and reg_size[reg] < 0:
        _fail(err, E_REG, i, OP_LOAD, LD_REG, reg, 0, 7, 0)
        return
    length = f[LD_LENGTH]
    ch = f[LD_CHANNEL]
    jr = f[LD_JR]
    jw = f[LD_JW]
    addr = f[LD_DDR]
    line0 = f[LD_BANK_ADDR]
    pad_start = f[LD_PAD_START]
    pad_end = f[LD_PAD_END]
    pad_idx = f[LD_PAD_IDX]
    cw = ((ch + w - 1) // w) * w
    aug = jr <= ch and ch <= 64
    first_end = length - pad_idx
    if aug:
        if pad_start >= ch:
            _fail(err, E_PAD_START, i, OP_LOAD, LD_PAD_START, pad_start, 0, ch - 1, 0)
            return
        zmin = cw - pad_end - jr * (pad_idx - 1)
        if zmin <= 0:
            _fail(err, E_PAD_END, i, OP_LOAD, LD_PAD_END, pad_end, 0, zmin, length - 1)
            return
    size = reg_size[reg] if not const else 0
    base = reg_off[reg] if not const else 0
    cval = f[LD_CONST]
    if cval >= 128:
        cval -= 256
    # pass 1: range check of the unmasked bytes of every item (no partial effects on error)
    nread = 0
    if not const:
        for it in range(length):
            lo, hi = _load_span(it, ch, aug, pad_start, pad_end, jr, first_end, cw)
            if lo < hi:
                src = addr + it * jr
                if src + hi > size:
                    _fail(err, E_DDR_READ, i, OP_LOAD, LD_DDR, addr, src + hi, size, reg)
                    return
                nread += hi - lo
    # pass 2: build each item (masked bytes 0) and write it
    brow = banks[bank]
    for it in range(length):
        if not const and not aug:              # every byte unmasked: straight from DDR, no staging copy
            _write(brow, line0 + it * jw, ddr, base + addr + it * jr, ch, depth, w)
            continue
        lo, hi = _load_span(it, ch, aug, pad_start, pad_end, jr, first_end, cw)
        if hi < lo:
            hi = lo
        for c in range(0, lo):
            buf[c] = 0
        if const:
            for c in range(lo, hi):
                buf[c] = cval
        else:
            p = base + addr + it * jr
            dsl = ddr[p + lo:p + hi]
            bsl = buf[lo:hi]
            for c in range(hi - lo):
                bsl[c] = dsl[c]
        for c in range(hi, ch):
            buf[c] = 0
        _write(brow, line0 + it * jw, buf, 0, ch, depth, w)
    if not const:
        ld_bytes[reg] += nread


@njit(cache=True)
def _save(i, f, banks, ddr, reg_off, reg_size, tp, sv_bytes, err, buf):
    depth = tp[T_DEPTH]
    w = tp[T_CP]
    bank = f[SV_BANK_ID]
    if bank >= tp[T_NIMG]:
        _fail(err, E_BANK_IMG, i, OP_SAVE, SV_BANK_ID, bank, 0, tp[T_NIMG] - 1, 0)
        return
    reg = f[SV_REG]
    if reg_size[reg] < 0:
        _fail(err, E_REG, i, OP_SAVE, SV_REG, reg, 0, 7, 0)
        return
    length = f[SV_LENGTH]
    ch = f[SV_CHANNEL]
    jr = f[SV_JR]
    jw = f[SV_JW]
    addr = f[SV_DDR]
    end = addr + (length - 1) * jw + ch
    if end > reg_size[reg]:
        _fail(err, E_DDR_WRITE, i, OP_SAVE, SV_DDR, addr, end, reg_size[reg], reg)
        return
    const_en = f[SV_CONST_EN] != 0
    am = f[SV_ARGMAX]
    if not const_en and (am & 2) != 0:
        if tp[T_ARGMAX] == 0:
            _fail(err, E_ARGMAX_TARGET, i, OP_SAVE, SV_ARGMAX, am, 0, 1, 0)
            return
        if (am & 1) != 0 and ch > 128:
            _fail(err, E_ARGMAX_CH, i, OP_SAVE, SV_CHANNEL, ch, 1, 128, 0)
            return
    cval = f[SV_CONST]
    if cval >= 128:
        cval -= 256
    base = reg_off[reg] + addr
    line0 = f[SV_BANK_ADDR]
    brow = banks[bank]
    nbytes = 0
    for it in range(length):
        dst = base + it * jw
        if const_en:
            for c in range(ch):
                ddr[dst + c] = cval
            nbytes += ch
        elif (am & 2) != 0:
            _read(brow, line0 + it * jr, ch, buf, 0, depth, w)
            k = 0
            for c in range(1, ch):
                if buf[c] > buf[k]:
                    k = c
            v = np.int64(buf[k]) if (am & 1) != 0 else np.int64(k)
            v = v & 0xFF
            if v >= 128:
                v -= 256
            ddr[dst] = v
            nbytes += 1
        else:                                  # bank_read into DDR: a vectorised copy (no slice assignment,
            _read(brow, line0 + it * jr, ch, ddr, dst, depth, w)   # whose shape-mismatch message costs 3 s of compile)
            nbytes += ch
    sv_bytes[reg] += nbytes


# ---- CONV ------------------------------------------------------------------------------------------
@njit(cache=True)
def _init_geometry_ok(i, op, f, kh, kw, sh, sw, soi, sb, kmax, smax, err):
    """Kernel/stride limits, stride_offset_in < stride_h and shift_bias <= 20 of a CONVINIT/ALUINIT."""
    for col in (kh, kw):
        if f[col] > kmax:
            _fail(err, E_KERNEL, i, op, col, f[col], 1, kmax, 0)
            return False
    for col in (sh, sw):
        if f[col] > smax:
            _fail(err, E_STRIDE, i, op, col, f[col], 1, smax, 0)
            return False
    if f[soi] >= f[sh]:
        _fail(err, E_SOI, i, op, soi, f[soi], 0, f[sh] - 1, 0)
        return False
    if f[sb] > 20:
        _fail(err, E_SHIFT_BIAS, i, op, sb, f[sb], 0, 20, 0)
        return False
    return True


@njit(cache=True)
def _convinit(i, f, tp, conv_st, err):
    if f[CI_VPP] > tp[T_PP]:
        _fail(err, E_VPP, i, OP_CONVINIT, CI_VPP, f[CI_VPP], 1, tp[T_PP], 0)
        return
    if not _init_geometry_ok(i, OP_CONVINIT, f, CI_KH, CI_KW, CI_SH, CI_SW, CI_SOI, CI_SB,
                             tp[T_CKMAX], tp[T_CSMAX], err):
        return
    if f[CI_SO] > tp[T_CSOMAX]:
        _fail(err, E_STRIDE_OUT, i, OP_CONVINIT, CI_SO, f[CI_SO], 1, tp[T_CSOMAX], 0)
        return
    act = f[CI_ACT]
    if not (act == 0 or act == 1 or act == 4 or (act == 3 and tp[T_CVLK] != 0)):
        _fail(err, E_ACT, i, OP_CONVINIT, CI_ACT, act, 0, 0, 0)
        return
    for k in range(MAX_FIELDS):
        conv_st[k] = f[k]
    conv_st[STATE_VALID] = 1


@njit(cache=True)
def _gather(banks, tp, X, rows_in, cols_in, nbytes, r_lo, r_hi, x_lo, x_hi, nread,
            bank_id, soi, sh, jre, jr, b0, b1, b2, b3):
    """Input gathering of spec §6.4 for tile rows [r_lo, r_hi) and columns [x_lo, x_hi): the first
    `nread` of the `nbytes` bytes of each pixel are read into X[r, x*nbytes : x*nbytes+nread]."""
    pp = tp[T_PP]
    depth = tp[T_DEPTH]
    w = tp[T_CP]
    gb = (bank_id // pp) * pp
    for r in range(r_lo, r_hi):
        t = soi + r
        slot = (bank_id - gb) + t // sh
        ps = slot // pp
        bank = gb + slot % pp
        if ps == 0:
            base = b0
        elif ps == 1:
            base = b1
        elif ps == 2:
            base = b2
        else:
            base = b3
        line0 = base + (t % sh) * jre
        brow = banks[bank]
        xr = X[r]
        for x in range(x_lo, x_hi):
            _read(brow, line0 + x * jr, nread, xr, x * nbytes, depth, w)


@njit(cache=True)
def _pass_check(i, op, col, err, tp, bank_id, soi, rows_in, sh):
    pp = tp[T_PP]
    t = soi + rows_in - 1
    slot = (bank_id % pp) + t // sh
    if slot // pp >= 4:
        _fail(err, E_PASS, i, op, col, slot // pp, 0, 3, rows_in - 1)
        return False
    return True


@njit(cache=True)
def _place(banks, tp, Y, vpp, length, nbytes, bank_id, bao, so, soo, jw, jwe):
    """Output placement of spec §6.4: Y[h, w*nbytes : (w+1)*nbytes] -> bank lines."""
    pp = tp[T_PP]
    depth = tp[T_DEPTH]
    wd = tp[T_CP]
    gb = (bank_id // pp) * pp
    for h in range(vpp):
        t = h + soo
        slot = (bank_id % pp) + t // so
        bank = gb + slot % pp
        row0 = bao + (slot // pp) * so * jwe + (t % so) * jwe
        brow = banks[bank]
        yh = Y[h]
        for x in range(length):
            _write(brow, row0 + x * jw, yh, x * nbytes, nbytes, depth, wd)


@njit(cache=True)
def _conv_post(A, bias, Y, vpp, length, ocp, sb, k, act):
    """Y[h, x*ocp + o] = dpu_round(ACT((2*A + bias*2^sb) / 2^k)) (spec §6.4) from exact accumulators A."""
    for h in range(vpp):
        for x in range(length):
            for o in range(ocp):
                a = 2 * A[h, x * ocp + o] + (bias[o] << sb)
                Y[h, x * ocp + o] = _act_round(a, k, act)


@njit(cache=True)
def _conv_mac(X, Wt, bias, Y, vpp, length, ocp, ic, kh, kw, sh, sw, sb, k, act):
    """CONV arithmetic of spec §6.4: Y[h, x*ocp + o] = dpu_round(ACT((2*acc + bias*2^sb) / 2^k))."""
    L = kw * ic
    for h in range(vpp):
        for x in range(length):
            off = x * sw * ic
            for o in range(ocp):
                acc = np.int64(0)
                for ky in range(kh):
                    # slices first: plain 0..L-1 indexing lets LLVM vectorise the int16 dot product
                    xs = X[h * sh + ky, off:off + L]
                    ws = Wt[o, ky, :]
                    s = np.int32(0)            # |s| <= 16*4096*2^14 = 2^30: no int32 overflow
                    for q in range(L):
                        s += np.int32(xs[q]) * np.int32(ws[q])
                    acc += s
                a = 2 * acc + (bias[o] << sb)
                Y[h, x * ocp + o] = _act_round(a, k, act)


@njit(cache=True)
def _conv(i, f, banks, tp, st, err, fast, tile, tile8, tstate, trows, wt, wt8, wsl, wvalid):
    """CONV (spec §6.4); returns the input tiles of the fast paths (float32, and uint8 for FAST_VNNI; the previous
    ones when none was made)."""
    if st[STATE_VALID] == 0:
        _fail(err, E_NOINIT, i, OP_CONV, -1, 0, 0, 0, 0)
        return tile, tile8
    nimg = tp[T_NIMG]
    for col in (CV_BIDI, CV_BIDO):
        if f[col] >= nimg:
            _fail(err, E_BANK_IMG, i, OP_CONV, col, f[col], 0, nimg - 1, 0)
            return tile, tile8
    cp = tp[T_CP]
    depth = tp[T_DEPTH]
    ocp = cp
    vpp = st[CI_VPP]
    kh = st[CI_KH]
    kw = st[CI_KW]
    sh = st[CI_SH]
    sw = st[CI_SW]
    soi = st[CI_SOI]
    cg = f[CV_CG]
    ic = cg * cp
    length = f[CV_LEN]
    rows_in = (vpp - 1) * sh + kh
    cols_in = (length - 1) * sw + kw
    bidi = f[CV_BIDI]
    if not _pass_check(i, OP_CONV, CV_BIDI, err, tp, bidi, soi, rows_in, sh):
        return tile, tile8
    co = f[CV_CO]
    nread = ic - co
    if nread < 0:
        nread = 0
    r_lo = f[CV_PT]
    r_hi = min(rows_in, rows_in - kh + f[CV_PB] + 1)
    x_lo = f[CV_PL]
    x_hi = min(cols_in, cols_in - kw + f[CV_PR] + 1)
    if rows_in * cols_in * ic > MAX_TILE:
        _fail(err, E_TOO_BIG, i, OP_CONV, CV_LEN, length, 1, 0, rows_in * cols_in * ic)
        return tile, tile8
    bias = np.empty(ocp, np.int64)
    _read(banks[tp[T_BIAS]], f[CV_BAB], ocp, bias, 0, depth, cp)
    Y = np.empty((vpp, length * ocp), np.int8)
    L = kw * ic
    baw = f[CV_BAW]
    wbase = tp[T_CONVW]
    Xf = tile
    Xu = tile8
    if fast == FAST_VNNI:
        # offset uint8 tile (x + 128, reused like the float32 one) and int8 weights on the CPU's int8 dot product,
        # exact in int32 (sim._vnni); int64 post-processing below
        if not _tc.lookup(tstate, st, f):
            Xi = np.zeros((rows_in, cols_in * ic), np.int8)
            _gather(banks, tp, Xi, rows_in, cols_in, ic, r_lo, r_hi, x_lo, x_hi, nread,
                    bidi, soi, sh, st[CI_JRE], st[CI_JR], f[CV_BAI], f[CV_BAI1], f[CV_BAI2], f[CV_BAI3])
            Xu = Xi.view(np.uint8)
            Xl = Xu.reshape(-1)
            for k in range(Xl.size):
                Xl[k] ^= 0x80
            _tc.store(tstate, trows, st, f, tp[T_PP], depth, cp, rows_in, r_lo, r_hi, x_lo, x_hi, nread,
                      bidi, soi, sh, st[CI_JRE], st[CI_JR], f[CV_BAI], f[CV_BAI1], f[CV_BAI2], f[CV_BAI3])
        A = np.empty((vpp, length * ocp), np.int64)
        wsum = np.empty(wt8.shape[1], np.int64)
        Wv = _wc.weights_vnni(banks, wt8, wsl, wvalid, wbase, baw, kh * L, ocp, depth, cp, wsum)   # [quads, lanes]
        conv_acc_vnni(Xu, Wv, wsum, A, vpp, length, ocp, ic, kh, kw, sh, sw)
        _conv_post(A, bias, Y, vpp, length, ocp, st[CI_SB], st[CI_SC] + 1, st[CI_ACT])
    elif fast:
        # float32 tile (reused from the previous CONV when sim._tilecache allows) and weights, exact by the bound
        # of sim._fastmac; int64 post-processing below
        if not _tc.lookup(tstate, st, f):
            Xf = np.zeros((rows_in, cols_in * ic), np.float32)
            _gather(banks, tp, Xf, rows_in, cols_in, ic, r_lo, r_hi, x_lo, x_hi, nread,
                    bidi, soi, sh, st[CI_JRE], st[CI_JR], f[CV_BAI], f[CV_BAI1], f[CV_BAI2], f[CV_BAI3])
            _tc.store(tstate, trows, st, f, tp[T_PP], depth, cp, rows_in, r_lo, r_hi, x_lo, x_hi, nread,
                      bidi, soi, sh, st[CI_JRE], st[CI_JR], f[CV_BAI], f[CV_BAI1], f[CV_BAI2], f[CV_BAI3])
        # the kh·kw·cg weight lines of bank o are consecutive (line baw + (ky·kw + kx)·cg), and so are their bytes
        # in [ky, kx·ic + i] order: one read per output channel (into column o for the outer-product kernel)
        A = np.empty((vpp, length * ocp), np.int64)
        if use_outer(L, vpp * length):
            Wq = _wc.weights(banks, wt, wvalid, wbase, baw, kh * L, ocp, depth, cp)   # sim._weightcache
            outer_acc(Xf, Wq.reshape(kh, L, Wq.shape[1]), A, vpp, length, ocp, ic, kh, kw, sh, sw)
        else:
            Wf = np.empty((ocp, kh * L), np.float32)
            for o in range(ocp):
                _read(banks[wbase + o], baw, kh * L, Wf[o], 0, depth, cp)
            conv_acc(Xf, Wf.reshape(ocp, kh, L), A, vpp, length, ocp, ic, kh, kw, sh, sw)
        _conv_post(A, bias, Y, vpp, length, ocp, st[CI_SB], st[CI_SC] + 1, st[CI_ACT])
    else:
        X = np.zeros((rows_in, cols_in * ic), np.int16)
        _gather(banks, tp, X, rows_in, cols_in, ic, r_lo, r_hi, x_lo, x_hi, nread,
                bidi, soi, sh, st[CI_JRE], st[CI_JR], f[CV_BAI], f[CV_BAI1], f[CV_BAI2], f[CV_BAI3])
        # weights [o, ky, kx*ic + i]
        Wt = np.empty((ocp, kh, L), np.int16)
        for o in range(ocp):
            for ky in range(kh):
                for kx in range(kw):
                    _read(banks[wbase + o], baw + (ky * kw + kx) * cg, ic, Wt[o, ky], kx * ic, depth, cp)
        _conv_mac(X, Wt, bias, Y, vpp, length, ocp, ic, kh, kw, sh, sw, st[CI_SB], st[CI_SC] + 1, st[CI_ACT])
    _place(banks, tp, Y, vpp, length, ocp, f[CV_BIDO], f[CV_BAO], st[CI_SO], st[CI_SOO], st[CI_JW],
           st[CI_JWE])
    return Xf, Xu


# ---- ALU -------------------------------------------------------------------------------------------
@njit(cache=True)
def _aluinit(i, f, tp, alu_st, err):
    mode = f[AI_MODE]
    if mode > 8:
        _fail(err, E_EXEC_MODE, i, OP_ALUINIT, AI_MODE, mode, 0, 8, 0)
        return
    if not _init_geometry_ok(i, OP_ALUINIT, f, AI_KH, AI_KW, AI_SH, AI_SW, AI_SOI, AI_SB,
                             tp[T_AKMAX], tp[T_ASMAX], err):
        return
    if f[AI_SO] > tp[T_ASOMAX]:
        _fail(err, E_STRIDE_OUT, i, OP_ALUINIT, AI_SO, f[AI_SO], 1, tp[T_ASOMAX], 0)
        return
    act = f[AI_ACT]
    if not (act == 0 or act == 1 or act == 4 or (act == 3 and tp[T_DWLK] != 0)):
        _fail(err, E_ACT, i, OP_ALUINIT, AI_ACT, act, 0, 0, 1)
        return
    if mode == 1 or mode == 4 or mode == 7:
        for col in (AI_KH, AI_KW, AI_SH, AI_SW):
            if f[col] != 1:
                _fail(err, E_ALU_1X1, i, OP_ALUINIT, col, f[col], 1, 1, mode)
                return
    for k in range(MAX_FIELDS):
        alu_st[k] = f[k]
    alu_st[STATE_VALID] = 1


@njit(cache=True)
def _alu(i, f, banks, tp, st, err, fast):
    if st[STATE_VALID] == 0:
        _fail(err, E_NOINIT, i, OP_ALU, -1, 0, 0, 0, 1)
        return
    vpp = f[AL_VPP]
    if vpp > tp[T_ALUPP]:
        _fail(err, E_VPP, i, OP_ALU, AL_VPP, vpp, 1, tp[T_ALUPP], 1)
        return
    nimg = tp[T_NIMG]
    for col in (AL_BIDI, AL_BIDO):
        if f[col] >= nimg:
            _fail(err, E_BANK_IMG, i, OP_ALU, col, f[col], 0, nimg - 1, 0)
            return
    mode = st[AI_MODE]
    kd = f[AL_KD]
    if (mode == 1 or mode == 4 or mode == 7) and kd != 1:
        _fail(err, E_KD, i, OP_ALU, AL_KD, kd, 1, 1, mode)
        return
    if mode == 2 or mode == 3 or mode == 5:
        kd = 1
    cp = tp[T_CP]
    depth = tp[T_DEPTH]
    kh = st[AI_KH]
    kw = st[AI_KW]
    sh = st[AI_SH]
    sw = st[AI_SW]
    soi = st[AI_SOI]
    cg = st[AI_CG]
    ic = cg * cp
    ick = ic * kd
    length = st[AI_LEN]
    rows_in = (vpp - 1) * sh + kh
    cols_in = (length - 1) * sw + kw
    bidi = f[AL_BIDI]
    if not _pass_check(i, OP_ALU, AL_BIDI, err, tp, bidi, soi, rows_in, sh):
        return
    pv = -128 if mode == 3 else 0
    if rows_in * cols_in * ick > MAX_TILE:
        _fail(err, E_TOO_BIG, i, OP_ALU, AL_VPP, vpp, 1, 0, rows_in * cols_in * ick)
        return
    X = np.full((rows_in, cols_in * ick), pv, np.int16)
    if mode == 5:
        r_lo, r_hi, x_lo, x_hi = 0, rows_in, 0, cols_in
    else:
        r_lo = f[AL_PT]
        r_hi = min(rows_in, rows_in - kh + f[AL_PB] + 1)
        x_lo = f[AL_PL]
        x_hi = min(cols_in, cols_in - kw + f[AL_PR] + 1)
    _gather(banks, tp, X, rows_in, cols_in, ick, r_lo, r_hi, x_lo, x_hi, ick,
            bidi, soi, sh, st[AI_JRE], st[AI_JR], f[AL_BAI], f[AL_BAI1], f[AL_BAI2], f[AL_BAI3])
    co = st[AI_CO]
    if co > 0 and mode != 5:
        c0 = ic - co
        if c0 < 0:
            c0 = 0
        for r in range(rows_in):
            for x in range(cols_in):
                for d in range(kd):
                    p = x * ick + d * ic
                    for c in range(c0, ic):
                        X[r, p + c] = pv
    sc = st[AI_SC]
    act = st[AI_ACT]
    Y = np.empty((vpp, length * ic), np.int8)
    if mode == 0 or mode == 6 or mode == 8:
        npos = kh * kw * kd
        Wt = np.empty((npos, ic), np.int64)
        baw = f[AL_BAW]
        jrw = st[AI_JRW]
        dwb = tp[T_DWCONVW]
        tot = depth * cp
        for ky in range(kh):
            for kx in range(kw):
                for d in range(kd):
                    pi = (ky * kw + kx) * kd + d
                    if mode == 8:
                        wline = baw + (ky * kw + kx) * jrw + d * cg * 2
                        p0 = (wline % depth) * cp
                        for c in range(ic):
                            g = c // cp
                            lo = np.int64(banks[dwb, (p0 + 2 * g * cp) % tot]) & 0xFF
                            hi8 = np.int64(banks[dwb, (p0 + 2 * g * cp + 1) % tot])
                            Wt[pi, c] = hi8 * 256 + lo
                    else:
                        _read(banks[dwb], baw + (ky * kw + kx) * jrw + d * cg, ic, Wt[pi], 0, depth, cp)
        bias = np.zeros(ic, np.int64)
        if mode == 0:
            _read(banks[tp[T_BIAS]], f[AL_BAB], ic, bias, 0, depth, cp)
        sb = st[AI_SB]
        k = sc + 1 if mode == 0 else sc
        if fast and mode != 8:       # int8 weights: float32 lanes, exact by the bound of sim._fastmac
            A = np.empty((vpp, length * ic), np.int64)
            dw_acc(X.astype(np.float32), Wt.astype(np.float32), A, vpp, length, ic, kh, kw, kd, sh, sw)
        else:
            A = np.zeros((vpp, length * ic), np.int64)
            for h in range(vpp):
                for x in range(length):
                    acc = A[h, x * ic:(x + 1) * ic]
                    for ky in range(kh):
                        row = X[h * sh + ky]
                        for kx in range(kw):
                            for d in range(kd):
                                p = (x * sw + kx) * ick + d * ic
                                wr = Wt[(ky * kw + kx) * kd + d]
                                xs = row[p:p + ic]
                                for c in range(ic):
                                    acc[c] += np.int64(xs[c]) * wr[c]
        for h in range(vpp):
            for x in range(length):
                for c in range(ic):
                    if mode == 0:
                        a = 2 * A[h, x * ic + c] + (bias[c] << sb)
                    else:
                        a = A[h, x * ic + c]
                    Y[h, x * ic + c] = _act_round(a, k, act)
    elif mode == 1 or mode == 4:
        alpha = np.empty(ic, np.int64)
        if mode == 1:
            _read(banks[tp[T_DWCONVW]], f[AL_BAW], ic, alpha, 0, depth, cp)
        else:
            mf = st[AI_MF]
            if mf >= 128:
                mf -= 256
            alpha[:] = mf
        spp = st[AI_SPP]
        spn = st[AI_SPN]
        sp = spp - 32 if spp >= 32 else -spp
        sn = spn - 32 if spn >= 32 else -spn
        for h in range(vpp):
            for x in range(length):
                p = x * sw * ick
                for c in range(ic):
                    t = np.int64(X[h * sh, p + c])
                    if t < 0:
                        t = t * alpha[c]
                    if t < 0:
                        v = _rhr(t, sn)
                    else:
                        v = _rhr(t, sp)
                    Y[h, x * ic + c] = _sat8(v)
    elif mode == 7:
        sb = st[AI_SB]
        off = 3 * 2731 * (np.int64(1) << sb)
        for h in range(vpp):
            for x in range(length):
                p = x * sw * ick
                for c in range(ic):
                    n = np.int64(X[h * sh, p + c]) * 2731 + off
                    if n < 0:
                        n = 0
                    if n > 4294967296:
                        n = 4294967296
                    Y[h, x * ic + c] = _sat8(_rhr(n, sc))
    else:  # pool modes 2, 3, 5
        e = sc if sc < 8 else -(sc - 8)
        acc = np.empty(ic, np.int64)
        mf = st[AI_MF]
        if mf >= 128:
            mf -= 256
        mf32 = np.float32(mf)
        scale = 2.0 ** e
        for h in range(vpp):
            for x in range(length):
                if mode == 2:
                    acc[:] = 0
                else:
                    acc[:] = -128
                for ky in range(kh):
                    row = X[h * sh + ky]
                    for kx in range(kw):
                        p = (x * sw + kx) * ick
                        xs = row[p:p + ic]
                        if mode == 2:
                            for c in range(ic):
                                acc[c] += xs[c]
                        else:
                            for c in range(ic):
                                v16 = np.int64(xs[c])
                                if v16 > acc[c]:
                                    acc[c] = v16
                for c in range(ic):
                    if mode == 2:
                        prod = np.float32(acc[c]) * mf32
                        Y[h, x * ic + c] = _dpu_round_f(np.float64(prod) * scale)
                    else:
                        Y[h, x * ic + c] = _sat8(_rhr(acc[c], -e))
    _place(banks, tp, Y, vpp, length, ic, f[AL_BIDO], f[AL_BAO], st[AI_SO], st[AI_SOO], st[AI_JW],
           st[AI_JWE])


# ---- ELEW ------------------------------------------------------------------------------------------
@njit(cache=True)
def _elewinit(i, f, tp, elew_st, elew_ok, err):
    if f[EI_BIDI] >= tp[T_NIMG]:
        _fail(err, E_BANK_IMG, i, OP_ELEWINIT, EI_BIDI, f[EI_BIDI], 0, tp[T_NIMG] - 1, 0)
        return
    d = f[EI_ID]
    for k in range(MAX_FIELDS):
        elew_st[d, k] = f[k]
    elew_ok[d] = 1


@njit(cache=True)
def _elew(i, f, banks, tp, elew_st, elew_ok, err):
    pp = tp[T_PP]
    cp = tp[T_CP]
    depth = tp[T_DEPTH]
    vpp = f[EW_VPP]
    if vpp > tp[T_ALUPP]:
        _fail(err, E_VPP, i, OP_ELEW, EW_VPP, vpp, 1, tp[T_ALUPP], 1)
        return
    et = f[EW_TYPE]
    if et > 1:
        _fail(err, E_ELEW_TYPE, i, OP_ELEW, EW_TYPE, et, 0, 1, 0)
        return
    num = f[EW_NUM]
    if et == 1 and num != 2:
        _fail(err, E_ELEW_NUM, i, OP_ELEW, EW_NUM, num, 2, 2, 0)
        return
    if f[EW_BIDO] >= tp[T_NIMG]:
        _fail(err, E_BANK_IMG, i, OP_ELEW, EW_BIDO, f[EW_BIDO], 0, tp[T_NIMG] - 1, 0)
        return
    for k in range(num):
        if elew_ok[k] == 0:
            _fail(err, E_ELEW_ID, i, OP_ELEW, EW_NUM, num, 0, num - 1, k)
            return
        jb = elew_st[k, EI_JB]
        if jb * vpp > pp:
            _fail(err, E_JUMP_BANK, i, OP_ELEW, EW_VPP, vpp, 1, pp // jb, k)
            return
    cg = f[EW_CG]
    ic = cg * cp
    length = f[EW_LEN]
    if vpp * length * ic > MAX_TILE:
        _fail(err, E_TOO_BIG, i, OP_ELEW, EW_LEN, length, 1, 0, vpp * length * ic)
        return
    S = np.zeros((vpp, length * ic), np.int64)
    tmp = np.empty(ic, np.int64)
    for k in range(num):
        bidi = elew_st[k, EI_BIDI]
        gb = (bidi // pp) * pp
        share = elew_st[k, EI_SHARE] != 0
        jb = elew_st[k, EI_JB]
        bai = elew_st[k, EI_BAI]
        jre = elew_st[k, EI_JRE]
        jr = elew_st[k, EI_JR]
        sr = elew_st[k, EI_SR]
        for r in range(vpp):
            if share:
                bank = bidi
                wrap = 0
            else:
                slot = (bidi - gb) + r * jb
                bank = gb + slot % pp
                wrap = slot // pp
            for j in range(length):
                _read(banks[bank], bai + wrap * jre + j * jr, ic, tmp, 0, depth, cp)
                p = j * ic
                for c in range(ic):
                    t = (tmp[c] << 2) >> sr
                    if et == 0:
                        S[r, p + c] += t
                    elif k == 0:
                        S[r, p + c] = t
                    else:
                        S[r, p + c] *= t
    q = 2 if et == 0 else 4
    sw_ = f[EW_SW]
    kk = q - sw_ if sw_ < 16 else (sw_ - 16) + q
    relu = f[EW_ACT] == 1
    Y = np.empty((vpp, length * ic), np.int8)
    for r in range(vpp):
        for p in range(length * ic):
            v = _rhr(S[r, p], kk)
            if relu and v < 0:
                v = 0
            Y[r, p] = _sat8(v)
    bido = f[EW_BIDO]
    gb = (bido // pp) * pp
    bao = f[EW_BAO]
    jw = f[EW_JW]
    jwe = f[EW_JWE]
    for r in range(vpp):
        slot = (bido - gb) + r
        bank = gb + slot % pp
        wrap = slot // pp
        for j in range(length):
            _write(banks[bank], bao + j * jw + wrap * jwe, Y[r], j * ic, ic, depth, cp)


# ---- main loop -------------------------------------------------------------------------------------
@njit(cache=True)
def run_range(op, fl, start, stop, banks, ddr, reg_off, reg_size, tp, conv_st, alu_st, elew_st, elew_ok,
              counts, ld_bytes, sv_bytes, err, status, fast):
    maxch = 16384 + 64
    buf = np.empty(maxch, np.int8)
    status[1] = 0
    tile = np.empty((0, 0), np.float32)         # the fast paths' last CONV input tile (sim._tilecache)
    tile8 = np.empty((0, 0), np.uint8)
    tstate = np.zeros(_tc.NKEY + 2, np.int64)
    trows = np.zeros((_tc.MAX_ROWS, 3), np.int64)
    nlanes = (tp[T_CP] + LANES - 1) // LANES * LANES                  # the weight mirror of sim._weightcache
    wt = np.empty((tp[T_DEPTH] * tp[T_CP] if fast == FAST_FLOAT else 0, nlanes), np.float32)
    wt8 = np.zeros((tp[T_DEPTH] * tp[T_CP] // 4 if fast == FAST_VNNI else 0, nlanes), np.int32)
    wsl = np.zeros((tp[T_DEPTH] if fast == FAST_VNNI else 0, nlanes), np.int64)
    wvalid = np.zeros(tp[T_DEPTH], np.int8)
    for i in range(start, stop):
        o = op[i]
        f = fl[i]
        if o == OP_LOAD:
            _load(i, f, banks, ddr, reg_off, reg_size, tp, ld_bytes, err, buf)
        elif o == OP_SAVE:
            _save(i, f, banks, ddr, reg_off, reg_size, tp, sv_bytes, err, buf)
        elif o == OP_CONV:
            tile, tile8 = _conv(i, f, banks, tp, conv_st, err, fast, tile, tile8, tstate, trows, wt, wt8, wsl, wvalid)
        elif o == OP_CONVINIT:
            _convinit(i, f, tp, conv_st, err)
        elif o == OP_ALU:
            _alu(i, f, banks, tp, alu_st, err, fast)
        elif o == OP_ALUINIT:
            _aluinit(i, f, tp, alu_st, err)
        elif o == OP_ELEWINIT:
            _elewinit(i, f, tp, elew_st, elew_ok, err)
        elif o == OP_ELEW:
            _elew(i, f, banks, tp, elew_st, elew_ok, err)
        elif o == OP_END:
            counts[o] += 1
            status[0] = i + 1
            status[1] = 1
            return
        else:
            _fail(err, E_LEGACY, i, o, -1, 0, 0, 0, 0)
        if err[0] != 0:
            status[0] = i
            return
        if fast:
            _tc.invalidate_after(o, f, conv_st, alu_st, tstate, trows, tp[T_PP], tp[T_DEPTH], tp[T_CP])
            if o == OP_LOAD:
                _wc.invalidate_after_load(f, wvalid, tp[T_CONVW], tp[T_CP], tp[T_DEPTH], tp[T_CP])
        counts[o] += 1
    status[0] = stop
