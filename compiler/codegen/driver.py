"""The code generator's driver: one DPU subgraph in three steps, each a pass of `compiler.pipeline` too.

* `plan`: every op's kind (legality), the subgraph's interface and memory plan (`memory.SubgraphPlan`);
* `lower`: the layers in topological order, each op lowered to its jobs (`registry.LOWERINGS`) and emitted, a
  producer fused with its only consumer where the cycle model says it pays (`fusion`), every choice kept as a
  `plans.LayerPlan`; tiling and the strip order happen inside each layer's emission (`tiling`, `ordering.strips`).
  Where a CONV consumer could be fused either with its producer or with its own ALU consumer (a contested pair),
  the ALU pair is taken, and when the subgraph has such a pair it is lowered the other way too;
* `order`: the cross-layer prefetch and the dependency tokens (`ordering`), the registers, the `DpuProgram`; of two
  lowerings of a contested subgraph the one the cycle model finds faster.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from opendpu.compiler.codegen.context import Ctx, Cycles, new_ctx
from opendpu.compiler.codegen.fusion import fuse_jobs, try_fuse, try_fuse_elew
from opendpu.compiler.codegen.ir import (REG_CONST, REG_IN, REG_OUT, REG_WORKSPACE, TOKEN_LINES, CodegenError, CopyJob,
                                         FMap, data_inputs, dense, tensor)
from opendpu.compiler.codegen.kinds import ALIAS, ALU_KINDS, CONV, ELEW, FUSE_PRODUCERS, SKIP_TYPES, VIEW
from opendpu.compiler.codegen.legality import classify
from opendpu.compiler.codegen.memory import MemoryPlan, SubgraphPlan, plan_subgraph, slice_view
from opendpu.compiler.codegen.ordering import footprint_keys, prefetch_layers, tokens
from opendpu.compiler.codegen.plans import LayerPlan, timing_cycles
from opendpu.compiler.codegen.registry import EMITTERS, LOWERINGS
from opendpu.compiler.program import DdrImage, DpuProgram, Layer
from opendpu.compiler.xir.dpu_abi import CONST, INTERFACE, WORKSPACE, Register, RegisterMap
from opendpu.compiler.xir.graph import Graph, Op
from opendpu.isa.program import Instruction
from opendpu.isa.target import Target


@dataclass(frozen=True)
class CodegenOptions:
    """The code generator's switches (vai_c `--options` keys of the same names, all on by default; docs/compiler.md):
    `channel_augmentation` lets convs with few input channels fold kw into the LOAD items, `fuse` lets a producer
    and its only (ALU) consumer share one superlayer with the intermediate on chip (each taken per layer when the
    cost model says it is faster); `exact_tokens`, `pipeline` and `prefetch_layers` are the scheduling
    optimisations; `fuse_conv` lets a producer be fused with its only CONV consumer; `pool_cascade` runs a large
    stride-1 max pool as a cascade of small ones."""
    channel_augmentation: bool = True
    fuse: bool = True
    exact_tokens: bool = True
    pipeline: bool = True
    prefetch_layers: bool = True
    fuse_conv: bool = True
    pool_cascade: bool = True

    @classmethod
    def from_options(cls, options: dict) -> "CodegenOptions":
        """From checked vai_c options: the keys named as the fields (absent: on); other keys are not this class's."""
        return cls(**{f.name: bool(options[f.name]) for f in fields(cls) if f.name in options})


CODEGEN_OPTIONS = tuple(f.name for f in fields(CodegenOptions))


# ---- step 1: plan ----------------------------------------------------------------------------------------------
def plan(graph: Graph, op_names: list[str], target: Target, name: str = "subgraph",
         options: CodegenOptions | None = None) -> SubgraphPlan:
    """The plan step of the ops `op_names` of `graph` (one DPU subgraph)."""
    opts = options or CodegenOptions()
    ops = set(op_names)
    kinds = {n: classify(graph, graph.ops[n], target) for n in graph.toposort() if n in ops}
    return plan_subgraph(graph, op_names, target, name, kinds, opts.channel_augmentation)


# ---- step 2: lower ---------------------------------------------------------------------------------------------
@dataclass
class Lowered:
    """One lowering of a subgraph: the untokened stream with its layers, the CONST blob, the memory plan, the
    workload and the LayerPlans; `contested`: the subgraph has a contested pair (decided as `conv_first` says)."""

    plan: SubgraphPlan
    conv_first: bool
    ins: list[Instruction]
    layer_of: list[int]
    layers: list[Layer]
    blob: bytes
    memory: MemoryPlan
    internal: list[DdrImage]
    workload: int
    plans: list[LayerPlan]
    contested: bool

    def to_dict(self) -> dict:
        """JSON-able (`--dump-after codegen_lower`): the layers, the LayerPlans and the images."""
        return {"conv_first": self.conv_first, "contested": self.contested, "instructions": len(self.ins),
                "const_bytes": len(self.blob), "workload": self.workload,
                "layers": [{"name": ly.name, "ops": ly.ops, "first": ly.first, "count": ly.count}
                           for ly in self.layers],
                "plans": [p.to_dict() for p in self.plans], "memory": self.memory.to_dict()}


def lower_op(c: Ctx, graph: Graph, op: Op, kind: str, fm: dict[str, FMap], out: FMap) -> list:
    """The jobs of one op (its kind's lowering); a PReLU's slopes (a const input) are not a feature map."""
    ins = [fm[i] for i in data_inputs(op) if graph.ops[i].type not in SKIP_TYPES]
    return LOWERINGS[kind](c, graph, op, ins, out)


def run_jobs(c: Ctx, jobs: list) -> None:
    for job in jobs:
        EMITTERS[type(job)](c, job)


class _Lowerer:
    """The lower step's state: the emission context, the memory plan, the layers so far."""

    def __init__(self, graph: Graph, p: SubgraphPlan, opts: CodegenOptions, cycles: Cycles, conv_first: bool):
        self.graph, self.p, self.opts, self.conv_first = graph, p, opts, conv_first
        c = self.c = new_ctx(p.target)
        c.graph = graph
        c.aug, c.pipeline, c.fuse_conv, c.cascade = (opts.channel_augmentation, opts.pipeline, opts.fuse_conv,
                                                     opts.pool_cascade)
        c.decisions = []
        c.cycles = cycles
        c.param_align = TOKEN_LINES if opts.prefetch_layers else 1   # a layer's parameters share no key with the next's
        self.mem = MemoryPlan(graph, p)
        c.ws_alloc = self.mem.workspace
        self.layers: list[Layer] = []
        self.internal: list[DdrImage] = []
        self.done: set[str] = set()              # consumers already emitted with their producer
        self.pos_of = {m: j for j, m in enumerate(p.compute)}
        self.contested = False

    def run(self) -> Lowered:
        for n in self.p.compute:
            if n not in self.done:
                self._layer(n)
        c = self.c
        if not c.s.ins:
            raise CodegenError(f"subgraph {self.p.name!r}: nothing to execute (only aliases)")
        c.s.add("END")
        c.s.layer_of[-1] = len(self.layers) - 1
        self.layers[-1].count += 1
        return Lowered(self.p, self.conv_first, c.s.ins, c.s.layer_of, self.layers, bytes(c.blob), self.mem,
                       self.internal, c.workload, list(c.decisions or []), self.contested)

    def _params(self, op: Op) -> list[str]:
        """The op and its constant inputs in the subgraph (the ops of its layer)."""
        return [op.name] + [i for i in op.input_ops() if i in self.p.ops and self.graph.ops[i].type in SKIP_TYPES]

    def _only_reader(self, n: str) -> str | None:
        """n's only consumer when it is in the subgraph and reads no other feature map, n not an interface tensor
        and not yet placed (None otherwise)."""
        g, p = self.graph, self.p
        cons = g.consumers(n)
        if n in p.outputs or n in self.mem.fm or len(cons) != 1 or cons[0] not in p.ops:
            return None
        return cons[0]

    def _sole_input(self, q: str, n: str) -> bool:
        return [i for i in data_inputs(self.graph.ops[q]) if self.graph.ops[i].type not in SKIP_TYPES] == [n]

    def _alu_pair(self, p_: str) -> bool:
        """Is p_'s only consumer an ALU layer reading only p_ (a pair `fusion.fused` takes first)?"""
        cs = self.graph.consumers(p_)
        return (len(cs) == 1 and cs[0] in self.p.ops and self.p.kinds[cs[0]] in ALU_KINDS
                and p_ not in self.p.outputs and self._sole_input(cs[0], p_))

    def _layer(self, n: str) -> None:
        c, g = self.c, self.graph
        op = g.ops[n]
        c.s.layer = len(self.layers)
        first = len(c.s.ins)
        if self.opts.fuse and (self._try_pair(n, first) or self._try_elew_pair(n, first)):
            return
        self._single(n, op, first)

    def _pair_layer(self, n: str, q: Op, qout: FMap, first: int) -> None:
        """Op n and its consumer q, emitted fused, as one layer (q's output image is internal unless an output)."""
        self.layers.append(Layer(n, self._params(self.graph.ops[n]) + self._params(q), first,
                                 len(self.c.s.ins) - first))
        self.done.add(q.name)
        if qout.reg == REG_WORKSPACE and q.name not in self.p.member_of:
            self.internal.append(self.mem.image(q.name))

    def _try_pair(self, n: str, first: int) -> bool:
        """n with its only consumer, an ALU layer or (fuse_conv) a CONV. A CONV consumer that has an ALU consumer
        of its own to fuse with is contested: the ALU pair wins unless `conv_first` (weighing the two pairs by a
        schedule of the three layers alone chose worse on tf2_custom_op and YOLOX, so `generate` compares whole
        programs)."""
        kinds = self.p.kinds
        q_name = self._only_reader(n) if kinds[n] in FUSE_PRODUCERS else None
        if q_name is None or not self._sole_input(q_name, n):
            return False
        conv_q = self.opts.fuse_conv and kinds[q_name] == CONV
        if conv_q and self._alu_pair(q_name):
            self.contested = True
            conv_q = self.conv_first
        if kinds[q_name] not in ALU_KINDS and not conv_q:
            return False
        g = self.graph
        q = g.ops[q_name]
        qout = self.mem.place(q_name)
        jobs = fuse_jobs(self.c, g, g.ops[n], q, kinds, self.mem.fm, qout)
        if jobs is None or not try_fuse(self.c, *jobs):
            return False
        self._pair_layer(n, q, qout, first)
        return True

    def _try_elew_pair(self, n: str, first: int) -> bool:
        """A conv whose only reader is an ELEW whose other inputs are already computed: the two in one strip loop."""
        kinds, g = self.p.kinds, self.graph
        q_name = self._only_reader(n) if kinds[n] == CONV else None
        if q_name is None or kinds[q_name] != ELEW:
            return False
        q = g.ops[q_name]
        qins = [i for i in data_inputs(q) if g.ops[i].type not in SKIP_TYPES]
        ready = all(i == n or i in self.p.inputs or (i in self.pos_of and self.pos_of[i] < self.pos_of[n]
                                                     and kinds[i] != ALIAS) for i in qins)
        if not ready or qins.count(n) != 1:
            return False
        qout = self.mem.place(q_name)
        jobs = fuse_jobs(self.c, g, g.ops[n], q, kinds, self.mem.fm, qout, elew=True)
        if jobs is None or not try_fuse_elew(self.c, jobs[0], jobs[1], qins.index(n)):
            return False
        self._pair_layer(n, q, qout, first)
        return True

    def _single(self, n: str, op: Op, first: int) -> None:
        """One op as its own layer: a view (a window of its input's image, copied only where a dense image is
        needed), an alias (its source's image, or a copy) or its kind's jobs."""
        c, g, mem, k = self.c, self.graph, self.mem, self.p.kinds[n]
        view_only = False
        if k == VIEW:
            v = slice_view(g, op, mem.fm[data_inputs(op)[0]])
            if n in mem.fm:
                run_jobs(c, [_copy_job(n, v, mem.fm[n])])
            else:
                mem.fm[n], view_only = v, True
        out = mem.place(n)
        if k == ALIAS:
            sf = mem.fm[data_inputs(op)[0]]
            if sf.reg != out.reg or sf.addr != out.addr:
                run_jobs(c, [_copy_job(n, dense(sf.reg, sf.addr, tensor(op).shape, sf.fp) if sf.dense else sf, out)])
        elif k != VIEW:
            run_jobs(c, lower_op(c, g, op, k, mem.fm, out))
        lops = self._params(op)
        if len(c.s.ins) > first or k not in (ALIAS, VIEW) or self.layers == []:
            self.layers.append(Layer(n, lops, first, len(c.s.ins) - first))
        else:
            self.layers[-1].ops.extend(lops)
        if out.reg == REG_WORKSPACE and n not in self.p.member_of and not view_only:
            self.internal.append(mem.image(n))


def _copy_job(name: str, src: FMap, dst: FMap) -> CopyJob:
    return CopyJob(name, src, [dst])


def lower(graph: Graph, p: SubgraphPlan, options: CodegenOptions | None = None, cycles: Cycles | None = None,
          conv_first: bool = False) -> Lowered:
    """The lower step (module docstring) with the contested pairs decided one way (`conv_first`: producer + CONV
    consumer); `cycles` the cycle model the per-layer choices are made by (default `timing_cycles`)."""
    return _Lowerer(graph, p, options or CodegenOptions(), cycles or timing_cycles, conv_first).run()


# ---- step 3: order ---------------------------------------------------------------------------------------------
def order(low: Lowered, options: CodegenOptions | None = None) -> DpuProgram:
    """The order step: the cross-layer prefetch, the tokens, the registers; the DpuProgram of one lowering."""
    opts = options or CodegenOptions()
    p, t, sizes = low.plan, low.plan.target, low.memory.sizes
    ins, layer_of = list(low.ins), list(low.layer_of)
    layers = [Layer(ly.name, list(ly.ops), ly.first, ly.count) for ly in low.layers]
    keys = footprint_keys(t, ins, {REG_CONST: max(1, len(low.blob)), **{r: max(1, v) for r, v in sizes.items()}})
    if opts.prefetch_layers:
        perm = prefetch_layers(ins, layer_of, keys)
        ins = [ins[j] for j in perm]
        layer_of = [layer_of[j] for j in perm]
        keys = keys.permuted(perm)
        span: dict[int, list[int]] = {}
        for pos, li in enumerate(layer_of):
            span.setdefault(li, [pos, pos])[1] = pos
        for li, (a, b) in span.items():                  # a layer's hull (its opening LOADs moved up)
            layers[li].first, layers[li].count = a, b - a + 1
    instrs = tokens(t, ins, opts.exact_tokens, keys)
    regs = [Register(REG_CONST, CONST, max(1, len(low.blob)), low.blob)]
    if sizes[REG_WORKSPACE]:
        regs.append(Register(REG_WORKSPACE, WORKSPACE, sizes[REG_WORKSPACE]))
    if p.inputs:
        regs.append(Register(REG_IN, INTERFACE, sizes[REG_IN]))
    regs.append(Register(REG_OUT, INTERFACE, sizes[REG_OUT]))
    return DpuProgram(p.name, t, instrs, layer_of, layers, RegisterMap.of(regs),
                      [low.memory.image(i) for i in p.inputs], [low.memory.image(o) for o in p.outputs],
                      list(low.internal), low.workload,
                      {"instructions": len(instrs), "const_bytes": len(low.blob),
                       "workspace_bytes": sizes[REG_WORKSPACE], "decisions": [d.to_dict() for d in low.plans]})


def choose(progs: list[DpuProgram], cycles: Cycles | None = None) -> DpuProgram:
    """Of the programs of a subgraph's lowerings (the second with the contested pairs the other way), the one the
    cycle model finds faster, the comparison recorded as a decision of the whole subgraph."""
    prog = progs[0]
    if len(progs) == 1:
        return prog
    cycles = cycles or timing_cycles
    alt = progs[1]
    ca, cp = int(cycles(prog.target, alt.instructions)), int(cycles(prog.target, prog.instructions))
    if ca < cp:
        prog = alt
    prog.stats["decisions"].append(LayerPlan("(whole subgraph)", "contested pairs",
                                             "producer + CONV consumer" if ca < cp else "CONV + ALU consumer",
                                             (("producer + CONV consumer", ca), ("CONV + ALU consumer", cp))).to_dict())
    return prog


def lowerings(graph: Graph, p: SubgraphPlan, options: CodegenOptions | None = None,
              cycles: Cycles | None = None) -> list[Lowered]:
    """The subgraph lowered with the contested pairs decided the default way, and, when it has one, the other."""
    first = lower(graph, p, options, cycles)
    return [first, lower(graph, p, options, cycles, conv_first=True)] if first.contested else [first]


def generate(graph: Graph, op_names: list[str], target: Target, name: str = "subgraph",
             log: Callable[[str], None] | None = None, options: CodegenOptions | None = None,
             cycles: Cycles | None = None) -> DpuProgram:
    """Compile the ops `op_names` of `graph` (one DPU subgraph) for `target`: plan, lower, order (module
    docstring) with `options` (`CodegenOptions`, all on by default). `cycles(target, instructions) -> int` is the
    cycle model the choices are made by; None: the one cycle model, `plans.timing_cycles` (sim.timing), as
    `compiler.compile` uses it."""
    opts = options or CodegenOptions()
    p = plan(graph, op_names, target, name, opts)
    prog = choose([order(low, opts) for low in lowerings(graph, p, opts, cycles)], cycles)
    if log:
        st = prog.stats
        log(f"{name}: {len(prog.layers)} layers, {st['instructions']} instructions, {st['const_bytes']} parameter "
            f"bytes, {st['workspace_bytes']} workspace bytes")
    return prog


__all__ = ["CODEGEN_OPTIONS", "CodegenOptions", "Lowered", "choose", "generate", "lower", "lowerings", "order",
           "plan"]
