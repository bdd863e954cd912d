"""The zoo's topologies of the Vitis AI 2.5 Model Zoo's fps tables (issue 33, runtime/boardfit.py): TF-slim ResNet v1,
VGG, MobileNet v1 / v2 at other widths, Inception v3. Builders over quant/zoo.py's _Builder (`b`; not imported here:
zoo.py imports this module), registered there."""

from __future__ import annotations

import math


def _mobilenet_v1_width(b, x: str, alpha: float):
    """MobileNet v1 at width multiplier alpha (Howard et al. 2017 §3.3; TF-slim's depth(d) = max(int(d * alpha), 8))."""
    d = lambda c: max(int(c * alpha), 8)  # noqa: E731
    x = b.conv_bn(x, 3, d(32), 3, "features.0", stride=2, gain=1.0)
    cfg = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    cin = d(32)
    for i, (cout, s) in enumerate(cfg, 1):
        x = b.conv_bn(x, cin, cin, 3, f"features.{i}.dw", stride=s, group=cin)
        x = b.conv_bn(x, cin, d(cout), 1, f"features.{i}.pw")
        cin = d(cout)
    return b.head(x, cin)


def _divisible(v: float, d: int = 8) -> int:
    """torchvision's _make_divisible: v rounded to a multiple of d, never below 90 % of v."""
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


def _mobilenet_v2_width(b, x: str, alpha: float):
    """MobileNet v2 at width multiplier alpha (Sandler et al. 2018; torchvision's rounding; the last 1x1 is 1280 *
    alpha when alpha > 1)."""
    c0 = _divisible(32 * alpha)
    x = b.conv_bn(x, 3, c0, 3, "features.0", act="relu6", stride=2, gain=1.0)
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1)]
    cin, i = c0, 1
    for t, c, n, s in settings:
        c = _divisible(c * alpha)
        for j in range(n):
            stride, p, hid = (s if j == 0 else 1), f"features.{i}", cin * t
            res = stride == 1 and cin == c
            y = x
            if t != 1:
                y = b.conv_bn(y, cin, hid, 1, p + ".expand", act="relu6", gain=1.0)
            y = b.conv_bn(y, hid, hid, 3, p + ".dw", act="relu6", stride=stride, group=hid)
            y = b.conv_bn(y, hid, c, 1, p + ".project", act=None, gamma=(0.2, 0.5) if res else (0.5, 1.5))
            x = b.node("Add", [x, y], p + ".add") if res else y
            cin, i = c, i + 1
    last = _divisible(1280 * alpha) if alpha > 1.0 else 1280
    x = b.conv_bn(x, cin, last, 1, f"features.{i}", act="relu6", gain=1.0)
    return b.head(x, last, dropout=0.2)


def _resnet_tf(b, x: str, layers: tuple[int, ...]) -> str:
    """TF-slim resnet_v1 (research/slim/nets/resnet_v1.py, the tf_resnetv1_* of Vitis AI's zoo): bottleneck units
    whose stride sits on the 3x3 of each block's *last* unit (blocks 1-3; block 4 keeps its resolution), that unit's
    shortcut a 1x1 subsample (a stride-2 pick, here a 1x1 max pool) where the depth does not change, else a strided
    1x1 conv; 'SAME' padding: the 7x7/2 conv pads 3, the stride-2 3x3s pad 1, the 3x3/2 max pool pads the bottom
    and right by 1."""
    x = b.conv_bn(x, 3, 64, 7, "conv1", stride=2, pad=3, gain=1.0)
    x = b.maxpool(x, "pool1", 3, 2, (0, 0, 1, 1))
    cin, res_gamma = 64, (0.2, 0.5)
    for blk, (n, width) in enumerate(zip(layers, (64, 128, 256, 512)), 1):
        for u in range(n):
            p, s, cout = f"block{blk}.unit_{u + 1}", (2 if blk < 4 and u == n - 1 else 1), width * 4
            y = b.conv_bn(x, cin, width, 1, p + ".conv1")
            y = b.conv_bn(y, width, width, 3, p + ".conv2", stride=s)
            y = b.conv_bn(y, width, cout, 1, p + ".conv3", act=None, gamma=res_gamma)
            if cin != cout:
                x = b.conv_bn(x, cin, cout, 1, p + ".shortcut", act=None, stride=s)
            elif s != 1:
                x = b.maxpool(x, p + ".shortcut", 1, s)
            x = b.relu(b.node("Add", [x, y], p + ".add"), p + ".relu")
            cin = cout
    return b.head(x, cin)


def _vgg(b, x: str, cfg: tuple) -> str:
    """torchvision VGG (Simonyan & Zisserman 2014, configurations D and E): 3x3 conv + bias + ReLU, 2x2 max pools,
    and the three fully connected layers (the 7x7 adaptive pool is the identity at 224; at other sizes the first FC
    takes the map as it is)."""
    cin, i = 3, 0
    for v in cfg:
        if v == "M":
            x = b.maxpool(x, f"features.{i}", 2, 2)
            i += 1
        else:
            x = b.relu(b.conv(x, cin, v, 3, f"features.{i}", pad=1, bias=True, gain=1.0 if i == 0 else 2.0),
                       f"features.{i + 1}")
            cin, i = v, i + 2
    x = b.node("Flatten", [x], "flatten", axis=1)
    h, w = b.input_hw
    nin = cin * (h // 32) * (w // 32)
    for j, (fi, fo) in enumerate(((nin, 4096), (4096, 4096), (4096, 1000))):
        wt = b.init(f"classifier.{3 * j}.weight", b.rng.standard_normal((fo, fi)) * math.sqrt(2.0 / fi))
        bs = b.init(f"classifier.{3 * j}.bias", b.rng.uniform(-0.1, 0.1, fo))
        x = b.node("Gemm", [x, wt, bs], f"classifier.{3 * j}", "output" if j == 2 else None, transB=1)
        if j < 2:
            x = b.dropout(b.relu(x, f"classifier.{3 * j + 1}"), f"classifier.{3 * j + 2}", 0.5)
    return x


_VGG16 = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")
_VGG19 = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M")


def _inception_v3(b, x: str) -> str:
    """torchvision / TF-slim Inception v3 (Szegedy et al. 2015, arXiv:1512.00567; torchvision's inception.py without
    the auxiliary classifier): the 3x3 stem, three InceptionA (5x5 branch), InceptionB (grid reduction), four
    InceptionC with factorized 1x7 / 7x1 convs, InceptionD, two InceptionE with split 1x3 / 3x1 branches; 3x3 average
    pools (stride 1, pad 1) in the pool branches; conv-BN(eps 1e-3)-ReLU throughout."""
    def cbr(x, cin, cout, k, name, stride=1, pad=0):
        kh, kw = (k, k) if isinstance(k, int) else k
        y = b.conv(x, cin, cout, (kh, kw), name + ".conv", stride, pad)
        return b.relu(b.bn(y, cout, name + ".bn", eps=1e-3), name + ".relu")

    def avg(x, name):
        return b.node("AveragePool", [x], name, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                      count_include_pad=1)

    def cat(ys, name):
        return b.node("Concat", ys, name, axis=1)

    x = cbr(x, 3, 32, 3, "Conv2d_1a_3x3", stride=2)
    x = cbr(x, 32, 32, 3, "Conv2d_2a_3x3")
    x = cbr(x, 32, 64, 3, "Conv2d_2b_3x3", pad=1)
    x = b.maxpool(x, "maxpool1", 3, 2)
    x = cbr(x, 64, 80, 1, "Conv2d_3b_1x1")
    x = cbr(x, 80, 192, 3, "Conv2d_4a_3x3")
    x = b.maxpool(x, "maxpool2", 3, 2)
    cin = 192
    for name, pf in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):          # InceptionA
        b1 = cbr(x, cin, 64, 1, name + ".branch1x1")
        b5 = cbr(cbr(x, cin, 48, 1, name + ".branch5x5_1"), 48, 64, 5, name + ".branch5x5_2", pad=2)
        b3 = cbr(cbr(cbr(x, cin, 64, 1, name + ".branch3x3dbl_1"), 64, 96, 3, name + ".branch3x3dbl_2", pad=1),
                 96, 96, 3, name + ".branch3x3dbl_3", pad=1)
        bp = cbr(avg(x, name + ".avgpool"), cin, pf, 1, name + ".branch_pool")
        x, cin = cat([b1, b5, b3, bp], name + ".concat"), 224 + pf
    n = "Mixed_6a"                                                                     # InceptionB
    b3 = cbr(x, cin, 384, 3, n + ".branch3x3", stride=2)
    bd = cbr(cbr(cbr(x, cin, 64, 1, n + ".branch3x3dbl_1"), 64, 96, 3, n + ".branch3x3dbl_2", pad=1), 96, 96, 3,
             n + ".branch3x3dbl_3", stride=2)
    x, cin = cat([b3, bd, b.maxpool(x, n + ".maxpool", 3, 2)], n + ".concat"), 384 + 96 + cin
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160), ("Mixed_6e", 192)):   # InceptionC
        b1 = cbr(x, cin, 192, 1, name + ".branch1x1")
        b7 = cbr(x, cin, c7, 1, name + ".branch7x7_1")
        b7 = cbr(b7, c7, c7, (1, 7), name + ".branch7x7_2", pad=(0, 3))
        b7 = cbr(b7, c7, 192, (7, 1), name + ".branch7x7_3", pad=(3, 0))
        bd = cbr(x, cin, c7, 1, name + ".branch7x7dbl_1")
        for i, (k, p, co) in enumerate((((7, 1), (3, 0), c7), ((1, 7), (0, 3), c7), ((7, 1), (3, 0), c7),
                                        ((1, 7), (0, 3), 192)), 2):
            bd = cbr(bd, c7, co, k, f"{name}.branch7x7dbl_{i}", pad=p)
        bp = cbr(avg(x, name + ".avgpool"), cin, 192, 1, name + ".branch_pool")
        x, cin = cat([b1, b7, bd, bp], name + ".concat"), 768
    n = "Mixed_7a"                                                                     # InceptionD
    b3 = cbr(cbr(x, cin, 192, 1, n + ".branch3x3_1"), 192, 320, 3, n + ".branch3x3_2", stride=2)
    b7 = cbr(x, cin, 192, 1, n + ".branch7x7x3_1")
    b7 = cbr(b7, 192, 192, (1, 7), n + ".branch7x7x3_2", pad=(0, 3))
    b7 = cbr(b7, 192, 192, (7, 1), n + ".branch7x7x3_3", pad=(3, 0))
    b7 = cbr(b7, 192, 192, 3, n + ".branch7x7x3_4", stride=2)
    x, cin = cat([b3, b7, b.maxpool(x, n + ".maxpool", 3, 2)], n + ".concat"), 320 + 192 + cin
    for name in ("Mixed_7b", "Mixed_7c"):                                              # InceptionE
        b1 = cbr(x, cin, 320, 1, name + ".branch1x1")
        b3 = cbr(x, cin, 384, 1, name + ".branch3x3_1")
        b3 = cat([cbr(b3, 384, 384, (1, 3), name + ".branch3x3_2a", pad=(0, 1)),
                  cbr(b3, 384, 384, (3, 1), name + ".branch3x3_2b", pad=(1, 0))], name + ".branch3x3")
        bd = cbr(cbr(x, cin, 448, 1, name + ".branch3x3dbl_1"), 448, 384, 3, name + ".branch3x3dbl_2", pad=1)
        bd = cat([cbr(bd, 384, 384, (1, 3), name + ".branch3x3dbl_3a", pad=(0, 1)),
                  cbr(bd, 384, 384, (3, 1), name + ".branch3x3dbl_3b", pad=(1, 0))], name + ".branch3x3dbl")
        bp = cbr(avg(x, name + ".avgpool"), cin, 192, 1, name + ".branch_pool")
        x, cin = cat([b1, b3, bd, bp], name + ".concat"), 2048
    return b.head(x, cin, dropout=0.5)
