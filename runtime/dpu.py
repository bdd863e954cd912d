"""A DPU subgraph of an xmodel, as the runners see it (spec §8.2–8.4).

`DpuSubgraph` gathers what running one DPU subgraph needs: its target (from `dpu_fingerprint`), register
sizes and context types, CONST parameter blobs, the decoded program, and the DDR images of its interface
tensors. It executes either on the instruction executor (`run_sim`), on the RTL (`run_rtl`) or on the XIR reference
(`run_ref`). `validate` is the static program check (isa/check.py) that `run_sim` and `run_rtl` apply first,
so every backend rejects a bad program with the executor's message.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opendpu.compiler.xir.graph import Graph, Op, Subgraph, Tensor, XModelError
from opendpu.isa.check import Problem, ProgramCheckError, check_program
from opendpu.isa.program import IsaError, ProgramArrays, decode, to_arrays
from opendpu.isa.target import Target, TargetError


MAX_DDR_BYTES = 1 << 31       # all DDR registers of one subgraph; the largest shared model uses ~34 MB


class RuntimeErrorDPU(RuntimeError):
    """A subgraph or tensor the runtime cannot use; the message names it."""


@dataclass
class TensorSpec:
    """A runner-visible tensor: VART's xir.Tensor subset plus where its bytes live in DPU DDR."""

    name: str
    dims: tuple[int, ...]
    dtype: str                 # "xint8" or "float32"
    fix_point: int | None
    reg_id: int | None = None
    ddr_addr: int | None = None
    stride: tuple[int, ...] | None = None   # element strides, outermost first
    op_name: str = ""          # producer op of the tensor in the graph

    @property
    def shape(self) -> tuple[int, ...]:
        return self.dims

    @property
    def ndim(self) -> int:
        return len(self.dims)

    def get_attr(self, name: str):
        if name == "fix_point":
            return self.fix_point
        raise KeyError(f"tensor {self.name!r} has no attribute {name!r}")

    @property
    def np_dtype(self):
        return np.int8 if self.dtype == "xint8" else np.float32

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, shape={list(self.dims)}, {self.dtype}, fix_point={self.fix_point})"


def tensor_spec(t: Tensor, op_name: str) -> TensorSpec:
    dt = "xint8" if t.is_fixed else "float32"
    stride = t.attrs.get("stride")
    return TensorSpec(t.name, tuple(int(d) for d in t.shape), dt, t.fix_point, t.attrs.get("reg_id"),
                      t.attrs.get("ddr_addr"), tuple(stride) if stride else None, op_name)


def image_strides(spec: TensorSpec) -> tuple[int, ...]:
    """Element strides of a tensor's DDR image: its `stride` attribute, else dense row-major (NHWC)."""
    if spec.stride is not None:
        return tuple(int(s) for s in spec.stride)
    out, acc = [], 1
    for d in reversed(spec.dims):
        out.insert(0, acc)
        acc *= d
    return tuple(out)


def ddr_view(buf: np.ndarray, spec: TensorSpec, what: str) -> np.ndarray:
    """Strided int8 view of a tensor's DDR image inside its register array (spec §8.3)."""
    dims = spec.dims
    stride = image_strides(spec)
    if len(stride) != len(dims):
        raise RuntimeErrorDPU(f"{what} tensor {spec.name!r}: stride {list(stride)} does not match shape "
                              f"{list(dims)}")
    addr = int(spec.ddr_addr or 0)
    last = addr + sum((d - 1) * s for d, s in zip(dims, stride)) if all(d > 0 for d in dims) else addr - 1
    if addr < 0 or last >= buf.size:
        raise RuntimeErrorDPU(f"{what} tensor {spec.name!r}: DDR image [{addr}, {last}] lies outside "
                              f"REG_{spec.reg_id} of {buf.size} bytes")
    return np.lib.stride_tricks.as_strided(buf[addr:], shape=dims, strides=tuple(int(s) for s in stride),
                                           writeable=True)


def _reg_map(sg: Subgraph, key: str) -> dict[int, object]:
    m = sg.attrs.get(key) or {}
    out = {}
    for k, v in m.items():
        if not k.startswith("REG_") or not k[4:].isdigit():
            raise RuntimeErrorDPU(f"subgraph {sg.name!r}: {key} has a bad register key {k!r}")
        out[int(k[4:])] = v
    return out


class DpuSubgraph:
    """Everything needed to execute one DPU subgraph of a graph."""

    def __init__(self, graph: Graph, sg: Subgraph):
        if sg.device != "DPU":
            raise RuntimeErrorDPU(f"subgraph {sg.name!r} has device {sg.device!r}, not DPU")
        self.graph, self.sg, self.name = graph, sg, sg.name
        fp = sg.attrs.get("dpu_fingerprint")
        if fp is None:
            raise RuntimeErrorDPU(f"subgraph {sg.name!r} carries no dpu_fingerprint (VART_GRAPH_FINGERPRINT_ERROR)")
        try:
            self.target = Target.from_fingerprint(int(fp))
        except TargetError as e:
            raise RuntimeErrorDPU(f"subgraph {sg.name!r}: {e}") from None
        self.fingerprint = int(fp)
        self.reg_sizes: dict[int, int] = {k: int(v) for k, v in _reg_map(sg, "reg_id_to_size").items()}
        total = sum(self.reg_sizes.values())
        if total > MAX_DDR_BYTES:
            big = max(self.reg_sizes, key=self.reg_sizes.get)
            raise RuntimeErrorDPU(f"subgraph {sg.name!r}: its DDR registers total {total} bytes (REG_{big}: "
                                  f"{self.reg_sizes[big]} B), beyond the emulator's {MAX_DDR_BYTES} bytes; a "
                                  f"compiled model needs far less (reg_id_to_size is damaged?)")
        ctx = _reg_map(sg, "reg_id_to_context_type_v2") or _reg_map(sg, "reg_id_to_context_type")
        self.reg_context: dict[int, str] = {k: str(v) for k, v in ctx.items()}
        self.params: dict[int, bytes] = {k: bytes(v) for k, v in _reg_map(sg, "reg_id_to_parameter_value").items()}
        for r, blob in self.params.items():
            if r not in self.reg_sizes:
                raise RuntimeErrorDPU(f"subgraph {sg.name!r}: parameter blob for REG_{r} has no reg_id_to_size entry")
            if len(blob) > self.reg_sizes[r]:
                raise RuntimeErrorDPU(f"subgraph {sg.name!r}: parameter blob REG_{r} ({len(blob)} B) exceeds "
                                      f"its size {self.reg_sizes[r]} B")
        mc = sg.attrs.get("mc_code")
        if not mc:
            raise RuntimeErrorDPU(f"subgraph {sg.name!r} has no mc_code")
        self.mc_code: bytes = bytes(mc)
        try:
            self.instructions = decode(self.mc_code)
        except IsaError as e:
            raise RuntimeErrorDPU(f"subgraph {sg.name!r}: mc_code: {e}") from None
        self._arrays: ProgramArrays | None = None
        self._problems: dict[Target, list[Problem]] = {}
        self.last_schedule = None
        self.op_names = graph.toposort(sg.all_ops())
        self._opset = set(self.op_names)
        self.inputs = self._interface_inputs()
        self.outputs = self._interface_outputs()

    # ---- interface tensors (spec §8.3) -------------------------------------------------------
    def _interface_inputs(self) -> list[TensorSpec]:
        out = []
        seen = set()
        for n in self.op_names:
            for p in self.graph.ops[n].input_ops():
                if p in self._opset or p in seen:
                    continue
                seen.add(p)
                outside = self.graph.ops[p]
                ups = [c for c in self.graph.consumers(p) if c in self._opset]
                ups = [c for c in ups if self.graph.ops[c].type == "upload"] or ups
                if len(ups) != 1 or self.graph.ops[ups[0]].type != "upload":
                    raise RuntimeErrorDPU(f"subgraph {self.name!r}: input {p!r} is not read through one upload op")
                img = tensor_spec(self.graph.ops[ups[0]].output, ups[0])
                if img.reg_id is None:
                    raise RuntimeErrorDPU(f"subgraph {self.name!r}: input {p!r} has no DDR image (reg_id on the "
                                          f"upload {ups[0]!r})")
                spec = tensor_spec(outside.output, p)
                spec.reg_id, spec.ddr_addr, spec.stride = img.reg_id, img.ddr_addr, img.stride
                if spec.fix_point is None:
                    spec.fix_point = img.fix_point
                out.append(spec)
        return out

    def _interface_outputs(self) -> list[TensorSpec]:
        out = []
        for n in self.op_names:
            op = self.graph.ops[n]
            consumers = self.graph.consumers(n)
            if consumers and all(c in self._opset for c in consumers):
                continue
            if op.type == "download":
                src = op.input_ops()
                if len(src) != 1:
                    raise RuntimeErrorDPU(f"subgraph {self.name!r}: download {n!r} has {len(src)} inputs")
                img = tensor_spec(self.graph.ops[src[0]].output, src[0])
            else:
                img = tensor_spec(op.output, n)
            spec = tensor_spec(op.output, n)
            spec.reg_id, spec.ddr_addr, spec.stride = img.reg_id, img.ddr_addr, img.stride
            if spec.fix_point is None:
                spec.fix_point = img.fix_point
            if spec.reg_id is None:
                raise RuntimeErrorDPU(f"subgraph {self.name!r}: output {spec.name!r} has no DDR image (reg_id)")
            out.append(spec)
        return out

    @property
    def arrays(self) -> ProgramArrays:
        if self._arrays is None:
            self._arrays = to_arrays(self.instructions)
        return self._arrays

    # ---- static program check ---------------------------------------------------------------
    def check(self, target: Target | None = None) -> list[Problem]:
        """Every instruction the executor would reject on `target` (default: the subgraph's own), from the
        static check isa.check.check_program with this subgraph's register sizes; cached per target."""
        t = target or self.target
        p = self._problems.get(t)
        if p is None:
            p = self._problems[t] = check_program(self.arrays, t, self.reg_sizes)
        return p

    def validate(self, target: Target | None = None) -> None:
        """Raise isa.check.ProgramCheckError (an isa.program.IsaError) for the first problem of `check`:
        "subgraph '<name>': instruction <i> (<OP>): field <f>=<v>: <message>", where the part from
        "instruction" on is exactly the executor's ExecError text for that instruction."""
        p = self.check(target)
        if p:
            raise ProgramCheckError(p[0], prefix=f"subgraph {self.name!r}: ")

    # ---- const data ---------------------------------------------------------------------------
    def const_data(self, op: Op) -> np.ndarray:
        """Data of a const(-fix) op: its `data` attribute, or its bytes in the parameter blob (spec §8)."""
        t = op.output
        dt = t.numpy_dtype
        n = int(np.prod(t.shape)) if t.shape else 1
        data = op.attrs.get("data")
        if data:
            arr = np.frombuffer(bytes(data), dtype=dt)
        else:
            reg, addr = t.attrs.get("reg_id"), t.attrs.get("ddr_addr")
            if reg is None or addr is None or reg not in self.params:
                raise RuntimeErrorDPU(f"const op {op.name!r} has no data and no parameter-blob location")
            blob = self.params[reg]
            nbytes = n * dt.itemsize
            if addr + nbytes > len(blob):
                raise RuntimeErrorDPU(f"const op {op.name!r}: bytes [{addr}, {addr + nbytes}) exceed the REG_{reg} "
                                      f"parameter blob of {len(blob)} B")
            arr = np.frombuffer(blob, dtype=dt, count=n, offset=addr)
        if arr.size != n:
            raise RuntimeErrorDPU(f"const op {op.name!r}: {arr.size} elements for shape {t.shape}")
        return arr.reshape(t.shape)

    # ---- execution --------------------------------------------------------------------------
    def check_inputs(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self.inputs):
            raise RuntimeErrorDPU(f"subgraph {self.name!r} takes {len(self.inputs)} inputs, got {len(inputs)}")
        out = []
        for spec, x in zip(self.inputs, inputs):
            x = np.asarray(x)
            if tuple(x.shape) != spec.dims:
                raise RuntimeErrorDPU(f"input {spec.name!r}: shape {list(x.shape)} != {list(spec.dims)}")
            if x.dtype != np.int8:
                raise RuntimeErrorDPU(f"input {spec.name!r}: dtype {x.dtype} (DPU inputs are int8 fixed point, "
                                      f"fix_point {spec.fix_point})")
            out.append(x)
        return out

    def new_machine(self, seed: int = 0, init_fill: str = "random"):
        from opendpu.sim.executor import DpuMachine
        m = DpuMachine(self.target, dict(self.reg_sizes), init_fill=init_fill, seed=seed)
        self.load_params(m)
        return m

    def load_params(self, machine) -> None:
        for r, blob in self.params.items():
            if self.reg_context.get(r, "CONST") == "CONST":
                machine.write_ddr(r, 0, np.frombuffer(blob, dtype=np.int8))

    def write_inputs(self, machine, inputs: list[np.ndarray]) -> None:
        for spec, x in zip(self.inputs, inputs):
            ddr_view(machine.ddr(spec.reg_id), spec, "input")[...] = x

    def read_outputs(self, machine) -> list[np.ndarray]:
        return [np.array(ddr_view(machine.ddr(s.reg_id), s, "output"), dtype=np.int8) for s in self.outputs]

    def run_sim(self, inputs: list[np.ndarray], machine=None, seed: int = 0, target: Target | None = None
                ) -> list[np.ndarray]:
        """Execute mc_code on the cycle model with functional execution (instructions run in the order the
        schedule starts them); the schedule is kept in `last_schedule`. Returns the output tensors."""
        from opendpu.sim.timing import simulate
        self.validate(target)
        inputs = self.check_inputs(inputs)
        m = machine or self.new_machine(seed)
        for r in self.reg_sizes:
            if self.reg_context.get(r) != "CONST":
                m.ddr(r)[...] = 0
        self.write_inputs(m, inputs)
        self.last_schedule = simulate(self.arrays, target or self.target, machine=m)
        return self.read_outputs(m)

    def run_rtl(self, inputs: list[np.ndarray], target: Target | None = None, backend: str | None = None,
                progress=None):
        """Execute mc_code on the RTL of the core (hw/, Verilator by default; OPENDPU_RTL_SIM picks the
        simulator). `progress(done, total, what)` hears the build and the run. Returns (outputs,
        hw.harness.RtlResult)."""
        import os
        from opendpu.hw.harness import build, ddr_needed, run_jobs
        from opendpu.sim.cosim import through_end, rtl_job, subgraph_program
        from opendpu.sim.timing import simulate
        t = target or self.target
        self.validate(t)
        instrs, sizes, init = subgraph_program(self, inputs)
        instrs = through_end(instrs)
        sched = simulate(to_arrays(instrs), t)          # timing only: bounds the run, reports deadlocks
        b = build(t, backend or os.environ.get("OPENDPU_RTL_SIM", "verilator"), ddr_bytes=ddr_needed(sizes),
                  progress=progress)
        res = run_jobs(b, [rtl_job(self.name, instrs, sizes, init, sched)], progress=progress)[0]
        if res.status != "done":
            raise RuntimeErrorDPU(f"subgraph {self.name!r}: the RTL did not finish within {res.waited} cycles "
                                  f"(DPU_STS={res.sts:#x})")

        class _Ddr:
            def ddr(self, r):
                return res.ddr[r]
        return self.read_outputs(_Ddr()), res

    def run_ref(self, inputs: list[np.ndarray], keep: bool = False) -> tuple[list[np.ndarray], dict]:
        """Evaluate the subgraph's ops on the XIR reference; returns (outputs, values by op name if keep)."""
        from opendpu.runtime.ops import evaluate_op
        inputs = self.check_inputs(inputs)
        vals: dict[str, np.ndarray] = {s.op_name: x for s, x in zip(self.inputs, inputs)}
        for n in self.op_names:
            op = self.graph.ops[n]
            if op.type in ("const-fix", "const"):
                vals[n] = self.const_data(op)
            else:
                vals[n] = evaluate_op(self.graph, op, [vals[p] for p in op.input_ops()])
        outs = [vals[s.op_name] for s in self.outputs]
        return outs, (vals if keep else {})


def dpu_subgraphs(graph: Graph) -> list[Subgraph]:
    return [s for s in graph.toposort_child_subgraphs() if s.device == "DPU"]


__all__ = ["DpuSubgraph", "TensorSpec", "RuntimeErrorDPU", "ProgramCheckError", "ddr_view", "dpu_subgraphs",
           "tensor_spec", "XModelError"]
