"""Inspector (vai_q Inspector): every op of a float model placed on the DPU or the CPU with the exact reason,
using the compiler's shared rule set (`compiler.rules`) on the prepared graph."""
from __future__ import annotations

import os

from opendpu.compiler.fixpoint import LEAKY_ALPHA
from opendpu.quant.onnx_in import QuantError, load_onnx, to_fgraph
from opendpu.quant.prepare import Prepared, prepare
from opendpu.quant.xir_out import NHWC_AXIS, act_attrs, geom_attrs, nhwc, onnx_macs, xir_weights

_XIR_TYPE = {"input": "data", "conv": "conv2d", "dwconv": "depthwise-conv2d", "tconv": "transposed-conv2d",
             "pool": "pool", "eltwise": "eltwise", "concat": "concat", "upsample": "upsample", "tile": "tile",
             "hsigmoid": "hard-sigmoid", "reshape": "reshape", "slice": "strided_slice",
             "prelu": "prelu"}
_ACT_TYPE = {"RELU": "relu", "RELU6": "relu6", "LEAKYRELU": "leaky-relu", "NONE": "identity"}


def _float_type(n) -> str:
    """The XIR type of a float (CPU) op: its own, or `onnx-op` for an ONNX node kept as it is."""
    return n.attrs.get("xir_type") or "onnx-op"


def op_descs(prep: Prepared) -> list:
    """The prepared ops as `compiler.rules.OpDesc` (XIR types and attribute names, NHWC shapes)."""
    from opendpu.compiler.rules import OpDesc
    shapes = {n.name: n.shape for n in prep.nodes}
    out = []
    for n in prep.nodes:
        a = n.attrs
        attrs = geom_attrs(n) if "kernel" in a else {}
        attrs.pop("pad_mode", None)
        if n.kind in ("conv", "dwconv", "tconv"):
            attrs["group"] = 1
            attrs.update(act_attrs(n))
            if n.kind == "tconv":
                attrs["output_padding"] = list(a.get("output_padding", [0, 0]))
        if n.kind == "pool":
            attrs["type"] = a["type"]
            attrs["global"] = bool(a.get("global", False))
            attrs["ceil_mode"] = bool(a.get("ceil_mode", 0))
            if a["type"] == "AVG":
                attrs["count_include_pad"] = bool(a.get("count_include_pad", 1))
        if n.kind == "eltwise":
            attrs["type"] = a["type"]
            attrs["nonlinear"] = n.act
        if n.kind == "concat":
            attrs["axis"] = NHWC_AXIS[a["axis"]] if len(n.shape) == 4 else a["axis"]
        if n.kind == "slice":
            for k in ("begin", "end", "strides"):
                attrs[k] = nhwc(a[k])
        if n.kind == "tile":
            attrs["stride"], attrs["reverse"] = int(a["stride"]), bool(a["reverse"])
        if n.kind == "upsample":
            attrs["mode"] = "NEAREST"
            sh, sw = a["scales"]
            attrs["scale"] = [sw, sh]
        if n.kind == "float" and a.get("generic"):     # an ONNX node kept on the CPU: its type, reason and MACs
            attrs.update(onnx_op_type=a["op_type"], cpu_reason=n.reason, macs=onnx_macs(n, prep))
        if n.kind == "act" and n.act == "LEAKYRELU":
            attrs["alpha"] = float(a.get("alpha") or LEAKY_ALPHA)
        typ = _ACT_TYPE[n.act] if n.kind == "act" else (_float_type(n) if n.kind == "float" else _XIR_TYPE[n.kind])
        w = list(xir_weights(n, n.weight).shape) if n.weight is not None else None
        out.append(OpDesc(n.name, typ, attrs, [nhwc(shapes[i]) for i in n.inputs], nhwc(n.shape), w))
    return out


def inspect_model(model, target, input_shape=None):
    """(prepared graph, [(QNode, Placement)]) for an ONNX model on a target."""
    from opendpu.isa.target import TargetError, get_target
    try:
        t = get_target(target) if not hasattr(target, "cp") else target
    except TargetError as e:
        raise QuantError(f"INSPECTOR_INPUT_FORMAT: {e}") from None
    m = load_onnx(model)
    src = os.fspath(model) if isinstance(model, (str, os.PathLike)) else m.graph.name

    class _Cfg:
        replace_sigmoid = False
        replace_silu = None
    prep = prepare(to_fgraph(m, src, input_shape), _Cfg())
    return t, prep, place_prepared(prep, t)


def place_prepared(prep: Prepared, target) -> list:
    """[(QNode, Placement)] of every prepared op on one target (the compiler's rules); prepare once, place per
    target."""
    from opendpu.compiler.rules import place
    return [(n, place(d, target)) for n, d in zip(prep.nodes, op_descs(prep))]


def inspect_coverage(prep: Prepared, rows) -> dict:
    """The DPU coverage (`compiler.partition.coverage_of`: MACs and ops on the DPU, CPU ops and why) of placed
    prepared ops; the rules' estimate of what the compiler will place."""
    from opendpu.compiler.partition import coverage_of
    return coverage_of((d, p.device, p.reason) for d, (_, p) in zip(op_descs(prep), rows))


def format_inspect(t, prep: Prepared, rows, verbose: int = 1) -> str:
    """The inspect_<target>.txt text: DPU coverage, target, limits, then the ops (verbose 1: CPU ops; 2: every op)."""
    from opendpu.compiler.partition import format_coverage, target_label
    from opendpu.compiler.rules import limits
    fp = "none" if t.fingerprint is None else f"0x{t.fingerprint:016X}"
    lines = ["[VAIQ_NOTE]: =>Start to inspect model...",
             format_coverage(inspect_coverage(prep, rows), target_label(t)),
             f"Target: {t.name}  fingerprint: {fp}  PP {t.pp} CP {t.cp} ALU_PP {t.alu_pp} bank_depth {t.bank_depth}",
             "Limits: " + ", ".join(f"{k}={v}" for k, v in limits(t).items()), ""]
    cpu = [(n, p) for n, p in rows if p.device == "CPU"]
    lines.append(f"ops: {len(rows)}  DPU: {sum(p.device == 'DPU' for _, p in rows)}  CPU: {len(cpu)}"
                 f"  other: {sum(p.device not in ('DPU', 'CPU') for _, p in rows)}")
    show = rows if verbose >= 2 else cpu
    if show:
        lines.append("")
        lines.append(f"{'op':44s} {'source':28s} {'type':18s} {'device':6s} reason")
        for n, p in show:
            src = ",".join(n.sources)[:28]
            hint = f"  [hint: {p.hint}]" if p.hint else ""
            typ = n.kind if n.kind != "float" else _float_type(n)
            lines.append(f"{n.name[:44]:44s} {src:28s} {typ:18s} {p.device:6s} {p.reason}{hint}")
    lines.append("[VAIQ_NOTE]: =>Finish inspecting.")
    return "\n".join(lines) + "\n"


def format_partition(t, part, verbose: int = 1) -> str:
    """The inspect_<target>.txt text of a quantized xmodel: DPU coverage and the compiler's own partition (rules and
    code generator) on `t`: subgraphs, CPU ops and why (verbose 2: every op)."""
    from opendpu.compiler.partition import PSEUDO_TYPES, coverage, format_coverage, target_label
    fp = "none" if t.fingerprint is None else f"0x{t.fingerprint:016X}"
    lines = ["[VAIQ_NOTE]: =>Start to inspect model...", format_coverage(coverage(part), target_label(t)),
             f"Target: {t.name}  fingerprint: {fp}  PP {t.pp} CP {t.cp} ALU_PP {t.alu_pp} bank_depth {t.bank_depth}",
             ""] + part.report()
    if verbose >= 2:
        g = part.graph
        lines += ["", f"{'op':44s} {'type':24s} {'device':6s} reason"]
        for n in g.toposort():
            p = part.placement[n]
            if g.ops[n].type.removesuffix("-fix") not in PSEUDO_TYPES:
                lines.append(f"{n[:44]:44s} {g.ops[n].type:24s} {p.device:6s} {p.reason}")
    lines.append("[VAIQ_NOTE]: =>Finish inspecting.")
    return "\n".join(lines) + "\n"
