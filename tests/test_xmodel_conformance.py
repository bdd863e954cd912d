"""xmodel conformance (issue 31 item 8): AMD's five shared ISA1 models recompiled by opendpu carry every attribute
AMD's carry, with AMD's AttrValue kinds and, where AMD's values follow a formula, AMD's values.

The analysis: per op type and device the op attribute names, per tensor kind (const, DPU input image, output
image, download, stored intermediate, on-chip intermediate, tensors outside the DPU) the tensor attribute names,
per subgraph level the subgraph attribute names, and the graph attribute names, each with its AttrValue kind, in
AMD's model and in ours. The diff must be empty except for the attributes listed in OURS_ONLY (each with its
reason). Values:
* `workload`, `workload_on_arch`, `channel_augmentation` of every op, and the workloads of the DPU, CPU and root
  subgraphs, equal AMD's (docs/compiler.md "xmodel attributes" has the formulas);
* where our memory layout is our own (const and feature-map addresses), the invariants: every const tensor's
  runs lie in the CONST register, inside what the program LOADs from it, disjoint, and read back as its data;
  every stored tensor's image lies in its register and, after the program ran on the simulator, holds the
  reference value of that tensor; every on-chip tensor is read only inside its own layer.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest

from opendpu.compiler.pipeline import compile as compile_graph
from opendpu.compiler.xir import dpu_abi as abi
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.footprint import program_footprints
from opendpu.runtime.dpu import DpuSubgraph, ddr_view, dpu_subgraphs
from tests.conftest import MODEL_NAMES, model_path

# attributes ours carry and AMD's do not, on purpose: {(what, key...): {name: reason}}
OURS_ONLY = {
    ("subgraph", "DPU"): {"opendpu_layer_map": "the exact instruction -> layer map, so profilers need no inference"},
    ("tensor", "const"): {abi.DDR_RUNS: "our weights lie per CONVW bank, so a const tensor may be several runs"},
}
# the root switches vai_c_xir 3.5 writes (the MNIST and YOLOX models); the VAI 3.0 models have none. Ours are 3.5's.
VAI35_ROOT = {"aie_tile_fusion_type", "concat_skip_code_gen", "enable_mt_fusion", "fusion", "hd_opt", "inspector",
              "preassign", "prefetch", "profile", "reserve_const_data"}
SMALL = ("dpu_mnist_classifier", "tf2_custom_op")          # small enough to run every program on the simulator


@pytest.fixture(scope="module", params=MODEL_NAMES)
def pair(request):
    """(name, AMD's graph, ours recompiled from it as a reader of the file sees it, the compile result)."""
    g = Graph.load(model_path(request.param))
    t = DpuSubgraph(g, dpu_subgraphs(g)[0]).target
    res = compile_graph(g, t, recompile=True, name="re")
    return request.param, g, Graph.deserialize(res.graph.serialize(), "ours"), res


# ---- the analysis ---------------------------------------------------------------------------------------------
def tensor_kind(g: Graph, n: str, dpu_ops: set[str]) -> str:
    """The role of op n's output tensor: const, upload (a DPU input image), download, output-image (a download's
    input), stored / on-chip (an intermediate with location 1 / 0), data (any other DPU tensor), outside."""
    op = g.ops[n]
    if n not in dpu_ops:
        return "outside"
    if op.type == "const-fix":
        return "const"
    if op.type in ("upload", "download"):
        return op.type
    if any(g.ops[c].type == "download" for c in g.consumers(n)):
        return "output-image"
    return {1: "stored", 0: "on-chip"}.get(op.output.attrs.get(abi.LOCATION), "data")


def signature(g: Graph) -> dict[tuple, tuple[dict[str, set[str]], set[str]]]:
    """{(what, key...): ({attribute name: AttrValue kinds} over all items, names every item carries)} over the
    whole graph: ops by (type, device), tensors by kind (tensor_kind), subgraphs by level, the graph."""
    items: dict[tuple, list] = defaultdict(list)
    dpu_ops = {n for s in dpu_subgraphs(g) for n in s.all_ops()}
    for n, op in g.ops.items():
        items[("op", op.type, "DPU" if n in dpu_ops else "CPU")].append(op.attrs)
        items[("tensor", tensor_kind(g, n, dpu_ops))].append(op.output.attrs)
    for s in g.root.walk():
        items[("subgraph", "root" if s is g.root else str(s.device) if s.parent is g.root else "DPU child")].append(
            s.attrs)
    items[("graph",)].append(g.attrs)
    out = {}
    for key, attrs in items.items():
        kinds: dict[str, set[str]] = defaultdict(set)
        for a in attrs:
            for k in a:
                kinds[k].add(a.kind(k))
        out[key] = (dict(kinds), set.intersection(*(set(a) for a in attrs)))
    return out


def attribute_diff(amd: Graph, ours: Graph) -> list[str]:
    """What AMD's model carries that ours lacks (on any item of a kind, or on one item where AMD's carry it on every
    item of that kind), carries in another AttrValue case, or what ours carries that AMD's lack beyond OURS_ONLY;
    [] when ours conforms."""
    a, o = signature(amd), signature(ours)
    vai35 = bool(VAI35_ROOT & set(a.get(("subgraph", "root"), ({}, set()))[0]))
    out = []
    for key in sorted(set(a) | set(o), key=str):
        if key not in o:
            out.append(f"{key}: ours has no such {key[0]} (AMD's carry {sorted(a[key][0])})")
            continue
        if key not in a:
            continue                                 # e.g. a tensor kind of our program AMD's program has not
        (ak, aall), (ok, oall) = a[key], o[key]
        allowed = set(OURS_ONLY.get(key, {}))
        if key == ("subgraph", "root") and not vai35:
            allowed |= VAI35_ROOT
        for k in sorted(set(ak) - set(ok)):
            out.append(f"{key}: AMD's carry {k!r}, ours do not")
        for k in sorted((aall & set(ok)) - oall):
            out.append(f"{key}: AMD's carry {k!r} on every one, ours not")
        for k in sorted(set(ok) - set(ak) - allowed):
            out.append(f"{key}: ours carry {k!r}, AMD's do not")
        for k in sorted(set(ak) & set(ok)):
            if ak[k] != ok[k]:
                out.append(f"{key}: {k!r} is {sorted(ok[k])} in ours, {sorted(ak[k])} in AMD's")
    return out


def test_attribute_diff_against_amd_is_empty(pair):
    name, g, ours, _ = pair
    assert attribute_diff(g, ours) == []


def test_the_diff_sees_a_missing_attribute(pair):
    """The analysis fails a model that lacks one of AMD's attributes, or carries one AMD's do not."""
    name, g, ours, _ = pair
    h = Graph.deserialize(ours.serialize(), "damaged")
    conv = next(op for op in h.ops.values() if op.type == "conv2d-fix")
    del conv.attrs["workload_on_arch"]
    const = next(op for op in h.ops.values() if op.type == "const-fix" and abi.LOCATION in op.output.attrs)
    del const.output.attrs[abi.LOCATION]
    conv.attrs.set("opendpu_extra", 1, "int32_value")
    diff = attribute_diff(g, h)
    assert any("'workload_on_arch'" in d for d in diff) and any("'location'" in d for d in diff), diff
    assert any("'opendpu_extra'" in d for d in diff)


# ---- values AMD's formulas give -------------------------------------------------------------------------------
OP_VALUES = ("workload", "workload_on_arch", "channel_augmentation")


def test_op_workloads_and_channel_augmentation_are_amds(pair):
    """Every op's workload, workload_on_arch and channel_augmentation equal AMD's (the same convs are augmented)."""
    name, g, ours, _ = pair
    n = 0
    for op_name, op in g.ops.items():
        mine = ours.ops[op_name]
        want = {k: op.attrs[k] for k in OP_VALUES if k in op.attrs}
        assert {k: mine.attrs[k] for k in OP_VALUES if k in mine.attrs} == want, (op_name, op.type)
        n += bool(want)
    assert n >= 4


def test_subgraph_workloads_are_amds(pair):
    """The DPU and CPU subgraphs' and the root's workload and workload_on_arch equal AMD's (our layers differ
    from AMD's superlayers, so the layer children are checked only to add up to their subgraph)."""
    name, g, ours, _ = pair

    def by_ops(graph: Graph) -> dict:
        skip = ("upload", "download")
        return {frozenset(x for x in s.all_ops() if graph.ops[x].type not in skip): s for s in graph.root.children}
    amd, mine = by_ops(g), by_ops(ours)
    for ops, s in amd.items():
        o = mine[ops]
        for k in ("workload", "workload_on_arch"):
            assert o.attrs[k] == s.attrs[k], (s.name, k)
            assert sum(c.attrs[k] for c in o.children) == (o.attrs[k] if o.children else 0), (o.name, k)
    for k in ("workload", "workload_on_arch"):
        assert ours.root.attrs[k] == g.root.attrs[k]


def test_root_switches_are_vai35s_kinds_with_our_values(pair):
    name, g, ours, res = pair
    r = ours.root.attrs
    assert r["fusion"] is True and r["hd_opt"] is False and r["prefetch"] is False and r["reserve_const_data"] is True
    assert (r["concat_skip_code_gen"], r["preassign"], r["enable_mt_fusion"], r["inspector"], r["profile"]) == \
        (True, True, False, False, False)
    assert r["aie_tile_fusion_type"] == []


# ---- values of our own layout: the invariants -----------------------------------------------------------------
def test_const_tensors_lie_in_the_const_register_and_read_back(pair):
    """Each const tensor of a DPU subgraph: reg_id the CONST register, location 1, its runs inside the bytes the
    program LOADs from that register, disjoint from every other const tensor's, and its bytes read back."""
    name, g, ours, res = pair
    for s in dpu_subgraphs(ours):
        regs = abi.read_registers(s)
        (reg,) = [r for r, c in regs.context.items() if c == abi.CONST]
        blob = regs.params[reg]
        d = DpuSubgraph(ours, s)
        loaded = np.zeros(len(blob), bool)
        for ins, fp in zip(d.instructions, program_footprints(d.instructions, d.target)):
            if ins.op == "LOAD":
                for r, lo, hi in fp.reads.ddr_ranges():
                    loaded[lo:hi] |= r == reg
        owner = np.full(len(blob), -1)
        consts = [ours.ops[n] for n in s.all_ops() if ours.ops[n].type == "const-fix"]
        assert consts
        for k, op in enumerate(consts):
            t = op.output
            assert (t.attrs.get(abi.REG_ID), t.attrs.get(abi.LOCATION)) == (reg, 1), op.name
            data = bytes(op.attrs["data"])
            runs = abi.const_runs(t, len(data))
            assert runs[0][0] == t.attrs[abi.DDR_ADDR]
            for a, n in runs:
                assert 0 <= a and a + n <= len(blob) and loaded[a:a + n].all(), (op.name, a, n)
                assert (owner[a:a + n] == -1).all(), (op.name, "overlaps", consts[owner[a:a + n].max()].name)
                owner[a:a + n] = k
            assert abi.read_const_bytes(t, blob, len(data)) == data, op.name


@pytest.mark.parametrize("name", ["dpu_mnist_classifier"])
def test_stripped_const_data_is_read_from_the_runs(name):
    """AMD ships compiled models with the const data stripped (`data` empty, the bytes only in the parameter blob).
    Ours stripped the same way run exactly as before on `ref`, through both readers of the blob: the runtime's
    (DpuSubgraph.const_data) and the recompile front end's (canonicalize of a compiled model), DDR_RUNS included."""
    from opendpu.compiler.frontend import canonicalize
    from opendpu.runtime.runner import GraphRunner
    g = Graph.load(model_path(name))
    t = DpuSubgraph(g, dpu_subgraphs(g)[0]).target
    ours = Graph.deserialize(compile_graph(g, t, recompile=True, name="re").graph.serialize(), "ours")
    stripped = Graph.deserialize(ours.serialize(), "stripped")
    consts = [op for op in stripped.ops.values() if op.type == "const-fix"]
    assert any(abi.DDR_RUNS in op.output.attrs for op in consts)      # the several-run form is exercised
    for op in consts:
        op.attrs.set("data", b"", op.attrs.kind("data"))
    assert all(op.attrs.get("data") == b"" for op in consts)
    rng = np.random.default_rng(0)
    runs = [GraphRunner(x, "ref") for x in (ours, stripped, canonicalize(stripped, "again"))]
    ins = {s.op_name: rng.integers(-128, 128, s.dims, dtype=np.int8) if s.dtype == "xint8"
           else rng.standard_normal(s.dims).astype(np.float32) for s in runs[0].get_inputs()}
    want = runs[0].run(ins).outputs
    for r in runs[1:]:
        got = r.run(ins).outputs
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)


def _layer_of(ours: Graph, s) -> dict[str, str]:
    return {n: c.name for c in s.children for n in c.ops}


def test_feature_map_images_lie_in_their_registers(pair):
    """Every stored DPU tensor's image lies inside a data register; every on-chip one (location 0) names a data
    register, has ddr_addr 0 and no stride, and is read only by ops of its own layer."""
    name, g, ours, _ = pair
    n_on_chip = 0
    for s in dpu_subgraphs(ours):
        regs = abi.read_registers(s)
        layer = _layer_of(ours, s)
        for n in s.all_ops():
            op = ours.ops[n]
            t = op.output
            if op.type == "const-fix" or abi.REG_ID not in t.attrs:
                continue
            reg = t.attrs[abi.REG_ID]
            assert regs.context.get(reg) not in (None, abi.CONST), n
            if t.attrs[abi.LOCATION] == 1:
                abi.image_extent(abi.tensor_spec(t, n), regs.sizes[reg], "stored")
            else:
                assert t.attrs[abi.LOCATION] == 0 and t.attrs[abi.DDR_ADDR] == 0 and abi.STRIDE not in t.attrs, n
                assert all(layer.get(c) == layer[n] for c in ours.consumers(n)), n
                n_on_chip += 1
    assert n_on_chip or name in ("dpu_mnist_classifier",)


def test_stored_tensors_hold_their_reference_values(pair):
    """After each DPU program ran on the simulator, every tensor with location 1 holds, at its image, the value the
    XIR reference computes for it (the concat members, the aliases' sources and the stored intermediates)."""
    name, g, ours, _ = pair
    if name not in SMALL:
        pytest.skip("the large models take minutes on the simulator; tests/test_xmodel_conformance.py's zoo test "
                    "covers concat members")
    rng = np.random.default_rng(5)
    for s in dpu_subgraphs(ours):
        _check_stored_values(ours, s, rng)


def _check_stored_values(graph: Graph, s, rng) -> int:
    d = DpuSubgraph(graph, s)
    xs = [rng.integers(-128, 128, size=i.dims, dtype=np.int8) for i in d.inputs]
    m = d.new_machine()
    d.run_sim(xs, machine=m)
    _, ref = d.run_ref(xs, keep=True)
    n = 0
    for op_name in s.all_ops():
        op = graph.ops[op_name]
        t = op.output
        if op.type in ("const-fix", "upload", "download") or t.attrs.get(abi.LOCATION) != 1:
            continue
        spec = abi.tensor_spec(t, op_name)
        got = np.array(ddr_view(m.ddr(spec.reg_id), spec, "stored"), dtype=np.int8)
        assert np.array_equal(got, ref[op_name].reshape(got.shape)), op_name
        n += 1
    return n


@pytest.mark.parametrize("model,size", [("squeezenet", 32), ("tiny_yolo", 64)])
def test_zoo_concat_members_hold_their_values(model, size):
    """Concat members written in place (squeezenet's fire modules, tiny-YOLO's route) and every other stored
    tensor hold their reference values at the images emit gives them."""
    from tests.compile_helpers import quantized
    q = quantized(model, size)
    res = compile_graph(q, "DPUCZDX8G_ISA1_B512", name="z")
    ours = Graph.deserialize(res.graph.serialize(), "ours")
    members = [n for n, op in ours.ops.items() if op.type == "concat-fix"
               for i in op.input_ops() if ours.ops[i].type not in ("upload",)
               and ours.ops[i].output.attrs.get(abi.REG_ID) == op.output.attrs.get(abi.REG_ID)
               and ours.ops[i].output.attrs.get(abi.STRIDE) == op.output.attrs.get(abi.STRIDE)]
    assert members
    rng = np.random.default_rng(2)
    assert sum(_check_stored_values(ours, s, rng) for s in dpu_subgraphs(ours))


# ---- the const finder on a layout built here ------------------------------------------------------------------
def test_const_runs_found_in_a_bank_layout_with_zero_rows():
    """Weights laid out as the code generator lays them (per bank o the rows o, o+P, ..., 64-byte aligned), two
    of them all zero and a zero bias beside them: every row is found where it is, no byte twice, the bias apart."""
    from opendpu.compiler.emit import _Claims
    rng = np.random.default_rng(1)
    oc, row, p = 10, 12, 4
    w = rng.integers(-128, 128, size=(oc, row), dtype=np.int8)
    w[[3, 7]] = 0
    blob, where = bytearray(), {}
    for o in range(p):
        blob += bytes(-len(blob) % 64)
        for r in range(o, oc, p):
            where[r] = len(blob)
            blob += w[r].tobytes()
    blob += bytes(-len(blob) % 64)
    bias_at = len(blob)
    blob += bytes(oc)                                 # a zero bias
    claims = _Claims(bytes(blob), [(where[r], where[r] + row) for r in range(oc)] + [(bias_at, bias_at + oc)])
    for careful in (False, True):
        claims.taken.clear()
        runs = claims.runs(w.tobytes(), row, careful)
        assert runs is not None
        got = b"".join(bytes(blob[a:a + n]) for a, n in runs)
        assert got == w.tobytes()
        assert claims.runs(bytes(oc), oc, careful) == [(bias_at, oc)], careful
    claims.taken.clear()                              # row 0 is found, the next row nowhere: nothing stays claimed
    assert claims.runs(w.tobytes()[:row] + bytes([1] * row), row) is None and claims.taken == []


def test_const_runs_attribute_round_trip_and_damage():
    from opendpu.compiler.xir.graph import Tensor
    t = Tensor("w", [2, 3], "XINT", 8)
    abi.write_const_image(t, 0, [(64, 3), (10, 3)])
    assert t.attrs[abi.DDR_ADDR] == 64 and t.attrs[abi.DDR_RUNS] == [64, 3, 10, 3]
    blob = bytes(range(100))
    assert abi.read_const_bytes(t, blob, 6) == bytes([64, 65, 66, 10, 11, 12])
    abi.write_const_image(u := Tensor("b", [3], "XINT", 8), 0, [(7, 3)])
    assert abi.DDR_RUNS not in u.attrs and abi.read_const_bytes(u, blob, 3) == bytes([7, 8, 9])
    with pytest.raises(abi.DpuAbiError, match="pairs"):
        abi.const_runs(t, 7)
    with pytest.raises(abi.DpuAbiError, match="beyond"):
        abi.read_const_bytes(t, blob[:20], 6)
