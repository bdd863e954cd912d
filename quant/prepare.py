"""Preparation (vai_q "optimize" step): a float `FGraph` becomes a list of `QNode`s, one per quantized XIR op.

It folds BatchNorm into the preceding conv / gemm (a lone BN becomes a 1×1 depthwise conv), turns Gemm/MatMul
into convolutions (a Flatten→Gemm into an H×W conv, as AMD's TransferMatMulToConv2d), fuses conv+act and
add+ReLU, recognises hard-sigmoid / hard-swish (including `x·clip(x+3,0,6)/6`), folds zero Pad into the next
conv, maps const add/mul onto conv bias/weights or a depthwise conv, and maps LeakyReLU 0.1 to the DPU's 26/256
(another slope: a one-slope PReLU); HardSigmoid(alpha, 0.5) is the DPU's hard-sigmoid of 6·alpha·x, the factor
folded into the producer conv, or into a scaled copy of it when the conv has other readers (`op_HardSigmoid`).
PReLU becomes an ALU prelu (negative slopes: an exact decomposition into DPU ops, `op_PRelu`); a Transpose before
Flatten/Reshape + Gemm/MatMul (PyTorch's permute + view + Linear) folds into the dense weights.
Ops without a fix-point form, and forms the DPU lacks (a handler raises), stay float on the CPU (`kind == "float"`:
the ONNX node itself, `cpu_node`) with the reason; Split/Slice of NCHW feature maps become strided slices.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from opendpu.compiler.fixpoint import LEAKY_ALPHA as _FIXPOINT_LEAKY
from opendpu.compiler.frontend import tile_shape
from opendpu.quant.onnx_in import FGraph, ModelError, Node, QuantError

LEAKY_ALPHA = float(_FIXPOINT_LEAKY)   # 26/256, the DPU's only LeakyReLU slope (UG1414; spec §7.2)
FLOAT_OPS = {"Softmax": "softmax", "Sigmoid": "sigmoid", "Tanh": "tanh"}
MOVE_KINDS = ("concat", "reshape", "slice", "upsample", "tile")     # data movement: no arithmetic of its own


@dataclass
class QNode:
    """One op of the prepared graph, in ONNX (NCHW) terms; `name` becomes the XIR op name."""
    name: str
    kind: str            # input conv dwconv tconv pool eltwise concat upsample tile hsigmoid act reshape prelu float
    inputs: list[str]
    shape: list[int]
    attrs: dict = field(default_factory=dict)
    weight: np.ndarray | None = None     # conv OIHW; dwconv [C,1,kh,kw]; tconv [Cin,Cout,kh,kw]; prelu slopes [C]|[1]
    bias: np.ndarray | None = None
    act: str = "NONE"                    # NONE RELU RELU6 LEAKYRELU
    sources: list[str] = field(default_factory=list)   # ONNX nodes merged into this op
    device: str = "DPU"
    reason: str = ""
    cpu: bool = False                    # placed on the CPU by the target's rules: stays float

    @property
    def quantized(self) -> bool:
        return self.kind != "float" and not self.cpu


@dataclass
class Prepared:
    name: str
    nodes: list[QNode]
    outputs: list[str]                   # QNode names of the graph outputs, in ONNX output order
    output_names: list[str]              # the ONNX names of those outputs
    notes: list[str]                     # VAIQ-style warnings (replacements, float ops, ...)
    opset: int = 17                      # the source model's opset (generic CPU ops are ONNX nodes of it)

    def node(self, name: str) -> QNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def consumers(self, name: str) -> list[QNode]:
        return [n for n in self.nodes if name in n.inputs]

    @property
    def input_nodes(self) -> list[QNode]:
        return [n for n in self.nodes if n.kind == "input"]


def _dpu_leaky(alpha) -> bool:
    """The DPU's LeakyReLU slope: 26/256, or 0.1 which vai_q maps to it."""
    return alpha is not None and (abs(float(alpha) - 0.1) < 1e-6 or abs(float(alpha) - LEAKY_ALPHA) < 1e-9)


def _ints(v, n, default):
    if v is None:
        return list(default)
    v = [int(x) for x in v]
    return v if len(v) == n else list(default)


class _Prep:
    def __init__(self, fg: FGraph, cfg):
        self.fg, self.cfg = fg, cfg
        self.nodes: list[QNode] = []
        self.byname: dict[str, QNode] = {}
        self.val: dict[str, str] = {}            # ONNX tensor -> QNode name
        self.done: set[int] = set()
        self.notes: list[str] = []
        self.graph_outputs = set(fg.outputs)
        self._cons: dict[str, list[Node]] = {}
        for n in fg.nodes:
            for i in n.inputs:
                self._cons.setdefault(i, []).append(n)
        self.exclude = _excluded(fg, tuple(getattr(cfg, "nodes_to_exclude", ()) or ()))

    # ---- helpers ------------------------------------------------------------------------------
    def err(self, node: Node, msg: str) -> QuantError:
        return QuantError(f"{self.fg.source}: op {node.name!r} ({node.op_type}): {msg}")

    def const(self, t: str):
        return self.fg.consts.get(t)

    def shape(self, t: str) -> list[int]:
        s = self.fg.shapes.get(t)
        if s is None:
            raise QuantError(f"{self.fg.source}: tensor {t!r} has no static shape after shape inference")
        return list(s)

    def only_consumer(self, t: str) -> Node | None:
        cs = self._cons.get(t, [])
        if len(cs) == 1 and t not in self.graph_outputs and id(cs[0]) not in self.done \
                and id(cs[0]) not in self.exclude:
            return cs[0]
        return None

    def add(self, q: QNode, *tensors: str) -> QNode:
        base, k = q.name, 1
        while q.name in self.byname:
            q.name = f"{base}_{k}"
            k += 1
        self.nodes.append(q)
        self.byname[q.name] = q
        for t in tensors:
            self.val[t] = q.name
        return q

    def src(self, node: Node, t: str) -> QNode:
        if t in self.fg.consts:
            raise self.err(node, f"input {t!r} is a constant where a feature map is expected")
        if t not in self.val:
            raise self.err(node, f"input {t!r} has no producer")
        return self.byname[self.val[t]]

    def mark(self, *nodes: Node) -> None:
        for n in nodes:
            self.done.add(id(n))

    def scalar_const(self, node: Node):
        """For a binary op with one constant operand: (activation tensor, constant) or (None, None)."""
        a, b = node.inputs[0], node.inputs[1]
        if b in self.fg.consts and a not in self.fg.consts:
            return a, self.fg.consts[b]
        if a in self.fg.consts and b not in self.fg.consts:
            return b, self.fg.consts[a]
        return None, None

    # ---- activation fusion ----------------------------------------------------------------------
    def act_of(self, node: Node) -> tuple[str, float | None] | None:
        t = node.op_type
        if t == "Relu":
            return "RELU", None
        if t == "LeakyRelu":
            alpha = float(node.attrs.get("alpha", 0.01))
            return "LEAKYRELU", alpha
        if t == "Clip":
            lo = node.attrs.get("min")
            hi = node.attrs.get("max")
            if len(node.inputs) > 1 and node.inputs[1]:
                lo = self.const(node.inputs[1])
            if len(node.inputs) > 2 and node.inputs[2]:
                hi = self.const(node.inputs[2])
            if lo is not None and hi is not None and float(lo) == 0.0 and float(hi) == 6.0:
                return "RELU6", None
            if lo is not None and float(lo) == 0.0 and hi is None:
                return "RELU", None
        return None

    def take_act(self, t: str, allowed=("RELU", "RELU6", "LEAKYRELU")) -> tuple[str, str, float | None, list[str]]:
        """Follow t into a fusable activation; returns (final tensor, act, alpha, merged node names)."""
        c = self.only_consumer(t)
        if c is None or not c.inputs or c.inputs[0] != t:
            return t, "NONE", None, []
        a = self.act_of(c)
        if a is None or a[0] not in allowed or (a[0] == "LEAKYRELU" and not _dpu_leaky(a[1])):
            return t, "NONE", None, []          # (another leaky slope: its own op, a one-slope PReLU)
        self.mark(c)
        act, alpha = a
        if act == "LEAKYRELU" and alpha is not None:        # (a leaky activation always has its slope)
            alpha = self.leaky(c, alpha)
        return c.outputs[0], act, alpha, [c.name]

    def leaky(self, node: Node, alpha: float) -> float:
        if alpha != LEAKY_ALPHA:
            self.notes.append(f"[VAIQ_WARN][QUANTIZER_TORCH_LEAKYRELU]: {node.name}: LeakyReLU slope {alpha:g} "
                              f"replaced by {LEAKY_ALPHA} (26/256), the DPU's slope")
        return LEAKY_ALPHA

    def take_bn(self, t: str, w: np.ndarray, b: np.ndarray, axis: int):
        """Fold a following BatchNormalization into (w, b) along output-channel `axis` of w."""
        c = self.only_consumer(t)
        if c is None or c.op_type != "BatchNormalization" or c.inputs[0] != t:
            return t, w, b, []
        g, beta, mu, var = (self.const(x) for x in c.inputs[1:5])
        if any(v is None for v in (g, beta, mu, var)):
            return t, w, b, []
        eps = float(c.attrs.get("epsilon", 1e-5))
        s = (g / np.sqrt(var + eps)).astype(np.float64)
        shp = [1] * w.ndim
        shp[axis] = -1
        w = (w.astype(np.float64) * s.reshape(shp)).astype(np.float32)
        b = (beta + (b.astype(np.float64) - mu) * s).astype(np.float32)
        self.mark(c)
        return c.outputs[0], w, b, [c.name]

    def take_const_affine(self, t: str, w: np.ndarray, b: np.ndarray, axis: int, nout: int):
        """Fold following Add/Sub/Mul/Div by a per-channel or scalar constant into (w, b)."""
        merged = []
        while True:
            c = self.only_consumer(t)
            if c is None or c.op_type not in ("Add", "Sub", "Mul", "Div") or len(c.inputs) != 2:
                break
            x, k = self.scalar_const(c)
            if x != t or k is None:
                break
            kv = _per_channel(k, nout, len(self.shape(t)))
            if kv is None or (c.op_type in ("Sub", "Div") and c.inputs[0] != t):
                break
            if self._hswish_head(c):
                break
            shp = [1] * w.ndim
            shp[axis] = -1
            if c.op_type == "Add":
                b = b + kv
            elif c.op_type == "Sub":
                b = b - kv
            else:
                f = kv if c.op_type == "Mul" else 1.0 / kv
                w = (w * f.reshape(shp)).astype(np.float32)
                b = b * f
            b = b.astype(np.float32)
            self.mark(c)
            merged.append(c.name)
            t = c.outputs[0]
        return t, w, b, merged

    # ---- hard-sigmoid / hard-swish patterns -----------------------------------------------------------
    def _hswish_head(self, add: Node) -> bool:
        return self._match_hsig(add) is not None

    def _match_hsig(self, add: Node):
        """Add(x, 3) -> Clip(0,6) | Relu6-clip -> Div 6 | Mul 1/6: returns (x, [nodes], out tensor)."""
        if add.op_type != "Add" or len(add.inputs) != 2:
            return None
        x, k = self.scalar_const(add)
        if x is None or np.size(k) != 1 or float(np.reshape(k, -1)[0]) != 3.0:
            return None
        c = self.only_consumer(add.outputs[0])
        if c is None or self.act_of(c) != ("RELU6", None):
            return None
        d = self.only_consumer(c.outputs[0])
        if d is None or d.op_type not in ("Div", "Mul"):
            return None
        _, k2 = self.scalar_const(d)
        if k2 is None or np.size(k2) != 1:
            return None
        k2 = float(np.reshape(k2, -1)[0])
        if not ((d.op_type == "Div" and k2 == 6.0) or (d.op_type == "Mul" and abs(k2 - 1 / 6) < 1e-6)):
            return None
        return x, [add, c, d], d.outputs[0]

    # ---- node handlers ----------------------------------------------------------------------------
    def run(self) -> Prepared:
        fg = self.fg
        for name, shp in fg.inputs:
            if len(shp) != 4:
                self.notes.append(f"input {name!r} has shape {shp}; feature maps are expected as NCHW")
            self.add(QNode(name, "input", [], shp, sources=[name]), name)
        for node in fg.nodes:
            if id(node) in self.done:
                continue
            if id(node) in self.exclude:
                self.cpu_node(node, "excluded from quantization (nodes_to_exclude): stays float on the CPU")
                continue
            h = getattr(self, "op_" + node.op_type, None)
            if h is None:
                if node.op_type in FLOAT_OPS:
                    self.float_op(node)
                else:
                    self.cpu_node(node, f"{node.op_type} has no DPU form")
                continue
            snap = self._snapshot()
            self.mark(node)
            try:
                h(node)
                fused = [n for n in self.fg.nodes if id(n) in self.exclude and id(n) in self.done - snap[3]]
                if fused:                   # a pattern took in an excluded node: the pattern's head stays float
                    raise self.err(node, f"its DPU form takes in {fused[0].name!r}, which nodes_to_exclude keeps "
                                         "float")
            except ModelError:
                raise
            except QuantError as e:         # a form the DPU lacks: the op stays float on the CPU, with the reason
                self._restore(snap)
                self.cpu_node(node, _reason(str(e), node), e)
        outs, onames = [], []
        for k, o in enumerate(fg.outputs):
            if o not in self.val:
                raise QuantError(f"{fg.source}: graph output {o!r} was not produced by a prepared op")
            outs.append(self.val[o])
            onames.append(fg.onnx_outputs[k] if len(fg.onnx_outputs) == len(fg.outputs) else o)   # before Identity
        self.check_layouts()
        self.float_regions()
        return Prepared(fg.name, self.nodes, outs, onames, self.notes, fg.opset)

    def check_layouts(self) -> None:
        """Drop dead nodes; a reshape whose NHWC flattening differs from the NCHW one runs on the CPU (in ONNX
        layout, as the generic node it came from), since the DPU reshape aliases the NHWC image."""
        live = {i for n in self.nodes for i in n.inputs} | set(self.val[o] for o in self.fg.outputs)
        self.nodes = [n for n in self.nodes if n.name in live or n.kind == "input"]
        for n in self.nodes:
            if n.kind == "reshape" and "onnx_node" in n.attrs:
                src = self.byname[n.inputs[0]]
                if not (_layout_free(src.shape) and _layout_free(n.shape)):
                    node = n.attrs["onnx_node"]
                    why = (f"reshape {src.shape} -> {n.shape} depends on the NCHW/NHWC layout (the DPU reshape "
                           f"aliases the NHWC image)")
                    n.kind, n.device, n.reason = "float", "CPU", why
                    n.attrs = self.generic_attrs(node, 0)
                    self.notes.append(f"[VAIQ_WARN][QUANTIZER_TORCH_FLOAT_OP]: {n.name}: {why}; stays float (CPU)")

    def float_regions(self) -> None:
        """Data movement (concat, reshape, slice, upsample) whose inputs are all computed in float on the CPU, or
        whose consumers all are, stays there too: quantizing it would cost a round trip and force one fix point
        on values of unrelated ranges (a detector's concat of box pixels and class scores, or of box and class
        logits on their way to the CPU decoder)."""
        for n in self.nodes:
            if n.kind in MOVE_KINDS and n.inputs and all(not self.byname[i].quantized for i in n.inputs):
                n.cpu, n.device = True, "CPU"
                n.reason = "its inputs are computed in float on the CPU; data movement stays with them"
        outs = {self.val[o] for o in self.fg.outputs}
        consumers: dict[str, list[QNode]] = {}
        for c in self.nodes:
            for i in set(c.inputs):
                consumers.setdefault(i, []).append(c)
        for n in reversed(self.nodes):
            cons = consumers.get(n.name, [])
            if n.kind in MOVE_KINDS and n.quantized and n.name not in outs and cons \
                    and all(not c.quantized for c in cons):
                n.cpu, n.device = True, "CPU"
                n.reason = "all its consumers compute in float on the CPU; data movement stays with them"

    # ---- placement instead of failure ------------------------------------------------------------------
    def _snapshot(self):
        return len(self.nodes), dict(self.byname), dict(self.val), set(self.done), len(self.notes)

    def _restore(self, snap) -> None:
        n, byname, val, done, notes = snap
        del self.nodes[n:]
        self.byname, self.val, self.done = byname, val, done
        del self.notes[notes:]

    def generic_attrs(self, node: Node, out_index: int) -> dict:
        """A float (CPU) op that is the ONNX node itself: constant operands kept, feature maps by position."""
        spec: list[tuple[str, object]] = []
        for i in node.inputs:
            if not i:
                spec.append(("none", None))
            elif i in self.fg.consts:
                spec.append(("const", self.fg.consts[i]))
            else:
                spec.append(("fm", self.val[i]))
        return {"op_type": node.op_type, "onnx_attrs": dict(node.attrs), "generic": True, "in_spec": spec,
                "out_index": out_index, "n_outputs": len(node.outputs)}

    def cpu_node(self, node: Node, reason: str, cause: QuantError | None = None) -> None:
        """Keep `node` in float on the CPU (one QNode per used output), with `reason` in the report."""
        self.mark(node)
        fms = []
        for i in node.inputs:
            if i and i not in self.fg.consts:
                if i not in self.val:
                    if cause is not None:
                        raise cause
                    raise self.err(node, f"input {i!r} has no producer")
                if self.val[i] not in fms:
                    fms.append(self.val[i])
        if not fms:
            raise cause or self.err(node, "no feature-map input (a constant subgraph that was not folded)")
        used = [k for k, o in enumerate(node.outputs) if o and (o in self.graph_outputs or self._cons.get(o))]
        for k in used:
            o = node.outputs[k]
            if o not in self.fg.shapes:
                raise cause or self.err(node, f"output {o!r} has no static shape after shape inference")
            name = node.name if len(used) == 1 else f"{node.name}_out{k}"
            self.add(QNode(name, "float", fms, self.shape(o), self.generic_attrs(node, k), sources=[node.name],
                           device="CPU", reason=reason), o)
        self.notes.append(f"[VAIQ_WARN][QUANTIZER_TORCH_FLOAT_OP]: {node.name}: {reason}; stays float (CPU)")

    def silu_mul(self, sig: Node) -> Node | None:
        """The Mul of SiLU x·sigmoid(x) that consumes this Sigmoid, if any."""
        c = self.only_consumer(sig.outputs[0])
        if c is not None and c.op_type == "Mul" and sorted(c.inputs) == sorted([sig.inputs[0], sig.outputs[0]]):
            return c
        return None

    def float_op(self, node: Node) -> None:
        self.mark(node)
        m = self.silu_mul(node) if node.op_type == "Sigmoid" and self.cfg.replace_silu == "hardswish" else None
        if m is not None:
            self.mark(m)
            x = self.src(node, node.inputs[0])
            self.notes.append(f"[VAIQ_WARN][QUANTIZER_TORCH_REPLACE_SILU]: {node.name}: SiLU x*sigmoid(x) replaced "
                              f"by hard-swish x*relu6(x+3)/6")
            hs = self.add(QNode(node.name, "hsigmoid", [x.name], x.shape, sources=[node.name]))
            self.add(QNode(m.name, "eltwise", [x.name, hs.name], self.shape(m.outputs[0]), {"type": "MUL"},
                           sources=[m.name, "hard-swish (SiLU)"]), m.outputs[0])
            return
        if node.op_type == "Sigmoid" and self.cfg.replace_sigmoid:
            x = self.src(node, node.inputs[0])
            self.notes.append(f"[VAIQ_WARN][QUANTIZER_TORCH_REPLACE_SIGMOID]: {node.name}: Sigmoid replaced by "
                              f"hard-sigmoid")
            self.add(QNode(node.name, "hsigmoid", [x.name], self.shape(node.outputs[0]), sources=[node.name]),
                     node.outputs[0])
            return
        x = self.src(node, node.inputs[0])
        attrs = {"op_type": node.op_type, "xir_type": FLOAT_OPS[node.op_type], "onnx_attrs": dict(node.attrs)}
        self.notes.append(f"[VAIQ_WARN][QUANTIZER_TORCH_FLOAT_OP]: {node.name}: {node.op_type} has no fix-point "
                          f"form and stays float (CPU)")
        self.add(QNode(node.name, "float", [x.name], self.shape(node.outputs[0]), attrs, sources=[node.name],
                       device="CPU", reason=f"{node.op_type.lower()} is not supported by the DPU"), node.outputs[0])
        m = self.silu_mul(node) if node.op_type == "Sigmoid" else None
        if m is not None:       # SiLU stays whole on the CPU: x*sigmoid(x) in float, quantized once after it
            self.cpu_node(m, "SiLU x*sigmoid(x): the DPU has no sigmoid, so the product stays with it on the CPU "
                             "(--replace-silu hardswish puts an approximation on the DPU)")

    def _conv_geom(self, node: Node, x_shape, kh, kw) -> dict:
        a = node.attrs
        strides = _ints(a.get("strides"), 2, (1, 1))
        dil = _ints(a.get("dilations"), 2, (1, 1))
        pads = _ints(a.get("pads"), 4, (0, 0, 0, 0))           # ONNX: t, l, b, r
        ap = a.get("auto_pad", b"NOTSET")
        ap = ap.decode() if isinstance(ap, bytes) else str(ap)
        if ap in ("SAME_UPPER", "SAME_LOWER"):
            pads = [0, 0, 0, 0]
            for d, (n_in, k, s, dl) in enumerate(((x_shape[2], kh, strides[0], dil[0]),
                                                  (x_shape[3], kw, strides[1], dil[1]))):
                out = -(-n_in // s)
                tot = max((out - 1) * s + (k - 1) * dl + 1 - n_in, 0)
                lo = tot // 2 if ap == "SAME_UPPER" else tot - tot // 2
                pads[d], pads[d + 2] = lo, tot - lo
        elif ap == "VALID":
            pads = [0, 0, 0, 0]
        return {"strides": strides, "dilations": dil, "pads": pads, "kernel": [kh, kw]}

    def absorb_pad(self, x: QNode, geo: dict) -> QNode:
        if x.kind == "pad" and len(self.consumer_names(x.name)) == 0:
            p = x.attrs["pads"]
            geo["pads"] = [geo["pads"][i] + p[i] for i in range(4)]
            return self.byname[x.inputs[0]]
        return x

    def consumer_names(self, name: str) -> list[str]:
        return [n.name for n in self.nodes if name in n.inputs]

    def op_Conv(self, node: Node) -> None:
        w = self.const(node.inputs[1])
        if w is None:
            raise self.err(node, "weights are not constant (unsupported)")
        if w.ndim != 4:
            raise self.err(node, f"only 2-D convolutions are supported (weights {list(w.shape)})")
        x = self.src(node, node.inputs[0])
        xs = x.shape
        b = self.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        O, Ig, kh, kw = w.shape
        g = int(node.attrs.get("group", 1))
        b = np.zeros(O, np.float32) if b is None else b.astype(np.float32)
        geo = self._conv_geom(node, xs, kh, kw)
        x = self.absorb_pad(x, geo)
        t, w, b, m1 = self.take_bn(node.outputs[0], w.astype(np.float32), b, 0)
        t, w, b, m2 = self.take_const_affine(t, w, b, 0, O)
        t, act, alpha, m3 = self.take_act(t)
        cin = xs[1]
        if g == 1:
            kind = "conv"
        elif g == cin and O == cin:
            kind = "dwconv"
        else:
            raise self.err(node, f"grouped convolution with group {g} (C_in {cin}, C_out {O}) is not supported; "
                                 f"the DPU runs group 1 or depthwise (group = C_in = C_out)")
        self.add(QNode(node.name, kind, [x.name], self.shape(t), geo, w, b, act,
                       [node.name] + m1 + m2 + m3, ), t)
        self.byname[self.val[t]].attrs["alpha"] = alpha

    def op_ConvTranspose(self, node: Node) -> None:
        w = self.const(node.inputs[1])
        if w is None or w.ndim != 4:
            raise self.err(node, "weights must be a constant 4-D tensor")
        x = self.src(node, node.inputs[0])
        Cin, Og, kh, kw = w.shape
        g = int(node.attrs.get("group", 1))
        if g != 1:
            raise self.err(node, f"grouped transposed convolution (group {g}) is not supported")
        b = self.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        b = np.zeros(Og, np.float32) if b is None else b.astype(np.float32)
        geo = self._conv_geom(node, x.shape, kh, kw)
        geo["output_padding"] = _ints(node.attrs.get("output_padding"), 2, (0, 0))
        t, w, b, m1 = self.take_bn(node.outputs[0], w.astype(np.float32), b, 1)
        t, act, alpha, m3 = self.take_act(t)
        q = self.add(QNode(node.name, "tconv", [x.name], self.shape(t), geo, w, b, act, [node.name] + m1 + m3), t)
        q.attrs["alpha"] = alpha

    def op_BatchNormalization(self, node: Node) -> None:
        x = self.src(node, node.inputs[0])
        g, beta, mu, var = (self.const(i) for i in node.inputs[1:5])
        if any(v is None for v in (g, beta, mu, var)):
            raise self.err(node, "BatchNormalization parameters must be constants")
        eps = float(node.attrs.get("epsilon", 1e-5))
        s = g / np.sqrt(var + eps)
        C = s.size
        w = s.reshape(C, 1, 1, 1).astype(np.float32)
        b = (beta - mu * s).astype(np.float32)
        t, act, alpha, m = self.take_act(node.outputs[0])
        self.notes.append(f"{node.name}: a BatchNormalization without a preceding conv became a 1x1 depthwise conv")
        q = self.add(QNode(node.name, "dwconv", [x.name], self.shape(t),
                           {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "kernel": [1, 1]},
                           w, b, act, [node.name] + m), t)
        q.attrs["alpha"] = alpha

    def _dense(self, node: Node, a_t: str, wmat: np.ndarray, bias: np.ndarray, out_t: str, merged: list[str]):
        """y = a @ wmat.T + bias on a 2-D input, as a conv over the 4-D tensor the input was flattened from."""
        a = self.src(node, a_t)
        N, K = wmat.shape
        t, w2, b2, m2 = self.take_const_affine(out_t, wmat.reshape(N, K, 1, 1).astype(np.float32),
                                               bias.astype(np.float32), 0, N)
        t, act, alpha, m3 = self.take_act(t)
        is_out = any(self.val.get(o) == a.name for o in self.fg.outputs)
        if a.kind == "reshape" and len(self.byname[a.inputs[0]].shape) == 4 and len(self._cons.get(a_t, [])) == 1 \
                and not is_out and int(np.prod(self.byname[a.inputs[0]].shape[1:])) == K:
            src4 = self.byname[a.inputs[0]]
            _, C, H, W = src4.shape
            w4 = w2.reshape(N, C, H, W)
            self.nodes.remove(a)
            del self.byname[a.name]
            for k_, v_ in list(self.val.items()):
                if v_ == a.name:
                    del self.val[k_]
            x = src4
            note = f"{node.name}: Flatten+{node.op_type} became a {H}x{W} conv (TransferMatMulToConv2d)"
        else:
            if len(a.shape) != 2 or a.shape[1] != K:
                raise self.err(node, f"input shape {a.shape} does not match weights K={K}")
            x = self.add(QNode(f"{node.name}_to4d", "reshape", [a.name], [a.shape[0], K, 1, 1],
                               {"shape": [a.shape[0], K, 1, 1]}, sources=[node.name]))
            C, H, W, w4 = K, 1, 1, w2
            note = f"{node.name}: {node.op_type} became a 1x1 conv"
        self.notes.append(note)
        out2d = self.shape(t)
        q = self.add(QNode(node.name, "conv", [x.name], [out2d[0], N, 1, 1],
                           {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "kernel": [H, W]},
                           w4, b2, act, [node.name] + merged + m2 + m3))
        q.attrs["alpha"] = alpha
        self.add(QNode(f"{node.name}_reshape", "reshape", [q.name], out2d, {"shape": out2d}, sources=[node.name]), t)

    def op_Gemm(self, node: Node) -> None:
        a = node.attrs
        if int(a.get("transA", 0)):
            raise self.err(node, "transA=1 is not supported")
        B = self.const(node.inputs[1])
        if B is None:
            raise self.err(node, "the second operand must be constant (weights)")
        wmat = B.T if not int(a.get("transB", 0)) else B
        wmat = wmat * float(a.get("alpha", 1.0))
        C = self.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
        bias = np.zeros(wmat.shape[0], np.float32) if C is None else \
            np.broadcast_to(np.asarray(C, np.float32).reshape(-1), (wmat.shape[0],)) * float(a.get("beta", 1.0))
        self._dense(node, node.inputs[0], wmat, bias, node.outputs[0], [])

    def op_MatMul(self, node: Node) -> None:
        B = self.const(node.inputs[1])
        if B is None or B.ndim != 2:
            raise self.err(node, "only a matmul with a constant 2-D right operand (a dense layer) is supported")
        self._dense(node, node.inputs[0], B.T, np.zeros(B.shape[1], np.float32), node.outputs[0], [])

    def _act_node(self, node: Node, act: str, alpha) -> None:
        x = self.src(node, node.inputs[0])
        fusable = ("RELU", "RELU6", "LEAKYRELU") if x.kind in ("conv", "dwconv", "tconv") else \
            ("RELU",) if (x.kind == "eltwise" and x.attrs.get("type") == "ADD") else ()
        if act in fusable and x.act == "NONE" and len(self.consumer_names(x.name)) == 0 \
                and x.name not in [self.val.get(o) for o in self.fg.outputs]:
            x.act = act
            x.attrs["alpha"] = alpha
            x.sources.append(node.name)
            self.val[node.outputs[0]] = x.name
            return
        q = self.add(QNode(node.name, "act", [x.name], self.shape(node.outputs[0]), {"alpha": alpha}, act=act,
                           sources=[node.name]), node.outputs[0])
        del q

    def op_Relu(self, node: Node) -> None:
        self._act_node(node, "RELU", None)

    def op_LeakyRelu(self, node: Node) -> None:
        """Slope 0.1 (vai_q's convention) or 26/256: the DPU's leaky ReLU (0.1 becomes 26/256, with a note). Any
        other slope α runs as a one-slope PReLU on the ALU (its slope quantized as PReLU slopes are) rather than
        being changed to 26/256."""
        alpha = float(node.attrs.get("alpha", 0.01))
        if not _dpu_leaky(alpha):
            self.notes.append(f"{node.name}: LeakyReLU slope {alpha:g} is not the DPU's 26/256: it runs as a "
                              f"one-slope PReLU")
            self._prelu(node, self.src(node, node.inputs[0]), np.array([alpha], np.float32))
            return
        self._act_node(node, "LEAKYRELU", self.leaky(node, alpha))

    def op_Clip(self, node: Node) -> None:
        a = self.act_of(node)
        if a is None:
            raise self.err(node, "only Clip(0, 6) (ReLU6) and Clip(0, inf) (ReLU) are supported")
        self._act_node(node, a[0], None)

    def op_PRelu(self, node: Node) -> None:
        """PReLU with constant slopes α (one per channel or one shared). All α ≥ 0: one `prelu` op (ALU exec_mode 1).
        The ALU cannot take α < 0 (it picks the shift by the sign of x·α, spec §6.8 vs §7.7), so then the exact
        identities x + relu((α−1)·x) (every α ≤ 1) or prelu(x, max(α,0)) + relu(min(α,0)·x) run as DPU ops:
        a 1×1 depthwise conv with ReLU, an ELEW add (and the ALU prelu). Never fused into a conv (ISA1 has no
        PReLU activation on CONV)."""
        x = self.src(node, node.inputs[0])
        k = self.const(node.inputs[1])
        if k is None:
            raise self.err(node, "the slope is not a constant")
        self._prelu(node, x, k)

    def _prelu(self, node: Node, x: QNode, k) -> None:
        """PReLU of x with constant slopes k (op_PRelu; a LeakyReLU of another slope than the DPU's)."""
        rank = len(x.shape)
        C = x.shape[1] if rank >= 2 else 1
        alpha = _per_channel(k, C, rank)
        if alpha is None or rank not in (2, 4):
            raise self.err(node, f"slope of shape {list(np.shape(k))} on a {x.shape} tensor (one slope per channel "
                                 f"or one shared, on an NCHW or [N, C] tensor)")
        if not np.all(np.isfinite(alpha)):
            raise self.err(node, "the slope is not finite")
        out_t = node.outputs[0]
        flat = rank == 2
        if flat:                    # a dense layer's [N, C] output runs as [N, C, 1, 1]
            x = self._prelu_4d(node, x)
        s4, name = list(x.shape), node.name + ("_4d" if flat else "")
        one = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "kernel": [1, 1], "alpha": None}
        if np.all(alpha >= 0):
            w = np.asarray(k, np.float32).reshape(-1) if np.size(k) == 1 else alpha
            y = self.add(QNode(name, "prelu", [x.name], s4, {}, w.astype(np.float32), sources=[node.name]))
        else:
            if np.all(alpha <= 1):
                pos, neg = x, alpha - 1.0
            else:
                pos = self.add(QNode(node.name + "_pos", "prelu", [x.name], s4, {}, np.maximum(alpha, 0),
                                     sources=[node.name]))
                neg = np.minimum(alpha, 0)
            v = self.add(QNode(node.name + "_neg", "dwconv", [x.name], s4, dict(one),
                               neg.reshape(C, 1, 1, 1).astype(np.float32), np.zeros(C, np.float32), "RELU",
                               [node.name]))
            y = self.add(QNode(name, "eltwise", [pos.name, v.name], s4, {"type": "ADD"}, sources=[node.name]))
            self.notes.append(f"{node.name}: PReLU with negative slopes became {'x' if pos is x else 'prelu'} + "
                              f"relu(dwconv 1x1) (the ALU takes slopes >= 0)")
        if flat:
            shp = self.shape(out_t)
            self.add(QNode(node.name, "reshape", [y.name], shp, {"shape": shp}, sources=[node.name]), out_t)
        else:
            self.val[out_t] = y.name

    def _prelu_4d(self, node: Node, x: QNode) -> QNode:
        """The [N, C, 1, 1] form of PReLU input x ([N, C]): the conv a dense layer's reshape came from, when
        nothing else reads that reshape, else a new reshape."""
        n, c = x.shape
        src = self.byname[x.inputs[0]] if x.kind == "reshape" and x.inputs else None
        if src is not None and src.shape == [n, c, 1, 1] and src.quantized == x.quantized \
                and len(self._cons.get(node.inputs[0], [])) == 1 and node.inputs[0] not in self.graph_outputs:
            return src
        return self.add(QNode(f"{node.name}_to4d", "reshape", [x.name], [n, c, 1, 1], {"shape": [n, c, 1, 1]},
                              sources=[node.name]))

    def _eltwise(self, node: Node, typ: str) -> None:
        xs = [self.src(node, i) for i in node.inputs]
        if typ == "ADD":
            t, act, _, m = self.take_act(node.outputs[0], ("RELU",))
        else:
            t, act, m = node.outputs[0], "NONE", []
        self.add(QNode(node.name, "eltwise", [x.name for x in xs], self.shape(t), {"type": typ}, act=act,
                       sources=[node.name] + m), t)

    def _const_channel_op(self, node: Node) -> None:
        """x (+,-,*,/) per-channel/scalar constant: into the producer conv, else a 1x1 depthwise conv."""
        x_t, k = self.scalar_const(node)
        x = self.src(node, x_t)
        C = x.shape[1] if len(x.shape) >= 2 else 1
        kv = _per_channel(k, C, len(x.shape))
        if kv is None or len(x.shape) != 4:
            raise self.err(node, f"{node.op_type} with a constant of shape {list(np.shape(k))} on a {x.shape} tensor "
                                 f"is not supported (per-channel or scalar constants only)")
        if node.op_type in ("Sub", "Div") and node.inputs[0] != x_t:
            raise self.err(node, f"constant {node.op_type} with the constant first is not supported")
        w = np.ones(C, np.float32)
        b = np.zeros(C, np.float32)
        if node.op_type == "Add":
            b = kv
        elif node.op_type == "Sub":
            b = -kv
        elif node.op_type == "Mul":
            w = kv
        else:
            w = 1.0 / kv
        t, act, alpha, m = self.take_act(node.outputs[0])
        self.notes.append(f"{node.name}: {node.op_type} by a constant became a 1x1 depthwise conv")
        q = self.add(QNode(node.name, "dwconv", [x.name], self.shape(t),
                           {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "kernel": [1, 1]},
                           w.reshape(C, 1, 1, 1).astype(np.float32), b.astype(np.float32), act,
                           [node.name] + m), t)
        q.attrs["alpha"] = alpha

    def op_Add(self, node: Node) -> None:
        hs = self._match_hsig(node)
        if hs is not None:
            self.hsig_pattern(node, hs)
            return
        if any(i in self.fg.consts for i in node.inputs):
            self._const_channel_op(node)
        else:
            self._eltwise(node, "ADD")

    def op_Sub(self, node: Node) -> None:
        if any(i in self.fg.consts for i in node.inputs):
            self._const_channel_op(node)
        else:
            raise self.err(node, "Sub of two feature maps is not supported")

    def op_Div(self, node: Node) -> None:
        if node.inputs[1] in self.fg.consts:
            self._const_channel_op(node)
        else:
            raise self.err(node, "Div by a feature map is not supported")

    def op_Mul(self, node: Node) -> None:
        if any(i in self.fg.consts for i in node.inputs):
            self._const_channel_op(node)
        else:
            self._eltwise(node, "MUL")

    def hsig_pattern(self, add: Node, hs) -> None:
        x_t, chain, out_t = hs
        x = self.src(add, x_t)
        self.mark(*chain)
        m = self.only_consumer(out_t)
        hsn = self.add(QNode(add.name + "_hsigmoid", "hsigmoid", [x.name], self.shape(out_t),
                             sources=[n.name for n in chain]), out_t)
        if m is not None and m.op_type == "Mul" and set(m.inputs) == {x_t, out_t}:
            self.mark(m)
            self.add(QNode(m.name, "eltwise", [x.name, hsn.name], self.shape(m.outputs[0]), {"type": "MUL"},
                           sources=[m.name, "hard-swish"]), m.outputs[0])

    def op_HardSigmoid(self, node: Node) -> None:
        """HardSigmoid(alpha, beta=0.5) = clip(alpha·x + 0.5, 0, 1) = relu6(6·alpha·x + 3)/6: the DPU's hard-sigmoid
        of k·x, k = 6·alpha (Paddle's alpha 0.2: k = 1.2). alpha 1/6 (PyTorch's export) is the DPU form as it is;
        otherwise k folds into the producer's weights and bias (a conv, depthwise conv or dense layer whose
        activation, if any, is ReLU) — exact in float. When the producer has other readers, the hard-sigmoid reads
        a scaled copy of it instead (`_scaled_copy`). Else the op stays on the CPU."""
        a, b = float(node.attrs.get("alpha", 0.2)), float(node.attrs.get("beta", 0.5))
        if abs(b - 0.5) > 1e-6 or not a > 0:
            raise self.err(node, f"HardSigmoid(alpha={a:g}, beta={b:g}) is not the DPU's hard-sigmoid "
                                 f"(alpha 1/6, beta 0.5) nor a rescaling of it (beta 0.5, alpha > 0)")
        x = self.src(node, node.inputs[0])
        if abs(a - 1 / 6) > 1e-6:
            x = self._fold_hsig_slope(node, x, 6.0 * a)
        self.add(QNode(node.name, "hsigmoid", [x.name], self.shape(node.outputs[0]), sources=[node.name]),
                 node.outputs[0])

    def _fold_hsig_slope(self, node: Node, x: QNode, k: float) -> QNode:
        """Scale producer x (conv / dwconv, or the conv under a dense layer's reshape) by k > 0 for the HardSigmoid
        `node`; returns the op the hard-sigmoid reads. When `node` is the only reader of everything x stands for,
        x itself is scaled; else a scaled copy of it feeds `node` alone (`_scaled_copy`). A producer of another
        kind, or with an activation that does not commute with k (ReLU6, LeakyReLU), is a QuantError (the op
        stays float)."""
        conv = self.byname[x.inputs[0]] if x.kind == "reshape" and x.inputs else x
        if conv.kind not in ("conv", "dwconv") or conv.act not in ("NONE", "RELU") or conv.weight is None:
            raise self.err(node, f"HardSigmoid(alpha={k / 6:g}, beta=0.5) is the DPU's hard-sigmoid of {k:g}·x "
                                 f"only when {k:g} folds into a conv producer ({x.name!r} is a {x.kind}"
                                 + (f" with {conv.act}" if conv.kind in ("conv", "dwconv") else "") + ")")
        for q in {conv.name, x.name}:
            tensors = [t for t, v in self.val.items() if v == q]
            readers = [c for t in tensors for c in self._cons.get(t, [])]
            if any(t in self.graph_outputs for t in tensors) or any(c is not node for c in readers) \
                    or (q == conv.name and conv is not x and self.consumer_names(q) != [x.name]) \
                    or (q == x.name and self.consumer_names(q)):
                return self._scaled_copy(node, conv, x, k)
        conv.weight = (conv.weight.astype(np.float64) * k).astype(np.float32)
        if conv.bias is not None:
            conv.bias = (conv.bias.astype(np.float64) * k).astype(np.float32)
        self.notes.append(f"{node.name}: HardSigmoid(alpha={k / 6:g}, beta=0.5) = hard-sigmoid({k:g}·x); {k:g} folded "
                          f"into {conv.name!r}'s weights and bias")
        return x

    def _scaled_copy(self, node: Node, conv: QNode, x: QNode, k: float) -> QNode:
        """The producer `conv` of HardSigmoid `node` has other readers, so k cannot fold into it: a copy of it
        (`<conv>_hsig_scaled`: same input, geometry and activation, weights and bias times k; ReLU commutes with
        k > 0) feeds the hard-sigmoid alone, and the original keeps its other readers. Under a dense layer's
        reshape (x is not conv) the reshape is copied too. Exact in float; costs the conv's MACs once more."""
        assert conv.weight is not None                      # checked by _fold_hsig_slope
        w = (conv.weight.astype(np.float64) * k).astype(np.float32)
        b = None if conv.bias is None else (conv.bias.astype(np.float64) * k).astype(np.float32)
        attrs = {a: list(v) if isinstance(v, list) else v for a, v in conv.attrs.items()}
        c = self.add(QNode(f"{conv.name}_hsig_scaled", conv.kind, list(conv.inputs), list(conv.shape), attrs, w, b,
                           conv.act, list(conv.sources) + [node.name]))
        out = c
        if x is not conv:
            out = self.add(QNode(f"{x.name}_hsig_scaled", x.kind, [c.name], list(x.shape),
                                 {a: list(v) if isinstance(v, list) else v for a, v in x.attrs.items()},
                                 sources=list(x.sources) + [node.name]))
        self.notes.append(f"{node.name}: HardSigmoid(alpha={k / 6:g}, beta=0.5) = hard-sigmoid({k:g}·x); {conv.name!r} "
                          f"has other consumers, so {k:g} folded into a copy of it, {c.name!r} (weights and bias "
                          f"times {k:g}), that feeds only the hard-sigmoid")
        return out

    def op_HardSwish(self, node: Node) -> None:
        x = self.src(node, node.inputs[0])
        hs = self.add(QNode(node.name + "_hsigmoid", "hsigmoid", [x.name], x.shape, sources=[node.name]))
        self.add(QNode(node.name, "eltwise", [x.name, hs.name], self.shape(node.outputs[0]), {"type": "MUL"},
                       sources=[node.name]), node.outputs[0])

    def _pool(self, node: Node, typ: str, glob: bool) -> None:
        x = self.src(node, node.inputs[0])
        if len(x.shape) != 4:
            raise self.err(node, f"pooling needs a 4-D NCHW input, got {x.shape}")
        a = node.attrs
        if glob:
            geo: dict = {"kernel": [x.shape[2], x.shape[3]], "strides": [1, 1], "pads": [0, 0, 0, 0], "global": True}
        else:
            k = _ints(a.get("kernel_shape"), 2, (1, 1))
            geo = self._conv_geom(node, x.shape, k[0], k[1])
            if list(geo.get("dilations", [1, 1])) != [1, 1]:
                raise self.err(node, "dilated pooling is not supported")
            geo["global"] = False
            geo["ceil_mode"] = int(a.get("ceil_mode", 0))
            if geo["ceil_mode"]:
                for d, n_in in ((0, x.shape[2]), (1, x.shape[3])):
                    lo, hi, kk, s = geo["pads"][d], geo["pads"][d + 2], k[d], geo["strides"][d]
                    out = -(-(n_in + lo + hi - kk) // s) + 1
                    if (out - 1) * s >= n_in + lo:
                        raise ModelError(f"{self.fg.source}: op {node.name!r} ({node.op_type}): its last ceil_mode "
                                         f"window starts in the trailing padding, where ONNX shape inference and "
                                         f"onnxruntime disagree on the output size; re-export with a smaller pad or "
                                         f"ceil_mode=0")
            if typ == "AVG":
                geo["count_include_pad"] = int(a.get("count_include_pad", 0))
                if not geo["count_include_pad"] and any(geo["pads"]):
                    raise self.err(node, "AveragePool with padding and count_include_pad=0 is not supported; the DPU "
                                         "divides by the full window")
                x2 = self.absorb_pad(x, geo)
                if x2 is not x:         # the folded Pad's zeros are real values: they count in the average
                    geo["count_include_pad"] = 1
                x = x2
        geo["type"] = typ
        self.add(QNode(node.name, "pool", [x.name], self.shape(node.outputs[0]), geo, sources=[node.name]),
                 node.outputs[0])

    def op_MaxPool(self, node: Node) -> None:
        if len(node.outputs) > 1 and node.outputs[1]:
            raise self.err(node, "MaxPool with indices output is not supported")
        self._pool(node, "MAX", False)

    def op_AveragePool(self, node: Node) -> None:
        self._pool(node, "AVG", False)

    def op_GlobalAveragePool(self, node: Node) -> None:
        self._pool(node, "AVG", True)

    def op_GlobalMaxPool(self, node: Node) -> None:
        self._pool(node, "MAX", True)

    def op_ReduceMean(self, node: Node) -> None:
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1:
            axes = self.const(node.inputs[1])
        axes = sorted(int(v) % 4 for v in np.reshape(axes, -1)) if axes is not None else None
        if axes != [2, 3]:
            raise self.err(node, f"ReduceMean over axes {axes} is not supported (only spatial [2, 3])")
        x = self.src(node, node.inputs[0])
        geo = {"kernel": [x.shape[2], x.shape[3]], "strides": [1, 1], "pads": [0, 0, 0, 0], "global": True,
               "type": "AVG"}
        out = self.shape(node.outputs[0])
        if len(out) == 4:
            self.add(QNode(node.name, "pool", [x.name], out, geo, sources=[node.name]), node.outputs[0])
        else:
            p = self.add(QNode(node.name, "pool", [x.name], [out[0], x.shape[1], 1, 1], geo, sources=[node.name]))
            self.add(QNode(node.name + "_reshape", "reshape", [p.name], out, {"shape": out}, sources=[node.name]),
                     node.outputs[0])

    def op_Concat(self, node: Node) -> None:
        xs = [self.src(node, i) for i in node.inputs]
        nd = len(xs[0].shape)
        axis = int(node.attrs.get("axis", 1)) % nd
        self.add(QNode(node.name, "concat", [x.name for x in xs], self.shape(node.outputs[0]), {"axis": axis},
                       sources=[node.name]), node.outputs[0])

    def op_Resize(self, node: Node) -> None:
        x = self.src(node, node.inputs[0])
        a = node.attrs
        mode = a.get("mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        ctm = a.get("coordinate_transformation_mode", b"half_pixel")
        ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
        nm = a.get("nearest_mode", b"round_prefer_floor")
        nm = nm.decode() if isinstance(nm, bytes) else nm
        out = self.shape(node.outputs[0])
        if mode != "nearest":
            raise self.err(node, f"Resize mode {mode!r} is not supported (nearest only)")
        if len(out) != 4 or out[2] % x.shape[2] or out[3] % x.shape[3] or out[:2] != x.shape[:2]:
            raise self.err(node, f"Resize from {x.shape} to {out} is not an integer spatial upsampling")
        ok = (ctm == "asymmetric" and nm == "floor") or \
             (ctm in ("half_pixel", "pytorch_half_pixel") and nm == "round_prefer_floor")
        if not ok:
            raise self.err(node, f"Resize nearest with coordinate_transformation_mode {ctm!r} and nearest_mode "
                                 f"{nm!r} is not supported")
        self.add(QNode(node.name, "upsample", [x.name], out,
                       {"scales": [out[2] // x.shape[2], out[3] // x.shape[3]]}, sources=[node.name]),
                 node.outputs[0])

    op_Upsample = op_Resize

    def op_SpaceToDepth(self, node: Node) -> None:
        """The reorg (tile-fix, reverse false): output channel (dy·s + dx)·C + c takes input pixel
        (y·s + dy, x·s + dx), ONNX's order and the DPU's (spec §7.9)."""
        self._tile(node, False)

    def op_DepthToSpace(self, node: Node) -> None:
        """tile-fix reverse true: ONNX's DCR order is the DPU's; CRD (PixelShuffle's) is not."""
        mode = node.attrs.get("mode", b"DCR")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        if mode != "DCR":
            raise self.err(node, f"DepthToSpace mode {mode!r}: the DPU's tile orders channels as DCR")
        self._tile(node, True)

    def _tile(self, node: Node, reverse: bool) -> None:
        x = self.src(node, node.inputs[0])
        s = int(node.attrs.get("blocksize", 0))
        out = self.shape(node.outputs[0])
        if s < 1:
            raise self.err(node, f"{node.op_type} blocksize {s} is not a positive integer")
        nhwc = tile_shape([x.shape[i] for i in (0, 2, 3, 1)], s, reverse) if len(x.shape) == 4 else None
        if nhwc is None or len(out) != 4 or [out[i] for i in (0, 2, 3, 1)] != nhwc:
            raise self.err(node, f"{node.op_type} blocksize {s} of {x.shape} to {out} is not a whole reorg")
        self.add(QNode(node.name, "tile", [x.name], out, {"stride": s, "reverse": reverse}, sources=[node.name]),
                 node.outputs[0])

    def op_Transpose(self, node: Node) -> None:
        """A Transpose read only by a Flatten/Reshape to [N, K] that feeds only a Gemm/MatMul (PyTorch's
        permute + view + Linear): the permutation goes into the dense weights, so the conv over the untransposed
        NCHW tensor (`_dense`) computes the same thing. Any other Transpose is an error (the DPU has none)."""
        x = self.src(node, node.inputs[0])
        rank = len(x.shape)
        perm = [int(p) % max(rank, 1) for p in node.attrs.get("perm", list(range(rank))[::-1])]
        if perm == list(range(rank)):
            self.val[node.outputs[0]] = x.name
            return
        f = self.only_consumer(node.outputs[0])
        g = self.only_consumer(f.outputs[0]) if f is not None and f.op_type in ("Flatten", "Reshape") \
            and f.inputs[0] == node.outputs[0] else None
        K = int(np.prod(x.shape[1:])) if rank else 0
        B = self.const(g.inputs[1]) if g is not None and len(g.inputs) > 1 else None
        ok = rank == 4 and perm[0] == 0 and f is not None and g is not None and g.inputs[0] == f.outputs[0] \
            and B is not None and B.ndim == 2 and self.shape(f.outputs[0]) == [x.shape[0], K] and \
            ((g.op_type == "Gemm" and not int(g.attrs.get("transA", 0))) or g.op_type == "MatMul")
        if not ok or f is None or g is None or B is None:        # (ok implies all three)
            raise self.err(node, f"Transpose {perm} of a {x.shape} tensor is not supported on the DPU (only one "
                                 f"that feeds Flatten/Reshape + Gemm/MatMul, where it folds into the weights)")
        tshape = [x.shape[p] for p in perm]
        inv = np.argsort(perm)
        # order[k] = the transposed-flatten position of the element at NCHW-flatten position k
        order = np.arange(K).reshape(tshape[1:]).transpose([int(inv[j]) - 1 for j in (1, 2, 3)]).reshape(-1)
        k_axis = 1 if g.op_type == "Gemm" and int(g.attrs.get("transB", 0)) else 0
        if B.shape[k_axis] != K:
            raise self.err(node, f"{g.op_type} weights {list(B.shape)} do not take {K} inputs")
        name = f"{g.inputs[1]}__{node.name}_perm"
        self.fg.consts[name] = np.ascontiguousarray(np.take(B, order, axis=k_axis))
        g.inputs[1] = name
        self.notes.append(f"{node.name}: Transpose {perm} before {f.op_type}+{g.op_type} folded into the weights")
        self.val[node.outputs[0]] = x.name

    def _reshape(self, node: Node) -> None:
        x = self.src(node, node.inputs[0])
        out = self.shape(node.outputs[0])
        if out == x.shape:
            self.val[node.outputs[0]] = x.name
            return
        self.add(QNode(node.name, "reshape", [x.name], out, {"shape": out, "onnx_node": node}, sources=[node.name]),
                 node.outputs[0])

    op_Flatten = op_Reshape = op_Squeeze = op_Unsqueeze = _reshape

    def _slice_node(self, node: Node, x: QNode, out_t: str, ranges: dict[int, tuple[int, int, int]], name: str):
        """A slice of a 4-D NCHW feature map (begin/end/strides per axis) as LOAD/SAVE addressing on the DPU."""
        if len(x.shape) != 4:
            raise self.err(node, f"slicing a {len(x.shape)}-D tensor {x.shape}; the DPU slices NCHW feature maps")
        begin, end, strides = [0, 0, 0, 0], list(x.shape), [1, 1, 1, 1]
        for ax, (b, e, st) in ranges.items():
            begin[ax], end[ax], strides[ax] = b, e, st
        if begin[0] != 0 or end[0] != x.shape[0] or strides[0] != 1:
            raise self.err(node, "slicing the batch axis is not supported on the DPU")
        if strides[1] != 1 or min(strides) < 1:
            raise self.err(node, f"slice strides {strides}: the DPU needs channel stride 1 and positive strides")
        out = self.shape(out_t)
        want = [len(range(b, e, st)) for b, e, st in zip(begin, end, strides)]
        if want != out:
            raise self.err(node, f"slice {begin}:{end}:{strides} of {x.shape} gives {want}, not {out}")
        if out == x.shape:
            self.val[out_t] = x.name
            return
        self.add(QNode(name, "slice", [x.name], out, {"begin": begin, "end": end, "strides": strides},
                       sources=[node.name]), out_t)

    def op_Slice(self, node: Node) -> None:
        x = self.src(node, node.inputs[0])
        vals: list[list[int] | None] = []
        for i in node.inputs[1:]:
            v = self.const(i) if i else None
            if i and v is None:
                raise self.err(node, f"slice bound {i!r} is not a constant")
            vals.append(None if v is None else [int(t) for t in np.reshape(v, -1)])
        starts, ends, rank = vals[0], vals[1], len(x.shape)
        if starts is None or ends is None:
            raise self.err(node, "Slice needs its starts and ends inputs")
        axes = vals[2] if len(vals) > 2 and vals[2] is not None else list(range(len(starts)))
        steps = vals[3] if len(vals) > 3 and vals[3] is not None else [1] * len(starts)
        ranges = {}
        for a, b, e, st in zip(axes, starts, ends, steps):
            a %= rank
            if st <= 0:
                raise self.err(node, f"slice step {st} on axis {a}: the DPU slices with positive steps")
            ranges[a] = slice(b, e, st).indices(x.shape[a])
        self._slice_node(node, x, node.outputs[0], ranges, node.name)

    def op_Split(self, node: Node) -> None:
        x = self.src(node, node.inputs[0])
        rank = len(x.shape)
        axis = int(node.attrs.get("axis", 0)) % max(rank, 1)
        o = 0
        for k, t in enumerate(node.outputs):
            n_ = self.shape(t)[axis]
            if t and (t in self.graph_outputs or self._cons.get(t)):
                self._slice_node(node, x, t, {axis: (o, o + n_, 1)}, f"{node.name}_{k}")
            o += n_
        if o != x.shape[axis]:
            raise self.err(node, f"split sizes add up to {o}, not {x.shape[axis]}")

    def op_Pad(self, node: Node) -> None:
        x = self.src(node, node.inputs[0])
        pads = self.const(node.inputs[1]) if len(node.inputs) > 1 else node.attrs.get("pads")
        mode = node.attrs.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        val = self.const(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else 0.0
        p = [int(v) for v in np.reshape(pads, -1)] if pads is not None else []       # none: refused below
        if mode != "constant" or float(np.reshape(val, -1)[0] if np.size(val) else 0.0) != 0.0 or len(p) != 8 \
                or any(p[i] for i in (0, 1, 4, 5)) or min(p) < 0:
            raise self.err(node, "only zero padding of H and W that feeds a conv is supported")
        c = self.only_consumer(node.outputs[0])
        if c is None or c.op_type not in ("Conv", "AveragePool"):
            raise self.err(node, "a Pad must feed a single Conv or AveragePool to be folded into it")
        self.add(QNode(node.name, "pad", [x.name], self.shape(node.outputs[0]),
                       {"pads": [p[2], p[3], p[6], p[7]]}, sources=[node.name]), node.outputs[0])


SUPPORTED_ONNX = {"Conv", "ConvTranspose", "BatchNormalization", "Gemm", "MatMul", "Relu", "LeakyRelu", "Clip", "Add",
                  "Slice", "Split", "Sub", "Mul", "Div", "HardSigmoid", "HardSwish", "MaxPool", "AveragePool",
                  "GlobalAveragePool", "GlobalMaxPool", "ReduceMean", "Concat", "Resize", "Upsample", "SpaceToDepth",
                  "DepthToSpace", "Flatten", "Reshape", "Squeeze", "Unsqueeze", "Pad", "Identity", "Dropout",
                  "Constant", "Shape"} | set(FLOAT_OPS)


def _layout_free(shape) -> bool:
    """True when a tensor's NCHW and NHWC element orders are the same (not 4-D, C == 1 or H·W == 1)."""
    return len(shape) != 4 or shape[1] == 1 or shape[2] * shape[3] == 1


def _excluded(fg: FGraph, names: tuple[str, ...]) -> set[int]:
    """ids of the nodes named (by node name or by an output tensor) in nodes_to_exclude; an unknown name is an
    error naming it, as vai_q_onnx's check of its nodes_to_exclude list."""
    want = set(names)
    ids, hit = set(), set()
    for n in fg.nodes:
        keys = ({n.name} | set(n.outputs)) & want
        if keys:
            ids.add(id(n))
            hit |= keys
    missing = sorted(want - hit)
    if missing:
        known = ", ".join(repr(n.name) for n in fg.nodes[:6])
        raise QuantError(f"{fg.source}: nodes_to_exclude: no node or tensor named {', '.join(map(repr, missing))} "
                         f"(node names look like {known}, ...; `opendpu inspect` lists them)")
    return ids


def _reason(msg: str, node: Node) -> str:
    """A handler's error message without its "<file>: op '<name>' (<type>): " prefix, as a placement reason."""
    tag = f"({node.op_type}): "
    return msg.split(tag, 1)[1] if tag in msg else msg


def _per_channel(k, C: int, rank: int):
    """A constant that broadcasts against an [N, C, ...] tensor of `rank` as one value per channel (or one
    scalar), as a length-C vector; None for any other shape (e.g. a 1-D [C] against NCHW is along W)."""
    k = np.asarray(k, np.float32)
    if k.size == 1:
        return np.full(C, float(k.reshape(-1)[0]), np.float32)
    if k.ndim > rank:
        return None
    shp = [1] * (rank - k.ndim) + list(k.shape)
    if rank >= 2 and shp[1] == C and all(d == 1 for i, d in enumerate(shp) if i != 1):
        return k.reshape(-1)
    return None


def prepare(fg: FGraph, cfg) -> Prepared:
    """Rewrite the float graph into quantizable ops (see the module docstring)."""
    return _Prep(fg, cfg).run()
