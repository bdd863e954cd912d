"""Independent whole-tensor reference ("golden") executor of quantized XIR ops (spec §6.1, §7)."""

from .ops import SUPPORTED, RefError, avg_pool_factor, dpu_round, evaluate

__all__ = ["RefError", "dpu_round", "evaluate", "SUPPORTED", "avg_pool_factor"]
