"""The cycle model as the compiler's cost function.

The compiler may not import the simulator (the layering test forbids compiler -> sim), so its own estimates
leave out the bank-port arbitration of docs/bank-ports.md. The runtime, which may import both, hands the real
cycle model to `compiler.compile(..., cycles=cycle_model)`: the code generator then times each per-layer
alternative (channel augmentation, fusion, pool cascade) on the same rules as `opendpu run --backend sim`.
"""
from __future__ import annotations

from opendpu.isa.program import Instruction
from opendpu.isa.target import Target
from opendpu.sim.timing import simulate


def cycle_model(target: Target, instructions: list[Instruction]) -> int:
    """Total cycles of a (scratch or whole) instruction stream on `target`: sim.timing.simulate, timing only."""
    return int(simulate(instructions, target).total_cycles)
