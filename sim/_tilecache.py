"""Reuse of a CONV input tile across consecutive CONVs (the fast path of `sim._kernels`).

A layer with more than OCP output channels issues one CONV per output-channel group over the same input strip
(spec §6.4: only `bank_addr_weights`, `bank_addr_bias` and `bank_addr_out` change), usually with LOADs, SAVEs and
the other CONVs' output writes in between. Gathering the strip costs as much memory traffic as its products cost
arithmetic, so the executor keeps the last gathered float32 tile and hands it to the next CONV when

1. the key matches: every CONVINIT field and every CONV field that the gathering reads (bank_id_in, the four
   input base addresses, channel_group, length, the four pads, channel_offset) are equal, so the same formula
   reads the same lines and zeroes the same positions; and
2. no bank line that the tile was read from has been written since: after every LOAD, CONV, ALU and ELEW
   (the only instructions that write banks, spec §2.2) its written lines are compared with the tile's read
   lines, bank by bank, as circular intervals modulo DEPTH (over-approximated: an instruction's items span
   `[line, line + (n−1)·jump + lines per item)`), and any overlap drops the tile. The check runs *after* the
   instruction, so a CONV that overwrites its own input invalidates the tile it has just gathered.

Banks changed from Python between `run` calls cannot be seen here, so the tile lives for one `run_range` call.
Program order is unchanged: each CONV still executes in turn, only its gathering is skipped.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from opendpu.isa.fields import FIELD_INDEX, MAX_FIELDS
from opendpu.isa.program import OP_INDEX

MAX_ROWS = 256                  # tile rows tracked; a larger tile is never cached
NKEY = MAX_FIELDS + 12          # CONVINIT fields, then the CONV gathering fields below
_CONV_KEY = tuple(FIELD_INDEX["CONV"][n] for n in (
    "bank_id_in", "bank_addr_in", "bank_addr_in_1", "bank_addr_in_2", "bank_addr_in_3", "channel_group", "length",
    "pad_top", "pad_bottom", "pad_left", "pad_right", "channel_offset"))
(K0, K1, K2, K3, K4, K5, K6, K7, K8, K9, K10, K11) = _CONV_KEY

_OP_LOAD, _OP_CONV, _OP_ALU, _OP_ELEW = OP_INDEX["LOAD"], OP_INDEX["CONV"], OP_INDEX["ALU"], OP_INDEX["ELEW"]
_LD = FIELD_INDEX["LOAD"]
LD_BANK, LD_ADDR, LD_LEN, LD_CH, LD_JW = (_LD[n] for n in ("bank_id", "bank_addr", "length", "channel", "jump_write"))
_CI = FIELD_INDEX["CONVINIT"]
CI_VPP, CI_SO, CI_SOO, CI_JW, CI_JWE = (_CI[n] for n in (
    "valid_pixel_parallel", "stride_out", "stride_offset_out", "jump_write", "jump_write_endl"))
_CV = FIELD_INDEX["CONV"]
CV_BIDO, CV_BAO, CV_LEN = _CV["bank_id_out"], _CV["bank_addr_out"], _CV["length"]
_AI = FIELD_INDEX["ALUINIT"]
AI_SO, AI_SOO, AI_JW, AI_JWE, AI_LEN, AI_CG = (_AI[n] for n in (
    "stride_out", "stride_offset_out", "jump_write", "jump_write_endl", "length", "channel_group"))
_AL = FIELD_INDEX["ALU"]
AL_BIDO, AL_BAO, AL_VPP = _AL["bank_id_out"], _AL["bank_addr_out"], _AL["valid_pixel_parallel"]
_EW = FIELD_INDEX["ELEW"]
EW_BIDO, EW_BAO, EW_VPP, EW_LEN, EW_JW, EW_JWE, EW_CG = (_EW[n] for n in (
    "bank_id_out", "bank_addr_out", "valid_pixel_parallel", "length", "jump_write", "jump_write_endl",
    "channel_group"))


def new_state():
    """(key + [valid, rows], rows [MAX_ROWS, 3] of (bank, first line, lines)) for one run_range call."""
    return np.zeros(NKEY + 2, np.int64), np.zeros((MAX_ROWS, 3), np.int64)


@njit(cache=True, inline="always")
def _key(st, f, out):
    for k in range(MAX_FIELDS):
        out[k] = st[k]
    out[MAX_FIELDS] = f[K0]
    out[MAX_FIELDS + 1] = f[K1]
    out[MAX_FIELDS + 2] = f[K2]
    out[MAX_FIELDS + 3] = f[K3]
    out[MAX_FIELDS + 4] = f[K4]
    out[MAX_FIELDS + 5] = f[K5]
    out[MAX_FIELDS + 6] = f[K6]
    out[MAX_FIELDS + 7] = f[K7]
    out[MAX_FIELDS + 8] = f[K8]
    out[MAX_FIELDS + 9] = f[K9]
    out[MAX_FIELDS + 10] = f[K10]
    out[MAX_FIELDS + 11] = f[K11]


@njit(cache=True)
def lookup(tstate, st, f):
    """True when the cached tile is valid and was gathered by a CONV with the same key as (CONVINIT st, CONV f)."""
    if tstate[NKEY] == 0:
        return False
    key = np.empty(NKEY, np.int64)
    _key(st, f, key)
    for k in range(NKEY):
        if key[k] != tstate[k]:
            return False
    return True


@njit(cache=True)
def store(tstate, trows, st, f, pp, depth, w, rows_in, r_lo, r_hi, x_lo, x_hi, nread, bank_id, soi, sh, jre, jr,
          b0, b1, b2, b3):
    """Record the key and the lines read by `_kernels._gather` with these arguments (spec §6.4 addressing)."""
    tstate[NKEY] = 0
    if rows_in > MAX_ROWS:
        return
    _key(st, f, tstate)
    gb = (bank_id // pp) * pp
    n = 0
    if x_hi > x_lo and nread > 0:
        span = (x_hi - 1 - x_lo) * jr + (nread + w - 1) // w
        for r in range(r_lo, r_hi):
            t = soi + r
            slot = (bank_id - gb) + t // sh
            ps = slot // pp
            base = b0 if ps == 0 else (b1 if ps == 1 else (b2 if ps == 2 else b3))
            trows[n, 0] = gb + slot % pp
            trows[n, 1] = (base + (t % sh) * jre + x_lo * jr) % depth
            trows[n, 2] = span
            n += 1
    tstate[NKEY + 1] = n
    tstate[NKEY] = 1


@njit(cache=True, inline="always")
def _overlap(a, n1, b, n2, depth):
    """Do the circular line intervals [a, a+n1) and [b, b+n2) modulo depth share a line?"""
    if n1 <= 0 or n2 <= 0:
        return False
    if n1 >= depth or n2 >= depth:
        return True
    d = (b - a) % depth
    return d < n1 or d + n2 > depth


@njit(cache=True)
def _hit(tstate, trows, bank, line, span, depth):
    for k in range(tstate[NKEY + 1]):
        if trows[k, 0] == bank and _overlap(trows[k, 1], trows[k, 2], line % depth, span, depth):
            return True
    return False


@njit(cache=True)
def _placed_hit(tstate, trows, pp, depth, vpp, bank_id, bao, so, soo, jw, jwe, span):
    """Rows placed as in `_kernels._place` (spec §6.4 output placement)."""
    gb = (bank_id // pp) * pp
    for h in range(vpp):
        t = h + soo
        slot = (bank_id % pp) + t // so
        row0 = bao + (slot // pp) * so * jwe + (t % so) * jwe
        if _hit(tstate, trows, gb + slot % pp, row0, span, depth):
            return True
    return False


@njit(cache=True)
def invalidate_after(o, f, conv_st, alu_st, tstate, trows, pp, depth, w):
    """Drop the tile if instruction (o, f), just executed, wrote a line the tile was read from."""
    if tstate[NKEY] == 0:
        return
    hit = False
    if o == _OP_LOAD:
        span = (f[LD_LEN] - 1) * f[LD_JW] + (f[LD_CH] + w - 1) // w
        hit = _hit(tstate, trows, f[LD_BANK], f[LD_ADDR], span, depth)
    elif o == _OP_CONV:
        span = (f[CV_LEN] - 1) * conv_st[CI_JW] + 1
        hit = _placed_hit(tstate, trows, pp, depth, conv_st[CI_VPP], f[CV_BIDO], f[CV_BAO], conv_st[CI_SO],
                          conv_st[CI_SOO], conv_st[CI_JW], conv_st[CI_JWE], span)
    elif o == _OP_ALU:
        span = (alu_st[AI_LEN] - 1) * alu_st[AI_JW] + alu_st[AI_CG]
        hit = _placed_hit(tstate, trows, pp, depth, f[AL_VPP], f[AL_BIDO], f[AL_BAO], alu_st[AI_SO],
                          alu_st[AI_SOO], alu_st[AI_JW], alu_st[AI_JWE], span)
    elif o == _OP_ELEW:
        gb = (f[EW_BIDO] // pp) * pp
        span = (f[EW_LEN] - 1) * f[EW_JW] + f[EW_CG]
        for r in range(f[EW_VPP]):
            slot = (f[EW_BIDO] - gb) + r
            if _hit(tstate, trows, gb + slot % pp, f[EW_BAO] + (slot // pp) * f[EW_JWE], span, depth):
                hit = True
                break
    if hit:
        tstate[NKEY] = 0
