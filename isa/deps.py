"""Dependency tokens between the four engines (dpdon/dpdby, spec §5.2): bit helpers, the rule that places
them from instruction footprints (isa/footprint.py), and a checker that every conflict is token-ordered.

Token model (spec §5.2): each engine runs its instructions in order; an instruction of engine C with dpdon
bit P waits for one token on (P, C), which an instruction of engine P with dpdby bit C sends when it
completes; the k-th wait on (P, C) is released by the k-th signal. Own-engine bits have no cross-engine
effect. SAVE signals are delivered in completion order of the whole SAVE engine.

`TokenPlanner` places tokens as TVM VTA does: an instruction that conflicts (write/write or read/write on
the same bank lines or DDR bytes) with work an engine P issued since P was last synchronised with this
engine waits on P's latest instruction, and that instruction gets the matching dpdby bit. If P's latest
instruction already signals this engine, an earlier instruction of this engine consumed that signal and
the new one is ordered through it (in-order engine), so no new token is needed. Every wait then has its
signal earlier in program order, and signals equal waits on every pair: the program cannot deadlock.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .fields import BY_NAME, Engine
from .footprint import Access, Footprint
from .program import Instruction, IsaError
from .target import Target

ENGINES = tuple(Engine)
ALL_BITS = 0b1111
_SAVE = int(Engine.SAVE)
_ENGINE_NUM = {op: int(info.engine) for op, info in BY_NAME.items()}


def _clock4(v: list[int]) -> tuple[int, int, int, int]:
    """A vector clock (one entry per engine) as the tuple stored in `hb`."""
    assert len(v) == 4, "a vector clock has one entry per engine (4)"
    return (v[0], v[1], v[2], v[3])


# ---- encoding helpers --------------------------------------------------------------------------------
def bit(engine: int) -> int:
    """The dpdon/dpdby mask bit of an engine (spec §4.1: LOAD bit 0, SAVE 1, CONV 2, MISC 3)."""
    return 1 << int(engine)


def mask(engines: Iterable[int]) -> int:
    """The dpdon/dpdby mask naming `engines`."""
    m = 0
    for e in engines:
        m |= 1 << int(e)
    return m


def engines_of(bits: int) -> tuple[Engine, ...]:
    """The engines named by a dpdon/dpdby mask, in bit order."""
    return tuple(e for e in ENGINES if bits >> e & 1)


def engine_of(op: str) -> Engine:
    """The engine that executes mnemonic `op` (spec §5.1)."""
    return BY_NAME[op].engine


def cross(bits: int, engine: int) -> int:
    """`bits` without the own-engine bit: the part that has a cross-engine effect."""
    return bits & ~(1 << int(engine)) & ALL_BITS


def token_counts(instrs: Sequence[Instruction]) -> tuple[list[list[int]], list[list[int]]]:
    """(signals[P][C], waits[P][C]) over the whole program, cross-engine bits only."""
    sig = [[0] * 4 for _ in range(4)]
    wai = [[0] * 4 for _ in range(4)]
    for ins in instrs:
        e = engine_of(ins.op)
        for x in range(4):
            if x != e:
                if ins.dpdon >> x & 1:
                    wai[x][e] += 1
                if ins.dpdby >> x & 1:
                    sig[e][x] += 1
    return sig, wai


class TokenError(IsaError):
    """A token request the rules forbid: a wait on the SAVE engine while a SAVE pair is open, a second
    SAVE that would need a wait of its own, a pair out of order, or a wait on an engine with no work."""


# ---- footprint keys ----------------------------------------------------------------------------------
class KeySpace:
    """Hashable integer keys of footprints: bank lines in aligned chunks of `line_chunk` lines per bank,
    DDR bytes in aligned chunks of `ddr_chunk` bytes per register. Two footprints share a key iff they
    touch a common chunk, so coarser chunks give fewer keys and more (conservative) conflicts."""

    def __init__(self, target: Target, line_chunk: int = 1, ddr_chunk: int = 1):
        depth = target.bank_depth
        if line_chunk < 1 or depth % line_chunk:
            raise ValueError(f"line_chunk {line_chunk} must be >= 1 and divide the bank depth {depth}")
        if ddr_chunk < 1:
            raise ValueError(f"ddr_chunk must be >= 1, got {ddr_chunk}")
        self.line_chunk, self.ddr_chunk = line_chunk, ddr_chunk
        self.nch = depth // line_chunk
        self._cache: dict[Access, frozenset[int]] = {}        # recent small accesses (progen asks again)

    def keys(self, access: Access) -> set[int]:
        """The keys of every bank line and DDR byte in `access` (bank keys >= 0, DDR keys < 0)."""
        if not access:
            return set()
        k = self._cache.get(access)
        if k is not None:
            return set(k)
        keys = set(self.keys_of([access])[1].tolist())
        if len(keys) <= 1024:                                   # small ones only: the cache stays small
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[access] = frozenset(keys)
        return keys

    def keys_of(self, accesses: Sequence[Access | tuple[()]]) -> tuple[np.ndarray, np.ndarray]:
        """(ptr, keys) of many accesses in one compiled pass (isa/_deps_kernel.py `expand`): access g's keys are
        keys[ptr[g]:ptr[g+1]], a key repeated where two of its runs overlap."""
        from ._deps_kernel import expand
        rows: list[tuple[int, int, int, int, int, int]] = []
        run_ptr = [0]
        for acc in accesses:
            if acc:
                rows.extend((0, *r) for r in acc.lines)
                rows.extend((1, *r) for r in acc.ddr)
            run_ptr.append(len(rows))
        runs = np.array(rows, np.int64).reshape(-1, 6)
        return expand(np.array(run_ptr, np.int64), runs, self.nch, self.line_chunk, self.ddr_chunk)

    def describe(self, key: int) -> str:
        """What a key stands for: `bank B lines a..b` or `REG_r bytes a..b` (the chunk it encodes)."""
        if key >= 0:
            bank, c = divmod(key, self.nch)
            lo = c * self.line_chunk
            return f"bank {bank} line {lo}" if self.line_chunk == 1 else \
                f"bank {bank} lines {lo}..{lo + self.line_chunk - 1}"
        v = -1 - key
        reg, chunk = v >> 40, v & ((1 << 40) - 1)
        lo = chunk * self.ddr_chunk
        return f"REG_{reg} byte {lo}" if self.ddr_chunk == 1 else f"REG_{reg} bytes {lo}..{lo + self.ddr_chunk - 1}"

    def footprint_keys(self, fp: Footprint) -> tuple[set[int], set[int]]:
        """(read keys, write keys) of a footprint."""
        return self.keys(fp.reads), self.keys(fp.writes)


@dataclass(frozen=True)
class DenseKeys:
    """The keys of a stream of instructions (a `KeySpace`'s bank-line and DDR chunks) as dense indices below
    `total`, two segments per instruction: instruction k reads keys[ptr[2k]:ptr[2k+1]] and writes
    keys[ptr[2k+1]:ptr[2k+2]]. What `ExactTokenPlanner.add_dense` and the compiler's prefetch pass read, without a
    Python set per access."""

    ptr: np.ndarray
    keys: np.ndarray
    total: int

    def __len__(self) -> int:
        return (len(self.ptr) - 1) // 2

    def empty(self, k: int) -> bool:
        return self.ptr[2 * k + 2] == self.ptr[2 * k]

    def sets(self, k: int) -> tuple[set[int], set[int]]:
        """Instruction k's (read, write) dense keys as sets (for tests and messages)."""
        p = self.ptr
        return set(self.keys[p[2 * k]:p[2 * k + 1]].tolist()), set(self.keys[p[2 * k + 1]:p[2 * k + 2]].tolist())

    def last_conflict(self, h: int, region: np.ndarray, floor: int, mark: np.ndarray) -> int:
        """1 + the last position p >= floor of `region` (instruction indices) whose instruction conflicts with
        instruction h (h writes what it reads or writes, or reads what it writes), else floor. `mark`: zeroed int8
        scratch of `total` entries, left zeroed."""
        from ._deps_kernel import last_conflict
        return int(last_conflict(self.ptr, self.keys, mark, h, region, floor))

    def permuted(self, order: Sequence[int]) -> "DenseKeys":
        """The keys of instructions order[0], order[1], ..."""
        from ._deps_kernel import permute
        ptr, keys = permute(self.ptr, self.keys, np.asarray(order, np.int64))
        return DenseKeys(ptr, keys, self.total)

    @staticmethod
    def of_footprints(space: KeySpace, fps: Sequence[Footprint | None]) -> "DenseKeys":
        """The keys `space.footprint_keys` gives each footprint (None: no access), made dense."""
        ptr, keys = space.keys_of([acc for fp in fps for acc in ((fp.reads, fp.writes) if fp else ((), ()))])
        return DenseKeys._dense(ptr, keys)

    @staticmethod
    def of_sets(space_keys: Sequence[tuple[set, set]]) -> "DenseKeys":
        """Dense keys of `KeySpace.keys` sets, per instruction (read set, write set)."""
        flat = [s for rw in space_keys for s in rw]
        ptr = np.zeros(len(flat) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, flat), np.int64, len(flat)), out=ptr[1:])
        return DenseKeys._dense(ptr, np.fromiter(itertools.chain.from_iterable(flat), np.int64, int(ptr[-1])))

    @staticmethod
    def _dense(ptr: np.ndarray, a: np.ndarray) -> "DenseKeys":
        """KeySpace keys renumbered densely: bank keys as they are, then each DDR register's chunks."""
        dense = a.copy()
        bank = a >= 0
        total = int(a[bank].max()) + 1 if bank.any() else 0
        if not bank.all():
            enc = -1 - a[~bank]
            reg, ch = enc >> 40, enc & ((1 << 40) - 1)
            d = np.empty_like(enc)
            for r in np.unique(reg).tolist():
                m = reg == r
                d[m] = total + ch[m]
                total += int(ch[m].max()) + 1
            dense[~bank] = d
        return DenseKeys(ptr, dense, total)


# ---- placing tokens ----------------------------------------------------------------------------------
def _check_pair(op: str, pair: int, pair_open: bool, i: int) -> None:
    """The SAVE-pair protocol of both planners: `pair` 0 opens a pair of SAVEs, 1 closes the open one."""
    if op != "SAVE" or pair not in (0, 1):
        raise TokenError(f"pair={pair!r} is for SAVEs (0 = hp_id 0, 1 = hp_id 1)", i)
    if pair == 0 and pair_open:
        raise TokenError("a SAVE pair is already open", i)
    if pair == 1 and not pair_open:
        raise TokenError("second SAVE of a pair without a first", i)


@dataclass(frozen=True)
class Step:
    """What `TokenPlanner.add` decided for one instruction. `dpdby` is its mask so far: later
    instructions that wait on this one add their engine bits (read the final masks from the planner)."""

    index: int
    engine: Engine
    dpdon: int
    dpdby: int
    waits: tuple[int, ...]        # indices of the earlier instructions it waits on (one per cross bit)


class TokenPlanner:
    """Incremental token placement (module docstring): `add` instructions in program order with their
    footprints; `dpdon[i]` / `dpdby[i]` hold the masks. SAVE pairs on the two AXI ports (spec §5.2) are
    `add(..., pair=0)` for the hp_id 0 SAVE (it waits for both: pass the union of the two footprints; its
    dpdby is 0000, so nothing may wait on the SAVE engine until the pair closes) and `pair=1` for the
    hp_id 1 SAVE (dpdon 0000, no waits of its own; dpdby signals for both)."""

    def __init__(self, target: Target, line_chunk: int = 1, ddr_chunk: int = 1):
        self.space = KeySpace(target, line_chunk, ddr_chunk)
        self.dpdon: list[int] = []
        self.dpdby: list[int] = []
        self.engine: list[Engine] = []
        self._last = [-1, -1, -1, -1]
        # pending[P][C]: read / write keys of P's instructions not yet ordered before C's next instruction
        self._pr: list[list[set]] = [[set() for _ in range(4)] for _ in range(4)]
        self._pw: list[list[set]] = [[set() for _ in range(4)] for _ in range(4)]
        self._pany = [[False] * 4 for _ in range(4)]
        self.pair_open = False

    def __len__(self) -> int:
        return len(self.dpdon)

    def keys(self, fp: Footprint) -> tuple[set[int], set[int]]:
        """(read keys, write keys) of a footprint in this planner's key space."""
        return self.space.footprint_keys(fp)

    def last(self, engine: int) -> int:
        """Index of the latest instruction of `engine` (-1: none yet)."""
        return self._last[engine]

    def pending(self, producer: int, consumer: int) -> bool:
        """Has `producer` issued work since it was last ordered before `consumer`'s next instruction?"""
        return self._pany[producer][consumer]

    def conflict(self, producer: int, consumer: int, reads: set, writes: set) -> bool:
        """Would a new `consumer` instruction with these read/write keys conflict with `producer`'s
        unsynchronised work (write/write, read-after-write or write-after-read)?"""
        pw = self._pw[producer][consumer]
        if writes and (not writes.isdisjoint(pw) or not writes.isdisjoint(self._pr[producer][consumer])):
            return True
        return bool(reads) and not reads.isdisjoint(pw)

    def conflicts(self, consumer: int, reads: set, writes: set) -> list[Engine]:
        """The engines a new `consumer` instruction with these keys must wait on."""
        return [ENGINES[P] for P in range(4) if P != consumer and self._last[P] >= 0
                and self.conflict(P, consumer, reads, writes)]

    def order_after(self, producer: int, i: int) -> int | None:
        """Order instruction i after `producer`'s latest instruction x: x gets dpdby bit engine(i) and i
        dpdon bit `producer`, unless x already signals that engine (then i is ordered through the earlier
        waiter). Returns x when a token was placed, else None."""
        producer = int(producer)
        if producer == _SAVE and self.pair_open:
            raise TokenError("nothing may wait on the SAVE engine between the two SAVEs of a pair", i)
        C = int(self.engine[i])
        x = self._last[producer]
        if x < 0:
            raise TokenError(f"no {ENGINES[producer].name} instruction to wait on", i)
        placed = None
        if not self.dpdby[x] & 1 << C:
            self.dpdby[x] |= 1 << C
            self.dpdon[i] |= 1 << producer
            placed = x
        self._pr[producer][C] = set()
        self._pw[producer][C] = set()
        self._pany[producer][C] = False
        return placed

    def order_after_all(self, i: int) -> list[int]:
        """Order instruction i after every engine with unsynchronised work (e.g. the final SAVE, so that
        all work precedes END). Returns the instructions it now waits on."""
        C = int(self.engine[i])
        out = []
        for P in range(4):
            if P != C and self._pany[P][C]:
                x = self.order_after(P, i)
                if x is not None:
                    out.append(x)
        return out

    def add(self, op: str, fp: Footprint | None = None, *, keys: tuple[set, set] | None = None,
            wait: bool = True, pair: int | None = None) -> Step:
        """Append instruction `op` with footprint `fp` (or precomputed `keys` = (read keys, write keys)).
        With `wait` it waits on every engine whose unsynchronised work conflicts with it. `pair` 0 / 1
        marks the first / second SAVE of a pair (class docstring)."""
        e = _ENGINE_NUM[op]
        R, W = keys if keys is not None else (self.keys(fp) if fp is not None else (set(), set()))
        i = len(self.dpdon)
        b = 1 << e
        on, by = b, b
        if pair is not None:
            _check_pair(op, pair, self.pair_open, i)
            if pair == 1:
                need = self.conflicts(e, R, W)
                if need:
                    raise TokenError("the second SAVE of a pair would need a wait of its own (on "
                                     f"{', '.join(P.name for P in need)}); the first SAVE waits for both", i)
                wait = False
            on, by = (b, 0) if pair == 0 else (0, b)
        elif self.pair_open and wait and e != _SAVE and self.conflict(_SAVE, e, R, W):
            raise TokenError(f"{op} conflicts with an open SAVE pair and cannot wait on it", i)
        self.dpdon.append(on)
        self.dpdby.append(by)
        self.engine.append(ENGINES[e])
        waits = []
        if wait and (R or W):
            for P in self.conflicts(e, R, W):
                x = self.order_after(P, i)
                if x is not None:
                    waits.append(x)
        pr, pw, pany = self._pr[e], self._pw[e], self._pany[e]
        for C in range(4):
            if C != e:
                if R:
                    pr[C] |= R
                if W:
                    pw[C] |= W
                pany[C] = True
        self._last[e] = i
        if pair is not None:
            self.pair_open = pair == 0
        return Step(i, ENGINES[e], self.dpdon[i], self.dpdby[i], tuple(waits))


class _KeyState:
    """Per-key state of `ExactTokenPlanner` for one key space, as dense arrays indexed by the key's chunk: `wr[E]`
    the latest write and `rd[E]` the latest read by engine E (-1: none). Older entries are never cleared: an
    access older than the key's latest write was ordered before that write, so waiting on the latest one (the
    planner takes needs latest-first) covers it."""

    def __init__(self) -> None:
        self.wr = np.full((4, 0), -1, np.int64)
        self.rd = np.full((4, 0), -1, np.int64)

    def ensure(self, n: int) -> None:
        m = self.wr.shape[1]
        if n <= m:
            return
        n = max(n, 2 * m, 1024)
        self.wr = np.concatenate([self.wr, np.full((4, n - m), -1, np.int64)], axis=1)
        self.rd = np.concatenate([self.rd, np.full((4, n - m), -1, np.int64)], axis=1)


class ExactTokenPlanner:
    """Token placement on the conflicting instruction itself, not on the producer engine's latest one.

    Same interface as `TokenPlanner` (`add`, `order_after_all`, `keys`, `dpdon`, `dpdby`, `pair_open`), same
    token model (module docstring), so the same checker (`find_races`) applies. For every key the planner keeps
    its last writer and, per engine, its latest reader; a new instruction i of engine C needs, per engine P != C,
    the latest P instruction x it conflicts with (P's last write of a key i reads or writes, P's latest read of
    a key i writes). Happens-before is tracked with vector clocks (`hb[i][E]`: the latest E instruction known
    complete when i starts, as `find_races` derives it): i inherits its engine's previous instruction's clock,
    and a need x <= hb[i][P] is already ordered (through an earlier token of this engine, or transitively through
    another engine's chain), so no token is placed. Otherwise x gets dpdby bit C and i dpdon bit P, and i's clock
    takes x and x's own clock.

    Why FIFO pairing still holds (spec §5.2: the k-th wait on (P, C) is released by the k-th signal): a signal
    on (P, C) is only ever placed together with its wait, so after every step each pair has as many signals as
    waits, and every earlier signal t was consumed by an earlier C instruction, whose clock i inherits:
    hb[i][P] >= t. A new signal goes on x > hb[i][P] >= t, i.e. later in P's order than every earlier signal,
    and its wait is later in C's order than every earlier wait: the queues pair them in order, and no earlier
    waiter can consume x's token.

    SAVE pairs: the first SAVE (hp_id 0) has dpdby 0000, so a need on it is placed on its partner (the hp_id 1
    SAVE, which the cycle model and spec §5.2 deliver only after the whole engine's earlier SAVEs completed).
    """

    def __init__(self, target: Target, line_chunk: int = 1, ddr_chunk: int = 1):
        self.space = KeySpace(target, line_chunk, ddr_chunk)
        self.dpdon: list[int] = []
        self.dpdby: list[int] = []
        self.engine: list[Engine] = []
        self.hb: list[tuple[int, int, int, int]] = []
        self._last = [-1, -1, -1, -1]
        # per key (dense arrays per key space): the latest write and read of each engine
        self._bank = _KeyState()
        self._ddr: dict[int, _KeyState] = {}
        self._partner: dict[int, int] = {}                      # first SAVE of a pair -> its second
        self._signal_of: dict[tuple[int, int], int] = {}        # (waiter, engine waited on) -> the signaller
        self.pair_open = False

    def __len__(self) -> int:
        return len(self.dpdon)

    def keys(self, fp: Footprint) -> tuple[set[int], set[int]]:
        """(read keys, write keys) of a footprint in this planner's key space."""
        return self.space.footprint_keys(fp)

    def last(self, engine: int) -> int:
        """Index of the latest instruction of `engine` (-1: none yet)."""
        return self._last[engine]

    def _split(self, keys: set) -> list[tuple["_KeyState", np.ndarray]]:
        """The keys as (state arrays, dense indices) per key space: bank lines, then each DDR register."""
        if not keys:
            return []
        a = np.fromiter(keys, np.int64, len(keys))
        lo, hi = int(a.min()), int(a.max())
        if lo >= 0:                                   # bank lines only
            self._bank.ensure(hi + 1)
            return [(self._bank, a)]
        out = []
        if hi >= 0:
            b = a[a >= 0]
            self._bank.ensure(int(b.max()) + 1)
            out.append((self._bank, b))
            a = a[a < 0]
        v = -1 - a
        reg = v >> 40
        ch = v & ((1 << 40) - 1)
        r0, r1 = int(reg.min()), int(reg.max())
        for r in ([r0] if r0 == r1 else np.unique(reg).tolist()):
            c = ch if r0 == r1 else ch[reg == r]
            st = self._ddr.get(r)
            if st is None:
                st = self._ddr[r] = _KeyState()
            st.ensure(int(c.max()) + 1)
            out.append((st, c))
        return out

    def needs(self, C: int, R: set, W: set) -> list[int]:
        """Per engine P, the latest P instruction that a new instruction of engine C with these keys conflicts
        with (-1: none; C's own entry is always -1)."""
        return self._needs(C, self._split(R), self._split(W))

    @staticmethod
    def _needs(C: int, sR: list, sW: list) -> list[int]:
        need = np.full(4, -1, np.int64)
        for st, idx in sR:                            # the latest write of every key read
            np.maximum(need, st.wr[:, idx].max(axis=1), out=need)
        for st, idx in sW:                            # the latest write and read of every key written
            np.maximum(need, st.wr[:, idx].max(axis=1), out=need)
            np.maximum(need, st.rd[:, idx].max(axis=1), out=need)
        out = need.tolist()
        out[C] = -1
        return out

    @staticmethod
    def _record(i: int, C: int, sR: list, sW: list) -> None:
        """Instruction i of engine C reads sR and writes sW: it becomes their latest writer / reader of C."""
        for st, idx in sW:
            st.wr[C, idx] = i
        for st, idx in sR:
            st.rd[C, idx] = i

    def _clock(self, C: int) -> list[int]:
        j = self._last[C]
        return list(self.hb[j]) if j >= 0 else [-1, -1, -1, -1]

    def _wait(self, i: int, C: int, x: int, v: list[int]) -> int:
        """Order i (engine C, clock v, updated) after instruction x of another engine; the signaller."""
        x = self._partner.get(x, x)
        P = int(self.engine[x])
        if P == _SAVE and self.pair_open:
            raise TokenError("nothing may wait on the SAVE engine between the two SAVEs of a pair", i)
        if self.dpdby[x] >> C & 1:          # cannot happen (class docstring); a second token would unbalance
            raise TokenError(f"instruction {x} already signals {ENGINES[C].name}", i)
        y = self._signal_of.get((i, P))
        if y is not None:                   # i already waits on P (one bit, one token): move that signal to x,
            self.dpdby[y] &= ~(1 << C)      # the later one (still the latest signal on (P, C): order kept)
        self._signal_of[(i, P)] = x
        self.dpdby[x] |= 1 << C
        self.dpdon[i] |= 1 << P
        h = self.hb[x]
        for E in range(4):
            if h[E] > v[E]:
                v[E] = h[E]
        if x > v[P]:
            v[P] = x
        return x

    def _resolve(self, i: int, C: int, need: list[int], v: list[int]) -> list[int]:
        """Place the tokens i needs, latest-first by index (a later instruction's clock often covers the
        others)."""
        out: list[int] = []
        while True:
            cand = [(need[P], P) for P in range(4) if P != C and need[P] > v[P]]
            if not cand:
                return out
            x, P = max(cand)
            out.append(self._wait(i, C, x, v))

    def order_after_all(self, i: int) -> list[int]:
        """Order instruction i after every other engine's latest instruction (the final SAVE)."""
        C = int(self.engine[i])
        v = list(self.hb[i])
        need = [self._last[P] if P != C else -1 for P in range(4)]
        out = self._resolve(i, C, need, v)
        self.hb[i] = _clock4(v)
        return out

    def add_all(self, steps: Sequence[tuple[str, tuple[set, set], int | None]], after_all: int = -1) -> None:
        """On a new planner: `add(op, keys=keys, pair=pair)` for every step in order (an END: `wait=False`, no keys),
        with `order_after_all(after_all)` right after that step: `add_dense` over the steps' key sets."""
        dk = DenseKeys.of_sets([k for _, k, _ in steps])
        idx = list(range(len(steps)))
        self.add_dense([op for op, _, _ in steps], [p for _, _, p in steps], idx, [i + 1 for i in idx], dk, after_all)

    def add_dense(self, ops: Sequence[str], pairs: Sequence[int | None], lo: Sequence[int], hi: Sequence[int],
                  dk: DenseKeys, after_all: int = -1) -> None:
        """On a new planner, one step per op: step s has the keys of instructions lo[s]..hi[s]-1 of `dk` (a SAVE
        pair's first step both SAVEs', as `add` is given their union) and pair mark pairs[s]. The same tokens as
        `add(ops[s], keys=..., pair=pairs[s])` step by step (an END: `wait=False`), with `order_after_all(after_all)`
        right after that step; the per-key bookkeeping of all steps is one compiled pass (isa/_deps_kernel.py), so
        this planner's own per-key state stays empty (`needs` / `add` after it would not see these steps)."""
        from ._deps_kernel import exact_needs
        if len(self.dpdon):
            raise TokenError("add_all needs a new planner", len(self.dpdon))
        n = len(ops)
        eng = np.fromiter((_ENGINE_NUM[op] for op in ops), np.int64, n)
        lo_a, hi_a = np.asarray(lo, np.int64), np.asarray(hi, np.int64)
        need_all = exact_needs(eng, lo_a, hi_a, dk.ptr, dk.keys, dk.total) if n else np.zeros((0, 4), np.int64)
        nonempty = (dk.ptr[2 * hi_a] > dk.ptr[2 * lo_a]).tolist() if n else []
        for i in range(n):
            e = int(eng[i])
            row = need_all[i].tolist()
            row[e] = -1
            self._place(ops[i], e, pairs[i], ops[i] != "END", row if nonempty[i] else None)
            if i == after_all:
                self.order_after_all(i)

    def _place(self, op: str, e: int, pair: int | None, wait: bool, need: list[int] | None) -> list[int]:
        """Append instruction i = len(self) of engine e, given its needs (None: it has no keys): the SAVE-pair
        protocol, the tokens (latest-first) and its clock. Returns the instructions it waits on."""
        i = len(self.dpdon)
        b = 1 << e
        on, by = b, b
        if pair is not None:
            _check_pair(op, pair, self.pair_open, i)
            if pair == 1:
                v = self._clock(e)
                if need is not None and any(need[P] > v[P] for P in range(4)):
                    raise TokenError("the second SAVE of a pair would need a wait of its own; the first SAVE "
                                     "waits for both", i)
                wait = False
            on, by = (b, 0) if pair == 0 else (0, b)
        v = self._clock(e)
        if not wait:
            need = None
        if need is not None and pair is None and self.pair_open and need[_SAVE] > v[_SAVE]:
            raise TokenError(f"{op} conflicts with an open SAVE pair and cannot wait on it", i)
        self.dpdon.append(on)
        self.dpdby.append(by)
        self.engine.append(ENGINES[e])
        self.hb.append((-1, -1, -1, -1))
        waits: list[int] = []
        if need is not None:
            waits = self._resolve(i, e, need, v)
        self.hb[i] = _clock4(v)
        if pair == 1:
            self._partner[self._last[e]] = i
        self._last[e] = i
        if pair is not None:
            self.pair_open = pair == 0
        return waits

    def add(self, op: str, fp: Footprint | None = None, *, keys: tuple[set, set] | None = None,
            wait: bool = True, pair: int | None = None) -> Step:
        """Append instruction `op` with footprint `fp` (or `keys`); see `TokenPlanner.add`."""
        e = _ENGINE_NUM[op]
        R, W = keys if keys is not None else (self.keys(fp) if fp is not None else (set(), set()))
        i = len(self.dpdon)
        sR, sW = self._split(R), self._split(W)
        need = self._needs(e, sR, sW) if (R or W) and (wait or pair == 1) else None
        waits = self._place(op, e, pair, wait, need)
        self._record(i, e, sR, sW)
        return Step(i, ENGINES[e], self.dpdon[i], self.dpdby[i], tuple(waits))


# ---- checking ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Race:
    """A cross-engine conflict that the tokens leave unordered (or an unmatched wait, kind "wait")."""

    kind: str          # "RAW", "WAR", "WAW" or "wait"
    first: int         # the earlier instruction (for "wait": the engine waited on)
    second: int        # the later instruction
    key: int | None    # a key they share (KeySpace encoding)

    def __str__(self) -> str:
        if self.kind == "wait":
            return f"instruction {self.second} waits on {Engine(self.first).name} with no earlier signal"
        return f"{self.kind} between instructions {self.first} and {self.second} (key {self.key})"


def find_races(instrs: Sequence[Instruction], footprints: Sequence[Footprint], target: Target,
               line_chunk: int = 1, ddr_chunk: int = 1, limit: int = 100) -> list[Race]:
    """Conflicts that some token-respecting schedule of the in-order engines could reorder (spec §5.2).

    Happens-before: instruction i starts after its engine's previous instruction starts and after the
    producers of the tokens it consumes complete (the k-th wait on (P, C) pairs with the k-th signal, which
    must come earlier in program order); a completed instruction implies all earlier ones of its engine
    completed. Two instructions of different engines that touch a common key, one of them writing, must
    be so ordered. Up to `limit` races are returned."""
    space = KeySpace(target, line_chunk, ddr_chunk)
    hb: list[list[int]] = []           # hb[i][E]: latest E instruction known complete when i starts
    last = [-1, -1, -1, -1]
    queue: list[list[list[int]]] = [[[] for _ in range(4)] for _ in range(4)]
    qpos = [[0] * 4 for _ in range(4)]
    state: dict[int, list[int]] = {}   # key -> [last writer, its engine, last reader of E0..E3 since]
    races: list[Race] = []
    if len(instrs) != len(footprints):
        raise TokenError(f"find_races: {len(instrs)} instructions but {len(footprints)} footprints")
    for i, (ins, fp) in enumerate(zip(instrs, footprints)):
        C = engine_of(ins.op)
        v = list(hb[last[C]]) if last[C] >= 0 else [-1, -1, -1, -1]
        for P in ENGINES:
            if P != C and ins.dpdon >> P & 1:
                q = queue[P][C]
                k = qpos[P][C]
                if k >= len(q):
                    races.append(Race("wait", int(P), i, None))
                    continue
                qpos[P][C] = k + 1
                x = q[k]
                for E in range(4):
                    if hb[x][E] > v[E]:
                        v[E] = hb[x][E]
                if x > v[P]:
                    v[P] = x
        hb.append(v)
        last[C] = i
        R, W = space.footprint_keys(fp)
        for key in R:
            s = state.get(key)
            if s is None:
                state[key] = s = [-1, -1, -1, -1, -1, -1]
            j = s[0]
            if j >= 0 and s[1] != C and v[s[1]] < j:
                races.append(Race("RAW", j, i, key))
            s[2 + C] = i
        for key in W:
            s = state.get(key)
            if s is None:
                state[key] = s = [-1, -1, -1, -1, -1, -1]
            j = s[0]
            if j >= 0 and s[1] != C and v[s[1]] < j:
                races.append(Race("WAW", j, i, key))
            for E in range(4):
                r = s[2 + E]
                if E != C and r >= 0 and v[E] < r:
                    races.append(Race("WAR", r, i, key))
            s[0], s[1] = i, C
            s[2] = s[3] = s[4] = s[5] = -1
        for P in ENGINES:
            if P != C and ins.dpdby >> P & 1:
                queue[C][P].append(i)
        if len(races) >= limit:
            return races[:limit]
    return races


__all__ = ["ALL_BITS", "ENGINES", "ExactTokenPlanner",
           "KeySpace", "Race", "Step", "TokenError", "TokenPlanner", "bit", "cross",
           "engine_of", "engines_of", "find_races", "mask", "token_counts"]
