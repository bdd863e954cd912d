"""Static program check (isa/check.py), its use by the runtime (DpuSubgraph.validate) and the disasm
listing (isa.disasm.disasm, runtime.disasm.disasm_subgraph).

The check must agree with the functional executor: on mutated valid programs it reports a problem iff
`DpuMachine.run` raises ExecError, and its first problem is that error (index, field, value, kind, text).
"""
from __future__ import annotations

import random
import time

import numpy as np
import pytest

from opendpu.compiler.xir.graph import Graph
from helpers import ins
from work_count import count_work
from opendpu.isa.check import (KIND_NAMES, E_DDR_READ, E_DDR_WRITE, E_NOINIT, ProgramCheckError, check_program,
                       validate_program)
from opendpu.isa.fields import FIELD_INDEX, FIELDS, OPS
from opendpu.isa.disasm import disasm
from opendpu.isa.program import (IsaError, OP_INDEX, ProgramArrays, decode, decode_lenient, encode, from_text,
                         to_arrays, to_text)
from opendpu.isa.target import Target
from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
from opendpu.sim.executor import DpuMachine, ExecError
from opendpu.sim.progen import random_program
from tests.conftest import MODEL_NAMES, model_path

B512 = Target.from_name("B512")
B4096 = Target.from_name("B4096")
# no SAVE argmax, no CONV leaky ReLU, ALU leaky ReLU: reaches the target-dependent kinds
ODD = Target.parametric(4, 8, 2, argmax=False, cv_lkrl=False, dw_lkrl=True)
TARGETS = (B512, Target.from_name("B1024"), ODD)


# ---- the oracle: static check vs executor --------------------------------------------------------------
def verdict(arr: ProgramArrays, t: Target, sizes: dict, init: dict | None = None) -> int:
    """Run the static check and the executor (fresh zero machine, program order); assert they agree and
    return the error kind (0 = accepted)."""
    probs = check_program(arr, t, sizes)
    m = DpuMachine(t, sizes, init_fill="zero")
    for r, d in (init or {}).items():
        m.write_ddr(r, 0, d)
    try:
        m.run(arr)
        err = None
    except ExecError as e:
        err = e
    first = probs[0].text if probs else None
    assert (err is None) == (not probs), f"executor: {err}; static check: {first}"
    if err is None:
        return 0
    p = probs[0]
    assert (p.index, p.op, p.field, p.value, p.kind) == (err.index, err.op, err.field, err.value, err.kind)
    assert p.text == str(err)
    return p.kind


def copy_arrays(a: ProgramArrays) -> ProgramArrays:
    return ProgramArrays(a.op.copy(), a.dpdon.copy(), a.dpdby.copy(), a.fields.copy())


def drop(a: ProgramArrays, i: int) -> ProgramArrays:
    k = np.arange(len(a)) != i
    return ProgramArrays(a.op[k], a.dpdon[k], a.dpdby[k], a.fields[k])


def col(op: str, name: str) -> int:
    return FIELD_INDEX[op][name]


_BASES: dict = {}


def base(t: Target, k: int):
    key = (t, k)
    if key not in _BASES:
        _BASES[key] = random_program(t, 20, seed=1000 + k)
    return _BASES[key]


def candidates(t: Target, mn: str, f, row: np.ndarray, sizes: dict, rng: random.Random) -> list[int]:
    """Values for field `f` of an instruction `row`: its bounds, neighbours of the current value, target
    limits and the exact DDR boundaries of LOAD/SAVE."""
    v = int(row[col(mn, f.name)])
    c = [f.lo, f.hi, v - 1, v + 1, rng.randint(f.lo, min(f.hi, max(2 * v, 16)))]
    if f.name.startswith("bank_id"):
        c += [t.num_img_banks - 1, t.num_img_banks, t.num_banks - 1, t.num_banks]
    if f.name in ("reg_id", "id"):
        c += list(range(f.hi + 1))
    if mn in ("LOAD", "SAVE"):
        g = {x.name: int(row[col(mn, x.name)]) for x in FIELDS[mn]}
        size = sizes.get(g["reg_id"], 0)
        step = g["jump_read"] if mn == "LOAD" else g["jump_write"]
        span = (g["length"] - 1) * step + g["channel"]
        if f.name == "ddr_addr":
            c += [size - span, size - span + 1, size - span - 1]
        if f.name == "length":
            n_fit = (size - g["ddr_addr"] - g["channel"]) // max(step, 1) + 1
            c += [n_fit, n_fit + 1]
        if f.name == "channel":
            c += [size - g["ddr_addr"] - (g["length"] - 1) * step + k for k in (0, 1)]
    return [x for x in c if f.lo <= x <= f.hi]


def mutate(t: Target, gp, rng: random.Random) -> ProgramArrays:
    a = copy_arrays(gp.arrays)
    n = len(a)
    r = rng.random()
    if r < 0.06:                                    # drop one instruction (INIT state, ELEWINIT ids)
        return drop(a, rng.randrange(n - 1))
    if r < 0.09:                                    # a legacy instruction in place of one
        a.op[rng.randrange(n - 1)] = OP_INDEX[rng.choice(("POOLINIT", "POOL", "DWINIT", "DPTWISE"))]
        return a
    for _ in range(1 + (rng.random() < 0.25)):      # one field (sometimes two) of one instruction
        i = rng.randrange(n - 1)
        mn = OPS[int(a.op[i])].mnemonic
        if not FIELDS[mn]:
            continue
        f = rng.choice(FIELDS[mn])
        a.fields[i, col(mn, f.name)] = rng.choice(candidates(t, mn, f, a.fields[i], gp.reg_sizes, rng))
    return a


def test_mutated_programs_agree_with_the_executor():
    rng = random.Random(11)
    seen: dict[int, int] = {}
    n_cases = 0
    t0 = time.perf_counter()
    for t in TARGETS:
        for k in range(8):
            gp = base(t, k)
            assert verdict(gp.arrays, t, gp.reg_sizes, gp.reg_init) == 0
            for _ in range(60):
                kind = verdict(mutate(t, gp, rng), t, gp.reg_sizes, gp.reg_init)
                seen[kind] = seen.get(kind, 0) + 1
                n_cases += 1
    dt = time.perf_counter() - t0
    print(f"{n_cases} mutated programs in {dt:.1f} s; kinds: "
          + ", ".join(f"{KIND_NAMES[k]} {c}" for k, c in sorted(seen.items())))
    assert seen.get(0, 0) > 50 and len(seen) >= 20       # both verdicts and most kinds occur


# ---- every error kind, by a hand-made program ----------------------------------------------------------
SIZES = {0: 4096, 1: 4096}
T32 = Target.parametric(8, 32, 8)          # CP 32, ALU_PP 8: the only way to an ELEW tile above MAX_TILE


def _ld(**kw):
    return ins("LOAD", **{"channel": 8, "jump_read": 8, **kw})


def _sv(**kw):
    return ins("SAVE", **{"channel": 8, "reg_id": 1, **kw})


def _prog(*instrs, raw: dict | None = None) -> ProgramArrays:
    """Program of `instrs` + END; `raw` {(row, field): value} writes values no mc_code can encode."""
    a = to_arrays(list(instrs) + [ins("END")])
    for (i, name), v in (raw or {}).items():
        a.fields[i, col(OPS[int(a.op[i])].mnemonic, name)] = v
    return a


CI, AI, EI = ins("CONVINIT"), ins("ALUINIT"), ins("ELEWINIT")
# (kind name, target, program): at least one case per kind
KIND_CASES = [
    ("bank_any", B512, _prog(_ld(bank_id=18))),
    ("bank_img", B512, _prog(_sv(bank_id=8))),
    ("bank_img", B512, _prog(CI, ins("CONV", bank_id_out=8))),
    ("bank_img", B512, _prog(AI, ins("ALU", bank_id_in=8))),
    ("bank_img", B512, _prog(ins("ELEWINIT", bank_id_in=8))),
    ("bank_img", B512, _prog(EI, ins("ELEW", bank_id_out=12))),
    ("reg", B512, _prog(_ld(reg_id=5))),
    ("reg", B512, _prog(_sv(reg_id=7))),
    ("mode_avg", B512, _prog(_ld(mode_avg=2))),
    ("pad_start", B512, _prog(_ld(pad_start=8))),
    ("pad_end", B512, _prog(_ld(pad_end=8))),
    ("ddr_read", B512, _prog(_ld(ddr_addr=4089))),
    ("ddr_write", B512, _prog(_sv(ddr_addr=4089))),
    ("argmax_target", ODD, _prog(_sv(argmax=2))),
    ("argmax_ch", B512, _prog(_sv(argmax=3, channel=129))),
    ("noinit", B512, _prog(ins("CONV"))),
    ("noinit", B512, _prog(ins("ALU"))),
    ("vpp", B512, _prog(ins("CONVINIT", valid_pixel_parallel=5))),
    ("vpp", B512, _prog(AI, ins("ALU", valid_pixel_parallel=3))),
    ("vpp", B512, _prog(EI, ins("ELEW", valid_pixel_parallel=3))),
    ("kernel", B512, _prog(CI, raw={(0, "kernel_h"): 17})),                 # beyond the 4-bit field
    ("kernel", B512, _prog(AI, raw={(0, "kernel_w"): 257})),                # beyond the 8-bit field
    ("stride", B512, _prog(ins("CONVINIT", stride_w=9))),
    ("stride", B512, _prog(AI, raw={(0, "stride_h"): 257})),
    ("stride_out", B512, _prog(ins("CONVINIT", stride_out=5))),              # B512: stride_out_h 1-4
    ("stride_out", B512, _prog(ins("ALUINIT", stride_out=16))),
    ("soi", B512, _prog(ins("CONVINIT", stride_offset_in=1))),
    ("soi", B512, _prog(ins("ALUINIT", stride_offset_in=3, stride_h=3))),
    ("shift_bias", B512, _prog(ins("ALUINIT", shift_bias=21))),
    ("act", B512, _prog(ins("CONVINIT", act_type=2))),
    ("act", ODD, _prog(ins("CONVINIT", act_type=3))),
    ("act", B512, _prog(ins("ALUINIT", act_type=3))),
    ("pass", B512, _prog(ins("CONVINIT", kernel_h=16, valid_pixel_parallel=4), ins("CONV"))),
    ("pass", B512, _prog(ins("ALUINIT", kernel_h=16), ins("ALU", bank_id_in=3, valid_pixel_parallel=2))),
    ("exec_mode", B512, _prog(ins("ALUINIT", exec_mode=9))),
    ("alu_1x1", B512, _prog(ins("ALUINIT", exec_mode=1, kernel_w=2))),
    ("alu_1x1", B512, _prog(ins("ALUINIT", exec_mode=7, stride_h=2))),
    ("kd", B512, _prog(ins("ALUINIT", exec_mode=4), ins("ALU", kernel_d=2))),
    ("elew_type", B512, _prog(EI, ins("ELEW", elew_type=2))),
    ("elew_num", B512, _prog(EI, ins("ELEW", elew_type=1, num=3))),
    ("elew_id", B512, _prog(EI, ins("ELEW", num=2))),
    ("elew_id", B512, _prog(ins("ELEWINIT", id=1), ins("ELEW", num=2))),
    ("jump_bank", B512, _prog(ins("ELEWINIT", jump_bank=3), ins("ELEW", valid_pixel_parallel=2))),
    ("legacy", B512, _prog(ins("POOLINIT"))),
    ("legacy", B512, _prog(ins("DPTWISE"))),
    ("too_big", B512, _prog(ins("CONVINIT", kernel_h=16, stride_h=8, valid_pixel_parallel=4),
                            ins("CONV", channel_group=256, length=1024))),
    ("too_big", B512, _prog(ins("ALUINIT", kernel_h=16, stride_h=16, length=2048, channel_group=256),
                            ins("ALU", valid_pixel_parallel=2))),
    ("too_big", T32, _prog(EI, ins("ELEW", valid_pixel_parallel=8, length=2048, channel_group=256))),
]


# What each kind's message must say, written by hand from the spec's rule (independent of the message table
# that the executor and the check share): a mis-wired kind -> message entry fails here.
KIND_WORDS = {
    "bank_any": "does not exist", "bank_img": "is not an image bank", "reg": "is not allocated",
    "mode_avg": "mean-subtraction LOAD", "pad_start": "pad_start must be smaller than channel",
    "pad_end": "end padding masks every byte", "ddr_read": "past the end of the register",
    "ddr_write": "but the register has", "argmax_target": "argmax is not available",
    "argmax_ch": "more than 128 channels", "noinit": "executed before any", "vpp": "valid_pixel_parallel exceeds",
    "kernel": "kernel size above the target limit", "stride": "stride above the target limit",
    "soi": "stride_offset_in must be smaller than stride_h", "shift_bias": "shift_bias too large",
    "act": "is not supported by the", "pass": "only 4 pass addresses exist", "exec_mode": "is illegal on ISA1",
    "alu_1x1": "requires kernel 1x1 and stride 1", "kd": "requires kernel_d 1", "elew_type": "elew_type",
    "elew_num": "needs exactly 2 inputs", "elew_id": "no ELEWINIT with id", "jump_bank": "jump_bank",
    "legacy": "is not usable on ISA1 targets", "too_big": "exceeds the emulator limit",
    "stride_out": "stride_out above the target limit (allowed 1..4",
}


@pytest.mark.parametrize("kind,t,a", KIND_CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(KIND_CASES)])
def test_each_error_kind_is_found_statically(kind, t, a):
    sizes = {0: 4096, 1: 4096}
    assert KIND_NAMES[verdict(a, t, sizes)] == kind
    assert KIND_WORDS[kind] in check_program(a, t, sizes)[0].message, check_program(a, t, sizes)[0].message
    with pytest.raises(ProgramCheckError) as ei:
        validate_program(a, t, sizes, prefix="P: ")
    e = ei.value
    assert isinstance(e, IsaError) and str(e) == "P: " + check_program(a, t, sizes)[0].text
    assert KIND_NAMES[e.kind] == kind and e.index == check_program(a, t, sizes)[0].index


def test_kind_cases_cover_every_kind():
    assert {c[0] for c in KIND_CASES} == set(KIND_NAMES[1:])


def test_instructions_after_end_and_valid_programs():
    a = _prog(_ld(), CI, ins("CONV"), AI, ins("ALU"), EI, ins("ELEW"), _sv())
    assert verdict(a, B512, SIZES) == 0 and check_program(a, B512, SIZES) == []
    # a broken instruction after END is never executed and not reported
    b = to_arrays([_ld(), ins("END"), _ld(bank_id=40)])
    assert verdict(b, B512, SIZES) == 0
    # unknown register sizes: register and DDR checks are skipped, the others stay
    assert check_program(_prog(_ld(reg_id=5, ddr_addr=1 << 28)), B512, None) == []
    assert [p.kind_name for p in check_program(_prog(_ld(reg_id=5, bank_id=40)), B512, None)] == ["bank_any"]
    # every bad instruction is reported, one problem each, in program order
    c = _prog(_ld(bank_id=40, reg_id=5), _sv(reg_id=6), ins("ELEW", elew_type=3))
    ps = check_program(c, B512, SIZES)
    assert [(p.index, p.kind_name, p.field) for p in ps] == [(0, "bank_any", "bank_id"), (1, "reg", "reg_id"),
                                                             (2, "elew_type", "elew_type")]
    assert ps[1].text == ("instruction 1 (SAVE): field reg_id=6: DDR register REG_6 is not allocated "
                          "(allocated: REG_0, REG_1)")
    # a rejected INIT leaves no state behind: the CONV after it has none
    d = check_program(_prog(ins("CONVINIT", shift_bias=21), ins("CONV")), B512, SIZES)
    assert [(p.index, p.kind_name) for p in d] == [(0, "shift_bias"), (1, "noinit")]
    with pytest.raises(ValueError, match="REG_9 does not exist"):
        check_program(c, B512, {9: 10})


# ---- hand-computed DDR bounds ----------------------------------------------------------------------------
def _one(t, instr, sizes):
    return verdict(_prog(instr), t, sizes), check_program(_prog(instr), t, sizes)


def test_load_reading_the_last_byte_passes_one_more_fails():
    # 4 items of 40 bytes every 100 bytes (jump_read 100 > channel: no augmentation): the last byte read is
    # ddr_addr + 3*100 + 39, so ddr_addr 660 ends exactly at byte 999 of a 1000-byte register
    ld = dict(channel=40, jump_read=100, length=4, reg_id=0)
    assert _one(B512, _ld(ddr_addr=660, **ld), {0: 1000}) == (0, [])
    kind, ps = _one(B512, _ld(ddr_addr=661, **ld), {0: 1000})
    assert kind == E_DDR_READ
    assert ps[0].text == ("instruction 0 (LOAD): field ddr_addr=661: reads REG_0 up to byte offset 1000 "
                          "(unmasked bytes only), past the end of the register (allowed offsets 0..999, size 1000)")
    # the same with the length: 4 items fit after ddr_addr 660, 5 do not
    assert _one(B512, _ld(ddr_addr=560, **{**ld, "length": 5}), {0: 1000})[0] == 0
    assert _one(B512, _ld(ddr_addr=561, **{**ld, "length": 5}), {0: 1000})[0] == E_DDR_READ


def test_load_bound_counts_unmasked_bytes_only():
    # channel augmentation on B512 (CP 8): channel 6, jump_read 3 <= channel, 4 items, pad_idx 2, pad_end 2.
    # Items 2 and 3 are end-padded: item it >= length-pad_idx keeps bytes [0, 8 - (2 + 3*(it-2))), i.e.
    # item 2 bytes 0..5, item 3 bytes 0..2. Item 2 ends at ddr_addr+6+6, item 3 at ddr_addr+9+3: the last
    # byte read is ddr_addr+11 (not ddr_addr+14, the end of item 3 unmasked).
    ld = dict(channel=6, jump_read=3, length=4, pad_idx=2, pad_end=2, reg_id=0)
    assert _one(B512, _ld(ddr_addr=88, **ld), {0: 100}) == (0, [])
    kind, ps = _one(B512, _ld(ddr_addr=89, **ld), {0: 100})
    assert kind == E_DDR_READ and ps[0].lo == 101            # first failing item is item 2: 89+6+6
    assert ps[0].message == ("reads REG_0 up to byte offset 100 (unmasked bytes only), past the end of the "
                             "register (allowed offsets 0..99, size 100)")
    # a broadcast LOAD (broadcast 7) reads no DDR at all
    assert _one(B512, _ld(ddr_addr=5000, broadcast=7, reg_id=4), {0: 100}) == (0, [])


def test_save_writing_the_last_byte_passes_one_more_fails():
    sv = dict(channel=40, jump_write=100, length=4, reg_id=0)
    assert _one(B512, _sv(ddr_addr=660, **sv), {0: 1000}) == (0, [])
    kind, ps = _one(B512, _sv(ddr_addr=661, **sv), {0: 1000})
    assert kind == E_DDR_WRITE
    assert ps[0].text == ("instruction 0 (SAVE): field ddr_addr=661: writes REG_0 bytes [661, 1001) but the "
                          "register has 1000 bytes (ddr_addr+(length-1)*jump_write+channel = 1001 must be <= 1000)")


# ---- the real models ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_shared_models_pass_the_check(name):
    """Each DPU subgraph passes, and the check is vectorised: its Python work (tests/work_count.py) is that of a
    20-instruction program, whatever the length (19 to 33,068 instructions); wall times: benchmarks/bench_checks.py."""
    small = random_program(B4096, n=20, seed=3)
    check_program(small.arrays, B4096, small.reg_sizes)            # first use: not counted
    with count_work() as base:
        assert check_program(small.arrays, B4096, small.reg_sizes) == []
    g = Graph.load(model_path(name))
    for sg in dpu_subgraphs(g):
        dpu = DpuSubgraph(g, sg)
        arr = dpu.arrays
        with count_work() as work:
            ps = check_program(arr, dpu.target, dpu.reg_sizes)
        assert ps == [], f"{sg.name}: {ps[:3]}"
        print(f"{sg.name}: {len(arr)} instructions checked with work {work} (20 instructions: {base})")
        assert work.total <= 1.5 * base.total, f"{sg.name}: {len(arr)} instructions, work {work}; 20: {base}"
        dpu.validate()
        assert dpu.check() is dpu.check(dpu.target)           # cached per target


def _mnist_with(mutate_fn):
    """The MNIST graph and its DPU subgraph with the program changed by mutate_fn(instructions, dpu)."""
    g = Graph.load(model_path("dpu_mnist_classifier"))
    sg = dpu_subgraphs(g)[0]
    dpu = DpuSubgraph(g, sg)
    prog = decode(dpu.mc_code)
    mutate_fn(prog, dpu)
    sg.attrs["mc_code"] = encode(prog)
    return g, sg, DpuSubgraph(g, sg)


def _load_past_end(prog, dpu):
    """Move the first DDR-reading LOAD so that it reads one byte past the end of its register."""
    for i, x in enumerate(prog):
        if x.op == "LOAD" and x.broadcast != 7:
            span = (x.length - 1) * x.jump_read + x.channel
            x.fields["ddr_addr"] = dpu.reg_sizes[x.reg_id] - span + 1
            return i


def test_every_backend_reports_the_executor_message():
    g, sg, dpu = _mnist_with(_load_past_end)
    bad = next(i for i, x in enumerate(dpu.instructions) if x.op == "LOAD" and x.broadcast != 7)
    m = dpu.new_machine()
    with pytest.raises(ExecError) as ee:
        m.run(dpu.arrays)
    assert ee.value.index == bad and ee.value.field == "ddr_addr"
    want = f"subgraph {sg.name!r}: {ee.value}"
    with pytest.raises(ProgramCheckError) as e1:
        dpu.validate()
    assert str(e1.value) == want and e1.value.index == bad
    x = [np.zeros(s.dims, np.int8) for s in dpu.inputs]
    with pytest.raises(ProgramCheckError) as e2:
        dpu.run_sim(x)
    assert str(e2.value) == want
    with pytest.raises(ProgramCheckError) as e3:          # refused before any RTL is built
        dpu.run_rtl(x)
    assert str(e3.value) == want


# ---- disasm ---------------------------------------------------------------------------------------------
def _split(line: str) -> tuple[int, str, list[str]]:
    """(index, instruction text, annotations) of a disasm line."""
    head, *notes = line.split("  ; ")
    idx, text = head.strip().split("  ", 1)
    return int(idx), text, notes


def test_disasm_mnist_has_indices_and_layer_names():
    from opendpu.runtime.disasm import disasm_subgraph
    g = Graph.load(model_path("dpu_mnist_classifier"))
    sg = dpu_subgraphs(g)[0]
    text = disasm_subgraph(g, sg)
    lines = text.splitlines()
    dpu = DpuSubgraph(g, sg)
    assert len(lines) == len(dpu.instructions) == 230
    rows = [_split(ln) for ln in lines]
    assert [r[0] for r in rows] == list(range(230))
    assert from_text("\n".join(r[1] for r in rows)) == dpu.instructions   # same text as to_text
    layers = [n[len("layer "):] for r in rows for n in r[2] if n.startswith("layer ")]
    assert len(layers) == 230
    children = {c.name for c in sg.children}
    assert set(layers) <= children and len(set(layers)) >= 3
    assert layers[0] == "subgraph_quant_conv2d" and layers[-1] == "subgraph_quant_dense_1(TransferMatMulToConv2d)"
    assert not any("; !" in ln for ln in lines)
    assert disasm_subgraph(g, dpu, header=True).startswith(f"# subgraph {sg.name} (DPUCZDX8G_ISA1_B4096, 230 ")
    # the plain to_text listing is unchanged
    assert to_text(dpu.instructions).splitlines()[5] == rows[5][1]


def test_disasm_annotates_static_check_findings():
    from opendpu.runtime.disasm import disasm_subgraph
    g, sg, dpu = _mnist_with(_load_past_end)
    bad = dpu.check()[0]
    lines = disasm_subgraph(g, sg).splitlines()
    idx, text, notes = _split(lines[bad.index])
    assert idx == bad.index and text == dpu.instructions[bad.index].to_text()
    assert notes[-1] == f"! ddr_addr={bad.value}: {bad.message}" and "past the end of the register" in notes[-1]
    assert sum("; !" in ln for ln in lines) == 1
    # a program whose schedule cannot be built (a CONV before any CONVINIT) is listed without layer names
    g2, sg2, dpu2 = _mnist_with(lambda prog, d: prog.__setitem__(1, ins("ALUINIT")))
    assert dpu2.check()[0].kind == E_NOINIT
    lines2 = disasm_subgraph(g2, sg2).splitlines()
    assert not any("; layer " in ln for ln in lines2)
    assert "! CONV executed before any CONVINIT" in "\n".join(lines2)


def test_disasm_goes_on_after_a_corrupted_word():
    from opendpu.runtime.disasm import disasm_subgraph
    g = Graph.load(model_path("dpu_mnist_classifier"))
    sg = dpu_subgraphs(g)[0]
    good = decode(bytes(sg.attrs["mc_code"]))
    words = np.frombuffer(bytes(sg.attrs["mc_code"]), "<u4").copy()
    start = np.cumsum([0] + [{"LOAD": 5, "SAVE": 5, "CONV": 5, "CONVINIT": 4, "ALUINIT": 6, "ALU": 5,
                              "ELEWINIT": 3, "ELEW": 3, "END": 1}[x.op] for x in good])
    assert start[-1] == len(words)
    # instruction 7 (a LOAD) gets a reserved bit: its 5 words stay one invalid entry
    assert good[7].op == "LOAD"
    words[start[7] + 3] |= 1 << 4                      # LOAD word 3 bits 3..7 are reserved
    sg.attrs["mc_code"] = words.tobytes()
    with pytest.raises(IsaError, match="reserved"):
        decode(words.tobytes())
    text = disasm_subgraph(g, sg)
    lines = text.splitlines()
    assert len(lines) == 230
    assert lines[7].split()[0] == "7" and "<invalid: LOAD word 3 sets reserved bits 0x00000010" in lines[7]
    assert f"0x{int(words[start[7]]):08X}" in lines[7]
    for i in (6, 8, 100, 229):                       # the other instructions, with their indices
        idx, t, notes = _split(lines[i])
        assert idx == i and t == good[i].to_text()
    # an unknown opcode: one invalid word, and the listing still reaches END
    w2 = np.frombuffer(bytes(words.tobytes()), "<u4").copy()
    w2[start[3]] = (w2[start[3]] & 0x0FFFFFFF) | (0x3 << 28)
    out = disasm(w2.tobytes(), B4096)
    assert "<invalid: unknown opcode 0x3 at word" in out.splitlines()[3]
    assert out.splitlines()[-1].split("  ", 2)[-1].startswith("END 0010 0010")
    # truncated stream: the listing says it does not end with END
    tail = disasm(words[:start[5] + 2].tobytes(), B4096).splitlines()
    assert "<invalid: LOAD needs 5 words but the stream ends after 2" in tail[-2]
    assert tail[-1].strip() == "; ! stream of 6 instructions does not end with END"


def test_decode_lenient_equals_decode_on_valid_streams():
    for t in (B512, B4096):
        gp = base(t, 0)
        mc = encode(gp.instructions)
        ent = decode_lenient(mc)
        assert [d.instruction for d in ent] == decode(mc) and all(d.error is None and d.note is None for d in ent)
        lines = disasm(mc, t, gp.reg_sizes).splitlines()
        assert [_split(ln)[1] for ln in lines] == to_text(gp.instructions).splitlines()


def test_isa_check_imports_only_isa_and_numpy():
    import ast
    import opendpu.isa.check as mod
    tree = ast.parse(open(mod.__file__).read())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert mods <= {"__future__", "dataclasses", "typing", "numpy", "fields", "program", "target"}, mods
