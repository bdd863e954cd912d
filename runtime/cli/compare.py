"""`opendpu compare`: accuracy of a compiled model against its float ONNX model (task metric, per-output SQNR)."""
from __future__ import annotations

from opendpu.compiler.outdir import check_file
from opendpu.runtime.pool import default_workers
from opendpu.runtime.cli.common import (_warm_kernels, _warn, _write_announced, add_verb, float_range,
                                            input_file, input_path, int_range)


def register(sub) -> None:
    cm = add_verb(sub, "compare", "accuracy of a compiled model against its float ONNX model: task metric and "
                                  "per-output SQNR")
    cm.add_argument("model", metavar="MODEL.onnx", help="the float ONNX model the build was made from")
    cm.add_argument("build_dir", metavar="BUILD_DIR", help="output of opendpu build (or compile), or a compiled "
                                                           ".xmodel")
    cm.add_argument("--data", required=True, metavar="DATA", help="samples: .npy [N,C,H,W], .npz ('x', optional "
                                                                  "labels 'y') or a folder of .npy")
    cm.add_argument("--task", default="auto", choices=("auto", "classify", "detect", "raw"),
                    help="auto = classify for one [1, K] output, else raw (SQNR only); detect = YOLOv8-style "
                         "[1, 4+nc, N] output")
    cm.add_argument("--limit", type=int_range(1), metavar="N", help="use at most N samples of --data (default: all)")
    cm.add_argument("--score-threshold", type=float_range(0, 1), default=0.25, metavar="S",
                    help="detect: keep boxes whose best class score is at least this")
    cm.add_argument("--iou", type=float_range(0, 1), default=0.5, metavar="IOU",
                    help="detect: IoU at which a float and a DPU detection of the same class match")
    cm.add_argument("--backend", choices=("sim", "ref"), default="sim",
                    help="sim = cycle model, ref = XIR reference ops")
    cm.add_argument("--workers", type=int_range(1, 1024), default=default_workers(), metavar="N",
                    help="processes sharing the samples (1 = in this process); the numbers do not depend on it")
    cm.add_argument("--json", metavar="OUT.json", help="also write the report as JSON")
    cm.set_defaults(fn=run)


def run(a) -> int:
    """Float onnxruntime beside the compiled xmodel on sim / ref: task metric and per-output SQNR."""
    from opendpu.runtime.compare import Comparison, format_report, to_json
    input_file(a.model, "model")
    input_path(a.build_dir, "build directory")
    input_path(a.data, "--data")
    if a.json:
        check_file(a.json, suffixes=(".json",), inputs=[a.model, a.data], what="--json")
    c = Comparison(a.model, a.build_dir, a.data, task=a.task, backend=a.backend, limit=a.limit,
                   score_threshold=a.score_threshold, iou=a.iou)
    for w in c.warnings:
        _warn(w)
    if a.backend == "sim" and c.runner.runners:
        _warm_kernels()             # here, so the workers find the kernels in Numba's cache
    from opendpu.runtime.progress import progress_bar
    with progress_bar("compare") as prog:
        rep = c.run(progress=prog, workers=a.workers)
    print(format_report(rep), end="")
    if a.json:
        def write(path):
            with open(path, "w") as f:
                f.write(to_json(rep))
        _write_announced(a.json, write, "JSON report")
    return 0
