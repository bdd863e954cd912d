"""vai_q -> canonical, per op: one handler per vai_q op type, each fusing the op with its `fix` (and a following
activation) into the canonical `*-fix` op, or keeping it a float CPU op when it is not quantized or has no DPU form.
`HANDLERS` is the registry `_FromVaiQ` dispatches on (compiler/frontend_vaiq.py)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from opendpu.compiler.fixpoint import (LEAKY_ALPHA, XIR_ROUND_MODES, FixPointError, hsigmoid_fields, round_values,
                                       slope_encoding, slope_fits_alu)
from opendpu.compiler.frontend_common import _as_float, _is_int, _nl, _short, _t, copy_attrs, fix_tensor
from opendpu.compiler.frontend_vaiq import (VAI_Q_ACTS, VAI_Q_CONV, VAI_Q_POOL, VAI_Q_RESHAPES, Handler, _FixParams,
                                            _FromVaiQ)
from opendpu.compiler.xir.graph import Attrs, Op

HSIGMOID_OUT_FP = 7          # hard-sigmoid output in [0, 1]: fix point 7, as the quantizer (quant.quantize)


def k_data(cv: _FromVaiQ, op: Op) -> None:
    f = cv.only(op.name)
    if f is None or f.type != "fix" or cv.cpu(f) or op.input_ops():
        return cv.float_op(op)
    a = copy_attrs(op.attrs)
    a.set("data_type", "XINT8")
    if "shape" not in a:
        a.set("shape", cv.shape(op))
    cv.emit(op.name, "data-fix", {}, a, cv.out_tensor(op, (None, f)))
    cv.finish(op, (None, f), op.name)


def k_const(cv: _FromVaiQ, op: Op) -> None:
    f = cv.only(op.name)
    if f is None or f.type != "fix" or cv.cpu(f):
        cv.pending[op.name] = op
        cv.floated[op.name] = op.name
        return
    fx = _FixParams(f, cv.where)
    v = cv.const_values(op) * 2.0 ** fx.fp
    q = np.clip(round_values(v, XIR_ROUND_MODES[fx.round_mode]), -128, 127).astype(np.int8)
    a = copy_attrs(op.attrs)
    a.set("data", q.tobytes())
    a.set("data_type", "XINT8")
    if "shape" not in a:
        a.set("shape", cv.shape(op))
    cv.emit(op.name, "const-fix", {}, a, cv.out_tensor(op, (None, f)))
    cv.finish(op, (None, f), op.name)


def k_fix(cv: _FromVaiQ, op: Op) -> None:
    ins = op.input_ops()
    if len(ins) != 1:
        raise cv.err(op, f"takes one input, has {len(ins)}")
    p = ins[0]
    fx = _FixParams(op, cv.where)
    if p in cv.fixed:
        src = cv.fixed[p]
        st = _t(cv.out.ops[src])
        if st.fix_point == fx.fp:
            cv.fixed[op.name] = src               # a re-quantization that changes nothing
            return
        # a fix of a quantized value with another fix point: a fix-point shift (single-input ELEW)
        a = Attrs([("type", "ADD"), ("nonlinear", "NONE")])
        cv.emit(op.name, "eltwise-fix", {"input": [src]}, a,
                fx.tensor(cv.names.claim_tensor(_t(op).name), cv.shape(op)))
        cv.fixed[op.name] = op.name
        return
    src = cv.float_of(p)
    cv.emit(op.name, "float2fix", {"input": [src]}, fx.attrs(),
            fx.tensor(cv.names.claim_tensor(_t(op).name), cv.shape(op)))
    cv.fixed[op.name] = op.name


def k_conv(cv: _FromVaiQ, op: Op) -> None:
    if "input" not in op.inputs or "weights" not in op.inputs:
        raise cv.err(op, f"needs arguments input and weights (has {list(op.inputs)})")
    pad = cv.pads.get(op.name)
    if pad is not None:
        src, _, absorbed = pad
        fixes = [cv.g.ops[a] for a in absorbed if cv.g.ops[a].type == "fix"]
        if src not in cv.fixed or any(_FixParams(f, cv.where).fp != cv.fp_of(cv.fixed[src])
                                      for f in fixes):
            cv.flush(absorbed)             # not a pure zero padding of a quantized value: convert it as it is
            pad = None
    x = [cv.fixed[pad[0]]] if pad is not None else cv.fixed_in(op)
    w = cv.const_fix_in(op, "weights")
    b = cv.const_fix_in(op, "bias")
    chain = cv.fix_chain(op, acts=True)
    base_nl = _nl(op.attrs.get("nonlinear"))
    if chain is not None and chain[0] is not None and base_nl != "NONE":
        chain = None                          # the conv already has an activation: cannot take another
    if x is None or w is None or ("bias" in op.inputs and b is None) or chain is None:
        if pad is not None:
            cv.flush(pad[2])
        return cv.float_op(op)
    a = copy_attrs(op.attrs, ("nonlinear", "LEAKYRELU_alpha", "device"))
    if pad is not None:
        old = a.get("pad", [0, 0, 0, 0])
        if not isinstance(old, list) or len(old) != 4 or not all(_is_int(v) for v in old):
            raise cv.err(op, f"attribute pad = {_short(old)} is not [left, right, top, bottom]")
        a.set("pad", [int(o) + p for o, p in zip(old, pad[1])])
        cv.done.update(pad[2])
    act = cv.act_attrs(chain[0]) if chain[0] is not None else Attrs([("nonlinear", base_nl)])
    assert act is not None
    for k, v in act.items():
        a.set(k, v)
    ins: dict[str, list[str]] = {"input": x, "weights": [w]}
    if b is not None:
        ins["bias"] = [b]
    cv.emit(op.name, VAI_Q_CONV[op.type], ins, a, cv.out_tensor(op, chain))
    cv.finish(op, chain, op.name)


def k_matmul(cv: _FromVaiQ, op: Op) -> None:
    """A dense layer as the conv our quantizer uses (quant/prepare.py _dense, TransferMatMulToConv2d): over the
    4-D tensor a flatten read (the flatten order folded into the OHWI weights), else over the 2-D input
    reshaped by `<name>_to4d`; the conv's [1, 1, 1, N] output is reshaped back by `<name>_reshape`."""
    args = op.inputs.get("input", [])
    if not args:
        raise cv.err(op, f"needs argument input (has {list(op.inputs)})")
    ta, tb = op.attrs.get("transpose_a", False), op.attrs.get("transpose_b", False)
    if not isinstance(ta, (bool, np.bool_)) or not isinstance(tb, (bool, np.bool_)):
        raise cv.err(op, f"attributes transpose_a / transpose_b = {_short(ta)} / {_short(tb)} are not booleans")
    bias_src = op.inputs["bias"] if "bias" in op.inputs else args[2:]
    w_src = args[1] if len(args) >= 2 else None
    w = cv.fixed.get(w_src) if w_src is not None else None
    b = cv.fixed.get(bias_src[0]) if len(bias_src) == 1 else None
    chain = cv.fix_chain(op, acts=True)
    plan = cv.dense.get(op.name)
    ok = (chain is not None and not ta and len(args) in (2, 3) and len(bias_src) <= 1
          and w is not None and cv.out.ops[w].type == "const-fix" and len(_t(cv.out.ops[w]).shape) == 2
          and cv.g.consumers(w_src or "") == [op.name] and not cv.out.consumers(w)
          and (not bias_src or (b is not None and cv.out.ops[b].type == "const-fix"))
          and len(cv.shape(op)) == 2 and cv.shape(op)[0] == 1)
    if plan is not None and not (ok and plan[0] in cv.fixed):
        cv.flush(plan[2])
        plan = None
    if ok and plan is None:
        a_in = cv.fixed.get(args[0])
        ok = a_in is not None and len(_t(cv.out.ops[a_in]).shape) == 2
    if not ok:
        return cv.float_op(op)
    assert w is not None and chain is not None
    w_op = cv.out.ops[w]
    wq = np.frombuffer(w_op.attrs["data"], np.int8).reshape(_t(w_op).shape)
    wm = wq if tb else wq.T                                # [out, in]
    N, K = (int(d) for d in wm.shape)
    if plan is not None:
        x = cv.fixed[plan[0]]
        _, H, W, C = (int(d) for d in _t(cv.out.ops[x]).shape)
        if H * W * C != K:
            raise cv.err(op, f"weights {list(wq.shape)} (transpose_b {bool(tb)}) do not match the flattened "
                             f"input {[1, H, W, C]}")
        w4 = wm.reshape(N, C, H, W).transpose(0, 2, 3, 1) if plan[1] == "nchw" else wm.reshape(N, H, W, C)
        cv.done.update(plan[2])
    else:
        a_in = cv.fixed[args[0]]
        t_in = _t(cv.out.ops[a_in])
        if int(t_in.shape[1]) != K:
            raise cv.err(op, f"input {list(t_in.shape)} does not match weights {list(wq.shape)} (transpose_b "
                             f"{bool(tb)})")
        H = W = 1
        w4 = wm.reshape(N, 1, 1, K)
        x = cv.names.op(f"{op.name}_to4d")
        cv.emit(x, "reshape-fix", {"input": [a_in]}, Attrs([("shape", [1, 1, 1, K])]),
                fix_tensor(cv.names.tensor(x), [1, 1, 1, K], cv.fp_of(a_in),
                           t_in.attrs.get("round_mode", "DPU_ROUND")))
    w4 = np.ascontiguousarray(w4)
    w_op.attrs.set("data", w4.tobytes())
    w_op.attrs.set("shape", [int(d) for d in w4.shape])
    _t(w_op).shape = [int(d) for d in w4.shape]
    a = Attrs([("kernel", [W, H]), ("stride", [1, 1]), ("pad", [0, 0, 0, 0]), ("pad_mode", "FLOOR"),
               ("dilation", [1, 1]), ("group", 1)])
    act = cv.act_attrs(chain[0])
    assert act is not None
    for k, v in act.items():
        a.set(k, v)
    conv_ins: dict[str, list[str]] = {"input": [x], "weights": [w]}
    if b is not None:
        conv_ins["bias"] = [b]
    fx = _FixParams(chain[1], cv.where)
    if plan is None:                  # the quantizer writes <name>_to4d before the layer's weights
        cv.move_before(x, min((w, b) if b is not None else (w,), key=list(cv.out.ops).index))
    cv.emit(op.name, "conv2d-fix", conv_ins, a, fx.tensor(cv.names.claim_tensor(op.name), [1, 1, 1, N]))
    r = cv.names.op(f"{op.name}_reshape")
    cv.emit(r, "reshape-fix", {"input": [op.name]}, Attrs([("shape", cv.shape(op))]),
            cv.out_tensor(op, chain))
    cv.finish(op, chain, r)


def k_eltwise(cv: _FromVaiQ, op: Op) -> None:
    xs = cv.fixed_in(op, n=None)
    chain = cv.fix_chain(op, acts=True)
    if xs is None or chain is None:
        return cv.float_op(op)
    a = copy_attrs(op.attrs, ("device",))
    a.set("type", "ADD" if op.type == "add" else "MUL")
    act = cv.act_attrs(chain[0])
    assert act is not None
    for k, v in act.items():
        a.set(k, v)
    cv.emit(op.name, "eltwise-fix", {"input": xs}, a, cv.out_tensor(op, chain))
    cv.finish(op, chain, op.name)


def k_pool(cv: _FromVaiQ, op: Op) -> None:
    x = cv.fixed_in(op)
    chain = cv.fix_chain(op, acts=False)
    typ = VAI_Q_POOL[op.type]
    a = copy_attrs(op.attrs, ("device", "count_include_invalid"))
    if typ == "AVG":
        pads = op.attrs.get("pad", [0, 0, 0, 0])
        if chain is None or (not op.attrs.get("count_include_pad", True) and isinstance(pads, list) and any(pads)) \
                or (not op.attrs.get("count_include_invalid", True) and str(op.attrs.get("pad_mode", "FLOOR"))
                    .upper() == "CEIL"):
            x = None                           # the DPU divides by the full window: not this op's divisor
        a.set("count_include_pad", True)
    if x is None or (chain is None and typ != "MAX"):
        return cv.float_op(op)
    a.set("type", typ)
    cv.emit(op.name, "pool-fix", {"input": x}, a, cv.out_tensor(op, chain, x[0]))
    cv.finish(op, chain, op.name)


def k_concat(cv: _FromVaiQ, op: Op) -> None:
    xs = cv.fixed_in(op, n=None)
    chain = cv.fix_chain(op, acts=False)
    if xs is None or (chain is None and len({cv.fp_of(x) for x in xs}) != 1):
        return cv.float_op(op)
    cv.emit(op.name, "concat-fix", {"input": xs}, copy_attrs(op.attrs, ("device",)),
            cv.out_tensor(op, chain, xs[0]))
    cv.finish(op, chain, op.name)


def k_upsample(cv: _FromVaiQ, op: Op) -> None:
    ins = op.inputs.get("input", op.input_ops()[:1])
    x = [cv.fixed[ins[0]]] if ins and ins[0] in cv.fixed else None
    chain = cv.fix_chain(op, acts=False)
    mode = str(op.attrs.get("mode", "NEAREST")).upper()
    if x is None or mode != "NEAREST" or op.attrs.get("align_corners", False) \
            or op.attrs.get("half_pixel_centers", False) or len(_t(op).shape) != 4:
        return cv.float_op(op)
    if op.type == "upsample":
        a = copy_attrs(op.attrs, ("device",))
    else:
        ih, iw = _t(cv.out.ops[x[0]]).shape[1:3]
        oh, ow = cv.shape(op)[1:3]
        a = Attrs([("mode", "NEAREST"), ("scale", [ow / iw, oh / ih]), ("align_corners", False),
                   ("half_pixel_centers", False)])
    cv.emit(op.name, "upsample-fix", {"input": x}, a, cv.out_tensor(op, chain, x[0]))
    cv.finish(op, chain, op.name)


def k_reorg(cv: _FromVaiQ, op: Op) -> None:
    """reorg (attrs scale, reverse; tile-fix's channel order, docs/decisions.md) -> tile-fix (stride, reverse)."""
    x = cv.fixed_in(op)
    chain = cv.fix_chain(op, acts=False)
    s, rev = op.attrs.get("scale", op.attrs.get("stride")), op.attrs.get("reverse", False)
    if x is None or not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 1 \
            or not isinstance(rev, (bool, np.bool_)) or len(_t(op).shape) != 4:
        return cv.float_op(op)
    cv.emit(op.name, "tile-fix", {"input": x}, Attrs([("stride", int(s)), ("reverse", bool(rev))]),
            cv.out_tensor(op, chain, x[0]))
    cv.finish(op, chain, op.name)


def k_hsigmoid(cv: _FromVaiQ, op: Op) -> None:
    x = cv.fixed_in(op)
    chain = cv.fix_chain(op, acts=False)
    if x is None or chain is None:
        return cv.float_op(op)
    t = cv.out_tensor(op, chain)
    a = copy_attrs(op.attrs, ("device", "hsigmoid_in", "shift_hsigmoid"))
    for k, v in zip(("hsigmoid_in", "shift_hsigmoid"),
                    hsigmoid_fields(cv.fp_of(x[0]), int(t.attrs["fix_point"]), check=False)):
        a.set(k, v)
    cv.emit(op.name, "hard-sigmoid-fix", {"input": x}, a, t)
    cv.finish(op, chain, op.name)


def k_hswish(cv: _FromVaiQ, op: Op) -> None:
    """x * hard-sigmoid(x) as our quantizer writes it: hard-sigmoid-fix (fix point 7) and eltwise-fix MUL."""
    x = cv.fixed_in(op)
    chain = cv.fix_chain(op, acts=False)
    if x is None or chain is None:
        return cv.float_op(op)
    hs = cv.names.op(f"{op.name}_hsigmoid")
    fields = hsigmoid_fields(cv.fp_of(x[0]), HSIGMOID_OUT_FP, check=False)
    cv.emit(hs, "hard-sigmoid-fix", {"input": x}, Attrs(zip(("hsigmoid_in", "shift_hsigmoid"), fields)),
            fix_tensor(cv.names.tensor(hs), cv.shape(op), HSIGMOID_OUT_FP))
    cv.emit(op.name, "eltwise-fix", {"input": [x[0], hs]}, Attrs([("type", "MUL"), ("nonlinear", "NONE")]),
            cv.out_tensor(op, chain))
    cv.finish(op, chain, op.name)


def k_reshape(cv: _FromVaiQ, op: Op) -> None:
    ins = op.inputs.get("input", op.input_ops()[:1])
    x = [cv.fixed[ins[0]]] if ins and ins[0] in cv.fixed else None
    if x is None:
        return cv.float_op(op)
    chain = cv.fix_chain(op, acts=False)
    a = copy_attrs(op.attrs, ("device", "start_axis", "end_axis", "axis", "axes"))
    a.set("shape", cv.shape(op))
    cv.emit(op.name, "reshape-fix", {"input": x}, a, cv.out_tensor(op, chain, x[0]))
    cv.finish(op, chain, op.name)


def k_act(cv: _FromVaiQ, op: Op) -> None:
    """An activation no conv / eltwise took: a single-input eltwise-fix (quant/xir_out.py k_act)."""
    x = cv.fixed_in(op)
    chain = cv.fix_chain(op, acts=False)
    if x is None:
        return cv.float_op(op)
    if op.type == "leaky-relu":
        alpha = _as_float(op.attrs.get("alpha", 0.01))
        if alpha is None:
            raise cv.err(op, f"attribute alpha = {_short(op.attrs.get('alpha'))} is not a number")
        if Fraction(alpha) == LEAKY_ALPHA:
            m, s = 26, 8                        # the quantizer's encoding of 26/256
        else:
            try:
                m, s = slope_encoding(alpha)
            except FixPointError:
                return cv.float_op(op)
            if not slope_fits_alu(m, s):
                return cv.float_op(op)
        if chain is None:                       # a leaky slope changes the value: needs an output fix point
            return cv.float_op(op)
        a = Attrs([("type", "LEAKY-RELU"), ("prelu_in", m), ("prelu_shift", s)])
    else:
        a = Attrs([("type", "ADD"), ("nonlinear", "RELU" if op.type == "relu" else "RELU6")])
    cv.emit(op.name, "eltwise-fix", {"input": x}, a, cv.out_tensor(op, chain, x[0]))
    cv.finish(op, chain, op.name)


HANDLERS: dict[str, Handler] = {
    "data": k_data, "const": k_const, "fix": k_fix, "matmul": k_matmul, "add": k_eltwise, "mul": k_eltwise,
    "concat": k_concat, "upsample": k_upsample, "resize": k_upsample, "reorg": k_reorg, "hard-sigmoid": k_hsigmoid,
    "hard-swish": k_hswish,
    **{t: k_conv for t in VAI_Q_CONV}, **{t: k_pool for t in VAI_Q_POOL}, **{t: k_act for t in VAI_Q_ACTS},
    **{t: k_reshape for t in VAI_Q_RESHAPES},
}
