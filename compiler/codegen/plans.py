"""Per-layer decisions by the one cycle model, and what they leave behind.

A decision emits each form of a layer (channel-augmented or not, single- or double-buffered weights, fused with
its consumer or split, a pool as one layer or a cascade) into a scratch context with the real emission's switches,
orders and tokens it as `generate` does, and times it with the cycle model: `timing_cycles` (sim.timing, bank-port
arbitration included; the compiler imports nothing else of sim), unless the caller passes another one. The choice
is kept as a frozen `LayerPlan` (the chosen form and the cycles of every form tried), which the compile report
prints."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from opendpu.compiler.codegen.context import Ctx, Cycles, new_ctx
from opendpu.compiler.codegen.ir import CodegenError
from opendpu.compiler.codegen.ordering import footprint_keys, prefetch_layers, tokens
from opendpu.isa.footprint import FootprintError
from opendpu.isa.program import Instruction
from opendpu.isa.target import Target


def timing_cycles(target: Target, instructions) -> int:
    """Total cycles of a (scratch or whole) instruction stream on `target`: sim.timing.simulate, timing only (the
    one cycle model of the profiler, the sweeps and the compiler's decisions; the compiler imports nothing else
    of sim)."""
    from opendpu.sim.timing import simulate
    return int(simulate(instructions, target).total_cycles)


@dataclass(frozen=True)
class LayerPlan:
    """One per-layer choice of the code generator: `decision` (channel_augmentation, weight_buffers, fuse,
    fuse_conv, fuse_elew, pool_cascade, contested pairs) for `layer`, the form `chosen` and the cycles of every
    form tried in order (None: the form cannot be emitted)."""

    layer: str
    decision: str
    chosen: str
    cycles: tuple[tuple[str, int | None], ...]

    def to_dict(self) -> dict:
        """The compile report's entry (DpuProgram.stats["decisions"])."""
        return {"layer": self.layer, "decision": self.decision, "chosen": self.chosen, "cycles": dict(self.cycles)}


def decide(c: Ctx, layer: str, what: str, costs: dict, chosen: str) -> None:
    """Record a choice of the real emission (none in scratch contexts)."""
    if c.decisions is not None:
        c.decisions.append(LayerPlan(layer, what, chosen, tuple(costs.items())))


def _scratch_regs(ins: list[Instruction]) -> dict[int, int]:
    """Register sizes that hold every DDR access of a scratch stream."""
    size: dict[int, int] = {}
    for x in ins:
        if x.op in ("LOAD", "SAVE"):
            f = x.fields
            step = f["jump_read"] if x.op == "LOAD" else f["jump_write"]
            end = f["ddr_addr"] + (f["length"] - 1) * step + f["channel"] + 64
            size[f["reg_id"]] = max(size.get(f["reg_id"], 1), end)
    return size


def program_cost(t: Target, ins: list[Instruction], layer_of: list[int], prefetch: bool, cycles: Cycles) -> int:
    """`cycles` of a scratch stream after the same order and token passes as `generate`."""
    keys = footprint_keys(t, ins, _scratch_regs(ins))
    if prefetch:
        order = prefetch_layers(ins, layer_of, keys)
        ins, keys = [ins[k] for k in order], keys.permuted(order)
    return int(cycles(t, tokens(t, ins, True, keys) if any(x.op == "SAVE" for x in ins) else ins))


def layer_cost(real: Ctx, *steps: Callable[[Ctx], None]) -> int:
    """Cycles of `steps` (one layer each) emitted into a scratch context with `real`'s scheduling switches, ordered
    and tokened as `generate` does, on `real`'s cycle model (bank-port conflicts included, issue 15). CodegenError
    when the form cannot be emitted, or emits instructions no valid program has (a footprint error: e.g. a window
    over more than 4 passes of the bank group, spec §6.4), so the form is not taken."""
    t = real.target
    assert real.cycles is not None, "a decision needs the cycle model"
    c = new_ctx(t)
    c.ws_alloc = lambda n: 0
    c.pipeline, c.param_align, c.fuse_conv = real.pipeline, real.param_align, real.fuse_conv
    for k, step in enumerate(steps):
        c.s.layer = k
        step(c)
    c.s.add("END")
    try:
        return program_cost(t, c.s.ins, c.s.layer_of, real.param_align > 1, real.cycles)
    except FootprintError as e:
        raise CodegenError(f"not a valid program: {e}") from None
