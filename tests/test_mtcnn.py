"""MTCNN (facenet-pytorch 2.6.0's PNet, RNet and ONet with their trained weights) through the quantizer's PyTorch
path, with PReLU on the DPU.

References are independent of the quantizer: hand-computed int8 PReLU values (spec §6.8 / §7.7 arithmetic done
by hand below), onnxruntime on the exported float ONNX model for the Transpose fold, the float PyTorch model for
the accuracy of ONet's box regression and landmarks on face crops of skimage's astronaut, and the golden XIR
reference runner for the compiled programs (sim output bytes == ref output bytes).

Default tests take about a minute; `-m slow` runs every net on every preset with more crops.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
pytest.importorskip("skimage")

import mtcnn_nets as M  # noqa: E402
from opendpu.compiler.pipeline import compile as compile_graph  # noqa: E402
from opendpu.compiler.xir.graph import Graph  # noqa: E402
from opendpu.isa.target import PRESETS, Target  # noqa: E402
from opendpu.quant.emit import QParams, emit_onnx, session  # noqa: E402
from opendpu.quant.onnx_in import QuantError, to_fgraph, torch_to_onnx  # noqa: E402
from opendpu.quant.prepare import Prepared, QNode, prepare  # noqa: E402
from opendpu.quant.quantize import QuantConfig, quantize  # noqa: E402
from opendpu.quant.xir_out import build_xmodel  # noqa: E402
from opendpu.runtime.runner import GraphRunner  # noqa: E402

TARGET = "DPUCZDX8G_ISA1_B4096"
N_CALIB = 64                  # calibration crops per net
N_EVAL = 32                   # evaluation crops per net (sim and ref each run every one)


def _need(name: str) -> None:
    if M.weights_path(name) is None:
        pytest.skip(f"facenet_pytorch's data/{name}.pt is not installed (pip install --no-deps facenet-pytorch==2.6.0)")


# ---- running a quantized model -----------------------------------------------------------------------------------
def _compiled(res, target=TARGET):
    """(quantized xmodel graph, compile result) of a QuantResult."""
    g = Graph.deserialize(res.xmodel().serialize())
    return g, compile_graph(g, target, name=res.model_name.replace("/", "_") or "net")


def _raw_outputs(runner: GraphRunner, x: np.ndarray) -> dict[str, np.ndarray]:
    """Graph outputs of one NCHW float sample: int8 for fixed-point outputs, float32 for CPU (float) ones."""
    xin = runner.prepare_input(runner.get_inputs()[0], x, layout="nchw")
    res = runner.run([xin], keep_values=True)
    return {k: v for k, (v, _) in runner.output_values(res, raw=True).items()}


def _sim_vs_ref(g: Graph, c, xs: np.ndarray) -> dict[str, np.ndarray]:
    """Runs every sample on the compiled xmodel (sim) and the quantized one (ref); asserts equal output bytes and
    returns the dequantized outputs by name, stacked over samples (NHWC as the xmodel has them)."""
    ref, sim = GraphRunner(g, backend="ref"), GraphRunner(c.graph, backend="sim", seed=3)
    fps = {s.name: s.fix_point for s in ref.get_outputs()}
    out: dict[str, list] = {}
    for i in range(len(xs)):
        a, b = _raw_outputs(ref, xs[i:i + 1]), _raw_outputs(sim, xs[i:i + 1])
        assert set(a) == set(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), f"sample {i}: output {k}: sim != ref"
            v = a[k].astype(np.float64) * 2.0 ** -fps[k] if a[k].dtype == np.int8 else a[k].astype(np.float64)
            out.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in out.items()}


def _nchw(v: np.ndarray) -> np.ndarray:
    return v.transpose(0, 3, 1, 2) if v.ndim == 4 else v


# ---- PReLU: hand-computed int8 values ----------------------------------------------------------------------------
def _prelu_module(slopes) -> torch.nn.Module:
    m = torch.nn.PReLU(len(slopes))
    with torch.no_grad():
        m.weight.copy_(torch.tensor(slopes, dtype=torch.float32))
    return m.eval()


# input of the hand-computed case: multiples of 1/64 (input fix point 6), [1, 3, 1, 4]
HAND_X = np.array([[-30, -92, 32, 92], [-64, -35, 0, 48], [-10, -92, 1, -32]], np.float32).reshape(1, 3, 1, 4) / 64
# slopes 0.25, 0.1, 0.75 -> fix point 7 (0.75·2^8 = 192 > 127), int8 32, 13 (12.8), 96.
# maxmin fix points: input |x| <= 1.4375 -> 6, output |y| <= 1.4375 -> 6; so for x < 0
#   y_q = floor(x_q·a_q / 2^(7 + 6 - 6) + 1/2) (DPU round: ties toward +inf), and y_q = x_q for x >= 0:
#   ch 0: -30·32/128 = -7.5 -> -7;  -92·32/128 = -23;       32;  92
#   ch 1: -64·13/128 = -6.5 -> -6;  -35·13/128 = -3.55 -> -4 (the float slope 0.1 would give -3.5 -> -3);  0;  48
#   ch 2: -10·96/128 = -7.5 -> -7;  -92·96/128 = -69;  1;  -32·96/128 = -24
HAND_Y = np.array([[-7, -23, 32, 92], [-6, -4, 0, 48], [-7, -69, 1, -24]], np.int8)


def test_prelu_hand_computed_int8():
    res = quantize(_prelu_module([0.25, 0.1, 0.75]), HAND_X, example_input=HAND_X, target=TARGET,
                   config=QuantConfig(method="maxmin"))
    (p,) = [n for n in res.prep.nodes if n.kind == "prelu"]
    inp = res.prep.input_nodes[0].name
    assert (res.qp.act_fp[inp], res.qp.act_fp[p.name], res.qp.w_fp[p.name]) == (6, 6, 7)
    assert res.qp.w_q[p.name].tolist() == [32, 13, 96]
    g, c = _compiled(res)
    op = g.ops[p.name]
    assert op.type == "eltwise-fix" and op.attrs["type"] == "PRELU" and op.attrs["prelu_shift"] == 7
    pl = c.partition.placement[p.name]
    assert (pl.device, pl.engine) == ("DPU", "alu"), pl
    got_ref = _raw_outputs(GraphRunner(g, backend="ref"), HAND_X)[p.name]
    got_sim = _raw_outputs(GraphRunner(c.graph, backend="sim"), HAND_X)[p.name]
    assert np.array_equal(got_ref.reshape(4, 3).T, HAND_Y)        # NHWC [1, 1, 4, 3]
    assert np.array_equal(got_sim, got_ref)
    fake = res.run(HAND_X, "dpu")[p.name] * 64                     # the ONNX fake-quant model (goldens, accuracy)
    assert np.array_equal(fake.reshape(3, 4), HAND_Y.astype(np.float32))


def test_prelu_shared_slope_and_shift_limit():
    """One shared slope stays one value; a tiny slope's fix point is cut so that s + fp_in - fp_out <= 31."""
    x = HAND_X
    res = quantize(_prelu_module([2.0 ** -40]), x, example_input=x, target=TARGET, config=QuantConfig(method="maxmin"))
    (p,) = [n for n in res.prep.nodes if n.kind == "prelu"]
    assert p.weight.shape == (1,)
    # maxmin alone would give s = 46 (2^-40·2^46 = 64); the ALU's negative shift s + 6 - 6 allows 31 at most
    assert res.qp.w_fp[p.name] == 31 and res.qp.w_q[p.name].tolist() == [0]
    assert any(a["tensor"] == p.name + "_weights" and a["to"] == 31 for a in res.adjustments)
    g, c = _compiled(res)
    got = _raw_outputs(GraphRunner(g, backend="ref"), x)[p.name].reshape(4, 3).T
    want = np.where(HAND_X[0, :, 0] < 0, 0, HAND_X[0, :, 0] * 64)     # 2^-40·x rounds to 0 at fix point 6
    assert np.array_equal(got, want.astype(np.int8))
    assert np.array_equal(_raw_outputs(GraphRunner(c.graph, backend="sim"), x)[p.name].reshape(4, 3).T, got)


@pytest.mark.parametrize("slopes", [[-0.25], [-0.25, 0.5, 0.9, -1.0], [-0.25, 0.5, 1.5, -1.0]])
def test_prelu_negative_slopes_on_the_dpu(slopes):
    """Negative slopes (which the ALU prelu cannot take) run as DPU ops whose result is the float PReLU within a
    rounding; sim, ref and the fake-quant model agree bit for bit."""
    rng = np.random.default_rng(len(slopes))
    x = (rng.integers(-96, 97, (16, 4, 3, 5)) / 64).astype(np.float32)
    res = quantize(_prelu_module(slopes), x, example_input=x[:1], target=TARGET, config=QuantConfig(method="maxmin"))
    kinds = sorted(n.kind for n in res.prep.nodes if n.kind != "input")
    assert kinds == (["dwconv", "eltwise", "prelu"] if max(slopes) > 1 else ["dwconv", "eltwise"])
    assert all(np.all(n.weight >= 0) for n in res.prep.nodes if n.kind == "prelu")
    g, c = _compiled(res)
    assert all(p.device in ("DPU", "USER", "") for p in c.partition.placement.values())
    out = res.prep.outputs[0]
    a = np.asarray(slopes if len(slopes) > 1 else slopes * 4, np.float64).reshape(1, 4, 1, 1)
    want = np.where(x < 0, x * a, x)
    fp = res.qp.act_fp[out]
    got = _nchw(_sim_vs_ref(g, c, x)[out])
    fake = res.run(x, "dpu")[out]
    assert np.array_equal(got, fake)
    # rounding of the depthwise branch and of the sum (half an LSB each) and of the slopes (half an LSB of their
    # fix point, times |x| <= 1.5)
    wfp = min(res.qp.w_fp[n.name] for n in res.prep.nodes if n.kind in ("dwconv", "prelu"))
    assert np.abs(got - want).max() <= 2.0 ** -fp + 1.5 * 2.0 ** -(wfp + 1) + 1e-9


def test_negative_prelu_slopes_run_on_the_cpu_in_the_compiler():
    """An eltwise-fix PRELU with a negative slope (from any source) is refused by the code generator: the compiler
    places it on the CPU with that reason and the compiled graph still computes the reference's values."""
    x = QNode("x", "input", [], [1, 3, 1, 4])
    p = QNode("p", "prelu", ["x"], [1, 3, 1, 4], {}, np.array([0.5, -0.25, 0.125], np.float32))
    prep = Prepared("neg", [x, p], ["p"], ["p"], [])
    qp = QParams(act_fp={"x": 6, "p": 6}, w_fp={"p": 3}, w_q={"p": np.array([4, -2, 1], np.int8)})
    g = build_xmodel(prep, qp)
    c = compile_graph(Graph.deserialize(g.serialize()), TARGET, name="neg")
    pl = c.partition.placement["p"]
    assert pl.device == "CPU" and "negative PReLU slopes" in pl.reason, pl
    xq = np.array([[-8, 8], [-8, 8], [-12, 12]], np.int8)            # [C, W]: x_q at fix point 6
    xs = np.tile(xq, (1, 2)).T.reshape(1, 1, 4, 3)                    # NHWC
    want = np.where(xs < 0, np.floor(xs * np.array([4, -2, 1]) / 8 + 0.5), xs).astype(np.int8)
    assert want[0, 0, 0].tolist() == [-4, 2, -1]                      # x·slope: -8·4/8, -8·(-2)/8, -12·1/8 = -1.5
    ref = GraphRunner(Graph.deserialize(g.serialize()), backend="ref").run([xs]).outputs
    sim = GraphRunner(c.graph, backend="sim").run([xs]).outputs
    (k,) = ref
    assert np.array_equal(np.asarray(ref[k]), want) and np.array_equal(np.asarray(sim[k]), want)


def test_prelu_on_the_cpu_is_float():
    """A PReLU the target's rules put on the CPU (more channels than the ALU takes) stays a float XIR prelu on the
    dequantized input."""
    t = Target.parametric(2, 4, bank_depth=512)                       # ALU: at most 256·4 channels
    C = 1032
    slopes = np.linspace(0.0, 0.5, C).astype(np.float32)
    x = np.random.default_rng(0).normal(0, 1, (4, C, 1, 2)).astype(np.float32)
    res = quantize(_prelu_module(slopes), x, example_input=x[:1], target=t)
    (p,) = [n for n in res.prep.nodes if n.kind == "prelu"]
    assert p.cpu and p.device == "CPU" and "1032" in p.reason, p.reason
    g = Graph.deserialize(res.xmodel().serialize())
    assert g.ops[p.name].type == "prelu"
    runner = GraphRunner(g, backend="ref")
    spec = runner.get_inputs()[0]
    xin = runner.prepare_input(spec, x[:1], layout="nchw")
    xd = xin.astype(np.float32) * np.float32(2.0 ** -spec.fix_point)          # NHWC [1, 1, 2, C]
    got = np.asarray(runner.run([xin]).outputs[p.name])
    assert np.array_equal(got, np.where(xd < 0, xd * slopes, xd).astype(np.float32))


# ---- Transpose before Flatten + Gemm ------------------------------------------------------------------------------
class _PermDense(torch.nn.Module):
    def __init__(self, perm, matmul: bool):
        super().__init__()
        self.perm, self.matmul = perm, matmul
        self.conv = torch.nn.Conv2d(3, 5, 3)
        self.fc = torch.nn.Linear(5 * 4 * 5, 6)

    def forward(self, x):
        y = self.conv(x).permute(*self.perm).contiguous()
        y = y.view(y.shape[0], -1)
        return y @ self.fc.weight.T if self.matmul else self.fc(y)


def _float_check(model, x: np.ndarray) -> Prepared:
    """Prepares the ONNX export of `model` and checks the prepared float model against onnxruntime on the export."""
    import onnxruntime as ort
    m = torch_to_onnx(model, x[:1])
    prep = prepare(to_fgraph(m, "t"), QuantConfig())
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session(emit_onnx(prep, "float", None, batch=1))
    for i in range(len(x)):
        a = want.run(None, {want.get_inputs()[0].name: x[i:i + 1]})
        b = got.run(None, {prep.input_nodes[0].name: x[i:i + 1]})
        for u, v in zip(a, b):
            assert np.abs(u - v).max() <= 1e-5 * max(1.0, float(np.abs(u).max()))
    return prep


@pytest.mark.parametrize("perm", [(0, 3, 2, 1), (0, 2, 3, 1), (0, 1, 3, 2), (0, 3, 1, 2)])
@pytest.mark.parametrize("matmul", [False, True])
def test_transpose_folds_into_dense_weights(perm, matmul):
    torch.manual_seed(0)
    x = np.random.default_rng(1).normal(0, 1, (3, 3, 6, 7)).astype(np.float32)
    prep = _float_check(_PermDense(perm, matmul).eval(), x)
    assert all(n.kind != "float" for n in prep.nodes), [(n.name, n.kind) for n in prep.nodes]
    dense = [n for n in prep.nodes if n.kind == "conv" and n.attrs["kernel"] == [4, 5]]
    assert len(dense) == 1 and prep.node(dense[0].inputs[0]).kind == "conv"      # over the untransposed conv output


def test_other_transpose_stays_on_the_cpu():
    class T(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x.permute(0, 2, 3, 1))
    x = np.random.default_rng(2).normal(0, 1, (2, 3, 4, 5)).astype(np.float32)
    prep = _float_check(T(), x)
    (t,) = [n for n in prep.nodes if "Transpose" in n.name]
    assert t.kind == "float" and "Transpose [0, 2, 3, 1]" in t.reason and "not supported on the DPU" in t.reason


def test_transpose_with_a_non_constant_gemm_weight_is_an_error():
    """op_Transpose's contract: a form it cannot fold raises QuantError (the caller places the op on the CPU)."""
    from opendpu.quant import prepare as P
    from opendpu.quant.onnx_in import FGraph, Node
    fg = FGraph("t", [Node("tr", "Transpose", ["x"], ["t"], {"perm": [0, 3, 2, 1]}),
                      Node("fl", "Flatten", ["t"], ["f"], {"axis": 1}),
                      Node("mm", "MatMul", ["f", "w"], ["y"])],
                {}, [("x", [1, 2, 3, 4]), ("w", [24, 5])], ["y"],
                {"x": [1, 2, 3, 4], "t": [1, 4, 3, 2], "f": [1, 24], "w": [24, 5], "y": [1, 5]})
    pr = P._Prep(fg, QuantConfig())
    pr.add(QNode("x", "input", [], [1, 2, 3, 4]), "x")
    with pytest.raises(QuantError, match="Transpose"):
        pr.op_Transpose(fg.nodes[0])


# ---- MTCNN ---------------------------------------------------------------------------------------------------------
def _calib(name: str) -> np.ndarray:
    s = M.INPUT_SIZE[name]
    if name == "pnet":       # PNet scans whole images: scenes and faces
        return M.normalise(np.concatenate([M.scene_crops(s, N_CALIB // 2, 2), M.face_crops(s, N_CALIB // 2, 1)]))
    return M.normalise(M.face_crops(s, N_CALIB, 1))


def _evalset(name: str, n: int = N_EVAL) -> np.ndarray:
    s = M.INPUT_SIZE[name]
    return M.normalise(M.scene_crops(s, n, 98) if name == "pnet" else M.face_crops(s, n, 99))


@functools.lru_cache(maxsize=None)
def _mtcnn(name: str, target: str = TARGET):
    net = M.load(name)
    cal = _calib(name)
    res = quantize(net, cal, example_input=cal[:1], target=target)
    g, c = _compiled(res, target)
    return net, res, g, c


def _prelu_ops(c) -> dict[str, object]:
    """Placements of every op the PReLUs became (named after the ONNX PRelu nodes), consts excluded."""
    return {k: p for k, p in c.partition.placement.items() if "/prelu" in k and p.device != ""}


@pytest.mark.parametrize("name", ["pnet", "rnet", "onet"])
def test_mtcnn_transpose_fold_is_exact_in_float(name):
    _need(name)
    prep = _float_check(M.load(name), _evalset(name, 4))
    assert not [n.name for n in prep.nodes if n.kind == "float" and n.attrs.get("op_type") != "Softmax"]


@pytest.mark.parametrize("name", ["pnet", "rnet", "onet"])
def test_mtcnn_prelu_on_the_dpu_and_sim_equals_ref(name):
    _need(name)
    net, res, g, c = _mtcnn(name)
    ops = _prelu_ops(c)
    n_prelu = sum(1 for m in net.modules() if isinstance(m, torch.nn.PReLU))
    assert len({k.split("/")[1] for k in ops}) == n_prelu
    off = {k: p.reason for k, p in ops.items() if p.device != "DPU"}
    assert not off, off
    assert {p.engine for p in ops.values()} <= {"alu", "eltwise", "load/save"}
    cpu = {k for k, p in c.partition.placement.items() if p.device == "CPU"}
    assert all("oftmax" in k or "fix2float" in k or "reshape" in k for k in cpu), cpu   # only the softmax head
    _sim_vs_ref(g, c, _evalset(name))


def _errors(net, res, outs: dict[str, np.ndarray], x: np.ndarray) -> dict[str, tuple[float, float]]:
    """Per output: (max |q - f| / (max f - min f), rms |q - f| / (max f - min f)) against the float PyTorch net."""
    with torch.no_grad():
        fl = [o.numpy().astype(np.float64) for o in net(torch.from_numpy(x))]
    err = {}
    for f, k in zip(fl, res.prep.outputs):
        q = _nchw(outs[k]).reshape(f.shape)
        r = f.max() - f.min()
        err[k] = (float(np.abs(q - f).max() / r), float(np.sqrt(np.mean((q - f) ** 2)) / r))
    return err


def test_onet_landmarks_and_box_regression():
    """ONet on face crops, every op but the softmax on the DPU: box regression (output 0) and landmarks (output 1)
    of the compiled net against the float PyTorch ONet. INT8 with power-of-two scales leaves ~6 % / ~4 % of the
    outputs' range as the largest error, above the 2 % the float-head variant below reaches: a single rounding of
    the 256 features before the heads already costs >= 3.3 % (test_onet_int8_feature_rounding_floor); the probability
    of a face stays within 0.01."""
    _need("onet")
    net, res, g, c = _mtcnn("onet")
    x = _evalset("onet")
    err = _errors(net, res, _sim_vs_ref(g, c, x), x)
    box, marks, prob = (err[k] for k in res.prep.outputs)
    print(f"ONet max/rms error over the output range: box {box[0]:.4f}/{box[1]:.4f}, landmarks "
          f"{marks[0]:.4f}/{marks[1]:.4f}, face prob {prob[0]:.4f}")
    assert box[0] <= 0.10 and box[1] <= 0.03
    assert marks[0] <= 0.05 and marks[1] <= 0.015
    assert prob[0] <= 0.01


def test_onet_int8_feature_rounding_floor():
    """Why all-INT8 ONet misses 2 %: in the float net, rounding only prelu5's output (256 features, range about
    [-0.1, 2.9]) to INT8 at its best power-of-two fix point (6, which clips the tail above 1.98) already moves the
    box regression by 3.3 % of its range (5 % at fix point 5, which does not clip). Every fix point is tried, so
    no calibration method gets under 3 %; keeping the head in float does."""
    _need("onet")
    net = M.load("onet")
    x = torch.from_numpy(_evalset("onet"))
    with torch.no_grad():
        box = net(x)[0].numpy()
        worst = []
        for fp in range(0, 8):
            h = net.prelu5.register_forward_hook(
                lambda m, i, o, fp=fp: torch.clamp(torch.round(o * 2.0 ** fp), -128, 127) / 2.0 ** fp)
            q = net(x)[0].numpy()
            h.remove()
            worst.append(float(np.abs(q - box).max() / np.ptp(box)))
    print("box max error per prelu5 fix point:", [round(w, 4) for w in worst])
    assert min(worst) >= 0.03


ONET_FLOAT_HEAD = ("/conv4/Conv", "/prelu4/PRelu", "/dense5/Gemm", "/prelu5/PRelu", "/dense6_1/Gemm",
                   "/dense6_2/Gemm", "/dense6_3/Gemm")


def test_onet_within_2_percent_with_the_head_in_float():
    """The accuracy mode a vai_q_onnx user picks for a regression head: `nodes_to_exclude` keeps conv4, dense5 and
    the three heads float on the CPU (4.6 % of the MACs), bias correction, 256 calibration crops. conv1-conv3 and
    their PReLUs stay on the DPU; box regression and landmarks are within 2 % of the float outputs' range on 96
    face crops, and sim == ref."""
    _need("onet")
    net = M.load("onet")
    cal = M.normalise(M.face_crops(M.INPUT_SIZE["onet"], 256, 1))
    cfg = QuantConfig(nodes_to_exclude=ONET_FLOAT_HEAD, bias_corr=True)
    res = quantize(net, cal, example_input=cal[:1], target=TARGET, config=cfg)
    g, c = _compiled(res)
    pl = c.partition.placement
    assert all(pl[k].device == "CPU" and "nodes_to_exclude" in pl[k].reason
               for k in ("/dense5/Gemm", "/prelu5/PRelu", "/dense6_2/Gemm", "/dense6_3/Gemm")), pl
    dpu_prelu = {k.split("/")[1] for k, p in _prelu_ops(c).items() if p.device == "DPU"}
    assert dpu_prelu == {"prelu1", "prelu2", "prelu3"}, dpu_prelu
    cov = res.coverage()
    assert 95 <= cov["macs_dpu_pct"] < 96, cov["macs_dpu_pct"]
    x = _evalset("onet", 96)
    err = _errors(net, res, _sim_vs_ref(g, c, x), x)
    box, marks = (err[k] for k in res.prep.outputs[:2])
    print(f"ONet, head in float: max/rms error over the output range: box {box[0]:.4f}/{box[1]:.4f}, landmarks "
          f"{marks[0]:.4f}/{marks[1]:.4f}; DPU MACs {cov['macs_dpu_pct']:.1f} %")
    assert box[0] <= 0.02 and marks[0] <= 0.02


def test_onet_prelu_on_the_dpu_costs_no_accuracy(monkeypatch):
    """The same quantization with the PReLUs computed in float on the CPU (the quantizer's fallback for an op it
    cannot place) is no more accurate: PReLU on the DPU adds no error of note."""
    _need("onet")
    from opendpu.quant import prepare as P
    net, res, g, c = _mtcnn("onet")
    x = _evalset("onet")
    dpu = _errors(net, res, {k: v for k, v in res.run(x, "dpu").items()}, x)

    def cpu_prelu(self, node):
        raise self.err(node, "kept in float for the comparison")
    monkeypatch.setattr(P._Prep, "op_PRelu", cpu_prelu)
    cal = _calib("onet")
    res_cpu = quantize(net, cal, example_input=cal[:1], target=TARGET)
    assert sum(1 for n in res_cpu.prep.nodes if n.kind == "float" and "PRelu" in n.name) == 5
    cpu = _errors(net, res_cpu, res_cpu.run(x, "dpu"), x)
    for k, kc in zip(res.prep.outputs[:2], res_cpu.prep.outputs[:2]):
        assert dpu[k][1] <= 1.2 * cpu[kc][1], (k, dpu[k], cpu[kc])


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(PRESETS))
@pytest.mark.parametrize("name", ["pnet", "rnet", "onet"])
def test_mtcnn_every_preset(name, key):
    _need(name)
    net, res, g, c = _mtcnn(name, key)
    assert all(p.device == "DPU" for p in _prelu_ops(c).values())
    x = _evalset(name, 96)
    outs = _sim_vs_ref(g, c, x)
    if name == "onet":
        err = _errors(net, res, outs, x)
        assert max(err[k][0] for k in res.prep.outputs[:2]) <= 0.12
