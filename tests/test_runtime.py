"""Runners and CLI on the real xmodels: sim (instruction executor) vs ref (XIR reference), bit for bit."""
import os
import subprocess
import sys

import numpy as np
import pytest

from opendpu.compiler.xir.graph import Graph
from opendpu.isa.program import decode, encode, from_text
from opendpu.runtime import GraphRunner, create_runner, register_op, unregister_op
from opendpu.runtime.cli import main as cli
from opendpu.runtime.demo import digits_as_mnist
from opendpu.runtime.dpu import DpuSubgraph, RuntimeErrorDPU, dpu_subgraphs
from opendpu.runtime.layers import run_tracked
from opendpu.runtime.ops import OpError
from tests.conftest import MODEL_NAMES, model_path


def test_mnist_sim_equals_ref_on_1000_random_inputs(mnist_path):
    g = Graph.load(mnist_path)
    sg = dpu_subgraphs(g)[0]
    sim, ref = create_runner(sg, "sim"), create_runner(sg, "ref")
    (t_in,), (t_out,) = sim.get_input_tensors(), sim.get_output_tensors()
    assert (t_in.name, t_in.dims, t_in.get_attr("fix_point")) == ("quant_input_1", (1, 28, 28, 1), 6)
    rng = np.random.default_rng(1)
    mism = 0
    for _ in range(1000):
        x = rng.integers(-128, 128, size=t_in.dims, dtype=np.int8)
        o_sim = np.empty(t_out.dims, np.int8)
        job = sim.execute_async([x], [o_sim])
        assert sim.wait(job) == 0
        mism += int(np.count_nonzero(o_sim != ref.run([x])[0]))
    assert mism == 0


def test_mnist_digits_end_to_end(mnist_path):
    g = Graph.load(mnist_path)
    sim, ref = GraphRunner(g, "sim"), GraphRunner(g, "ref")
    x, y = digits_as_mnist(60)
    correct = 0
    for i in range(len(x)):
        rs, rr = sim.run([x[i:i + 1]]), ref.run([x[i:i + 1]])
        (ds,), (dr,) = rs.dpu_outputs.values(), rr.dpu_outputs.values()
        assert all(np.array_equal(ds[k], dr[k]) for k in ds)
        p = rs.outputs["quant_dense_1_softmax"].reshape(-1)
        assert abs(p.sum() - 1) < 1e-5
        correct += int(np.argmax(p)) == int(y[i])
    assert correct >= 36          # 44/60 measured; chance is 6/60 (8x8 digits upscaled, not MNIST)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_check_passes_on_every_dpu_subgraph(name, capsys):
    assert cli(["check", model_path(name), "-n", "1"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and out.count("PASS") == len(dpu_subgraphs(Graph.load(model_path(name))))


def test_check_finds_the_first_broken_layer(mnist_path):
    g = Graph.load(mnist_path)
    sg = dpu_subgraphs(g)[0]
    prog = decode(bytes(sg.attrs["mc_code"]))
    # break the bias shift of the second CONVINIT (the first dense layer, spec §10.2 mutation "shift_bias − 1")
    inits = [i for i, ins in enumerate(prog) if ins.op == "CONVINIT"]
    prog[inits[1]].fields["shift_cut"] += 1
    sg.attrs["mc_code"] = encode(prog)
    d = DpuSubgraph(g, sg)
    x = [np.random.default_rng(0).integers(-128, 128, size=t.dims, dtype=np.int8) for t in d.inputs]
    ref_out, ref_vals = d.run_ref(x, keep=True)
    out, rep = run_tracked(d, d.new_machine(), x, ref_vals)
    assert not np.array_equal(out[0], ref_out[0])
    # MNIST stores only its output (one SAVE): the broken layer's tensor stays on chip, so the first
    # observable mismatch is the output layer, and earlier layers are reported as on-chip
    assert rep.first_mismatch() == "quant_dense_1(TransferMatMulToConv2d)"
    assert rep.status["quant_dense(TransferMatMulToConv2d)"] == "on-chip"
    assert rep.detail["quant_dense_1(TransferMatMulToConv2d)"][1] > 0


def test_tf2_custom_op_needs_registration_then_runs():
    g = Graph.load(model_path("tf2_custom_op"))
    x = np.random.default_rng(0).random((1, 28, 28, 1), dtype=np.float32)
    gr = GraphRunner(g, "sim")
    with pytest.raises(OpError, match=r"type 'Mylayer'.*register_op\('Mylayer'"):
        gr.run([x])

    def mylayer(op, ins):            # AMD's example: a PReLU with learned alpha (x>0 ? x : alpha*x)
        x, alpha = ins
        return np.where(x > 0, x, alpha[None] * x)

    register_op("Mylayer", mylayer)
    try:
        rs, rr = GraphRunner(g, "sim").run([x]), GraphRunner(g, "ref").run([x])
    finally:
        unregister_op("Mylayer")
    assert rs.outputs.keys() == rr.outputs.keys() and len(rs.dpu_outputs) == 2
    for k in rs.outputs:
        assert np.array_equal(rs.outputs[k], rr.outputs[k])
    (out,) = rs.outputs.values()
    assert out.shape == (1, 10) and np.all((out >= 0) & (out <= 1))       # hard-sigmoid output


def test_fingerprint_mismatch_is_refused(mnist_path):
    g = Graph.load(mnist_path)
    with pytest.raises(RuntimeErrorDPU, match="VART_GRAPH_FINGERPRINT_ERROR.*DPUCZDX8G_ISA1_B512"):
        create_runner(dpu_subgraphs(g)[0], "sim", target="B512")
    create_runner(dpu_subgraphs(g)[0], "sim", target="DPUCZDX8G_ISA1_B4096")


def test_input_errors(mnist_path):
    g = Graph.load(mnist_path)
    gr = GraphRunner(g, "sim")
    with pytest.raises(RuntimeErrorDPU, match="NaN or Inf"):
        gr.run([np.full((1, 28, 28, 1), np.nan, np.float32)])
    with pytest.raises(RuntimeErrorDPU, match=r"shape \[3, 3\]"):
        gr.run([np.zeros((3, 3), np.float32)])
    r = create_runner(dpu_subgraphs(g)[0], "sim")
    with pytest.raises(RuntimeErrorDPU, match="takes 1 input"):
        r.execute_async([], [])


def test_cli_run_dump_golden_disasm(mnist_path, tmp_path, capsys):
    x = digits_as_mnist(1)[0][:1]
    np.save(tmp_path / "in.npy", x)
    assert cli(["run", mnist_path, "-i", str(tmp_path / "in.npy"), "-o", str(tmp_path / "ref.npz"),
                "--backend", "ref", "--dump", str(tmp_path / "gold")]) == 0
    names = sorted(os.listdir(tmp_path / "gold"))
    assert "quant_conv2d_relu_fix.bin" in names and "quant_dense_1_softmax_fix.bin" in names
    assert cli(["run", mnist_path, "-i", str(tmp_path / "in.npy"), "-o", str(tmp_path / "sim.npz"),
                "--backend", "sim", "--golden", str(tmp_path / "gold")]) == 0
    out = capsys.readouterr().out
    assert "XLNX_GOLDEN_DIR: compare data success !layer_name quant_dense_1_softmax_fix" in out
    assert "fail" not in out
    a, b = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "sim.npz")
    assert list(a.keys()) == ["quant_dense_1_softmax"] and np.array_equal(a["quant_dense_1_softmax"],
                                                                            b["quant_dense_1_softmax"])
    # a corrupted golden file is reported as a failure with a non-zero exit status
    gp = tmp_path / "gold" / "quant_dense_1_softmax_fix.bin"
    v = np.fromfile(gp, np.int8)
    v[0] ^= 1
    v.tofile(gp)
    assert cli(["run", mnist_path, "-i", str(tmp_path / "in.npy"), "--golden", str(tmp_path / "gold")]) == 1
    assert "compare data fail ! layer_name quant_dense_1_softmax_fix" in capsys.readouterr().out
    # disasm (indices, layer names) -> assemble -> encode gives the original mc_code
    assert cli(["disasm", mnist_path]) == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert len(lines) == 230 and lines[229].split()[:2] == ["229", "END"] and "; layer " in lines[0]
    mc = bytes(dpu_subgraphs(Graph.load(mnist_path))[0].attrs["mc_code"])
    assert encode(from_text(text)) == mc


def test_cli_errors_are_clean(tmp_path, capsys):
    bad = tmp_path / "bad.xmodel"
    bad.write_bytes(b"garbage\x00\x01")
    assert cli(["xmodel", str(bad)]) == 2
    assert "not an xmodel" in capsys.readouterr().err
    assert cli(["run", str(tmp_path / "none.xmodel"), "-i", "x.npy"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_console_script_targets():
    exe = os.path.join(os.path.dirname(sys.executable), "opendpu")
    out = subprocess.run([exe, "targets", "--json"], capture_output=True, text=True, check=True).stdout
    assert '"fingerprint": "0x0101000056010407"' in out


def test_cli_run_int8_input_both_backends_agree(mnist_path, tmp_path):
    rng = np.random.default_rng(7)
    outs = {}
    for k in range(3):
        x = rng.integers(-128, 128, size=(1, 28, 28, 1), dtype=np.int8)   # int8 is taken as fixed point
        np.save(tmp_path / f"x{k}.npy", x)
        for be in ("ref", "sim"):
            assert cli(["run", mnist_path, "-i", str(tmp_path / f"x{k}.npy"), "-o", str(tmp_path / f"{be}{k}.npz"),
                        "--backend", be, "--dump", str(tmp_path / f"d{be}{k}")]) == 0
            outs[be, k] = np.load(tmp_path / f"{be}{k}.npz")["quant_dense_1_softmax"]
        assert np.array_equal(outs["ref", k], outs["sim", k])
        a = np.fromfile(tmp_path / f"dref{k}" / "quant_dense_1_softmax_fix.bin", np.int8)
        b = np.fromfile(tmp_path / f"dsim{k}" / "quant_dense_1_softmax_fix.bin", np.int8)
        assert a.size == 10 and np.array_equal(a, b)


def test_cli_reports_executor_errors_by_instruction(mnist_path, tmp_path, capsys):
    g = Graph.load(mnist_path)
    sg = dpu_subgraphs(g)[0]
    prog = decode(bytes(sg.attrs["mc_code"]))
    prog[0].fields["reg_id"] = 7                      # a DDR register the subgraph never allocated
    sg.attrs["mc_code"] = encode(prog)
    g.save(str(tmp_path / "bad.xmodel"))
    assert cli(["check", str(tmp_path / "bad.xmodel"), "-n", "1"]) == 2
    err = capsys.readouterr().err
    assert "instruction 0 (LOAD): field reg_id=7" in err and "REG_7" in err
