"""Small arithmetic helpers shared by the engines (constant division, image-bank group of a bank id)."""
from __future__ import annotations

from amaranth.hdl import Const

from .params import HwParams


def const_divmod(x, d: int, xmax: int):
    """(x // d, x mod d) for a constant divisor d and 0 <= x <= xmax, without a divider."""
    if d & (d - 1) == 0:
        k = d.bit_length() - 1
        return (x >> k), (x & (d - 1) if d > 1 else Const(0, 1))
    q = 0
    for k in range(1, xmax // d + 1):
        q = q + (x >= k * d)
    return q, (x - q * d)[:max(1, (d - 1).bit_length())]


def split_img_bank(p: HwParams, bank_id):
    """(IMGBASE(bank_id), bank_id - IMGBASE) of an image bank id: its conv-PP group base and slot (spec §6)."""
    q, r = const_divmod(bank_id, p.pp, (1 << p.bank_id_bits) - 1)
    return q * p.pp, r
