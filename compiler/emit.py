"""The compiled xmodel: the canonical graph, its partition and one `DpuProgram` per DPU subgraph, in the structure
vai_c_xir writes (spec §8.2–8.3, the shared AMD models).

* The root's children are the subgraphs of the partition in topological order, each with `device` USER, DPU or
  CPU (CPU ones with the cpu-runner `runner` map), and `workload` / `workload_on_arch`.
* A DPU subgraph reads each input through an `upload` op (output tensor `<tensor>_upload_<k>`, the DDR image of
  the input) and hands each output on through a `download` op. As in AMD's models the download's tensor takes
  the original tensor name and the op inside gets `<tensor>_download_0` (with the DDR image); ops outside read
  the download. Its children are one `subgraph_<upload>` per input (`skip_code_gen`), then one child per layer of
  the program (`DpuProgram.layers`, `children_topological_sort` in program order; `skip_code_gen` when it has no
  instruction), each followed by the `subgraph_<download>` children of the outputs it produces.
* The DPU subgraph carries what `dpu_abi.write_dpu_subgraph`, `write_registers` and `write_interface` write, plus
  `children_topological_sort`, `debug_mode` "null", `if_prefetch`, `workload_on_arch` and `opendpu_layer_map`:
  the instruction -> layer map as {layer child name: [first, count, first, count, ...]} (int32 vector map), so
  profilers attribute every instruction exactly. WORKSPACE tensors of the program get their DDR image
  (`dpu_abi.write_image`). Const ops keep their `data` (root attribute `reserve_const_data` true).
* Every attribute AMD's compiled models carry, with their values (docs/compiler.md "xmodel attributes"): per op
  `workload`, `workload_on_arch`, `channel_augmentation`; per const tensor where its bytes lie in the CONST
  register; per feature map its DDR image, or `location` 0 when the program keeps it on chip; the root's switches.

`meta_json` is the runtime's meta.json: target, fingerprint, runner library, file names, DPU subgraph names
("kernel", as vai_c), the compiler and its options.
"""
from __future__ import annotations

import bisect
import copy
import hashlib
import math
from collections import OrderedDict
from typing import Any

import numpy as np

from opendpu.compiler.codegen import ALIAS_TYPES
from opendpu.compiler.partition import CPU, DPU, Partition, SubgraphPlan, coverage, shape_of
from opendpu.compiler.program import DdrImage, DpuProgram
from opendpu.compiler.xir import dpu_abi as abi
from opendpu.compiler.xir.graph import Attrs, Graph, Op, Subgraph, Tensor, XModelError
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.footprint import InitState, footprint_of
from opendpu.isa.target import Target

LAYER_MAP = "opendpu_layer_map"
LAYER_MAP_KIND = "map_string_2_int32_vec_value"
CPU_RUNNERS = {"run": "libvart-cpu-runner.so", "ref": "libvart-cpu-runner.so", "sim": "libvart-cpu-runner.so"}
DDR_TENSOR_ATTRS = (abi.REG_ID, abi.DDR_ADDR, abi.LOCATION, abi.STRIDE, "strides", abi.DDR_RUNS)
COMPILED_OP_ATTRS = ("workload", "workload_on_arch", "channel_augmentation")    # decided again on every emit
# vai_c_xir's switches AMD's VAI 3.5 models record on the root subgraph, with opendpu's values (docs/compiler.md)
ROOT_SWITCHES: tuple[tuple[str, Any, str], ...] = (
    ("aie_tile_fusion_type", [], "string_vec_value"), ("concat_skip_code_gen", True, "bool_value"),
    ("enable_mt_fusion", False, "bool_value"), ("inspector", False, "bool_value"), ("preassign", True, "bool_value"),
    ("profile", False, "bool_value"))
U64 = "uint64_value"


class EmitError(OpenDpuError, ValueError):
    """A program that does not fit its subgraph (ops, interface, layers); the message names what differs."""


# ---- the instruction -> layer map ---------------------------------------------------------------------------
def encode_layer_map(names: list[str]) -> dict[str, list[int]]:
    """{layer: [first, count, first, count, ...]}: the runs of consecutive instructions of each layer."""
    out: dict[str, list[int]] = OrderedDict()
    i = 0
    while i < len(names):
        j = i
        while j + 1 < len(names) and names[j + 1] == names[i]:
            j += 1
        out.setdefault(names[i], []).extend([i, j - i + 1])
        i = j + 1
    return out


def decode_layer_map(m: Any, n: int, where: str = "subgraph") -> list[str]:
    """The layer name of each of `n` instructions from an `opendpu_layer_map` attribute; every instruction must be
    covered exactly once (else EmitError naming `where`)."""
    if not isinstance(m, dict):
        raise EmitError(f"{where}: {LAYER_MAP} is a {type(m).__name__}, not a map layer -> [first, count, ...]")
    out: list[str | None] = [None] * n
    for name, runs in m.items():
        if not isinstance(runs, list) or len(runs) % 2 or not all(isinstance(v, int) for v in runs):
            raise EmitError(f"{where}: {LAYER_MAP}[{name!r}] is not a list of (first, count) pairs")
        for first, count in zip(runs[::2], runs[1::2]):
            if first < 0 or count < 1 or first + count > n:
                raise EmitError(f"{where}: {LAYER_MAP}[{name!r}] run ({first}, {count}) lies outside the "
                                f"{n} instructions")
            for i in range(first, first + count):
                if out[i] is not None:
                    raise EmitError(f"{where}: {LAYER_MAP}: instruction {i} belongs to {out[i]!r} and {name!r}")
                out[i] = name
    missing = [i for i, v in enumerate(out) if v is None]
    if missing:
        raise EmitError(f"{where}: {LAYER_MAP} leaves {len(missing)} instruction(s) without a layer (first "
                        f"{missing[0]})")
    return [v for v in out if v is not None]


# ---- workloads ------------------------------------------------------------------------------------------------
def _pad(n: int, m: int) -> int:
    return -(-int(n) // m) * m


def _hw(shape) -> tuple[int, int, int]:
    s = [int(d) for d in shape]
    s = [1] * (4 - len(s)) + s if len(s) < 4 else s
    return s[-3], s[-2], s[-1]


CONV_TYPES = ("conv2d-fix", "transposed-conv2d-fix")
DW_TYPES = ("depthwise-conv2d-fix", "transposed-depthwise-conv2d-fix")
WORKLOAD_TYPES = CONV_TYPES + DW_TYPES + ("pool-fix", "eltwise-fix")    # the ops AMD writes both workloads on
CPU_WORKLOAD_TYPES = ("softmax",)                                       # CPU ops AMD writes a workload on
SKIP_TYPES = ("const-fix", "const", "upload", "download")                # no compute: no placement of their own
VIEW_TYPES = ("strided_slice-fix",)                                     # windows of their input's image
AUGMENTED = "channel_augmentation"


def op_workload(graph: Graph, op: Op, target: Target, augmented: bool = False) -> tuple[int, int]:
    """(workload, workload_on_arch) of one DPU op in operations, as vai_c writes them on AMD's five ISA1 models
    (docs/compiler.md, "xmodel attributes"; every value of those models is reproduced):
    * workload: conv-like ops 2 per multiply-accumulate plus 1 per output element with a bias (transposed convs:
      kh*kw/(sh*sw) taps per output), pools kernel taps per output element, eltwise one per input element;
    * workload_on_arch: the same count with the output height rounded up to the engine's pixel parallelism (PP for
      CONV, ALU_PP for the ALU and eltwise; a transposed conv's sh phases each), the output channels to CP and a
      conv's input channels to CP; a channel-augmented conv (`augmented`) counts kh*(kw*IC rounded up to 2*ICP),
      its augmented channel_num, per output element (not doubled).
    Every other op: (0, 0)."""
    t = op.type
    if t not in WORKLOAD_TYPES or op.output is None or not op.output.shape:
        return 0, 0
    oh, ow, oc = _hw(op.output.shape)
    out = oh * ow * oc
    ins = op.inputs.get("input") or []
    bias = 1 if op.inputs.get("bias") else 0
    k = op.attrs.get("kernel") or [1, 1]
    kw, kh = (int(k[0]), int(k[1])) if isinstance(k, list) and len(k) == 2 else (1, 1)
    s = op.attrs.get("stride") or [1, 1]
    sw, sh = (int(s[0]), int(s[1])) if isinstance(s, list) and len(s) == 2 else (1, 1)
    pp = target.pp if t in CONV_TYPES else target.alu_pp
    rows = _pad(-(-oh // sh), pp) * sh if t.startswith("transposed") else _pad(oh, pp)
    arch = rows * ow * _pad(oc, target.cp)
    if t in CONV_TYPES or t in DW_TYPES:
        ic = 1 if t in DW_TYPES else (_hw(shape_of(graph, ins[0]))[2] if ins else oc)
        taps: float = kh * kw / (sw * sh) if t.startswith("transposed") else kh * kw
        icp = 1 if t in DW_TYPES else _pad(ic, target.cp)
        per_arch = kh * _pad(kw * ic, 2 * target.cp) if augmented else 2 * taps * icp
        return int(out * (2 * taps * ic + bias)), int(arch * (per_arch + bias))
    if t == "pool-fix":
        if op.attrs.get("global") and ins:
            h, w, _ = _hw(shape_of(graph, ins[0]))
            kh, kw = h, w
        return out * kh * kw, arch * kh * kw
    return out * max(1, len(ins)), arch * max(1, len(ins))          # eltwise-fix


def cpu_op_workload(op: Op) -> int:
    """The workload vai_c writes on a CPU op: softmax 3n-1 per row of n (n exponentials, n-1 additions, n
    divisions; AMD's MNIST softmax over 10 classes carries 29); other CPU ops carry none (0)."""
    if op.type not in CPU_WORKLOAD_TYPES or op.output is None or not op.output.shape:
        return 0
    shape = [int(d) for d in op.output.shape]
    axis = int(op.attrs.get("axis", -1))
    n = shape[axis if -len(shape) <= axis < len(shape) else -1]
    return (math.prod(shape) // max(1, n)) * max(0, 3 * n - 1)


def augmented_ops(prog: DpuProgram) -> set[str]:
    """The convs the code generator channel-augmented: its last `channel_augmentation` decision per layer (the
    compile report's record) chose the augmented form."""
    last: dict[str, str] = {}
    for d in prog.stats.get("decisions") or []:
        if d.get("decision") == AUGMENTED:
            last[str(d.get("layer"))] = str(d.get("chosen"))
    return {n for n, c in last.items() if c == "augmented"}


# ---- the compiled graph ---------------------------------------------------------------------------------------
def _copy_tensor(t: Tensor, name: str | None = None, keep_ddr: bool = False) -> Tensor:
    """A copy without DDR placement (the program being emitted places every tensor afresh), unless `keep_ddr`."""
    attrs = Attrs()
    for k, v in t.attrs.items():
        if k in DDR_TENSOR_ATTRS and not keep_ddr:
            continue
        attrs.set(k, copy.deepcopy(v), t.attrs.kinds.get(k))
    return Tensor(name or t.name, list(t.shape), t.data_type, t.bit_width, attrs)


def _copy_attrs(a: Attrs, drop: tuple[str, ...] = ()) -> Attrs:
    out = Attrs()
    for k, v in a.items():
        if k not in drop:
            out.set(k, copy.deepcopy(v), a.kinds.get(k))
    return out


def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out = f"{name}_{k}"
        k += 1
    return out


def _spec(img: DdrImage, op_name: str, t: Tensor) -> abi.TensorSpec:
    return abi.TensorSpec(t.name, tuple(int(d) for d in img.dims), "xint8", int(img.fix_point), int(img.reg_id),
                          int(img.ddr_addr), tuple(int(s) for s in img.strides), op_name)


def _check_program(plan: SubgraphPlan, prog: DpuProgram, graph: Graph) -> None:
    """The program covers its subgraph: END last, one layer per instruction, every op in exactly one layer, and the
    interface the ABI finds (inputs read from outside, outputs leaving the subgraph)."""
    where = f"DPU subgraph {plan.name!r}"
    n = len(prog.instructions)
    if not n or prog.instructions[-1].op != "END":
        raise EmitError(f"{where}: the program does not end with END")
    if len(prog.layer_of) != n:
        raise EmitError(f"{where}: {len(prog.layer_of)} layer indices for {n} instructions")
    if any(not 0 <= k < len(prog.layers) for k in prog.layer_of):
        raise EmitError(f"{where}: an instruction names a layer outside 0..{len(prog.layers) - 1}")
    names = [ly.name for ly in prog.layers]
    if len(set(names)) != len(names):
        raise EmitError(f"{where}: layer names repeat ({sorted({x for x in names if names.count(x) > 1})[:3]})")
    seen: dict[str, str] = {}
    for ly in prog.layers:
        for o in ly.ops:
            if o in seen:
                raise EmitError(f"{where}: op {o!r} is in layers {seen[o]!r} and {ly.name!r}")
            seen[o] = ly.name
    ops = set(plan.ops)
    if set(seen) != ops:
        extra, missing = sorted(set(seen) - ops), sorted(ops - set(seen))
        raise EmitError(f"{where}: the layers hold ops {extra[:3]} not in the subgraph and miss {missing[:3]}")
    want_in = set(abi.input_producers(graph, plan.ops))
    got_in = [i.op_name for i in prog.inputs]
    if set(got_in) != want_in or len(got_in) != len(want_in):
        raise EmitError(f"{where}: the program's inputs {sorted(got_in)[:4]} are not the tensors it reads from "
                        f"outside {sorted(want_in)[:4]}")
    want_out = set(abi.output_ops(graph, plan.ops))
    got_out = [o.op_name for o in prog.outputs]
    if set(got_out) != want_out or len(got_out) != len(want_out):
        raise EmitError(f"{where}: the program's outputs {sorted(got_out)[:4]} are not the ops read outside or "
                        f"by none {sorted(want_out)[:4]}")


def emit(graph: Graph, part: Partition, programs: dict[str, DpuProgram], target: Target,
         options: dict | None = None, org_md5: dict[str, str] | None = None) -> Graph:
    """The compiled Graph of `graph` (the canonical graph `part` partitions) with `programs` (by DPU subgraph name)
    for `target`. `options` (vai_c's) are recorded; `org_md5` becomes the graph's `files_md5sum`."""
    options = dict(options or {})
    plans = {s.name: s for s in part.subgraphs}
    for s in part.dpu_subgraphs:
        if s.name not in programs:
            raise EmitError(f"DPU subgraph {s.name!r} has no program")
        _check_program(s, programs[s.name], graph)
    extra = sorted(set(programs) - {s.name for s in part.dpu_subgraphs})
    if extra:
        raise EmitError(f"programs {extra[:3]} name no DPU subgraph of the partition")
    sub = part.subgraph_of
    dev = {n: plans[s].device for n, s in sub.items()}
    order = graph.toposort()
    taken = set(graph.ops)

    # boundary ops: a download after every DPU output, an upload into every DPU subgraph per outside producer
    download: dict[str, str] = {}
    for s in part.dpu_subgraphs:
        for o in abi.output_ops(graph, s.ops):
            download[o] = _unique(f"{o}_download_0", taken)
            taken.add(download[o])
    upload: dict[tuple[str, str], str] = {}
    readers: dict[str, list[str]] = {}
    for s in part.dpu_subgraphs:
        for p in abi.input_producers(graph, s.ops):
            readers.setdefault(p, []).append(s.name)
    for p, sgs in readers.items():
        for k, s_name in enumerate(sgs):
            upload[(p, s_name)] = _unique(f"{p}_upload_{k}", taken)
            taken.add(upload[(p, s_name)])

    def source(p: str, reader_sg: str) -> str:
        """The op that `reader_sg` reads for producer p."""
        if sub[p] == reader_sg:
            return p
        if plans[reader_sg].device == DPU:
            return upload[(p, reader_sg)]
        return download.get(p, p)

    augmented = set().union(*(augmented_ops(p) for p in programs.values()))
    op_wl: dict[str, tuple[int, int]] = {}
    out = Graph(graph.name)
    out.attrs = _copy_attrs(graph.attrs)
    out.op_defs = list(graph.op_defs)
    for n in order:
        op = graph.ops[n]
        s_name = sub[n]
        ins = OrderedDict((arg, [source(p, s_name) for p in ps]) for arg, ps in op.inputs.items())
        attrs = _copy_attrs(op.attrs, COMPILED_OP_ATTRS)
        attrs.set("device", dev[n], "string_value")
        if dev[n] == DPU and op.type in WORKLOAD_TYPES:
            op_wl[n] = op_workload(graph, op, target, n in augmented and op.type == "conv2d-fix")
            attrs.set("workload", op_wl[n][0], U64)
            attrs.set("workload_on_arch", op_wl[n][1], U64)
            if n in augmented and op.type == "conv2d-fix":
                attrs.set(AUGMENTED, 1, "int32_value")
        elif dev[n] == CPU and op.type in CPU_WORKLOAD_TYPES:
            op_wl[n] = (cpu_op_workload(op), 0)
            attrs.set("workload", op_wl[n][0], U64)
        t = op.output
        if t is None:
            raise EmitError(f"op {n!r} has no output tensor")
        # a const without data keeps where its bytes are (the program's blob came with the graph); the rest is placed
        tensor = _copy_tensor(t, f"{t.name}_download_0" if n in download else None,
                              keep_ddr=op.type == "const-fix" and not op.attrs.get("data"))
        out.add_op(n, op.type, ins, attrs, tensor)
        if n in download:
            d = download[n]
            dattrs = Attrs()
            dattrs.set("device", DPU, "string_value")
            out.add_op(d, abi.DOWNLOAD, {"input": [n]}, dattrs, _copy_tensor(t, t.name))
        for k, s_name2 in enumerate(readers.get(n, [])):
            u = upload[(n, s_name2)]
            uattrs = Attrs()
            uattrs.set("device", DPU, "string_value")
            out.add_op(u, abi.UPLOAD, {"input": [download.get(n, n)]}, uattrs,
                       _copy_tensor(t, f"{t.name}_upload_{k}"))

    # the subgraph tree
    root = Subgraph("root")
    total_wl = total_arch = 0
    for s in part.subgraphs:
        if s.device == DPU:
            sg = _dpu_subgraph(out, graph, s, programs[s.name], target, options, download, upload, op_wl)
        else:
            sg = Subgraph(s.name, list(s.ops))
            sg.attrs.set("device", s.device, "string_value")
            if s.device == CPU:
                sg.attrs.set(abi.RUNNER, dict(CPU_RUNNERS), abi.SUBGRAPH_ATTR_KINDS[abi.RUNNER])
            sg.attrs.set("workload", sum(op_wl.get(o, (0, 0))[0] for o in s.ops), U64)
            sg.attrs.set("workload_on_arch", 0, U64)
        sg.parent = root
        root.children.append(sg)
        total_wl += int(sg.attrs["workload"])
        total_arch += int(sg.attrs["workload_on_arch"])
    root.attrs.set("workload", total_wl, U64)
    root.attrs.set("workload_on_arch", total_arch, U64)
    root.attrs.set("prefetch", bool(options.get("prefetch", False)), "bool_value")
    root.attrs.set("fusion", bool(options.get("fuse", True)), "bool_value")
    root.attrs.set("hd_opt", bool(options.get("hd_opt", False)), "bool_value")
    for key, value, kind in ROOT_SWITCHES:
        root.attrs.set(key, copy.deepcopy(value), kind)
    root.attrs.set("reserve_const_data", True, "bool_value")
    out.root = root
    if org_md5:
        out.attrs.set("files_md5sum", dict(org_md5), "map_string_2_string_value")
    out.attrs.set("libs_info", {"opendpu": _version()}, "map_string_2_string_value")
    out._link_subgraphs()
    try:
        out.validate()
    except XModelError as e:
        raise EmitError(f"the compiled graph breaks an XIR rule: {e}") from None
    for s in part.dpu_subgraphs:
        _check_abi(out, out.root.find(s.name), programs[s.name], download, upload)
    return out


def _dpu_subgraph(out: Graph, graph: Graph, s: SubgraphPlan, prog: DpuProgram, target: Target, options: dict,
                  download: dict[str, str], upload: dict[tuple[str, str], str],
                  op_wl: dict[str, tuple[int, int]]) -> Subgraph:
    sg = Subgraph(s.name)
    kids: list[Subgraph] = []

    def child(name: str, ops: list[str], wl: int = 0, arch: int = 0, skip: bool = False) -> Subgraph:
        c = Subgraph(f"subgraph_{name}", ops, parent=sg)
        if skip:
            c.attrs.set("skip_code_gen", True, "bool_value")
        c.attrs.set("workload", int(wl), U64)
        c.attrs.set("workload_on_arch", int(arch), U64)
        kids.append(c)
        return c

    ins = abi.input_producers(graph, s.ops)
    for p in ins:
        u = upload[(p, s.name)]
        child(u, [u], skip=True)
    layer_kids = []
    total_wl = total_arch = 0
    used = set(prog.layer_of)
    for k, ly in enumerate(prog.layers):
        ops = graph.toposort(ly.ops)
        wl = arch = 0
        for o in ops:
            w, a = op_wl.get(o, (0, 0))
            wl, arch = wl + w, arch + a
        c = child(ly.name, ops, wl, arch, skip=k not in used)       # a layer without instructions (aliases)
        layer_kids.append(c)
        total_wl, total_arch = total_wl + wl, total_arch + arch
        for o in ops:                       # as AMD: each download's child right after its producer's layer
            if o in download:
                child(download[o], [download[o]])
    names = [c.name for c in kids]
    if len(set(names)) != len(names):
        raise EmitError(f"DPU subgraph {s.name!r}: child subgraph names repeat "
                        f"({sorted({x for x in names if names.count(x) > 1})[:3]})")
    sg.children = kids
    spec = abi.DpuSubgraphSpec.for_target(target, prog.mc_code, prog.registers, total_wl)
    abi.write_dpu_subgraph(sg, spec)
    sg.attrs.set("children_topological_sort", [c.name for c in layer_kids], "string_vec_value")
    sg.attrs.set("debug_mode", "null", "string_value")
    sg.attrs.set("if_prefetch", bool(options.get("prefetch", False)), "bool_value")
    sg.attrs.set("workload_on_arch", int(total_arch), U64)
    layer_names = [layer_kids[k].name for k in prog.layer_of]
    sg.attrs.set(LAYER_MAP, encode_layer_map(layer_names), LAYER_MAP_KIND)
    # DDR images: WORKSPACE tensors, then the interface (written onto the upload / download-input tensors)
    for img in prog.internal:
        if img.op_name not in out.ops:
            raise EmitError(f"DPU subgraph {s.name!r}: internal image of unknown op {img.op_name!r}")
        t = out.ops[img.op_name].output
        assert t is not None
        if tuple(int(d) for d in t.shape) != tuple(img.dims):
            raise EmitError(f"DPU subgraph {s.name!r}: image of {img.op_name!r} has dims {list(img.dims)}, the "
                            f"tensor {list(t.shape)}")
        abi.write_image(t, img.reg_id, img.ddr_addr, img.strides)
    sg.graph = out
    inputs = []
    for img in prog.inputs:
        p = img.op_name
        src = download.get(p, p)           # the op outside the subgraph that its upload reads
        t = out.ops[src].output
        assert t is not None
        inputs.append(_spec(img, src, t))
    outputs = []
    for img in prog.outputs:
        t = out.ops[img.op_name].output
        assert t is not None
        outputs.append(_spec(img, img.op_name, t))
    abi.write_interface(out, sg, inputs, outputs, prog.registers)
    _place_consts(out, prog, target)
    _place_members_and_on_chip(out, s, prog)
    return sg


# ---- DDR placement of the tensors without an image of their own ------------------------------------------------
class _Chunks:
    """The `size`-byte chunks of `data` (the last may be shorter), sliced when asked for."""

    def __init__(self, data: bytes, size: int):
        self.data, self.size = data, size

    def __len__(self) -> int:
        return -(-len(self.data) // self.size)

    def __getitem__(self, j: int) -> bytes:
        return self.data[j * self.size:(j + 1) * self.size]


class _Claims:
    """Byte ranges of a parameter blob handed out to const tensors, searched only inside `ranges` (what the
    program LOADs), each byte to one tensor at most."""

    def __init__(self, blob: bytes, ranges: list[tuple[int, int]]):
        self.blob = blob
        self.ranges: list[tuple[int, int]] = []
        for lo, hi in sorted(ranges):
            if self.ranges and lo <= self.ranges[-1][1]:
                self.ranges[-1] = (self.ranges[-1][0], max(hi, self.ranges[-1][1]))
            else:
                self.ranges.append((lo, hi))
        self.taken: list[tuple[int, int]] = []
        self.made: list[tuple[int, int]] = []            # the claims of the current `runs` call

    def _inside(self, a: int, b: int) -> bool:
        i = bisect.bisect_right(self.ranges, (a, 1 << 62)) - 1
        return i >= 0 and b <= self.ranges[i][1]

    def _free(self, a: int, b: int) -> bool:
        i = bisect.bisect_right(self.taken, (a, 1 << 62))
        return not ((i and self.taken[i - 1][1] > a) or (i < len(self.taken) and self.taken[i][0] < b))

    def runs(self, data: bytes, size: int, careful: bool = False) -> list[tuple[int, int]] | None:
        """Free places for the `size`-byte chunks of `data` in order, claimed (merged where adjacent); None (and
        nothing claimed) when a chunk is nowhere free (`_fast`, or with `careful` `_careful`)."""
        chunks = _Chunks(data, size)
        at: list[int | None] = [None] * len(chunks)
        self.made = []
        if not (self._careful(chunks, at) if careful else self._fast(data, chunks, at, size)):
            for claim in self.made:
                self.taken.remove(claim)
            return None
        pos = np.array(at, dtype=np.int64)
        ends = pos + size
        ends[-1] = pos[-1] + len(chunks[len(at) - 1])
        cut = np.flatnonzero(pos[1:] != ends[:-1]) + 1      # a run starts where a chunk does not follow the last
        firsts, lasts = np.concatenate(([0], cut)), np.concatenate((cut, [len(at)])) - 1
        return [(int(pos[a]), int(ends[b] - pos[a])) for a, b in zip(firsts, lasts)]

    def _claim(self, at: list[int | None], j: int, a: int, n: int) -> None:
        at[j] = a
        self._take(a, a + n)

    def _fast(self, data: bytes, chunks: "_Chunks", at: list[int | None], size: int) -> bool:
        """Each chunk takes its first free place after the last chunk's (rows of one tensor lie close); once chunk j
        is found right after chunk j - p (the rows of p CONVW banks), the chunks that follow that period are
        claimed at once (`_bulk`)."""
        hint, period, j = 0, 0, 0
        end_of: dict[int, int] = {}
        while j < len(chunks):
            pat = chunks[j]
            prev = at[j - period] if period and j >= period else None
            c = prev + size if prev is not None else -1
            if not (c >= 0 and self.blob[c:c + len(pat)] == pat and self._free(c, c + len(pat))
                    and self._inside(c, c + len(pat))):
                free = self._free_places(pat, 1, hint)
                if not free:
                    return False
                c = free[0]
                if not period and c in end_of:
                    period = j - end_of[c]
                    k = self._bulk(data, at, c, size, j, period)
                    if k:
                        j += k
                        hint, period, end_of = int(at[j - 1] or 0) + size, 0, {}
                        continue
            self._claim(at, j, c, len(pat))
            end_of[c + len(pat)] = j
            hint = c + len(pat)
            j += 1
        return True

    def _careful(self, chunks: "_Chunks", at: list[int | None]) -> bool:
        """Chunks with one free place are claimed first, so a chunk that recurs (a row of zeros) cannot take a place
        that overlaps a unique chunk's; when only recurring chunks are left, the first takes its first place."""
        todo = list(range(len(chunks)))
        while todo:
            left, progress = [], False
            for j in todo:
                free = self._free_places(chunks[j], 2)
                if not free:
                    return False
                if len(free) == 1:
                    self._claim(at, j, free[0], len(chunks[j]))
                    progress = True
                else:
                    left.append(j)
            if left and not progress:
                j = left.pop(0)
                self._claim(at, j, self._free_places(chunks[j], 1)[0], len(chunks[j]))
            todo = left
        return True

    def _bulk(self, data: bytes, at: list[int | None], first: int, size: int, j0: int, p: int) -> int:
        """Claim chunks j0, j0+1, ... at once while they follow the period p (chunk j right after chunk j - p; chunk
        j0 at `first`): the rows of p CONVW banks, each bank one run. The number claimed (0: none)."""
        n = len(at)
        known = [a for a in at[j0 - p:j0] if a is not None] if j0 >= p else []
        if len(data) != n * size or len(known) != p or known[0] + size != first:
            return 0
        base = np.array(known, dtype=np.int64)
        buf = np.frombuffer(self.blob, dtype=np.uint8)
        want = np.frombuffer(data, dtype=np.uint8)[j0 * size:].reshape(n - j0, size)
        k = n - j0
        for o in range(min(p, k)):               # bank o's rows j0+o, j0+o+p, ... in one run after its row j0+o-p
            rows = want[o::p]
            lo = int(base[o]) + size
            m = min(len(rows), max(0, (len(self.blob) - lo) // size))
            same = (buf[lo:lo + m * size].reshape(m, size) == rows[:m]).all(axis=1)
            first_bad = m if same.all() else int(np.argmin(same))
            if first_bad < len(rows):
                k = min(k, o + first_bad * p)
        j = np.arange(j0, j0 + k)
        pos = base[(j - j0) % p] + ((j - j0) // p + 1) * size
        runs = [(int(base[o]) + size, int(base[o]) + size * (1 + len(range(o, k, p)))) for o in range(min(p, k))]
        if not k or not all(self._inside(a, b) and self._free(a, b) for a, b in runs) or \
                any(b > c for (_, b), (c, _) in zip(sorted(runs), sorted(runs)[1:])):
            return 0
        for a, b in runs:
            self._take(a, b)
        for i, v in enumerate(pos[:k].tolist()):
            at[j0 + i] = v
        return k

    def _free_places(self, pat: bytes, most: int, start: int = 0) -> list[int]:
        """Up to `most` free places of `pat`, searched from `start` on, then from the beginning."""
        out: list[int] = []
        spans = [(max(lo, start), hi) for lo, hi in self.ranges if hi > start]
        spans += [(lo, min(hi, start + len(pat) - 1)) for lo, hi in self.ranges if lo < start]
        for lo, hi in spans:
            for i in self._finds(pat, lo, hi):
                if self._free(i, i + len(pat)):
                    out.append(i)
                    if len(out) == most:
                        return out
        return out

    def _take(self, a: int, b: int) -> None:
        bisect.insort(self.taken, (a, b))
        self.made.append((a, b))

    def _finds(self, pat: bytes, lo: int, hi: int):
        i = self.blob.find(pat, lo, hi)
        while i >= 0:
            yield i
            i = self.blob.find(pat, i + 1, hi)


def _const_bytes(op: Op) -> bytes | None:
    """The int8 bytes of a const-fix op in tensor order (None: no data, or not one byte per element)."""
    data, t = op.attrs.get("data"), op.output
    if not data or t is None or len(data) != math.prod(int(d) for d in t.shape):
        return None
    return bytes(data)


def _place_consts(out: Graph, prog: DpuProgram, target: Target) -> None:
    """Locate each const tensor of the program's layers in the CONST register (reg_id, ddr_addr, location 1, as
    AMD's): the bytes of its data, in tensor order, inside what its layer LOADs from that register (else what the
    program LOADs). The code generator lays conv weights out per CONVW bank, so a tensor may lie in several runs
    (rows of its output channels, or of its innermost dimension), listed in abi.DDR_RUNS."""
    regs = [r for r, c in prog.registers.context.items() if c == abi.CONST and r in prog.registers.params]
    if len(regs) != 1:
        return
    reg = regs[0]
    blob = prog.registers.params[reg]
    loads: dict[int, list[tuple[int, int]]] = {}
    for ins, k in zip(prog.instructions, prog.layer_of):
        if ins.op == "LOAD" and ins.fields.get("reg_id") == reg:
            fp = footprint_of("LOAD", ins.fields, InitState(), target)
            loads.setdefault(k, []).extend((lo, hi) for r, lo, hi in fp.reads.ddr_ranges() if r == reg)
    every = _Claims(blob, [r for rs in loads.values() for r in rs])
    for k, ly in enumerate(prog.layers):
        consts = [(o, _const_bytes(out.ops[o])) for o in ly.ops if out.ops[o].type == "const-fix"]
        todo = sorted(((o, d) for o, d in consts if d is not None), key=lambda x: -len(x[1]))
        mine = _Claims(blob, loads.get(k, []))
        mine.taken = every.taken                 # one set of claims: no byte serves two tensors
        before = list(every.taken)
        for careful in (False, True):            # the fast search, then (a tensor found no place) the careful one
            every.taken[:] = before
            found = _find_consts(out, todo, mine, every, careful)
            if len(found) == len(todo):
                break
        for o, got in found.items():
            abi.write_const_image(out.ops[o].output, reg, got)   # type: ignore[arg-type]


def _find_consts(out: Graph, todo: list[tuple[str, bytes]], mine: "_Claims", every: "_Claims",
                 careful: bool) -> dict[str, list[tuple[int, int]]]:
    """The byte runs of each const of one layer: the whole tensor, else rows of dim 0, else rows of the last dim,
    in the layer's LOADed bytes, else in the program's."""
    found: dict[str, list[tuple[int, int]]] = {}
    for where in (mine, every):
        for level in range(3):
            for o, d in todo:
                if o in found:
                    continue
                shape = [int(v) for v in out.ops[o].output.shape]   # type: ignore[union-attr]
                size = max(1, (len(d), len(d) // max(1, shape[0]) if shape else len(d),
                               shape[-1] if shape else len(d))[level])
                got = where.runs(d, size, careful)
                if got is not None:
                    found[o] = got
    return found


def _place_members_and_on_chip(out: Graph, s: SubgraphPlan, prog: DpuProgram) -> None:
    """Give the subgraph's tensors that have no DDR image of their own what AMD's compiler gives them, from where
    the code generator puts them: the source of a reshape (an alias) written straight into the reshape's image that
    image, densely; a concat member written in place (no image, same fix point as its concat) the part of the
    concat's image it fills (its offset along the concat axis, the concat's strides); a tensor read only inside its
    own layer (the intermediate of a fused pair) `location` 0 (abi.write_on_chip). Others (views) keep none."""
    ops = set(s.ops)
    layer_of = {o: k for k, ly in enumerate(prog.layers) for o in ly.ops}

    def placed(n: str) -> bool:
        return abi.REG_ID in out.ops[n].output.attrs    # type: ignore[union-attr]

    for n in reversed(out.toposort(list(s.ops))):     # chains of aliases share one image
        op, src = out.ops[n], out.ops[n].input_ops()
        t = op.output
        if op.type not in ALIAS_TYPES or len(src) != 1 or src[0] not in ops or placed(src[0]) or not placed(n):
            continue
        st = out.ops[src[0]].output
        assert t is not None and st is not None
        if [int(v) for v in t.attrs.get(abi.STRIDE) or []] == list(abi.dense_strides(t.shape)):
            abi.write_image(st, int(t.attrs[abi.REG_ID]), int(t.attrs[abi.DDR_ADDR]), abi.dense_strides(st.shape))

    for n in out.toposort(list(s.ops)):              # in program order: a member of two concats is in the first's
        op = out.ops[n]
        t = op.output
        if op.type != "concat-fix" or t is None or not placed(n) or abi.STRIDE not in t.attrs:
            continue
        rank = len(t.shape)
        axis = int(op.attrs.get("axis", -1))
        axis = axis + rank if axis < 0 else axis
        stride = [int(v) for v in t.attrs[abi.STRIDE]]
        off = 0
        for i in op.inputs.get("input") or []:
            it = out.ops[i].output
            assert it is not None
            if (i in ops and not placed(i) and out.ops[i].type not in VIEW_TYPES and it.fix_point == t.fix_point
                    and len(it.shape) == rank):
                abi.write_image(it, int(t.attrs[abi.REG_ID]), int(t.attrs[abi.DDR_ADDR]) + off * stride[axis], stride)
            off += int(it.shape[axis]) if len(it.shape) == rank else 0
    data = [r for r, c in sorted(prog.registers.context.items()) if c == abi.WORKSPACE] or \
        [r for r, c in sorted(prog.registers.context.items()) if c != abi.CONST]
    for n in s.ops:
        op = out.ops[n]
        if op.type in SKIP_TYPES or placed(n) or not data:
            continue
        cons = out.consumers(n)
        if cons and all(c in layer_of and layer_of[c] == layer_of.get(n) for c in cons):
            abi.write_on_chip(op.output, data[0])           # type: ignore[arg-type]


def _check_abi(out: Graph, sg: Subgraph | None, prog: DpuProgram, download: dict[str, str],
               upload: dict[tuple[str, str], str]) -> None:
    """What a runner reads back (dpu_abi.read_*) is what the program was compiled for."""
    assert sg is not None
    spec = abi.read_dpu_subgraph(sg)
    if spec.mc_code != prog.mc_code or spec.registers.sizes != prog.registers.sizes:
        raise EmitError(f"DPU subgraph {sg.name!r}: program or registers do not read back")
    want = {download.get(i.op_name, i.op_name): (i.reg_id, i.ddr_addr, tuple(i.strides)) for i in prog.inputs}
    got = {t.op_name: (t.reg_id, t.ddr_addr, tuple(t.stride or ())) for t in abi.read_inputs(out, sg)}
    if want != got:
        raise EmitError(f"DPU subgraph {sg.name!r}: input images read back as {got}, compiled as {want}")
    want = {download[o.op_name]: (o.reg_id, o.ddr_addr, tuple(o.strides)) for o in prog.outputs}
    got = {t.op_name: (t.reg_id, t.ddr_addr, tuple(t.stride or ())) for t in abi.read_outputs(out, sg)}
    if want != got:
        raise EmitError(f"DPU subgraph {sg.name!r}: output images read back as {got}, compiled as {want}")


def layer_map_of(sg: Subgraph, n: int) -> list[str] | None:
    """The exact instruction -> layer (child subgraph name) map of a DPU subgraph compiled by opendpu, or None when
    it carries none (AMD's models); a damaged map is an EmitError."""
    m = sg.attrs.get(LAYER_MAP)
    if m is None:
        return None
    names = decode_layer_map(m, n, f"subgraph {sg.name!r}")
    kids = {c.name for c in sg.children}
    unknown = sorted(set(names) - kids)
    if unknown:
        raise EmitError(f"subgraph {sg.name!r}: {LAYER_MAP} names {unknown[:3]}, which are not its children")
    return names


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("opendpu")
    except Exception:  # noqa: BLE001 - a source checkout without distribution metadata
        return "0.1.0"


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def meta_json(name: str, target: Target, part: Partition, programs: dict[str, DpuProgram],
              options: dict) -> dict:
    """meta.json for the runtime (vai_c_xir writes one beside the compiled xmodel); "coverage" is the share of MACs
    and ops on the DPU with every CPU op and its reason (`partition.coverage`)."""
    fp = f"0x{target.fingerprint:016X}" if target.fingerprint is not None else None
    return {
        "coverage": coverage(part),
        "target": target.name, "fingerprint": fp, "lib": abi.DPU_RUNNERS["run"], "filename": f"{name}.xmodel",
        "org_filename": f"{name}_org.xmodel", "kernel": [s.name for s in part.dpu_subgraphs],
        "compiler": "opendpu", "opendpu_version": _version(), "options": dict(options),
        "summary": part.summary(),
        "subgraphs": [dict(name=s.name, device=s.device, ops=len(s.ops),
                           **({"instructions": len(programs[s.name].instructions),
                               "layers": len(programs[s.name].layers),
                               "registers": {abi.reg_key(r): int(v) for r, v in
                                             sorted(programs[s.name].registers.sizes.items())}}
                              if s.device == DPU else {}))
                      for s in part.subgraphs],
    }


__all__ = ["emit", "meta_json", "op_workload", "encode_layer_map", "decode_layer_map", "layer_map_of", "EmitError",
           "LAYER_MAP", "md5"]
