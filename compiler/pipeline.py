"""The compiler as one ordered pass list (docs/architecture.md, "The compiler"; TVM VTA's build_config style).

    from opendpu.compiler.pipeline import compile
    res = compile(graph, "DPUCZDX8G_ISA1_B4096", output_ops="fc", prefetch=True)
    res.graph        # the compiled xmodel Graph
    res.write(dir, "net")    # net.xmodel, net_org.xmodel, meta.json

`PASSES` lists the passes in order; each is `Pass(name, fn, doc)` with `fn(ctx) -> ctx` over one
`CompileContext`; a pass leaves a one-line summary of what it did in `ctx.summary` (printed through the `log`
callback, kept in `ctx.summaries`). `compile(..., dump_after=["partition"])` keeps the context after a pass as JSON
(`CompileResult.dumps`, written as `dump_after_<pass>.json`). The code generator runs as three passes, each over
every DPU subgraph (compiler.codegen's driver): `codegen_plan` (op kinds, interface, DDR image plan; dumped as the
plans and the images they fix), `codegen_lower` (jobs, tiles, strips, fusion, each per-layer choice a LayerPlan;
dumped as the layers and LayerPlans) and `codegen_order` (prefetch, tokens, registers; dumped as the programs).

Options are vai_c_xir's `--options` keys (UG1414 Table 31): `input_shape` ("1,224,224,3", inputs separated by
";"; must equal the graph's static input shapes, since opendpu does not re-infer shapes; a 4-D shape in the xmodel's
NHWC or in the NCHW of the ONNX model it was quantized from, and the compile log says which was read),
`output_ops` ("op0,op1": the graph outputs; everything that does not feed them is dropped), `prefetch` and `hd_opt`
(accepted and recorded; they change no instruction), `plugins` (refused: compiler plugins are C++ libraries).
Nine opendpu keys switch optimisations off (all default true; docs/compiler.md): `channel_augmentation` (fold kw into
the LOAD items of convs with few input channels), `fuse` (a producer and its only ALU consumer in one superlayer,
the intermediate kept on chip), `exact_tokens` (a waiter waits on the instruction it conflicts with, not on the
producer engine's latest one), `pipeline` (software-pipelined strip order: the next strip's LOADs and the previous
strip's SAVEs interleaved with the current strip's compute), `prefetch_layers` (a layer's opening LOADs in the
previous layer's tail), `pool_cascade` (a large stride-1 max pool as 5x5 / 3x3 stages) and `downsample_bp` (a
tensor read only by strided 1x1 convs is computed only at the pixels they read), `fuse_conv` (a producer fused
with its only CONV consumer), and `pool_split` (a single-output average pool too large for the image banks as two
passes; not bit-exact to the one-pass op, the deviation stated in the log). Any other key is an error that names
it and the known ones.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from opendpu.compiler.codegen import (CODEGEN_OPTIONS, CodegenOptions, Lowered, SubgraphPlan, choose, lowerings, order,
                                      plan, timing_cycles)
from opendpu.compiler.codegen.memory import MemoryPlan
from opendpu.compiler.emit import emit, md5, meta_json
from opendpu.compiler.partition import Partition, partition, shape_of
from opendpu.compiler.program import DpuProgram
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.disasm import disasm
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import Target, get_target


class CompileError(OpenDpuError, ValueError):
    """Bad compile input (options, graph, names); the message names the offending thing."""


GRAPH_PASS_OPTIONS = ("downsample_bp", "pool_split")       # the graph rewrites before partitioning, on by default
BOOL_OPTIONS = ("prefetch", "hd_opt") + CODEGEN_OPTIONS + GRAPH_PASS_OPTIONS
KNOWN_OPTIONS = ("input_shape", "output_ops", "plugins") + BOOL_OPTIONS
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


# ---- options ------------------------------------------------------------------------------------------------
def _bool_option(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[v.strip().lower()]
    raise CompileError(f"option {key}: {v!r} is not a boolean (true or false)")


def _shape_list(v: Any) -> list[list[int]]:
    """input_shape as one shape per graph input: "1,8,8,1", "1,8,8,1;1,10", [1,8,8,1] or [[1,8,8,1], [1,10]]."""
    def dims(x, text) -> list[int]:
        try:
            out = [int(str(d).strip()) for d in x]
        except ValueError:
            raise CompileError(f"option input_shape: {text!r} is not a list of integers") from None
        if not out or any(d <= 0 for d in out):
            raise CompileError(f"option input_shape: {text!r} needs positive dimensions")
        return out
    if isinstance(v, str):
        parts = [p for p in v.split(";")]
        if any(not p.strip() for p in parts):
            raise CompileError(f"option input_shape: {v!r} has an empty shape")
        return [dims(p.split(","), p) for p in parts]
    if isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return [dims(v, str(v))]
    if isinstance(v, list) and v and all(isinstance(x, list) for x in v):
        return [dims(x, str(x)) for x in v]
    raise CompileError(f"option input_shape: {v!r} is not a shape like \"1,224,224,3\" (inputs separated by ';')")


def _op_list(v: Any) -> list[str]:
    if isinstance(v, str):
        names = [s.strip() for s in v.split(",")]
    elif isinstance(v, list) and all(isinstance(s, str) for s in v):
        names = [s.strip() for s in v]
    else:
        raise CompileError(f"option output_ops: {v!r} is not op names like \"op0,op1\"")
    if not names or any(not s for s in names):
        raise CompileError(f"option output_ops: {v!r} has an empty op name")
    if len(set(names)) != len(names):
        raise CompileError(f"option output_ops: an op is named twice in {v!r}")
    return names


def check_options(options: dict) -> dict:
    """vai_c's options, checked and normalised (input_shape: list of shapes, output_ops: list of names, prefetch and
    hd_opt: bool); an unknown key, a bad value or a plugin is a CompileError."""
    if not isinstance(options, dict):
        raise CompileError(f"options must be a JSON object of vai_c keys ({', '.join(KNOWN_OPTIONS)}), not a "
                           f"{type(options).__name__}")
    out: dict[str, Any] = {}
    for k, v in options.items():
        if k not in KNOWN_OPTIONS:
            raise CompileError(f"unknown option {k!r}; known options: {', '.join(KNOWN_OPTIONS)}")
        if k == "input_shape":
            out[k] = _shape_list(v)
        elif k == "output_ops":
            out[k] = _op_list(v)
        elif k in BOOL_OPTIONS:
            out[k] = _bool_option(k, v)
        elif k == "plugins":
            if v not in ("", None, []):
                raise CompileError(f"option plugins: {v!r}: compiler plugins (C++ shared libraries with "
                                   f"get_plugin()) are not supported by opendpu; leave the ops to the CPU partition")
            out[k] = ""
    return out


def parse_options(text: str) -> dict:
    """--options JSON text -> checked options (CompileError for bad JSON or keys)."""
    from opendpu.isa.jsonin import check_depth
    check_depth(text, "--options", CompileError, hint="vai_c's options are an object of strings, numbers and shape "
                                                      "lists")
    try:
        v = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise CompileError(f"--options is not valid JSON ({e}); e.g. '{{\"output_ops\": \"fc\"}}'") from None
    return check_options(v)


# ---- the context and the passes ---------------------------------------------------------------------------
@dataclass
class CompileContext:
    """What the passes share: the input graph, target, options, and what each pass produced."""

    source: Graph
    target: Target
    options: dict
    name: str
    recompile: bool = False
    graph: Graph | None = None                    # the canonical graph (after canonicalize)
    partition: Partition | None = None
    plans: dict[str, SubgraphPlan] = field(default_factory=dict)          # codegen_plan, per DPU subgraph
    lowered: dict[str, list[Lowered]] = field(default_factory=dict)     # codegen_lower (two: a contested pair)
    programs: dict[str, DpuProgram] = field(default_factory=dict)
    compiled: Graph | None = None
    org_bytes: bytes = b""
    meta: dict = field(default_factory=dict)
    summary: str = ""                             # the last pass's one-line summary
    summaries: list[tuple[str, str]] = field(default_factory=list)
    log: Callable[[str], None] | None = None
    cycles: Callable | None = None                # the cycle model the code generator decides by (codegen.Cycles)

    def say(self, line: str) -> None:
        if self.log is not None:
            self.log(line)

    def to_dict(self) -> dict:
        """The context as JSON-able data (the --dump-after file)."""
        d: dict[str, Any] = {"name": self.name, "target": self.target.name,
                             "fingerprint": f"0x{self.target.fingerprint:016X}"
                             if self.target.fingerprint is not None else None,
                             "options": self.options, "passes": [dict(name=n, summary=s) for n, s in self.summaries]}
        if self.graph is not None:
            d["graph"] = _graph_dict(self.graph)
        if self.partition is not None:
            d["partition"] = self.partition.to_dict()
        if self.plans and not self.lowered:
            d["codegen_plan"] = {k: dict(p.to_dict(), memory=_initial_images(self.graph, p))
                                 for k, p in self.plans.items()}
        if self.lowered and not self.programs:
            d["codegen_lower"] = {k: [low.to_dict() for low in lows] for k, lows in self.lowered.items()}
        if self.programs:
            d["programs"] = {k: _program_dict(p) for k, p in self.programs.items()}
        if self.compiled is not None:
            d["compiled"] = {"subgraphs": [{"name": s.name, "device": s.device, "ops": len(s.all_ops()),
                                            "children": [c.name for c in s.children]}
                                           for s in self.compiled.root.children]}
        if self.meta:
            d["meta"] = self.meta
        return d


def _initial_images(g: Graph | None, p: SubgraphPlan) -> dict:
    """The DDR images the plan fixes before lowering: the interface tensors and the aliases of outputs."""
    assert g is not None
    return MemoryPlan(g, p).to_dict()


def _graph_dict(g: Graph) -> dict:
    ops = []
    for n in g.toposort():
        op = g.ops[n]
        t = op.output
        ops.append({"name": n, "type": op.type, "inputs": {k: list(v) for k, v in op.inputs.items()},
                    "attrs": {k: (f"<{len(v)} bytes>" if isinstance(v, (bytes, bytearray)) else v)
                              for k, v in op.attrs.items()},
                    "shape": list(t.shape) if t is not None else None,
                    "dtype": t.dtype_name if t is not None else None,
                    "fix_point": t.fix_point if t is not None else None})
    return {"name": g.name, "ops": ops}


def _program_dict(p: DpuProgram) -> dict:
    def img(i) -> dict:
        return {"op": i.op_name, "reg_id": i.reg_id, "ddr_addr": i.ddr_addr, "dims": list(i.dims),
                "strides": list(i.strides), "fix_point": i.fix_point}
    return {"instructions": len(p.instructions), "workload": p.workload, "stats": p.stats,
            "layers": [{"name": ly.name, "ops": ly.ops, "first": ly.first, "count": ly.count} for ly in p.layers],
            "registers": [{"reg_id": r.reg_id, "context": r.context, "size": r.size,
                           "params": len(r.params) if r.params is not None else None} for r in p.registers.registers()],
            "inputs": [img(i) for i in p.inputs], "outputs": [img(i) for i in p.outputs],
            "internal": [img(i) for i in p.internal],
            "listing": disasm(p.mc_code, p.target, dict(p.registers.sizes), p.layer_map()).splitlines()}


@dataclass(frozen=True)
class Pass:
    name: str
    fn: Callable[[CompileContext], CompileContext]     # sets ctx.summary
    doc: str


def check_graph(g: Graph, recompile: bool = False, options: dict | None = None) -> str:
    """What can be checked before any work: a quantized graph (`frontend.detect_form`: the canonical form or AMD's
    vai_q form; a compiled xmodel only with `recompile`), and the checked `options` that name its ops and inputs
    (output_ops exist, input_shape equals its input shapes). Returns the form."""
    from opendpu.compiler.frontend import detect_form
    form = detect_form(g)
    if recompile and form != "compiled":
        raise CompileError(f"graph {g.name!r} is not compiled (no DPU subgraphs); compile it without recompile")
    if not recompile and form == "compiled":
        raise CompileError(f"graph {g.name!r} is already compiled (it has DPU subgraphs); recompile it "
                           f"(--recompile) or give the quantized xmodel")
    options = options or {}
    _check_input_shape(g, options.get("input_shape"))
    for n in options.get("output_ops") or ():
        if n not in g.ops:
            ends = [m for m in g.ops if not g.consumers(m)]
            raise CompileError(f"option output_ops: no op {n!r} in graph {g.name!r} (XCOM_USER_INVALID_OUTPUT_OPS); "
                               f"its outputs are {ends[:6]}")
    return form


def p_canonicalize(ctx: CompileContext) -> CompileContext:
    """The quantized XIR graph in canonical `*-fix` form (compiler.frontend): ours as it is, AMD's vai_q form with
    its fix ops fused, a compiled xmodel (recompile) without its subgraphs."""
    from opendpu.compiler.frontend import canonicalize
    g = ctx.source
    form = check_graph(g, ctx.recompile)
    ctx.graph = canonicalize(g)
    cg = ctx.graph
    fix = sum(1 for op in cg.ops.values() if op.type.endswith("-fix"))
    ctx.summary = f"{len(cg.ops)} ops ({fix} *-fix) from the {len(g.ops)} ops of {g.name!r} ({form} form)"
    return ctx


def _inputs_of(g: Graph) -> list[str]:
    return [n for n in g.toposort() if g.ops[n].type in ("data", "data-fix")]


def p_apply_options(ctx: CompileContext) -> CompileContext:
    """input_shape checked against the graph's inputs; output_ops: drop every op that does not feed them."""
    g = ctx.graph
    assert g is not None
    done = []
    ins = _inputs_of(g)
    for n in ins:
        shape = shape_of(g, n)
        if not shape or 0 in shape:
            raise CompileError(f"input {n!r} has the dynamic shape {shape}: opendpu compiles static shapes only; "
                               f"quantize the model with a static input shape (input_shape cannot re-infer the "
                               f"shapes of the graph)")
    if ctx.options.get("input_shape") is not None:
        done.append("input_shape " + ", ".join(_check_input_shape(g, ctx.options["input_shape"])))
    outs = ctx.options.get("output_ops")
    if outs is not None:
        for n in outs:
            if n not in g.ops:
                ends = [m for m in g.ops if not g.consumers(m)]
                raise CompileError(f"option output_ops: no op {n!r} in the graph (XCOM_USER_INVALID_OUTPUT_OPS); its "
                                   f"current outputs are {ends[:6]}")
            if g.ops[n].type in ("data", "data-fix", "const", "const-fix"):
                raise CompileError(f"option output_ops: {n!r} is a {g.ops[n].type} op, not a computed tensor")
        keep: set[str] = set()
        stack = list(outs)
        while stack:
            n = stack.pop()
            if n in keep:
                continue
            keep.add(n)
            stack.extend(g.ops[n].input_ops())
        for n in outs:
            fed = [o for o in outs if o != n and n in _ancestors(g, o)]
            if fed:
                raise CompileError(f"option output_ops: {n!r} feeds the other output {fed[0]!r}; a graph output is an "
                                   f"op no other op reads (give only {fed[0]!r}, or outputs on separate branches)")
        dropped = [n for n in g.ops if n not in keep]
        if dropped:
            ctx.graph = _subgraph_copy(g, keep)
        done.append(f"output_ops {outs}: {len(dropped)} op(s) dropped")
    for k in ("prefetch", "hd_opt"):
        if k in ctx.options:
            done.append(f"{k}={str(ctx.options[k]).lower()} recorded (no effect on the instructions)")
    ctx.summary = "; ".join(done) if done else "no options"
    return ctx


def _check_input_shape(g: Graph, shapes: list[list[int]] | None) -> list[str]:
    """input_shape must give the graph's own static input shapes, one per input in graph order. A 4-D shape may be
    given in the xmodel's layout (NHWC) or in the NCHW of the ONNX model it was quantized from; returns, per input,
    the layout it was read in."""
    if shapes is None:
        return []
    ins = _inputs_of(g)
    if len(shapes) != len(ins):
        raise CompileError(f"option input_shape gives {len(shapes)} shape(s) for the {len(ins)} input(s) "
                           f"{ins[:4]} of the graph")
    how = []
    for n, s in zip(ins, shapes):
        have = shape_of(g, n)
        nchw = [have[0], have[3], have[1], have[2]] if len(have) == 4 else None
        if nchw is None:
            if s != have:
                raise CompileError(f"option input_shape {s} for input {n!r}: the quantized graph's input is {have}; "
                                   f"opendpu compiles the static shapes the model was quantized with (give {have})")
            how.append(f"{n!r} {s}")
        elif s == have:
            how.append(f"{n!r} {s} read as NHWC (the xmodel's layout" + (", the same as NCHW)" if s == nchw else ")"))
        elif s == nchw:
            how.append(f"{n!r} {s} read as NCHW (the ONNX model's layout) = {have} NHWC")
        else:
            raise CompileError(f"option input_shape {s} for input {n!r}: the quantized graph's input is {have} NHWC "
                               f"(the xmodel's layout), {nchw} NCHW (the ONNX model's); opendpu compiles the static "
                               f"shape the model was quantized with: give one of these, or quantize the ONNX model "
                               f"at the shape you want (opendpu quantize --input-shape N,C,H,W, NCHW)")
    return how


def _ancestors(g: Graph, n: str) -> set[str]:
    out: set[str] = set()
    stack = list(g.ops[n].input_ops())
    while stack:
        m = stack.pop()
        if m not in out:
            out.add(m)
            stack.extend(g.ops[m].input_ops())
    return out


def _subgraph_copy(g: Graph, keep: set[str]) -> Graph:
    """A copy of `g` with only the ops in `keep` (every producer of a kept op is kept)."""
    h = Graph.deserialize(g.serialize(), g.name)
    for n in [n for n in h.ops if n not in keep]:
        del h.ops[n]
    h._consumers = None
    h.validate()
    return h


def _rewrite(ctx: CompileContext, option: str, rewrite: Callable, what: str) -> CompileContext:
    """A graph rewrite pass before partitioning: off by `option`; `rewrite(graph)` edits a copy in place and returns
    one line per change (canonicalize hands a canonical input graph over as it is: never edit it)."""
    from opendpu.compiler.downsample import clone
    assert ctx.graph is not None
    if not ctx.options.get(option, True):
        ctx.summary = f"off (option {option})"
        return ctx
    g = clone(ctx.graph)
    lines = rewrite(g)
    if lines:
        ctx.graph = g
    for line in lines:
        ctx.say(f"{option}: {line}")
    ctx.summary = f"{len(lines)} {what}" if lines else "nothing to do"
    return ctx


def p_downsample_bp(ctx: CompileContext) -> CompileContext:
    """Tensors read only by strided 1x1 convs are computed only at the pixels read (compiler.downsample)."""
    from opendpu.compiler.downsample import downsample_bp
    keep = set(ctx.options.get("output_ops") or ())
    return _rewrite(ctx, "downsample_bp", lambda g: downsample_bp(g, protected=keep),
                    "op(s) computed at the stride of their readers")


def p_pool_split(ctx: CompileContext) -> CompileContext:
    """Single-output average pools too large for the image banks as two passes (compiler.poolsplit)."""
    from opendpu.compiler.poolsplit import split_pools
    return _rewrite(ctx, "pool_split", lambda g: split_pools(g, ctx.target), "average pool(s) in two passes")


def p_partition(ctx: CompileContext) -> CompileContext:
    """compiler.rules + the code generator's refusals: USER, DPU and CPU subgraphs without cycles."""
    assert ctx.graph is not None
    ctx.partition = partition(ctx.graph, ctx.target)
    for line in ctx.partition.report()[1:]:
        ctx.say(line)
    ctx.summary = ctx.partition.summary()
    return ctx


def _codegen_options(ctx: CompileContext) -> CodegenOptions:
    return CodegenOptions.from_options(ctx.options)


def p_codegen_plan(ctx: CompileContext) -> CompileContext:
    """The code generator's plan step per DPU subgraph (compiler.codegen.plan): every op's kind by the legality
    registry, the interface, concat members in place, aliases, slack."""
    assert ctx.graph is not None and ctx.partition is not None
    opts = _codegen_options(ctx)
    ctx.plans = {s.name: plan(ctx.graph, s.ops, ctx.target, s.name, opts) for s in ctx.partition.dpu_subgraphs}
    n = sum(len(p.compute) for p in ctx.plans.values())
    ctx.summary = (f"{len(ctx.plans)} DPU subgraph(s), {n} ops to lower, "
                   f"{sum(len(p.member_of) for p in ctx.plans.values())} concat member(s) in place")
    return ctx


def p_codegen_lower(ctx: CompileContext) -> CompileContext:
    """The lower step per DPU subgraph (compiler.codegen.lower): jobs per op, tiles, strips, fusion, each choice a
    LayerPlan timed on the cycle model; a subgraph with a contested pair lowered both ways."""
    assert ctx.graph is not None
    opts = _codegen_options(ctx)
    ctx.lowered = {name: lowerings(ctx.graph, p, opts, ctx.cycles) for name, p in ctx.plans.items()}
    first = [lows[0] for lows in ctx.lowered.values()]
    ctx.summary = (f"{sum(len(low.layers) for low in first)} layers, {sum(len(low.ins) for low in first)} "
                   f"instructions before ordering, {sum(len(low.plans) for low in first)} per-layer choices, "
                   f"{sum(len(lows) > 1 for lows in ctx.lowered.values())} subgraph(s) lowered both ways")
    return ctx


def p_codegen_order(ctx: CompileContext) -> CompileContext:
    """The order step per DPU subgraph (compiler.codegen.order): cross-layer prefetch, tokens, registers; of two
    lowerings the faster. One DpuProgram per DPU subgraph."""
    opts = _codegen_options(ctx)
    ctx.programs = {}
    for name, lows in ctx.lowered.items():
        prog = ctx.programs[name] = choose([order(low, opts) for low in lows], ctx.cycles)
        st = prog.stats
        ctx.say(f"{name}: {len(prog.layers)} layers, {st['instructions']} instructions, {st['const_bytes']} "
                f"parameter bytes, {st['workspace_bytes']} workspace bytes")
    n = sum(len(p.instructions) for p in ctx.programs.values())
    ctx.summary = f"{len(ctx.programs)} DPU subgraph(s), {n} instructions"
    return ctx


def p_emit(ctx: CompileContext) -> CompileContext:
    """The compiled xmodel (vai_c_xir's structure), <net>_org.xmodel and meta.json."""
    assert ctx.graph is not None and ctx.partition is not None
    ctx.org_bytes = ctx.graph.serialize()
    org = f"{ctx.name}_org.xmodel"
    ctx.compiled = emit(ctx.graph, ctx.partition, ctx.programs, ctx.target, ctx.options, {org: md5(ctx.org_bytes)})
    ctx.meta = meta_json(ctx.name, ctx.target, ctx.partition, ctx.programs, ctx.options)
    ctx.summary = f"{len(ctx.compiled.ops)} ops, {len(ctx.compiled.root.children)} subgraphs"
    return ctx


PASSES: list[Pass] = [
    Pass("canonicalize", p_canonicalize, "the quantized graph in canonical *-fix form (compiler.frontend)"),
    Pass("apply_options", p_apply_options, "input_shape checked; output_ops: ops not feeding them dropped"),
    Pass("downsample_bp", p_downsample_bp, "ops read only by strided 1x1 convs computed at that stride "
         "(compiler.downsample)"),
    Pass("pool_split", p_pool_split, "single-output average pools too large for the banks in two passes "
         "(compiler.poolsplit)"),
    Pass("partition", p_partition, "USER / DPU / CPU subgraphs (compiler.rules, codegen refusals), no cycles"),
    Pass("codegen_plan", p_codegen_plan, "per DPU subgraph: op kinds (legality), interface, DDR image plan "
         "(compiler.codegen.plan)"),
    Pass("codegen_lower", p_codegen_lower, "per DPU subgraph: jobs, tiles, strips, fusion; each choice a LayerPlan "
         "timed on the cycle model (compiler.codegen.lower)"),
    Pass("codegen_order", p_codegen_order, "per DPU subgraph: prefetch, tokens, registers: one DpuProgram "
         "(compiler.codegen.order)"),
    Pass("emit", p_emit, "the compiled xmodel, <net>_org.xmodel and meta.json (compiler.emit)"),
]
PASS_NAMES = tuple(p.name for p in PASSES)


def check_dump_after(names) -> list[str]:
    out = list(names or [])
    for n in out:
        if n not in PASS_NAMES:
            raise CompileError(f"--dump-after {n!r}: no such pass; the passes are {', '.join(PASS_NAMES)}")
    return out


# ---- the API ------------------------------------------------------------------------------------------------
@dataclass
class CompileResult:
    graph: Graph                          # the compiled xmodel
    org: Graph                            # the canonical graph it was compiled from (<net>_org.xmodel)
    programs: dict[str, DpuProgram]
    partition: Partition
    meta: dict
    name: str
    summaries: list[tuple[str, str]]
    dumps: dict[str, dict] = field(default_factory=dict)
    org_bytes: bytes = b""

    def report(self) -> dict:
        """The compile report: per DPU subgraph its size and every per-layer choice of the code generator with
        the estimated cycles of each form it tried (the chosen one and the rejected ones; docs/compiler.md)."""
        return {"name": self.name, "target": self.meta.get("target"),
                "passes": [dict(name=n, summary=s) for n, s in self.summaries],
                "subgraphs": [{"name": n, "instructions": len(p.instructions), "layers": len(p.layers),
                               "const_bytes": p.stats.get("const_bytes"),
                               "workspace_bytes": p.stats.get("workspace_bytes"),
                               "decisions": p.stats.get("decisions", [])} for n, p in self.programs.items()]}

    def report_text(self) -> str:
        r = self.report()
        lines = [f"compile report: {r['name']} for {r['target']}"]
        lines += [f"  pass {p['name']}: {p['summary']}" for p in r["passes"]]
        for sg in r["subgraphs"]:
            lines.append(f"DPU subgraph {sg['name']}: {sg['instructions']} instructions, {sg['layers']} layers, "
                         f"{len(sg['decisions'])} decisions")
            for d in sg["decisions"]:
                alts = ", ".join(f"{k} {'-' if v is None else v}" + (" *" if k == d["chosen"] else "")
                                 for k, v in d["cycles"].items())
                lines.append(f"  {d['decision']:20s} {d['layer']}: {d['chosen']} ({alts})")
        lines.append("(cycles: the estimate the choice was made by; * marks the form taken)")
        return "\n".join(lines) + "\n"

    def files(self) -> dict[str, bytes]:
        """File name -> content: <name>.xmodel, <name>_org.xmodel, meta.json, report.json / report.txt (the
        compile report) and any dump_after_<pass>.json."""
        contents = [self.graph.serialize(), self.org_bytes or self.org.serialize(),
                    (json.dumps(self.meta, indent=1) + "\n").encode(),
                    (json.dumps(self.report(), indent=1) + "\n").encode(), self.report_text().encode()]
        contents += [(json.dumps(d, indent=1, default=str) + "\n").encode() for d in self.dumps.values()]
        return dict(zip(output_names(self.name, list(self.dumps)), contents, strict=True))

    def write(self, directory: str) -> list[str]:
        """Write `files()` into an existing directory (the CLI writes through compiler.outdir); returns the paths."""
        paths = []
        for f, data in self.files().items():
            p = os.path.join(directory, f)
            with open(p, "wb") as fh:
                fh.write(data)
            paths.append(p)
        return paths


NAME_MAX = 255                  # bytes of a file name on Linux file systems (compiler.outdir checks the real one)


def output_names(name: str, dump_after=()) -> list[str]:
    """The files a compile of net `name` writes (`CompileResult.files`), in order: known before any work."""
    return [f"{name}.xmodel", f"{name}_org.xmodel", "meta.json", "report.json", "report.txt"] + \
        [f"dump_after_{p}.json" for p in dump_after]


def check_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or os.sep in name or "\0" in name or name.startswith("."):
        raise CompileError(f"net name {name!r}: give a plain file stem (no directory, not starting with '.')")
    longest = max(len(os.fsencode(f)) for f in output_names(name))       # NAME_org.xmodel
    if longest > NAME_MAX:
        raise CompileError(f"net name {name[:40]}... is {len(os.fsencode(name))} bytes long: its output file "
                           f"NAME_org.xmodel would be {longest} bytes, over the {NAME_MAX}-byte limit of a file name")
    return name


def compile(graph: Graph, target: "Target | str", *, name: str | None = None, recompile: bool = False,
            dump_after=(), log: Callable[[str], None] | None = None, cycles: Callable | None = None,
            **options) -> CompileResult:
    """Compile a quantized XIR graph (the `*-fix` form `opendpu quantize` writes; with `recompile`, a compiled
    xmodel) for `target` (a Target, preset name, fingerprint or arch.json path) with vai_c's `options`.
    `cycles(target, instructions) -> int` is the cycle model the code generator decides by; None: the one cycle
    model, `timing_cycles` (sim.timing, bank-port conflicts included), as `opendpu compile`, the sweep and the
    profiler use it."""
    if cycles is None:
        cycles = timing_cycles
    t = target if isinstance(target, Target) else get_target(target)
    opts = check_options(options)
    dumps = check_dump_after(dump_after)
    ctx = CompileContext(graph, t, opts, check_name(name or graph.name), recompile, log=log, cycles=cycles)
    fpr = f"fingerprint 0x{t.fingerprint:016X}" if t.fingerprint is not None else "no fingerprint"
    ctx.say(f"Compile mode: dpu; target {t.name} ({fpr}); graph {graph.name!r} with "
            f"{len(graph.ops)} ops")
    out_dumps: dict[str, dict] = {}
    for p in PASSES:
        ctx.summary = ""
        ctx = p.fn(ctx)
        ctx.summaries.append((p.name, ctx.summary))
        ctx.say(f"pass {p.name}: {ctx.summary}")
        if p.name in dumps:
            out_dumps[p.name] = ctx.to_dict()
    assert ctx.compiled is not None and ctx.graph is not None and ctx.partition is not None
    return CompileResult(ctx.compiled, ctx.graph, ctx.programs, ctx.partition, ctx.meta, ctx.name, ctx.summaries,
                         out_dumps, ctx.org_bytes)


__all__ = ["compile", "timing_cycles", "CompileResult", "CompileContext", "CompileError", "Pass", "PASSES",
           "PASS_NAMES", "KNOWN_OPTIONS", "check_options", "parse_options", "check_dump_after", "check_name",
           "check_graph"]
