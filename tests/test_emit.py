"""compiler.emit against AMD's compiled models: each shared model is taken apart into the graph it was compiled from
and its programs (instructions, registers, DDR images, layers), partitioned by compiler.partition and written again
by compiler.emit; the result must have AMD's structure (subgraph tree, upload/download ops, tensor names, DDR
images, attribute names and AttrValue kinds, workloads) and run byte for byte like AMD's file. Also the layer map
encoding and emit's refusals."""
from __future__ import annotations

import numpy as np
import pytest

from opendpu.compiler.emit import (LAYER_MAP, EmitError, decode_layer_map, emit, encode_layer_map, layer_map_of,
                                   op_workload)
from opendpu.compiler.partition import partition
from opendpu.compiler.program import DdrImage, DpuProgram, Layer
from opendpu.compiler.xir import dpu_abi as abi
from opendpu.compiler.xir.graph import Graph
from opendpu.runtime.disasm import layer_names
from opendpu.runtime.dpu import DpuSubgraph
from opendpu.runtime.profile import profile_graph
from tests.conftest import MODEL_NAMES, model_path
from tests.test_partition import accept_all, amd_target, strip_compiled

DDR = ("reg_id", "ddr_addr", "location", "stride")
SMALL = ("dpu_mnist_classifier", "tf2_custom_op")


def canonical(g: Graph) -> Graph:
    """The graph AMD's model was compiled from, without the DDR images of its feature maps (consts keep theirs:
    their bytes live in the parameter blob)."""
    c = strip_compiled(g)
    for op in c.ops.values():
        if op.type not in ("const-fix", "const"):
            for k in DDR:
                op.output.attrs.pop(k, None)
                op.output.attrs.kinds.pop(k, None)
    return c


def amd_program(g: Graph, sg, canon: Graph, ops: list[str]) -> DpuProgram:
    """AMD's DPU subgraph as a DpuProgram over the canonical graph's op names."""
    d = DpuSubgraph(g, sg)
    fwd = {n: op.input_ops()[0] for n, op in g.ops.items() if op.type in ("upload", "download")}
    kids = [c for c in sg.children if not any(g.ops[n].type in ("upload", "download") for n in c.ops)]
    order = sg.attrs.get("children_topological_sort")
    kids.sort(key=lambda c: order.index(c.name) if c.name in order else len(order))
    layers = [Layer(c.name[len("subgraph_"):], list(c.ops)) for c in kids]
    names = layer_names(d)
    assert names is not None and len(names) == len(d.instructions)
    index = {c.name: i for i, c in enumerate(kids)}
    layer_of = [index[n] for n in names]

    def img(spec, op_name):
        return DdrImage(op_name, spec.reg_id, spec.ddr_addr, spec.dims, abi.image_strides(spec), spec.fix_point)
    ins = [img(s, fwd.get(s.op_name, s.op_name)) for s in d.inputs]
    outs = [img(s, fwd[s.op_name]) for s in d.outputs]
    internal = []
    for n in ops:
        t = g.ops[n].output
        if g.ops[n].type not in ("const-fix", "const") and t.attrs.get("location") == 1 and "stride" in t.attrs \
                and n not in {o.op_name for o in outs}:
            internal.append(img(abi.tensor_spec(t, n), n))
    # AMD's channel-augmented convs, recorded as the code generator records its choice (emit reads it from there)
    aug = [{"layer": n, "decision": "channel_augmentation", "chosen": "augmented", "cycles": {}}
           for n in ops if g.ops[n].attrs.get("channel_augmentation")]
    return DpuProgram(sg.name, d.target, list(d.instructions), layer_of, layers, abi.read_registers(sg), ins, outs,
                      internal, stats={"decisions": aug})


@pytest.fixture(scope="module", params=MODEL_NAMES)
def reemitted(request):
    g = Graph.load(model_path(request.param))
    canon = canonical(g)
    t = amd_target(g)
    part = partition(canon, t, accept_all)
    amd_dpu = [s for s in g.root.children if s.device == "DPU"]
    programs = {}
    for s in part.dpu_subgraphs:
        sg = next(a for a in amd_dpu if set(s.ops) <= set(a.all_ops()))
        programs[s.name] = amd_program(g, sg, canon, s.ops)
    out = emit(canon, part, programs, t)
    out = Graph.deserialize(out.serialize(), "re-emitted")        # what a reader of the file sees
    return request.param, g, out, part, programs


def by_ops(graph: Graph) -> dict:
    return {frozenset(s.all_ops()): s for s in graph.root.children}


def test_same_ops_tensors_and_subgraph_tree_as_amd(reemitted):
    name, g, out, part, _ = reemitted
    assert set(out.ops) == set(g.ops)                    # upload / download ops named as AMD names them
    for n, op in g.ops.items():
        mine = out.ops[n]
        assert mine.type == op.type and dict(mine.inputs) == dict(op.inputs), n
        assert mine.output.name == op.output.name, n       # download takes the tensor name, the op inside _download_0
        assert list(mine.output.shape) == list(op.output.shape)
        assert mine.attrs.get("device") == op.attrs.get("device"), n
    amd, ours = by_ops(g), by_ops(out)
    assert set(amd) == set(ours)
    for ops, s in amd.items():
        o = ours[ops]
        assert o.device == s.device
        assert [c.name for c in o.children] == [c.name for c in s.children]
        assert [sorted(c.ops) for c in o.children] == [sorted(c.ops) for c in s.children]
        if s.device == "DPU":
            assert o.attrs["children_topological_sort"] == s.attrs["children_topological_sort"]
    assert [s.device for s in out.toposort_child_subgraphs()] == [s.device for s in g.toposort_child_subgraphs()]


def test_dpu_subgraph_attributes_have_amds_names_and_kinds(reemitted):
    name, g, out, _, _ = reemitted
    amd, ours = by_ops(g), by_ops(out)
    for ops, s in amd.items():
        o = ours[ops]
        want = {k: s.attrs.kind(k) for k in s.attrs}
        got = {k: o.attrs.kind(k) for k in o.attrs if k != LAYER_MAP}
        assert got == want, s.name
        if s.device == "DPU":
            for k in ("device", "dpu_name", "dpu_fingerprint", "mc_code", "mc_code_preload", "reg_id_to_size",
                      "reg_id_to_context_type", "reg_id_to_context_type_v2", "reg_id_to_parameter_value",
                      "reg_id_to_hw_segment", "runner", "debug_mode"):
                assert o.attrs[k] == s.attrs[k], (s.name, k)
            assert o.attrs.kind(LAYER_MAP) == "map_string_2_int32_vec_value"
            for ca, co in zip(s.children, o.children):
                assert {k: co.attrs.kind(k) for k in co.attrs} == {k: ca.attrs.kind(k) for k in ca.attrs}


def test_workloads_are_amds(reemitted):
    """vai_c's workload and workload_on_arch: per op (AMD writes them on every DPU compute op; op_workload's
    formula, AMD's channel-augmented convs counted as such), on the re-emitted ops, per layer child, per subgraph."""
    name, g, out, _, _ = reemitted
    t = amd_target(g)
    n = 0
    for op in g.ops.values():
        if "workload" in op.attrs and op.attrs.get("device") == "DPU":
            want = (op.attrs["workload"], op.attrs["workload_on_arch"])
            assert op_workload(g, op, t, bool(op.attrs.get("channel_augmentation"))) == want, op.name
            mine = out.ops[op.name].attrs
            assert (mine["workload"], mine["workload_on_arch"], mine.get("channel_augmentation")) == \
                (*want, op.attrs.get("channel_augmentation")), op.name
            n += 1
    assert n
    amd, ours = by_ops(g), by_ops(out)
    for ops, s in amd.items():
        o = ours[ops]
        assert (o.attrs["workload"], o.attrs["workload_on_arch"]) == (s.attrs["workload"], s.attrs["workload_on_arch"])
        for ca, co in zip(s.children, o.children):
            assert (co.attrs["workload"], co.attrs["workload_on_arch"]) == \
                (ca.attrs["workload"], ca.attrs["workload_on_arch"]), ca.name


def test_ddr_images_read_back_as_amds(reemitted):
    """dpu_abi.read_* of the re-emitted subgraphs gives AMD's interface images, and the WORKSPACE tensors AMD
    stores carry AMD's reg_id / ddr_addr / stride (written from the program, not copied)."""
    name, g, out, _, programs = reemitted
    amd, ours = by_ops(g), by_ops(out)
    for ops, s in amd.items():
        if s.device != "DPU":
            continue
        o = ours[ops]
        for rd in (abi.read_inputs, abi.read_outputs):
            a, b = rd(g, s), rd(out, o)
            assert [(x.name, x.dims, x.reg_id, x.ddr_addr, abi.image_strides(x), x.fix_point, x.op_name) for x in a] \
                == [(x.name, x.dims, x.reg_id, x.ddr_addr, abi.image_strides(x), x.fix_point, x.op_name) for x in b]
    checked = 0
    for n, op in g.ops.items():
        t = op.output
        if op.type in ("const-fix", "const", "upload") or t.attrs.get("location") != 1 or "stride" not in t.attrs:
            continue
        mine = out.ops[n].output
        assert [mine.attrs.get(k) for k in DDR] == [t.attrs.get(k) for k in DDR], n
        checked += 1
    assert checked


def test_layer_map_is_the_programs(reemitted):
    name, g, out, _, programs = reemitted
    for s in out.root.children:
        if s.device != "DPU":
            continue
        prog = programs[s.name]
        names = layer_map_of(s, len(prog.instructions))
        assert names == [f"subgraph_{prog.layers[k].name}" for k in prog.layer_of]


def test_reemitted_model_runs_like_amds(reemitted):
    """sim and ref outputs of every DPU subgraph equal those of AMD's own file, byte for byte."""
    name, g, out, _, _ = reemitted
    if name not in SMALL:
        pytest.skip("the large models run in tests/test_runtime.py; the small ones suffice here")
    amd, ours = by_ops(g), by_ops(out)
    rng = np.random.default_rng(7)
    for ops, s in amd.items():
        if s.device != "DPU":
            continue
        da, do = DpuSubgraph(g, s), DpuSubgraph(out, ours[ops])
        xs = [rng.integers(-128, 128, size=t.dims, dtype=np.int8) for t in da.inputs]
        for a, b in zip(da.run_sim(xs), do.run_sim(xs)):
            assert np.array_equal(a, b)
        ra, _ = da.run_ref(xs)
        rb, _ = do.run_ref(xs)
        for a, b in zip(ra, rb):
            assert np.array_equal(a, b)


def test_profile_attributes_by_the_map(reemitted):
    """The profiler charges each instruction to the layer the map names (no inference)."""
    name, g, out, _, programs = reemitted
    if name not in SMALL:
        pytest.skip("timing the large models adds nothing here")
    prof = profile_graph(out)
    for sp in prof.subgraphs:
        prog = programs[sp.name]
        want = {f"subgraph_{ly.name}": 0 for ly in prog.layers}
        for k in prog.layer_of:
            want[f"subgraph_{prog.layers[k].name}"] += 1
        got = {ly.name: ly.instructions for ly in sp.layers}
        assert got == {k: v for k, v in want.items() if k in got} and sum(got.values()) == len(prog.instructions)


# ---- the layer map and emit's refusals ----------------------------------------------------------------------
def test_layer_map_round_trip_and_damage():
    names = ["a", "a", "b", "a", "c", "c", "c"]
    m = encode_layer_map(names)
    assert m == {"a": [0, 2, 3, 1], "b": [2, 1], "c": [4, 3]}
    assert decode_layer_map(m, 7) == names
    for bad, why in (({"a": [0, 2], "b": [1, 6]}, "belongs to"), ({"a": [0, 6]}, "without a layer"),
                     ({"a": [0, 8]}, "outside"), ({"a": [0]}, "pairs"), ([1, 2], "not a map")):
        with pytest.raises(EmitError, match=why):
            decode_layer_map(bad, 7)


def _mnist_parts():
    g = Graph.load(model_path("dpu_mnist_classifier"))
    canon = canonical(g)
    t = amd_target(g)
    part = partition(canon, t, accept_all)
    s = part.dpu_subgraphs[0]
    sg = next(a for a in g.root.children if a.device == "DPU")
    return canon, part, t, s, amd_program(g, sg, canon, s.ops)


def test_emit_refuses_a_program_that_does_not_fit_its_subgraph():
    canon, part, t, s, prog = _mnist_parts()
    emit(canon, part, {s.name: prog}, t)                      # as it is: fine

    def drop_op(p):
        p.layers[0].ops = p.layers[0].ops[1:]

    def no_outputs(p):
        p.outputs = []

    def short_map(p):
        p.layer_of = p.layer_of[:-1]

    def no_end(p):
        p.instructions, p.layer_of = p.instructions[:-1], p.layer_of[:-1]

    def input_in_const(p):
        p.inputs = [DdrImage(i.op_name, 0, i.ddr_addr, i.dims, i.strides, i.fix_point) for i in p.inputs]

    for damage, why in ((drop_op, "miss"), (no_outputs, "outputs"), (short_map, "layer indices"), (no_end, "END"),
                        (input_in_const, "CONST")):
        p = _mnist_parts()[4]
        damage(p)
        with pytest.raises((EmitError, abi.DpuAbiError), match=why):
            emit(canon, part, {s.name: p}, t)
    with pytest.raises(EmitError, match="has no program"):
        emit(canon, part, {}, t)
