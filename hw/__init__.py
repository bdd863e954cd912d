"""Amaranth RTL of one parameterized DPUCZDX8G ISA1 core, generated from an `isa.target.Target`."""
