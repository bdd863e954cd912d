"""Global average pools larger than one pass of the image banks (issue 30 part 6; docs/compiler.md "Global pools").

* A single-output pool reads the same rows at any stride_h; at stride ceil(kh/PP) its rows spread over the PP banks
  (ceil(kh/PP)*kw lines, UG1414's pool limit) instead of kh*kw lines in one bank: PP-OCRv4 det's 80x160
  squeeze-excite pools then fit B4096 in one pass, bit-exact (the op itself, sim == ref, RTL == cycle model).
* Beyond that (80x160 on B512: ceil(80/4)*160 = 3200 > 2048 lines), `compiler.poolsplit` computes the pool in two
  passes; the compiled graph holds both, sim == ref on it byte for byte, and its deviation from the one-pass op on
  the quantized graph stays within the bound the compile log states (hand-computed here).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper

from compile_helpers import compile_model, graph_inputs, initial_ddr, mismatches, reference, run, target
from opendpu.compiler.pipeline import compile as compile_graph
from opendpu.compiler.poolsplit import fits, fits_strided, plan
from opendpu.compiler.xir.graph import Graph
from opendpu.quant.quantize import QuantConfig, quantize
from opendpu.runtime.runner import GraphRunner


def se_model(c: int = 16, h: int = 80, w: int = 160) -> onnx.ModelProto:
    """conv3x3+ReLU -> r1 (1xCxHxW); squeeze-excite: global avg pool, 1x1 conv + ReLU, 1x1 conv, HardSigmoid,
    channel Mul with r1."""
    r = np.random.default_rng(0)
    inits = {"w1": r.normal(0, .3, (c, 3, 3, 3)), "b1": r.normal(0, .1, c), "s1": r.normal(0, .3, (8, c, 1, 1)),
             "s1b": r.normal(0, .1, 8), "s2": r.normal(0, .3, (c, 8, 1, 1)), "s2b": r.normal(0, .1, c)}
    N = oh.make_node
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             N("Relu", ["c1"], ["r1"], name="relu1"),
             N("GlobalAveragePool", ["r1"], ["sq"], name="gap"),
             N("Conv", ["sq", "s1", "s1b"], ["e1"], name="fc1"), N("Relu", ["e1"], ["e1r"], name="relu2"),
             N("Conv", ["e1r", "s2", "s2b"], ["e2"], name="fc2"),
             N("HardSigmoid", ["e2"], ["gate"], alpha=1 / 6, beta=0.5, name="gate"),
             N("Mul", ["r1", "gate"], ["y"], name="scale")]
    g = oh.make_graph(nodes, "se", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, h, w])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, h, w])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m


_Q: dict = {}


def _quantized(tkey: str) -> Graph:
    if tkey not in _Q:
        x = np.random.default_rng(1).normal(0, 1, (4, 3, 80, 160)).astype(np.float32)
        res = quantize(se_model(), x, target=target(tkey), config=QuantConfig(method="maxmin"))
        _Q[tkey] = Graph.deserialize(res.xmodel().serialize())
    return _Q[tkey]


def test_plan_by_hand():
    # B512: PP 4, depth 2048. One pass: ceil(80/4)*160 = 3200 lines > 2048.
    assert not fits(80, 160, 4, 2048)
    assert fits(80, 160, 8, 2048)                     # B4096 (PP 8): ceil(80/8)*160 = 1600
    sp = plan(80, 160, 4, 2048)
    assert sp is not None and sp.kh % sp.a == 0 and sp.kw % sp.c == 0
    # pass 1 has one output row (b = 1): its rows spread over the banks, ceil(80/4)*80 = 1600 lines; pass 2 1x2
    assert fits(sp.a, sp.c, 4, 2048) and fits(sp.b, sp.d, 4, 2048) and -(-sp.a // 4) * sp.c == 1600
    assert fits_strided(8, 160, 2048) and not fits_strided(16, 160, 2048)       # 1280 and 2560 lines
    # 1/6400 ~ 82/2^19 (2^19/6400 = 81.92): ratio 82*6400/2^19 = 1.0009765625, so 128*e = 0.125 input LSB
    assert (sp.a, sp.c, sp.b, sp.d) == (80, 80, 1, 2)
    assert sp.bound_lsb == pytest.approx(0.5 + 0.125)          # pass 2 (1x2, divisor 1/2 exact): r2 = 1, e2 = 0
    # 1/12800 ~ 82/2^20 (81.92 again): the one-pass op's own divisor error is the same 0.125
    assert sp.one_pass_lsb == pytest.approx(0.125)
    assert plan(7, 7, 8, 2048) is not None                    # a split always needs divisors: 7x7 -> 7x1, 1x7
    assert plan(13, 13, 1, 2) is None                          # nothing fits two lines


def test_b4096_one_pass_bit_exact_and_rtl():
    """80x160 on B4096: no split, the pool's rows spread over the banks; sim == ref, RTL == cycle model."""
    from opendpu.runtime.cosim import cosim_programs
    g = _quantized("B4096")
    c = compile_model(g, target("B4096"), "se")
    assert "gap_pass1" not in c.graph.ops
    (p,) = c.programs.values()                                  # one DPU subgraph: the pool is on the DPU
    pools = [i for i in p.instructions if i.op == "ALUINIT" and i.fields["exec_mode"] == 2]
    assert {(i.fields["kernel_h"], i.fields["kernel_w"], i.fields["stride_h"]) for i in pools} == {(80, 160, 10)}
    x = graph_inputs(c.graph, 3)
    vals = reference(c.graph, x)
    m, _ = run(p, initial_ddr(p, vals), fill="random", seed=3)
    assert not mismatches(p, m, vals)
    want = GraphRunner(g, backend="ref").run(x).outputs
    got = GraphRunner(c.xmodel, backend="sim", seed=3).run(x).outputs
    for k, v in want.items():
        assert np.array_equal(np.asarray(got[k]), np.asarray(v)), k
    init = initial_ddr(p, vals)
    (rep,) = cosim_programs(c.target, [(p.name, list(p.instructions), dict(p.registers.sizes), init)])
    assert rep.ok and rep.rtl_cycles == rep.model_cycles > 0, rep.summary()


@pytest.mark.parametrize("key", ["B512", "B800", "B1152"])
def test_two_passes_on_small_targets(key):
    t = target(key)
    assert not fits(80, 160, t.pp, t.bank_depth)               # PP 4: 3200 lines
    g = _quantized(key)
    lines: list[str] = []
    res = compile_graph(g, t, name="se", log=lines.append)
    assert "gap_pass1" in res.org.ops, lines
    split = [ln for ln in lines if "pool_split: gap:" in ln]
    assert split and "deviation from the exact mean" in split[0]
    p1, p2 = res.org.ops["gap_pass1"], res.org.ops["gap"]
    src = g.ops[g.ops["gap"].inputs["input"][0]].output
    assert p2.inputs["input"] == ["gap_pass1"] and p1.output.fix_point == src.fix_point   # the input's LSB
    assert p2.output.fix_point == g.ops["gap"].output.fix_point
    (p,) = res.programs.values()                                 # both passes on the DPU, nothing on the CPU
    pools = [i for i in p.instructions if i.op == "ALUINIT" and i.fields["exec_mode"] == 2]
    assert len({(i.fields["kernel_h"], i.fields["kernel_w"]) for i in pools}) == 2
    # the compiled graph: sim == ref byte for byte
    x = graph_inputs(res.org, 5)
    vals = reference(res.org, x)
    m, _ = run(p, initial_ddr(p, vals), fill="random", seed=5)
    assert not mismatches(p, m, vals)
    got = GraphRunner(res.graph, backend="sim", seed=5).run(x).outputs
    org = GraphRunner(res.org, backend="ref").run(x).outputs
    for k in org:
        assert np.array_equal(np.asarray(got[k]), np.asarray(org[k])), k
    # against the one-pass op of the quantized graph: within the stated bound (+1 for the two final roundings)
    sp = plan(80, 160, t.pp, t.bank_depth)
    assert sp is not None
    k = 2.0 ** (g.ops["gap"].output.fix_point - src.fix_point)
    one = reference(g, x)["gap"].astype(np.int32)
    two = vals["gap"].astype(np.int32)
    dev = np.abs(one - two).max()
    assert dev <= np.ceil((sp.bound_lsb + sp.one_pass_lsb) * k) + 1, (dev, sp)


def test_option_off_leaves_the_pool_on_the_cpu():
    t = target("B512")
    res = compile_graph(_quantized("B512"), t, name="se", pool_split=False)
    assert "gap_pass1" not in res.org.ops
    assert "gap" not in {o for s in res.partition.dpu_subgraphs for o in s.ops}
