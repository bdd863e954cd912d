"""LOAD and SAVE: a strip's input rows into its image bank buffer (spec §2.4 layout), channel-augmented items
(spec §6.2; vai-c-program-patterns §5), the output rows back to their DDR image, and the strip buffers they fill."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from opendpu.compiler.codegen.context import Ctx
from opendpu.compiler.codegen.ir import TOKEN_LINES, Aug, ConvJob, FMap, InBuf, OutBuf, Tile, Window, ceil_div
from opendpu.compiler.codegen.limits import ITEMS_MAX, PAD_END_MAX, PAD_START_MAX, SAVE_CHANNEL_MAX
from opendpu.compiler.codegen.tiling import in_lines
from opendpu.isa.target import Target

AUG_MASK_BYTES = 64              # the bytes of a LOAD item the pad masks can reach (spec §6.2)


def load_rows(c: Ctx, fm: FMap, tile: Tile, buf: InBuf) -> None:
    """LOAD the real input rows of a tile into `buf` (one LOAD per row and bank pass; padding is not loaded)."""
    t = c.target
    x_lo, x_hi = max(0, tile.b), min(fm.w, tile.b + tile.cv)
    if x_hi <= x_lo:
        return
    for q in range(tile.nv):
        y = tile.a + q
        if not 0 <= y < fm.h:
            continue
        slot, sub = divmod(q, buf.sh)
        p, bank = divmod(slot, t.pp)
        line0 = buf.base + p * buf.sh * buf.E + sub * buf.E + (x_lo - tile.b) * buf.cg
        for x in range(x_lo, x_hi, ITEMS_MAX):
            n = min(ITEMS_MAX, x_hi - x)
            c.s.add("LOAD", bank_addr=line0 + (x - x_lo) * buf.cg, bank_id=buf.group + bank, jump_write=buf.cg,
                    jump_read=fm.pix, length=n, channel=fm.c, pad_idx=1, reg_id=fm.reg, ddr_addr=fm.at(y, x))


def save_rows(c: Ctx, out: FMap, tile: Tile, ob: OutBuf, c0: int, nch: int, rows: range | None = None) -> None:
    """SAVE the tile's output rows (all, or `rows`; channels [c0, c0+nch) of `out`, starting at line offset 0 of
    each pixel)."""
    t = c.target
    for j in (range(tile.rows) if rows is None else rows):
        p, bank = divmod(j, t.pp)
        for x in range(0, tile.cols, ITEMS_MAX):
            n = min(ITEMS_MAX, tile.cols - x)
            step = SAVE_CHANNEL_MAX // t.cp * t.cp          # whole lines per SAVE item
            for cc in range(0, nch, step):
                k = min(step, nch - cc)
                c.s.add("SAVE", bank_addr=ob.base + p * ob.E + x * ob.lpp + cc // t.cp, bank_id=ob.group + bank,
                        jump_read=ob.lpp, jump_write=out.pix, length=n, channel=k, reg_id=out.reg,
                        ddr_addr=out.at(tile.y0 + j, tile.x0 + x, c0 + cc))


def strip_bufs(c: Ctx, name: str, inp: FMap, tile: Tile, sh: int, cg: int, lpp: int,
               aug: Aug | None = None, ib: InBuf | None = None) -> tuple[InBuf, OutBuf]:
    """Allocate a strip's input buffer (VB0) and output buffer (VB1, `lpp` lines per pixel) in the rings and LOAD
    the strip's input rows (channel-augmented items when `aug` is given); with `ib`, the input already on chip
    there (only the output buffer is allocated)."""
    t = c.target
    align = TOKEN_LINES if c.pipeline else 1        # consecutive strips' buffers share no dependency key
    if ib is None:
        ib = in_buf(c, name, tile, sh, cg, inp, aug, align=align)
    Eo = tile.cols * lpp
    ob = OutBuf(t.img_base(1), c.img[1].alloc(ceil_div(tile.rows, t.pp) * Eo, f"layer {name!r} output", align), Eo,
                lpp)
    return ib, ob


def in_buf(c: Ctx, name: str, tile: Tile, sh: int, cg: int, inp: FMap, aug: Aug | None = None,
           group: int = 0, align: int = 1) -> InBuf:
    """A strip's input buffer in image group `group`, filled by LOADs of `inp` (or of `aug.src`, augmented)."""
    t = c.target
    E, lines = in_lines(t, tile, sh, cg)
    ib = InBuf(t.img_base(group), c.img[group].alloc(lines, f"layer {name!r} input", align), E, cg, sh, lines)
    if aug is None:
        load_rows(c, inp, tile, ib)
    else:
        load_aug(c, aug, tile, ib)
    return ib


# ---- channel augmentation (spec §6.2; vai-c-program-patterns §5) -----------------------------------------------
def aug_ok(t: Target, x: FMap, kw: int, sw: int, pl: int) -> bool:
    """Channel augmentation can express this conv input: kw > 1 columns of contiguous pixels, kw*IC within the
    LOAD masking range (spec §6.2), sw <= kw, left padding shorter than the kernel (every window starts inside
    the image or its padding, so no item is masked whole), pad_start / pad_end encodable, and slack before the
    image for the masked bytes of the first item."""
    ch = kw * x.c
    if kw < 2 or sw > kw or ch > AUG_MASK_BYTES or x.pix != x.c or not 0 <= pl < kw:
        return False
    cw = ceil_div(ch, t.cp) * t.cp
    return pl * x.c <= PAD_START_MAX and cw - ch + (kw - 1) * x.c <= PAD_END_MAX and x.addr >= pl * x.c


def load_aug(c: Ctx, aug: Aug, tile: Tile, buf: InBuf) -> None:
    """LOAD a channel-augmented tile: per real input row, items for the tile's output columns (virtual columns
    tile.b ...); pad_start zeroes the bytes left of the image, pad_end / pad_idx those right of it (spec §6.2)."""
    t = c.target
    s, ic = aug.src, aug.src.c
    ch = aug.kw * ic
    jr = aug.sw * ic
    cw = ceil_div(ch, t.cp) * t.cp
    for q in range(tile.nv):
        y = tile.a + q
        if not 0 <= y < s.h:
            continue
        slot, sub = divmod(q, buf.sh)
        p, bank = divmod(slot, t.pp)
        line0 = buf.base + p * buf.sh * buf.E + sub * buf.E
        for x in range(tile.b, tile.b + tile.cv, ITEMS_MAX):
            n = min(ITEMS_MAX, tile.b + tile.cv - x)
            x_in = x * aug.sw - aug.pl                       # first input column of item 0
            pad_start = max(0, -x_in) * ic
            # right padding: items from i1 on overhang the image by r_i = r_i1 + sw*(i - i1) columns
            over = [(x + i) * aug.sw - aug.pl + aug.kw - s.w for i in range(n)]
            i1 = next((i for i, r in enumerate(over) if r > 0), n)
            pad_idx, pad_end = (n - i1, cw - ch + over[i1] * ic) if i1 < n else (1, 0)
            c.s.add("LOAD", bank_addr=line0 + (x - tile.b) * buf.cg, bank_id=buf.group + bank, jump_write=buf.cg,
                    jump_read=jr, length=n, channel=ch, pad_idx=pad_idx, pad_start=pad_start, pad_end=pad_end,
                    reg_id=s.reg, ddr_addr=s.at(y, 0) + x_in * ic)


def aug_job(job: ConvJob) -> ConvJob:
    """The channel-augmented form of a conv job (weights w'[oc, ky, 0, kx*IC + ic] = w[oc, ky, kx, ic])."""
    win, x = job.win, job.inp
    oc, kh, kw, ic = job.w.shape
    return replace(job, inp=FMap(x.reg, x.addr, x.h, win.wo, kw * ic, kw * ic, win.wo * kw * ic, x.fp),
                   win=Window(kh, 1, win.sh, 1, win.pt, 0, win.ho, win.wo),
                   w=np.ascontiguousarray(job.w.reshape(oc, kh, 1, kw * ic)),
                   aug=Aug(x, kw, win.sw, win.pl))
