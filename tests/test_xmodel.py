"""xmodel container: faithful round-trip of the real files, IR invariants, corrupted files."""
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opendpu.compiler.xir import xir_pb2 as pb
from opendpu.compiler.xir.graph import Attrs, Graph, Subgraph, Tensor, XModelError
from opendpu.runtime.dpu import DpuSubgraph, RuntimeErrorDPU
from tests.conftest import MODEL_NAMES, model_path


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_roundtrip_decodes_identically(name, tmp_path):
    p = model_path(name)
    raw = open(p, "rb").read()
    g = Graph.load(p)
    out = tmp_path / "x.xmodel"
    g.save(str(out))
    a, b = pb.Graph(), pb.Graph()
    a.ParseFromString(raw)
    b.ParseFromString(out.read_bytes())
    assert a == b                           # every op, tensor, attribute (with its kind), subgraph, op_def
    assert len(out.read_bytes()) == len(raw)   # nothing dropped (no unknown fields, no lost attributes)


def test_mnist_structure(mnist_path):
    g = Graph.load(mnist_path)
    devs = [(s.name, s.device) for s in g.toposort_child_subgraphs()]
    assert [d for _, d in devs] == ["USER", "DPU", "CPU"]
    dpu = DpuSubgraph(g, g.toposort_child_subgraphs()[1])
    assert [(t.name, t.dims, t.fix_point, t.reg_id, t.ddr_addr) for t in dpu.inputs] == \
        [("quant_input_1", (1, 28, 28, 1), 6, 2, 0)]
    assert [(t.name, t.dims, t.fix_point, t.reg_id) for t in dpu.outputs] == \
        [("quant_dense_1_softmax_fix", (1, 10), 2, 3)]
    assert dpu.reg_sizes == {0: 712704, 1: 5536, 2: 784, 3: 16}
    w = dpu.const_data(g.ops["quant_conv2d_weights"])
    assert w.shape == (32, 3, 3, 1) and w.dtype.name == "int8"


def test_build_and_save_a_graph(tmp_path):
    g = Graph("tiny")
    g.add_op("x", "data-fix", attrs={"shape": [1, 4, 4, 8]},
             output=Tensor("x", [1, 4, 4, 8], attrs=Attrs(fix_point=4)))
    g.add_op("y", "pool-fix", {"input": ["x"]}, {"type": "MAX", "kernel": [2, 2], "stride": [2, 2]},
             Tensor("y", [1, 2, 2, 8], attrs=Attrs(fix_point=4)))
    g.root.children = [Subgraph("s0", ["x"], Attrs(device="USER")), Subgraph("s1", ["y"], Attrs(device="DPU"))]
    g.attrs.set("workload", 3, "uint64_value")
    g.save(str(tmp_path / "t.xmodel"))
    h = Graph.load(str(tmp_path / "t.xmodel"))
    assert h.toposort() == ["x", "y"] and h.ops["y"].attrs["kernel"] == [2, 2]
    assert h.attrs.kinds["workload"] == "uint64_value" and h.ops["x"].output.fix_point == 4
    with pytest.raises(XModelError, match="XIR_OP_NAME_CONFLICT"):
        g.add_op("x", "relu")
    with pytest.raises(XModelError, match="unknown op 'nope'"):
        g.add_op("z", "relu", {"input": ["nope"]})


def test_not_an_xmodel(tmp_path):
    p = tmp_path / "a.xmodel"
    p.write_bytes(b"\x89PNG not a graph at all \xff\xfe")
    with pytest.raises(XModelError, match="not an xmodel"):
        Graph.load(str(p))
    with pytest.raises(XModelError, match="cannot read xmodel"):
        Graph.load(str(tmp_path / "missing.xmodel"))


_MNIST_RAW = None


def _raw():
    global _MNIST_RAW
    if _MNIST_RAW is None:
        _MNIST_RAW = open(model_path("dpu_mnist_classifier"), "rb").read()
    return _MNIST_RAW


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_xmodels_give_documented_errors(data):
    raw = bytearray(_raw())
    kind = data.draw(st.sampled_from(["truncate", "flip", "splice"]))
    if kind == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= data.draw(st.integers(1, 255))
    else:
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i:i + 64] = data.draw(st.binary(min_size=1, max_size=64))
    try:
        g = Graph.deserialize(bytes(raw), "corrupt.xmodel")
        for s in g.root.children:
            if s.device == "DPU":
                DpuSubgraph(g, s)
    except (XModelError, RuntimeErrorDPU):
        pass


def test_serialization_is_reproducible_across_processes():
    """The same graph gives the same bytes in every process (protobuf map order does not follow the hash seed)."""
    import os
    import subprocess
    import sys
    code = ("import hashlib, sys\nfrom opendpu.compiler.xir.graph import Graph\n"
            "print(hashlib.md5(Graph.load(sys.argv[1]).serialize()).hexdigest())")
    path = model_path("tf2_custom_op")
    digests = set()
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        digests.add(r.stdout.strip())
    assert len(digests) == 1


def test_toposort_counts_a_producer_used_twice_once():
    """Add(x, x) lists its producer twice; that is one dependency, not a cycle."""
    from opendpu.compiler.xir.graph import Graph, Tensor
    g = Graph("twice")
    g.add_op("x", "data-fix", {}, {"shape": [1, 2, 2, 1]}, Tensor("x", [1, 2, 2, 1]))
    g.add_op("y", "eltwise-fix", {"input": ["x", "x"]}, {"type": "ADD"}, Tensor("y", [1, 2, 2, 1]))
    g.add_op("z", "eltwise-fix", {"input": ["y"]}, {"type": "ADD"}, Tensor("z", [1, 2, 2, 1]))
    assert g.toposort() == ["x", "y", "z"]
