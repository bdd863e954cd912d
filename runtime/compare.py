"""Accuracy of a compiled model against its float ONNX model: onnxruntime beside the xmodel on `sim` or `ref`.

`compare(onnx_path, build_dir, data)` runs both on every sample and returns a report dict: per output the SQNR,
the max abs error and the float range, and a task metric (top-1 agreement for a classifier, detection agreement
for a YOLOv8-style head). `format_report` renders it as text, `to_json` as JSON. Definitions: docs/accuracy.md.
"""
from __future__ import annotations

import json
import math
import os
import re
import time

import numpy as np

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.jsonin import check_depth

__all__ = ["compare", "Comparison", "CompareError", "format_report", "to_json", "sqnr_db", "box_iou", "nms",
           "decode_yolo", "match_detections", "DetectionTally", "TASKS", "NMS_IOU"]

TASKS = ("auto", "classify", "detect", "raw")
BACKENDS = ("sim", "ref")
NMS_IOU = 0.45                  # class-wise NMS of the detection metric (YOLOv8's default)


class CompareError(OpenDpuError, ValueError):
    """A model, build directory, data set or option that cannot be compared; the message names it."""


# ---- metrics ---------------------------------------------------------------------------------------------
def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """10·log10(Σ ref² / Σ (ref − test)²) in dB: inf when equal, -inf when the reference is all zero."""
    r = np.asarray(ref, np.float64)
    e = r - np.asarray(test, np.float64)
    return _sqnr(float(np.sum(r * r)), float(np.sum(e * e)))


def _sqnr(signal: float, noise: float) -> float:
    """SQNR in dB from the summed squares of the signal and of the error."""
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU [len(a), len(b)] of boxes given as (x1, y1, x2, y2); 0 where the union is empty."""
    a = np.asarray(a, np.float64).reshape(-1, 4)
    b = np.asarray(b, np.float64).reshape(-1, 4)
    iw = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = iw * ih
    area_a = np.clip(a[:, 2] - a[:, 0], 0, None) * np.clip(a[:, 3] - a[:, 1], 0, None)
    area_b = np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)
    union = area_a[:, None] + area_b[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float = NMS_IOU) -> np.ndarray:
    """Indices kept by greedy single-class NMS: highest score first, a box is dropped at IoU > `iou` with a kept
    one (ties in score keep the earlier box)."""
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    keep: list[int] = []
    while order.size:
        i = int(order[0])
        keep.append(i)
        rest = order[1:]
        if rest.size:
            rest = rest[box_iou(boxes[i:i + 1], boxes[rest])[0] <= iou]
        order = rest
    return np.asarray(keep, np.int64)


def decode_yolo(out: np.ndarray, score_threshold: float = 0.25, nms_iou: float = NMS_IOU,
                channels_first: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Detections of one YOLOv8-style output [4+nc, N] (or [N, 4+nc] with channels_first=False): (boxes x1y1x2y2,
    scores, classes), boxes with max class score ≥ score_threshold, after class-wise NMS, by descending score."""
    o = np.asarray(out, np.float64)
    if not channels_first:
        o = o.T
    if o.ndim != 2 or o.shape[0] < 5:
        raise CompareError(f"a detection output needs [4+nc, N] with nc >= 1, got {list(o.shape)}")
    cx, cy, w, h = o[0], o[1], o[2], o[3]
    cls_scores = o[4:]
    cls = np.argmax(cls_scores, axis=0)
    score = cls_scores[cls, np.arange(o.shape[1])]
    sel = np.flatnonzero(score >= score_threshold)
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)[sel]
    score, cls = score[sel], cls[sel]
    kept = [np.flatnonzero(cls == c)[nms(boxes[cls == c], score[cls == c], nms_iou)] for c in np.unique(cls)]
    idx = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    idx = idx[np.argsort(-score[idx], kind="stable")]
    return boxes[idx], score[idx], cls[idx]


def match_detections(a: tuple, b: tuple, iou: float = 0.5) -> int:
    """Pairs in a greedy one-to-one matching of detections `a` to `b` ((boxes, scores, classes) each): `a` in
    descending score takes the unmatched `b` box of its class with the highest IoU, if that IoU is ≥ `iou`."""
    ab, as_, ac = a
    bb, _, bc = b
    if len(ab) == 0 or len(bb) == 0:
        return 0
    ious = box_iou(ab, bb)
    ious[np.asarray(ac)[:, None] != np.asarray(bc)[None, :]] = -1.0
    used = np.zeros(len(bb), bool)
    n = 0
    for i in np.argsort(-np.asarray(as_, np.float64), kind="stable"):
        row = np.where(used, -1.0, ious[i])
        j = int(np.argmax(row))
        if row[j] >= iou:
            used[j] = True
            n += 1
    return n


class DetectionTally:
    """Detection agreement pooled over samples: float and DPU detections, and the pairs matched between them."""

    def __init__(self, score_threshold: float = 0.25, iou: float = 0.5, channels_first: bool = True):
        self.score_threshold, self.iou, self.channels_first = score_threshold, iou, channels_first
        self.float_detections = self.dpu_detections = self.matched = 0

    def add(self, float_out: np.ndarray, dpu_out: np.ndarray) -> None:
        """One sample's output ([4+nc, N], or [N, 4+nc] when not channels_first) from each model."""
        fd = decode_yolo(float_out, self.score_threshold, NMS_IOU, self.channels_first)
        dd = decode_yolo(dpu_out, self.score_threshold, NMS_IOU, self.channels_first)
        self.float_detections += len(fd[0])
        self.dpu_detections += len(dd[0])
        self.matched += match_detections(fd, dd, self.iou)

    def result(self) -> dict:
        nf, nd, k = self.float_detections, self.dpu_detections, self.matched
        return {"layout": "[1, 4+nc, N]" if self.channels_first else "[1, N, 4+nc]",
                "score_threshold": self.score_threshold, "nms_iou": NMS_IOU, "match_iou": self.iou,
                "float_detections": nf, "dpu_detections": nd, "matched": k,
                "detection_agreement": k / nf if nf else None, "reverse_agreement": k / nd if nd else None}


# ---- the build directory, the data, the pairing ------------------------------------------------------------
def find_xmodel(build_dir: str) -> str:
    """The compiled xmodel of `opendpu build -o DIR` (DIR/compiled/meta.json), `opendpu compile -o DIR`
    (DIR/meta.json), or a compiled .xmodel given directly."""
    p = os.fspath(build_dir)
    if os.path.isfile(p):
        if not p.endswith(".xmodel"):
            raise CompareError(f"build directory {p} is a file, not a directory or a compiled .xmodel")
        return p
    if not os.path.isdir(p):
        raise CompareError(f"build directory {p}: no such directory")
    for d in (os.path.join(p, "compiled"), p):
        meta = os.path.join(d, "meta.json")
        if os.path.isfile(meta):
            try:
                with open(meta) as f:
                    text = f.read()
                check_depth(text, f"build directory {p}: {meta}", CompareError)
                name = json.loads(text).get("filename")
            except CompareError:
                raise
            except (OSError, ValueError, AttributeError, RecursionError) as e:
                raise CompareError(f"build directory {p}: unreadable {meta} ({type(e).__name__})") from None
            x = os.path.join(d, str(name))
            if not name or not os.path.isfile(x):
                raise CompareError(f"build directory {p}: {meta} names the xmodel {name!r}, which is not there")
            return x
    found = sorted(f for f in os.listdir(p) if f.endswith(".xmodel") and not f.endswith(("_org.xmodel",
                                                                                          "_int.xmodel")))
    if len(found) == 1:
        return os.path.join(p, found[0])
    raise CompareError(f"build directory {p} holds no compiled xmodel (expected compiled/meta.json of opendpu build "
                       f"or meta.json of opendpu compile" + (f"; found {found}" if found else "") + ")")


def _nchw(dims) -> list[int]:
    """The ONNX (NCHW) shape of an xmodel tensor (NHWC for 4-D)."""
    d = [int(v) for v in dims]
    return [d[0], d[3], d[1], d[2]] if len(d) == 4 else d


def _layout_fn(dpu_dims, onnx_shape):
    """A function taking an xmodel output (its dims) to the ONNX output's shape, or None when they differ: equal,
    NHWC -> NCHW (first: a 4-D xmodel tensor is NHWC, also when C == H == W), or equal up to size-1 dimensions."""
    d, o = tuple(int(v) for v in dpu_dims), tuple(int(v) for v in onnx_shape)
    if len(d) == 4 and len(o) == 4 and (d[0], d[3], d[1], d[2]) == o:
        return lambda v: np.transpose(v, (0, 3, 1, 2))
    if d == o:
        return lambda v: v
    if [v for v in d if v != 1] == [v for v in o if v != 1]:
        return lambda v: np.reshape(v, o)
    return None


def _load_data(data, shape: list[int], limit: int | None) -> tuple[np.ndarray, np.ndarray | None, str]:
    """(x float32 [N, ...], labels or None, the data's name), checked against the model input `shape` (NCHW)."""
    from opendpu.quant.onnx_in import QuantError
    from opendpu.quant.quantize import eval_arrays
    from opendpu.runtime.cli.checks import load_npz
    y = None
    name = "<array>"
    where = where_x = "data"
    if isinstance(data, tuple) and len(data) == 2:
        x, y = data
    elif isinstance(data, (str, os.PathLike)):
        x = name = os.fspath(data)
        where = where_x = f"data {name}"
        if name.endswith(".npz") and os.path.isfile(name):
            z = load_npz(name, "data")
            if "x" not in z:
                raise CompareError(f"{where}: an .npz needs an array named 'x' (and optionally labels 'y'); "
                                   f"has {list(z)}")
            x, y, where_x = z["x"], z.get("y"), f"{where} 'x'"
    else:
        x = data
    try:
        x, y = eval_arrays(x, shape, y)
    except QuantError as e:
        msg = (str(e).replace("NO_CALIBRATION: ", "").replace("evaluation data array", where_x)
               .replace("evaluation data", "data")
               .replace("evaluation labels 'y'", f"{where}: labels 'y'"))
        raise CompareError(msg) from None
    if limit is not None:
        x, y = x[:limit], (y[:limit] if y is not None else None)
    return x, y, name


def _output_keys(spec) -> set[str]:
    """Names an xmodel graph output may be known by: its tensor, its op, the op before the compiler's download."""
    return {spec.name, spec.op_name, re.sub(r"_download_\d+$", "", spec.op_name)}


class Comparison:
    """A checked pairing of a float ONNX model with a compiled xmodel and a data set; `run()` measures it.

    Everything is validated in the constructor (files, pairing, data shape, task), so a mistake costs no work."""

    def __init__(self, onnx_path, build_dir, data, task: str = "auto", backend: str = "sim",
                 limit: int | None = None, score_threshold: float = 0.25, iou: float = 0.5):
        from opendpu.compiler.xir.graph import Graph, XModelError
        from opendpu.quant.emit import session
        from opendpu.quant.onnx_in import QuantError, load_onnx
        from opendpu.runtime.dpu import RuntimeErrorDPU
        from opendpu.runtime.ops import unimplemented_ops
        from opendpu.runtime.runner import GraphRunner
        if task not in TASKS:
            raise CompareError(f"task {task!r}: choose from {', '.join(TASKS)}")
        if backend not in BACKENDS:
            raise CompareError(f"backend {backend!r}: choose from {', '.join(BACKENDS)}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
            raise CompareError(f"limit {limit!r} must be an integer >= 1")
        for k, v in (("score threshold", score_threshold), ("iou", iou)):
            if not (isinstance(v, (int, float)) and 0.0 < float(v) <= 1.0):
                raise CompareError(f"{k} {v!r} must be in (0, 1]")
        self.onnx_path, self.task_asked, self.backend = os.fspath(onnx_path), task, backend
        self.score_threshold, self.iou = float(score_threshold), float(iou)
        # ---- the compiled model (a Graph in memory: runtime.flow's accuracy step)
        if isinstance(build_dir, Graph):
            self.xmodel, g = f"{build_dir.name}.xmodel", build_dir
        else:
            self.xmodel = find_xmodel(build_dir)
            try:
                g = Graph.load(self.xmodel)
            except XModelError as e:
                msg = " ".join(str(e).split())
                raise CompareError(msg if self.xmodel in msg else f"xmodel {self.xmodel}: {msg}") from None
        if not g.root.children:
            raise CompareError(f"xmodel {self.xmodel} is not compiled (a quantized graph without DPU subgraphs); "
                               f"give the output of opendpu build or opendpu compile")
        cpu = [n for sg in g.toposort_child_subgraphs() if sg.device == "CPU" for n in g.toposort(sg.all_ops())]
        missing = unimplemented_ops(g, cpu)
        if missing:
            raise CompareError(f"xmodel {self.xmodel}: CPU op {missing[0][0]!r} has type {missing[0][1]!r}, which "
                               f"opendpu does not implement")
        try:
            self.runner = GraphRunner(g, backend=backend)
        except RuntimeErrorDPU as e:
            raise CompareError(f"xmodel {self.xmodel}: {e}") from None
        self.target = next((r.target.name for r in self.runner.runners.values() if r.target is not None), None)
        ins = self.runner.get_inputs()
        if len(ins) != 1:
            raise CompareError(f"xmodel {self.xmodel} has {len(ins)} inputs; compare handles one-input models")
        self.in_spec = ins[0]
        self.shape = _nchw(self.in_spec.dims)
        self.layout = "nchw" if len(self.in_spec.dims) == 4 else "nhwc"
        # ---- the float model, paired with it
        try:
            m = load_onnx(self.onnx_path)
        except QuantError as e:
            raise CompareError(str(e)) from None
        inits = {i.name for i in m.graph.initializer}
        m_ins = [vi for vi in m.graph.input if vi.name not in inits]
        if len(m_ins) != 1:
            raise CompareError(f"model {self.onnx_path} has {len(m_ins)} inputs; compare handles one-input models")
        self.in_name = m_ins[0].name
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in m_ins[0].type.tensor_type.shape.dim]
        if len(dims) != len(self.shape) or any(v is not None and v != s for v, s in zip(dims[1:], self.shape[1:])):
            shown = ['?' if v is None else v for v in dims]
            raise CompareError(f"model {self.onnx_path} input {self.in_name!r} {shown}"
                               f" does not match the xmodel's input {list(self.in_spec.dims)} "
                               f"({'NHWC, ' if self.layout == 'nchw' else ''}{self.shape} as ONNX): the build was "
                               f"not made from this model")
        self.onnx_outputs = [o.name for o in m.graph.output]
        self.pairs = self._pair_outputs(m)
        # ---- the data
        self.x, self.y, self.data_name = _load_data(data, self.shape, limit)
        try:
            self.sess = session(m)
        except QuantError as e:
            raise CompareError(f"model {self.onnx_path}: {e}") from None
        first = self._float(self.x[:1])
        self.conv = {}
        for o, spec in self.pairs.items():
            fn = _layout_fn(spec.dims, first[o].shape)
            if fn is None:
                raise CompareError(f"model {self.onnx_path} output {o!r} has shape {list(first[o].shape)} but the "
                                   f"xmodel's output {spec.name!r} has {list(spec.dims)}: the build was not made "
                                   f"from this model")
            self.conv[o] = fn
        self.shapes = {o: [int(v) for v in first[o].shape] for o in self.onnx_outputs}
        self.task = self._resolve_task()
        self.warnings: list[str] = []       # legal but suspicious: the CLI prints each as a warning line
        if self.y is not None:
            where = f"data {self.data_name}: labels 'y'"
            if self.task == "classify":     # a label the output cannot predict would make the accuracy 0 %
                from opendpu.quant.quantize import check_labels
                try:
                    check_labels(self.y, int(np.prod(self.shapes[self.onnx_outputs[0]][1:])), where)
                except QuantError as e:
                    raise CompareError(str(e)) from None
            else:
                self.warnings.append(f"{where} are not used: task {self.task} measures "
                                     + ("detection agreement" if self.task == "detect" else "SQNR only")
                                     + " (labels give an accuracy with task classify)")

    def _pair_outputs(self, m) -> dict:
        """ONNX output name -> xmodel output spec, by the names the quantizer gives ops (quant.prepare), else by
        the output's or its producer's name; every output on both sides must be paired."""
        from opendpu.quant.onnx_in import QuantError, to_fgraph
        from opendpu.quant.prepare import prepare
        from opendpu.quant.quantize import QuantConfig
        import onnx
        producer = {t: n.name for n in m.graph.node for t in n.output}
        copy = onnx.ModelProto()
        copy.CopyFrom(m)
        try:
            prep = prepare(to_fgraph(copy, self.onnx_path, self.shape), QuantConfig())
            qname = dict(zip(prep.output_names, prep.outputs))
        except QuantError:
            qname = {}
        specs = self.runner.get_outputs()
        pairs, used = {}, set()
        for o in self.onnx_outputs:
            names = {qname[o]} if o in qname else {o, producer.get(o) or o}
            hits = [s for s in specs if _output_keys(s) & names and s.name not in used]
            inner = [n for n in names if n in self.runner.graph.ops]
            if not hits and inner:
                raise CompareError(f"model {self.onnx_path} output {o!r} is computed inside the xmodel {self.xmodel} "
                                   f"(op {inner[0]!r}) but is not one of its outputs: an XIR graph output is an op "
                                   f"without consumers, and this ONNX output also feeds other ops")
            if len(hits) != 1:
                raise CompareError(f"model {self.onnx_path} output {o!r} (op {sorted(names)[0]!r}) "
                                   f"{'has no' if not hits else 'has several'} matching output in the xmodel "
                                   f"{self.xmodel} (its outputs: {[s.name for s in specs]}): the build was not made "
                                   f"from this model")
            pairs[o] = hits[0]
            used.add(hits[0].name)
        extra = [s.name for s in specs if s.name not in used]
        if extra:
            raise CompareError(f"xmodel {self.xmodel} outputs {extra} have no counterpart among the outputs "
                               f"{self.onnx_outputs} of model {self.onnx_path}: the build was not made from this model")
        return pairs

    def _resolve_task(self) -> str:
        shp = self.shapes
        cls = [o for o in self.onnx_outputs if len(shp[o]) in (2, 4) and shp[o][0] == 1 and shp[o][1] >= 2
               and all(v == 1 for v in shp[o][2:])]
        if self.task_asked == "auto":
            return "classify" if len(self.onnx_outputs) == 1 and cls else "raw"
        if self.task_asked == "classify" and not (len(self.onnx_outputs) == 1 and cls):
            raise CompareError(f"task classify needs one output of shape [1, K] or [1, K, 1, 1]; model "
                               f"{self.onnx_path} has {[f'{o} {shp[o]}' for o in self.onnx_outputs]}")
        if self.task_asked == "detect":
            det = [o for o in self.onnx_outputs if len(shp[o]) == 3 and shp[o][0] == 1 and min(shp[o][1:]) >= 5]
            if len(det) != 1:
                raise CompareError(f"task detect needs exactly one output of shape [1, 4+nc, N] (or [1, N, 4+nc]); "
                                   f"model {self.onnx_path} has {[f'{o} {shp[o]}' for o in self.onnx_outputs]}")
            self.det_output = det[0]
            self.det_channels_first = shp[det[0]][1] <= shp[det[0]][2]
        return self.task_asked

    def _float(self, x: np.ndarray) -> dict[str, np.ndarray]:
        outs = self.sess.run(self.onnx_outputs, {self.in_name: x})
        return dict(zip(self.onnx_outputs, outs))

    def _dpu(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """The xmodel's outputs for one sample, as the ONNX outputs (by name, in their layout)."""
        return _Evaluator(self.sess, self.runner, self._spec())._dpu(x)

    def _spec(self) -> dict:
        """What a worker process needs to measure samples as this comparison does (picklable)."""
        g = self.runner.graph
        return {"onnx": self.onnx_path, "xmodel": self.xmodel if os.path.isfile(self.xmodel) else g.serialize(),
                "backend": self.backend, "in_name": self.in_name, "outputs": self.onnx_outputs,
                "pairs": {o: s.name for o, s in self.pairs.items()}, "shapes": self.shapes, "layout": self.layout,
                "task": self.task,
                "det": (getattr(self, "det_output", None), getattr(self, "det_channels_first", True)),
                "score_threshold": self.score_threshold, "iou": self.iou}

    def run(self, progress=None, workers: int = 1) -> dict:
        """Run every sample through onnxruntime and the xmodel; the report dict (see `compare`). With `workers`
        > 1, the samples are shared among that many processes (runtime.pool); the report is the same, as
        every sample is measured alone and the sums are taken in sample order here."""
        from opendpu.runtime.pool import check_workers, chunks, map_chunks, throughput
        try:
            workers = check_workers(workers)
        except ValueError as e:
            raise CompareError(str(e)) from None
        n = len(self.x)
        workers = min(workers, n)
        t0 = time.perf_counter()
        parts = chunks(n, workers)
        if workers == 1:
            ev = _Evaluator(self.sess, self.runner, self._spec())
            recs = []
            for r in parts:
                recs.append(ev.measure(self.x[r.start:r.stop]))
                if progress:
                    progress(r.stop, n, "samples")
        else:
            if self.backend == "sim" and self.runner.runners:
                from opendpu.sim import warm_kernels
                warm_kernels()          # compiled once, here: the workers load them from Numba's disk cache
            recs = map_chunks(_measure, [self.x[r.start:r.stop] for r in parts], workers, _load, (self._spec(),),
                              progress=progress, sizes=[len(r) for r in parts])
        seconds = time.perf_counter() - t0
        acc = {o: {"signal": 0.0, "noise": 0.0, "max_abs_err": 0.0, "min": math.inf, "max": -math.inf}
               for o in self.onnx_outputs}
        fl_top, dp_top = [], []
        det = DetectionTally(self.score_threshold, self.iou, getattr(self, "det_channels_first", True))
        for rec in (r for part in recs for r in part):          # in sample order, whatever the workers
            for o, (signal, noise, err, lo, hi) in zip(self.onnx_outputs, rec["outputs"]):
                a = acc[o]
                a["signal"] += signal
                a["noise"] += noise
                if err is not None:
                    a["max_abs_err"] = max(a["max_abs_err"], err)
                    a["min"], a["max"] = min(a["min"], lo), max(a["max"], hi)
            if self.task == "classify":
                fl_top.append(rec["top1"][0])
                dp_top.append(rec["top1"][1])
            elif self.task == "detect":
                det.float_detections += rec["det"][0]
                det.dpu_detections += rec["det"][1]
                det.matched += rec["det"][2]
        outputs = []
        for o in self.onnx_outputs:
            a = acc[o]
            outputs.append({"name": o, "xmodel_output": self.pairs[o].name, "shape": self.shapes[o],
                            "float_min": a["min"], "float_max": a["max"], "sqnr_db": _sqnr(a["signal"], a["noise"]),
                            "max_abs_err": a["max_abs_err"]})
        metric: dict = {}
        if self.task == "classify":
            fa, da = np.asarray(fl_top), np.asarray(dp_top)
            metric = {"top1_agreement": float(np.mean(fa == da)), "agreeing": int(np.sum(fa == da)),
                      "float_accuracy": None, "dpu_accuracy": None}
            if self.y is not None:
                metric["float_accuracy"] = float(np.mean(fa == self.y))
                metric["dpu_accuracy"] = float(np.mean(da == self.y))
        elif self.task == "detect":
            metric = {"output": self.det_output, **det.result()}
        return {"model": self.onnx_path, "xmodel": self.xmodel, "backend": self.backend, "target": self.target,
                "data": self.data_name, "samples": n, "task": self.task, "metric": metric, "outputs": outputs,
                "throughput": throughput(n, seconds, workers)}


class _Evaluator:
    """Measures samples one at a time: onnxruntime and the xmodel side by side, each sample's sums and extremes
    (folded in sample order by `Comparison.run`). Built in process, or once per pool worker by `_load`."""

    def __init__(self, sess, runner, spec: dict):
        self.sess, self.runner, self.spec = sess, runner, spec
        specs = {s.name: s for s in runner.get_outputs()}
        self.pairs = {o: specs[name] for o, name in spec["pairs"].items()}
        self.conv = {o: _layout_fn(s.dims, spec["shapes"][o]) for o, s in self.pairs.items()}

    def _dpu(self, x: np.ndarray) -> dict[str, np.ndarray]:
        res = self.runner.run([x], keep_values=True, layout=self.spec["layout"])
        vals = {name: v for name, (v, _fp) in self.runner.output_values(res).items()}   # float, by fix_point
        return {o: self.conv[o](vals[s.name]) for o, s in self.pairs.items()}

    def measure(self, x: np.ndarray) -> list[dict]:
        sp, recs = self.spec, []
        for i in range(len(x)):
            xi = x[i:i + 1]
            f = dict(zip(sp["outputs"], self.sess.run(sp["outputs"], {sp["in_name"]: xi})))
            d = self._dpu(xi)
            rec: dict = {"outputs": []}
            for o in sp["outputs"]:
                fv, dv = np.asarray(f[o], np.float64), np.asarray(d[o], np.float64)
                e = fv - dv
                rec["outputs"].append((float(np.sum(fv * fv)), float(np.sum(e * e)),
                                       float(np.max(np.abs(e))) if e.size else None,
                                       float(fv.min()) if e.size else None, float(fv.max()) if e.size else None))
            if sp["task"] == "classify":
                o = sp["outputs"][0]
                rec["top1"] = (int(np.argmax(np.reshape(f[o], -1))), int(np.argmax(np.reshape(d[o], -1))))
            elif sp["task"] == "detect":
                out, first = sp["det"]
                fd = decode_yolo(f[out][0], sp["score_threshold"], NMS_IOU, first)
                dd = decode_yolo(d[out][0], sp["score_threshold"], NMS_IOU, first)
                rec["det"] = (len(fd[0]), len(dd[0]), match_detections(fd, dd, sp["iou"]))
            recs.append(rec)
        return recs


_WORKER: _Evaluator | None = None


def _load(spec: dict) -> None:
    """Pool initializer: the float model's session and the xmodel's runner, once per worker."""
    global _WORKER
    from opendpu.compiler.xir.graph import Graph
    from opendpu.quant.emit import session
    from opendpu.quant.onnx_in import load_onnx
    from opendpu.runtime.runner import GraphRunner
    src = spec["xmodel"]
    g = Graph.deserialize(src) if isinstance(src, bytes) else Graph.load(src)
    runner = GraphRunner(g, backend=spec["backend"])
    if spec["backend"] == "sim":
        from opendpu.sim import warm_kernels
        warm_kernels()
    _WORKER = _Evaluator(session(load_onnx(spec["onnx"])), runner, spec)


def _measure(x: np.ndarray) -> list[dict]:
    """Pool task: the records of a chunk of samples."""
    assert _WORKER is not None, "the pool initializer loads the models"
    return _WORKER.measure(x)


def compare(onnx_path, build_dir, data, task: str = "auto", backend: str = "sim", limit: int | None = None,
            score_threshold: float = 0.25, iou: float = 0.5, progress=None, workers: int = 1) -> dict:
    """Float onnxruntime against the compiled xmodel on `backend` over `data` (a path: .npy, .npz with x and
    optional labels y, a folder of .npy; an array; or (x, y)). Returns the report: task metric and per-output
    SQNR (dB, inf when equal), max abs error and float range, and the throughput (images/s with `workers`
    processes; the other numbers do not depend on `workers`)."""
    return Comparison(onnx_path, build_dir, data, task, backend, limit, score_threshold, iou).run(progress, workers)


# ---- rendering ---------------------------------------------------------------------------------------------
def _pct(v) -> str:
    return "n/a" if v is None else f"{100.0 * v:.2f} %"


def _num(v: float) -> str:
    return f"{v:.4g}"


def format_report(rep: dict) -> str:
    """The report as text: what was compared, the task metric, then one row per output."""
    lines = [f"compared {rep['model']} (onnxruntime, float) with {rep['xmodel']} ({rep['backend']}"
             + (f", {rep['target']}" if rep.get("target") else "") + f") on {rep['samples']} samples of {rep['data']}"]
    m = rep["metric"]
    if rep["task"] == "classify":
        s = f"classify: top-1 agreement {_pct(m['top1_agreement'])} ({m['agreeing']} of {rep['samples']})"
        if m.get("float_accuracy") is not None:
            s += f"; top-1 accuracy float {_pct(m['float_accuracy'])}, DPU {_pct(m['dpu_accuracy'])} (labels y)"
        lines.append(s)
    elif rep["task"] == "detect":
        lines.append(f"detect: detection agreement {_pct(m['detection_agreement'])} ({m['matched']} of "
                     f"{m['float_detections']} float detections matched), reverse {_pct(m['reverse_agreement'])} "
                     f"({m['matched']} of {m['dpu_detections']} DPU detections); output {m['output']} {m['layout']}, "
                     f"score >= {m['score_threshold']:g}, NMS IoU {m['nms_iou']:g}, match IoU >= {m['match_iou']:g}"
                     f" with the same class")
    else:
        lines.append("raw: per-output SQNR only")
    rows = [("output", "shape", "float range", "SQNR dB", "max abs err")]
    for o in rep["outputs"]:
        rng = f"[{_num(o['float_min'])}, {_num(o['float_max'])}]" if math.isfinite(o["float_min"]) else "-"
        sq = o["sqnr_db"]
        rows.append((o["name"], str(o["shape"]), rng, "inf (equal)" if sq == math.inf else f"{sq:.2f}",
                     _num(o["max_abs_err"])))
    w = [max(len(r[k]) for r in rows) for k in range(5)]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w[k]) if k < 3 else c.rjust(w[k]) for k, c in enumerate(r)).rstrip())
    t = rep.get("throughput")
    if t and t.get("images_per_s") is not None:
        lines.append(f"throughput: {t['images_per_s']:g} images/s ({rep['samples']} samples in {t['seconds']:g} s, "
                     f"{t['workers']} worker{'s' if t['workers'] > 1 else ''})")
    return "\n".join(lines) + "\n"


def to_json(rep: dict) -> str:
    """The report as JSON with stable keys; a non-finite number (SQNR of equal outputs) is written as null."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v
    out = clean(rep)
    for o, src in zip(out["outputs"], rep["outputs"]):
        o["exact"] = src["sqnr_db"] == math.inf
    return json.dumps(out, indent=1, sort_keys=False) + "\n"
