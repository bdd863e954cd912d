"""ELEW layers: eltwise add / multiply lowered to `ElewJob`s (also the rescaling copies of concat, upsample and
tile), and a job's instructions: per strip its inputs LOADed side by side into VB0 (a broadcast input only its
real rows / columns), ELEWINITs and ELEWs writing VB1, SAVEs; in chunks of channel groups when a row of all
channels does not fit."""
from __future__ import annotations

from dataclasses import replace

from opendpu.compiler.codegen.context import Ctx
from opendpu.compiler.codegen.loadsave import load_rows, save_rows
from opendpu.compiler.codegen.ir import ElewJob, FMap, InBuf, OutBuf, Tile, Window, ceil_div, nonlinear
from opendpu.compiler.codegen.kinds import ELEW
from opendpu.compiler.codegen.limits import ALU_ENDL_MAX, ALU_LENGTH_MAX
from opendpu.compiler.codegen.registry import emitter, lowering
from opendpu.compiler.codegen.tiling import block_rows, channel_chunk, in_lines, plan_tiles, tile_of, tiles
from opendpu.compiler.fixpoint import elew_shift_write
from opendpu.compiler.xir.graph import Graph, Op

ELEW_ADD, ELEW_MUL = 0, 1


def rescale(name: str, src: FMap, dst: FMap) -> ElewJob:
    """A single-input ELEW that copies `src` into `dst` at `dst`'s fix point."""
    return ElewJob(name, [src], dst, [0], elew_shift_write(dst.fp - src.fp), ELEW_ADD, 0)


def _point(out: FMap) -> Window:
    return Window(1, 1, 1, 1, 0, 0, out.h, out.w)


def emit_elew(c: Ctx, job: ElewJob) -> None:
    """ELEW layer, in chunks of channel groups when all channels do not fit (ELEW channel_group's range)."""
    t = c.target
    ch = job.out.c
    cg_all = ceil_div(ch, t.cp)
    win = _point(job.out)
    chunk = channel_chunk(c, job.name, win, cg_all, len(job.inps), block_rows(t, win, t.alu_pp))
    for g0 in range(0, cg_all, chunk):
        c0, c1 = g0 * t.cp, min(ch, (g0 + chunk) * t.cp)
        _elew_chunk(c, replace(job, inps=[replace(f, addr=f.addr + c0, c=c1 - c0) for f in job.inps],
                               out=replace(job.out, addr=job.out.addr + c0, c=c1 - c0)))
    c.workload += len(job.inps) * ch * win.ho * win.wo


def _elew_chunk(c: Ctx, job: ElewJob) -> None:
    t = c.target
    ch = job.out.c
    cg = ceil_div(ch, t.cp)
    win = _point(job.out)
    n = len(job.inps)
    rows, cols, vb = plan_tiles(c, job.name, win, cg, n, cg, block_rows(t, win, t.alu_pp), ALU_ENDL_MAX,
                                ALU_LENGTH_MAX)
    for tile in tiles(win, rows, cols):
        bufs = []
        subs = []
        for fm in job.inps:
            # a broadcast input (H or W of 1, spec §6.7 share_pp / jump_read 0) holds only its real rows / columns
            rb, cb = fm.h == 1 and job.out.h > 1, fm.w == 1 and job.out.w > 1
            sub = tile_of(Window(1, 1, 1, 1, 0, 0, fm.h, fm.w), 0 if rb else tile.y0, 1 if rb else tile.rows,
                          0 if cb else tile.x0, 1 if cb else tile.cols)
            subs.append((fm, sub, rb, cb, *in_lines(t, sub, 1, cg)))
        # the strip's inputs as one block of the ring: allocated one by one, a wrap between two of them could put
        # the second over the first
        at = c.img[0].alloc(sum(s[5] for s in subs), f"layer {job.name!r} inputs")
        for fm, sub, rb, cb, Ek, lk in subs:
            ib = InBuf(t.img_base(0), at, Ek, cg, 1, lk)
            at += lk
            load_rows(c, fm, sub, ib)
            bufs.append((ib, rb, cb))
        Eo = tile.cols * cg
        ob = OutBuf(t.img_base(1), c.img[1].alloc(ceil_div(tile.rows, t.pp) * Eo, f"layer {job.name!r} output"),
                    Eo, cg)
        elew_rows(c, job, tile, bufs, ob, vb)
        save_rows(c, job.out, tile, ob, 0, ch)


def elew_rows(c: Ctx, job: ElewJob, tile: Tile, bufs: list[tuple[InBuf, bool, bool]], ob: OutBuf,
              vb: int) -> None:
    """The ELEWINITs and ELEWs of one strip, `vb` rows per ELEW: input k read from bufs[k] = (buffer, broadcast over
    rows, broadcast over columns; spec §6.7 share_pp / jump_read 0), the output written to `ob`."""
    t = c.target
    cg = ceil_div(job.out.c, t.cp)
    for j0 in range(0, tile.rows, vb):
        vpp = min(vb, tile.rows - j0)
        p, b = divmod(j0, t.pp)
        for k, (ib, rb, cb) in enumerate(bufs):
            c.s.add("ELEWINIT", share_pp=int(rb), bank_id_in=ib.group + (0 if rb else b),
                    bank_addr_in=ib.base + (0 if rb else p * ib.E), jump_read_endl=ib.E, id=k, jump_bank=1,
                    jump_read=0 if cb else cg, shift_read=job.shift_read[k])
        c.s.add("ELEW", length=tile.cols, act_type=job.act, elew_type=job.elew_type, bank_id_out=ob.group + b,
                bank_addr_out=ob.base + p * ob.E, jump_write_endl=ob.E, num=len(bufs), valid_pixel_parallel=vpp,
                jump_write=cg, shift_write=job.shift_write, channel_group=cg)


def elew_fits(c: Ctx, job: ElewJob) -> None:
    """`emit_elew`'s refusal without emitting: no channel chunk of the inputs' strips fits the image banks."""
    t = c.target
    win = _point(job.out)
    channel_chunk(c, job.name, win, ceil_div(job.out.c, t.cp), len(job.inps), block_rows(t, win, t.alu_pp))


emitter(ElewJob, elew_fits)(emit_elew)


@lowering(ELEW)
def lower_elew(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[ElewJob]:
    et = str(op.get("type", "ADD")).upper()
    fps = [f.fp for f in ins]
    if et == "ADD":
        lo = min(fps)
        sr = [f - lo for f in fps]
        sw_ = elew_shift_write(out.fp - lo)
    else:
        sr = [0] * len(fps)
        sw_ = elew_shift_write(out.fp - sum(fps))
    return [ElewJob(op.name, ins, out, sr, sw_, ELEW_ADD if et == "ADD" else ELEW_MUL,
                    1 if nonlinear(op) == "RELU" else 0)]
