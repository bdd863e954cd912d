"""The on-chip banks (spec §2.2-2.3) and their port arbiter (docs/bank-ports.md).

IMG_BG image groups of PP banks, OCP CONVW banks, DWCONVW, BIAS. Each bank is a `lib.memory.Memory`
of DEPTH lines of W bytes. Every access is a whole line: a bank write of n bytes always starts at a
line boundary and zero-fills the rest of its last line, so engines write whole lines. Engines address
image banks by absolute bank id, one request per pixel row; the array routes each request to its bank.

Ports (docs/bank-ports.md §1): every bank has **one read port** (read-first: a read and a write of the
same line in one cycle return the old line) and **one write port**, with the request muxing in front of
them.

* Not arbitrated (one user per port): the CONVW banks (read by CONV, written by LOAD), DWCONVW (read
  by MISC, written by LOAD), the BIAS write port (LOAD). With the wide weight path (p.weight_lines = 2) each
  CONVW bank is two memories, even and odd lines, so LOAD writes two consecutive lines in one cycle.
* Arbitrated: the image-bank write ports (LOAD, CONV rows, MISC rows), the image-bank read ports
  (CONV rows, MISC rows, each SAVE unit) and the BIAS read port (CONV, MISC).

Arbitration (docs/bank-ports.md §3): fixed priority CONV > MISC > LOAD > SAVE unit 0 > SAVE unit 1 ...,
all or nothing per engine: an engine is granted (`*_go`) when none of the banks it reads is read, and
none of the banks it writes is written, by an engine granted before it, and none of the banks it writes
has a busy write port (its write queue is draining, below). Rows of one engine that address the same
bank are one read access. A request is what the engine enables in the cycle; requests are functions of
the engines' registers only (never of a grant) and the busy bits are registers, so there is no
combinational loop. Grants gate the memory enables.

A refused engine is frozen by its owner (the core wraps it in an `EnableInserter` on `*_go`, see
`freeze`). Because the shared read port may serve another engine while one is frozen, each read row of
an engine that can be refused has a hold register. In the cycle after a granted cycle the engine sees
the port's data (of the read it was granted) and the hold register takes it; in the cycles after a
refused cycle it sees the hold register. So a frozen engine finds the data of its last granted read
when it resumes. CONV can be refused only by a busy write port, so on targets without a write queue
(`write_lines(p)` = 1) `conv_go` is constant 1 and CONV has no hold registers.

Write queue (docs/bank-ports.md §2). ISA1's output placement (spec §2.4) puts up to `stride_out`
consecutive output rows of one CONV or ALU into one bank, at different lines, written in the same
cycle. Each image bank has one write port and a queue of `write_lines(p)` − 1 entries (line address +
one line) in front of it. In a granted cycle the rows of the writing engine that hit bank b are ranked
by row index h (rank = number of lower rows hitting b); rank 0 is written in the grant cycle, ranks
1.. are loaded into the queue and written one per cycle in the following cycles (lowest h first, so a
later row wins a shared line, as in the executor). While the queue holds a line (`busy`, a register)
the port belongs to it and every engine's write request to the bank is refused. A grant therefore
finds the queue empty.
"""
from __future__ import annotations

from amaranth.hdl import Const, EnableInserter, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from . import iface
from .params import HwParams, alu_write_lines, conv_write_lines


def write_lines(p: HwParams) -> int:
    """The most lines one granted write puts into one image bank (all from one engine): the most output
    rows of one CONV / ALU that can share a bank, min(rows, stride_out_h limit of the target). The
    bank's write queue holds write_lines(p) − 1 of them."""
    return max(conv_write_lines(p.target), alu_write_lines(p.target))


def _any(terms):
    v = 0
    for x in terms:
        v = v | x
    return v


class BankArray(wiring.Component):
    """All banks of one core, their request muxing and the arbiter (see the module docstring).

    Grant outputs: `conv_go`, `misc_go`, `load_go`, `save_go[u]`. A grant is high when the engine's
    request of this cycle is served (an empty request is always served)."""

    def __init__(self, p: HwParams):
        self.p = p
        super().__init__({
            "load_wr": In(iface.load_write(p)),
            "conv_rd": In(iface.bank_read(p)).array(p.pp),
            "conv_wr": In(iface.bank_write(p)).array(p.pp),
            "convw_rd": In(iface.convw_read(p)),
            "conv_bias_rd": In(iface.line_read(p)),
            "misc_rd": In(iface.bank_read(p)).array(p.alu_pp),
            "misc_wr": In(iface.bank_write(p)).array(p.alu_pp),
            "dw_rd": In(iface.line_read(p)),
            "misc_bias_rd": In(iface.line_read(p)),
            "save_rd": In(iface.bank_read(p)).array(p.ddr_ports),
            "conv_go": Out(1),
            "misc_go": Out(1),
            "load_go": Out(1),
            "save_go": Out(p.ddr_ports),
        })
        self.lines = write_lines(p)          # write queue: lines - 1 entries per image bank
        # One memory per bank id; tests read and write them through `line(b, ln)`. With the wide weight path
        # (p.weight_lines = 2) each CONVW bank is two memories of DEPTH/2 lines, even and odd lines (`halves`), so
        # that LOAD writes two consecutive lines per cycle; its entry in `mems` is None.
        self.wide = p.weight_lines == 2
        convw = range(p.convw_base, p.convw_base + p.ocp)
        self.halves = {b: tuple(Memory(shape=8 * p.width, depth=p.depth // 2, init=[]) for _ in range(2))
                       for b in convw} if self.wide else {}
        self.mems = [None if b in self.halves else Memory(shape=8 * p.width, depth=p.depth, init=[])
                     for b in range(p.num_banks)]

    def line(self, b: int, ln: int):
        """The simulator-visible storage of line `ln` of bank `b` (for tests: ctx.get / ctx.set)."""
        if b in self.halves:
            return self.halves[b][ln & 1].data[ln >> 1]
        mem = self.mems[b]
        assert mem is not None                 # None only for a bank kept in `halves`
        return mem.data[ln]

    def elaborate(self, platform):
        p = self.p
        m = Module()
        nimg = p.num_img_banks
        bias = p.bias_bank
        ab = p.addr_bits
        W8 = 8 * p.width
        for b, mem in enumerate(self.mems):
            if mem is not None:
                m.submodules[f"bank{b}"] = mem
        for b, hv in self.halves.items():
            m.submodules[f"bank{b}_even"], m.submodules[f"bank{b}_odd"] = hv

        # ---- per-row bank hits (request of one row for one image bank) ----
        def hits(r, tag):
            out = []
            for b in range(nimg):
                s = Signal(name=f"{tag}_hit{b}")
                m.d.comb += s.eq(r.en & (r.bank == b))
                out.append(s)
            return out

        conv_rh = [hits(r, f"conv_r{h}") for h, r in enumerate(self.conv_rd)]
        misc_rh = [hits(r, f"misc_r{h}") for h, r in enumerate(self.misc_rd)]
        save_rh = [hits(r, f"save{u}_r") for u, r in enumerate(self.save_rd)]
        conv_wh = [hits(r, f"conv_w{h}") for h, r in enumerate(self.conv_wr)]
        misc_wh = [hits(r, f"misc_w{h}") for h, r in enumerate(self.misc_wr)]
        load_wh = hits(self.load_wr, "load_w")

        # ---- request sets (one bit per arbitrated port; rows of one engine merge) ----
        def rset(rows_hits, bias_en, tag):
            s = Signal(nimg + 1, name=f"{tag}_rset")        # bit nimg: the BIAS read port
            m.d.comb += s.eq(sum((_any(rh[b] for rh in rows_hits) << b) for b in range(nimg))
                             | (bias_en << nimg))
            return s

        def wset(rows_hits, tag):
            s = Signal(nimg, name=f"{tag}_wset")
            m.d.comb += s.eq(sum((_any(rh[b] for rh in rows_hits) << b) for b in range(nimg)))
            return s

        r_conv = rset(conv_rh, self.conv_bias_rd.en, "conv")
        r_misc = rset(misc_rh, self.misc_bias_rd.en, "misc")
        r_save = [rset([save_rh[u]], 0, f"save{u}") for u in range(p.ddr_ports)]
        w_conv = wset(conv_wh, "conv")
        w_misc = wset(misc_wh, "misc")
        w_load = wset([load_wh], "load")

        # ---- write queues: busy[b] = the queue of bank b holds a line (a register) ----
        K = self.lines
        qn = K - 1
        q_valid = [[Signal(name=f"q{b}_v{i}") for i in range(qn)] for b in range(nimg)]
        q_addr = [[Signal(ab, name=f"q{b}_a{i}", reset_less=True) for i in range(qn)] for b in range(nimg)]
        q_data = [[Signal(W8, name=f"q{b}_d{i}", reset_less=True) for i in range(qn)] for b in range(nimg)]
        busy = Signal(nimg, name="wq_busy")
        m.d.comb += busy.eq(sum((q_valid[b][0] << b) for b in range(nimg)) if qn else 0)

        # ---- the arbiter: CONV > MISC > LOAD > SAVE 0 > SAVE 1 ... ----
        go_conv, go_misc, go_load = self.conv_go, self.misc_go, self.load_go
        m.d.comb += go_conv.eq((w_conv & busy) == 0)
        tr_conv = Signal(nimg + 1, name="taken_r_conv")
        tw_conv = Signal(nimg, name="taken_w_conv")
        m.d.comb += [tr_conv.eq(Mux(go_conv, r_conv, 0)), tw_conv.eq(Mux(go_conv, w_conv, 0) | busy)]
        m.d.comb += go_misc.eq(((r_misc & tr_conv) == 0) & ((w_misc & tw_conv) == 0))
        taken_r = Signal(nimg + 1, name="taken_r_misc")
        taken_w = Signal(nimg, name="taken_w_misc")
        m.d.comb += [taken_r.eq(tr_conv | Mux(go_misc, r_misc, 0)), taken_w.eq(tw_conv | Mux(go_misc, w_misc, 0))]
        m.d.comb += go_load.eq((w_load & taken_w) == 0)
        go_save = []
        for u in range(p.ddr_ports):
            g = Signal(name=f"save{u}_go")
            m.d.comb += [g.eq((r_save[u] & taken_r) == 0), self.save_go[u].eq(g)]
            nt = Signal(nimg + 1, name=f"taken_r_save{u}")
            m.d.comb += nt.eq(taken_r | Mux(g, r_save[u], 0))
            taken_r = nt
            go_save.append(g)

        # ---- image-bank read ports: one per bank, muxed between the granted rows ----
        rd_src = ([(r, rh, go_conv) for r, rh in zip(self.conv_rd, conv_rh)]
                  + [(r, rh, go_misc) for r, rh in zip(self.misc_rd, misc_rh)]
                  + [(r, rh, g) for r, rh, g in zip(self.save_rd, save_rh, go_save)])
        datas = []
        for b in range(nimg):
            rp = self.mems[b].read_port(transparent_for=())
            sel = _named(m, [rh[b] & g for _, rh, g in rd_src], f"rd{b}_sel")
            m.d.comb += [rp.en.eq(_any(sel)),
                         rp.addr.eq(_any(Mux(s, r.addr, 0) for (r, _, _), s in zip(rd_src, sel)))]
            datas.append(rp.data)

        # per engine: the cycle after a granted cycle ("fresh") shows the port; else the hold register
        fresh = {}
        for tag, g in (([("conv", go_conv)] if K > 1 else []) + [("misc", go_misc)]
                       + [(f"save{u}", go_save[u]) for u in range(p.ddr_ports)]):
            f = Signal(name=f"{tag}_fresh")
            m.d.sync += f.eq(g)
            fresh[tag] = f

        def deliver(raw, eng, tag, dst):
            """Drive `dst` (read data of engine `eng`) from `raw`, through a hold register unless the engine
            is never refused (CONV without write queues)."""
            if eng == "conv" and K == 1:
                m.d.comb += dst.eq(raw)
                return
            held = Signal(len(dst), name=f"{tag}_held", reset_less=True)
            with m.If(fresh[eng]):
                m.d.sync += held.eq(raw)
            m.d.comb += dst.eq(Mux(fresh[eng], raw, held))

        def route(reqs, go, tag):
            for h, r in enumerate(reqs):
                sel = Signal(range(max(nimg, 2)), name=f"{tag}_sel{h}")
                with m.If(r.en & go):
                    m.d.sync += sel.eq(r.bank)
                raw = Signal(W8, name=f"{tag}_raw{h}")
                with m.Switch(sel):
                    for b in range(nimg):
                        with m.Case(b):
                            m.d.comb += raw.eq(datas[b])
                deliver(raw, tag, f"{tag}_r{h}", r.data)

        route(list(self.conv_rd), go_conv, "conv")
        route(list(self.misc_rd), go_misc, "misc")
        for u in range(p.ddr_ports):
            route([self.save_rd[u]], go_save[u], f"save{u}")

        # ---- image-bank write ports: one per bank, behind its write queue ----
        def ranks(rows_hits, b, tag):
            """Per row: its rank among the rows of one engine that hit bank b (lower rows first)."""
            out, below = [], []
            for h, rh in enumerate(rows_hits):
                if K == 1 or not below:
                    out.append(Const(0, 1))
                else:
                    r = Signal(range(len(below) + 1), name=f"{tag}_rank{h}_b{b}")
                    m.d.comb += r.eq(sum(below))
                    out.append(r)
                below.append(rh[b])
            return out

        for b in range(nimg):
            src = ([(r, wh[b], go_conv, k) for r, wh, k in zip(self.conv_wr, conv_wh, ranks(conv_wh, b, "conv"))]
                   + [(r, wh[b], go_misc, k) for r, wh, k in zip(self.misc_wr, misc_wh, ranks(misc_wh, b, "misc"))]
                   + [(self.load_wr, load_wh[b], go_load, Const(0, 1))])
            slots = []
            for j in range(K):                       # slot j: the row of rank j of the granted writer
                sel = _named(m, [hit & g & (k == j) for _, hit, g, k in src], f"w{b}_s{j}_sel")
                en = Signal(name=f"w{b}_s{j}_en")
                addr = Signal(ab, name=f"w{b}_s{j}_addr")
                data = Signal(W8, name=f"w{b}_s{j}_data")
                m.d.comb += [en.eq(_any(sel)),
                             addr.eq(_any(Mux(s, r.addr, 0) for (r, _, _, _), s in zip(src, sel))),
                             data.eq(_any(Mux(s, r.data, 0) for (r, _, _, _), s in zip(src, sel)))]
                slots.append((en, addr, data))
            wp = self.mems[b].write_port()
            if qn == 0:
                m.d.comb += [wp.en.eq(slots[0][0]), wp.addr.eq(slots[0][1]), wp.data.eq(slots[0][2])]
                continue
            qv, qa, qd = q_valid[b], q_addr[b], q_data[b]
            m.d.comb += [wp.en.eq(qv[0] | slots[0][0]),
                         wp.addr.eq(Mux(qv[0], qa[0], slots[0][1])),
                         wp.data.eq(Mux(qv[0], qd[0], slots[0][2]))]
            with m.If(qv[0]):                        # draining: write the head, shift the queue
                for i in range(qn):
                    if i + 1 < qn:
                        m.d.sync += [qv[i].eq(qv[i + 1]), qa[i].eq(qa[i + 1]), qd[i].eq(qd[i + 1])]
                    else:
                        m.d.sync += qv[i].eq(0)
            with m.Else():                           # idle: load ranks 1.. of this cycle's write (if any)
                for i in range(qn):
                    en, addr, data = slots[i + 1]
                    m.d.sync += [qv[i].eq(en), qa[i].eq(addr), qd[i].eq(data)]

        # ---- parameter banks: LOAD is their only writer ----
        lw = self.load_wr
        for b in range(nimg, p.num_banks):
            if b in self.halves:
                continue
            wp = self.mems[b].write_port()
            m.d.comb += [wp.addr.eq(lw.addr), wp.data.eq(lw.data), wp.en.eq(lw.en & (lw.bank == b) & go_load)]
        if self.wide:
            # split CONVW bank: line l in half l & 1 at l >> 1; LOAD's two lines l, l + 1 are in different halves
            a2 = Signal(ab, name="load_wr_addr2")
            m.d.comb += a2.eq(lw.addr + 1)
            for b, hv in self.halves.items():
                e1 = Signal(name=f"w{b}_e1")
                e2 = Signal(name=f"w{b}_e2")
                m.d.comb += [e1.eq(lw.en & (lw.bank == b) & go_load), e2.eq(lw.en2 & (lw.bank == b) & go_load)]
                for h, mem in enumerate(hv):
                    wp = mem.write_port()
                    first = lw.addr[0] == h                  # line 1 of the cycle is in this half
                    m.d.comb += [wp.en.eq(Mux(first, e1, e2)),
                                 wp.addr.eq(Mux(first, lw.addr[1:], a2[1:])),
                                 wp.data.eq(Mux(first, lw.data, lw.data2))]
        # CONVW: CONV only; a frozen CONV reads nothing, so the ports keep their data (no hold register)
        ren = self.convw_rd.en & go_conv
        par = Signal(name="convw_par")                     # split banks: the half that holds the line being read
        if self.wide:
            with m.If(ren):
                m.d.sync += par.eq(self.convw_rd.addr[0])
        for o in range(p.ocp):
            b = p.convw_base + o
            if b not in self.halves:
                rp = self.mems[b].read_port(transparent_for=())
                m.d.comb += [rp.addr.eq(self.convw_rd.addr), rp.en.eq(ren), self.convw_rd.data[o].eq(rp.data)]
                continue
            rps = [mem.read_port(transparent_for=()) for mem in self.halves[b]]
            for rp in rps:
                m.d.comb += [rp.addr.eq(self.convw_rd.addr[1:]), rp.en.eq(ren)]
            m.d.comb += self.convw_rd.data[o].eq(Mux(par, rps[1].data, rps[0].data))
        # DWCONVW: MISC only; a frozen MISC reads nothing, so the port keeps its data (no hold register)
        rp = self.mems[p.dwconvw_bank].read_port(transparent_for=())
        m.d.comb += [rp.addr.eq(self.dw_rd.addr), rp.en.eq(self.dw_rd.en & go_misc), self.dw_rd.data.eq(rp.data)]
        # BIAS: CONV and MISC share the read port
        rp = self.mems[bias].read_port(transparent_for=())
        conv_b = self.conv_bias_rd.en & go_conv
        m.d.comb += [rp.en.eq(conv_b | (self.misc_bias_rd.en & go_misc)),
                     rp.addr.eq(Mux(conv_b, self.conv_bias_rd.addr, self.misc_bias_rd.addr))]
        deliver(rp.data, "conv", "conv_bias", self.conv_bias_rd.data)
        deliver(rp.data, "misc", "misc_bias", self.misc_bias_rd.data)
        return m


def _named(m, exprs, prefix):
    """Each select expression as a Signal of its own: used in several places, an expression would be emitted
    again at every use (and once per bit under `replicate`), which bloats the Verilog and the simulator builds."""
    out = []
    for i, e in enumerate(exprs):
        s = Signal(name=f"{prefix}{i}")
        m.d.comb += s.eq(e)
        out.append(s)
    return out


# ---- engine freeze -------------------------------------------------------------------------------
def freeze(engine, go):
    """`engine` with its sync domain enabled by `go` (a refused engine does not advance); add the result
    as the submodule. With go = None the engine is returned unchanged."""
    return engine if go is None else EnableInserter({"sync": go})(engine)


def connect_load_ddr(m, load, port, go):
    """LOAD's DDR read port to `port` (responder side, e.g. the core's flipped ddr_rd): a refused LOAD
    reads nothing, and the data of its last granted read is held for it while it is frozen."""
    p_data = port.data
    m.d.comb += [port.en.eq(load.ddr_rd.en & go), port.addr.eq(load.ddr_rd.addr)]
    fresh = Signal(name="load_ddr_fresh")
    held = Signal(len(p_data), name="load_ddr_held", reset_less=True)
    m.d.sync += fresh.eq(go)
    with m.If(fresh):
        m.d.sync += held.eq(p_data)
    m.d.comb += load.ddr_rd.data.eq(Mux(fresh, p_data, held))


def connect_save_ddr(m, unit, port, go):
    """A SAVE unit's DDR write port to `port`: a refused unit writes nothing (it presents the same beat
    again when it resumes)."""
    w = unit.ddr_wr
    m.d.comb += [port.en.eq(w.en & go), port.addr.eq(w.addr), port.data.eq(w.data), port.mask.eq(w.mask)]


# ---- wiring of each engine to its BankArray ports (used by the core and by the block tests) ----------
def connect_load(m, load, banks):
    wiring.connect(m, load.bank_wr, banks.load_wr)


def connect_save(m, unit, banks, u: int):
    wiring.connect(m, unit.bank_rd, banks.save_rd[u])


def connect_conv(m, conv, banks):
    for h in range(banks.p.pp):
        wiring.connect(m, conv.img_rd[h], banks.conv_rd[h])
        wiring.connect(m, conv.img_wr[h], banks.conv_wr[h])
    wiring.connect(m, conv.w_rd, banks.convw_rd)
    wiring.connect(m, conv.bias_rd, banks.conv_bias_rd)


def connect_misc(m, misc, banks):
    for h in range(banks.p.alu_pp):
        wiring.connect(m, misc.img_rd[h], banks.misc_rd[h])
        wiring.connect(m, misc.img_wr[h], banks.misc_wr[h])
    wiring.connect(m, misc.dw_rd, banks.dw_rd)
    wiring.connect(m, misc.bias_rd, banks.misc_bias_rd)
