"""The ABI of a compiled DPU subgraph (spec §8.2–8.3), written once for the reader and the writer.

A DPU subgraph carries its target (`dpu_fingerprint`), its program (`mc_code`) and its DDR registers (the
`reg_id_to_*` maps keyed `REG_<n>`); its interface tensors are read through `upload` ops and written through
`download` ops whose image tensors carry `reg_id`, `ddr_addr` and `stride`. The runtime reads these with the
`read_*` functions; a code generator writes them with the `write_*` functions, in the AttrValue cases AMD's
compiled models use, so that VART and this runtime read the result alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from opendpu.compiler.xir.graph import Graph, Subgraph, Tensor, XModelError, reg_id_of
from opendpu.isa.check import NUM_REGS          # REG_0 … REG_7 on DPUCZDX8G (3-bit reg_id fields)
from opendpu.isa.target import Target, TargetError


class DpuAbiError(XModelError):
    """A DPU subgraph whose ABI attributes are missing, inconsistent or not writable; the message names it."""


# ---- subgraph attributes (spec §8.2) ------------------------------------------------------------------
DEVICE = "device"
DEVICE_DPU = "DPU"
DPU_FINGERPRINT = "dpu_fingerprint"
DPU_NAME = "dpu_name"
# opendpu extension: a configuration no fingerprint describes (spec §3.2: bank_depth 2048 and the ARCH table only)
# is named by its parameters (Target.from_name reads "..._PP2_CP4_ALUPP1_D512"); dpu_fingerprint is then 0.
OPENDPU_TARGET = "opendpu_target"
MC_CODE = "mc_code"
MC_CODE_PRELOAD = "mc_code_preload"
WORKLOAD = "workload"
RUNNER = "runner"
REG_ID_TO_SIZE = "reg_id_to_size"
REG_ID_TO_CONTEXT_TYPE = "reg_id_to_context_type"
REG_ID_TO_CONTEXT_TYPE_V2 = "reg_id_to_context_type_v2"
REG_ID_TO_PARAMETER_VALUE = "reg_id_to_parameter_value"
REG_ID_TO_HW_SEGMENT = "reg_id_to_hw_segment"

# AttrValue case of each subgraph attribute in AMD's compiled models (all five shared models agree).
SUBGRAPH_ATTR_KINDS = {
    DEVICE: "string_value", DPU_NAME: "string_value", DPU_FINGERPRINT: "uint64_value", MC_CODE: "bytes_value",
    MC_CODE_PRELOAD: "bytes_value", WORKLOAD: "uint64_value", RUNNER: "map_string_2_string_value",
    REG_ID_TO_SIZE: "map_string_2_int32_value", REG_ID_TO_CONTEXT_TYPE: "map_string_2_string_value",
    REG_ID_TO_CONTEXT_TYPE_V2: "map_string_2_string_value", REG_ID_TO_PARAMETER_VALUE: "map_string_2_bytes_value",
    REG_ID_TO_HW_SEGMENT: "map_string_2_string_value",
}

# The VART runner library of each run mode, as AMD's compiler names it on every DPU subgraph.
DPU_RUNNERS = {"run": "libvart-dpu-runner.so", "ref": "libvart-cpu-runner.so", "sim": "libvart-sim-runner.so"}

# Register context types: v2 vocabulary, and the v1 word each maps to ("DATA" for everything not CONST).
CONST, DATA, WORKSPACE, INTERFACE = "CONST", "DATA", "WORKSPACE", "INTERFACE"
CONTEXT_TYPES = (CONST, DATA, WORKSPACE, INTERFACE)
CONTEXT_V1 = {CONST: CONST, DATA: DATA, WORKSPACE: DATA, INTERFACE: DATA}
# reg_id_to_hw_segment of AMD's ISA1 models: parameters in weight segment W0, everything else in data segment D0.
HW_SEGMENT = {CONST: "W0", DATA: "D0", WORKSPACE: "D0", INTERFACE: "D0"}

REG_PREFIX = "REG_"
MAX_DDR_BYTES = 1 << 31         # all DDR registers of one subgraph; the largest shared model uses ~34 MB
INT32_MAX = (1 << 31) - 1       # reg_id_to_size and the tensor attributes are int32 in AMD's models

# ---- tensor attributes of a DDR image (spec §8.2, §8.3) -----------------------------------------------
UPLOAD = "upload"
DOWNLOAD = "download"
REG_ID = "reg_id"
DDR_ADDR = "ddr_addr"
LOCATION = "location"
STRIDE = "stride"
FIX_POINT = "fix_point"
LOCATION_DDR = 1
LOCATION_ON_CHIP = 0            # AMD's value on tensors a program keeps in the banks (reg_id / ddr_addr 0 alongside)
# opendpu extension on const tensors whose bytes are not one run in tensor order: [offset, length, offset, length,
# ...] in the register, the runs in row-major element order (the code generator lays weights out per CONVW bank)
DDR_RUNS = "opendpu_ddr_runs"
TENSOR_ATTR_KINDS = {REG_ID: "int32_value", DDR_ADDR: "int32_value", LOCATION: "int32_value",
                     STRIDE: "int32_vec_value", FIX_POINT: "int32_value", DDR_RUNS: "int32_vec_value"}


def reg_key(reg_id: int) -> str:
    """Register map key of a register id: 2 -> 'REG_2'."""
    return f"{REG_PREFIX}{int(reg_id)}"


# ---- registers ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Register:
    """One DDR register (segment) of a DPU subgraph: id, context type, size in bytes, initial bytes if CONST."""

    reg_id: int
    context: str | None         # CONST, DATA, WORKSPACE or INTERFACE (None: the subgraph names none)
    size: int
    params: bytes | None = None


@dataclass
class RegisterMap:
    """The `reg_id_to_*` maps of a DPU subgraph keyed by register id; `context` holds the v2 vocabulary when
    the subgraph has it, else v1."""

    sizes: dict[int, int] = field(default_factory=dict)
    context: dict[int, str] = field(default_factory=dict)
    params: dict[int, bytes] = field(default_factory=dict)

    @classmethod
    def of(cls, regs: Iterable[Register]) -> "RegisterMap":
        m = cls()
        for r in regs:
            if r.reg_id in m.sizes:
                raise DpuAbiError(f"register REG_{r.reg_id} given twice")
            m.sizes[r.reg_id] = int(r.size)
            if r.context is not None:
                m.context[r.reg_id] = r.context
            if r.params is not None:
                m.params[r.reg_id] = bytes(r.params)
        return m

    def registers(self) -> list[Register]:
        """The registers in id order."""
        return [Register(r, self.context.get(r), self.sizes[r], self.params.get(r)) for r in sorted(self.sizes)]


def read_reg_map(sg: Subgraph, key: str) -> dict[int, Any]:
    """A `reg_id_to_*` attribute as {register id: value} (empty when absent); a key not `REG_<n>` is an error."""
    m = sg.attrs.get(key) or {}
    out = {}
    for k, v in m.items():
        r = reg_id_of(k)
        if r is None or not 0 <= r < NUM_REGS:
            raise DpuAbiError(f"subgraph {sg.name!r}: {key} has a bad register key {k!r} (REG_0..REG_{NUM_REGS - 1})")
        out[r] = v
    return out


def read_registers(sg: Subgraph) -> RegisterMap:
    """Sizes, context types (v2 preferred) and parameter blobs of a DPU subgraph, checked for consistency."""
    sizes = {k: int(v) for k, v in read_reg_map(sg, REG_ID_TO_SIZE).items()}
    total = sum(sizes.values())
    if total > MAX_DDR_BYTES:
        big = max(sizes, key=lambda r: sizes[r])
        raise DpuAbiError(f"subgraph {sg.name!r}: its DDR registers total {total} bytes (REG_{big}: "
                          f"{sizes[big]} B), beyond the emulator's {MAX_DDR_BYTES} bytes; a "
                          f"compiled model needs far less (reg_id_to_size is damaged?)")
    ctx = read_reg_map(sg, REG_ID_TO_CONTEXT_TYPE_V2) or read_reg_map(sg, REG_ID_TO_CONTEXT_TYPE)
    context = {k: str(v) for k, v in ctx.items()}
    params = {k: bytes(v) for k, v in read_reg_map(sg, REG_ID_TO_PARAMETER_VALUE).items()}
    for r, blob in params.items():
        if r not in sizes:
            raise DpuAbiError(f"subgraph {sg.name!r}: parameter blob for REG_{r} has no reg_id_to_size entry")
        if len(blob) > sizes[r]:
            raise DpuAbiError(f"subgraph {sg.name!r}: parameter blob REG_{r} ({len(blob)} B) exceeds "
                              f"its size {sizes[r]} B")
    return RegisterMap(sizes, context, params)


def write_registers(sg: Subgraph, regs: RegisterMap) -> None:
    """Set `reg_id_to_size`, `reg_id_to_context_type(_v2)`, `reg_id_to_parameter_value` and
    `reg_id_to_hw_segment` as AMD writes them; every register needs a context, only CONST ones carry bytes."""
    where = f"subgraph {sg.name!r}"
    for r, size in regs.sizes.items():
        if not 0 <= r < NUM_REGS:
            raise DpuAbiError(f"{where}: register id {r} out of range 0..{NUM_REGS - 1}")
        if not 0 <= size <= INT32_MAX:
            raise DpuAbiError(f"{where}: REG_{r} size {size} B does not fit reg_id_to_size (int32)")
        c = regs.context.get(r)
        if c not in CONTEXT_TYPES:
            raise DpuAbiError(f"{where}: REG_{r} has context type {c!r}, not one of {', '.join(CONTEXT_TYPES)}")
    for name, m in (("context type", regs.context), ("parameter blob", regs.params)):
        for r in m:
            if r not in regs.sizes:
                raise DpuAbiError(f"{where}: {name} for REG_{r}, which has no size")
    total = sum(regs.sizes.values())
    if total > MAX_DDR_BYTES:
        raise DpuAbiError(f"{where}: DDR registers total {total} bytes, beyond {MAX_DDR_BYTES}")
    for r, blob in regs.params.items():
        if regs.context[r] != CONST:
            raise DpuAbiError(f"{where}: parameter blob for REG_{r}, a {regs.context[r]} register (only CONST "
                              f"registers are loaded from the model)")
        if len(blob) > regs.sizes[r]:
            raise DpuAbiError(f"{where}: parameter blob REG_{r} ({len(blob)} B) exceeds its size {regs.sizes[r]} B")
    ids = sorted(regs.sizes)
    k = SUBGRAPH_ATTR_KINDS
    sg.attrs.set(REG_ID_TO_SIZE, {reg_key(r): int(regs.sizes[r]) for r in ids}, k[REG_ID_TO_SIZE])
    sg.attrs.set(REG_ID_TO_CONTEXT_TYPE, {reg_key(r): CONTEXT_V1[regs.context[r]] for r in ids},
                 k[REG_ID_TO_CONTEXT_TYPE])
    sg.attrs.set(REG_ID_TO_CONTEXT_TYPE_V2, {reg_key(r): regs.context[r] for r in ids}, k[REG_ID_TO_CONTEXT_TYPE_V2])
    sg.attrs.set(REG_ID_TO_PARAMETER_VALUE, {reg_key(r): bytes(regs.params[r]) for r in sorted(regs.params)},
                 k[REG_ID_TO_PARAMETER_VALUE])
    sg.attrs.set(REG_ID_TO_HW_SEGMENT, {reg_key(r): HW_SEGMENT[regs.context[r]] for r in ids},
                 k[REG_ID_TO_HW_SEGMENT])


# ---- the subgraph as a whole ------------------------------------------------------------------------
@dataclass
class DpuSubgraphSpec:
    """The ABI values of one DPU subgraph apart from its interface: target, program and registers."""

    target: Target
    fingerprint: int            # as stored (a preset target's own fingerprint may be a newer one)
    mc_code: bytes
    registers: RegisterMap
    dpu_name: str | None = None
    workload: int | None = None  # operation count, for profilers

    @classmethod
    def for_target(cls, target: Target, mc_code: bytes, registers: RegisterMap,
                   workload: int | None = None) -> "DpuSubgraphSpec":
        """The spec of a program compiled for `target`: its fingerprint and name as AMD's compiler writes them (a
        configuration without a fingerprint gets 0 and is named by OPENDPU_TARGET)."""
        return cls(target, target.fingerprint or 0, bytes(mc_code), registers, target.name, workload)


def read_dpu_subgraph(sg: Subgraph) -> DpuSubgraphSpec:
    """Device, target, registers and program of a DPU subgraph, with the runtime's checks (VART's error names)."""
    if sg.device != DEVICE_DPU:
        raise DpuAbiError(f"subgraph {sg.name!r} has device {sg.device!r}, not DPU")
    fp = sg.attrs.get(DPU_FINGERPRINT)
    if fp is None:
        raise DpuAbiError(f"subgraph {sg.name!r} carries no dpu_fingerprint (VART_GRAPH_FINGERPRINT_ERROR)")
    param = sg.attrs.get(OPENDPU_TARGET)
    try:
        if param is not None and int(fp) == 0:
            if not isinstance(param, str):
                raise TargetError(f"{OPENDPU_TARGET} must be a string, got {type(param).__name__}")
            target = Target.from_name(param)
            if target.fingerprint is not None:
                raise TargetError(f"{OPENDPU_TARGET} {param!r} has fingerprint 0x{target.fingerprint:016X}, "
                                  f"but dpu_fingerprint is 0")
        else:
            target = Target.from_fingerprint(int(fp))
    except TargetError as e:
        raise DpuAbiError(f"subgraph {sg.name!r}: {e}") from None
    regs = read_registers(sg)
    mc = sg.attrs.get(MC_CODE)
    if not mc:
        raise DpuAbiError(f"subgraph {sg.name!r} has no mc_code")
    wl = sg.attrs.get(WORKLOAD)
    return DpuSubgraphSpec(target, int(fp), bytes(mc), regs, sg.attrs.get(DPU_NAME),
                           None if wl is None else int(wl))


def write_dpu_subgraph(sg: Subgraph, spec: DpuSubgraphSpec) -> None:
    """Set the device, target, program, runner and register attributes of a DPU subgraph (spec §8.2)."""
    fp = int(spec.fingerprint)
    if not 0 <= fp < 1 << 64:
        raise DpuAbiError(f"subgraph {sg.name!r}: fingerprint {fp} does not fit dpu_fingerprint (uint64)")
    if not spec.mc_code:
        raise DpuAbiError(f"subgraph {sg.name!r}: empty mc_code")
    k = SUBGRAPH_ATTR_KINDS
    sg.attrs.set(DEVICE, DEVICE_DPU, k[DEVICE])
    sg.attrs.set(DPU_NAME, spec.dpu_name or spec.target.name, k[DPU_NAME])
    sg.attrs.set(DPU_FINGERPRINT, fp, k[DPU_FINGERPRINT])
    if spec.target.fingerprint is None:
        if fp != 0:
            raise DpuAbiError(f"subgraph {sg.name!r}: target {spec.target.name} has no fingerprint; "
                              f"dpu_fingerprint must be 0")
        sg.attrs.set(OPENDPU_TARGET, spec.target.name, "string_value")
    sg.attrs.set(MC_CODE, bytes(spec.mc_code), k[MC_CODE])
    sg.attrs.set(MC_CODE_PRELOAD, b"", k[MC_CODE_PRELOAD])       # present but empty on every ISA1 model (§8.2)
    sg.attrs.set(RUNNER, dict(DPU_RUNNERS), k[RUNNER])
    if spec.workload is not None:
        if not 0 <= int(spec.workload) < 1 << 64:
            raise DpuAbiError(f"subgraph {sg.name!r}: workload {spec.workload} does not fit uint64")
        sg.attrs.set(WORKLOAD, int(spec.workload), k[WORKLOAD])
    write_registers(sg, spec.registers)


# ---- interface tensors (spec §8.3) --------------------------------------------------------------------
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
    """A graph tensor as a runner sees it, with its DDR-image attributes if it has them."""
    dt = "xint8" if t.is_fixed else "float32"
    stride = t.attrs.get(STRIDE)
    return TensorSpec(t.name, tuple(int(d) for d in t.shape), dt, t.fix_point, t.attrs.get(REG_ID),
                      t.attrs.get(DDR_ADDR), tuple(stride) if stride else None, op_name)


def dense_strides(dims: Iterable[int]) -> tuple[int, ...]:
    """Element strides of a dense row-major (NHWC for feature maps) image: (1, 28, 28, 1) -> (784, 28, 1, 1)."""
    out: list[int] = []
    acc = 1
    for d in reversed(tuple(dims)):
        out.insert(0, acc)
        acc *= int(d)
    return tuple(out)


def image_strides(spec: TensorSpec) -> tuple[int, ...]:
    """Element strides of a tensor's DDR image: its `stride` attribute, else dense row-major (NHWC)."""
    if spec.stride is not None:
        return tuple(int(s) for s in spec.stride)
    return dense_strides(spec.dims)


def image_extent(spec: TensorSpec, reg_size: int, what: str) -> tuple[int, tuple[int, ...]]:
    """(ddr_addr, element strides) of a tensor's DDR image, checked to lie inside its register of `reg_size`
    bytes; `what` ("input", "output", …) names the tensor's role in the errors."""
    dims = spec.dims
    stride = image_strides(spec)
    if len(stride) != len(dims):
        raise DpuAbiError(f"{what} tensor {spec.name!r}: stride {list(stride)} does not match shape {list(dims)}")
    addr = int(spec.ddr_addr or 0)
    last = addr + sum((d - 1) * s for d, s in zip(dims, stride)) if all(d > 0 for d in dims) else addr - 1
    if addr < 0 or last >= reg_size:
        raise DpuAbiError(f"{what} tensor {spec.name!r}: DDR image [{addr}, {last}] lies outside "
                          f"REG_{spec.reg_id} of {reg_size} bytes")
    return addr, stride


def _output(graph: Graph, name: str) -> Tensor:
    t = graph.ops[name].output
    if t is None:
        raise DpuAbiError(f"op {name!r} has no output tensor")
    return t


def _op_names(graph: Graph, sg: Subgraph, op_names: list[str] | None) -> list[str]:
    return graph.toposort(sg.all_ops()) if op_names is None else op_names


def input_producers(graph: Graph, op_names: list[str]) -> list[str]:
    """Ops outside the subgraph (ops `op_names`, in order) that it reads, in first-read order."""
    opset, seen, out = set(op_names), set(), []
    for n in op_names:
        for p in graph.ops[n].input_ops():
            if p not in opset and p not in seen:
                seen.add(p)
                out.append(p)
    return out


def upload_of(graph: Graph, sg_name: str, op_names: list[str], producer: str) -> str:
    """The upload op through which the subgraph reads `producer` (an op outside it); there must be exactly one."""
    opset = set(op_names)
    ups = [c for c in graph.consumers(producer) if c in opset]
    ups = [c for c in ups if graph.ops[c].type == UPLOAD] or ups
    if len(ups) != 1 or graph.ops[ups[0]].type != UPLOAD:
        raise DpuAbiError(f"subgraph {sg_name!r}: input {producer!r} is not read through one upload op")
    return ups[0]


def output_ops(graph: Graph, op_names: list[str]) -> list[str]:
    """Ops of the subgraph whose value leaves it (read outside it, or read by no op), in order."""
    opset = set(op_names)
    out = []
    for n in op_names:
        consumers = graph.consumers(n)
        if consumers and all(c in opset for c in consumers):
            continue
        out.append(n)
    return out


def output_image_op(graph: Graph, sg_name: str, op_name: str) -> str:
    """The op whose output tensor holds the DDR image of output op `op_name`: a download's single input, else
    the op itself."""
    op = graph.ops[op_name]
    if op.type != DOWNLOAD:
        return op_name
    src = op.input_ops()
    if len(src) != 1:
        raise DpuAbiError(f"subgraph {sg_name!r}: download {op_name!r} has {len(src)} inputs")
    return src[0]


def _interface_spec(outside: TensorSpec, img: TensorSpec) -> TensorSpec:
    """The interface tensor: name, dims and fix point of the tensor outside, DDR image of the tensor inside."""
    outside.reg_id, outside.ddr_addr, outside.stride = img.reg_id, img.ddr_addr, img.stride
    if outside.fix_point is None:
        outside.fix_point = img.fix_point
    return outside


def read_inputs(graph: Graph, sg: Subgraph, op_names: list[str] | None = None) -> list[TensorSpec]:
    """Input tensors of a DPU subgraph (ops `op_names`, default its ops in topological order), each with the
    DDR image of the upload op that reads it."""
    names = _op_names(graph, sg, op_names)
    out = []
    for p in input_producers(graph, names):
        up = upload_of(graph, sg.name, names, p)
        img = tensor_spec(_output(graph, up), up)
        if img.reg_id is None:
            raise DpuAbiError(f"subgraph {sg.name!r}: input {p!r} has no DDR image (reg_id on the upload {up!r})")
        out.append(_interface_spec(tensor_spec(_output(graph, p), p), img))
    return out


def read_outputs(graph: Graph, sg: Subgraph, op_names: list[str] | None = None) -> list[TensorSpec]:
    """Output tensors of a DPU subgraph, each with the DDR image of its download's input (or its own)."""
    names = _op_names(graph, sg, op_names)
    out = []
    for n in output_ops(graph, names):
        src = output_image_op(graph, sg.name, n)
        spec = _interface_spec(tensor_spec(_output(graph, n), n), tensor_spec(_output(graph, src), src))
        if spec.reg_id is None:
            raise DpuAbiError(f"subgraph {sg.name!r}: output {spec.name!r} has no DDR image (reg_id)")
        out.append(spec)
    return out


def write_image(t: Tensor, reg_id: int, ddr_addr: int, stride: Iterable[int]) -> None:
    """Place tensor `t` in DPU DDR: `reg_id`, `ddr_addr`, `location` 1 and element `stride`, as int32
    attributes (AMD's form)."""
    stride = [int(s) for s in stride]
    where = f"tensor {t.name!r}"
    if not 0 <= int(reg_id) < NUM_REGS:
        raise DpuAbiError(f"{where}: register id {reg_id} out of range 0..{NUM_REGS - 1}")
    if not 0 <= int(ddr_addr) <= INT32_MAX:
        raise DpuAbiError(f"{where}: ddr_addr {ddr_addr} does not fit an int32 offset")
    if len(stride) != len(t.shape) or not all(0 <= s <= INT32_MAX for s in stride):
        raise DpuAbiError(f"{where}: stride {stride} is not one int32 element stride per dimension of "
                          f"{list(t.shape)}")
    k = TENSOR_ATTR_KINDS
    t.attrs.set(REG_ID, int(reg_id), k[REG_ID])
    t.attrs.set(DDR_ADDR, int(ddr_addr), k[DDR_ADDR])
    t.attrs.set(LOCATION, LOCATION_DDR, k[LOCATION])
    t.attrs.set(STRIDE, stride, k[STRIDE])


def write_on_chip(t: Tensor, reg_id: int) -> None:
    """Mark tensor `t` as never stored by the program (it stays in the banks): `location` 0 with `reg_id` (a data
    register) and `ddr_addr` 0 and no stride, as AMD's compiler marks the intermediates of its fused layers."""
    k = TENSOR_ATTR_KINDS
    t.attrs.set(REG_ID, int(reg_id), k[REG_ID])
    t.attrs.set(DDR_ADDR, 0, k[DDR_ADDR])
    t.attrs.set(LOCATION, LOCATION_ON_CHIP, k[LOCATION])


def write_const_image(t: Tensor, reg_id: int, runs: list[tuple[int, int]]) -> None:
    """Place a const tensor's bytes in CONST register `reg_id`: `runs` (offset, length) in row-major element order.
    One run is AMD's form (`ddr_addr` alone); several are also listed in DDR_RUNS, `ddr_addr` being the first."""
    where = f"const tensor {t.name!r}"
    if not runs or any(a < 0 or n <= 0 or a + n > INT32_MAX for a, n in runs):
        raise DpuAbiError(f"{where}: byte runs {runs[:4]} are not (offset, length) pairs inside an int32 register")
    k = TENSOR_ATTR_KINDS
    t.attrs.set(REG_ID, int(reg_id), k[REG_ID])
    t.attrs.set(DDR_ADDR, int(runs[0][0]), k[DDR_ADDR])
    t.attrs.set(LOCATION, LOCATION_DDR, k[LOCATION])
    if len(runs) > 1:
        t.attrs.set(DDR_RUNS, [int(v) for run in runs for v in run], k[DDR_RUNS])


def const_runs(t: Tensor, nbytes: int) -> list[tuple[int, int]]:
    """The (offset, length) byte runs of a const tensor of `nbytes` bytes in its register: DDR_RUNS when present
    (their lengths must add up to `nbytes`), else one run at `ddr_addr` (AMD's form)."""
    v = t.attrs.get(DDR_RUNS)
    if v is None:
        addr = t.attrs.get(DDR_ADDR)
        if addr is None:
            raise DpuAbiError(f"const tensor {t.name!r} has no ddr_addr")
        return [(int(addr), int(nbytes))]
    if not isinstance(v, list) or len(v) % 2 or sum(v[1::2]) != nbytes:
        raise DpuAbiError(f"const tensor {t.name!r}: {DDR_RUNS} is not (offset, length) pairs of {nbytes} bytes")
    return [(int(a), int(n)) for a, n in zip(v[::2], v[1::2])]


def read_const_bytes(t: Tensor, blob: bytes, nbytes: int) -> bytes:
    """The `nbytes` bytes of a const tensor in row-major order, gathered from its register's parameter `blob`."""
    out = bytearray()
    for a, n in const_runs(t, nbytes):
        if a + n > len(blob):
            raise DpuAbiError(f"const tensor {t.name!r}: bytes [{a}, {a + n}) lie beyond the {len(blob)}-byte "
                              f"parameter blob")
        out += blob[a:a + n]
    return bytes(out)


def _write_interface_image(t: Tensor, spec: TensorSpec, what: str) -> None:
    if tuple(int(d) for d in t.shape) != tuple(spec.dims):
        raise DpuAbiError(f"{what} tensor {spec.name!r}: shape {list(spec.dims)} differs from its DDR image "
                          f"tensor {t.name!r} {list(t.shape)}")
    if spec.reg_id is None:
        raise DpuAbiError(f"{what} tensor {spec.name!r}: no register (reg_id)")
    write_image(t, spec.reg_id, int(spec.ddr_addr or 0), image_strides(spec))
    if t.fix_point is None and spec.fix_point is not None:
        t.attrs.set(FIX_POINT, int(spec.fix_point), TENSOR_ATTR_KINDS[FIX_POINT])


def write_input(graph: Graph, sg: Subgraph, spec: TensorSpec, op_names: list[str] | None = None) -> None:
    """Write the DDR image of input `spec` (produced by op `spec.op_name` outside the subgraph) onto the
    output tensor of the upload op that reads it."""
    names = _op_names(graph, sg, op_names)
    up = upload_of(graph, sg.name, names, spec.op_name)
    _write_interface_image(_output(graph, up), spec, "input")


def write_output(graph: Graph, sg: Subgraph, spec: TensorSpec) -> None:
    """Write the DDR image of output `spec` (op `spec.op_name` of the subgraph) onto its download's input
    tensor (or its own tensor when it is no download)."""
    if spec.op_name not in set(sg.all_ops()):
        raise DpuAbiError(f"subgraph {sg.name!r}: output {spec.name!r} comes from op {spec.op_name!r}, "
                          f"which is not in the subgraph")
    src = output_image_op(graph, sg.name, spec.op_name)
    _write_interface_image(_output(graph, src), spec, "output")


def write_interface(graph: Graph, sg: Subgraph, inputs: list[TensorSpec], outputs: list[TensorSpec],
                    registers: RegisterMap) -> None:
    """Write the DDR images of all interface tensors, each checked to lie inside its register of `registers`."""
    names = _op_names(graph, sg, None)
    for what, specs in (("input", inputs), ("output", outputs)):
        for s in specs:
            if s.reg_id not in registers.sizes:
                raise DpuAbiError(f"{what} tensor {s.name!r}: register REG_{s.reg_id} is not in the register map")
            image_extent(s, registers.sizes[s.reg_id], what)
            if registers.context.get(s.reg_id) == CONST:
                raise DpuAbiError(f"{what} tensor {s.name!r}: REG_{s.reg_id} is a CONST register")
    for s in inputs:
        write_input(graph, sg, s, names)
    for s in outputs:
        write_output(graph, sg, s)


__all__ = [
    "DpuAbiError", "Register", "RegisterMap", "DpuSubgraphSpec", "TensorSpec", "CONTEXT_TYPES", "CONTEXT_V1",
    "SUBGRAPH_ATTR_KINDS", "TENSOR_ATTR_KINDS", "MAX_DDR_BYTES", "reg_key", "read_reg_map", "read_registers",
    "read_dpu_subgraph", "read_inputs", "read_outputs", "tensor_spec", "dense_strides", "image_strides",
    "image_extent", "input_producers", "upload_of", "output_ops", "output_image_op", "write_registers",
    "write_dpu_subgraph", "write_image", "write_input", "write_output", "write_interface", "write_on_chip",
    "write_const_image", "const_runs", "read_const_bytes", "DDR_RUNS",
]
