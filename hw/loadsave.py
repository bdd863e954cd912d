"""The LOAD engine and one SAVE unit (spec §6.2-6.3; costs of docs/microarchitecture.md §3).

Both engines move one bank line (W bytes) per cycle and model the AXI ports by their timing only: an
item takes max(DDR beats, bank lines) cycles, counted with two per-item byte accumulators (no
division), and the fixed terms (setup and the DDR latency) are waited out at the end, after the real
transfers, so every write is issued before `end`.

Timeline of one instruction started in cycle s (sum = the item cycles of the cost formula):

* s: the instruction is latched (with its first item's mask bounds and DDR/bank pointers).
* s+1 .. s+sum: the item loop (state ITER). LOAD: in a line cycle, read W DDR bytes at
  `ddr_base[reg] + ddr_addr + i*jump_read + l*W`; the data arrives the next cycle and is written,
  masked, to bank line `bank_addr + i*jump_write + l` in that same cycle (combinational data path).
  A broadcast LOAD writes its line in the loop cycle itself (no DDR read).
  SAVE: read bank line `bank_addr + i*jump_read + l`; the next cycle forms the DDR beat (plain bytes,
  const bytes, or the running argmax of the item); the beat leaves through registers one cycle later.
  With the wide weight path (Timing.weight_load_lines = 2), a DDR LOAD into a CONVW bank without channel
  augmentation reads 2W bytes per line cycle and writes lines l and l + 1 (bank_wr.en2 / data2; the split
  CONVW memories of hw/banks.py take both), so its item takes max(ceil(lines / 2), beats) cycles.
* s+sum+1 .. s+cost: the tail (setup + L, or setup for a broadcast LOAD), `end` in its last cycle.

Pipeline depth after the last loop cycle: LOAD 1 cycle (needs load_setup + L >= 2; a broadcast LOAD
writes in the loop cycle itself, so it needs load_setup >= 1), SAVE 2 cycles (needs save_setup + L >= 3).
hw/params.py MIN_LATENCY guarantees both (ddr_latency >= 3, load_setup >= 1).
"""
from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from . import decode, iface
from .params import HwParams


def _byte_mask(bits, n: int):
    """Expand n mask bits to an 8n-bit byte mask."""
    return Cat(*(bits[j].replicate(8) for j in range(n)))


class LoadEngine(wiring.Component):
    """LOAD: DDR (or a constant) -> any bank, with channel-augmentation masking (spec §6.2)."""

    def __init__(self, p: HwParams):
        self.p = p
        super().__init__({
            "ctl": In(iface.engine_ctl(p)),
            "ddr_base": In(iface.ddr_bases(p)),
            "ddr_rd": Out(iface.ddr_read(p)),
            "bank_wr": Out(iface.load_write(p)),
        })

    def elaborate(self, platform):
        p = self.p
        m = Module()
        W = p.width
        WL = p.weight_lines                                 # lines per cycle into a CONVW bank (1 or 2)
        RW = p.ddr_rd_bytes                                 # W * WL: bytes of one DDR read
        AB = p.addr_bits
        BP = p.t.ddr_bytes_per_cycle * p.t.ddr_ports       # bytes per cycle over all read channels
        C_DDR = p.t.load_setup + p.t.ddr_latency            # tail after the item loop
        C_BC = p.t.load_setup
        f = decode.fields("LOAD", self.ctl.instr)
        chw = len(f["channel"])                             # 15 bits: channel <= 16384
        ch_max = 1 << (chw - 1)

        # ---- instruction registers ----
        busy = Signal()                                     # item loop (ITER)
        tail = Signal(range(max(C_DDR, C_BC) + 1))          # cycles left until end (end when 1)
        bcast = Signal()
        aug = Signal()
        bank = Signal(p.bank_id_bits)
        jr = Signal(len(f["jump_read"]))
        jw = Signal(len(f["jump_write"]))
        ch = Signal(chw)
        cval = Signal(8)
        items = Signal(len(f["length"]))                    # items left, including the current one
        item_ptr = Signal(p.ddr_addr_bits)                  # DDR address of the current item
        rd_ptr = Signal(p.ddr_addr_bits)                    # DDR address of the current line
        item_line = Signal(AB)
        wr_line = Signal(AB)
        off = Signal(range(ch_max + RW + 1))                # byte offset of the current line in the item
        dbl = Signal()                                      # two lines per cycle (wide weight path)
        bb = Signal(range(ch_max + BP + 1))                 # DDR bytes covered by the item's beats so far
        # per-item mask bounds: unmasked bytes are [lo, hi); b = max(0, hi - lo) bytes to read
        lo = Signal(len(f["pad_start"]))
        hi = Signal(chw)
        b = Signal(chw)
        k = Signal(signed(13))                              # item index - first_end_item
        zs = Signal(13)                                     # pad_end + jump_read * max(k, 0)
        cw = Signal(8)                                      # ceil(channel / W) * W (channel <= 64 only)

        def hi_of(tag, aug_v, k_v, zs_v, cw_v, ch_v):
            """End bound of the unmasked span: min(channel, cw - zs) for end items, clamped at 0."""
            z = Signal(signed(16), name=f"{tag}_z")
            use = Signal(name=f"{tag}_use_z")
            h = Signal(chw, name=f"{tag}_hi")
            m.d.comb += [z.eq(cw_v - zs_v),
                         use.eq(aug_v & (k_v >= 0) & (z < ch_v)),
                         h.eq(Mux(use, Mux(z < 0, 0, z), ch_v))]
            return h

        def span_bytes(tag, lo_v, hi_v):
            n = Signal(chw, name=f"{tag}_b")
            m.d.comb += n.eq(Mux(hi_v > lo_v, hi_v - lo_v, 0))
            return n

        # ---- values of the first item, from the instruction words (cycle s) ----
        s_ch = f["channel"]
        s_jr = f["jump_read"]
        s_aug = Signal()
        m.d.comb += s_aug.eq((s_jr <= s_ch) & (s_ch <= 64))
        s_cw_sig = Signal(8)
        with m.Switch(s_ch[:7]):                            # channel <= 64 in augmentation mode
            for c in range(1, 65):
                with m.Case(c):
                    m.d.comb += s_cw_sig.eq(-(-c // W) * W)
        s_k = Signal(signed(13))
        s_zs = Signal(13)
        s_lo = Signal(len(lo))
        m.d.comb += [
            s_k.eq(f["pad_idx"] - f["length"]),
            # augmentation implies jump_read <= 64 and k0 <= 31: a 7 x 5-bit product
            s_zs.eq(f["pad_end"] + Mux(s_k >= 0, s_jr[:7] * s_k[:5], 0)),
            s_lo.eq(Mux(s_aug, f["pad_start"], 0)),
        ]
        s_hi = hi_of("s", s_aug, s_k, s_zs, s_cw_sig, s_ch)
        s_b = span_bytes("s", s_lo, s_hi)
        s_base = Signal(p.ddr_addr_bits)
        m.d.comb += s_base.eq(self.ddr_base[f["reg_id"]] + f["ddr_addr"])

        # ---- values of the next item (at an item transition) ----
        n_lo = Signal(len(lo))
        n_k = Signal(signed(13))
        n_zs = Signal(13)
        m.d.comb += [
            n_lo.eq(Mux(lo > jr, lo - jr, 0)),
            n_k.eq(k + 1),
            n_zs.eq(Mux(k >= 0, zs + jr[:7], zs)),
        ]
        n_hi = hi_of("n", aug, n_k, n_zs, cw, ch)
        n_b = span_bytes("n", n_lo, n_hi)

        # ---- the item loop ----
        op = Signal()              # a line cycle: read one DDR line / write one bank line
        fin_l = Signal()
        fin_b = Signal()
        step = Mux(dbl, 2 * W, W) if WL == 2 else W         # item bytes per loop cycle
        m.d.comb += [
            op.eq(busy & (off < ch)),
            fin_l.eq(off + step >= ch),
            fin_b.eq(bcast | (bb + BP >= b)),              # a broadcast reads no DDR: lines only
        ]
        # byte mask of the current line(s): byte j is unmasked iff lo <= off + j < hi
        rel_lo = Signal(signed(chw + 2))
        rel_hi = Signal(signed(chw + 2))
        mask_a = Signal(RW)
        m.d.comb += [rel_lo.eq(lo - off), rel_hi.eq(hi - off),
                     mask_a.eq(Cat(*((rel_lo <= j) & (rel_hi > j) for j in range(RW))))]

        # stage B: DDR data of the previous cycle's read
        v_b = Signal()
        line_b = Signal(AB)
        mask_b = Signal(RW)
        m.d.sync += [v_b.eq(op & ~bcast), line_b.eq(wr_line), mask_b.eq(mask_a)]
        rd_data = self.ddr_rd.data

        m.d.comb += [
            self.ddr_rd.en.eq(op & ~bcast & mask_a[:W].any()),
            self.ddr_rd.addr.eq(rd_ptr),
            self.bank_wr.bank.eq(bank),
            self.bank_wr.en.eq(Mux(bcast, op, v_b)),
            self.bank_wr.addr.eq(Mux(bcast, wr_line, line_b)),
            self.bank_wr.data.eq(Mux(bcast, cval.replicate(W) & _byte_mask(mask_a, W),
                                     rd_data[:8 * W] & _byte_mask(mask_b, W))),
            self.ctl.end.eq(tail == 1),
        ]
        if WL == 2:
            # the second line of a two-line cycle (line + 1 of the same CONVW bank), when the item has it
            v2_b = Signal()
            m.d.sync += v2_b.eq(op & dbl & (off + W < ch))
            m.d.comb += [self.bank_wr.en2.eq(v2_b),
                         self.bank_wr.data2.eq(rd_data[8 * W:] & _byte_mask(mask_b[W:], W))]
            bid = f["bank_id"]
            s_dbl = Signal()
            m.d.comb += s_dbl.eq((bid >= p.convw_base) & (bid < p.dwconvw_bank) & (f["broadcast"] != 7) & ~s_aug)

        with m.If(self.ctl.start):
            m.d.sync += [
                busy.eq(1), tail.eq(0),
                bcast.eq(f["broadcast"] == 7), aug.eq(s_aug), bank.eq(f["bank_id"]),
                jr.eq(s_jr), jw.eq(f["jump_write"]), ch.eq(s_ch), cval.eq(f["const_value"]),
                items.eq(f["length"]),
                item_ptr.eq(s_base), rd_ptr.eq(s_base),
                item_line.eq(f["bank_addr"]), wr_line.eq(f["bank_addr"]),
                off.eq(0), bb.eq(0), dbl.eq(s_dbl if WL == 2 else 0),
                lo.eq(s_lo), hi.eq(s_hi), b.eq(s_b), k.eq(s_k), zs.eq(s_zs), cw.eq(s_cw_sig),
            ]
        with m.Elif(busy):
            with m.If(op):
                m.d.sync += [rd_ptr.eq(rd_ptr + step), wr_line.eq(wr_line + Mux(dbl, 2, 1)), off.eq(off + step)]
            with m.If(bb < b):
                m.d.sync += bb.eq(bb + BP)
            with m.If(fin_l & fin_b):
                with m.If(items == 1):
                    m.d.sync += [busy.eq(0), tail.eq(Mux(bcast, C_BC, C_DDR))]
                with m.Else():
                    m.d.sync += [
                        items.eq(items - 1),
                        item_ptr.eq(item_ptr + jr), rd_ptr.eq(item_ptr + jr),
                        item_line.eq(item_line + jw), wr_line.eq(item_line + jw),
                        off.eq(0), bb.eq(0),
                        lo.eq(n_lo), hi.eq(n_hi), b.eq(n_b), k.eq(n_k), zs.eq(n_zs),
                    ]
        with m.Elif(tail != 0):
            m.d.sync += tail.eq(tail - 1)
        return m


class SaveUnit(wiring.Component):
    """SAVE on one AXI write port: image bank -> DDR, plain, argmax or constant (spec §6.3)."""

    def __init__(self, p: HwParams):
        self.p = p
        super().__init__({
            "ctl": In(iface.engine_ctl(p)),
            "ddr_base": In(iface.ddr_bases(p)),
            "ddr_wr": Out(iface.ddr_write(p)),
            "bank_rd": Out(iface.bank_read(p)),
        })

    def elaborate(self, platform):
        p = self.p
        m = Module()
        W = p.width
        AB = p.addr_bits
        B = p.t.ddr_bytes_per_cycle
        ND = p.ddr_wr_bytes                                 # max(W, B)
        C = p.t.save_setup + p.t.ddr_latency
        f = decode.fields("SAVE", self.ctl.instr)
        chw = len(f["channel"])                             # 13 bits: channel <= 4096
        ch_max = 1 << (chw - 1)

        busy = Signal()
        tail = Signal(range(C + 1))
        cst = Signal()                                      # const_en: B const bytes per cycle
        am = Signal()                                       # argmax (one byte per item)
        amv = Signal()                                      # argmax stores the value, not the index
        bank = Signal(p.bank_id_bits)
        jr = Signal(len(f["jump_read"]))
        jw = Signal(len(f["jump_write"]))
        ch = Signal(chw)
        cval = Signal(8)
        items = Signal(len(f["length"]))
        item_ptr = Signal(p.ddr_addr_bits)
        wr_ptr = Signal(p.ddr_addr_bits)
        item_line = Signal(AB)
        rd_line = Signal(AB)
        off = Signal(range(ch_max + ND + 1))
        bb = Signal(range(ch_max + B + 1))

        s_base = Signal(p.ddr_addr_bits)
        m.d.comb += s_base.eq(self.ddr_base[f["reg_id"]] + f["ddr_addr"])

        op = Signal()
        fin_l = Signal()
        fin_b = Signal()
        nb = Signal(chw)
        m.d.comb += [
            op.eq(busy & (off < ch)),
            fin_l.eq(off + Mux(cst, B, W) >= ch),
            nb.eq(Mux(am, 1, ch)),
            fin_b.eq(bb + B >= nb),
        ]
        # valid bytes of the current beat: j < min(step, channel - off)
        rem = Signal(signed(chw + 2))
        m.d.comb += rem.eq(ch - off)
        bits = []
        for j in range(ND):
            in_step = 1 if j < min(W, B) else (~cst if j < W else cst)
            bits.append((rem > j) & in_step)
        mask_a = Signal(ND)
        m.d.comb += mask_a.eq(Cat(*bits))

        m.d.comb += [
            self.bank_rd.en.eq(op & ~cst),
            self.bank_rd.bank.eq(bank),
            self.bank_rd.addr.eq(rd_line),
        ]

        # ---- stage B: bank data of the previous cycle's read ----
        v_b = Signal()
        first_b = Signal()
        last_b = Signal()
        addr_b = Signal(p.ddr_addr_bits)
        item_b = Signal(p.ddr_addr_bits)
        mask_b = Signal(ND)
        off_b = Signal(range(ch_max + ND + 1))
        m.d.sync += [v_b.eq(op), first_b.eq(off == 0), last_b.eq(fin_l), addr_b.eq(wr_ptr),
                     item_b.eq(item_ptr), mask_b.eq(mask_a), off_b.eq(off)]

        # argmax of the valid bytes of the line: first maximum (strict '>' scan) of signed bytes
        idx_w = max(1, (W - 1).bit_length())
        line = self.bank_rd.data
        nodes = [(mask_b[j], line[8 * j:8 * j + 8].as_signed(), Const(j, idx_w)) for j in range(W)]
        lvl = 0
        while len(nodes) > 1:
            nxt = []
            for q in range(0, len(nodes) - 1, 2):
                (lv, lval, li), (rv, rval, ri) = nodes[q], nodes[q + 1]
                take = Signal(name=f"am{lvl}_{q}_take")
                val = Signal(signed(8), name=f"am{lvl}_{q}_v")
                idx = Signal(idx_w, name=f"am{lvl}_{q}_i")
                valid = Signal(name=f"am{lvl}_{q}_ok")
                m.d.comb += [take.eq(rv & (rval > lval)), val.eq(Mux(take, rval, lval)),
                             idx.eq(Mux(take, ri, li)), valid.eq(lv | rv)]
                nxt.append((valid, val, idx))
            if len(nodes) % 2:
                nxt.append(nodes[-1])
            nodes = nxt
            lvl += 1
        _, l_val, l_idx = nodes[0]
        run_v = Signal(signed(8))
        run_i = Signal(chw)
        take = Signal()
        res_v = Signal(signed(8))
        res_i = Signal(chw)
        m.d.comb += [take.eq(first_b | (l_val > run_v)),
                     res_v.eq(Mux(take, l_val, run_v)),
                     res_i.eq(Mux(take, off_b + l_idx, run_i))]
        with m.If(v_b & am):
            m.d.sync += [run_v.eq(res_v), run_i.eq(res_i)]

        # ---- output beat (registered) ----
        o_en = Signal()
        o_addr = Signal(p.ddr_addr_bits)
        o_data = Signal(8 * ND)
        o_mask = Signal(ND)
        am_byte = Signal(8)
        m.d.comb += am_byte.eq(Mux(amv, res_v.as_unsigned(), res_i[:8]))
        m.d.sync += [
            o_en.eq(v_b & (~am | last_b)),
            o_addr.eq(Mux(am, item_b, addr_b)),
            o_data.eq(Mux(cst, cval.replicate(ND), Mux(am, am_byte, line))),
            o_mask.eq(Mux(am, 1, mask_b)),
        ]
        m.d.comb += [
            self.ddr_wr.en.eq(o_en), self.ddr_wr.addr.eq(o_addr),
            self.ddr_wr.data.eq(o_data), self.ddr_wr.mask.eq(o_mask),
            self.ctl.end.eq(tail == 1),
        ]

        with m.If(self.ctl.start):
            m.d.sync += [
                busy.eq(1), tail.eq(0),
                cst.eq(f["const_en"]), am.eq(~f["const_en"] & f["argmax"][1]), amv.eq(f["argmax"][0]),
                bank.eq(f["bank_id"]), jr.eq(f["jump_read"]), jw.eq(f["jump_write"]),
                ch.eq(f["channel"]), cval.eq(f["const_value"]), items.eq(f["length"]),
                item_ptr.eq(s_base), wr_ptr.eq(s_base),
                item_line.eq(f["bank_addr"]), rd_line.eq(f["bank_addr"]),
                off.eq(0), bb.eq(0),
            ]
        with m.Elif(busy):
            with m.If(op):
                m.d.sync += [wr_ptr.eq(wr_ptr + Mux(cst, B, W)), rd_line.eq(rd_line + 1),
                             off.eq(off + Mux(cst, B, W))]
            with m.If(bb < nb):
                m.d.sync += bb.eq(bb + B)
            with m.If(fin_l & fin_b):
                with m.If(items == 1):
                    m.d.sync += [busy.eq(0), tail.eq(C)]
                with m.Else():
                    m.d.sync += [
                        items.eq(items - 1),
                        item_ptr.eq(item_ptr + jw), wr_ptr.eq(item_ptr + jw),
                        item_line.eq(item_line + jr), rd_line.eq(item_line + jr),
                        off.eq(0), bb.eq(0),
                    ]
        with m.Elif(tail != 0):
            m.d.sync += tail.eq(tail - 1)
        return m
