"""The reorg (tile-fix, spec §7.9) through the whole loop: ONNX SpaceToDepth / DepthToSpace (DCR) -> quantizer
(`tile`, one fix point shared by input and output) -> tile-fix -> compiler (s² LOAD/SAVE copies between strided
views) -> sim against the reference, race-free, on every target, and on the RTL.

Independent references: onnxruntime on the original float model (the prepared float model) and on the fake-quant
model (the golden, every layer against the integer reference); a hand-built 2x2 example; the RTL."""
from __future__ import annotations

import numpy as np
import pytest

from compile_helpers import ALL_TARGET_KEYS, compiled, graph_inputs, quantized, reorg_model
from opendpu.compiler import frontend as fe
from opendpu.compiler.frontend import FrontendError
from opendpu.compiler.ref import evaluate
from opendpu.compiler.xir.graph import Graph
from opendpu.quant.emit import session
from opendpu.quant.inspect import inspect_model
from opendpu.quant.quantize import QuantConfig, quantize
from opendpu.quant.vai_q_out import to_vai_q
from opendpu.runtime.dpu import dpu_subgraphs
from opendpu.runtime.runner import GraphRunner
from test_compiled_programs import _cosim, check_compiled

CALIB = np.random.default_rng(0).normal(0, 1, (8, 4, 12, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def res():
    return quantize(reorg_model(), CALIB, config=QuantConfig(method="maxmin"))


def test_reference_tile_by_hand():
    """space-to-depth by 2 of a 2x2 map of 2 channels: output channel (dy·2 + dx)·2 + c holds pixel (dy, dx)."""
    x = np.array([[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]], np.int8)          # NHWC [1, 2, 2, 2]: x[0, y, x, c]
    want = np.array([1, 2, 3, 4, 5, 6, 7, 8], np.int8).reshape(1, 1, 1, 8)
    got = evaluate("tile-fix", [x], {"stride": 2, "reverse": False}, [0], 0, (1, 1, 1, 8), name="t")
    assert np.array_equal(got, want)
    back = evaluate("tile-fix", [want], {"stride": 2, "reverse": True}, [0], 0, (1, 2, 2, 2), name="t")
    assert np.array_equal(back, x)
    f = evaluate("reorg", [x.astype(np.float32) / 2], {"scale": 2, "reverse": False}, [None], None, (1, 1, 1, 8),
                 name="t")
    assert f.dtype == np.float32 and np.array_equal(f, want / 2)


def test_prepared_float_model_equals_onnxruntime(res):
    m = reorg_model()
    x = np.random.default_rng(9).normal(0, 1, (3, 4, 12, 16)).astype(np.float32)
    want = np.concatenate([session(m).run(None, {"x": x[i:i + 1]})[0] for i in range(3)])
    got = res.run(x, "float")[res.prep.outputs[0]]
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
    assert [n.kind for n in res.prep.nodes].count("tile") == 2


def test_golden_equals_reference_on_every_layer(res):
    """onnxruntime's SpaceToDepth / DepthToSpace on the fake-quant model against tile-fix on the reference."""
    g = Graph.deserialize(res.xmodel().serialize())
    tiles = [op for op in g.ops.values() if op.type == "tile-fix"]
    assert sorted((op.name, op.attrs["stride"], op.attrs["reverse"]) for op in tiles) == [
        ("reorg", 2, False), ("shuffle", 2, True)]
    for op in tiles:                                                # no fix-point change (the shared position)
        assert op.output.fix_point == g.ops[op.input_ops()[0]].output.fix_point
    for i in range(3):
        x1 = np.random.default_rng(50 + i).normal(0, 1, (1, 4, 12, 16)).astype(np.float32)
        gold = res.golden(x1)
        vals = GraphRunner(g, backend="ref").run([x1.transpose(0, 2, 3, 1)], keep_values=True).values
        for name in ("reorg", "route", "shuffle", "conv3"):
            np.testing.assert_array_equal(vals[name].reshape(gold[name].shape), gold[name], err_msg=name)


def test_placement_dpu_and_crd_on_the_cpu():
    _, _, rows = inspect_model(reorg_model(), "B4096")
    pl = {n.name: p for n, p in rows}
    assert (pl["reorg"].device, pl["shuffle"].device) == ("DPU", "DPU")
    assert "space-to-depth" in pl["reorg"].reason and "depth-to-space" in pl["shuffle"].reason
    m = reorg_model()
    for n in m.graph.node:
        if n.op_type == "DepthToSpace":
            n.attribute[1].s = b"CRD"
    r2 = quantize(m, CALIB, config=QuantConfig(method="maxmin"))
    cpu = {n.name: n.reason for n in r2.prep.nodes if n.device == "CPU"}
    assert list(cpu) == ["shuffle"] and "CRD" in cpu["shuffle"] and "DCR" in cpu["shuffle"]


@pytest.mark.parametrize("key", ALL_TARGET_KEYS)
def test_compiled_reorg_exact_race_free_timing_robust(key):
    c = compiled("reorg", None, key)
    (sg,) = dpu_subgraphs(c.xmodel)                      # one DPU subgraph: both tiles run on the DPU
    assert {"reorg", "shuffle"} <= set(sg.all_ops())
    st = check_compiled("reorg", None, key, [graph_inputs(c.graph, 1), graph_inputs(c.graph, 2)], timings=5)
    assert st["programs"] == 1 and len(st["orders"]) > 1


def test_compiled_reorg_on_the_rtl():
    g = compiled("reorg", None, "B512").graph
    (rep,) = _cosim("reorg", None, "B512", graph_inputs(g, 4))
    assert rep.instructions > 20


def test_vai_q_round_trip_of_tile(res, tmp_path):
    g0 = res.xmodel()
    v = to_vai_q(g0)
    reorgs = [op for op in v.ops.values() if op.type == "reorg"]
    assert sorted((op.attrs["scale"], op.attrs["reverse"]) for op in reorgs) == [(2, False), (2, True)]
    path = str(tmp_path / "v.xmodel")
    v.save(path)
    g1 = fe.load(path)
    assert [(op.name, op.type, dict(op.attrs)) for op in g1.ops.values() if op.type == "tile-fix"] == \
        [(op.name, op.type, dict(op.attrs)) for op in g0.ops.values() if op.type == "tile-fix"]


@pytest.mark.parametrize("attrs,out,msg", [
    ({"stride": 0, "reverse": False}, [1, 1, 1, 32], "stride = 0"),
    ({"stride": 2, "reverse": "yes"}, [1, 2, 2, 32], "reverse"),
    ({"stride": 2, "reverse": False}, [1, 2, 2, 16], "cannot turn [1, 4, 4, 8] into [1, 2, 2, 16]"),
    ({"stride": 3, "reverse": True}, [1, 12, 12, 1], "depth-to-space by stride 3"),
])
def test_bad_tile_fix_is_a_clear_error(attrs, out, msg):
    g = quantized("reorg", None)
    g2 = Graph.deserialize(g.serialize())
    op = g2.ops["reorg"]
    x = g2.ops[op.input_ops()[0]]
    x.output.shape = [1, 4, 4, 8]
    op.output.shape = out
    op.attrs = type(op.attrs)(list(attrs.items()))
    with pytest.raises(FrontendError) as e:
        fe.canonicalize(g2)
    assert "'reorg'" in str(e.value) and msg in str(e.value) and "\n" not in str(e.value)


def test_a_reorg_beyond_the_channel_limit_runs_on_the_cpu(tmp_path):
    """UG1414's reorg limit: space-to-depth needs stride²·C ≤ 256·CP. 4 x 600 channels exceed B512's 2,048, so the
    rules put the reorg on the CPU (its float form `reorg`, with the reason; the conv reading its 2,400 channels
    too), after the DPU subgraph of conv1, and the compiled xmodel on the cycle model still gives the quantized
    graph's output on the reference."""
    from onnx import TensorProto, helper as oh, numpy_helper

    from opendpu.compiler.pipeline import compile as compile_graph
    r = np.random.default_rng(3)
    inits = {"w1": r.normal(0, .2, (600, 4, 1, 1)), "w2": r.normal(0, .05, (8, 2400, 1, 1))}
    N = oh.make_node
    nodes = [N("Conv", ["x", "w1"], ["c1"], name="conv1"), N("SpaceToDepth", ["c1"], ["s"], blocksize=2, name="reorg"),
             N("Conv", ["s", "w2"], ["y"], name="conv2")]
    g = oh.make_graph(nodes, "big", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 2, 2])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    res = quantize(m, r.normal(0, 1, (4, 4, 4, 4)).astype(np.float32), config=QuantConfig(method="maxmin"),
                   target="DPUCZDX8G_ISA1_B512")
    (n,) = [n for n in res.prep.nodes if n.name == "reorg"]
    assert n.device == "CPU" and "256*CP = 2048" in n.reason
    q = Graph.deserialize(res.xmodel().serialize())
    assert q.ops["reorg"].type == "reorg"
    c = compile_graph(q, "DPUCZDX8G_ISA1_B512", name="big").graph
    assert [s.device for s in c.toposort_child_subgraphs()] == ["USER", "DPU", "CPU"]
    x = [np.random.default_rng(4).integers(-128, 128, (1, 4, 4, 4), dtype=np.int8)]
    want = GraphRunner(q, backend="ref").run(x).outputs
    got = GraphRunner(c, backend="sim", seed=1).run(x).outputs
    assert all(np.array_equal(np.asarray(got[k]), np.asarray(v)) for k, v in want.items())
