"""The quantized xmodel, in the XIR form vai_q_pytorch exports: data-fix, const-fix (with data), conv2d-fix,
depthwise-conv2d-fix, transposed-conv2d-fix, pool-fix, eltwise-fix, concat-fix, upsample-fix, tile-fix,
hard-sigmoid-fix, reshape-fix, fix2float/float2fix around float ops; NHWC tensors with fix_point, bit_width,
if_signed, round_mode."""
from __future__ import annotations

import numpy as np

from opendpu.compiler.fixpoint import LEAKY_ALPHA, hsigmoid_fields
from opendpu.compiler.frontend_common import _t
from opendpu.compiler.xir.graph import DATA_TYPE_CODES, Graph, Tensor
from opendpu.quant.emit import QParams, opset_of
from opendpu.quant.prepare import Prepared, QNode

XINT = DATA_TYPE_CODES["XINT"]
FLOAT = DATA_TYPE_CODES["FLOAT"]
NHWC_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}


def nhwc(shape) -> list[int]:
    s = [int(d) for d in shape]
    return [s[0], s[2], s[3], s[1]] if len(s) == 4 else s


def fix_tensor(name: str, shape, fp: int, round_mode: str = "DPU_ROUND") -> Tensor:
    t = Tensor(name, list(shape), XINT, 8)
    t.attrs.set("fix_point", int(fp))
    t.attrs.set("bit_width", 8)
    t.attrs.set("if_signed", True)
    t.attrs.set("round_mode", round_mode)
    return t


def float_tensor(name: str, shape) -> Tensor:
    return Tensor(name, list(shape), FLOAT, 32)


def xir_weights(n: QNode, q: np.ndarray) -> np.ndarray:
    """ONNX weight layout -> XIR: conv OIHW -> OHWI; depthwise [C,1,kh,kw] -> [1,kh,kw,C];
    transposed [Cin,Cout,kh,kw] -> OHWI of the equivalent stride-1 conv (unflipped, spec §7.9)."""
    if n.kind == "conv":
        return np.ascontiguousarray(q.transpose(0, 2, 3, 1))
    if n.kind == "dwconv":
        return np.ascontiguousarray(q.transpose(1, 2, 3, 0))
    if n.kind == "tconv":
        return np.ascontiguousarray(q[:, :, ::-1, ::-1].transpose(1, 2, 3, 0))
    if n.kind == "prelu":                   # slopes: one per channel (the NHWC last axis) or one shared
        return np.ascontiguousarray(q.reshape(-1))
    raise ValueError(n.kind)


def act_attrs(n: QNode) -> dict:
    """XIR `nonlinear` (and `LEAKYRELU_alpha`) of a conv-like node."""
    out: dict[str, str | float] = {"nonlinear": n.act}
    if n.act == "LEAKYRELU":
        out["LEAKYRELU_alpha"] = float(n.attrs.get("alpha") or LEAKY_ALPHA)
    return out


def geom_attrs(n: QNode) -> dict:
    """XIR window attributes of a node: kernel/stride/dilation as [w, h], pad as [left, right, top, bottom]."""
    a = n.attrs
    kh, kw = a["kernel"]
    sh, sw = a["strides"]
    t, l, b, r = a["pads"]
    out = {"kernel": [int(kw), int(kh)], "stride": [int(sw), int(sh)], "pad": [int(l), int(r), int(t), int(b)],
           "pad_mode": "FLOOR"}
    if "dilations" in a:
        dh, dw = a["dilations"]
        out["dilation"] = [int(dw), int(dh)]
    return out


class _Builder:
    def __init__(self, prep: Prepared, qp: QParams):
        self.prep, self.qp = prep, qp
        self.g = Graph(prep.name)
        self.fixed: dict[str, str] = {}     # QNode -> XIR op with its int8 value
        self.floated: dict[str, str] = {}   # QNode -> XIR op with its float value

    def op(self, name, typ, inputs, attrs, out):
        return self.g.add_op(name, typ, inputs, attrs, out)

    def fixed_of(self, src: str) -> str:
        if src in self.fixed:
            return self.fixed[src]
        fl = self.floated[src]
        fp = self.qp.act_fp[src]
        shape = _t(self.g.ops[fl]).shape
        name = f"{src}_float2fix"
        self.op(name, "float2fix", {"input": [fl]}, {"fix_point": fp, "bit_width": 8, "if_signed": True,
                                                      "round_mode": "DPU_ROUND"}, fix_tensor(name, shape, fp))
        self.fixed[src] = name
        return name

    def float_of(self, src: str) -> str:
        if src in self.floated:
            return self.floated[src]
        fx = self.fixed[src]
        t = _t(self.g.ops[fx])
        name = f"{src}_fix2float"
        self.op(name, "fix2float", {"input": [fx]}, {"fix_point": t.fix_point, "bit_width": 8, "if_signed": True},
                float_tensor(name, t.shape))
        self.floated[src] = name
        return name

    def const(self, name: str, q: np.ndarray, fp: int):
        t = fix_tensor(name, q.shape, fp, "PY3_ROUND")
        self.op(name, "const-fix", {}, {"data": q.astype(np.int8).tobytes(), "data_type": "XINT8",
                                        "shape": [int(d) for d in q.shape]}, t)
        return name

    def build(self) -> Graph:
        for n in self.prep.nodes:
            if n.cpu:
                self.k_cpu(n)
            else:
                getattr(self, "k_" + n.kind)(n)
        return self.g

    def fconst(self, name: str, arr: np.ndarray) -> str:
        arr = np.ascontiguousarray(arr, np.float32)
        self.op(name, "const", {}, {"data": arr.tobytes(), "data_type": "FLOAT32",
                                    "shape": [int(d) for d in arr.shape]}, float_tensor(name, arr.shape))
        return name

    def k_cpu(self, n: QNode):
        """An op the target's rules put on the CPU: the float XIR op (VART's CPU runner), fed by fix2float."""
        ins = [self.float_of(i) for i in n.inputs]
        shape = nhwc(n.shape)
        k, a = n.kind, n.attrs
        main = n.name if n.act == "NONE" or k in ("conv", "dwconv", "tconv") else n.name + "_op"
        if k in ("conv", "dwconv", "tconv"):
            assert n.weight is not None and n.bias is not None        # prepare gives every conv-like op both
            w = self.fconst(f"{n.name}_weights", xir_weights(n, n.weight))
            b = self.fconst(f"{n.name}_bias", n.bias.reshape(-1))
            attrs = geom_attrs(n)
            attrs.update(act_attrs(n))
            typ = {"conv": "conv2d", "dwconv": "depthwise-conv2d", "tconv": "transposed-conv2d"}[k]
            self.op(main, typ, {"input": ins, "weights": [w], "bias": [b]}, attrs, float_tensor(main, shape))
        elif k == "pool":
            attrs = geom_attrs(n)
            attrs.pop("dilation", None)
            attrs["global"] = bool(a.get("global", False))
            if a["type"] == "AVG":
                attrs["count_include_pad"] = bool(a.get("count_include_pad", 1))
                attrs["count_include_invalid"] = not a.get("ceil_mode")
            self.op(main, "maxpool2d" if a["type"] == "MAX" else "avgpool2d", {"input": ins}, attrs,
                    float_tensor(main, shape))
        elif k == "eltwise":
            self.op(main, "add" if a["type"] == "ADD" else "mul", {"input": ins}, {}, float_tensor(main, shape))
        elif k == "concat":
            self.op(main, "concat", {"input": ins}, {"axis": NHWC_AXIS[a["axis"]] if len(n.shape) == 4 else a["axis"]},
                    float_tensor(main, shape))
        elif k == "upsample":
            sh, sw = a["scales"]
            self.op(main, "upsample", {"input": ins}, {"mode": "NEAREST", "scale": [float(sw), float(sh)]},
                    float_tensor(main, shape))
        elif k == "tile":
            self.op(main, "reorg", {"input": ins}, {"scale": int(a["stride"]), "reverse": bool(a["reverse"])},
                    float_tensor(main, shape))
        elif k == "hsigmoid":
            self.op(main, "hard-sigmoid", {"input": ins}, {}, float_tensor(main, shape))
        elif k == "prelu":
            assert n.weight is not None
            w = self.fconst(f"{n.name}_slope", xir_weights(n, n.weight))
            self.op(main, "prelu", {"input": ins, "weight": [w]}, {}, float_tensor(main, shape))
        elif k == "reshape":
            self.op(main, "reshape", {"input": ins}, {"shape": shape}, float_tensor(main, shape))
        elif k == "slice":
            self.op(main, "strided_slice", {"input": ins}, {"begin": nhwc(a["begin"]), "end": nhwc(a["end"]),
                                                            "strides": nhwc(a["strides"])}, float_tensor(main, shape))
        elif k == "act":
            main = ins[0]
        else:
            raise ValueError(f"op {n.name}: no float form for kind {k}")
        if main != n.name:
            typ = {"RELU": "relu", "RELU6": "relu6", "LEAKYRELU": "leaky-relu"}[n.act]
            attrs = {"alpha": float(a.get("alpha") or LEAKY_ALPHA)} if n.act == "LEAKYRELU" else {}
            self.op(n.name, typ, {"input": [main]}, attrs, float_tensor(n.name, shape))
        self.floated[n.name] = n.name

    def out_tensor(self, n: QNode) -> Tensor:
        return fix_tensor(n.name, nhwc(n.shape), self.qp.act_fp[n.name])

    def k_input(self, n: QNode):
        self.op(n.name, "data-fix", {}, {"shape": nhwc(n.shape), "data_type": "XINT8"}, self.out_tensor(n))
        self.fixed[n.name] = n.name

    def _conv(self, n: QNode, typ: str):
        qp = self.qp
        w = self.const(f"{n.name}_weights", xir_weights(n, qp.w_q[n.name]), qp.w_fp[n.name])
        b = self.const(f"{n.name}_bias", qp.b_q[n.name].reshape(-1), qp.b_fp[n.name])
        attrs = geom_attrs(n)
        if n.kind == "tconv":
            attrs["output_padding"] = list(n.attrs.get("output_padding", [0, 0]))
        attrs["group"] = 1
        attrs.update(act_attrs(n))
        self.op(n.name, typ, {"input": [self.fixed_of(n.inputs[0])], "weights": [w], "bias": [b]}, attrs,
                self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_conv(self, n):
        self._conv(n, "conv2d-fix")

    def k_dwconv(self, n):
        self._conv(n, "depthwise-conv2d-fix")

    def k_tconv(self, n):
        self._conv(n, "transposed-conv2d-fix")

    def k_pool(self, n: QNode):
        a = n.attrs
        attrs = geom_attrs(n)
        attrs.pop("dilation", None)
        attrs["type"] = a["type"]
        attrs["global"] = bool(a.get("global", False))
        if a["type"] == "AVG":
            attrs["count_include_pad"] = True
        if a.get("ceil_mode"):
            attrs["pad_mode"] = "CEIL"
        self.op(n.name, "pool-fix", {"input": [self.fixed_of(n.inputs[0])]}, attrs, self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_eltwise(self, n: QNode):
        self.op(n.name, "eltwise-fix", {"input": [self.fixed_of(i) for i in n.inputs]},
                {"type": n.attrs["type"], "nonlinear": n.act}, self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_act(self, n: QNode):
        if n.act == "LEAKYRELU":
            attrs = {"type": "LEAKY-RELU", "prelu_in": int(LEAKY_ALPHA * 2 ** 8), "prelu_shift": 8}   # 26 / 2^8
        else:
            attrs = {"type": "ADD", "nonlinear": n.act}
        self.op(n.name, "eltwise-fix", {"input": [self.fixed_of(n.inputs[0])]}, attrs, self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_concat(self, n: QNode):
        axis = NHWC_AXIS[n.attrs["axis"]] if len(n.shape) == 4 else n.attrs["axis"]
        self.op(n.name, "concat-fix", {"input": [self.fixed_of(i) for i in n.inputs]}, {"axis": axis},
                self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_upsample(self, n: QNode):
        sh, sw = n.attrs["scales"]
        self.op(n.name, "upsample-fix", {"input": [self.fixed_of(n.inputs[0])]},
                {"mode": "NEAREST", "scale": [float(sw), float(sh)], "align_corners": False,
                 "half_pixel_centers": False}, self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_tile(self, n: QNode):
        self.op(n.name, "tile-fix", {"input": [self.fixed_of(n.inputs[0])]},
                {"stride": int(n.attrs["stride"]), "reverse": bool(n.attrs["reverse"])}, self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_prelu(self, n: QNode):
        """eltwise-fix PRELU (ALU exec_mode 1, spec §7.7): int8 slopes as a const-fix input, their fix point as
        prelu_shift; y = x < 0 ? x·slope : x, rescaled from the input's fix point to the output's."""
        s = self.const(f"{n.name}_slope", xir_weights(n, self.qp.w_q[n.name]), self.qp.w_fp[n.name])
        self.op(n.name, "eltwise-fix", {"input": [self.fixed_of(n.inputs[0]), s]},
                {"type": "PRELU", "prelu_shift": int(self.qp.w_fp[n.name])}, self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_hsigmoid(self, n: QNode):
        fin = self.qp.act_fp[n.inputs[0]]
        fout = self.qp.act_fp[n.name]
        self.op(n.name, "hard-sigmoid-fix", {"input": [self.fixed_of(n.inputs[0])]},
                dict(zip(("hsigmoid_in", "shift_hsigmoid"), hsigmoid_fields(fin, fout, check=False))),
                self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_reshape(self, n: QNode):
        shape = nhwc(n.shape)
        if n.inputs[0] in self.fixed or n.inputs[0] in self.qp.act_fp:
            self.op(n.name, "reshape-fix", {"input": [self.fixed_of(n.inputs[0])]}, {"shape": shape},
                    self.out_tensor(n))
            self.fixed[n.name] = n.name
        else:
            self.op(n.name, "reshape", {"input": [self.float_of(n.inputs[0])]}, {"shape": shape},
                    float_tensor(n.name, shape))
            self.floated[n.name] = n.name

    def k_slice(self, n: QNode):
        a = n.attrs
        self.op(n.name, "strided_slice-fix", {"input": [self.fixed_of(n.inputs[0])]},
                {"begin": nhwc(a["begin"]), "end": nhwc(a["end"]), "strides": nhwc(a["strides"])}, self.out_tensor(n))
        self.fixed[n.name] = n.name

    def k_generic(self, n: QNode):
        """An ONNX node kept as it is (`onnx-op`, run by the CPU in ONNX's NCHW layout): 4-D feature maps are
        transposed NHWC -> NCHW on the way in and back on the way out."""
        a = n.attrs
        ins: list[str] = []
        names: dict[str, str] = {}
        same = _pointwise(n, self.prep)       # elementwise on equal shapes: any layout will do, no transposes
        for q in n.inputs:
            f = self.float_of(q)
            if len(_t(self.g.ops[f]).shape) == 4 and not same:
                t = f"{n.name}_{q}_nchw"
                self.op(t, "transpose", {"input": [f]}, {"order": [0, 3, 1, 2], "layout_only": True},
                        float_tensor(t, self.prep.node(q).shape))
                f = t
            names[q] = f"x{len(ins)}"
            ins.append(f)
        model = onnx_node_model(n, names, *opset_of(self.prep))
        main = n.name if len(n.shape) != 4 or same else n.name + "_nchw"
        self.op(main, "onnx-op", {"input": ins}, {"device": "CPU", "onnx_op_type": a["op_type"], "cpu_reason": n.reason,
                                                  "onnx_model": model, "output_index": int(a["out_index"]),
                                                  "macs": onnx_macs(n, self.prep)},
                float_tensor(main, nhwc(n.shape) if same else n.shape))
        if main != n.name:
            self.op(n.name, "transpose", {"input": [main]}, {"order": [0, 2, 3, 1], "layout_only": True},
                    float_tensor(n.name, nhwc(n.shape)))
        self.floated[n.name] = n.name

    def k_float(self, n: QNode):
        if n.attrs.get("generic"):
            return self.k_generic(n)
        attrs: dict[str, str | int] = {"device": "CPU"}
        oa = n.attrs.get("onnx_attrs", {})
        if n.attrs["xir_type"] == "softmax":
            ax = int(oa.get("axis", -1)) % len(n.shape)
            attrs["axis"] = NHWC_AXIS[ax] if len(n.shape) == 4 else ax
        self.op(n.name, n.attrs["xir_type"], {"input": [self.float_of(i) for i in n.inputs]}, attrs,
                float_tensor(n.name, nhwc(n.shape)))
        self.floated[n.name] = n.name


POINTWISE = frozenset(("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Sigmoid", "Tanh", "Exp",
                       "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Erf", "Relu", "LeakyRelu", "Elu", "Selu", "Celu",
                       "Gelu", "Mish", "Softplus", "Softsign", "HardSigmoid", "HardSwish", "Clip", "Floor", "Ceil",
                       "Round", "Sign", "Sin", "Cos", "ThresholdedRelu"))


def _pointwise(n: QNode, prep: Prepared) -> bool:
    """An elementwise ONNX op whose feature maps all have the output's shape and whose constants are scalars: it
    computes the same in NHWC, so it needs no layout transposes."""
    a = n.attrs
    return a["op_type"] in POINTWISE and all(prep.node(q).shape == n.shape for q in n.inputs) and \
        all(np.size(v) == 1 for w, v in a["in_spec"] if w == "const")


def onnx_macs(n: QNode, prep: Prepared) -> int:
    """Multiply-accumulates of a generic (CPU) ONNX node, for the DPU coverage: Conv out·(Cin/group)·kh·kw,
    ConvTranspose in·(Cout/group)·kh·kw, Gemm / MatMul out·K; 0 for others."""
    a, t = n.attrs, n.attrs["op_type"]
    consts = [v for w, v in a["in_spec"] if w == "const"]
    out = int(np.prod(n.shape))
    if t in ("Conv", "ConvTranspose") and consts:
        w = np.shape(consts[0])
        if len(w) < 3:
            return 0
        k = int(np.prod(w[2:]))
        if t == "Conv":
            return out * int(w[1]) * k
        return int(np.prod(prep.node(n.inputs[0]).shape)) * int(w[1]) * k if n.inputs else 0
    if t in ("Gemm", "MatMul") and consts and n.shape:
        w = np.shape(consts[0])
        if len(w) == 2:
            trans = t == "Gemm" and int(a.get("onnx_attrs", {}).get("transB", 0))
            return out * int(w[1] if trans else w[0])
    return 0


def onnx_node_model(n: QNode, names: dict[str, str], opset: int, ir_version: int) -> bytes:
    """A generic float op as a one-node ONNX model (serialized): feature-map inputs x0.., constants as
    initializers, every output of the node y0.. (attr `output_index` picks one); the CPU runs it as ONNX would."""
    from onnx import TensorProto, helper, numpy_helper
    a = n.attrs
    inputs, inits, vis = [], [], []
    for k, (what, v) in enumerate(a["in_spec"]):
        if what == "none":
            inputs.append("")
        elif what == "const":
            c = f"c{k}"
            inits.append(numpy_helper.from_array(np.asarray(v), c))
            inputs.append(c)
        else:
            inputs.append(names[v])
    for q, x in names.items():
        vis.append(helper.make_tensor_value_info(x, TensorProto.FLOAT, None))
    outs = [f"y{k}" for k in range(int(a["n_outputs"]))]
    node = helper.make_node(a["op_type"], inputs, outs, name=n.name, **a.get("onnx_attrs", {}))
    g = helper.make_graph([node], n.name, vis, [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None)
                                                for o in outs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="opendpu.quant")
    m.ir_version = ir_version
    return m.SerializeToString()


def build_xmodel(prep: Prepared, qp: QParams) -> Graph:
    """The quantized graph as an (uncompiled) XIR graph: root subgraph only, as vai_q exports it."""
    g = _Builder(prep, qp).build()
    g.attrs.set("origin", "opendpu.quant")
    g._link_subgraphs()
    g.validate()
    return g
