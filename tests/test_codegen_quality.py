"""Compile-quality optimisations of the code generator (issue 16; docs/compiler.md): channel augmentation of convs
with few input channels, a producer fused with its only ALU consumer (the intermediate stays on chip), tokens on the
exact conflicting instruction, the software-pipelined strip order and the cross-layer prefetch.

Each small graph is compiled with the optimisation on and off (the `channel_augmentation` / `fuse` /
`exact_tokens` / `pipeline` / `prefetch_layers` switches of `codegen.generate`). The optimised program must take the
new path (its instruction pattern is asserted), equal the golden reference (`GraphRunner(backend="ref")`) byte for
byte on every output and stored workspace tensor from random bank contents on several targets, have no race
(isa.deps.find_races), and need fewer cycles on the cycle model (sim.timing.simulate) than the program without the
optimisation.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper as oh, numpy_helper

from opendpu.compiler import codegen
from opendpu.compiler.codegen import conv as codegen_conv
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.fields import Engine
from opendpu.isa.target import Target
from opendpu.quant.quantize import QuantConfig, quantize
from opendpu.sim.timing import simulate

sys.path.insert(0, os.path.dirname(__file__))
from test_codegen import dpu_ops, mismatches, no_races, reference, run_program  # noqa: E402

TARGETS = {
    "B512": lambda: Target.from_name("DPUCZDX8G_ISA1_B512"),
    "B1152": lambda: Target.from_name("DPUCZDX8G_ISA1_B1152"),
    "B4096": lambda: Target.from_name("DPUCZDX8G_ISA1_B4096"),
    "PP2_CP4_D512": lambda: Target.parametric(2, 4, bank_depth=512),
}


# ---- small float models, quantized -----------------------------------------------------------------------------
class _Net:
    """A float ONNX chain under construction (NCHW shapes tracked by the conv / pool formulas)."""

    def __init__(self, shape, seed=0):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.shape = [], {}, shape
        self.shapes = {"x": shape}
        self.last = "x"

    def _w(self, *shape):
        n = f"w{len(self.inits)}"
        self.inits[n] = (self.rng.normal(0, 1, shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
        return n

    def op(self, kind, *inputs, oc=None, src=None, **attrs):
        """Append `kind` reading `src` (default: the last tensor) and `inputs`."""
        src = src or self.last
        name = f"{kind.lower()}{len(self.nodes)}"
        n, c, h, w = self.shapes[src]
        if "kernel_shape" in attrs:
            (kh, kw), (sh, sw) = attrs["kernel_shape"], attrs.get("strides", [1, 1])
            pt, pl, pb, pr = attrs.get("pads", [0, 0, 0, 0])
            h, w = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
        self.nodes.append(oh.make_node(kind, [src, *inputs], [name], name=name, **attrs))
        self.shapes[name] = (n, oc or c, h, w)
        self.last = name
        return self

    def conv(self, oc, k, s=1, p=0, group=1, src=None):
        ic = self.shapes[src or self.last][1]
        return self.op("Conv", self._w(oc, ic // group, k, k), self._w(oc), oc=oc, kernel_shape=[k, k],
                       strides=[s, s], pads=[p] * 4, group=group, src=src)

    def model(self, outs=None):
        outs = outs or [self.last]
        g = oh.make_graph(self.nodes, "q", [oh.make_tensor_value_info("x", TensorProto.FLOAT, self.shape)],
                          [oh.make_tensor_value_info(o, TensorProto.FLOAT, self.shapes[o]) for o in outs],
                          [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
        m.ir_version = 8
        return m


def _quantized(net: _Net) -> tuple[Graph, tuple]:
    x = np.random.default_rng(1).normal(0, 1, (6,) + net.shape[1:]).astype(np.float32)
    res = quantize(net.model(), x, config=QuantConfig(method="maxmin"))
    n, c, h, w = net.shape
    return Graph.deserialize(res.xmodel().serialize()), (1, h, w, c)


def _stem():
    """3-channel 3x3 stride-2 stem with padding on every side (YOLOX-like), odd width, then a 1x1 conv."""
    return _Net((1, 3, 19, 23)).conv(8, 3, 2, 1).op("Relu").conv(8, 1)


def _lenet():
    """1-channel 5x5 conv (pads 2), ReLU, 2x2/2 max pool, 3x3 conv, ReLU, 2x2/2 max pool (a LeNet-style net)."""
    return (_Net((1, 1, 20, 18)).conv(6, 5, 1, 2).op("Relu").op("MaxPool", kernel_shape=[2, 2], strides=[2, 2])
            .conv(16, 3, 1, 1).op("Relu").op("MaxPool", kernel_shape=[2, 2], strides=[2, 2]))


def _pillars():
    """PointPillars' PFN in small: a 1x1 conv over (pillars x points) then a max over the points (W)."""
    return _Net((1, 4, 40, 12)).conv(24, 1).op("Relu").op("MaxPool", kernel_shape=[1, 12], strides=[1, 12])


def _dw_pool():
    """1x1 conv -> depthwise 3x3 pad 1 (overlapping windows: the conv recomputes the halo rows of each strip) ->
    2x2/2 max pool; then a 1x1 conv and a 3x3/2 pool with padding 1 (odd top padding: the conv's first row goes to
    sub-row 1 of the pool's first slot, written by a one-row CONV)."""
    return (_Net((1, 8, 16, 16)).conv(16, 1).op("Relu").conv(16, 3, 1, 1, group=16).op("Relu")
            .op("MaxPool", kernel_shape=[2, 2], strides=[2, 2]).conv(16, 1).op("Relu")
            .op("MaxPool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))


def _alu_alu():
    """An ALU producer and an ALU consumer: depthwise 3x3 (pads 1) on the input, ReLU, 2x2/2 max pool."""
    return _Net((1, 12, 14, 18)).conv(12, 3, 1, 1, group=12).op("Relu").op("MaxPool", kernel_shape=[2, 2],
                                                                           strides=[2, 2])


def _strips():
    """Three convs (3x3 pads 1, 3x3 pads 1, 1x1) over a 40x64 map of 32 channels: several strips per layer on B512,
    B1152 and PP2_CP4_D512 (column tiles there), one strip on B4096."""
    return _Net((1, 32, 40, 64)).conv(32, 3, 1, 1).op("Relu").conv(16, 3, 1, 1).op("Relu").conv(16, 1)


MODELS = {"stem": _stem, "lenet": _lenet, "pillars": _pillars, "dw_pool": _dw_pool, "alu_alu": _alu_alu,
          "strips": _strips}


@pytest.fixture(scope="module")
def graphs():
    return {k: _quantized(f()) for k, f in MODELS.items()}


def _compile(g, t, cycles=None, **opts):
    """`codegen.generate` of the graph's DPU ops with `opts` switched; `cycles` None: its default, the one cycle
    model."""
    ops, why = dpu_ops(g, t)
    assert not why, why
    return codegen.generate(g, ops, t, options=codegen.CodegenOptions(**opts), cycles=cycles)


def _cycles(prog) -> int:
    return int(simulate(prog.instructions, prog.target).total_cycles)


def _check_exact(g, shape, prog, t):
    for seed in (1, 2):
        values = reference(g, shape, seed)
        bad = mismatches(prog, run_program(prog, values, seed), values)
        assert not any(bad.values()), {k: v for k, v in bad.items() if v}
    assert no_races(prog, t)


def _op(g, typ, k=0):
    return [n for n in g.toposort() if g.ops[n].type == typ][k]


def _layer_ins(prog, op_name: str) -> list:
    """The instructions of the layer that realises `op_name` (by the layer map: a layer's opening LOADs may sit in
    the previous layer's tail, codegen.ordering.prefetch_layers)."""
    k = next(i for i, ly in enumerate(prog.layers) if op_name in ly.ops)
    return [x for x, ly in zip(prog.instructions, prog.layer_of) if ly == k]


def _saved_bytes(prog) -> int:
    return sum(x.fields["length"] * x.fields["channel"] for x in prog.instructions if x.op == "SAVE")


def _image_bytes(prog) -> int:
    return sum(int(np.prod(im.dims)) for im in prog.outputs + prog.internal)


# ---- channel augmentation --------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("model,kw,ic,sw", [("stem", 3, 3, 2), ("lenet", 5, 1, 1)])
def test_channel_augmentation(graphs, model, kw, ic, sw, target):
    g, shape = graphs[model]
    t = TARGETS[target]()
    on = _compile(g, t, fuse=False)
    off = _compile(g, t, fuse=False, channel_augmentation=False)
    first = _op(g, "conv2d-fix")
    ins = _layer_ins(on, first)
    img = [x for x in ins if x.op == "LOAD" and x.fields["reg_id"] != codegen.REG_CONST]
    if model == "stem" and target == "PP2_CP4_D512":
        # 9 bytes per item on 4-byte lines: 3 lines per item for a third of the items, and the CONV cycles stay
        # 3 x 1 x 3 = 3 x 3 x 1; the cycle model says it does not pay, so the layer is unchanged
        assert all(x.fields["channel"] == ic for x in img)
        assert _cycles(on) == _cycles(off)
        _check_exact(g, shape, on, t)
        return
    # every image LOAD of the layer: items of kw pixels (kw*IC bytes) stepping sw pixels; padding by the masks
    assert img and all(x.fields["channel"] == kw * ic and x.fields["jump_read"] == sw * ic for x in img)
    assert any(x.fields["pad_start"] > 0 for x in img) and any(x.fields["pad_idx"] > 1 or x.fields["pad_end"] > 0
                                                               for x in img)
    convinit = [x for x in ins if x.op == "CONVINIT"]
    assert all(x.fields["kernel_w"] == 1 and x.fields["stride_w"] == 1 for x in convinit)
    conv = [x for x in ins if x.op == "CONV"]
    cg = -(-kw * ic // t.cp)
    assert all(x.fields["channel_group"] == cg and x.fields["channel_offset"] == cg * t.cp - kw * ic for x in conv)
    # the input image has slack before it for the masked bytes left of the first column
    assert on.inputs[0].ddr_addr >= codegen.DDR_ALIGN
    # the old path: no augmented LOAD, the full kernel in CONVINIT
    assert all(x.fields["kernel_w"] == kw for x in off.instructions if x.op == "CONVINIT"
               and x is [y for y in off.instructions if y.op == "CONVINIT"][0])
    _check_exact(g, shape, on, t)
    assert _cycles(on) < _cycles(off)


# ---- producer + only consumer on chip ----------------------------------------------------------------------------
@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("model,pairs", [
    ("lenet", [("conv2d-fix", 0, "pool-fix", 0), ("conv2d-fix", 1, "pool-fix", 1)]),
    ("pillars", [("conv2d-fix", 0, "pool-fix", 0)]),
    ("dw_pool", [("conv2d-fix", 0, "depthwise-conv2d-fix", 0)]),
    ("alu_alu", [("depthwise-conv2d-fix", 0, "pool-fix", 0)])])
def test_fusion(graphs, model, pairs, target):
    g, shape = graphs[model]
    t = TARGETS[target]()
    on = _compile(g, t, channel_augmentation=False)
    off = _compile(g, t, channel_augmentation=False, fuse=False)
    stored = {im.op_name for im in on.outputs + on.internal}
    if model == "alu_alu" and t.alu_pp < 2:
        # one row per ALU cannot fill two rows per bank slot (stride_out 2) without stride_offset_out: refused
        assert stored == {im.op_name for im in off.outputs + off.internal}
        _check_exact(g, shape, on, t)
        return
    for pt, pk, qt, qk in pairs:
        p, q = _op(g, pt, pk), _op(g, qt, qk)
        # one superlayer holds both ops; the intermediate has no DDR image and no SAVE writes it
        assert any(p in ly.ops and q in ly.ops for ly in on.layers), (p, q, [ly.ops for ly in on.layers])
        assert p not in stored
        assert p in {im.op_name for im in off.outputs + off.internal}
    assert _saved_bytes(on) == _image_bytes(on) < _saved_bytes(off)
    _check_exact(g, shape, on, t)
    assert _cycles(on) < _cycles(off)


def test_fused_stride2_consumer_uses_stride_out_2(graphs):
    """A 2x2/2 pool fused after a conv: the CONVs write two rows per bank (stride_out 2, jump_write_endl = the
    pool's sub-row distance), the layout the pool reads with stride_h 2 (spec §2.4)."""
    g, _ = graphs["lenet"]
    t = TARGETS["B4096"]()
    prog = _compile(g, t, channel_augmentation=False)
    p = _op(g, "conv2d-fix", 1)
    lay = next(ly for ly in prog.layers if p in ly.ops)
    ins = _layer_ins(prog, lay.ops[0])
    ci = [x for x in ins if x.op == "CONVINIT"]
    ai = [x for x in ins if x.op == "ALUINIT"]
    assert ci and all(x.fields["stride_out"] == 2 for x in ci)
    assert ai and all(x.fields["stride_h"] == 2 and x.fields["jump_read_endl"] == ci[0].fields["jump_write_endl"]
                      for x in ai)


def test_both_on_all_models_exact_and_faster(graphs):
    """Both optimisations together on every model (B512): exact, race-free, and faster than neither."""
    t = TARGETS["B512"]()
    for name, (g, shape) in graphs.items():
        if name == "strips":                     # neither applies there (no few-channel conv, no ALU consumer)
            continue
        on, off = _compile(g, t), _compile(g, t, channel_augmentation=False, fuse=False)
        _check_exact(g, shape, on, t)
        assert _cycles(on) < _cycles(off), name


def test_switched_off_is_the_old_program(graphs):
    """With both switches off no LOAD is augmented, no intermediate stays on chip and no CONV writes stride_out 2."""
    g, _ = graphs["lenet"]
    t = TARGETS["B4096"]()
    prog = _compile(g, t, channel_augmentation=False, fuse=False)
    ops = [n for n in g.toposort() if g.ops[n].type in ("conv2d-fix", "pool-fix")]
    assert all(len([o for o in ly.ops if o in ops]) <= 1 for ly in prog.layers)
    assert all(x.fields["stride_out"] == 1 for x in prog.instructions if x.op in ("CONVINIT", "ALUINIT"))
    assert all(x.fields["pad_start"] == 0 and x.fields["pad_end"] == 0 for x in prog.instructions if x.op == "LOAD")


def test_generate_decides_by_the_one_cycle_model(graphs):
    """`generate` called directly decides by the cycle model `compile()` uses (sim.timing, plans.timing_cycles):
    the default gives the program of an explicit `cycles=timing_cycles` and the program `compile()` makes of the
    same graph; and every per-layer choice (LayerPlan) took a form with the fewest cycles of the forms it timed."""
    from opendpu.compiler.pipeline import compile as compile_graph, timing_cycles
    t = TARGETS["B4096"]()
    n_plans = 0
    for name, (g, _) in graphs.items():
        default = _compile(g, t)
        explicit = _compile(g, t, cycles=timing_cycles)
        assert default.mc_code == explicit.mc_code, name
        (via_compile,) = compile_graph(g, t, name="m").programs.values()
        assert via_compile.mc_code == default.mc_code, name
        for d in default.stats["decisions"]:
            tried = [v for v in d["cycles"].values() if v is not None]
            assert d["cycles"][d["chosen"]] is not None and d["cycles"][d["chosen"]] == min(tried), (name, d)
            n_plans += 1
    assert n_plans >= 5


def test_fusion_refused_when_the_intermediate_has_two_consumers():
    """A conv read by a pool and by another conv stays in DDR (stored once, both consumers read it back)."""
    net = _Net((1, 3, 12, 12)).conv(8, 3, 1, 1).op("Relu")
    mid = net.last
    pool = net.op("MaxPool", kernel_shape=[2, 2], strides=[2, 2]).last
    side = net.conv(8, 1, 2, src=mid).last
    net.op("Add", side, src=pool)
    m = net.model()
    x = np.random.default_rng(1).normal(0, 1, (6, 3, 12, 12)).astype(np.float32)
    g = Graph.deserialize(quantize(m, x, config=QuantConfig(method="maxmin")).xmodel().serialize())
    t = TARGETS["B512"]()
    prog = _compile(g, t)
    conv, pool = _op(g, "conv2d-fix"), _op(g, "pool-fix")
    assert not any(conv in ly.ops and pool in ly.ops for ly in prog.layers)
    _check_exact(g, (1, 12, 12, 3), prog, t)


# ---- tokens on the conflicting instruction, software-pipelined strips, cross-layer prefetch ----------------------
def _signallers(prog) -> list[tuple[int, int, int]]:
    """(waiter, engine waited on, signaller) of every cross-engine wait: the k-th wait on (P, C) pairs with the
    k-th signal (spec §5.2)."""
    sig: dict[tuple[int, int], list[int]] = {}
    used: dict[tuple[int, int], int] = {}
    out = []
    for i, x in enumerate(prog.instructions):
        C = int(x.engine)
        for P in range(4):
            if P != C and x.dpdon >> P & 1:
                k = used.get((P, C), 0)
                used[(P, C)] = k + 1
                out.append((i, P, sig[(P, C)][k]))
        for Q in range(4):
            if Q != C and x.dpdby >> Q & 1:
                sig.setdefault((C, Q), []).append(i)
    return out


def _first_index(prog, op_name, pred) -> int:
    k = next(i for i, ly in enumerate(prog.layers) if op_name in ly.ops)
    return next(i for i, (x, ly) in enumerate(zip(prog.instructions, prog.layer_of)) if ly == k and pred(x))


@pytest.mark.parametrize("target", ["B512", "B1152", "PP2_CP4_D512"])
def test_pipelined_strips(graphs, target):
    """Strip k+1's LOADs come before strip k's SAVEs in program order (between the layer's first CONV and its first
    SAVE there are image LOADs); the plain order has none there. Exact, race-free and faster."""
    g, shape = graphs["strips"]
    t = TARGETS[target]()
    on, off = _compile(g, t), _compile(g, t, pipeline=False)
    conv = _op(g, "conv2d-fix", 0)

    def loads_before_first_save(prog):
        a = _first_index(prog, conv, lambda x: x.op == "CONV")
        b = _first_index(prog, conv, lambda x: x.op == "SAVE")
        return [x for x in prog.instructions[a:b] if x.op == "LOAD" and x.fields["reg_id"] != codegen.REG_CONST]

    assert loads_before_first_save(on) and not loads_before_first_save(off)
    _check_exact(g, shape, on, t)
    assert _cycles(on) < _cycles(off)


@pytest.mark.parametrize("target", ["B512", "B4096", "PP2_CP4_D512"])
def test_pipelined_fused_strips(graphs, target):
    """A fused conv + pool (pillars): with `pipeline` the next strip's image LOADs also sit between the producer's
    CONVs of the current strip, and the pool's SAVEs come one block late (never right after their own ALU); the
    plain fused order has neither. Exact, race-free, faster. (On B512 / B4096 a wider PFN than `_pillars`, for
    several strips.)"""
    if target == "PP2_CP4_D512":
        g, shape = graphs["pillars"]
    else:
        g, shape = _quantized(_Net((1, 9, 120, 32)).conv(64, 1).op("Relu").op("MaxPool", kernel_shape=[1, 32],
                                                                                strides=[1, 32]))
    t = TARGETS[target]()
    on, off = _compile(g, t), _compile(g, t, pipeline=False)

    def pattern(prog):
        ins = prog.instructions
        load_in_conv_run = any(ins[i].op == "LOAD" and ins[i].fields["reg_id"] != codegen.REG_CONST
                               and ins[i - 1].op == "CONV" and ins[i + 1].op == "CONV" for i in range(1, len(ins) - 1))
        save_after_alu = any(ins[i].op == "ALU" and ins[i + 1].op == "SAVE" for i in range(len(ins) - 1))
        return load_in_conv_run, save_after_alu

    assert pattern(off) == (False, True)
    assert pattern(on)[0] and _cycles(on) < _cycles(off)
    _check_exact(g, shape, on, t)


@pytest.mark.parametrize("target", ["B512", "B4096", "PP2_CP4_D512"])
def test_exact_tokens(graphs, target):
    """A SAVE waits on the CONV that produced its rows, which is not the CONV engine's latest instruction before it
    (the engine-latest rule never does that); exact, race-free and faster than with exact_tokens off."""
    g, shape = graphs["strips"]
    t = TARGETS[target]()
    on, off = _compile(g, t), _compile(g, t, exact_tokens=False)

    def early_signals(prog):
        ins = prog.instructions
        conv = int(Engine.CONV)
        n = 0
        for i, P, x in _signallers(prog):
            if ins[i].op == "SAVE" and P == conv:
                latest = max(j for j in range(i) if ins[j].op in ("CONV", "CONVINIT"))
                n += x < latest
        return n

    assert early_signals(on) > 0 and early_signals(off) == 0
    _check_exact(g, shape, on, t)
    assert _cycles(on) < _cycles(off)


def test_prefetch_layers(graphs):
    """B4096: a layer's bias / weight LOADs move into the previous layer's tail (before its last CONV), never above
    an instruction they conflict with; exact, race-free, faster than without; off, every layer starts after the
    previous one's last instruction."""
    g, shape = graphs["strips"]
    t = TARGETS["B4096"]()
    on, off = _compile(g, t), _compile(g, t, prefetch_layers=False)

    def early(prog):
        last_conv: dict[int, int] = {}
        for i, (x, ly) in enumerate(zip(prog.instructions, prog.layer_of)):
            if x.op == "CONV":
                last_conv[ly] = i
        return [i for i, (x, ly) in enumerate(zip(prog.instructions, prog.layer_of))
                if x.op == "LOAD" and x.fields["reg_id"] == codegen.REG_CONST and ly - 1 in last_conv
                and i < last_conv[ly - 1]]

    assert early(on) and not early(off)
    assert all(b >= a for a, b in zip(off.layer_of, off.layer_of[1:]))
    _check_exact(g, shape, on, t)
    assert _cycles(on) < _cycles(off)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_schedule_options_all_models(graphs, target):
    """Every model with the three scheduling options on: exact and race-free, never slower than with all three off.
    Where both programs made the same per-layer choices they have the same layers, tiles and instructions, in
    another order with other tokens; the choices may differ, since each is timed on the cycle model with the
    scheduling switches of its own program (on PP2_CP4_D512 the stem's fused pair puts its output in VB1 with them,
    in VB0 without)."""
    same = 0
    for name, (g, shape) in graphs.items():
        t = TARGETS[target]()
        on = _compile(g, t)
        off = _compile(g, t, exact_tokens=False, pipeline=False, prefetch_layers=False)
        if [d["chosen"] for d in on.stats["decisions"]] == [d["chosen"] for d in off.stats["decisions"]]:
            assert len(on.instructions) == len(off.instructions), name
            same += 1
        _check_exact(g, shape, on, t)
        assert _cycles(on) <= _cycles(off), name
    assert same >= len(graphs) // 2


def _conv_pair():
    """A 3x3 conv (pads 1) whose only consumer is a 1x1 conv with no ALU consumer of its own."""
    return _Net((1, 8, 40, 40)).conv(16, 3, 1, 1).op("Relu").conv(8, 1).op("Relu")


@pytest.fixture(scope="module")
def conv_pair():
    return _quantized(_conv_pair())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fused_conv_pair(conv_pair, target):
    """fuse_conv (on by default): the two convs are one layer, the intermediate is never SAVEd (the 1x1 conv
    reads the 3x3 conv's rows in VB1), exact, race-free and faster than with fuse_conv off (the schedule
    decides, plans.layer_cost)."""
    g, shape = conv_pair
    t = TARGETS[target]()
    on, off = _compile(g, t), _compile(g, t, fuse_conv=False)
    a, b = _op(g, "conv2d-fix", 0), _op(g, "conv2d-fix", 1)
    assert any(a in ly.ops and b in ly.ops for ly in on.layers)
    assert not any(a in ly.ops and b in ly.ops for ly in off.layers)
    assert _saved_bytes(on) < _saved_bytes(off)
    _check_exact(g, shape, on, t)
    assert _cycles(on) < _cycles(off)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fused_stride2_consumer_with_odd_top_padding(graphs, target):
    """A 3x3/2 pool with top padding 1 fused after a 1x1 conv: the conv's first output row is virtual row 1 of the
    pool's window (sub-row 1 of slot 0); it is written by a one-row CONV (valid_pixel_parallel 1) whose
    bank_addr_out holds the sub-row offset, so stride_offset_out stays 0 everywhere. Exact, race-free, and the
    intermediate is never stored. (fuse_conv off: on PP2 the conv is otherwise fused with its CONV producer, a
    whole-program choice; this test is about the ALU pair.)"""
    g, shape = graphs["dw_pool"]
    t = TARGETS[target]()
    on, off = (_compile(g, t, channel_augmentation=False, fuse_conv=False),
               _compile(g, t, channel_augmentation=False, fuse=False, fuse_conv=False))
    p, q = _op(g, "conv2d-fix", 1), _op(g, "pool-fix", 1)
    assert any(p in ly.ops and q in ly.ops for ly in on.layers)
    assert p not in {im.op_name for im in on.outputs + on.internal}
    ins = _layer_ins(on, p)
    inits = [x for x in ins if x.op == "CONVINIT"]
    assert any(x.fields["stride_out"] == 2 and x.fields["valid_pixel_parallel"] == 1 for x in inits)
    assert all(x.fields["stride_offset_out"] == 0 for x in on.instructions if x.op in ("CONVINIT", "ALUINIT"))
    _check_exact(g, shape, on, t)
    assert _cycles(on) < _cycles(off)


def _spp():
    """YOLOX's SPP in small: a 1x1 conv read by 5x5, 9x9 and 13x13 stride-1 max pools (pads 2, 4, 6) and concat."""
    net = _Net((1, 8, 14, 13)).conv(16, 1).op("Relu")
    x = net.last
    pools = [net.op("MaxPool", kernel_shape=[k, k], strides=[1, 1], pads=[k // 2] * 4, src=x).last for k in (5, 9, 13)]
    net.op("Concat", *pools, src=x, axis=1)
    net.shapes[net.last] = (1, 64, 14, 13)
    return net


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_pool_cascade(target):
    """pool_cascade: the 9x9 and 13x13 max pools run as 2 and 3 stages of 5x5 (25 kernel positions per stage instead
    of 81 / 169; the windows compose and the padding is reached exactly when the big window reaches it), the 5x5
    pool stays one ALU layer; exact on random inputs (padding at every edge), race-free, fewer cycles than with the
    option off."""
    g, shape = _quantized(_spp())
    t = TARGETS[target]()
    on = _compile(g, t)
    kernels = sorted({x.fields["kernel_h"] for x in on.instructions if x.op == "ALUINIT"})
    assert kernels == [5]
    _check_exact(g, shape, on, t)
    if target == "PP2_CP4_D512":
        # without the cascade the 13x13 window spans more than 4 passes over 2 banks (spec §6.4): no valid program
        return
    off = _compile(g, t, pool_cascade=False)
    assert sorted({x.fields["kernel_h"] for x in off.instructions if x.op == "ALUINIT"}) == [5, 9, 13]
    assert on.stats["workspace_bytes"] > off.stats["workspace_bytes"]           # the stage temporaries
    assert on.workload == off.workload                                          # the ops' own MACs
    assert _cycles(on) < _cycles(off)


# ---- a conv and its ELEW consumer (fuse_elew) ------------------------------------------------------------------
def _residual():
    """A residual block: 3x3 conv (pads 1) + ReLU = a; 1x1 conv of a = b; ReLU(b + a). The 1x1 conv's only reader
    is the add, whose other input is computed before it: the pair `_conv_elew` takes. 24 rows x 40 columns of 24
    channels: several strips on the small targets."""
    n = _Net((1, 16, 24, 40)).conv(24, 3, 1, 1).op("Relu")
    a = n.last
    return n.conv(24, 1).op("Add", a).op("Relu")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_conv_and_its_add_fused(target):
    """fuse_elew (with `fuse`): the 1x1 conv and the add are one layer, the conv's rows are never SAVEd (fewer
    SAVE bytes, the add reads them in VB1), the program equals the reference byte for byte on every output and
    stored tensor, has no race, and takes fewer cycles on the cycle model than with fusion off."""
    g, shape = _quantized(_residual())
    t = TARGETS[target]()
    on, off = _compile(g, t), _compile(g, t, fuse=False)
    b, add = _op(g, "conv2d-fix", 1), _op(g, "eltwise-fix")
    assert any(b in ly.ops and add in ly.ops for ly in on.layers)
    assert not any(b in ly.ops and add in ly.ops for ly in off.layers)
    ins = _layer_ins(on, b)
    assert {x.op for x in ins} >= {"CONV", "ELEW", "SAVE"}
    assert _saved_bytes(on) < _saved_bytes(off)
    _check_exact(g, shape, on, t)
    assert _cycles(on) < _cycles(off)


# ---- weight groups: double buffering and the kept input --------------------------------------------------------
def _wide():
    """A small map with many weights: 3x3 conv 64 -> 256 channels on 6x6 (pads 1), the weights of every output
    channel need several CONVW groups on B512 and PP2_CP4_D512, and the layer is bound by their LOADs."""
    return _Net((1, 64, 6, 6)).conv(256, 3, 1, 1).op("Relu")


@pytest.mark.parametrize("target,one_strip", [("B512", True), ("PP2_CP4_D512", False)])
def test_double_buffered_weights_and_kept_input(target, one_strip, monkeypatch):
    """Forced either way (codegen.conv.choose_half), both programs equal the reference and are race-free; the double-
    buffered one puts the next group's weight LOADs among a group's CONVs (after its last input LOAD; single
    buffering opens each group with them) and takes fewer cycles. Where the
    input is one strip (B512) it is LOADed once for all groups (its bytes once, not once per group); on
    PP2_CP4_D512 (512-line banks) it takes several strips, LOADed again per group."""
    from opendpu.runtime.costmodel import cycle_model
    g, shape = _quantized(_wide())
    t = TARGETS[target]()
    progs = {}
    for half in (False, True):
        monkeypatch.setattr(codegen_conv, "choose_half", lambda c, job, half=half: half)
        progs[half] = _compile(g, t, cycles=cycle_model)
        _check_exact(g, shape, progs[half], t)
    conv = _op(g, "conv2d-fix")
    convw = range(t.convw_base, t.convw_base + t.cp)

    def weight_runs_after_a_conv(p) -> tuple[int, int]:
        """(runs of weight LOADs that follow a CONV of the group before them, all runs)"""
        ops = [("W" if x.op == "LOAD" and x.fields["bank_id"] in convw else x.op) for x in _layer_ins(p, conv)]
        starts = [i for i in range(1, len(ops)) if ops[i] == "W" and ops[i - 1] != "W"]
        return sum(ops[i - 1] == "CONV" for i in starts), len(starts)
    after, runs = weight_runs_after_a_conv(progs[True])
    assert runs > 2 and after >= 2                       # several groups; the next group's weights among the CONVs
    assert weight_runs_after_a_conv(progs[False])[0] == 0   # single buffering: a group's weights open the group
    assert _cycles(progs[True]) < _cycles(progs[False])
    img = range(0, t.img_bg * t.pp)
    for p in progs.values():
        loaded = sum(x.fields["length"] * x.fields["channel"] for x in _layer_ins(p, conv)
                     if x.op == "LOAD" and x.fields["bank_id"] in img)
        assert (loaded == 6 * 6 * 64) == one_strip


# ---- the wide weight path (Timing.weight_load_lines = 2) --------------------------------------------------------
@pytest.mark.parametrize("target", ["B512", "B4096", "PP2_CP4_D512"])
def test_wide_weight_path(graphs, target):
    """With two weight lines per cycle (the board profiles), programs stay exact and race-free; the small-IC
    weights (IC <= 64, whole lines) are LOADed as long items, which the wide path takes at two lines per cycle
    (an augmentation-shaped item of IC <= 64 bytes would keep one line); the program is faster than the same
    graph compiled and timed with one line per cycle."""
    from opendpu.runtime.costmodel import cycle_model
    g, shape = graphs["strips"]
    t1 = TARGETS[target]()
    t2 = t1.with_timing(weight_load_lines=2)
    p1, p2 = _compile(g, t1, cycles=cycle_model), _compile(g, t2, cycles=cycle_model)
    _check_exact(g, shape, p2, t2)
    convw = range(t2.convw_base, t2.convw_base + t2.cp)
    wl = [x.fields for x in p2.instructions if x.op == "LOAD" and x.fields["bank_id"] in convw]
    wide = [f for f in wl if t2.load_lines_per_cycle(f["bank_id"], f["channel"], f["jump_read"], f["broadcast"]) == 2]
    # the 16- and 32-channel convs' weights of one CONVW bank are one long item (on the wide path), or one item of
    # at most 64 bytes where that is all the bank gets (the 1x1 16 -> 16 conv); the one-line program LOADs items of
    # IC bytes
    assert len(wide) >= len(wl) // 2
    assert all(f["length"] == 1 and f["channel"] > 64 for f in wide)
    assert all(f["length"] == 1 and f["channel"] <= 64 for f in wl if f not in wide)
    assert any(x.fields["channel"] in (16, 32) for x in p1.instructions
               if x.op == "LOAD" and x.fields["bank_id"] in convw)
    assert _cycles(p2) < _cycles(p1)
    assert int(simulate(p2.instructions, t1).total_cycles) > _cycles(p2)     # the same program, one line per cycle
