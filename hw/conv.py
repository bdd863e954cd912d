"""The CONV engine: CONVINIT and CONV (spec §6.4), bit-exact with sim/_kernels.py and cycle-exact with
docs/microarchitecture.md §3.

CONVINIT latches its fields (plus a few per-layer products) and ends after `init_cycles`.

CONV runs one *step* per cycle over (w, ky, kx, g), g innermost: N = length·kernel_h·kernel_w·cg steps.

    cycle s          start: latch the CONV fields and the per-instruction constants (row bases, limits)
    cycle s+1+j      ISSUE step j: read the PP input lines (row h: input row h·stride_h+ky, column
                     w·stride_w+kx, line group g) and the OCP weight lines; padding / channel_offset masks
    cycle s+2+j      MAC: masked inputs x weights, PP x OCP sums of ICP signed 8x8 products, added into
                     the PP x OCP 48-bit accumulators; the last step of a column copies the sums into R
    cycle s+3+j      POST (last step of a column only): a = 2·R + bias·2^shift_bias, activation,
                     DPU rounding, int8 saturation -> Y (PP lines of OCP bytes); unsigned 60-bit
                     arithmetic with the clamps done as compares before the byte extraction
    cycle s+4+j      WRITE: one output line per valid row (stride_out placement)
    cycle s+N+lat    end (the tail counter waits out conv_latency after the last issue)

The bias line is read once (issued in cycle s+1, latched in s+2). Column w's POST/WRITE overlap the
accumulation of column w+1, so the array is busy every cycle. The pipeline needs conv_latency >= 4
(`MIN_LATENCY["conv_latency"]`): the last write is issued in cycle s+N+3 <= s+cost-1; with stride_out > 1
up to min(PP, stride_out limit) - 1 more lines of that write drain from the bank's write queue
afterwards, so `min_latency` adds them. A write that finds its bank's write port busy (a queue still
draining, docs/bank-ports.md §2) is refused and the whole engine is frozen for the cycle (core: `freeze`).

Like the hardware it models, a CONV writes column w while it still reads later columns: a program
whose CONV reads lines that the same CONV writes, or writes one line twice, can differ from the
executor (which gathers everything first and writes rows in h order). Compiled programs never do.

Address generation uses counters only (no multiplier in the step loop): the line offset of a step is
shared by all rows; a row's line is its pass base (a 4-entry shift register that advances when the
input slot crosses a bank-group boundary) plus that offset.
"""
from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from . import decode, iface
from .params import HwParams
from .util import const_divmod as _const_divmod



class ConvEngine(wiring.Component):
    """CONVINIT + CONV. Ports: ctl, img_rd[PP], img_wr[PP], w_rd, bias_rd (see hw/iface.py)."""

    def __init__(self, p: HwParams):
        if not (p.icp == p.ocp == p.width):
            raise ValueError("the CONV engine assumes ICP = OCP = bank width (ISA1)")
        self.p = p
        super().__init__({
            "ctl": In(iface.engine_ctl(p)),
            "img_rd": Out(iface.bank_read(p)).array(p.pp),
            "img_wr": Out(iface.bank_write(p)).array(p.pp),
            "w_rd": Out(iface.convw_read(p)),
            "bias_rd": Out(iface.line_read(p)),
        })

    def _A(self, v):
        """An address value reduced modulo DEPTH (low addr_bits bits)."""
        ab = self.p.addr_bits
        return v[:ab] if len(v) > ab else v

    def elaborate(self, platform):
        m = Module()
        words = self.ctl.instr
        opcode = decode.header(words)["opcode"]
        fi = decode.fields("CONVINIT", words)
        fc = decode.fields("CONV", words)
        start_init = self.ctl.start & (opcode == decode.opcode("CONVINIT"))
        start_conv = self.ctl.start & (opcode == decode.opcode("CONV"))

        ci = self._convinit_state(m, fi, start_init)
        cv = self._conv_registers(m, fc, start_conv, ci)
        st = self._issue(m, ci, cv)
        bias = self._bias(m, ci, cv)
        mac = self._mac(m, st)
        y = self._post(m, ci, mac, bias)
        wcol = self._write(m, ci, cv, y)
        self._start_end(m, fc, start_init, start_conv, ci, st, bias, wcol)
        return m

    # ================= CONVINIT state (latched at CONVINIT start) =================
    def _convinit_state(self, m, fi, start_init):
        """The CONVINIT fields and per-layer products (output arithmetic constants, strides, output
        placement per row), latched when a CONVINIT starts."""
        p = self.p
        pp, ab = p.pp, p.addr_bits
        A = self._A
        jr = Signal(ab)          # jump_read          (mod DEPTH)
        jre = Signal(ab)         # jump_read_endl
        jw = Signal(ab)          # jump_write
        sb = Signal(5)           # shift_bias (<= 20 on legal programs)
        # Output arithmetic (POST stage), per path: n = none/ReLU/ReLU6 and leaky with a >= 0; l = leaky
        # with a < 0 (26*a). kk = the right shift, clamped to 56 (every clamped case rounds to 0 because
        # |a| < 2^49); rf = 2^(kk-1) + 2^59 (rounding constant plus the sign offset of the POST stage);
        # tb = 2^(59-kk), the offset that the sign offset leaves after the shift.
        kk_n = Signal(6)
        kk_l = Signal(6)
        rf_n = Signal(60)
        rf_l = Signal(60)
        th_n = Signal(60)        # shifted values >= th_n saturate high (to hi8)
        tl_n = Signal(60)        # shifted values <  tl_n saturate low (to lo8)
        tl_l = Signal(60)
        nb_n = Signal(8)         # -tb mod 256: added to the low byte of the shifted value
        nb_l = Signal(8)
        hi8 = Signal(8)          # 127, or 96 for ReLU6
        lo8 = Signal(8)          # -128, or 0 for ReLU / ReLU6
        act_leaky = Signal()     # act 3
        vpp = Signal(4)
        kh = Signal(5)
        kw = Signal(5)
        sh = Signal(5)
        sw = Signal(5)
        soi = Signal(3)
        soi_jre = Signal(ab)     # stride_offset_in * jump_read_endl
        vsh = Signal(8)          # (vpp-1) * stride_h
        swjr = Signal(ab)        # stride_w * jump_read
        sojwe = Signal(ab)       # stride_out * jump_write_endl
        osq = [Signal(5, name=f"osq{h}") for h in range(pp)]       # (h+soo) // stride_out
        ormoff = [Signal(ab, name=f"ormoff{h}") for h in range(pp)]  # ((h+soo) % stride_out) * jwe

        with m.If(start_init):
            sc = fi["shift_cut"]
            act = fi["act_type"]
            kn = Signal(6)
            kl = Signal(6)
            m.d.comb += [kn.eq(Mux(sc > 55, 56, sc + 1)), kl.eq(Mux(sc > 47, 56, sc + 9))]
            relu = (act == 1) | (act == 4)
            relu6 = act == 4

            def pow2(e):                           # 2^e for 0 <= e <= 63, as a 64-bit value
                return (Const(1, 1) << e[:6])[:64]
            tbn = Signal(60)
            tbl = Signal(60)
            m.d.comb += [tbn.eq(pow2(59 - kn)), tbl.eq(pow2(59 - kl))]
            m.d.sync += [
                jr.eq(A(fi["jump_read"])), jre.eq(A(fi["jump_read_endl"])), jw.eq(A(fi["jump_write"])),
                sb.eq(fi["shift_bias"][:5]), act_leaky.eq(act == 3),
                kk_n.eq(kn), kk_l.eq(kl),
                rf_n.eq(pow2(kn - 1)[:59] | (1 << 59)), rf_l.eq(pow2(kl - 1)[:59] | (1 << 59)),
                th_n.eq(tbn + Mux(relu6, 97, 128)),
                tl_n.eq(Mux(relu, tbn, Mux(tbn[7:] != 0, tbn - 128, 0))),
                tl_l.eq(Mux(tbl[7:] != 0, tbl - 128, 0)),
                nb_n.eq(-tbn[:8]), nb_l.eq(-tbl[:8]),
                hi8.eq(Mux(relu6, 96, 127)), lo8.eq(Mux(relu, 0, 0x80)),
                vpp.eq(fi["valid_pixel_parallel"]), kh.eq(fi["kernel_h"]), kw.eq(fi["kernel_w"]),
                sh.eq(fi["stride_h"]), sw.eq(fi["stride_w"]), soi.eq(fi["stride_offset_in"]),
                soi_jre.eq(A(fi["stride_offset_in"] * fi["jump_read_endl"])),
                vsh.eq((fi["valid_pixel_parallel"] - 1) * fi["stride_h"]),
                swjr.eq(A(fi["stride_w"] * fi["jump_read"])),
                sojwe.eq(A(fi["stride_out"] * fi["jump_write_endl"])),
            ]
            # (t // so, t % so) for t = 0 .. 7+PP-1 by a chain of increments (no divider)
            so_f, soo_f, jwe_f = fi["stride_out"], fi["stride_offset_out"], fi["jump_write_endl"]
            quo, rem = [Const(0, 5)], [Const(0, 5)]
            for t in range(1, 7 + pp):
                wrap = (rem[-1] + 1) >= so_f
                qt, rt = Signal(5, name=f"soq{t}"), Signal(5, name=f"sor{t}")
                m.d.comb += [rt.eq(Mux(wrap, 0, rem[-1] + 1)), qt.eq(quo[-1] + wrap)]
                quo.append(qt)
                rem.append(rt)
            qa, ra = Array(quo), Array(rem)
            for h in range(pp):
                m.d.sync += [osq[h].eq(qa[soo_f + h]), ormoff[h].eq(A(ra[soo_f + h] * jwe_f))]
        return SimpleNamespace(
            jr=jr, jre=jre, jw=jw, sb=sb, kk_n=kk_n, kk_l=kk_l, rf_n=rf_n, rf_l=rf_l, th_n=th_n, tl_n=tl_n,
            tl_l=tl_l, nb_n=nb_n, nb_l=nb_l, hi8=hi8, lo8=lo8, act_leaky=act_leaky, vpp=vpp, kh=kh, kw=kw,
            sh=sh, sw=sw, soi=soi, soi_jre=soi_jre, vsh=vsh, swjr=swjr, sojwe=sojwe, osq=osq, ormoff=ormoff)

    # ================= CONV instruction registers (latched at CONV start) =================
    def _conv_registers(self, m, fc, start_conv, ci):
        """The CONV fields and per-instruction constants (pass bases, padding limits, output rows),
        latched when a CONV starts."""
        p = self.p
        pp, cp, ab = p.pp, p.cp, p.addr_bits
        A = self._A
        bases = [Signal(ab, name=f"base{k}") for k in range(4)]
        gb_i = Signal(6)
        c_i = Signal(range(max(pp, 2)))
        pt = Signal(4)
        pl = Signal(4)
        ylim = Signal(9)          # rows r >= ylim are padding
        xlim = Signal(16)         # columns x >= xlim are padding
        cg = Signal(9)
        length = Signal(11)
        nread = Signal(signed(16))  # channels read: cg*CP - channel_offset
        baw = Signal(ab)
        bab = Signal(ab)
        row0 = [Signal(ab, name=f"row0_{h}") for h in range(pp)]
        obank = [Signal(6, name=f"obank{h}") for h in range(pp)]

        with m.If(start_conv):
            bidi, bido = fc["bank_id_in"], fc["bank_id_out"]
            qi, ri = _const_divmod(bidi, pp, 63)
            qo, ro = _const_divmod(bido, pp, 63)
            m.d.sync += [
                bases[0].eq(A(fc["bank_addr_in"])), bases[1].eq(A(fc["bank_addr_in_1"])),
                bases[2].eq(A(fc["bank_addr_in_2"])), bases[3].eq(A(fc["bank_addr_in_3"])),
                gb_i.eq(qi * pp), c_i.eq(ri),
                pt.eq(fc["pad_top"]), pl.eq(fc["pad_left"]),
                ylim.eq(ci.vsh + fc["pad_bottom"] + 1),
                xlim.eq((fc["length"] - 1) * ci.sw + fc["pad_right"] + 1),
                cg.eq(fc["channel_group"]), length.eq(fc["length"]),
                nread.eq(fc["channel_group"] * cp - fc["channel_offset"]),
                baw.eq(A(fc["bank_addr_weights"])), bab.eq(A(fc["bank_addr_bias"])),
            ]
            for h in range(pp):
                slot = ro + ci.osq[h]
                qs_, rs_ = _const_divmod(slot, pp, 2 * pp + 8)
                m.d.sync += [obank[h].eq(qo * pp + rs_),
                             row0[h].eq(A(A(fc["bank_addr_out"]) + ci.ormoff[h] + A(qs_ * ci.sojwe)))]
        return SimpleNamespace(bases=bases, gb_i=gb_i, c_i=c_i, pt=pt, pl=pl, ylim=ylim, xlim=xlim, cg=cg,
                               length=length, nread=nread, baw=baw, bab=bab, row0=row0, obank=obank)

    # ================= ISSUE stage: step counters and read requests =================
    def _issue(self, m, ci, cv):
        """The step loop (w, ky, kx, g): the row and weight read requests of the step, its padding /
        channel_offset masks (registered with the data), and the counter update."""
        p = self.p
        pp, cp, ab = p.pp, p.cp, p.addr_bits
        run = Signal()
        g = Signal(9)
        kx = Signal(5)
        ky = Signal(5)
        w = Signal(11)
        gch = Signal(16)          # g * CP
        rmod = Signal(5)          # (soi + ky) % stride_h
        rmoff = Signal(ab)        # rmod * jre
        coloff = Signal(ab)       # w * sw * jr
        loff = Signal(ab)         # rmoff + coloff + kx * jr
        xcol = Signal(16)         # w * sw
        umod = Signal(range(max(pp, 2)))   # (bank_id_in % PP + (soi+ky)//sh) % PP
        bw = [Signal(ab, name=f"bw{k}") for k in range(4)]   # pass bases from the current pass on
        waddr = Signal(ab)        # weight line: baw + (ky*kw + kx)*cg + g

        g_last = g == cv.cg - 1
        kx_last = kx == ci.kw - 1
        ky_last = ky == ci.kh - 1
        w_last = w == cv.length - 1
        col_first = (g == 0) & (kx == 0) & (ky == 0)
        col_last = g_last & kx_last & ky_last

        loffg = Signal(ab)
        m.d.comb += loffg.eq(loff + g)
        for h in range(pp):
            r = self.img_rd[h]
            s_ = umod + h
            carry = s_ >= pp
            m.d.comb += [
                r.en.eq(run & (h < ci.vpp)),
                r.bank.eq(cv.gb_i + Mux(carry, s_ - pp, s_)),
                r.addr.eq(Mux(carry, bw[1], bw[0]) + loffg),
            ]
        m.d.comb += [self.w_rd.en.eq(run), self.w_rd.addr.eq(waddr)]

        # masks, computed at issue and registered with the data
        x_now = xcol + kx
        colok = (x_now >= cv.pl) & (x_now < cv.xlim)
        rowok_d = Signal(pp)
        chok_d = Signal(cp)
        v_d = Signal()
        first_d = Signal()
        last_d = Signal()
        thr = Signal(signed(17))
        m.d.comb += thr.eq(cv.nread - gch)
        m.d.sync += [
            v_d.eq(run), first_d.eq(col_first), last_d.eq(col_last),
            chok_d.eq(Cat(*[thr > i for i in range(cp)])),
            rowok_d.eq(Cat(*[colok & (ky + h * ci.sh >= cv.pt) & (ky + h * ci.sh < cv.ylim) for h in range(pp)])),
        ]

        with m.If(run):
            m.d.sync += waddr.eq(waddr + 1)
            with m.If(~g_last):
                m.d.sync += [g.eq(g + 1), gch.eq(gch + cp)]
            with m.Else():
                m.d.sync += [g.eq(0), gch.eq(0)]
                with m.If(~kx_last):
                    m.d.sync += [kx.eq(kx + 1), loff.eq(loff + ci.jr)]
                with m.Else():
                    m.d.sync += kx.eq(0)
                    with m.If(~ky_last):
                        m.d.sync += ky.eq(ky + 1)
                        with m.If(rmod + 1 >= ci.sh):    # next input sub-row is in the next slot
                            m.d.sync += [rmod.eq(0), rmoff.eq(0), loff.eq(coloff)]
                            with m.If(umod == pp - 1):  # ... which is in the next pass
                                m.d.sync += [umod.eq(0), bw[0].eq(bw[1]), bw[1].eq(bw[2]), bw[2].eq(bw[3])]
                            with m.Else():
                                m.d.sync += umod.eq(umod + 1)
                        with m.Else():
                            m.d.sync += [rmod.eq(rmod + 1), rmoff.eq(rmoff + ci.jre),
                                         loff.eq(rmoff + ci.jre + coloff)]
                    with m.Else():                        # next output column
                        m.d.sync += [ky.eq(0), rmod.eq(ci.soi), rmoff.eq(ci.soi_jre), umod.eq(cv.c_i),
                                     waddr.eq(cv.baw), coloff.eq(coloff + ci.swjr),
                                     loff.eq(ci.soi_jre + coloff + ci.swjr), xcol.eq(xcol + ci.sw), w.eq(w + 1)]
                        m.d.sync += [bw[k].eq(cv.bases[k]) for k in range(4)]
                        with m.If(w_last):
                            m.d.sync += run.eq(0)
        return SimpleNamespace(run=run, g=g, kx=kx, ky=ky, w=w, gch=gch, rmod=rmod, rmoff=rmoff, coloff=coloff,
                               loff=loff, xcol=xcol, umod=umod, bw=bw, waddr=waddr, w_last=w_last,
                               col_last=col_last, rowok_d=rowok_d, chok_d=chok_d, v_d=v_d, first_d=first_d,
                               last_d=last_d)

    # ================= bias =================
    def _bias(self, m, ci, cv):
        """The bias line, read once per CONV (request `pend`), latched as bias[o] * 2^shift_bias."""
        cp = self.p.cp
        bias_pend = Signal()
        bsh = [Signal(60, name=f"bsh{o}") for o in range(cp)]    # bias[o] * 2^shift_bias (mod 2^60)
        m.d.comb += [self.bias_rd.en.eq(bias_pend), self.bias_rd.addr.eq(cv.bab)]
        bias_v = Signal()
        m.d.sync += [bias_pend.eq(0), bias_v.eq(bias_pend)]
        with m.If(bias_v):
            m.d.sync += [bsh[o].eq(self.bias_rd.data[8 * o:8 * o + 8].as_signed() << ci.sb) for o in range(cp)]
        return SimpleNamespace(pend=bias_pend, bsh=bsh)

    # ================= MAC stage =================
    def _mac(self, m, st):
        """The PP x OCP accumulators; the last step of a column copies its sums into R (valid: `rv`)."""
        p = self.p
        pp, cp = p.pp, p.cp
        acc = [[Signal(signed(p.acc_bits), name=f"acc{h}_{o}") for o in range(cp)] for h in range(pp)]
        R = [[Signal(signed(p.acc_bits), name=f"R{h}_{o}") for o in range(cp)] for h in range(pp)]
        rv = Signal()
        m.d.sync += rv.eq(st.v_d & st.last_d)
        wts = [[self.w_rd.data[o][8 * i:8 * i + 8].as_signed() for i in range(cp)] for o in range(cp)]
        # Two int8 products per multiplier (AMD WP486): the weights of output channels 2k and 2k+1 packed
        # as w_2k * 2^18 + w_2k+1 (a 27-bit DSP48E2 A/D operand, shared by all PP rows) times the int8
        # activation give P = w_2k*x * 2^18 + w_2k+1*x; |w*x| <= 2^14, so the low 18 bits are w_2k+1*x
        # (signed) and (P - low) >> 18 is w_2k*x, exactly. An odd last channel keeps its own multiplier.
        packed = []
        for k in range(cp // 2):
            row = []
            for i in range(cp):
                pw = Signal(signed(27), name=f"pw{k}_{i}")
                m.d.comb += pw.eq((wts[2 * k][i] << 18) + wts[2 * k + 1][i])
                row.append(pw)
            packed.append(row)
        for h in range(pp):
            d = self.img_rd[h].data
            xs = []
            for i in range(cp):
                xm = Signal(signed(8), name=f"x{h}_{i}")
                m.d.comb += xm.eq(Mux(st.rowok_d[h] & st.chok_d[i], d[8 * i:8 * i + 8], 0))
                xs.append(xm)
            prods = [[None] * cp for _ in range(cp)]          # prods[o][i] = x_i * w_o,i
            for k in range(cp // 2):
                for i in range(cp):
                    pr = Signal(signed(35), name=f"pp{h}_{k}_{i}")
                    lo = Signal(signed(18), name=f"plo{h}_{k}_{i}")
                    hi = Signal(signed(17), name=f"phi{h}_{k}_{i}")
                    m.d.comb += [pr.eq(packed[k][i] * xs[i]), lo.eq(pr[:18]), hi.eq((pr - lo) >> 18)]
                    prods[2 * k][i], prods[2 * k + 1][i] = hi, lo
            if cp % 2:
                for i in range(cp):
                    prods[cp - 1][i] = xs[i] * wts[cp - 1][i]
            for o in range(cp):
                ps = Signal(signed(16 + max(1, (cp - 1).bit_length())), name=f"ps{h}_{o}")
                m.d.comb += ps.eq(sum(prods[o][i] for i in range(cp)))
                nxt = Signal(signed(p.acc_bits), name=f"accn{h}_{o}")
                m.d.comb += nxt.eq(Mux(st.first_d, 0, acc[h][o]) + ps)
                with m.If(st.v_d):
                    m.d.sync += acc[h][o].eq(nxt)
                with m.If(st.v_d & st.last_d):
                    m.d.sync += R[h][o].eq(nxt)
        return SimpleNamespace(R=R, rv=rv)

    # ================= POST stage: bias, shift, activation, rounding, saturation =================
    def _post(self, m, ci, mac, bias):
        """The output bytes Y (one line per row, valid: `yv`) of the column in R."""
        p = self.p
        pp, cp = p.pp, p.cp
        Y = [Signal(8 * cp, name=f"Y{h}") for h in range(pp)]
        yv = Signal()
        m.d.sync += yv.eq(mac.rv)
        # All in unsigned 60-bit arithmetic (|values| < 2^57), which simulates fast. With the sign offset
        # 2^59 added, u = t + 2^59 > 0 for the true value t = n + 2^(kk-1), and (u >> kk) = v + tb with
        # v = floor(t / 2^kk) the rounded value and tb = 2^(59-kk). The activation's clamp to [lo, hi]
        # is done on u >> kk against tb + hi + 1 and tb + lo; in range, the output byte is the low byte
        # of v = (u >> kk) - tb.
        for h in range(pp):
            ybytes = []
            for o in range(cp):
                rs = Signal(60, name=f"r{h}_{o}")
                m.d.comb += rs.eq(mac.R[h][o])                   # sign-extends
                a = Signal(60, name=f"a{h}_{o}")
                m.d.comb += a.eq((rs << 1) + bias.bsh[o])        # 2*acc + bias*2^shift_bias
                neg = ci.act_leaky & a[59]
                a26 = (a << 4)[:60] + (a << 3)[:60] + (a << 1)[:60]
                u = Signal(60, name=f"u{h}_{o}")
                m.d.comb += u.eq(Mux(neg, a26, a) + Mux(neg, ci.rf_l, ci.rf_n))
                sv = Signal(60, name=f"sv{h}_{o}")
                m.d.comb += sv.eq(u >> Mux(neg, ci.kk_l, ci.kk_n))
                hi_hit = ~neg & (sv >= ci.th_n)
                lo_hit = sv < Mux(neg, ci.tl_l, ci.tl_n)
                y = Mux(hi_hit, ci.hi8, Mux(lo_hit, ci.lo8, sv[:8] + Mux(neg, ci.nb_l, ci.nb_n)))
                ybytes.append(y[:8])
            with m.If(mac.rv):
                m.d.sync += Y[h].eq(Cat(*ybytes))
        return SimpleNamespace(Y=Y, yv=yv)

    # ================= WRITE stage =================
    def _write(self, m, ci, cv, y):
        """One output line per valid row; returns the column offset register (w * jump_write)."""
        p = self.p
        wcol = Signal(p.addr_bits)         # w * jump_write
        with m.If(y.yv):
            m.d.sync += wcol.eq(wcol + ci.jw)
        for h in range(p.pp):
            wr = self.img_wr[h]
            m.d.comb += [wr.en.eq(y.yv & (h < ci.vpp)), wr.bank.eq(cv.obank[h]), wr.addr.eq(cv.row0[h] + wcol),
                         wr.data.eq(y.Y[h])]
        return wcol

    # ================= start / end =================
    def _start_end(self, m, fc, start_init, start_conv, ci, st, bias, wcol):
        """The end timer (init_cycles after a CONVINIT, conv_latency after the last CONV step) and the
        start of a CONV (loop counters and bias request)."""
        p = self.p
        pp = p.pp
        A = self._A
        tail = Signal(range(max(p.t.conv_latency, p.t.init_cycles, 2)))
        tailing = Signal()
        m.d.comb += self.ctl.end.eq(tailing & (tail == 0))
        with m.If(tailing):
            m.d.sync += tail.eq(tail - 1)
            with m.If(tail == 0):
                m.d.sync += tailing.eq(0)
        with m.If(st.run & st.col_last & st.w_last):
            m.d.sync += [tailing.eq(1), tail.eq(p.t.conv_latency - 1)]
        with m.If(start_init):
            m.d.sync += [tailing.eq(1), tail.eq(p.t.init_cycles - 1)]
        with m.If(start_conv):
            m.d.sync += [st.run.eq(1), bias.pend.eq(1), st.g.eq(0), st.gch.eq(0), st.kx.eq(0), st.ky.eq(0),
                         st.w.eq(0), st.rmod.eq(ci.soi), st.rmoff.eq(ci.soi_jre), st.coloff.eq(0),
                         st.loff.eq(ci.soi_jre), st.xcol.eq(0), st.waddr.eq(A(fc["bank_addr_weights"])),
                         wcol.eq(0), tailing.eq(0), st.umod.eq(_const_divmod(fc["bank_id_in"], pp, 63)[1])]
            bw = st.bw
            m.d.sync += [bw[0].eq(A(fc["bank_addr_in"])), bw[1].eq(A(fc["bank_addr_in_1"])),
                         bw[2].eq(A(fc["bank_addr_in_2"])), bw[3].eq(A(fc["bank_addr_in_3"]))]
