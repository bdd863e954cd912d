"""compiler.partition: placement of every op (rules + the code generator's refusals), DPU/CPU grouping without
cycles between subgraphs, USER subgraphs, consts with their consumers, the vai_c summary line; checked on hand-built
graphs and against the partition AMD's compiler made of the five shared models."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from opendpu.compiler import codegen
from opendpu.compiler.partition import CPU, DPU, USER, PartitionError, partition, place_op
from opendpu.compiler.xir.graph import Graph, Subgraph, Tensor
from opendpu.isa.target import Target, get_target
from tests.conftest import MODEL_NAMES, model_path

B4096 = get_target("DPUCZDX8G_ISA1_B4096")
B512 = get_target("DPUCZDX8G_ISA1_B512")


def accept_all(graph, op, target):
    return None


def fix_t(name: str, shape, fp: int = 4) -> Tensor:
    t = Tensor(name, list(shape))
    t.attrs.set("fix_point", fp)
    t.attrs.set("bit_width", 8)
    t.attrs.set("if_signed", True)
    t.attrs.set("round_mode", "DPU_ROUND")
    return t


class G:
    """A tiny builder of quantized XIR graphs (NHWC, the quantizer's op forms)."""

    def __init__(self, name="t"):
        self.g = Graph(name)

    def shape(self, n):
        return list(self.g.ops[n].output.shape)

    def data(self, n, shape=(1, 8, 8, 4)):
        self.g.add_op(n, "data-fix", {}, {"shape": list(shape), "data_type": "XINT8"}, fix_t(n, shape, 6))
        return n

    def const(self, n, shape, fp=6):
        data = np.zeros(int(np.prod(shape)), np.int8).tobytes()
        self.g.add_op(n, "const-fix", {}, {"data": data, "data_type": "XINT8", "shape": list(shape)},
                      fix_t(n, shape, fp))
        return n

    def conv(self, n, x, oc=8, k=3, nl="RELU"):
        ic = self.shape(x)[-1]
        w = self.const(f"{n}_weights", [oc, k, k, ic])
        b = self.const(f"{n}_bias", [oc], 8)
        h, wd = self.shape(x)[1:3]
        p = (k - 1) // 2
        self.g.add_op(n, "conv2d-fix", {"input": [x], "weights": [w], "bias": [b]},
                      {"kernel": [k, k], "stride": [1, 1], "pad": [p, p, p, p], "dilation": [1, 1], "group": 1,
                       "nonlinear": nl, "pad_mode": "FLOOR"}, fix_t(n, [1, h, wd, oc], 4))
        return n

    def add(self, n, xs):
        self.g.add_op(n, "eltwise-fix", {"input": list(xs)}, {"type": "ADD", "nonlinear": "NONE"},
                      fix_t(n, self.shape(xs[0]), 3))
        return n

    def fix2float(self, n, x):
        self.g.add_op(n, "fix2float", {"input": [x]}, {"fix_point": 4}, Tensor(n, self.shape(x), 4, 32))
        return n

    def float_op(self, n, typ, xs):
        self.g.add_op(n, typ, {"input": list(xs)}, {}, Tensor(n, self.shape(xs[0]), 4, 32))
        return n

    def float2fix(self, n, x, fp=4):
        self.g.add_op(n, "float2fix", {"input": [x]}, {"fix_point": fp}, fix_t(n, self.shape(x), fp))
        return n


def quotient_is_acyclic(graph: Graph, subgraph_of: dict[str, str]) -> bool:
    """Kahn's algorithm on the subgraph graph built from the op edges (independent of the partitioner)."""
    nodes = set(subgraph_of.values())
    edges = {s: set() for s in nodes}
    for op in graph.ops.values():
        for p in op.input_ops():
            a, b = subgraph_of[p], subgraph_of[op.name]
            if a != b:
                edges[a].add(b)
    indeg = {s: 0 for s in nodes}
    for a in edges:
        for b in edges[a]:
            indeg[b] += 1
    ready = [s for s in nodes if indeg[s] == 0]
    seen = 0
    while ready:
        s = ready.pop()
        seen += 1
        for b in edges[s]:
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    return seen == len(nodes)


def same_subgraph(part, *ops) -> bool:
    return len({part.subgraph_of[o] for o in ops}) == 1


# ---- hand-built graphs -----------------------------------------------------------------------------------------
def test_cpu_op_in_the_middle_splits_the_dpu_ops():
    b = G()
    x = b.data("x")
    c1 = b.conv("c1", x)
    f = b.fix2float("c1_float", c1)
    e = b.float_op("mylayer", "Mylayer", [f])
    q = b.float2fix("mylayer_fix", e)
    b.conv("c2", q)
    part = partition(b.g, B4096)                 # the real code generator's refusal hook
    assert part.summary() == "Total device subgraph number 4, DPU subgraph number 2"
    assert [s.device for s in part.subgraphs] == [USER, DPU, CPU, DPU]
    assert [s.name for s in part.subgraphs] == ["subgraph_x", "subgraph_c1", "subgraph_mylayer", "subgraph_c2"]
    assert set(part.subgraphs[1].ops) == {"c1", "c1_weights", "c1_bias"}   # consts go with their consumer
    assert set(part.subgraphs[2].ops) == {f, e, q}
    assert quotient_is_acyclic(b.g, part.subgraph_of)
    cpu = {n: p.reason for n, t, p in part.cpu_ops}
    assert set(cpu) == {f, e, q}
    assert "mylayer" in cpu[e].lower() and "not supported by the DPU" in cpu[e]
    assert cpu[f].startswith("fix2float") and cpu[q].startswith("float2fix")
    rep = "\n".join(part.report())
    assert rep.splitlines()[0] == part.summary() and "CPU op mylayer (Mylayer)" in rep


def test_a_path_through_the_cpu_keeps_two_dpu_ops_apart():
    """c1 -> c3 directly and c1 -> CPU -> c3: merging c1 and c3 would make a cycle DPU -> CPU -> DPU."""
    b = G()
    x = b.data("x")
    c1 = b.conv("c1", x)
    q = b.float2fix("back", b.float_op("exp", "exp", [b.fix2float("c1_f", c1)]))
    c3 = b.add("c3", [c1, q])
    part = partition(b.g, B4096, accept_all)
    assert not same_subgraph(part, c1, c3)
    assert quotient_is_acyclic(b.g, part.subgraph_of)
    assert len(part.dpu_subgraphs) == 2


def test_merge_picks_the_group_that_closes_no_cycle():
    """c2 reads a and the CPU branch; d reads both: d may join c2's group but not a's (a -> CPU -> c2 -> d)."""
    b = G()
    x = b.data("x")
    a = b.conv("a", x)
    a2 = b.conv("a2", a)
    q = b.float2fix("q", b.float_op("sig", "sigmoid", [b.fix2float("a_f", a)]))
    c2 = b.conv("c2", q)
    d = b.add("d", [a2, c2])
    part = partition(b.g, B4096, accept_all)
    assert same_subgraph(part, a, a2) and same_subgraph(part, c2, d) and not same_subgraph(part, a, d)
    assert quotient_is_acyclic(b.g, part.subgraph_of)
    assert part.summary() == "Total device subgraph number 4, DPU subgraph number 2"


def test_branches_joined_by_a_dpu_op_form_one_subgraph():
    b = G()
    x = b.data("x")
    d = b.add("d", [b.conv("l", x), b.conv("r", x)])
    part = partition(b.g, B512, accept_all)
    assert len(part.dpu_subgraphs) == 1 and same_subgraph(part, "l", "r", d)
    assert part.subgraphs[0].device == USER and part.subgraphs[0].ops == ["x"]


def test_every_data_op_is_its_own_user_subgraph_and_placement_is_logged():
    b = G()
    x, y = b.data("x"), b.data("y")
    b.add("sum", [b.conv("cx", x), b.conv("cy", y)])
    part = partition(b.g, B4096, accept_all)
    users = [s for s in part.subgraphs if s.device == USER]
    assert [s.ops for s in users] == [["x"], ["y"]]
    assert part.placement["x"].device == USER and part.placement["cx_weights"].device == ""
    assert part.placement["cx"].device == DPU and "CONV" in part.placement["cx"].reason


def test_code_generator_refusal_moves_the_op_to_the_cpu_with_its_reason():
    b = G()
    x = b.data("x")
    c1 = b.conv("c1", x)
    c2 = b.conv("c2", c1)
    c3 = b.conv("c3", c2)

    def refuse_c2(graph, op, target):
        return "tile too large for the test" if op == "c2" else None
    part = partition(b.g, B4096, refuse_c2)
    assert part.placement["c2"].device == CPU
    assert part.placement["c2"].reason == "the code generator cannot compile it: tile too large for the test"
    assert [n for n, _, _ in part.cpu_ops] == ["c2"]
    assert not same_subgraph(part, c1, c3) and len(part.dpu_subgraphs) == 2
    assert part.subgraph_of["c2_weights"] == part.subgraph_of["c2"]    # its consts follow it to the CPU


def test_the_default_hook_is_the_code_generator():
    """Every -fix op the rules put on the DPU is on the DPU exactly when codegen.unsupported accepts it."""
    b = G()
    x = b.data("x")
    c1 = b.conv("c1", x)
    b.g.add_op("dil", "conv2d-fix", {"input": [c1], "weights": [b.const("dw", [8, 3, 3, 8])],
                                     "bias": [b.const("db", [8])]},
               {"kernel": [3, 3], "stride": [1, 1], "pad": [2, 2, 2, 2], "dilation": [2, 2], "group": 1,
                "nonlinear": "NONE"}, fix_t("dil", [1, 8, 8, 8]))
    part = partition(b.g, B4096)
    for n in ("c1", "dil"):
        why = codegen.unsupported(b.g, n, B4096)
        assert (part.placement[n].device == DPU) == (why is None)
        if why:
            assert why in part.placement[n].reason


def test_float_ops_stay_on_the_cpu_even_when_the_dpu_could_run_them():
    b = G()
    x = b.data("x")
    r = b.float_op("relu_f", "relu", [b.fix2float("xf", x)])
    part = partition(b.g, B4096, accept_all)
    assert part.placement[r].device == CPU and "not quantized" in part.placement[r].reason
    assert len(part.dpu_subgraphs) == 0 and part.summary().endswith("DPU subgraph number 0")


def test_shared_const_and_compiled_graphs_are_refused():
    b = G()
    x = b.data("x")
    c1 = b.conv("c1", x)
    q = b.float2fix("q", b.float_op("e", "exp", [b.fix2float("f", c1)]))
    w = "c1_weights"
    b.g.add_op("c2", "conv2d-fix", {"input": [q], "weights": [w], "bias": ["c1_bias"]},
               dict(b.g.ops["c1"].attrs), fix_t("c2", [1, 8, 8, 8]))
    with pytest.raises(PartitionError, match="c1_(weights|bias).*different subgraphs"):
        partition(b.g, B4096, accept_all)
    g = Graph.load(model_path("dpu_mnist_classifier"))
    with pytest.raises(PartitionError, match="already compiled"):
        place_op(g, "input_1_upload_0", B4096, accept_all)


# ---- against AMD's partitions ------------------------------------------------------------------------------
def strip_compiled(g: Graph) -> Graph:
    """An AMD compiled graph -> the graph it was compiled from: upload/download ops removed (their readers read the
    op they forward; the op inside a download gets the download's tensor name back), no subgraph tree."""
    h = Graph.deserialize(g.serialize(), g.name)
    alias: dict[str, str] = {}
    for n, op in h.ops.items():
        if op.type in ("upload", "download"):
            src = op.input_ops()[0]
            alias[n] = alias.get(src, src)
            if op.type == "download":
                h.ops[alias[n]].output.name = op.output.name
    for n in list(h.ops):
        if n in alias:
            del h.ops[n]
        else:
            op = h.ops[n]
            op.inputs = OrderedDict((k, [alias.get(p, p) for p in v]) for k, v in op.inputs.items())
    h.root = Subgraph("root")
    h._consumers = None
    h._link_subgraphs()
    h.validate()
    return h


def amd_target(g: Graph) -> Target:
    sg = next(s for s in g.root.children if s.device == "DPU")
    return Target.from_fingerprint(int(sg.attrs["dpu_fingerprint"]))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_same_subgraphs_as_amds_compiler(name):
    """With every -fix op the rules accept compiled, the partition of the five shared models is AMD's: the same
    devices and op sets (upload/download ops aside); names where AMD names by the first compute op."""
    g = Graph.load(model_path(name))
    part = partition(strip_compiled(g), amd_target(g), accept_all)
    amd = sorted((s.device, tuple(sorted(n for n in s.all_ops() if g.ops[n].type not in ("upload", "download"))))
                 for s in g.root.children)
    ours = sorted((s.device, tuple(sorted(s.ops))) for s in part.subgraphs)
    assert ours == amd
    assert part.summary() == (f"Total device subgraph number {len(g.root.children)}, DPU subgraph number "
                              f"{sum(s.device == 'DPU' for s in g.root.children)}")
    assert quotient_is_acyclic(part.graph, part.subgraph_of)
    if name in ("dpu_mnist_classifier", "tf2_custom_op"):
        assert [s.name for s in part.subgraphs] == [s.name for s in g.toposort_child_subgraphs()]
