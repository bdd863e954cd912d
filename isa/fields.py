"""ISA1 (DPUV2) field tables, transcribed from spec §4.2-§4.3.

Each field is (name, word, lsb, width, minus_one). Reserved bits are not listed; they encode as 0.
Word 0 bits 31..20 (opcode, dpdon, dpdby) are the common header and are not in these tables.
"""
from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class Field(NamedTuple):
    name: str
    word: int
    lsb: int
    width: int
    minus_one: bool

    @property
    def lo(self) -> int:
        """Smallest legal logical value."""
        return 1 if self.minus_one else 0

    @property
    def hi(self) -> int:
        """Largest legal logical value."""
        return (1 << self.width) if self.minus_one else (1 << self.width) - 1


class Engine(IntEnum):
    """The four engine categories; the value is the bit number in dpdon/dpdby (spec §4.1, §5.1). The one
    numbering of engines: cycle model, profiler, RTL and generator index by it (Numba kernels take int(e))."""

    LOAD = 0
    SAVE = 1
    CONV = 2
    MISC = 3

    @property
    def bit(self) -> int:
        """The engine's dpdon/dpdby mask bit."""
        return 1 << self.value


class OpInfo(NamedTuple):
    mnemonic: str
    opcode: int
    words: int
    engine: Engine


OPS = (
    OpInfo("LOAD", 0x0, 5, Engine.LOAD),
    OpInfo("ALUINIT", 0x1, 6, Engine.MISC),
    OpInfo("ALU", 0x2, 5, Engine.MISC),
    OpInfo("SAVE", 0x4, 5, Engine.SAVE),
    OpInfo("POOLINIT", 0x6, 2, Engine.MISC),
    OpInfo("END", 0x7, 1, Engine.SAVE),
    OpInfo("CONV", 0x8, 5, Engine.CONV),
    OpInfo("CONVINIT", 0x9, 4, Engine.CONV),
    OpInfo("DPTWISE", 0xA, 5, Engine.MISC),
    OpInfo("DWINIT", 0xB, 3, Engine.MISC),
    OpInfo("POOL", 0xC, 5, Engine.MISC),
    OpInfo("ELEWINIT", 0xD, 3, Engine.MISC),
    OpInfo("ELEW", 0xE, 3, Engine.MISC),
)
BY_OPCODE = {o.opcode: o for o in OPS}
BY_NAME = {o.mnemonic: o for o in OPS}

_ = Field
FIELDS: dict[str, tuple[Field, ...]] = {
    "LOAD": (
        _("bank_addr", 0, 0, 12, False),
        _("bank_id", 0, 14, 6, False),
        _("jump_write", 1, 0, 10, True),
        _("jump_read", 1, 10, 16, True),
        _("length", 2, 0, 10, True),
        _("channel", 2, 10, 14, True),
        _("pad_idx", 2, 27, 5, True),
        _("reg_id", 3, 0, 3, False),
        _("const_value", 3, 8, 8, False),
        _("broadcast", 3, 16, 4, False),
        _("mode_avg", 3, 20, 2, False),
        _("pad_end", 3, 22, 5, False),
        _("pad_start", 3, 27, 5, False),
        _("ddr_addr", 4, 0, 29, False),
    ),
    "SAVE": (
        _("bank_addr", 0, 0, 12, False),
        _("bank_id", 0, 14, 6, False),
        _("jump_read", 1, 0, 10, True),
        _("jump_write", 1, 10, 16, True),
        _("argmax", 1, 27, 2, False),
        _("hp_id", 1, 29, 2, False),
        _("length", 2, 0, 10, True),
        _("channel", 2, 10, 12, True),
        _("reg_id", 3, 0, 3, False),
        _("const_value", 3, 8, 8, False),
        _("const_en", 3, 16, 1, False),
        _("ddr_addr", 4, 0, 29, False),
    ),
    "CONVINIT": (
        _("jump_read", 0, 0, 10, True),
        _("shift_cut", 0, 10, 6, False),
        _("act_type", 0, 16, 4, False),
        _("jump_read_endl", 1, 0, 10, True),
        _("shift_bias", 1, 10, 6, False),
        _("stride_out", 1, 28, 4, True),
        _("jump_write", 2, 0, 10, True),
        _("stride_offset_in", 2, 10, 3, False),
        _("valid_pixel_parallel", 2, 13, 3, True),
        _("kernel_h", 2, 24, 4, True),
        _("stride_h", 2, 28, 4, True),
        _("jump_write_endl", 3, 0, 10, True),
        _("stride_offset_out", 3, 10, 3, False),
        _("kernel_w", 3, 24, 4, True),
        _("stride_w", 3, 28, 4, True),
    ),
    "CONV": (
        _("bank_addr_in", 0, 0, 12, False),
        _("pad_top", 0, 12, 4, False),
        _("pad_left", 0, 16, 4, False),
        _("bank_addr_out", 1, 0, 12, False),
        _("pad_bottom", 1, 12, 4, False),
        _("pad_right", 1, 16, 4, False),
        _("channel_group", 1, 24, 8, True),
        _("bank_addr_weights", 2, 0, 12, False),
        _("bank_id_in", 2, 12, 6, False),
        _("length", 2, 22, 10, True),
        _("bank_addr_bias", 3, 0, 12, False),
        _("bank_id_out", 3, 12, 6, False),
        _("bank_addr_in_1", 3, 18, 12, False),
        _("bank_addr_in_2", 4, 0, 12, False),
        _("bank_addr_in_3", 4, 12, 12, False),
        _("channel_offset", 4, 24, 5, False),
    ),
    "ALUINIT": (
        _("kernel_w", 0, 0, 8, True),
        _("kernel_h", 0, 8, 8, True),
        _("exec_mode", 0, 16, 4, False),
        _("stride_offset_out", 1, 0, 8, False),
        _("stride_offset_in", 1, 8, 8, False),
        _("stride_w", 1, 16, 8, True),
        _("stride_h", 1, 24, 8, True),
        _("length", 2, 0, 11, True),
        _("channel_offset", 2, 11, 5, False),
        _("channel_group", 2, 16, 8, True),
        _("stride_out", 2, 24, 8, True),
        _("shift_prelu_n", 3, 0, 6, False),
        _("shift_cut", 3, 6, 6, False),
        _("shift_bias", 3, 12, 6, False),
        _("act_type", 3, 18, 4, False),
        _("shift_prelu_p", 3, 22, 6, False),
        _("jump_read_endl", 4, 0, 13, True),
        _("jump_read", 4, 13, 10, True),
        _("multi_factor", 4, 23, 8, False),
        _("jump_write_endl", 5, 0, 13, True),
        _("jump_write", 5, 13, 10, True),
        _("jump_read_weights", 5, 23, 9, False),
    ),
    "ALU": (
        _("bank_addr_out", 0, 0, 14, False),
        _("bank_id_out", 0, 14, 6, False),
        _("bank_addr_in", 1, 0, 14, False),
        _("bank_id_in", 1, 14, 6, False),
        _("valid_pixel_parallel", 1, 20, 3, True),
        _("pad_bottom", 1, 23, 8, False),
        _("bank_addr_in_1", 2, 0, 14, False),
        _("pad_right", 2, 14, 8, False),
        _("pad_left", 2, 22, 4, False),
        _("pad_top", 2, 26, 4, False),
        _("bank_addr_in_2", 3, 0, 14, False),
        _("bank_addr_weights", 3, 14, 14, False),
        _("kernel_d", 3, 28, 4, True),
        _("bank_addr_in_3", 4, 0, 14, False),
        _("bank_addr_bias", 4, 14, 14, False),
    ),
    "ELEWINIT": (
        _("share_pp", 0, 13, 1, False),
        _("bank_id_in", 0, 14, 6, False),
        _("bank_addr_in", 1, 0, 14, False),
        _("jump_read_endl", 1, 14, 13, True),
        _("id", 1, 27, 2, False),
        _("jump_bank", 1, 29, 3, True),
        _("jump_read", 2, 0, 12, False),
        _("shift_read", 2, 12, 4, False),
    ),
    "ELEW": (
        _("length", 0, 0, 11, True),
        _("act_type", 0, 11, 1, False),
        _("elew_type", 0, 12, 2, False),
        _("bank_id_out", 0, 14, 6, False),
        _("bank_addr_out", 1, 0, 14, False),
        _("jump_write_endl", 1, 14, 13, True),
        _("num", 1, 27, 2, True),
        _("valid_pixel_parallel", 1, 29, 3, True),
        _("jump_write", 2, 0, 12, True),
        _("shift_write", 2, 12, 5, False),
        _("channel_group", 2, 17, 8, True),
    ),
    "END": (),
    "POOLINIT": (
        _("jump_read", 0, 0, 10, True),
        _("kernel_h", 0, 10, 3, True),
        _("kernel_w", 0, 13, 3, True),
        _("shift_cut", 0, 16, 4, False),
        _("pool_type", 1, 0, 2, False),
        _("stride_h", 1, 2, 3, True),
        _("stride_w", 1, 5, 3, True),
        _("stride_offset_in", 1, 8, 3, False),
        _("valid_pixel_parallel", 1, 11, 3, True),
        _("stride_offset_out", 1, 14, 3, False),
        _("stride_out", 1, 17, 4, True),
        _("jump_write", 1, 21, 10, True),
    ),
    "POOL": (
        _("bank_addr_in", 0, 0, 12, False),
        _("channel_group", 0, 12, 8, True),
        _("bank_id_in", 1, 0, 6, False),
        _("pad_bottom", 1, 6, 3, False),
        _("pad_right", 1, 9, 3, False),
        _("pad_top", 1, 12, 3, False),
        _("pad_left", 1, 15, 3, False),
        _("jump_write_endl", 1, 18, 12, True),
        _("bank_id_out", 2, 0, 6, False),
        _("length", 2, 6, 10, True),
        _("jump_read_endl", 2, 16, 12, True),
        _("bank_addr_out", 3, 0, 12, False),
        _("bank_addr_in_1", 3, 12, 12, False),
        _("downsample_kernel_w", 3, 24, 8, True),
        _("bank_addr_in_2", 4, 0, 12, False),
        _("bank_addr_in_3", 4, 12, 12, False),
        _("downsample_kernel_h", 4, 24, 8, True),
    ),
    "DWINIT": (
        _("jump_read_endl", 0, 0, 10, True),
        _("jump_read", 0, 10, 10, True),
        _("jump_write_endl", 1, 0, 10, True),
        _("kernel_h", 1, 10, 4, True),
        _("kernel_w", 1, 14, 4, True),
        _("stride_h", 1, 18, 4, True),
        _("stride_w", 1, 22, 4, True),
        _("valid_pixel_parallel", 1, 26, 3, True),
        _("stride_offset_in", 1, 29, 3, False),
        _("shift_cut", 2, 0, 6, False),
        _("shift_bias", 2, 6, 6, False),
        _("stride_offset_out", 2, 12, 3, False),
        _("stride_out", 2, 15, 4, True),
        _("jump_write", 2, 19, 10, True),
    ),
    "DPTWISE": (
        _("bank_addr_in", 0, 0, 12, False),
        _("channel_group", 0, 12, 8, True),
        _("bank_addr_out", 1, 0, 12, False),
        _("pad_bottom", 1, 16, 4, False),
        _("pad_top", 1, 20, 4, False),
        _("pad_right", 1, 24, 4, False),
        _("pad_left", 1, 28, 4, False),
        _("bank_addr_weights", 2, 0, 12, False),
        _("bank_id_in", 2, 12, 6, False),
        _("length", 2, 18, 10, True),
        _("act_type", 2, 28, 4, False),
        _("bank_addr_bias", 3, 0, 12, False),
        _("bank_id_out", 3, 12, 6, False),
        _("bank_addr_in_1", 3, 18, 12, False),
        _("bank_addr_in_2", 4, 0, 12, False),
        _("bank_addr_in_3", 4, 12, 12, False),
        _("channel_offset", 4, 24, 5, False),
    ),
}
del _

# Emission order of the text assembly (spec §4.4): word by word, most significant field first.
TEXT_ORDER: dict[str, tuple[str, ...]] = {
    m: tuple(f.name for f in sorted(fs, key=lambda f: (f.word, -f.lsb))) for m, fs in FIELDS.items()
}
FIELD_INDEX: dict[str, dict[str, int]] = {
    m: {f.name: i for i, f in enumerate(fs)} for m, fs in FIELDS.items()
}
MAX_FIELDS = max(len(fs) for fs in FIELDS.values())
