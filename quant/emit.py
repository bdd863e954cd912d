"""ONNX views of a prepared graph: the float model (calibration), the QDQ export (QuantizeLinear/DequantizeLinear,
power-of-two scales, zero point 0) and the DPU fake-quant model (round half up, the DPU's avg-pool and
hard-sigmoid constants) that produces the golden dumps and the accuracy estimates."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from opendpu.compiler.fixpoint import HSIGMOID_SLOPE, LEAKY_ALPHA, avg_pool_factor
from opendpu.quant.prepare import Prepared, QNode

if TYPE_CHECKING:                  # onnx is imported where a model is built
    import onnx

HSIG_A = HSIGMOID_SLOPE        # the DPU's 1/6 = 2731/16384 (spec §7.6)
TIE_BITS = 16                  # QDQ tie-break offset 2^-(fp+16): 1/65536 LSB, one float32 ulp at 64..128 LSB
OPSET = 17


def opset_of(prep: Prepared) -> tuple[int, int]:
    """(opset, IR version) of the emitted ONNX views: 17, or the source model's when newer (its generic CPU
    ops are its own nodes)."""
    op = max(OPSET, int(getattr(prep, "opset", OPSET)))
    return op, (8 if op <= 18 else 9 if op <= 20 else 10)


@dataclass
class QParams:
    """Fix points and integer constants of a quantized graph (ONNX layouts)."""
    act_fp: dict[str, int] = field(default_factory=dict)    # QNode name -> output fix point
    w_fp: dict[str, int] = field(default_factory=dict)
    b_fp: dict[str, int] = field(default_factory=dict)
    w_q: dict[str, np.ndarray] = field(default_factory=dict)
    b_q: dict[str, np.ndarray] = field(default_factory=dict)


def avg_geometry(n: QNode) -> tuple[int, int, int, int]:
    """(kh, kw, N, M) of an average pool: window and the DPU's divisor approximation N/2^M."""
    kh, kw = n.attrs["kernel"]
    N, M = avg_pool_factor(int(kh), int(kw))
    return kh, kw, N, M


def ceil_extra_pads(n: QNode, in_shape) -> list[int]:
    """Pads [t, l, b, r] that make a floor-mode window produce the node's (ceil-mode) output size."""
    kh, kw = n.attrs["kernel"]
    sh, sw = n.attrs["strides"]
    t, l, b, r = n.attrs["pads"]
    oh, ow = n.shape[2], n.shape[3]
    need_h = (oh - 1) * sh + kh - (in_shape[2] + t + b)
    need_w = (ow - 1) * sw + kw - (in_shape[3] + l + r)
    return [t, l, b + max(0, need_h), r + max(0, need_w)]


class _Emitter:
    def __init__(self, prep: Prepared, mode: str, qp: QParams | None, all_outputs: bool, batch):
        from onnx import helper
        self.h = helper
        self.prep, self.mode = prep, mode
        self.qp = qp if qp is not None else QParams()     # float mode (qp None) reads none of it
        self.all_outputs = all_outputs
        self.batch = batch
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0
        self._consts: dict = {}
        self.shapes = {n.name: n.shape for n in prep.nodes}

    def uid(self, base: str) -> str:
        self.k += 1
        return f"{base}__{self.k}"

    def const(self, arr: np.ndarray, base: str) -> str:
        from onnx import numpy_helper
        arr = np.asarray(arr)
        key = (arr.dtype.str, arr.shape, arr.tobytes()) if arr.size <= 16 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self.uid(base)
        self.inits.append(numpy_helper.from_array(arr, name))
        if key is not None:
            self._consts[key] = name
        return name

    def node(self, op: str, ins: list[str], out: str | None = None, name: str | None = None, **attrs) -> str:
        out = out or self.uid(op)
        self.nodes.append(self.h.make_node(op, ins, [out], name=name or self.uid(op + "_n"), **attrs))
        return out

    def half_up(self, t: str, fp: int, name: str) -> str:
        """floor(t·2^fp + 0.5)·2^-fp, unsaturated: the DPU's (and the host's) round half up, in float ops."""
        up = self.const(np.array(2.0 ** fp, np.float32), f"pow2_{fp}")
        dn = self.const(np.array(2.0 ** -fp, np.float32), f"pow2_{-fp}")
        half = self.const(np.array(0.5, np.float32), "half")
        v = self.node("Floor", [self.node("Add", [self.node("Mul", [t, up]), half])], name=name)
        return self.node("Mul", [v, dn])

    def quantize(self, t: str, fp: int, out: str) -> str:
        """The activation quantizer: QDQ (half to even) or the DPU's floor(x·2^fp + 0.5) saturated."""
        if self.mode in ("qdq", "qdq-native"):
            s = self.const(np.array(2.0 ** -fp, np.float32), f"scale_fp{fp}")
            z = self.const(np.array(0, np.int8), "zero_point")
            if self.mode == "qdq":
                # DPU rounding is half up; QuantizeLinear rounds half to even. A tie-break offset of 1/65536 LSB
                # turns exact ties upward and leaves every other value's rounding alone (docs/decisions.md).
                t = self.node("Add", [t, self.const(np.array(2.0 ** -(fp + TIE_BITS), np.float32),
                                                    f"tiebreak_fp{fp}")], name=out + "_dpu_round")
            q = self.node("QuantizeLinear", [t, s, z], name=out + "_QuantizeLinear")
            return self.node("DequantizeLinear", [q, s, z], out, name=out + "_DequantizeLinear")
        lo = self.const(np.array(-128 * 2.0 ** -fp, np.float32), f"qmin_fp{fp}")
        hi = self.const(np.array(127 * 2.0 ** -fp, np.float32), f"qmax_fp{fp}")
        return self.node("Clip", [self.half_up(t, fp, out + "_dpu_round"), lo, hi], out, name=out + "_dpu_fix")

    def weights(self, n: QNode, which: str) -> str:
        qp = self.qp
        if self.mode == "float" or not n.quantized:
            arr = n.weight if which == "w" else n.bias
            assert arr is not None                   # only nodes with weights (and a bias) are asked
            return self.const(arr.astype(np.float32), f"{n.name}.{which}")
        q = (qp.w_q if which == "w" else qp.b_q)[n.name]
        fp = (qp.w_fp if which == "w" else qp.b_fp)[n.name]
        if self.mode in ("qdq", "qdq-native"):
            qi = self.const(q.astype(np.int8), f"{n.name}.{'weight' if which == 'w' else 'bias'}_quant")
            s = self.const(np.array(2.0 ** -fp, np.float32), f"scale_fp{fp}")
            z = self.const(np.array(0, np.int8), "zero_point")
            return self.node("DequantizeLinear", [qi, s, z], f"{n.name}.{'weight' if which == 'w' else 'bias'}")
        return self.const((q.astype(np.float64) * 2.0 ** -fp).astype(np.float32), f"{n.name}.{which}")

    def act(self, n: QNode, t: str, out: str) -> str:
        if n.act == "NONE":
            return t
        if n.act == "RELU":
            return self.node("Relu", [t], out)
        if n.act == "RELU6":
            lo = self.const(np.array(0, np.float32), "zero")
            hi = self.const(np.array(6, np.float32), "six")
            return self.node("Clip", [t, lo, hi], out)
        if n.act == "LEAKYRELU":
            return self.node("LeakyRelu", [t], out, alpha=float(n.attrs.get("alpha") or LEAKY_ALPHA))
        raise ValueError(f"op {n.name}: unknown activation {n.act}")

    def generic(self, n: QNode, ins: list[str], raw: str) -> str:
        """An ONNX node kept as it is (a generic CPU op); with a batch dimension, a Reshape's target gets -1
        for the batch."""
        a = n.attrs
        args = []
        for k, (what, v) in enumerate(a["in_spec"]):
            if what == "none":
                args.append("")
            elif what == "fm":
                args.append(ins[n.inputs.index(v)])
            else:
                if a["op_type"] == "Reshape" and k == 1 and self.batch != 1 and n.shape and n.shape[0] == 1:
                    v = np.array([-1] + list(n.shape[1:]), np.int64)
                args.append(self.const(v, f"{n.name}.c{k}"))
        outs = [raw if j == int(a["out_index"]) else self.uid(f"{n.name}_y{j}") for j in range(int(a["n_outputs"]))]
        self.nodes.append(self.h.make_node(a["op_type"], args, outs, name=self.uid(n.name), **a.get("onnx_attrs", {})))
        return raw

    def pool_pads(self, t: str, pads: list[int], kernel, value: float, name: str) -> tuple[str, list[int]]:
        """(input, pads) for a pool or its depthwise form: pads that reach a whole kernel (which onnxruntime
        refuses) become an explicit Pad with `value` (the DPU's zero or -128 padding) before it."""
        if all(p < k for p, k in zip(pads, list(kernel) * 2)):
            return t, list(pads)
        tt, ll, bb, rr = pads
        cv = self.const(np.array(value, np.float32), name + ".pad_value")
        pv = self.const(np.array([0, 0, tt, ll, 0, 0, bb, rr], np.int64), name + ".pads")
        return self.node("Pad", [t, pv, cv], None, mode="constant"), [0, 0, 0, 0]

    def emit_node(self, n: QNode, ins: list[str]) -> str:
        raw = n.name if (self.mode == "float" or n.name not in self.qp.act_fp or not n.quantized) else n.name + "__raw"
        k = n.kind
        if k in ("conv", "dwconv"):
            a = n.attrs
            assert n.weight is not None
            C = n.weight.shape[0]
            pre = raw if n.act == "NONE" else self.uid(n.name + "_conv")
            self.node("Conv", [ins[0], self.weights(n, "w"), self.weights(n, "b")], pre, name=n.name,
                      kernel_shape=list(a["kernel"]), strides=list(a["strides"]), pads=list(a["pads"]),
                      dilations=list(a["dilations"]), group=(C if k == "dwconv" else 1))
            return self.act(n, pre, raw)
        if k == "tconv":
            a = n.attrs
            pre = raw if n.act == "NONE" else self.uid(n.name + "_conv")
            self.node("ConvTranspose", [ins[0], self.weights(n, "w"), self.weights(n, "b")], pre, name=n.name,
                      kernel_shape=list(a["kernel"]), strides=list(a["strides"]), pads=list(a["pads"]),
                      dilations=list(a["dilations"]), output_padding=list(a.get("output_padding", [0, 0])))
            return self.act(n, pre, raw)
        if k == "pool":
            a = n.attrs
            src_shape = self.shapes[n.inputs[0]]
            if a["type"] == "MAX":
                if a.get("global"):
                    return self.node("GlobalMaxPool", ins, raw, name=n.name)
                t, pads = self.pool_pads(ins[0], ceil_extra_pads(n, src_shape), a["kernel"], -3.0e38, n.name)
                return self.node("MaxPool", [t], raw, name=n.name, kernel_shape=list(a["kernel"]),
                                 strides=list(a["strides"]), pads=pads)
            if self.mode == "float" or not n.quantized:
                if a.get("global"):
                    return self.node("GlobalAveragePool", ins, raw, name=n.name)
                t, pads = self.pool_pads(ins[0], list(a["pads"]), a["kernel"], 0.0, n.name)
                return self.node("AveragePool", [t], raw, name=n.name, kernel_shape=list(a["kernel"]),
                                 strides=list(a["strides"]), pads=pads,
                                 count_include_pad=int(a.get("count_include_pad", 1)),
                                 ceil_mode=int(a.get("ceil_mode", 0)))
            # the DPU's average: window sum times N/2^M (ALU multi_factor N; spec §7.4), as a depthwise conv
            kh, kw, N, M = avg_geometry(n)
            C = src_shape[1]
            w = np.full((C, 1, kh, kw), N / 2.0 ** M, np.float32)
            t, pads = (ins[0], [0, 0, 0, 0]) if a.get("global") else \
                self.pool_pads(ins[0], ceil_extra_pads(n, src_shape), (kh, kw), 0.0, n.name)
            return self.node("Conv", [t, self.const(w, n.name + ".avg_factor")], raw, name=n.name,
                             kernel_shape=[kh, kw], strides=list(a["strides"]), pads=pads, group=C)
        if k in ("eltwise", "act"):
            if k == "act":
                return self.act(n, ins[0], raw) if n.act != "NONE" else self.node("Identity", ins, raw)
            op = "Add" if n.attrs["type"] == "ADD" else "Mul"
            t = ins[0]
            for j, other in enumerate(ins[1:]):
                last = j == len(ins) - 2
                t = self.node(op, [t, other], raw if (last and n.act == "NONE") else None,
                              name=n.name if last else None)
            return self.act(n, t, raw)
        if k == "concat":
            return self.node("Concat", ins, raw, name=n.name, axis=int(n.attrs["axis"]))
        if k == "upsample":
            sh, sw = n.attrs["scales"]
            sc = self.const(np.array([1, 1, sh, sw], np.float32), n.name + ".scales")
            return self.node("Resize", [ins[0], "", sc], raw, name=n.name, mode="nearest",
                             coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        if k == "tile":
            typ = "DepthToSpace" if n.attrs["reverse"] else "SpaceToDepth"
            mode = {"mode": "DCR"} if n.attrs["reverse"] else {}
            return self.node(typ, ins, raw, name=n.name, blocksize=int(n.attrs["stride"]), **mode)
        if k == "prelu":
            # "dpu": the int8 slopes α_q·2^-s; x·α is then exact in float32 (8 by 8 bits), so the activation
            # quantizer after it rounds as the ALU and the reference do (spec §6.8, §7.7)
            slope = self.weights(n, "w")
            if len(n.shape) > 2 and n.weight is not None and n.weight.size > 1:
                slope_shape = self.const(np.array([-1] + [1] * (len(n.shape) - 2), np.int64), n.name + ".slope_shape")
                slope = self.node("Reshape", [slope, slope_shape])
            return self.node("PRelu", [ins[0], slope], raw, name=n.name)
        if k == "hsigmoid":
            if self.mode == "float" or not n.quantized:
                return self.node("HardSigmoid", ins, raw, name=n.name, alpha=1 / 6, beta=0.5)
            return self.node("HardSigmoid", ins, raw, name=n.name, alpha=HSIG_A, beta=3 * HSIG_A)
        if k == "reshape":
            shp = list(n.attrs["shape"])
            if self.batch != 1 and shp and shp[0] == 1:
                shp[0] = -1
            elif self.batch != 1 and len(shp) == 1:     # a Squeeze without axes took the batch too: [N*K] batched
                shp = [-1]
            return self.node("Reshape", [ins[0], self.const(np.array(shp, np.int64), n.name + ".shape")], raw,
                             name=n.name)
        if k == "slice":
            a = n.attrs
            i64 = [self.const(np.array(v[1:], np.int64), f"{n.name}.{w}") for v, w in
                   ((a["begin"], "starts"), (a["end"], "ends"), ([0, 1, 2, 3], "axes"), (a["strides"], "steps"))]
            return self.node("Slice", [ins[0]] + i64, raw, name=n.name)
        if k == "float" and n.attrs.get("generic"):
            return self.generic(n, ins, raw)
        if k == "float":
            return self.node(n.attrs["op_type"], ins, raw, name=n.name, **n.attrs.get("onnx_attrs", {}))
        raise ValueError(f"op {n.name}: cannot emit kind {k}")

    def build(self):
        from onnx import TensorProto
        h = self.h
        prep = self.prep
        inputs = []
        dims0 = "N" if self.batch != 1 else 1
        quant = self.mode != "float"
        self.tname = {}
        self.qname = {}
        for n in prep.input_nodes:
            inputs.append(h.make_tensor_value_info(n.name, TensorProto.FLOAT, [dims0] + list(n.shape[1:])))
        for n in prep.nodes:
            if n.kind == "input":
                if quant and self.mode == "qdq":
                    # the host rounds the float input half up (floor(x·2^fp + 0.5)); a continuous input has no
                    # coarse grid for the tie-break offset, so round explicitly, then Q/DQ (exact on integers)
                    fp = self.qp.act_fp[n.name]
                    self.tname[n.name] = self.quantize(self.half_up(n.name, fp, n.name + "_dpu_round"), fp,
                                                       n.name + "_fix")
                else:
                    self.tname[n.name] = self.quantize(n.name, self.qp.act_fp[n.name], n.name + "_fix") if quant \
                        else n.name
                continue
            src = [self.qname.get(i, self.tname[i]) if n.quantized else self.tname[i] for i in n.inputs]
            out = self.emit_node(n, src)
            if quant and n.name in self.qp.act_fp:
                if n.quantized:
                    out = self.quantize(out, self.qp.act_fp[n.name], n.name)
                else:       # a float (CPU) op feeding quantized ops: float2fix for those consumers only
                    self.qname[n.name] = self.quantize(out, self.qp.act_fp[n.name], n.name + "_float2fix")
            self.tname[n.name] = out
        outs, seen = [], set()

        def vi(t, name):
            shp = self.shapes[name]
            return h.make_tensor_value_info(t, TensorProto.FLOAT, [dims0] + list(shp[1:]) if shp else None)
        for o in prep.outputs:
            if self.tname[o] not in seen:
                outs.append(vi(self.tname[o], o))
                seen.add(self.tname[o])
        if self.all_outputs:
            for n in prep.nodes:
                t = self.tname[n.name]
                if t not in seen and (n.kind != "input" or quant):
                    outs.append(vi(t, n.name))
                    seen.add(t)
        g = h.make_graph(self.nodes, prep.name, inputs, outs, self.inits)
        opset, ir = opset_of(prep)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], producer_name="opendpu.quant")
        m.ir_version = ir
        return m


def emit_onnx(prep: Prepared, mode: str = "float", qp: QParams | None = None, all_outputs: bool = False,
              batch="N"):
    """mode 'float' (prepared float model), 'qdq' (QuantizeLinear/DequantizeLinear with a tie-break offset so ties
    round up as on the DPU), 'qdq-native' (plain Q/DQ, ties to even) or 'dpu' (DPU fake quant with Floor).
    Graph outputs: the model outputs (named by their QNodes), plus every op output if `all_outputs`."""
    if mode not in ("float", "qdq", "qdq-native", "dpu"):
        raise ValueError(f"unknown ONNX emission mode {mode!r}")
    if mode != "float" and qp is None:
        raise ValueError(f"mode {mode!r} needs quantization parameters")
    return _Emitter(prep, mode, qp, all_outputs, batch).build()


def value_name(prep: Prepared, name: str, mode: str) -> str:
    """The ONNX tensor that holds QNode `name`'s output in an emitted model (inputs get '_fix' when quantized)."""
    n = prep.node(name)
    return name + "_fix" if (n.kind == "input" and mode != "float") else name


def session(model, threads: int | None = None, arena: bool = True):
    """An onnxruntime session for an in-memory model (graph optimisations on, CPU; but PadFusion, which would fold
    the explicit Pad of `pool_pads` back into a pool whose pad then reaches the kernel, which it refuses).
    `arena` False: without onnxruntime's memory arena, which keeps its largest size (growing by powers of two) for
    the session's life; without it a batch's buffers go back as soon as the batch is done."""
    import onnxruntime as ort
    from opendpu.quant.onnx_in import QuantError
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.enable_cpu_mem_arena = arena
    if threads:
        so.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=["Pad_Fusion"])
    except Exception as e:      # onnxruntime raises its own exception types
        raise QuantError(f"onnxruntime cannot load the model {model.graph.name!r}: {str(e).splitlines()[0][:300]}") \
            from None
