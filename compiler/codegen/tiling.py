"""Tiling: a layer cut into strips of output rows (halo input rows included) and, when a row does not fit the image
banks, into column tiles; rows per instruction; the bank layout of a strip's input (spec §2.4) and the pad and
address fields of each block of rows (spec §6.4). Pure planning: nothing here emits an instruction."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterator, Sequence

from opendpu.compiler.codegen.context import Ctx
from opendpu.compiler.codegen.ir import CodegenError, InBuf, OutBuf, Tile, Window, ceil_div
from opendpu.compiler.codegen.limits import ALU_ENDL_MAX, ALU_LENGTH_MAX, CHANNEL_GROUP_MAX
from opendpu.isa.target import Target


def tile_of(win: Window, y0: int, rows: int, x0: int, cols: int) -> Tile:
    a = y0 * win.sh - win.pt
    b = x0 * win.sw - win.pl
    return Tile(y0, rows, x0, cols, a, (rows - 1) * win.sh + win.kh, b, (cols - 1) * win.sw + win.kw)


def in_lines(t: Target, tile: Tile, sh: int, cg: int) -> tuple[int, int]:
    """(E, lines per bank) of a strip's input buffer."""
    E = tile.cv * cg
    slots = ceil_div(tile.nv, sh)
    return E, ceil_div(slots, t.pp) * sh * E


def block_rows(t: Target, win: Window, engine_rows: int) -> int:
    """Rows per instruction: the largest divisor of PP that is <= the engine's rows and keeps the input window
    within 4 passes over the bank group (spec §6.4 gathering check), from any starting bank."""
    v = engine_rows
    while v > 1:
        if t.pp % v == 0 and (t.pp - 1) + ceil_div((v - 1) * win.sh + win.kh, win.sh) <= 4 * t.pp:
            return v
        v -= 1
    return 1


def plan_tiles(c: Ctx, name: str, win: Window, cg_in: int, n_in: int, lpp_out: int, vb_max: int,
               e_max: int, len_max: int) -> tuple[int, int, int]:
    """(strip rows, tile columns, rows per instruction): full rows if they fit, else column tiles; strips as
    tall as fit. Each buffer gets half the usable depth (double buffering; `n_in` inputs share the input group),
    or, when nothing fits that way, the whole depth (single buffering) and fewer rows per instruction."""
    t = c.target

    def fits(rows: int, cols: int, in_budget: int, out_budget: int) -> bool:
        tile = tile_of(win, 0, rows, 0, cols)
        E, lines = in_lines(t, tile, win.sh, cg_in)
        if win.sh > 1 and E > e_max:
            return False
        out_lines = ceil_div(rows, t.pp) * cols * lpp_out
        return lines <= in_budget and out_lines <= out_budget

    for share in (2, 1):
        in_budget, out_budget = c.depth // share // n_in, c.depth // share
        vb = vb_max
        while vb >= 1:
            if t.pp % vb == 0:
                cols = min(win.wo, len_max)
                while cols > 1 and not fits(vb, cols, in_budget, out_budget):
                    cols = max(1, min(cols - 1, cols * 3 // 4))
                if fits(vb, cols, in_budget, out_budget):
                    rows = vb
                    while rows + vb <= ceil_div(win.ho, vb) * vb and fits(rows + vb, cols, in_budget, out_budget):
                        rows += vb
                    return rows, cols, vb
            vb -= 1
    raise CodegenError(f"layer {name!r}: one output row x 1 column does not fit the image banks (bank_depth "
                       f"{c.depth}): input channel groups {cg_in}, kernel {win.kw}x{win.kh}, stride "
                       f"{win.sw}x{win.sh}, {lpp_out} output lines per pixel")


def tiles(win: Window, rows: int, cols: int) -> Iterator[Tile]:
    for y0 in range(0, win.ho, rows):
        for x0 in range(0, win.wo, cols):
            yield tile_of(win, y0, min(rows, win.ho - y0), x0, min(cols, win.wo - x0))


def pads_of_block(win: Window, h_in: int, w_in: int, tile: Tile, j0: int, vpp: int) -> dict[str, int]:
    """CONV/ALU pad fields of the block of output rows [j0, j0+vpp) of a tile (spec §6.4 encoding)."""
    top = tile.a + j0 * win.sh                  # first input row of the block's window
    bot = top + (vpp - 1) * win.sh + win.kh - 1
    right = tile.b + tile.cv - 1
    pt = max(0, -top)
    pb = max(0, bot - (h_in - 1))
    pl = max(0, -tile.b)
    pr = max(0, right - (w_in - 1))
    if pb > win.kh - 1 or pr > win.kw - 1 or pt > win.kh - 1 or pl > win.kw - 1:
        raise CodegenError(f"window padding {pl},{pr},{pt},{pb} exceeds the kernel {win.kw}x{win.kh}")
    return {"pad_top": pt, "pad_left": pl, "pad_bottom": win.kh - 1 - pb, "pad_right": win.kw - 1 - pr}


def check_window_pads(win: Window, h_in: int, w_in: int) -> None:
    """`pads_of_block`'s check over a whole layer, without its tiles: the largest padding of any block is at the
    first row / column (top, left) and at the last (bottom, right)."""
    first = tile_of(win, 0, win.ho, 0, win.wo)
    pads_of_block(win, h_in, w_in, first, 0, win.ho)


def in_fields(t: Target, buf: InBuf, j0: int) -> dict[str, int]:
    """bank_id_in and the four pass base addresses of a block starting at output row j0 of the strip."""
    slot0 = j0                                    # virtual row j0*sh is sub-row 0 of slot j0
    p0, b0 = divmod(slot0, t.pp)
    step = buf.sh * buf.E
    return {"bank_id_in": buf.group + b0, "bank_addr_in": buf.base + p0 * step,
            "bank_addr_in_1": buf.base + (p0 + 1) * step, "bank_addr_in_2": buf.base + (p0 + 2) * step,
            "bank_addr_in_3": buf.base + (p0 + 3) * step}


def clip_addr(f: dict[str, int], limit: int) -> dict[str, int]:
    """Pass bases beyond the buffer are never read (fewer passes); keep them encodable."""
    for k in ("bank_addr_in_1", "bank_addr_in_2", "bank_addr_in_3"):
        if f[k] >= limit:
            f[k] = f["bank_addr_in"]
    return f


def channel_chunk(c: Ctx, name: str, win: Window, cg_all: int, n_in: int, vb_max: int,
                  weight_lines_per_cg: int = 0) -> int:
    """Channel groups per chunk for an ALU / ELEW layer: all of them (at most the channel_group field's range) if a
    row fits, else halved until one does (and the per-chunk weights fit the DWCONVW bank)."""
    chunk = min(cg_all, CHANNEL_GROUP_MAX)
    while True:
        try:
            if weight_lines_per_cg * chunk > c.depth:
                raise CodegenError(f"layer {name!r}: {weight_lines_per_cg} kernel positions x {chunk} channel groups "
                                   f"of weights exceed the DWCONVW bank ({c.depth} lines)")
            plan_tiles(c, name, win, chunk, n_in, chunk, vb_max, ALU_ENDL_MAX, ALU_LENGTH_MAX)
            return chunk
        except CodegenError:
            if chunk == 1:
                raise
            chunk = ceil_div(chunk, 2)


def strip_plan(c: Ctx, ho: int, wo: int, vb_max: int, col_max: int,
               use: Callable[[int, int], "Sequence[int] | None"],
               shares: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(strip rows, columns, rows per instruction) of a superlayer's strips: the largest rows per instruction (a
    divisor of PP) for which some strip fits, as wide and then as tall as fits. `use(rows, cols)` gives the lines the
    strip takes in each image ring (None: a field overflows); each must fit `depth / share`, the first share that
    admits a strip wins (2 first: double buffering)."""
    t = c.target
    for share in shares:
        budget = c.depth // share

        def fits(rows: int, cols: int) -> bool:
            u = use(rows, cols)
            return u is not None and max(u) <= budget
        for vb in range(vb_max, 0, -1):
            if t.pp % vb:
                continue
            cols = min(wo, col_max)
            while cols > 1 and not fits(vb, cols):
                cols = max(1, min(cols - 1, cols * 3 // 4))
            if fits(vb, cols):
                rows = vb
                while rows + vb <= ceil_div(ho, vb) * vb and fits(rows + vb, cols):
                    rows += vb
                return rows, cols, vb
    return None


def blocks(t: Target, ob: OutBuf, rows: int, vb: int) -> Iterator[tuple[int, int, int, int]]:
    """(first row, rows, bank_id_out, bank_addr_out) of the instructions that compute `rows` output rows of a
    strip, at most `vb` rows each; with stride_out s > 1 no block's rows wrap past the bank group, a block that
    starts on sub-row 1 has one row, and every other block but the last has a multiple of s rows
    (stride_offset_out stays 0)."""
    j0 = 0
    while j0 < rows:
        bank, addr, room = ob.place(t, j0)
        vpp = min(vb, rows - j0, room)
        if vpp < rows - j0 and vpp > ob.s:
            vpp -= vpp % ob.s
        yield j0, vpp, bank, addr
        j0 += vpp


def one_row_stride(t: Target, win: Window, depth: int) -> Window:
    """A window with one output row (a global pool) reads the same input rows whatever its stride_h, but the
    stride decides the bank layout of those rows (spec §6.4: slot q // stride_h, sub-row q % stride_h): at the
    op's own stride (= kernel_h) every row is a sub-row of slot 0 in one bank, kernel_h·cols lines of a single
    bank. stride_h = ceil(kernel_h / PP) spreads the rows over the PP banks, ceil(kernel_h / PP)·cols lines each
    (the UG1414 pool limit `compiler.rules` checks), within one gathering pass. The result is the same sum of the
    same window (docs/compiler.md, "Global pools"). The op's own stride is kept whenever one channel group of its
    rows fits the image banks, so the programs of pools that always fitted (AMD's 7x7 global pools) are unchanged."""
    if win.ho != 1 or win.sh <= ceil_div(win.kh, t.pp):
        return win
    if in_lines(t, tile_of(win, 0, 1, 0, win.wo), win.sh, 1)[1] <= depth:
        return win
    return replace(win, sh=ceil_div(win.kh, t.pp))


def buf_span(t: Target, b: "InBuf | OutBuf", rows: int = 0) -> tuple[int, int, int]:
    """(bank group base, first line, lines) a strip buffer occupies; an OutBuf's lines from its `rows`."""
    if isinstance(b, InBuf):
        return b.group, b.base, b.lines
    return b.group, b.base, ceil_div(rows, t.pp) * b.E


def disjoint(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return a[0] != b[0] or a[1] + a[2] <= b[1] or b[1] + b[2] <= a[1]
