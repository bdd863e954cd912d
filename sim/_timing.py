"""Numba kernels of the cycle model (docs/microarchitecture.md): per-instruction cost, then the schedule.

`costs` turns each instruction into its busy time in core cycles (formulas of §3 of the document) and
its DDR traffic; `schedule` computes fetch, dispatch, start, end and retire cycles of every instruction
under in-order fetch/dispatch, in-order engines and the dependency-token counters of spec §5.2. All
times are exact integers; the schedule is the least solution of max-plus constraints, evaluated in
dependency order (a worklist), so its cost is linear in the program length, not in the cycle count.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from opendpu.isa.fields import FIELD_INDEX, OPS, Engine
from . import _kernels as K
from . import ports as P

ENGINE_OF_OP = np.array([int(o.engine) for o in OPS], np.int64)
WORDS_OF_OP = np.array([o.words for o in OPS], np.int64)
SV_HP = FIELD_INDEX["SAVE"]["hp_id"]
# Numba takes plain ints, not the enum: the engine count and the SAVE engine's number as int globals
NENG = len(Engine)
SAVE_E = int(Engine.SAVE)
CONV_E = int(Engine.CONV)
MISC_E = int(Engine.MISC)
LOAD_E = int(Engine.LOAD)
INF = P.INF

# timing parameter vector (filled from isa.target.Timing by sim/timing.py)
(TM_FETCH_LAT, TM_FIFO, TM_QUEUE, TM_DDR_LAT, TM_DDR_BPC, TM_PORTS, TM_LD_SETUP, TM_SV_SETUP, TM_CONV_LAT,
 TM_ALU_LAT, TM_ELEW_LAT, TM_INIT, TM_END, TM_WATCHDOG, TM_WLINES) = range(15)
NTM = 15
assert (P.TM_DDR_BPC, P.TM_PORTS) == (TM_DDR_BPC, TM_PORTS)

# status codes of `schedule`
ST_OK, ST_DEADLOCK, ST_WATCHDOG, ST_INTERNAL = 0, 1, 2, 3
# cost errors
CE_NONE, CE_NOINIT, CE_LEGACY = 0, 1, 2


@njit(cache=True)
def _cdiv(a, b):
    return (a + b - 1) // b


@njit(cache=True)
def _cost_error(err, kind, i, o):
    err[0] = kind
    err[1] = i
    err[2] = o


@njit(cache=True)
def load_wide(f, tp, wl):
    """Whether a (non-broadcast) LOAD writes `wl` > 1 lines per cycle: into a CONVW bank, without channel
    augmentation (isa.target.Target.load_lines_per_cycle; such an item reads all `channel` bytes)."""
    bank = f[K.LD_BANK_ID]
    ch = f[K.LD_CHANNEL]
    return wl > 1 and tp[K.T_CONVW] <= bank and bank < tp[K.T_DWCONVW] and not (f[K.LD_JR] <= ch and ch <= 64)


@njit(cache=True)
def costs(op, fl, stop, tp, tm, cost, port, ddr_reg, ddr_rd, ddr_wr, err):
    """cost[i] = busy cycles of instruction i; port[i] = AXI port of a SAVE (-1 otherwise);
    ddr_reg/ddr_rd/ddr_wr = register and bytes read/written. err = (kind, index, op) on failure."""
    w = tp[K.T_CP]
    lat = tm[TM_DDR_LAT]
    bpc = tm[TM_DDR_BPC]
    ports = tm[TM_PORTS]
    conv_kh = -1
    conv_kw = -1
    alu_k = -1
    alu_cg = 0
    alu_len = 0
    for i in range(stop):
        o = op[i]
        f = fl[i]
        port[i] = -1
        ddr_reg[i] = -1
        ddr_rd[i] = 0
        ddr_wr[i] = 0
        if o == K.OP_LOAD:
            length = f[K.LD_LENGTH]
            ch = f[K.LD_CHANNEL]
            lines = _cdiv(ch, w)
            if f[K.LD_BCAST] == 7:
                cost[i] = tm[TM_LD_SETUP] + length * lines
            else:
                if load_wide(f, tp, tm[TM_WLINES]):
                    lines = _cdiv(lines, tm[TM_WLINES])
                cyc, nb, _ = P.load_items(f, lines, w, bpc * ports)
                cost[i] = tm[TM_LD_SETUP] + lat + cyc
                ddr_reg[i] = f[K.LD_REG]
                ddr_rd[i] = nb
        elif o == K.OP_SAVE:
            length = f[K.SV_LENGTH]
            ch = f[K.SV_CHANNEL]
            if f[K.SV_CONST_EN] != 0:
                lines = 0
                nb = ch
            elif (f[K.SV_ARGMAX] & 2) != 0:
                lines = _cdiv(ch, w)
                nb = 1
            else:
                lines = _cdiv(ch, w)
                nb = ch
            beats = _cdiv(nb, bpc)
            per = beats if beats > lines else lines
            cost[i] = tm[TM_SV_SETUP] + length * per + lat
            port[i] = f[SV_HP] % ports
            ddr_reg[i] = f[K.SV_REG]
            ddr_wr[i] = length * nb
        elif o == K.OP_CONVINIT:
            conv_kh = f[K.CI_KH]
            conv_kw = f[K.CI_KW]
            cost[i] = tm[TM_INIT]
        elif o == K.OP_CONV:
            if conv_kh < 0:
                return _cost_error(err, CE_NOINIT, i, o)
            cost[i] = tm[TM_CONV_LAT] + f[K.CV_LEN] * conv_kh * conv_kw * f[K.CV_CG]
        elif o == K.OP_ALUINIT:
            alu_k = f[K.AI_KH] * f[K.AI_KW]
            alu_cg = f[K.AI_CG]
            alu_len = f[K.AI_LEN]
            cost[i] = tm[TM_INIT]
        elif o == K.OP_ALU:
            if alu_k < 0:
                return _cost_error(err, CE_NOINIT, i, o)
            cost[i] = tm[TM_ALU_LAT] + alu_len * alu_k * f[K.AL_KD] * alu_cg
        elif o == K.OP_ELEWINIT:
            cost[i] = tm[TM_INIT]
        elif o == K.OP_ELEW:
            cost[i] = tm[TM_ELEW_LAT] + f[K.EW_LEN] * f[K.EW_CG] * f[K.EW_NUM]
        elif o == K.OP_END:
            cost[i] = tm[TM_END]
        else:
            return _cost_error(err, CE_LEGACY, i, o)


@njit(cache=True)
def _busy_now(T, busy_until, bm):
    """(mask of the banks whose write port is busy in cycle T, cycles until the first of them is free);
    bm[0] = banks whose busy_until may still be > T (pruned here)."""
    busy = 0
    nexp = INF
    if bm[0] != 0:
        for b in range(63):
            if (bm[0] >> b) & 1:
                if busy_until[b] > T:
                    busy |= np.int64(1) << b
                    if busy_until[b] - T < nexp:
                        nexp = busy_until[b] - T
        bm[0] = busy
    return busy, nexp


@njit(cache=True)
def _resolve(rs, clist, ncs, pend, tau, cur, start, end, cost, st_bank, kind, prm, rfoot, wfoot, fl, bp, w, wd,
             nunits, info, act, grant, dummy, busy_until, bm):
    """Advance the bank-port arbitration (docs/bank-ports.md §2-4) from cycle rs[0] until at least one
    pending instruction (pend[u] >= 0: started, end not yet known) ends; set its end.

    Units in priority order: 0 CONV, 1 MISC, 2 LOAD, 3 + u SAVE unit u. rs = [T, cpos]: every cycle < T is
    resolved; clist[cpos:ncs] are the started CONV-engine instructions that have not ended by T; those
    that cannot stall (`schedule`) have end = s + cost and are the fixed CONV `c` here, the others are
    pending as unit 0. tau[u] = engine time of pend[u] at cycle T. busy_until[b] = first cycle in which
    bank b's write queue is empty (the port is busy in the cycles before; bm[0] = the banks that may be
    busy). While the static footprints of the active instructions do not intersect, no active instruction
    can still write several lines into one bank and no busy bank is in a write footprint, time jumps to
    the next event; otherwise it steps from one change of any active request (or busy bit) to the next,
    and one cycle at a time across a granted multi-line write."""
    T = rs[0]
    cpos = rs[1]
    info[7] += 1
    while True:
        while cpos < ncs and end[clist[cpos]] <= T:     # (a pending CONV, end -1, is unit 0)
            cpos += 1
        c = -1
        horizon = INF
        if cpos < ncs:
            x = clist[cpos]
            if start[x] <= T:
                if kind[x] != P.KD_NONE:
                    c = x
                horizon = end[x] - T
            else:
                horizon = start[x] - T
        nact = 0
        for u in range(nunits):
            act[u] = False
            x = pend[u]
            if x < 0:
                continue
            if start[x] > T:
                if start[x] - T < horizon:
                    horizon = start[x] - T
            else:
                act[u] = True
                nact += 1
                if cost[x] - tau[u] < horizon:
                    horizon = cost[x] - tau[u]
        if nact == 0:
            T += horizon
            continue
        busy, nexp = _busy_now(T, busy_until, bm)
        # footprints of what each active instruction may still request (they only shrink with time)
        acc_r = 0
        acc_w = 0
        if c >= 0:
            acc_r, acc_w = P.future_foot(P.KD_CONV, prm[c], T - start[c])
        dup_r = 0
        dup_w = 0
        qf = 0
        for u in range(nunits):
            if act[u]:
                x = pend[u]
                fr, fw = P.future_foot(kind[x], prm[x], tau[u])
                dup_r |= fr & acc_r
                dup_w |= fw & acc_w
                acc_r |= fr
                acc_w |= fw
                qf |= P.future_queue(kind[x], prm[x], tau[u])
        conflict = dup_r != 0 or dup_w != 0 or qf != 0 or (busy & acc_w) != 0
        d = horizon
        if not conflict:
            info[8] += 1
            for u in range(nunits):
                if act[u]:
                    tau[u] += d
        else:
            info[9] += 1
            # Requests are compared only on the banks in two or more of the footprints (dup), the banks
            # of future multi-line writes (qf) and the busy ones: as long as that part of every request and
            # the busy set stay the same, so do all grants.
            rel_r = dup_r
            rel_w = dup_w | qf | busy
            used_r = 0
            used_w = busy
            if nexp < d:
                d = nexp
            if c >= 0:                                  # (never refused: it writes no busy bank)
                rm, wm, run = P.request(P.KD_CONV, prm[c], fl[c], T - start[c], dummy, bp, w, rel_r, rel_w)
                used_r |= rm
                used_w |= wm
                if run < d:
                    d = run
            for u in range(nunits):
                if act[u]:
                    x = pend[u]
                    rm, wm, run = P.request(kind[x], prm[x], fl[x], tau[u], cur[u], bp, w, rel_r, rel_w)
                    if (rm & used_r) != 0 or (wm & used_w) != 0:
                        grant[u] = False
                    else:
                        grant[u] = True
                        used_r |= rm
                        used_w |= wm
                        if run < d:
                            d = run
                        q = wm & prm[x, P.P_WQ2]
                        if q != 0:                      # lines 2.. of this write go through the queue
                            d = 1
                            for b in range(63):
                                if (q >> b) & 1:
                                    busy_until[b] = T + P.write_lines(prm[x], b)
                            bm[0] |= q
            for u in range(nunits):
                if act[u]:
                    if grant[u]:
                        tau[u] += d
                    else:
                        st_bank[pend[u]] += d
        T += d
        fin = False
        for u in range(nunits):
            if act[u] and tau[u] >= cost[pend[u]]:
                end[pend[u]] = T
                pend[u] = -1
                fin = True
        if fin:
            rs[0] = T
            rs[1] = cpos
            return ST_OK
        if T > wd:
            for u in range(nunits):
                if pend[u] >= 0:
                    info[6] = pend[u]
                    end[pend[u]] = T
            rs[0] = T
            return ST_WATCHDOG


@njit(cache=True)
def schedule(eng, dpdon, dpdby, words, cost, port, n, tm, fetch, disp, start, end, ret, st_tok, st_q, st_ddr,
             info, tok, src, kind, prm, rfoot, wfoot, fl, bp, w, st_bank):
    """Fetch/dispatch/start/end/retire cycles of instructions 0..n-1 (docs/microarchitecture.md §2) with the
    bank-port stalls of docs/bank-ports.md (st_bank).

    Returns ST_OK, ST_DEADLOCK, ST_WATCHDOG or ST_INTERNAL. info = [first undispatched instruction, head
    instruction of each engine (4), instructions started, watchdog instruction]; tok[0] = waits consumed
    and tok[1] = signals delivered per (producer, consumer) pair; src[k, P] = the instruction whose signal
    k consumed on (P, engine of k), or -1.

    The max-plus worklist computes starts as before. An instruction with bank requests that can be
    stalled starts *pending*: its end depends on what the engines before it in the priority order (and the
    write queues) do while it runs. Every MISC, LOAD and SAVE instruction with requests can be stalled; a
    CONV only if it writes a bank into which some CONV or ALU of the program writes several lines at
    once (stride_out > 1: the bank's write port can be busy draining its queue); any other CONV ends at
    s + cost (the shortcut that keeps the common case fast). When the worklist can make no more progress, `_resolve`
    advances the arbitration in global time until the first pending instruction ends; everything not yet
    started depends on some pending end, so it starts no earlier than that cycle.
    """
    lf = tm[TM_FETCH_LAT]
    fifo = tm[TM_FIFO]
    qd = tm[TM_QUEUE]
    wd = tm[TM_WATCHDOG]
    nports = tm[TM_PORTS]
    nunits = 3 + nports
    cnt = np.zeros(NENG, np.int64)
    pos = np.empty(n, np.int64)
    for k in range(n):
        pos[k] = cnt[eng[k]]
        cnt[eng[k]] += 1
    off = np.zeros(NENG + 1, np.int64)
    for ee in range(NENG):
        off[ee + 1] = off[ee] + cnt[ee]
    elist = np.empty(n, np.int64)
    for k in range(n):
        elist[off[eng[k]] + pos[k]] = k
    ws = np.empty(n, np.int64)
    nw = 0
    for k in range(n):
        ws[k] = nw
        nw += words[k]
    owner = np.empty(nw, np.int64)
    for k in range(n):
        for j in range(ws[k], ws[k] + words[k]):
            owner[j] = k
    maxsig = 1
    for ee in range(NENG):
        if cnt[ee] > maxsig:
            maxsig = cnt[ee]
    sig = np.empty((NENG * NENG, maxsig), np.int64)
    sig_from = np.empty((NENG * NENG, maxsig), np.int64)
    nsig = np.zeros((NENG, NENG), np.int64)
    nwait = np.zeros((NENG, NENG), np.int64)
    head = np.zeros(NENG, np.int64)
    rhead = np.zeros(NENG, np.int64)
    prev_ret = np.zeros(NENG, np.int64)
    prev_start = np.full(NENG, -1, np.int64)
    port_last = np.full(nports, -1, np.int64)
    pend = np.full(nunits, -1, np.int64)
    tau = np.zeros(nunits, np.int64)
    cur = np.zeros((nunits, 2), np.int64)
    rs = np.zeros(2, np.int64)
    act = np.zeros(nunits, np.bool_)
    grant = np.zeros(nunits, np.bool_)
    dummy = np.zeros(2, np.int64)
    busy_until = np.zeros(64, np.int64)
    bm = np.zeros(1, np.int64)
    clist = elist[off[CONV_E]:off[CONV_E + 1]]
    # banks that some CONV / ALU writes several lines of at once (stride_out > 1): only a CONV that writes
    # one of them can find a busy write port, so only such a CONV is pending; the others end at s + cost
    multi = 0
    for k in range(n):
        if kind[k] == P.KD_CONV or kind[k] == P.KD_ALU:
            multi |= prm[k, P.P_WQ2]
    a_prev = lf - 1
    nd = 0
    nsched = 0
    nret = 0
    status = ST_OK
    info[6] = -1
    while nret < n:
        progress = False
        # ---- fetch + dispatch, in stream order -------------------------------------------------
        while nd < n:
            k = nd
            ek = eng[k]
            qready = 0
            if pos[k] >= qd:
                if head[ek] <= pos[k] - qd:          # the instruction qd places ahead has not started
                    break
                qready = start[elist[off[ek] + pos[k] - qd]] + 1
            a = a_prev
            for j in range(ws[k], ws[k] + words[k]):
                cr = lf if j < fifo else disp[owner[j - fifo]] + lf
                a = a + 1 if a + 1 > cr else cr
            a_prev = a
            fetch[k] = a
            base = a + 1
            if k > 0 and disp[k - 1] + 1 > base:
                base = disp[k - 1] + 1
            dk = base if base > qready else qready
            st_q[k] = dk - base
            disp[k] = dk
            nd += 1
            progress = True
        # ---- engines: start the head of each queue when it may, retire in order -----------------
        for ee in range(NENG):
            while head[ee] < cnt[ee]:
                h = elist[off[ee] + head[ee]]
                if h >= nd:
                    break
                b = disp[h] + 1
                if ee == SAVE_E and ((dpdon[h] >> SAVE_E) & 1) == 0:
                    av = prev_start[ee] + 1
                elif ee == SAVE_E:
                    if rhead[ee] < head[ee]:            # an earlier SAVE-engine instruction has not retired
                        break
                    av = prev_ret[ee]
                elif head[ee] > 0:
                    av = end[elist[off[ee] + head[ee] - 1]]
                    if av < 0:                          # the previous instruction is still pending
                        break
                else:
                    av = 0
                if av > b:
                    b = av
                tt = b
                ok = True
                for p in range(NENG):
                    if p != ee and ((dpdon[h] >> p) & 1) != 0:
                        m = nwait[p, ee]
                        if nsig[p, ee] <= m:
                            ok = False
                            break
                        t = sig[p * NENG + ee, m]
                        if t > tt:
                            tt = t
                if not ok:
                    break
                t2 = tt
                pp = port[h]
                if pp >= 0 and port_last[pp] >= 0:
                    pe = end[port_last[pp]]
                    if pe < 0:                          # the previous SAVE on this port is still pending
                        break
                    if pe > t2:
                        t2 = pe
                if t2 < rs[0]:                          # cannot happen (see the docstring): report it
                    info[6] = h
                    status = ST_INTERNAL
                    break
                st_tok[h] = tt - b
                st_ddr[h] = t2 - tt
                start[h] = t2
                st_bank[h] = 0
                if kind[h] != P.KD_NONE and (ee != CONV_E or (prm[h, P.P_WM] & multi) != 0):
                    u = 0 if ee == CONV_E else (1 if ee == MISC_E else (2 if ee == LOAD_E else 3 + pp))
                    end[h] = -1
                    pend[u] = h
                    tau[u] = 0
                    cur[u, 0] = 0
                    cur[u, 1] = 1
                else:
                    end[h] = t2 + cost[h]
                for p in range(NENG):
                    src[h, p] = -1
                    if p != ee and ((dpdon[h] >> p) & 1) != 0:
                        src[h, p] = sig_from[p * NENG + ee, nwait[p, ee]]
                        nwait[p, ee] += 1
                if pp >= 0:
                    port_last[pp] = h
                prev_start[ee] = t2
                head[ee] += 1
                nsched += 1
                progress = True
            if status != ST_OK:
                break
            while rhead[ee] < head[ee]:
                h = elist[off[ee] + rhead[ee]]
                if end[h] < 0:
                    break
                rr = end[h] if end[h] > prev_ret[ee] else prev_ret[ee]
                ret[h] = rr
                for p in range(NENG):
                    if p != ee and ((dpdby[h] >> p) & 1) != 0:
                        sig[ee * NENG + p, nsig[ee, p]] = rr
                        sig_from[ee * NENG + p, nsig[ee, p]] = h
                        nsig[ee, p] += 1
                prev_ret[ee] = rr
                rhead[ee] += 1
                nret += 1
                progress = True
                if rr > wd:
                    status = ST_WATCHDOG
                    info[6] = h
                    break
            if status != ST_OK:
                break
        if status != ST_OK:
            break
        if not progress:
            waiting = False
            for u in range(nunits):
                if pend[u] >= 0:
                    waiting = True
            if not waiting:
                status = ST_DEADLOCK
                break
            status = _resolve(rs, clist, head[CONV_E], pend, tau, cur, start, end, cost, st_bank, kind, prm,
                              rfoot, wfoot, fl, bp, w, wd, nunits, info, act, grant, dummy, busy_until, bm)
            if status != ST_OK:
                break
    info[0] = nd
    for ee in range(NENG):
        info[1 + ee] = elist[off[ee] + head[ee]] if head[ee] < cnt[ee] else -1
    info[5] = nsched
    for p in range(NENG):
        for c in range(NENG):
            tok[0, p, c] = nwait[p, c]
            tok[1, p, c] = nsig[p, c]
    return status
