"""Train the small load_digits CNN used as the quantizer's accuracy benchmark and export it as float ONNX
(opset 17) with Conv and BatchNormalization kept as separate nodes.
Run: python -m opendpu.quant.models.train_digits [--out PATH]."""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import onnx
import torch
from torch import nn

from opendpu.quant import zoo

SEED = 0
EPOCHS = 40
BATCH = 32
LR = 2e-3


class DigitsCNN(nn.Module):
    """Conv(1->16)+BN+ReLU, MaxPool2, Conv(16->32)+BN+ReLU, MaxPool2, Linear(128->64)+ReLU, Dropout, Linear(64->10)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Dropout(0.2),
                                        nn.Linear(64, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def train(epochs: int = EPOCHS, verbose: bool = True) -> tuple[DigitsCNN, float]:
    """Deterministic training on the zoo.digits_data() train split; returns the eval model and held-out accuracy."""
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    x_tr, y_tr, x_te, y_te = zoo.digits_data()
    xt_tr, yt_tr, xt_te = torch.from_numpy(x_tr), torch.from_numpy(y_tr), torch.from_numpy(x_te)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    gen = torch.Generator().manual_seed(SEED)
    for ep in range(epochs):
        model.train()
        perm = torch.randperm(len(xt_tr), generator=gen)
        for i in range(0, len(perm), BATCH):
            idx = perm[i:i + BATCH]
            loss = nn.functional.cross_entropy(model(xt_tr[idx]), yt_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
        if verbose and (ep + 1) % 10 == 0:
            print(f"epoch {ep + 1:3d}  loss {loss.item():.4f}  held-out acc {accuracy(model, xt_te, y_te):.4f}")
    return model.eval(), accuracy(model, xt_te, y_te)


def accuracy(model: nn.Module, x: torch.Tensor, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(x).argmax(1).numpy()
    return float((pred == y).mean())


def export(model: DigitsCNN, acc: float, path: str) -> onnx.ModelProto:
    """Legacy (TorchScript) export; with do_constant_folding=False the BatchNormalization nodes stay in the graph
    (checked: the quantizer must fold them itself)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "legacy TorchScript-based exporter": chosen on purpose
        torch.onnx.export(model.eval(), (torch.zeros(1, 1, 8, 8),), path, dynamo=False, opset_version=17,
                          do_constant_folding=False, input_names=["input"], output_names=["output"])
    m = onnx.load(path)
    m.graph.name = "digits_cnn"
    if sum(n.op_type == "BatchNormalization" for n in m.graph.node) != 2:
        raise RuntimeError("exporter folded the BatchNormalization nodes")
    onnx.helper.set_model_props(m, {"heldout_accuracy": repr(acc), "dataset": "sklearn load_digits, "
                                    "train_test_split(test_size=0.3, random_state=0, stratify=y), x = pixel/8 - 1"})
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=zoo.DIGITS_ONNX, help="output ONNX path (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    args = ap.parse_args(argv)
    t = time.time()
    model, acc = train(args.epochs)
    m = export(model, acc, args.out)
    ops = [n.op_type for n in m.graph.node]
    print(f"held-out float accuracy {acc:.4f}  ({time.time() - t:.1f} s)")
    print(f"wrote {args.out}: {len(m.SerializeToString())} bytes, ops {ops}")


if __name__ == "__main__":
    main()
