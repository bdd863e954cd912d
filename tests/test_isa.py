"""ISA1 encoding: real mc_code round-trips, field ranges, text assembly, and malformed streams."""
import collections

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opendpu.compiler.xir.graph import Graph
from opendpu.isa.fields import BY_NAME, FIELDS, OPS
from opendpu.isa.disasm import disasm
from opendpu.isa.program import (IsaError, Instruction, decode, decode_lenient, encode, from_text, parse_line,
                         to_text)
from tests.conftest import MODEL_NAMES, model_path


def _mc(name):
    g = Graph.load(model_path(name))
    return [bytes(s.attrs["mc_code"]) for s in g.root.children if s.device == "DPU"]


def test_mnist_instruction_counts(mnist_path):
    (mc,) = _mc("dpu_mnist_classifier")
    prog = decode(mc)
    assert len(prog) == 230
    assert collections.Counter(i.op for i in prog) == {"LOAD": 202, "CONV": 17, "CONVINIT": 4, "ALU": 4,
                                                      "ALUINIT": 1, "SAVE": 1, "END": 1}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_real_streams_roundtrip_through_text(name):
    for mc in _mc(name):
        prog = decode(mc)
        assert prog[-1].op == "END"
        again = from_text(to_text(prog))
        assert encode(again) == mc


def test_known_word_layout():
    # Hand-encoded LOAD: bank_id 33, bank_addr 5, jump_write 1, jump_read 32, length 1, channel 32,
    # pad_idx 1, reg_id 0, ddr_addr 4096; dpdon 0001 dpdby 0100 (spec §4.3 word/bit positions).
    ins = Instruction("LOAD", 0b0001, 0b0100, dict(
        bank_addr=5, bank_id=33, jump_write=1, jump_read=32, length=1, channel=32, pad_idx=1, reg_id=0,
        const_value=0, broadcast=0, mode_avg=0, pad_end=0, pad_start=0, ddr_addr=4096))
    w = np.frombuffer(encode([ins, Instruction("END", 2, 2)]), "<u4")
    assert w[0] == (0x0 << 28) | (1 << 24) | (4 << 20) | (33 << 14) | 5
    assert w[1] == (0 << 0) | (31 << 10)           # jump_write-1 = 0, jump_read-1 = 31
    assert w[2] == (0 << 0) | (31 << 10) | (0 << 27)
    assert w[3] == 0 and w[4] == 4096
    assert w[5] == (0x7 << 28) | (2 << 24) | (2 << 20)


def _instr_strategy():
    def build(op):
        fs = {f.name: st.integers(f.lo, f.hi) for f in FIELDS[op.mnemonic]}
        return st.builds(lambda on, by, fl: Instruction(op.mnemonic, on, by, fl), st.integers(0, 15),
                         st.integers(0, 15), st.fixed_dictionaries(fs))
    return st.one_of([build(o) for o in OPS if o.mnemonic != "END"])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_instr_strategy(), min_size=0, max_size=12))
def test_random_programs_roundtrip(prog):
    prog = prog + [Instruction("END", 2, 2)]
    mc = encode(prog)
    back = decode(mc)
    assert [(i.op, i.dpdon, i.dpdby, i.fields) for i in back] == [(i.op, i.dpdon, i.dpdby, i.fields) for i in prog]
    assert encode(from_text(to_text(prog))) == mc


@settings(max_examples=400)
@given(st.binary(max_size=200))
def test_random_bytes_give_isa_error_or_program(data):
    try:
        prog = decode(data)
    except IsaError as e:
        assert "instruction" in str(e) or "mc_code" in str(e)
    else:
        assert prog[-1].op == "END" and encode(prog) == data


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_lenient_decode_and_disasm_go_on_where_decode_stops(data):
    ent = decode_lenient(data)
    text = disasm(data)
    lines = text.splitlines()
    assert [ln.split()[0] for ln in lines[:len(ent)]] == [str(d.index) for d in ent]
    try:
        prog = decode(data)
    except IsaError as e:
        msg = str(e)
        reason = msg.split(": ", 1)[1] if msg.startswith("instruction") else msg
        assert reason in text                       # decode's reason is in the listing
    else:
        assert [d.instruction for d in ent] == prog and "<invalid" not in text and "; !" not in text


def test_field_range_errors_name_index_field_and_range():
    ins = parse_line("CONVINIT 0100 0100 stride_h 1 kernel_h 3 valid_pixel_parallel 8 stride_offset_in 0 "
                     "jump_write 1 stride_out 1 shift_bias 0 jump_read_endl 1 act_type 1 shift_cut 0 jump_read 1 "
                     "stride_w 1 kernel_w 3 stride_offset_out 0 jump_write_endl 1")
    ins.fields["kernel_h"] = 17
    with pytest.raises(IsaError, match=r"instruction 3: CONVINIT field kernel_h = 17 out of range 1\.\.16"):
        ins.words(3)
    with pytest.raises(IsaError, match=r"line 1: instruction 0: LOAD field reg_id = 9 out of range 0\.\.7"):
        from_text("LOAD 0000 0000 " + " ".join(f"{f.name} {9 if f.name == 'reg_id' else f.lo}"
                                                for f in FIELDS["LOAD"]) + "\nEND 0010 0010\n")


def test_malformed_streams():
    end = np.array([0x7 << 28], "<u4").tobytes()
    with pytest.raises(IsaError, match=r"instruction 0: unknown opcode 0x3"):
        decode(np.array([0x3 << 28], "<u4").tobytes() + end)
    with pytest.raises(IsaError, match=r"instruction 0: LOAD needs 5 words but the stream ends after 2"):
        decode(np.array([0, 0], "<u4").tobytes())
    with pytest.raises(IsaError, match=r"does not end with END"):
        decode(np.zeros(5, "<u4").tobytes())
    with pytest.raises(IsaError, match=r"not a multiple of 4"):
        decode(end + b"\x00")
    with pytest.raises(IsaError, match=r"END at word 0 is followed by 5 more words"):
        decode(end + np.zeros(5, "<u4").tobytes())
    with pytest.raises(IsaError, match=r"unknown mnemonic 'FOO'"):
        from_text("FOO 0000 0000\nEND 0010 0010")
    with pytest.raises(IsaError, match=r"CONVINIT has no field 'kernel_q'"):
        parse_line("CONVINIT 0000 0000 kernel_q 1")
    with pytest.raises(IsaError, match=r"LOAD field bank_id is missing"):
        parse_line("LOAD 0000 0000 bank_addr 0")
    with pytest.raises(IsaError, match=r"4 binary digits"):
        parse_line("END 2 0010")


def test_text_emission_order_is_word_then_msb_first():
    ins = decode(np.array([0x7 << 28 | 2 << 24 | 2 << 20], "<u4").tobytes())[0]
    assert ins.to_text() == "END 0010 0010"
    line = to_text([Instruction("ELEWINIT", 8, 0, dict(share_pp=0, bank_id_in=3, bank_addr_in=7, jump_read_endl=1,
                                                        id=1, jump_bank=1, jump_read=2, shift_read=1))])
    assert line.split()[3::2] == ["bank_id_in", "share_pp", "jump_bank", "id", "jump_read_endl", "bank_addr_in",
                                  "shift_read", "jump_read"]
    assert BY_NAME["ELEWINIT"].words == 3
