"""The quantizer's fix-point rules for pools and concats, as AMD's compiled programs show them (docs/quantizer.md,
"DPU fix-point rules"), and the compiler's realisation of the unaligned cases.

* An average pool keeps its own output fix point (AMD's MobileNetV2 programs: 7x7 global avg pool, input 4, output
  5 or 6, spec §7.4); a max pool shares its input's (every max pool of the shared xmodels).
* A concat producer read by nothing but the concat shares the concat's fix point; one with other consumers keeps its
  own and the concat takes the minimum (the compiler rescales it with a single-input ELEW, spec §7.8).
* `align_pool` / `align_concat` give the old rule (every pool and every producer share), as TF1's defaults.

The compiled programs of a model with both cases (a squeeze-excite block over an unaligned concat, a 5x5 avg pool
with its own fix point) are checked against the golden XIR reference on the cycle model, tensor by tensor, and end
to end on the `sim` backend; the model is the one `benchmarks/bench_fix_rules.py` measures against float.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper

from compile_helpers import (ALL_TARGET_KEYS, compile_model, graph_inputs, initial_ddr, mismatches, reference, run,
                             target)
from opendpu.compiler.fixpoint import avg_pool_factor
from opendpu.compiler.xir.graph import Graph
from opendpu.quant.quantize import QuantConfig, quantize
from opendpu.runtime.runner import GraphRunner


def se_concat_model(seed: int = 0) -> onnx.ModelProto:
    """1x8x16x16: conv3x3+ReLU, 2x2 max pool, conv3x3+ReLU (`c2`, read by a concat, a 1x1 conv and a 3x3 avg pool),
    a 1x1 conv of large weights (`c3`), concat(c2, c3), squeeze-excite over the concat (global avg pool, 1x1 conv +
    ReLU, 1x1 conv, HardSigmoid, channel Mul), 1x1 conv -> `y`; avg pool 5x5 of c2 -> 1x1 conv -> `z`."""
    r = np.random.default_rng(seed)
    n = r.normal
    inits = {"w1": n(0, .3, (16, 8, 3, 3)), "b1": n(0, .1, 16), "w2": n(0, .05, (16, 16, 3, 3)), "b2": n(0, .02, 16),
             "w3": n(0, 1.0, (16, 16, 1, 1)), "b3": n(0, .1, 16), "s1": n(0, .3, (8, 32, 1, 1)), "s1b": n(0, .1, 8),
             "s2": n(0, .3, (32, 8, 1, 1)), "s2b": n(0, .1, 32), "w4": n(0, .2, (8, 32, 1, 1)), "b4": n(0, .1, 8),
             "w5": n(0, .3, (4, 16, 1, 1)), "b5": n(0, .1, 4)}
    N = oh.make_node
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             N("Relu", ["c1"], ["r1"], name="relu1"),
             N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="maxpool"),
             N("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             N("Relu", ["c2"], ["r2"], name="relu2"),
             N("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3"),
             N("Concat", ["r2", "c3"], ["cat"], axis=1, name="cat"),
             N("GlobalAveragePool", ["cat"], ["sq"], name="se_pool"),
             N("Conv", ["sq", "s1", "s1b"], ["e1"], name="se_fc1"), N("Relu", ["e1"], ["e1r"], name="se_relu"),
             N("Conv", ["e1r", "s2", "s2b"], ["e2"], name="se_fc2"),
             N("HardSigmoid", ["e2"], ["gate"], alpha=1 / 6, beta=0.5, name="se_gate"),
             N("Mul", ["cat", "gate"], ["se"], name="se_scale"),
             N("Conv", ["se", "w4", "b4"], ["y"], name="conv4"),
             N("AveragePool", ["r2"], ["ap"], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2],
               count_include_pad=1, name="avgpool"),
             N("Conv", ["ap", "w5", "b5"], ["z"], name="conv5")]
    g = oh.make_graph(nodes, "se_concat", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8]),
                       oh.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, 8, 8])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def se_concat_calib(n: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (n, 8, 16, 16)).astype(np.float32)


_CACHE: dict = {}


def _quantized(**cfg) -> Graph:
    key = tuple(sorted(cfg.items()))
    if key not in _CACHE:
        res = quantize(se_concat_model(), se_concat_calib(), config=QuantConfig(method="maxmin", **cfg))
        _CACHE[key] = Graph.deserialize(res.xmodel().serialize())
    return _CACHE[key]


def _fps(g: Graph) -> dict[str, int]:
    return {n: op.output.fix_point for n, op in g.ops.items()}


def test_rules_pool_and_concat():
    g = _quantized()
    fp = _fps(g)
    assert fp["maxpool"] == fp["conv1"]                                    # max pool shares
    for pool, src in (("se_pool", "cat"), ("avgpool", "conv2")):          # avg pools keep their own, finer here
        assert fp[pool] > fp[src], (pool, fp[pool], fp[src])
        kw, kh = g.ops[pool].attrs["kernel"]
        assert fp[pool] - fp[src] - avg_pool_factor(kh, kw)[1] <= 7     # the ALU exponent has a code
    # conv2 (relu2 fused) is read by the concat, conv3 and the avg pool: it keeps its own fix point, finer than
    # conv3's; conv3 is read only by the concat and shares its fix point, the minimum
    assert [g.ops[i].name for i in g.ops["cat"].input_ops()] == ["conv2", "conv3"]
    assert fp["conv2"] > fp["cat"] == fp["conv3"] == min(fp["conv2"], fp["conv3"])


def test_old_rule_aligns_everything():
    new, old = _fps(_quantized()), _fps(_quantized(align_pool=True, align_concat=True))
    assert old["avgpool"] == old["conv2"] == old["cat"] == old["conv3"] == old["se_pool"]
    assert old["maxpool"] == old["conv1"]
    # the old rule only ever lowers: every fix point of the new rule is at least as fine
    assert all(new[k] >= old[k] for k in old)
    assert new["conv2"] > old["conv2"] and new["avgpool"] > old["avgpool"] and new["se_pool"] > old["se_pool"]


@pytest.mark.parametrize("key", ALL_TARGET_KEYS)
def test_compiled_unaligned_pool_and_concat_bit_exact(key):
    """Every DPU program equals the reference on every output and workspace tensor (random bank contents), and the
    compiled xmodel end to end on `sim` equals the quantized graph on `ref`."""
    g = _quantized()
    c = compile_model(g, target(key), "se_concat")
    assert c.programs
    fp = _fps(c.graph)                  # the canonical graph the programs come from still has the unaligned cases
    assert fp["avgpool"] != fp["conv2"] and fp["conv2"] != fp["cat"]
    dpu_ops = {im.op_name for p in c.programs.values() for im in p.outputs + p.internal}
    assert {"conv5", "conv4"} <= dpu_ops
    (prog,) = c.programs.values()                       # one DPU subgraph: nothing went to the CPU
    ins = prog.instructions
    # spec §7.4: ALU avg pool, exponent e = fp_out - fp_in - M, shift_cut code 8 - e for e < 0 (8x8: 1/64 exact,
    # M = 6; 5x5: 10/2^8); spec §7.8: the unaligned concat input is a single-input ELEW, shift_write 16 + (in - out)
    pools = {(i.fields["kernel_h"], i.fields["shift_cut"]) for i in ins if i.op == "ALUINIT"
             and i.fields["exec_mode"] == 2}
    assert pools == {(8, 8 - (fp["se_pool"] - fp["cat"] - 6)), (5, 8 - (fp["avgpool"] - fp["conv2"] - 8))}
    assert any(i.op == "ELEW" and i.fields["shift_write"] == 16 + fp["conv2"] - fp["cat"] for i in ins)
    for seed in (1, 2):
        x = graph_inputs(c.graph, seed)
        vals = reference(c.graph, x)
        for p in c.programs.values():
            m, _ = run(p, initial_ddr(p, vals), fill="random", seed=seed)
            assert not mismatches(p, m, vals), (key, p.name, mismatches(p, m, vals))
        want = GraphRunner(g, backend="ref").run(x).outputs
        got = GraphRunner(c.xmodel, backend="sim", seed=3).run(x).outputs
        assert set(got) == set(want)
        for k, v in want.items():
            assert np.array_equal(np.asarray(got[k]), np.asarray(v)), (key, k)
