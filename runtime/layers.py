"""Per-layer observation of a DPU program run: which intermediate tensors it stores to DDR, and when.

Release programs keep many tensors on chip and reuse WORKSPACE space (spec §8.3, C6), so a tensor's DDR
image is meaningful only between the SAVEs that complete it and the next overwrite. The program is run
in chunks ending at each SAVE; a byte-level "last written by SAVE #k" map per register tells when every
byte of a tensor's image has been (re)written since the tensor was last captured. At that moment its
image is captured (and compared with the reference when one is given).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from isa.fields import FIELD_INDEX
from isa.program import OP_INDEX
from runtime.dpu import DpuSubgraph, TensorSpec, ddr_view, tensor_spec

_SAVE = OP_INDEX["SAVE"]
_SF = FIELD_INDEX["SAVE"]

SKIP_TYPES = {"upload", "download", "const-fix", "const", "data-fix", "data"}


@dataclass
class _Watch:
    spec: TensorSpec
    lo: int
    hi: int                     # inclusive byte range of the image
    size: int
    strides_desc: list          # (stride, dim) sorted by stride descending, for membership tests
    pending: int = 0
    arm: int = 0
    captures: int = 0
    matched: bool | None = None
    value: np.ndarray | None = None


@dataclass
class LayerReport:
    captured: dict[str, np.ndarray] = field(default_factory=dict)    # op name -> int8 value
    status: dict[str, str] = field(default_factory=dict)            # op name -> ok / MISMATCH / on-chip
    order: list[str] = field(default_factory=list)                  # op names in topological order

    def first_mismatch(self) -> str | None:
        for n in self.order:
            if self.status.get(n) == "MISMATCH":
                return n
        return None


def _watch_list(dpu: DpuSubgraph) -> list[_Watch]:
    out = []
    for n in dpu.op_names:
        op = dpu.graph.ops[n]
        t = op.output
        if op.type in SKIP_TYPES or not t.is_fixed or t.attrs.get("reg_id") is None:
            continue
        if dpu.reg_context.get(t.attrs["reg_id"]) == "CONST" or t.attrs.get("location", 1) != 1:
            continue
        spec = tensor_spec(t, n)
        dims = spec.dims
        stride = list(spec.stride) if spec.stride else None
        if stride is None:
            stride, acc = [], 1
            for d in reversed(dims):
                stride.insert(0, acc)
                acc *= d
        lo = int(spec.ddr_addr or 0)
        hi = lo + sum((d - 1) * s for d, s in zip(dims, stride))
        size = int(np.prod(dims))
        sd = sorted(((int(s), int(d)) for s, d in zip(stride, dims) if d > 1), reverse=True)
        out.append(_Watch(spec, lo, hi, size, sd, pending=size))
    return out


def _in_image(w: _Watch, addr: np.ndarray) -> np.ndarray:
    rem = addr - w.lo
    ok = rem >= 0
    for s, d in w.strides_desc:
        q = rem // s
        ok &= q < d
        rem = rem - np.minimum(q, d - 1) * s
    return ok & (rem == 0)


def run_tracked(dpu: DpuSubgraph, machine, inputs: list[np.ndarray], reference: dict | None = None):
    """Run the subgraph's program on `machine`, capturing each stored intermediate tensor.

    Returns (outputs, LayerReport). `reference` maps op name -> expected int8 array.
    """
    inputs = dpu.check_inputs(inputs)
    for r in dpu.reg_sizes:
        if dpu.reg_context.get(r) != "CONST":
            machine.ddr(r)[...] = 0
    dpu.write_inputs(machine, inputs)
    prog = dpu.arrays
    watches = _watch_list(dpu)
    by_reg: dict[int, list[_Watch]] = {}
    for w in watches:
        by_reg.setdefault(w.spec.reg_id, []).append(w)
    serial = {r: np.zeros(machine.ddr(r).size, np.int32) for r in by_reg}
    saves = np.nonzero(prog.op == _SAVE)[0]
    pos = 0
    for k, i in enumerate(saves, start=1):
        machine.run(prog, pos, int(i) + 1)
        pos = int(i) + 1
        f = prog.fields[i]
        reg = int(f[_SF["reg_id"]])
        if reg not in by_reg:
            continue
        length, channel = int(f[_SF["length"]]), int(f[_SF["channel"]])
        if int(f[_SF["argmax"]]) & 2:
            channel = 1
        base = int(f[_SF["ddr_addr"]]) + np.arange(length, dtype=np.int64) * int(f[_SF["jump_write"]])
        addr = (base[:, None] + np.arange(channel, dtype=np.int64)[None, :]).ravel()
        addr = addr[addr < serial[reg].size]
        if addr.size == 0:
            continue
        amin, amax = int(addr.min()), int(addr.max())
        old = serial[reg][addr]
        for w in by_reg[reg]:
            if w.hi < amin or w.lo > amax:
                continue
            m = _in_image(w, addr) & (old <= w.arm)
            if not m.any():
                continue
            w.pending -= int(np.unique(addr[m]).size)
            if w.pending <= 0:
                val = np.array(ddr_view(machine.ddr(reg), w.spec, "layer"), dtype=np.int8)
                w.captures += 1
                exp = reference.get(w.spec.op_name) if reference is not None else None
                if exp is not None:
                    same = val.shape == exp.shape and np.array_equal(val, exp)
                    if same or w.matched is None or not w.matched:
                        w.value = val
                    w.matched = bool(w.matched) or same
                else:
                    w.value = val
                w.arm, w.pending = k, w.size
        serial[reg][addr] = k
    machine.run(prog, pos, len(prog))
    outputs = dpu.read_outputs(machine)
    rep = LayerReport(order=list(dpu.op_names))
    for w in watches:
        n = w.spec.op_name
        if w.captures == 0:
            rep.status[n] = "on-chip"
            continue
        rep.captured[n] = w.value
        if reference is not None and n in reference:
            rep.status[n] = "ok" if w.matched else "MISMATCH"
        else:
            rep.status[n] = "stored"
    return outputs, rep
