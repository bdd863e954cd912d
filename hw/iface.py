"""Interfaces between the core's control, its engines, the banks and the memory ports.

All signatures are written from the *requester's* side (the engine or the control); the responder
(the bank array, the DDR model) uses `In(...)` of the same signature. Timing conventions:

* Bank and DDR reads are synchronous: `data` is valid in the cycle after the one with `en` high.
* Writes take effect at the end of the cycle in which `en` is high.
* `EngineCtl`: the control raises `start` for one cycle (cycle s) with the instruction in `instr`
  (word w at bits [32w, 32w+32)). The engine must raise `end` for one cycle exactly in cycle
  s + cost + stalls, where cost is the formula of docs/microarchitecture.md §3 and stalls the number of
  cycles in [s, end) in which the bank arbiter refused the engine's request (docs/bank-ports.md; the
  engine is then frozen by its clock enable, so it sees only its own un-stalled cycles). It must have
  completed every bank / DDR write of the instruction by then (writes issued in the cycle before `end`
  at the latest). The engine accepts the next `start` in any cycle from its `end` on, including the
  cycle of its `end`. Requests (the `en`, `bank`, `addr` of the bank ports) must be functions of the
  engine's registers only (never of a grant). An idle engine and an engine in its `end` cycle have
  an empty request, which is always granted, so a `start` always arrives in a granted cycle.
"""
from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .params import HwParams


def engine_ctl(p: HwParams) -> wiring.Signature:
    """Control -> engine: start pulse with the instruction words; engine -> control: end pulse."""
    return wiring.Signature({"start": Out(1), "instr": Out(p.instr_bits), "end": In(1)})


def bank_read(p: HwParams) -> wiring.Signature:
    """Read one line of bank `bank` (absolute bank id) at line `addr`; `data` the next cycle."""
    return wiring.Signature({"en": Out(1), "bank": Out(p.bank_id_bits), "addr": Out(p.addr_bits),
                             "data": In(8 * p.width)})


def bank_write(p: HwParams) -> wiring.Signature:
    """Write one whole line (byte i at bits [8i, 8i+8)) of bank `bank` at line `addr`."""
    return wiring.Signature({"en": Out(1), "bank": Out(p.bank_id_bits), "addr": Out(p.addr_bits),
                             "data": Out(8 * p.width)})


def load_write(p: HwParams) -> wiring.Signature:
    """LOAD's bank write: one line, plus with the wide weight path (p.weight_lines = 2) a second line `data2` at
    `addr` + 1 of the same (CONVW) bank when `en2` is high."""
    if p.weight_lines == 1:
        return bank_write(p)
    return wiring.Signature({"en": Out(1), "bank": Out(p.bank_id_bits), "addr": Out(p.addr_bits),
                             "data": Out(8 * p.width), "en2": Out(1), "data2": Out(8 * p.width)})


def line_read(p: HwParams) -> wiring.Signature:
    """Read one line of a fixed bank (DWCONVW or BIAS)."""
    return wiring.Signature({"en": Out(1), "addr": Out(p.addr_bits), "data": In(8 * p.width)})


def convw_read(p: HwParams) -> wiring.Signature:
    """Read the same line of all OCP CONVW banks at once; data[o] is the line of CONVW bank o."""
    return wiring.Signature({"en": Out(1), "addr": Out(p.addr_bits),
                             "data": In(data.ArrayLayout(unsigned(8 * p.width), p.ocp))})


def ddr_read(p: HwParams) -> wiring.Signature:
    """Read p.ddr_rd_bytes (W, or 2W with the wide weight path) at any byte address (no alignment); `data` (byte i
    = address addr+i) the next cycle."""
    return wiring.Signature({"en": Out(1), "addr": Out(p.ddr_addr_bits), "data": In(8 * p.ddr_rd_bytes)})


def ddr_write(p: HwParams) -> wiring.Signature:
    """Write the bytes of `data` whose `mask` bit is set, byte i to address addr+i."""
    n = p.ddr_wr_bytes
    return wiring.Signature({"en": Out(1), "addr": Out(p.ddr_addr_bits), "data": Out(8 * n),
                             "mask": Out(n)})


def instr_read(p: HwParams) -> wiring.Signature:
    """Instruction port: read the 32-bit word at word address `addr`; `data` the next cycle."""
    return wiring.Signature({"en": Out(1), "addr": Out(p.instr_addr_bits), "data": In(32)})


def ddr_bases(p: HwParams):
    """The eight DDR base registers ADDR_0..ADDR_7 (spec §2.6), as seen by LOAD and SAVE."""
    return data.ArrayLayout(unsigned(p.ddr_addr_bits), p.num_ddr_regs)
