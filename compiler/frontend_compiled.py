"""compiled -> canonical: the quantized graph inside a compiled xmodel (AMD's or ours), recovered from its DPU
subgraphs (compiler/frontend.py's docstring says what is removed and where const data comes from)."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from opendpu.compiler.frontend_common import FLOAT, FrontendError, _int_or_none, _t, _where, copy_attrs, copy_tensor
from opendpu.compiler.xir import dpu_abi as abi
from opendpu.compiler.xir.graph import Graph, Op, XModelError

# attributes a compiled xmodel adds that the canonical graph must not carry (the compiler decides them again)
COMPILED_OP_ATTRS = ("workload", "workload_on_arch", "channel_augmentation")
COMPILED_TENSOR_ATTRS = ("reg_id", "ddr_addr", "location", "stride", "strides", abi.DDR_RUNS)
COMPILED_GRAPH_ATTRS = ("files_md5sum", "libs_info")


def from_compiled(graph: Graph, source: str | None = None) -> Graph:
    """The quantized graph inside a compiled xmodel: every op of its subgraphs without `upload` / `download`,
    const-fix data recovered from the DPU subgraphs' parameter blobs, the compiler's placement attributes
    removed and the subgraph tree dropped (root only)."""
    where = _where(graph, source)
    try:
        order = graph.toposort()
    except XModelError as e:
        raise FrontendError(f"{where}: {e}") from None
    out = Graph(graph.name)
    out.attrs = copy_attrs(graph.attrs, COMPILED_GRAPH_ATTRS)
    out.op_defs = list(graph.op_defs)
    alias: dict[str, str] = {}
    params: dict[str, abi.RegisterMap] = {}

    def blob_data(op: Op) -> bytes:
        t = _t(op)
        try:
            sg = graph.subgraph_of(op.name)
        except XModelError:
            raise FrontendError(f"{where}: const op {op.name!r} has no data and is in no subgraph") from None
        if sg.name not in params:
            if sg.device != "DPU":
                raise FrontendError(f"{where}: const op {op.name!r} has no data and its subgraph {sg.name!r} is "
                                    f"not a DPU subgraph (no parameter blob)")
            try:
                params[sg.name] = abi.read_registers(sg)
            except XModelError as e:
                raise FrontendError(f"{where}: {e}") from None
        regs = params[sg.name]
        reg, addr = _int_or_none(t.attrs.get("reg_id")), _int_or_none(t.attrs.get("ddr_addr"))
        if reg is None or addr is None:
            raise FrontendError(f"{where}: const op {op.name!r} has no data and no reg_id / ddr_addr to find it in "
                                f"the parameter blob")
        blob = regs.params.get(reg)
        if blob is None:
            raise FrontendError(f"{where}: const op {op.name!r}: REG_{reg} of subgraph {sg.name!r} has no "
                                f"parameter blob (context {regs.context.get(reg, 'unknown')})")
        try:
            n = int(np.prod(t.shape, dtype=np.int64)) * t.numpy_dtype.itemsize
        except XModelError as e:
            raise FrontendError(f"{where}: const op {op.name!r}: {e}") from None
        try:                                        # one run at ddr_addr (AMD's form), or opendpu's DDR_RUNS
            return abi.read_const_bytes(t, blob, n)
        except abi.DpuAbiError as e:
            raise FrontendError(f"{where}: const op {op.name!r}: REG_{reg} of subgraph {sg.name!r}: {e}") from None

    for n in order:
        op = graph.ops[n]
        if op.output is None:
            raise FrontendError(f"{where}: op {n!r} ({op.type}) has no output tensor")
        if op.type in ("upload", "download"):
            ins = op.input_ops()
            if len(ins) != 1:
                raise FrontendError(f"{where}: op {n!r} ({op.type}) takes one input, has {len(ins)}")
            src = alias.get(ins[0], ins[0])
            alias[n] = src
            if op.type == "download" and graph.consumers(ins[0]) == [n]:
                _t(out.ops[src]).name = _t(op).name      # the producer's tensor takes the user-facing name
            continue
        is_float = _t(op).data_type == FLOAT
        drop = COMPILED_OP_ATTRS + (() if is_float and op.attrs.get("device") == "CPU" else ("device",))
        a = copy_attrs(op.attrs, drop)
        if op.type in ("const-fix", "const") and not op.attrs.get("data"):
            a.set("data", blob_data(op), "bytes_value")
        args = OrderedDict((arg, [alias.get(p, p) for p in ps]) for arg, ps in op.inputs.items())
        try:
            out.add_op(n, op.type, args, a, copy_tensor(_t(op), drop=COMPILED_TENSOR_ATTRS))
        except XModelError as e:
            raise FrontendError(f"{where}: {e}") from None
    out._link_subgraphs()
    try:
        out.validate()
    except XModelError as e:
        raise FrontendError(f"{where}: the recovered graph is not valid: {e}") from None
    return out
