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


class ModelError(QuantError):
    """A model that is wrong or ambiguous as ONNX itself: an error even where an unsupported form would go to the
    CPU (running it there would not help)."""


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
    opset: int = MIN_OPSET              # the model's default-domain opset (generic CPU ops keep its semantics)
    onnx_outputs: list[str] = field(default_factory=list)   # the graph outputs' own names (`outputs` after Identity)

    def consumers(self, tensor: str) -> list[Node]:
        return [n for n in self.nodes if tensor in n.inputs]


_ITEMSIZE = {"FLOAT": 4, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "INT32": 4, "INT64": 8, "BOOL": 1,
             "FLOAT16": 2, "DOUBLE": 8, "UINT32": 4, "UINT64": 8, "BFLOAT16": 2}   # bytes per element


def _all_tensors(graph):
    """Every TensorProto of a graph: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for nd in graph.node:
        for a in nd.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _all_tensors(a.g)
            for g in a.graphs:
                yield from _all_tensors(g)


def _load_external_data(m, path: str) -> None:
    """Read the external data files of an ONNX model saved with external data (beside the model), checking that
    each file exists inside the model's directory and holds every tensor's bytes; QuantError naming them if not."""
    from onnx import TensorProto, external_data_helper
    base = os.path.dirname(os.path.abspath(path))
    ext = [t for t in _all_tensors(m.graph) if t.data_location == TensorProto.EXTERNAL]
    if not ext:
        return
    sizes: dict[str, int] = {}
    for t in ext:
        try:
            info = external_data_helper.ExternalDataInfo(t)
        except ValueError as e:
            raise QuantError(f"{path}: tensor {t.name}: bad external data entry ({e})") from None
        loc = info.location
        if not loc:
            raise QuantError(f"{path}: tensor {t.name} is stored as external data without a file location")
        if os.path.isabs(loc) or os.path.normpath(loc).split(os.sep)[0] == "..":
            raise QuantError(f"{path}: external data file {loc} (tensor {t.name}) lies outside the model's "
                             f"directory; keep the data file next to the model")
        f = os.path.join(base, loc)
        if loc not in sizes:
            if not os.path.isfile(f):
                raise QuantError(f"{path}: external data file {loc} (tensor {t.name}) is missing next to the model "
                                 f"(expected {f})")
            sizes[loc] = os.path.getsize(f)
        itemsize = _ITEMSIZE.get(TensorProto.DataType.Name(t.data_type) if t.data_type in
                                 TensorProto.DataType.values() else "", 0)   # 0: strings, sub-byte types
        need = int(np.prod(t.dims, dtype=np.int64)) * itemsize
        if info.length is not None and itemsize and info.length != need:
            raise QuantError(f"{path}: tensor {t.name} {list(t.dims)} needs {need} bytes but its external data "
                             f"entry in {loc} has length {info.length}")
        start = info.offset or 0
        end = start + (info.length if info.length is not None else need)
        if end > sizes[loc]:
            raise QuantError(f"{path}: external data file {loc} is truncated: tensor {t.name} needs bytes "
                             f"{start}..{end} but the file has {sizes[loc]} bytes")
    try:
        external_data_helper.load_external_data_for_model(m, base)
    except Exception as e:  # noqa: BLE001 - onnx reports unreadable data files in several exception types
        why = " ".join(str(e).split())[:200]
        raise QuantError(f"{path}: cannot read the external data of the model ({type(e).__name__}: {why})") from None


_FLOAT_TYPES = (1, 10, 11)            # FLOAT, FLOAT16, DOUBLE
_INPUT_RANKS = (2, 4)                 # [N, K] and NCHW: what the quantizer's input node and calibration handle


def _declared_dims(tt, input_shape) -> list[tuple[int | None, str]]:
    """An ONNX input's declared dims as (value or None when dynamic, name); a tensor without any shape has
    len(input_shape) dynamic dims, or none when input_shape is not given. A `dim_value` of -1 is dynamic too:
    Paddle2ONNX and older exporters write it for an unknown size (onnxruntime takes it so); other negative values
    stay errors."""
    if not tt.HasField("shape"):
        return [(None, "?")] * (len(input_shape) if input_shape is not None else 0)
    return [(int(d.dim_value) if d.HasField("dim_value") and d.dim_value != -1 else None, d.dim_param)
            for d in tt.shape.dim]


def load_onnx(model, source: str | None = None):
    """An `onnx.ModelProto` from a path or a proto, checked (opset ≥ 13 after conversion, checker); the external
    data files of a model saved with external data are read from beside it."""
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
            m = onnx.load(path, load_external_data=False)
        except Exception as e:  # protobuf decode errors come in several types
            why = " ".join(str(e).split())[:200]
            raise QuantError(f"model {path}: not an ONNX model, or a truncated or corrupt one "
                             f"({type(e).__name__}: {why})") from None
        if not m.graph.node:
            raise QuantError(f"model {path}: not an ONNX model (no graph nodes)")
        _load_external_data(m, path)
    elif isinstance(model, onnx.ModelProto):
        m = model
        source = source or (m.graph.name or "<model>")
    else:
        raise QuantError(f"expected an ONNX file path or onnx.ModelProto, got {type(model).__name__}")
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise QuantError(f"{source}: no default-domain opset import (the model declares no ONNX opset: "
                         f"re-export it, or check that the file is complete)")
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
            # torch annotates f as a path, but the TorchScript exporter (dynamo=False) writes to a file object too
            torch.onnx.export(module.eval(), (x.float(),), buf, dynamo=False,  # type: ignore[arg-type]
                              opset_version=opset, do_constant_folding=True, input_names=["input"],
                              output_names=["output"])
        except Exception as e:
            raise QuantError(f"PYTORCH_TRACE: export of {type(module).__name__} failed: {e}") from None
    m = onnx.load_from_string(buf.getvalue())
    m.graph.name = m.graph.name or type(module).__name__
    return m


def _attrs(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _static_input_shapes(m, source: str, input_shape=None) -> list[tuple[str, list[int]]]:
    """[(name, shape)] of the model's one graph input, batch fixed to 1 and dynamic dimensions from `input_shape`;
    QuantError naming the input for what the quantizer cannot take (several inputs, not float, rank not 2 or 4)."""
    from onnx import TensorProto
    inits = {i.name for i in m.graph.initializer}
    vis = [vi for vi in m.graph.input if vi.name not in inits]
    if not vis:
        raise QuantError(f"{source}: the model has no non-constant input")
    if len(vis) > 1:
        names = ", ".join(vi.name for vi in vis[:6]) + (", ..." if len(vis) > 6 else "")
        raise QuantError(f"{source}: {len(vis)} inputs ({names}); the DPU runs single-input models (export the "
                         f"model with one image input)")
    out = []
    for vi in vis:
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            raise QuantError(f"{source}: input {vi.name!r} is a {kind or 'untyped value'}, not a tensor; only float "
                             f"tensor inputs are quantizable")
        tt = vi.type.tensor_type
        if tt.elem_type not in _FLOAT_TYPES:
            et = (TensorProto.DataType.Name(tt.elem_type).lower() if tt.elem_type in TensorProto.DataType.values()
                  else f"of element type {tt.elem_type}")
            raise QuantError(f"{source}: input {vi.name!r} is {et}; only float inputs are quantizable "
                             f"(TENSOR_TYPE_NOT_QUANTIZABLE)")
        decl = _declared_dims(tt, input_shape)
        if not decl:
            raise QuantError(f"{source}: input {vi.name!r} has no shape; give input_shape (opendpu quantize / "
                             f"inspect / build: --input-shape N,C,H,W)")
        if len(decl) not in _INPUT_RANKS:
            text = "[" + ", ".join(str(v) if v is not None else repr(p or "?") for v, p in decl) + "]"
            raise QuantError(f"{source}: input {vi.name!r} has rank {len(decl)} {text}; give an NCHW image input "
                             f"(rank 4) or a rank-2 [1, K] input")
        dims = []
        for i, (v, param) in enumerate(decl):
            if v is not None and v > MAX_DIM:
                raise QuantError(f"{source}: input {vi.name!r} dimension {i} is {v}, beyond {MAX_DIM}")
            if v is not None and v > 0:
                dims.append(v)
            elif v is not None and i > 0:
                raise QuantError(f"{source}: input {vi.name!r} dimension {i} is {v}; every dimension "
                                 f"but the batch must be > 0")
            elif i == 0:
                dims.append(1)          # batch: the DPU runs batch 1 (XMODEL_BATCHSIZE)
            elif input_shape is not None:
                if i >= len(input_shape) or not int(input_shape[i]) > 0:
                    raise QuantError(f"{source}: input {vi.name!r} dimension {i} is dynamic and input_shape "
                                     f"{list(input_shape)} gives no positive size for it")
                dims.append(int(input_shape[i]))
            else:
                raise QuantError(f"{source}: input {vi.name!r} dimension {i} is dynamic ({param!r}); "
                                 f"give input_shape (opendpu quantize / inspect / build: --input-shape N,C,H,W)")
        if dims and dims[0] != 1:
            dims[0] = 1
        out.append((vi.name, dims))
    return out


def _fold(node: Node, vals: list[np.ndarray | None], opset: int) -> list[np.ndarray]:
    """The outputs of `node` evaluated on constant inputs (None: an omitted optional input)."""
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
        assert v is not None                   # only an omitted (unnamed) input has no value
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


_MAX_ROUNDS = 6          # fold / infer rounds; real exports need 2 (Shape chains, then the Reshapes they feed)


def _infer(m, source: str) -> dict[str, list[int]]:
    """Static shapes from onnx's shape inference with data propagation (Shape → Slice → Concat values)."""
    from onnx import shape_inference
    try:
        mi = shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception as e:
        raise QuantError(f"{source}: shape inference failed: {' '.join(str(e).split())[:300]}") from None
    out: dict[str, list[int]] = {}
    for vi in list(mi.graph.value_info) + list(mi.graph.output):
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            out[vi.name] = [int(d.dim_value) for d in tt.shape.dim]
    return out


def _fold_pass(nodes: list[Node], consts: dict, shapes: dict, alias: dict, opset: int, source: str) -> list[Node]:
    """One folding pass: Constant, Identity/Dropout, Shape/Size of static tensors and all-constant nodes."""
    kept: list[Node] = []
    for node in nodes:
        node.inputs = [alias.get(i, i) for i in node.inputs]
        t, name, inputs = node.op_type, node.name, node.inputs
        if t == "Constant":
            consts[node.outputs[0]] = _fold(node, [], opset)[0]
            continue
        if t in ("Identity", "Dropout"):
            alias[node.outputs[0]] = inputs[0]
            if inputs[0] in consts:
                consts[node.outputs[0]] = consts[inputs[0]]
            if inputs[0] in shapes:
                shapes[node.outputs[0]] = shapes[inputs[0]]
            continue
        if t == "Shape" and inputs[0] in shapes:
            sh = np.array(shapes[inputs[0]], dtype=np.int64)
            a = node.attrs
            consts[node.outputs[0]] = sh[a.get("start", 0):a.get("end", len(sh))]
            continue
        if t == "Size" and inputs[0] in shapes:
            consts[node.outputs[0]] = np.array(int(np.prod(shapes[inputs[0]])), dtype=np.int64)
            continue
        if all((i == "" or i in consts) for i in inputs) and t not in ("RandomNormal", "RandomUniform",
                                                                         "RandomNormalLike", "RandomUniformLike"):
            try:
                outs = _fold(node, [consts[i] if i else None for i in inputs], opset)
            except Exception as e:
                raise QuantError(f"{source}: constant folding of op {name!r} ({t}) failed: "
                                 f"{' '.join(str(e).split())[:200]}") from None
            for o, v in zip(node.outputs, outs):
                consts[o] = v
                shapes[o] = list(np.shape(v))
            continue
        kept.append(node)
    return kept


def _rebuild(m, nodes: list[Node], consts: dict, shapes: dict, alias: dict):
    """The model with the folded graph (constants as initializers), for another round of shape inference."""
    import onnx
    from onnx import helper, numpy_helper
    used = {i for n in nodes for i in n.inputs if i}
    g = onnx.GraphProto()
    g.name = m.graph.name
    g.input.extend(vi for vi in m.graph.input if vi.name not in consts)
    outs = []
    for vi in m.graph.output:
        o = onnx.ValueInfoProto()
        o.CopyFrom(vi)
        o.name = alias.get(vi.name, vi.name)
        outs.append(o)
    g.output.extend(outs)
    g.initializer.extend(numpy_helper.from_array(np.asarray(consts[t]), t) for t in sorted(used & consts.keys()))
    g.node.extend(helper.make_node(n.op_type, n.inputs, n.outputs, name=n.name, **n.attrs) for n in nodes)
    m2 = helper.make_model(g, opset_imports=list(m.opset_import), ir_version=m.ir_version)
    return m2


def _forget_dynamic_dims(m) -> None:
    """Declared output / value_info dims that are negative (Paddle2ONNX and older exporters write `dim_value: -1`
    for a dynamic dim instead of a `dim_param`) become unknown, so shape inference computes them from the static
    input shape, as onnxruntime does; kept, they would be taken for static sizes (a reshape to [-1, 2])."""
    for vi in list(m.graph.output) + list(m.graph.value_info):
        if vi.type.WhichOneof("value") != "tensor_type" or not vi.type.tensor_type.HasField("shape"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.Clear()


def to_fgraph(m, source: str = "<model>", input_shape=None) -> FGraph:
    """Static shapes, constants folded (Constant nodes, Shape of static tensors, const subgraphs),
    Identity and Dropout removed.

    onnx's data-propagating shape inference gives the shapes; folding then turns Shape → Gather/Slice → Concat
    chains into constants, and inference runs again on the folded graph (a Reshape whose target was computed
    becomes static), until nothing changes (at most `_MAX_ROUNDS` rounds)."""
    import onnx
    from onnx import numpy_helper
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
    _forget_dynamic_dims(m2)
    opset = next((o.version for o in m2.opset_import if o.domain in ("", "ai.onnx")), MIN_OPSET)
    for nd in m2.graph.node:
        if nd.domain not in ("", "ai.onnx"):
            raise QuantError(f"{source}: op {nd.name or nd.op_type!r} has custom domain {nd.domain!r}: "
                             f"unsupported op {nd.op_type}")
    consts: dict[str, np.ndarray] = {i.name: numpy_helper.to_array(i) for i in m2.graph.initializer}
    alias: dict[str, str] = {}
    shapes: dict[str, list[int]] = dict(shape_of)
    nodes = [Node(nd.name or f"{nd.op_type}_{k}", nd.op_type, list(nd.input), list(nd.output), _attrs(nd))
             for k, nd in enumerate(m2.graph.node)]
    for _ in range(_MAX_ROUNDS):
        shapes.update(_infer(m2, source))
        n_before = len(nodes)
        nodes = _fold_pass(nodes, consts, shapes, alias, opset, source)
        if len(nodes) == n_before:
            break
        m2 = _rebuild(m2, nodes, consts, shapes, alias)
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
    return FGraph(m2.graph.name or "model", nodes, consts, ins, outputs, shapes, source, opset,
                  [o.name for o in m.graph.output])
