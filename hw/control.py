"""The core's control: fetch, dispatch, engine queues, dependency tokens, start, retire and END.

It implements the scheduling rules of docs/microarchitecture.md §2 literally, one cycle at a time, so
that every instruction's start, end and retire cycle equals the cycle model's:

* fetch requests one 32-bit word per cycle while the fetch FIFO has credit (a slot is freed when its
  instruction is dispatched, and may be re-requested that same cycle); a word requested in cycle t is in
  the FIFO in cycle t + fetch_latency;
* dispatch moves at most one whole instruction per cycle, in stream order, into its engine's queue
  (queue_depth entries; a slot frees when its instruction starts); nothing after the first END;
* an engine starts its queue head when the engine is free, the head's dpdon tokens exist (tokens
  signalled in this very cycle count), and for SAVEs the own-bit and port rules hold;
* LOAD, CONV and MISC retire at their end; the SAVE engine (SAVE units and END) retires in start order
  through a small reorder buffer; retiring instructions deliver their dpdby tokens;
* END's retire ends the run (ap_done); EXEC_CYCLE is that cycle's number, counted from 0 at the first
  cycle after ap_start.
"""
from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from opendpu.isa.fields import BY_OPCODE, Engine

from . import iface
from .params import HwParams

END_OPCODE = 0x7
USABLE = ("LOAD", "SAVE", "END", "CONVINIT", "CONV", "ALUINIT", "ALU", "ELEWINIT", "ELEW")
# DPU_STS error bits
ERR_ILLEGAL, ERR_ROB = 1, 2


def n_end_slots(p: HwParams) -> int:
    """Trace slots for end events: LOAD, CONV, MISC, one per SAVE unit, END."""
    return 3 + p.ddr_ports + 1


def n_ret_slots(p: HwParams) -> int:
    """Trace slots for retire events: LOAD, CONV, MISC, then the SAVE reorder buffer in order."""
    return 3 + p.save_rob_entries


class Control(wiring.Component):
    def __init__(self, p: HwParams):
        self.p = p
        ib = p.idx_bits
        super().__init__({
            "go": In(1),
            "instr_base": In(p.instr_addr_bits),
            "ifetch": Out(iface.instr_read(p)),
            "load": Out(iface.engine_ctl(p)),
            "conv": Out(iface.engine_ctl(p)),
            "misc": Out(iface.engine_ctl(p)),
            "save": Out(iface.engine_ctl(p)).array(p.ddr_ports),
            "running": Out(1),
            "done": Out(1),
            "cyc": Out(p.cycle_bits),
            "err": Out(4),
            "cnt_start": Out(data.ArrayLayout(32, 4)),
            "cnt_end": Out(data.ArrayLayout(32, 4)),
            "tr_start_v": Out(4),
            "tr_start_idx": Out(data.ArrayLayout(ib, 4)),
            "tr_end_v": Out(n_end_slots(p)),
            "tr_end_idx": Out(data.ArrayLayout(ib, n_end_slots(p))),
            "tr_ret_v": Out(n_ret_slots(p)),
            "tr_ret_idx": Out(data.ArrayLayout(ib, n_ret_slots(p))),
        })

    def elaborate(self, platform):
        m = Module()
        run, go = self._run_state(m)
        f = self._fetch(m, run, go)
        hd = self._decode_head(m, f)
        q = self._queues(m, run, f, hd)
        tk = self._tokens(m, q)
        start = [Signal(name=f"start{e}") for e in range(4)]
        se = self._single_issue(m, run, q, tk, start)
        sv = self._save_engine(m, run, q, tk, se, start)
        self._token_counters(m, q, tk, start)
        self._done_and_trace(m, run, q, se, sv, start)
        self._reset(m, go, f, q, tk, se, sv)
        return m

    def _run_state(self, m):
        """The run flag (`go` starts a run, END's retire ends it) and the cycle counter."""
        run = Signal()
        go = Signal()
        m.d.comb += go.eq(self.go & ~run)
        cyc = self.cyc
        m.d.comb += self.running.eq(run)
        with m.If(go):
            m.d.sync += [run.eq(1), cyc.eq(0)]
        with m.Elif(run):
            m.d.sync += cyc.eq(cyc + 1)
        return run, go

    # ---------------- fetch ------------------------------------------------------------------
    def _fetch(self, m, run, go):
        """Word requests while the FIFO has credit, the fetch_latency delay line and the fetch FIFO.
        `disp_words` (driven by dispatch) frees FIFO credit."""
        p = self.p
        D = p.t.fetch_fifo_words
        LF = p.t.fetch_latency
        wbits = 24
        req_cnt = Signal(wbits)           # words requested so far
        freed = Signal(wbits)             # words whose FIFO slot was freed by a dispatch
        disp_words = Signal(3)            # words dispatched this cycle
        freed_now = Signal(wbits)
        m.d.comb += freed_now.eq(freed + disp_words)
        req = Signal()
        m.d.comb += req.eq(run & ((req_cnt - freed_now)[:wbits] < D))
        m.d.comb += [self.ifetch.en.eq(req), self.ifetch.addr.eq(self.instr_base + req_cnt)]
        m.d.sync += freed.eq(freed_now)
        with m.If(req):
            m.d.sync += req_cnt.eq(req_cnt + 1)
        req_q = Signal()
        m.d.sync += req_q.eq(req)
        arr_v = Signal()
        arr_d = Signal(32)
        if LF <= 1:
            m.d.comb += [arr_v.eq(req_q), arr_d.eq(self.ifetch.data)]
        else:
            sv = [Signal(name=f"fl_v{i}") for i in range(LF - 1)]
            sd = [Signal(32, name=f"fl_d{i}") for i in range(LF - 1)]
            m.d.sync += [sv[0].eq(req_q), sd[0].eq(self.ifetch.data)]
            for i in range(1, LF - 1):
                m.d.sync += [sv[i].eq(sv[i - 1]), sd[i].eq(sd[i - 1])]
            m.d.comb += [arr_v.eq(sv[-1]), arr_d.eq(sd[-1])]
            with m.If(go):
                m.d.sync += [s.eq(0) for s in sv]
        with m.If(go):
            m.d.sync += [req_cnt.eq(0), freed.eq(0), req_q.eq(0)]

        fifo = Array(Signal(32, name=f"fifo{i}") for i in range(D))
        f_wr = Signal(range(D))
        f_rd = Signal(range(D))
        f_cnt = Signal(range(D + 1))
        with m.If(arr_v):
            m.d.sync += [fifo[f_wr].eq(arr_d), f_wr.eq(Mux(f_wr == D - 1, 0, f_wr + 1))]
        return SimpleNamespace(disp_words=disp_words, arr_v=arr_v, fifo=fifo, f_wr=f_wr, f_rd=f_rd, f_cnt=f_cnt)

    # ---------------- decode the FIFO head -------------------------------------------------------
    def _decode_head(self, m, f):
        """The instruction at the FIFO head: opcode, length, engine, legality and its words."""
        p = self.p
        D = p.t.fetch_fifo_words
        win = []
        for i in range(6):
            ix = Signal(range(D), name=f"win_ix{i}")
            s = f.f_rd + i
            m.d.comb += ix.eq(Mux(s >= D, s - D, s))
            win.append(f.fifo[ix])
        w0 = win[0]
        op = w0[28:32]
        nwords = Signal(3)
        eng = Signal(2)
        legal = Signal()
        with m.Switch(op):
            for opc, info in BY_OPCODE.items():
                if info.mnemonic in USABLE:
                    with m.Case(opc):
                        m.d.comb += [nwords.eq(info.words), eng.eq(int(info.engine)), legal.eq(1)]
        head_words = Signal(p.instr_bits)
        for i in range(6):
            m.d.comb += head_words[32 * i:32 * i + 32].eq(Mux(i < nwords, win[i], 0))
        return SimpleNamespace(op=op, nwords=nwords, eng=eng, legal=legal, head_words=head_words)

    # ---------------- queues ---------------------------------------------------------------------
    def _queues(self, m, run, f, hd):
        """Dispatch of the FIFO head into its engine's queue (with the illegal-opcode error) and the
        queue heads."""
        p = self.p
        ib = p.idx_bits
        D = p.t.fetch_fifo_words
        Q = p.t.queue_depth
        qe_bits = p.instr_bits + ib
        queues = [Array(Signal(qe_bits, name=f"q{e}_{i}") for i in range(Q)) for e in range(4)]
        q_wr = [Signal(range(Q), name=f"q{e}_wr") for e in range(4)]
        q_rd = [Signal(range(Q), name=f"q{e}_rd") for e in range(4)]
        q_occ = [Signal(range(Q + 1), name=f"q{e}_occ") for e in range(4)]
        q_occ_arr = Array(q_occ)

        disp_idx = Signal(ib)
        end_seen = Signal()
        dispatch = Signal()
        m.d.comb += dispatch.eq(run & ~end_seen & hd.legal & (f.f_cnt >= hd.nwords) & (q_occ_arr[hd.eng] < Q))
        m.d.comb += f.disp_words.eq(Mux(dispatch, hd.nwords, 0))
        bad = Signal()
        m.d.comb += bad.eq(run & ~end_seen & ~hd.legal & (f.f_cnt >= 1))
        err = Signal(4)
        m.d.comb += self.err.eq(err)
        with m.If(bad):
            m.d.sync += err.eq(err | ERR_ILLEGAL)

        m.d.sync += f.f_cnt.eq(f.f_cnt + f.arr_v - f.disp_words)
        with m.If(dispatch):
            nrd = f.f_rd + hd.nwords
            m.d.sync += [f.f_rd.eq(Mux(nrd >= D, nrd - D, nrd)), disp_idx.eq(disp_idx + 1)]
            with m.If(hd.op == END_OPCODE):
                m.d.sync += end_seen.eq(1)
        disp_to = [Signal(name=f"disp_to{e}") for e in range(4)]
        for e in range(4):
            m.d.comb += disp_to[e].eq(dispatch & (hd.eng == e))
            with m.If(disp_to[e]):
                m.d.sync += [queues[e][q_wr[e]].eq(Cat(hd.head_words, disp_idx)),
                             q_wr[e].eq(Mux(q_wr[e] == Q - 1, 0, q_wr[e] + 1))]

        heads = []
        for e in range(4):
            h = Signal(qe_bits, name=f"head{e}")
            m.d.comb += h.eq(queues[e][q_rd[e]])
            heads.append(h)
        hv = [q_occ[e] != 0 for e in range(4)]
        h_instr = [h[:p.instr_bits] for h in heads]
        h_idx = [h[p.instr_bits:] for h in heads]
        h_dpdon = [h[24:28] for h in heads]
        h_dpdby = [h[20:24] for h in heads]
        return SimpleNamespace(q_wr=q_wr, q_rd=q_rd, q_occ=q_occ, disp_idx=disp_idx, end_seen=end_seen, err=err,
                               disp_to=disp_to, hv=hv, h_instr=h_instr, h_idx=h_idx, h_dpdon=h_dpdon,
                               h_dpdby=h_dpdby)

    # ---------------- tokens and retire signals ----------------------------------------------------
    def _tokens(self, m, q):
        """The token counters (producer -> consumer), this cycle's signals and each queue head's
        token check (tokens signalled in this very cycle count)."""
        ib = self.p.idx_bits
        sig = [[Signal(5, name=f"sig{a}{b}") for b in range(4)] for a in range(4)]   # signals now P->C
        tok = [[Signal(ib, name=f"tok{a}{b}") for b in range(4)] for a in range(4)]
        tok_ok = [Signal(name=f"tok_ok{c}") for c in range(4)]
        for c in range(4):
            conds = [~q.h_dpdon[c][pp] | (tok[pp][c] != 0) | (sig[pp][c] != 0) for pp in range(4) if pp != c]
            acc = Const(1)
            for x in conds:
                acc = acc & x
            m.d.comb += tok_ok[c].eq(acc)
        return SimpleNamespace(sig=sig, tok=tok, tok_ok=tok_ok)

    def _single_issue(self, m, run, q, tk, start):
        """The single-issue engines LOAD, CONV and MISC: start rule, busy flag, the running index."""
        ib = self.p.idx_bits
        ctl = {Engine.LOAD: self.load, Engine.CONV: self.conv, Engine.MISC: self.misc}
        busy = {}
        r_idx = {}
        r_by = {}
        for e, c in ctl.items():
            busy[e] = Signal(name=f"busy{e}")
            r_idx[e] = Signal(ib, name=f"ridx{e}")
            r_by[e] = Signal(4, name=f"rby{e}")
            free = ~busy[e] | c.end
            m.d.comb += start[e].eq(run & q.hv[e] & free & tk.tok_ok[e])
            m.d.comb += [c.start.eq(start[e]), c.instr.eq(q.h_instr[e])]
            with m.If(start[e]):
                m.d.sync += [busy[e].eq(1), r_idx[e].eq(q.h_idx[e]), r_by[e].eq(q.h_dpdby[e])]
            with m.Elif(c.end):
                m.d.sync += busy[e].eq(0)
        return SimpleNamespace(ctl=ctl, busy=busy, r_idx=r_idx, r_by=r_by)

    def _save_engine(self, m, run, q, tk, se, start):
        """The SAVE engine: SAVE units (one per port), the END timer and the reorder buffer; in-order
        retire (with the token signals of every engine) and the start rule of the SAVE queue head."""
        p = self.p
        ib = p.idx_bits
        R = p.save_rob_entries
        ports = p.ddr_ports
        rob_v = Array(Signal(name=f"rob_v{i}") for i in range(R))
        rob_ended = Array(Signal(name=f"rob_ended{i}") for i in range(R))
        rob_idx = Array(Signal(ib, name=f"rob_idx{i}") for i in range(R))
        rob_by = Array(Signal(4, name=f"rob_by{i}") for i in range(R))
        rob_end = Array(Signal(name=f"rob_isend{i}") for i in range(R))
        rob_rd = Signal(range(R))
        rob_wr = Signal(range(R))
        rob_cnt = Signal(range(R + 1))
        u_busy = [Signal(name=f"ubusy{u}") for u in range(ports)]
        u_slot = [Signal(range(R), name=f"uslot{u}") for u in range(ports)]
        u_idx = [Signal(ib, name=f"uidx{u}") for u in range(ports)]
        et_busy = Signal()
        et_cnt = Signal(range(p.t.end_cycles + 1))
        et_slot = Signal(range(R))
        et_idx = Signal(ib)
        et_end = Signal()
        m.d.comb += et_end.eq(et_busy & (et_cnt == 1))
        with m.If(et_busy):
            m.d.sync += et_cnt.eq(et_cnt - 1)
            with m.If(et_end):
                m.d.sync += et_busy.eq(0)
        rob = SimpleNamespace(rob_v=rob_v, rob_ended=rob_ended, rob_idx=rob_idx, rob_by=rob_by, rob_end=rob_end,
                              rob_rd=rob_rd, rob_wr=rob_wr, rob_cnt=rob_cnt, u_busy=u_busy, u_slot=u_slot,
                              u_idx=u_idx, et_busy=et_busy, et_cnt=et_cnt, et_slot=et_slot, et_idx=et_idx,
                              et_end=et_end)
        ret, slots, n_ret, end_retires = self._retire(m, rob, tk, se)
        self._save_start(m, run, q, tk, rob, n_ret, start)
        rob.ret, rob.slots, rob.end_retires = ret, slots, end_retires
        return rob

    def _retire(self, m, rob, tk, se):
        """Which ROB entries end this cycle, the in-order retire of a ROB prefix, and the token signals of
        the retiring instructions (SAVE engine: retired ROB entries; LOAD, CONV, MISC: their end)."""
        p = self.p
        R = p.save_rob_entries
        ports = p.ddr_ports
        sig = tk.sig
        # which ROB entries end this cycle
        ending = [Signal(name=f"ending{i}") for i in range(R)]
        for i in range(R):
            x = rob.et_end & (rob.et_slot == i)
            for u in range(ports):
                x = x | (self.save[u].end & (rob.u_slot[u] == i))
            m.d.comb += ending[i].eq(x)
        ending_arr = Array(ending)
        for u in range(ports):
            with m.If(self.save[u].end):
                m.d.sync += [rob.rob_ended[rob.u_slot[u]].eq(1)]
        with m.If(rob.et_end):
            m.d.sync += rob.rob_ended[rob.et_slot].eq(1)

        # in-order retire of a prefix of the ROB
        ret = []
        prev = Const(1)
        slots = []
        for k in range(R):
            sl = Signal(range(R), name=f"rob_sl{k}")
            s = rob.rob_rd + k
            m.d.comb += sl.eq(Mux(s >= R, s - R, s))
            ok = Signal(name=f"rob_ret{k}")
            m.d.comb += ok.eq(prev & (k < rob.rob_cnt) & (rob.rob_ended[sl] | ending_arr[sl]))
            prev = ok
            ret.append(ok)
            slots.append(sl)
        n_ret = Signal(range(R + 1))
        m.d.comb += n_ret.eq(sum(ret))
        for cc in range(4):
            if cc != Engine.SAVE:
                m.d.comb += sig[Engine.SAVE][cc].eq(sum(r & rob.rob_by[sl][cc] for r, sl in zip(ret, slots)))
        for e in se.ctl:
            for cc in range(4):
                if cc != e:
                    m.d.comb += sig[e][cc].eq(se.ctl[e].end & se.r_by[e][cc])
        end_retires = Signal()
        m.d.comb += end_retires.eq(sum(r & rob.rob_end[sl] for r, sl in zip(ret, slots)) != 0)
        return ret, slots, n_ret, end_retires

    def _save_start(self, m, run, q, tk, rob, n_ret, start):
        """The start rule of the SAVE engine head (own bit, port, ROB room), the SAVE unit / END timer it
        starts, and the ROB write."""
        p = self.p
        t = p.t
        R = p.save_rob_entries
        ports = p.ddr_ports
        rob_wr = rob.rob_wr
        sv = Engine.SAVE
        h_instr = q.h_instr
        s_is_end = h_instr[sv][28:32] == END_OPCODE
        hp = h_instr[sv][32 + 29:32 + 31]
        port = Signal(range(max(ports, 2)))
        m.d.comb += port.eq(hp % ports)
        port_free = Signal()
        pf = Const(0)
        for u in range(ports):
            pf = pf | ((port == u) & (~rob.u_busy[u] | self.save[u].end))
        m.d.comb += port_free.eq(pf)
        own_ok = ~q.h_dpdon[sv][Engine.SAVE] | ((rob.rob_cnt - n_ret) == 0)
        rob_room = (rob.rob_cnt - n_ret) < R
        want = run & q.hv[sv] & own_ok & tk.tok_ok[sv] & (s_is_end | port_free)
        m.d.comb += start[sv].eq(want & rob_room)
        with m.If(want & ~rob_room):
            m.d.sync += q.err.eq(q.err | ERR_ROB)
        for u in range(ports):
            su = Signal(name=f"save_start{u}")
            m.d.comb += su.eq(start[sv] & ~s_is_end & (port == u))
            m.d.comb += [self.save[u].start.eq(su), self.save[u].instr.eq(h_instr[sv])]
            with m.If(su):
                m.d.sync += [rob.u_busy[u].eq(1), rob.u_slot[u].eq(rob_wr), rob.u_idx[u].eq(q.h_idx[sv])]
            with m.Elif(self.save[u].end):
                m.d.sync += rob.u_busy[u].eq(0)
        with m.If(start[sv] & s_is_end):
            m.d.sync += [rob.et_busy.eq(1), rob.et_cnt.eq(t.end_cycles), rob.et_slot.eq(rob_wr),
                         rob.et_idx.eq(q.h_idx[sv])]
        with m.If(start[sv]):
            m.d.sync += [rob.rob_v[rob_wr].eq(1), rob.rob_ended[rob_wr].eq(0), rob.rob_idx[rob_wr].eq(q.h_idx[sv]),
                         rob.rob_by[rob_wr].eq(q.h_dpdby[sv]), rob.rob_end[rob_wr].eq(s_is_end),
                         rob_wr.eq(Mux(rob_wr == R - 1, 0, rob_wr + 1))]
        nrr = rob.rob_rd + n_ret
        m.d.sync += [rob.rob_rd.eq(Mux(nrr >= R, nrr - R, nrr)), rob.rob_cnt.eq(rob.rob_cnt + start[sv] - n_ret)]

    # ---------------- token counters, queue pointers -----------------------------------------------
    def _token_counters(self, m, q, tk, start):
        """Tokens: + signalled, - consumed by a start; queue read pointers and occupancy."""
        Q = self.p.t.queue_depth
        tok, sig = tk.tok, tk.sig
        for a in range(4):
            for b in range(4):
                if a != b:
                    use = start[b] & q.h_dpdon[b][a]
                    m.d.sync += tok[a][b].eq(tok[a][b] + sig[a][b] - use)
        for e in range(4):
            with m.If(start[e]):
                m.d.sync += q.q_rd[e].eq(Mux(q.q_rd[e] == Q - 1, 0, q.q_rd[e] + 1))
            m.d.sync += q.q_occ[e].eq(q.q_occ[e] + q.disp_to[e] - start[e])

    # ---------------- done, counters, trace --------------------------------------------------------
    def _done_and_trace(self, m, run, q, se, sv, start):
        """ap_done at END's retire, the start / end counters and the trace outputs."""
        p = self.p
        R = p.save_rob_entries
        ports = p.ddr_ports
        ctl, r_idx = se.ctl, se.r_idx
        m.d.comb += self.done.eq(run & sv.end_retires)
        with m.If(run & sv.end_retires):
            m.d.sync += run.eq(0)
        ends = [self.load.end, self.save[0].end, self.conv.end, self.misc.end]
        n_save_end = sum(self.save[u].end for u in range(ports)) + sv.et_end
        for e in range(4):
            m.d.sync += self.cnt_start[e].eq(self.cnt_start[e] + start[e])
            m.d.sync += self.cnt_end[e].eq(self.cnt_end[e] + (n_save_end if e == Engine.SAVE else ends[e]))
        for e in range(4):
            m.d.comb += [self.tr_start_v[e].eq(start[e]), self.tr_start_idx[e].eq(q.h_idx[e])]
        for j, e in enumerate((Engine.LOAD, Engine.CONV, Engine.MISC)):
            m.d.comb += [self.tr_end_v[j].eq(ctl[e].end), self.tr_end_idx[j].eq(r_idx[e]),
                         self.tr_ret_v[j].eq(ctl[e].end), self.tr_ret_idx[j].eq(r_idx[e])]
        for u in range(ports):
            m.d.comb += [self.tr_end_v[3 + u].eq(self.save[u].end), self.tr_end_idx[3 + u].eq(sv.u_idx[u])]
        m.d.comb += [self.tr_end_v[3 + ports].eq(sv.et_end), self.tr_end_idx[3 + ports].eq(sv.et_idx)]
        for k in range(R):
            m.d.comb += [self.tr_ret_v[3 + k].eq(sv.ret[k]), self.tr_ret_idx[3 + k].eq(sv.rob_idx[sv.slots[k]])]

    # ---------------- a new run resets every piece of state --------------------------------------
    def _reset(self, m, go, f, q, tk, se, sv):
        tok = tk.tok
        with m.If(go):
            m.d.sync += [f.f_wr.eq(0), f.f_rd.eq(0), f.f_cnt.eq(0), q.disp_idx.eq(0), q.end_seen.eq(0), q.err.eq(0),
                         sv.rob_rd.eq(0), sv.rob_wr.eq(0), sv.rob_cnt.eq(0), sv.et_busy.eq(0)]
            m.d.sync += [x.eq(0) for x in q.q_wr + q.q_rd + q.q_occ + sv.u_busy + list(se.busy.values())]
            m.d.sync += [tok[a][b].eq(0) for a in range(4) for b in range(4) if a != b]
            m.d.sync += [self.cnt_start[e].eq(0) for e in range(4)]
            m.d.sync += [self.cnt_end[e].eq(0) for e in range(4)]
