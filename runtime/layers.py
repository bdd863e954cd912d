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

from opendpu.isa.fields import FIELD_INDEX
from opendpu.isa.program import OP_INDEX
from opendpu.runtime.dpu import DpuSubgraph, TensorSpec, ddr_view, image_strides, tensor_spec
from opendpu.runtime.ops import output_of

_SAVE = OP_INDEX["SAVE"]
_SF = FIELD_INDEX["SAVE"]

SKIP_TYPES = {"upload", "download", "const-fix", "const", "data-fix", "data"}


@dataclass
class _Watch:
    spec: TensorSpec
    lo: int
    hi: int                     # inclusive byte range of the image
    size: int
    stride: tuple               # element strides of the image (outermost first)
    strides_desc: list          # (stride, dim) sorted by stride descending, for membership tests
    pending: int = 0
    arm: int = 0
    captures: int = 0
    matched: bool | None = None
    value: np.ndarray | None = None
    bad_saves: int = 0
    first_bad: tuple | None = None     # (SAVE instruction index, bytes differing, bytes written)


@dataclass
class LayerReport:
    captured: dict[str, np.ndarray] = field(default_factory=dict)    # op name -> int8 value
    status: dict[str, str] = field(default_factory=dict)            # op name -> ok / MISMATCH / on-chip
    order: list[str] = field(default_factory=list)                  # op names in topological order
    detail: dict[str, tuple] = field(default_factory=dict)          # op -> (SAVE index, bytes off, bytes)

    def first_mismatch(self) -> str | None:
        for n in self.order:
            if self.status.get(n) == "MISMATCH":
                return n
        return None


def _watch_list(dpu: DpuSubgraph) -> list[_Watch]:
    out = []
    for n in dpu.op_names:
        op = dpu.graph.ops[n]
        t = output_of(op)
        if op.type in SKIP_TYPES or not t.is_fixed or t.attrs.get("reg_id") is None:
            continue
        if dpu.reg_context.get(t.attrs["reg_id"]) == "CONST" or t.attrs.get("location", 1) != 1:
            continue
        spec = tensor_spec(t, n)
        dims = spec.dims
        stride = image_strides(spec)
        lo = int(spec.ddr_addr or 0)
        hi = lo + sum((d - 1) * s for d, s in zip(dims, stride))
        size = int(np.prod(dims))
        sd = sorted(((int(s), int(d)) for s, d in zip(stride, dims) if d > 1), reverse=True)
        out.append(_Watch(spec, lo, hi, size, stride, sd, pending=size))
    return out


def _locate(w: _Watch, addr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mask of addresses inside the tensor's image, flat row-major element index of each)."""
    rem = addr - w.lo
    ok = rem >= 0
    idx = {}
    for s, d in w.strides_desc:
        q = np.clip(rem // s, 0, d - 1)
        ok &= (rem // s) < d
        idx[s] = q
        rem = rem - q * s
    ok &= rem == 0
    flat = np.zeros_like(addr)
    for s, d in zip(w.stride, w.spec.dims):
        flat = flat * d + (idx.get(int(s), 0) if d > 1 else 0)
    return ok, flat


def _attribute(watches, addr, old, amin, amax, ddr, reference, k, index) -> None:
    """Reference mode (spec §10 checker): a SAVE belongs to the tensor whose reference bytes it reproduces."""
    vals = ddr[addr]
    best, best_frac, best_diff, exact = None, -1.0, 0, False
    for w in watches:
        if w.hi < amin or w.lo > amax:
            continue
        exp_arr = reference.get(w.spec.op_name)
        if exp_arr is None:
            continue
        inimg, flat = _locate(w, addr)
        if not inimg.any():
            continue
        eq = exp_arr.reshape(-1)[flat[inimg]].astype(np.int8) == vals[inimg]
        frac = float(eq.mean())
        if frac == 1.0:
            exact = True
            if w.matched:
                continue
            m = inimg & (old <= w.arm)
            w.pending -= int(np.unique(addr[m]).size)
            if w.pending <= 0:
                w.value = np.array(ddr_view(ddr, w.spec, "layer"), dtype=np.int8)
                w.captures += 1
                w.matched = np.array_equal(w.value, exp_arr.astype(np.int8))
                if not w.matched:         # complete but stale bytes inside: wait for later rewrites
                    w.arm, w.pending = k, w.size
        elif frac > best_frac:
            best, best_frac, best_diff = w, frac, int((~eq).sum())
    if not exact and best is not None:
        best.bad_saves += 1
        if best.first_bad is None:
            best.first_bad = (index, best_diff, int(addr.size))


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
        assert w.spec.reg_id is not None           # _watch_list keeps images that lie in a register
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
        if reference is not None:
            _attribute(by_reg[reg], addr, old, amin, amax, machine.ddr(reg), reference, k, int(i))
            serial[reg][addr] = k
            continue
        for w in by_reg[reg]:
            if w.hi < amin or w.lo > amax:
                continue
            inimg, _ = _locate(w, addr)
            m = inimg & (old <= w.arm)
            if not m.any():
                continue
            w.pending -= int(np.unique(addr[m]).size)
            if w.pending <= 0:      # every byte of the image (re)written since the last capture
                w.value = np.array(ddr_view(machine.ddr(reg), w.spec, "layer"), dtype=np.int8)
                w.captures += 1
                w.arm, w.pending = k, w.size
        serial[reg][addr] = k
    machine.run(prog, pos, len(prog))
    outputs = dpu.read_outputs(machine)
    rep = LayerReport(order=list(dpu.op_names))
    for w in watches:
        n = w.spec.op_name
        if w.value is not None:
            rep.captured[n] = w.value
        if reference is not None and n in reference:
            if w.matched:
                rep.status[n] = "ok"
            elif w.bad_saves and w.first_bad is not None:      # (the first bad SAVE is recorded with the count)
                rep.status[n] = "MISMATCH"
                rep.detail[n] = w.first_bad
            else:
                rep.status[n] = "on-chip"
        else:
            rep.status[n] = "stored" if w.captures else "on-chip"
    return outputs, rep
