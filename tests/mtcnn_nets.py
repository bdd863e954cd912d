"""MTCNN's PNet, RNet and ONet (facenet-pytorch 2.6.0's published design) with its bundled weights, and face
crops from scikit-image's sample images, for tests/test_mtcnn.py.

facenet_pytorch itself is never imported (its __init__ needs torchvision): the weight files are found through
the package's location and loaded as state dicts (`torch.load(..., weights_only=True)`).
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import torch
from torch import nn

INPUT_SIZE = {"pnet": 48, "rnet": 24, "onet": 48}     # PNet takes any size >= 12; RNet 24x24, ONet 48x48


def weights_path(name: str) -> str | None:
    """Path of facenet-pytorch's `data/<name>.pt`, or None when the package or the file is absent."""
    spec = importlib.util.find_spec("facenet_pytorch")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = os.path.join(list(spec.submodule_search_locations)[0], "data", f"{name}.pt")
    return p if os.path.isfile(p) else None


class PNet(nn.Module):
    """Proposal net: fully convolutional; face probability (softmax over 2) and box regression per 12x12 window."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 10, kernel_size=3)
        self.prelu1 = nn.PReLU(10)
        self.pool1 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(10, 16, kernel_size=3)
        self.prelu2 = nn.PReLU(16)
        self.conv3 = nn.Conv2d(16, 32, kernel_size=3)
        self.prelu3 = nn.PReLU(32)
        self.conv4_1 = nn.Conv2d(32, 2, kernel_size=1)
        self.softmax4_1 = nn.Softmax(dim=1)
        self.conv4_2 = nn.Conv2d(32, 4, kernel_size=1)

    def forward(self, x):
        x = self.prelu1(self.conv1(x))
        x = self.pool1(x)
        x = self.prelu2(self.conv2(x))
        x = self.prelu3(self.conv3(x))
        a = self.softmax4_1(self.conv4_1(x))
        b = self.conv4_2(x)
        return b, a


class RNet(nn.Module):
    """Refinement net (24x24 crops): face probability and box regression."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 28, kernel_size=3)
        self.prelu1 = nn.PReLU(28)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(28, 48, kernel_size=3)
        self.prelu2 = nn.PReLU(48)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(48, 64, kernel_size=2)
        self.prelu3 = nn.PReLU(64)
        self.dense4 = nn.Linear(576, 128)
        self.prelu4 = nn.PReLU(128)
        self.dense5_1 = nn.Linear(128, 2)
        self.softmax5_1 = nn.Softmax(dim=1)
        self.dense5_2 = nn.Linear(128, 4)

    def forward(self, x):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.prelu3(self.conv3(x))
        x = x.permute(0, 3, 2, 1).contiguous()
        x = self.prelu4(self.dense4(x.view(x.shape[0], -1)))
        a = self.softmax5_1(self.dense5_1(x))
        b = self.dense5_2(x)
        return b, a


class ONet(nn.Module):
    """Output net (48x48 crops): face probability, box regression and five facial landmarks."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, kernel_size=3)
        self.prelu1 = nn.PReLU(32)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.prelu2 = nn.PReLU(64)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.conv3 = nn.Conv2d(64, 64, kernel_size=3)
        self.prelu3 = nn.PReLU(64)
        self.pool3 = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.conv4 = nn.Conv2d(64, 128, kernel_size=2)
        self.prelu4 = nn.PReLU(128)
        self.dense5 = nn.Linear(1152, 256)
        self.prelu5 = nn.PReLU(256)
        self.dense6_1 = nn.Linear(256, 2)
        self.softmax6_1 = nn.Softmax(dim=1)
        self.dense6_2 = nn.Linear(256, 4)
        self.dense6_3 = nn.Linear(256, 10)

    def forward(self, x):
        x = self.pool1(self.prelu1(self.conv1(x)))
        x = self.pool2(self.prelu2(self.conv2(x)))
        x = self.pool3(self.prelu3(self.conv3(x)))
        x = self.prelu4(self.conv4(x))
        x = x.permute(0, 3, 2, 1).contiguous()
        x = self.prelu5(self.dense5(x.view(x.shape[0], -1)))
        a = self.softmax6_1(self.dense6_1(x))
        b = self.dense6_2(x)
        c = self.dense6_3(x)
        return b, c, a


NETS = {"pnet": PNet, "rnet": RNet, "onet": ONet}


def load(name: str) -> nn.Module:
    """The net with facenet-pytorch's trained weights (strict state-dict load), in eval mode."""
    path = weights_path(name)
    if path is None:
        raise FileNotFoundError(f"facenet_pytorch/data/{name}.pt")
    net = NETS[name]()
    net.load_state_dict(torch.load(path, weights_only=True), strict=True)
    return net.eval()


def normalise(rgb: np.ndarray) -> np.ndarray:
    """uint8 HWC RGB images [N, H, W, 3] -> MTCNN's float input [N, 3, H, W], (x - 127.5) / 128."""
    x = (np.asarray(rgb, np.float32) - 127.5) * 0.0078125
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    from skimage.transform import resize
    out = resize(img, (size, size), order=1, anti_aliasing=True, preserve_range=True)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def _rgb(img: np.ndarray) -> np.ndarray:
    img = np.asarray(img)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    return img[:, :, :3]


FACE = (120, 226, 112)          # astronaut(): face box centre row, column and side (the float ONet's face score ~1)


def face_crops(size: int, n: int, seed: int) -> np.ndarray:
    """n square RGB crops [n, size, size, 3] uint8 around the face of skimage's astronaut (`FACE`), jittered by
    up to 12 px and 0.85-1.15x in size, every other one mirrored: the boxes RNet and ONet get from the stage
    before them."""
    from skimage import data
    img = _rgb(data.astronaut())
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        side = int(round(FACE[2] * rng.uniform(0.85, 1.15)))
        cy, cx = FACE[0] + int(rng.integers(-12, 13)), FACE[1] + int(rng.integers(-12, 13))
        y0 = int(np.clip(cy - side // 2, 0, img.shape[0] - side))
        x0 = int(np.clip(cx - side // 2, 0, img.shape[1] - side))
        c = img[y0:y0 + side, x0:x0 + side]
        if i % 2:
            c = c[:, ::-1]
        out.append(_resize(c, size))
    return np.stack(out)


SCENES = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "camera", "cat", "hubble_deep_field")


def scene_crops(size: int, n: int, seed: int) -> np.ndarray:
    """n square RGB crops [n, size, size, 3] uint8 at random places and scales of skimage's sample images
    (faces, a cat, objects, textures), some mirrored: what PNet sees when it scans an image pyramid."""
    from skimage import data
    imgs = [_rgb(getattr(data, s)()) for s in SCENES]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = imgs[i % len(imgs)]
        side = int(rng.integers(min(img.shape[:2]) // 4, min(img.shape[:2]) + 1))
        y0 = int(rng.integers(0, img.shape[0] - side + 1))
        x0 = int(rng.integers(0, img.shape[1] - side + 1))
        c = img[y0:y0 + side, x0:x0 + side]
        if rng.random() < 0.5:
            c = c[:, ::-1]
        out.append(_resize(c, size))
    return np.stack(out)
