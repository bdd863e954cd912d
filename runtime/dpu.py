"""A DPU subgraph of an xmodel, as the runners see it (spec §8.2–8.4).

`DpuSubgraph` gathers what running one DPU subgraph needs: its target (from `dpu_fingerprint`), register
sizes and context types, CONST parameter blobs, the decoded program, and the DDR images of its interface
tensors, all read through compiler/xir/dpu_abi.py (the ABI the compiler writes; errors become RuntimeErrorDPU
with the same messages). It executes either on the instruction executor (`run_sim`), on the RTL (`run_rtl`) or
on the XIR reference (`run_ref`). `validate` is the static program check (isa/check.py) that `run_sim` and
`run_rtl` apply first, so every backend rejects a bad program with the executor's message.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from opendpu.compiler.xir import dpu_abi as abi
from opendpu.compiler.xir.dpu_abi import MAX_DDR_BYTES, TensorSpec, image_strides, tensor_spec
from opendpu.compiler.xir.graph import Graph, Op, Subgraph, XModelError
from opendpu.isa.check import Problem, ProgramCheckError, check_program
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.program import IsaError, ProgramArrays, decode, to_arrays
from opendpu.isa.target import Target
from opendpu.runtime.ops import output_of

if TYPE_CHECKING:                  # the simulator is imported where a run needs it
    from opendpu.sim.executor import DpuMachine
    from opendpu.sim.timing import Schedule


class RuntimeErrorDPU(OpenDpuError, RuntimeError):
    """A subgraph or tensor the runtime cannot use; the message names it."""


@contextmanager
def _abi_errors():
    """Report the ABI reader's complaints about a subgraph as RuntimeErrorDPU, with the same message."""
    try:
        yield
    except abi.DpuAbiError as e:
        raise RuntimeErrorDPU(str(e)) from None


def ddr_view(buf: np.ndarray, spec: TensorSpec, what: str) -> np.ndarray:
    """Strided int8 view of a tensor's DDR image inside its register array (spec §8.3)."""
    with _abi_errors():
        addr, stride = abi.image_extent(spec, buf.size, what)
    return np.lib.stride_tricks.as_strided(buf[addr:], shape=spec.dims, strides=stride, writeable=True)


def _reg_map(sg: Subgraph, key: str) -> dict[int, Any]:
    """A `reg_id_to_*` map keyed by register id (compiler.xir.dpu_abi.read_reg_map, runtime errors)."""
    with _abi_errors():
        return abi.read_reg_map(sg, key)


class DpuSubgraph:
    """Everything needed to execute one DPU subgraph of a graph."""

    def __init__(self, graph: Graph, sg: Subgraph):
        with _abi_errors():
            spec = abi.read_dpu_subgraph(sg)
        self.graph, self.sg, self.name = graph, sg, sg.name
        self.target, self.fingerprint = spec.target, spec.fingerprint
        self.reg_sizes: dict[int, int] = spec.registers.sizes
        self.reg_context: dict[int, str] = spec.registers.context
        self.params: dict[int, bytes] = spec.registers.params
        self.mc_code: bytes = spec.mc_code
        try:
            self.instructions = decode(self.mc_code)
        except IsaError as e:
            raise RuntimeErrorDPU(f"subgraph {sg.name!r}: mc_code: {e}") from None
        self._arrays: ProgramArrays | None = None
        self._problems: dict[Target, list[Problem]] = {}
        self.last_schedule: Schedule | None = None        # of the last run_sim
        self._schedules: dict = {}                 # (target, timing) -> its schedule (data-independent)
        self.op_names = graph.toposort(sg.all_ops())
        self._consts: dict[str, np.ndarray] = {}         # const op -> its data, read once (run_ref)
        self.inputs = self._interface_inputs()
        self.outputs = self._interface_outputs()
        for what, specs in (("input", self.inputs), ("output", self.outputs)):
            for ts in specs:          # every image in an allocated register, inside it: checked once, up front
                if ts.reg_id not in self.reg_sizes:
                    raise RuntimeErrorDPU(f"subgraph {sg.name!r}: {what} {ts.name!r} lies in REG_{ts.reg_id}, "
                                          f"which reg_id_to_size does not allocate")
                with _abi_errors():
                    abi.image_extent(ts, self.reg_sizes[ts.reg_id], what)

    # ---- interface tensors (spec §8.3) -------------------------------------------------------
    def _interface_inputs(self) -> list[TensorSpec]:
        with _abi_errors():
            return abi.read_inputs(self.graph, self.sg, self.op_names)

    def _interface_outputs(self) -> list[TensorSpec]:
        with _abi_errors():
            return abi.read_outputs(self.graph, self.sg, self.op_names)

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
        t = output_of(op)
        dt = t.numpy_dtype
        n = int(np.prod(t.shape)) if t.shape else 1
        data = op.attrs.get("data")
        if data:
            arr = np.frombuffer(bytes(data), dtype=dt)
        else:
            reg, addr = t.attrs.get("reg_id"), t.attrs.get("ddr_addr")
            if reg is None or addr is None or reg not in self.params:
                raise RuntimeErrorDPU(f"const op {op.name!r} has no data and no parameter-blob location")
            try:                                    # one run at ddr_addr (AMD's form), or opendpu's DDR_RUNS
                raw = abi.read_const_bytes(t, self.params[reg], n * dt.itemsize)
            except abi.DpuAbiError as e:
                raise RuntimeErrorDPU(f"const op {op.name!r}: REG_{reg}: {e}") from None
            arr = np.frombuffer(raw, dtype=dt, count=n)
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

    def new_machine(self, seed: int = 0, init_fill: str = "random") -> DpuMachine:
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
        from opendpu.sim.timing import execute_in_start_order, simulate
        self.validate(target)
        inputs = self.check_inputs(inputs)
        m = machine or self.new_machine(seed)
        for r in self.reg_sizes:
            if self.reg_context.get(r) != "CONST":
                m.ddr(r)[...] = 0
        self.write_inputs(m, inputs)
        t = target or self.target
        key = (t, t.timing)                    # Target equality leaves its timing out
        sched = self._schedules.get(key)
        if sched is None:                      # timing depends on the fields only: once per target and timing
            sched = self._schedules[key] = simulate(self.arrays, t)
        execute_in_start_order(m, self.arrays, sched)
        self.last_schedule = sched
        return self.read_outputs(m)

    def run_rtl(self, inputs: list[np.ndarray], target: Target | None = None, backend: str | None = None,
                progress=None):
        """Execute mc_code on the RTL of the core (hw/, Verilator by default; OPENDPU_RTL_SIM picks the
        simulator). `progress(done, total, what)` hears the build and the run. Returns (outputs,
        hw.harness.RtlResult)."""
        import os
        from opendpu.hw.harness import build, ddr_needed, run_jobs
        from opendpu.runtime.cosim import through_end, rtl_job, subgraph_program
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
                if n not in self._consts:     # read-only arrays, the same objects every run (the golden
                    self._consts[n] = self.const_data(op)  # prepares its weight products once per array)
                vals[n] = self._consts[n]
            else:
                vals[n] = evaluate_op(self.graph, op, [vals[p] for p in op.input_ops()])
        outs = [vals[s.op_name] for s in self.outputs]
        return outs, (vals if keep else {})


def dpu_subgraphs(graph: Graph) -> list[Subgraph]:
    return [s for s in graph.toposort_child_subgraphs() if s.device == "DPU"]


__all__ = ["DpuSubgraph", "TensorSpec", "RuntimeErrorDPU", "ProgramCheckError", "ddr_view", "dpu_subgraphs",
           "tensor_spec", "image_strides", "MAX_DDR_BYTES", "XModelError"]
