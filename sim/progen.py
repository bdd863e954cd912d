"""Random *valid* ISA1 programs for verification (executor fuzzing now, cycle model and RTL later).

`random_program` emits programs that are field-legal, accepted by `sim.executor.DpuMachine`, keep every
LOAD/SAVE inside its DDR register, and carry dpdon/dpdby tokens (spec §5.2) that are
* deadlock-free: the k-th wait on every engine pair (P, C) has its k-th signal earlier in program order,
  and signals = waits at END;
* race-free: every cross-engine conflict (write/write or read/write on the same bank lines or DDR bytes)
  is ordered by a token chain, so any schedule of the four in-order engines that honours the tokens
  gives the program-order result.
`break_tokens` derives programs that must deadlock ("starve", "cycle").

Footprints are coarse and conservative: bank lines in chunks of 16 lines per bank (the OCP CONVW banks
share one line space, since CONV reads all of them at the same lines), DDR bytes of the workspace
register in chunks of 64 bytes. Tokens are placed as in TVM VTA: an instruction that conflicts with
work an engine issued since the last synchronisation waits on that engine's latest instruction.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from opendpu.isa.fields import BY_NAME, CONV_ENGINE, FIELDS, LOAD_ENGINE, MISC_ENGINE, SAVE_ENGINE
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

BIT = (1, 2, 4, 8)                  # dpdon/dpdby bit of each engine (spec §4.1)
ENGINE = {o: BY_NAME[o].engine for o in BY_NAME}
LMAX = 32                           # longest tile (items / output columns)
CGMAX = 3                           # largest channel_group
P_REINIT = 0.15                     # chance of a fresh CONVINIT / ALUINIT before a CONV / ALU
P_EXTRA = 0.08                      # chance of an extra (not needed) cross-engine dependency
P_PAIR = 0.35                       # chance that a SAVE becomes an hp_id 0/1 SAVE pair
_EMPTY: frozenset = frozenset()
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
                   mix: dict[str, float] | None = None) -> GeneratedProgram:
    """About `n` random instructions, then a final SAVE ordered after all other work, then END.

    `mix` weights the kinds in KINDS (missing kinds get weight 0; INITs come with their CONV/ALU/ELEW);
    `save_pairs` allows hp_id 0/1 SAVE pairs (spec §5.2). Deterministic for a given seed.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    g = _Gen(target, seed, save_pairs, mix)
    g.run(n)
    instrs = [Instruction(op, on, by, f) for op, on, by, f in zip(g.ops, g.on, g.by, g.fl)]
    init = {reg: np.frombuffer(g.rng.randbytes(REG_SIZES[reg]), np.int8).copy()
            for reg in (REG_CONST, REG_INPUT, REG_WORK)}
    return GeneratedProgram(target, instrs, dict(REG_SIZES), init)


class _Gen:
    """Generator state: the program so far, INIT state, and per engine pair the unsynchronised footprints."""

    def __init__(self, t: Target, seed: int, save_pairs: bool, mix: dict[str, float] | None):
        self.t = t
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
        chunk = min(16, self.D)
        self.csh = chunk.bit_length() - 1
        self.nch = self.D // chunk
        self.vb_convw, self.vb_dw, self.vb_bias = self.nimg, self.nimg + 1, self.nimg + 2
        self.dbase = (self.nimg + 3) * self.nch
        self.hot = min(self.D, 512)          # most image accesses fall in the first 512 lines: many conflicts
        self.phot = min(self.D, 256)
        # program so far
        self.ops: list[str] = []
        self.on: list[int] = []
        self.by: list[int] = []
        self.fl: list[dict] = []
        self.last = [-1, -1, -1, -1]
        # pending[P][C]: read / write keys of P instructions not yet ordered before C's next instruction
        self.pr = [[set() for _ in range(4)] for _ in range(4)]
        self.pw = [[set() for _ in range(4)] for _ in range(4)]
        self.pany = [[False] * 4 for _ in range(4)]
        self.conv = None          # (CONVINIT fields, longest CONV length it allows)
        self.alu = None           # (ALUINIT fields, largest kernel_d)
        self.open_pair = False    # between the two SAVEs of a pair: nothing may wait on SAVE

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
        self.on.append(BIT[SAVE_ENGINE])
        self.by.append(BIT[SAVE_ENGINE])
        self.fl.append({})

    def _commit(self, bundle) -> None:
        for op, eng, f, R, W, meta in bundle:
            self._issue(op, eng, f, R, W)
            if op == "CONVINIT":
                self.conv = (f, meta)
            elif op == "ALUINIT":
                self.alu = (f, meta)

    # ---- tokens ----------------------------------------------------------------------------------
    def _conflict(self, P: int, C: int, R, W) -> bool:
        """Does a new C instruction with footprint (R, W) conflict with P's unsynchronised work?"""
        pw = self.pw[P][C]
        if W and (not W.isdisjoint(pw) or not W.isdisjoint(self.pr[P][C])):
            return True
        return bool(R) and not R.isdisjoint(pw)

    def _sync(self, P: int, C: int, i: int) -> None:
        """Order instruction i (engine C) after P's latest instruction (VTA-style token)."""
        assert not (P == SAVE_ENGINE and self.open_pair)
        x = self.last[P]
        if not self.by[x] & BIT[C]:
            self.by[x] |= BIT[C]
            self.on[i] |= BIT[P]
        self.pr[P][C] = set()
        self.pw[P][C] = set()
        self.pany[P][C] = False

    def _issue(self, op, eng, f, R, W, on=None, by=None, waits=True) -> int:
        i = len(self.ops)
        self.ops.append(op)
        self.fl.append(f)
        b = BIT[eng]
        self.on.append(b if on is None else on)
        self.by.append(b if by is None else by)
        last = self.last
        if waits:
            if R or W:
                for P in range(4):
                    if P != eng and last[P] >= 0 and self._conflict(P, eng, R, W):
                        self._sync(P, eng, i)
            if self.r() < P_EXTRA:          # an extra dependency, for varied token traffic
                P = (eng + 1 + int(self.r() * 3)) & 3
                x = last[P]
                if x >= 0 and not self.by[x] & b and not (P == SAVE_ENGINE and self.open_pair):
                    self._sync(P, eng, i)
        pr, pw, pany = self.pr[eng], self.pw[eng], self.pany[eng]
        for C in range(4):
            if C != eng:
                if R:
                    pr[C] |= R
                if W:
                    pw[C] |= W
                pany[C] = True
        last[eng] = i
        return i

    # ---- footprints --------------------------------------------------------------------------------
    def _lines(self, keys: set, vb: int, lo: int, hi: int) -> None:
        """Add the chunk keys of lines [lo, hi) (taken modulo DEPTH) of virtual bank vb."""
        c0 = lo >> self.csh
        c1 = (hi - 1) >> self.csh
        nch = self.nch
        base = vb * nch
        if c1 - c0 + 1 >= nch:
            keys.update(range(base, base + nch))
        else:
            m = nch - 1
            for c in range(c0, c1 + 1):
                keys.add(base + (c & m))

    def _ddr(self, keys: set, reg: int, lo: int, hi: int) -> None:
        """Add the keys of DDR bytes [lo, hi) of the workspace (the only register two engines share)."""
        if reg == REG_WORK and hi > lo:
            base = self.dbase
            for c in range(lo >> 6, ((hi - 1) >> 6) + 1):
                keys.add(base + c)

    # ---- random values -----------------------------------------------------------------------------
    def _addr(self, bits: int) -> int:
        """An image line address: mostly in a small hot window, sometimes wrapping past the last line."""
        r = self.r
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

    def _in_keys(self, keys, gb, b0, ns, bases, span) -> None:
        """Rows of a CONV/ALU input: slot s lies in bank gb + s mod PP, pass s // PP (spec §6.4)."""
        pp = self.pp
        for s in range(b0, b0 + ns):
            a = bases[s // pp]
            self._lines(keys, gb + s % pp, a, a + span)

    def _out_keys(self, keys, bank_out, bao, vpp, so, soo, jwe, span) -> None:
        """Output rows placed as in spec §6.4 (stride_out sub-rows, pass offset so*jwe)."""
        pp = self.pp
        gb = bank_out - bank_out % pp
        b0 = bank_out % pp
        for h in range(vpp):
            t = h + soo
            slot = b0 + t // so
            row0 = bao + (slot // pp) * so * jwe + (t % so) * jwe
            self._lines(keys, gb + slot % pp, row0, row0 + span)

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

    # ---- LOAD --------------------------------------------------------------------------------------
    def _load(self):
        r = self.r
        W = self.cp
        if r() < 0.6:                                   # image bank
            bank = int(r() * self.nimg)
            vb = bank
            ba = self._addr(12)
            x = r()
            reg = REG_INPUT if x < 0.6 else (REG_WORK if x < 0.9 else REG_CONST)
        else:                                           # parameter banks
            x = r()
            if x < 0.6:
                bank, vb = self.convw + int(r() * self.cp), self.vb_convw
            elif x < 0.8:
                bank, vb = self.dwconvw, self.vb_dw
            else:
                bank, vb = self.bias, self.vb_bias
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
        ext = (length - 1) * jr + ch                     # DDR extent of the unmasked bytes
        aug = jr <= ch <= 64
        if aug and (pad_start or pad_end):
            ext = 0
            first_end = length - pad_idx
            for it in range(length):
                lo = max(0, pad_start - it * jr)
                hi = ch
                if it >= first_end:
                    hi = min(hi, cw - (pad_end + jr * (it - first_end)))
                if lo < hi:
                    ext = max(ext, it * jr + hi)
        size = REG_SIZES[reg]
        if aug and ext < (length - 1) * jr + ch and r() < 0.3:
            addr = size - ext                            # masked bytes run past the register (spec §2.6)
        else:
            addr = int(r() * (size - ext + 1))
        f = dict(bank_addr=ba, bank_id=bank, jump_write=jw, jump_read=jr, length=length, channel=ch,
                 pad_idx=pad_idx, reg_id=reg, const_value=int(r() * 256), broadcast=bcast, mode_avg=0,
                 pad_end=pad_end, pad_start=pad_start, ddr_addr=addr)
        Wk = set()
        self._lines(Wk, vb, ba, ba + (length - 1) * jw + nl)
        Rk = set()
        if bcast != 7:
            self._ddr(Rk, reg, addr, addr + ext)
        return [("LOAD", LOAD_ENGINE, f, Rk, Wk, None)]

    # ---- SAVE --------------------------------------------------------------------------------------
    def _save(self, avoid_bank: int = -1):
        """One SAVE: (fields, read keys, write keys, (reg, first byte, end byte))."""
        r = self.r
        W = self.cp
        bank = int(r() * self.nimg)
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
        Rk = set()
        if not const_en:
            self._lines(Rk, bank, ba, ba + (length - 1) * jr + nl)
        end = addr + (length - 1) * jw + ib
        Wk = set()
        self._ddr(Wk, reg, addr, end)
        return f, Rk, Wk, (reg, addr, end)

    def _save_bundle(self):
        f, R, W, _ = self._save()
        return [("SAVE", SAVE_ENGINE, f, R, W, None)]

    def _pair(self, n: int) -> None:
        """SAVE pair (spec §5.2): s1 hp_id 0 waits for both, dpdby 0000; s2 hp_id 1, 1-4 instructions
        later, dpdon 0000, signals for both. Instructions in between touch nothing either SAVE touches."""
        f1, R1, W1, iv1 = self._save()
        for _ in range(4):
            f2, R2, W2, iv2 = self._save(avoid_bank=f1["bank_id"])
            if iv1[0] != iv2[0] or iv1[2] <= iv2[1] or iv2[2] <= iv1[1]:
                break
        else:
            self._commit([("SAVE", SAVE_ENGINE, f1, R1, W1, None)])
            return
        f1["hp_id"], f2["hp_id"] = 0, 1
        # s1 waits on behalf of both; pending[SAVE] gets the union, so later conflicts with either SAVE
        # (and any with s2 by the instructions in between) are seen.
        self._issue("SAVE", SAVE_ENGINE, f1, R1 | R2, W1 | W2, on=BIT[SAVE_ENGINE], by=0)
        self.open_pair = True
        k = int(self.r() * 4)
        cnt = tries = 0
        while cnt < k and tries < 2 * k + 2 and self.cum_nosave is not None:
            tries += 1
            j = min(bisect.bisect_right(self.cum_nosave, self.r() * self.cum_nosave[-1]), len(KINDS) - 1)
            b = self.gens[j]()
            if b is None or len(b) > k - cnt:
                continue
            _, eng, _, Rb, Wb, _ = b[-1]
            if self._conflict(SAVE_ENGINE, eng, Rb, Wb):
                continue
            self._commit(b)
            cnt += len(b)
        for P in (LOAD_ENGINE, CONV_ENGINE, MISC_ENGINE):
            assert not self._conflict(P, SAVE_ENGINE, R2, W2), "s2 needs a wait of its own"
        self.open_pair = False
        self._issue("SAVE", SAVE_ENGINE, f2, R2, W2, on=0, by=BIT[SAVE_ENGINE], waits=False)

    def _final_save(self) -> None:
        """Last SAVE: waits on every engine with work not yet ordered before it, so all of it precedes END."""
        f, R, W, _ = self._save()
        i = self._issue("SAVE", SAVE_ENGINE, f, R, W)
        for P in (LOAD_ENGINE, CONV_ENGINE, MISC_ENGINE):
            if self.pany[P][SAVE_ENGINE]:
                self._sync(P, SAVE_ENGINE, i)

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
            bundle.append(("CONVINIT", CONV_ENGINE, cf, _EMPTY, _EMPTY, lmax))
        else:
            cf, lmax = self.conv
        kh, kw, sh, sw = cf["kernel_h"], cf["kernel_w"], cf["stride_h"], cf["stride_w"]
        soi, vpp = cf["stride_offset_in"], cf["valid_pixel_parallel"]
        jr, jre = cf["jump_read"], cf["jump_read_endl"]
        cg = 1 + int(r() * CGMAX)
        length = 1 + int(r() * lmax)
        rows_in = (vpp - 1) * sh + kh
        cols_in = (length - 1) * sw + kw
        ns = (soi + rows_in - 1) // sh + 1
        b0 = int(r() * (min(pp - 1, 4 * pp - ns) + 1))
        gi = int(r() * self.img_bg)
        bases = self._in_bases(b0, ns, sh, jre, 12)
        R = set()
        self._in_keys(R, gi * pp, b0, ns, bases, (sh - 1) * jre + (cols_in - 1) * jr + cg)
        baw, bab = self._paddr(12), self._paddr(12)
        self._lines(R, self.vb_convw, baw, baw + kh * kw * cg)
        self._lines(R, self.vb_bias, bab, bab + 1)
        for attempt in range(4):
            go = int(r() * self.img_bg) if attempt < 2 else (gi + 1) % self.img_bg
            bido = go * pp + int(r() * pp)
            bao = self._addr(12)
            Wk = set()
            self._out_keys(Wk, bido, bao, vpp, cf["stride_out"], cf["stride_offset_out"],
                           cf["jump_write_endl"], (length - 1) * cf["jump_write"] + 1)
            if R.isdisjoint(Wk):                         # never read and write the same lines
                break
        else:
            return None
        pt, pl, pb, prt = self._pads(kh, kw, 15, 15)
        co = int(r() * min(32, cg * self.cp)) if r() < 0.2 else 0
        f = dict(bank_addr_in=bases[0], pad_top=pt, pad_left=pl, bank_addr_out=bao, pad_bottom=pb,
                 pad_right=prt, channel_group=cg, bank_addr_weights=baw, bank_id_in=gi * pp + b0,
                 length=length, bank_addr_bias=bab, bank_id_out=bido, bank_addr_in_1=bases[1],
                 bank_addr_in_2=bases[2], bank_addr_in_3=bases[3], channel_offset=co)
        bundle.append(("CONV", CONV_ENGINE, f, R, Wk, None))
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
            bundle.append(("ALUINIT", MISC_ENGINE, af, _EMPTY, _EMPTY, kdmax))
        else:
            af, kdmax = self.alu
        mode = af["exec_mode"]
        kh, kw, sh, sw = af["kernel_h"], af["kernel_w"], af["stride_h"], af["stride_w"]
        soi, length, cg = af["stride_offset_in"], af["length"], af["channel_group"]
        vpp = 1 + int(r() * self.alu_pp)
        kd = 1 + int(r() * kdmax) if mode in (0, 6, 8) else 1
        rows_in = (vpp - 1) * sh + kh
        cols_in = (length - 1) * sw + kw
        ns = (soi + rows_in - 1) // sh + 1
        b0 = int(r() * (min(pp - 1, 4 * pp - ns) + 1))
        gi = int(r() * self.img_bg)
        jre = af["jump_read_endl"]
        bases = self._in_bases(b0, ns, sh, jre, 14)
        R = set()
        self._in_keys(R, gi * pp, b0, ns, bases, (sh - 1) * jre + (cols_in - 1) * af["jump_read"] + cg * kd)
        baw, bab = self._paddr(14), self._paddr(14)
        jrw = af["jump_read_weights"]
        if mode in (0, 6):
            self._lines(R, self.vb_dw, baw, baw + (kh * kw - 1) * jrw + kd * cg)
        elif mode == 8:
            self._lines(R, self.vb_dw, baw, baw + (kh * kw - 1) * jrw + 2 * kd * cg)
        elif mode == 1:
            self._lines(R, self.vb_dw, baw, baw + cg)
        if mode == 0:
            self._lines(R, self.vb_bias, bab, bab + cg)
        for attempt in range(4):
            go = int(r() * self.img_bg) if attempt < 2 else (gi + 1) % self.img_bg
            bido = go * pp + int(r() * pp)
            bao = self._addr(14)
            Wk = set()
            self._out_keys(Wk, bido, bao, vpp, af["stride_out"], af["stride_offset_out"],
                           af["jump_write_endl"], (length - 1) * af["jump_write"] + cg)
            if R.isdisjoint(Wk):
                break
        else:
            return None
        pt, pl, pb, prt = self._pads(kh, kw, 15, 255)
        f = dict(bank_addr_out=bao, bank_id_out=bido, bank_addr_in=bases[0], bank_id_in=gi * pp + b0,
                 valid_pixel_parallel=vpp, pad_bottom=pb, bank_addr_in_1=bases[1], pad_right=prt,
                 pad_left=pl, pad_top=pt, bank_addr_in_2=bases[2], bank_addr_weights=baw, kernel_d=kd,
                 bank_addr_in_3=bases[3], bank_addr_bias=bab)
        bundle.append(("ALU", MISC_ENGINE, f, R, Wk, None))
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
        R = set()
        bundle = []
        for k in range(num):
            share = 1 if r() < 0.1 else 0
            bidi = int(r() * self.nimg)
            jb = 1 if r() < 0.8 else 1 + int(r() * (pp // vpp))      # jump_bank * vpp <= PP
            jr = cg if r() < 0.8 else int(r() * (cg + 3))             # 0 = column broadcast
            jre = 1 + int(r() * 64)
            bai = self._addr(14)
            gb = bidi - bidi % pp
            span = (length - 1) * jr + cg
            for row in range(1 if share else vpp):
                slot = bidi - gb + row * jb
                lo = bai + (slot // pp) * jre
                self._lines(R, gb + slot % pp, lo, lo + span)
            f = dict(share_pp=share, bank_id_in=bidi, bank_addr_in=bai, jump_read_endl=jre, id=k,
                     jump_bank=jb, jump_read=jr, shift_read=int(r() * 3) if r() < 0.8 else int(r() * 16))
            bundle.append(("ELEWINIT", MISC_ENGINE, f, _EMPTY, _EMPTY, None))
        jw = cg + (int(r() * 3) if r() < 0.3 else 0)
        jwe = 1 + int(r() * 64)
        for attempt in range(4):
            bido = int(r() * self.nimg)
            bao = self._addr(14)
            gb = bido - bido % pp
            Wk = set()
            for row in range(vpp):                       # one row per bank (spec §6.7)
                slot = bido - gb + row
                lo = bao + (slot // pp) * jwe
                self._lines(Wk, gb + slot % pp, lo, lo + (length - 1) * jw + cg)
            if R.isdisjoint(Wk):
                break
        else:
            return None
        x = r()
        sw = int(r() * 3) if x < 0.5 else (16 + int(r() * 3) if x < 0.9 else int(r() * 32))
        f = dict(length=length, act_type=int(r() * 2), elew_type=int(mult), bank_id_out=bido,
                 bank_addr_out=bao, jump_write_endl=jwe, num=num, valid_pixel_parallel=vpp, jump_write=jw,
                 shift_write=sw, channel_group=cg)
        bundle.append(("ELEW", MISC_ENGINE, f, R, Wk, None))
        return bundle


# ---- deliberately broken programs -------------------------------------------------------------------
def _token_counts(instrs: list[Instruction]) -> tuple[list[list[int]], list[list[int]]]:
    """(signals[P][C], waits[P][C]) over the whole program, cross-engine bits only."""
    sig = [[0] * 4 for _ in range(4)]
    wai = [[0] * 4 for _ in range(4)]
    for ins in instrs:
        e = ENGINE[ins.op]
        for x in range(4):
            if x != e:
                if ins.dpdon >> x & 1:
                    wai[x][e] += 1
                if ins.dpdby >> x & 1:
                    sig[e][x] += 1
    return sig, wai


def _template(prog: GeneratedProgram, eng: int, rng: random.Random) -> Instruction:
    """A state-free instruction of engine `eng` (LOAD, SAVE, CONVINIT, ALUINIT) legal anywhere."""
    ok = {LOAD_ENGINE: ("LOAD",), SAVE_ENGINE: ("SAVE",), CONV_ENGINE: ("CONVINIT",),
          MISC_ENGINE: ("ALUINIT",)}[eng]
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
    sig, wai = _token_counts(out)
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
