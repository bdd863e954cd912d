"""Downsample back-propagation (compiler/downsample.py): which ops are rewritten, that the rewritten graph computes
the same outputs on the golden reference, and that its compiled programs equal the reference, are race-free and
take fewer cycles; checked on the Caffe ResNet-50 (where AMD's compiler does the same) and on the torchvision one
(where nothing may change)."""
import numpy as np
import pytest
from compile_helpers import compile_graph, graph_inputs, quantized, races, target
from test_compiled_programs import check_compiled

from opendpu.compiler.downsample import clone, downsample_bp
from opendpu.isa.program import to_arrays
from opendpu.runtime.runner import GraphRunner
from opendpu.sim.timing import simulate

SIZE = 32


def _ops(g, kind):
    return {n: op for n, op in g.ops.items() if op.type == kind}


def test_rewrite_caffe_resnet50():
    g = quantized("resnet50_caffe", SIZE)
    h = clone(g)
    lines = downsample_bp(h)
    # the last block of stages 2-4: the add on stride-2 picks, its branch2c 1x1 and its 3x3 branch2b at stride 2
    assert len(lines) == 9
    for blk, prev, size in (("res2c", "res2b", 8), ("res3d", "res3c", 4), ("res4f", "res4e", 2)):
        half = size // 2
        assert h.ops[f"{blk}_branch2b"].attrs["stride"] == [2, 2]
        assert h.ops[f"{blk}_branch2b"].output.shape == [1, half, half, h.ops[f"{blk}_branch2b"].output.shape[3]]
        assert h.ops[f"{blk}_branch2c"].attrs["stride"] == [1, 1]
        assert h.ops[f"{blk}"].inputs["input"] == [f"{prev}_downsample_bp", f"{blk}_branch2c"]
        pick = h.ops[f"{prev}_downsample_bp"]
        assert pick.type == "pool-fix" and pick.attrs["kernel"] == [1, 1] and pick.attrs["stride"] == [2, 2]
        assert pick.output.fix_point == h.ops[prev].output.fix_point
        nxt = f"res{int(blk[3]) + 1}a"
        assert h.ops[f"{nxt}_branch1"].attrs["stride"] == [1, 1] == h.ops[f"{nxt}_branch2a"].attrs["stride"]
        assert g.ops[f"{blk}_branch2b"].attrs["stride"] == [1, 1]      # the input graph is not touched
    assert len(_ops(h, "pool-fix")) == len(_ops(g, "pool-fix")) + 3
    # every output of the graph is unchanged on the golden reference (independent of the compiler)
    for seed in range(2):
        x = graph_inputs(g, seed)
        want = GraphRunner(g, backend="ref").run(x).outputs
        got = GraphRunner(h, backend="ref").run(x).outputs
        assert set(got) == set(want) and want
        for k in want:
            assert np.array_equal(got[k], want[k]), k
            assert np.abs(want[k].astype(np.int32)).sum() > 0


def test_nothing_to_do_on_torchvision_resnet50():
    """torchvision puts the stride on the 3x3 and reads the block input at full resolution too."""
    h = clone(quantized("resnet50", SIZE))
    assert downsample_bp(h) == []


def test_only_floor_windows_that_read_exactly_the_picked_pixels():
    """A reader in CEIL mode, or one whose output is not ceil(n / s) pixels, keeps its producer whole."""
    g = quantized("resnet50_caffe", SIZE)
    h = clone(g)
    h.ops["res3a_branch1"].attrs.set("pad_mode", "CEIL")
    lines = downsample_bp(h)
    assert len(lines) == 6 and h.ops["res2c_branch2b"].attrs["stride"] == [1, 1]
    assert h.ops["res3d_branch2b"].attrs["stride"] == [2, 2]
    h = clone(g)
    h.ops["res4a_branch2a"].output.shape[1] += 1           # claims one more row than the stride-2 picks give
    assert len(downsample_bp(h)) == 6 and h.ops["res3d_branch2b"].attrs["stride"] == [1, 1]


def test_protected_outputs_keep_their_resolution():
    g = quantized("resnet50_caffe", SIZE)
    h = clone(g)
    lines = downsample_bp(h, protected={"res2c", "res3d", "res4f"})
    assert lines == []


@pytest.mark.parametrize("key", ["B4096", "B512", "PP2"])
def test_compiled_caffe_resnet50_exact_race_free_and_faster(key):
    g = quantized("resnet50_caffe", SIZE)
    t = target(key)
    on = compile_graph(g, t, name="r")
    off = compile_graph(g, t, name="r", downsample_bp=False)
    assert any(n.endswith("_downsample_bp") for n in on.org.ops) and not any(n.endswith("_downsample_bp")
                                                                          for n in off.org.ops)
    # end to end on the sim backend against the reference of the graph as quantized (before any rewrite)
    x = graph_inputs(g, 3)
    want = GraphRunner(g, backend="ref").run(x).outputs
    got = GraphRunner(on.graph, backend="sim").run(x).outputs
    for k in want:
        assert np.array_equal(got[k], want[k]), k
    for p in on.programs.values():
        assert races(p.instructions, t) == []
    cyc = [sum(int(simulate(to_arrays(p.instructions), t).total_cycles) for p in r.programs.values())
           for r in (on, off)]
    assert cyc[0] < cyc[1], cyc
    work = [sum(p.workload for p in r.programs.values()) for r in (on, off)]
    assert work[0] < work[1], work


def test_compiled_caffe_resnet50_every_output_and_timing():
    """The compiled programs' every output and workspace tensor equals the reference, 0 races, same DDR bytes
    under random timing (tests/test_compiled_programs.py's check)."""
    g = quantized("resnet50_caffe", SIZE)
    stats = check_compiled("resnet50_caffe", SIZE, "B1024", [graph_inputs(g, 5)], timings=3)
    assert stats["programs"] >= 1 and stats["instructions"] > 1000
