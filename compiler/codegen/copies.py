"""Copies: concat members that could not be written in place, nearest upsampling (every output phase a strided
view of the output image), tile-fix (space-to-depth / depth-to-space between strided views), lowered to
`CopyJob`s (LOAD the rows, SAVE them into every destination) and rescaling `ElewJob`s where the fix point
changes; LOAD and SAVE addressing only."""
from __future__ import annotations

from opendpu.compiler.codegen.context import Ctx
from opendpu.compiler.codegen.elew import rescale
from opendpu.compiler.codegen.loadsave import load_rows, save_rows
from opendpu.compiler.codegen.ir import (CopyJob, FMap, InBuf, Job, OutBuf, Window, ceil_div, concat_axis,
                                         data_inputs, member_view, tensor)
from opendpu.compiler.codegen.kinds import CONCAT, TILE, UPSAMPLE
from opendpu.compiler.codegen.limits import ALU_ENDL_MAX, ITEMS_MAX
from opendpu.compiler.codegen.registry import emitter, lowering
from opendpu.compiler.codegen.tiling import in_lines, plan_tiles, tiles
from opendpu.compiler.xir.graph import Graph, Op

COPY_COLS_MAX = ITEMS_MAX * 64          # columns of one copy strip: at most 64 LOADs per row


def _plan(c: Ctx, job: CopyJob) -> tuple[int, int, int]:
    win = Window(1, 1, 1, 1, 0, 0, job.inp.h, job.inp.w)
    return plan_tiles(c, job.name, win, ceil_div(job.inp.c, c.target.cp), 1, 1, c.target.pp, ALU_ENDL_MAX,
                      COPY_COLS_MAX)


def copy_fits(c: Ctx, job: CopyJob) -> None:
    _plan(c, job)


@emitter(CopyJob, copy_fits)
def emit_copy(c: Ctx, job: CopyJob) -> None:
    """LOAD the rows of `job.inp` and SAVE each into every FMap of `job.outs`; the input buffer doubles as the output
    buffer (row j in bank j % PP, as SAVE reads it)."""
    t = c.target
    inp = job.inp
    cg = ceil_div(inp.c, t.cp)
    rows, cols, _ = _plan(c, job)
    for tile in tiles(Window(1, 1, 1, 1, 0, 0, inp.h, inp.w), rows, cols):
        E, lines = in_lines(t, tile, 1, cg)
        ib = InBuf(t.img_base(0), c.img[0].alloc(lines, f"layer {job.name!r} copy"), E, cg, 1, lines)
        load_rows(c, inp, tile, ib)
        ob = OutBuf(ib.group, ib.base, E, cg)
        for o in job.outs:
            save_rows(c, o, tile, ob, 0, inp.c)


@lowering(CONCAT)
def lower_concat(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[Job]:
    """Each member not written in place by its producer: copied into its part of the image (rescaled by an ELEW
    when its fix point differs)."""
    jobs: list[Job] = []
    c0 = 0
    axis = concat_axis(op)
    for i, f in zip(data_inputs(op), ins):
        dst = member_view(out, axis, c0, tensor(graph.ops[i]).shape, out.fp)
        c0 += (f.h, f.w, f.c)[axis]
        if f.reg == dst.reg and f.addr == dst.addr and f.pix == dst.pix and f.row == dst.row:
            continue                      # written in place by its producer
        jobs.append(CopyJob(op.name, f, [dst]) if f.fp == out.fp else rescale(f"{op.name}[{i}]", f, dst))
    return jobs


def _rescaled(c: Ctx, op: Op, x: FMap, out: FMap, jobs: list[Job]) -> FMap:
    """`x`, or a workspace copy of it at `out`'s fix point (single-input ELEW) when the fix point changes."""
    if x.fp == out.fp:
        return x
    tmp = c.temp(x.h, x.w, x.c, out.fp)
    jobs.append(rescale(f"{op.name}[rescale]", x, tmp))
    return tmp


@lowering(UPSAMPLE)
def lower_upsample(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[Job]:
    jobs: list[Job] = []
    sh, sw = out.h // ins[0].h, out.w // ins[0].w
    x = _rescaled(c, op, ins[0], out, jobs)
    views = [FMap(out.reg, out.at(dy, dx), x.h, x.w, out.c, out.pix * sw, out.row * sh, out.fp)
             for dy in range(sh) for dx in range(sw)]
    return jobs + [CopyJob(op.name, x, views)]


@lowering(TILE)
def lower_tile(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[Job]:
    """§7.9 tile-fix: s² copies, each between a strided view (every s-th pixel and row, from (dy, dx)) and a block
    of C channels at offset (dy·s + dx)·C."""
    jobs: list[Job] = []
    s = int(op.get("stride"))
    x = _rescaled(c, op, ins[0], out, jobs)
    for dy in range(s):
        for dx in range(s):
            if bool(op.get("reverse", False)):              # depth-to-space: channel block -> pixel (dy, dx)
                src = FMap(x.reg, x.at(0, 0, (dy * s + dx) * out.c), x.h, x.w, out.c, x.pix, x.row, x.fp)
                dst = FMap(out.reg, out.at(dy, dx), x.h, x.w, out.c, out.pix * s, out.row * s, out.fp)
            else:                                           # space-to-depth: pixel (dy, dx) -> channel block
                src = FMap(x.reg, x.at(dy, dx), out.h, out.w, x.c, x.pix * s, x.row * s, x.fp)
                dst = FMap(out.reg, out.at(0, 0, (dy * s + dx) * x.c), out.h, out.w, x.c, out.pix, out.row, out.fp)
            jobs.append(CopyJob(op.name, src, [dst]))
    return jobs
