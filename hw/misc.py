"""The MISC engine: ALUINIT / ALU (every ISA1 exec_mode 0-8) and ELEWINIT / ELEW (spec §6.7, §6.8).

Bit-exact reference: `sim/_kernels.py::_alu` / `_elew`. Cycle cost (docs/microarchitecture.md §3):

* ALUINIT, ELEWINIT: `init_cycles` (end = s + init_cycles; the INIT state is latched in cycle s).
* ALU:  `alu_latency + N`,  N = length * kernel_h * kernel_w * kernel_d * channel_group.
* ELEW: `elew_latency + N`, N = length * channel_group * num.

Micro-architecture. One loop step per cycle, steps in cycles s+1 .. s+N; then the fixed-latency tail
(`end` rises `latency` cycles after the last step).

ALU, loop order (w, g, ky, kx, d) with d innermost: every output line (column w, channel group g,
ALU_PP rows x CP channels) is finished after its kernel_h*kernel_w*kernel_d consecutive steps, so only
one accumulator set of ALU_PP x CP lanes is needed. A step reads, for every output row h < vpp, line
`base[pass] + ((soi+ky) mod stride_h)*jump_read_endl + (w*stride_w+kx)*jump_read + d*cg + g` of the
row's bank (rows of one step sit in distinct banks of the conv-PP group, spec §2.4), plus one DWCONVW
line. Every address is a counter (no multiplier in the loop). Pool modes with kernel_d > 1 run the
kd steps (the cost counts them) but only d = 0 contributes (the executor uses kd = 1).

ELEW, loop order (j, g, k): step (j, g, k) reads input k's line for the vpp rows; the output line is
complete after the num-th input.

ALU and ELEW share one lane datapath (ALU_PP rows x CP channels). Pipeline of a step issued in cycle c:

    c    S0  issue the row reads and the DWCONVW read; padding / channel_offset flags
    c+1  S1  prod = (xv * w) >> psh: xv = the byte, or PV on pads and channel_offset lanes; w = int8
             weight (doubled in mode 0) / alpha, int16 weight (mode 8), multi_factor (2, 4), 2731 (7),
             1 (3, 5, prelu x >= 0); ELEW: w = 4, psh = shift_read (t = (x<<2) >> shift_read).
             The first step of an output line reads its BIAS line (mode 0).
    c+2  S2  acc = sum (max for modes 3/5, t0*t1 for ELEW mult); a sum starts from bias<<shift_bias
             (mode 0: acc = 2*sum + bias*2^sb) or 3*2731<<shift_bias (mode 7)
    c+3  S3  v = (acc * 256 + rc) >> sh: the signed rounding shift (for a < 0 and leaky: acc * 26*256
             and k + 8; prelu: sn for a < 0, sp otherwise)
    c+4  S4  byte = min(y_hi, max(y_lo, v)): ReLU (y_lo 0), ReLU6 (y_hi 96), int8 saturation and the
             hsigmoid clamp to [0, 2^32] (y_hi = min(127, rhu(2^32 / 2^shift_cut)), exact because the
             rounding shift is monotonic) -> write registers
    c+5  S5  the ALU_PP write rows are issued (whole lines)

so the last write is issued in cycle s+N+5 <= s+cost-1: alu_latency >= 6 and elew_latency >= 6
(hw/params.MIN_LATENCY).

Shift codes k < 0 (left shifts) are clamped to -8 and k > 50 to 50; both are exact after saturation
for the value ranges: |acc| <= 2^20 kernel positions * 128 * 32768 = 2^42 (mode 8), |26*acc| < 2^47.
Every lane computation sits under its stage's valid flag, datapath registers have no reset, and
values are widened by arithmetic, not by Mux or assignment (which the Verilog backend emits as bit
replication): this keeps the Verilator model fast.

The per-instruction constants of the output placement (stride_offset_out / stride_out, bank group
wrap) use small dividers on registered instruction fields; they are stable for the whole instruction
and first needed in S5.

Semantic note: the engine streams, like the hardware. An instruction whose output lines overlap its own
input lines (a later step reads a line an earlier step wrote), or that writes one line twice, can differ
from the executor, which reads the whole tile before writing row by row (tests/test_hw_misc.py keeps
its random programs free of both; co-simulating real programs is the check that they are too).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


from . import iface
from .decode import fields, header, opcode, raw
from .params import HwParams
from .util import split_img_bank

ACC_W = 46        # accumulator (|acc| <= 2^42, see the module docstring)
KMAX = 50         # right shifts >= KMAX give 0 for |26*acc| < 2^49
KMIN = -8         # left shifts beyond 8 saturate anyway
RC_W = 59         # rounding constant 2^(k+7) of the shift by k+8
V_W = 62          # acc * (256 | 26*256) + rc


def _clamp(v, lo, hi):
    return Mux(v < lo, lo, Mux(v > hi, hi, v))


def _shift_consts(m, k, kmax, width, name):
    """(sh, rc) so that ((a << 8) + rc) >> sh == rhu(a / 2^k) for k in [KMIN, kmax] (clamped outside)."""
    kc = _clamp(k, KMIN, kmax)
    sh = Signal(range(kmax + 9), name=f"{name}_sh")
    rc = Signal(width, name=f"{name}_rc")
    top = Const(1 << (width - 1), width)
    m.d.comb += [sh.eq(kc + 8), rc.eq(Mux(kc > 0, top >> (width - 8 - kc)[:6], 0))]
    return sh, rc


def _sext(v, width):
    """v (signed) widened to `width` bits by an adder (native sign extension in the generated Verilog)."""
    return (v + Const(0, signed(width)))[:width].as_signed()


def _sigs(m, op, words, prefix):
    """The logical field values of `op` in `words`, each as a named Signal (one decoder per field)."""
    out = {}
    for name, v in fields(op, words).items():
        s = Signal(v.shape(), name=f"{prefix}{name}")
        m.d.comb += s.eq(v)
        out[name] = s
    return out


class MiscEngine(wiring.Component):
    """ALUINIT / ALU / ELEWINIT / ELEW engine of one core (see the module docstring)."""

    def __init__(self, p: HwParams):
        self.p = p
        super().__init__({
            "ctl": In(iface.engine_ctl(p)),
            "img_rd": Out(iface.bank_read(p)).array(p.alu_pp),
            "img_wr": Out(iface.bank_write(p)).array(p.alu_pp),
            "dw_rd": Out(iface.line_read(p)),
            "bias_rd": Out(iface.line_read(p)),
        })

    # ---- helpers --------------------------------------------------------------------------------
    def _split_bank(self, bid):
        """(group base, offset in group) of an image bank id (conv PP groups)."""
        return split_img_bank(self.p, bid)

    def elaborate(self, platform):
        p = self.p
        m = Module()
        PP, CP, APP, AB, W = p.pp, p.cp, p.alu_pp, p.addr_bits, p.width
        t = p.t
        ctl = self.ctl
        instr = ctl.instr
        opc = header(instr)["opcode"]

        # ================================================================ control / end timing
        maxlat = max(t.init_cycles, t.alu_latency, t.elew_latency)
        tail = Signal(range(maxlat + 2))
        with m.If(tail != 0):
            m.d.sync += tail.eq(tail - 1)
        m.d.comb += ctl.end.eq(tail == 1)

        ai = Signal(p.instr_bits)          # last ALUINIT
        cur = Signal(p.instr_bits)         # the running ALU / ELEW
        run_alu = Signal()
        run_el = Signal()

        # ================================================================ ALUINIT state (decoded)
        A = _sigs(m, "ALUINIT", ai, "ai_")
        mode = A["exec_mode"]
        is0, is1, is2, is3, is4, is5, is6, is7, is8 = (Signal(name=f"mode{k}") for k in range(9))
        m.d.comb += [s_.eq(mode == k) for k, s_ in enumerate((is0, is1, is2, is3, is4, is5, is6, is7, is8))]
        is_dw = Signal(); is_max = Signal(); is_prelu = Signal(); pad_en = Signal()
        m.d.comb += [is_dw.eq(is0 | is6 | is8), is_max.eq(is3 | is5), is_prelu.eq(is1 | is4),
                     pad_en.eq(~is5)]
        act = A["act_type"]
        act_eff = Signal(4)
        m.d.comb += act_eff.eq(Mux(is_dw, act, 0))
        relu_a = Signal()
        relu6_a = Signal()
        m.d.comb += [relu_a.eq((act_eff == 1) | (act_eff == 4)), relu6_a.eq(act_eff == 4)]
        leaky = Signal()
        m.d.comb += leaky.eq(is_dw & (act == 3))
        sc = A["shift_cut"]
        sbc = A["shift_bias"][:5]
        mf_s = A["multi_factor"].as_signed()
        spp, spn = A["shift_prelu_p"], A["shift_prelu_n"]
        sp = Mux(spp >= 32, spp - 32, -spp)
        sn = Mux(spn >= 32, spn - 32, -spn)
        neg_e = Mux(sc >= 8, sc - 8, -sc)                 # -e_cut
        k_p = Signal(signed(9))
        m.d.comb += k_p.eq(Mux(is0, sc + 1, Mux(is_prelu, sp, Mux(is2 | is_max, neg_e, sc))))
        k_n = Signal(signed(9))
        m.d.comb += k_n.eq(Mux(leaky, k_p + 8, Mux(is_prelu, sn, k_p)))
        pv = Signal(signed(8))
        m.d.comb += pv.eq(Mux(is3, -128, 0))
        wconst = Signal(signed(16))                       # weight of modes 2, 4 (mf) and 7 (2731)
        m.d.comb += wconst.eq(Mux(is7, 2731, mf_s))
        use_wconst = Signal()
        m.d.comb += use_wconst.eq(is2 | is4 | is7)
        off7 = Signal(ACC_W - 1)                          # 3*2731 << shift_bias
        m.d.comb += off7.eq(Const(3 * 2731, 14) << sbc)

        a_kw, a_kh, a_cg, a_len = (raw("ALUINIT", ai, n) for n in ("kernel_w", "kernel_h", "channel_group",
                                                                      "length"))
        a_sh_m1 = raw("ALUINIT", ai, "stride_h")
        sh_v, sw_v, soi = A["stride_h"], A["stride_w"], A["stride_offset_in"]
        jre, jr, jrw, jw, jwe = (A[n][:AB] for n in ("jump_read_endl", "jump_read", "jump_read_weights",
                                                      "jump_write", "jump_write_endl"))
        co = A["channel_offset"]
        ic = A["channel_group"] * CP
        soi_jre = Signal(AB)
        swjr = Signal(AB)
        m.d.comb += [soi_jre.eq(soi * jre), swjr.eq(sw_v * jr)]
        thr0 = Signal(signed(16))
        m.d.comb += thr0.eq(ic - co)

        # ================================================================ ALU instruction (decoded)
        L = _sigs(m, "ALU", cur, "alu_")
        l_kd = raw("ALU", cur, "kernel_d")
        vpp = L["valid_pixel_parallel"]
        gb_i, _ = self._split_bank(L["bank_id_in"])
        bases = Cat(*(L[n][:AB] for n in ("bank_addr_in", "bank_addr_in_1", "bank_addr_in_2",
                                          "bank_addr_in_3")))
        pt, pl, pb, pr = L["pad_top"], L["pad_left"], L["pad_bottom"], L["pad_right"]
        top_thr, bot_thr = [], []
        for h in range(APP):
            tt = Signal(signed(12), name=f"top_thr{h}")
            bt = Signal(signed(14), name=f"bot_thr{h}")
            m.d.comb += [tt.eq(pt - h * sh_v), bt.eq((vpp - 1 - h) * sh_v + pb)]
            top_thr.append(tt)
            bot_thr.append(bt)
        xlast = Signal(21)
        m.d.comb += xlast.eq(a_len * sw_v + pr)

        # output placement constants per row (spec §2.4)
        gb_o, b0_o = self._split_bank(L["bank_id_out"])
        so, soo = A["stride_out"], A["stride_offset_out"]
        o_bank, o_row0 = [], []
        rr = Signal(9, name="o_r0")
        qq = Signal(9, name="o_q0")
        m.d.comb += [rr.eq(soo % so), qq.eq(soo // so)]
        r_h, q_h = rr, qq
        for h in range(APP):
            slot = Signal(10, name=f"o_slot{h}")
            m.d.comb += slot.eq(b0_o + q_h)
            ob = Signal(6, name=f"o_bank{h}")
            orow = Signal(AB, name=f"o_row0_{h}")
            m.d.comb += [ob.eq(gb_o + slot % PP),
                         orow.eq(L["bank_addr_out"] + ((slot // PP) * so + r_h) * jwe)]
            o_bank.append(ob)
            o_row0.append(orow)
            nr = r_h + 1
            wrp = nr == so
            r_n = Signal(9, name=f"o_r{h + 1}")
            q_n = Signal(9, name=f"o_q{h + 1}")
            m.d.comb += [r_n.eq(Mux(wrp, 0, nr)), q_n.eq(q_h + wrp)]
            r_h, q_h = r_n, q_n

        # ================================================================ ELEWINIT descriptors
        NID = 4
        e_bank = [[Signal(6, name=f"e_bank{k}_{r}") for r in range(APP)] for k in range(NID)]
        e_off = [[Signal(AB, name=f"e_off{k}_{r}") for r in range(APP)] for k in range(NID)]
        e_bai = [Signal(AB, name=f"e_bai{k}") for k in range(NID)]
        e_jr = [Signal(AB, name=f"e_jr{k}") for k in range(NID)]
        e_sr = [Signal(4, name=f"e_sr{k}") for k in range(NID)]
        EI = _sigs(m, "ELEWINIT", instr, "ei_")
        ei_gb, ei_b0 = self._split_bank(EI["bank_id_in"])
        ei_bank, ei_off = [], []
        for r in range(APP):
            slot = Signal(7, name=f"ei_slot{r}")
            m.d.comb += slot.eq(ei_b0 + r * EI["jump_bank"])
            wrp = slot >= PP
            bk = Signal(6, name=f"ei_bank{r}")
            of = Signal(AB, name=f"ei_off{r}")
            m.d.comb += [bk.eq(Mux(EI["share_pp"], EI["bank_id_in"], ei_gb + Mux(wrp, slot - PP, slot))),
                         of.eq(Mux(wrp & ~EI["share_pp"], EI["jump_read_endl"][:AB], 0))]
            ei_bank.append(bk)
            ei_off.append(of)

        # ================================================================ ELEW instruction (decoded)
        E = _sigs(m, "ELEW", cur, "el_")
        e_num_m1, e_cg_m1, e_len_m1 = (raw("ELEW", cur, n) for n in ("num", "channel_group", "length"))
        e_vpp = E["valid_pixel_parallel"]
        e_mult = Signal()
        m.d.comb += e_mult.eq(E["elew_type"] == 1)
        e_q = Mux(E["elew_type"] == 0, 2, 4)
        e_swf = E["shift_write"]
        kk = Signal(signed(8))
        m.d.comb += kk.eq(Mux(e_swf < 16, e_q - e_swf, e_swf - 16 + e_q))
        e_relu = E["act_type"]
        gb_eo, b0_eo = self._split_bank(E["bank_id_out"])
        eo_bank, eo_off = [], []
        for r in range(APP):
            slot = Signal(5, name=f"eo_slot{r}")
            m.d.comb += slot.eq(b0_eo + r)
            wrp = slot >= PP
            bk = Signal(6, name=f"eo_bank{r}")
            of = Signal(AB, name=f"eo_off{r}")
            m.d.comb += [bk.eq(gb_eo + Mux(wrp, slot - PP, slot)),
                         of.eq(E["bank_addr_out"] + Mux(wrp, E["jump_write_endl"], 0))]
            eo_bank.append(bk)
            eo_off.append(of)

        # ================================================================ ALU loop counters
        cw_w = Signal(11); cw_g = Signal(8); cw_ky = Signal(8); cw_kx = Signal(8); cw_d = Signal(4)
        x = Signal(21); xw = Signal(21)
        colA = Signal(AB); colW = Signal(AB)
        sub = Signal(8); rowoff = Signal(AB)
        bank0 = Signal(range(max(PP, 2))); pass0 = Signal(2)
        wpos = Signal(AB); dg = Signal(AB)
        thr = Signal(signed(16))
        outoff = Signal(AB); wjw = Signal(AB)

        last_d = cw_d == l_kd
        last_kx = last_d & (cw_kx == a_kw)
        last_ky = last_kx & (cw_ky == a_kh)
        last_g = last_ky & (cw_g == a_cg)
        last_w = last_g & (cw_w == a_len)

        # ================================================================ ELEW loop counters
        ej = Signal(11); eg = Signal(8); ek = Signal(2)
        ecol = [Signal(AB, name=f"ecol{k}") for k in range(NID)]
        eocol = Signal(AB); ejjw = Signal(AB)
        elast_k = ek == e_num_m1
        elast_g = elast_k & (eg == e_cg_m1)
        elast_j = elast_g & (ej == e_len_m1)

        # ================================================================ start
        with m.If(ctl.start):
            with m.Switch(opc):
                with m.Case(opcode("ALUINIT")):
                    m.d.sync += [ai.eq(instr), tail.eq(t.init_cycles)]
                with m.Case(opcode("ELEWINIT")):
                    with m.Switch(EI["id"]):
                        for k in range(NID):
                            with m.Case(k):
                                m.d.sync += [e_bai[k].eq(EI["bank_addr_in"]), e_jr[k].eq(EI["jump_read"]),
                                             e_sr[k].eq(EI["shift_read"])]
                                for r in range(APP):
                                    m.d.sync += [e_bank[k][r].eq(ei_bank[r]), e_off[k][r].eq(ei_off[r])]
                    m.d.sync += tail.eq(t.init_cycles)
                with m.Case(opcode("ALU")):
                    _, b0_i0 = self._split_bank(fields("ALU", instr)["bank_id_in"])
                    m.d.sync += [cur.eq(instr), run_alu.eq(1),
                                 cw_w.eq(0), cw_g.eq(0), cw_ky.eq(0), cw_kx.eq(0), cw_d.eq(0),
                                 x.eq(0), xw.eq(0), colA.eq(0), colW.eq(0),
                                 sub.eq(soi), rowoff.eq(soi_jre), bank0.eq(b0_i0), pass0.eq(0),
                                 wpos.eq(0), dg.eq(0), thr.eq(thr0), outoff.eq(0), wjw.eq(0)]
                with m.Case(opcode("ELEW")):
                    m.d.sync += [cur.eq(instr), run_el.eq(1), ej.eq(0), eg.eq(0), ek.eq(0),
                                 eocol.eq(0), ejjw.eq(0)] + [c.eq(0) for c in ecol]

        # ================================================================ ALU S0: issue
        a_common = Signal(AB)
        m.d.comb += a_common.eq(rowoff + colA + dg)
        rb0 = Signal(AB)
        rb1 = Signal(AB)
        m.d.comb += [rb0.eq(bases.word_select(pass0, AB)), rb1.eq(bases.word_select((pass0 + 1)[:2], AB))]
        colpad = Signal()
        m.d.comb += colpad.eq(pad_en & ((x < pl) | (x > xlast)))
        rowpad = []
        for h in range(APP):
            rp = Signal(name=f"rowpad{h}")
            m.d.comb += rp.eq(pad_en & ((cw_ky < top_thr[h]) | (cw_ky > bot_thr[h])))
            rowpad.append(rp)
        lane_mask = Signal(CP)
        m.d.comb += lane_mask.eq(Cat(*((thr <= i) & pad_en for i in range(CP))))

        # ELEW S0 helpers
        e_kbank = [Cat(*(e_bank[k][r] for k in range(NID))).word_select(ek, 6) for r in range(APP)]
        e_koff = [Cat(*(e_off[k][r] for k in range(NID))).word_select(ek, AB) for r in range(APP)]
        e_kbase = Signal(AB)
        m.d.comb += e_kbase.eq(Cat(*e_bai).word_select(ek, AB) + Cat(*ecol).word_select(ek, AB) + eg)

        with m.If(run_alu):
            for h in range(APP):
                s_ = bank0 + h
                wr = s_ >= PP
                rd = self.img_rd[h]
                m.d.comb += [rd.en.eq((vpp > h) & ~rowpad[h] & ~colpad),
                             rd.bank.eq(gb_i + Mux(wr, s_ - PP, s_)),
                             rd.addr.eq(Mux(wr, rb1, rb0) + a_common)]
            m.d.comb += [self.dw_rd.en.eq(1),
                         self.dw_rd.addr.eq(L["bank_addr_weights"] + wpos + Mux(is8, dg << 1, dg))]
        with m.Elif(run_el):
            for r in range(APP):
                rd = self.img_rd[r]
                m.d.comb += [rd.en.eq(e_vpp > r), rd.bank.eq(e_kbank[r]), rd.addr.eq(e_kbase + e_koff[r])]

        # ---- ALU counter update (loop order w, g, ky, kx, d)
        with m.If(run_alu):
            with m.If(~last_d):
                m.d.sync += [cw_d.eq(cw_d + 1), dg.eq(dg + A["channel_group"])]
            with m.Elif(~last_kx):
                m.d.sync += [cw_d.eq(0), dg.eq(cw_g), cw_kx.eq(cw_kx + 1), x.eq(x + 1), colA.eq(colA + jr),
                             wpos.eq(wpos + jrw)]
            with m.Elif(~last_ky):
                m.d.sync += [cw_d.eq(0), dg.eq(cw_g), cw_kx.eq(0), x.eq(xw), colA.eq(colW),
                             cw_ky.eq(cw_ky + 1), wpos.eq(wpos + jrw)]
                with m.If(sub == a_sh_m1):
                    m.d.sync += [sub.eq(0), rowoff.eq(0)]
                    with m.If(bank0 == PP - 1):
                        m.d.sync += [bank0.eq(0), pass0.eq(pass0 + 1)]
                    with m.Else():
                        m.d.sync += bank0.eq(bank0 + 1)
                with m.Else():
                    m.d.sync += [sub.eq(sub + 1), rowoff.eq(rowoff + jre)]
            with m.Else():
                _, b0_ic = self._split_bank(L["bank_id_in"])
                m.d.sync += [cw_d.eq(0), cw_kx.eq(0), cw_ky.eq(0), wpos.eq(0), sub.eq(soi),
                             rowoff.eq(soi_jre), bank0.eq(b0_ic), pass0.eq(0)]
                with m.If(~last_g):
                    m.d.sync += [cw_g.eq(cw_g + 1), dg.eq(cw_g + 1), thr.eq(thr - CP), outoff.eq(outoff + 1),
                                 x.eq(xw), colA.eq(colW)]
                with m.Else():
                    m.d.sync += [cw_g.eq(0), dg.eq(0), thr.eq(thr0), cw_w.eq(cw_w + 1),
                                 xw.eq(xw + sw_v), x.eq(xw + sw_v), colW.eq(colW + swjr),
                                 colA.eq(colW + swjr), wjw.eq(wjw + jw), outoff.eq(wjw + jw)]
                    with m.If(last_w):
                        m.d.sync += [run_alu.eq(0), tail.eq(t.alu_latency)]

        # ---- ELEW counter update (loop order j, g, k)
        with m.If(run_el):
            with m.If(~elast_k):
                m.d.sync += ek.eq(ek + 1)
            with m.Elif(~elast_g):
                m.d.sync += [ek.eq(0), eg.eq(eg + 1), eocol.eq(eocol + 1)]
            with m.Else():
                m.d.sync += [ek.eq(0), eg.eq(0), ej.eq(ej + 1), ejjw.eq(ejjw + E["jump_write"]),
                             eocol.eq(ejjw + E["jump_write"])]
                m.d.sync += [ecol[k].eq(ecol[k] + e_jr[k]) for k in range(NID)]
                with m.If(elast_j):
                    m.d.sync += [run_el.eq(0), tail.eq(t.elew_latency)]

        # ================================================================ shared lane pipeline
        # ALU and ELEW share the ALU_PP x CP lanes (they never overlap). Per lane:
        #   S1  prod = (xv * w) >> psh     xv = PV on pads / channel_offset lanes, else the byte
        #   S2  acc  = sum | max | ELEW product; a sum starts from bias<<shift_bias (mode 0, where w is
        #            doubled so acc = 2*sum + bias*2^sb) or 3*2731<<shift_bias (mode 7)
        #   S3  v    = (acc * (256 | 26*256) + rc) >> sh     (rounding shift; leaky: 26*a, k + 8)
        #   S4  byte = min(y_hi, max(y_lo, v))                (ReLU, ReLU6, hsigmoid 2^32 clamp, sat8)
        # Every lane computation sits under its stage's valid flag and has no reset; widening is done
        # by arithmetic (`_sext`), never by Mux / assignment, which the Verilog backend would emit as bit
        # replication (slow in Verilator).
        el_v = Signal()                                   # the running instruction is an ELEW
        with m.If(ctl.start & (opc == opcode("ALU"))):
            m.d.sync += el_v.eq(0)
        with m.If(ctl.start & (opc == opcode("ELEW"))):
            m.d.sync += el_v.eq(1)
        alu_v = ~el_v
        d_m0, d_m7, d_leaky, d_max, d_prelu, d_is8, d_mult = (Signal(name=n) for n in (
            "d_m0", "d_m7", "d_leaky", "d_max", "d_prelu", "d_is8", "d_mult"))
        m.d.comb += [d_m0.eq(alu_v & is0), d_m7.eq(alu_v & is7), d_leaky.eq(alu_v & leaky),
                     d_max.eq(alu_v & is_max), d_prelu.eq(alu_v & is_prelu), d_is8.eq(alu_v & is8),
                     d_mult.eq(el_v & e_mult)]
        d_wconst = Signal(signed(16))                     # weight for every lane (modes 2, 3, 4, 5, 7; ELEW)
        m.d.comb += d_wconst.eq(Mux(el_v, 4, Mux(is_max, 1, wconst)))
        d_usec = Signal()
        m.d.comb += d_usec.eq(el_v | use_wconst | is_max)
        k_pa = Signal(signed(9))
        k_na = Signal(signed(9))
        m.d.comb += [k_pa.eq(Mux(el_v, kk, k_p)), k_na.eq(Mux(el_v, kk, k_n))]
        sh_p, rc_p = _shift_consts(m, k_pa, KMAX, RC_W, "kp")
        sh_n, rc_n = _shift_consts(m, k_na, KMAX, RC_W, "kn")
        mul_n = Signal(14)                                # x256 of the rounding shift, x26 for leaky a < 0
        m.d.comb += mul_n.eq(Mux(d_leaky, 26 * 256, 256))
        hi7 = Signal(8)                                   # min(127, rhu(2^32 / 2^shift_cut)): hsigmoid
        m.d.comb += hi7.eq(Mux(sc <= 25, 127, Mux(sc <= 32, Const(128, 8) >> (sc - 25)[:3], Mux(sc == 33, 1, 0))))
        y_lo = Signal(signed(8))
        y_hi = Signal(signed(9))
        m.d.comb += [y_lo.eq(Mux(Mux(el_v, e_relu, relu_a | is7), 0, -128)),
                     y_hi.eq(Mux(el_v, 127, Mux(is7, hi7, Mux(relu6_a, 96, 127))))]

        # ---- S0 -> S1 control
        s1_v, s1_first, s1_last, s1_cv, s1_colpad = (Signal(name=n) for n in (
            "s1_v", "s1_first", "s1_last", "s1_cv", "s1_colpad"))
        s1_rowpad = Signal(APP, reset_less=True)
        s1_mask = Signal(CP, reset_less=True)
        s1_oo = Signal(AB, reset_less=True)
        s1_g = Signal(8, reset_less=True)
        s1_psh = Signal(4, reset_less=True)
        m.d.sync += s1_v.eq(run_alu | run_el)
        with m.If(run_el):
            m.d.sync += [s1_first.eq(ek == 0), s1_last.eq(elast_k), s1_cv.eq(1), s1_colpad.eq(0),
                         s1_rowpad.eq(0), s1_mask.eq(0), s1_oo.eq(eocol),
                         s1_psh.eq(Cat(*e_sr).word_select(ek, 4))]
        with m.Else():
            m.d.sync += [s1_first.eq((cw_d == 0) & (cw_kx == 0) & (cw_ky == 0)), s1_last.eq(last_ky),
                         s1_cv.eq(is_dw | (cw_d == 0)), s1_colpad.eq(colpad), s1_rowpad.eq(Cat(*rowpad)),
                         s1_mask.eq(lane_mask), s1_oo.eq(outoff), s1_g.eq(cw_g), s1_psh.eq(0)]
        # the BIAS line of a (w, g) output line is read by its first step, for its S2
        m.d.comb += [self.bias_rd.en.eq(s1_v & s1_first & d_m0), self.bias_rd.addr.eq(L["bank_addr_bias"] + s1_g)]

        # ---- S1: mask + multiply
        s2_v, s2_first, s2_last, s2_cv = (Signal(name=n) for n in ("s2_v", "s2_first", "s2_last", "s2_cv"))
        s2_oo = Signal(AB, reset_less=True)
        m.d.sync += [s2_v.eq(s1_v), s2_first.eq(s1_first), s2_last.eq(s1_last), s2_cv.eq(s1_cv),
                     s2_oo.eq(s1_oo)]
        dwd = self.dw_rd.data
        w16 = dwd[0:16].as_signed()
        prod = [[Signal(signed(24), name=f"prod{h}_{i}", reset_less=True) for i in range(CP)] for h in range(APP)]
        for h in range(APP):
            rdd = self.img_rd[h].data
            for i in range(CP):
                byte = rdd[8 * i: 8 * i + 8].as_signed()
                padded = s1_rowpad[h] | s1_colpad | s1_mask[i]
                xv = Mux(padded, pv, byte)
                wb = _sext(dwd[8 * i: 8 * i + 8].as_signed(), 16)
                wv = Mux(d_is8, w16, Mux(d_usec, d_wconst, (wb * (1 + d_m0))[:16].as_signed()))
                # prelu / leakyrelu: x >= 0 passes (pads are 0 there)
                wsel = Mux(d_prelu & (padded | ~rdd[8 * i + 7]), 1, wv)
                with m.If(s1_v):
                    m.d.sync += prod[h][i].eq((xv * wsel) >> s1_psh)

        # ---- S2: accumulate
        s3_fin = Signal()
        s3_oo = Signal(AB, reset_less=True)
        m.d.sync += [s3_fin.eq(s2_v & s2_last), s3_oo.eq(s2_oo)]
        acc = [[Signal(signed(ACC_W), name=f"acc{h}_{i}", reset_less=True) for i in range(CP)] for h in range(APP)]
        bd = self.bias_rd.data
        for h in range(APP):
            for i in range(CP):
                a_ = acc[h][i]
                pr_ = prod[h][i]
                init = Mux(d_m0, _sext(bd[8 * i: 8 * i + 8].as_signed() << sbc, ACC_W),
                           Mux(d_m7, off7, 0))
                s_sum = Mux(s2_first, init, a_) + _sext(Mux(s2_cv, pr_, 0), ACC_W)
                mb = Mux(s2_first, -128, a_)
                mi = _sext(Mux(s2_cv, pr_, -128), ACC_W)
                s_max = Mux(mi > mb, mi, mb)
                s_mul = _sext(a_[:10].as_signed() * pr_[:10].as_signed(), ACC_W)
                with m.If(s2_v):
                    m.d.sync += a_.eq(Mux(d_max, s_max, Mux(d_mult & ~s2_first, s_mul, s_sum)))

        # ---- S3: rounding shift
        s4_fin = Signal()
        s4_oo = Signal(AB, reset_less=True)
        m.d.sync += [s4_fin.eq(s3_fin), s4_oo.eq(s3_oo)]
        vv = [[Signal(signed(V_W), name=f"v{h}_{i}", reset_less=True) for i in range(CP)] for h in range(APP)]
        for h in range(APP):
            for i in range(CP):
                av = acc[h][i]
                ng = av < 0
                with m.If(s3_fin):
                    m.d.sync += vv[h][i].eq((av * Mux(ng, mul_n, 256) + Mux(ng, rc_n, rc_p)) >> Mux(ng, sh_n, sh_p))

        # ---- S4: activation and saturation as one clamp -> write registers
        w_en = Signal(APP)
        w_bank = [Signal(6, name=f"w_bank{h}", reset_less=True) for h in range(APP)]
        w_addr = [Signal(AB, name=f"w_addr{h}", reset_less=True) for h in range(APP)]
        w_data = [Signal(8 * W, name=f"w_data{h}", reset_less=True) for h in range(APP)]
        m.d.sync += w_en.eq(0)
        with m.If(s4_fin):
            for h in range(APP):
                row = []
                for i in range(CP):
                    v = vv[h][i]
                    row.append(Mux(v < y_lo, y_lo[:8], Mux(v > y_hi, y_hi[:8], v[:8])))
                m.d.sync += [w_en[h].eq(Mux(el_v, e_vpp > h, vpp > h)),
                             w_bank[h].eq(Mux(el_v, eo_bank[h], o_bank[h])),
                             w_addr[h].eq(Mux(el_v, eo_off[h], o_row0[h]) + s4_oo),
                             w_data[h].eq(Cat(*row))]
        for h in range(APP):
            wp = self.img_wr[h]
            m.d.comb += [wp.en.eq(w_en[h]), wp.bank.eq(w_bank[h]), wp.addr.eq(w_addr[h]), wp.data.eq(w_data[h])]
        return m
