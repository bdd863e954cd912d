"""CONV layers: conv2d-fix and transposed-conv2d-fix lowered to `ConvJob`s, and a job's instructions (bias and
weight LOADs laid out in the CONST blob exactly as LOAD reads them, strips of CONVs over OCP-wide output-channel
slices, SAVEs), with its two per-layer choices: channel augmentation and double-buffered weight groups."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opendpu.compiler.codegen.context import Ctx, Ring, Seg, cut, put
from opendpu.compiler.codegen.loadsave import aug_job, aug_ok, save_rows, strip_bufs
from opendpu.compiler.codegen.ir import (REG_CONST, CodegenError, ConvJob, FMap, InBuf, OutBuf, Tile, Window, arg,
                                         ceil_div, conv_act, fix_point, int8_data, pads, pair)
from opendpu.compiler.codegen.kinds import CONV, TCONV
from opendpu.compiler.codegen.limits import (CHANNEL_GROUP_MAX, CONV_ADDR_LINES, CONV_ENDL_MAX, CONV_LENGTH_MAX,
                                             ITEMS_MAX, LOAD_CHANNEL_MAX)
from opendpu.compiler.codegen.ordering import interleave, strips
from opendpu.compiler.codegen.plans import decide, layer_cost
from opendpu.compiler.codegen.registry import emitter, lowering
from opendpu.compiler.codegen.tiling import (block_rows, blocks, check_window_pads, clip_addr, disjoint, in_fields,
                                             pads_of_block, plan_tiles, tiles)
from opendpu.compiler.fixpoint import conv_shifts
from opendpu.compiler.xir.graph import Graph, Op
from opendpu.isa.target import Target


@dataclass
class ConvSetup:
    cg: int
    ic: int
    n_sl: int
    lines_slice: int
    per_group: int
    b_base: int
    vb_max: int


def weight_lines(t: Target, job: ConvJob) -> tuple[int, int]:
    """(CONVW lines of one output channel's weights, output-channel slices) of a conv."""
    oc, kh, kw, ic = job.w.shape
    return kh * kw * ceil_div(ic, t.cp), ceil_div(oc, t.cp)


def per_group(c: Ctx, lines_slice: int, n_sl: int, half: bool = False) -> int:
    """Output-channel slices per CONVW group: as many as the banks hold (at most half the depth in slices), or with
    `half` as many as half the bank depth holds (double buffering)."""
    per = max(1, min(n_sl, c.depth // lines_slice, c.depth // 2))
    return max(1, min(per, c.depth // 2 // lines_slice)) if half else per


def _limits(c: Ctx, job: ConvJob) -> tuple[int, int, int]:
    """(channel groups, CONVW lines per slice, slices) of a conv; CodegenError beyond the CONV's limits."""
    oc, kh, kw, ic = job.w.shape
    cg = ceil_div(ic, c.target.cp)
    lines_slice, n_sl = weight_lines(c.target, job)
    if cg > CHANNEL_GROUP_MAX:
        raise CodegenError(f"layer {job.name!r}: {ic} input channels = {cg} channel groups > {CHANNEL_GROUP_MAX} "
                           f"(CONV channel_group); one CONV must read all input channels")
    if lines_slice > c.depth:
        raise CodegenError(f"layer {job.name!r}: the weights of one output channel need {lines_slice} CONVW lines "
                           f"(kernel {kw}x{kh} x {cg} channel groups), more than bank_depth {c.depth}")
    return cg, lines_slice, n_sl


def conv_setup(c: Ctx, job: ConvJob, half: bool = False) -> ConvSetup:
    """Check the layer's limits and LOAD its bias (one LOAD of OC bytes; slice s at line base + s). `half`: weight
    groups of at most half the CONVW depth, so the next group's LOADs fill one half while the CONVs read the other."""
    t = c.target
    oc = job.w.shape[0]
    cg, lines_slice, n_sl = _limits(c, job)
    per = per_group(c, lines_slice, n_sl, half)
    b_off = c.const(job.b.astype(np.int8).tobytes())
    b_base = c.bias.alloc(n_sl, f"layer {job.name!r} bias", c.param_align)
    c.s.add("LOAD", bank_addr=b_base, bank_id=t.bias_bank, jump_write=1, jump_read=oc, length=1, channel=oc,
            pad_idx=1, reg_id=REG_CONST, ddr_addr=b_off)
    return ConvSetup(cg, job.w.shape[3], n_sl, lines_slice, per, b_base, block_rows(t, job.win, t.pp))


def conv_weights(c: Ctx, job: ConvJob, st: ConvSetup, g0: int, nsg: int) -> int:
    """LOAD the weights of slices g0..g0+nsg (CONVW bank o holds, per slice, K items of IC bytes, cg lines each);
    their first CONVW line."""
    t = c.target
    oc, kh, kw, ic = job.w.shape
    K, cg = kh * kw, st.cg
    w_base = c.convw.alloc(nsg * st.lines_slice, f"layer {job.name!r} weights", c.param_align)
    for o in range(t.cp):
        chans = [s * t.cp + o for s in range(g0, g0 + nsg) if s * t.cp + o < oc]
        if not chans:
            continue
        data = np.ascontiguousarray(job.w[chans].reshape(len(chans) * K, ic))
        off = c.const(data.tobytes())
        items = len(chans) * K
        if ic % t.cp == 0 and t.load_lines_per_cycle(t.convw_base + o, ic, ic, 0) < t.timing.weight_load_lines:
            # whole lines, contiguous in DDR and bank, but one item would take channel augmentation's single-line
            # path: LOAD them as long items instead, which the wide weight path writes two lines per cycle
            per = min(items, LOAD_CHANNEL_MAX // ic)
            for i0 in range(0, items, per):
                n = min(per, items - i0)
                c.s.add("LOAD", bank_addr=w_base + i0 * cg, bank_id=t.convw_base + o, jump_write=cg,
                        jump_read=n * ic, length=1, channel=n * ic, pad_idx=1, reg_id=REG_CONST,
                        ddr_addr=off + i0 * ic)
            continue
        for i0 in range(0, items, ITEMS_MAX):
            n = min(ITEMS_MAX, items - i0)
            c.s.add("LOAD", bank_addr=w_base + i0 * cg, bank_id=t.convw_base + o, jump_write=cg, jump_read=ic,
                    length=n, channel=ic, pad_idx=1, reg_id=REG_CONST, ddr_addr=off + i0 * ic)
    return w_base


def conv_tile(c: Ctx, job: ConvJob, st: ConvSetup, tile: Tile, ib: InBuf, ob: OutBuf, w_base: int, g0: int,
              nsg: int, vb: int, state: dict, after=None) -> None:
    """The CONVs of one strip: blocks of <= vb output rows, all slices of the group per block (inner loop);
    `after(j0, rows)` follows each block."""
    t = c.target
    win = job.win
    oc, kh, kw, ic = job.w.shape
    cg, E, Eo = st.cg, ib.E, ob.E
    for j0, vpp, bank_out, addr_out in blocks(t, ob, tile.rows, vb):
        init = dict(jump_read=cg, shift_cut=job.shift_cut, act_type=job.act,
                    jump_read_endl=E if E <= CONV_ENDL_MAX else 1, shift_bias=job.shift_bias, stride_out=ob.s,
                    jump_write=nsg, stride_offset_in=0, valid_pixel_parallel=vpp, kernel_h=kh,
                    stride_h=win.sh, jump_write_endl=Eo if Eo <= CONV_ENDL_MAX else 1, stride_offset_out=0,
                    kernel_w=kw, stride_w=win.sw)
        if init != state:
            c.s.add("CONVINIT", **init)
            state.clear()
            state.update(init)
        pads_ = pads_of_block(win, job.inp.h, job.inp.w, tile, j0, vpp)
        inf = clip_addr(in_fields(t, ib, j0), CONV_ADDR_LINES)
        for sl in range(nsg):
            c.s.add("CONV", **inf, **pads_, bank_addr_out=addr_out + sl, channel_group=cg,
                    bank_addr_weights=w_base + sl * st.lines_slice, length=tile.cols,
                    bank_addr_bias=st.b_base + g0 + sl, bank_id_out=bank_out, channel_offset=cg * t.cp - ic)
        if after is not None:
            after(j0, vpp)


def emit_conv(c: Ctx, job: ConvJob, half: bool = False) -> None:
    """A conv layer: its weight groups (double-buffered with `half`), each as strips of CONVs."""
    t = c.target
    st = conv_setup(c, job, half)
    oc = job.w.shape[0]
    win = job.win
    groups = [(g0, min(st.per_group, st.n_sl - g0)) for g0 in range(0, st.n_sl, st.per_group)]
    w_next = conv_weights(c, job, st, *groups[0])
    ahead: Seg = []                                      # the next group's weight LOADs (double buffering)
    plans = [plan_tiles(c, job.name, win, st.cg, 1, nsg, st.vb_max, CONV_ENDL_MAX, CONV_LENGTH_MAX)
             for _, nsg in groups]
    tiles_of = [list(tiles(win, r, k)) for r, k, _ in plans]
    # one strip, the same in every group: its input is LOADed once and stays in VB0 (only outputs are allocated
    # between the groups, in VB1), as AMD's programs read a small map once for all output channels
    keep = len(groups) > 1 and all(len(ts) == 1 and ts[0] == tiles_of[0][0] for ts in tiles_of)
    kept: list[InBuf] = []

    def load(tile: Tile, nsg: int) -> tuple[InBuf, OutBuf]:
        ib, ob = strip_bufs(c, job.name, job.inp, tile, win.sh, st.cg, nsg, job.aug, kept[0] if kept else None)
        if keep and not kept:
            kept.append(ib)
        return ib, ob

    for gi, (g0, nsg) in enumerate(groups):
        if gi and not ahead:
            w_next = conv_weights(c, job, st, g0, nsg)
        w_base = w_next
        ahead = []
        n_next = groups[gi + 1][1] * st.lines_slice if gi + 1 < len(groups) else 0
        # double buffering: the next group's weight LOADs (the other half of the CONVW ring) go after this group's
        # last input LOAD, spread among its CONVs, so the LOAD engine fills them while the CONVs run; unless the
        # ring would put them over this group's lines (then they open the next group, in place)
        if half and n_next and disjoint((0, w_base, nsg * st.lines_slice),
                                        (0, c.convw.peek(n_next, c.param_align), n_next)):
            w_next, ahead = cut(c, lambda: conv_weights(c, job, st, *groups[gi + 1]))
        c0 = g0 * t.cp
        nch = min(oc, (g0 + nsg) * t.cp) - c0
        vb = plans[gi][2]
        state: dict[str, int] = {}
        _, seg = cut(c, lambda: strips(
            c, tiles_of[gi], lambda tile: load(tile, nsg),
            lambda tile, ib, ob: conv_tile(c, job, st, tile, ib, ob, w_base, g0, nsg, vb, state),
            lambda tile, ob: save_rows(c, job.out, tile, ob, c0, nch)))
        last = max((i for i, (x, _) in enumerate(seg) if x.op == "LOAD"), default=-1)
        put(c, seg[:last + 1])
        interleave(c, seg[last + 1:], ahead)
    c.workload += 2 * oc * job.w.shape[1] * job.w.shape[2] * st.ic * win.ho * win.wo


def choose_aug(c: Ctx, job: ConvJob) -> ConvJob:
    """The channel-augmented form of a conv when augmentation is allowed, can express it and the cycle model says
    it is faster (docs/compiler.md); else the job itself."""
    if not c.aug or job.aug is not None or job.win.kw < 2:
        return job
    if not aug_ok(c.target, job.inp, job.win.kw, job.win.sw, job.win.pl):
        return job
    a = aug_job(job)
    try:
        ca, cp = layer_cost(c, lambda k: emit_conv(k, a)), layer_cost(c, lambda k: emit_conv(k, job))
    except CodegenError:
        return job
    decide(c, job.name, "channel_augmentation", {"augmented": ca, "plain": cp}, "augmented" if ca < cp else "plain")
    return a if ca < cp else job


def choose_half(c: Ctx, job: ConvJob) -> bool:
    """Whether a conv whose weights take several CONVW groups loads them double-buffered (groups of at most half the
    bank depth: the next group's weight LOADs overlap the CONVs of this one, at the price of more groups, each
    reading the input again). Decided on the cycle model, which sees that overlap (docs/compiler.md); a context
    without one (a dry run) takes single buffering."""
    if c.cycles is None:
        return False
    lines_slice, n_sl = weight_lines(c.target, job)
    whole = per_group(c, lines_slice, n_sl)
    if whole >= n_sl or per_group(c, lines_slice, n_sl, True) == whole:
        return False
    try:
        cw, ch = layer_cost(c, lambda k: emit_conv(k, job)), layer_cost(c, lambda k: emit_conv(k, job, True))
    except CodegenError:
        return False
    decide(c, job.name, "weight_buffers", {"single": cw, "double": ch}, "double" if ch < cw else "single")
    return ch < cw


def conv_fits(c: Ctx, job: ConvJob) -> None:
    """`emit_conv`'s refusals (single-buffered, as a dry run emits it) without emitting: the CONV's limits, the
    bias slices in the BIAS bank, a strip of every weight group in the image banks, the window's padding."""
    cg, lines_slice, n_sl = _limits(c, job)
    Ring(c.depth).alloc(n_sl, f"layer {job.name!r} bias")
    per = per_group(c, lines_slice, n_sl)
    vb_max = block_rows(c.target, job.win, c.target.pp)
    for nsg in dict.fromkeys((per, n_sl - (n_sl - 1) // per * per)):
        plan_tiles(c, job.name, job.win, cg, 1, nsg, vb_max, CONV_ENDL_MAX, CONV_LENGTH_MAX)
    check_window_pads(job.win, job.inp.h, job.inp.w)


@emitter(ConvJob, conv_fits)
def run_conv(c: Ctx, job: ConvJob) -> None:
    """A conv job with its per-layer choices (a transposed conv's phases: none)."""
    if not job.decide:
        emit_conv(c, job)
        return
    job = choose_aug(c, job)
    emit_conv(c, job, choose_half(c, job))


@lowering(CONV, TCONV)
def lower_conv(c: Ctx, graph: Graph, op: Op, ins: list[FMap], out: FMap) -> list[ConvJob]:
    """A conv as one job; a transposed conv as stride^2 phases, each a stride-1 conv with the sub-kernel on the
    original input."""
    t = c.target
    fp_out = out.fp
    wop, bop = arg(graph, op, "weights"), arg(graph, op, "bias")
    assert wop is not None
    w = int8_data(wop)
    oc = w.shape[0]
    b = int8_data(bop).reshape(-1) if bop is not None else np.zeros(oc, np.int8)
    sc, sb = conv_shifts(ins[0].fp, fix_point(wop), fp_out, fix_point(bop) if bop is not None else None, check=True)
    act = conv_act(op, t, fp_out, "conv")
    kw_, kh_ = pair(op, "kernel", [w.shape[2], w.shape[1]])
    sw, sh = pair(op, "stride", [1, 1])
    pl, pr, pt, pb = pads(op)
    x = ins[0]
    if op.type == "conv2d-fix":
        return [ConvJob(op.name, x, out, Window(kh_, kw_, sh, sw, pt, pl, out.h, out.w), w, b, sc, sb or 0, act)]
    jobs = []
    P_h, P_w = kh_ - 1 - pt, kw_ - 1 - pl
    for py in range(sh):
        ky0 = (P_h - py) % sh
        kys = list(range(ky0, kh_, sh))
        hp = ceil_div(out.h - py, sh)
        for px in range(sw):
            kx0 = (P_w - px) % sw
            kxs = list(range(kx0, kw_, sw))
            wp = ceil_div(out.w - px, sw)
            if hp <= 0 or wp <= 0:
                continue
            if not kys or not kxs:
                raise CodegenError(f"op {op.name!r}: a transposed-conv phase has no kernel taps (stride > kernel)")
            dy = (py + ky0 - P_h) // sh
            dx = (px + kx0 - P_w) // sw
            sub = np.ascontiguousarray(w[:, kys][:, :, kxs])
            o = FMap(out.reg, out.at(py, px), hp, wp, out.c, out.pix * sw, out.row * sh, out.fp)
            win = Window(len(kys), len(kxs), 1, 1, -dy, -dx, hp, wp)
            jobs.append(ConvJob(f"{op.name}[phase {py},{px}]", x, o, win, sub, b, sc, sb or 0, act, decide=False))
    return jobs
