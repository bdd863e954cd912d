"""Functional, bit-exact executor of DPUCZDX8G ISA1 programs (spec §2, §5.2, §5.3, §6).

`DpuMachine` holds the on-chip banks, the eight DDR registers and the INIT state, and executes
`isa.program.ProgramArrays` in program order (spec §5.2: dpdon/dpdby are ignored). The work is done by
one numba function (`sim._kernels.run_range`); errors come back as a status record that is turned into
`ExecError` here.
"""
from __future__ import annotations

import numpy as np

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.fields import FIELDS, MAX_FIELDS, OPS
from opendpu.isa import check as _check
from opendpu.isa.check import location, problem_message
from opendpu.isa.program import ProgramArrays
from opendpu.isa.target import Target

from . import _kernels as K
from ._fastmac import ensure_compiled
from ._vnni import HAVE_VNNI

NUM_REGS = _check.NUM_REGS
_REG_ALIGN = 4096


class ExecError(OpenDpuError, RuntimeError):
    """An instruction that the simulator would reject (spec §6, §9.17).

    Attributes: `index` (instruction index), `op` (mnemonic), `field` (field name or None),
    `value` (offending value or None). The text is built by isa.check.location / problem_message, which the
    static check (isa.check.check_program) uses too, so both report a bad instruction identically.
    """

    def __init__(self, index: int, op: str, field: str | None, msg: str, value: int | None = None,
                 kind: int | None = None):
        self.index = index
        self.op = op
        self.field = field
        self.value = value
        self.kind = kind          # error kind (isa.check.KIND_NAMES) when raised by the executor
        self.msg = msg
        super().__init__(f"{location(index, op, field, value)}: {msg}")


def _target_params(t: Target) -> np.ndarray:
    tp = np.zeros(K.NTP, np.int64)
    tp[K.T_PP] = t.pp
    tp[K.T_CP] = t.cp
    tp[K.T_ALUPP] = t.alu_pp
    tp[K.T_DEPTH] = t.bank_depth
    tp[K.T_NIMG] = t.num_img_banks
    tp[K.T_CONVW] = t.convw_base
    tp[K.T_DWCONVW] = t.dwconvw_bank
    tp[K.T_BIAS] = t.bias_bank
    tp[K.T_NBANKS] = t.num_banks
    tp[K.T_CVLK] = int(t.cv_lkrl)
    tp[K.T_DWLK] = int(t.dw_lkrl)
    tp[K.T_ARGMAX] = int(t.argmax)
    tp[K.T_CKMAX] = t.conv_kernel_max
    tp[K.T_CSMAX] = t.conv_stride_max
    tp[K.T_AKMAX] = t.alu_kernel_max
    tp[K.T_ASMAX] = t.alu_stride_max
    tp[K.T_CSOMAX] = t.conv_stride_out_h_max
    tp[K.T_ASOMAX] = t.alu_stride_out_h_max
    return tp


def checked_arrays(prog: ProgramArrays, op_dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous (op, fields) of a ProgramArrays, with the shape and opcode checks the kernels rely on."""
    op = np.ascontiguousarray(prog.op, dtype=op_dtype)
    fl = np.ascontiguousarray(prog.fields, dtype=np.int64)
    if op.ndim != 1 or fl.ndim != 2 or fl.shape[0] != len(op) or fl.shape[1] < MAX_FIELDS:
        raise ValueError(f"ProgramArrays: op must be [N] and fields [N, {MAX_FIELDS}], got {op.shape} and "
                         f"{fl.shape}")
    if len(op) and (int(op.min()) < 0 or int(op.max()) >= len(OPS)):
        raise ValueError(f"ProgramArrays.op holds values outside 0..{len(OPS) - 1}")
    return op, fl


_FILL_CACHE: dict[tuple[int, int, int], np.ndarray] = {}


def _random_fill(nbanks: int, nbytes: int, seed: int) -> np.ndarray:
    """Pseudo-random initial bank content in -16..16 (spec §2.3), deterministic by seed; cached
    (read-only) so that building many machines costs one copy each."""
    key = (nbanks, nbytes, int(seed))
    a = _FILL_CACHE.get(key)
    if a is None:
        a = np.random.default_rng(seed).integers(-16, 17, size=(nbanks, nbytes), dtype=np.int8)
        a.flags.writeable = False
        if len(_FILL_CACHE) >= 8:
            _FILL_CACHE.pop(next(iter(_FILL_CACHE)))
        _FILL_CACHE[key] = a
    return a


class DpuMachine:
    """One DPU core: banks, DDR registers REG_0..7, CONV/ALU/ELEW INIT state, statistics.

    banks: int8 [num_banks, bank_depth*bank_width] (one flat byte array per bank, spec §2.3).
    DDR: every allocated register is a zero-initialised int8 array of exactly reg_sizes[k] bytes
    (stored in one flat buffer, 4 KiB aligned); all range checks use the exact size (spec §2.6).
    fast: the arithmetic of CONV and ALU dwconv runs through vectorised exact kernels, and consecutive CONVs over
    the same input reuse its gathered tile (`sim._tilecache`), and CONV weights are converted once per bank line
    into a mirror in the kernel's layout until a LOAD rewrites them (`sim._weightcache`) (default). CONV runs on the
    CPU's int8 dot-product instruction (`sim._vnni`, "vnni") where the CPU has AVX-512 VNNI and CP is a multiple of
    4, else in float32 (`sim._fastmac`, "float32"); either name can be given to choose. False selects the scalar
    integer loops, bit-identical and slower, kept only as tests/test_sim_fast.py's reference.
    """

    def __init__(self, target: Target, reg_sizes: dict[int, int], init_fill: str = "random", seed: int = 0,
                 fast: bool | str = True):
        self.target = target
        self.fast = fast
        t = target
        self._tp = _target_params(t)
        nbytes = t.bank_depth * t.bank_width
        if init_fill == "random":
            self.banks = _random_fill(t.num_banks, nbytes, seed).copy()
        elif init_fill == "zero":
            self.banks = np.zeros((t.num_banks, nbytes), np.int8)
        else:
            raise ValueError(f"init_fill must be 'random' or 'zero', not {init_fill!r}")
        self._reg_size = np.full(NUM_REGS, -1, np.int64)
        self._reg_off = np.zeros(NUM_REGS, np.int64)
        off = 0
        for k, size in sorted(reg_sizes.items()):
            k, size = int(k), int(size)
            if not 0 <= k < NUM_REGS:
                raise ValueError(f"DDR register REG_{k} does not exist (REG_0..REG_{NUM_REGS - 1})")
            if size < 0:
                raise ValueError(f"DDR register REG_{k}: negative size {size}")
            self._reg_size[k] = size
            self._reg_off[k] = off
            off += -(-max(size, 1) // _REG_ALIGN) * _REG_ALIGN
        self._ddr = np.zeros(max(off, 1), np.int8)
        self._conv_st = np.zeros(MAX_FIELDS + 1, np.int64)
        self._alu_st = np.zeros(MAX_FIELDS + 1, np.int64)
        self._elew_st = np.zeros((4, MAX_FIELDS), np.int64)
        self._elew_ok = np.zeros(4, np.int64)
        self._counts = np.zeros(len(OPS), np.int64)
        self._ld_bytes = np.zeros(NUM_REGS, np.int64)
        self._sv_bytes = np.zeros(NUM_REGS, np.int64)
        self._err = np.zeros(8, np.int64)
        self._status = np.zeros(2, np.int64)
        self.pc = 0          # index after the last executed instruction
        self.ended = False   # an END has been executed

    @property
    def fast(self) -> bool | str:
        """The arithmetic in use: "vnni", "float32" or False (scalar loops); set True for the host's best."""
        return self._fast

    @fast.setter
    def fast(self, fast: bool | str) -> None:
        if fast is True:
            fast = "vnni" if HAVE_VNNI and self.target.cp % 4 == 0 else "float32"
        if fast not in (False, "float32", "vnni"):
            raise ValueError(f"fast must be True, False, 'float32' or 'vnni', not {fast!r}")
        if fast == "vnni" and self.target.cp % 4 != 0:
            raise ValueError(f"fast='vnni' needs CP a multiple of 4 (the target has CP {self.target.cp})")
        self._fast = fast
        self._fast_mode = {False: 0, "float32": K.FAST_FLOAT, "vnni": K.FAST_VNNI}[fast]

    # ---- DDR ---------------------------------------------------------------------------------------
    def _check_reg(self, reg: int) -> None:
        if not (0 <= reg < NUM_REGS) or self._reg_size[reg] < 0:
            raise ValueError(f"DDR register REG_{reg} is not allocated (allocated: {self._alloc_str()})")

    def _alloc_str(self) -> str:
        return _check.allocated_str(k for k in range(NUM_REGS) if self._reg_size[k] >= 0)

    def ddr(self, reg: int) -> np.ndarray:
        """The whole int8 array of register `reg` (a view of exactly reg_sizes[reg] bytes)."""
        self._check_reg(reg)
        o = int(self._reg_off[reg])
        return self._ddr[o:o + int(self._reg_size[reg])]

    def write_ddr(self, reg: int, offset: int, data) -> None:
        self._check_reg(reg)
        if isinstance(data, (bytes, bytearray, memoryview)):
            arr = np.frombuffer(bytes(data), np.int8)
        else:
            arr = np.asarray(data)
            if arr.dtype != np.int8:
                if arr.dtype == np.uint8:
                    arr = arr.view(np.int8)
                else:
                    arr = arr.astype(np.int8)
            arr = arr.reshape(-1)
        size = int(self._reg_size[reg])
        if offset < 0 or offset + arr.size > size:
            raise ValueError(f"write of {arr.size} bytes at offset {offset} does not fit in REG_{reg} "
                             f"({size} bytes)")
        self.ddr(reg)[offset:offset + arr.size] = arr

    def read_ddr(self, reg: int, offset: int, nbytes: int) -> np.ndarray:
        self._check_reg(reg)
        size = int(self._reg_size[reg])
        if offset < 0 or nbytes < 0 or offset + nbytes > size:
            raise ValueError(f"read of {nbytes} bytes at offset {offset} exceeds REG_{reg} ({size} bytes)")
        return self.ddr(reg)[offset:offset + nbytes].copy()

    # ---- statistics --------------------------------------------------------------------------------
    @property
    def stats(self) -> dict:
        """{'counts': {mnemonic: executed}, 'load_bytes': {reg: bytes read from DDR by LOAD},
        'save_bytes': {reg: bytes written to DDR by SAVE}} — cumulative over all run() calls."""
        return {
            "counts": {o.mnemonic: int(self._counts[j]) for j, o in enumerate(OPS) if self._counts[j]},
            "load_bytes": {k: int(self._ld_bytes[k]) for k in range(NUM_REGS) if self._ld_bytes[k]},
            "save_bytes": {k: int(self._sv_bytes[k]) for k in range(NUM_REGS) if self._sv_bytes[k]},
        }

    # ---- execution ---------------------------------------------------------------------------------
    def run(self, prog: ProgramArrays, start: int = 0, stop: int | None = None,
            index_map: np.ndarray | None = None) -> None:
        """Execute instructions [start, stop) in array order; stops early after END.

        `index_map[i]` is the instruction number reported in errors for array row i (for a program that
        was reordered, e.g. into the start order of the cycle model)."""
        n = len(prog)
        if stop is None or stop > n:
            stop = n
        if start < 0 or start > stop:
            raise ValueError(f"bad instruction range [{start}, {stop}) for a program of {n}")
        op, fl = checked_arrays(prog, np.int32)
        self._err[:] = 0
        ensure_compiled()                       # the SLP-vectorised CONV tile, before run_range can compile it
        K.run_range(op, fl, start, stop, self.banks, self._ddr, self._reg_off, self._reg_size, self._tp,
                    self._conv_st, self._alu_st, self._elew_st, self._elew_ok, self._counts,
                    self._ld_bytes, self._sv_bytes, self._err, self._status, self._fast_mode)
        self.pc = int(self._status[0])
        self.ended = bool(self._status[1])
        if self._err[0] != 0:
            raise self._make_error(index_map)

    def _make_error(self, index_map=None) -> ExecError:
        kind, idx, opi, col, v, lo, hi, aux = (int(x) for x in self._err)
        if index_map is not None:
            idx = int(index_map[idx])
        mn = OPS[opi].mnemonic
        fname = FIELDS[mn][col].name if col >= 0 else None
        jb = int(self._elew_st[aux, K.EI_JB]) if kind == K.E_JUMP_BANK else None
        allocated = [k for k in range(NUM_REGS) if self._reg_size[k] >= 0]
        msg = problem_message(kind, mn, self.target, v, lo, hi, aux, allocated, jb)
        return ExecError(idx, mn, fname, msg, v if fname is not None else None, kind=kind)
