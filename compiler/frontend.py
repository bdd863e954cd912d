"""Front ends: every quantized input the compiler accepts becomes one canonical graph, the `*-fix` form.

The canonical form is what our quantizer writes (`opendpu quantize` -> `<net>_int.xmodel`, quant/xir_out.py):
`data-fix`, `const-fix` (int8 `data` bytes, tensor `fix_point`), `conv2d-fix`, `depthwise-conv2d-fix`,
`transposed-conv2d-fix`, `pool-fix`, `eltwise-fix`, `concat-fix`, `upsample-fix`, `tile-fix`,
`hard-sigmoid-fix`, `reshape-fix`, `strided_slice-fix`, and float CPU ops fed through `fix2float` / `float2fix`;
NHWC tensors, root subgraph only.

Three forms are read (`detect_form`):

``fix``       the canonical form itself; `canonicalize` only validates it.
``vai_q``     the form AMD's quantizers write (vai_q_pytorch / vai_q_tensorflow2) and `vai_c_xir -x` reads: float XIR
              ops with each quantization point a separate `fix` op (attrs `fix_point`, `bit_width`, `if_signed`,
              `round_mode`) after the input, after every weight/bias `const` and after each activation.
              `from_vai_q` fuses every `fix` into the op before it (the op's output tensor takes the fix point and
              the fix op's tensor name; the op keeps its own name), folds relu / relu6 / leaky-relu (slope 26/256)
              into the conv / eltwise / dense op they follow (`nonlinear`, as the quantizer writes it), quantizes
              each `const` with its fix op's fix point and round mode into an int8 `const-fix`, lowers a dense
              `matmul` into the conv our quantizer uses for dense layers (TransferMatMulToConv2d: a flattened 4-D
              input becomes an HxW conv whose OHWI weights absorb the flatten order, NCHW after a `transpose`
              [0,3,1,2], NHWC without one; a 2-D input goes through a `<name>_to4d` reshape into a 1x1 conv; the
              result is reshaped back by `<name>_reshape`), and folds a zero `pad` into the conv it feeds. Every other
              op stays a float CPU op, fed by `fix2float` (named `<producer>_fix2float`) and read back through
              `float2fix` (the fix op that follows it). An op with attribute ``device: "CPU"`` is never fused: it is
              the placement mark quant/vai_q_out.py writes for ops our quantizer placed on the CPU; the front end
              consumes the mark (a float op is a CPU op in the canonical form).
``compiled``  an xmodel with DPU subgraphs (AMD's or ours). `from_compiled` recovers the quantized graph: the ops of
              every subgraph with `upload` / `download` removed, the subgraph tree dropped, each `const-fix` given its
              int8 `data` from the DPU subgraph's `reg_id_to_parameter_value` at the const tensor's `reg_id` /
              `ddr_addr` (AMD strips the data attributes: all 312 const-fix ops of the five shared models have empty
              `data`), and the compiler's placement attributes (`reg_id`, `ddr_addr`, `location`, `stride`,
              `workload`, `device` of DPU ops, ...) removed.

`canonicalize(graph)` dispatches on the form and validates the result (every op type known, static shapes, batch 1,
the attributes each `*-fix` op needs); every problem is a `FrontendError` that names the graph and the op.

The modules: `frontend_common` (FrontendError, tensor / attribute copies, names), `frontend_vaiq` (the vai_q
converter) with its per-op handlers `frontend_vaiq_ops.HANDLERS`, `frontend_compiled` (`from_compiled`),
`frontend_check` (`validate`). This module dispatches on the form; every name above is importable from it.
"""
from __future__ import annotations

from opendpu.compiler.frontend_check import FIX_OPS, validate
from opendpu.compiler.frontend_common import FrontendError, _where
from opendpu.compiler.frontend_compiled import from_compiled
from opendpu.compiler.frontend_vaiq import _FromVaiQ
from opendpu.compiler.frontend_vaiq_ops import HANDLERS
from opendpu.compiler.xir.graph import Graph, XModelError
# names other modules import from here (quant/vai_q_out.py, quant/prepare.py, the code generator, the tests)
from opendpu.compiler.frontend_check import tile_shape as tile_shape
from opendpu.compiler.frontend_common import (_Names as _Names, copy_attrs as copy_attrs, copy_tensor as copy_tensor,
                                              fix_tensor as fix_tensor, float_tensor as float_tensor)
from opendpu.compiler.frontend_vaiq import FUSABLE_TYPES as FUSABLE_TYPES

__all__ = ["FrontendError", "FORMS", "FIX_OPS", "detect_form", "from_vai_q", "from_compiled", "canonicalize",
           "validate", "load"]

FORMS = ("fix", "vai_q", "compiled")


def detect_form(graph: Graph, source: str | None = None) -> str:
    """"fix" (the canonical `*-fix` form), "vai_q" (float ops + `fix` ops, AMD's quantizers), "compiled" (has DPU
    subgraphs), or FrontendError for a float graph without any quantization."""
    types = {op.type for op in graph.ops.values()}
    if any(s.device == "DPU" for s in graph.root.walk()) or types & {"upload", "download"}:
        return "compiled"
    if any(t.endswith("-fix") for t in types) or types & {"fix2float", "float2fix"}:
        return "fix"
    if "fix" in types:
        return "vai_q"
    first = ", ".join(f"{op.type} {op.name!r}" for op in list(graph.ops.values())[:3]) or "no ops"
    raise FrontendError(f"{_where(graph, source)}: not quantized: no fix ops / fix points ({len(graph.ops)} float "
                        f"ops: {first}{', ...' if len(graph.ops) > 3 else ''}); run `opendpu quantize` first")


def from_vai_q(graph: Graph, source: str | None = None) -> Graph:
    """The canonical `*-fix` graph of a graph in AMD's quantizer form (float XIR ops + `fix` ops); see the module
    docstring for what is fused. `source` (a file name) prefixes error messages."""
    return _FromVaiQ(graph, source, HANDLERS).run()


def canonicalize(graph: Graph, source: str | None = None) -> Graph:
    """The canonical `*-fix` graph of any accepted input (a canonical graph is validated and returned as is)."""
    form = detect_form(graph, source)
    if form == "vai_q":
        graph = from_vai_q(graph, source)
    elif form == "compiled":
        graph = from_compiled(graph, source)
    validate(graph, source)
    return graph


def load(path: str) -> Graph:
    """Read an xmodel of any accepted form and return its canonical graph (errors name the file)."""
    try:
        g = Graph.load(path)
    except XModelError as e:
        raise FrontendError(str(e)) from None
    return canonicalize(g, path)
