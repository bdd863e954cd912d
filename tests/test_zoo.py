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
    if name in ("tiny_yolo_v2", "yolov2"):
        return [(1, 125, size // 32, size // 32)]
    if name in ("yolov3", "yolov3_voc"):
        c = 255 if name == "yolov3" else 75
        return [(1, c, size // d, size // d) for d in (32, 16, 8)]
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
                                                "yolov3": ["output0", "output1", "output2"],
                                                "yolov3_voc": ["output0", "output1", "output2"]}.get(name, ["output"])
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
    # yolov2 at one size: its 67 M weights make each onnxruntime session a few seconds
    # inception_v3's stem and grid reductions need 75 pixels (torchvision's minimum)
    for size in ((64,) if name == "yolov2" else (64, 96) if "yolo" in name else (96,) if name == "inception_v3"
                 else (32, 64)):
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
    m = {n: zoo.build(n, 96 if n == "inception_v3" else 64) for n in zoo.NAMES}
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
        assert ("BatchNormalization" in ops) == (n not in ("squeezenet", "inception_v1_caffe", "vgg16", "vgg19"))
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
    # YOLOv2 (yolo-voc.2.0.cfg): 22 convs, 5 pools; layer 16's map reorganized (SpaceToDepth 2) and concatenated
    # before layer 24's output: 4 * 512 + 1024 = 3072 channels into layer 28
    y2 = m["yolov2"]
    assert _ops(y2).count("Conv") == 22 and _ops(y2).count("MaxPool") == 5 and _ops(y2).count("LeakyRelu") == 21
    (s2d,) = [nd for nd in y2.graph.node if nd.op_type == "SpaceToDepth"]
    (cat,) = [nd for nd in y2.graph.node if nd.op_type == "Concat"]
    assert s2d.input == ["layer16.leaky"] and helper.get_attribute_value(s2d.attribute[0]) == 2
    assert cat.input == [s2d.output[0], "layer24.leaky"]
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in onnx.shape_inference.infer_shapes(y2).graph.value_info}
    assert shapes["layer16.leaky"] == [1, 512, 4, 4] and shapes[s2d.output[0]] == [1, 2048, 2, 2]
    assert shapes[cat.output[0]] == [1, 3072, 2, 2]
    # TF-slim resnet_v1: the stride on the 3x3 of each block's last unit (blocks 1-3), that unit's shortcut a 1x1
    # stride-2 subsample; 16 / 33 / 50 residual adds
    def _strided(model):
        return sorted(nd.name for nd in model.graph.node if nd.op_type in ("Conv", "MaxPool") and
                      helper.get_attribute_value(next(a for a in nd.attribute if a.name == "strides")) == [2, 2])
    assert _strided(m["resnet50_tf"]) == sorted(["conv1.conv", "pool1"] + [
        f"block{b}.unit_{u}.{k}" for b, u in ((1, 3), (2, 4), (3, 6)) for k in ("conv2.conv", "shortcut")])
    assert [_ops(m[n]).count("Add") for n in ("resnet50_tf", "resnet101_tf", "resnet152_tf")] == [16, 33, 50]
    for n, convs in (("vgg16", 13), ("vgg19", 16)):
        assert _ops(m[n]).count("Conv") == convs and _ops(m[n]).count("Gemm") == 3 and _ops(m[n]).count("MaxPool") == 5
    # Inception v3: 3 InceptionA, 4 InceptionC with 1x7 / 7x1 factorized convs, 2 InceptionE with split 1x3 / 3x1
    v3 = m["inception_v3"].graph
    kshapes = [tuple(helper.get_attribute_value(a)) for nd in v3.node if nd.op_type == "Conv" for a in nd.attribute
               if a.name == "kernel_shape"]
    assert (kshapes.count((1, 7)), kshapes.count((7, 1)), kshapes.count((1, 3)), kshapes.count((3, 1))) == \
        (4 * 3 + 1, 4 * 3 + 1, 4, 4)
    assert _ops(m["inception_v3"]).count("AveragePool") == 9 and _ops(m["inception_v3"]).count("Conv") == 94
    # width multipliers: MobileNet v1 0.25 starts at 8 channels, v2 1.4 at 48 and ends at 1792
    first = {n: next(t for t in m[n].graph.initializer if t.name == "features.0.conv.weight").dims[0]
             for n in ("mobilenet_v1_025", "mobilenet_v1_050", "mobilenet_v2_140")}
    assert first == {"mobilenet_v1_025": 8, "mobilenet_v1_050": 16, "mobilenet_v2_140": 48}
    assert next(t for t in m["mobilenet_v2_140"].graph.initializer if t.name == "fc.weight").dims[1] == 1792
    dw = [nd for nd in m["mobilenet_v1"].graph.node if nd.op_type == "Conv"
          and helper.get_attribute_value(next(a for a in nd.attribute if a.name == "group")) > 1]
    assert len(dw) == 13
    clips = [nd for nd in m["mobilenet_v2"].graph.node if nd.op_type == "Clip"]
    assert clips and all(len(c.input) == 3 for c in clips)
    assert _ops(m["mobilenet_v2"]).count("Add") == 10 and "Relu" not in _ops(m["mobilenet_v2"])
    for n in ("mobilenet_v2", "squeezenet", "inception_v1"):
        assert "Dropout" in _ops(m[n])
    assert _ops(m["squeezenet"]).count("Concat") == 8 and _ops(m["inception_v1"]).count("Concat") == 9
    assert _ops(m["inception_v1_caffe"]).count("Concat") == 9 and "LRN" not in _ops(m["inception_v1_caffe"])
    for n in ("squeezenet", "inception_v1", "inception_v1_caffe"):
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
        zoo.build("vgg11")
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


# darknet yolo-voc.2.0.cfg at 416: (output grid, Cin, Cout, k) of each conv, from the cfg's layer list
YOLOV2_416 = [(416, 3, 32, 3), (208, 32, 64, 3), (104, 64, 128, 3), (104, 128, 64, 1), (104, 64, 128, 3),
              (52, 128, 256, 3), (52, 256, 128, 1), (52, 128, 256, 3), (26, 256, 512, 3), (26, 512, 256, 1),
              (26, 256, 512, 3), (26, 512, 256, 1), (26, 256, 512, 3), (13, 512, 1024, 3), (13, 1024, 512, 1),
              (13, 512, 1024, 3), (13, 1024, 512, 1), (13, 512, 1024, 3), (13, 1024, 1024, 3), (13, 1024, 1024, 3),
              (13, 3072, 1024, 3), (13, 1024, 125, 1)]


def test_yolov2_is_pg338s_82_5_gops_at_640():
    """darknet lists yolo-voc.2.0.cfg at 34.90 BFLOPs (2*MACs) at 416; the count scales with the pixels to 82.6 GOPs
    at 640x640, PG338's YOLO-V2 (82.5)."""
    hand = sum(s * s * cin * cout * k * k for s, cin, cout, k in YOLOV2_416)
    assert hand == 17_449_063_424 and round(2 * hand / 1e9, 2) == 34.90
    assert zoo.count(zoo.build("yolov2"))["macs"] == hand
    c = zoo.count(zoo.build("yolov2", 640))
    assert c["macs"] == hand * 640 ** 2 // 416 ** 2 and round(c["gops"], 1) == 82.6
    assert abs(c["gops"] / 82.5 - 1) < 0.002
    with pytest.raises(QuantError, match=r"layer26.reorg reorganizes a 7x7 map by 2\); use a multiple of 32"):
        zoo.build("yolov2", 112)                  # 112 / 16 = 7: onnx infers 3x3, onnxruntime refuses to run


def test_inception_v1_caffe_is_googlenet_table_1():
    """The Caffe GoogLeNet against Szegedy et al. 2014, Table 1: each row's multiply-adds (in millions, as printed)
    and the inception outputs' sizes; a real 5x5 in every third branch."""
    m = zoo.build("inception_v1_caffe")
    inf = onnx.shape_inference.infer_shapes(m)
    shp = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
           for v in list(inf.graph.value_info) + list(inf.graph.output)}
    w = {t.name: list(t.dims) for t in m.graph.initializer}
    macs: dict[str, int] = {}
    for n in m.graph.node:
        if n.op_type in ("Conv", "Gemm"):
            row = n.name.split("/")[0]
            macs[row] = macs.get(row, 0) + int(np.prod(shp[n.output[0]])) * int(np.prod(w[n.input[1]][1:]))
    # as printed, except 5a: the table prints 54 M, its own row (7x7x832 in; 256, 160->320, 32->128 5x5, 128)
    # gives 832·49·(256 + 160 + 32 + 128) + 49·(9·160·320 + 25·32·128) = 51.08 M
    table = {"conv1": 118, "conv2": 360, "inception_3a": 128, "inception_3b": 304, "inception_4a": 73,
             "inception_4b": 88, "inception_4c": 100, "inception_4d": 119, "inception_4e": 170, "inception_5a": 51,
             "inception_5b": 71, "loss3": 1}
    assert macs.keys() == table.keys() and all(abs(macs[k] / 1e6 - v) < 1 for k, v in table.items()), macs
    assert macs["inception_5a"] == 832 * 49 * (256 + 160 + 32 + 128) + 49 * (9 * 160 * 320 + 25 * 32 * 128)
    sizes = {n.name.split("/")[0]: shp[n.output[0]][1:] for n in m.graph.node if n.name.endswith("/output")}
    assert sizes == {"inception_3a": [256, 28, 28], "inception_3b": [480, 28, 28], "inception_4a": [512, 14, 14],
                     "inception_4b": [512, 14, 14], "inception_4c": [512, 14, 14], "inception_4d": [528, 14, 14],
                     "inception_4e": [832, 14, 14], "inception_5a": [832, 7, 7], "inception_5b": [1024, 7, 7]}
    assert all(w[f"{k}/5x5.weight"][2:] == [5, 5] for k in sizes)


def test_yolov2_reorg_runs_on_the_dpu():
    """SpaceToDepth (the reorg) becomes the quantizer's `tile` (tile-fix, stride 2): the whole model is on the DPU;
    UG1414's reorg limit stride²·C ≤ 256·CP holds for its 512 channels on B4096 (2048 ≤ 4096)."""
    from opendpu.quant.inspect import inspect_model

    _, prep, rows = inspect_model(zoo.build("yolov2", 64), "B4096")
    assert [(n.name, p.reason) for n, p in rows if p.device == "CPU"] == []
    r = prep.node("layer26.reorg")
    assert r.kind == "tile" and r.attrs == {"stride": 2, "reverse": False} and r.shape == [1, 2048, 2, 2]


@pytest.mark.slow
def test_yolov2_quantizes_and_compiles_with_the_reorg_on_the_dpu():
    """The whole flow at 64x64 (bench_calibration.py's: 4 random calibration images, B4096): one DPU subgraph
    holding the tile-fix; the compiled xmodel on the cycle model gives the quantized graph's outputs on the
    reference byte for byte."""
    from opendpu.compiler.pipeline import compile as compile_graph
    from opendpu.compiler.xir.graph import Graph
    from opendpu.quant.quantize import QuantConfig, quantize
    from opendpu.runtime.runner import GraphRunner

    x = np.random.default_rng(0).normal(0, 1, (4, 3, 64, 64)).astype(np.float32)
    res = quantize(zoo.build("yolov2", 64), x, config=QuantConfig(method="maxmin"))
    q = Graph.deserialize(res.xmodel().serialize())
    g = compile_graph(q, "DPUCZDX8G_ISA1_B4096", name="yolov2").graph
    assert [s.device for s in g.toposort_child_subgraphs()] == ["USER", "DPU"]
    dpu = next(s for s in g.root.children if s.device == "DPU")
    assert g.ops["layer26.reorg"].type == "tile-fix" and "layer26.reorg" in dpu.all_ops()
    xin = [np.random.default_rng(1).integers(-128, 128, (1, 64, 64, 3), dtype=np.int8)]
    want = GraphRunner(q, backend="ref").run(xin).outputs
    got = GraphRunner(g, backend="sim", seed=3).run(xin).outputs
    assert set(got) == set(want) and all(np.array_equal(np.asarray(got[k]), np.asarray(v)) for k, v in want.items())
