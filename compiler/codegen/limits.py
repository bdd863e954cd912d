"""The ISA field limits the code generator plans against, read from `isa.fields.FIELDS` (spec §4.3) so they exist
once: the largest value a field encodes (`hi`) or the lines an address field reaches (`span`)."""
from __future__ import annotations

from opendpu.isa.fields import FIELDS


def hi(op: str, name: str) -> int:
    """The largest logical value of field `name` of instruction `op`."""
    return next(f for f in FIELDS[op] if f.name == name).hi


def span(op: str, name: str) -> int:
    """Addresses field `name` of `op` reaches (hi + 1): the lines a bank address field can name."""
    return hi(op, name) + 1


ITEMS_MAX = hi("LOAD", "length")                  # items of one LOAD / SAVE (1024; SAVE's length is as wide)
LOAD_CHANNEL_MAX = hi("LOAD", "channel")          # bytes of one LOAD item
SAVE_CHANNEL_MAX = hi("SAVE", "channel")          # bytes of one SAVE item
PAD_START_MAX = hi("LOAD", "pad_start")           # masked bytes before a LOAD item (channel augmentation)
PAD_END_MAX = hi("LOAD", "pad_end")               # masked bytes after it
CONV_ADDR_LINES = span("CONV", "bank_addr_in")    # 12-bit bank address fields of LOAD / SAVE / CONV
ALU_ADDR_LINES = span("ALU", "bank_addr_in")      # 14-bit ones of ALU
CONV_ENDL_MAX = hi("CONVINIT", "jump_read_endl")  # lines of one input sub-row a CONV steps over
CONV_LENGTH_MAX = hi("CONV", "length")            # output columns of one CONV
ALU_ENDL_MAX = hi("ALUINIT", "jump_read_endl")    # the same for ALU (and ELEWINIT's jump_read_endl)
ALU_LENGTH_MAX = hi("ALUINIT", "length")          # output columns of one ALU / ELEW
ELEW_ENDL_MAX = hi("ELEWINIT", "jump_read_endl")
CHANNEL_GROUP_MAX = hi("CONV", "channel_group")   # CONV, ALUINIT and ELEW all have 8-bit channel_group
ELEW_INPUTS_MAX = hi("ELEW", "num")
SHIFT_READ_MAX = hi("ELEWINIT", "shift_read")     # fix-point distance of ELEW inputs (and of rescaling copies)
MULTI_FACTOR_MASK = hi("ALUINIT", "multi_factor")

assert CHANNEL_GROUP_MAX == hi("ALUINIT", "channel_group") == hi("ELEW", "channel_group")
assert ITEMS_MAX == hi("SAVE", "length") and ALU_LENGTH_MAX == hi("ELEW", "length")
