"""Model zoo and digits benchmark: topologies build, check and run; counts match published figures; the committed
digits ONNX reproduces its stored held-out accuracy."""

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from opendpu.quant import zoo
from opendpu.quant.onnx_in import QuantError

CLASSIFIERS = tuple(n for n in zoo.NAMES if "yolo" not in n)


def _out_shapes(name, size):
    if name == "tiny_yolo":
        return [(1, 255, size // 32, size // 32), (1, 255, size // 16, size // 16)]
    if name == "tiny_yolo_v2":
        return [(1, 125, size // 32, size // 32)]
    if name == "yolov3":
        return [(1, 255, size // d, size // d) for d in (32, 16, 8)]
    return [(1, 1000)]


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"input": x})


def _ops(model):
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("name", zoo.NAMES)
def test_default_size_valid_and_matches_published(name):
    m = zoo.build(name)
    onnx.checker.check_model(m)
    size = zoo.DEFAULT_SIZE[name]
    assert m.graph.name == name
    assert [i.name for i in m.graph.input] == ["input"]
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 3, size, size]
    assert [o.name for o in m.graph.output] == {"tiny_yolo": ["output0", "output1"],
                                                "yolov3": ["output0", "output1", "output2"]}.get(name, ["output"])
    assert [tuple(d.dim_value for d in o.type.tensor_type.shape.dim) for o in m.graph.output] == \
        _out_shapes(name, size)
    names = [n.name for n in m.graph.node]
    assert all(names) and len(set(names)) == len(names)
    c, pub = zoo.count(m), zoo.PUBLISHED[name]
    assert c["gops"] == pytest.approx(2 * c["macs"] / 1e9)
    assert abs(c["macs"] / pub["macs"] - 1) < 0.03, (c["macs"], pub["macs"])
    assert abs(c["params"] / pub["params"] - 1) < 0.03, (c["params"], pub["params"])


@pytest.mark.parametrize("name", zoo.NAMES)
def test_small_sizes_run_in_onnxruntime(name):
    for size in ((64, 96) if "yolo" in name else (32, 64)):
        m = zoo.build(name, size)
        onnx.checker.check_model(m)
        x = np.random.default_rng(size).standard_normal((1, 3, size, size)).astype(np.float32)
        outs = _run(m, x)
        want = _out_shapes(name, size)
        assert [o.shape for o in outs] == want
        for o, vi in zip(outs, m.graph.output):
            assert list(o.shape) == [d.dim_value for d in vi.type.tensor_type.shape.dim]
            assert np.isfinite(o).all()
            # not dead, not exploding; at 32 the last depthwise layers see 1x1 maps and only their centre tap
            assert (0.1 if size >= 64 else 0.03) < o.std() < 100, (size, o.std())


def test_structure():
    m = {n: zoo.build(n, 64) for n in zoo.NAMES}
    for n in zoo.NAMES:
        ops = _ops(m[n])
        inits = {t.name for t in m[n].graph.initializer}
        # every BN follows a bias-free Conv (separate nodes: the quantizer folds them)
        producer = {o: nd for nd in m[n].graph.node for o in nd.output}
        for nd in m[n].graph.node:
            if nd.op_type == "BatchNormalization":
                conv = producer[nd.input[0]]
                assert conv.op_type == "Conv" and len(conv.input) == 2, nd.name
                assert all(i in inits for i in nd.input[1:])
        assert ("BatchNormalization" in ops) == (n != "squeezenet")
    assert _ops(m["resnet18"]).count("Add") == 8 and _ops(m["resnet50"]).count("Add") == 16
    assert sum(nd.name.endswith("downsample.0") for nd in m["resnet50"].graph.node) == 4
    # Caffe ResNet-50: the stride sits on the 1x1 branch2a / branch1 of res3a, res4a, res5a, never on a 3x3
    strided = sorted(nd.name for nd in m["resnet50_caffe"].graph.node if nd.op_type == "Conv" and nd.name != "conv1"
                     and helper.get_attribute_value(next(a for a in nd.attribute if a.name == "strides")) == [2, 2])
    assert strided == [f"res{s}a_{br}" for s in (3, 4, 5) for br in ("branch1", "branch2a")]
    assert _ops(m["resnet50_caffe"]).count("Add") == 16
    assert [nd.op_type for nd in m["tiny_yolo_v2"].graph.node].count("MaxPool") == 6
    # YOLOv3: 23 residual adds in Darknet-53 (1 + 2 + 8 + 8 + 4), 75 convs, 2 upsamples joined by concats
    y3 = _ops(m["yolov3"])
    assert y3.count("Add") == 23 and y3.count("Conv") == 75 and y3.count("Resize") == 2 and y3.count("Concat") == 2
    dw = [nd for nd in m["mobilenet_v1"].graph.node if nd.op_type == "Conv"
          and helper.get_attribute_value(next(a for a in nd.attribute if a.name == "group")) > 1]
    assert len(dw) == 13
    clips = [nd for nd in m["mobilenet_v2"].graph.node if nd.op_type == "Clip"]
    assert clips and all(len(c.input) == 3 for c in clips)
    assert _ops(m["mobilenet_v2"]).count("Add") == 10 and "Relu" not in _ops(m["mobilenet_v2"])
    for n in ("mobilenet_v2", "squeezenet", "inception_v1"):
        assert "Dropout" in _ops(m[n])
    assert _ops(m["squeezenet"]).count("Concat") == 8 and _ops(m["inception_v1"]).count("Concat") == 9
    for n in ("squeezenet", "inception_v1"):
        pools = [nd for nd in m[n].graph.node if nd.op_type == "MaxPool"]
        assert pools and all(helper.get_attribute_value(a) == 1 for p in pools for a in p.attribute
                             if a.name == "ceil_mode")
    bn_eps = [helper.get_attribute_value(a) for nd in m["inception_v1"].graph.node for a in nd.attribute
              if nd.op_type == "BatchNormalization" and a.name == "epsilon"]
    assert len(bn_eps) == 57 and bn_eps == pytest.approx([1e-3] * 57)
    yolo = m["tiny_yolo"].graph
    (resize,) = [nd for nd in yolo.node if nd.op_type == "Resize"]
    attrs = {a.name: helper.get_attribute_value(a) for a in resize.attribute}
    assert attrs == {"mode": b"nearest", "coordinate_transformation_mode": b"asymmetric", "nearest_mode": b"floor"}
    assert _ops(m["tiny_yolo"]).count("LeakyRelu") == 11
    last_pool = [nd for nd in yolo.node if nd.op_type == "MaxPool"][-1]
    pa = {a.name: helper.get_attribute_value(a) for a in last_pool.attribute}
    assert pa["strides"] == [1, 1] and pa["pads"] == [0, 0, 1, 1]


def test_count_hand_built_graph():
    # input [1,3,8,8]
    # conv  3->4, 3x3, pad 1, bias    : out 1x4x8x8 = 256 elems * 3*3*3 = 6912 MACs; 108 + 4 params
    # dwconv group 4, 3x3, s2, pad 1 : out 1x4x4x4 =  64 elems * 1*3*3 =  576 MACs;  36 params
    # BN(4): gamma + beta = 8 params (running mean/var not counted)
    # flatten [1,64]; Gemm transB W[10,64] + b[10]: 1*10*64 = 640 MACs; 650 params
    # MatMul [1,10] x W[10,5]: 1*5*10 = 50 MACs; 50 params
    rng = np.random.default_rng(0)

    def t(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2],
                         group=4),
        helper.make_node("BatchNormalization", ["c2", "g", "be", "mu", "var"], ["bn"]),
        helper.make_node("Flatten", ["bn"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["g1"], transB=1),
        helper.make_node("MatMul", ["g1", "w4"], ["output"]),
    ]
    inits = [t("w1", 4, 3, 3, 3), t("b1", 4), t("w2", 4, 1, 3, 3), t("g", 4), t("be", 4), t("mu", 4),
             numpy_helper.from_array(np.ones(4, np.float32), "var"), t("w3", 10, 64), t("b3", 10), t("w4", 10, 5)]
    g = helper.make_graph(nodes, "hand", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 5])], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    c = zoo.count(m)
    assert c["macs"] == 6912 + 576 + 640 + 50
    assert c["params"] == 108 + 4 + 36 + 8 + 650 + 50
    assert c["gops"] == pytest.approx(2 * 8178 / 1e9)


def test_determinism_and_seed():
    a, b = zoo.build("resnet18", 32, seed=0), zoo.build("resnet18", 32, seed=0)
    assert a.SerializeToString() == b.SerializeToString()
    c = zoo.build("resnet18", 32, seed=1)
    assert _ops(a) == _ops(c)
    wa = {t.name: numpy_helper.to_array(t) for t in a.graph.initializer}
    wc = {t.name: numpy_helper.to_array(t) for t in c.graph.initializer}
    assert wa.keys() == wc.keys()
    assert not np.array_equal(wa["conv1.weight"], wc["conv1.weight"])
    assert not np.array_equal(wa["fc.weight"], wc["fc.weight"])


def test_unknown_name_and_summary():
    with pytest.raises(ValueError, match="resnet18.*tiny_yolo"):
        zoo.build("vgg16")
    rows = zoo.summary(["squeezenet", "mobilenet_v2"], 64)
    assert [r["name"] for r in rows] == ["squeezenet", "mobilenet_v2"]
    assert rows[0]["input"] == "1x3x64x64"
    assert set(rows[0]) == {"name", "input", "macs", "gops", "params", "published_gops", "published_params"}
    assert rows[0]["params"] == zoo.PUBLISHED["squeezenet"]["params"]  # params do not depend on input size
    assert rows[0]["macs"] < zoo.PUBLISHED["squeezenet"]["macs"] / 5


def test_digits_data():
    x_tr, y_tr, x_te, y_te = zoo.digits_data()
    assert x_tr.shape == (1257, 1, 8, 8) and x_te.shape == (540, 1, 8, 8)
    assert x_tr.dtype == np.float32 and y_tr.dtype == np.int64
    assert x_tr.min() == -1.0 and x_tr.max() == 1.0
    n_te, n_all = np.bincount(y_te), np.bincount(y_te) + np.bincount(y_tr)
    assert np.all(np.abs(n_te - 0.3 * n_all) <= 1)  # stratified: 30 % of each class
    again = zoo.digits_data()
    assert all(np.array_equal(p, q) for p, q in zip((x_tr, y_tr, x_te, y_te), again))


def test_digits_onnx_accuracy():
    assert os.path.getsize(zoo.DIGITS_ONNX) < 100_000
    m = onnx.load(zoo.DIGITS_ONNX)
    onnx.checker.check_model(m)
    assert _ops(m).count("BatchNormalization") == 2
    meta = {p.key: p.value for p in m.metadata_props}
    stored = float(meta["heldout_accuracy"])
    _, _, x_te, y_te = zoo.digits_data()
    sess = ort.InferenceSession(zoo.DIGITS_ONNX, providers=["CPUExecutionProvider"])
    pred = np.array([sess.run(None, {"input": x[None]})[0].argmax() for x in x_te])
    acc = float((pred == y_te).mean())
    assert acc >= 0.96
    assert abs(acc - stored) < 1e-9


def test_non_square_input():
    m = zoo.build("yolov3", (256, 512))
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 256, 512]
    assert [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output] == \
        [[1, 255, 256 // d, 512 // d] for d in (32, 16, 8)]
    # 65.864 GOPs at 416x416 scale with the pixels: 49.885 GOPs at 256x512 (PG338 lists 53.7)
    assert zoo.count(m)["gops"] == pytest.approx(65.864075264 * 256 * 512 / 416 ** 2, rel=1e-6)
    with pytest.raises(QuantError, match="give one size or a pair"):
        zoo.build("yolov3", (256, 512, 3))
