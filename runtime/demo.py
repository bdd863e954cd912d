"""`make demo`: run AMD's compiled MNIST xmodel end to end on the emulated B4096 DPU.

Handwritten digits come from scikit-learn's `load_digits` (8×8, scaled into the 28×28 input). Each image
goes through the whole graph (quantize → DPU subgraph on the instruction executor → fix2float →
softmax); the DPU result is checked against the XIR reference, byte for byte. The cycle model then gives
the latency and the vaitrace-style per-layer profile.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np


def digits_as_mnist(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n sklearn digits as float32 [n,28,28,1] in [0,1] (8×8 upscaled 3× and padded), and labels."""
    from sklearn.datasets import load_digits
    d = load_digits()
    idx = np.random.default_rng(seed).permutation(len(d.images))[:n]
    img = d.images[idx] / 16.0                                  # 0..1
    big = np.kron(img, np.ones((3, 3)))                         # 24×24
    out = np.zeros((len(idx), 28, 28, 1), np.float32)
    out[:, 2:26, 2:26, 0] = big
    return out, d.target[idx]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "models"))
    p.add_argument("-n", type=int, default=20, help="number of digits")
    a = p.parse_args(argv)
    path = os.path.join(a.models, "dpu_mnist_classifier.xmodel")
    if not os.path.isfile(path):
        print(f"demo: {path} not found (the shared reference models must sit in ../shared/models)", file=sys.stderr)
        return 2
    from opendpu.compiler.xir.graph import Graph
    from opendpu.runtime.runner import GraphRunner
    from opendpu.sim import warm_kernels
    secs = warm_kernels(log=lambda s: print(s, flush=True))
    if secs:
        print(f"compiled simulator kernels in {secs:.1f} s (cached for next runs)")
    g = Graph.load(path)
    sim = GraphRunner(g, backend="sim")
    ref = GraphRunner(g, backend="ref")
    dpu_name = next(r.target.name for r in sim.runners.values() if r.target is not None)
    print(f"model {path}\ntarget {dpu_name}; inputs {[(t.name, list(t.dims), t.fix_point) for t in sim.get_inputs()]}")
    x, y = digits_as_mnist(a.n)
    sim.run([x[0:1]])                                           # warm-up (first-call allocations)
    correct, same, t_sim = 0, 0, 0.0
    out_name = sim.get_outputs()[0].name
    for i in range(a.n):
        t0 = time.perf_counter()
        rs = sim.run([x[i:i + 1]])
        t_sim += time.perf_counter() - t0
        rr = ref.run([x[i:i + 1]])
        prob = rs.outputs[out_name].reshape(-1)
        pred = int(np.argmax(prob))
        dpu_s = next(iter(rs.dpu_outputs.values()))
        dpu_r = next(iter(rr.dpu_outputs.values()))
        eq = all(np.array_equal(dpu_s[k], dpu_r[k]) for k in dpu_s)
        same += eq
        correct += pred == int(y[i])
        print(f"digit {i:3d}: label {int(y[i])}  predicted {pred}  p={prob[pred]:.3f}  "
              f"DPU int8 out {next(iter(dpu_s.values())).reshape(-1).tolist()}  sim==ref {'yes' if eq else 'NO'}")
    print(f"\n{correct}/{a.n} correct on sklearn digits (8x8 upscaled; the model was trained on MNIST)")
    print(f"sim == ref bit-exact on {same}/{a.n}; mean sim time {t_sim / a.n * 1e3:.2f} ms per inference")
    st = next(iter(sim.runners.values())).stats
    print(f"cycle model: {st['cycles']} DPU cycles per inference = {st['latency_ms']:.3f} ms at "
          f"{st['clock_mhz']:g} MHz (timing parameters: docs/microarchitecture.md)\n")
    from opendpu.runtime.profile import profile_graph
    print(profile_graph(g, model=os.path.basename(path)).table().split("\n\nNotes:")[0])
    ok_q, res = _quantize_demo()
    ok_c = _compile_demo(res)
    return 0 if same == a.n and ok_q and ok_c else 1


def _quantize_demo() -> tuple[bool, Any]:
    """Quantize the trained digits CNN for B4096 and run its INT8 xmodel on the ref runner."""
    from opendpu.quant import zoo
    from opendpu.quant.quantize import QuantConfig
    from opendpu.runtime.flow import quantize_step, quantized_graph
    from opendpu.runtime.runner import GraphRunner
    xtr, _, xte, yte = zoo.digits_data()
    print(f"\nquantizer: {os.path.basename(zoo.DIGITS_ONNX)} (trained on sklearn digits), 200 calibration images, "
          f"method diffs, target DPUCZDX8G_ISA1_B4096")
    res = quantize_step(zoo.DIGITS_ONNX, xtr[:200], target="DPUCZDX8G_ISA1_B4096", config=QuantConfig(method="diffs"))
    gr = GraphRunner(quantized_graph(res), backend="ref")
    out = res.prep.outputs[0]
    pred = np.array([int(np.argmax(gr.run([xte[i:i + 1].transpose(0, 2, 3, 1)]).outputs[out]))
                     for i in range(len(xte))])
    ev = res.evaluate(xte, yte)
    acc = float(np.mean(pred == yte))
    print(f"held-out accuracy: float {ev['float_accuracy']:.4f}, INT8 xmodel on the ref runner {acc:.4f} "
          f"({len(xte)} images); fix points {sorted(set(res.qp.act_fp.values()))}")
    return abs(acc - ev["float_accuracy"]) <= 0.01, res


def _compile_demo(res) -> bool:
    """Compile the quantized digits CNN with opendpu's compiler for B512 and B4096, run the compiled xmodel on
    the cycle model (accuracy, bit-exact against the reference, cycles), and co-simulate one inference on the RTL."""
    from opendpu.compiler.xir.graph import Graph
    from opendpu.quant import zoo
    from opendpu.runtime.flow import compile_step, quantized_graph
    from opendpu.runtime.runner import GraphRunner
    _, _, xte, yte = zoo.digits_data()
    q = quantized_graph(res)
    ref = GraphRunner(q, backend="ref")
    ok = True
    compiled = {}
    for tname in ("DPUCZDX8G_ISA1_B512", "DPUCZDX8G_ISA1_B4096"):
        cr = compile_step(Graph.deserialize(q.serialize()), tname)
        g = Graph.deserialize(cr.graph.serialize())
        compiled[tname] = g
        prog = next(iter(cr.programs.values()))
        sim = GraphRunner(g, backend="sim")
        out = sim.get_outputs()[0].name
        correct = same = 0
        n = len(xte)
        for i in range(n):
            xi = xte[i:i + 1].transpose(0, 2, 3, 1)
            rs, rr = sim.run([xi]), ref.run([xi])
            same += all(np.array_equal(rs.outputs[k], rr.outputs[k]) for k in rs.outputs)
            correct += int(np.argmax(rs.outputs[out])) == int(yte[i])
        st = next(r for r in sim.runners.values() if r.dpu is not None).stats
        print(f"\ncompiled by opendpu for {tname}: {len(prog.instructions)} instructions, {len(prog.layers)} layers, "
              f"{len(prog.registers.params.get(0, b''))} parameter bytes\n  on the cycle model: accuracy "
              f"{correct / n:.4f} ({n} images), output == XIR reference on {same}/{n}, {st['cycles']} cycles = "
              f"{st['latency_ms']:.3f} ms at {st['clock_mhz']:g} MHz")
        ok &= same == n
    ok &= _rtl_demo(compiled["DPUCZDX8G_ISA1_B512"], xte[:1].transpose(0, 2, 3, 1))
    return ok


def _rtl_demo(g, x) -> bool:
    """One inference of the compiled program on the RTL (Verilator), compared cycle for cycle with the model."""
    from opendpu.runtime.cosim import cosim_programs, subgraph_program
    from opendpu.runtime.dpu import DpuSubgraph, dpu_subgraphs
    from opendpu.runtime.runner import dpu_round_quantize
    sg = dpu_subgraphs(g)[0]
    d = DpuSubgraph(g, sg)
    spec = d.inputs[0]
    if spec.fix_point is None:
        raise SystemExit(f"demo: the compiled input {spec.name!r} has no fix_point")
    xq = dpu_round_quantize(x.reshape(spec.dims), spec.fix_point)
    (rep,) = cosim_programs(d.target, [(sg.name, *subgraph_program(d, [xq]))])
    match = not rep.mismatches and rep.model_cycles == rep.rtl_cycles
    print(f"RTL (Verilator) on {d.target.name}: cycle model {rep.model_cycles} cycles, RTL {rep.rtl_cycles} cycles, "
          f"{rep.ddr_bytes} DDR bytes compared: {'MATCH' if match else 'MISMATCH'}")
    return match


if __name__ == "__main__":
    sys.exit(main())
