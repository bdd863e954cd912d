"""End to end: `opendpu quantize` -> `opendpu compile` (and `opendpu build`) for B512 and B4096, then the compiled
model checked against independent references: the quantized graph evaluated by the XIR reference (`run --backend
ref` of the *_int.xmodel), `opendpu check` (sim against ref), the token race check, and AMD's own compiled programs
(the shared MNIST and custom-op models recompiled by opendpu must compute what AMD's files compute). Also the
Python API (`compiler.pipeline.compile`) and its options."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from opendpu.compiler.emit import LAYER_MAP
from opendpu.compiler.outdir import MARKER
from opendpu.compiler.pipeline import PASS_NAMES, CompileError, compile as compile_graph
from opendpu.compiler.xir import dpu_abi as abi
from opendpu.compiler.xir.graph import Graph
from opendpu.quant import zoo
from opendpu.runtime.cli import main as cli
from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
from opendpu.runtime.runner import GraphRunner
from tests.conftest import model_path

TARGETS = ("DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B4096")


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """The digits CNN quantized once through the CLI: (its *_int.xmodel, calibration images NCHW)."""
    d = tmp_path_factory.mktemp("digits")
    x = zoo.digits_data()[0][:40]
    np.save(d / "calib.npy", x)
    assert cli(["quantize", zoo.DIGITS_ONNX, "--calib", str(d / "calib.npy"), "-o", str(d / "q"), "--method",
                "maxmin", "--target", "DPUCZDX8G_ISA1_B4096"]) == 0
    return str(d / "q" / "digits_cnn_int.xmodel"), x


@pytest.fixture(scope="module", params=TARGETS)
def compiled(request, quantized, tmp_path_factory):
    xm, _ = quantized
    out = tmp_path_factory.mktemp("c") / "out"
    assert cli(["compile", "-x", xm, "--target", request.param, "-o", str(out), "-n", "digits"]) == 0
    return request.param, out


def test_model_positional_as_well_as_x(compiled, quantized, tmp_path, capsys):
    """`compile MODEL -o DIR` (the net named after the file, without _int) writes what `compile -x MODEL -n NAME`
    writes; vai_c_xir's --output_dir / --net_name spellings too."""
    target, out = compiled
    xm, _ = quantized
    assert cli(["compile", xm, "--target", target, "-o", str(tmp_path / "p")]) == 0
    assert cli(["compile", "-x", xm, "--target", target, "--output_dir", str(tmp_path / "v"), "--net_name",
                "digits"]) == 0
    capsys.readouterr()
    assert sorted(os.listdir(tmp_path / "p")) == sorted([MARKER, "digits_cnn.xmodel", "digits_cnn_org.xmodel",
                                                        "meta.json", "report.json", "report.txt"])
    ref = open(out / "digits.xmodel", "rb").read()
    assert open(tmp_path / "v" / "digits.xmodel", "rb").read() == ref
    a, b = Graph.load(str(tmp_path / "p" / "digits_cnn.xmodel")), Graph.load(str(out / "digits.xmodel"))
    codes = [[DpuSubgraph(g, s).mc_code for s in dpu_subgraphs(g)] for g in (a, b)]
    assert codes[0] == codes[1] and codes[0]


def _raw_outputs(path: str, backend: str, images: np.ndarray) -> list[dict]:
    gr = GraphRunner(Graph.load(path), backend=backend)
    spec = gr.get_inputs()[0]
    outs = []
    for im in images:
        x = gr.prepare_input(spec, im[None].transpose(0, 2, 3, 1))
        res = gr.run([x], keep_values=True)
        outs.append({k: v for k, (v, _) in gr.output_values(res, raw=True).items()})
    return outs


def test_compile_writes_the_three_files(compiled, capsys):
    target, out = compiled
    assert sorted(os.listdir(out)) == sorted([MARKER, "digits.xmodel", "digits_org.xmodel", "meta.json",
                                              "report.json", "report.txt"])
    meta = json.loads((out / "meta.json").read_text())
    g = Graph.load(str(out / "digits.xmodel"))
    sgs = dpu_subgraphs(g)
    assert meta["target"] == target and meta["filename"] == "digits.xmodel"
    assert meta["kernel"] == [s.name for s in sgs] and len(sgs) == 1
    assert meta["fingerprint"] == f"0x{DpuSubgraph(g, sgs[0]).fingerprint:016X}"
    assert meta["summary"] == "Total device subgraph number 2, DPU subgraph number 1"
    org = Graph.load(str(out / "digits_org.xmodel"))
    assert not org.root.children and set(org.ops) < set(g.ops)
    from opendpu.compiler.emit import md5
    assert g.attrs["files_md5sum"] == {"digits_org.xmodel": md5((out / "digits_org.xmodel").read_bytes())}
    assert [s.device for s in g.toposort_child_subgraphs()] == ["USER", "DPU"]


def test_compiled_model_computes_the_quantized_graph(compiled, quantized):
    """The compiled program on the cycle model gives, byte for byte, what the XIR reference computes from the
    quantized graph (the golden the quantizer wrote the model for)."""
    target, out = compiled
    xm, images = quantized
    ref = _raw_outputs(xm, "ref", images[:6])
    sim = _raw_outputs(str(out / "digits.xmodel"), "sim", images[:6])
    assert len(ref) == len(sim) == 6
    for r, s in zip(ref, sim):
        assert r.keys() == s.keys()                      # the graph output keeps its tensor name
        for k in r:
            assert np.array_equal(r[k], s[k]), k


def test_compiled_model_matches_the_quantizers_golden_per_layer(compiled, quantized, capsys):
    """`opendpu run --golden` on the cycle model: every layer the program stores equals the quantizer's golden dump
    (computed by the ONNX fake-quant model, not by the XIR reference)."""
    target, out = compiled
    golden = os.path.join(os.path.dirname(quantized[0]), "golden")
    capsys.readouterr()
    assert cli(["run", str(out / "digits.xmodel"), "-i", os.path.join(golden, "input_aquant.bin"), "--golden",
                golden]) == 0
    o = capsys.readouterr().out
    ok = [ln for ln in o.splitlines() if ln.startswith("XLNX_GOLDEN_DIR: compare data success")]
    # the input, the two pooled maps and the classifier output; the conv+conv and conv+pool intermediates stay on
    # chip (the run reports them as not observable)
    assert "fail !" not in o and len(ok) >= 4, o
    assert "kept on chip (not observable)" in o
    assert "/classifier/classifier.4/Gemm_reshape" in " ".join(ok)        # the graph output, by its own name


def test_check_races_disasm_profile_xmodel_on_the_compiled_model(compiled, capsys):
    target, out = compiled
    m = str(out / "digits.xmodel")
    capsys.readouterr()
    assert cli(["check", m, "-n", "3"]) == 0
    o = capsys.readouterr().out
    assert o.startswith("PASS") and " 0 mismatching" in o
    assert cli(["races", m]) == 0
    assert capsys.readouterr().out.startswith("RACE-FREE")
    assert cli(["disasm", m]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip() and not ln.startswith("#")]
    g = Graph.load(m)
    sg = dpu_subgraphs(g)[0]
    n = len(DpuSubgraph(g, sg).instructions)
    assert len(lines) == n and all("; layer subgraph_" in ln for ln in lines)
    names = {c.name for c in sg.children}
    assert {ln.split("; layer ")[1].split(" ;")[0].strip() for ln in lines} <= names
    assert cli(["profile", m]) == 0
    o = capsys.readouterr().out
    assert "layer attribution matched" in o
    matched = o.split("layer attribution matched ")[1].split()[0]
    a, b = matched.split("/")
    assert a == b and int(b) > 0
    assert cli(["xmodel", m]) == 0
    o = capsys.readouterr().out
    assert f"target={target}" in o and "REG_0: CONST" in o


def test_recompile_for_the_other_target(compiled, quantized, tmp_path, capsys):
    target, out = compiled
    other = next(t for t in TARGETS if t != target)
    dst = tmp_path / "re"
    assert cli(["compile", "-x", str(out / "digits.xmodel"), "--recompile", "--target", other, "-o", str(dst), "-n",
                "again"]) == 0
    g = Graph.load(str(dst / "again.xmodel"))
    assert DpuSubgraph(g, dpu_subgraphs(g)[0]).target.name == other
    xm, images = quantized
    for r, s in zip(_raw_outputs(xm, "ref", images[:3]), _raw_outputs(str(dst / "again.xmodel"), "sim", images[:3])):
        for k in r:
            assert np.array_equal(r[k], s[k])


def test_build_quantizes_compiles_and_checks(tmp_path, capsys):
    x = zoo.digits_data()[0][:20]
    np.save(tmp_path / "calib.npy", x)
    out = tmp_path / "b"
    rc = cli(["build", zoo.DIGITS_ONNX, "--calib", str(tmp_path / "calib.npy"), "--target", "DPUCZDX8G_ISA1_B512",
              "-o", str(out), "--method", "maxmin"])
    o = capsys.readouterr().out
    assert rc == 0, o
    assert (out / "quantized" / "digits_cnn_int.xmodel").is_file()
    assert sorted(os.listdir(out / "compiled")) == sorted([MARKER, "digits_cnn.xmodel", "digits_cnn_org.xmodel",
                                                          "meta.json", "report.json", "report.txt"])
    assert "Total device subgraph number 2, DPU subgraph number 1" in o and "PASS " in o
    assert not [p for p in os.listdir(out) if p.startswith(".opendpu-tmp")]


def test_a_cpu_op_in_the_middle(tmp_path, capsys):
    """conv -> Sigmoid (float, CPU) -> conv: USER, DPU, CPU, DPU subgraphs; the CPU op's reason is printed; the
    whole compiled graph on the cycle model equals the quantized graph on the XIR reference."""
    import onnx
    from onnx import helper as h
    from opendpu.quant.quantize import QuantConfig, quantize
    from tests.test_quant import _model
    r = np.random.default_rng(1)
    inits = {"w1": r.normal(0, .3, (8, 3, 3, 3)), "b1": r.normal(0, .1, 8), "w2": r.normal(0, .3, (8, 8, 3, 3)),
             "b2": r.normal(0, .1, 8)}
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             h.make_node("Sigmoid", ["c1"], ["s"], name="sig"),
             h.make_node("Conv", ["s", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
             h.make_node("Relu", ["c2"], ["y"], name="relu2")]
    onnx.save(_model(nodes, inits, [1, 3, 8, 8], ["y"], name="mid"), tmp_path / "mid.onnx")
    x = r.standard_normal((8, 3, 8, 8)).astype(np.float32)
    q = quantize(str(tmp_path / "mid.onnx"), x, target="DPUCZDX8G_ISA1_B512", config=QuantConfig(method="maxmin"))
    q.xmodel().save(str(tmp_path / "mid_int.xmodel"))
    capsys.readouterr()
    assert cli(["compile", "-x", str(tmp_path / "mid_int.xmodel"), "--target", "DPUCZDX8G_ISA1_B512", "-o",
                str(tmp_path / "c"), "-n", "mid"]) == 0
    o = capsys.readouterr().out
    assert "Total device subgraph number 4, DPU subgraph number 2" in o
    assert "CPU op sig (sigmoid): sigmoid is not supported by the DPU" in o
    g = Graph.load(str(tmp_path / "c" / "mid.xmodel"))
    assert [s.device for s in g.toposort_child_subgraphs()] == ["USER", "DPU", "CPU", "DPU"]
    cpu = next(s for s in g.root.children if s.device == "CPU")
    assert [g.ops[n].type for n in g.toposort(cpu.all_ops())] == ["fix2float", "sigmoid", "float2fix"]
    assert g.ops["conv1_fix2float"].input_ops() == ["conv1_download_0"]
    assert g.ops["sig_float2fix_upload_0"].input_ops() == ["sig_float2fix"]
    ref, sim = GraphRunner(q.xmodel(), backend="ref"), GraphRunner(g, backend="sim")
    for k in range(4):
        xi = ref.prepare_input(ref.get_inputs()[0], x[k:k + 1].transpose(0, 2, 3, 1))
        a, b = ref.run([xi]).outputs, sim.run([xi]).outputs
        assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)
    assert cli(["check", str(tmp_path / "c" / "mid.xmodel")]) == 0
    assert capsys.readouterr().out.count("PASS ") == 2


def test_compile_report_records_every_choice_with_its_alternatives():
    """report.json: per DPU subgraph each per-layer choice of the code generator with the estimated cycles of every
    form tried; the form taken is the cheapest one (ties: the simpler form, except the image group of a fused pair's
    output: the one farthest from the producer's input), and turning an optimisation off
    removes its decisions."""
    from opendpu.runtime.costmodel import cycle_model
    g = Graph.load(model_path("yolox_nano_b4096"))
    t = DpuSubgraph(g, dpu_subgraphs(g)[0]).target
    res = compile_graph(g, t, recompile=True, name="y", cycles=cycle_model)
    rep = json.loads(res.files()["report.json"])
    (sg,) = rep["subgraphs"]
    kinds = {d["decision"] for d in sg["decisions"]}
    assert {"channel_augmentation", "fuse", "fuse_conv", "contested pairs"} <= kinds, kinds
    taken_fused = 0
    for d in sg["decisions"]:
        costs = {k: v for k, v in d["cycles"].items() if v is not None}
        assert len(d["cycles"]) >= 2 and d["chosen"] in d["cycles"] and costs
        assert costs[d["chosen"]] == min(costs.values()), d
        taken_fused += d["decision"] in ("fuse", "fuse_conv") and d["chosen"].startswith("fused")
    # every fused pair taken is one layer of the program holding both ops
    assert taken_fused == sum(1 for ly in res.programs[sg["name"]].layers
                              if sum(res.org.ops[o].type in ("conv2d-fix", "depthwise-conv2d-fix", "pool-fix")
                                     for o in ly.ops) >= 2) and taken_fused > 0
    text = res.files()["report.txt"].decode()
    assert f"DPU subgraph {sg['name']}: {sg['instructions']} instructions" in text and " *" in text
    off = compile_graph(g, t, recompile=True, name="y", cycles=cycle_model, fuse=False, fuse_conv=False,
                        channel_augmentation=False)
    assert {d["decision"] for d in off.report()["subgraphs"][0]["decisions"]} <= {"pool_cascade"}


# ---- AMD's programs as the reference ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dpu_mnist_classifier", "tf2_custom_op"])
def test_recompiled_shared_models_compute_what_amds_programs_compute(name, tmp_path):
    """opendpu recompiles AMD's compiled models from their graphs; each DPU subgraph of ours, given the same input
    bytes, writes the same output bytes as AMD's program (run on the same simulator)."""
    g = Graph.load(model_path(name))
    t = DpuSubgraph(g, dpu_subgraphs(g)[0]).target
    res = compile_graph(g, t, recompile=True, name="re")
    ours = {frozenset(n for n in s.all_ops() if res.graph.ops[n].type not in ("upload", "download")): s
            for s in dpu_subgraphs(res.graph)}
    rng = np.random.default_rng(3)
    n = 0
    for s in dpu_subgraphs(g):
        key = frozenset(m for m in s.all_ops() if g.ops[m].type not in ("upload", "download"))
        da, do = DpuSubgraph(g, s), DpuSubgraph(res.graph, ours[key])
        assert [(i.name, i.dims) for i in da.inputs] == [(i.name, i.dims) for i in do.inputs]
        assert [(o.name, o.dims) for o in da.outputs] == [(o.name, o.dims) for o in do.outputs]
        for _ in range(3):
            xs = [rng.integers(-128, 128, size=i.dims, dtype=np.int8) for i in da.inputs]
            for a, b in zip(da.run_sim(xs), do.run_sim(xs)):
                assert np.array_equal(a, b)
            n += 1
    assert n


# ---- the Python API and its options --------------------------------------------------------------------------
def test_api_output_ops_prefetch_and_dump(quantized):
    xm, images = quantized
    g = Graph.load(xm)
    cut = "/features/features.7/MaxPool"
    res = compile_graph(g, "DPUCZDX8G_ISA1_B4096", name="cut", output_ops=cut, prefetch="true",
                        dump_after=["partition", "emit"])
    assert not any(n.startswith("/classifier") for n in res.org.ops)
    sg = dpu_subgraphs(res.graph)[0]
    assert [o.op_name for o in abi.read_outputs(res.graph, sg)] == [f"{cut}_download_0"]
    assert sg.attrs["if_prefetch"] is True and res.graph.root.attrs["prefetch"] is True
    assert res.meta["options"] == {"output_ops": [cut], "prefetch": True}
    d = res.dumps["partition"]
    assert d["partition"]["summary"] == res.partition.summary() and "programs" not in d
    assert set(res.dumps["emit"]["programs"]) == {sg.name} and LAYER_MAP not in json.dumps(d)
    listing = res.dumps["emit"]["programs"][sg.name]["listing"]
    assert len(listing) == len(res.programs[sg.name].instructions)
    files = res.files()
    assert set(files) == {"cut.xmodel", "cut_org.xmodel", "meta.json", "report.json", "report.txt",
                          "dump_after_partition.json", "dump_after_emit.json"}
    # the cut graph's output is the reference value of that op
    gr = GraphRunner(Graph.load(xm), backend="ref")
    x = gr.prepare_input(gr.get_inputs()[0], images[0][None].transpose(0, 2, 3, 1))
    want = gr.run([x], keep_values=True).values[cut]
    cr = GraphRunner(res.graph, backend="sim")
    got = cr.run([x]).outputs
    assert list(got) == [g.ops[cut].output.name] and np.array_equal(got[g.ops[cut].output.name], want)


def test_api_rejects_bad_options(quantized):
    g = Graph.load(quantized[0])
    t = "DPUCZDX8G_ISA1_B512"
    for kw, why in (({"optimize": 3}, "unknown option 'optimize'; known options: input_shape, output_ops"),
                    ({"output_ops": "no_such_op"}, "no op 'no_such_op'"),
                    ({"output_ops": "input"}, "data-fix op"),
                    ({"output_ops": "/features/features.3/MaxPool,/features/features.7/MaxPool"}, "feeds the other"),
                    ({"input_shape": "1,16,16,1"}, r"\[1, 8, 8, 1\]"),
                    ({"input_shape": "1,8,8,1;1,8,8,1"}, "2 shape"),
                    ({"input_shape": "1,x,8,1"}, "not a list of integers"),
                    ({"prefetch": "maybe"}, "not a boolean"),
                    ({"plugins": "libmine.so"}, "not supported")):
        with pytest.raises(CompileError, match=why):
            compile_graph(g, t, **kw)
    with pytest.raises(CompileError, match="no such pass; the passes are " + ", ".join(PASS_NAMES)):
        compile_graph(g, t, dump_after=["fuse"])
    assert compile_graph(g, t, input_shape=[1, 8, 8, 1], hd_opt=False).meta["options"] == {
        "input_shape": [[1, 8, 8, 1]], "hd_opt": False}


def test_a_dpu_output_read_directly_by_another_dpu_subgraph():
    """c1 feeds c3 directly and through a CPU op, so they are two DPU subgraphs: c3's subgraph uploads c1's
    download (the interface in DDR between them), and the graph on the cycle model equals the reference."""
    from tests.test_partition import G
    b = G()
    c1 = b.conv("c1", b.data("x"))
    b.add("c3", [c1, b.float2fix("back", b.float_op("sig", "sigmoid", [b.fix2float("c1_f", c1)]))])
    res = compile_graph(b.g, "DPUCZDX8G_ISA1_B512")
    g = res.graph
    assert [s.device for s in g.toposort_child_subgraphs()] == ["USER", "DPU", "CPU", "DPU"]
    assert g.ops["c1_upload_0"].input_ops() == ["c1_download_0"] and g.ops["c1_f"].input_ops() == ["c1_download_0"]
    assert g.ops["c3"].input_ops() == ["c1_upload_0", "back_upload_0"]
    rng = np.random.default_rng(0)
    ref, sim = GraphRunner(b.g, backend="ref"), GraphRunner(g, backend="sim")
    for _ in range(3):
        xi = rng.integers(-128, 128, (1, 8, 8, 4)).astype(np.int8)
        assert np.array_equal(ref.run([xi]).outputs["c3"], sim.run([xi]).outputs["c3"])


def test_input_shape_in_either_layout_of_the_model(quantized):
    """input_shape is the model's own shape: the quantized xmodel's NHWC [1, 8, 8, 1] or the NCHW [1, 1, 8, 8] of the
    ONNX model it came from, both compiling the same program; the pass summary says which layout was read. Any other
    shape names both layouts and the way to another shape (quantize with --input-shape), never "quantize it again"
    at the shape the model already has."""
    from opendpu.compiler.pipeline import parse_options
    g = Graph.load(quantized[0])
    t = "DPUCZDX8G_ISA1_B512"
    plain = compile_graph(g, t)
    for text, how in (('"1,1,8,8"', "'input' [1, 1, 8, 8] read as NCHW (the ONNX model's layout) = [1, 8, 8, 1] NHWC"),
                      ("[1, 8, 8, 1]", "'input' [1, 8, 8, 1] read as NHWC (the xmodel's layout)"),
                      ('"1,8,8,1"', "'input' [1, 8, 8, 1] read as NHWC (the xmodel's layout)")):
        res = compile_graph(g, t, **parse_options('{"input_shape": ' + text + "}"))
        assert f"input_shape {how}" in dict(res.summaries)["apply_options"]
        assert [p.instructions for p in res.programs.values()] == [p.instructions for p in plain.programs.values()]
    for bad in ("1,2,8,8", "1,8,1,8", "1,64"):
        with pytest.raises(CompileError) as e:
            compile_graph(g, t, input_shape=bad)
        msg = str(e.value)
        assert "quantize it again" not in msg
        if bad != "1,64":
            assert "the quantized graph's input is [1, 8, 8, 1] NHWC (the xmodel's layout), [1, 1, 8, 8] NCHW " \
                   "(the ONNX model's)" in msg and "--input-shape N,C,H,W, NCHW" in msg


def test_library_default_and_cli_emit_the_same_programs(tmp_path):
    """One cost model (issue 31 item 3): `compile()` with its defaults and `opendpu compile` decide by the same
    cycle model and emit identical mc_code (MobileNet v2 64x64 on B512, where the old library default differed)."""
    from compile_helpers import quantized as zoo_quantized
    g = zoo_quantized("mobilenet_v2", 64)
    xm = tmp_path / "m_int.xmodel"
    xm.write_bytes(g.serialize())
    lib = compile_graph(Graph.deserialize(g.serialize()), "DPUCZDX8G_ISA1_B512", name="m")
    assert cli(["compile", "-x", str(xm), "--target", "DPUCZDX8G_ISA1_B512", "-o", str(tmp_path / "out"), "-n",
                "m"]) == 0
    xmodel = Graph.deserialize((tmp_path / "out" / "m.xmodel").read_bytes())
    got = {sg.name: DpuSubgraph(xmodel, sg).mc_code for sg in dpu_subgraphs(xmodel)}
    assert got and got == {n: p.mc_code for n, p in lib.programs.items()}
