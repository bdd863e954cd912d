"""The code generator's registries (issue 31 item 2; docs/compiler.md, "The pass list and the code generator's
modules"): every kind has a lowering and every job an emitter; the ISA field limits are read from isa.fields, never
restated; and legality, which answers the partitioner without emitting (`codegen.unsupported`: the kind's check and
each job's tiling planner), agrees op by op with actually emitting the op alone into a scratch context (the dry run
it replaced), on the zoo and on small parametric targets where the planners refuse layers."""
from __future__ import annotations

import ast
import glob
import os

import pytest

from compile_helpers import PRESET_KEYS, quantized, target
from opendpu.compiler.codegen import kinds, limits, unsupported
from opendpu.compiler.codegen.context import new_ctx
from opendpu.compiler.codegen.driver import lower_op
from opendpu.compiler.codegen.ir import REG_IN, REG_OUT, AluJob, CodegenError, ConvJob, CopyJob, ElewJob, dense
from opendpu.compiler.codegen.legality import classify
from opendpu.compiler.codegen.registry import EMITTERS, FITS, LEGALITY, LOWERINGS
from opendpu.compiler.fixpoint import FixPointError
from opendpu.compiler.frontend import canonicalize
from opendpu.isa.fields import FIELDS
from opendpu.isa.target import Target

CODEGEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compiler", "codegen")
KINDS = {v for k, v in vars(kinds).items() if k.isupper() and isinstance(v, str)}


def test_every_kind_is_registered():
    assert set(LOWERINGS) == KINDS - set(kinds.NO_CODE)
    assert set(EMITTERS) == set(FITS) == {ConvJob, AluJob, ElewJob, CopyJob}
    assert set(kinds.ALU_KINDS) | set(kinds.FUSE_PRODUCERS) | set(kinds.MEMBER_KINDS) <= set(LOWERINGS)
    assert all(t.endswith("-fix") for t in LEGALITY)


def test_field_limits_come_from_isa_fields():
    """The limits are the fields' ranges; no module of the package but `limits` writes one as a number."""
    def hi(op, name):
        f = next(f for f in FIELDS[op] if f.name == name)
        return (1 << f.width) if f.minus_one else (1 << f.width) - 1
    assert (limits.ITEMS_MAX, limits.LOAD_CHANNEL_MAX, limits.SAVE_CHANNEL_MAX) == (
        hi("LOAD", "length"), hi("LOAD", "channel"), hi("SAVE", "channel")) == (1024, 16384, 4096)
    assert (limits.CONV_ENDL_MAX, limits.ALU_ENDL_MAX, limits.ALU_LENGTH_MAX, limits.CHANNEL_GROUP_MAX) == (
        1024, 8192, 2048, 256)
    assert limits.CONV_ADDR_LINES == 4096 and limits.ALU_ADDR_LINES == 16384
    restated = {256, 1024, 2048, 4096, 8192, 16384}
    found = []
    for path in sorted(glob.glob(os.path.join(CODEGEN, "*.py"))):
        if path.endswith("limits.py"):
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        found += [f"{os.path.basename(path)}:{n.lineno} {n.value}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and type(n.value) is int and n.value in restated]
    assert not found, found


def _dry_run(g, name: str, t: Target) -> str | None:
    """The op alone emitted into a scratch context (dense images, no decisions): None, or why it cannot be."""
    op = g.ops[name]
    try:
        kind = classify(g, op, t)
        if kind in kinds.NO_CODE:
            return None
        c = new_ctx(t)
        fm = {i: dense(REG_IN, 0, g.ops[i].output.shape, g.ops[i].output.fix_point) for i in op.inputs.get("input", [])}
        for job in lower_op(c, g, op, kind, fm, dense(REG_OUT, 0, op.output.shape, op.output.fix_point)):
            EMITTERS[type(job)](c, job)
    except (CodegenError, FixPointError) as e:
        return str(e)
    return None


def _agree(g, targets) -> tuple[int, int]:
    n = refused = 0
    for t in targets:
        for name, op in g.ops.items():
            if op.type == "data-fix" or not (op.type.endswith("-fix") or op.type in kinds.ALIAS_TYPES):
                continue
            want = _dry_run(g, name, t)
            assert unsupported(g, name, t) == want, (t.name, name, op.type, want)
            n += 1
            refused += want is not None
    return n, refused


SMALL = [Target.parametric(2, 4, bank_depth=128), Target.parametric(4, 8, bank_depth=256)]


@pytest.mark.parametrize("model,size", [("digits", None), ("mobilenet_v2", 32), ("squeezenet", 32),
                                        ("tiny_yolo_v2", 32)])
def test_legality_agrees_with_emitting(model, size):
    g = canonicalize(quantized(model, size))
    n, _ = _agree(g, [target(k) for k in PRESET_KEYS] + SMALL)
    assert n > 0


def test_legality_refuses_what_does_not_fit_without_emitting():
    """On 128-line banks the planners refuse layers of SqueezeNet at 224x224 (the weights of one output channel
    exceed the CONVW bank; a conv's bias slices exceed the BIAS bank): legality names the same refusals, in the
    same words, as emitting does."""
    g = canonicalize(quantized("squeezenet", None))
    n, refused = _agree(g, SMALL[:1])
    assert refused > 0 and n > refused


def test_dump_after_the_code_generator_steps():
    """`--dump-after` works for the three code-generator passes: the plan dump has every DPU op's kind, the lower
    dump the LayerPlans the program reports, the order dump the programs; dumping changes no program."""
    import json

    from opendpu.compiler.pipeline import PASS_NAMES, compile as compile_graph
    steps = ["codegen_plan", "codegen_lower", "codegen_order"]
    assert [p for p in PASS_NAMES if p.startswith("codegen")] == steps
    g, t = quantized("digits"), target("B512")
    plain = compile_graph(g, t, name="d")
    res = compile_graph(g, t, name="d", dump_after=steps)
    assert {n: p.mc_code for n, p in res.programs.items()} == {n: p.mc_code for n, p in plain.programs.items()}
    dumps = json.loads(json.dumps(res.dumps))
    for name, prog in res.programs.items():
        plan = dumps["codegen_plan"]["codegen_plan"][name]
        assert set(plan["kinds"]) == set(res.partition.dpu_subgraphs[0].ops) and "conv" in plan["kinds"].values()
        assert plan["memory"]["images"] and plan["inputs"] and plan["outputs"]
        (low,) = dumps["codegen_lower"]["codegen_lower"][name]
        assert low["plans"] == prog.stats["decisions"] and len(low["plans"]) > 0
        assert [ly["ops"] for ly in low["layers"]] == [ly.ops for ly in prog.layers]
        assert dumps["codegen_order"]["programs"][name]["instructions"] == len(prog.instructions)
