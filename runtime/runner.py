"""VART-shaped runners: one API, several backends.

`create_runner(subgraph, mode)` returns a `Runner` for a DPU subgraph (modes "ref", "sim", "rtl"; "run" = "sim")
or a CPU subgraph. `GraphRunner` executes a whole xmodel: USER inputs are quantized with their fix_point
and DPU rounding, DPU subgraphs run on the chosen backend, CPU subgraphs on the reference ops or on
user-registered custom ops (`runtime.register_op`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from opendpu.compiler.fixpoint import dequantize, dpu_quantize
from opendpu.compiler.xir.graph import Graph, Subgraph
from opendpu.isa.target import Target, get_target
from opendpu.runtime.dpu import DpuSubgraph, RuntimeErrorDPU, TensorSpec, tensor_spec
from opendpu.runtime.ops import evaluate_op, output_of

if TYPE_CHECKING:                  # the simulator is imported where a run needs it
    from opendpu.sim.executor import DpuMachine
    from opendpu.sim.timing import Schedule

MODES = ("ref", "sim", "rtl")
_job_ids = itertools.count(1)


def dpu_round_quantize(x: np.ndarray, fix_point: int) -> np.ndarray:
    """float -> int8 with the DPU's rounding (half up, saturating), spec §6.1 / §7.1: compiler.fixpoint."""
    return dpu_quantize(x, fix_point)


class Runner:
    """Runner for one subgraph. Inputs/outputs are C-contiguous numpy arrays in tensor order."""

    def __init__(self, subgraph: Subgraph, mode: str = "sim", target: "Target | str | None" = None,
                 graph: Graph | None = None, seed: int = 0, timing: dict | None = None):
        if mode == "run":
            mode = "sim"
        if mode not in MODES:
            raise RuntimeErrorDPU(f"unknown runner mode {mode!r}; use one of {', '.join(MODES)}")
        g = graph or getattr(subgraph, "graph", None)
        if g is None:
            raise RuntimeErrorDPU(f"subgraph {subgraph.name!r} is not attached to a graph")
        self.graph: Graph = g
        self.subgraph, self.mode, self.seed = subgraph, mode, seed
        self.device = subgraph.device
        self.stats: dict = {}
        self._jobs: dict[int, int] = {}
        self._machine: DpuMachine | None = None
        self.schedule: Schedule | None = None       # sim mode: the schedule of the last job
        self.progress = None            # rtl mode: progress(done, total, what) for the build and the run
        if self.device == "DPU":
            self.dpu: DpuSubgraph | None = DpuSubgraph(self.graph, subgraph)
            self.target: Target | None = self.dpu.target
            if target is not None:
                want = get_target(target)
                if want.fingerprint != self.dpu.fingerprint:
                    fp = "none" if want.fingerprint is None else f"0x{want.fingerprint:016X}"
                    raise RuntimeErrorDPU(
                        f"VART_GRAPH_FINGERPRINT_ERROR: subgraph {subgraph.name!r} was compiled for "
                        f"{self.dpu.target.name} (fingerprint 0x{self.dpu.fingerprint:016X}) but the runner's "
                        f"target is {want.name} (fingerprint {fp})")
                self.target = want
            if timing:
                self.target = self.target.with_timing(**timing)
            self._inputs = self.dpu.inputs
            self._outputs = self.dpu.outputs
        elif self.device == "CPU":
            self.dpu = None
            self.target = None
            self._ops = self.graph.toposort(subgraph.all_ops())
            opset = set(self._ops)
            self._inputs, self._outputs, seen = [], [], set()
            for n in self._ops:
                for p in self.graph.ops[n].input_ops():
                    if p not in opset and p not in seen:
                        seen.add(p)
                        self._inputs.append(tensor_spec(output_of(self.graph.ops[p]), p))
                cons = self.graph.consumers(n)
                if not cons or any(c not in opset for c in cons):
                    self._outputs.append(tensor_spec(output_of(self.graph.ops[n]), n))
        else:
            raise RuntimeErrorDPU(f"subgraph {subgraph.name!r} has device {self.device!r}; runners exist for "
                                  f"DPU and CPU subgraphs")

    # ---- VART API ---------------------------------------------------------------------------
    def get_input_tensors(self) -> list[TensorSpec]:
        return list(self._inputs)

    def get_output_tensors(self) -> list[TensorSpec]:
        return list(self._outputs)

    def get_tensor_format(self) -> str:
        return "NHWC"

    def execute_async(self, inputs: list[np.ndarray], outputs: list[np.ndarray] | None = None) -> int:
        """Run one job. Results go into `outputs` (pre-allocated, VART style) and `self.results`."""
        inputs = list(inputs)
        if len(inputs) != len(self._inputs):
            raise RuntimeErrorDPU(f"subgraph {self.subgraph.name!r} takes {len(self._inputs)} input tensors "
                                  f"({[t.name for t in self._inputs]}), got {len(inputs)}")
        for spec, x in zip(self._inputs, inputs):
            if not isinstance(x, np.ndarray) or not x.flags.c_contiguous:
                raise RuntimeErrorDPU(f"input {spec.name!r} must be a C-contiguous numpy array")
        res = self._run(inputs)
        if outputs is not None:
            if len(outputs) != len(res):
                raise RuntimeErrorDPU(f"expected {len(res)} output buffers, got {len(outputs)}")
            for spec, buf, r in zip(self._outputs, outputs, res):
                if tuple(buf.shape) != tuple(r.shape):
                    raise RuntimeErrorDPU(f"output buffer for {spec.name!r} has shape {list(buf.shape)}, "
                                          f"needs {list(r.shape)}")
                buf[...] = r
        self.results = res
        job = next(_job_ids)
        self._jobs[job] = 0
        return job

    def wait(self, job_id: int, timeout: int = -1) -> int:
        if job_id not in self._jobs:
            raise RuntimeErrorDPU(f"unknown job id {job_id}")
        return self._jobs.pop(job_id)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Convenience: execute_async + wait, returning the output arrays."""
        self.wait(self.execute_async(inputs))
        return self.results

    def run_layers(self, inputs: list[np.ndarray], reference: dict | None = None):
        """Run and also return per-layer int8 values by op name (and, for sim, a LayerReport)."""
        if self.dpu is None:
            return self.run(inputs), {}, None
        if self.mode == "rtl":        # the RTL exposes only the subgraph's outputs in DDR
            out = self.run(inputs)
            return out, {t.op_name: v for t, v in zip(self._outputs, out)}, None
        if self.mode == "ref":
            out, vals = self.dpu.run_ref(inputs, keep=True)
            layer_vals = {n: v for n, v in vals.items()
                          if self.graph.ops[n].type not in ("const-fix", "const")}
            return out, layer_vals, None
        from opendpu.runtime.layers import run_tracked
        if self._machine is None:
            self._machine = self.dpu.new_machine(self.seed)
        out, rep = run_tracked(self.dpu, self._machine, list(inputs), reference)
        self.stats = dict(self._machine.stats)
        vals = dict(rep.captured)
        for t, v in zip(self._outputs, out):
            vals[t.op_name] = v
        return out, vals, rep

    # ---- backends ---------------------------------------------------------------------------
    def _run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if self.dpu is not None:
            if self.mode == "sim":
                if self._machine is None:
                    self._machine = self.dpu.new_machine(self.seed)
                out = self.dpu.run_sim(inputs, machine=self._machine, target=self.target)
                self.schedule = sched = self.dpu.last_schedule
                assert sched is not None                  # run_sim keeps its schedule
                self.stats = dict(self._machine.stats, cycles=sched.total_cycles, latency_ms=sched.latency_ms,
                                  clock_mhz=sched.clock_mhz)
                return out
            if self.mode == "rtl":
                out, res = self.dpu.run_rtl(inputs, target=self.target, progress=self.progress)
                assert self.target is not None           # a DPU subgraph's runner has its target
                self.stats = dict(cycles=res.cycles, latency_ms=res.cycles / (self.target.timing.clock_mhz * 1e3),
                                  clock_mhz=self.target.timing.clock_mhz, rtl_wall_s=res.wall_seconds,
                                  counters=res.counters)
                return out
            out, _ = self.dpu.run_ref(inputs)
            return out
        vals = {s.op_name: x for s, x in zip(self._inputs, inputs)}
        for n in self._ops:
            op = self.graph.ops[n]
            vals[n] = evaluate_op(self.graph, op, [vals[p] for p in op.input_ops()])
        return [vals[s.op_name] for s in self._outputs]


def _stack(parts: list[dict]) -> dict:
    """Per-run dicts of arrays -> one dict, each array concatenated along its leading (batch) dimension."""
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]) if np.ndim(parts[0][k])
            else np.stack([np.asarray(p[k]) for p in parts]) for k in parts[0]}


def layout_name(dims) -> str:
    """The layout the DPU uses for a tensor of this rank (NHWC for images)."""
    return "NHWC" if len(dims) == 4 else f"{len(dims)}-D, as stored"


def create_runner(subgraph: Subgraph, mode: str = "sim", target=None, **kw) -> Runner:
    """VART's `Runner.create_runner(subgraph, mode)`; modes 'ref', 'sim' ('run' = 'sim')."""
    return Runner(subgraph, mode, target=target, **kw)


@dataclass
class GraphResult:
    outputs: dict[str, np.ndarray]                      # graph outputs by tensor name
    values: dict[str, np.ndarray] = field(default_factory=dict)   # every computed op output by op name
    dpu_outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # per DPU subgraph
    layers: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)  # DPU subgraph -> op -> value


class GraphRunner:
    """Executes a whole xmodel in subgraph topological order (VART's graph runner)."""

    def __init__(self, graph: Graph, backend: str = "sim", target=None, seed: int = 0, timing: dict | None = None):
        self.graph, self.backend = graph, backend
        self.runners: dict[str, Runner] = {}
        self.flat = not graph.root.children
        if self.flat:
            # an uncompiled (quantized) xmodel, as vai_q exports it: every op runs on the XIR reference
            if backend != "ref":
                raise RuntimeErrorDPU(f"graph {graph.name!r} is not compiled (no DPU subgraphs); run it with "
                                      f"backend 'ref' or compile it first")
            self.order = []
            self.ops = graph.toposort()
            self.user_ops = [n for n in self.ops if graph.ops[n].type in ("data", "data-fix")]
            self._inputs = [tensor_spec(output_of(graph.ops[n]), n) for n in self.user_ops]
            self._outputs = [tensor_spec(output_of(op), op.name) for op in graph.ops.values()
                             if not graph.consumers(op.name) and op.type not in ("const", "const-fix")]
            return
        self.order = graph.toposort_child_subgraphs()
        for sg in self.order:
            if sg.device == "DPU":
                self.runners[sg.name] = Runner(sg, backend, target=target, graph=graph, seed=seed, timing=timing)
            elif sg.device == "CPU":
                self.runners[sg.name] = Runner(sg, "ref", graph=graph)
            elif sg.device != "USER":
                raise RuntimeErrorDPU(f"subgraph {sg.name!r}: unknown device {sg.device!r}")
        self.user_ops = [n for sg in self.order if sg.device == "USER" for n in graph.toposort(sg.all_ops())]
        self._inputs = [tensor_spec(output_of(graph.ops[n]), n) for n in self.user_ops]
        self._outputs = [tensor_spec(output_of(op), op.name) for op in graph.ops.values()
                         if not graph.consumers(op.name)]

    def get_inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    def get_outputs(self) -> list[TensorSpec]:
        return list(self._outputs)

    def prepare_input(self, spec: TensorSpec, x: np.ndarray, layout: str = "nhwc") -> np.ndarray:
        """float -> fixed point with the tensor's fix_point (DPU rounding); int8 taken as fixed point.

        The shape must equal the tensor's exactly (the DPU's layout is NHWC); `layout="nchw"` transposes a 4-D
        input explicitly. Nothing is reshaped silently."""
        x = np.asarray(x)
        if layout not in ("nhwc", "nchw"):
            raise RuntimeErrorDPU(f"layout {layout!r}: use 'nhwc' or 'nchw'")
        if layout == "nchw" and x.ndim == 4 and len(spec.dims) == 4:
            x = x.transpose(0, 2, 3, 1)
        if tuple(x.shape) != spec.dims:
            hint = ""
            if x.ndim == 4 and len(spec.dims) == 4 and layout == "nhwc" and \
                    tuple(x.shape[i] for i in (0, 2, 3, 1)) == spec.dims:
                hint = "; it looks like NCHW: pass --layout nchw (layout='nchw') to transpose it"
            elif layout == "nchw" and x.ndim == 4:
                hint = " after the NCHW -> NHWC transpose"
            raise RuntimeErrorDPU(f"input {spec.name!r}: shape {list(x.shape)} does not match the model's "
                                  f"{list(spec.dims)} ({layout_name(spec.dims)}){hint}")
        kind = x.dtype.kind
        if spec.dtype == "xint8":
            if x.dtype == np.int8:
                return np.ascontiguousarray(x)
            if kind == "f":
                if not np.all(np.isfinite(x)):
                    raise RuntimeErrorDPU(f"input {spec.name!r} contains NaN or Inf")
                if spec.fix_point is None:
                    raise RuntimeErrorDPU(f"input {spec.name!r}: the fixed-point tensor has no fix_point to quantize "
                                          f"a float input with; give int8 (raw fixed point)")
                return dpu_round_quantize(x, spec.fix_point)
            raise RuntimeErrorDPU(f"input {spec.name!r}: dtype {x.dtype} is not accepted; give float (real values, "
                                  f"quantized with fix_point {spec.fix_point}) or int8 (raw fixed point)")
        if kind != "f":
            raise RuntimeErrorDPU(f"input {spec.name!r}: dtype {x.dtype} is not accepted; the tensor is float32")
        if not np.all(np.isfinite(x)):
            raise RuntimeErrorDPU(f"input {spec.name!r} contains NaN or Inf")
        return np.ascontiguousarray(x, dtype=np.float32)

    def output_values(self, res: "GraphResult", raw: bool = False) -> dict[str, tuple[np.ndarray, int | None]]:
        """Graph outputs by tensor name as (array, fix_point): float32 real values by default (a fixed-point
        output is dequantized by its tensor's fix_point, as AMD-compiled graphs do with fix2float); with `raw`,
        the int8 fixed-point values (through a final fix2float to its int8 input) and their fix_point. An
        output computed in float on the CPU stays float (fix_point None) either way. Needs `keep_values`."""
        out = {}
        for spec in self._outputs:
            v = res.outputs[spec.name]
            op = self.graph.ops[spec.op_name]
            if raw:
                if op.type == "fix2float" and op.input_ops() and op.input_ops()[0] in res.values:
                    src = self.graph.ops[op.input_ops()[0]]
                    fp = output_of(src).fix_point
                    fp = fp if fp is not None else op.attrs.get("fix_point")
                    out[spec.name] = (np.asarray(res.values[src.name]).astype(np.int8), fp)
                elif spec.dtype == "xint8":
                    out[spec.name] = (np.asarray(v, np.int8), spec.fix_point)
                else:
                    out[spec.name] = (np.asarray(v, np.float32), None)
            elif spec.dtype == "xint8" and np.asarray(v).dtype == np.int8:
                if spec.fix_point is None:
                    raise RuntimeErrorDPU(f"output {spec.name!r}: the fixed-point tensor has no fix_point to "
                                          f"dequantize with; ask for the raw values")
                out[spec.name] = (dequantize(v, spec.fix_point), spec.fix_point)
            else:
                out[spec.name] = (np.asarray(v, np.float32), None)
        return out

    def run(self, inputs, keep_values: bool = False, layers: bool = False, layout: str = "nhwc") -> GraphResult:
        """inputs: list in get_inputs() order, or dict by tensor or op name (NHWC, or NCHW with layout).

        A batch (every input's leading dimension N times the model's) runs N times through the same runners, so
        the DPU program, its machine and its kernels are set up once (the batch column of vaitrace); the
        outputs, values and layers come back stacked along the leading dimension, as N single runs would give."""
        if isinstance(inputs, dict):
            lst = []
            for s in self._inputs:
                if s.name in inputs:
                    lst.append(inputs[s.name])
                elif s.op_name in inputs:
                    lst.append(inputs[s.op_name])
                else:
                    raise RuntimeErrorDPU(f"missing graph input {s.name!r} (inputs: {[t.name for t in self._inputs]})")
            inputs = lst
        inputs = list(inputs)
        if len(inputs) != len(self._inputs):
            raise RuntimeErrorDPU(f"graph {self.graph.name!r} takes {len(self._inputs)} inputs "
                                  f"({[t.name for t in self._inputs]}), got {len(inputs)}")
        n = self.batch_of(inputs, layout)
        if n == 1:
            return self._run_one(inputs, keep_values, layers, layout)
        inputs = [np.asarray(x) for x in inputs]
        b = [s.dims[0] for s in self._inputs]
        parts = [self._run_one([x[i * k:(i + 1) * k] for x, k in zip(inputs, b)], keep_values, layers, layout)
                 for i in range(n)]
        return GraphResult(_stack([p.outputs for p in parts]), _stack([p.values for p in parts]),
                           {sg: _stack([p.dpu_outputs[sg] for p in parts]) for sg in parts[0].dpu_outputs},
                           {sg: _stack([p.layers[sg] for p in parts]) for sg in parts[0].layers})

    def batch_of(self, inputs: list, layout: str = "nhwc") -> int:
        """How many runs of the model a list of inputs holds: 1 for inputs of the model's shape; N when every
        input's leading dimension is N times the model's (a batch, the rest of the shape equal). A leading
        dimension that is not such a multiple, or batches of different sizes, is an error naming the input."""
        counts = []
        for spec, x in zip(self._inputs, inputs):
            shape = tuple(np.shape(x))
            if layout == "nchw" and len(shape) == 4 and len(spec.dims) == 4:
                shape = (shape[0], shape[2], shape[3], shape[1])
            if not spec.dims or len(shape) != len(spec.dims) or shape[1:] != tuple(spec.dims[1:]) \
                    or shape[0] == spec.dims[0]:
                counts.append((spec, 1))            # one run; prepare_input checks the shape itself
                continue
            if shape[0] == 0 or spec.dims[0] == 0 or shape[0] % spec.dims[0]:
                raise RuntimeErrorDPU(f"input {spec.name!r}: leading dimension {shape[0]} is not a batch of the "
                                      f"model's {list(spec.dims)} ({layout_name(spec.dims)}; a batch's leading "
                                      f"dimension is a positive multiple of {spec.dims[0]})")
            counts.append((spec, shape[0] // spec.dims[0]))
        sizes = {k for _, k in counts}
        if len(sizes) > 1:
            (s0, k0), (s1, k1) = counts[0], next(c for c in counts if c[1] != counts[0][1])
            raise RuntimeErrorDPU(f"inputs {s0.name!r} and {s1.name!r} hold batches of different sizes ({k0} and "
                                  f"{k1} runs of the model): give every input the same leading dimension")
        return sizes.pop() if sizes else 1

    def _run_one(self, inputs: list, keep_values: bool, layers: bool, layout: str) -> GraphResult:
        vals: dict[str, np.ndarray] = {}
        for spec, x in zip(self._inputs, inputs):
            vals[spec.op_name] = self.prepare_input(spec, x, layout)
        res = GraphResult({})
        if self.flat:
            self._run_flat(vals, res, layers)
            res.outputs = {s.name: vals[s.op_name] for s in self._outputs}
            if keep_values:
                res.values = vals
            return res
        for sg in self.order:
            if sg.device == "USER":
                continue
            r = self.runners[sg.name]
            ins = [np.ascontiguousarray(vals[t.op_name]) for t in r.get_input_tensors()]
            if layers and sg.device == "DPU":
                outs, lv, _ = r.run_layers(ins)
                res.layers[sg.name] = lv
            else:
                outs = r.run(ins)
            for t, v in zip(r.get_output_tensors(), outs):
                vals[t.op_name] = v
            if sg.device == "DPU":
                res.dpu_outputs[sg.name] = {t.name: v for t, v in zip(r.get_output_tensors(), outs)}
        res.outputs = {s.name: vals[s.op_name] for s in self._outputs}
        if keep_values:
            res.values = vals
        return res

    def _run_flat(self, vals: dict, res: GraphResult, layers: bool) -> None:
        g = self.graph
        for n in self.ops:
            if n in vals:
                continue
            op = g.ops[n]
            vals[n] = evaluate_op(g, op, [vals[p] for p in op.input_ops()])
        if layers:
            res.layers["root"] = {n: v for n, v in vals.items()
                                  if g.ops[n].type not in ("const-fix", "const")}

