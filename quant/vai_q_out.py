"""The quantized graph in the form AMD's quantizers write (vai_q_pytorch / vai_q_tensorflow2), which `vai_c_xir -x`
reads: float XIR ops, each quantization point a separate `fix` op (attrs `fix_point`, `bit_width`, `if_signed`,
`round_mode`) after the input `data`, after every weight / bias `const` and after each activation.

`to_vai_q(graph)` converts the `*-fix` graph our quantizer builds (quant/xir_out.py `build_xmodel`) and is exactly
the inverse of `compiler.frontend.from_vai_q`: `from_vai_q(to_vai_q(g))` equals `g` op for op (names, types,
arguments, attributes, tensors, const bytes). What it writes:

* `data-fix` x        -> `data` x (FLOAT32) + `fix` x_fix; `const-fix` w -> `const` w (float32 data q·2^-fix_point,
  exact) + `fix` w_fix (round_mode PY3_ROUND, as the int8 tensor says);
* a conv / pool / eltwise / concat / upsample / hard-sigmoid / reshape `*-fix` op -> its float op under the same name
  (tile-fix -> reorg, `stride` -> `scale`),
  its `nonlinear` as a separate relu / relu6 / leaky-relu op, then a `fix` whose tensor keeps the `*-fix` tensor's
  name; a single-input eltwise-fix is the activation alone (or a bare `fix` for a pure fix-point change);
* a dense layer (quant/prepare.py `_dense`: conv2d-fix C over a full window, reshaped by `C_reshape`, fed directly or
  through `C_to4d`) -> `transpose` [0,3,1,2] + `flatten` + `matmul` (weights [out, in] in NCHW flatten order,
  transpose_b) as vai_q_pytorch exports a Linear;
* `float2fix` -> a `fix` of the float value; `fix2float` disappears (a fixed value is already its float value);
* float ops stay as they are; an op of a type the front end would fuse gets ``device: "CPU"``, the mark that keeps
  it float (our quantizer placed it on the CPU).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from opendpu.compiler.fixpoint import LEAKY_ALPHA, hsigmoid_fields
from opendpu.compiler.frontend import (FUSABLE_TYPES, FrontendError, _Names, copy_attrs, copy_tensor, float_tensor)
from opendpu.compiler.frontend_common import _t
from opendpu.compiler.xir.graph import Attrs, Graph, Op, Tensor

COARSE = {"conv2d-fix": "conv2d", "depthwise-conv2d-fix": "depthwise-conv2d",
          "transposed-conv2d-fix": "transposed-conv2d", "concat-fix": "concat", "upsample-fix": "upsample",
          "hard-sigmoid-fix": "hard-sigmoid", "reshape-fix": "reshape"}
ACT_OPS = {"RELU": "relu", "RELU6": "relu6", "LEAKYRELU": "leaky-relu"}
NL_ATTRS = ("nonlinear", "LEAKYRELU_alpha")
DENSE_ATTRS = ("kernel", "stride", "pad", "pad_mode", "dilation", "group", "nonlinear", "LEAKYRELU_alpha")


class _ToVaiQ:
    def __init__(self, g: Graph):
        self.g = g
        self.out = Graph(g.name)
        self.out.attrs = copy_attrs(g.attrs)
        self.out.op_defs = list(g.op_defs)
        self.names = _Names(g.ops, (op.output.name for op in g.ops.values() if op.output is not None))
        self.val: dict[str, str] = {}         # our op -> the vai_q op holding its (float) value
        self.skip: set[str] = set()           # our ops written as part of a pattern
        self.dense: dict[str, tuple[str, str, str | None]] = {}    # conv -> (reshape op, matmul input op, to4d op)
        self.dense_w: dict[str, str] = {}     # weight const of a dense conv -> the conv

    def err(self, op: Op, msg: str) -> FrontendError:
        return FrontendError(f"graph {self.g.name!r}: op {op.name!r} ({op.type}): {msg}")

    def emit(self, base: str, typ: str, inputs: dict[str, list[str]], attrs: Attrs, out: Tensor,
             exact: bool = False) -> str:
        name = self.names.claim_op(base) if exact else self.names.op(base)
        self.names.used_tensors.add(out.name)
        self.out.add_op(name, typ, inputs, attrs, out)
        return name

    def fix_params(self, t: Tensor) -> Attrs:
        """The `fix` op attributes of an int8 tensor."""
        fp = t.fix_point
        if fp is None or not t.is_fixed:
            raise FrontendError(f"tensor {t.name!r} is {t.dtype_name} without a fix point")
        return Attrs([("fix_point", int(fp)), ("bit_width", int(t.attrs.get("bit_width", t.bit_width))),
                      ("if_signed", bool(t.attrs.get("if_signed", True))),
                      ("round_mode", str(t.attrs.get("round_mode", "DPU_ROUND")))])

    def ins(self, op: Op) -> "OrderedDict[str, list[str]]":
        return OrderedDict((arg, [self.val[p] for p in ps]) for arg, ps in op.inputs.items())

    def tail(self, op: Op, coarse: str, nl: str = "NONE", alpha=None) -> None:
        """After the float op `coarse`: the activation of `nl`, then the fix carrying op's tensor name."""
        t = _t(op)
        x = coarse
        if nl not in ("NONE", ""):
            if nl not in ACT_OPS:
                raise self.err(op, f"nonlinear {nl} has no vai_q form (relu, relu6, leaky-relu)")
            a = Attrs([("alpha", float(alpha if alpha is not None else LEAKY_ALPHA))]) if nl == "LEAKYRELU" else Attrs()
            x = self.emit(f"{coarse}_{ACT_OPS[nl].replace('-', '_')}", ACT_OPS[nl], {"input": [x]}, a,
                          float_tensor(self.names.tensor(f"{t.name}_{ACT_OPS[nl]}"), t.shape))
        self.val[op.name] = self.emit(f"{op.name}_fix", "fix", {"input": [x]}, self.fix_params(t),
                                      float_tensor(t.name, t.shape))

    def coarse_tensor(self, t: Tensor) -> Tensor:
        return float_tensor(self.names.tensor(f"{t.name}_float"), t.shape)

    # ---- dense layers ---------------------------------------------------------------------------
    def plan(self) -> None:
        for op in self.g.ops.values():
            if op.type == "conv2d-fix":
                self.plan_dense(op)

    def plan_dense(self, c: Op) -> None:
        g = self.g
        cons = g.consumers(c.name)
        r = g.ops.get(f"{c.name}_reshape")
        if r is None or cons != [r.name] or r.type != "reshape-fix" or r.input_ops() != [c.name]:
            return
        ct, rt = _t(c), _t(r)
        if len(rt.shape) != 2 or int(rt.shape[0]) != 1 or [int(d) for d in ct.shape] != [1, 1, 1, int(rt.shape[1])] \
                or self.fix_params(ct) != self.fix_params(rt) or set(r.attrs) != {"shape"}:
            return
        ins = c.inputs.get("input", [])
        w, b = c.inputs.get("weights", []), c.inputs.get("bias", [])
        if len(ins) != 1 or len(w) != 1 or len(b) > 1 or g.consumers(w[0]) != [c.name]:
            return
        x = g.ops[ins[0]]
        xs = [int(d) for d in _t(x).shape]
        if len(xs) != 4 or xs[0] != 1:
            return
        want = {"kernel": [xs[2], xs[1]], "stride": [1, 1], "pad": [0, 0, 0, 0], "pad_mode": "FLOOR",
                "dilation": [1, 1], "group": 1}
        a = dict(c.attrs)
        if any(k not in DENSE_ATTRS for k in a) or any(a.get(k) != v for k, v in want.items()) \
                or str(a.get("nonlinear", "NONE")) not in ("NONE", *ACT_OPS) \
                or (a.get("nonlinear") == "LEAKYRELU" and a.get("LEAKYRELU_alpha") != float(LEAKY_ALPHA)):
            return
        to4d = None
        if x.name == f"{c.name}_to4d" and x.type == "reshape-fix" and g.consumers(x.name) == [c.name] \
                and xs[1:3] == [1, 1] and len(x.input_ops()) == 1 and set(x.attrs) == {"shape"}:
            src = g.ops[x.input_ops()[0]]
            if len(_t(src).shape) == 2 and _t(src).is_fixed and self.fix_params(_t(src)) == self.fix_params(
                    _t(x)):
                to4d = x.name
        self.dense[c.name] = (r.name, to4d or x.name, to4d)
        self.dense_w[w[0]] = c.name
        self.skip.add(r.name)
        if to4d:
            self.skip.add(to4d)

    def k_dense(self, c: Op) -> None:
        r_name, x_name, to4d = self.dense[c.name]
        r = self.g.ops[r_name]
        x = self.g.ops[x_name]
        src = self.g.ops[x.input_ops()[0]] if to4d else x
        if to4d:
            inp = self.val[src.name]
        else:
            _, H, W, C = (int(d) for d in _t(x).shape)
            tr = self.emit(f"{c.name}_transpose", "transpose", {"input": [self.val[x.name]]},
                           Attrs([("order", [0, 3, 1, 2])]),
                           float_tensor(self.names.tensor(f"{c.name}_transpose"), [1, C, H, W]))
            inp = self.emit(f"{c.name}_flatten", "flatten", {"input": [tr]},
                            Attrs([("start_axis", 1), ("end_axis", -1)]),
                            float_tensor(self.names.tensor(f"{c.name}_flatten"), [1, C * H * W]))
        ins: dict[str, list[str]] = {"input": [inp, self.val[c.inputs["weights"][0]]]}
        if c.inputs.get("bias"):
            ins["bias"] = [self.val[c.inputs["bias"][0]]]
        n = int(_t(r).shape[1])
        m = self.emit(c.name, "matmul", ins, Attrs([("transpose_a", False), ("transpose_b", True)]),
                      float_tensor(self.names.tensor(f"{_t(r).name}_float"), [1, n]), exact=True)
        self.tail(r, m, str(c.attrs.get("nonlinear", "NONE")), c.attrs.get("LEAKYRELU_alpha"))

    def dense_weights(self, op: Op, q: np.ndarray) -> np.ndarray:
        """OHWI weights of a dense conv -> [out, in] in the flatten order the matmul reads (NCHW after the
        transpose; a 1x1 conv after `_to4d` reads the 2-D input as it is)."""
        return np.ascontiguousarray(q.transpose(0, 3, 1, 2).reshape(q.shape[0], -1))

    # ---- ops ------------------------------------------------------------------------------------
    def run(self) -> Graph:
        self.plan()
        for n in self.g.toposort():
            if n in self.skip:
                continue
            op = self.g.ops[n]
            if op.output is None:
                raise self.err(op, "has no output tensor")
            h = getattr(self, "k_" + op.type.replace("-", "_"), None)
            if h is None:
                if op.type.endswith("-fix") or op.type in ("upload", "download"):
                    raise self.err(op, "has no vai_q form (the vai_q writer takes the quantizer's *-fix ops)")
                h = self.k_float
            h(op)
        self.out._link_subgraphs()
        self.out.validate()
        return self.out

    def k_data_fix(self, op: Op) -> None:
        a = copy_attrs(op.attrs)
        a.set("data_type", "FLOAT32")
        d = self.emit(op.name, "data", {}, a, self.coarse_tensor(_t(op)), exact=True)
        self.tail(op, d)

    def k_const_fix(self, op: Op) -> None:
        t = _t(op)
        fp = t.fix_point
        data = op.attrs.get("data")
        n = int(np.prod(t.shape, dtype=np.int64)) if t.shape else 1
        if fp is None or not isinstance(data, (bytes, bytearray)) or len(data) != n:
            raise self.err(op, f"needs {n} int8 data bytes and a fix point")
        q: np.ndarray = np.frombuffer(bytes(data), np.int8).reshape([int(d) for d in t.shape])
        if op.name in self.dense_w:
            q = self.dense_weights(self.g.ops[self.dense_w[op.name]], q)
        v = np.ldexp(q.astype(np.float32), -int(fp))          # exact: q·2^-fp of an int8 q
        a = copy_attrs(op.attrs)
        a.set("data", np.ascontiguousarray(v, np.float32).tobytes())
        a.set("data_type", "FLOAT32")
        if "shape" in a:
            a.set("shape", [int(d) for d in q.shape])
        c = self.emit(op.name, "const", {}, a, float_tensor(self.names.tensor(f"{t.name}_float"), q.shape),
                      exact=True)
        self.val[op.name] = self.emit(f"{op.name}_fix", "fix", {"input": [c]}, self.fix_params(t),
                                      float_tensor(t.name, q.shape))

    def _coarse(self, op: Op, typ: str, drop=NL_ATTRS) -> None:
        a = copy_attrs(op.attrs, drop)
        c = self.emit(op.name, typ, self.ins(op), a, self.coarse_tensor(_t(op)), exact=True)
        self.tail(op, c, str(op.attrs.get("nonlinear", "NONE")) if "nonlinear" in drop else "NONE",
                  op.attrs.get("LEAKYRELU_alpha"))

    def k_conv2d_fix(self, op: Op) -> None:
        if op.name in self.dense:
            return self.k_dense(op)
        self._check_act(op)
        self._coarse(op, COARSE[op.type])

    def k_depthwise_conv2d_fix(self, op: Op) -> None:
        self._check_act(op)
        self._coarse(op, COARSE[op.type])

    k_transposed_conv2d_fix = k_depthwise_conv2d_fix

    def _check_act(self, op: Op) -> None:
        nl = str(op.attrs.get("nonlinear", "NONE"))
        if nl == "LEAKYRELU" and op.attrs.get("LEAKYRELU_alpha", float(LEAKY_ALPHA)) != float(LEAKY_ALPHA):
            raise self.err(op, f"leaky slope {op.attrs.get('LEAKYRELU_alpha')} is not the DPU's 26/256: a vai_q "
                               f"leaky-relu would not fuse back")

    def k_concat_fix(self, op: Op) -> None:
        self._coarse(op, "concat", ())

    def k_upsample_fix(self, op: Op) -> None:
        self._coarse(op, "upsample", ())

    def k_tile_fix(self, op: Op) -> None:
        """tile-fix (stride, reverse) -> reorg (scale, reverse), the float op `from_vai_q` reads back."""
        a = Attrs([("scale", int(op.attrs.get("stride", 1))), ("reverse", bool(op.attrs.get("reverse", False)))])
        c = self.emit(op.name, "reorg", self.ins(op), a, self.coarse_tensor(_t(op)), exact=True)
        self.tail(op, c)

    def k_reshape_fix(self, op: Op) -> None:
        self._coarse(op, "reshape", ())

    def k_hard_sigmoid_fix(self, op: Op) -> None:
        x = self.g.ops[op.input_ops()[0]]
        fin, fout = _t(x).fix_point, _t(op).fix_point
        want = hsigmoid_fields(int(fin or 0), int(fout or 0), check=False)
        have = (op.attrs.get("hsigmoid_in"), op.attrs.get("shift_hsigmoid"))
        if fin is None or fout is None or tuple(have) != tuple(want):
            raise self.err(op, f"hsigmoid_in / shift_hsigmoid {have} do not follow from the fix points "
                               f"({fin} -> {fout}: {want}); vai_q's hard-sigmoid carries no such fields")
        self._coarse(op, "hard-sigmoid", ("hsigmoid_in", "shift_hsigmoid"))

    def k_pool_fix(self, op: Op) -> None:
        typ = str(op.attrs.get("type", "MAX")).upper()
        if typ not in ("MAX", "AVG"):
            raise self.err(op, f"pool type {typ} has no vai_q form")
        a = copy_attrs(op.attrs, ("type",))
        if typ == "AVG":
            a.set("count_include_invalid", True)           # pool-fix divides by the full window, ceil mode too
        c = self.emit(op.name, "maxpool2d" if typ == "MAX" else "avgpool2d", self.ins(op), a,
                      self.coarse_tensor(_t(op)), exact=True)
        self.tail(op, c)

    def k_eltwise_fix(self, op: Op) -> None:
        typ = str(op.attrs.get("type", "ADD")).upper()
        nl = str(op.attrs.get("nonlinear", "NONE"))
        xs = op.input_ops()
        if typ in ("ADD", "MUL") and len(xs) >= 2:
            return self._coarse(op, "add" if typ == "ADD" else "mul", ("type",) + NL_ATTRS)
        x = self.val[xs[0]] if len(xs) == 1 else None
        t = _t(op)
        if x is not None and typ == "ADD" and set(op.attrs) <= {"type", "nonlinear"} and nl in ACT_OPS \
                and nl != "LEAKYRELU":
            a = self.emit(op.name, ACT_OPS[nl], {"input": [x]}, Attrs(), self.coarse_tensor(t), exact=True)
            return self.tail(op, a)
        if x is not None and typ == "ADD" and set(op.attrs) <= {"type", "nonlinear"} and nl == "NONE":
            self.val[op.name] = self.emit(op.name, "fix", {"input": [x]}, self.fix_params(t),
                                          float_tensor(t.name, t.shape), exact=True)
            return None
        if x is not None and typ == "LEAKY-RELU" and set(op.attrs) == {"type", "prelu_in", "prelu_shift"}:
            alpha = int(op.attrs["prelu_in"]) / 2.0 ** int(op.attrs["prelu_shift"])
            a = self.emit(op.name, "leaky-relu", {"input": [x]}, Attrs([("alpha", alpha)]), self.coarse_tensor(t),
                          exact=True)
            return self.tail(op, a)
        if typ == "PRELU":
            raise self.err(op, "PReLU has no vai_q form here: the vai_q front end (compiler.frontend.from_vai_q) "
                               "reads no prelu back; write the xir format instead")
        raise self.err(op, f"eltwise type {typ} with {len(xs)} input(s) and attributes {sorted(op.attrs)} has no "
                           f"vai_q form")

    def k_float2fix(self, op: Op) -> None:
        t = _t(op)
        self.val[op.name] = self.emit(op.name, "fix", {"input": [self.val[op.input_ops()[0]]]}, self.fix_params(t),
                                      float_tensor(t.name, t.shape), exact=True)

    def k_fix2float(self, op: Op) -> None:
        self.val[op.name] = self.val[op.input_ops()[0]]

    def k_float(self, op: Op) -> None:
        if _t(op).is_fixed:
            raise self.err(op, "produces a fixed-point tensor but is no quantizer op")
        a = copy_attrs(op.attrs)
        if op.type in FUSABLE_TYPES and "device" not in a:
            a.set("device", "CPU")                        # placed on the CPU by the quantizer: keep it float
        self.val[op.name] = self.emit(op.name, op.type, self.ins(op), a, copy_tensor(_t(op)), exact=True)


def to_vai_q(graph: Graph) -> Graph:
    """The vai_q form of a quantized `*-fix` graph (see the module docstring); FrontendError for an op that has
    none."""
    return _ToVaiQ(graph).run()
