"""Every constant the RTL uses, read from one `isa.target.Target` (no constant is re-derived elsewhere)."""
from __future__ import annotations

from dataclasses import dataclass

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import Target, get_target

# Pipeline depths of the RTL engines (cycles). A Target whose timing is smaller than `min_latency(target)`
# (these depths, plus the write-queue drain for CONV and ALU) cannot be realised cycle-exactly by this RTL;
# `HwParams` refuses it with a clear message.
MIN_LATENCY = {"conv_latency": 4, "alu_latency": 6, "elew_latency": 6, "ddr_latency": 3, "load_setup": 1,
               "fetch_latency": 1}


def conv_write_lines(target: Target) -> int:
    """Most output rows of one CONV that share one bank (spec §2.4): min(PP, stride_out_h limit)."""
    return max(1, min(target.pp, target.conv_stride_out_h_max))


def alu_write_lines(target: Target) -> int:
    """Most output rows of one ALU that share one bank: min(ALU_PP, stride_out_h limit)."""
    return max(1, min(target.alu_pp, target.alu_stride_out_h_max))


def min_latency(target: Target) -> dict[str, int]:
    """The smallest timing values the RTL realises on `target`: MIN_LATENCY, with conv_latency and
    alu_latency raised by the lines a write can leave in a bank's write queue (docs/bank-ports.md §2:
    every queued line is written before the instruction ends)."""
    out = dict(MIN_LATENCY)
    out["conv_latency"] += conv_write_lines(target) - 1
    out["alu_latency"] += alu_write_lines(target) - 1
    return out


class HwError(OpenDpuError, ValueError):
    """A target or timing that this RTL cannot realise, or a bad RTL option."""


def _clog2(n: int) -> int:
    return max(1, (n - 1).bit_length())


@dataclass(frozen=True)
class HwParams:
    """Hardware constants of one core (spec §2) plus the timing parameters (docs/microarchitecture.md)."""

    target: Target

    # ---- structure (spec §2.1-2.2) ----
    @property
    def pp(self) -> int: return self.target.pp
    @property
    def cp(self) -> int: return self.target.cp
    @property
    def icp(self) -> int: return self.target.icp
    @property
    def ocp(self) -> int: return self.target.ocp
    @property
    def width(self) -> int:
        """Bank line width W in bytes (every bank group has the same width on ISA1)."""
        return self.target.bank_width
    @property
    def alu_pp(self) -> int: return self.target.alu_pp
    @property
    def depth(self) -> int: return self.target.bank_depth
    @property
    def addr_bits(self) -> int:
        """Bank line-address width: log2(DEPTH) (every address field is reduced modulo DEPTH)."""
        return _clog2(self.depth)
    @property
    def img_bg(self) -> int: return self.target.img_bg
    @property
    def num_img_banks(self) -> int: return self.target.num_img_banks
    @property
    def convw_base(self) -> int: return self.target.convw_base
    @property
    def dwconvw_bank(self) -> int: return self.target.dwconvw_bank
    @property
    def bias_bank(self) -> int: return self.target.bias_bank
    @property
    def num_banks(self) -> int: return self.target.num_banks

    # ---- interfaces ----
    bank_id_bits = 6            # instruction bank_id fields
    ddr_addr_bits = 32          # physical byte address of the data ports (harness DDR)
    instr_addr_bits = 32        # physical word address of the instruction port
    instr_bits = 192            # widest instruction, 6 words; word w at bits [32w, 32w+32)
    idx_bits = 20               # instruction index in the stream
    acc_bits = 48               # CONV / ALU accumulators (spec §6.4 recommends >= 40)
    cycle_bits = 48             # cycle counter (EXEC_CYCLE)
    num_ddr_regs = 8            # ADDR_0..ADDR_7
    save_rob_entries = 8        # SAVE-engine instructions in flight (SAVE units + END); overflow sets DPU_STS bit 1

    @property
    def ddr_wr_bytes(self) -> int:
        """Width in bytes of a SAVE write beat: a bank line, or a DDR beat for const SAVEs if wider."""
        return max(self.width, self.t.ddr_bytes_per_cycle)

    @property
    def weight_lines(self) -> int:
        """Lines per cycle a DDR LOAD writes into a CONVW bank (Timing.weight_load_lines; 2 splits each CONVW bank
        into two memories by line parity)."""
        return self.t.weight_load_lines

    @property
    def ddr_rd_bytes(self) -> int:
        """Width in bytes of LOAD's DDR read: one bank line, or two with the wide weight path."""
        return self.width * self.weight_lines

    @property
    def t(self):
        """The timing parameters (isa.target.Timing)."""
        return self.target.timing

    @property
    def ddr_ports(self) -> int: return self.t.ddr_ports

    @classmethod
    def of(cls, target) -> "HwParams":
        """HwParams of a Target, preset name or fingerprint; refuses timings the RTL cannot realise."""
        t = get_target(target) if not isinstance(target, Target) else target
        for k, v in min_latency(t).items():
            if getattr(t.timing, k) < v:
                q = v - MIN_LATENCY[k]
                what = f"{MIN_LATENCY[k]} + {q} write-queue line(s) = {v}" if q else f"{v}"
                raise HwError(f"timing {k} = {getattr(t.timing, k)} is below the RTL pipeline depth {what}; "
                              f"the RTL cannot match the cycle model (use {k} >= {v})")
        if t.bank_depth & (t.bank_depth - 1):
            raise HwError(f"bank_depth {t.bank_depth} must be a power of two for the RTL")
        if t.timing.weight_load_lines == 2 and t.bank_depth < 2:
            raise HwError(f"timing weight_load_lines 2 splits each CONVW bank into even and odd lines: bank_depth "
                          f"{t.bank_depth} must be >= 2")
        if t.timing.fetch_fifo_words > 256:
            raise HwError(f"fetch_fifo_words {t.timing.fetch_fifo_words} > 256 is not supported by the RTL")
        if t.timing.queue_depth > 64:
            raise HwError(f"queue_depth {t.timing.queue_depth} > 64 is not supported by the RTL")
        return cls(t)
