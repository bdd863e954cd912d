"""Model zoo: standard DPU benchmark topologies generated in code as float ONNX (opset 17) with deterministic
random weights, their MAC/parameter counts checked against published figures, and the load_digits data set."""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from opendpu.quant.onnx_in import QuantError
from opendpu.quant.zoo_more import (_VGG16, _VGG19, _inception_v3, _mobilenet_v1_width, _mobilenet_v2_width,
                                    _resnet_tf, _vgg)

OPSET = 17
NAMES = ("resnet18", "resnet50", "resnet50_caffe", "mobilenet_v1", "mobilenet_v2", "squeezenet", "inception_v1",
         "inception_v1_caffe", "tiny_yolo", "tiny_yolo_v2", "yolov2", "yolov3",
         # the board-throughput tables' topologies (issue 33, docs/calibration.md)
         "resnet50_tf", "resnet101_tf", "resnet152_tf", "vgg16", "vgg19", "mobilenet_v1_050", "mobilenet_v1_025",
         "mobilenet_v2_140", "yolov3_voc", "inception_v3")
DEFAULT_SIZE = {"resnet18": 224, "resnet50": 224, "resnet50_caffe": 224, "mobilenet_v1": 224, "mobilenet_v2": 224,
                "squeezenet": 224, "inception_v1": 224, "inception_v1_caffe": 224, "tiny_yolo": 416,
                "tiny_yolo_v2": 416, "yolov2": 416, "yolov3": 416, "resnet50_tf": 224, "resnet101_tf": 224,
                "resnet152_tf": 224, "vgg16": 224, "vgg19": 224, "mobilenet_v1_050": 160, "mobilenet_v1_025": 128,
                "mobilenet_v2_140": 224, "yolov3_voc": 416, "inception_v3": 299}
DIGITS_ONNX = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "digits_cnn.onnx")

# Published compute and size of each model at its default input size. "macs" are multiply-accumulates
# (gops = 2 * macs / 1e9), "params" counts learnable parameters (conv/fc weights and biases + BN gamma/beta,
# no BN running statistics), as torchvision does.
# Sources:
#  - torchvision weight metadata (torchvision/models/*.py, `num_params` and `_ops`; the docs' "GFLOPS" column
#    is this `_ops` value and is in fact GMACs): resnet18 1.814 / 11,689,512; resnet50 4.089 / 25,557,032;
#    mobilenet_v2 0.301 / 3,504,872; squeezenet1_1 0.349 / 1,235,496 (at 224); googlenet 1.498 / 6,624,904.
#  - MobileNet v1: Howard et al. 2017 (arXiv:1704.04861): 1.0 MobileNet-224 has 569 M mult-adds and 4.2 M parameters.
#  - tiny-YOLOv3: darknet (pjreddie.com/darknet/yolo) lists 5.56 Bn FLOPs at 416 (darknet counts 2*MACs);
#    the Hailo model zoo lists tiny_yolov3 at 416x416 with 8.85 M parameters (and 5.58 G ops).
#  - vitis_ai: the matching Vitis AI model-zoo entry (name ends in its GOPs = 2*MACs for that variant). These are
#    different trainings/frameworks (caffe/TF variants, dk_tiny-yolov3 is a private-data model), so they are
#    listed for reference only and not used for the check.
PUBLISHED: dict[str, dict] = {
    "resnet18": {"macs": 1_814_000_000, "params": 11_689_512, "source": "torchvision ResNet18_Weights.IMAGENET1K_V1",
                 "vitis_ai": "cf_resnet18_imagenet_224_224_3.65G"},
    "resnet50": {"macs": 4_089_000_000, "params": 25_557_032, "source": "torchvision ResNet50_Weights.IMAGENET1K_V1",
                 "vitis_ai": "pt_resnet50_imagenet_224_224_8.2G"},
    "resnet50_caffe": {"macs": 3_860_000_000, "params": 25_557_032,
                       "source": "He et al. 2015 (arXiv:1512.03385, Table 1: 3.8e9 multiply-adds); PG338's "
                                 "ResNet50 (7.7 GOPs) and UG1414's vaitrace table (Figure 37, the layer names)",
                       "vitis_ai": "cf_resnet50_imagenet_224_224_7.7G"},
    "mobilenet_v1": {"macs": 569_000_000, "params": 4_200_000, "source": "Howard et al. 2017 (arXiv:1704.04861)",
                     "vitis_ai": "tf_mobilenetv1_1.0_imagenet_224_224_1.14G"},
    "mobilenet_v2": {"macs": 301_000_000, "params": 3_504_872,
                     "source": "torchvision MobileNet_V2_Weights.IMAGENET1K_V1",
                     "vitis_ai": "tf_mobilenetv2_1.0_imagenet_224_224_0.59G"},
    "squeezenet": {"macs": 349_000_000, "params": 1_235_496, "source": "torchvision SqueezeNet1_1_Weights (224)",
                   "vitis_ai": "pt_squeezenet_imagenet_224_224_703.5M"},
    "inception_v1": {"macs": 1_498_000_000, "params": 6_624_904, "source": "torchvision GoogLeNet_Weights (no aux)",
                     "vitis_ai": "tf_inceptionv1_imagenet_224_224_3G"},
    "inception_v1_caffe": {"macs": 1_586_000_000, "params": 6_998_552,
                           "source": "Szegedy et al. 2014 (arXiv:1409.4842) Table 1: 1,586 M multiply-adds (the ops "
                                     "column summed); params counted by hand from bvlc_googlenet's prototxt without "
                                     "the auxiliary classifiers: conv and fc weights and biases; PG338's "
                                     "Inception-v1 (3.2 GOPs)",
                           "vitis_ai": "cf_inceptionv1_imagenet_224_224_3.16G"},
    "tiny_yolo": {"macs": 2_780_000_000, "params": 8_850_000,
                  "source": "darknet yolov3-tiny 5.56 BFLOPs; Hailo model zoo tiny_yolov3 8.85 M params",
                  "vitis_ai": "dk_tiny-yolov3_416_416_5.46G"},
    "tiny_yolo_v2": {"macs": 3_485_000_000, "params": 15_861_773,
                     "source": "darknet tiny-yolo-voc.cfg: 6.97 BFLOPs at 416 (darknet counts 2*MACs), PG338's "
                               "Tiny-YOLO (6.97 GOPs); params counted by hand from the cfg: conv weights "
                               "15,855,536 + BN 6,112 + detection bias 125",
                     "vitis_ai": "PG338 Tiny-YOLO 6.97G"},
    "yolov2": {"macs": 17_450_000_000, "params": 67_137_565,
               "source": "darknet yolo-voc.2.0.cfg (YOLOv2 VOC, first release: the passthrough reorgs the 512-channel "
                         "map directly, no 1x1 64-channel conv): 34.90 BFLOPs at 416 (darknet counts 2*MACs); "
                         "params counted by hand from the cfg: conv weights 67,116,896 + BN 20,544 + detection bias "
                         "125. PG338's YOLO-V2 (82.5 GOPs) is this network at 640x640 (34.90 * (640/416)^2 = 82.6; "
                         "the later yolo-voc.cfg / yolov2.cfg with the 64-channel conv fit 82.5 at no standard size)",
               "vitis_ai": "PG338 YOLO-V2 82.5G"},
    "yolov3": {"macs": 32_930_000_000, "params": 61_949_149,
               "source": "darknet yolov3.cfg: 65.86 BFLOPs at 416 (2*MACs); 61,949,149 parameters (Ultralytics' "
                         "yolov3 summary); PG338's YOLO-V3 512x256 is this network at 256x512 (input_size=(256, 512))",
               "vitis_ai": "PG338 YOLO-V3 512x256 53.7G"},
    # issue 33: the Vitis AI 2.5 Model Zoo's board fps tables (../shared/reference/model-zoo-2.5-fps.csv) name these
    "resnet50_tf": {"macs": 3_485_000_000, "params": 25_557_032,
                    "source": "TF-slim resnet_v1_50 (tensorflow/models research/slim nets/resnet_v1.py: the stride on "
                              "the 3x3 of each block's last unit); the 2.5 zoo's tf_resnetv1_50 is 6.97 GOPs",
                    "vitis_ai": "tf_resnetv1_50_imagenet_224_224_6.97G"},
    "resnet101_tf": {"macs": 7_200_000_000, "params": 44_549_160,
                     "source": "TF-slim resnet_v1_101 (as resnet50_tf, 3/4/23/3 units); the 2.5 zoo's 14.4 GOPs",
                     "vitis_ai": "tf_resnetv1_101_imagenet_224_224_14.4G"},
    "resnet152_tf": {"macs": 10_915_000_000, "params": 60_192_808,
                     "source": "TF-slim resnet_v1_152 (3/8/36/3 units); the 2.5 zoo's 21.83 GOPs",
                     "vitis_ai": "tf_resnetv1_152_imagenet_224_224_21.83G"},
    "vgg16": {"macs": 15_470_000_000, "params": 138_357_544, "source": "torchvision VGG16_Weights.IMAGENET1K_V1",
              "vitis_ai": "tf_vgg16_imagenet_224_224_30.96G"},
    "vgg19": {"macs": 19_630_000_000, "params": 143_667_240, "source": "torchvision VGG19_Weights.IMAGENET1K_V1",
              "vitis_ai": "tf_vgg19_imagenet_224_224_39.28G"},
    "mobilenet_v1_050": {"macs": 76_000_000, "params": 1_320_000,
                         "source": "Howard et al. 2017 Table 7: 0.50 MobileNet-160, 76 M mult-adds, 1.32 M parameters",
                         "vitis_ai": "tf_mobilenetv1_0.5_imagenet_160_160_150M"},
    "mobilenet_v1_025": {"macs": 13_500_000, "params": 470_000,
                         "source": "Howard et al. 2017 Table 7: 0.25 MobileNet-128, 14 M mult-adds (rounded; the 2.5 "
                                   "zoo's 27 M ops are 13.5 M), 0.47 M parameters",
                         "vitis_ai": "tf_mobilenetv1_0.25_imagenet_128_128_27M"},
    "mobilenet_v2_140": {"macs": 582_000_000, "params": 6_060_000,
                         "source": "TF-slim's MobileNet v2 table (research/slim/nets/mobilenet/README.md): "
                                   "mobilenet_v2_1.4_224, 582 M MACs, 6.06 M parameters (Sandler et al. 2018, "
                                   "arXiv:1801.04381)",
                         "vitis_ai": "tf_mobilenetv2_1.4_imagenet_224_224_1.16G"},
    "yolov3_voc": {"macs": 32_815_000_000, "params": 61_626_049,
                   "source": "darknet yolov3-voc.cfg: yolov3 with the 20-class VOC head (3 x 25 outputs per cell); "
                             "the 2.5 zoo's tf_yolov3_voc is 65.63 GOPs",
                   "vitis_ai": "tf_yolov3_voc_416_416_65.63G"},
    "inception_v3": {"macs": 5_713_000_000, "params": 23_834_568,
                     "source": "torchvision Inception_V3_Weights.IMAGENET1K_V1: 5.71 GMACs at 299; 27,161,264 "
                               "parameters less its auxiliary classifier's 3,326,696 (1x1 768->128 + BN, 5x5 128->768 "
                               "+ BN, fc 768->1000), which is left out here",
                     "vitis_ai": "tf_inceptionv3_imagenet_299_299_11.45G"},
}
for _p in PUBLISHED.values():
    _p["gops"] = 2 * _p["macs"] / 1e9
del _p


class _Builder:
    """Accumulates nodes and initializers with unique readable names and deterministic random weights."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.names: set[str] = set()
        self.consts: dict[str, str] = {}
        self.input_hw = (224, 224)          # the model's input (H, W), set by build()

    def init(self, name: str, arr: np.ndarray) -> str:
        if name in self.names:
            raise ValueError(f"duplicate name {name}")
        self.names.add(name)
        self.inits.append(numpy_helper.from_array(np.array(arr, dtype=np.float32, order="C"), name))
        return name

    def const(self, name: str, value) -> str:
        """Shared scalar/vector constant (Clip bounds, Dropout ratio, Resize scales)."""
        if name not in self.consts:
            self.consts[name] = self.init(name, np.asarray(value, dtype=np.float32))
        return self.consts[name]

    def node(self, op: str, inputs: list[str], name: str, output: str | None = None, **attrs) -> str:
        if name in self.names:
            raise ValueError(f"duplicate name {name}")
        self.names.add(name)
        out = output or name
        if out != name:
            self.names.add(out)
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def conv(self, x, cin, cout, k, name, stride=1, pad=0, group=1, bias=False, gain=2.0, output=None):
        """k: a size or (kh, kw); pad: one for every side or (ph, pw)."""
        kh, kw = (k, k) if isinstance(k, int) else k
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        fan_in = cin // group * kh * kw
        w = self.rng.standard_normal((cout, cin // group, kh, kw))
        w *= math.sqrt(gain / fan_in)               # in place: the same values without a second float64 copy
        ins = [x, self.init(name + ".weight", w)]
        if bias:
            ins.append(self.init(name + ".bias", self.rng.uniform(-0.1, 0.1, cout)))
        return self.node("Conv", ins, name, output, kernel_shape=[kh, kw], strides=[stride, stride],
                         pads=[ph, pw, ph, pw], group=group, dilations=[1, 1])

    def bn(self, x, c, name, gamma=(0.5, 1.5), eps=1e-5):
        g = self.init(name + ".weight", self.rng.uniform(gamma[0], gamma[1], c))
        b = self.init(name + ".bias", self.rng.uniform(-0.1, 0.1, c))
        m = self.init(name + ".running_mean", self.rng.uniform(-0.1, 0.1, c))
        v = self.init(name + ".running_var", self.rng.uniform(0.5, 2.0, c))
        return self.node("BatchNormalization", [x, g, b, m, v], name, epsilon=eps, momentum=0.9)

    def relu(self, x, name):
        return self.node("Relu", [x], name)

    def relu6(self, x, name):
        return self.node("Clip", [x, self.const("relu6.min", 0.0), self.const("relu6.max", 6.0)], name)

    def leaky(self, x, name):
        return self.node("LeakyRelu", [x], name, alpha=0.1)

    def maxpool(self, x, name, k, s, pads=(0, 0, 0, 0), ceil=0):
        return self.node("MaxPool", [x], name, kernel_shape=[k, k], strides=[s, s], pads=list(pads),
                         ceil_mode=ceil)

    def dropout(self, x, name, ratio):
        return self.node("Dropout", [x, self.const(f"dropout.ratio{ratio:g}", ratio)], name)

    def head(self, x, cin, ncls=1000, dropout=None):
        """GlobalAveragePool -> Flatten -> [Dropout] -> Gemm named 'fc' with output 'output' (torchvision order)."""
        x = self.node("GlobalAveragePool", [x], "avgpool")
        x = self.node("Flatten", [x], "flatten", axis=1)
        if dropout is not None:
            x = self.dropout(x, "dropout", dropout)
        w = self.init("fc.weight", self.rng.standard_normal((ncls, cin)) * math.sqrt(1.0 / cin))
        b = self.init("fc.bias", self.rng.uniform(-0.1, 0.1, ncls))
        return self.node("Gemm", [x, w, b], "fc", "output", transB=1)

    def conv_bn(self, x, cin, cout, k, name, act="relu", stride=1, pad=None, group=1, gain=2.0, gamma=(0.5, 1.5),
                eps=1e-5, conv_name=None, bn_name=None, act_name=None):
        pad = k // 2 if pad is None else pad
        x = self.conv(x, cin, cout, k, conv_name or name + ".conv", stride, pad, group, gain=gain)
        x = self.bn(x, cout, bn_name or name + ".bn", gamma=gamma, eps=eps)
        if act == "relu":
            x = self.relu(x, act_name or name + ".relu")
        elif act == "relu6":
            x = self.relu6(x, act_name or name + ".relu6")
        elif act == "leaky":
            x = self.leaky(x, act_name or name + ".leaky")
        return x


# ---------------------------------------------------------------------------------------------------- topologies
def _resnet(b: _Builder, x: str, bottleneck: bool, layers: tuple[int, ...]) -> str:
    x = b.conv_bn(x, 3, 64, 7, "", stride=2, pad=3, gain=1.0, conv_name="conv1", bn_name="bn1", act_name="relu")
    x = b.maxpool(x, "maxpool", 3, 2, (1, 1, 1, 1))
    cin, exp = 64, (4 if bottleneck else 1)
    res_gamma = (0.2, 0.5)  # last BN of each block: keeps the residual stream O(1) through the depth
    for li, (n, width) in enumerate(zip(layers, (64, 128, 256, 512)), 1):
        for bi in range(n):
            p, s = f"layer{li}.{bi}", (2 if li > 1 and bi == 0 else 1)
            cout = width * exp
            if bottleneck:  # torchvision v1.5: stride on the 3x3
                y = b.conv_bn(x, cin, width, 1, p, conv_name=p + ".conv1", bn_name=p + ".bn1", act_name=p + ".relu1")
                y = b.conv_bn(y, width, width, 3, p, stride=s, conv_name=p + ".conv2", bn_name=p + ".bn2",
                              act_name=p + ".relu2")
                y = b.conv_bn(y, width, cout, 1, p, act=None, gamma=res_gamma, conv_name=p + ".conv3",
                              bn_name=p + ".bn3")
            else:
                y = b.conv_bn(x, cin, width, 3, p, stride=s, conv_name=p + ".conv1", bn_name=p + ".bn1",
                              act_name=p + ".relu1")
                y = b.conv_bn(y, width, cout, 3, p, act=None, gamma=res_gamma, conv_name=p + ".conv2",
                              bn_name=p + ".bn2")
            if s != 1 or cin != cout:
                x = b.conv_bn(x, cin, cout, 1, p, act=None, stride=s, conv_name=p + ".downsample.0",
                              bn_name=p + ".downsample.1")
            x = b.node("Add", [x, y], p + ".add")
            x = b.relu(x, p + ".relu")
            cin = cout
    return b.head(x, cin)


def _resnet50_caffe(b: _Builder, x: str) -> str:
    """The original (Caffe) ResNet-50: the stride of a stage's first block sits on its 1x1 branch2a and branch1
    convolutions, not on the 3x3; nodes carry the Caffe prototxt names (conv1, res2a_branch2a, ..., res2a, pool5,
    fc1000), the names of UG1414's vaitrace ResNet-50 table. Pool1 pads 1 where Caffe uses ceil mode: same shape."""
    x = b.conv_bn(x, 3, 64, 7, "", stride=2, pad=3, gain=1.0, conv_name="conv1", bn_name="bn_conv1",
                  act_name="conv1_relu")
    x = b.maxpool(x, "pool1", 3, 2, (1, 1, 1, 1))
    cin, res_gamma = 64, (0.2, 0.5)
    for stage, (n, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), 2):
        for bi in range(n):
            p, s, cout = f"res{stage}{'abcdef'[bi]}", (2 if stage > 2 and bi == 0 else 1), width * 4
            y = b.conv_bn(x, cin, width, 1, p, stride=s, conv_name=p + "_branch2a", bn_name=f"bn{p[3:]}_branch2a",
                          act_name=p + "_branch2a_relu")
            y = b.conv_bn(y, width, width, 3, p, conv_name=p + "_branch2b", bn_name=f"bn{p[3:]}_branch2b",
                          act_name=p + "_branch2b_relu")
            y = b.conv_bn(y, width, cout, 1, p, act=None, gamma=res_gamma, conv_name=p + "_branch2c",
                          bn_name=f"bn{p[3:]}_branch2c")
            if bi == 0:
                x = b.conv_bn(x, cin, cout, 1, p, act=None, stride=s, conv_name=p + "_branch1",
                              bn_name=f"bn{p[3:]}_branch1")
            x = b.relu(b.node("Add", [x, y], p), p + "_relu")
            cin = cout
    x = b.node("GlobalAveragePool", [x], "pool5")
    x = b.node("Flatten", [x], "flatten", axis=1)
    w = b.init("fc1000.weight", b.rng.standard_normal((1000, cin)) * math.sqrt(1.0 / cin))
    return b.node("Gemm", [x, w, b.init("fc1000.bias", b.rng.uniform(-0.1, 0.1, 1000))], "fc1000", "output",
                  transB=1)


def _squeezenet(b: _Builder, x: str):
    def fire(x, cin, sq, e1, e3, p):
        s = b.relu(b.conv(x, cin, sq, 1, p + ".squeeze", bias=True), p + ".squeeze_activation")
        a = b.relu(b.conv(s, sq, e1, 1, p + ".expand1x1", bias=True), p + ".expand1x1_activation")
        c = b.relu(b.conv(s, sq, e3, 3, p + ".expand3x3", pad=1, bias=True), p + ".expand3x3_activation")
        return b.node("Concat", [a, c], p + ".concat", axis=1), e1 + e3

    x = b.relu(b.conv(x, 3, 64, 3, "features.0", stride=2, bias=True, gain=1.0), "features.1")
    x = b.maxpool(x, "features.2", 3, 2, ceil=1)
    cin = 64
    for i, cfg in [(3, (16, 64, 64)), (4, (16, 64, 64)), (5, None), (6, (32, 128, 128)), (7, (32, 128, 128)),
                   (8, None), (9, (48, 192, 192)), (10, (48, 192, 192)), (11, (64, 256, 256)),
                   (12, (64, 256, 256))]:
        if cfg is None:
            x = b.maxpool(x, f"features.{i}", 3, 2, ceil=1)
        else:
            x, cin = fire(x, cin, *cfg, f"features.{i}")
    x = b.dropout(x, "classifier.0", 0.5)
    x = b.relu(b.conv(x, cin, 1000, 1, "classifier.1", bias=True), "classifier.2")
    x = b.node("GlobalAveragePool", [x], "classifier.3")
    return b.node("Flatten", [x], "flatten", "output", axis=1)


# GoogLeNet's inception blocks (Szegedy et al. 2014, Table 1): (key, (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool
# proj)); None: a stride-2 max pool between stages
_GOOGLENET = (("3a", (64, 96, 128, 16, 32, 32)), ("3b", (128, 128, 192, 32, 96, 64)), ("3", None),
              ("4a", (192, 96, 208, 16, 48, 64)), ("4b", (160, 112, 224, 24, 64, 64)),
              ("4c", (128, 128, 256, 24, 64, 64)), ("4d", (112, 144, 288, 32, 64, 64)),
              ("4e", (256, 160, 320, 32, 128, 128)), ("4", None), ("5a", (256, 160, 320, 32, 128, 128)),
              ("5b", (384, 192, 384, 48, 128, 128)))


def _inception(b: _Builder, conv, x: str, cin: int, cfg, names: tuple[str, ...], k5: int) -> tuple[str, int]:
    """One inception block: 1x1; 1x1 -> 3x3; 1x1 -> k5 x k5; 3x3 max pool -> 1x1; concatenated. `names`: the
    eight node names (the six convs, the pool, the concat) in that order."""
    c1, c3r, c3, c5r, c5, pp = cfg
    b1 = conv(x, cin, c1, 1, names[0])
    b2 = conv(conv(x, cin, c3r, 1, names[1]), c3r, c3, 3, names[2])
    b3 = conv(conv(x, cin, c5r, 1, names[3]), c5r, c5, k5, names[4])
    b4 = conv(b.maxpool(x, names[6], 3, 1, (1, 1, 1, 1), ceil=1), cin, pp, 1, names[5])
    return b.node("Concat", [b1, b2, b3, b4], names[7], axis=1), c1 + c3 + c5 + pp


def _inception_v1(b: _Builder, x: str):
    def basic(x, cin, cout, k, name, stride=1, gain=2.0):
        return b.conv_bn(x, cin, cout, k, name, stride=stride, gain=gain, eps=1e-3)

    x = basic(x, 3, 64, 7, "conv1", stride=2, gain=1.0)
    x = b.maxpool(x, "maxpool1", 3, 2, ceil=1)
    x = basic(x, 64, 64, 1, "conv2")
    x = basic(x, 64, 192, 3, "conv3")
    x = b.maxpool(x, "maxpool2", 3, 2, ceil=1)
    cin = 192
    for key, cfg in _GOOGLENET:
        if cfg is None:                                    # torchvision: maxpool4 is 2x2
            x = b.maxpool(x, f"maxpool{key}", 3 if key == "3" else 2, 2, ceil=1)
        else:
            p = f"inception{key}"
            names = tuple(p + n for n in (".branch1", ".branch2.0", ".branch2.1", ".branch3.0", ".branch3.1",
                                          ".branch4.1", ".branch4.0", ".concat"))
            x, cin = _inception(b, basic, x, cin, cfg, names, 3)   # the "5x5" branch is a 3x3, as in torchvision
    return b.head(x, cin, dropout=0.2)  # torchvision: avgpool, flatten, dropout, fc


def _inception_v1_caffe(b: _Builder, x: str):
    """BVLC GoogLeNet (Szegedy et al. 2014, Table 1; the Caffe model behind Vitis AI's cf_inceptionv1): conv + bias +
    ReLU throughout, a real 5x5 conv in each inception's third branch, ceil-mode pools, a 7x7 average pool and the
    1000-way classifier; Caffe prototxt names. The two LRN layers are left out: the DPU has no LRN, and a model
    deployed whole on the DPU, as PG338 measures it, has none (docs/calibration.md)."""
    def conv(x, cin, cout, k, name, stride=1, gain=2.0):
        y = b.conv(x, cin, cout, k, name, stride=stride, pad=k // 2, bias=True, gain=gain)
        return b.relu(y, name.replace("/", "/relu_", 1) if "/" in name else name + "_relu")

    x = conv(x, 3, 64, 7, "conv1/7x7_s2", stride=2, gain=1.0)
    x = b.maxpool(x, "pool1/3x3_s2", 3, 2, ceil=1)
    x = conv(x, 64, 64, 1, "conv2/3x3_reduce")
    x = conv(x, 64, 192, 3, "conv2/3x3")
    x = b.maxpool(x, "pool2/3x3_s2", 3, 2, ceil=1)
    cin = 192
    for key, cfg in _GOOGLENET:
        if cfg is None:
            x = b.maxpool(x, f"pool{key}/3x3_s2", 3, 2, ceil=1)
        else:
            p = f"inception_{key}"
            names = tuple(p + n for n in ("/1x1", "/3x3_reduce", "/3x3", "/5x5_reduce", "/5x5", "/pool_proj", "/pool",
                                          "/output"))
            x, cin = _inception(b, conv, x, cin, cfg, names, 5)
    x = b.node("GlobalAveragePool", [x], "pool5/7x7_s1")
    x = b.node("Flatten", [x], "flatten", axis=1)
    x = b.dropout(x, "pool5/drop_7x7_s1", 0.4)
    w = b.init("loss3/classifier.weight", b.rng.standard_normal((1000, cin)) * math.sqrt(1.0 / cin))
    return b.node("Gemm", [x, w, b.init("loss3/classifier.bias", b.rng.uniform(-0.1, 0.1, 1000))], "loss3/classifier",
                  "output", transB=1)


def _tiny_yolo(b: _Builder, x: str, ncls: int = 80):
    nout = 3 * (ncls + 5)

    def cbl(x, cin, cout, k, i, gain=2.0):
        return b.conv_bn(x, cin, cout, k, f"layer{i}", act="leaky", gain=gain)

    x = cbl(x, 3, 16, 3, 0, gain=1.0)
    cin, i = 16, 1
    for cout in (32, 64, 128, 256, 512):
        x = b.maxpool(x, f"layer{i}.maxpool", 2, 2)
        x = cbl(x, cin, cout, 3, i + 1)
        cin, i = cout, i + 2
        if cout == 256:
            route8 = x
    x = b.maxpool(x, "layer11.maxpool", 2, 1, (0, 0, 1, 1))
    x = cbl(x, 512, 1024, 3, 12)
    r13 = cbl(x, 1024, 256, 1, 13)
    x = cbl(r13, 256, 512, 3, 14)
    b.conv(x, 512, nout, 1, "layer15.conv", bias=True, output="output0")
    x = cbl(r13, 256, 128, 1, 18)  # layer 17 is "route -4" (= layer 13)
    x = b.node("Resize", [x, "", b.const("upsample.scales", [1.0, 1.0, 2.0, 2.0])], "layer19.upsample",
               mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    x = b.node("Concat", [x, route8], "layer20.route", axis=1)
    x = cbl(x, 384, 256, 3, 21)
    b.conv(x, 256, nout, 1, "layer22.conv", bias=True, output="output1")
    return ["output0", "output1"]


def _tiny_yolo_v2(b: _Builder, x: str, ncls: int = 20):
    """darknet tiny-yolo-voc (YOLOv2 tiny, VOC head: 5 anchors x (20 + 5)): nine 3x3 conv-BN-leaky layers with
    six max pools (the last with stride 1), and a 1x1 detection conv; one output grid at 1/32 of the input."""
    cin = 3
    for i, cout in enumerate((16, 32, 64, 128, 256, 512)):
        x = b.conv_bn(x, cin, cout, 3, f"layer{2 * i}", act="leaky", gain=1.0 if i == 0 else 2.0)
        x = b.maxpool(x, f"layer{2 * i + 1}.maxpool", 2, 2) if i < 5 else \
            b.maxpool(x, "layer11.maxpool", 2, 1, (0, 0, 1, 1))
        cin = cout
    x = b.conv_bn(x, 512, 1024, 3, "layer12", act="leaky")
    x = b.conv_bn(x, 1024, 1024, 3, "layer13", act="leaky")
    b.conv(x, 1024, 5 * (ncls + 5), 1, "layer14.conv", bias=True, output="output")
    return ["output"]


def _yolov2(b: _Builder, x: str, ncls: int = 20):
    """darknet yolo-voc.2.0.cfg (YOLOv2 VOC, 5 anchors x (20 + 5)): a Darknet-19 backbone of 3x3 / 1x1 conv-BN-leaky
    layers and five 2x2 max pools, two more 3x3 1024 convs, and the passthrough: the 1/16 map of layer 16 (26x26x512
    at 416) reorganized to 1/32 (13x13x2048) and concatenated before layer 24's output (3072 channels), then a 3x3
    1024 conv and the 1x1 detection conv. The reorg is ONNX SpaceToDepth (blocksize 2): the same tensor sizes and
    the same work as darknet's reorg layer, whose reorg_cpu orders the channels differently (it reads the C x H x W
    map as if it were C/4 x 2H x 2W), so the weights of a trained darknet model would need their 3072 input channels
    of layer 28 permuted; timing and counts do not depend on that order."""
    spec = [32, "M", 64, "M", 128, (64, 1), 128, "M", 256, (128, 1), 256, "M", 512, (256, 1), 512, (256, 1), 512,
            "M", 1024, (512, 1), 1024, (512, 1), 1024, 1024, 1024]
    cin, i, passthrough = 3, 0, ""
    for layer in spec:
        if layer == "M":
            x = b.maxpool(x, f"layer{i}.maxpool", 2, 2)
        else:
            cout, k = layer if isinstance(layer, tuple) else (layer, 3)
            x = b.conv_bn(x, cin, cout, k, f"layer{i}", act="leaky", gain=1.0 if i == 0 else 2.0)
            cin = cout
        if i == 16:
            passthrough = x
        i += 1
    r = b.node("SpaceToDepth", [passthrough], "layer26.reorg", blocksize=2)   # layer 25 is "route -9" (= layer 16)
    x = b.node("Concat", [r, x], "layer27.route", axis=1)
    x = b.conv_bn(x, 4 * 512 + 1024, 1024, 3, "layer28", act="leaky")
    b.conv(x, 1024, 5 * (ncls + 5), 1, "layer29.conv", bias=True, output="output")
    return ["output"]


def _yolov3(b: _Builder, x: str, ncls: int = 80):
    """darknet YOLOv3: the Darknet-53 backbone (residual blocks of a 1x1 halving and a 3x3 restoring conv) and three
    detection heads at 1/32, 1/16 and 1/8 of the input, joined by 1x1 convs, 2x nearest upsampling and concats."""
    nout = 3 * (ncls + 5)
    k = [0]

    def cbl(x, cin, cout, ksz, stride=1, gain=2.0):
        k[0] += 1
        return b.conv_bn(x, cin, cout, ksz, f"conv{k[0]}", act="leaky", stride=stride, gain=gain)

    x = cbl(x, 3, 32, 3, gain=1.0)
    cin, routes = 32, []
    for cout, n in ((64, 1), (128, 2), (256, 8), (512, 8), (1024, 4)):
        x = cbl(x, cin, cout, 3, stride=2)
        for i in range(n):
            y = cbl(cbl(x, cout, cout // 2, 1), cout // 2, cout, 3, gain=0.5)
            x = b.node("Add", [x, y], f"res{k[0]}")
        cin = cout
        routes.append(x)
    outs = []
    for head, (width, skip) in enumerate(((512, None), (256, routes[3]), (128, routes[2]))):
        if skip is not None:
            x = cbl(x, cin, width, 1)
            x = b.node("Resize", [x, "", b.const("upsample.scales", [1.0, 1.0, 2.0, 2.0])], f"upsample{head}",
                       mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
            x = b.node("Concat", [x, skip], f"route{head}", axis=1)
            cin = width + (512 if head == 1 else 256)
        for i in range(5):
            x = cbl(x, cin if i == 0 else (width if i % 2 == 1 else 2 * width), width if i % 2 == 0 else 2 * width,
                    1 if i % 2 == 0 else 3)
        cin = width
        y = cbl(x, width, 2 * width, 3)
        outs.append(b.conv(y, 2 * width, nout, 1, f"detect{head}", bias=True, output=f"output{head}"))
    return outs


_BUILDERS = {
    "resnet18": lambda b, x: _resnet(b, x, False, (2, 2, 2, 2)),
    "resnet50": lambda b, x: _resnet(b, x, True, (3, 4, 6, 3)),
    "resnet50_caffe": _resnet50_caffe,
    "mobilenet_v1": lambda b, x: _mobilenet_v1_width(b, x, 1.0),     # width 1.0: the same graph and weights
    "mobilenet_v2": lambda b, x: _mobilenet_v2_width(b, x, 1.0),
    "squeezenet": _squeezenet,
    "inception_v1": _inception_v1,
    "inception_v1_caffe": _inception_v1_caffe,
    "tiny_yolo": _tiny_yolo,
    "tiny_yolo_v2": _tiny_yolo_v2,
    "yolov2": _yolov2,
    "yolov3": _yolov3,
    "resnet50_tf": lambda b, x: _resnet_tf(b, x, (3, 4, 6, 3)),
    "resnet101_tf": lambda b, x: _resnet_tf(b, x, (3, 4, 23, 3)),
    "resnet152_tf": lambda b, x: _resnet_tf(b, x, (3, 8, 36, 3)),
    "vgg16": lambda b, x: _vgg(b, x, _VGG16),
    "vgg19": lambda b, x: _vgg(b, x, _VGG19),
    "mobilenet_v1_050": lambda b, x: _mobilenet_v1_width(b, x, 0.5),
    "mobilenet_v1_025": lambda b, x: _mobilenet_v1_width(b, x, 0.25),
    "mobilenet_v2_140": lambda b, x: _mobilenet_v2_width(b, x, 1.4),
    "yolov3_voc": lambda b, x: _yolov3(b, x, 20),
    "inception_v3": _inception_v3,
}


MIN_SIZE, MAX_SIZE = 32, 1024


def _check_hw(input_size) -> tuple[int, int]:
    """(H, W) of an input size: an int (square) or a pair (H, W), each in MIN_SIZE..MAX_SIZE."""
    if isinstance(input_size, (tuple, list)):
        if len(input_size) != 2:
            raise QuantError(f"zoo input size {input_size!r}: give one size or a pair (H, W)")
        h, w = (_check_size(v) for v in input_size)
        return h, w
    s = _check_size(input_size)
    return s, s


def _check_size(input_size) -> int:
    """The input size as an int in MIN_SIZE..MAX_SIZE (QuantError naming the value otherwise)."""
    if isinstance(input_size, (bool, np.bool_)) or not isinstance(input_size, (int, np.integer)):
        raise QuantError(f"zoo input size {input_size!r} is not an integer")
    size = int(input_size)
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise QuantError(f"zoo input size {size} is out of range {MIN_SIZE}..{MAX_SIZE}")
    return size


def build(name: str, input_size: "int | tuple[int, int] | None" = None, seed: int = 0) -> onnx.ModelProto:
    """Float32 NCHW ONNX model of topology `name` (input "input" [1,3,S,S], or [1,3,H,W] for input_size=(H, W))
    with weights from default_rng(seed)."""
    if not isinstance(name, str) or name not in _BUILDERS:
        raise QuantError(f"unknown zoo model {name!r}; allowed names: {', '.join(NAMES)}")
    h, w = _check_hw(DEFAULT_SIZE[name] if input_size is None else input_size)
    size = h if h == w else f"{h}x{w}"
    b = _Builder(np.random.default_rng(seed))
    b.input_hw = (h, w)
    outs = _BUILDERS[name](b, "input")
    outs = [outs] if isinstance(outs, str) else outs
    graph = helper.make_graph(
        b.nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, h, w])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="opendpu.quant.zoo")
    model.ir_version = 8
    try:
        shapes = _shapes(model)
    except onnx.shape_inference.InferenceError as e:
        first = " ".join(str(e).split())[:160]
        raise QuantError(f"zoo model {name}: input size {size} does not fit the topology (its feature maps do not "
                         f"line up: {first}); use a multiple of 32") from None
    for n in model.graph.node:                      # onnx infers floor(H / 2) where onnxruntime refuses to run
        if n.op_type == "SpaceToDepth":
            bs, (hh, ww) = helper.get_attribute_value(n.attribute[0]), shapes[n.input[0]][2:]
            if hh % bs or ww % bs:
                raise QuantError(f"zoo model {name}: input size {size} does not fit the topology ({n.name} reorganizes "
                                 f"a {hh}x{ww} map by {bs}); use a multiple of 32")
    for o in model.graph.output:
        o.CopyFrom(helper.make_tensor_value_info(o.name, TensorProto.FLOAT, shapes[o.name]))
    return model


# -------------------------------------------------------------------------------------------------------- counting
def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Static shapes of every tensor in the graph, via onnx shape inference (initializers included). Inference
    runs on a copy whose large initializers (weights) are graph inputs of their type and shape: the same shapes
    without serializing the weights (hundreds of MB for the YOLOs) into the inference; small ones (Resize scales,
    Clip bounds) keep their values, which inference may read."""
    g = model.graph
    named = {i.name for i in g.input}
    big = [t for t in g.initializer if math.prod(t.dims) > 64]
    light = helper.make_model(
        helper.make_graph(g.node, g.name, list(g.input) + [helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                                                            for t in big if t.name not in named],
                          g.output, initializer=[t for t in g.initializer if math.prod(t.dims) <= 64],
                          value_info=g.value_info),
        opset_imports=model.opset_import, ir_version=model.ir_version)
    inferred = onnx.shape_inference.infer_shapes(light, strict_mode=True)
    g = inferred.graph
    out = {t.name: list(t.dims) for t in model.graph.initializer}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
            out[vi.name] = dims
    return out


def count(model: onnx.ModelProto) -> dict:
    """MACs and parameters computed from the ONNX graph (shape inference), not from builder bookkeeping.

    macs: Conv = out_elems * (Cin/group) * kh * kw; Gemm/MatMul = M * N * K (batch dims multiplied in).
    params: elements of the Conv/Gemm/MatMul weight and bias initializers plus BatchNormalization scale (gamma)
    and B (beta); BN running mean/var are not counted (as torchvision's num_params counts only parameters).
    """
    shapes = _shapes(model)
    inits = {t.name for t in model.graph.initializer}

    def shape(name, node):
        s = shapes.get(name)
        if s is None or any(d is None or d <= 0 for d in s):
            raise ValueError(f"node {node.name or node.op_type}: no static shape for {name!r}")
        return s

    macs, counted = 0, set()
    for node in model.graph.node:
        if node.op_type == "Conv":
            w = shape(node.input[1], node)
            macs += math.prod(shape(node.output[0], node)) * math.prod(w[1:])
            pin = node.input[1:3]
        elif node.op_type == "Gemm":
            a = {at.name: helper.get_attribute_value(at) for at in node.attribute}
            sa = shape(node.input[0], node)
            k = sa[0] if a.get("transA", 0) else sa[1]
            macs += math.prod(shape(node.output[0], node)) * k
            pin = node.input[1:3]
        elif node.op_type == "MatMul":
            sa = shape(node.input[0], node)
            macs += math.prod(shape(node.output[0], node)) * sa[-1]
            pin = node.input[0:2]
        elif node.op_type == "BatchNormalization":
            pin = node.input[1:3]
        else:
            continue
        for p in pin:
            if p and p in inits and p not in counted:
                counted.add(p)
    params = sum(math.prod(shapes[p]) for p in counted)
    return {"macs": int(macs), "gops": 2 * macs / 1e9, "params": int(params)}


def summary(names=None, input_size=None, models: dict | None = None) -> list[dict]:
    """One row per model: counted MACs/GOPs/params at `input_size` (default: each model's own) and published values.
    `models`, when given, receives the built ModelProtos by name (so an export does not build them again)."""
    rows = []
    names = list(NAMES if names is None else names)
    for n in names:                                 # every name and the size checked before any model is built
        if not isinstance(n, str) or n not in _BUILDERS:
            raise QuantError(f"unknown zoo model {n!r}; allowed names: {', '.join(NAMES)}")
    if input_size is not None:
        _check_hw(input_size)
    for n in names:
        m = build(n, input_size)
        dims = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
        c = count(m)
        if models is not None:
            models[n] = m
        rows.append({"name": n, "input": "x".join(map(str, dims)), **c,
                     "published_gops": PUBLISHED[n]["gops"], "published_params": PUBLISHED[n]["params"]})
    return rows


# ----------------------------------------------------------------------------------------------- CLE-sensitive weights
def cle_sensitive(model: onnx.ModelProto, seed: int = 0, decades: float = 2.0, relu6: str = "relu") -> onnx.ModelProto:
    """A copy of `model` whose depthwise convs' output channels span orders of magnitude, as BatchNorm folding
    leaves trained depthwise layers: each depthwise conv (+ BatchNormalization) followed by an activation and a 1x1
    (or any group-1) conv gets channel c scaled by k_c = 10**U(-decades, decades) (the BN's gamma and beta, else the
    conv's weights and bias) and the next conv's input channel c by 1/k_c. Through ReLU, LeakyReLU or no activation
    the float function is unchanged. `relu6`: "relu" replaces every Clip(0, 6) by Relu first (vai_q's
    convert_relu6_to_relu; then the sensitized model computes what the converted model does); "keep" scales
    through the ReLU6 as well, which makes another float model (channel c clips at 6/k_c of its former scale)."""
    if relu6 not in ("relu", "keep"):
        raise ValueError(f"relu6 {relu6!r}: use 'relu' or 'keep'")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    if relu6 == "relu":
        for n in g.node:
            if n.op_type == "Clip":
                n.op_type = "Relu"
                del n.input[1:]
                del n.attribute[:]
    inits = {t.name: t for t in g.initializer}
    cons: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            cons.setdefault(i, []).append(n)
    outs = {o.name for o in g.output}

    def only(t):
        c = cons.get(t, [])
        return c[0] if len(c) == 1 and t not in outs else None

    def arr(name):
        return numpy_helper.to_array(inits[name]).astype(np.float64)

    def put(name, a):
        inits[name].CopyFrom(numpy_helper.from_array(a.astype(np.float32), name))

    rng = np.random.default_rng(seed)
    for n in list(g.node):
        if n.op_type != "Conv" or n.input[1] not in inits:
            continue
        group = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "group"), 1)
        w = arr(n.input[1])
        if group == 1 or group != w.shape[0] or w.shape[1] != 1:
            continue
        bn = only(n.output[0])
        t = n.output[0]
        if bn is not None and bn.op_type == "BatchNormalization":
            t = bn.output[0]
        else:
            bn = None
        act = only(t)
        if act is not None and act.op_type in ("Relu", "LeakyRelu", "Clip"):
            t = act.output[0]
        nxt = only(t)
        if nxt is None or nxt.op_type != "Conv" or nxt.input[1] not in inits or \
                next((helper.get_attribute_value(a) for a in nxt.attribute if a.name == "group"), 1) != 1:
            continue
        k = 10.0 ** rng.uniform(-decades, decades, w.shape[0])
        if bn is not None:
            put(bn.input[1], arr(bn.input[1]) * k)
            put(bn.input[2], arr(bn.input[2]) * k)
        else:
            put(n.input[1], w * k.reshape(-1, 1, 1, 1))
            if len(n.input) > 2 and n.input[2]:
                put(n.input[2], arr(n.input[2]) * k)
        put(nxt.input[1], arr(nxt.input[1]) / k.reshape(1, -1, 1, 1))
    return m


# ---------------------------------------------------------------------------------------------------------- digits
def digits_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """sklearn load_digits as float32 NCHW [N,1,8,8] in [-1,1] (pixel/8 - 1) with a fixed stratified 70/30 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 8.0 - 1.0)[:, None, :, :]
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.3, random_state=0, stratify=y)
    return (np.ascontiguousarray(x_tr), np.ascontiguousarray(y_tr), np.ascontiguousarray(x_te),
            np.ascontiguousarray(y_te))


if __name__ == "__main__":
    for r in summary():
        print(f"{r['name']:13s} {r['input']:12s} MACs {r['macs'] / 1e6:9.2f} M "
              f"(pub {r['published_gops'] / 2 * 1e3:8.2f})  params {r['params']:>10,d} "
              f"(pub {r['published_params']:>10,d})")
