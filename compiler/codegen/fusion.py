"""Fusion: a producer and its only consumer in one superlayer, the intermediate kept on chip.

* `fused`: producer P (CONV or ALU) and its only consumer Q (ALU, or CONV) strip by strip: P computes the rows and
  columns Q's windows read straight into Q's input buffer in VB1 (stride_out = Q's stride_h, spec §2.4), Q reads
  them there and writes image group `q_group`; only Q's rows are SAVEd.
* `conv_elew`: a conv and the ELEW (add / multiply) that is the only reader of its output (AMD's ResNet-50
  program does this: UG1414's rows `res2b` etc. hold branch2c and the add).
* `try_fuse` / `try_fuse_elew`: each form timed against the split layers by the cycle model (plans.layer_cost),
  taken when faster and when the real context accepts it (else undone), the choice kept as a LayerPlan."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from opendpu.compiler.codegen.alu import alu_params, alu_tile, emit_alu, kpos
from opendpu.compiler.codegen.context import Ctx, Seg, cut, emit_or_undo, put
from opendpu.compiler.codegen.conv import ConvSetup, choose_aug, conv_setup, conv_tile, conv_weights, emit_conv
from opendpu.compiler.codegen.elew import elew_rows, emit_elew
from opendpu.compiler.codegen.loadsave import in_buf, load_aug, load_rows, save_rows
from opendpu.compiler.codegen.ir import (REG_SCRATCH, TOKEN_LINES, AluJob, CodegenError, ConvJob, ElewJob, FMap,
                                         InBuf, OutBuf, Tile, Window, ceil_div, data_inputs, dense, fix_point, tensor)
from opendpu.compiler.codegen.kinds import COMPUTE_OPS, SKIP_TYPES
from opendpu.compiler.codegen.limits import (ALU_ENDL_MAX, ALU_LENGTH_MAX, CHANNEL_GROUP_MAX, CONV_ENDL_MAX,
                                             CONV_LENGTH_MAX, ELEW_ENDL_MAX)
from opendpu.compiler.codegen.ordering import interleave
from opendpu.compiler.codegen.plans import decide, layer_cost
from opendpu.compiler.codegen.registry import LOWERINGS
from opendpu.compiler.codegen.tiling import block_rows, buf_span, disjoint, in_lines, strip_plan, tile_of, tiles
from opendpu.compiler.xir.graph import Graph, Op

# the forms of a fused pair by the image group of Q's output (the compile report's names)
FUSED_FORM = ("fused", "fused, output in VB1", "fused, output in VB2")
STRIDE_OUT_MAX = 2                # stride_out > 2 is unproven (spec §2.4)


@dataclass
class _Pair:
    """A producer / consumer pair being emitted fused: the two jobs and what their setup left (parameter lines,
    rows per instruction, the strip plan)."""

    pjob: ConvJob | AluJob
    qjob: AluJob | ConvJob
    q_group: int
    s: int                        # Q's stride_h = P's stride_out
    cg: int                       # channel groups of the intermediate
    st: ConvSetup | None = None   # P's conv setup (a CONV producer)
    cg_p: int = 0                 # P's input channel groups
    vbP: int = 0
    e_max: int = 0                # P's largest input sub-row (strided) and output columns
    len_max: int = 0
    w_base: int = 0               # P's CONVW lines, or its DWCONVW / BIAS lines (pw, pb)
    pw: int = 0
    pb: int = 0
    stq: ConvSetup | None = None  # Q's conv setup (a CONV consumer)
    wq_base: int = 0
    q_params: Seg = field(default_factory=list)     # Q's parameter LOADs, spread among P's first strip
    qw: int = 0
    qb: int = 0
    vbQ_max: int = 0
    lpp_q: int = 0                # lines per pixel of Q's output
    ch_out: int = 0
    len_q: int = 0
    rows: int = 0
    cols: int = 0
    vbQ: int = 0

    @property
    def p_conv(self) -> bool:
        return isinstance(self.pjob, ConvJob)

    @property
    def q_conv(self) -> bool:
        return isinstance(self.qjob, ConvJob)


def _setup_producer(c: Ctx, f: _Pair) -> None:
    """P's parameters LOADed (a CONV producer: bias and one CONVW group of weights; an ALU: DWCONVW and BIAS)."""
    t = c.target
    pjob = f.pjob
    if isinstance(pjob, ConvJob):
        st = f.st = conv_setup(c, pjob)
        if st.per_group < st.n_sl or st.n_sl != f.cg:
            raise CodegenError(f"fusion of {pjob.name!r}: its weights do not fit one CONVW group")
        f.cg_p, f.vbP, f.e_max, f.len_max = st.cg, st.vb_max, CONV_ENDL_MAX, CONV_LENGTH_MAX
        f.w_base = conv_weights(c, pjob, st, 0, st.n_sl)
    else:
        f.cg_p, f.e_max, f.len_max = f.cg, ALU_ENDL_MAX, ALU_LENGTH_MAX
        if kpos(pjob) * f.cg > c.depth:
            raise CodegenError(f"fusion of {pjob.name!r}: weights do not fit the DWCONVW bank")
        f.vbP = block_rows(t, pjob.win, t.alu_pp)
        f.pw, f.pb = alu_params(c, pjob)
    if f.vbP < f.s:
        raise CodegenError(f"fusion of {pjob.name!r}: {f.vbP} rows per instruction < stride_out {f.s}")


def _setup_consumer(c: Ctx, f: _Pair) -> None:
    """Q's parameters. A CONV consumer's weights stay resident beside P's (one CONVW group each, no ring overlap);
    its bias and weight LOADs are taken out of the stream and spread among P's first strip (Q needs them only after
    it), which requires their lines to be none of P's."""
    t = c.target
    qjob = f.qjob
    if isinstance(qjob, ConvJob):
        stq, f.q_params = cut(c, lambda: conv_setup(c, qjob))
        f.stq = stq
        q_wl = stq.n_sl * stq.lines_slice
        p_wl = f.st.n_sl * f.st.lines_slice if f.st is not None else 0
        if stq.per_group < stq.n_sl or p_wl + q_wl > c.depth:
            raise CodegenError(f"fusion into {qjob.name!r}: the two layers' weights do not fit the CONVW banks")
        f.wq_base, more = cut(c, lambda: conv_weights(c, qjob, stq, 0, stq.n_sl))
        f.q_params += more
        if f.st is not None and not disjoint((0, f.w_base, p_wl), (0, f.wq_base, q_wl)):
            raise CodegenError(f"fusion into {qjob.name!r}: the two layers' weights overlap in the CONVW ring")
        if not c.pipeline or (f.st is not None and not disjoint((0, f.st.b_base, f.st.n_sl),
                                                                 (0, stq.b_base, stq.n_sl))):
            put(c, f.q_params)                            # in place: before P's instructions
            f.q_params = []
        f.vbQ_max, f.lpp_q, f.ch_out, f.len_q = stq.vb_max, stq.n_sl, qjob.w.shape[0], CONV_LENGTH_MAX
    else:
        f.qw, f.qb = alu_params(c, qjob)
        f.vbQ_max, f.lpp_q, f.ch_out, f.len_q = block_rows(t, qjob.win, t.alu_pp), f.cg, qjob.inp.c, ALU_LENGTH_MAX


def _plan_strips(c: Ctx, f: _Pair) -> None:
    """The pair's strips: as many of Q's output rows as P's input (VB0), the intermediate (VB1) and Q's output
    (group q_group) fit. Q's output beside the intermediate (VB1) only with the half-depth budget: the ring then
    never wraps onto the strip Q is still reading."""
    t = c.target
    winQ, pwin = f.qjob.win, f.pjob.win
    H, W = f.qjob.inp.h, f.qjob.inp.w
    q_endl = CONV_ENDL_MAX if f.p_conv or f.q_conv else ALU_ENDL_MAX

    def use(rows: int, cols: int) -> list[int] | None:
        """Lines of a strip in each image group (P's input in VB0, the intermediate in VB1, Q's output in group
        `q_group`), None if a field overflows."""
        qt = tile_of(winQ, 0, rows, 0, cols)
        Eq, q_lines = in_lines(t, qt, f.s, f.cg)
        pt = tile_of(pwin, 0, min(qt.nv, H), 0, min(qt.cv, W))
        Ep, p_lines = in_lines(t, pt, pwin.sh, f.cg_p)
        if (pwin.sh > 1 and Ep > f.e_max) or (f.s > 1 and Eq > q_endl) or Eq > ALU_ENDL_MAX \
                or pt.cols > f.len_max or cols > f.len_q:
            return None
        u = [p_lines, q_lines] + [0] * (len(c.img) - 2)
        u[f.q_group] += ceil_div(rows, t.pp) * cols * f.lpp_q
        return u

    plan = strip_plan(c, winQ.ho, winQ.wo, f.vbQ_max, ALU_LENGTH_MAX, use, (2, 1) if f.q_group != 1 else (2,))
    if plan is None:
        raise CodegenError(f"fusion of {f.pjob.name!r} and {f.qjob.name!r}: one strip does not fit the image banks")
    f.rows, f.cols, f.vbQ = plan


def _prepare(c: Ctx, f: _Pair, qt: Tile) -> tuple[Tile, InBuf, OutBuf, InBuf]:
    """Strip buffers: Q's input (VB1, written by P) and P's input (VB0, LOADed now)."""
    t = c.target
    qjob, pjob = f.qjob, f.pjob
    H, W = qjob.inp.h, qjob.inp.w
    ya, yb = max(0, qt.a), min(H, qt.a + qt.nv)
    xa, xb = max(0, qt.b), min(W, qt.b + qt.cv)
    if yb <= ya or xb <= xa:
        raise CodegenError(f"fusion into {qjob.name!r}: a strip's windows lie in the padding")
    pt = tile_of(pjob.win, ya, yb - ya, xa, xb - xa)
    Eq, q_lines = in_lines(t, qt, f.s, f.cg)
    ibq = InBuf(t.img_base(1), c.img[1].alloc(q_lines, f"layer {qjob.name!r} input", TOKEN_LINES), Eq, f.cg, f.s,
                q_lines)
    obp = OutBuf(ibq.group, ibq.base, Eq, f.cg, f.s, ya - qt.a, (xa - qt.b) * f.cg)
    p_aug = pjob.aug if isinstance(pjob, ConvJob) else None
    ibp = in_buf(c, pjob.name, pt, pjob.win.sh, f.cg_p, pjob.inp, p_aug, 0, TOKEN_LINES)
    return pt, ibp, obp, ibq


class _Deferred:
    """Q's SAVEs not emitted yet and the lines they read: emitted before anything that overwrites those lines."""

    def __init__(self) -> None:
        self.seg: Seg = []
        self.span: tuple[int, int, int] = (0, 0, 0)

    def flush_if(self, c: Ctx, span: tuple[int, int, int] | None) -> None:
        if self.seg and span is not None and not disjoint(span, self.span):
            put(c, self.seg)
            self.seg = []


def _strips(c: Ctx, f: _Pair) -> None:
    """Software pipeline in program order: P computes strip k, the LOADs of strip k+1 follow, then Q's blocks of
    strip k, each followed by the SAVEs of its rows (so no engine queue waits behind a strip's whole tail)."""
    t = c.target
    qjob = f.qjob
    state_p: dict[str, int] = {}
    state_q = state_p if f.p_conv == f.q_conv else {}   # two ALU (two CONV) layers share the ALUINIT (CONVINIT) state
    ts = list(tiles(qjob.win, f.rows, f.cols))
    nxt = _prepare(c, f, ts[0])
    if not f.q_conv:
        f.q_params = []
    deferred = _Deferred()
    for k, qt in enumerate(ts):
        pt, ibp, obp, ibq = nxt
        if isinstance(f.pjob, ConvJob):
            pjob, st = f.pjob, f.st
            assert st is not None
            _, pseg = cut(c, lambda: conv_tile(c, pjob, st, pt, ibp, obp, f.w_base, 0, st.n_sl, f.vbP, state_p))
        else:
            ajob = f.pjob
            _, pseg = cut(c, lambda: alu_tile(c, ajob, pt, ibp, obp, f.pw, f.pb, f.vbP, state_p))
        deferred.flush_if(c, buf_span(t, ibq))           # P writes where Q's deferred rows are (Q's output in VB1)
        moved: Seg = []
        if k + 1 < len(ts):
            nxt, moved = cut(c, lambda: _prepare(c, f, ts[k + 1]))
        n_q = ceil_div(qt.rows, f.vbQ)
        _producer_strip(c, f, pseg, moved, n_q, nxt[1] if k + 1 < len(ts) else None, ibp, ibq, deferred)
        Eo = qt.cols * f.lpp_q
        obq = OutBuf(t.img_base(f.q_group), c.img[f.q_group].alloc(ceil_div(qt.rows, t.pp) * Eo,
                                                                   f"layer {qjob.name!r} output", TOKEN_LINES),
                     Eo, f.lpp_q)
        nxt_span = buf_span(t, nxt[1]) if k + 1 < len(ts) else None
        _consumer_strip(c, f, qt, ibq, obq, moved, n_q, nxt_span, deferred, state_q)
        if moved:
            deferred.flush_if(c, nxt_span)
        put(c, moved)
    put(c, deferred.seg)


def _producer_strip(c: Ctx, f: _Pair, pseg: Seg, moved: Seg, n_q: int, nxt_ibp: InBuf | None, ibp: InBuf,
                    ibq: InBuf, deferred: _Deferred) -> None:
    """P's instructions of a strip, with Q's parameter LOADs (first strip) and, with `c.pipeline`, a share of the
    next strip's LOADs among them (P's strip waits for its own LOADs; a run of P instructions behind a full queue
    would hold those LOADs back), when their lines are free; the share is taken off `moved`."""
    t = c.target
    if c.pipeline and moved:
        assert nxt_ibp is not None
        n_p = sum(1 for x, _ in pseg if x.op in COMPUTE_OPS)
        k_p = len(moved) * n_p // (n_p + n_q)
        nsp = buf_span(t, nxt_ibp)
        if not (disjoint(nsp, buf_span(t, ibp)) and disjoint(nsp, buf_span(t, ibq))):
            k_p = 0
        if k_p:
            deferred.flush_if(c, nsp)
        interleave(c, pseg, f.q_params + moved[:k_p])
        del moved[:k_p]
    else:
        interleave(c, pseg, f.q_params)
    f.q_params = []


def _consumer_strip(c: Ctx, f: _Pair, qt: Tile, ibq: InBuf, obq: OutBuf, moved: Seg, n_q: int,
                    nxt_span: tuple[int, int, int] | None, deferred: _Deferred, state_q: dict) -> None:
    """Q's blocks of a strip, each followed by a share of the next strip's LOADs and the SAVEs of Q's rows."""
    t = c.target
    qjob = f.qjob
    per = ceil_div(len(moved), n_q) if moved else 0
    ob_span = buf_span(t, obq, qt.rows)
    # the rings allocate without knowing what is live: Q's rows must not land on the strip Q reads or on the next
    # strip's input (LOADed among Q's blocks)
    if not disjoint(ob_span, buf_span(t, ibq)) or (nxt_span is not None and not disjoint(ob_span, nxt_span)):
        raise CodegenError(f"fusion into {qjob.name!r}: its output rows would overwrite a strip buffer in use")
    deferred.flush_if(c, ob_span)                        # Q's blocks overwrite the deferred rows: SAVE them first

    def after(j0: int, n: int) -> None:
        """After Q's block: a share of the next strip's LOADs (they touch other lines and bytes, so moving them
        past Q's block keeps the program's meaning) and the SAVEs of Q's rows. With `c.pipeline` the SAVEs are
        those of the previous block (this block's wait for its ALU, and a full SAVE queue would stop the
        dispatcher before the LOADs behind it), unless the LOADs overwrite their lines."""
        _, sv = cut(c, lambda: save_rows(c, qjob.out, qt, obq, 0, f.ch_out, range(j0, j0 + n)))
        if not c.pipeline:
            put(c, sv)
            put(c, moved[:per])
        else:
            if moved[:per]:
                deferred.flush_if(c, nxt_span)
            put(c, moved[:per])
            put(c, deferred.seg)
            deferred.seg, deferred.span = sv, ob_span
        del moved[:per]

    if isinstance(qjob, ConvJob):
        stq = f.stq
        assert stq is not None
        conv_tile(c, qjob, stq, qt, ibq, obq, f.wq_base, 0, stq.n_sl, f.vbQ, state_q, after=after)
    else:
        alu_tile(c, qjob, qt, ibq, obq, f.qw, f.qb, f.vbQ, state_q, after=after)


def fused(c: Ctx, pjob: ConvJob | AluJob, qjob: AluJob | ConvJob, q_group: int = 0) -> None:
    """P and Q as one superlayer (module docstring); Q's output in image group `q_group` (VB0 by default, beside P's
    input; VB1 or a third group keep Q's SAVEs off the banks P's next strip reads, docs/compiler.md). CodegenError
    when the pair does not fit this scheme."""
    t = c.target
    if not 0 <= q_group < len(c.img):
        raise CodegenError(f"fusion into {qjob.name!r}: no image group {q_group} on {t.name}")
    winQ, pwin = qjob.win, pjob.win
    ch = qjob.inp.c
    f = _Pair(pjob, qjob, q_group, winQ.sh, ceil_div(ch, t.cp))
    if f.s > STRIDE_OUT_MAX:
        raise CodegenError(f"fusion into {qjob.name!r}: stride_out {f.s} (> {STRIDE_OUT_MAX} is unproven, spec §2.4)")
    if not isinstance(qjob, ConvJob) and (f.cg > CHANNEL_GROUP_MAX or kpos(qjob) * f.cg > c.depth):
        raise CodegenError(f"fusion into {qjob.name!r}: channels do not fit one ALU pass")
    _setup_producer(c, f)
    _setup_consumer(c, f)
    _plan_strips(c, f)
    _strips(c, f)
    kp = pjob.w.shape[1] * pjob.w.shape[2] * pjob.w.shape[3] if isinstance(pjob, ConvJob) else pwin.kh * pwin.kw
    kq = qjob.w.shape[1] * qjob.w.shape[2] * qjob.w.shape[3] if isinstance(qjob, ConvJob) else winQ.kh * winQ.kw
    c.workload += 2 * ch * kp * pwin.ho * pwin.wo + 2 * f.ch_out * kq * winQ.ho * winQ.wo


def fuse_jobs(c: Ctx, graph: Graph, p: Op, q: Op, kinds: dict[str, str], fm: dict[str, FMap],
              out: FMap, elew: bool = False) -> tuple | None:
    """(P's job, Q's job) of a producer / consumer pair, P's conv in its chosen (augmented or not) form; None if
    either is not a single CONV / ALU layer (with `elew`: a CONV and an ELEW)."""
    # where the unfused P would store its output: a register of its own (REG_SCRATCH), so that in the scratch
    # emissions the decisions time it shares no DDR byte with a real tensor; the fused form never reads or writes it
    p_out = dense(REG_SCRATCH, 0, tensor(p).shape, fix_point(p))
    jobs = []
    for op, o, env in ((p, p_out, fm), (q, out, {**fm, p.name: p_out})):
        ins = [env[i] for i in data_inputs(op) if graph.ops[i].type not in SKIP_TYPES]
        got = LOWERINGS[kinds[op.name]](c, graph, op, ins, o)
        if len(got) != 1:
            return None
        jobs.append(got[0])
    pj, qj = jobs
    if elew:
        if not isinstance(pj, ConvJob) or not isinstance(qj, ElewJob):
            return None
    elif not isinstance(qj, (AluJob, ConvJob)) or (isinstance(qj, ConvJob) and not c.fuse_conv):
        return None
    if isinstance(pj, ConvJob):
        pj = choose_aug(c, pj)
    return pj, qj


def _alone(job: ConvJob | AluJob) -> Callable[[Ctx], None]:
    if isinstance(job, ConvJob):
        return lambda k: emit_conv(k, job)
    return lambda k: emit_alu(k, job)


def try_fuse(c: Ctx, pj: ConvJob | AluJob, qj: AluJob | ConvJob) -> bool:
    """Emit P and Q fused when that fits and the cycle model says it is faster than P then Q through DDR. Q's output
    may go to VB0 (beside P's input), VB1 (beside the intermediate) or a third image group; the cycle model sees
    the bank-port conflicts that tell them apart."""
    forms: dict[str, int | None] = {}
    for g in range(len(c.img)):
        def fused_in(k: Ctx, g: int = g) -> None:
            fused(k, pj, qj, g)
        try:
            forms[FUSED_FORM[g]] = layer_cost(c, fused_in)
        except CodegenError:
            forms[FUSED_FORM[g]] = None
    tried = {f: v for f, v in forms.items() if v is not None}
    if not tried:
        return False
    # on equal cycles the group farthest from P's input: the layer alone cannot show what Q's SAVEs, starved of
    # a bank port by P's reads, cost the layers after it (tf2_custom_op: 17,743 -> 17,676 cycles, docs/compiler.md)
    form = min(tried, key=lambda f: (tried[f], -FUSED_FORM.index(f)))
    try:
        split: int | None = layer_cost(c, _alone(pj), _alone(qj))
    except CodegenError:
        split = None
    take = split is None or tried[form] < split
    # the scratch run starts with empty parameter rings; the real ones may wrap elsewhere and refuse the pair
    # (e.g. the two layers' weights overlapping in the CONVW ring): then it is undone and the layers go split
    g = FUSED_FORM.index(form)
    if take and not emit_or_undo(c, lambda: fused(c, pj, qj, g)):
        take, forms[form] = False, None
    decide(c, f"{pj.name} + {qj.name}", "fuse_conv" if isinstance(qj, ConvJob) else "fuse",
           {**forms, "split": split}, form if take else "split")
    return take


# ---- a conv and its ELEW consumer --------------------------------------------------------------------------------
def conv_elew(c: Ctx, pj: ConvJob, qj: ElewJob, k: int) -> None:
    """A conv and the ELEW that is the only reader of its output, as input k, strip by strip: the conv writes its
    rows into VB1, the ELEW reads them there with the rows of its other inputs LOADed beside the conv's input in
    VB0, and only the ELEW's rows are SAVEd. CodegenError when the pair does not fit this scheme."""
    t = c.target
    st = conv_setup(c, pj)
    cg = st.n_sl
    H, W = qj.out.h, qj.out.w
    if st.per_group < st.n_sl:
        raise CodegenError(f"fusion of {pj.name!r}: its weights do not fit one CONVW group")
    if cg > CHANNEL_GROUP_MAX or (pj.out.h, pj.out.w, pj.out.c) != (H, W, qj.out.c) or \
            any((f.h, f.w, f.c) != (H, W, qj.out.c) for f in qj.inps):
        raise CodegenError(f"fusion into {qj.name!r}: the ELEW's inputs are not all the conv's shape")
    others = [f for i, f in enumerate(qj.inps) if i != k]
    win = pj.win
    ewin = Window(1, 1, 1, 1, 0, 0, H, W)
    vbE = block_rows(t, ewin, t.alu_pp)

    def lines(rows: int, cols: int) -> tuple[int, int] | None:
        """(VB0 lines: the conv's input + the other inputs' rows, VB1 lines: the conv's rows + the ELEW's rows)."""
        tile = tile_of(win, 0, rows, 0, cols)
        E, in_l = in_lines(t, tile, win.sh, st.cg)
        if (win.sh > 1 and E > CONV_ENDL_MAX) or cols > CONV_LENGTH_MAX or cols * cg > ELEW_ENDL_MAX:
            return None
        out = ceil_div(rows, t.pp) * cols * cg
        return in_l + len(others) * out, 2 * out

    plan = strip_plan(c, win.ho, win.wo, st.vb_max, CONV_LENGTH_MAX, lines, (2, 1))
    if plan is None:
        raise CodegenError(f"fusion of {pj.name!r} and {qj.name!r}: one strip does not fit the image banks")
    rows, cols, vb = plan
    w_base = conv_weights(c, pj, st, 0, cg)
    state: dict[str, int] = {}
    for tile in tiles(win, rows, cols):
        E, in_l = in_lines(t, tile, win.sh, st.cg)
        Eo = tile.cols * cg
        out = ceil_div(tile.rows, t.pp) * Eo
        # each ring's share of the strip as one block (a wrap between two allocations could overlap them)
        a0 = c.img[0].alloc(in_l + len(others) * out, f"layer {pj.name!r} + {qj.name!r} inputs", TOKEN_LINES)
        ib = InBuf(t.img_base(0), a0, E, st.cg, win.sh, in_l)
        if pj.aug is None:
            load_rows(c, pj.inp, tile, ib)
        else:
            load_aug(c, pj.aug, tile, ib)
        otile = tile_of(ewin, tile.y0, tile.rows, tile.x0, tile.cols)
        bufs: list[InBuf] = []
        at = a0 + in_l
        for f in others:
            bufs.append(InBuf(t.img_base(0), at, Eo, cg, 1, out))
            load_rows(c, f, otile, bufs[-1])
            at += out
        a1 = c.img[1].alloc(2 * out, f"layer {pj.name!r} + {qj.name!r} outputs", TOKEN_LINES)
        ob = OutBuf(t.img_base(1), a1, Eo, cg)
        eb = OutBuf(t.img_base(1), a1 + out, Eo, cg)
        conv_tile(c, pj, st, tile, ib, ob, w_base, 0, cg, vb, state)
        bufs.insert(k, InBuf(ob.group, ob.base, Eo, cg, 1, out))
        elew_rows(c, qj, otile, [(b, False, False) for b in bufs], eb, vbE)
        save_rows(c, qj.out, tile, eb, 0, qj.out.c)
    kp = pj.w.shape[1] * pj.w.shape[2] * pj.w.shape[3]
    c.workload += 2 * qj.out.c * kp * win.ho * win.wo + len(qj.inps) * qj.out.c * H * W


def try_fuse_elew(c: Ctx, pj: ConvJob, qj: ElewJob, k: int) -> bool:
    """Emit a conv and its ELEW consumer fused when that fits and the cycle model says it is faster than split."""
    try:
        fused_cost: int | None = layer_cost(c, lambda x: conv_elew(x, pj, qj, k))
    except CodegenError:
        return False
    try:
        split: int | None = layer_cost(c, lambda x: emit_conv(x, pj), lambda x: emit_elew(x, qj))
    except CodegenError:
        split = None
    assert fused_cost is not None
    take = split is None or fused_cost < split
    if take and not emit_or_undo(c, lambda: conv_elew(c, pj, qj, k)):
        take, fused_cost = False, None
    decide(c, f"{pj.name} + {qj.name}", "fuse_elew", {"fused": fused_cost, "split": split},
           "fused" if take else "split")
    return take
