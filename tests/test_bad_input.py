"""Issue 11 bad-input suite: every verb of `opendpu`, fed careless or hostile input, answers with exit code 2 and one
line `opendpu VERB: error: MESSAGE` that names the offending thing (option, file, key, tensor, op), never a traceback,
and leaves nothing behind: no new file or directory, every input byte-for-byte unchanged, and (for mistakes found by
validation) nothing printed on stdout and no computation started.

The CLI runs in-process (`runtime.cli.main`) with OPENDPU_DEBUG=1, so an unexpected internal exception propagates and
fails the case instead of being turned into a one-line "internal error". Heavy entry points (the runners, the cycle
model, the RTL build, calibration, the zoo builder...) are replaced by a sentinel during validation cases: if one is
reached, the case fails with "computation started before validation". A few cases run the real entry point
(`.venv/bin/opendpu`) in a subprocess.

Inputs are generated in one module-scoped directory (never committed): copies of the small shared MNIST and
tf2_custom_op xmodels, the quantizer's digits CNN (input [N,1,8,8] NCHW), tiny .npy arrays, corrupted and hostile
xmodels, hostile arch.json files. Case tables are lists of `Case(id, argv, code, must, ...)`: `argv` is a template
formatted with the fixture's paths, `must` the substrings the message must contain (case-insensitive; a tuple means
any one of them), `never` substrings it must not contain.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pytest

from opendpu.compiler.xir import xir_pb2 as pb
from opendpu.compiler.xir.graph import Graph, XModelError
from opendpu.isa.program import IsaError
from opendpu.runtime.cli import main as cli_main
from opendpu.runtime.dpu import DpuSubgraph, RuntimeErrorDPU, dpu_subgraphs
from tests.conftest import MODELS, REPO

MNIST_SRC = os.path.join(MODELS, "dpu_mnist_classifier.xmodel")
TF2_SRC = os.path.join(MODELS, "tf2_custom_op.xmodel")
DIGITS_SRC = os.path.join(REPO, "quant", "models", "digits_cnn.onnx")
HAVE_MODELS = os.path.isfile(MNIST_SRC) and os.path.isfile(TF2_SRC)
pytestmark = pytest.mark.skipif(not HAVE_MODELS, reason=f"shared models not present in {MODELS}")

VERBS = ("run", "check", "disasm", "races", "xmodel", "profile", "sweep", "cosim", "quantize", "inspect", "zoo",
         "targets", "compile", "build")
ERR_LINE = re.compile(r"^opendpu(?: (?P<verb>[a-z]+))?: error: (?P<msg>.+)$")
MNIST_SHAPE = "[1, 28, 28, 1]"


# ====================================================================================================================
# the workspace: every input generated once per module
# ====================================================================================================================
class Workspace:
    def __init__(self, root: str):
        self.root = root
        self.inp = os.path.join(root, "in")
        self.out = os.path.join(root, "out")
        self.cwd = os.path.join(root, "cwd")
        self.p: dict[str, str] = {"root": root, "in": self.inp, "out": self.out, "cwd": self.cwd}

    def path(self, key: str, rel: str) -> str:
        p = os.path.join(self.inp, rel)
        self.p[key] = p
        return p

    def save(self, key: str, arr, rel: str | None = None, allow_pickle: bool = False) -> str:
        p = self.path(key, rel or f"{key}.npy")
        np.save(p, arr, allow_pickle=allow_pickle)
        return p

    def write(self, key: str, data: bytes | str, rel: str) -> str:
        p = self.path(key, rel)
        with open(p, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        return p


def _mnist_dpu(g: Graph):
    return next(s for s in g.root.children if s.device == "DPU")


def _set_reg_size(g: Graph, reg: str, size: int) -> None:
    sg = _mnist_dpu(g)
    d = dict(sg.attrs["reg_id_to_size"])
    d[reg] = size
    sg.attrs.set("reg_id_to_size", d, sg.attrs.kinds["reg_id_to_size"])


# hostile xmodels made from the MNIST model: name -> (edit of the Graph, or of the protobuf, substrings of the error)
def _h_graph(fn):
    return ("graph", fn)


def _h_proto(fn):
    return ("proto", fn)


def _first_op(p: pb.Graph, name: str):
    return next(n for n in p.op_node if n.op_name == name)


HOSTILE = {
    "huge_dim": (_h_proto(lambda p: _first_op(p, "input_1").output_tensor.tensor_dim.__setitem__(1, 1 << 31)),
                 ["input_1", "dimension 1"]),
    "negative_dim": (_h_proto(lambda p: _first_op(p, "input_1").output_tensor.tensor_dim.__setitem__(2, 2**32 - 1)),
                     ["input_1", "dimension 2"]),
    "many_elements": (_h_proto(lambda p: (_first_op(p, "input_1").output_tensor.tensor_dim.__delitem__(slice(None)),
                                          _first_op(p, "input_1").output_tensor.tensor_dim.extend([65536] * 3))),
                      ["input_1", "elements"]),
    "fix_point_out_of_range": (_h_graph(lambda g: g.ops["input_1"].output.attrs.set("fix_point", 1000, "int32_value")),
                               ["input_1", "fix_point"]),
    "fix_point_min_int32": (_h_graph(lambda g: g.ops["input_1"].output.attrs.set("fix_point", -2**31, "int32_value")),
                            ["input_1", "fix_point"]),
    "fix_point_string": (_h_graph(lambda g: g.ops["input_1"].output.attrs.set("fix_point", "six", "string_value")),
                         ["input_1", "fix_point"]),
    "fix_point_float": (_h_graph(lambda g: g.ops["input_1"].output.attrs.set("fix_point", 6.5, "double_value")),
                        ["input_1", "fix_point"]),
    "bit_width_0": (_h_proto(lambda p: setattr(_first_op(p, "input_1").output_tensor, "tensor_bit_width", 0)),
                    ["input_1", "bit width"]),
    "bit_width_1000": (_h_proto(lambda p: setattr(_first_op(p, "input_1").output_tensor, "tensor_bit_width", 1000)),
                       ["input_1", "bit width"]),
    "data_type_99": (_h_proto(lambda p: setattr(_first_op(p, "input_1").output_tensor, "data_type", 99)),
                     ["input_1", "data type"]),
    "float_bit_width_8": (_h_proto(lambda p: (setattr(_first_op(p, "input_1").output_tensor, "data_type", 4),
                                              setattr(_first_op(p, "input_1").output_tensor, "tensor_bit_width", 8))),
                          ["input_1", "bit width"]),
    "ddr_addr_negative": (_h_graph(lambda g: g.ops["input_1_upload_0"].output.attrs.set("ddr_addr", -100,
                                                                                         "int32_value")),
                          ["input_1_upload_0", "ddr_addr"]),
    "reg_id_string": (_h_graph(lambda g: g.ops["input_1_upload_0"].output.attrs.set("reg_id", "REG_2",
                                                                                     "string_value")),
                      ["input_1_upload_0", "reg_id"]),
    "stride_wrong_rank": (_h_graph(lambda g: g.ops["input_1_upload_0"].output.attrs.set("stride", [1],
                                                                                         "int32_vec_value")),
                          ["input_1_upload_0", "stride"]),
    "mc_code_string": (_h_graph(lambda g: _mnist_dpu(g).attrs.set("mc_code", "hello", "string_value")),
                       ["subgraph_quant_conv2d", "mc_code"]),
    "mc_code_truncated": (_h_graph(lambda g: _mnist_dpu(g).attrs.set(
        "mc_code", bytes(_mnist_dpu(g).attrs["mc_code"])[:-3], "bytes_value")), ["subgraph_quant_conv2d", "mc_code"]),
    "mc_code_missing": (_h_graph(lambda g: _mnist_dpu(g).attrs.pop("mc_code")), ["subgraph_quant_conv2d", "mc_code"]),
    "fingerprint_missing": (_h_graph(lambda g: _mnist_dpu(g).attrs.pop("dpu_fingerprint")),
                            ["subgraph_quant_conv2d", "fingerprint"]),
    "fingerprint_string": (_h_graph(lambda g: _mnist_dpu(g).attrs.set("dpu_fingerprint", "B4096", "string_value")),
                           ["subgraph_quant_conv2d", "dpu_fingerprint"]),
    "fingerprint_other_dpu": (_h_graph(lambda g: _mnist_dpu(g).attrs.set("dpu_fingerprint", 0x0201000056010407,
                                                                         "uint64_value")),
                              ["subgraph_quant_conv2d", "DPU type 2"]),
    "reg_size_negative": (_h_graph(lambda g: _set_reg_size(g, "REG_1", -5)), ["reg_id_to_size", "REG_1"]),
    "reg_size_huge": (_h_graph(lambda g: (_mnist_dpu(g).attrs.set("reg_id_to_size", {
        **_mnist_dpu(g).attrs["reg_id_to_size"], "REG_1": 1 << 40}, "map_string_2_int64_value"))),
                      ["reg_id_to_size", "REG_1"]),
    "reg_key_bad": (_h_graph(lambda g: _mnist_dpu(g).attrs.set("reg_id_to_size", {
        **_mnist_dpu(g).attrs["reg_id_to_size"], "REGISTER_9": 16}, "map_string_2_int32_value")),
                    ["reg_id_to_size", "REGISTER_9"]),
    "param_blob_not_bytes": (_h_graph(lambda g: _mnist_dpu(g).attrs.set("reg_id_to_parameter_value", {"REG_0": 5},
                                                                        "map_string_2_int32_value")),
                             ["reg_id_to_parameter_value", "REG_0"]),
    "param_blob_too_big": (_h_graph(lambda g: _set_reg_size(g, "REG_0", 1024)), ["REG_0", "parameter"]),
    "topo_sort_not_names": (_h_graph(lambda g: g.root.attrs.set("children_topological_sort", [1, 2],
                                                                "int32_vec_value")),
                            ["children_topological_sort"]),
    "device_int": (_h_graph(lambda g: _mnist_dpu(g).attrs.set("device", 5, "int32_value")),
                   ["subgraph_quant_conv2d", "device"]),
    "unknown_producer": (_h_proto(lambda p: _first_op(p, "quant_conv2d").args[0].arg_ops.__setitem__(0, "ghost_op")),
                         ["quant_conv2d", "ghost_op"]),
    "op_cycle": (_h_proto(lambda p: _first_op(p, "input_1").args.add(arg_name="input", arg_ops=["quant_conv2d"])),
                 ["cycle"]),
    "op_defined_twice": (_h_proto(lambda p: p.op_node.add().CopyFrom(_first_op(p, "input_1"))),
                         ["input_1", "twice"]),
    "subgraph_unknown_op": (_h_proto(lambda p: p.subg_root.subg_child[0].op_name.append("phantom_op")),
                            ["phantom_op"]),
    "op_in_two_subgraphs": (_h_proto(lambda p: p.subg_root.subg_child[2].op_name.append("input_1")),
                            ["input_1", "two subgraphs"]),
    "empty_op_type": (_h_proto(lambda p: setattr(_first_op(p, "quant_conv2d"), "op_type", "")),
                      ["quant_conv2d", "type"]),
}


def _onnx_node(m, name):
    return next(n for n in m.graph.node if n.name == name)


def _onnx_nan_weight(m):
    from onnx import numpy_helper
    t = next(i for i in m.graph.initializer if i.name == "features.0.weight")
    a = numpy_helper.to_array(t).copy()
    a.flat[3] = np.nan
    t.CopyFrom(numpy_helper.from_array(a, t.name))


def _onnx_extra_input(m):
    from onnx import TensorProto, helper
    m.graph.input.add().CopyFrom(helper.make_tensor_value_info("extra", TensorProto.FLOAT, [1, 1, 8, 8]))


def _onnx_dim(i, **kw):
    def edit(m):
        d = m.graph.input[0].type.tensor_type.shape.dim[i]
        d.Clear()
        for k, v in kw.items():
            setattr(d, k, v)
    return edit


# hostile ONNX models made from the digits CNN: name -> (edit of the ModelProto, substrings of the error)
HOSTILE_ONNX = {
    "dynamic_dim": (_onnx_dim(2, dim_param="H"), ["dynamic_dim.onnx", "dimension 2"]),
    "zero_dim": (_onnx_dim(1, dim_value=0), ["zero_dim.onnx", "dimension 1"]),
    "negative_dim": (_onnx_dim(2, dim_value=-3), ["negative_dim.onnx", "dimension 2"]),
    "huge_dim": (_onnx_dim(3, dim_value=1 << 40), ["huge_dim.onnx", "dimension 3"]),
    "int_input": (lambda m: setattr(m.graph.input[0].type.tensor_type, "elem_type", 7), ["int_input.onnx", "input"]),
    "nan_weight": (_onnx_nan_weight, ["features.0.weight", ("nan", "inf")]),
    "custom_domain": (lambda m: setattr(m.graph.node[2], "domain", "com.example"), ["com.example"]),
    "no_output": (lambda m: m.graph.output.__delitem__(slice(None)), ["no_output.onnx", "output"]),
    "unsorted_nodes": (lambda m: m.graph.node[0].input.__setitem__(0, m.graph.node[-1].output[0]),
                       ["unsorted_nodes.onnx"]),
    "unknown_op": (lambda m: setattr(_onnx_node(m, "/features/features.2/Relu"), "op_type", "NoSuchOp"),
                   ["NoSuchOp"]),
    "old_opset_bad": (lambda m: setattr(m.opset_import[0], "version", 7), ["old_opset_bad.onnx"]),
}


def _hostile_bytes(mnist: bytes, how) -> bytes:
    kind, fn = how
    if kind == "graph":
        g = Graph.deserialize(mnist, "mnist")
        fn(g)
        return g.serialize()
    p = pb.Graph()
    p.ParseFromString(mnist)
    fn(p)
    return p.SerializeToString()


# truncation lengths and bit-flip positions are fixed (seeded) at collection time
TRUNCATE_AT = (1, 7, 64, 500, 4000, 20000, 100000, 400000, 700000, -4096, -100, -1)
N_FLIPS = 18


@lru_cache(maxsize=None)
def flip_positions() -> tuple[tuple[int, int], ...]:
    """(byte offset, bit) pairs over tf2_custom_op's structure (outside its two parameter blobs), seeded."""
    if not HAVE_MODELS:
        return ()
    data = open(TF2_SRC, "rb").read()
    g = Graph.deserialize(data, TF2_SRC)
    blobs = []
    for sg in g.root.walk():
        for v in (sg.attrs.get("reg_id_to_parameter_value") or {}).values():
            i = data.find(bytes(v[:64]))
            blobs.append((i, i + len(v)))
    rng = random.Random(11)
    out = []
    while len(out) < N_FLIPS:
        p = rng.randrange(len(data))
        if all(not a <= p < b for a, b in blobs):
            out.append((p, rng.randrange(8)))
    return tuple(out)


def _flip(data: bytes, pos: int, bit: int) -> bytes:
    b = bytearray(data)
    b[pos] ^= 1 << bit
    return bytes(b)


ARCH = {
    "not_json": "this is not JSON",
    "empty": "",
    "binary": b"\xff\xfe\x00\x81garbage",
    "list": [1, 2, 3],
    "string": "\"DPUCZDX8G_ISA1_B4096\"",
    "null": "null",
    "no_key": {},
    "deep": "[" * 50000 + "]" * 50000,
    "target_number": {"target": 4096},
    "target_list": {"target": ["B4096"]},
    "target_unknown": {"target": "B9999"},
    "fingerprint_float": {"fingerprint": 1.5},
    "fingerprint_bool": {"fingerprint": True},
    "fingerprint_negative": {"fingerprint": -1},
    "fingerprint_huge": {"fingerprint": 2 ** 70},
    "fingerprint_garbage": {"fingerprint": "0xZZ"},
    "fingerprint_other_dpu": {"fingerprint": "0x0201000056010407"},
    "target_fingerprint_disagree": {"target": "DPUCZDX8G_ISA1_B4096", "fingerprint": "0x101000056010200"},
    "unknown_key": {"target": "DPUCZDX8G_ISA1_B4096", "colour": "red"},
    "timing_list": {"target": "DPUCZDX8G_ISA1_B4096", "timing": [60]},
    "timing_unknown_key": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"ddr_latncy": 60}},
    "timing_huge": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"ddr_latency": 10 ** 30}},
    "timing_negative": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"conv_latency": -1}},
    "timing_float": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"queue_depth": 2.5}},
    "timing_bool": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"ddr_ports": True}},
    "timing_string": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"ddr_latency": "80"}},
    "timing_null": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"alu_latency": None}},
    "timing_nan": "{\"target\": \"DPUCZDX8G_ISA1_B4096\", \"timing\": {\"clock_mhz\": NaN}}",
    "timing_inf": "{\"target\": \"DPUCZDX8G_ISA1_B4096\", \"timing\": {\"clock_mhz\": Infinity}}",
    "timing_clock_zero": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"clock_mhz": 0}},
    "timing_clock_huge": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"clock_mhz": 1e300}},
    "timing_fifo_small": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"fetch_fifo_words": 3}},
    "timing_watchdog_huge": {"target": "DPUCZDX8G_ISA1_B4096", "timing": {"watchdog_cycles": 2 ** 64}},
}
# the key or value each hostile arch.json must be named by
ARCH_MUST = {
    "not_json": ["JSON"], "empty": ["JSON"], "binary": ["JSON"], "list": ["object"], "string": ["object"],
    "null": ["object"], "no_key": ["target", "fingerprint"], "deep": ["JSON"], "target_number": ["target"],
    "target_list": ["target"], "target_unknown": ["B9999"], "fingerprint_float": ["fingerprint"],
    "fingerprint_bool": ["fingerprint"], "fingerprint_negative": ["fingerprint"], "fingerprint_huge": ["fingerprint"],
    "fingerprint_garbage": ["0xZZ"], "fingerprint_other_dpu": ["DPU type 2"],
    "target_fingerprint_disagree": ["target", "fingerprint"], "unknown_key": ["colour"],
    "timing_list": ["timing"], "timing_unknown_key": ["ddr_latncy"], "timing_huge": ["ddr_latency", "out of range"],
    "timing_negative": ["conv_latency", "out of range"], "timing_float": ["queue_depth"],
    "timing_bool": ["ddr_ports"], "timing_string": ["ddr_latency"], "timing_null": ["alu_latency"],
    "timing_nan": ["clock_mhz"], "timing_inf": ["clock_mhz"], "timing_clock_zero": ["clock_mhz"],
    "timing_clock_huge": ["clock_mhz"], "timing_fifo_small": ["fetch_fifo_words"],
    "timing_watchdog_huge": ["watchdog_cycles", "out of range"],
}

# every numpy dtype kind that is neither a real float (float16/32/64: real values) nor int8 (raw fixed point)
BAD_DTYPES = ("uint8", "uint16", "uint32", "uint64", "int16", "int32", "int64", "bool", "complex64", "complex128",
              "U4", "S4", "datetime64[s]", "timedelta64[ms]", "V4", "structured", "object")


def _dtype_array(name: str, shape=(1, 28, 28, 1)):
    if name == "structured":
        return np.zeros(shape, dtype=[("a", "<f4")])
    if name == "object":
        a = np.empty(shape, dtype=object)
        a.fill(0.5)
        return a
    return np.zeros(shape, dtype=np.dtype(name))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "_", name.lower())


def _dtype_names(name: str) -> tuple[str, ...]:
    """Any of these spellings names the dtype in a message."""
    if name == "object":
        return ("object",)
    dt = _dtype_array(name, (1,)).dtype
    return tuple({str(dt), dt.name, name})


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Workspace:
    w = Workspace(str(tmp_path_factory.mktemp("bad_input")))
    for d in (w.inp, w.out, w.cwd):
        os.makedirs(d)
    # models
    shutil.copyfile(MNIST_SRC, w.path("mnist", "mnist.xmodel"))
    shutil.copyfile(TF2_SRC, w.path("tf2", "tf2_custom_op.xmodel"))
    shutil.copyfile(DIGITS_SRC, w.path("onnx", "digits_cnn.onnx"))
    import onnx
    os.makedirs(os.path.join(w.inp, "hostile_onnx"))
    for name, (edit, _) in HOSTILE_ONNX.items():
        m = onnx.load(DIGITS_SRC)
        edit(m)
        w.write(f"ho_{name}", m.SerializeToString(), os.path.join("hostile_onnx", f"{name}.onnx"))
    m = onnx.load(DIGITS_SRC)
    _onnx_extra_input(m)
    w.write("ho_two_inputs", m.SerializeToString(), os.path.join("hostile_onnx", "two_inputs.onnx"))
    mnist = open(MNIST_SRC, "rb").read()
    # plain inputs
    w.save("x", np.zeros((1, 28, 28, 1), np.float32))
    w.save("x_int8", np.zeros((1, 28, 28, 1), np.int8))
    w.write("bin_short", bytes(100), "short.bin")
    np.savez(w.path("npz_ok", "npz_ok.npz"), quant_input_1=np.zeros((1, 28, 28, 1), np.float32))
    np.savez(w.path("npz_wrong_key", "wrong_key.npz"), image=np.zeros((1, 28, 28, 1), np.float32))
    np.savez(w.path("npz_extra_key", "extra_key.npz"), quant_input_1=np.zeros((1, 28, 28, 1), np.float32),
             bogus_array=np.zeros(3, np.float32))
    w.write("npz_corrupt", b"PK\x03\x04 this zip is broken", "corrupt.npz")
    w.write("text", "just some notes\n", "notes.txt")
    w.write("text_npy", "not numpy at all\n", "text.npy")
    w.write("npy_truncated", open(w.p["x"], "rb").read()[:200], "truncated.npy")
    w.save("pickled", np.array([{"a": 1}], dtype=object), "pickled.npy", allow_pickle=True)
    w.write("empty_file", b"", "empty.xmodel")
    os.makedirs(w.path("adir", "adir"))
    w.write("adir_file", "x", os.path.join("adir", "inside.txt"))
    w.p["missing"] = os.path.join(w.inp, "missing.xmodel")
    # dtypes, NaN/Inf, shapes
    for name in BAD_DTYPES:
        w.save(f"dt_{_slug(name)}", _dtype_array(name), f"dtype_{_slug(name)}.npy", allow_pickle=(name == "object"))
    for dt in ("float16", "float32", "float64"):
        for label, v in (("nan", np.nan), ("inf", np.inf), ("ninf", -np.inf)):
            a = np.zeros((1, 28, 28, 1), dt)
            a[0, 3, 5, 0] = v
            w.save(f"{label}_{dt}", a)
    np.savez(w.path("npz_nan", "nan.npz"), quant_input_1=np.full((1, 28, 28, 1), np.nan, np.float32))
    for label, shape in (("nchw", (1, 1, 28, 28)), ("flat", (784,)), ("hw", (28, 28)), ("hwc", (28, 28, 1)),
                         ("rank5", (1, 28, 28, 1, 1)), ("batch0", (0, 28, 28, 1)), ("h29", (1, 29, 28, 1)),
                         ("empty", (0,)), ("c3", (1, 28, 28, 3)), ("scalar", ())):
        w.save(f"shape_{label}", np.zeros(shape, np.float32))
    # quantizer inputs
    rng = np.random.default_rng(0)
    w.save("calib", rng.standard_normal((6, 1, 8, 8)).astype(np.float32))
    w.save("calib_nhwc", np.zeros((6, 8, 8, 1), np.float32))
    w.save("calib_flat", np.zeros((6, 64), np.float32))
    w.save("calib_3ch", np.zeros((6, 3, 8, 8), np.float32))
    w.save("calib_nan", np.full((6, 1, 8, 8), np.nan, np.float32))
    w.save("calib_inf", np.full((6, 1, 8, 8), np.inf, np.float32))
    w.save("calib_beyond_f32", np.full((6, 1, 8, 8), 1e300, np.float64))
    w.save("calib_empty", np.zeros((0, 1, 8, 8), np.float32))
    for name in ("bool", "complex64", "U4", "datetime64[s]", "object"):
        w.save(f"calib_dt_{_slug(name)}", _dtype_array(name, (6, 1, 8, 8)), f"calib_{_slug(name)}.npy",
               allow_pickle=(name == "object"))
    np.savez(w.path("eval_ok_y", "eval_ok.npz"), x=rng.standard_normal((5, 1, 8, 8)).astype(np.float32),
             y=np.arange(5))
    np.savez(w.path("eval_nan", "eval_nan.npz"), x=np.full((5, 1, 8, 8), np.nan, np.float32))
    np.savez(w.path("eval_shape", "eval_shape.npz"), x=np.zeros((5, 8, 8, 1), np.float32))
    np.savez(w.path("eval_no_x", "eval_no_x.npz"), images=np.zeros((5, 1, 8, 8), np.float32))
    np.savez(w.path("eval_labels", "eval_labels.npz"), x=np.zeros((5, 1, 8, 8), np.float32), y=np.arange(3))
    os.makedirs(w.path("calib_dir_empty", "calib_empty_dir"))
    os.makedirs(w.path("calib_dir_text", "calib_text_dir"))
    w.write("calib_dir_text_file", "no arrays here", os.path.join("calib_text_dir", "readme.txt"))
    w.write("qi_not_json", "{ not json", "qi_not_json.json")
    w.write("qi_no_tensors", json.dumps({"format": "opendpu.quant_info/1"}), "qi_no_tensors.json")
    w.write("qi_bad_fp", json.dumps({"tensors": {"input": {"fix_point": "six"}}}), "qi_bad_fp.json")
    w.write("qi_fp_range", json.dumps({"tensors": {"input": {"fix_point": 10 ** 9}}}), "qi_fp_range.json")
    w.write("qi_list", json.dumps([1, 2]), "qi_list.json")
    # compiler inputs: the digits CNN quantized (the *-fix form), a float graph that was never quantized
    from opendpu.compiler.xir.graph import Tensor
    from opendpu.quant.quantize import QuantConfig, quantize
    res = quantize(DIGITS_SRC, np.load(w.p["calib"]), target="DPUCZDX8G_ISA1_B512",
                   config=QuantConfig(method="maxmin"))
    res.xmodel().save(w.path("q", "digits_int.xmodel"))
    fg = Graph("float_net")
    fg.add_op("image", "data", {}, {"shape": [1, 8, 8, 1]}, Tensor("image", [1, 8, 8, 1], 4, 32))
    fg.add_op("act", "relu", {"input": ["image"]}, {}, Tensor("act", [1, 8, 8, 1], 4, 32))
    fg.save(w.path("float_xmodel", "float_net.xmodel"))
    # golden directories
    os.makedirs(w.path("golden_empty", "golden_empty"))
    os.makedirs(w.path("golden_unrelated", "golden_unrelated"))
    for n in ("some_other_layer.bin", "another_net_fix.bin"):
        w.write(f"g_{n}", bytes(16), os.path.join("golden_unrelated", n))
    # op plugins
    w.write("plugin_raises", "raise RuntimeError('plugin exploded on import')\n", "bad_plugin.py")
    w.write("plugin_not_py", "x = 1\n", "plugin.txt")
    # hostile / corrupted xmodels and arch.json files
    os.makedirs(os.path.join(w.inp, "hostile"))
    for name, (how, _) in HOSTILE.items():
        w.write(f"h_{name}", _hostile_bytes(mnist, how), os.path.join("hostile", f"{name}.xmodel"))
    for n in TRUNCATE_AT:
        w.write(f"trunc_{n}", mnist[:n], os.path.join("hostile", f"trunc_{n}.xmodel"))
    w.write("random_bytes", bytes(random.Random(3).randrange(256) for _ in range(5000)), "random.xmodel")
    w.write("png_header", b"\x89PNG\r\n\x1a\n" + bytes(200), "image.xmodel")
    w.write("text_xmodel", "graph { name: 'mnist' }\n", "text.xmodel")
    shutil.copyfile(DIGITS_SRC, w.path("onnx_as_xmodel", "digits.xmodel"))
    shutil.copyfile(w.p["x"], w.path("npy_as_xmodel", "array.xmodel"))
    w.write("xmodel_as_onnx", mnist[:50000], "mnist_prefix.onnx")
    shutil.copyfile(w.p["x"], w.path("npy_as_onnx", "array.onnx"))
    tf2 = open(TF2_SRC, "rb").read()
    os.makedirs(os.path.join(w.inp, "flips"))
    for pos, bit in flip_positions():
        w.write(f"flip_{pos}_{bit}", _flip(tf2, pos, bit), os.path.join("flips", f"flip_{pos}_{bit}.xmodel"))
    os.makedirs(os.path.join(w.inp, "arch"))
    for name, content in ARCH.items():
        w.write(f"arch_{name}", content if isinstance(content, (str, bytes)) else json.dumps(content),
                os.path.join("arch", f"{name}.json"))
    w.p["arch_missing"] = os.path.join(w.inp, "arch", "missing.json")
    # a program that reads past the end of its DDR register: the MNIST input register shrunk to 512 bytes
    g = Graph.deserialize(mnist, "mnist")
    _set_reg_size(g, "REG_2", 512)
    g.save(w.path("oob", "oob.xmodel"))
    # outputs: a foreign non-empty directory, an empty one, a regular file, a missing parent
    os.makedirs(os.path.join(w.out, "foreign"))
    with open(os.path.join(w.out, "foreign", "keep.txt"), "w") as f:
        f.write("the user's file\n")
    w.p["foreign"] = os.path.join(w.out, "foreign")
    w.p["file"] = os.path.join(w.out, "file.txt")
    with open(w.p["file"], "w") as f:
        f.write("a regular file\n")
    w.p["nodir"] = os.path.join(w.out, "no_such_dir")
    for suf in ("npz", "json", "csv", "png", "txt"):          # directories named like the file outputs
        os.makedirs(os.path.join(w.out, f"dir.{suf}"))
        w.p[f"dir_{suf}"] = os.path.join(w.out, f"dir.{suf}")
    return w


# ====================================================================================================================
# the harness
# ====================================================================================================================
class ComputationStarted(BaseException):
    """Raised by the sentinels: work began before every input was validated (a BaseException, so no handler of the
    CLI can turn it into an error line)."""


# heavy entry points: (module, attribute path); reaching one during a validation case fails the case
COMPUTE = (("opendpu.runtime.runner", "Runner._run"), ("opendpu.runtime.runner", "Runner.run_layers"),
           ("opendpu.runtime.runner", "GraphRunner._run_flat"), ("opendpu.runtime.dpu", "DpuSubgraph.run_sim"),
           ("opendpu.runtime.dpu", "DpuSubgraph.run_ref"), ("opendpu.runtime.dpu", "DpuSubgraph.run_rtl"),
           ("opendpu.runtime.layers", "run_tracked"), ("opendpu.runtime.profile", "profile_graph"),
           ("opendpu.sim.sweep", "sweep"), ("opendpu.runtime.cosim", "cosim_programs"), ("opendpu.sim", "warm_kernels"),
           ("opendpu.quant.quantize", "_calibrate"),
           ("opendpu.quant.quantize", "_weights"), ("opendpu.quant.quantize", "QuantResult.evaluate"),
           ("opendpu.quant.inspect", "op_descs"), ("opendpu.quant.zoo", "summary"), ("opendpu.quant.zoo", "build"),
           ("opendpu.compiler.pipeline", "compile"), ("opendpu.compiler.codegen", "generate"),
           ("opendpu.compiler.codegen.driver", "lower"))


def _resolve(modname: str, attr: str):
    """(owner object, attribute name) of a sentinel target, or None when it no longer exists."""
    import importlib
    owner, name = importlib.import_module(modname), attr
    if "." in attr:
        cls, name = attr.split(".")
        owner = getattr(owner, cls, None)
    return (owner, name) if owner is not None and hasattr(owner, name) else None


def _install_sentinels(monkeypatch, entries=COMPUTE) -> None:
    import opendpu.runtime.cli as cli_mod
    for modname, attr in entries:
        found = _resolve(modname, attr)
        if found is None:           # renamed: test_sentinel_targets_exist reports it, the other cases still run
            continue
        owner, name = found
        orig = getattr(owner, name)

        def sentinel(*a, _what=f"{modname}.{attr}", **k):
            raise ComputationStarted(f"computation started before validation: {_what}")
        monkeypatch.setattr(owner, name, sentinel)
        if "." not in attr and getattr(cli_mod, name, None) is orig:   # imported by name into the CLI
            monkeypatch.setattr(cli_mod, name, sentinel)


def _snapshot(root: str) -> dict:
    out = {}
    for r, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(r, d), root) + "/"] = None
        for f in files:
            p = os.path.join(r, f)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size, st.st_mtime_ns, st.st_mode)
    return out


def _md5(p: str) -> str:
    with open(p, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


@dataclass
class Case:
    id: str
    argv: str | list           # template (split on spaces) or list of templates
    code: int = 2
    must: list = field(default_factory=list)
    never: list = field(default_factory=list)
    compute: bool = False       # True: the error may be found after work started (no sentinels)
    stdout_empty: bool = True
    cwd: str = "{cwd}"

    def args(self, ws: Workspace) -> list[str]:
        parts = self.argv.split() if isinstance(self.argv, str) else list(self.argv)
        return [p.format(**ws.p) for p in parts]


@dataclass
class Result:
    code: int
    out: str
    err: str
    msg: str | None


def run_cli(ws: Workspace, argv: list[str], monkeypatch, capsys, sentinels=True, cwd: str | None = None):
    """Run `opendpu argv` in-process; return Result after asserting nothing in the workspace changed.
    `sentinels`: True for every COMPUTE entry point, a tuple of (module, attribute) for those only, False for none."""
    monkeypatch.setenv("OPENDPU_DEBUG", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)     # --op-plugin imports must not leave __pycache__
    monkeypatch.chdir(cwd or ws.cwd)
    if sentinels:
        _install_sentinels(monkeypatch, COMPUTE if sentinels is True else sentinels)
    named = [a for a in argv if os.path.isfile(a)]
    hashes = {a: _md5(a) for a in named}
    before = _snapshot(ws.root)
    capsys.readouterr()
    try:
        code = cli_main(list(argv))
    except SystemExit as e:                                  # argparse (--help/--version) or a CLI that exits
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    out, err = capsys.readouterr()
    after = _snapshot(ws.root)
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    assert not added and not removed and not changed, \
        f"opendpu {' '.join(argv)} left the workspace changed: added {added}, removed {removed}, changed {changed}"
    for a, h in hashes.items():
        assert _md5(a) == h, f"input {a} was modified"
    assert "Traceback" not in out + err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    msg = None
    if code not in (0, 1):
        assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{err}"
        m = ERR_LINE.match(lines[0])
        assert m, f"not of the form 'opendpu VERB: error: MESSAGE': {lines[0]!r}"
        verb = next((a for a in argv if a in VERBS), None)
        assert m.group("verb") == verb, f"error line names verb {m.group('verb')!r}, expected {verb!r}: {lines[0]}"
        msg = m.group("msg")
    return Result(code, out, err, msg)


def check_case(ws: Workspace, case: Case, monkeypatch, capsys) -> Result:
    argv = case.args(ws)
    r = run_cli(ws, argv, monkeypatch, capsys, sentinels=not case.compute, cwd=case.cwd.format(**ws.p))
    assert r.code == case.code, f"opendpu {' '.join(argv)}: exit {r.code}, expected {case.code}\n{r.err}{r.out[-2000:]}"
    if case.code == 2:
        low = r.msg.lower()
        for s in case.must:
            alts = (s,) if isinstance(s, str) else tuple(s)
            alts = tuple(a.format(**ws.p) for a in alts)
            assert any(a.lower() in low for a in alts), f"message does not name {alts}: {r.msg}"
        for s in case.never:
            assert s.format(**ws.p).lower() not in low, f"message should not contain {s!r}: {r.msg}"
        if case.stdout_empty:
            assert r.out.strip() == "", f"stdout not empty on a validation error:\n{r.out[-2000:]}"
    return r


def _params(cases: list[Case]):
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    return pytest.mark.parametrize("case", cases, ids=ids)


# ====================================================================================================================
# the case tables
# ====================================================================================================================
RUN = "run {mnist} -i {x}"
RUN_REF = "run {mnist} --backend ref -i {x}"
PROFILE = "profile {mnist}"
SWEEP = "sweep {mnist} --param ddr_latency=40,80"
QUANT = "quantize {onnx} --calib {calib}"
INSPECT = "inspect {onnx} --target DPUCZDX8G_ISA1_B4096"
RANDOM = "cosim --random 1 --target DPUCZDX8G_ISA1_B512"
NEVER_NAN = ["not a number", "invalid int", "invalid float"]

# ---- A. usage: argparse errors, one line, every verb -----------------------------------------------------------
USAGE = [
    Case("no_verb", "", must=[("VERB", "required")]),
    Case("unknown_verb", "frobnicate", must=["frobnicate"]),
    Case("quantize_without_calib", "quantize {onnx}", must=["--calib"]),
    Case("inspect_without_target", "inspect {onnx}", must=["--target"]),
    Case("cosim_random_without_target", "cosim --random 2", must=["--target"]),
    Case("cosim_nothing", "cosim", must=["--random"]),
    Case("sweep_without_param", "sweep {mnist}", must=["--param"]),
    Case("run_without_input", "run {mnist}", must=["-i"]),
]
USAGE += [Case(f"{v}_without_model", v, must=["model"])
          for v in ("run", "check", "disasm", "races", "xmodel", "profile", "sweep", "quantize", "inspect")]
USAGE += [Case(f"{v}_unknown_option", f"{argv} --bogus-option", must=["--bogus-option"]) for v, argv in (
    ("run", RUN), ("check", "check {mnist}"), ("disasm", "disasm {mnist}"), ("races", "races {mnist}"),
    ("xmodel", "xmodel {mnist}"),
    ("profile", PROFILE), ("sweep", SWEEP), ("cosim", "cosim {mnist}"), ("quantize", QUANT), ("inspect", INSPECT),
    ("zoo", "zoo resnet18"), ("targets", "targets"))]
USAGE += [Case(f"bad_choice_{i}", argv, must=must) for i, (argv, must) in enumerate((
    (RUN + " --backend gpu", ["--backend", "gpu"]),
    (RUN + " --layout nwhc", ["--layout", "nwhc"]),
    (QUANT + " --method magic", ["--method", "magic"]),
    (QUANT + " --weight-method percentile", ["--weight-method", "percentile"]),
    (QUANT + " --statistic mode", ["--statistic", "mode"]),
    (INSPECT + " --verbose 5", ["--verbose", "5"]),
    (RANDOM + " --rtl-sim modelsim", ["--rtl-sim", "modelsim"]),
))]
USAGE += [Case(f"missing_value_{i}", argv, must=must) for i, (argv, must) in enumerate((
    ("run {mnist} -i", ["-i"]), ("check {mnist} -n", ["-n"]), (PROFILE + " --trace", ["--trace"]),
    ("run {mnist} -i {x} --target", ["--target"]), (QUANT + " -o", ["-o"]), ("zoo --size", ["--size"]),
))]
USAGE += [Case(f"not_a_number_{i}", argv, must=must) for i, (argv, must) in enumerate((
    ("check {mnist} -n abc", ["-n", "abc"]), ("check {mnist} --seed x1", ["--seed", "x1"]),
    ("zoo --size big", ["--size", "big"]), (QUANT + " --percentile pct", ["--percentile", "pct"]),
    (QUANT + " --batch-size 1.5", ["--batch-size", "1.5"]), (QUANT + " --calib-limit some", ["--calib-limit"]),
    ("cosim --random x --target DPUCZDX8G_ISA1_B512", ["--random", "x"]),
    (RANDOM + " --instructions many", ["--instructions", "many"]), (RUN + " --clock-mhz fast", ["--clock-mhz", "fast"]),
    (PROFILE + " --clock-mhz 3GHz", ["--clock-mhz", "3GHz"]),
    (RUN + " --workers 1.5", ["--workers", "1.5"]), (QUANT + " --workers two", ["--workers", "two"]),
))]

# ---- B. numeric ranges: out of range is called out of range -------------------------------------------------------
def _range(cid, argv, opt, value, out_of_range=True, spellings=()):
    must = [opt, (value,) + tuple(spellings)] + (["out of range"] if out_of_range else [])
    return Case(cid, f"{argv} {opt} {value}", must=must, never=NEVER_NAN if out_of_range else [])


HUGE = "99999999999999999999"
RANGES = [
    _range("check_n_zero", "check {mnist}", "-n", "0"), _range("check_n_negative", "check {mnist}", "-n", "-1"),
    _range("check_n_huge", "check {mnist}", "-n", HUGE), _range("check_seed_negative", "check {mnist}", "--seed", "-1"),
    _range("check_seed_huge", "check {mnist}", "--seed", HUGE + "000"),
    _range("cosim_seed_negative", "cosim {mnist}", "--seed", "-7"),
    _range("quantize_seed_negative", QUANT, "--seed", "-1"),
    _range("zoo_size_zero", "zoo", "--size", "0"), _range("zoo_size_31", "zoo", "--size", "31"),
    _range("zoo_size_negative", "zoo", "--size", "-5"), _range("zoo_size_big", "zoo", "--size", "100000"),
    _range("zoo_size_huge", "zoo", "--size", HUGE),
    _range("percentile_zero", QUANT, "--percentile", "0"), _range("percentile_150", QUANT, "--percentile", "150"),
    _range("percentile_negative", QUANT, "--percentile", "-1"),
    _range("percentile_just_above", QUANT, "--percentile", "100.0001"),
    _range("percentile_nan", QUANT, "--percentile", "nan", out_of_range=False),
    _range("percentile_inf", QUANT, "--percentile", "inf", out_of_range=False),
    _range("batch_size_zero", QUANT, "--batch-size", "0"), _range("batch_size_negative", QUANT, "--batch-size", "-3"),
    _range("calib_limit_zero", QUANT, "--calib-limit", "0"),
    _range("calib_limit_negative", QUANT, "--calib-limit", "-1"),
    _range("run_clock_zero", RUN, "--clock-mhz", "0"), _range("run_clock_negative", RUN, "--clock-mhz", "-5"),
    _range("run_clock_huge", RUN, "--clock-mhz", "1e9", spellings=("1e+09", "1000000000")),
    _range("run_clock_inf", RUN, "--clock-mhz", "inf", out_of_range=False),
    _range("run_clock_nan", RUN, "--clock-mhz", "nan", out_of_range=False),
    _range("profile_clock_zero", PROFILE, "--clock-mhz", "0"),
    _range("profile_clock_inf", PROFILE, "--clock-mhz", "inf", out_of_range=False),
    _range("profile_clock_nan", PROFILE, "--clock-mhz", "nan", out_of_range=False),
    _range("cosim_instructions_zero", RANDOM, "--instructions", "0"),
    _range("cosim_instructions_one", RANDOM, "--instructions", "1"),
    _range("cosim_instructions_negative", RANDOM, "--instructions", "-1"),
    _range("cosim_random_negative", "cosim --target DPUCZDX8G_ISA1_B512", "--random", "-1"),
    _range("run_workers_zero", RUN, "--workers", "0"), _range("run_workers_negative", RUN, "--workers", "-2"),
    _range("quantize_workers_zero", QUANT, "--workers", "0"),
    _range("quantize_workers_negative", QUANT, "--workers", "-1"),
]

# ---- C. --timing KEY=VALUE and sweep --param --------------------------------------------------------------------
TIMING_VALUES = {
    "unknown_key": ("ddr_latncy=3", ["ddr_latncy"], []),
    "huge": ("ddr_latency=" + HUGE, ["ddr_latency", "out of range"], ["OverflowError"] + NEVER_NAN),
    "huge_watchdog": (f"watchdog_cycles={2 ** 41}", ["watchdog_cycles", "out of range"], NEVER_NAN),
    "negative": ("ddr_latency=-1", ["ddr_latency", "out of range"], NEVER_NAN),
    "not_a_number": ("ddr_latency=fast", ["ddr_latency", "fast"], []),
    "float_for_integer": ("ddr_latency=1.5", ["ddr_latency", "1.5"], []),
    "no_equals": ("ddr_latency", ["ddr_latency"], []),
    "empty_value": ("ddr_latency=", ["ddr_latency"], []),
    "empty_key": ("=80", ["--timing"], []),
    "clock_zero": ("clock_mhz=0", ["clock_mhz"], []),
    "clock_inf": ("clock_mhz=inf", ["clock_mhz"], []),
    "clock_nan": ("clock_mhz=nan", ["clock_mhz"], []),
    "clock_negative": ("clock_mhz=-300", ["clock_mhz"], []),
    "fifo_too_small": ("fetch_fifo_words=3", ["fetch_fifo_words"], []),
    "queue_zero": ("queue_depth=0", ["queue_depth", "out of range"], NEVER_NAN),
    "ports_huge": ("ddr_ports=1000", ["ddr_ports", "out of range"], NEVER_NAN),
    "word_for_integer": ("cores=true", ["cores"], []),
}
TIMING = [Case(f"profile_{k}", f"{PROFILE} --timing {v}", must=m, never=n) for k, (v, m, n) in TIMING_VALUES.items()]
TIMING += [Case(f"run_{k}", f"{RUN} --timing {TIMING_VALUES[k][0]}", must=TIMING_VALUES[k][1],
                never=TIMING_VALUES[k][2])
           for k in ("unknown_key", "huge", "negative", "not_a_number", "clock_inf", "no_equals")]
TIMING += [Case(f"run_rtl_{k}", f"{RUN} --backend rtl --timing {TIMING_VALUES[k][0]}", must=TIMING_VALUES[k][1],
                never=TIMING_VALUES[k][2]) for k in ("huge", "unknown_key")]
TIMING += [Case(f"cosim_{k}", f"cosim {{mnist}} --timing {TIMING_VALUES[k][0]}", must=TIMING_VALUES[k][1],
                never=TIMING_VALUES[k][2]) for k in ("unknown_key", "huge", "negative", "clock_nan")]
TIMING += [Case(f"cosim_random_{k}", f"{RANDOM} --timing {TIMING_VALUES[k][0]}", must=TIMING_VALUES[k][1],
                never=TIMING_VALUES[k][2]) for k in ("huge", "fifo_too_small")]
TIMING += [
    Case("timing_key_twice", PROFILE + " --timing ddr_latency=10 --timing ddr_latency=20", must=["ddr_latency"]),
    Case("timing_clock_and_clock_mhz", PROFILE + " --timing clock_mhz=200 --clock-mhz 300", must=["clock"]),
]
PARAMS = {
    "unknown": ("ddr_latncy=1,2", ["ddr_latncy"]),
    "huge": ("ddr_latency=1," + HUGE, ["ddr_latency", "out of range"]),
    "negative": ("ddr_latency=-5", ["ddr_latency"]),
    "not_numbers": ("ddr_latency=a,b", ["ddr_latency"]),
    "empty": ("ddr_latency=", ["ddr_latency"]),
    "empty_item": ("ddr_latency=40,,80", ["ddr_latency"]),
    "no_equals": ("ddr_latency", ["ddr_latency"]),
    "clock_zero": ("clock_mhz=0,300", ["clock_mhz"]),
    "clock_inf": ("clock_mhz=inf", ["clock_mhz"]),
    "fifo_too_small": ("fetch_fifo_words=2,8", ["fetch_fifo_words"]),
}
TIMING += [Case(f"sweep_param_{k}", f"sweep {{mnist}} --param {v}", must=m) for k, (v, m) in PARAMS.items()]
TIMING += [Case("sweep_param_twice", "sweep {mnist} --param ddr_latency=1,2 --param ddr_latency=3",
                must=["ddr_latency"])]

# ---- D. option combinations, input counts and names, targets, custom ops ------------------------------------------
B512 = "DPUCZDX8G_ISA1_B512"
COMBOS = [
    Case("ref_with_timing", RUN_REF + " --timing ddr_latency=80", must=["--timing", "ref"]),
    Case("ref_with_clock", RUN_REF + " --clock-mhz 200", must=["--clock-mhz", "ref"]),
    Case("cosim_model_and_random", "cosim {mnist} --random 2", must=["--random", "either"]),
    Case("cosim_bank_conflicts_without_random", "cosim {mnist} --bank-conflicts",
         must=["--bank-conflicts", "--random"]),
    Case("two_inputs_for_one", RUN + " -i {x}", must=["quant_input_1"]),
    Case("npz_without_the_input", "run {mnist} -i {npz_wrong_key}", must=["quant_input_1"]),
    Case("npz_with_an_extra_array", "run {mnist} -i {npz_extra_key}", must=["bogus_array"]),
    Case("disasm_unknown_subgraph", "disasm {mnist} --subgraph nope_sg", must=["nope_sg"]),
    Case("cosim_unknown_subgraph", "cosim {mnist} --subgraph nope_sg", must=["nope_sg"]),
    Case("zoo_unknown_model", "zoo vgg11", must=["vgg11"]),
    Case("custom_op_without_plugin", "run {tf2} --backend ref -i {x}", must=["Mylayer"]),
    Case("plugin_missing", RUN_REF + " --op-plugin {in}/nope_plugin.py", must=["nope_plugin.py", "no such file"]),
    Case("plugin_not_python", RUN_REF + " --op-plugin {plugin_not_py}", must=["plugin.txt"]),
    Case("plugin_raises", RUN_REF + " --op-plugin {plugin_raises}", must=["bad_plugin.py"]),
]
COMBOS += [Case(f"{v}_target_mismatch", f"{argv} --target {B512}", must=["B512"]) for v, argv in (
    ("run", RUN), ("run_ref", RUN_REF), ("check", "check {mnist}"), ("profile", PROFILE), ("sweep", SWEEP),
    ("cosim", "cosim {mnist}"))]
COMBOS += [Case(f"{v}_target_unknown", f"{argv} --target B9999", must=["B9999"]) for v, argv in (
    ("run", RUN), ("check", "check {mnist}"), ("profile", PROFILE), ("sweep", SWEEP), ("cosim", "cosim {mnist}"),
    ("cosim_random", "cosim --random 1"), ("quantize", QUANT), ("inspect", "inspect {onnx}"))]
COMBOS += [Case(f"{v}_target_directory", f"{argv} --target {{adir}}", must=["adir", "directory"]) for v, argv in (
    ("check", "check {mnist}"), ("profile", PROFILE), ("quantize", QUANT))]
COMBOS += [Case(f"{v}_target_missing_json", f"{argv} --target {{arch_missing}}", must=["missing.json", "no such file"])
           for v, argv in (("check", "check {mnist}"), ("sweep", SWEEP), ("inspect", "inspect {onnx}"))]

# ---- E. input paths: missing, directory, empty, wrong format ------------------------------------------------------
MODEL_VERBS = {  # verb -> argv with {model}
    "run": "run {model} -i {x}", "check": "check {model}", "disasm": "disasm {model}", "races": "races {model}",
    "xmodel": "xmodel {model}",
    "profile": "profile {model}", "sweep": "sweep {model} --param ddr_latency=40,80", "cosim": "cosim {model}",
    "quantize": "quantize {model} --calib {calib}", "inspect": "inspect {model} --target DPUCZDX8G_ISA1_B4096",
}


def _model_case(cid, verb, model, must):
    return Case(cid, MODEL_VERBS[verb].replace("{model}", model), must=must)


PATHS = []
for _v in MODEL_VERBS:
    onnx = _v in ("quantize", "inspect")
    PATHS += [
        _model_case(f"{_v}_model_missing", _v, "{in}/missing." + ("onnx" if onnx else "xmodel"),
                    ["missing." + ("onnx" if onnx else "xmodel"), "no such file"]),
        _model_case(f"{_v}_model_directory", _v, "{adir}", ["adir", "is a directory"]),
        _model_case(f"{_v}_model_empty", _v, "{empty_file}", ["empty.xmodel", "empty"]),
        _model_case(f"{_v}_model_text", _v, "{text}", ["notes.txt", "not an ONNX" if onnx else "not an xmodel"]),
    ]
PATHS += [
    Case("input_missing_npy", "run {mnist} -i {in}/missing.npy", must=["missing.npy", "no such file"]),
    Case("input_missing_bin", "run {mnist} -i {in}/missing.bin", must=["missing.bin", "no such file"]),
    Case("input_missing_npz", "run {mnist} -i {in}/missing.npz", must=["missing.npz", "no such file"]),
    Case("input_directory", "run {mnist} -i {adir}", must=["adir", "is a directory"]),
    Case("input_text_as_npy", "run {mnist} -i {text_npy}", must=["text.npy", "not an .npy file"], never=["pickle"]),
    Case("input_text_file", "run {mnist} -i {text}", must=["notes.txt", "not an .npy file"], never=["pickle"]),
    Case("input_pickled_objects", "run {mnist} -i {pickled}", must=["pickled.npy"], never=["allow_pickle"]),
    Case("input_truncated_npy", "run {mnist} -i {npy_truncated}", must=["truncated.npy"]),
    Case("input_corrupt_npz", "run {mnist} -i {npz_corrupt}", must=["corrupt.npz"]),
    Case("input_short_bin", "run {mnist} -i {bin_short}", must=["short.bin"]),
    Case("input_xmodel_as_input", "run {mnist} -i {mnist}", must=["mnist.xmodel"], never=["pickle"]),
    Case("calib_missing", "quantize {onnx} --calib {in}/missing.npy", must=["missing.npy", "no such file"]),
    Case("calib_empty_directory", "quantize {onnx} --calib {calib_dir_empty}", must=["calib_empty_dir"]),
    Case("calib_directory_without_arrays", "quantize {onnx} --calib {calib_dir_text}", must=["calib_text_dir"]),
    Case("calib_text_as_npy", "quantize {onnx} --calib {text_npy}", must=["text.npy", "not an .npy file"],
         never=["pickle"]),
    Case("calib_text_file", "quantize {onnx} --calib {text}", must=["notes.txt", "not an .npy"], never=["pickle"]),
    Case("calib_pickled_objects", "quantize {onnx} --calib {pickled}", must=["pickled.npy"], never=["allow_pickle"]),
    Case("calib_corrupt_npz", "quantize {onnx} --calib {npz_corrupt}", must=["corrupt.npz"]),
    Case("calib_truncated_npy", "quantize {onnx} --calib {npy_truncated}", must=["truncated.npy"]),
    Case("quant_info_missing", QUANT + " --quant-info {in}/missing.json", must=["missing.json", "no such file"]),
    Case("quant_info_directory", QUANT + " --quant-info {adir}", must=["adir", "directory"]),
    Case("quant_info_not_json", QUANT + " --quant-info {qi_not_json}", must=["qi_not_json.json", "JSON"]),
    Case("quant_info_no_tensors", QUANT + " --quant-info {qi_no_tensors}", must=["qi_no_tensors.json", "tensors"]),
    Case("quant_info_bad_fix_point", QUANT + " --quant-info {qi_bad_fp}", must=["qi_bad_fp.json", "fix_point"]),
    Case("quant_info_fix_point_range", QUANT + " --quant-info {qi_fp_range}", must=["qi_fp_range.json", "fix_point"]),
    Case("quant_info_a_list", QUANT + " --quant-info {qi_list}", must=["qi_list.json"]),
    Case("evaluate_missing", QUANT + " --evaluate {in}/missing.npz", must=["missing.npz", "no such file"]),
    Case("evaluate_directory", QUANT + " --evaluate {adir}", must=["adir", "directory"]),
    Case("evaluate_nan", QUANT + " --evaluate {eval_nan}", must=["evaluation", ("nan", "inf")],
         never=["calibration"]),
    Case("evaluate_wrong_shape", QUANT + " --evaluate {eval_shape}", must=["evaluation", "[1, 1, 8, 8]"],
         never=["calibration"]),
    Case("evaluate_without_x", QUANT + " --evaluate {eval_no_x}", must=["eval_no_x.npz", "'x'"]),
    Case("evaluate_labels_mismatch", QUANT + " --evaluate {eval_labels}", must=["eval_labels.npz", ("label", "'y'")]),
    Case("evaluate_text", QUANT + " --evaluate {text}", must=["notes.txt"], never=["pickle"]),
    Case("golden_missing", RUN_REF + " --golden {in}/golden_missing", must=["golden_missing"]),
    Case("golden_is_a_file", RUN_REF + " --golden {text}", must=["notes.txt", "directory"]),
    Case("golden_empty", RUN_REF + " --golden {golden_empty}", must=["golden_empty"]),
    Case("golden_unrelated", RUN_REF + " --golden {golden_unrelated}", must=["compared 0 of 2"], compute=True,
         stdout_empty=False),
]

# ---- F. output paths ----------------------------------------------------------------------------------------------
OUTPUTS = [
    Case("run_o_missing_parent", RUN_REF + " -o {nodir}/o.npz", must=["no_such_dir"]),
    Case("run_o_directory", RUN_REF + " -o {dir_npz}", must=["dir.npz", "directory"]),
    Case("run_o_not_npz", RUN_REF + " -o {out}/o.txt", must=["o.txt", ".npz"]),
    Case("run_o_no_suffix", RUN_REF + " -o {out}/result", must=["result", ".npz"]),
    Case("run_o_existing_other_file", RUN_REF + " -o {file}", must=["file.txt"]),
    Case("run_o_the_model", RUN_REF + " -o {mnist}", must=["mnist.xmodel"]),
    Case("run_o_the_input", "run {mnist} --backend ref -i {npz_ok} -o {npz_ok}", must=["npz_ok.npz", "input"]),
    Case("run_o_the_input_forced", "run {mnist} --backend ref -i {npz_ok} -o {npz_ok} --force",
         must=["npz_ok.npz", "input"]),
    Case("run_dump_regular_file", RUN_REF + " --dump {file}", must=["file.txt"]),
    Case("run_dump_regular_file_forced", RUN_REF + " --dump {file} --force", must=["file.txt"]),
    Case("run_dump_foreign_directory", RUN_REF + " --dump {foreign}", must=["foreign", "--force"]),
    Case("run_dump_dot", RUN_REF + " --dump .", must=["--force"], cwd="{in}"),
    Case("run_dump_ancestor_of_input", RUN_REF + " --dump {in}", must=["--force"]),
    Case("sweep_csv_missing_parent", SWEEP + " --csv {nodir}/s.csv", must=["no_such_dir"]),
    Case("sweep_csv_directory", SWEEP + " --csv {dir_csv}", must=["dir.csv", "directory"]),
    Case("sweep_csv_the_model", SWEEP + " --csv {mnist}", must=["mnist.xmodel"]),
    Case("sweep_csv_existing_other_file", SWEEP + " --csv {x}", must=["x.npy"]),
    Case("plot_unknown_format", PROFILE + " --plot {out}/p.xyz", must=["p.xyz"]),
    Case("plot_jpeg", PROFILE + " --plot {out}/p.jpg", must=["p.jpg"]),
    Case("plot_no_suffix", PROFILE + " --plot {out}/plot", must=["plot"]),
    Case("profile_same_file_twice", PROFILE + " --json {out}/same.json --trace {out}/same.json", must=["same.json"]),
]
for _opt, _suf in (("trace", ".json"), ("json", ".json"), ("csv", ".csv"), ("instructions", ".csv"), ("plot", ".png"),
                   ("txt", ".txt")):
    OUTPUTS += [
        Case(f"profile_{_opt}_missing_parent", f"{PROFILE} --{_opt} {{nodir}}/p{_suf}", must=["no_such_dir"]),
        Case(f"profile_{_opt}_directory", f"{PROFILE} --{_opt} {{dir_{_suf[1:]}}}", must=[f"dir{_suf}", "directory"]),
        Case(f"profile_{_opt}_the_model", f"{PROFILE} --{_opt} {{mnist}}", must=["mnist.xmodel"]),
        Case(f"profile_{_opt}_existing_other_file", f"{PROFILE} --{_opt} {{x}}", must=["x.npy"]),
    ]
for _v, _argv in (("quantize", QUANT), ("inspect", INSPECT)):
    OUTPUTS += [
        Case(f"{_v}_o_dot", _argv + " -o .", must=["--force"], cwd="{in}"),
        Case(f"{_v}_o_foreign_directory", _argv + " -o {foreign}", must=["foreign", "--force"]),
        Case(f"{_v}_o_regular_file", _argv + " -o {file}", must=["file.txt"]),
        Case(f"{_v}_o_regular_file_forced", _argv + " -o {file} --force", must=["file.txt"]),
        Case(f"{_v}_o_ancestor_of_input", _argv + " -o {in}", must=["--force"]),
        Case(f"{_v}_o_the_model", _argv + " -o {onnx}", must=["digits_cnn.onnx"]),
    ]
OUTPUTS += [
    Case("zoo_export_foreign_directory", "zoo resnet18 --export {foreign}", must=["foreign", "--force"]),
    Case("zoo_export_regular_file", "zoo resnet18 --export {file}", must=["file.txt"]),
    Case("zoo_export_regular_file_forced", "zoo resnet18 --export {file} --force", must=["file.txt"]),
    Case("zoo_export_dot", "zoo resnet18 --export .", must=["--force"], cwd="{in}"),
    Case("cosim_waves_foreign_directory", RANDOM + " --waves {foreign}", must=["foreign", "--force"]),
    Case("cosim_waves_regular_file", RANDOM + " --waves {file}", must=["file.txt"]),
]

# ---- G/H/I. dtypes, NaN/Inf, shapes -------------------------------------------------------------------------------
VALUES = []
for _b in ("ref", "sim"):
    VALUES += [Case(f"{_b}_dtype_{_slug(n)}", f"run {{mnist}} --backend {_b} -i {{dt_{_slug(n)}}}",
                    must=[_dtype_names(n)], never=["allow_pickle"]) for n in BAD_DTYPES]
VALUES += [Case(f"calib_dtype_{_slug(n)}", f"quantize {{onnx}} --calib {{calib_dt_{_slug(n)}}}",
                must=[_dtype_names(n)], never=["allow_pickle"]) for n in ("bool", "complex64", "U4", "datetime64[s]",
                                                                          "object")]
VALUES += [Case(f"ref_{lab}_{dt}", f"run {{mnist}} --backend ref -i {{{lab}_{dt}}}",
                must=[("nan", "inf"), ("quant_input_1", f"{lab}_{dt}.npy")])
           for dt in ("float16", "float32", "float64") for lab in ("nan", "inf", "ninf")]
VALUES += [
    Case("sim_nan_float32", "run {mnist} -i {nan_float32}", must=[("nan", "inf")]),
    Case("ref_nan_in_npz", "run {mnist} --backend ref -i {npz_nan}", must=[("nan", "inf")]),
    Case("calib_nan", "quantize {onnx} --calib {calib_nan}", must=["calib_nan.npy", ("nan", "inf")]),
    Case("calib_inf", "quantize {onnx} --calib {calib_inf}", must=["calib_inf.npy", ("nan", "inf")]),
    Case("calib_beyond_float32", "quantize {onnx} --calib {calib_beyond_f32}", must=["calib_beyond_f32.npy"]),
    Case("calib_zero_samples", "quantize {onnx} --calib {calib_empty}", must=["calib_empty.npy"]),
]
VALUES += [Case(f"ref_shape_{lab}", f"run {{mnist}} --backend ref -i {{shape_{lab}}}", must=[MNIST_SHAPE, "NHWC"])
           for lab in ("nchw", "flat", "hw", "hwc", "rank5", "batch0", "h29", "empty", "c3", "scalar")]
VALUES += [
    Case("sim_shape_nchw", "run {mnist} -i {shape_nchw}", must=[MNIST_SHAPE, "NHWC"]),
    Case("layout_nchw_on_nhwc_input", RUN_REF + " --layout nchw", must=[MNIST_SHAPE]),
    Case("layout_nchw_on_3d_input", "run {mnist} --backend ref --layout nchw -i {shape_hwc}", must=[MNIST_SHAPE]),
    Case("calib_nhwc", "quantize {onnx} --calib {calib_nhwc}", must=["calib_nhwc.npy", "[1, 1, 8, 8]"]),
    Case("calib_flat", "quantize {onnx} --calib {calib_flat}", must=["calib_flat.npy", "[1, 1, 8, 8]"]),
    Case("calib_three_channels", "quantize {onnx} --calib {calib_3ch}", must=["calib_3ch.npy", "[1, 1, 8, 8]"]),
]

# ---- J. corrupted and hostile xmodels -----------------------------------------------------------------------------
XMODELS = [Case(f"truncated_{n}", f"xmodel {{trunc_{n}}}", must=[f"trunc_{n}.xmodel", "not an xmodel"])
           for n in TRUNCATE_AT]
XMODELS += [Case(f"{v}_truncated", MODEL_VERBS[v].replace("{model}", "{trunc_4000}"), must=["trunc_4000.xmodel"])
            for v in ("run", "check", "disasm", "races", "profile", "sweep", "cosim")]
XMODELS += [Case(f"not_an_xmodel_{k}", f"xmodel {{{k}}}", must=[os.path.basename(f), "not an xmodel"])
            for k, f in (("random_bytes", "random.xmodel"), ("png_header", "image.xmodel"),
                         ("text_xmodel", "text.xmodel"), ("onnx_as_xmodel", "digits.xmodel"),
                         ("npy_as_xmodel", "array.xmodel"))]
XMODELS += [Case(f"{v}_not_onnx_{k}", MODEL_VERBS[v].replace("{model}", f"{{{k}}}"), must=[f])
            for v in ("quantize", "inspect") for k, f in (("xmodel_as_onnx", "mnist_prefix.onnx"),
                                                         ("npy_as_onnx", "array.onnx"), ("mnist", "mnist.xmodel"))]
for _name, (_how, _must) in HOSTILE.items():
    XMODELS += [Case(f"{_v}_{_name}", _argv.replace("{model}", f"{{h_{_name}}}"), must=_must)
                for _v, _argv in (("xmodel", "xmodel {model}"), ("check", "check {model} -n 1"),
                                  ("run_ref", "run {model} --backend ref -i {x}"))]

# a dynamic H quantizes with the shape of the calibration data (issue 14; tests/test_input_shape.py), so only
# inspect (no data) must refuse it
ONNX_CASES = [Case(f"{v}_{name}", MODEL_VERBS[v].replace("{model}", f"{{ho_{name}}}"), must=must)
              for name, (_, must) in HOSTILE_ONNX.items() for v in ("quantize", "inspect")
              if (v, name) != ("quantize", "dynamic_dim")]
ONNX_CASES += [Case("quantize_two_inputs", "quantize {ho_two_inputs} --calib {calib}",
                    must=["two_inputs.onnx", "2 inputs"])]

# ---- K. hostile arch.json -----------------------------------------------------------------------------------------
ARCHS = [Case(f"check_arch_{k}", "check {mnist} --target {arch_%s}" % k, must=[f"{k}.json"] + ARCH_MUST[k])
         for k in ARCH]
ARCHS += [Case(f"{v}_arch_{k}", f"{argv} --target {{arch_{k}}}", must=[f"{k}.json"] + ARCH_MUST[k])
          for v, argv, k in (("profile", PROFILE, "timing_huge"), ("sweep", SWEEP, "timing_nan"),
                             ("run", RUN, "timing_negative"), ("cosim", "cosim {mnist}", "list"),
                             ("cosim_random", "cosim --random 1", "timing_unknown_key"),
                             ("quantize", QUANT, "not_json"), ("inspect", "inspect {onnx}", "binary"),
                             ("run_ref", RUN_REF, "fingerprint_other_dpu"))]


# ---- L. compile and build: usage, inputs, targets, --options, names, outputs --------------------------------------
COMPILE = "compile -x {q} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net"
BUILD = "build {onnx} --calib {calib} --target DPUCZDX8G_ISA1_B512 -o {out}/b"


def _opts(cid, json_text, must, argv=COMPILE):
    return Case(cid, argv.split() + ["--options", json_text.replace("{", "{{").replace("}", "}}")], must=must)


COMPILER = [
    Case("compile_without_x", "compile --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net", must=["-x"]),
    Case("compile_without_o", "compile -x {q} --target DPUCZDX8G_ISA1_B512 -n net", must=["-o"]),
    Case("compile_without_target", "compile -x {q} -o {out}/c -n net", must=["-a", "--target"]),
    Case("compile_arch_and_target", COMPILE + " -a {arch_no_key}", must=["either", "-a", "--target"]),
    Case("compile_unknown_option", COMPILE + " --bogus-option", must=["--bogus-option"]),
    Case("build_without_calib", "build {onnx} --target DPUCZDX8G_ISA1_B512 -o {out}/b", must=["--calib"]),
    Case("build_without_target", "build {onnx} --calib {calib} -o {out}/b", must=["--target"]),
    Case("build_without_output", "build {onnx} --calib {calib} --target DPUCZDX8G_ISA1_B512", must=["-o"]),
    Case("build_unknown_option", BUILD + " --bogus-option", must=["--bogus-option"]),
    Case("build_bad_method", BUILD + " --method magic", must=["--method", "magic"]),
    _range("build_check_n_zero", BUILD, "--check-n", "0"),
    _range("build_seed_negative", BUILD, "--seed", "-1"),
    # inputs
    Case("compile_model_missing", "compile -x {in}/missing.xmodel --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net",
         must=["missing.xmodel", "no such file"]),
    Case("compile_model_directory", "compile -x {adir} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net",
         must=["adir", "directory"]),
    Case("compile_model_empty", "compile -x {empty_file} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net",
         must=["empty.xmodel", "empty"]),
    Case("compile_model_text", "compile -x {text} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net",
         must=["notes.txt", "not an xmodel"]),
    Case("compile_model_truncated", "compile -x {trunc_4000} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net",
         must=["trunc_4000.xmodel"]),
    Case("compile_model_onnx", "compile -x {onnx_as_xmodel} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net",
         must=["digits.xmodel", "not an xmodel"]),
    Case("compile_float_xmodel", "compile -x {float_xmodel} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n net",
         must=["float_net", "not quantized", "opendpu quantize"]),
    Case("compile_compiled_without_recompile", "compile -x {mnist} --target DPUCZDX8G_ISA1_B4096 -o {out}/c -n net",
         must=["already compiled", "--recompile"]),
    Case("compile_recompile_uncompiled", COMPILE + " --recompile", must=["not compiled"]),
    Case("build_model_missing", "build {in}/missing.onnx --calib {calib} --target DPUCZDX8G_ISA1_B512 -o {out}/b",
         must=["missing.onnx", "no such file"]),
    Case("build_model_text", "build {text} --calib {calib} --target DPUCZDX8G_ISA1_B512 -o {out}/b",
         must=["notes.txt"]),
    Case("build_model_xmodel", "build {mnist} --calib {calib} --target DPUCZDX8G_ISA1_B512 -o {out}/b",
         must=["mnist.xmodel"]),
    Case("build_calib_missing", "build {onnx} --calib {in}/missing.npy --target DPUCZDX8G_ISA1_B512 -o {out}/b",
         must=["missing.npy", "no such file"]),
    Case("build_calib_wrong_shape", "build {onnx} --calib {calib_nhwc} --target DPUCZDX8G_ISA1_B512 -o {out}/b",
         must=["calib_nhwc.npy", "[1, 1, 8, 8]"]),
    Case("build_calib_nan", "build {onnx} --calib {calib_nan} --target DPUCZDX8G_ISA1_B512 -o {out}/b",
         must=["calib_nan.npy", ("nan", "inf")]),
    # targets
    Case("compile_target_unknown", "compile -x {q} --target B9999 -o {out}/c -n net", must=["B9999"]),
    Case("compile_arch_missing", "compile -x {q} -a {arch_missing} -o {out}/c -n net",
         must=["missing.json", "no such file"]),
    Case("compile_target_directory", "compile -x {q} --target {adir} -o {out}/c -n net", must=["adir", "directory"]),
    Case("build_target_unknown", "build {onnx} --calib {calib} --target B9999 -o {out}/b", must=["B9999"]),
]
COMPILER += [Case(f"compile_arch_{k}", "compile -x {q} -a {arch_%s} -o {out}/c -n net" % k,
                  must=[f"{k}.json"] + ARCH_MUST[k])
             for k in ("not_json", "list", "no_key", "fingerprint_other_dpu", "target_unknown", "timing_huge")]
COMPILER += [
    # --options (vai_c keys), --dump-after, -n
    _opts("options_not_json", "{not json", ["--options", "JSON"]),
    _opts("options_a_list", "[1, 2]", ["options", "object"]),
    _opts("options_unknown_key", '{"optimize": 3}', ["optimize", "input_shape, output_ops"]),
    _opts("options_output_ops_unknown", '{"output_ops": "no_such_op"}', ["no_such_op", "output_ops"]),
    _opts("options_output_ops_not_names", '{"output_ops": 5}', ["output_ops"]),
    _opts("options_input_shape_other", '{"input_shape": "1,16,16,1"}', ["input_shape", "[1, 8, 8, 1]"]),
    _opts("options_input_shape_garbage", '{"input_shape": "1,x,8,1"}', ["input_shape", "1,x,8,1"]),
    _opts("options_input_shape_two", '{"input_shape": "1,8,8,1;1,8,8,1"}', ["input_shape", "2 shape"]),
    _opts("options_prefetch_not_bool", '{"prefetch": "maybe"}', ["prefetch", "maybe"]),
    _opts("options_plugins", '{"plugins": "libmine.so"}', ["plugins", "not supported"]),
    _opts("build_options_unknown_key", '{"optimize": 3}', ["optimize"], argv=BUILD),
    Case("compile_dump_after_unknown", COMPILE + " --dump-after fuse", must=["fuse", "canonicalize"]),
    Case("compile_name_with_directory", "compile -x {q} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n ../net",
         must=["../net"]),
    Case("compile_name_hidden", "compile -x {q} --target DPUCZDX8G_ISA1_B512 -o {out}/c -n .net", must=[".net"]),
    Case("build_name_with_directory", BUILD + " -n sub/net", must=["sub/net"]),
]
for _v, _argv in (("compile", "compile -x {q} --target DPUCZDX8G_ISA1_B512 -n net"),
                  ("build", "build {onnx} --calib {calib} --target DPUCZDX8G_ISA1_B512")):
    COMPILER += [
        Case(f"{_v}_o_dot", _argv + " -o .", must=["--force"], cwd="{in}"),
        Case(f"{_v}_o_foreign_directory", _argv + " -o {foreign}", must=["foreign", "--force"]),
        Case(f"{_v}_o_regular_file", _argv + " -o {file}", must=["file.txt"]),
        Case(f"{_v}_o_regular_file_forced", _argv + " -o {file} --force", must=["file.txt"]),
        Case(f"{_v}_o_ancestor_of_input", _argv + " -o {in}", must=["--force"]),
        Case(f"{_v}_o_missing_parent_file", _argv + " -o {file}/sub", must=["file.txt"]),
    ]
COMPILER += [Case("compile_o_the_model", "compile -x {q} --target DPUCZDX8G_ISA1_B512 -n net -o {q}",
                  must=["digits_int.xmodel"])]


ALL_TABLES = {"usage": USAGE, "ranges": RANGES, "timing": TIMING, "combinations": COMBOS, "input paths": PATHS,
              "output paths": OUTPUTS, "dtypes/NaN/shapes": VALUES, "corrupted xmodels": XMODELS,
              "hostile ONNX": ONNX_CASES, "hostile arch.json": ARCHS, "compile/build": COMPILER}


@_params(USAGE)
def test_usage(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(COMPILER)
def test_compile_and_build(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(RANGES)
def test_ranges(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(TIMING)
def test_timing_values(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(COMBOS)
def test_option_combinations(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(PATHS)
def test_input_paths(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(OUTPUTS)
def test_output_paths(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(VALUES)
def test_input_values(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(XMODELS)
def test_corrupted_xmodels(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(ONNX_CASES)
def test_hostile_onnx(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


@_params(ARCHS)
def test_hostile_arch_json(ws, case, monkeypatch, capsys):
    check_case(ws, case, monkeypatch, capsys)


# ---- J (cont.). bit-flipped xmodels through the CLI: load and work, or one clean error ------------------------------
FLIP_VERBS = {"xmodel": "xmodel {model}", "disasm": "disasm {model}", "check": "check {model} -n 1"}


@pytest.mark.parametrize("verb", list(FLIP_VERBS))
@pytest.mark.parametrize("pos_bit", flip_positions(), ids=[f"byte{p}_bit{b}" for p, b in flip_positions()])
def test_bit_flipped_xmodel(ws, pos_bit, verb, monkeypatch, capsys):
    pos, bit = pos_bit
    key = f"flip_{pos}_{bit}"
    argv = [a.format(**ws.p) for a in FLIP_VERBS[verb].replace("{model}", "{%s}" % key).split()]
    r = run_cli(ws, argv, monkeypatch, capsys, sentinels=False)     # one line if it fails, never a traceback
    allowed = (0, 1, 2) if verb == "check" else (0, 2)                # check may FAIL (1): a changed program
    assert r.code in allowed, f"exit {r.code}: {r.err}"


def test_bit_flips_load_or_fail_cleanly(ws, monkeypatch, capsys):
    """Seeded single-bit flips over the whole tf2_custom_op file (structure and parameter blobs): every one loads,
    or fails with XModelError / RuntimeErrorDPU / IsaError and a one-line message; never another exception. A
    sample of the ones that load also goes through `opendpu xmodel`, `disasm` and `check -n 1` (no traceback)."""
    data = open(TF2_SRC, "rb").read()
    rng = random.Random(2026)
    loaded = failed = 0
    sample = []
    for k in range(300):
        pos, bit = rng.randrange(len(data)), rng.randrange(8)
        b = _flip(data, pos, bit)
        try:
            g = Graph.deserialize(b, f"flip@{pos}.{bit}")
            for sg in dpu_subgraphs(g):
                d = DpuSubgraph(g, sg)
                d.inputs, d.outputs, d.arrays               # noqa: B018 - decoded program and interface tensors
            loaded += 1
            if loaded % 25 == 1:
                sample.append((pos, bit, b))
        except (XModelError, RuntimeErrorDPU, IsaError) as e:
            failed += 1
            assert "\n" not in str(e) and str(e).strip(), f"flip {pos}.{bit}: message {str(e)!r}"
    assert loaded + failed == 300 and loaded > 0 and failed > 0
    for pos, bit, b in sample:
        p = os.path.join(ws.cwd, f"sample_{pos}_{bit}.xmodel")
        with open(p, "wb") as f:
            f.write(b)
        try:
            for verb in FLIP_VERBS.values():
                argv = verb.replace("{model}", p).split()
                r = run_cli(ws, argv, monkeypatch, capsys, sentinels=False)
                assert r.code in ((0, 1, 2) if argv[0] == "check" else (0, 2)), r.err
        finally:
            os.remove(p)


def test_every_truncation_and_hostile_file_is_an_xmodel_error(ws):
    """The loader names the file for every truncated copy and every graph-level hostile edit (the DPU-level ones
    are the runtime's RuntimeErrorDPU naming the subgraph)."""
    for n in TRUNCATE_AT:
        with pytest.raises(XModelError, match=re.escape(ws.p[f"trunc_{n}"])):
            Graph.load(ws.p[f"trunc_{n}"])
    dpu_level = {"mc_code_missing", "mc_code_truncated", "fingerprint_missing", "fingerprint_other_dpu",
                 "param_blob_too_big"}
    for name in HOSTILE:
        path = ws.p[f"h_{name}"]
        if name in dpu_level:
            g = Graph.load(path)
            with pytest.raises(RuntimeErrorDPU, match="subgraph_quant_conv2d"):
                for sg in dpu_subgraphs(g):
                    DpuSubgraph(g, sg)
        else:
            with pytest.raises(XModelError) as ei:
                Graph.load(path)
            assert path in str(ei.value) and "\n" not in str(ei.value), (name, str(ei.value))


# ---- L. a program that reads past the end of its DDR register: the same refusal on every backend --------------------
RTL_SENTINELS = (("opendpu.hw.harness", "build"), ("opendpu.hw.harness", "run_jobs"),
                 ("opendpu.runtime.cosim", "cosim_programs"))
OOB = {
    "run_rtl": ("run {oob} -i {x} --backend rtl", RTL_SENTINELS),
    "profile": ("profile {oob}", True),
    "sweep": ("sweep {oob} --param ddr_latency=40,80", True),
    "check": ("check {oob} -n 1", False),
    "cosim": ("cosim {oob}", RTL_SENTINELS),
}


@pytest.mark.parametrize("verb", list(OOB))
def test_out_of_bounds_program_refused_like_sim(ws, verb, monkeypatch, capsys):
    ref = run_cli(ws, [a.format(**ws.p) for a in "run {oob} -i {x}".split()], monkeypatch, capsys, sentinels=False)
    assert ref.code == 2 and "REG_2" in ref.msg, ref.err
    template, sentinels = OOB[verb]
    r = run_cli(ws, [a.format(**ws.p) for a in template.split()], monkeypatch, capsys, sentinels=sentinels)
    assert r.code == 2, f"{verb}: exit {r.code}\n{r.out[-1500:]}"
    assert r.msg == ref.msg, f"{verb} says {r.msg!r}\n   sim says {ref.msg!r}"


# ---- M. --version and the real entry point -------------------------------------------------------------------------
def test_version_in_process(ws, monkeypatch, capsys):
    r = run_cli(ws, ["--version"], monkeypatch, capsys)
    assert r.code == 0 and r.out.strip() == "opendpu 0.1.0" and r.err == ""


SUBPROCESS = {  # id -> (argv templates, code, substrings)
    "version": (["--version"], 0, []),
    "no_verb": ([], 2, []),
    "missing_model": (["run", "{in}/missing.xmodel", "-i", "{x}"], 2, ["missing.xmodel"]),
    "check_n_zero": (["check", "{mnist}", "-n", "0"], 2, ["-n", "out of range"]),
    "timing_overflow": (["profile", "{mnist}", "--timing", "ddr_latency=" + HUGE], 2, ["ddr_latency", "out of range"]),
    "zoo_size_zero": (["zoo", "--size", "0"], 2, ["--size"]),
    "percentile_150": (["quantize", "{onnx}", "--calib", "{calib}", "--percentile", "150"], 2, ["--percentile"]),
    "truncated_xmodel": (["xmodel", "{trunc_4000}"], 2, ["trunc_4000.xmodel"]),
    "uint8_input": (["run", "{mnist}", "-i", "{dt_uint8}"], 2, ["uint8"]),
    "hostile_arch": (["check", "{mnist}", "--target", "{arch_timing_huge}"], 2, ["timing_huge.json", "ddr_latency"]),
}


@pytest.fixture(scope="module")
def subprocess_results(ws):
    """Every SUBPROCESS case run concurrently through the installed `opendpu` script, without OPENDPU_DEBUG."""
    exe = os.path.join(os.path.dirname(sys.executable), "opendpu")
    if not os.path.isfile(exe):
        pytest.skip(f"{exe} is not installed")
    env = {k: v for k, v in os.environ.items() if k != "OPENDPU_DEBUG"}
    before = _snapshot(ws.root)
    procs = {k: subprocess.Popen([exe] + [a.format(**ws.p) for a in argv], cwd=ws.cwd, env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for k, (argv, _, _) in SUBPROCESS.items()}
    res = {k: (p.wait(timeout=300),) + p.communicate() for k, p in procs.items()}
    return res, before, _snapshot(ws.root)


@pytest.mark.parametrize("cid", list(SUBPROCESS))
def test_real_entry_point(ws, subprocess_results, cid):
    res, before, after = subprocess_results
    code, out, err = res[cid]
    argv, want, must = SUBPROCESS[cid]
    assert before == after, "the subprocess cases changed the workspace"
    assert "Traceback" not in out + err and code == want, f"exit {code}\n{err}"
    if want == 0:
        assert out.strip() == "opendpu 0.1.0" and err == ""
        return
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and ERR_LINE.match(lines[0]), err
    for s in must:
        assert s.format(**ws.p).lower() in lines[0].lower(), lines[0]


# ---- G (cont.). the accepted dtypes mean what the contract says ------------------------------------------------------
def test_accepted_dtypes_agree(ws, monkeypatch, capsys, tmp_path):
    """float16/32/64 are real values quantized with the input fix point (6 for MNIST), int8 is raw fixed point: the
    same image given in all four forms (exactly representable) gives bit-identical outputs."""
    rng = np.random.default_rng(5)
    q = rng.integers(-128, 128, size=(1, 28, 28, 1)).astype(np.int8)
    forms = {"int8": q, "float16": (q / 64.0).astype(np.float16), "float32": (q / 64.0).astype(np.float32),
             "float64": q / 64.0}
    outs = {}
    for name, arr in forms.items():
        xp, op = tmp_path / f"x_{name}.npy", tmp_path / f"o_{name}.npz"
        np.save(xp, arr)
        r = run_cli(ws, ["run", ws.p["mnist"], "--backend", "ref", "-i", str(xp), "-o", str(op), "--raw"],
                    monkeypatch, capsys, sentinels=False)
        assert r.code == 0, r.err
        with np.load(op) as z:
            outs[name] = {k: z[k] for k in z.files}
    for name in ("float16", "float32", "float64"):
        assert outs[name].keys() == outs["int8"].keys()
        for k in outs["int8"]:
            assert np.array_equal(outs[name][k], outs["int8"][k]), (name, k)


def test_sentinel_targets_exist():
    """Every heavy entry point the validation cases guard still exists (a rename would silently weaken them)."""
    missing = [f"{m}.{a}" for m, a in COMPUTE + RTL_SENTINELS if _resolve(m, a) is None]
    assert not missing, f"sentinel targets gone (update COMPUTE): {missing}"


# ---- N. a custom-op plugin whose implementation misbehaves: OpError naming the op ------------------------------------
PLUGINS = {
    "raises": ("def f(op, ins):\n    raise ValueError('boom in the user op')\n", ["custom_layer", "boom"]),
    "wrong_shape": ("import numpy as np\ndef f(op, ins):\n    return np.zeros(3, np.float32)\n",
                    ["custom_layer", "[3]"]),
    "returns_text": ("def f(op, ins):\n    return 'hello'\n", ["custom_layer"]),
    "returns_none": ("def f(op, ins):\n    return None\n", ["custom_layer"]),
    "returns_objects": ("import numpy as np\ndef f(op, ins):\n    return np.full(op.output.shape, object())\n",
                        ["custom_layer"]),
}


@pytest.mark.parametrize("kind", list(PLUGINS))
def test_misbehaving_custom_op(ws, kind, monkeypatch, capsys, tmp_path):
    from opendpu.runtime.ops import unregister_op
    body, must = PLUGINS[kind]
    plug = tmp_path / f"plugin_{kind}.py"
    plug.write_text("from opendpu.runtime import register_op\n" + body + "register_op('Mylayer', f)\n")
    try:
        r = run_cli(ws, ["run", ws.p["tf2"], "--backend", "ref", "-i", ws.p["x"], "--op-plugin", str(plug)],
                    monkeypatch, capsys, sentinels=False)
    finally:
        unregister_op("Mylayer")
    assert r.code == 2, r.err + r.out
    for m in must:
        assert m.lower() in r.msg.lower(), r.msg


# ---- the harness itself can fail ------------------------------------------------------------------------------------
def test_harness_catches_a_written_file(ws, monkeypatch, capsys):
    out = os.path.join(ws.out, "harness_probe.npz")
    try:
        with pytest.raises(AssertionError, match="left the workspace changed"):
            run_cli(ws, ["run", ws.p["mnist"], "--backend", "ref", "-i", ws.p["x"], "-o", out], monkeypatch, capsys,
                    sentinels=False)
    finally:
        if os.path.exists(out):
            os.remove(out)


def test_harness_catches_computation(ws, monkeypatch, capsys):
    with pytest.raises(ComputationStarted):
        run_cli(ws, ["run", ws.p["mnist"], "--backend", "ref", "-i", ws.p["x"]], monkeypatch, capsys)


def test_harness_catches_a_message_that_names_the_wrong_thing(ws, monkeypatch, capsys):
    with pytest.raises(AssertionError, match="does not name"):
        check_case(ws, Case("probe", "check {mnist} -n 0", must=["--seed"]), monkeypatch, capsys)
