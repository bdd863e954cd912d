"""Fuzz of the whole loop: random small float ONNX graphs -> quantize -> compile -> every DPU program on the cycle
model (`sim`) against the XIR reference (`ref`).

A hypothesis strategy (`fuzz_cases`) builds models with onnx.helper (opset 17, input 1xCxHxW, C 1..24, H/W 4..24):
chains and small DAGs of Conv (kernel 1/3/5, stride 1/2, random pads, plain or depthwise, with or without bias,
sometimes followed by BatchNormalization), activations (Relu, Relu6 as Clip(0, 6), LeakyRelu(0.1), HardSwish,
HardSigmoid, Sigmoid), MaxPool/AveragePool (kernel 2/3, stride 1/2, pads, ceil_mode), GlobalAveragePool, Add of two
branches, Mul by a per-channel constant, Concat along channels, Resize nearest x2, Reshape, Split along channels,
Transpose, Softmax, Flatten (or Reshape) + Gemm at the end, and now and then an op the DPU lacks (Exp, Abs, Tanh,
Clip(0, 1)); beyond the issue's list, more of what the quantizer takes: ConvTranspose, zero Pad folded into a Conv
or AveragePool, GlobalMaxPool, ReduceMean over H and W, Add/Sub/Mul/Div by a scalar or per-channel constant, Mul of
two branches and squeeze-excite, PRelu (also negative slopes), Slice, SpaceToDepth / DepthToSpace. Hypothesis
draws the structure, the target (B512, B1152, B4096, PP2_CP4_D512), the calibration method and a seed; the weights
and the 8 calibration inputs (normal, uniform or smooth sums of sines) come from a numpy generator with that seed.

Every example must end in one of two ways (`check_case`):
- success: `quant.quantize.quantize` and `compiler.pipeline.compile` return, and for three inputs (two calibration
  images, one random int8) every DPU program, run on the cycle model in schedule order with random bank contents
  (compile_helpers.run), leaves in DDR exactly the bytes the reference computes for every output and workspace
  tensor (the canonical graph on `GraphRunner(.., "ref")`), also under one random set of timing parameters; and the
  compiled xmodel on `GraphRunner(.., "sim")` (USER, DPU and CPU subgraphs) gives the quantized graph's outputs on
  `ref` byte for byte;
- a clear error: quantize or compile raises an `OpenDpuError` whose message is one line naming an op (node or
  output name, alone or as the stem of an XIR name like 'conv2_fix', or an op type) of the model. The outcome does
  not depend on whether an op the DPU lacks is refused (QuantError) or kept as a CPU op: both are allowed.
Anything else (another exception, an error raised while running a compiled model, a multi-line or traceback-like
message, sim != ref, more than `TIMEOUT_S` seconds) fails, and the failure message gives a directory holding the
model, its calibration data and the case, which `python -m tests.test_fuzz_onnx DIR` re-runs.

Shapes are kept small (Reshape and Resize outputs bounded by MAX_RESHAPE_C / MAX_SIDE) so that an example takes
well under a second. The quantizer bugs the fuzz found (a Pad of a kernel or more before an AveragePool, ceil-mode
pools whose last window starts in the trailing pad (two meanings: now a clear error), a hard-sigmoid in a lowered
concat, a range beyond any fix point) have minimal regression tests below.

The default run checks `CI_EXAMPLES` examples; `-m slow` checks 200. `python -m tests.test_fuzz_onnx --survey`
runs the 200 examples of the slow test without stopping at a failure and prints the outcomes grouped by message.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st
from onnx import TensorProto, helper as oh, numpy_helper

from opendpu.compiler.pipeline import compile as compile_graph
from opendpu.compiler.program import DpuProgram
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import Target, TargetError
from opendpu.quant.onnx_in import QuantError
from opendpu.quant.quantize import QuantConfig, quantize
from opendpu.runtime.runner import GraphRunner
from opendpu.sim.executor import DpuMachine
from tests.compile_helpers import ddr_state, initial_ddr, mismatches, random_timing, run

TARGETS = ("B512", "B1152", "B4096", "PP2_CP4_D512")
METHODS = ("maxmin", "maxmin", "diffs", "percentile")
CI_EXAMPLES = 25
SLOW_EXAMPLES = 200
TIMEOUT_S = 60                    # per example (a hang); examples take well under 2 s
N_CALIB = 8
MAX_SIDE = 48                     # at most this many rows or columns out of a Resize or Reshape
MAX_RESHAPE_C = 256               # at most this many channels out of a Reshape
MAX_OPS = 8                       # op draws per graph (a conv with BN, a branch + Add... count as one)
UNSUPPORTED = ("Exp", "Abs", "Tanh", "Clip01")

_SETTINGS = dict(deadline=None, derandomize=True, database=None, print_blob=False,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


# ---- the model builder ------------------------------------------------------------------------------------------
class _Net:
    """A float ONNX graph under construction: nodes, initializers and the static shape of every tensor (from ONNX
    shape inference after each node, so the builder never disagrees with ONNX about a shape)."""

    def __init__(self, rng: np.random.Generator, shape: tuple[int, int, int, int]):
        self.rng = rng
        self.nodes: list = []
        self.inits: dict[str, np.ndarray] = {}
        self.shapes: dict[str, tuple[int, ...]] = {"x": shape}
        self.maps = ["x"]                 # 4-D tensors a later op may read
        self.read: set[str] = set()
        self.ended = False                # a Gemm head ends the graph
        self.desc: list[str] = []

    # -- helpers
    def name(self, kind: str) -> str:
        return f"{kind}{len(self.nodes)}"

    def const(self, base: str, v, dtype=np.float32) -> str:
        n = f"{base}_{len(self.inits)}"
        self.inits[n] = np.asarray(v, dtype)
        return n

    def model(self, outputs: list[str] | None = None) -> onnx.ModelProto:
        outs = outputs if outputs is not None else self.outputs()
        g = oh.make_graph(self.nodes, "fuzz", [oh.make_tensor_value_info("x", TensorProto.FLOAT, self.shapes["x"])],
                          [oh.make_tensor_value_info(o, TensorProto.FLOAT, self.shapes[o]) for o in outs],
                          [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], producer_name="opendpu-fuzz")
        m.ir_version = 8
        return m

    def outputs(self) -> list[str]:
        outs = [t for n in self.nodes for t in n.output if t not in self.read]
        return outs or ["x"]

    def add(self, op: str, inputs: list[str], n_out: int = 1, desc: str | None = None, **attrs) -> list[str]:
        base = self.name(op.lower())
        outs = [base] if n_out == 1 else [f"{base}_{i}" for i in range(n_out)]
        self.nodes.append(oh.make_node(op, inputs, outs, name=base, **attrs))
        self.read.update(i for i in inputs if i)
        m = self.model([])
        inf = onnx.shape_inference.infer_shapes(m, strict_mode=True)
        known = {v.name: v for v in inf.graph.value_info}
        for o in outs:
            dims = tuple(d.dim_value for d in known[o].type.tensor_type.shape.dim)
            assert dims and all(d > 0 for d in dims), f"builder: {base} gives shape {dims}"
            self.shapes[o] = dims
            if len(dims) == 4:
                self.maps.append(o)
        self.desc.append(desc or base)
        return outs


def _pads(draw, k: int, h: int, w: int, most: int) -> list[int]:
    """ONNX pads [top, left, bottom, right], each 0..most, such that the window fits in the padded map."""
    p = [draw(st.integers(0, most)) for _ in range(4)]
    if h + p[0] + p[2] < k:
        p[0] = p[2] = (k - h + 1) // 2
    if w + p[1] + p[3] < k:
        p[1] = p[3] = (k - w + 1) // 2
    return p


def _conv(draw, net: _Net, x: str, oc: int | None = None, k: int | None = None, stride: int | None = None,
          same: bool = False, depthwise: bool | None = None) -> str:
    rng = net.rng
    _, c, h, w = net.shapes[x]
    k = draw(st.sampled_from((1, 3, 3, 5))) if k is None else k
    stride = draw(st.sampled_from((1, 1, 2))) if stride is None else stride
    depthwise = (c > 1 and draw(st.integers(0, 3)) == 0) if depthwise is None else depthwise
    if depthwise:
        oc = c
    elif oc is None:
        oc = draw(st.integers(1, 24))
    pads = [k // 2] * 4 if same else _pads(draw, k, h, w, k // 2)
    fan = (1 if depthwise else c) * k * k
    wt = rng.normal(0, 1.5 / np.sqrt(fan), (oc, 1 if depthwise else c, k, k))
    ins = [x, net.const("w", wt)]
    bias = draw(st.booleans())
    if bias:
        ins.append(net.const("b", rng.normal(0, 0.2, oc)))
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=pads)
    if depthwise:
        attrs["group"] = c
    y = net.add("Conv", ins, desc=f"{'dw' if depthwise else ''}conv k{k} s{stride} p{pads} oc{oc}"
                f"{'' if bias else ' nobias'}", **attrs)[0]
    if not same and draw(st.integers(0, 3)) == 0:
        bn = [net.const("g", rng.uniform(0.5, 1.5, oc)), net.const("beta", rng.normal(0, 0.2, oc)),
              net.const("mu", rng.normal(0, 0.2, oc)), net.const("var", rng.uniform(0.5, 2.0, oc))]
        y = net.add("BatchNormalization", [y] + bn, desc="bn", epsilon=1e-5)[0]
    return y


def _ceil_defined(n: int, k: int, s: int, lo: int, hi: int) -> bool:
    """ceil_mode's last window starts inside the input or its leading pad. When it would start in the trailing pad,
    ONNX shape inference keeps the window and onnxruntime drops it: a model with two meanings, on which the quantizer
    fails (test_ceil_mode_window_in_the_trailing_pad_*); the strategy leaves such pools in floor mode."""
    out = -(-(n + lo + hi - k) // s) + 1
    return (out - 1) * s < n + lo


def _activation(draw, net: _Net, x: str) -> str:
    kind = draw(st.sampled_from(("Relu", "Relu6", "LeakyRelu", "HardSwish", "HardSigmoid", "HardSigmoid02",
                                 "Sigmoid")))
    if kind == "Relu6":
        return net.add("Clip", [x, net.const("lo", 0.0), net.const("hi", 6.0)], desc="relu6")[0]
    if kind == "LeakyRelu":
        return net.add("LeakyRelu", [x], desc="leakyrelu", alpha=0.1)[0]
    if kind == "HardSigmoid":
        return net.add("HardSigmoid", [x], desc="hardsigmoid", alpha=1 / 6, beta=0.5)[0]
    if kind == "HardSigmoid02":                       # ONNX's default slope 0.2, not the DPU's 1/6
        return net.add("HardSigmoid", [x], desc="hardsigmoid(0.2)")[0]
    return net.add(kind, [x], desc=kind.lower())[0]


def _pool(draw, net: _Net, x: str) -> str:
    _, c, h, w = net.shapes[x]
    op = draw(st.sampled_from(("MaxPool", "AveragePool")))
    k = draw(st.sampled_from((2, 3)))
    s = draw(st.sampled_from((1, 2, 2)))
    pads = _pads(draw, k, h, w, k - 1) if draw(st.booleans()) else _pads(draw, k, h, w, 0)
    ceil = int(draw(st.integers(0, 3)) == 0)
    attrs = dict(kernel_shape=[k, k], strides=[s, s], pads=pads, ceil_mode=ceil)
    if op == "AveragePool" and any(pads):
        attrs["count_include_pad"] = int(draw(st.booleans()))
    return net.add(op, [x], desc=f"{op.lower()} k{k} s{s} p{pads} ceil{ceil}"
                   f"{' cip' + str(attrs.get('count_include_pad')) if 'count_include_pad' in attrs else ''}",
                   **attrs)[0]


def _add(draw, net: _Net, x: str) -> str:
    same = [t for t in net.maps if t != x and net.shapes[t] == net.shapes[x]]
    if same and draw(st.booleans()):
        other = draw(st.sampled_from(same))
    elif draw(st.integers(0, 9)) == 0:
        other = x                                      # Add(x, x)
    else:
        other = _conv(draw, net, x, oc=net.shapes[x][1], k=draw(st.sampled_from((1, 3))), stride=1, same=True)
    y = net.add("Add", [x, other], desc="add")[0]
    if draw(st.booleans()):
        y = net.add("Relu", [y], desc="relu")[0]
    return y


def _concat(draw, net: _Net, x: str) -> str:
    hw = net.shapes[x][2:]
    members = [x]
    for _ in range(draw(st.integers(1, 2))):
        same = [t for t in net.maps if net.shapes[t][2:] == hw]
        if draw(st.booleans()):
            members.append(draw(st.sampled_from(same)))
        else:
            members.append(_conv(draw, net, x, k=draw(st.sampled_from((1, 3))), stride=1, same=True,
                                 depthwise=False))
    return net.add("Concat", members, desc=f"concat x{len(members)}", axis=1)[0]


def _split(draw, net: _Net, x: str) -> str:
    c = net.shapes[x][1]
    a = draw(st.integers(1, c - 1))
    outs = net.add("Split", [x, net.const("split", [a, c - a], np.int64)], n_out=2, desc=f"split {a}/{c - a}", axis=1)
    return draw(st.sampled_from(outs))


def _reshape(draw, net: _Net, x: str) -> str:
    _, c, h, w = net.shapes[x]
    shapes = [(1, c, h, w)]           # the other shapes are kept small, so that an example stays well under 1 s
    shapes += [t for t in ((1, c, h * w, 1), (1, c * h, w, 1), (1, c * h * w, 1, 1))
               if t[1] <= MAX_RESHAPE_C and t[2] <= MAX_SIDE]
    if c % 2 == 0:
        shapes.append((1, c // 2, 2 * h, w))
    to = draw(st.sampled_from(shapes))
    return net.add("Reshape", [x, net.const("shape", to, np.int64)], desc=f"reshape {list(to)}")[0]


def _unsupported(draw, net: _Net, x: str) -> str:
    kind = draw(st.sampled_from(UNSUPPORTED))
    if kind == "Clip01":
        return net.add("Clip", [x, net.const("lo", 0.0), net.const("hi", 1.0)], desc="clip(0,1)")[0]
    return net.add(kind, [x], desc=kind.lower())[0]


def _tconv(draw, net: _Net, x: str) -> str:
    """ConvTranspose: kernel 2 stride 2, kernel 3 stride 2 pad 1 (+ output_padding 1), kernel 4 stride 2 pad 1,
    kernel 3 stride 1 pad 1."""
    rng = net.rng
    c = net.shapes[x][1]
    k, s, p, op = draw(st.sampled_from(((2, 2, 0, 0), (3, 2, 1, 1), (4, 2, 1, 0), (3, 1, 1, 0))))
    oc = draw(st.integers(1, 16))
    ins = [x, net.const("tw", rng.normal(0, 1.5 / np.sqrt(c * k * k / s / s), (c, oc, k, k)))]
    if draw(st.booleans()):
        ins.append(net.const("tb", rng.normal(0, 0.2, oc)))
    return net.add("ConvTranspose", ins, desc=f"convtranspose k{k} s{s} p{p} op{op} oc{oc}", kernel_shape=[k, k],
                   strides=[s, s], pads=[p] * 4, output_padding=[op, op])[0]


def _pad(draw, net: _Net, x: str) -> str:
    """A zero Pad of H and W followed by the Conv or AveragePool it folds into (before a pool, pads up to the kernel
    and beyond: test_pad_of_a_kernel_or_more_before_an_avgpool)."""
    to_conv = draw(st.booleans())
    k = min(draw(st.sampled_from((2, 3))), *net.shapes[x][2:])
    p = [draw(st.integers(0, 2 if to_conv else k + 1)) for _ in range(4)]
    y = net.add("Pad", [x, net.const("pads", [0, 0, p[0], p[1], 0, 0, p[2], p[3]], np.int64)],
                desc=f"pad {p}", mode="constant")[0]
    if to_conv:
        return _conv(draw, net, y)
    return net.add("AveragePool", [y], desc=f"averagepool k{k} s1", kernel_shape=[k, k], strides=[1, 1])[0]


def _const_arith(draw, net: _Net, x: str) -> str:
    """Add / Sub / Div / Mul by a scalar or a per-channel constant (folded into a conv before it, else a 1x1
    depthwise conv)."""
    c = net.shapes[x][1]
    op = draw(st.sampled_from(("Add", "Sub", "Div", "Mul")))
    shape = draw(st.sampled_from(((), (1, c, 1, 1))))
    v = net.rng.uniform(0.5, 2.0, shape) * np.where(net.rng.random(shape) < 0.8, 1, -1)
    if op in ("Add", "Sub"):
        v = net.rng.normal(0, 0.5, shape)
    return net.add(op, [x, net.const("k", v)], desc=f"{op.lower()} const{list(shape)}")[0]


def _mul_branches(draw, net: _Net, x: str) -> str:
    """Mul of two maps: a same-shape branch (eltwise MUL), or squeeze-excite (x * hard-sigmoid / sigmoid of
    1x1 convs over the global average: a broadcast MUL)."""
    rng = net.rng
    c = net.shapes[x][1]
    if draw(st.booleans()):
        other = _conv(draw, net, x, oc=c, k=1, stride=1, same=True)
        return net.add("Mul", [x, other], desc="mul branches")[0]
    g = net.add("GlobalAveragePool", [x], desc="gap")[0]
    mid = max(1, c // 4)
    a = net.add("Conv", [g, net.const("se1", rng.normal(0, 1 / np.sqrt(c), (mid, c, 1, 1))),
                         net.const("se1b", rng.normal(0, 0.1, mid))], desc=f"se conv {c}->{mid}",
                kernel_shape=[1, 1])[0]
    a = net.add("Relu", [a], desc="relu")[0]
    b = net.add("Conv", [a, net.const("se2", rng.normal(0, 1 / np.sqrt(mid), (c, mid, 1, 1))),
                         net.const("se2b", rng.normal(0, 0.1, c))], desc=f"se conv {mid}->{c}", kernel_shape=[1, 1])[0]
    gate = draw(st.sampled_from(("HardSigmoid", "Sigmoid")))
    b = net.add(gate, [b], desc=gate.lower(), **({"alpha": 1 / 6, "beta": 0.5} if gate == "HardSigmoid" else {}))[0]
    return net.add("Mul", [x, b], desc="mul se")[0]


def _prelu(draw, net: _Net, x: str) -> str:
    c = net.shapes[x][1]
    neg = draw(st.booleans())
    slope = net.rng.uniform(-0.5 if neg else 0.0, 0.5, (c, 1, 1))
    return net.add("PRelu", [x, net.const("slope", slope)], desc=f"prelu{' (negative slopes)' if neg else ''}")[0]


def _slice(draw, net: _Net, x: str) -> str:
    """Slice of channels, rows or columns (start, end, step 1 or 2)."""
    _, c, h, w = net.shapes[x]
    axis = draw(st.sampled_from((1, 2, 3)))
    n = (c, h, w)[axis - 1]
    if n < 2:
        return _conv(draw, net, x)
    a = draw(st.integers(0, n - 2))
    b = draw(st.integers(a + 1, n))
    step = draw(st.sampled_from((1, 1, 2)))
    return net.add("Slice", [x, net.const("st", [a], np.int64), net.const("en", [b], np.int64),
                             net.const("ax", [axis], np.int64), net.const("sp", [step], np.int64)],
                   desc=f"slice axis{axis} {a}:{b}:{step}")[0]


def _reorg(draw, net: _Net, x: str) -> str:
    """SpaceToDepth(2) of an even map, or DepthToSpace(2) (DCR, or now and then CRD, which stays on the CPU) of a
    map with a multiple of 4 channels; otherwise a conv."""
    _, c, h, w = net.shapes[x]
    s2d_ok = h % 2 == 0 and w % 2 == 0 and 4 * c <= MAX_RESHAPE_C
    d2s_ok = c % 4 == 0 and 2 * max(h, w) <= MAX_SIDE
    if not (s2d_ok or d2s_ok):
        return _conv(draw, net, x)
    if s2d_ok and (not d2s_ok or draw(st.booleans())):
        return net.add("SpaceToDepth", [x], desc="space-to-depth 2", blocksize=2)[0]
    mode = draw(st.sampled_from(("DCR", "DCR", "CRD")))
    return net.add("DepthToSpace", [x], desc=f"depth-to-space 2 {mode}", blocksize=2, mode=mode)[0]


def _head(draw, net: _Net, x: str) -> str:
    """Flatten (or Reshape to [1, -1]) + Gemm: the end of the graph."""
    rng = net.rng
    if draw(st.booleans()):
        x = net.add("GlobalAveragePool", [x], desc="gap")[0]
    if draw(st.booleans()):
        f = net.add("Flatten", [x], desc="flatten", axis=1)[0]
    else:
        f = net.add("Reshape", [x, net.const("shape", [1, -1], np.int64)], desc="reshape [1, -1]")[0]
    n_in = net.shapes[f][1]
    n = draw(st.integers(1, 16))
    ins = [f, net.const("fc", rng.normal(0, 1.5 / np.sqrt(n_in), (n, n_in))), net.const("fcb", rng.normal(0, .2, n))]
    y = net.add("Gemm", ins, desc=f"gemm {n_in}->{n}", transB=1)[0]
    net.ended = True
    return y


OPS = ("conv", "conv", "conv", "act", "act", "pool", "pool", "gap", "add", "add", "mul", "concat", "concat",
       "resize", "reshape", "split", "transpose", "softmax", "unsupported", "head",
       # beyond the list: more of what the quantizer takes
       "tconv", "pad", "gmp", "reducemean", "arith", "mulbranch", "prelu", "slice", "reorg")


def _op(draw, net: _Net, x: str, kind: str) -> str:
    rng = net.rng
    _, c, h, w = net.shapes[x]
    if kind == "conv":
        return _conv(draw, net, x)
    if kind == "act":
        return _activation(draw, net, x)
    if kind == "pool":
        return _pool(draw, net, x)
    if kind == "gap":
        return net.add("GlobalAveragePool", [x], desc="gap")[0]
    if kind == "add":
        return _add(draw, net, x)
    if kind == "mul":
        k = net.const("k", rng.uniform(-2, 2, (1, c, 1, 1)))
        return net.add("Mul", [x, k], desc="mul per-channel")[0]
    if kind == "concat":
        return _concat(draw, net, x)
    if kind == "resize" and max(h, w) > MAX_SIDE // 2:
        return _conv(draw, net, x, stride=2)
    if kind == "resize":
        mode = draw(st.sampled_from(("half_pixel", "asymmetric")))
        nearest = "floor" if mode == "asymmetric" else "round_prefer_floor"
        return net.add("Resize", [x, "", net.const("scales", [1, 1, 2, 2])], desc=f"resize x2 {mode}",
                       mode="nearest", coordinate_transformation_mode=mode, nearest_mode=nearest)[0]
    if kind == "reshape":
        return _reshape(draw, net, x)
    if kind == "split":
        return _split(draw, net, x) if c > 1 else _conv(draw, net, x)
    if kind == "transpose":
        perm = [0] + list(draw(st.permutations((1, 2, 3))))
        return net.add("Transpose", [x], desc=f"transpose {perm}", perm=perm)[0]
    if kind == "softmax":
        return net.add("Softmax", [x], desc="softmax", axis=1)[0]
    if kind == "unsupported":
        return _unsupported(draw, net, x)
    if kind == "head":
        return _head(draw, net, x)
    if kind == "tconv":
        return _tconv(draw, net, x)
    if kind == "pad":
        return _pad(draw, net, x)
    if kind == "gmp":
        return net.add("GlobalMaxPool", [x], desc="gmp")[0]
    if kind == "reducemean":
        return net.add("ReduceMean", [x], desc="reducemean hw", axes=[2, 3], keepdims=1)[0]
    if kind == "arith":
        return _const_arith(draw, net, x)
    if kind == "mulbranch":
        return _mul_branches(draw, net, x)
    if kind == "prelu":
        return _prelu(draw, net, x)
    if kind == "slice":
        return _slice(draw, net, x)
    if kind == "reorg":
        return _reorg(draw, net, x)
    raise AssertionError(kind)


@dataclass
class Case:
    model: onnx.ModelProto = field(repr=False)
    calib: np.ndarray = field(repr=False)
    target: str
    method: str
    seed: int
    ops: list[str]

    def __repr__(self) -> str:
        s = self.model.graph.input[0].type.tensor_type.shape.dim
        return (f"Case(input {[d.dim_value for d in s]}, target {self.target}, method {self.method}, seed {self.seed}, "
                f"ops {self.ops})")


def calibration(rng: np.random.Generator, shape, kind: str) -> np.ndarray:
    """N_CALIB inputs: standard normal, uniform 0..1 (image-like) or smooth (sums of three random 2-D sines)."""
    n = (N_CALIB,) + tuple(shape[1:])
    if kind == "normal":
        return rng.standard_normal(n).astype(np.float32)
    if kind == "uniform":
        return rng.uniform(0, 1, n).astype(np.float32)
    _, c, h, w = n
    yy, xx = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    out = np.zeros(n, np.float32)
    for i in range(N_CALIB):
        for ch in range(c):
            for _ in range(3):
                fy, fx, ph = rng.uniform(0, 0.8), rng.uniform(0, 0.8), rng.uniform(0, 2 * np.pi)
                out[i, ch] += rng.uniform(0.3, 1.0) * np.sin(fy * yy + fx * xx + ph)
    return out


@st.composite
def fuzz_cases(draw) -> Case:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shape = (1, draw(st.integers(1, 24)), draw(st.integers(4, 24)), draw(st.integers(4, 24)))
    net = _Net(rng, shape)
    x = "x"
    for _ in range(draw(st.integers(1, MAX_OPS))):
        if draw(st.integers(0, 4)) == 0:              # a DAG: read an earlier map now and then
            x = draw(st.sampled_from(net.maps))
        x = _op(draw, net, x, draw(st.sampled_from(OPS)))
        if net.ended:
            break
    m = net.model()
    onnx.checker.check_model(m, full_check=True)
    calib = calibration(rng, shape, draw(st.sampled_from(("normal", "uniform", "smooth"))))
    return Case(m, calib, draw(st.sampled_from(TARGETS)), draw(st.sampled_from(METHODS)), seed, net.desc)


# ---- one case through the loop ----------------------------------------------------------------------------------
class FuzzFailure(AssertionError):
    """An outcome the acceptance does not allow."""


class _Timeout(BaseException):
    pass


@dataclass
class Outcome:
    kind: str                     # "ok" | "error" (a clear OpenDpuError) | "failure"
    message: str = ""
    stage: str = ""
    seconds: float = 0.0
    programs: int = 0
    repro: str = ""


def _program_mismatches(prog: DpuProgram, values: dict[str, np.ndarray], seed: int, timed: bool) -> dict[str, int]:
    """One program on the cycle model (schedule start order, random bank contents; compile_helpers.run), its
    inputs from `values`: op name -> differing bytes for every output and workspace tensor that differs. With
    `timed`, also under one random set of timing parameters (another instruction order), which must leave the same
    DDR bytes."""
    init = initial_ddr(prog, values)
    m, sched = run(prog, init, fill="random", seed=seed)
    if not sched.complete:
        raise FuzzFailure(f"{prog.name}: the schedule did not complete")
    bad = mismatches(prog, m, values)
    if timed and not bad:
        t = prog.target.with_timing(**random_timing(np.random.default_rng(seed)))
        mt, st_ = run(prog, init, t, fill="random", seed=seed + 100)
        if not st_.complete or ddr_state(prog, mt) != ddr_state(prog, m):
            raise FuzzFailure(f"sim depends on timing: program {prog.name} under {t.timing} leaves other DDR bytes "
                              f"({mismatches(prog, mt, values)})")
    return bad


def _names_an_op(msg: str, model: onnx.ModelProto) -> bool:
    """The message names a node or output tensor of the model (also as the stem of a derived XIR name such as
    'conv2_bias' or 'conv2_fix'), or an op type of the model."""
    names = {n.name for n in model.graph.node} | {t for n in model.graph.node for t in n.output}
    return any(re.search(rf"(?<![\w/.]){re.escape(n)}(?![0-9A-Za-z])", msg) for n in names) or \
        any(n.op_type in msg for n in model.graph.node)


def clear_error(e: BaseException, model: onnx.ModelProto) -> str | None:
    """Why `e` is not an allowed error (None if it is: an OpenDpuError, one line, naming an op of the model)."""
    msg = str(e)
    if not isinstance(e, OpenDpuError):
        return f"{type(e).__name__} is not an OpenDpuError"
    if not msg.strip() or "\n" in msg.strip():
        return "the message is not one line"
    if "Traceback" in msg or re.search(r'File "[^"]+", line \d+', msg):
        return "the message holds a traceback"
    if not _names_an_op(msg, model):
        return "the message names no op of the model"
    return None


def _sim_equals_ref(case: Case, qg: Graph, res) -> int:
    """Every DPU program against the reference on the canonical graph, and the compiled xmodel end to end against
    the quantized graph; three inputs (two calibration images, one random int8). Returns the number of programs."""
    ref_q = GraphRunner(qg, backend="ref")
    spec = ref_q.get_inputs()[0]
    rng = np.random.default_rng(case.seed ^ 0x5EED)
    xs = [ref_q.prepare_input(spec, case.calib[i:i + 1], layout="nchw") for i in (0, N_CALIB - 1)]
    xs.append(rng.integers(-128, 128, spec.dims, dtype=np.int8))
    ref_org = GraphRunner(res.org, backend="ref")
    sim = GraphRunner(res.graph, backend="sim", seed=case.seed % 1000)
    for k, x in enumerate(xs):
        vals = ref_org.run([x], keep_values=True).values
        for p in res.programs.values():
            bad = _program_mismatches(p, vals, seed=case.seed % 9973 + k, timed=k == 0)
            if bad:
                raise FuzzFailure(f"sim != ref: input {k}, program {p.name}: differing bytes per tensor {bad}")
        want = ref_q.run([x]).outputs
        got = sim.run([x]).outputs
        if set(got) != set(want):
            raise FuzzFailure(f"the compiled graph's outputs {sorted(got)} are not the quantized graph's "
                              f"{sorted(want)}")
        for name, v in want.items():
            g = np.asarray(got[name])
            if g.shape != np.asarray(v).shape or g.dtype != np.asarray(v).dtype or not np.array_equal(g, v):
                n = int((g != v).sum()) if g.shape == np.asarray(v).shape else -1
                raise FuzzFailure(f"sim != ref: input {k}, graph output {name!r}: {n} of {np.asarray(v).size} "
                                  f"values differ (shape {g.shape}/{np.asarray(v).shape})")
    return len(res.programs)


def save_case(case: Case, why: str, parent: str | None = None) -> str:
    """A new directory (under `parent`, default the system's temporary directory) with model.onnx, calib.npy and
    case.json."""
    d = tempfile.mkdtemp(prefix="opendpu-fuzz-", dir=parent)
    onnx.save(case.model, os.path.join(d, "model.onnx"))
    np.save(os.path.join(d, "calib.npy"), case.calib)
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump({"target": case.target, "method": case.method, "seed": case.seed, "ops": case.ops, "why": why},
                  f, indent=1)
    return d


def load_case(d: str) -> Case:
    with open(os.path.join(d, "case.json")) as f:
        info = json.load(f)
    return Case(onnx.load(os.path.join(d, "model.onnx")), np.load(os.path.join(d, "calib.npy")), info["target"],
                info["method"], info["seed"], info["ops"])


def run_case(case: Case, save_dir: str | None = None) -> Outcome:
    """The case through quantize -> compile -> sim/ref; never raises (a failure is an Outcome of kind "failure"
    with the model saved to `repro`, a new directory under `save_dir`)."""
    t0 = time.perf_counter()
    stage = "quantize"

    def on_alarm(signum, frame):
        raise _Timeout()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(TIMEOUT_S)
    try:
        try:
            q = quantize(case.model, case.calib, target=case.target, config=QuantConfig(method=case.method))
            qg = Graph.deserialize(q.xmodel().serialize())
            stage = "compile"
            res = compile_graph(qg, Target.from_name(case.target), name="fuzz")
        except OpenDpuError as e:
            why = clear_error(e, case.model)
            if why is None:
                return Outcome("error", str(e), stage, time.perf_counter() - t0)
            raise FuzzFailure(f"{stage}: {why}: {type(e).__name__}: {e}") from e
        stage = "run"
        n = _sim_equals_ref(case, qg, res)
        return Outcome("ok", "", "run", time.perf_counter() - t0, n)
    except _Timeout:
        msg = f"{stage}: no result after {TIMEOUT_S} s (a hang?)"
    except FuzzFailure as e:
        msg = str(e)
    except Exception as e:  # noqa: BLE001 - any other exception is the failure being looked for
        tb = traceback.extract_tb(e.__traceback__)[-1]
        msg = f"{stage}: {type(e).__name__}: {' '.join(str(e).split())[:300]} (at {tb.filename}:{tb.lineno})"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return Outcome("failure", msg, stage, time.perf_counter() - t0, repro=save_case(case, msg, save_dir))


def check_case(case: Case) -> Outcome:
    out = run_case(case)
    if out.kind == "failure":
        raise FuzzFailure(f"{out.message}\n  case: {case!r}\n  model, calibration data and case saved in {out.repro}"
                          f"\n  reproduce: .venv/bin/python -m tests.test_fuzz_onnx {out.repro}")
    return out


# ---- the tests -------------------------------------------------------------------------------------------------
_SURVEY: list | None = None          # set by `--survey`: outcomes are collected instead of raised


def _record(case: Case) -> None:
    if _SURVEY is not None:
        out = run_case(case)
        _SURVEY.append((case, out))
        print(f"{len(_SURVEY):4d} {out.kind:7s} {out.seconds:6.2f}s {out.programs} DPU {case!r} {out.message[:160]}",
              flush=True)
        return
    out = check_case(case)
    event(f"outcome: {out.kind}")                     # --hypothesis-show-statistics
    event(f"DPU subgraphs: {min(out.programs, 3)}{'+' if out.programs > 3 else ''}")


@settings(max_examples=CI_EXAMPLES, **_SETTINGS)
@given(case=fuzz_cases())
def test_fuzz_onnx_quantize_compile_sim_equals_ref(case):
    _record(case)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, **_SETTINGS)
@given(case=fuzz_cases())
def test_fuzz_onnx_200(case):
    _record(case)


# ---- the checker itself -----------------------------------------------------------------------------------------
def _conv_relu_model(extra: str | None = None) -> Case:
    """conv 3x3 (3 -> 4 channels) + Relu on 1x3x8x8 for B512, then the op type `extra` if given."""
    rng = np.random.default_rng(3)
    net = _Net(rng, (1, 3, 8, 8))
    y = net.add("Conv", ["x", net.const("w", rng.normal(0, .3, (4, 3, 3, 3))), net.const("b", rng.normal(0, .1, 4))],
                kernel_shape=[3, 3], pads=[1, 1, 1, 1])[0]
    y = net.add("Relu", [y])[0]
    if extra:
        net.add(extra, [y])
    return Case(net.model(), calibration(rng, (1, 3, 8, 8), "normal"), "B512", "maxmin", 3, net.desc)


def test_a_successful_case_is_ok_and_an_unsupported_op_is_a_clear_error_or_ok():
    ok = run_case(_conv_relu_model())
    assert ok.kind == "ok" and ok.programs == 1, ok
    exp = run_case(_conv_relu_model("Exp"))
    assert exp.kind in ("ok", "error"), exp
    if exp.kind == "error":
        assert "exp" in exp.message.lower() and "\n" not in exp.message


def test_the_checker_flags_sim_differing_from_ref(monkeypatch, tmp_path):
    """A program whose first output byte is disturbed after the run is reported as sim != ref, with the model
    saved where the message says."""
    orig = DpuMachine.ddr

    def corrupt(self, reg):
        d = orig(self, reg).copy()
        d[:] = d ^ 1
        return d
    monkeypatch.setattr(DpuMachine, "ddr", corrupt)
    out = run_case(_conv_relu_model(), str(tmp_path))
    assert out.kind == "failure" and out.message.startswith("sim != ref"), out
    assert os.path.dirname(out.repro) == str(tmp_path) and os.path.isfile(os.path.join(out.repro, "model.onnx"))
    again = load_case(out.repro)
    assert again.target == "B512" and again.calib.shape == (N_CALIB, 3, 8, 8)


def test_the_checker_refuses_unclear_errors():
    m = _conv_relu_model().model
    assert clear_error(QuantError("op 'relu1' (Relu): bad"), m) is None
    assert clear_error(QuantError("Relu: bad"), m) is None
    assert clear_error(QuantError("op 'relu1_fix': bad"), m) is None
    assert clear_error(QuantError("op 'relu12': bad"), m) == "the message names no op of the model"
    assert clear_error(QuantError("something is wrong"), m) == "the message names no op of the model"
    assert clear_error(QuantError("op relu1:\nTraceback (most recent call last)"), m) == "the message is not one line"
    assert clear_error(QuantError('op relu1 File "x.py", line 3'), m) == "the message holds a traceback"
    assert clear_error(ValueError("op relu1"), m) == "ValueError is not an OpenDpuError"
    assert clear_error(TargetError("relu1"), m) is None


def _ceil_rows(n: int, k: int, s: int, lo: int, hi: int) -> tuple[int, int]:
    """(onnxruntime's, ONNX shape inference's) output rows of a ceil-mode MaxPool over n rows."""
    import onnxruntime as ort
    node = oh.make_node("MaxPool", ["x"], ["y"], kernel_shape=[k, 1], strides=[s, 1], pads=[lo, 0, hi, 0],
                        ceil_mode=1)
    g = oh.make_graph([node], "p", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, n, 1])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(m).graph.output[0].type.tensor_type.shape.dim[2].dim_value
    so = ort.SessionOptions()
    so.log_severity_level = 3
    got = ort.InferenceSession(m.SerializeToString(), so).run(None, {"x": np.zeros((1, 1, n, 1), np.float32)})[0]
    return got.shape[2], inferred


def test_the_strategy_leaves_out_exactly_the_ceil_mode_pools_with_two_meanings():
    """_ceil_defined holds exactly when onnxruntime's ceil-mode output size equals ONNX shape inference's."""
    seen = set()
    for n in range(2, 7):
        for k in (2, 3):
            for s in (1, 2):
                for lo in range(k):
                    for hi in range(k):
                        if n + lo + hi >= k:
                            got, inferred = _ceil_rows(n, k, s, lo, hi)
                            assert (got == inferred) == _ceil_defined(n, k, s, lo, hi), (n, k, s, lo, hi, got)
                            seen.add(got == inferred)
    assert seen == {True, False}


# ---- bugs the fuzz found and that are fixed here: regression tests ----------------------------------------------
@pytest.mark.parametrize("depthwise", [False, True])
def test_conv_windows_entirely_in_the_padding(depthwise, tmp_path):
    """A conv whose windows all lie in the padding (a Pad of 3 rows before a 3x3 stride-2 conv on a 1x1 map) is
    legal ONNX: the output is the bias (compiler/ref refused it: 'padding leaves no input inside the windows'). The
    float reference equals onnxruntime, and the fuzz case that found it (GAP, Pad, depthwise conv on the CPU) runs."""
    import onnxruntime as ort
    from opendpu.compiler.ref import evaluate
    rng = np.random.default_rng(5)
    c = 4
    x = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
    w = rng.standard_normal((c, 1 if depthwise else c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    pads = [3, 1, 0, 1]                                   # ONNX [top, left, bottom, right]
    node = oh.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=pads,
                        group=c if depthwise else 1)
    g = oh.make_graph([node], "c", [oh.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                      [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    want = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0].transpose(0, 2, 3, 1)
    assert want.shape == (1, 1, 1, c) and np.allclose(want.reshape(-1), b)
    attrs = {"kernel": [3, 3], "stride": [2, 2], "dilation": [1, 1], "pad": [1, 1, 3, 0], "pad_mode": "FLOOR"}
    wx = w[:, 0].transpose(1, 2, 0)[None] if depthwise else w.transpose(0, 2, 3, 1)
    got = evaluate("depthwise-conv2d" if depthwise else "conv2d", [x.transpose(0, 2, 3, 1), wx, b], attrs,
                   [None] * 3, None, want.shape, name="conv")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)

    def build(net, rng):
        y = net.add("GlobalAveragePool", ["x"])[0]
        y = net.add("Pad", [y, net.const("pads", [0, 0, 2, 1, 0, 0, 0, 1], np.int64)], mode="constant")[0]
        net.add("Conv", [y, net.const("w", rng.normal(0, .5, (c, 1, 3, 3))), net.const("b", rng.normal(0, .5, c))],
                kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 0], group=c)
    out = run_case(_one_model((1, c, 6, 6), build), str(tmp_path))
    assert out.kind == "ok", out.message


# ---- regressions: quantizer bugs the fuzz found (fixed), as minimal models ---------------------------------------
# Each must now succeed with sim == ref or give a clear error naming an op.
def _one_model(shape, build, target="B512") -> Case:
    rng = np.random.default_rng(0)
    net = _Net(rng, shape)
    build(net, rng)
    return Case(net.model(), calibration(rng, shape, "normal"), target, "maxmin", 0, net.desc)


def test_pad_of_a_kernel_or_more_before_an_avgpool(tmp_path):
    def build(net, rng):
        y = net.add("Pad", ["x", net.const("pads", [0, 0, 0, 0, 0, 0, 0, 2], np.int64)], mode="constant")[0]
        net.add("AveragePool", [y], kernel_shape=[2, 2], strides=[1, 1])
    out = run_case(_one_model((1, 3, 6, 6), build), str(tmp_path))
    assert out.kind in ("ok", "error"), out.message


def test_ceil_mode_window_in_the_trailing_pad_maxpool(tmp_path):
    def build(net, rng):
        net.add("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 2, 0], ceil_mode=1)
    out = run_case(_one_model((1, 3, 4, 6), build), str(tmp_path))
    assert out.kind in ("ok", "error"), out.message


def test_ceil_mode_window_in_the_trailing_pad_avgpool(tmp_path):
    def build(net, rng):
        net.add("AveragePool", ["x"], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1,
                count_include_pad=0)
    out = run_case(_one_model((1, 3, 6, 4), build), str(tmp_path))
    assert out.kind in ("ok", "error"), out.message


def test_hard_sigmoid_in_a_concat_lowered_by_an_add(tmp_path):
    def build(net, rng):
        h = net.add("HardSigmoid", ["x"], alpha=1 / 6, beta=0.5)[0]
        c = net.add("Conv", [h, net.const("w", rng.normal(0, .3, (4, 4, 1, 1)))], kernel_shape=[1, 1])[0]
        cat = net.add("Concat", [h, c], axis=1)[0]
        big = net.add("Conv", [cat, net.const("w2", rng.normal(0, 8, (8, 8, 1, 1)))], kernel_shape=[1, 1])[0]
        net.add("Add", [cat, big])
    out = run_case(_one_model((1, 4, 8, 8), build), str(tmp_path))
    assert out.kind in ("ok", "error"), out.message



def test_a_float_range_beyond_any_fix_point(tmp_path):
    def build(net, rng):
        y = net.add("Exp", ["x"])[0]
        y = net.add("Exp", [y])[0]
        net.add("Conv", [y, net.const("w", rng.normal(0, .3, (2, 3, 3, 3)))], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    case = _one_model((1, 3, 6, 6), build)
    case.calib[0, 0, 0, 0] = 4.2                   # exp(exp(4.2)) = 9e28
    out = run_case(case, str(tmp_path))
    assert out.kind == "ok" or (out.kind == "error" and out.stage == "quantize" and "const-fix" not in out.message), \
        out.message


# ---- command line: re-run a saved case, or survey the slow test's examples ------------------------------------
def _survey() -> int:
    global _SURVEY
    _SURVEY = []
    t0 = time.perf_counter()
    test_fuzz_onnx_200()
    outs = _SURVEY
    ok = [o for _, o in outs if o.kind == "ok"]
    err = [(c, o) for c, o in outs if o.kind == "error"]
    bad = [(c, o) for c, o in outs if o.kind == "failure"]
    secs = np.array([o.seconds for _, o in outs])
    print(f"\n{len(outs)} examples in {time.perf_counter() - t0:.1f} s: {len(ok)} ok, {len(err)} clear errors, "
          f"{len(bad)} failures; per example median {np.median(secs):.2f} s, mean {secs.mean():.2f} s, "
          f"p90 {np.percentile(secs, 90):.2f} s, max {secs.max():.2f} s")
    groups: dict[str, int] = {}
    for _, o in err:
        key = re.sub(r"\b(\w+?)\d+\b", r"\1N", o.message)
        key = re.sub(r"'[a-z_]+N(_\d+)?'", "'OP'", key)[:200]
        groups[key] = groups.get(key, 0) + 1
    print("\nclear errors by message:")
    for k, v in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {v:4d}  {k}")
    print("\nfailures:")
    for c, o in bad:
        print(f"  {o.message}\n    {c!r}\n    repro {o.repro}")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if argv == ["--survey"]:
        return _survey()
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print("usage: python -m tests.test_fuzz_onnx (REPRO_DIR | --survey)", file=sys.stderr)
        return 2
    case = load_case(argv[0])
    print(repr(case))
    out = run_case(case)
    print(f"{out.kind} after {out.seconds:.2f} s: {out.message}")
    return 1 if out.kind == "failure" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
