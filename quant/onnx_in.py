"""Float model input: load and check an ONNX file (or export a PyTorch module), fix its shapes to batch 1,
fold constants and drop inference no-ops, giving a flat `FGraph` that the preparation pass rewrites."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from opendpu.isa.errors import OpenDpuError

MIN_OPSET = 13
MAX_DIM = (1 << 31) - 1


class QuantError(OpenDpuError, ValueError):
    """Bad quantizer input or an unsupported model; the message names the file, op or tensor."""


@dataclass
class Node:
    name: str
    op_type: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)


@dataclass
class FGraph:
    """A float ONNX graph after constant folding: nodes in topological order, constants by tensor name."""
    name: str
    nodes: list[Node]
    consts: dict[str, np.ndarray]
    inputs: list[tuple[str, list[int]]]
    outputs: list[str]
    shapes: dict[str, list[int]]
    source: str = "<model>"

    def consumers(self, tensor: str) -> list[Node]:
        return [n for n in self.nodes if tensor in n.inputs]


def load_onnx(model, source: str | None = None):
    """An `onnx.ModelProto` from a path or a proto, checked (opset ≥ 13 after conversion, checker)."""
    import onnx
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        source = source or path
        if os.path.isdir(path):
            raise QuantError(f"model {path} is a directory, not an ONNX file")
        if not os.path.isfile(path):
            raise QuantError(f"model {path}: no such file")
        if not os.access(path, os.R_OK):
            raise QuantError(f"model {path} is not readable")
        if os.path.getsize(path) == 0:
            raise QuantError(f"model {path}: not an ONNX model (empty file)")
        try:
            m = onnx.load(path)
        except Exception as e:  # protobuf decode errors come in several types
            why = " ".join(str(e).split())[:200]
            raise QuantError(f"model {path}: not an ONNX model ({type(e).__name__}: {why})") from None
        if not m.graph.node:
            raise QuantError(f"model {path}: not an ONNX model (no graph nodes)")
    elif isinstance(model, onnx.ModelProto):
        m = model
        source = source or (m.graph.name or "<model>")
    else:
        raise QuantError(f"expected an ONNX file path or onnx.ModelProto, got {type(model).__name__}")
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise QuantError(f"{source}: no default-domain opset import")
    if opset < MIN_OPSET:
        try:
            from onnx import version_converter
            m = version_converter.convert_version(m, MIN_OPSET)
        except Exception as e:
            raise QuantError(f"{source}: opset {opset} < {MIN_OPSET} and conversion failed "
                             f"({' '.join(str(e).split())[:200]}); re-export with opset {MIN_OPSET} or newer") from None
    try:
        onnx.checker.check_model(m)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise QuantError(f"{source}: invalid ONNX model: {first}") from None
    return m


def torch_to_onnx(module, example_input, opset: int = 17):
    """Export a PyTorch `nn.Module` (eval mode, batch 1) to ONNX with the TorchScript exporter
    (extra: torch==2.13.0)."""
    try:
        import torch
    except ImportError:
        raise QuantError("a PyTorch module needs the optional extra: pip install torch==2.13.0 "
                         "(or `pip install opendpu[torch]`)") from None
    import io
    import warnings
    import onnx
    if not isinstance(module, torch.nn.Module):
        raise QuantError(f"expected a torch.nn.Module, got {type(module).__name__}")
    x = example_input if isinstance(example_input, torch.Tensor) else torch.as_tensor(np.asarray(example_input))
    if x.shape[0] != 1:
        raise QuantError(f"XMODEL_BATCHSIZE: the example input must have batch 1, got shape {list(x.shape)}")
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(module.eval(), (x.float(),), buf, dynamo=False, opset_version=opset,
                              do_constant_folding=True, input_names=["input"], output_names=["output"])
        except Exception as e:
            raise QuantError(f"PYTORCH_TRACE: export of {type(module).__name__} failed: {e}") from None
    m = onnx.load_from_string(buf.getvalue())
    m.graph.name = m.graph.name or type(module).__name__
    return m


def _attrs(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _static_input_shapes(m, source: str, input_shape=None) -> list[tuple[str, list[int]]]:
    inits = {i.name for i in m.graph.initializer}
    out = []
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        if tt.elem_type not in (1, 10, 11):
            raise QuantError(f"{source}: input {vi.name!r} has element type {tt.elem_type}; only float inputs "
                             f"are quantizable (TENSOR_TYPE_NOT_QUANTIZABLE)")
        dims = []
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > MAX_DIM:
                raise QuantError(f"{source}: input {vi.name!r} dimension {i} is {d.dim_value}, beyond {MAX_DIM}")
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_value") and i > 0:
                raise QuantError(f"{source}: input {vi.name!r} dimension {i} is {d.dim_value}; every dimension "
                                 f"but the batch must be > 0")
            elif i == 0:
                dims.append(1)          # batch: the DPU runs batch 1 (XMODEL_BATCHSIZE)
            elif input_shape is not None:
                if i >= len(input_shape) or not int(input_shape[i]) > 0:
                    raise QuantError(f"{source}: input {vi.name!r} dimension {i} is dynamic and input_shape "
                                     f"{list(input_shape)} gives no positive size for it")
                dims.append(int(input_shape[i]))
            else:
                raise QuantError(f"{source}: input {vi.name!r} dimension {i} is dynamic ({d.dim_param!r}); "
                                 f"give input_shape (opendpu quantize / inspect / build: --input-shape N,C,H,W)")
        if dims and dims[0] != 1:
            dims[0] = 1
        out.append((vi.name, dims))
    if not out:
        raise QuantError(f"{source}: the model has no non-constant input")
    return out


def _fold(node: Node, vals: list[np.ndarray], opset: int) -> list[np.ndarray]:
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    ins, feeds = [], {}
    for i, (n, v) in enumerate(zip(node.inputs, vals)):
        if not n:
            ins.append("")
            continue
        nm = f"i{i}"
        ins.append(nm)
        feeds[nm] = v
    outs = [f"o{i}" for i in range(len(node.outputs))]
    nd = helper.make_node(node.op_type, ins, outs, **node.attrs)
    g = helper.make_graph([nd], "fold",
                          [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                           for k, v in feeds.items()],
                          [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    res = ReferenceEvaluator(model).run(None, feeds)
    return [np.asarray(r) for r in res]


def to_fgraph(m, source: str = "<model>", input_shape=None) -> FGraph:
    """Static shapes, constants folded (Constant nodes, Shape of static tensors, const subgraphs),
    Identity and Dropout removed."""
    import onnx
    from onnx import numpy_helper, shape_inference
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    ins = _static_input_shapes(m2, source, input_shape)
    shape_of = dict(ins)
    for vi in m2.graph.input:
        if vi.name in shape_of:
            tt = vi.type.tensor_type
            del tt.shape.dim[:]
            for d in shape_of[vi.name]:
                tt.shape.dim.add().dim_value = d
    try:
        m2 = shape_inference.infer_shapes(m2, strict_mode=False)
    except Exception as e:
        raise QuantError(f"{source}: shape inference failed: {' '.join(str(e).split())[:300]}") from None
    opset = next((o.version for o in m2.opset_import if o.domain in ("", "ai.onnx")), MIN_OPSET)
    shapes: dict[str, list[int]] = dict(shape_of)
    for vi in list(m2.graph.value_info) + list(m2.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = [int(d.dim_value) for d in tt.shape.dim]
    consts: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in m2.graph.initializer}
    alias: dict[str, str] = {}
    nodes: list[Node] = []
    for k, nd in enumerate(m2.graph.node):
        if nd.domain not in ("", "ai.onnx"):
            raise QuantError(f"{source}: op {nd.name or nd.op_type!r} has custom domain {nd.domain!r}: "
                             f"unsupported op {nd.op_type}")
        name = nd.name or f"{nd.op_type}_{k}"
        inputs = [alias.get(i, i) for i in nd.input]
        node = Node(name, nd.op_type, inputs, list(nd.output), _attrs(nd))
        if nd.op_type == "Constant":
            consts[nd.output[0]] = _fold(node, [], opset)[0]
            continue
        if nd.op_type in ("Identity", "Dropout"):
            alias[nd.output[0]] = inputs[0]
            if inputs[0] in consts:
                consts[nd.output[0]] = consts[inputs[0]]
            continue
        if nd.op_type == "Shape" and inputs[0] in shapes:
            sh = np.array(shapes[inputs[0]], dtype=np.int64)
            a = node.attrs
            consts[nd.output[0]] = sh[a.get("start", 0):a.get("end", len(sh))]
            continue
        if nd.op_type == "Size" and inputs[0] in shapes:
            consts[nd.output[0]] = np.array(int(np.prod(shapes[inputs[0]])), dtype=np.int64)
            continue
        if all((i == "" or i in consts) for i in inputs) and nd.op_type not in ("RandomNormal", "RandomUniform"):
            try:
                outs = _fold(node, [consts[i] if i else None for i in inputs], opset)
            except Exception as e:
                raise QuantError(f"{source}: constant folding of op {name!r} ({nd.op_type}) failed: "
                                 f"{' '.join(str(e).split())[:200]}") from None
            for o, v in zip(nd.output, outs):
                consts[o] = v
            continue
        nodes.append(node)
    outputs = [alias.get(o.name, o.name) for o in m2.graph.output]
    if not outputs:
        raise QuantError(f"{source}: the graph has no output")
    for o in outputs:
        if o in consts:
            raise QuantError(f"{source}: graph output {o!r} is a constant")
    # float tensors with NaN/Inf weights cannot be quantized
    for n in nodes:
        for i in n.inputs:
            v = consts.get(i)
            if v is not None and v.dtype.kind == "f" and not np.all(np.isfinite(v)):
                raise QuantError(f"{source}: TENSOR_VALUE_INVALID: constant {i!r} of op {n.name!r} ({n.op_type}) "
                                 f"contains NaN or Inf")
    return FGraph(m2.graph.name or "model", nodes, consts, ins, outputs, shapes, source)
