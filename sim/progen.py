"""Random *valid* ISA1 programs for verification (executor fuzzing now, cycle model and RTL later).

`random_program` emits programs that are field-legal, accepted by `sim.executor.DpuMachine`, keep every
LOAD/SAVE inside its DDR register, and carry dpdon/dpdby tokens (spec §5.2) that are
* deadlock-free: the k-th wait on every engine pair (P, C) has its k-th signal earlier in program order,
  and signals = waits at END;
* race-free: every cross-engine conflict (write/write or read/write on the same bank lines or DDR bytes)
  is ordered by a token chain, so any schedule of the four in-order engines that honours the tokens
  gives the program-order result.
`break_tokens` derives programs that must deadlock ("starve", "cycle").

Footprints come from isa.footprint (the executor's exact addressing), compared in chunks of 16 lines per
bank and 64 DDR bytes so that many instructions conflict; tokens are placed by isa.deps.TokenPlanner as in
TVM VTA: an instruction that conflicts with work an engine issued since the last synchronisation waits on
that engine's latest instruction.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from opendpu.isa.deps import TokenPlanner, token_counts
from opendpu.isa.fields import BY_NAME, FIELDS, Engine
from opendpu.isa.footprint import InitState, footprint_of
from opendpu.isa.program import Instruction, ProgramArrays, to_arrays
from opendpu.isa.target import Target

from .executor import DpuMachine

KINDS = ("LOAD", "SAVE", "CONV", "ALU", "ELEW")
DEFAULT_MIX = {"LOAD": 0.3, "SAVE": 0.2, "CONV": 0.2, "ALU": 0.15, "ELEW": 0.15}
BREAK_KINDS = ("starve", "cycle")

# DDR registers: CONST weights and input are only read by LOADs, the workspace is written by SAVEs and read
# back by LOADs, the output is only written by SAVEs.
REG_CONST, REG_INPUT, REG_WORK, REG_OUT = 0, 1, 2, 3
REG_SIZES = {REG_CONST: 16384, REG_INPUT: 12288, REG_WORK: 8192, REG_OUT: 16384}

BIT = tuple(e.bit for e in Engine)  # dpdon/dpdby bit of each engine (spec §4.1)
ENGINE = {o: BY_NAME[o].engine for o in BY_NAME}
LMAX = 32                           # longest tile (items / output columns)
CGMAX = 3                           # largest channel_group
P_REINIT = 0.15                     # chance of a fresh CONVINIT / ALUINIT before a CONV / ALU
P_EXTRA = 0.08                      # chance of an extra (not needed) cross-engine dependency
P_PAIR = 0.35                       # chance that a SAVE becomes an hp_id 0/1 SAVE pair
_EMPTY: frozenset = frozenset()
_NO_STATE = InitState()             # LOAD and SAVE footprints need no INIT state
# ALU exec modes and their weights (spec §6.8; 5 maxreduce and 8 w16b0 are legal but rare).
_ALU_MODES = (0, 1, 2, 3, 4, 5, 6, 7, 8)
_ALU_MODE_CUM = tuple(np.cumsum((3.0, 1.0, 2.0, 2.0, 1.0, 0.5, 1.0, 1.0, 0.5)).tolist())


@dataclass
class GeneratedProgram:
    """A generated program with the DDR registers it needs and their initial contents."""

    target: Target
    instructions: list[Instruction]      # ends with exactly one END
    reg_sizes: dict[int, int]            # reg_id -> bytes
    reg_init: dict[int, np.ndarray]      # int8 initial contents of the registers LOADs read from

    @cached_property
    def arrays(self) -> ProgramArrays:
        return to_arrays(self.instructions)

    def machine(self, seed: int = 0) -> DpuMachine:
        """A zero-filled DpuMachine with the registers allocated and `reg_init` written."""
        m = DpuMachine(self.target, self.reg_sizes, init_fill="zero", seed=seed)
        for reg, data in self.reg_init.items():
            m.write_ddr(reg, 0, data)
        return m


def random_program(target: Target, n: int = 64, seed: int = 0, *, save_pairs: bool = True,
                   mix: dict[str, float] | None = None, bank_conflicts: bool = False) -> GeneratedProgram:
    """About `n` random instructions, then a final SAVE ordered after all other work, then END.

    `mix` weights the kinds in KINDS (missing kinds get weight 0; INITs come with their CONV/ALU/ELEW);
    `save_pairs` allows hp_id 0/1 SAVE pairs (spec §5.2). Deterministic for a given seed.

    `bank_conflicts` fuzzes the bank-port arbitration (docs/bank-ports.md): image accesses crowd onto the
    first bank group and two hot banks of it (so engines running at the same time often request the same
    bank), more LOADs go to image banks, while line addresses spread over the whole bank depth (so
    fewer accesses share lines, fewer tokens order them, and more of them run concurrently). Programs
    stay valid and race-free: tokens still come from the exact line footprints.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    g = _Gen(target, seed, save_pairs, mix, bank_conflicts)
    g.run(n)
    instrs = [Instruction(op, on, by, f) for op, on, by, f in zip(g.ops, g.tok.dpdon, g.tok.dpdby, g.fl)]
    init = {reg: np.frombuffer(g.rng.randbytes(REG_SIZES[reg]), np.int8).copy()
            for reg in (REG_CONST, REG_INPUT, REG_WORK)}
    return GeneratedProgram(target, instrs, dict(REG_SIZES), init)


class _Gen:
    """Generator state: the program so far, INIT state, and the token planner (unsynchronised footprints)."""

    def __init__(self, t: Target, seed: int, save_pairs: bool, mix: dict[str, float] | None,
                 bank_conflicts: bool = False):
        self.t = t
        self.crowd = bank_conflicts
        self.rng = random.Random(seed)
        self.r = self.rng.random
        self.save_pairs = save_pairs
        mix = DEFAULT_MIX if mix is None else mix
        bad = set(mix) - set(KINDS)
        if bad:
            raise ValueError(f"unknown instruction kind(s) {sorted(bad)} in mix; known: {', '.join(KINDS)}")
        w = [float(mix.get(k, 0.0)) for k in KINDS]
        if min(w) < 0 or sum(w) <= 0:
            raise ValueError(f"mix weights must be >= 0 with a positive sum, got {mix}")
        self.cum = np.cumsum(w).tolist()
        wns = [0.0 if k == "SAVE" else x for k, x in zip(KINDS, w)]
        self.cum_nosave = np.cumsum(wns).tolist() if sum(wns) > 0 else None
        self.gens = (self._load, self._save_bundle, self._conv, self._alu, self._elew)
        # target constants
        self.pp, self.cp, self.alu_pp, self.D = t.pp, t.cp, t.alu_pp, t.bank_depth
        self.img_bg, self.nimg = t.img_bg, t.num_img_banks
        self.convw, self.dwconvw, self.bias = t.convw_base, t.dwconvw_bank, t.bias_bank
        self.conv_acts, self.alu_acts, self.argmax = t.conv_nonlinear, t.alu_nonlinear, t.argmax
        self.conv_so_max = max(1, min(4, t.conv_stride_out_h_max))
        self.alu_so_max = max(1, min(4, t.alu_stride_out_h_max))
        self.hot = min(self.D, 512)          # most image accesses fall in the first 512 lines: many conflicts
        self.phot = min(self.D, 256)
        # program so far
        self.ops: list[str] = []
        self.fl: list[dict] = []
        # dpdon/dpdby; footprints compared in chunks of 16 lines and 64 DDR bytes (many conflicts)
        self.tok = TokenPlanner(t, line_chunk=min(16, self.D), ddr_chunk=64)
        self.conv: tuple[dict, int] | None = None     # (CONVINIT fields, longest CONV length it allows)
        self.alu: tuple[dict, int] | None = None      # (ALUINIT fields, largest kernel_d)

    # ---- main loop -------------------------------------------------------------------------------
    def run(self, n: int) -> None:
        r = self.r
        tries = 0
        while len(self.ops) < n and tries < 8 * n + 100:
            tries += 1
            k = bisect.bisect_right(self.cum, r() * self.cum[-1])
            k = min(k, len(KINDS) - 1)
            if k == 1 and self.save_pairs and n - len(self.ops) >= 2 and r() < P_PAIR:
                self._pair(n)
                continue
            b = self.gens[k]()
            if b is not None:
                self._commit(b)
        self._final_save()
        self.ops.append("END")
        self.fl.append({})
        self.tok.add("END", wait=False)          # dpdon = dpdby = SAVE only (spec §5.2)

    def _commit(self, bundle) -> None:
        for op, eng, f, R, W, meta in bundle:
            self._issue(op, f, (R, W))
            if op == "CONVINIT":
                self.conv = (f, meta)
            elif op == "ALUINIT":
                self.alu = (f, meta)

    # ---- tokens and footprints -------------------------------------------------------------------
    def _issue(self, op, f, keys, pair=None, waits=True) -> int:
        """Append one instruction; it waits on every engine it conflicts with (isa.deps.TokenPlanner)."""
        self.ops.append(op)
        self.fl.append(f)
        tok = self.tok
        i = tok.add(op, keys=keys, wait=waits, pair=pair).index
        if waits and self.r() < P_EXTRA:          # an extra dependency, for varied token traffic
            eng = ENGINE[op]
            P = (eng + 1 + int(self.r() * 3)) & 3
            x = tok.last(P)
            if x >= 0 and not tok.dpdby[x] & BIT[eng] and not (P == Engine.SAVE and tok.pair_open):
                tok.order_after(P, i)
        return i

    def _keys(self, op: str, f: dict, state: InitState | None = None) -> tuple[set, set]:
        """(read keys, write keys) of an instruction's footprint (isa.footprint) in the planner's chunks."""
        return self.tok.keys(footprint_of(op, f, state or _NO_STATE, self.t))

    # ---- random values -----------------------------------------------------------------------------
    def _img_bank(self) -> int:
        """An image bank id: uniform, or (bank_conflicts) mostly one of two hot banks of group 0."""
        r = self.r
        if not self.crowd:
            return int(r() * self.nimg)
        x = r()
        if x < 0.7:
            return int(r() * 2)
        if x < 0.95:
            return int(r() * self.pp)
        return int(r() * self.nimg)

    def _img_group(self) -> int:
        """An image bank group: uniform, or (bank_conflicts) mostly group 0."""
        r = self.r
        if self.crowd and r() < 0.9:
            return 0
        return int(r() * self.img_bg)

    def _addr(self, bits: int) -> int:
        """An image line address: mostly in a small hot window, sometimes wrapping past the last line
        (bank_conflicts: anywhere in the bank)."""
        r = self.r
        if self.crowd:
            return int(r() * self.D) & ((1 << bits) - 1)
        x = r()
        if x < 0.9:
            return int(r() * self.hot)
        if x < 0.97:
            return (self.D - 1 - int(r() * 48)) & ((1 << bits) - 1)
        return int(r() * (1 << bits))

    def _paddr(self, bits: int) -> int:
        """A parameter-bank line address."""
        r = self.r
        x = r()
        if x < 0.93:
            return int(r() * self.phot)
        if x < 0.98:
            return (self.D - 1 - int(r() * 16)) & ((1 << bits) - 1)
        return int(r() * (1 << bits))

    def _in_bases(self, b0: int, ns: int, sh: int, jre: int, bits: int) -> list[int]:
        """Pass addresses bank_addr_in, _1, _2, _3 (compiler layout A0 + k*stride*E, or independent)."""
        r = self.r
        mask = (1 << bits) - 1
        npass = (b0 + ns - 1) // self.pp + 1
        if r() < 0.75:
            a0 = self._addr(bits)
            bases = [(a0 + k * sh * jre) & mask for k in range(4)]
        else:
            bases = [self._addr(bits) for _ in range(4)]
        for k in range(npass, 4):
            bases[k] = int(r() * (mask + 1))   # unused pass: any value
        return bases

    def _pads(self, kh: int, kw: int, lr_max: int, rb_max: int) -> tuple[int, int, int, int]:
        """(pad_top, pad_left, pad_bottom, pad_right); bottom/right are last-valid indices (spec §6.4)."""
        r = self.r
        if r() < 0.03:
            return int(r() * 16), int(r() * 16), int(r() * (rb_max + 1)), int(r() * (rb_max + 1))
        pt = int(r() * kh) if r() < 0.4 else 0
        pl = int(r() * kw) if r() < 0.4 else 0
        pb = kh - 1 - (int(r() * kh) if r() < 0.3 else 0)
        pr = kw - 1 - (int(r() * kw) if r() < 0.3 else 0)
        return min(pt, lr_max), min(pl, lr_max), min(pb, rb_max), min(pr, rb_max)

    def _place_out(self, op: str, f: dict, st: InitState, gi: int, bits: int) -> set | None:
        """Pick bank_id_out / bank_addr_out of a CONV or ALU (up to 4 tries) so that it never writes a line
        its unpadded input reads (a superset of what the padded instruction reads). Returns the write keys,
        or None if every try overlaps."""
        r = self.r
        pp = self.pp
        space = self.tok.space
        R = None
        for attempt in range(4):
            go = self._img_group() if attempt < 2 else (gi + 1) % self.img_bg
            f["bank_id_out"] = go * pp + int(r() * pp)
            f["bank_addr_out"] = self._addr(bits)
            fp = footprint_of(op, f, st, self.t)
            if R is None:
                R = space.keys(fp.reads)
            W = space.keys(fp.writes)
            if R.isdisjoint(W):
                return W
        return None

    # ---- LOAD --------------------------------------------------------------------------------------
    def _load(self):
        r = self.r
        W = self.cp
        if r() < (0.9 if self.crowd else 0.6):         # image bank
            bank = self._img_bank()
            ba = self._addr(12)
            x = r()
            reg = REG_INPUT if x < 0.6 else (REG_WORK if x < 0.9 else REG_CONST)
        else:                                           # parameter banks
            x = r()
            if x < 0.6:
                bank = self.convw + int(r() * self.cp)
            elif x < 0.8:
                bank = self.dwconvw
            else:
                bank = self.bias
            ba = self._paddr(12)
            reg = REG_CONST if r() < 0.9 else REG_INPUT
        ch = 1 + int(r() * CGMAX * W)
        nl = (ch + W - 1) // W
        cw = nl * W
        length = 1 + int(r() * LMAX)
        jw = nl + (int(r() * 3) if r() < 0.3 else 0)        # >= lines per item: items never overlap
        pad_start = pad_end = 0
        pad_idx = 1
        if ch <= 64 and r() < 0.25:                     # jump_read <= channel <= 64: augmentation (§6.2)
            jr = 1 + int(r() * ch)
            if r() < 0.7:
                pad_start = int(r() * min(ch, 32))
                pad_idx = 1 + int(r() * min(32, (cw - 1) // jr + 1))
                pad_end = int(r() * min(32, cw - jr * (pad_idx - 1)))
        else:
            jr = ch + (1 + int(r() * 8) if r() < 0.3 else 0)
            if (jr > ch or ch > 64) and r() < 0.2:      # pad fields are ignored without augmentation
                pad_start, pad_end, pad_idx = int(r() * 32), int(r() * 32), 1 + int(r() * 32)
        bcast = 0
        x = r()
        if x < 0.06:
            bcast = 7                                    # constant fill
        elif x < 0.09:
            bcast = (8 + int(r() * 8)) if r() < 0.5 else int(r() * 7)   # no effect on ISA1
        f = dict(bank_addr=ba, bank_id=bank, jump_write=jw, jump_read=jr, length=length, channel=ch,
                 pad_idx=pad_idx, reg_id=reg, const_value=0, broadcast=0, mode_avg=0,
                 pad_end=pad_end, pad_start=pad_start, ddr_addr=0)
        # DDR extent of the unmasked bytes (the items' addressing, also for a constant fill)
        ext = max((b.start + (b.blocks - 1) * b.step + b.width
                   for b in footprint_of("LOAD", f, _NO_STATE, self.t).reads.ddr), default=0)
        size = REG_SIZES[reg]
        if jr <= ch <= 64 and ext < (length - 1) * jr + ch and r() < 0.3:
            addr = size - ext                            # masked bytes run past the register (spec §2.6)
        else:
            addr = int(r() * (size - ext + 1))
        f.update(const_value=int(r() * 256), broadcast=bcast, ddr_addr=addr)
        R, Wk = self._keys("LOAD", f)
        return [("LOAD", Engine.LOAD, f, R, Wk, None)]

    # ---- SAVE --------------------------------------------------------------------------------------
    def _save(self, avoid_bank: int = -1):
        """One SAVE: (fields, read keys, write keys, (reg, first byte, end byte) it writes)."""
        r = self.r
        W = self.cp
        bank = self._img_bank()
        if bank == avoid_bank:
            bank = (bank + 1 + int(r() * (self.nimg - 1))) % self.nimg
        const_en = 1 if r() < 0.05 else 0
        am = 0
        x = r()
        if self.argmax and x < 0.1:
            am = 2 | int(r() * 2)                       # argmax index / value (channel <= 128 here)
        elif x < 0.13:
            am = 1                                       # bit 1 clear: plain save
        ch = 1 + int(r() * CGMAX * W)
        nl = (ch + W - 1) // W
        length = 1 + int(r() * LMAX)
        jr = nl if r() < 0.7 else 1 + int(r() * (nl + 3))
        ib = 1 if (am & 2 and not const_en) else ch       # bytes written per item
        jw = ib + (1 + int(r() * 16) if r() < 0.3 else 0)
        reg = REG_WORK if r() < 0.5 else REG_OUT
        span = (length - 1) * jw + ch                    # the executor's range check uses channel
        addr = int(r() * (REG_SIZES[reg] - span + 1))
        ba = self._addr(12)
        f = dict(bank_addr=ba, bank_id=bank, jump_read=jr, jump_write=jw, argmax=am, hp_id=int(r() * 2),
                 length=length, channel=ch, reg_id=reg, const_value=int(r() * 256), const_en=const_en,
                 ddr_addr=addr)
        fp = footprint_of("SAVE", f, _NO_STATE, self.t)
        (_, lo, count, step, width), = fp.writes.ddr             # one strided run
        R, Wk = self.tok.keys(fp)
        return f, R, Wk, (reg, lo, lo + (count - 1) * step + width)

    def _save_bundle(self):
        f, R, W, _ = self._save()
        return [("SAVE", Engine.SAVE, f, R, W, None)]

    def _pair(self, n: int) -> None:
        """SAVE pair (spec §5.2): s1 hp_id 0 waits for both, dpdby 0000; s2 hp_id 1, 1-4 instructions
        later, dpdon 0000, signals for both. Instructions in between touch nothing either SAVE touches."""
        f1, R1, W1, iv1 = self._save()
        for _ in range(4):
            f2, R2, W2, iv2 = self._save(avoid_bank=f1["bank_id"])
            if iv1[0] != iv2[0] or iv1[2] <= iv2[1] or iv2[2] <= iv1[1]:
                break
        else:
            self._commit([("SAVE", Engine.SAVE, f1, R1, W1, None)])
            return
        f1["hp_id"], f2["hp_id"] = 0, 1
        # s1 waits on behalf of both; pending[SAVE] gets the union, so later conflicts with either SAVE
        # (and any with s2 by the instructions in between) are seen.
        self._issue("SAVE", f1, (R1 | R2, W1 | W2), pair=0)
        k = int(self.r() * 4)
        cnt = tries = 0
        while cnt < k and tries < 2 * k + 2 and self.cum_nosave is not None:
            tries += 1
            j = min(bisect.bisect_right(self.cum_nosave, self.r() * self.cum_nosave[-1]), len(KINDS) - 1)
            b = self.gens[j]()
            if b is None or len(b) > k - cnt:
                continue
            _, eng, _, Rb, Wb, _ = b[-1]
            if self.tok.conflict(Engine.SAVE, eng, Rb, Wb):
                continue
            self._commit(b)
            cnt += len(b)
        self._issue("SAVE", f2, (R2, W2), pair=1, waits=False)   # TokenError if s2 needed a wait

    def _final_save(self) -> None:
        """Last SAVE: waits on every engine with work not yet ordered before it, so all of it precedes END."""
        f, R, W, _ = self._save()
        i = self._issue("SAVE", f, (R, W))
        self.tok.order_after_all(i)

    # ---- CONV --------------------------------------------------------------------------------------
    def _convinit(self):
        r = self.r
        pp = self.pp
        kh = 1 + int(r() * (5 if r() < 0.95 else 7))
        kw = 1 + int(r() * (5 if r() < 0.95 else 7))
        sh = 1 + int(r() * 2) if r() < 0.95 else 3
        sw = 1 + int(r() * 2) if r() < 0.95 else 3
        soi = int(r() * sh)
        vpp = 1 + int(r() * pp)
        while (soi + (vpp - 1) * sh + kh - 1) // sh + 1 > 4 * pp:   # pass check with bank offset 0
            if vpp > 1:
                vpp -= 1
            else:
                kh -= 1
        so = 1 + int(r() * 2) if r() < 0.9 else 1 + int(r() * self.conv_so_max)
        so = min(so, self.conv_so_max)
        soo = int(r() * so) if r() < 0.3 else 0
        jw = 1 + (r() < 0.3)
        lmax = 1 + int(r() * LMAX)
        jwe = (lmax - 1) * jw + 1 + int(r() * 8)       # sub-rows never overlap
        if 2 * so * jwe >= self.D:                       # keep one CONV's output rows apart in a small bank
            so, soo = 1, 0
        sc = 4 + int(r() * 12) if r() < 0.9 else int(r() * 64)
        f = dict(jump_read=1 + int(r() * 3), shift_cut=sc,
                 act_type=self.conv_acts[int(r() * len(self.conv_acts))],
                 jump_read_endl=1 + int(r() * 96), shift_bias=int(r() * 21), stride_out=so, jump_write=jw,
                 stride_offset_in=soi, valid_pixel_parallel=vpp, kernel_h=kh, stride_h=sh,
                 jump_write_endl=jwe, stride_offset_out=soo, kernel_w=kw, stride_w=sw)
        return f, lmax

    def _conv(self):
        r = self.r
        pp = self.pp
        bundle = []
        if self.conv is None or r() < P_REINIT:
            cf, lmax = self._convinit()
            bundle.append(("CONVINIT", Engine.CONV, cf, _EMPTY, _EMPTY, lmax))
        else:
            cf, lmax = self.conv
        kh, kw, sh = cf["kernel_h"], cf["kernel_w"], cf["stride_h"]
        soi, vpp, jre = cf["stride_offset_in"], cf["valid_pixel_parallel"], cf["jump_read_endl"]
        cg = 1 + int(r() * CGMAX)
        length = 1 + int(r() * lmax)
        rows_in = (vpp - 1) * sh + kh
        ns = (soi + rows_in - 1) // sh + 1
        b0 = int(r() * (min(pp - 1, 4 * pp - ns) + 1))
        gi = self._img_group()
        bases = self._in_bases(b0, ns, sh, jre, 12)
        baw, bab = self._paddr(12), self._paddr(12)
        f = dict(bank_addr_in=bases[0], pad_top=0, pad_left=0, bank_addr_out=0, pad_bottom=kh - 1,
                 pad_right=kw - 1, channel_group=cg, bank_addr_weights=baw, bank_id_in=gi * pp + b0,
                 length=length, bank_addr_bias=bab, bank_id_out=0, bank_addr_in_1=bases[1],
                 bank_addr_in_2=bases[2], bank_addr_in_3=bases[3], channel_offset=0)
        st = InitState(conv=cf)
        Wk = self._place_out("CONV", f, st, gi, 12)
        if Wk is None:
            return None
        pt, pl, pb, prt = self._pads(kh, kw, 15, 15)
        co = int(r() * min(32, cg * self.cp)) if r() < 0.2 else 0
        f.update(pad_top=pt, pad_left=pl, pad_bottom=pb, pad_right=prt, channel_offset=co)
        R = self.tok.space.keys(footprint_of("CONV", f, st, self.t).reads)    # the writes do not change
        bundle.append(("CONV", Engine.CONV, f, R, Wk, None))
        return bundle

    # ---- ALU ---------------------------------------------------------------------------------------
    def _aluinit(self):
        r = self.r
        mode = _ALU_MODES[min(bisect.bisect_right(_ALU_MODE_CUM, r() * _ALU_MODE_CUM[-1]), 8)]
        if mode in (1, 4, 7):                            # 1x1, stride 1 (spec §6.8)
            kh = kw = sh = sw = 1
        else:
            kh, kw = 1 + int(r() * 5), 1 + int(r() * 5)
            sh, sw = 1 + int(r() * 2), 1 + int(r() * 2)
        soi = int(r() * sh)
        while (soi + (self.alu_pp - 1) * sh + kh - 1) // sh + 1 > 4 * self.pp:
            kh -= 1
        length = 1 + int(r() * LMAX)
        cg = 1 + int(r() * CGMAX)
        kdmax = 2 if (mode in (0, 6, 8) and r() < 0.15) else 1
        so = 1 + int(r() * 2) if r() < 0.9 else 1 + int(r() * self.alu_so_max)
        so = min(so, self.alu_so_max)
        soo = int(r() * so) if r() < 0.3 else 0
        jw = cg + (r() < 0.3)                            # a pixel is cg lines: columns never overlap
        jwe = (length - 1) * jw + cg + int(r() * 8)
        if 2 * so * jwe >= self.D:
            so, soo = 1, 0
        jr = cg * kdmax if r() < 0.7 else 1 + int(r() * (cg * kdmax + 1))
        jrw = cg * kdmax * (2 if mode == 8 else 1) if r() < 0.8 else int(r() * 64)
        if mode in (2, 3, 5):
            x = r()
            sc = 0 if x < 0.5 else (int(r() * 8) if x < 0.75 else 8 + int(r() * 8))
        elif mode == 7:
            sc = 6 + int(r() * 12)
        else:
            sc = int(r() * 16) if r() < 0.9 else int(r() * 64)
        spp = (int(r() * 8) + (32 if r() < 0.5 else 0)) if r() < 0.9 else int(r() * 64)
        spn = (int(r() * 8) + (32 if r() < 0.5 else 0)) if r() < 0.9 else int(r() * 64)
        f = dict(kernel_w=kw, kernel_h=kh, exec_mode=mode, stride_offset_out=soo, stride_offset_in=soi,
                 stride_w=sw, stride_h=sh, length=length,
                 channel_offset=int(r() * min(32, cg * self.cp)) if r() < 0.15 else 0,
                 channel_group=cg, stride_out=so, shift_prelu_n=spn, shift_cut=sc,
                 shift_bias=int(r() * (8 if mode == 7 else 21)),
                 act_type=self.alu_acts[int(r() * len(self.alu_acts))], shift_prelu_p=spp,
                 jump_read_endl=1 + int(r() * 96), jump_read=jr,
                 multi_factor=1 + int(r() * 127) if r() < 0.95 else int(r() * 256),
                 jump_write_endl=jwe, jump_write=jw, jump_read_weights=jrw)
        return f, kdmax

    def _alu(self):
        r = self.r
        pp = self.pp
        bundle = []
        if self.alu is None or r() < P_REINIT:
            af, kdmax = self._aluinit()
            bundle.append(("ALUINIT", Engine.MISC, af, _EMPTY, _EMPTY, kdmax))
        else:
            af, kdmax = self.alu
        mode = af["exec_mode"]
        kh, kw, sh, soi = af["kernel_h"], af["kernel_w"], af["stride_h"], af["stride_offset_in"]
        vpp = 1 + int(r() * self.alu_pp)
        kd = 1 + int(r() * kdmax) if mode in (0, 6, 8) else 1
        rows_in = (vpp - 1) * sh + kh
        ns = (soi + rows_in - 1) // sh + 1
        b0 = int(r() * (min(pp - 1, 4 * pp - ns) + 1))
        gi = self._img_group()
        bases = self._in_bases(b0, ns, sh, af["jump_read_endl"], 14)
        baw, bab = self._paddr(14), self._paddr(14)
        f = dict(bank_addr_out=0, bank_id_out=0, bank_addr_in=bases[0], bank_id_in=gi * pp + b0,
                 valid_pixel_parallel=vpp, pad_bottom=kh - 1, bank_addr_in_1=bases[1], pad_right=kw - 1,
                 pad_left=0, pad_top=0, bank_addr_in_2=bases[2], bank_addr_weights=baw, kernel_d=kd,
                 bank_addr_in_3=bases[3], bank_addr_bias=bab)
        st = InitState(alu=af)
        Wk = self._place_out("ALU", f, st, gi, 14)
        if Wk is None:
            return None
        pt, pl, pb, prt = self._pads(kh, kw, 15, 255)
        f.update(pad_top=pt, pad_left=pl, pad_bottom=pb, pad_right=prt)
        R = self.tok.space.keys(footprint_of("ALU", f, st, self.t).reads)     # the writes do not change
        bundle.append(("ALU", Engine.MISC, f, R, Wk, None))
        return bundle

    # ---- ELEW --------------------------------------------------------------------------------------
    def _elew(self):
        r = self.r
        pp = self.pp
        mult = r() < 0.25
        x = r()
        num = 2 if mult else (1 if x < 0.4 else (2 if x < 0.9 else 3 + int(r() * 2)))
        vpp = 1 + int(r() * self.alu_pp)
        cg = 1 + int(r() * CGMAX)
        length = 1 + int(r() * LMAX)
        bundle = []
        st = InitState()
        for k in range(num):
            share = 1 if r() < 0.1 else 0
            bidi = self._img_bank()
            jb = 1 if r() < 0.8 else 1 + int(r() * (pp // vpp))      # jump_bank * vpp <= PP
            jr = cg if r() < 0.8 else int(r() * (cg + 3))             # 0 = column broadcast
            jre = 1 + int(r() * 64)
            bai = self._addr(14)
            f = dict(share_pp=share, bank_id_in=bidi, bank_addr_in=bai, jump_read_endl=jre, id=k,
                     jump_bank=jb, jump_read=jr, shift_read=int(r() * 3) if r() < 0.8 else int(r() * 16))
            bundle.append(("ELEWINIT", Engine.MISC, f, _EMPTY, _EMPTY, None))
            st.update("ELEWINIT", f)
        jw = cg + (int(r() * 3) if r() < 0.3 else 0)
        jwe = 1 + int(r() * 64)
        f = dict(length=length, act_type=0, elew_type=int(mult), bank_id_out=0, bank_addr_out=0,
                 jump_write_endl=jwe, num=num, valid_pixel_parallel=vpp, jump_write=jw, shift_write=0,
                 channel_group=cg)
        R = None
        for attempt in range(4):
            f.update(bank_id_out=self._img_bank(), bank_addr_out=self._addr(14))
            Rk, Wk = self._keys("ELEW", f, st)
            R = Rk if R is None else R
            if R.isdisjoint(Wk):                         # never read and write the same lines
                break
        else:
            return None
        x = r()
        sw = int(r() * 3) if x < 0.5 else (16 + int(r() * 3) if x < 0.9 else int(r() * 32))
        f.update(act_type=int(r() * 2), shift_write=sw)  # the footprint does not depend on these two
        bundle.append(("ELEW", Engine.MISC, f, R, Wk, None))
        return bundle


# ---- deliberately broken programs -------------------------------------------------------------------
def _template(prog: GeneratedProgram, eng: int, rng: random.Random) -> Instruction:
    """A state-free instruction of engine `eng` (LOAD, SAVE, CONVINIT, ALUINIT) legal anywhere."""
    ok = {Engine.LOAD: ("LOAD",), Engine.SAVE: ("SAVE",), Engine.CONV: ("CONVINIT",),
          Engine.MISC: ("ALUINIT",)}[Engine(eng)]
    cands = [ins for ins in prog.instructions if ins.op in ok]
    if cands:
        return _copy(cands[int(rng.random() * len(cands))])
    op = ok[0]
    f = {fd.name: fd.lo for fd in FIELDS[op]}
    if op == "LOAD":
        f["reg_id"] = REG_INPUT
    elif op == "SAVE":
        f["reg_id"] = REG_OUT
    return Instruction(op, 0, 0, f)


def _copy(ins: Instruction) -> Instruction:
    return Instruction(ins.op, ins.dpdon, ins.dpdby, dict(ins.fields))


def break_tokens(prog: GeneratedProgram, kind: str, seed: int = 0) -> list[Instruction]:
    """A copy of prog's instructions whose tokens must deadlock on in-order engines (spec §5.2).

    "starve": one wait can never get its signal (a signal removed, or a wait added, on a pair whose
    signals do not exceed its waits). "cycle": before END, an instruction a of engine X waits on (Y, X);
    then b of engine Y waits on (X, Y), whose signal comes from a (or from a later X instruction), and b
    sends the (Y, X) signal a needs. Only engine pairs without spare tokens are used, so the deadlock is
    certain (ValueError if there is none).
    """
    if kind not in BREAK_KINDS:
        raise ValueError(f"unknown break kind {kind!r}; known: {', '.join(BREAK_KINDS)}")
    rng = random.Random(seed)
    out = [_copy(i) for i in prog.instructions]
    if not out or out[-1].op != "END":
        raise ValueError("program must end with END")
    sig, wai = token_counts(out)
    if kind == "starve":
        remove, add = [], []          # (instruction, other engine)
        for i, ins in enumerate(out[:-1]):
            e = ENGINE[ins.op]
            for x in range(4):
                if x == e:
                    continue
                if ins.dpdby >> x & 1 and sig[e][x] <= wai[e][x]:
                    remove.append((i, x))
                if not ins.dpdon >> x & 1 and sig[x][e] <= wai[x][e]:
                    add.append((i, x))
        if remove and (not add or rng.random() < 0.5):
            i, x = remove[int(rng.random() * len(remove))]
            out[i].dpdby &= ~BIT[x]
        elif add:
            i, x = add[int(rng.random() * len(add))]
            out[i].dpdon |= BIT[x]
        else:
            raise ValueError("no wait can be starved in this program")
        return out
    pairs = [(x, y) for x in range(4) for y in range(4)
             if x != y and sig[y][x] <= wai[y][x] and sig[x][y] <= wai[x][y]]
    if not pairs:
        raise ValueError("every engine pair has spare tokens; a cycle cannot be made certain")
    x, y = pairs[int(rng.random() * len(pairs))]
    a, b = _template(prog, x, rng), _template(prog, y, rng)
    a.dpdon = b.dpdon = b.dpdby = BIT[x] | BIT[y]
    if rng.random() < 0.5:           # a itself signals b
        a.dpdby = BIT[x] | BIT[y]
        out[-1:-1] = [a, b]
    else:                            # a later X instruction c signals b; c cannot start before a
        c = _template(prog, x, rng)
        a.dpdby = BIT[x]
        c.dpdon, c.dpdby = BIT[x], BIT[x] | BIT[y]
        out[-1:-1] = [a, c, b]
    return out
