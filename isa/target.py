"""DPU targets: the single source of every hardware constant (spec §2-§3).

A `Target` is built from a registered preset name (B512…B4096), from a 64-bit fingerprint (decoded per
spec §3.2), from an arch.json file in either Vitis AI form, or from parameters (`Target.parametric`).
Every other module reads bank ids, widths, depths and parallelism from here and never re-derives them.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field, replace

import numpy as np

from .errors import OpenDpuError
from .jsonin import check_depth

DPU_TYPE_DPUCZDX8G = 1
ISA_VERSION = 1
TYPE_NAMES = {1: "DPUCZDX8G", 2: "DPUCAHX8H", 3: "DPUCAHX8L", 4: "DPUCZDI4G", 5: "DPUCVDX8H",
              6: "DPUCVDX8G", 7: "DPUCADF8H", 8: "IPU_PHX", 9: "DPUCV2DX8G"}

# ARCH index (feature_code bits 3..0) -> (PP, CP), spec §3.2.
ARCH_TABLE = ((4, 8), (4, 10), (8, 8), (4, 12), (8, 10), (8, 12), (8, 14), (8, 16),
              (4, 4), (2, 6), (2, 8), (2, 4))

# ALU exec modes of ISA1 (spec §3.4 / §6.8); numbering equals ALUINIT exec_mode.
ALU_TYPES = ("dwconv", "prelu", "avg_pool", "max_pool", "leaky_relu", "max_reduce",
             "dwconv_no_bias", "hsigmoid", "w16b0")

# Registered ISA1 presets (spec §3.3): name -> current fingerprint.
PRESET_FINGERPRINTS = {
    "DPUCZDX8G_ISA1_B512": 0x0101000056010200,
    "DPUCZDX8G_ISA1_B800": 0x0101000056010201,
    "DPUCZDX8G_ISA1_B1024": 0x0101000056010402,
    "DPUCZDX8G_ISA1_B1152": 0x0101000056010203,
    "DPUCZDX8G_ISA1_B1600": 0x0101000056010404,
    "DPUCZDX8G_ISA1_B2304": 0x0101000056010405,
    "DPUCZDX8G_ISA1_B3136": 0x0101000056010406,
    "DPUCZDX8G_ISA1_B4096": 0x0101000056010407,
}


# Accepted range of every timing parameter (inclusive), the one source of these limits (arch.json "timing",
# --timing, --clock-mhz, sweeps and boards all construct a Timing). clock_mhz: 1 MHz (a slowed-down debug clock) to
# 2 GHz, beyond any programmable-logic clock (the DPUCZDX8G runs at 100-400 MHz, its DSPs at twice that); outside
# it the latencies and fps printed would be physically meaningless. Cycle counts stay <= 2**40 so that
# per-instruction costs and schedules fit the cycle model's int64 arithmetic with room to spare.
MAX_CYCLES = 1 << 40
TIMING_BOUNDS = {
    "clock_mhz": (1.0, 2000.0),
    "dsp_clock_mult": (1, 16),
    "cores": (1, 64),
    "fetch_latency": (0, MAX_CYCLES),
    "fetch_fifo_words": (6, 1 << 20),
    "queue_depth": (1, 1 << 20),
    "ddr_latency": (0, MAX_CYCLES),
    "ddr_bytes_per_cycle": (1, 1 << 20),
    "ddr_ports": (1, 64),
    "weight_load_lines": (1, 2),
    "load_setup": (0, MAX_CYCLES),
    "save_setup": (0, MAX_CYCLES),
    "conv_latency": (0, MAX_CYCLES),
    "alu_latency": (0, MAX_CYCLES),
    "elew_latency": (0, MAX_CYCLES),
    "init_cycles": (1, MAX_CYCLES),
    "end_cycles": (1, MAX_CYCLES),
    "watchdog_cycles": (1, MAX_CYCLES),
    "board_ddr_mbps": (0, 1 << 24),
    "ddr_efficiency_pct": (1, 100),
    "frame_overhead_us": (0, 1 << 30),
    "host_frame_us": (0, 1 << 30),
    "host_us_per_mb": (0, 1 << 30),
    "cpu_threads": (1, 1024),
    "cpu_mhz": (1, 100_000),
    "host_load_pct": (100, 10_000),
}


def load_augmented(channel: int, jump_read: int) -> bool:
    """A LOAD in channel-augmentation mode (spec §6.2): jump_read <= channel <= 64; its pad fields mask bytes."""
    return jump_read <= channel <= 64


ARCH_JSON_KEYS = ("target", "fingerprint", "timing")
ARCH_JSON_MAX_BYTES = 1 << 20


def _json_type(v) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(v), type(v).__name__)


def _short(v, n: int = 40) -> str:
    """repr of a (possibly hostile) value, cut to n characters for a one-line message."""
    r = repr(v)
    return r if len(r) <= n else r[: n - 1] + "…"


def _fmt_bound(v) -> str:
    return f"2**{v.bit_length() - 1}" if isinstance(v, int) and v >= 1 << 16 and v & (v - 1) == 0 else str(v)


@dataclass(frozen=True)
class Timing:
    """Timing parameters of one DPU core (docs/microarchitecture.md); read only by the cycle model and RTL.

    Defaults are first-order, uncalibrated values for a ZynqMP DPUCZDX8G at 300 MHz (spec §6.9 [inferred]).
    """

    clock_mhz: float = 300.0        # core clock (m_axi_dpu_aclk)
    dsp_clock_mult: int = 2         # DSP clock = 2x core clock: each DSP does 2 MACs per core cycle (information)
    cores: int = 1                  # DPU cores; each runs its own batch element
    fetch_latency: int = 16         # INSTR port: cycles from a word request to its arrival
    fetch_fifo_words: int = 32      # instruction FIFO (32-bit words) between fetch and dispatch
    queue_depth: int = 4            # per-engine instruction queue (LOAD, SAVE, CONV, MISC)
    ddr_latency: int = 60           # data ports: read latency to the first beat, and write-response latency
    ddr_bytes_per_cycle: int = 16   # per AXI data port and direction (128-bit HP port at the core clock)
    ddr_ports: int = 2              # AXI data ports (hp_id 0/1)
    # Bank lines a DDR LOAD writes per cycle into a CONVW bank (1, or 2: each CONVW bank is two memories split by
    # line parity, and LOAD reads 2 lines per cycle over both data ports); docs/microarchitecture.md §3.
    weight_load_lines: int = 1
    load_setup: int = 4             # LOAD descriptor decode and address generation
    save_setup: int = 4
    conv_latency: int = 16          # CONV pipeline fill + drain (bank read, DSP cascade, bias/shift/act, write)
    alu_latency: int = 12
    elew_latency: int = 8
    init_cycles: int = 1            # CONVINIT / ALUINIT / ELEWINIT
    end_cycles: int = 1
    watchdog_cycles: int = 1 << 40  # a run longer than this is stopped and reported
    # The board's DDR, shared by the `cores` cores: peak MB/s (0 = no board limit) and the share of it a DPU
    # stream achieves. Only the multi-core contention model reads them (sim/multicore.py, docs/calibration.md);
    # one core is bounded by its own ports above, in the cycle model and the RTL alike.
    board_ddr_mbps: int = 0
    ddr_efficiency_pct: int = 100
    frame_overhead_us: int = 0      # per DPU run, the core idle: job submission, cache maintenance, interrupt
    # The board's host side (sim/multicore.py): work per frame on one CPU thread, a fixed part and a part per 10^6
    # bytes of the graph's input and output tensors (at sim.multicore.HOST_REF_MHZ), and the threads and clock of
    # the CPU that runs it in parallel with the DPU cores.
    host_frame_us: int = 0
    host_us_per_mb: int = 0
    cpu_threads: int = 1
    cpu_mhz: int = 1200
    # CPU time of a frame when every thread is busy (multi-thread), in % of the single-thread host work plus the
    # runs' overheads (the CPU side of job submission and cache maintenance): the A53s share their L2 and the DDR
    host_load_pct: int = 100

    def __post_init__(self):
        for k, v in list(self.__dict__.items()):
            lo, hi = TIMING_BOUNDS[k]
            if isinstance(v, (np.integer, np.floating)) and not isinstance(v, np.bool_):
                v = v.item()                        # numpy scalars are taken as the Python number they hold
                object.__setattr__(self, k, v)
            shown = _short(v)
            if k == "clock_mhz":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                        or not lo <= v <= hi:
                    raise TargetError(f"timing clock_mhz must be >= {lo:g} and <= {hi:g} (MHz, a finite number), "
                                      f"got {shown}")
            elif not isinstance(v, int) or isinstance(v, bool):
                raise TargetError(f"timing {k} must be an integer, got {shown}")
            elif not lo <= v <= hi:
                why = " (the longest instruction is 6 words)" if k == "fetch_fifo_words" else ""
                raise TargetError(f"timing {k} must be >= {lo} and <= {_fmt_bound(hi)}{why}; {shown} is out of "
                                  f"range")

    def replace(self, **kw) -> "Timing":
        bad = [k for k in kw if k not in self.__dataclass_fields__]
        if bad:
            raise TargetError(f"unknown timing parameter(s) {', '.join(map(repr, bad))}; known: "
                              f"{', '.join(self.__dataclass_fields__)}")
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class TargetError(OpenDpuError, ValueError):
    """An unknown target name, an undecodable fingerprint or an unusable arch.json."""


def _bits(v: int, lsb: int, width: int) -> int:
    return (v >> lsb) & ((1 << width) - 1)


@dataclass(frozen=True)
class Target:
    """One DPUCZDX8G ISA1 core configuration. Bank numbering follows spec §2.2."""

    pp: int                      # conv pixel parallelism = bank_num of an image bank group
    cp: int                      # channel parallelism (ICP = OCP) = bank width in bytes
    alu_pp: int                  # ALU / eltwise pixel parallelism
    bank_depth: int = 2048       # lines per bank
    img_bg: int = 2              # image bank groups
    ld_augm: bool = True         # LOAD channel augmentation
    ld_mean: bool = False
    cv_lkrl: bool = True         # CONV supports leaky ReLU
    dw_lkrl: bool = False        # ALU dwconv supports leaky ReLU
    argmax: bool = True          # SAVE argmax (feature bit 30)
    cv_wp: int = 1
    alu_wp: int = 1
    name: str = ""
    fingerprint: int | None = None
    # Timing parameters (read by the cycle model and the RTL; no functional effect).
    timing: Timing = field(default_factory=lambda: Timing(), compare=False, hash=False)

    def with_timing(self, **kw) -> "Target":
        """The same configuration with some timing parameters changed (clock, DDR, queues, ...)."""
        return replace(self, timing=self.timing.replace(**kw))

    # ---- derived constants -------------------------------------------------------------------
    @property
    def icp(self) -> int:
        return self.cp

    @property
    def ocp(self) -> int:
        return self.cp

    @property
    def bank_width(self) -> int:
        """Line width in bytes of every ISA1 bank (= CP)."""
        return self.cp

    @property
    def peak_ops_per_cycle(self) -> int:
        return 2 * self.pp * self.cp * self.cp

    @property
    def size_name(self) -> str:
        return f"B{self.peak_ops_per_cycle}"

    def img_base(self, g: int) -> int:
        return g * self.pp

    @property
    def convw_base(self) -> int:
        return self.img_bg * self.pp

    @property
    def dwconvw_bank(self) -> int:
        return self.convw_base + self.ocp

    @property
    def bias_bank(self) -> int:
        return self.dwconvw_bank + 1

    @property
    def num_banks(self) -> int:
        return self.bias_bank + 1

    @property
    def num_img_banks(self) -> int:
        return self.img_bg * self.pp

    def is_img_bank(self, bank_id: int) -> bool:
        return 0 <= bank_id < self.num_img_banks

    def load_lines_per_cycle(self, bank_id: int, channel: int, jump_read: int, broadcast: int) -> int:
        """Bank lines one LOAD writes per loop cycle (docs/microarchitecture.md §3): timing.weight_load_lines into a
        CONVW bank from DDR without channel augmentation (spec §6.2), else 1."""
        if (self.convw_base <= bank_id < self.dwconvw_bank and broadcast != 7
                and not load_augmented(channel, jump_read)):
            return self.timing.weight_load_lines
        return 1

    def bank_group_of(self, bank_id: int) -> str:
        if 0 <= bank_id < self.num_img_banks:
            return f"VB{bank_id // self.pp}"
        if self.convw_base <= bank_id < self.dwconvw_bank:
            return "CONVW"
        if bank_id == self.dwconvw_bank:
            return "DWCONVW"
        if bank_id == self.bias_bank:
            return "BIAS"
        raise TargetError(f"bank id {bank_id} is outside target {self.name} (0..{self.num_banks - 1})")

    def bank_groups(self) -> list[dict]:
        """Bank groups as in the target prototxt (name, type, base_id, bank_num, width, depth)."""
        out = [dict(name=f"VB{g}", type="Virtual", base_id=g * self.pp, bank_num=self.pp,
                    bank_width=self.cp, bank_depth=self.bank_depth) for g in range(self.img_bg)]
        out.append(dict(name="CONVW", type="Param", base_id=self.convw_base, bank_num=self.ocp,
                        bank_width=self.icp, bank_depth=self.bank_depth))
        out.append(dict(name="DWCONVW", type="Param", base_id=self.dwconvw_bank, bank_num=1,
                        bank_width=self.cp, bank_depth=self.bank_depth))
        out.append(dict(name="BIAS", type="Param", base_id=self.bias_bank, bank_num=1,
                        bank_width=self.cp, bank_depth=self.bank_depth))
        return out

    # ---- engine limits (spec §3.4) ----------------------------------------------------------
    @property
    def conv_nonlinear(self) -> tuple[int, ...]:
        """act_type codes the CONV engine accepts (0 none, 1 relu, 3 leaky, 4 relu6)."""
        return (0, 1, 3, 4) if self.cv_lkrl else (0, 1, 4)

    @property
    def alu_nonlinear(self) -> tuple[int, ...]:
        return (0, 1, 3, 4) if self.dw_lkrl else (0, 1, 4)

    @property
    def alu_exec_modes(self) -> tuple[int, ...]:
        return tuple(range(len(ALU_TYPES)))

    @staticmethod
    def _stride_out_limit(pp: int, wp: int) -> int:
        return 4 if (wp == 1 or pp // wp >= 4) else pp // wp

    @property
    def conv_stride_out_h_max(self) -> int:
        return self._stride_out_limit(self.pp, self.cv_wp)

    @property
    def alu_stride_out_h_max(self) -> int:
        return self._stride_out_limit(self.pp, self.alu_wp)

    conv_kernel_max = 16
    conv_stride_max = 8
    alu_kernel_max = 256
    alu_stride_max = 256

    # ---- fingerprint / feature code -------------------------------------------------------
    @property
    def arch_index(self) -> int | None:
        try:
            return ARCH_TABLE.index((self.pp, self.cp))
        except ValueError:
            return None

    def encodable(self) -> bool:
        """True if a fingerprint can describe this configuration (spec §3.2)."""
        return (self.arch_index is not None and self.bank_depth == 2048 and 1 <= self.alu_pp <= 15
                and 1 <= self.img_bg <= 3 and self.cv_wp in (1, 2, 4, 8) and self.alu_wp in (1, 2, 4, 8))

    def feature_code(self) -> int:
        ai = self.arch_index
        if ai is None or not self.encodable():
            raise TargetError(f"target {self.name or self.describe()} cannot be described by a fingerprint "
                              f"(needs (PP,CP) in the ARCH table, bank_depth 2048, ALU_PP 1..15, IMG_BG 1..3)")
        fc = ai | (self.alu_pp << 8) | (0x01 << 16) | (self.img_bg << 24)
        fc |= (self.ld_augm << 26) | (self.ld_mean << 27) | (self.cv_lkrl << 28) | (self.dw_lkrl << 29)
        fc |= (self.argmax << 30)
        fc |= (self.cv_wp.bit_length() - 1) << 32
        fc |= (self.alu_wp.bit_length() - 1) << 34
        return fc

    def describe(self) -> str:
        return f"PP{self.pp}_CP{self.cp}_ALUPP{self.alu_pp}_D{self.bank_depth}"

    def to_dict(self) -> dict:
        return dict(name=self.name, fingerprint=(f"0x{self.fingerprint:016X}" if self.fingerprint is not None
                                                 else None),
                    size=self.size_name, pixel_parallel=self.pp, channel_parallel=self.cp,
                    alu_pixel_parallel=self.alu_pp, bank_depth=self.bank_depth, img_bank_groups=self.img_bg,
                    num_banks=self.num_banks, peak_ops_per_cycle=self.peak_ops_per_cycle,
                    ld_augm=self.ld_augm, cv_lkrl=self.cv_lkrl, dw_lkrl=self.dw_lkrl, argmax=self.argmax,
                    bank_groups=self.bank_groups(), timing=self.timing.to_dict())

    # ---- constructors ---------------------------------------------------------------------
    @classmethod
    def from_fingerprint(cls, fp: int | str) -> "Target":
        """Registered fingerprint -> preset; other type-1/ISA-1 fingerprints decoded per spec §3.2."""
        if isinstance(fp, str):
            try:
                fp = int(fp.strip(), 0)
            except ValueError:
                raise TargetError(f"fingerprint {_short(fp)} is not a number (expected e.g. '0x101000056010407')") \
                    from None
        if isinstance(fp, bool) or not isinstance(fp, int):
            raise TargetError(f"fingerprint {_short(fp)}: expected an integer or a hex string")
        if not 0 <= fp < 1 << 64:
            raise TargetError(f"fingerprint {fp:#x} does not fit in 64 bits")
        for name, pfp in PRESET_FINGERPRINTS.items():
            if pfp == fp:
                return _preset(name)
        typ, isa, fc = fp >> 56, _bits(fp, 48, 8), fp & ((1 << 48) - 1)
        if typ != DPU_TYPE_DPUCZDX8G:
            raise TargetError(f"fingerprint 0x{fp:016X}: DPU type {typ} ({TYPE_NAMES.get(typ, 'unknown')}) "
                              f"is not DPUCZDX8G (type 1)")
        if isa != ISA_VERSION:
            raise TargetError(f"fingerprint 0x{fp:016X}: ISA version {isa} is not supported (only ISA1)")
        t = cls(**_decode_feature_code(fp, fc), fingerprint=fp)
        return replace(t, name=f"DPUCZDX8G_ISA1_{t.size_name}_{fp:016X}")

    @classmethod
    def parametric(cls, pp: int, cp: int, alu_pp: int | None = None, bank_depth: int = 2048, img_bg: int = 2,
                   **features) -> "Target":
        """A configuration from its parameters; fingerprint and name generated where encodable."""
        if not 1 <= pp <= 8:
            raise TargetError(f"pixel_parallel {pp} out of range 1..8 (valid_pixel_parallel is 3 bits)")
        if not 1 <= cp <= 32:
            raise TargetError(f"channel_parallel {cp} out of range 1..32")
        if alu_pp is None:
            alu_pp = max(1, pp // 2)
        if not 1 <= alu_pp <= pp:
            raise TargetError(f"alu_pixel_parallel {alu_pp} out of range 1..{pp}")
        if not 1 <= img_bg <= 3:
            raise TargetError(f"img_bank_groups {img_bg} out of range 1..3")
        if bank_depth < 1 or bank_depth & (bank_depth - 1) or bank_depth > 16384:
            raise TargetError(f"bank_depth {bank_depth} must be a power of two in 1..16384")
        t = cls(pp=pp, cp=cp, alu_pp=alu_pp, bank_depth=bank_depth, img_bg=img_bg, **features)
        if t.num_banks > 64:
            raise TargetError(f"{t.num_banks} banks exceed the 64 that 6-bit bank ids can address")
        if t.encodable():
            fp = (DPU_TYPE_DPUCZDX8G << 56) | (ISA_VERSION << 48) | t.feature_code()
            for name, pfp in PRESET_FINGERPRINTS.items():
                if pfp == fp:
                    return replace(t, name=name, fingerprint=fp)
            return replace(t, name=f"DPUCZDX8G_ISA1_{t.size_name}_{fp:016X}", fingerprint=fp)
        return replace(t, name=f"DPUCZDX8G_ISA1_{t.size_name}_{t.describe()}", fingerprint=None)

    @classmethod
    def from_name(cls, name: str) -> "Target":
        """Preset name (also the short form 'B4096') or generated name with a fingerprint suffix."""
        n = name.strip()
        if n.upper().startswith("B") and n[1:].isdigit():
            n = f"DPUCZDX8G_ISA1_{n.upper()}"
        if n in PRESET_FINGERPRINTS:
            return _preset(n)
        tail = n.rsplit("_", 1)[-1]
        if n.startswith("DPUCZDX8G_ISA1_") and len(tail) == 16:
            try:
                return cls.from_fingerprint(int(tail, 16))
            except ValueError:
                pass
        m = _PARAM_NAME.fullmatch(n.upper())
        if m:                     # a parametric configuration by its parameters (Target.describe form)
            a, d = m.group(3), m.group(4)
            return cls.parametric(int(m.group(1)), int(m.group(2)), int(a) if a else None,
                                  bank_depth=int(d) if d else 2048)
        raise TargetError(f"unknown target {name!r}; presets: {', '.join(PRESET_FINGERPRINTS)}, or a parametric "
                          f"configuration PP<n>_CP<n>[_ALUPP<n>][_D<depth>] (e.g. PP2_CP4_ALUPP1_D512)")

    @classmethod
    def from_arch_json(cls, path: str) -> "Target":
        """arch.json in either Vitis AI form: {"target": NAME} or {"fingerprint": "0x…"}, plus opendpu's optional
        "timing" object. Anything else (unreadable, not a JSON object, wrong types, unknown keys) is a
        TargetError naming the file and the key."""
        where = f"arch.json {path}"
        if os.path.isdir(path):
            raise TargetError(f"{where} is a directory, not a file")
        try:
            with open(path, "rb") as f:
                raw = f.read(ARCH_JSON_MAX_BYTES + 1)
        except OSError as e:
            what = "no such file" if isinstance(e, FileNotFoundError) else (e.strerror or str(e))
            raise TargetError(f"cannot read {where}: {what}") from None
        if len(raw) > ARCH_JSON_MAX_BYTES:
            raise TargetError(f"{where}: larger than {ARCH_JSON_MAX_BYTES} bytes; not an arch.json")
        try:
            text = raw.decode("utf-8")
            check_depth(text, where, TargetError)
            d = json.loads(text)
        except UnicodeDecodeError:
            raise TargetError(f"{where}: not a JSON file (not UTF-8 text)") from None
        except json.JSONDecodeError as e:
            raise TargetError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        except RecursionError:
            raise TargetError(f"{where}: JSON nested too deeply") from None
        if not isinstance(d, dict):
            raise TargetError(f"{where}: expected a JSON object like {{\"target\": \"DPUCZDX8G_ISA1_B4096\"}}, "
                              f"got a JSON {_json_type(d)}")
        unknown = [k for k in d if k not in ARCH_JSON_KEYS]
        if unknown:
            raise TargetError(f"{where}: unknown key {_short(unknown[0])}; known keys: {', '.join(ARCH_JSON_KEYS)}")
        t = None
        if "target" in d:
            name = d["target"]
            if not isinstance(name, str):
                raise TargetError(f"{where}: 'target' must be a string (a preset name), got a JSON {_json_type(name)}")
            try:
                t = cls.from_name(name)
            except TargetError as e:
                raise TargetError(f"{where}: 'target': {e}") from None
        if "fingerprint" in d:
            fp = d["fingerprint"]
            if isinstance(fp, bool) or not isinstance(fp, (str, int)):
                raise TargetError(f"{where}: 'fingerprint' must be a hex string like \"0x101000056010407\" or an "
                                  f"integer, got a JSON {_json_type(fp)} {_short(fp)}")
            try:
                tf = cls.from_fingerprint(fp)
            except TargetError as e:
                raise TargetError(f"{where}: 'fingerprint': {e}") from None
            if t is not None and t.fingerprint != tf.fingerprint:
                raise TargetError(f"{where}: 'target' {t.name} and 'fingerprint' {_short(fp)} disagree; give one")
            t = tf
        if t is None:
            raise TargetError(f"{where}: needs a 'target' or a 'fingerprint' key")
        tm = d.get("timing")
        if tm is not None:       # opendpu extension: timing parameters for the cycle model
            if not isinstance(tm, dict):
                raise TargetError(f"{where}: 'timing' must be an object, got a JSON {_json_type(tm)}")
            try:
                t = t.with_timing(**tm)
            except TargetError as e:
                raise TargetError(f"{where}: {e}") from None
        return t

    def write_arch_json(self, path: str, form: str = "fingerprint") -> None:
        """Write arch.json; form 'target' (registered name) or 'fingerprint' (hex)."""
        if form == "target":
            if self.name not in PRESET_FINGERPRINTS:
                raise TargetError(f"{self.name} is not a registered target; use the fingerprint form")
            d = {"target": self.name}
        elif form == "fingerprint":
            if self.fingerprint is None:
                raise TargetError(f"{self.name} has no fingerprint")
            d = {"fingerprint": f"0x{self.fingerprint:X}"}
        else:
            raise TargetError(f"arch.json form {form!r}: use 'target' or 'fingerprint'")
        with open(path, "w") as f:
            json.dump(d, f)
            f.write("\n")


def _decode_feature_code(fp: int, fc: int) -> dict:
    """Constructor arguments from an ISA1 feature code (spec §3.2)."""
    arch = _bits(fc, 0, 4)
    if arch >= len(ARCH_TABLE):
        raise TargetError(f"fingerprint 0x{fp:016X}: ARCH index {arch} is invalid (0..{len(ARCH_TABLE) - 1})")
    pp, cp = ARCH_TABLE[arch]
    alu_pp, img_bg = _bits(fc, 8, 4), _bits(fc, 24, 2)
    if alu_pp == 0 or img_bg == 0:
        raise TargetError(f"fingerprint 0x{fp:016X}: ALU_PP {alu_pp} / IMG_BG {img_bg} must be non-zero")
    return dict(pp=pp, cp=cp, alu_pp=alu_pp, img_bg=img_bg, ld_augm=bool(_bits(fc, 26, 1)),
                ld_mean=bool(_bits(fc, 27, 1)), cv_lkrl=bool(_bits(fc, 28, 1)), dw_lkrl=bool(_bits(fc, 29, 1)),
                argmax=bool(_bits(fc, 30, 1)), cv_wp=1 << _bits(fc, 32, 2), alu_wp=1 << _bits(fc, 34, 2))


def _preset(name: str) -> Target:
    fp = PRESET_FINGERPRINTS[name]
    return Target(**_decode_feature_code(fp, fp & ((1 << 48) - 1)), name=name, fingerprint=fp)


PRESETS = tuple(PRESET_FINGERPRINTS)


# "PP2_CP4_ALUPP1_D512", optionally behind the generated name's "DPUCZDX8G_ISA1_B<size>_" prefix
_PARAM_NAME = re.compile(r"(?:DPUCZDX8G_ISA1_B\d+_)?PP(\d+)_CP(\d+)(?:_ALUPP(\d+))?(?:_D(\d+))?")


def get_target(spec: "str | int | Target") -> Target:
    """Resolve a CLI/runtime target spec: Target, preset name, fingerprint, or path to arch.json."""
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, int):
        return Target.from_fingerprint(spec)
    if isinstance(spec, bool) or not isinstance(spec, (str, os.PathLike)):
        raise TargetError(f"target {_short(spec)}: expected a preset name, a fingerprint or an arch.json path")
    s = os.fspath(spec)
    if not s.strip():
        raise TargetError("target: empty name; give a preset name (e.g. DPUCZDX8G_ISA1_B4096), a fingerprint or "
                          "an arch.json path")
    if os.path.isdir(s):
        raise TargetError(f"target {s} is a directory, not an arch.json file or a preset name")
    if s.endswith(".json") or os.path.isfile(s) or os.sep in s:
        return Target.from_arch_json(s)
    if s.lower().startswith("0x"):
        return Target.from_fingerprint(s)
    return Target.from_name(s)
