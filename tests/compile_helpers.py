"""Helpers for tests/test_compiled_programs.py and benchmarks/bench_compile.py: quantize a model (the digits CNN or
a zoo topology) and compile it through the library flow (runtime.flow: the steps `opendpu build` chains), run each
DPU program on the cycle model in schedule start order under chosen timing parameters, and compare what it leaves
in DDR with the golden reference (`GraphRunner(graph, backend="ref")` on the canonical graph the programs were
compiled from).

Nothing here is cached on disk; `quantized` and `compiled` keep their results for the life of the process.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np

from opendpu.compiler.pipeline import compile as compile_graph  # noqa: F401 - test_downsample's direct compiles
from opendpu.compiler.program import DdrImage, DpuProgram
from opendpu.compiler.xir.graph import Graph
from opendpu.isa.deps import engine_of, find_races
from opendpu.isa.footprint import program_footprints
from opendpu.isa.program import Instruction, to_arrays
from opendpu.isa.target import PRESETS, TIMING_BOUNDS, Target, get_target
from opendpu.quant import zoo
from opendpu.quant.quantize import QuantConfig
from opendpu.runtime.flow import compile_step, quantize_step, quantized_graph
from opendpu.runtime.runner import GraphRunner
from opendpu.sim.executor import DpuMachine
from opendpu.sim.timing import simulate

# ---- targets ---------------------------------------------------------------------------------------------------
PARAMETRIC = {"PP2": (2, 4, 512), "PP8": (8, 32, 4096)}          # (pp, cp, bank_depth)


def target(key: str) -> Target:
    """A preset (full or short name, e.g. "B512") or one of the two parametric targets "PP2" (PP2/CP4, 512 lines)
    and "PP8" (PP8/CP32, 4096 lines), which have no fingerprint. A "_BOARD" suffix adds the boards' calibrated DPU
    timing (isa/boards.py DPU_TIMING: DDR and CONV latency, the wide weight path)."""
    if key.endswith("_BOARD"):
        from opendpu.isa.boards import DPU_TIMING
        return target(key[:-len("_BOARD")]).with_timing(**DPU_TIMING)
    if key in PARAMETRIC:
        pp, cp, depth = PARAMETRIC[key]
        return Target.parametric(pp, cp, bank_depth=depth)
    if key.startswith("PP"):                                   # any parametric array by name, PP8_CP32_D4096
        return Target.from_name(key)
    return get_target(key if key in PRESETS else f"DPUCZDX8G_ISA1_{key}")


PRESET_KEYS = tuple(n.rsplit("_", 1)[1] for n in PRESETS)          # B512 ... B4096
ALL_TARGET_KEYS = PRESET_KEYS + tuple(PARAMETRIC)


# ---- models ----------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def quantized(name: str, size: int | None = None) -> Graph:
    """The quantized xmodel graph of the digits CNN ("digits": calibrated on 40 load_digits training images), of
    `reorg_model` ("reorg", 8 random normal images) or of zoo topology `name` at input `size` (4 random normal
    calibration images); maxmin calibration."""
    if name == "digits":
        model, calib = zoo.DIGITS_ONNX, zoo.digits_data()[0][:40]
    elif name == "reorg":
        model = reorg_model()
        calib = np.random.default_rng(0).normal(0, 1, (8, 4, 12, 16)).astype(np.float32)
    else:
        s = zoo.DEFAULT_SIZE[name] if size is None else size
        h, w = s if isinstance(s, tuple) else (s, s)
        model = zoo.build(name, s)
        calib = np.random.default_rng(0).normal(0, 1, (4, 3, h, w)).astype(np.float32)
    return quantized_graph(quantize_step(model, calib, config=QuantConfig(method="maxmin")))


def reorg_model():
    """A 1x4x12x16 float ONNX graph around both reorgs (tile-fix): conv 3x3 -> SpaceToDepth(2), concatenated with
    a 2x2 max pool of the same map (YOLOv2's passthrough), conv 1x1 to 12 channels -> DepthToSpace(2, DCR) ->
    conv 3x3; weights from a fixed seed."""
    import onnx
    from onnx import TensorProto, helper as oh, numpy_helper
    r = np.random.default_rng(5)
    inits = {"w1": r.normal(0, .3, (8, 4, 3, 3)), "b1": r.normal(0, .1, 8), "w2": r.normal(0, .2, (12, 40, 1, 1)),
             "w3": r.normal(0, .3, (5, 3, 3, 3)), "b3": r.normal(0, .1, 5)}
    N = oh.make_node
    nodes = [N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             N("Relu", ["c1"], ["r1"], name="relu1"),
             N("SpaceToDepth", ["r1"], ["s2d"], blocksize=2, name="reorg"),
             N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
             N("Concat", ["s2d", "p1"], ["cat"], axis=1, name="route"),
             N("Conv", ["cat", "w2"], ["c2"], name="conv2"),
             N("DepthToSpace", ["c2"], ["d2s"], blocksize=2, mode="DCR", name="shuffle"),
             N("Conv", ["d2s", "w3", "b3"], ["y"], pads=[1, 1, 1, 1], name="conv3")]
    g = oh.make_graph(nodes, "reorg", [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 12, 16])],
                      [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 12, 16])],
                      [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


@dataclass
class Compiled:
    """A compiled model: the canonical graph the programs come from, one DpuProgram per DPU subgraph (in
    partition order) and the compiled xmodel."""

    graph: Graph
    target: Target
    programs: dict[str, DpuProgram]
    xmodel: Graph
    seconds: float = 0.0


def compile_model(g: Graph, t: Target, name: str = "net") -> Compiled:
    """Compile through the flow's compile step (`pipeline.compile`'s pass list: canonicalize, partition, codegen,
    emit; deciding by the one cycle model, as `opendpu compile`)."""
    import time
    t0 = time.perf_counter()
    res = compile_step(g, t, name=name)
    return Compiled(res.org, t, dict(res.programs), res.graph, time.perf_counter() - t0)


@functools.lru_cache(maxsize=None)
def compiled(name: str, size: int | None, target_key: str) -> Compiled:
    return compile_model(quantized(name, size), target(target_key), name)


def graph_inputs(g: Graph, seed: int = 0) -> list[np.ndarray]:
    """Random int8 fixed-point values for every graph input (NHWC, in GraphRunner input order)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(-128, 128, s.dims, dtype=np.int8) for s in GraphRunner(g, backend="ref").get_inputs()]


def digits_inputs(g: Graph, k: int = 0) -> list[np.ndarray]:
    """Test image k of load_digits as the int8 input of the quantized digits CNN (NHWC, its fix point)."""
    r = GraphRunner(g, backend="ref")
    spec = r.get_inputs()[0]
    x = zoo.digits_data()[2][k:k + 1]
    return [r.prepare_input(spec, x, layout="nchw")]


def reference(g: Graph, inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Every op's value (by op name) on the golden reference runner."""
    return GraphRunner(g, backend="ref").run(inputs, keep_values=True).values


# ---- one program on the cycle model ----------------------------------------------------------------------------
def image(ddr: np.ndarray, img: DdrImage) -> np.ndarray:
    """The tensor `img` as a strided view of its register's bytes."""
    return np.lib.stride_tricks.as_strided(ddr[img.ddr_addr:], shape=img.dims, strides=img.strides)


def initial_ddr(prog: DpuProgram, values: dict[str, np.ndarray]) -> dict[int, np.ndarray]:
    """reg -> int8 bytes before the run: the parameter blob in CONST, each input tensor's image (value from
    `values`, the reference), zeros elsewhere."""
    init = {r: np.zeros(s, np.int8) for r, s in prog.registers.sizes.items()}
    for r, blob in prog.registers.params.items():
        init[r][:len(blob)] = np.frombuffer(blob, np.int8)
    for im in prog.inputs:
        image(init[im.reg_id], im)[...] = np.asarray(values[im.op_name]).reshape(im.dims)
    return init


def run(prog: DpuProgram, init: dict[int, np.ndarray], t: Target | None = None, instrs=None,
        fill: str = "random", seed: int = 0):
    """Run `instrs` (default: the program's) on a DpuMachine of target `t` (default: the program's, with its
    timing) in the cycle model's start order. Returns (machine, schedule)."""
    t = t or prog.target
    m = DpuMachine(t, dict(prog.registers.sizes), init_fill=fill, seed=seed)
    for r, d in init.items():
        m.write_ddr(r, 0, d)
    sched = simulate(to_arrays(list(instrs if instrs is not None else prog.instructions)), t, machine=m)
    return m, sched


def mismatches(prog: DpuProgram, m: DpuMachine, values: dict[str, np.ndarray]) -> dict[str, int]:
    """op name -> number of differing bytes, for every output and workspace tensor that differs from `values`."""
    out = {}
    for im in prog.outputs + prog.internal:
        want = np.asarray(values[im.op_name]).reshape(im.dims)
        bad = int((image(m.ddr(im.reg_id), im) != want).sum())
        if bad:
            out[im.op_name] = bad
    return out


def ddr_state(prog: DpuProgram, m: DpuMachine) -> dict[int, bytes]:
    """Every DDR register's final bytes (outputs, workspace and anything written outside them)."""
    return {r: m.ddr(r).tobytes() for r in prog.registers.sizes}


# ---- timing parameters ------------------------------------------------------------------------------------------
# Ranges drawn from (all inside isa.target.TIMING_BOUNDS); the extremes let one engine run far ahead of another.
TIMING_RANGES = {
    "fetch_latency": (0, 200), "fetch_fifo_words": (6, 256), "queue_depth": (1, 32), "ddr_latency": (0, 600),
    "ddr_bytes_per_cycle": (1, 128), "ddr_ports": (1, 4), "load_setup": (0, 64), "save_setup": (0, 64),
    "conv_latency": (0, 400), "alu_latency": (0, 400), "elew_latency": (0, 400), "init_cycles": (1, 16),
    "end_cycles": (1, 16),
}
assert all(TIMING_BOUNDS[k][0] <= lo <= hi <= TIMING_BOUNDS[k][1] for k, (lo, hi) in TIMING_RANGES.items())


def random_timing(rng: np.random.Generator) -> dict[str, int]:
    """One random timing parameter set: each parameter log-uniform over its range (or its lower end / upper end
    with probability 1/8 each), so that small and large latencies both occur."""
    out = {}
    for k, (lo, hi) in TIMING_RANGES.items():
        u = rng.random()
        if u < 0.125:
            v = lo
        elif u < 0.25:
            v = hi
        else:
            v = int(round(np.exp(rng.uniform(np.log(lo + 1), np.log(hi + 1))) - 1))
        out[k] = min(max(v, lo), hi)
    return out


def timed_targets(t: Target, n: int, seed: int) -> list[Target]:
    rng = np.random.default_rng(seed)
    return [t.with_timing(**random_timing(rng)) for _ in range(n)]


# ---- races and mutants ------------------------------------------------------------------------------------------
def races(instrs, t: Target, line_chunk: int = 1, ddr_chunk: int = 64, limit: int = 100):
    """isa.deps.find_races over the program's footprints. The default DDR granularity is 64-byte chunks (bank
    lines exact): coarser keys only add conflicts, so 0 races here means 0 at byte granularity too, and byte keys
    over megabytes of weights are slow."""
    instrs = list(instrs)
    return find_races(instrs, program_footprints(instrs, t), t, line_chunk=line_chunk, ddr_chunk=ddr_chunk,
                      limit=limit)


MUTANT_KINDS = ("balanced", "wait", "signal")


@dataclass
class Mutant:
    """A program with one cross-engine dependency token (signalled by instruction `signaller` of engine `producer`,
    awaited by instruction `waiter`) removed: kind "balanced" clears the waiter's dpdon bit and the signaller's
    matching dpdby bit (waits and signals still balance), "wait" only the dpdon bit (a signal is left over, so later
    waits pair with earlier signals), "signal" only the dpdby bit (a wait is left without a signal: deadlock)."""

    kind: str
    signaller: int
    waiter: int
    producer: int
    instructions: list[Instruction] = field(repr=False, default_factory=list)


def token_pairs(instrs) -> list[tuple[int, int, int]]:
    """(signaller, waiter, producer engine) of every cross-engine token: the k-th wait on (P, C) is released by
    the k-th signal on (P, C) (spec §5.2)."""
    sig: dict[tuple[int, int], list[int]] = {}
    out = []
    pos: dict[tuple[int, int], int] = {}
    for i, ins in enumerate(instrs):
        C = int(engine_of(ins.op))
        for P in range(4):
            if P != C and ins.dpdon >> P & 1:
                q = sig.get((P, C), [])
                k = pos.get((P, C), 0)
                assert k < len(q), f"instruction {i} waits on engine {P} with no earlier signal"
                pos[(P, C)] = k + 1
                out.append((q[k], i, P))
        for X in range(4):
            if X != C and ins.dpdby >> X & 1:
                sig.setdefault((C, X), []).append(i)
    return out


def mutants(instrs, n: int, seed: int, kind: str = "balanced") -> list[Mutant]:
    """Up to `n` mutants of `kind` (MUTANT_KINDS), each missing ONE token, for distinct tokens picked at random
    (every token when the program has at most `n`)."""
    if kind not in MUTANT_KINDS:
        raise ValueError(f"mutant kind {kind!r}: one of {MUTANT_KINDS}")
    instrs = list(instrs)
    pairs = token_pairs(instrs)
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(pairs), size=min(n, len(pairs)), replace=False)
    out = []
    for k in sorted(int(x) for x in pick):
        s, w, P = pairs[k]
        C = int(engine_of(instrs[w].op))
        ins = list(instrs)
        if kind != "signal":
            ins[w] = replace(ins[w], dpdon=ins[w].dpdon & ~(1 << P))
        if kind != "wait":
            ins[s] = replace(ins[s], dpdby=ins[s].dpdby & ~(1 << C))
        out.append(Mutant(kind, s, w, P, ins))
    return out


__all__ = ["ALL_TARGET_KEYS", "Compiled", "MUTANT_KINDS", "Mutant", "PARAMETRIC", "PRESET_KEYS", "TIMING_RANGES",
           "compile_model", "compiled", "ddr_state", "digits_inputs", "graph_inputs", "image", "initial_ddr",
           "mismatches", "mutants", "quantized", "races", "random_timing", "reference", "run", "target",
           "timed_targets", "token_pairs"]
