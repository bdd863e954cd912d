"""The on-chip banks (spec §2.2-2.3): IMG_BG image groups of PP banks, OCP CONVW banks, DWCONVW, BIAS.

Each bank is a `lib.memory.Memory` of DEPTH lines of W bytes. Every access is a whole line: a bank
write of n bytes always starts at a line boundary and zero-fills the rest of its last line, so engines
write whole lines. Engines address image banks by absolute bank id, one request per pixel row; the
array routes each request to its bank. Rows of one request group must address distinct banks, or the
same line of one bank (the ELEW share_pp / jump_bank 0 broadcast), which is what ISA1's placement
rules guarantee (spec §2.4). Ports per image bank: writes from LOAD, PP CONV rows and ALU_PP MISC rows;
reads for CONV, MISC and each SAVE unit. Engines never contend for a port, so no access waits.
"""
from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from . import iface
from .params import HwParams


class BankArray(wiring.Component):
    """All banks of one core with one port group per engine."""

    def __init__(self, p: HwParams):
        self.p = p
        super().__init__({
            "load_wr": In(iface.bank_write(p)),
            "conv_rd": In(iface.bank_read(p)).array(p.pp),
            "conv_wr": In(iface.bank_write(p)).array(p.pp),
            "convw_rd": In(iface.convw_read(p)),
            "conv_bias_rd": In(iface.line_read(p)),
            "misc_rd": In(iface.bank_read(p)).array(p.alu_pp),
            "misc_wr": In(iface.bank_write(p)).array(p.alu_pp),
            "dw_rd": In(iface.line_read(p)),
            "misc_bias_rd": In(iface.line_read(p)),
            "save_rd": In(iface.bank_read(p)).array(p.ddr_ports),
        })
        # One memory per bank id; tests read and write them through `mems[b].data[line]`.
        self.mems = [Memory(shape=8 * p.width, depth=p.depth, init=[]) for _ in range(p.num_banks)]

    def elaborate(self, platform):
        p = self.p
        m = Module()
        nimg = p.num_img_banks
        for b, mem in enumerate(self.mems):
            m.submodules[f"bank{b}"] = mem
            # LOAD writes every bank.
            wp = mem.write_port()
            m.d.comb += [wp.addr.eq(self.load_wr.addr), wp.data.eq(self.load_wr.data),
                         wp.en.eq(self.load_wr.en & (self.load_wr.bank == b))]

        # image banks: row-routed read groups and write rows
        def read_group(reqs, tag):
            sel = [Signal(range(max(nimg, 2)), name=f"{tag}_sel{h}") for h in range(len(reqs))]
            for h, r in enumerate(reqs):
                with m.If(r.en):
                    m.d.sync += sel[h].eq(r.bank)
            datas = []
            for b in range(nimg):
                rp = self.mems[b].read_port(transparent_for=())
                hits = [r.en & (r.bank == b) for r in reqs]
                addr = 0
                for r, hit in zip(reqs, hits):
                    addr = addr | (r.addr & hit.replicate(p.addr_bits))
                en = 0
                for hit in hits:
                    en = en | hit
                m.d.comb += [rp.addr.eq(addr), rp.en.eq(en)]
                datas.append(rp.data)
            for h, r in enumerate(reqs):
                with m.Switch(sel[h]):
                    for b in range(nimg):
                        with m.Case(b):
                            m.d.comb += r.data.eq(datas[b])

        read_group(list(self.conv_rd), "conv")
        read_group(list(self.misc_rd), "misc")
        for u in range(p.ddr_ports):
            read_group([self.save_rd[u]], f"save{u}")

        for b in range(nimg):
            for reqs in (self.conv_wr, self.misc_wr):
                for r in reqs:
                    wp = self.mems[b].write_port()
                    m.d.comb += [wp.addr.eq(r.addr), wp.data.eq(r.data), wp.en.eq(r.en & (r.bank == b))]

        # parameter banks
        for o in range(p.ocp):
            rp = self.mems[p.convw_base + o].read_port(transparent_for=())
            m.d.comb += [rp.addr.eq(self.convw_rd.addr), rp.en.eq(self.convw_rd.en),
                         self.convw_rd.data[o].eq(rp.data)]
        for req, b in ((self.dw_rd, p.dwconvw_bank), (self.conv_bias_rd, p.bias_bank),
                       (self.misc_bias_rd, p.bias_bank)):
            rp = self.mems[b].read_port(transparent_for=())
            m.d.comb += [rp.addr.eq(req.addr), rp.en.eq(req.en), req.data.eq(rp.data)]
        return m


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
