"""What code generation produces for one DPU subgraph: the program, its DDR registers and where every
tensor it reads or writes lives. The xmodel writer (`compiler.emit`) turns a `DpuProgram` into a DPU
subgraph with `compiler.xir.dpu_abi`; nothing here knows the xmodel container.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opendpu.compiler.xir.dpu_abi import RegisterMap
from opendpu.isa.program import Instruction, encode
from opendpu.isa.target import Target


@dataclass(frozen=True)
class DdrImage:
    """The DDR image of one op's output tensor: register, byte offset of element 0, element strides (outermost
    first; NHWC feature maps may have a padded pixel stride) and fix point."""

    op_name: str
    reg_id: int
    ddr_addr: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    fix_point: int


@dataclass
class Layer:
    """One superlayer (a child subgraph of the DPU subgraph): the op that names it, every op it realises (the
    compute op, its const weights/bias, aliases such as reshapes), and its instruction range."""

    name: str
    ops: list[str]
    first: int = 0          # index of its first instruction
    count: int = 0          # number of instructions


@dataclass
class DpuProgram:
    """One compiled DPU subgraph (spec §8.2): instructions with dependency tokens, ending with END."""

    name: str
    target: Target
    instructions: list[Instruction]
    layer_of: list[int]                  # per instruction: index into `layers` (END: the last layer)
    layers: list[Layer]
    registers: RegisterMap               # REG_0 CONST (the parameter blob), WORKSPACE, INTERFACE registers
    inputs: list[DdrImage]               # one per input tensor, in the order of the subgraph's inputs
    outputs: list[DdrImage]              # one per output tensor
    internal: list[DdrImage] = field(default_factory=list)   # feature maps stored in WORKSPACE
    workload: int = 0                    # operations (2 per MAC), for profilers
    stats: dict = field(default_factory=dict)

    @property
    def mc_code(self) -> bytes:
        return encode(self.instructions)

    def layer_map(self) -> list[str]:
        """The instruction -> layer map: the layer name of every instruction."""
        return [self.layers[i].name for i in self.layer_of]


__all__ = ["DdrImage", "DpuProgram", "Layer"]
