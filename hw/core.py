"""One DPUCZDX8G ISA1 core: control, LOAD, SAVE units, CONV, MISC, banks and the host register map.

The core has three memory-side ports, all simple synchronous ports (data the cycle after the request):
the 32-bit instruction port, one W-byte DDR read port (LOAD) and one DDR write port per AXI data port
(SAVE units). AXI latency and bandwidth are modelled inside the engines by the timing parameters of
the Target (docs/microarchitecture.md), so a plain memory behind these ports gives the documented
cycle counts. The host programs the core through the register map of spec §2.7 (`bus_*`).
"""
from __future__ import annotations

from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from opendpu.isa.fields import Engine

from . import iface
from .banks import (BankArray, connect_conv, connect_load, connect_load_ddr, connect_misc, connect_save,
                    connect_save_ddr, freeze)
from .control import Control, n_end_slots, n_ret_slots
from .conv import ConvEngine
from .loadsave import LoadEngine, SaveUnit
from .misc import MiscEngine
from .params import HwParams

# Register offsets (spec §2.7).
AP_CTRL, GIE, IER, ISR = 0x00, 0x04, 0x08, 0x0C
SYS, TIMESTAMP, FREQ = 0x20, 0x24, 0x28
IRQ_CLR, PROF_ENA, HP_BUS = 0x40, 0x44, 0x48
INSTR_ADDR_LO, INSTR_ADDR_HI, PROF_ADDR_LO, PROF_ADDR_HI = 0x50, 0x54, 0x58, 0x5C
ADDR_BASE = 0x60                                  # ADDR_k lo at 0x60 + 8k, hi at 0x64 + 8k
COUNTERS = {"LSTART": 0x180, "LEND": 0x184, "CSTART": 0x188, "CEND": 0x18C,
            "SSTART": 0x190, "SEND": 0x194, "MSTART": 0x198, "MEND": 0x19C}
EXEC_CYCLE_LO, EXEC_CYCLE_HI, DPU_STS, AXI_STS = 0x1A0, 0x1A4, 0x1A8, 0x1AC
# Bank-stall cycles per engine (docs/bank-ports.md §5; our addition, free offsets after AXI_STS): the
# cycles of the run in which the engine's bank request was refused (SAVE: summed over the SAVE units).
BANK_STALLS = {"LSTALL": 0x1B0, "CSTALL": 0x1B4, "SSTALL": 0x1B8, "MSTALL": 0x1BC}
FINGERPRINT_LO, FINGERPRINT_HI = 0x1F0, 0x1F4
ENGINE_OF_COUNTER = {e.name[0]: e for e in Engine}    # the first letter of LSTART, CEND, ...


def core_signature(p: HwParams) -> wiring.Signature:
    """The port signature of the core for `p`; the test bench generator reads it from here, so that
    listing the ports does not build a DpuCore that is never elaborated (Amaranth warns about those)."""
    ib = p.idx_bits
    return wiring.Signature({
        "bus_addr": In(12), "bus_wdata": In(32), "bus_we": In(1), "bus_rdata": Out(32),
        "irq": Out(1), "ap_done": Out(1),
        "ifetch": Out(iface.instr_read(p)),
        "ddr_rd": Out(iface.ddr_read(p)),
        "ddr_wr": Out(iface.ddr_write(p)).array(p.ddr_ports),
        "cyc": Out(p.cycle_bits),
        "tr_start_v": Out(len(Engine)), "tr_start_idx": Out(len(Engine) * ib),     # one start slot per engine
        "tr_end_v": Out(n_end_slots(p)), "tr_end_idx": Out(n_end_slots(p) * ib),
        "tr_ret_v": Out(n_ret_slots(p)), "tr_ret_idx": Out(n_ret_slots(p) * ib),
    })


class DpuCore(wiring.Component):
    """The whole core, generated from HwParams (every constructor argument comes from the Target)."""

    def __init__(self, p: HwParams):
        self.p = p
        super().__init__(core_signature(p))

    def elaborate(self, platform):
        p = self.p
        m = Module()
        m.submodules.control = ctl = Control(p)
        m.submodules.banks = banks = BankArray(p)
        # every engine but CONV is frozen in the cycles its bank request is refused (docs/bank-ports.md)
        load, conv, misc = LoadEngine(p), ConvEngine(p), MiscEngine(p)
        m.submodules.load = freeze(load, banks.load_go)
        m.submodules.conv = freeze(conv, banks.conv_go)
        m.submodules.misc = freeze(misc, banks.misc_go)
        saves = []
        for u in range(p.ddr_ports):
            s = SaveUnit(p)
            m.submodules[f"save{u}"] = freeze(s, banks.save_go[u])
            saves.append(s)

        wiring.connect(m, ctl.load, load.ctl)
        wiring.connect(m, ctl.conv, conv.ctl)
        wiring.connect(m, ctl.misc, misc.ctl)
        for u, s in enumerate(saves):
            wiring.connect(m, ctl.save[u], s.ctl)
            connect_save(m, s, banks, u)
            connect_save_ddr(m, s, self.ddr_wr[u], banks.save_go[u])
        connect_load(m, load, banks)
        connect_load_ddr(m, load, self.ddr_rd, banks.load_go)
        connect_conv(m, conv, banks)
        connect_misc(m, misc, banks)
        wiring.connect(m, ctl.ifetch, wiring.flipped(self.ifetch))

        # ---- host registers (spec §2.7) ----
        regs = {}

        def reg(addr, width=32, name=None):
            s = Signal(width, name=name or f"reg_{addr:03x}")
            regs[addr] = s
            return s

        gie, ier, isr = reg(GIE), reg(IER), reg(ISR)
        for a in (PROF_ENA, HP_BUS, INSTR_ADDR_HI, PROF_ADDR_LO, PROF_ADDR_HI):
            reg(a)                                    # stored and read back; no function in this model
        ia_lo = reg(INSTR_ADDR_LO)
        addr_lo = [reg(ADDR_BASE + 8 * k, name=f"addr{k}_lo") for k in range(8)]
        for k in range(8):
            reg(ADDR_BASE + 8 * k + 4, name=f"addr{k}_hi")   # the harness DDR is 32-bit
        writable = dict(regs)
        done_sticky = Signal()
        exec_cycle = Signal(p.cycle_bits)
        go = Signal()
        with m.If(self.bus_we):
            with m.Switch(self.bus_addr):
                for a, s in writable.items():
                    with m.Case(a):
                        m.d.sync += s.eq(self.bus_wdata)
                with m.Case(AP_CTRL):
                    m.d.comb += go.eq(self.bus_wdata[0] & ~ctl.running)
                with m.Case(IRQ_CLR):
                    with m.If(self.bus_wdata != 0):
                        m.d.sync += [done_sticky.eq(0), isr.eq(0)]
                with m.Case(ISR):
                    m.d.sync += isr.eq(isr & ~self.bus_wdata)
        m.d.comb += [ctl.go.eq(go), ctl.instr_base.eq(ia_lo >> 2)]
        with m.If(go):
            m.d.sync += done_sticky.eq(0)
        with m.If(ctl.done):
            m.d.sync += [done_sticky.eq(1), exec_cycle.eq(ctl.cyc), isr.eq(isr | ier[0])]
        m.d.comb += [self.irq.eq(gie[0] & isr[0]), self.ap_done.eq(done_sticky), self.cyc.eq(ctl.cyc)]
        # bank-stall counters (cleared by ap_start); CONV is refused only by a busy write queue
        stall_cnt = {n: Signal(32, name=f"cnt_{n.lower()}") for n in BANK_STALLS}
        stall_now = {"LSTALL": ~banks.load_go, "CSTALL": ~banks.conv_go, "MSTALL": ~banks.misc_go,
                     "SSTALL": sum(~banks.save_go[u] for u in range(p.ddr_ports))}
        for n, c in stall_cnt.items():
            with m.If(go):
                m.d.sync += c.eq(0)
            with m.Else():
                m.d.sync += c.eq(c + stall_now[n])
        for k in range(8):
            m.d.comb += [load.ddr_base[k].eq(addr_lo[k])] + [s.ddr_base[k].eq(addr_lo[k]) for s in saves]

        fp = p.target.fingerprint or 0
        rd = {AP_CTRL: ctl.running | (done_sticky << 1) | ((~ctl.running) << 2) | ((~ctl.running) << 3),
              FREQ: int(round(p.t.clock_mhz)),
              EXEC_CYCLE_LO: exec_cycle[:32], EXEC_CYCLE_HI: exec_cycle[32:],
              DPU_STS: ctl.err, AXI_STS: 0,
              FINGERPRINT_LO: fp & 0xFFFFFFFF, FINGERPRINT_HI: fp >> 32}
        for name, a in BANK_STALLS.items():
            rd[a] = stall_cnt[name]
        for name, a in COUNTERS.items():
            e = ENGINE_OF_COUNTER[name[0]]
            rd[a] = ctl.cnt_start[e] if name.endswith("START") else ctl.cnt_end[e]
        rd.update(writable)
        with m.Switch(self.bus_addr):
            for a, v in rd.items():
                with m.Case(a):
                    m.d.comb += self.bus_rdata.eq(v)

        # ---- trace ----
        m.d.comb += [self.tr_start_v.eq(ctl.tr_start_v), self.tr_start_idx.eq(ctl.tr_start_idx.as_value()),
                     self.tr_end_v.eq(ctl.tr_end_v), self.tr_end_idx.eq(ctl.tr_end_idx.as_value()),
                     self.tr_ret_v.eq(ctl.tr_ret_v), self.tr_ret_idx.eq(ctl.tr_ret_idx.as_value())]
        return m
