"""ALU layers: depthwise conv, max / average pools, leaky ReLU, PReLU, ReLU6 (a 1x1 depthwise with weight 1) and
hard-sigmoid lowered to `AluJob`s, and a job's instructions (weights into DWCONVW, bias into BIAS, strips of ALUs,
in chunks of channel groups when a row of all channels does not fit), with the pool-cascade choice."""
from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Callable

import numpy as np

from opendpu.compiler.codegen.context import Ctx, Ring
from opendpu.compiler.codegen.loadsave import save_rows, strip_bufs
from opendpu.compiler.codegen.ir import (REG_CONST, AluJob, CodegenError, FMap, InBuf, OutBuf, Tile, Window, arg,
                                         ceil_div, conv_act, data_inputs, fix_point, int8_data, pads, pair)
from opendpu.compiler.codegen.kinds import DWCONV, HSIGMOID, LEAKY, POOL, PRELU, RELU6
from opendpu.compiler.codegen.limits import ALU_ADDR_LINES, ALU_ENDL_MAX, ALU_LENGTH_MAX, MULTI_FACTOR_MASK
from opendpu.compiler.codegen.ordering import strips
from opendpu.compiler.codegen.plans import decide, layer_cost
from opendpu.compiler.codegen.registry import emitter, lowering
from opendpu.compiler.codegen.tiling import (block_rows, blocks, channel_chunk, check_window_pads, clip_addr,
                                             in_fields, one_row_stride, pads_of_block, plan_tiles, tiles)
from opendpu.compiler.fixpoint import (FixPointError, avg_pool_factor, conv_shifts, hsigmoid_fields, pool_shift_cut,
                                       prelu_shift_codes, slope_encoding)
from opendpu.compiler.xir.graph import Graph, Op

MODE_DWCONV_BIAS, MODE_PRELU, MODE_AVG, MODE_MAX, MODE_LEAKY, MODE_DWCONV, MODE_HSIGMOID = 0, 1, 2, 3, 4, 6, 7
_NO_SHIFTS = dict(shift_prelu_p=0, shift_prelu_n=0)


def kpos(job: AluJob) -> int:
    """Kernel positions of the job's DWCONVW weights (0: none)."""
    return 0 if job.weights is None else job.weights.reshape(-1, job.inp.c).shape[0]


def emit_alu(c: Ctx, job: AluJob) -> None:
    """ALU layer; when a row of all channels does not fit (e.g. a global pool of 7x7x2048), the channels are
    processed in chunks of whole channel groups, each with its own weights and bias."""
    t = c.target
    ch = job.inp.c
    cg_all = ceil_div(ch, t.cp)
    win = job.win
    vb_max = block_rows(t, win, t.alu_pp)
    chunk = channel_chunk(c, job.name, win, cg_all, 1, vb_max, kpos(job))
    for g0 in range(0, cg_all, chunk):
        c0, c1 = g0 * t.cp, min(ch, (g0 + chunk) * t.cp)
        sub = replace(job, inp=replace(job.inp, addr=job.inp.addr + c0, c=c1 - c0),
                      out=replace(job.out, addr=job.out.addr + c0, c=c1 - c0),
                      weights=None if job.weights is None else job.weights[..., c0:c1],
                      bias=None if job.bias is None else job.bias[c0:c1])
        _alu_chunk(c, sub, vb_max)
    c.workload += 2 * ch * win.kh * win.kw * win.ho * win.wo


def alu_params(c: Ctx, job: AluJob) -> tuple[int, int]:
    """LOAD an ALU layer's weights (DWCONVW) and bias; their line addresses."""
    t = c.target
    ch = job.inp.c
    cg = ceil_div(ch, t.cp)
    w_addr = b_addr = 0
    if job.weights is not None:
        wl = np.ascontiguousarray(job.weights.reshape(-1, ch))
        off = c.const(wl.tobytes())
        w_addr = c.dwconvw.alloc(wl.shape[0] * cg, f"layer {job.name!r} weights", c.param_align)
        c.s.add("LOAD", bank_addr=w_addr, bank_id=t.dwconvw_bank, jump_write=cg, jump_read=ch, length=wl.shape[0],
                channel=ch, pad_idx=1, reg_id=REG_CONST, ddr_addr=off)
    if job.bias is not None:
        off = c.const(np.ascontiguousarray(job.bias).astype(np.int8).tobytes())
        b_addr = c.bias.alloc(cg, f"layer {job.name!r} bias", c.param_align)
        c.s.add("LOAD", bank_addr=b_addr, bank_id=t.bias_bank, jump_write=1, jump_read=ch, length=1, channel=ch,
                pad_idx=1, reg_id=REG_CONST, ddr_addr=off)
    return w_addr, b_addr


def alu_tile(c: Ctx, job: AluJob, tile: Tile, ib: InBuf, ob: OutBuf, w_addr: int, b_addr: int, vb: int,
             state: dict, after: Callable[[int, int], None] | None = None) -> None:
    """The ALUs of one strip (blocks of <= vb output rows); `after(j0, rows)` follows each block."""
    t = c.target
    ch = job.inp.c
    cg = ceil_div(ch, t.cp)
    win = job.win
    E, Eo = ib.E, ob.E
    init = dict(kernel_w=win.kw, kernel_h=win.kh, exec_mode=job.mode, stride_offset_out=0, stride_offset_in=0,
                stride_w=win.sw, stride_h=win.sh, length=tile.cols, channel_offset=cg * t.cp - ch,
                channel_group=cg, stride_out=ob.s, jump_read_endl=E, jump_read=cg, jump_write_endl=Eo,
                jump_write=cg, jump_read_weights=cg, **job.init)
    for j0, vpp, bank_out, addr_out in blocks(t, ob, tile.rows, vb):
        if init != state:
            c.s.add("ALUINIT", **init)
            state.clear()
            state.update(init)
        pads_ = pads_of_block(win, job.inp.h, job.inp.w, tile, j0, vpp)
        c.s.add("ALU", **clip_addr(in_fields(t, ib, j0), ALU_ADDR_LINES), **pads_, bank_addr_out=addr_out,
                bank_id_out=bank_out, valid_pixel_parallel=vpp, bank_addr_weights=w_addr, kernel_d=1,
                bank_addr_bias=b_addr)
        if after is not None:
            after(j0, vpp)


def _alu_chunk(c: Ctx, job: AluJob, vb_max: int) -> None:
    t = c.target
    ch = job.inp.c
    cg = ceil_div(ch, t.cp)
    win = job.win
    w_addr, b_addr = alu_params(c, job)
    rows, cols, vb = plan_tiles(c, job.name, win, cg, 1, cg, vb_max, ALU_ENDL_MAX, ALU_LENGTH_MAX)
    state: dict[str, int] = {}
    strips(c, list(tiles(win, rows, cols)),
           lambda tile: strip_bufs(c, job.name, job.inp, tile, win.sh, cg, cg),
           lambda tile, ib, ob: alu_tile(c, job, tile, ib, ob, w_addr, b_addr, vb, state),
           lambda tile, ob: save_rows(c, job.out, tile, ob, 0, ch))


# ---- pools as cascades of small pools ----------------------------------------------------------------------------
def pool_cascade(op: Op, win: Window, x: FMap, mode: int, d: int) -> list[int]:
    """The kernel sizes of a cascade of stride-1 max pools equal to a k x k stride-1 max pool with padding
    (k-1)/2 on every side (the SPP pools): 5x5 stages, then a 3x3 one (k = 1 + 4a + 2b); [] when the pool is not of
    that form, changes the fix point (each stage would round), or the cascade reads no fewer kernel positions.
    *Why equal:* per axis, output p of the cascade is the max over the input within [p-(k-1)/2, p+(k-1)/2] (the
    windows compose), plus the padding value exactly when that range leaves the image (a stage window at q reaches
    the padding iff q is within its half-width of the edge, and composes to the same condition), whatever the
    padding value is; max is exact with shift_cut 0."""
    k = win.kh
    if (mode != MODE_MAX or d != 0 or op.get("global", False) or win.kw != k or k < 7 or k % 2 == 0 or win.sh != 1
            or win.sw != 1 or win.pt != (k - 1) // 2 or win.pl != (k - 1) // 2
            or tuple(pads(op)) != ((k - 1) // 2,) * 4 or (win.ho, win.wo) != (x.h, x.w)):
        return []
    a, r = divmod(k - 1, 4)
    stages = [5] * a + ([3] if r else [])
    return stages if sum(s * s for s in stages) < k * k else []


def cascade_step(job: AluJob, stages) -> Callable[[Ctx], None]:
    """Emit `job` (a max pool) as the stride-1 cascade `stages` through workspace temporaries."""
    def step(c: Ctx) -> None:
        src = job.inp
        w0 = c.workload
        for i, k in enumerate(stages):
            dst = job.out if i == len(stages) - 1 else c.temp(src.h, src.w, src.c, src.fp)
            h = (k - 1) // 2
            emit_alu(c, replace(job, inp=src, out=dst, win=Window(k, k, 1, 1, h, h, src.h, src.w)))
            src = dst
        win = job.win                                 # the workload is the op's own, not the stages'
        c.workload = w0 + 2 * job.inp.c * win.kh * win.kw * win.ho * win.wo
    return step


def alu_fits(c: Ctx, job: AluJob) -> None:
    """`emit_alu`'s refusals without emitting: a channel chunk whose strip and weights fit, its bias in the BIAS
    bank, the window's padding."""
    t = c.target
    cg_all = ceil_div(job.inp.c, t.cp)
    chunk = channel_chunk(c, job.name, job.win, cg_all, 1, block_rows(t, job.win, t.alu_pp), kpos(job))
    if job.bias is not None:
        Ring(c.depth).alloc(min(chunk, cg_all), f"layer {job.name!r} bias")
    check_window_pads(job.win, job.inp.h, job.inp.w)


@emitter(AluJob, alu_fits)
def run_alu(c: Ctx, job: AluJob) -> None:
    """An ALU job; a max pool with a cascade form as the cascade when the cycle model says it is faster, or when
    the single pool cannot be emitted (e.g. a 13x13 window over more than 4 passes of a PP 2 bank group)."""
    stages = list(job.cascade)
    if stages and c.cascade:
        form = "cascade " + "/".join(map(str, stages))
        cc, cs = _cost(c, cascade_step(job, stages)), _cost(c, lambda k: emit_alu(k, job))
        take = cc is not None and (cs is None or cc < cs)
        if cc is not None or cs is not None:
            decide(c, job.name, "pool_cascade", {form: cc, "single": cs}, form if take else "single")
        if take:
            cascade_step(job, stages)(c)
            return
    emit_alu(c, job)


def _cost(c: Ctx, step: Callable[[Ctx], None]) -> int | None:
    try:
        return layer_cost(c, step)
    except CodegenError:
        return None


# ---- lowerings ---------------------------------------------------------------------------------------------------
def _point(out: FMap) -> Window:
    return Window(1, 1, 1, 1, 0, 0, out.h, out.w)


@lowering(DWCONV)
def lower_dwconv(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[AluJob]:
    wop, bop = arg(graph, op, "weights"), arg(graph, op, "bias")
    assert wop is not None
    w = int8_data(wop)[0]                       # [kh, kw, C]
    sc, sb = conv_shifts(ins[0].fp, fix_point(wop), out.fp, fix_point(bop) if bop is not None else None, check=True)
    act = conv_act(op, c.target, out.fp, "alu")
    kw_, kh_ = pair(op, "kernel", [w.shape[1], w.shape[0]])
    sw, sh = pair(op, "stride", [1, 1])
    pl, pr, pt, pb = pads(op)
    bias = int8_data(bop).reshape(-1) if bop is not None else None
    mode = MODE_DWCONV_BIAS if bias is not None else MODE_DWCONV
    win = Window(kh_, kw_, sh, sw, pt, pl, out.h, out.w)
    return [AluJob(op.name, ins[0], out, win, mode, dict(shift_cut=sc, shift_bias=sb or 0, act_type=act,
                                                         multi_factor=0, **_NO_SHIFTS), w, bias)]


@lowering(POOL)
def lower_pool(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[AluJob]:
    x = ins[0]
    ptype = str(op.get("type", "MAX")).upper()
    if op.get("global", False):
        win = Window(x.h, x.w, x.h, x.w, 0, 0, 1, 1)
    else:
        kw_, kh_ = pair(op, "kernel", [1, 1])
        sw, sh = pair(op, "stride", [kw_, kh_])
        pl, pr, pt, pb = pads(op)
        win = Window(kh_, kw_, sh, sw, pt, pl, out.h, out.w)
    win = one_row_stride(c.target, win, c.depth)
    d = out.fp - x.fp
    try:
        if ptype == "MAX":
            mode, init = MODE_MAX, dict(shift_cut=pool_shift_cut(d), multi_factor=0)
        else:
            nf, mf = avg_pool_factor(win.kh, win.kw)
            mode, init = MODE_AVG, dict(shift_cut=pool_shift_cut(d - mf), multi_factor=nf)
    except FixPointError as e:
        raise CodegenError(f"op {op.name!r}: {e}") from None
    full = dict(init, shift_bias=0, act_type=0, **_NO_SHIFTS)
    return [AluJob(op.name, x, out, win, mode, full, cascade=tuple(pool_cascade(op, win, x, mode, d)))]


@lowering(LEAKY)
def lower_leaky(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[AluJob]:
    x = ins[0]
    m, s = slope_encoding(Fraction(int(op.get("prelu_in")), 1 << int(op.get("prelu_shift"))))
    sp, sn = prelu_shift_codes(s, x.fp, out.fp)
    return [AluJob(op.name, x, out, _point(out), MODE_LEAKY,
                   dict(shift_cut=0, shift_bias=0, act_type=0, multi_factor=m & MULTI_FACTOR_MASK, shift_prelu_p=sp,
                        shift_prelu_n=sn))]


@lowering(HSIGMOID)
def lower_hsigmoid(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[AluJob]:
    x = ins[0]
    hin, shs = hsigmoid_fields(x.fp, out.fp)
    return [AluJob(op.name, x, out, _point(out), MODE_HSIGMOID,
                   dict(shift_cut=shs, shift_bias=hin, act_type=0, multi_factor=0, **_NO_SHIFTS))]


@lowering(RELU6)
def lower_relu6(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[AluJob]:
    """ALU dwconv 1x1 with weight 1 (fix point 0) and ReLU6: y = round(relu6(x * 2^(fp_out - fp_in)))."""
    x = ins[0]
    sc = x.fp - out.fp
    return [AluJob(op.name, x, out, _point(out), MODE_DWCONV,
                   dict(shift_cut=sc, shift_bias=0, act_type=4 if out.fp <= 4 else 1, multi_factor=0, **_NO_SHIFTS),
                   np.ones((1, 1, x.c), np.int8), None)]


@lowering(PRELU)
def lower_prelu(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[AluJob]:
    x = ins[0]
    aop = graph.ops[data_inputs(op)[1]] if len(data_inputs(op)) > 1 else arg(graph, op, "weights")
    assert aop is not None
    alpha = np.broadcast_to(int8_data(aop).reshape(-1), (x.c,)).astype(np.int8)
    shift = int(op.get("prelu_shift", fix_point(aop)))
    sp, sn = prelu_shift_codes(shift, x.fp, out.fp)
    return [AluJob(op.name, x, out, _point(out), MODE_PRELU,
                   dict(shift_cut=0, shift_bias=0, act_type=0, multi_factor=0, shift_prelu_p=sp, shift_prelu_n=sn),
                   alpha.reshape(1, x.c))]
