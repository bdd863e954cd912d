"""Code generation for one DPU subgraph: quantized `*-fix` ops -> ISA1 instructions (spec §6, §7).

Every layer runs DDR to DDR (docs/compiler.md): its inputs are LOADed from their DDR images row by row into
image bank group VB0, the CONV / ALU / ELEW instructions write group VB1, and SAVEs store the output rows into
the output's DDR image. A layer is cut into strips of output rows (halo input rows included) and, when a row
does not fit, into column tiles; each strip's buffers alternate between two places in the bank ring so the
LOADs of strip k+1 can run while strip k computes. Output channels are computed in OCP-wide slices (the inner
loop); weights are loaded once per layer (per group of slices when they do not fit a CONVW bank) with one LOAD
per CONVW bank, laid out in the CONST blob exactly as LOAD reads them. Program order is the reference semantics;
it is a software pipeline (strip k's compute with strip k-1's SAVEs and strip k+1's LOADs between its instructions,
a layer's opening LOADs in the previous layer's tail), and dependency tokens are placed afterwards from the
instructions' footprints on the exact conflicting instruction (`isa.deps.ExactTokenPlanner`), so the program is
race-free by construction.

The modules (docs/compiler.md, "The pass list and the code generator's modules"):

    kinds       the op kinds, named once            limits      ISA field limits, read from isa.fields
    ir          images, windows, buffers, jobs      registry    the per-kind tables (legality, lowering, emit)
    legality    classify / unsupported per type     memory      the subgraph plan and its DDR images
    context     stream, bank rings, CONST blob      tiling      strips, column tiles, block fields
    loadsave    LOAD / SAVE, channel augmentation   ordering    strip pipeline, prefetch, tokens
    plans       LayerPlan, cycle-model decisions    conv / alu / elew / copies   lowering + emission per kind
    fusion      producer + consumer superlayers     driver      plan -> lower -> order, generate
"""
from __future__ import annotations

from opendpu.compiler.codegen.context import Cycles, Ring
from opendpu.compiler.codegen.driver import (CODEGEN_OPTIONS, CodegenOptions, Lowered, choose, generate, lower,
                                             lowerings, order, plan)
from opendpu.compiler.codegen.ir import DDR_ALIGN, REG_CONST, CodegenError, FMap, hwc
from opendpu.compiler.codegen.kinds import ALIAS_TYPES, SKIP_TYPES
from opendpu.compiler.codegen.legality import classify, unsupported
from opendpu.compiler.codegen.memory import SubgraphPlan
from opendpu.compiler.codegen.plans import LayerPlan, timing_cycles
from opendpu.compiler.program import DdrImage

__all__ = ["ALIAS_TYPES", "CODEGEN_OPTIONS", "CodegenError", "CodegenOptions", "Cycles", "DDR_ALIGN", "DdrImage",
           "FMap", "LayerPlan", "Lowered", "REG_CONST", "Ring", "SKIP_TYPES", "SubgraphPlan", "choose", "classify",
           "generate", "hwc", "lower", "lowerings", "order", "plan", "timing_cycles", "unsupported"]
