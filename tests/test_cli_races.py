"""`opendpu races`: AMD's token streams order every conflict; a stream stripped of its cross-engine tokens does not."""
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.deps import bit
from opendpu.isa.program import Instruction, decode, encode
from opendpu.runtime.cli import main as cli
from tests.conftest import model_path


def test_amd_streams_are_race_free(capsys):
    for name in ("dpu_mnist_classifier", "tf2_custom_op"):
        assert cli(["races", model_path(name)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out and all(ln.startswith("RACE-FREE ") for ln in out)


def test_stripped_tokens_are_reported(tmp_path, capsys):
    g = Graph.load(model_path("dpu_mnist_classifier"))
    sg = next(s for s in g.root.children if s.device == "DPU")
    instrs = decode(bytes(sg.attrs["mc_code"]))
    own = [Instruction(x.op, x.dpdon & bit(x.engine), x.dpdby & bit(x.engine), x.fields) for x in instrs]
    sg.attrs.set("mc_code", encode(own), sg.attrs.kinds["mc_code"])
    bad = tmp_path / "stripped.xmodel"
    g.save(str(bad))
    assert cli(["races", str(bad), "--limit", "3"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("RACES subgraph_quant_conv2d: 230 instructions") and "(first 3)" in out[0]
    assert len(out) == 4
    # each reported race is a real conflict: the named line or byte is written by one and touched by the other
    from opendpu.isa.deps import KeySpace
    from opendpu.isa.footprint import program_footprints
    from opendpu.runtime.dpu import DpuSubgraph
    d = DpuSubgraph(g, sg)
    fps = program_footprints(own, d.target, d.reg_sizes)
    space = KeySpace(d.target)
    for ln in out[1:]:
        kind, _, i, _, _, _, j = ln.split()[:7]
        i, j = int(i), int(j)
        assert kind in ("RAW", "WAR", "WAW") and i < j and ln.endswith("no token path orders them")
        assert instrs[i].engine != instrs[j].engine                   # a race is always between two engines
        (ri, wi), (rj, wj) = space.footprint_keys(fps[i]), space.footprint_keys(fps[j])
        shared = {"RAW": wi & rj, "WAR": ri & wj, "WAW": wi & wj}[kind]
        named = ln.split(" on ", 1)[1].rsplit(":", 1)[0]
        assert named in {space.describe(k) for k in shared}, (ln, kind)


def test_races_bad_input(tmp_path, capsys):
    mnist = model_path("dpu_mnist_classifier")
    cases = [(["races", str(tmp_path / "none.xmodel")], "no such file"),
             (["races", mnist, "--limit", "0"], "--limit"),
             (["races", mnist, "--subgraph", "nope"], "nope")]
    for argv, must in cases:
        assert cli(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("opendpu races: error:") and must in err[0]
    assert list(tmp_path.iterdir()) == []                         # nothing written
