"""ISA1 of the DPUCZDX8G: field tables, instruction encode/decode/text assembly, targets."""
from .fields import FIELDS, OPS, BY_NAME, BY_OPCODE, Engine  # noqa: F401
from .target import Target, TargetError, PRESETS, get_target  # noqa: F401
