"""Functional bit-exact executor of DPUCZDX8G ISA1 programs (spec §6)."""
from .executor import DpuMachine, ExecError  # noqa: F401
