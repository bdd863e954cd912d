"""cocotb 2.1 test for the generated bench: a GPI clock, then wait until every job has run.

The bench does all per-cycle work in the simulator (memory models, job sequencing), so this test costs
no Python per cycle. Run through hw.harness (backends cocotb-verilator and cocotb-icarus).
"""
import cocotb
from cocotb.clock import Clock
from cocotb.triggers import RisingEdge


@cocotb.test()
async def run_jobs(dut):
    """Clock tb_top until its job sequencer raises `finished`."""
    Clock(dut.clk, 10, unit="ns").start()
    while str(dut.finished.value) != "1":
        await RisingEdge(dut.finished)
