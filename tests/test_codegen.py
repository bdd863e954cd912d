"""The code generator (compiler/codegen/) against the golden reference: every output and every feature map it
stores in the workspace must equal `GraphRunner(backend="ref")` byte for byte, the token placement must leave no
race (isa.deps.find_races), on presets and parametric targets. The program runs on the instruction executor from
random initial bank contents."""
from __future__ import annotations

import numpy as np
import pytest

from opendpu.compiler import codegen
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.deps import find_races
from opendpu.isa.footprint import program_footprints
from opendpu.isa.program import to_arrays
from opendpu.isa.target import Target
from opendpu.quant import zoo
from opendpu.quant.quantize import QuantConfig, quantize
from opendpu.runtime.runner import GraphRunner
from opendpu.sim.executor import DpuMachine

TARGETS = {
    "B512": lambda: Target.from_name("DPUCZDX8G_ISA1_B512"),
    "B1152": lambda: Target.from_name("DPUCZDX8G_ISA1_B1152"),
    "B4096": lambda: Target.from_name("DPUCZDX8G_ISA1_B4096"),
    "PP2_CP4_D512": lambda: Target.parametric(2, 4, bank_depth=512),
    "PP8_CP32_D4096": lambda: Target.parametric(8, 32, bank_depth=4096),
}


def _quantized(model, shape, n=8):
    x = np.random.default_rng(0).normal(0, 1, (n,) + shape).astype(np.float32)
    res = quantize(model, x, config=QuantConfig(method="maxmin"))
    return Graph.deserialize(res.xmodel().serialize())


@pytest.fixture(scope="module")
def models():
    import sys
    import os
    sys.path.insert(0, os.path.dirname(__file__))
    import test_quant as tq
    rich = quantize(tq.rich_model(), tq.calib(), config=QuantConfig(method="diffs"))
    return {
        "digits": (_quantized(zoo.DIGITS_ONNX, (1, 8, 8)), (1, 8, 8, 1)),
        "rich": (Graph.deserialize(rich.xmodel().serialize()), (1, 16, 16, 3)),
        "resnet18_32": (_quantized(zoo.build("resnet18", 32), (3, 32, 32)), (1, 32, 32, 3)),
        "mobilenet_v2_32": (_quantized(zoo.build("mobilenet_v2", 32), (3, 32, 32)), (1, 32, 32, 3)),
    }


def dpu_ops(g: Graph, t: Target) -> tuple[list[str], dict[str, str]]:
    """The compilable ops up to the first op that is not (one subgraph), and the reasons of the others."""
    ops, why = [], {}
    for n in g.toposort():
        o = g.ops[n]
        if o.type == "data-fix" or not (o.type.endswith("-fix") or o.type in codegen.ALIAS_TYPES):
            continue
        if any(i not in ops and g.ops[i].type not in ("data-fix", "const-fix") for i in o.input_ops()):
            why[n] = "after a CPU op"
            continue
        r = codegen.unsupported(g, n, t)
        if r is None:
            ops.append(n)
        else:
            why[n] = r
    return ops, why


def run_program(prog, values: dict, seed: int = 0, instructions=None) -> DpuMachine:
    m = DpuMachine(prog.target, prog.registers.sizes, seed=seed)
    for r, data in prog.registers.params.items():
        m.write_ddr(r, 0, np.frombuffer(data, np.int8))
    for im in prog.inputs:
        view = np.lib.stride_tricks.as_strided(m.ddr(im.reg_id)[im.ddr_addr:], shape=im.dims, strides=im.strides)
        view[...] = values[im.op_name].reshape(im.dims)
    m.run(to_arrays(instructions if instructions is not None else prog.instructions))
    return m


def mismatches(prog, m: DpuMachine, values: dict) -> dict[str, int]:
    out = {}
    for im in prog.outputs + prog.internal:
        got = np.lib.stride_tricks.as_strided(m.ddr(im.reg_id)[im.ddr_addr:], shape=im.dims, strides=im.strides)
        out[im.op_name] = int((got != values[im.op_name].reshape(im.dims)).sum())
    return out


def no_races(prog, t: Target) -> bool:
    """find_races at 8-line / 64-byte keys: a conflict between single lines or bytes is also one between their
    chunks, so none at this granularity proves none at line / byte granularity (and it is 40x faster)."""
    return find_races(prog.instructions, program_footprints(prog.instructions, t), t, line_chunk=8,
                      ddr_chunk=64) == []


def reference(g: Graph, shape, seed: int) -> dict:
    x = np.random.default_rng(seed).integers(-128, 128, shape).astype(np.int8)
    return GraphRunner(g, backend="ref").run([x], keep_values=True).values


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("model", ["digits", "rich", "resnet18_32", "mobilenet_v2_32"])
def test_compiled_equals_reference_and_race_free(models, model, target):
    g, shape = models[model]
    t = TARGETS[target]()
    ops, why = dpu_ops(g, t)
    prog = codegen.generate(g, ops, t, name=model)
    assert prog.instructions[-1].op == "END" and len(prog.layer_of) == len(prog.instructions)
    checked = 0
    for seed in (1, 2):
        values = reference(g, shape, seed)
        bad = mismatches(prog, run_program(prog, values, seed), values)
        assert not any(bad.values()), {k: v for k, v in bad.items() if v}
        checked += len(bad)
    assert checked >= 2 * len(prog.outputs) > 0
    assert no_races(prog, t)
    if target != "PP2_CP4_D512":          # the tiny target puts a few big layers on the CPU (below)
        assert not why, why


def test_tiny_target_places_what_fits_nothing_on_cpu_with_the_limit(models):
    g, _ = models["resnet18_32"]
    ops, why = dpu_ops(g, TARGETS["PP2_CP4_D512"]())
    r = why["layer3.0.conv2"]
    assert "layer3.0.conv2" in r and "576 CONVW lines" in r and "bank_depth 512" in r


def test_comparison_is_sensitive_to_a_wrong_shift(models):
    """Control: the same check fails when one CONVINIT shift_cut is off by one."""
    g, shape = models["digits"]
    t = TARGETS["B512"]()
    prog = codegen.generate(g, dpu_ops(g, t)[0], t)
    values = reference(g, shape, 3)
    ins = list(prog.instructions)
    k = next(i for i, x in enumerate(ins) if x.op == "CONVINIT")
    ins[k] = type(ins[k])(ins[k].op, ins[k].dpdon, ins[k].dpdby, dict(ins[k].fields, shift_cut=ins[k].shift_cut + 1))
    bad = mismatches(prog, run_program(prog, values, 3, ins), values)
    assert sum(bad.values()) > 0


def test_tokens_are_needed(models):
    """Control: with every cross-engine token removed, the race checker finds races in the compiled program."""
    g, _ = models["resnet18_32"]
    t = TARGETS["B4096"]()
    prog = codegen.generate(g, dpu_ops(g, t)[0], t)
    bare = [type(x)(x.op, 1 << int(x.engine), 1 << int(x.engine), x.fields) for x in prog.instructions]
    assert len(find_races(bare, program_footprints(bare, t), t, line_chunk=8, ddr_chunk=64)) > 0


def test_every_image_access_stays_in_its_register(models):
    """Footprints bound-checked against the exact register sizes (no byte outside, spec §2.6)."""
    g, _ = models["rich"]
    for name in TARGETS:
        t = TARGETS[name]()
        prog = codegen.generate(g, dpu_ops(g, t)[0], t)
        program_footprints(prog.instructions, t, prog.registers.sizes)      # raises FootprintError otherwise


def test_ring_allocator_never_straddles_the_end():
    r = codegen.Ring(100)
    assert [r.alloc(40, "a"), r.alloc(40, "b"), r.alloc(40, "c"), r.alloc(60, "d")] == [0, 40, 0, 40]
    with pytest.raises(codegen.CodegenError, match="needs 101 lines"):
        r.alloc(101, "x")


def test_hwc_shapes():
    assert codegen.hwc([1, 5, 6, 7]) == (5, 6, 7)
    assert codegen.hwc([1, 10]) == (1, 1, 10)
    assert codegen.hwc([10]) == (1, 1, 10)
    with pytest.raises(codegen.CodegenError, match="batch must be 1"):
        codegen.hwc([2, 4, 4, 3])
