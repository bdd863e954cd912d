"""Bank-port request traces of every instruction (docs/bank-ports.md §2, docs/microarchitecture.md §3a).

An instruction's *request* in engine time τ (τ = 0 in its start cycle, counting only the cycles in which
its engine is not stalled) is the set of banks it reads and the set it writes in that cycle, exactly as
the un-stalled RTL engine enables its bank ports (hw/conv.py, hw/misc.py, hw/loadsave.py), with the
contract's simplification that an ALU step requests the banks of all rows h < vpp (padding is ignored).
Only the arbitrated ports appear (contract §1): image-bank reads and writes and BIAS reads. CONVW /
DWCONVW reads and every write of a parameter bank (LOAD only) have a single user and never conflict.

Sets are bit masks over absolute bank ids (Target.num_banks <= 63). Engine timings (τ) of each kind,
for the instruction's own fields and the INIT state it runs under:

* CONV, N = length·K steps, K = kernel_h·kernel_w·channel_group, loop (w, ky, kx, g), g innermost.
  Step j reads in τ = 1 + j the banks of rows h < vpp (CONVINIT vpp): bank
  IMGBASE(bank_id_in) + (bank_id_in mod PP + (soi + ky) div stride_h + h) mod PP. The BIAS line is read
  once, in τ = 1. Column w is written in τ = 3 + (w+1)·K (rows h < vpp, bank of the output placement
  (bank_id_out mod PP + (soo + h) div stride_out) mod PP in bank_id_out's group).
* ALU, N = length·channel_group·KK steps, KK = kernel_h·kernel_w·kernel_d, loop (w, g, ky, kx, d).
  Step j reads in τ = 1 + j the banks of rows h < vpp (ALU vpp), same bank rule as CONV with the ALUINIT
  strides. exec_mode 0 reads the BIAS line in τ = 2 + l·KK for every output line l (its first step's
  S1). Output line l is written in τ = 5 + (l+1)·KK (rows h < vpp, same output placement rule).
* ELEW, N = length·channel_group·num steps, loop (j, g, k). Step j reads in τ = 1 + j input k = j mod num:
  rows r < vpp in bank bank_id_in (share_pp) or IMGBASE + (bank_id_in mod PP + r·jump_bank) mod PP of
  ELEWINIT id k. Every num-th step completes an output line: written in τ = 5 + (q+1)·num (rows r < vpp,
  bank IMGBASE(bank_id_out) + (bank_id_out mod PP + r) mod PP).
* LOAD: item i takes c_i = max(lines, ceil(b_i / (B·ddr_ports))) loop cycles (lines = ceil(channel/W),
  b_i its unmasked bytes; a broadcast item c_i = lines) starting in τ = 1 + Σ_{i'<i} c_i'. Its lines are
  written to bank_id in the first `lines` cycles of the item plus one (the DDR data of a read arrives the
  next cycle); a broadcast LOAD writes in the loop cycle itself. Only image banks are arbitrated.
* SAVE: item i takes p = max(lines, ceil(n / B)) loop cycles (n = channel, or 1 for argmax) starting in
  τ = 1 + i·p; it reads bank_id in its first `lines` cycles. const_en SAVEs read no bank.
* CONVINIT, ALUINIT, ELEWINIT, END: no request.

A write of a CONV / ALU puts `write_lines(p, b)` lines into bank b: the number of its rows h < vpp that
the placement maps to b (1, or up to stride_out when stride_out > 1; P_WQ2..P_WQ4 mark the banks with
at least 2..4 rows). The bank's write queue takes them one per cycle: the first in the grant cycle, the
others in the next n − 1 cycles, during which the bank's write port is busy (docs/bank-ports.md §2; the
arbitration in sim/_timing.py tracks it). LOAD and ELEW writes are one line per bank.

`request(k, τ, ...)` returns (reads, writes, run): the masks in τ and a number of cycles ≥ 1 during which
they stay the same (so that the arbitration can step from one change to the next).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import _kernels as K

# kinds of request traces
KD_NONE, KD_CONV, KD_ALU, KD_ELEW, KD_LOAD, KD_SAVE = range(6)
INF = 1 << 62
TM_DDR_BPC, TM_PORTS = 4, 5          # slots of the timing vector (sim/_timing.py checks they agree)

# parameter slots of prm[k]
(P_N, P_PERIOD, P_KYRUN, P_VPP, P_GB, P_C, P_SOI, P_SH, P_WM,
 P_WFIRST, P_WPER, P_WCNT, P_BFIRST, P_BPER, P_BCNT,
 P_RM0, P_RM1, P_RM2, P_RM3, P_SAME,
 P_LEN, P_LINES, P_PER, P_W0, P_MASK, P_BIASM, P_PP, P_RCONST, P_RUNION, P_BLAST, P_WLAST, P_LAST,
 P_WQ2, P_WQ3, P_WQ4) = range(35)
NPRM = 35
MAX_LINES = 4          # the most lines one write puts into one bank (stride_out_h limit, isa/target.py)


@njit(cache=True)
def _cdiv(a, b):
    return (a + b - 1) // b


@njit(cache=True)
def _rot_block(vpp, u, pp):
    """Bits (u + h) mod pp for h < vpp, as a mask over the pp banks of a group."""
    block = (1 << vpp) - 1
    full = (1 << pp) - 1
    return ((block << u) | (block >> (pp - u))) & full


@njit(cache=True)
def _out_masks(bank_id_out, vpp, so, soo, pp, p):
    """Banks of rows h < vpp of a CONV / ALU output (spec §2.4 placement with stride_out: row h goes to
    slot (bank_id_out mod PP + (soo + h) div stride_out) mod PP of bank_id_out's group), into p[P_WM], and
    the banks that get at least 2, 3, 4 of those rows (lines of one write) into p[P_WQ2 .. P_WQ4]."""
    gb = (bank_id_out // pp) * pp
    b0 = bank_id_out - gb
    cnt = np.zeros(pp, np.int64)
    for h in range(vpp):
        cnt[(b0 + (soo + h) // so) % pp] += 1
    for s in range(4):
        p[P_WM if s == 0 else P_WQ2 + s - 1] = 0
    for b in range(pp):
        for s in range(4):
            if cnt[b] > s:
                p[P_WM if s == 0 else P_WQ2 + s - 1] |= np.int64(1) << (gb + b)


@njit(cache=True)
def write_lines(p, b):
    """Lines that one write of the instruction (its prm row p) puts into bank b (0 if it does not write
    b): 1 + the rows beyond the first that share the bank (docs/bank-ports.md §2 write queue)."""
    if ((p[P_WM] >> b) & 1) == 0:
        return 0
    return 1 + ((p[P_WQ2] >> b) & 1) + ((p[P_WQ3] >> b) & 1) + ((p[P_WQ4] >> b) & 1)


@njit(cache=True)
def future_queue(kind, p, tau):
    """Banks into which the instruction may still write two or more lines at once from engine time τ on."""
    if (kind == KD_CONV or kind == KD_ALU) and tau <= p[P_WLAST]:
        return p[P_WQ2]
    return 0


@njit(cache=True)
def _row_mask(prm, ky):
    """Banks of the rows h < vpp of a CONV / ALU step with kernel row ky."""
    pp = prm[P_PP]
    u = (prm[P_C] + (prm[P_SOI] + ky) // prm[P_SH]) % pp
    return _rot_block(prm[P_VPP], u, pp) << prm[P_GB]


@njit(cache=True)
def load_items(f, lines, w, bp):
    """(Σ item cycles, Σ unmasked bytes, cycles of every item if they are all equal else -1) of a DDR
    LOAD: item i takes max(lines, ceil(b_i / bp)) cycles. Only the first items (masked by pad_start) and
    the last pad_idx items (masked by pad_end) can differ from the others, which read all `channel` bytes
    (spec §6.2), so only those are visited."""
    ch = f[K.LD_CHANNEL]
    length = f[K.LD_LENGTH]
    jr = f[K.LD_JR]
    aug = jr <= ch and ch <= 64
    full = _cdiv(ch, bp)
    if full < lines:
        full = lines
    if not aug:
        return length * full, length * ch, full
    first_end = length - f[K.LD_PAD_IDX]
    cw = lines * w
    a = _cdiv(f[K.LD_PAD_START], jr)          # items before a can have lo > 0
    if a > length:
        a = length
    m1 = first_end if first_end > a else a     # items in [a, m1) read all channel bytes
    if m1 > length:
        m1 = length
    cyc = (m1 - a) * full
    nb = (m1 - a) * ch
    per = full if m1 > a else -2
    for part in range(2):
        i0 = 0 if part == 0 else m1
        i1 = a if part == 0 else length
        for it in range(i0, i1):
            lo, hi = K._load_span(it, ch, aug, f[K.LD_PAD_START], f[K.LD_PAD_END], jr, first_end, cw)
            b = hi - lo if hi > lo else 0
            c = _cdiv(b, bp)
            if c < lines:
                c = lines
            cyc += c
            nb += b
            if per == -2:
                per = c
            elif c != per:
                per = -1
    return cyc, nb, per


@njit(cache=True)
def _rows_union(p, kh):
    """Union of the row masks over kernel rows 0..kh-1: vpp + (number of extra slots) consecutive slots."""
    pp = p[P_PP]
    q0 = p[P_SOI] // p[P_SH]
    q1 = (p[P_SOI] + kh - 1) // p[P_SH]
    width = p[P_VPP] + q1 - q0
    if width > pp:
        width = pp
    return _rot_block(width, (p[P_C] + q0) % pp, pp) << p[P_GB]


@njit(cache=True)
def future_foot(kind, p, tau):
    """(reads, writes): the banks the instruction may still request from engine time τ on."""
    if kind == KD_NONE:
        return 0, 0
    if kind == KD_LOAD:
        return 0, (p[P_MASK] if tau <= p[P_LAST] else 0)
    if kind == KD_SAVE:
        return (p[P_MASK] if tau <= p[P_LAST] else 0), 0
    r = p[P_RUNION] if tau <= p[P_N] else 0
    if tau <= p[P_BLAST]:
        r |= p[P_BIASM]
    return r, (p[P_WM] if tau <= p[P_WLAST] else 0)


@njit(cache=True)
def _finish(p, kind, rfoot, wfoot, i):
    """Last request times and the static footprint of instruction i (its prm row p)."""
    if kind == KD_LOAD or kind == KD_SAVE:
        per = p[P_PER]
        if per > 0:                           # (unequal LOAD items: trace_params sets P_LAST)
            p[P_LAST] = p[P_W0] + (p[P_LEN] - 1) * per + p[P_LINES] - 1
    elif kind != KD_NONE:
        p[P_BLAST] = p[P_BFIRST] + (p[P_BCNT] - 1) * p[P_BPER] if p[P_BCNT] > 0 else -1
        p[P_WLAST] = p[P_WFIRST] + (p[P_WCNT] - 1) * p[P_WPER] if p[P_WCNT] > 0 else -1
        last = p[P_N]
        if p[P_BLAST] > last:
            last = p[P_BLAST]
        if p[P_WLAST] > last:
            last = p[P_WLAST]
        p[P_LAST] = last
    rfoot[i], wfoot[i] = future_foot(kind, p, 0)


@njit(cache=True)
def _rows_const(p, kh):
    """1 if every kernel row reads the same banks (all rows in one slot, or vpp = PP: the whole group)."""
    if p[P_VPP] >= p[P_PP] or (p[P_SOI] + kh - 1) // p[P_SH] == p[P_SOI] // p[P_SH]:
        return 1
    return 0


@njit(cache=True)
def trace_params(op, fl, n, tp, tm, kind, prm, rfoot, wfoot):
    """Per instruction 0..n-1: its trace kind, parameters and static footprint (the union of its read
    masks and of its write masks over all τ). Tracks the CONVINIT / ALUINIT / ELEWINIT state in program
    order, as the engines do. Instructions before their INIT get KD_NONE (costs() rejects them)."""
    pp = tp[K.T_PP]
    w = tp[K.T_CP]
    nimg = tp[K.T_NIMG]
    bias = np.int64(1) << tp[K.T_BIAS]
    bpc = tm[TM_DDR_BPC]
    ports = tm[TM_PORTS]
    bp = bpc * ports
    ci = np.full(K.MAX_FIELDS, -1, np.int64)
    ai = np.full(K.MAX_FIELDS, -1, np.int64)
    ei = np.full((4, K.MAX_FIELDS), -1, np.int64)
    for i in range(n):
        o = op[i]
        f = fl[i]
        kind[i] = KD_NONE
        rfoot[i] = 0
        wfoot[i] = 0
        for s in range(NPRM):
            prm[i, s] = 0
        p = prm[i]
        p[P_PP] = pp
        if o == K.OP_CONVINIT:
            for s in range(K.MAX_FIELDS):
                ci[s] = f[s]
        elif o == K.OP_ALUINIT:
            for s in range(K.MAX_FIELDS):
                ai[s] = f[s]
        elif o == K.OP_ELEWINIT:
            d = f[K.EI_ID]
            if 0 <= d < 4:
                for s in range(K.MAX_FIELDS):
                    ei[d, s] = f[s]
        elif o == K.OP_CONV and ci[K.CI_KH] >= 0:
            kh, kw, cg = ci[K.CI_KH], ci[K.CI_KW], f[K.CV_CG]
            kk = kh * kw * cg
            length = f[K.CV_LEN]
            bidi = f[K.CV_BIDI]
            kind[i] = KD_CONV
            p[P_N] = length * kk
            p[P_PERIOD] = kk
            p[P_KYRUN] = kw * cg
            p[P_VPP] = ci[K.CI_VPP]
            p[P_GB] = (bidi // pp) * pp
            p[P_C] = bidi % pp
            p[P_SOI] = ci[K.CI_SOI]
            p[P_SH] = ci[K.CI_SH]
            _out_masks(f[K.CV_BIDO], ci[K.CI_VPP], ci[K.CI_SO], ci[K.CI_SOO], pp, p)
            p[P_WFIRST] = 3 + kk
            p[P_WPER] = kk
            p[P_WCNT] = length
            p[P_BFIRST] = 1
            p[P_BPER] = 1
            p[P_BCNT] = 1
            p[P_BIASM] = bias
            p[P_RCONST] = _rows_const(p, kh)
            p[P_RUNION] = _rows_union(p, kh)
        elif o == K.OP_ALU and ai[K.AI_KH] >= 0:
            kh, kw, kd, cg = ai[K.AI_KH], ai[K.AI_KW], f[K.AL_KD], ai[K.AI_CG]
            kk = kh * kw * kd
            nl = ai[K.AI_LEN] * cg
            bidi = f[K.AL_BIDI]
            kind[i] = KD_ALU
            p[P_N] = nl * kk
            p[P_PERIOD] = kk
            p[P_KYRUN] = kw * kd
            p[P_VPP] = f[K.AL_VPP]
            p[P_GB] = (bidi // pp) * pp
            p[P_C] = bidi % pp
            p[P_SOI] = ai[K.AI_SOI]
            p[P_SH] = ai[K.AI_SH]
            _out_masks(f[K.AL_BIDO], f[K.AL_VPP], ai[K.AI_SO], ai[K.AI_SOO], pp, p)
            p[P_WFIRST] = 5 + kk
            p[P_WPER] = kk
            p[P_WCNT] = nl
            if ai[K.AI_MODE] == 0:
                p[P_BFIRST] = 2
                p[P_BPER] = kk
                p[P_BCNT] = nl
                p[P_BIASM] = bias
            p[P_RCONST] = _rows_const(p, kh)
            p[P_RUNION] = _rows_union(p, kh)
        elif o == K.OP_ELEW:
            num = f[K.EW_NUM]
            vpp = f[K.EW_VPP]
            nq = f[K.EW_LEN] * f[K.EW_CG]
            ok = True
            for k in range(num):
                if k >= 4 or ei[k, K.EI_ID] < 0:
                    ok = False
            if ok:
                kind[i] = KD_ELEW
                p[P_N] = nq * num
                p[P_PERIOD] = num
                p[P_VPP] = vpp
                r = 0
                for k in range(num):
                    b = ei[k, K.EI_BIDI]
                    if ei[k, K.EI_SHARE] != 0:
                        m = np.int64(1) << b
                    else:
                        gb = (b // pp) * pp
                        m = 0
                        for rr in range(vpp):
                            m |= np.int64(1) << (gb + (b - gb + rr * ei[k, K.EI_JB]) % pp)
                    p[P_RM0 + k] = m
                    r |= m
                same = 1
                for k in range(1, num):
                    if p[P_RM0 + k] != p[P_RM0]:
                        same = 0
                p[P_SAME] = same
                bo = f[K.EW_BIDO]
                gb = (bo // pp) * pp
                m = 0
                for rr in range(vpp):
                    m |= np.int64(1) << (gb + (bo - gb + rr) % pp)
                p[P_WM] = m
                p[P_WFIRST] = 5 + num
                p[P_WPER] = num
                p[P_WCNT] = nq
                p[P_RUNION] = r
        elif o == K.OP_LOAD:
            bank = f[K.LD_BANK_ID]
            if bank < nimg:
                ch = f[K.LD_CHANNEL]
                length = f[K.LD_LENGTH]
                lines = _cdiv(ch, w)
                kind[i] = KD_LOAD
                p[P_LEN] = length
                p[P_LINES] = lines
                p[P_MASK] = np.int64(1) << bank
                if f[K.LD_BCAST] == 7:
                    p[P_W0] = 1
                    p[P_PER] = lines
                else:
                    p[P_W0] = 2
                    cyc, _, per = load_items(f, lines, w, bp)
                    p[P_PER] = per
                    if per < 0:                   # last item: its first loop cycle + 1 + lines - 1
                        p[P_LAST] = 1 + cyc - _load_item_cycles(f, length - 1, lines, bp, w) + lines
        elif o == K.OP_SAVE:
            bank = f[K.SV_BANK_ID]
            if f[K.SV_CONST_EN] == 0 and bank < nimg:
                ch = f[K.SV_CHANNEL]
                lines = _cdiv(ch, w)
                nb = 1 if (f[K.SV_ARGMAX] & 2) != 0 else ch
                beats = _cdiv(nb, bpc)
                kind[i] = KD_SAVE
                p[P_LEN] = f[K.SV_LENGTH]
                p[P_LINES] = lines
                p[P_PER] = beats if beats > lines else lines
                p[P_W0] = 1
                p[P_MASK] = np.int64(1) << bank
        _finish(p, kind[i], rfoot, wfoot, i)


@njit(cache=True)
def _events(tau, first, per, cnt):
    """One-cycle events in τ = first + m·per, 0 <= m < cnt: (hit, cycles until the hit status may change)."""
    if cnt <= 0:
        return False, INF
    if per == 1:                              # a contiguous range
        if tau < first:
            return False, first - tau
        if tau < first + cnt:
            return True, first + cnt - tau
        return False, INF
    if tau < first:
        return False, first - tau
    rel = tau - first
    m = rel // per
    if m >= cnt:
        return False, INF
    ph = rel - m * per
    if ph == 0:
        return True, 1
    if m + 1 >= cnt:
        return False, INF
    return False, per - ph


@njit(cache=True)
def _windows(tau, first, per, width, cnt):
    """Windows [first + m·per, first + m·per + width), 0 <= m < cnt: (hit, cycles of constant status)."""
    if cnt <= 0:
        return False, INF
    if tau < first:
        return False, first - tau
    rel = tau - first
    if width >= per:                          # back to back: one range
        if rel < cnt * per:
            return True, cnt * per - rel
        return False, INF
    m = rel // per
    if m >= cnt:
        return False, INF
    ph = rel - m * per
    if ph < width:
        return True, width - ph
    if m + 1 >= cnt:
        return False, INF
    return False, per - ph


@njit(cache=True)
def _load_item_cycles(f, it, lines, bp, w):
    ch = f[K.LD_CHANNEL]
    jr = f[K.LD_JR]
    aug = jr <= ch and ch <= 64
    first_end = f[K.LD_LENGTH] - f[K.LD_PAD_IDX]
    lo, hi = K._load_span(it, ch, aug, f[K.LD_PAD_START], f[K.LD_PAD_END], jr, first_end, lines * w)
    b = hi - lo if hi > lo else 0
    c = _cdiv(b, bp)
    return c if c > lines else lines


@njit(cache=True)
def request(kind, p, f, tau, cur, bp, w, rel_r, rel_w):
    """(read mask, write mask, run) of an instruction with trace `kind`, parameters `p` (its prm row) and
    fields `f` in engine time τ, restricted to the banks of rel_r (reads) and rel_w (writes); the
    restricted masks stay the same for τ .. τ + run - 1 (with rel_r = rel_w = -1: the whole request).
    `cur` = [item, first τ of the item] is a cursor for LOADs with unequal items; τ must not decrease
    between calls with one cursor (reset it to [0, 1] for a new instruction)."""
    if kind == KD_NONE:
        return 0, 0, INF
    if kind == KD_LOAD or kind == KD_SAVE:
        m = p[P_MASK] & (rel_w if kind == KD_LOAD else rel_r)
        if m == 0:
            return 0, 0, INF
        lines = p[P_LINES]
        per = p[P_PER]
        if per > 0:
            hit, run = _windows(tau, p[P_W0], per, lines, p[P_LEN])
        else:                                 # LOAD with items of different lengths: walk the items
            w0 = p[P_W0]
            length = p[P_LEN]
            # item i runs in loop cycles [t0_i, t0_i + c_i) and writes in [t0_i + w0 - 1, ... + lines)
            while cur[0] < length and tau >= cur[1] + w0 - 1 + lines:
                cur[1] += _load_item_cycles(f, cur[0], lines, bp, w)
                cur[0] += 1
            if cur[0] >= length:
                return 0, 0, INF
            a = cur[1] + w0 - 1
            if tau < a:
                return 0, 0, a - tau
            hit = True
            run = a + lines - tau
        if not hit:
            return 0, 0, run
        if kind == KD_LOAD:
            return 0, m, run
        return m, 0, run
    rm = 0
    wm = 0
    n = p[P_N]
    if tau < 1:
        run = 1
    elif tau <= n:
        j = tau - 1
        if kind == KD_ELEW:
            num = p[P_PERIOD]
            rm = p[P_RM0 + j % num] & rel_r
            run = n + 1 - tau
            for k in range(num):
                if (p[P_RM0 + k] & rel_r) != rm:
                    run = 1
        else:
            kr = p[P_KYRUN]
            kh = p[P_PERIOD] // kr
            ky = (j % p[P_PERIOD]) // kr
            rm = _row_mask(p, ky) & rel_r
            if p[P_RCONST] != 0:
                run = n + 1 - tau
            else:
                # the rows move to the next bank slot every stride_h kernel rows: find the next kernel
                # row of this column whose (restricted) banks differ; if none, and the first rows of the
                # next column have the same banks too, the run goes on into it (checked up to PP slots)
                ky2 = ky + 1
                while ky2 < kh and (_row_mask(p, ky2) & rel_r) == rm:
                    ky2 += 1
                run = (ky2 - ky) * kr - j % kr
                if ky2 == kh:
                    same = True
                    for q in range(p[P_PP]):
                        kq = q * p[P_SH]
                        if kq < kh and (_row_mask(p, kq) & rel_r) != rm:
                            same = False
                    if same:
                        run = n + 1 - tau
            if run > n + 1 - tau:
                run = n + 1 - tau
    else:
        run = INF
    bm = p[P_BIASM] & rel_r
    if bm != 0:
        hit, r2 = _events(tau, p[P_BFIRST], p[P_BPER], p[P_BCNT])
        if hit:
            rm |= bm
        if r2 < run:
            run = r2
    wmm = p[P_WM] & rel_w
    if wmm != 0:
        hit, r2 = _events(tau, p[P_WFIRST], p[P_WPER], p[P_WCNT])
        if hit:
            wm = wmm
        if r2 < run:
            run = r2
    return rm, wm, run


@njit(cache=True)
def expand(kind, p, f, cost, bp, w, rd, wr, check_runs):
    """rd[τ], wr[τ] for τ < cost, by calling `request` at every τ; with check_runs, also checks that each
    returned run really is constant (returns the first τ where it is not, or -1)."""
    cur = np.zeros(2, np.int64)
    cur[1] = 1
    bad = -1
    hold_r = 0
    hold_w = 0
    hold_until = -1
    for tau in range(cost):
        a, b, run = request(kind, p, f, tau, cur, bp, w, -1, -1)
        rd[tau] = a
        wr[tau] = b
        if check_runs and bad < 0:
            if tau < hold_until and (a != hold_r or b != hold_w):
                bad = tau
            if run < 1:
                bad = tau
            if tau >= hold_until:
                hold_r, hold_w, hold_until = a, b, tau + run
    return bad


def mask_banks(m: int) -> list[int]:
    """The bank ids of a mask."""
    return [b for b in range(63) if (int(m) >> b) & 1]


__all__ = ["request", "trace_params", "expand", "mask_banks", "write_lines", "future_queue", "KD_NONE", "KD_CONV",
           "KD_ALU", "KD_ELEW", "KD_LOAD", "KD_SAVE", "NPRM"]
