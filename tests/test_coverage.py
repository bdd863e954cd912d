"""DPU coverage (compiler.partition.coverage): the MACs of each op and the share of MACs and of ops on the DPU, in
meta.json after `opendpu compile`, first in the summaries of compile and build, and per target in `opendpu inspect`.

Every expected number is computed by hand in the comments from the shapes of small graphs built here."""
from __future__ import annotations

import json
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opendpu.compiler.partition import (CPU, DPU, coverage, format_coverage, op_desc, op_macs, partition,
                                        target_label)
from opendpu.compiler.rules import OpDesc
from opendpu.compiler.xir.graph import Graph, Tensor
from opendpu.isa.target import get_target
from opendpu.runtime.cli import main as cli

B512 = get_target("DPUCZDX8G_ISA1_B512")
B4096 = get_target("DPUCZDX8G_ISA1_B4096")
KEYS = ["macs_total", "macs_dpu", "macs_dpu_pct", "ops_total", "ops_dpu", "ops_dpu_pct", "cpu_ops"]


def accept_all(graph, op, target):
    return None


# ---- MACs of single ops ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("desc, macs", [
    # conv 3x3, 4 -> 8 channels on 8x8: out 8*8*8 = 512 elements * 3*3 * 4 = 18432
    (OpDesc("c", "conv2d-fix", {"kernel": [3, 3]}, [[1, 8, 8, 4]], [1, 8, 8, 8], [8, 3, 3, 4]), 18432),
    # grouped conv 3x3, 8 -> 8 in 2 groups: 512 * 9 * 8 / 2 = 18432
    (OpDesc("g", "conv2d", {"kernel": [3, 3], "group": 2}, [[1, 8, 8, 8]], [1, 8, 8, 8], [8, 3, 3, 4]), 18432),
    # kernel 5 wide, 3 high ([w, h]) read from attrs: out 1*6*4*2 = 48 * 15 * 3 = 2160
    (OpDesc("r", "conv2d-fix", {"kernel": [5, 3]}, [[1, 8, 8, 3]], [1, 6, 4, 2], None), 2160),
    # no kernel attribute: from the OHWI weights [2, 3, 5, 3]
    (OpDesc("w", "conv2d-fix", {}, [[1, 8, 8, 3]], [1, 6, 4, 2], [2, 3, 5, 3]), 2160),
    # depthwise 3x3 stride 2 on 8x8x8: out 4*4*8 = 128 * 9 = 1152
    (OpDesc("d", "depthwise-conv2d-fix", {"kernel": [3, 3]}, [[1, 8, 8, 8]], [1, 4, 4, 8], [1, 3, 3, 8]), 1152),
    # transposed conv 4x4 stride 2, 8 -> 6: in 4*4*8 = 128 * 16 * 6 = 12288
    (OpDesc("t", "transposed-conv2d-fix", {"kernel": [4, 4], "stride": [2, 2]}, [[1, 4, 4, 8]], [1, 8, 8, 6],
            [6, 4, 4, 8]), 12288),
    # transposed depthwise 2x2 stride 2 on 4x4x8: in 128 * 4 * (8 / 8) = 512
    (OpDesc("td", "transposed-depthwise-conv2d-fix", {"kernel": [2, 2]}, [[1, 4, 4, 8]], [1, 8, 8, 8], None), 512),
    # dense as conv (TransferMatMulToConv2d): 8x8 kernel over 8x8x6 -> 10: 10 * 64 * 6 = 3840
    (OpDesc("fc", "conv2d-fix", {"kernel": [8, 8]}, [[1, 8, 8, 6]], [1, 1, 1, 10], [10, 8, 8, 6]), 3840),
    # a float dense layer on the CPU, [1, 384] x [384, 10]: 10 * 384 = 3840
    (OpDesc("mm", "matmul", {}, [[1, 384]], [1, 10], [10, 384]), 3840),
    # pools, eltwise, moves and unknown ops multiply-accumulate nothing
    (OpDesc("p", "pool-fix", {"kernel": [2, 2], "type": "MAX"}, [[1, 8, 8, 8]], [1, 4, 4, 8]), 0),
    (OpDesc("e", "eltwise-fix", {"type": "ADD"}, [[1, 4, 4, 8], [1, 4, 4, 8]], [1, 4, 4, 8]), 0),
    (OpDesc("s", "softmax", {}, [[1, 10]], [1, 10]), 0),
])
def test_op_macs(desc, macs):
    assert op_macs(desc) == macs


# ---- a hand-built quantized graph with one op forced to the CPU ---------------------------------------------------
def fix_t(name, shape, fp=4) -> Tensor:
    t = Tensor(name, list(shape))
    for k, v in (("fix_point", fp), ("bit_width", 8), ("if_signed", True), ("round_mode", "DPU_ROUND")):
        t.attrs.set(k, v)
    return t


def _const(g: Graph, name, shape) -> str:
    g.add_op(name, "const-fix", {}, {"data": np.zeros(int(np.prod(shape)), np.int8).tobytes(), "data_type": "XINT8",
                                     "shape": list(shape)}, fix_t(name, shape, 6))
    return name


def _convlike(g: Graph, typ, name, x, wshape, out, kernel, stride, pad, **attrs):
    w = _const(g, f"{name}_w", wshape)
    b = _const(g, f"{name}_b", [out[-1]])
    a = {"kernel": kernel, "stride": stride, "pad": pad, "dilation": [1, 1], "pad_mode": "FLOOR",
         "nonlinear": "NONE", **attrs}
    if typ == "conv2d-fix":
        a["group"] = 1
    g.add_op(name, typ, {"input": [x], "weights": [w], "bias": [b]}, a, fix_t(name, out))


def hand_graph() -> Graph:
    """x [1,8,8,4] -> conv 3x3 (8) -> {maxpool 2x2, depthwise 3x3 s2} -> add -> transposed conv 4x4 s2 (6) with a
    LeakyReLU of slope 0.2 (not 26/256: the rules put it on the CPU) -> dense 8x8 conv (10) -> fix2float -> softmax.
    """
    g = Graph("cov")
    g.add_op("x", "data-fix", {}, {"shape": [1, 8, 8, 4], "data_type": "XINT8"}, fix_t("x", [1, 8, 8, 4], 6))
    _convlike(g, "conv2d-fix", "conv", "x", [8, 3, 3, 4], [1, 8, 8, 8], [3, 3], [1, 1], [1, 1, 1, 1])
    g.add_op("pool", "pool-fix", {"input": ["conv"]}, {"type": "MAX", "kernel": [2, 2], "stride": [2, 2],
                                                       "pad": [0, 0, 0, 0], "global": False},
             fix_t("pool", [1, 4, 4, 8]))
    _convlike(g, "depthwise-conv2d-fix", "dw", "conv", [1, 3, 3, 8], [1, 4, 4, 8], [3, 3], [2, 2], [1, 1, 1, 1])
    g.add_op("sum", "eltwise-fix", {"input": ["pool", "dw"]}, {"type": "ADD", "nonlinear": "NONE"},
             fix_t("sum", [1, 4, 4, 8]))
    _convlike(g, "transposed-conv2d-fix", "up", "sum", [6, 4, 4, 8], [1, 8, 8, 6], [4, 4], [2, 2], [1, 1, 1, 1],
              nonlinear="LEAKYRELU", LEAKYRELU_alpha=0.2)
    _convlike(g, "conv2d-fix", "fc", "up", [10, 8, 8, 6], [1, 1, 1, 10], [8, 8], [1, 1], [0, 0, 0, 0])
    g.add_op("fc_fix2float", "fix2float", {"input": ["fc"]}, {"fix_point": 4}, Tensor("fc_fix2float", [1, 1, 1, 10],
                                                                                        4, 32))
    g.add_op("softmax", "softmax", {"input": ["fc_fix2float"]}, {"axis": -1}, Tensor("softmax", [1, 1, 1, 10], 4, 32))
    return g


def test_hand_graph_macs_per_op():
    g = hand_graph()
    got = {n: op_macs(op_desc(g, g.ops[n])) for n in ("conv", "pool", "dw", "sum", "up", "fc", "softmax")}
    # conv 512*9*4; dw 128*9; up: in 128 * 16 * 6; fc 10 * 64 * 6
    assert got == {"conv": 18432, "pool": 0, "dw": 1152, "sum": 0, "up": 12288, "fc": 3840, "softmax": 0}


def test_coverage_with_an_op_forced_to_the_cpu():
    part = partition(hand_graph(), B4096, accept_all)
    assert part.placement["up"].device == CPU and "LeakyReLU alpha 0.2" in part.placement["up"].reason
    assert all(part.placement[n].device == DPU for n in ("conv", "pool", "dw", "sum", "fc"))
    cov = coverage(part)
    assert list(cov) == KEYS
    # MACs 18432 + 1152 + 12288 + 3840 = 35712, of which the DPU runs all but the transposed conv's 12288: 23424;
    # real ops (x, the consts and fix2float do not count): conv pool dw sum up fc softmax = 7, 5 on the DPU
    assert (cov["macs_total"], cov["macs_dpu"], cov["ops_total"], cov["ops_dpu"]) == (35712, 23424, 7, 5)
    assert cov["macs_dpu_pct"] == pytest.approx(100 * 23424 / 35712)          # 65.59 %
    assert cov["ops_dpu_pct"] == pytest.approx(100 * 5 / 7)
    assert [(c["name"], c["type"]) for c in cov["cpu_ops"]] == [("up", "transposed-conv2d-fix"),
                                                                ("softmax", "softmax")]
    assert "softmax is not supported by the DPU" in cov["cpu_ops"][1]["reason"]
    line = format_coverage(cov, target_label(B4096))
    assert line.startswith("DPU coverage (B4096): 65.6 % of MACs (23.4 kMAC of 35.7), 5/7 ops; 2 ops on the CPU: "
                           "up (transposed-conv: LeakyReLU alpha 0.2 != 26/256")
    assert "softmax (softmax is not supported by the DPU" in line


def test_format_coverage_edges():
    base = {"macs_total": 10_000_000_000, "macs_dpu": 9_999_000_000, "macs_dpu_pct": 99.99, "ops_total": 3,
            "ops_dpu": 2, "ops_dpu_pct": 66.7, "cpu_ops": [{"name": "sm", "type": "softmax", "reason": "r"}]}
    # 99.99 % is not rounded up to 100.0 while MACs run on the CPU
    assert format_coverage(base, "B512") == ("DPU coverage (B512): >99.9 % of MACs (10 GMAC of 10), 2/3 ops; 1 op on "
                                             "the CPU: sm (r)")
    none = dict(base, macs_total=0, macs_dpu=0, macs_dpu_pct=None, ops_dpu=3, cpu_ops=[])
    assert format_coverage(none, "B512") == "DPU coverage (B512): no MACs, 3/3 ops, none on the CPU"
    many = dict(base, cpu_ops=[{"name": f"op{i}", "type": "t", "reason": "r"} for i in range(7)])
    assert format_coverage(many, "X", limit=2).endswith("7 ops on the CPU: op0 (r), op1 (r), and 5 more")
    assert target_label(B512) == "B512" and target_label(get_target("PP2_CP4_ALUPP1_D512")) != "B512"


# ---- through the CLI --------------------------------------------------------------------------------------------
def cov_onnx(path) -> None:
    """x [1,3,20,20] -> conv 17x17 (4, pad 8; beyond the 16x16 kernel limit: CPU) -> relu -> conv 3x3 (8, pad 1)
    -> softmax."""
    r = np.random.RandomState(0)
    init = [numpy_helper.from_array(r.randn(4, 3, 17, 17).astype(np.float32) * 0.05, "big.weight"),
            numpy_helper.from_array(np.zeros(4, np.float32), "big.bias"),
            numpy_helper.from_array(r.randn(8, 4, 3, 3).astype(np.float32) * 0.2, "small.weight"),
            numpy_helper.from_array(np.zeros(8, np.float32), "small.bias")]
    nodes = [helper.make_node("Conv", ["x", "big.weight", "big.bias"], ["a"], pads=[8, 8, 8, 8], name="big"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Conv", ["b", "small.weight", "small.bias"], ["c"], pads=[1, 1, 1, 1], name="small"),
             helper.make_node("Softmax", ["c"], ["y"], axis=1, name="softmax")]
    g = helper.make_graph(nodes, "cov", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 20, 20])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 20, 20])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


# big: out 20*20*4 = 1600 * 17*17*3 = 1387200; small: out 20*20*8 = 3200 * 3*3*4 = 115200 (the relu is fused)
COV_MACS, COV_DPU_MACS = 1387200 + 115200, 115200


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    d = tmp_path_factory.mktemp("cov")
    cov_onnx(d / "cov.onnx")
    np.save(d / "calib.npy", np.random.RandomState(1).rand(4, 3, 20, 20).astype(np.float32))
    assert cli(["quantize", str(d / "cov.onnx"), "--calib", str(d / "calib.npy"), "-o", str(d / "q"), "--method",
                "maxmin", "--target", "B4096"]) == 0
    return d, d / "q" / "cov_int.xmodel"


def _check_cov(cov):
    assert (cov["macs_total"], cov["macs_dpu"], cov["ops_total"], cov["ops_dpu"]) == (COV_MACS, COV_DPU_MACS, 3, 1)
    assert [c["name"] for c in cov["cpu_ops"]] == ["big", "softmax"]
    assert "conv kernel 17x17 > 16" in cov["cpu_ops"][0]["reason"]


def test_compile_writes_coverage_and_prints_it_first(quantized, tmp_path, capsys):
    d, xm = quantized
    capsys.readouterr()
    assert cli(["compile", "-x", str(xm), "--target", "B4096", "-o", str(tmp_path / "c"), "-n", "cov"]) == 0
    lines = capsys.readouterr().out.splitlines()
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    assert list(meta)[0] == "coverage" and list(meta["coverage"]) == KEYS
    _check_cov(meta["coverage"])
    assert meta["coverage"]["macs_dpu_pct"] == pytest.approx(100 * 115200 / 1502400)      # 7.67 %
    first = next(i for i, s in enumerate(lines) if s.startswith("wrote "))
    assert lines[first - 1].startswith("DPU coverage (B4096): 7.7 % of MACs (0.115 MMAC of 1.5), 1/3 ops; 2 ops on "
                                       "the CPU: big (conv kernel 17x17 > 16)")
    assert all(s.startswith("wrote ") for s in lines[first:])


def test_build_prints_coverage_first_in_its_summary(tmp_path, capsys):
    cov_onnx(tmp_path / "cov.onnx")
    np.save(tmp_path / "calib.npy", np.random.RandomState(1).rand(4, 3, 20, 20).astype(np.float32))
    assert cli(["build", str(tmp_path / "cov.onnx"), "--calib", str(tmp_path / "calib.npy"), "--target", "B512",
                "-o", str(tmp_path / "b"), "--method", "maxmin"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].startswith("DPU coverage (B512): 7.7 % of MACs (0.115 MMAC of 1.5), 1/3 ops; 2 ops on the CPU")
    assert lines[-2].startswith("accuracy vs float: ")        # the verdict (onnxruntime cannot run this test model)
    assert lines[-1].startswith(f"wrote {tmp_path / 'b'}/quantized")
    _check_cov(json.loads((tmp_path / "b" / "compiled" / "meta.json").read_text())["coverage"])


def test_inspect_onnx_per_target(tmp_path, capsys):
    """A dense layer of 3000 inputs fits B4096 (256*16 = 4096 channels) but not B512 (256*8 = 2048)."""
    r = np.random.RandomState(0)
    init = [numpy_helper.from_array(r.randn(10, 3000).astype(np.float32), "fc.weight"),
            numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias")]
    g = helper.make_graph([helper.make_node("Gemm", ["x", "fc.weight", "fc.bias"], ["a"], transB=1, name="fc"),
                           helper.make_node("Softmax", ["a"], ["y"], axis=1, name="softmax")], "wide",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3000])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], init)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), tmp_path / "wide.onnx")
    out = tmp_path / "i"
    assert cli(["inspect", str(tmp_path / "wide.onnx"), "--target", "B512,DPUCZDX8G_ISA1_B4096", "-o", str(out),
                "--verbose", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # 10 outputs * 3000 inputs = 30000 MACs; ops: the reshapes around the dense conv, the conv, the softmax
    assert lines[0] == ("DPU coverage (B512): 0.0 % of MACs (0 kMAC of 30), 2/4 ops; 2 ops on the CPU: fc (conv "
                        "input channels 3000 > 256*CP = 2048), softmax (softmax is not supported by the DPU "
                        "(DPUCZDX8G ISA1 has no softmax engine))")
    assert lines[1].startswith("DPU coverage (B4096): 100.0 % of MACs (30 kMAC of 30), 3/4 ops; 1 op on the CPU: "
                               "softmax")
    assert lines[2:] == [f"wrote {out}/inspect_DPUCZDX8G_ISA1_B512.txt",
                         f"wrote {out}/inspect_DPUCZDX8G_ISA1_B4096.txt"]
    for name, line in zip(("B512", "B4096"), lines):
        report = (out / f"inspect_DPUCZDX8G_ISA1_{name}.txt").read_text().splitlines()
        assert report[1] == line                   # the report opens with the coverage


def test_inspect_quantized_xmodel(quantized, tmp_path, capsys):
    """A quantized xmodel is inspected with the compiler's own partition: the numbers meta.json gets."""
    d, xm = quantized
    out = tmp_path / "i"
    assert cli(["inspect", str(xm), "--target", "B512,B4096", "-o", str(out), "--verbose", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [s.split(":")[0] for s in lines[:2]] == ["DPU coverage (B512)", "DPU coverage (B4096)"]
    assert all(s.split(": ", 1)[1].startswith("7.7 % of MACs (0.115 MMAC of 1.5), 1/3 ops; 2 ops on the CPU: big")
               for s in lines[:2])
    txt = (out / "inspect_DPUCZDX8G_ISA1_B512.txt").read_text()
    assert "Total device subgraph number 4, DPU subgraph number 1" in txt and "CPU op big (conv2d)" in txt


@pytest.mark.parametrize("targets, must", [
    ("B512,,B4096", ["--target", "empty target name"]),
    ("B512,B999", ["--target B999", "unknown target 'B999'"]),
    ("B512,DPUCZDX8G_ISA1_B512", ["DPUCZDX8G_ISA1_B512 is named twice"]),
])
def test_inspect_bad_target_lists(quantized, tmp_path, capsys, monkeypatch, targets, must):
    monkeypatch.setenv("OPENDPU_DEBUG", "1")
    d, _ = quantized
    out = tmp_path / "never"
    assert cli(["inspect", str(d / "cov.onnx"), "--target", targets, "-o", str(out)]) == 2
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opendpu inspect: error: ") and not cap.out
    assert all(s in err[0] for s in must), err[0]
    assert not out.exists()


def test_inspect_refuses_a_compiled_xmodel(quantized, tmp_path, capsys):
    d, xm = quantized
    assert cli(["compile", "-x", str(xm), "--target", "B4096", "-o", str(tmp_path / "c"), "-n", "cov"]) == 0
    capsys.readouterr()
    assert cli(["inspect", str(tmp_path / "c" / "cov.xmodel"), "--target", "B512", "-o", str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cov.xmodel is a compiled xmodel" in err and not os.path.exists(tmp_path / "n")
