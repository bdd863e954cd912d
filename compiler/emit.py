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

`meta_json` is the runtime's meta.json: target, fingerprint, runner library, file names, DPU subgraph names
("kernel", as vai_c), the compiler and its options.
"""
from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from typing import Any

from opendpu.compiler.partition import CPU, DPU, Partition, SubgraphPlan, coverage, shape_of
from opendpu.compiler.program import DdrImage, DpuProgram
from opendpu.compiler.xir import dpu_abi as abi
from opendpu.compiler.xir.graph import Attrs, Graph, Op, Subgraph, Tensor, XModelError
from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import Target

LAYER_MAP = "opendpu_layer_map"
LAYER_MAP_KIND = "map_string_2_int32_vec_value"
CPU_RUNNERS = {"run": "libvart-cpu-runner.so", "ref": "libvart-cpu-runner.so", "sim": "libvart-cpu-runner.so"}
DDR_TENSOR_ATTRS = (abi.REG_ID, abi.DDR_ADDR, abi.LOCATION, abi.STRIDE, "strides")
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


def op_workload(graph: Graph, op: Op, target: Target) -> tuple[int, int]:
    """(workload, workload_on_arch) of one op in operations, as vai_c counts them on the DPU ops of AMD's models:
    conv-like ops 2 per multiply-accumulate plus 1 per output element with a bias (transposed convs: kernel taps per
    output kh*kw/(sh*sw)); pools kernel taps per output element; eltwise one per input element; every other op 0.
    On the arch, output widths are padded to the pixel parallelism and channels to the channel parallelism."""
    t = op.type
    if op.output is None or not op.output.shape:
        return 0, 0
    oh, ow, oc = _hw(op.output.shape)
    out = oh * ow * oc
    arch = oh * _pad(ow, target.pp) * _pad(oc, target.cp)
    ins = op.inputs.get("input") or []
    bias = 1 if op.inputs.get("bias") else 0
    k = op.attrs.get("kernel") or [1, 1]
    kw, kh = (int(k[0]), int(k[1])) if isinstance(k, list) and len(k) == 2 else (1, 1)
    if t in ("conv2d-fix", "transposed-conv2d-fix", "depthwise-conv2d-fix", "transposed-depthwise-conv2d-fix"):
        ic = 1 if "depthwise" in t else (_hw(shape_of(graph, ins[0]))[2] if ins else oc)
        taps: float = kh * kw
        if t.startswith("transposed"):
            s = op.attrs.get("stride") or [1, 1]
            taps = kh * kw / (int(s[0]) * int(s[1]))
        icp = 1 if "depthwise" in t else _pad(ic, target.cp)
        return int(out * (2 * taps * ic + bias)), int(arch * (2 * taps * icp + bias))
    if t == "pool-fix":
        if op.attrs.get("global") and ins:
            h, w, _ = _hw(shape_of(graph, ins[0]))
            kh, kw = h, w
        return out * kh * kw, arch * kh * kw
    if t == "eltwise-fix":
        return out * max(1, len(ins)), arch * max(1, len(ins))
    return 0, 0


# ---- the compiled graph ---------------------------------------------------------------------------------------
def _copy_tensor(t: Tensor, name: str | None = None, strip_ddr: bool = False) -> Tensor:
    attrs = Attrs()
    for k, v in t.attrs.items():
        if strip_ddr and k in DDR_TENSOR_ATTRS:
            continue
        attrs.set(k, copy.deepcopy(v), t.attrs.kinds.get(k))
    return Tensor(name or t.name, list(t.shape), t.data_type, t.bit_width, attrs)


def _copy_attrs(a: Attrs) -> Attrs:
    out = Attrs()
    for k, v in a.items():
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

    out = Graph(graph.name)
    out.attrs = _copy_attrs(graph.attrs)
    out.op_defs = list(graph.op_defs)
    for n in order:
        op = graph.ops[n]
        s_name = sub[n]
        ins = OrderedDict((arg, [source(p, s_name) for p in ps]) for arg, ps in op.inputs.items())
        attrs = _copy_attrs(op.attrs)
        attrs.set("device", dev[n], "string_value")
        t = op.output
        if t is None:
            raise EmitError(f"op {n!r} has no output tensor")
        tensor = _copy_tensor(t, f"{t.name}_download_0" if n in download else None)
        out.add_op(n, op.type, ins, attrs, tensor)
        if n in download:
            d = download[n]
            dattrs = Attrs()
            dattrs.set("device", DPU, "string_value")
            out.add_op(d, abi.DOWNLOAD, {"input": [n]}, dattrs, _copy_tensor(t, t.name, strip_ddr=True))
        for k, s_name2 in enumerate(readers.get(n, [])):
            u = upload[(n, s_name2)]
            uattrs = Attrs()
            uattrs.set("device", DPU, "string_value")
            out.add_op(u, abi.UPLOAD, {"input": [download.get(n, n)]}, uattrs,
                       _copy_tensor(t, f"{t.name}_upload_{k}", strip_ddr=True))

    # the subgraph tree
    root = Subgraph("root")
    total_wl = total_arch = 0
    for s in part.subgraphs:
        if s.device == DPU:
            sg = _dpu_subgraph(out, graph, s, programs[s.name], target, options, download, upload)
        else:
            sg = Subgraph(s.name, list(s.ops))
            sg.attrs.set("device", s.device, "string_value")
            if s.device == CPU:
                sg.attrs.set(abi.RUNNER, dict(CPU_RUNNERS), abi.SUBGRAPH_ATTR_KINDS[abi.RUNNER])
            sg.attrs.set("workload", 0, U64)
            sg.attrs.set("workload_on_arch", 0, U64)
        sg.parent = root
        root.children.append(sg)
        total_wl += int(sg.attrs["workload"])
        total_arch += int(sg.attrs["workload_on_arch"])
    root.attrs.set("workload", total_wl, U64)
    root.attrs.set("workload_on_arch", total_arch, U64)
    root.attrs.set("prefetch", bool(options.get("prefetch", False)), "bool_value")
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
                  download: dict[str, str], upload: dict[tuple[str, str], str]) -> Subgraph:
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
            w, a = op_workload(graph, graph.ops[o], target)
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
    return sg


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
