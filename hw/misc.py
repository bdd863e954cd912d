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
             1 (3, 5, prelu x >= 0); ELEW: w = 4, psh = shift_read (t = (x<<2) >> shift_read); ELEW
             mult, second input: prod = t1 * t0, with t0 the previous step's prod (one multiplier a lane).
             The first step of an output line reads its BIAS line (mode 0).
    c+2  S2  acc = sum (max for modes 3/5, prod for ELEW mult); a sum starts from bias<<shift_bias
             (mode 0: acc = 2*sum + bias*2^sb) or 3*2731<<shift_bias (mode 7)
    c+3  S3  v = (acc * 256 + rc) >> sh: the signed rounding shift (for a < 0 and leaky: acc * 26*256
             and k + 8; prelu: sn for a < 0, sp otherwise)
    c+4  S4  byte = min(y_hi, max(y_lo, v)): ReLU (y_lo 0), ReLU6 (y_hi 96), int8 saturation and the
             hsigmoid clamp to [0, 2^32] (y_hi = min(127, rhu(2^32 / 2^shift_cut)), exact because the
             rounding shift is monotonic) -> write registers
    c+5  S5  the ALU_PP write rows are issued (whole lines)

so the last write is issued in cycle s+N+5 <= s+cost-1: alu_latency >= 6 and elew_latency >= 6
(hw/params.MIN_LATENCY); an ALU write of several rows into one bank (stride_out > 1) leaves up to
min(ALU_PP, stride_out limit) - 1 lines in the bank's write queue, so alu_latency must be that much
larger (hw/params.min_latency).

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

from types import SimpleNamespace

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
NID = 4           # ELEWINIT descriptors (id 0..3)


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
        m = Module()
        instr = self.ctl.instr
        opc = header(instr)["opcode"]
        st = self._control(m)
        a = self._aluinit_state(m, st.ai)
        alu = self._alu_instr(m, st.cur, a)
        ei = self._elewinit_descriptors(m, instr)
        el = self._elew_instr(m, st.cur)
        ac = self._alu_counters(alu, a)
        ec = self._elew_counters(el)
        self._start(m, opc, instr, st, a, ei, ac, ec)
        s0 = self._s0_issue(m, st, a, alu, ei, el, ac, ec)
        self._alu_step(m, st, a, alu, ac)
        self._elew_step(m, st, el, ei, ec)
        lc = self._lane_config(m, opc, a, el)
        s1 = self._s0_to_s1(m, st, a, alu, ei, ac, ec, s0, lc)
        s2 = self._s1_multiply(m, a, lc, s1)
        s3 = self._s2_accumulate(m, a, lc, s2)
        s4 = self._s3_round(m, lc, s3)
        self._s4_write(m, alu, el, lc, s4)
        return m

    # ================================================================ control / end timing
    def _control(self, m):
        """The end timer (`ctl.end` when `tail` reaches 1) and the instruction registers: the last
        ALUINIT (`ai`), the running ALU / ELEW (`cur`) and its run flag."""
        p, t = self.p, self.p.t
        maxlat = max(t.init_cycles, t.alu_latency, t.elew_latency)
        tail = Signal(range(maxlat + 2))
        with m.If(tail != 0):
            m.d.sync += tail.eq(tail - 1)
        m.d.comb += self.ctl.end.eq(tail == 1)

        ai = Signal(p.instr_bits)          # last ALUINIT
        cur = Signal(p.instr_bits)         # the running ALU / ELEW
        run_alu = Signal()
        run_el = Signal()
        return SimpleNamespace(tail=tail, ai=ai, cur=cur, run_alu=run_alu, run_el=run_el)

    # ================================================================ ALUINIT state (decoded)
    def _aluinit_state(self, m, ai):
        """The latched ALUINIT decoded: mode flags, shift codes, lane constants and loop strides."""
        p = self.p
        CP, AB = p.cp, p.addr_bits
        A = _sigs(m, "ALUINIT", ai, "ai_")
        mode = A["exec_mode"]
        is0, is1, is2, is3, is4, is5, is6, is7, is8 = (Signal(name=f"mode{k}") for k in range(9))
        m.d.comb += [s_.eq(mode == k) for k, s_ in enumerate((is0, is1, is2, is3, is4, is5, is6, is7, is8))]
        is_dw = Signal()
        is_max = Signal()
        is_prelu = Signal()
        pad_en = Signal()
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
        return SimpleNamespace(
            A=A, is0=is0, is7=is7, is8=is8, is_dw=is_dw, is_max=is_max, is_prelu=is_prelu, pad_en=pad_en,
            relu_a=relu_a, relu6_a=relu6_a, leaky=leaky, sc=sc, sbc=sbc, k_p=k_p, k_n=k_n, pv=pv,
            wconst=wconst, use_wconst=use_wconst, off7=off7,
            a_kw=a_kw, a_kh=a_kh, a_cg=a_cg, a_len=a_len, a_sh_m1=a_sh_m1, sh_v=sh_v, sw_v=sw_v, soi=soi,
            jre=jre, jr=jr, jrw=jrw, jw=jw, jwe=jwe, soi_jre=soi_jre, swjr=swjr, thr0=thr0)

    # ================================================================ ALU instruction (decoded)
    def _alu_instr(self, m, cur, a):
        """The running ALU decoded: input bank and pass bases, padding thresholds per row, and the
        output placement of every row."""
        p = self.p
        APP, AB = p.alu_pp, p.addr_bits
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
            m.d.comb += [tt.eq(pt - h * a.sh_v), bt.eq((vpp - 1 - h) * a.sh_v + pb)]
            top_thr.append(tt)
            bot_thr.append(bt)
        xlast = Signal(21)
        m.d.comb += xlast.eq(a.a_len * a.sw_v + pr)
        o_bank, o_row0 = self._alu_out_placement(m, L, a)
        return SimpleNamespace(L=L, l_kd=l_kd, vpp=vpp, gb_i=gb_i, bases=bases, pl=pl, top_thr=top_thr,
                               bot_thr=bot_thr, xlast=xlast, o_bank=o_bank, o_row0=o_row0)

    def _alu_out_placement(self, m, L, a):
        """Output placement constants per row (spec §2.4): (bank, first line) of each of the ALU_PP rows."""
        p = self.p
        PP, APP, AB = p.pp, p.alu_pp, p.addr_bits
        gb_o, b0_o = self._split_bank(L["bank_id_out"])
        so, soo = a.A["stride_out"], a.A["stride_offset_out"]
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
                         orow.eq(L["bank_addr_out"] + ((slot // PP) * so + r_h) * a.jwe)]
            o_bank.append(ob)
            o_row0.append(orow)
            nr = r_h + 1
            wrp = nr == so
            r_n = Signal(9, name=f"o_r{h + 1}")
            q_n = Signal(9, name=f"o_q{h + 1}")
            m.d.comb += [r_n.eq(Mux(wrp, 0, nr)), q_n.eq(q_h + wrp)]
            r_h, q_h = r_n, q_n
        return o_bank, o_row0

    # ================================================================ ELEWINIT descriptors
    def _elewinit_descriptors(self, m, instr):
        """The NID input descriptors (registers, loaded by ELEWINIT id k) and the per-row bank / line
        offset of the ELEWINIT being started."""
        p = self.p
        PP, APP, AB = p.pp, p.alu_pp, p.addr_bits
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
        return SimpleNamespace(e_bank=e_bank, e_off=e_off, e_bai=e_bai, e_jr=e_jr, e_sr=e_sr, EI=EI,
                               ei_bank=ei_bank, ei_off=ei_off)

    # ================================================================ ELEW instruction (decoded)
    def _elew_instr(self, m, cur):
        """The running ELEW decoded: loop bounds, the combined shift code and the output rows."""
        p = self.p
        PP, APP, AB = p.pp, p.alu_pp, p.addr_bits
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
        return SimpleNamespace(E=E, e_num_m1=e_num_m1, e_cg_m1=e_cg_m1, e_len_m1=e_len_m1, e_vpp=e_vpp,
                               e_mult=e_mult, kk=kk, e_relu=e_relu, eo_bank=eo_bank, eo_off=eo_off)

    # ================================================================ ALU loop counters
    def _alu_counters(self, alu, a):
        """The ALU loop counters (w, g, ky, kx, d) and their address accumulators; last-step flags."""
        p = self.p
        PP, AB = p.pp, p.addr_bits
        cw_w = Signal(11)
        cw_g = Signal(8)
        cw_ky = Signal(8)
        cw_kx = Signal(8)
        cw_d = Signal(4)
        x = Signal(21)                      # input column w*stride_w + kx (padded coordinates)
        xw = Signal(21)                     # w*stride_w
        colA = Signal(AB)                   # x * jump_read
        colW = Signal(AB)                   # xw * jump_read
        sub = Signal(8)                     # (soi + ky) mod stride_h
        rowoff = Signal(AB)                 # sub * jump_read_endl
        bank0 = Signal(range(max(PP, 2)))   # slot of row 0 in the conv-PP group
        pass0 = Signal(2)                   # ... and its pass (bank_addr_in, _1, _2, _3)
        wpos = Signal(AB)                   # (ky*kernel_w + kx) * jump_read_weights
        dg = Signal(AB)                     # d*cg + g
        thr = Signal(signed(16))            # cg*CP - channel_offset - g*CP: lanes >= thr are padding
        outoff = Signal(AB)                 # w*jump_write + g
        wjw = Signal(AB)                    # w*jump_write

        last_d = cw_d == alu.l_kd
        last_kx = last_d & (cw_kx == a.a_kw)
        last_ky = last_kx & (cw_ky == a.a_kh)
        last_g = last_ky & (cw_g == a.a_cg)
        last_w = last_g & (cw_w == a.a_len)
        return SimpleNamespace(cw_w=cw_w, cw_g=cw_g, cw_ky=cw_ky, cw_kx=cw_kx, cw_d=cw_d, x=x, xw=xw,
                               colA=colA, colW=colW, sub=sub, rowoff=rowoff, bank0=bank0, pass0=pass0,
                               wpos=wpos, dg=dg, thr=thr, outoff=outoff, wjw=wjw, last_d=last_d,
                               last_kx=last_kx, last_ky=last_ky, last_g=last_g, last_w=last_w)

    # ================================================================ ELEW loop counters
    def _elew_counters(self, el):
        """The ELEW loop counters (j, g, k), the per-input column offsets; last-step flags."""
        AB = self.p.addr_bits
        ej = Signal(11)
        eg = Signal(8)
        ek = Signal(2)
        ecol = [Signal(AB, name=f"ecol{k}") for k in range(NID)]
        eocol = Signal(AB)
        ejjw = Signal(AB)
        elast_k = ek == el.e_num_m1
        elast_g = elast_k & (eg == el.e_cg_m1)
        elast_j = elast_g & (ej == el.e_len_m1)
        return SimpleNamespace(ej=ej, eg=eg, ek=ek, ecol=ecol, eocol=eocol, ejjw=ejjw, elast_k=elast_k,
                               elast_g=elast_g, elast_j=elast_j)

    # ================================================================ start
    def _start(self, m, opc, instr, st, a, ei, ac, ec):
        """An instruction starts: latch ALUINIT / an ELEWINIT descriptor, or load the ALU / ELEW loop."""
        t = self.p.t
        APP = self.p.alu_pp
        with m.If(self.ctl.start):
            with m.Switch(opc):
                with m.Case(opcode("ALUINIT")):
                    m.d.sync += [st.ai.eq(instr), st.tail.eq(t.init_cycles)]
                with m.Case(opcode("ELEWINIT")):
                    with m.Switch(ei.EI["id"]):
                        for k in range(NID):
                            with m.Case(k):
                                m.d.sync += [ei.e_bai[k].eq(ei.EI["bank_addr_in"]), ei.e_jr[k].eq(ei.EI["jump_read"]),
                                             ei.e_sr[k].eq(ei.EI["shift_read"])]
                                for r in range(APP):
                                    m.d.sync += [ei.e_bank[k][r].eq(ei.ei_bank[r]), ei.e_off[k][r].eq(ei.ei_off[r])]
                    m.d.sync += st.tail.eq(t.init_cycles)
                with m.Case(opcode("ALU")):
                    _, b0_i0 = self._split_bank(fields("ALU", instr)["bank_id_in"])
                    m.d.sync += [st.cur.eq(instr), st.run_alu.eq(1),
                                 ac.cw_w.eq(0), ac.cw_g.eq(0), ac.cw_ky.eq(0), ac.cw_kx.eq(0), ac.cw_d.eq(0),
                                 ac.x.eq(0), ac.xw.eq(0), ac.colA.eq(0), ac.colW.eq(0),
                                 ac.sub.eq(a.soi), ac.rowoff.eq(a.soi_jre), ac.bank0.eq(b0_i0), ac.pass0.eq(0),
                                 ac.wpos.eq(0), ac.dg.eq(0), ac.thr.eq(a.thr0), ac.outoff.eq(0), ac.wjw.eq(0)]
                with m.Case(opcode("ELEW")):
                    m.d.sync += [st.cur.eq(instr), st.run_el.eq(1), ec.ej.eq(0), ec.eg.eq(0), ec.ek.eq(0),
                                 ec.eocol.eq(0), ec.ejjw.eq(0)] + [c.eq(0) for c in ec.ecol]

    # ================================================================ ALU S0: issue
    def _s0_issue(self, m, st, a, alu, ei, el, ac, ec):
        """S0 of the running ALU or ELEW step: the row reads (and the DWCONVW read) and the padding /
        channel_offset flags that travel with them to S1."""
        p = self.p
        PP, CP, APP, AB = p.pp, p.cp, p.alu_pp, p.addr_bits
        a_common = Signal(AB)
        m.d.comb += a_common.eq(ac.rowoff + ac.colA + ac.dg)
        rb0 = Signal(AB)
        rb1 = Signal(AB)
        m.d.comb += [rb0.eq(alu.bases.word_select(ac.pass0, AB)),
                     rb1.eq(alu.bases.word_select((ac.pass0 + 1)[:2], AB))]
        colpad = Signal()
        m.d.comb += colpad.eq(a.pad_en & ((ac.x < alu.pl) | (ac.x > alu.xlast)))
        rowpad = []
        for h in range(APP):
            rp = Signal(name=f"rowpad{h}")
            m.d.comb += rp.eq(a.pad_en & ((ac.cw_ky < alu.top_thr[h]) | (ac.cw_ky > alu.bot_thr[h])))
            rowpad.append(rp)
        lane_mask = Signal(CP)
        m.d.comb += lane_mask.eq(Cat(*((ac.thr <= i) & a.pad_en for i in range(CP))))

        # ELEW S0 helpers
        ek = ec.ek
        e_kbank = [Cat(*(ei.e_bank[k][r] for k in range(NID))).word_select(ek, 6) for r in range(APP)]
        e_koff = [Cat(*(ei.e_off[k][r] for k in range(NID))).word_select(ek, AB) for r in range(APP)]
        e_kbase = Signal(AB)
        m.d.comb += e_kbase.eq(Cat(*ei.e_bai).word_select(ek, AB) + Cat(*ec.ecol).word_select(ek, AB) + ec.eg)

        with m.If(st.run_alu):
            for h in range(APP):
                s_ = ac.bank0 + h
                wr = s_ >= PP
                rd = self.img_rd[h]
                # the request of every row h < vpp, padding or not (docs/bank-ports.md §2); a padded
                # row's data is replaced by the pad value in S1
                m.d.comb += [rd.en.eq(alu.vpp > h),
                             rd.bank.eq(alu.gb_i + Mux(wr, s_ - PP, s_)),
                             rd.addr.eq(Mux(wr, rb1, rb0) + a_common)]
            m.d.comb += [self.dw_rd.en.eq(1),
                         self.dw_rd.addr.eq(alu.L["bank_addr_weights"] + ac.wpos + Mux(a.is8, ac.dg << 1, ac.dg))]
        with m.Elif(st.run_el):
            for r in range(APP):
                rd = self.img_rd[r]
                m.d.comb += [rd.en.eq(el.e_vpp > r), rd.bank.eq(e_kbank[r]), rd.addr.eq(e_kbase + e_koff[r])]
        return SimpleNamespace(colpad=colpad, rowpad=rowpad, lane_mask=lane_mask)

    # ---- ALU counter update (loop order w, g, ky, kx, d)
    def _alu_step(self, m, st, a, alu, ac):
        """Advance the ALU loop by one step; the last step starts the alu_latency tail."""
        p = self.p
        PP, CP = p.pp, p.cp
        with m.If(st.run_alu):
            with m.If(~ac.last_d):
                m.d.sync += [ac.cw_d.eq(ac.cw_d + 1), ac.dg.eq(ac.dg + a.A["channel_group"])]
            with m.Elif(~ac.last_kx):
                m.d.sync += [ac.cw_d.eq(0), ac.dg.eq(ac.cw_g), ac.cw_kx.eq(ac.cw_kx + 1), ac.x.eq(ac.x + 1),
                             ac.colA.eq(ac.colA + a.jr), ac.wpos.eq(ac.wpos + a.jrw)]
            with m.Elif(~ac.last_ky):
                m.d.sync += [ac.cw_d.eq(0), ac.dg.eq(ac.cw_g), ac.cw_kx.eq(0), ac.x.eq(ac.xw), ac.colA.eq(ac.colW),
                             ac.cw_ky.eq(ac.cw_ky + 1), ac.wpos.eq(ac.wpos + a.jrw)]
                with m.If(ac.sub == a.a_sh_m1):
                    m.d.sync += [ac.sub.eq(0), ac.rowoff.eq(0)]
                    with m.If(ac.bank0 == PP - 1):
                        m.d.sync += [ac.bank0.eq(0), ac.pass0.eq(ac.pass0 + 1)]
                    with m.Else():
                        m.d.sync += ac.bank0.eq(ac.bank0 + 1)
                with m.Else():
                    m.d.sync += [ac.sub.eq(ac.sub + 1), ac.rowoff.eq(ac.rowoff + a.jre)]
            with m.Else():
                _, b0_ic = self._split_bank(alu.L["bank_id_in"])
                m.d.sync += [ac.cw_d.eq(0), ac.cw_kx.eq(0), ac.cw_ky.eq(0), ac.wpos.eq(0), ac.sub.eq(a.soi),
                             ac.rowoff.eq(a.soi_jre), ac.bank0.eq(b0_ic), ac.pass0.eq(0)]
                with m.If(~ac.last_g):
                    m.d.sync += [ac.cw_g.eq(ac.cw_g + 1), ac.dg.eq(ac.cw_g + 1), ac.thr.eq(ac.thr - CP),
                                 ac.outoff.eq(ac.outoff + 1), ac.x.eq(ac.xw), ac.colA.eq(ac.colW)]
                with m.Else():
                    m.d.sync += [ac.cw_g.eq(0), ac.dg.eq(0), ac.thr.eq(a.thr0), ac.cw_w.eq(ac.cw_w + 1),
                                 ac.xw.eq(ac.xw + a.sw_v), ac.x.eq(ac.xw + a.sw_v), ac.colW.eq(ac.colW + a.swjr),
                                 ac.colA.eq(ac.colW + a.swjr), ac.wjw.eq(ac.wjw + a.jw),
                                 ac.outoff.eq(ac.wjw + a.jw)]
                    with m.If(ac.last_w):
                        m.d.sync += [st.run_alu.eq(0), st.tail.eq(p.t.alu_latency)]

    # ---- ELEW counter update (loop order j, g, k)
    def _elew_step(self, m, st, el, ei, ec):
        """Advance the ELEW loop by one step; the last step starts the elew_latency tail."""
        with m.If(st.run_el):
            with m.If(~ec.elast_k):
                m.d.sync += ec.ek.eq(ec.ek + 1)
            with m.Elif(~ec.elast_g):
                m.d.sync += [ec.ek.eq(0), ec.eg.eq(ec.eg + 1), ec.eocol.eq(ec.eocol + 1)]
            with m.Else():
                m.d.sync += [ec.ek.eq(0), ec.eg.eq(0), ec.ej.eq(ec.ej + 1), ec.ejjw.eq(ec.ejjw + el.E["jump_write"]),
                             ec.eocol.eq(ec.ejjw + el.E["jump_write"])]
                m.d.sync += [ec.ecol[k].eq(ec.ecol[k] + ei.e_jr[k]) for k in range(NID)]
                with m.If(ec.elast_j):
                    m.d.sync += [st.run_el.eq(0), st.tail.eq(self.p.t.elew_latency)]

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
    def _lane_config(self, m, opc, a, el):
        """The lane constants of the running instruction (ALU mode or ELEW): weight selection, the
        rounding shifts of both signs and the output clamp."""
        el_v = Signal()                                   # the running instruction is an ELEW
        with m.If(self.ctl.start & (opc == opcode("ALU"))):
            m.d.sync += el_v.eq(0)
        with m.If(self.ctl.start & (opc == opcode("ELEW"))):
            m.d.sync += el_v.eq(1)
        alu_v = ~el_v
        d_m0, d_m7, d_leaky, d_max, d_prelu, d_is8, d_mult = (Signal(name=n) for n in (
            "d_m0", "d_m7", "d_leaky", "d_max", "d_prelu", "d_is8", "d_mult"))
        m.d.comb += [d_m0.eq(alu_v & a.is0), d_m7.eq(alu_v & a.is7), d_leaky.eq(alu_v & a.leaky),
                     d_max.eq(alu_v & a.is_max), d_prelu.eq(alu_v & a.is_prelu), d_is8.eq(alu_v & a.is8),
                     d_mult.eq(el_v & el.e_mult)]
        d_wconst = Signal(signed(16))                     # weight for every lane (modes 2, 3, 4, 5, 7; ELEW)
        m.d.comb += d_wconst.eq(Mux(el_v, 4, Mux(a.is_max, 1, a.wconst)))
        d_usec = Signal()
        m.d.comb += d_usec.eq(el_v | a.use_wconst | a.is_max)
        k_pa = Signal(signed(9))
        k_na = Signal(signed(9))
        m.d.comb += [k_pa.eq(Mux(el_v, el.kk, a.k_p)), k_na.eq(Mux(el_v, el.kk, a.k_n))]
        sh_p, rc_p = _shift_consts(m, k_pa, KMAX, RC_W, "kp")
        sh_n, rc_n = _shift_consts(m, k_na, KMAX, RC_W, "kn")
        sc = a.sc
        hi7 = Signal(8)                                   # min(127, rhu(2^32 / 2^shift_cut)): hsigmoid
        m.d.comb += hi7.eq(Mux(sc <= 25, 127, Mux(sc <= 32, Const(128, 8) >> (sc - 25)[:3], Mux(sc == 33, 1, 0))))
        y_lo = Signal(signed(8))
        y_hi = Signal(signed(9))
        m.d.comb += [y_lo.eq(Mux(Mux(el_v, el.e_relu, a.relu_a | a.is7), 0, -128)),
                     y_hi.eq(Mux(el_v, 127, Mux(a.is7, hi7, Mux(a.relu6_a, 96, 127))))]
        return SimpleNamespace(el_v=el_v, d_m0=d_m0, d_m7=d_m7, d_max=d_max, d_prelu=d_prelu, d_is8=d_is8,
                               d_mult=d_mult, d_wconst=d_wconst, d_usec=d_usec, sh_p=sh_p, rc_p=rc_p,
                               sh_n=sh_n, rc_n=rc_n, d_leaky=d_leaky, y_lo=y_lo, y_hi=y_hi)

    # ---- S0 -> S1 control
    def _s0_to_s1(self, m, st, a, alu, ei, ac, ec, s0, lc):
        """The S1 control registers of the step issued in S0, and the BIAS read of an output line."""
        p = self.p
        CP, APP, AB = p.cp, p.alu_pp, p.addr_bits
        s1_v, s1_first, s1_last, s1_cv, s1_colpad = (Signal(name=n) for n in (
            "s1_v", "s1_first", "s1_last", "s1_cv", "s1_colpad"))
        s1_rowpad = Signal(APP, reset_less=True)
        s1_mask = Signal(CP, reset_less=True)
        s1_oo = Signal(AB, reset_less=True)
        s1_g = Signal(8, reset_less=True)
        s1_psh = Signal(4, reset_less=True)
        m.d.sync += s1_v.eq(st.run_alu | st.run_el)
        with m.If(st.run_el):
            m.d.sync += [s1_first.eq(ec.ek == 0), s1_last.eq(ec.elast_k), s1_cv.eq(1), s1_colpad.eq(0),
                         s1_rowpad.eq(0), s1_mask.eq(0), s1_oo.eq(ec.eocol),
                         s1_psh.eq(Cat(*ei.e_sr).word_select(ec.ek, 4))]
        with m.Else():
            m.d.sync += [s1_first.eq((ac.cw_d == 0) & (ac.cw_kx == 0) & (ac.cw_ky == 0)), s1_last.eq(ac.last_ky),
                         s1_cv.eq(a.is_dw | (ac.cw_d == 0)), s1_colpad.eq(s0.colpad),
                         s1_rowpad.eq(Cat(*s0.rowpad)), s1_mask.eq(s0.lane_mask), s1_oo.eq(ac.outoff),
                         s1_g.eq(ac.cw_g), s1_psh.eq(0)]
        # the BIAS line of a (w, g) output line is read by its first step, for its S2
        m.d.comb += [self.bias_rd.en.eq(s1_v & s1_first & lc.d_m0),
                     self.bias_rd.addr.eq(alu.L["bank_addr_bias"] + s1_g)]
        return SimpleNamespace(v=s1_v, first=s1_first, last=s1_last, cv=s1_cv, colpad=s1_colpad,
                               rowpad=s1_rowpad, mask=s1_mask, oo=s1_oo, psh=s1_psh)

    # ---- S1: mask + multiply
    def _s1_multiply(self, m, a, lc, s1):
        """S1: every lane's masked input times its weight, shifted by psh."""
        p = self.p
        CP, APP, AB = p.cp, p.alu_pp, p.addr_bits
        s2_v, s2_first, s2_last, s2_cv = (Signal(name=n) for n in ("s2_v", "s2_first", "s2_last", "s2_cv"))
        s2_oo = Signal(AB, reset_less=True)
        m.d.sync += [s2_v.eq(s1.v), s2_first.eq(s1.first), s2_last.eq(s1.last), s2_cv.eq(s1.cv),
                     s2_oo.eq(s1.oo)]
        dwd = self.dw_rd.data
        w16 = dwd[0:16].as_signed()
        prod = [[Signal(signed(24), name=f"prod{h}_{i}", reset_less=True) for i in range(CP)] for h in range(APP)]
        # ELEW multiply (num = 2): the second input's step multiplies t1 = (x << 2) >> shift_read by t0, which
        # the first step left in `prod` one cycle earlier (steps of one output line are consecutive), so the
        # lane's one multiplier serves both (no second multiplier in S2; docs/rtl.md "MISC multipliers").
        mk = Signal()
        m.d.comb += mk.eq(lc.d_mult & ~s1.first)
        for h in range(APP):
            rdd = self.img_rd[h].data
            for i in range(CP):
                byte = rdd[8 * i: 8 * i + 8].as_signed()
                padded = s1.rowpad[h] | s1.colpad | s1.mask[i]
                xv = Mux(padded, a.pv, byte)
                wb = _sext(dwd[8 * i: 8 * i + 8].as_signed(), 16)
                wv = Mux(lc.d_is8, w16, Mux(lc.d_usec, lc.d_wconst, (wb + Mux(lc.d_m0, wb, 0))[:16].as_signed()))
                # prelu / leakyrelu: x >= 0 passes (pads are 0 there)
                wsel = Mux(lc.d_prelu & (padded | ~rdd[8 * i + 7]), 1, wv)
                t1 = _sext((_sext(xv, 10) << 2) >> s1.psh, 10)          # |t| <= 508
                op_a = Mux(mk, t1, _sext(xv, 10))
                op_b = Mux(mk, _sext(prod[h][i][:10].as_signed(), 16), wsel)
                pm = Signal(signed(26), name=f"pm{h}_{i}")
                m.d.comb += pm.eq(op_a * op_b)
                with m.If(s1.v):
                    m.d.sync += prod[h][i].eq(Mux(mk, pm, pm >> s1.psh))
        return SimpleNamespace(v=s2_v, first=s2_first, last=s2_last, cv=s2_cv, oo=s2_oo, prod=prod)

    # ---- S2: accumulate
    def _s2_accumulate(self, m, a, lc, s2):
        """S2: the accumulators (sum from the bias / mode-7 offset, max, or the ELEW product)."""
        p = self.p
        CP, APP, AB = p.cp, p.alu_pp, p.addr_bits
        s3_fin = Signal()
        s3_oo = Signal(AB, reset_less=True)
        m.d.sync += [s3_fin.eq(s2.v & s2.last), s3_oo.eq(s2.oo)]
        acc = [[Signal(signed(ACC_W), name=f"acc{h}_{i}", reset_less=True) for i in range(CP)] for h in range(APP)]
        bd = self.bias_rd.data
        for h in range(APP):
            for i in range(CP):
                a_ = acc[h][i]
                pr_ = s2.prod[h][i]
                init = Mux(lc.d_m0, _sext(bd[8 * i: 8 * i + 8].as_signed() << a.sbc, ACC_W),
                           Mux(lc.d_m7, a.off7, 0))
                s_sum = Mux(s2.first, init, a_) + _sext(Mux(s2.cv, pr_, 0), ACC_W)
                mb = Mux(s2.first, -128, a_)
                mi = _sext(Mux(s2.cv, pr_, -128), ACC_W)
                s_max = Mux(mi > mb, mi, mb)
                with m.If(s2.v):      # ELEW multiply: S1 already formed t0 * t1
                    m.d.sync += a_.eq(Mux(lc.d_max, s_max, Mux(lc.d_mult & ~s2.first, _sext(pr_, ACC_W), s_sum)))
        return SimpleNamespace(fin=s3_fin, oo=s3_oo, acc=acc)

    # ---- S3: rounding shift
    def _s3_round(self, m, lc, s3):
        """S3: the signed rounding shift of every finished accumulator."""
        p = self.p
        CP, APP, AB = p.cp, p.alu_pp, p.addr_bits
        s4_fin = Signal()
        s4_oo = Signal(AB, reset_less=True)
        m.d.sync += [s4_fin.eq(s3.fin), s4_oo.eq(s3.oo)]
        vv = [[Signal(signed(V_W), name=f"v{h}_{i}", reset_less=True) for i in range(CP)] for h in range(APP)]
        for h in range(APP):
            for i in range(CP):
                av = s3.acc[h][i]
                ng = av < 0
                # x256 is a shift and leaky's x26 = 16 + 8 + 2 three shifted adds: no multiplier
                av26 = (av << 4) + (av << 3) + (av << 1)
                t = Mux(ng & lc.d_leaky, av26, _sext(av, ACC_W + 5))
                with m.If(s3.fin):
                    m.d.sync += vv[h][i].eq(((t << 8) + Mux(ng, lc.rc_n, lc.rc_p)) >> Mux(ng, lc.sh_n, lc.sh_p))
        return SimpleNamespace(fin=s4_fin, oo=s4_oo, vv=vv)

    # ---- S4: activation and saturation as one clamp -> write registers
    def _s4_write(self, m, alu, el, lc, s4):
        """S4: the clamp to [y_lo, y_hi] into the write registers; S5 drives the ALU_PP write ports."""
        p = self.p
        CP, APP, AB, W = p.cp, p.alu_pp, p.addr_bits, p.width
        w_en = Signal(APP)
        w_bank = [Signal(6, name=f"w_bank{h}", reset_less=True) for h in range(APP)]
        w_addr = [Signal(AB, name=f"w_addr{h}", reset_less=True) for h in range(APP)]
        w_data = [Signal(8 * W, name=f"w_data{h}", reset_less=True) for h in range(APP)]
        m.d.sync += w_en.eq(0)
        with m.If(s4.fin):
            for h in range(APP):
                row = []
                for i in range(CP):
                    v = s4.vv[h][i]
                    row.append(Mux(v < lc.y_lo, lc.y_lo[:8], Mux(v > lc.y_hi, lc.y_hi[:8], v[:8])))
                m.d.sync += [w_en[h].eq(Mux(lc.el_v, el.e_vpp > h, alu.vpp > h)),
                             w_bank[h].eq(Mux(lc.el_v, el.eo_bank[h], alu.o_bank[h])),
                             w_addr[h].eq(Mux(lc.el_v, el.eo_off[h], alu.o_row0[h]) + s4.oo),
                             w_data[h].eq(Cat(*row))]
        for h in range(APP):
            wp = self.img_wr[h]
            m.d.comb += [wp.en.eq(w_en[h]), wp.bank.eq(w_bank[h]), wp.addr.eq(w_addr[h]), wp.data.eq(w_data[h])]
