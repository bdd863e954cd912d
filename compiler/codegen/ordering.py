"""Program order and tokens: the software-pipelined strip order of a layer (`strips`), compute interleaved with
the LOADs / SAVEs that may run under it (`interleave`), the cross-layer prefetch (`prefetch_layers`) and the
dependency tokens placed from the instructions' footprints on the exact conflicting instruction (`tokens`,
isa.deps.ExactTokenPlanner), so the program is race-free by construction."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from opendpu.compiler.codegen.context import Ctx, Seg, cut, put
from opendpu.compiler.codegen.ir import TOKEN_LINES, InBuf, OutBuf, Tile, ceil_div
from opendpu.compiler.codegen.kinds import COMPUTE_OPS, INIT_OPS
from opendpu.compiler.codegen.tiling import buf_span, disjoint
from opendpu.isa.deps import DenseKeys, ExactTokenPlanner, KeySpace, TokenPlanner
from opendpu.isa.footprint import Footprint, InitState, footprint_of
from opendpu.isa.program import Instruction
from opendpu.isa.target import Target

PREFETCH_PER_SLOT = 3        # prefetched LOADs after one compute instruction: fewer than the 4-deep LOAD queue


# ---- strips of one layer ---------------------------------------------------------------------------------------
def interleave(c: Ctx, comp: Seg, extra: Seg) -> None:
    """Emit a strip's compute instructions with `extra` (LOADs / SAVEs) spread evenly after its CONV / ALU / ELEW
    instructions, so that each engine queue gets work in the order the engines can take it (the dispatcher stops
    behind a full queue, docs/microarchitecture.md §2)."""
    n = sum(1 for x, _ in comp if x.op in COMPUTE_OPS)
    m, done, u = len(extra), 0, 0
    for x, layer in comp:
        c.s.ins.append(x)
        c.s.layer_of.append(layer)
        if x.op in COMPUTE_OPS and n:
            u += 1
            due = ceil_div(u * m, n)
            put(c, extra[done:due])
            done = max(done, due)
    put(c, extra[done:])


def strips(c: Ctx, tiles: list[Tile], load: Callable[[Tile], tuple[InBuf, OutBuf]],
           compute: Callable[[Tile, InBuf, OutBuf], None], save: Callable[[Tile, OutBuf], None]) -> None:
    """The strips of one layer. In the plain order each strip is LOADs, compute, SAVEs. With `c.pipeline` the
    program order is a software pipeline: strip k's compute instructions with the SAVEs of strip k-1 and the
    LOADs of strip k+1 spread between them (those touch other buffers, checked here, and other DDR bytes: a
    layer's input and output images never overlap, so the program's meaning is unchanged); with the tokens on
    the exact conflicting instruction (isa.deps.ExactTokenPlanner) strip k+1's LOADs run under strip k's compute
    and strip k-1's SAVEs under it too, instead of the dispatcher stopping behind a full SAVE queue that waits on
    strip k's last CONV. A boundary where the buffers overlap (single buffering) keeps the plain order."""
    t = c.target
    if not c.pipeline or len(tiles) < 2:
        for tile in tiles:
            ib, ob = load(tile)
            compute(tile, ib, ob)
            save(tile, ob)
        return
    cur = load(tiles[0])
    pending: Seg = []                                    # the SAVEs of the previous strip, not emitted yet
    prev_ob: tuple[int, int, int] | None = None
    for k, tile in enumerate(tiles):
        ib, ob = cur
        _, comp = cut(c, lambda: compute(tile, ib, ob))
        ob_span = buf_span(t, ob, tile.rows)
        if pending:
            assert prev_ob is not None, "pending SAVEs are those of a previous strip, whose output span is prev_ob"
            if not disjoint(ob_span, prev_ob):
                put(c, pending)                           # strip k overwrites strip k-1's output: SAVE it first
                pending = []
        nxt: Seg = []
        ahead = True                                      # strip k+1's LOADs may go among strip k's compute
        if k + 1 < len(tiles):
            cur, nxt = cut(c, lambda: load(tiles[k + 1]))
            ib_span = buf_span(t, cur[0])
            ahead = disjoint(ib_span, buf_span(t, ib)) and disjoint(ib_span, ob_span)
        _, sv = cut(c, lambda: save(tile, ob))
        if ahead:
            interleave(c, comp, pending + nxt)
            pending = sv
        else:
            interleave(c, comp, pending)
            put(c, sv)
            put(c, nxt)
            pending = []
        prev_ob = ob_span
    put(c, pending)


# ---- the whole stream ------------------------------------------------------------------------------------------
def footprint_keys(t: Target, ins: list[Instruction], reg_sizes: dict[int, int]) -> DenseKeys:
    """The read and write keys of every instruction in the token planner's key space (8-line / 64-byte chunks),
    dense (isa.deps.DenseKeys)."""
    space = KeySpace(t, line_chunk=TOKEN_LINES, ddr_chunk=64)
    state = InitState()
    fps: list[Footprint | None] = []
    for x in ins:
        if x.op == "END":
            fps.append(None)
            continue
        fps.append(footprint_of(x.op, x.fields, state, t, reg_sizes))
        state.update(x.op, x.fields)
    return DenseKeys.of_footprints(space, fps)


def _layer_head(ins: list[Instruction], i: int, j: int) -> list[int]:
    """The LOADs that open the layer ins[i:j]: those before its first other non-INIT instruction."""
    head: list[int] = []
    k = i
    while k < j and (ins[k].op == "LOAD" or ins[k].op in INIT_OPS):
        if ins[k].op == "LOAD":
            head.append(k)
        k += 1
    return head


def _hoist(ins: list[Instruction], region: list[int], head: list[int], keys: DenseKeys,
           mark: np.ndarray) -> list[int]:
    """`region` (the previous layer's tail) with the LOADs `head` merged in: each after the last region instruction
    it conflicts with and no earlier than its share of the region's compute instructions, right after a compute
    instruction, at most PREFETCH_PER_SLOT per slot, in their own order."""
    region_a = np.asarray(region, np.int64)
    comp = [p for p, x in enumerate(region) if ins[x].op in COMPUTE_OPS]
    slots: dict[int, list[int]] = {}                 # region position before which LOADs go (len: the end)
    floor = 0
    for m, h in enumerate(head):
        # after the last region instruction h conflicts with (h writes what it reads or writes, or reads what it
        # writes)
        e = keys.last_conflict(h, region_a, floor, mark)
        want = comp[m * len(comp) // len(head)] + 1 if comp else len(region)
        pos = max(e, want)
        while pos < len(region) and (ins[region[pos - 1]].op not in COMPUTE_OPS
                                     or len(slots.get(pos, ())) >= PREFETCH_PER_SLOT):
            pos += 1                                 # right after a compute instruction (or at the end)
        floor = pos
        slots.setdefault(pos, []).append(h)
    merged: list[int] = []
    for p in range(len(region) + 1):
        merged.extend(slots.get(p, ()))
        if p < len(region):
            merged.append(region[p])
    return merged


def prefetch_layers(ins: list[Instruction], layer_of: list[int], keys: DenseKeys) -> list[int]:
    """Cross-layer prefetch (vai-c-program-patterns §7 item 4): the LOADs that open a layer (bias, weights, its
    first strip's rows: the LOADs before its first other non-INIT instruction) move up into the previous layer's
    tail, the instructions after the LOAD engine's last earlier LOAD, spread after its CONV / ALU / ELEW
    instructions (so the dispatcher is not held behind a full LOAD queue) and never above an instruction they
    conflict with (a SAVE of the rows they read, a reader of the lines they overwrite: keys at the planner's
    granularity), in their own order. Only LOADs move, and LOAD footprints do not depend on INIT state, so every
    instruction's meaning is unchanged. Returns the new order (indices into `ins`)."""
    out: list[int] = []
    last_load = -1                                       # position in `out` of the latest LOAD
    n = len(ins)
    mark = np.zeros(max(1, keys.total), np.int8)         # scratch of `last_conflict`
    i = 0
    while i < n:
        j = i
        while j < n and layer_of[j] == layer_of[i]:
            j += 1
        head = _layer_head(ins, i, j)
        r0 = last_load + 1
        if head and i > 0 and r0 < len(out):
            moved = set(head)
            out[r0:] = _hoist(ins, out[r0:], head, keys, mark)
            out.extend(x for x in range(i, j) if x not in moved)
        else:
            out.extend(range(i, j))
        for q in range(len(out) - 1, last_load, -1):
            if ins[out[q]].op == "LOAD":
                last_load = q
                break
        i = j
    return out


def _save_span(x: Instruction) -> tuple[int, int, int]:
    f = x.fields
    return f["reg_id"], f["ddr_addr"], f["ddr_addr"] + (f["length"] - 1) * f["jump_write"] + f["channel"]


def pairable(a: Instruction, b: Instruction) -> bool:
    """Two adjacent SAVEs may go out as a pair on the two AXI ports (spec §5.2): different banks and disjoint
    DDR byte spans (interleaved strided writes are not paired)."""
    if a.op != "SAVE" or b.op != "SAVE" or a.fields["bank_id"] == b.fields["bank_id"]:
        return False
    ra, a0, a1 = _save_span(a)
    rb, b0, b1 = _save_span(b)
    return ra != rb or a1 <= b0 or b1 <= a0


def _exact_tokens(planner: ExactTokenPlanner, ins: list[Instruction], keys: DenseKeys,
                  last_save: int) -> list[Instruction]:
    """`tokens` with the exact planner, in one compiled key pass (the same tokens as `_engine_tokens`' loop)."""
    out = list(ins)
    ops: list[str] = []
    pairs: list[int | None] = []
    lo: list[int] = []
    hi: list[int] = []
    i = 0
    while i < len(ins):
        x = ins[i]
        if x.op != "END" and i + 1 < last_save and pairable(x, ins[i + 1]):
            ops += ["SAVE", "SAVE"]                     # the first waits for both: the union of their keys
            pairs += [0, 1]
            lo += [i, i + 1]
            hi += [i + 2, i + 2]
            out[i] = replace(x, fields=dict(x.fields, hp_id=0))
            out[i + 1] = replace(ins[i + 1], fields=dict(ins[i + 1].fields, hp_id=1))
            i += 2
            continue
        ops.append(x.op)
        pairs.append(None)
        lo.append(i)
        hi.append(i if x.op == "END" else i + 1)
        i += 1
    planner.add_dense(ops, pairs, lo, hi, keys, last_save)
    return [replace(x, dpdon=planner.dpdon[k], dpdby=planner.dpdby[k]) for k, x in enumerate(out)]


def _engine_tokens(planner: TokenPlanner, ins: list[Instruction], keys: DenseKeys,
                   last_save: int) -> list[Instruction]:
    out = list(ins)
    i = 0
    while i < len(ins):
        x = ins[i]
        if x.op == "END":
            planner.add("END", wait=False)
            i += 1
            continue
        if i + 1 < last_save and pairable(x, ins[i + 1]):
            y = ins[i + 1]
            (r1, w1), (r2, w2) = keys.sets(i), keys.sets(i + 1)
            planner.add("SAVE", keys=(r1 | r2, w1 | w2), pair=0)
            planner.add("SAVE", keys=(r2, w2), pair=1)
            out[i] = replace(x, fields=dict(x.fields, hp_id=0))
            out[i + 1] = replace(y, fields=dict(y.fields, hp_id=1))
            i += 2
            continue
        planner.add(x.op, keys=keys.sets(i))
        if i == last_save:
            planner.order_after_all(i)
        i += 1
    return [replace(x, dpdon=planner.dpdon[k], dpdby=planner.dpdby[k]) for k, x in enumerate(out)]


def tokens(t: Target, ins: list[Instruction], exact: bool, keys: DenseKeys) -> list[Instruction]:
    """Place dpdon/dpdby from the footprint keys (isa.deps.TokenPlanner / ExactTokenPlanner); the last SAVE waits
    for all work. Adjacent SAVEs of different banks go out as pairs (hp_id 0 waits for both, hp_id 1 signals for
    both), except the last SAVE, which must carry the final waits itself."""
    last_save = max(i for i, x in enumerate(ins) if x.op == "SAVE")
    if exact:
        return _exact_tokens(ExactTokenPlanner(t, line_chunk=TOKEN_LINES, ddr_chunk=64), ins, keys, last_save)
    return _engine_tokens(TokenPlanner(t, line_chunk=TOKEN_LINES, ddr_chunk=64), ins, keys, last_save)
