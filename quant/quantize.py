"""Post-training quantization (vai_q semantics): prepare → weights → calibrate → DPU constraints → exports.

`quantize(model, calib, target=..., config=QuantConfig(...))` returns a `QuantResult` that holds the prepared
graph and every fix point; `QuantResult.write(dir)` writes the quantized xmodel, the QDQ ONNX, quant_info.json,
golden dumps and the report into `dir` atomically (nothing is left behind on error).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from opendpu.compiler import fixpoint as F
from opendpu.compiler.xir.graph import dump_stem
from opendpu.isa.jsonin import check_depth
from opendpu.isa.target import Target
from opendpu.quant import calib as C
from opendpu.quant.conv_params import CONV_KINDS, quantize_conv_params
from opendpu.quant.emit import QParams, avg_geometry, emit_onnx, session, value_name
from opendpu.quant.onnx_in import QuantError, load_onnx, to_fgraph, torch_to_onnx
from opendpu.quant.prepare import Prepared, prepare

XMODEL_FORMATS = ("xir", "vai_q")   # QuantResult.write: our *-fix form, or AMD's quantizer form (vai_q_out)
HSIG_OUT_FP = 7          # hard-sigmoid output is [0, 1]: fix point 7 (its DPU form saturates at 127/128)


@dataclass
class QuantConfig:
    """Every scheme choice (defaults as vai_q_pytorch for a DPU target); recorded in quant_info.json."""
    method: str = "diffs"                 # activation calibration: maxmin percentile mse entropy diffs
    weight_method: str | None = None      # weights and biases: maxmin | diffs | mse (None: diffs, maxmin if method is)
    statistic: str | None = None          # per-batch reduction for diffs (modal | max | mean | median)
    percentile: float = 99.9999
    bit_width: int = 8
    weight_round: str = "half_even"       # PY3_ROUND in the xmodel
    act_round: str = "half_up"            # DPU_ROUND
    batch_size: int = 8
    calib_limit: int | None = None        # use at most this many calibration samples
    replace_sigmoid: bool = False         # sigmoid -> hard-sigmoid (vai_q REPLACE_SIGMOID)
    replace_silu: str | None = None       # "hardswish": x*sigmoid(x) -> hard-swish on the DPU (an approximation)
    # fix-point sharing (docs/quantizer.md "DPU fix-point rules"; defaults as AMD's compiled programs show):
    # align_concat True: every concat producer takes the concat's position (TF1 align_concat 0). False: only a
    # producer read by nothing but the concat does; one with other consumers keeps its own and the concat takes
    # the minimum (the compiler rescales it with a single-input ELEW, spec §7.8).
    # align_pool True: average pools share their input's position too (TF1 align_pool 0); False: they keep their
    # own output fix point (vai_q_pytorch change_pool_input_fix False). Max pools always share (lossless).
    align_concat: bool = False
    align_pool: bool = False
    eltwise_spread: int = 2               # max fix-point spread of eltwise-add inputs (DPU ELEW keeps 2 extra bits)
    bias_corr: bool = False
    fast_finetune: bool = False
    # cross-layer equalization (quant/cle.py; vai_q include_cle on, cle_steps 10, cle_to_relu6 off):
    cle: bool = True                      # equalize conv/dwconv pairs joined by ReLU / LeakyReLU / PReLU / identity
    cle_steps: int = 10                   # passes over the pairs (a layer in two pairs is pulled both ways)
    cle_to_relu6: bool = False            # forced CLE through ReLU6 (changes the float model; the report says how much)
    cle_bias_absorb: bool = False         # Nagel et al. 2019 §4.2 bias absorption after ReLU (calibration-data minimum)
    nodes_to_exclude: tuple[str, ...] = ()  # ONNX node (or output tensor) names kept float on the CPU (vai_q_onnx)
    # a weight tensor that vai_q's fix-point cap of 12 would mostly zero takes its own fix point (_weights); False:
    # the cap everywhere, as vai_q
    weight_fp_lift: bool = True
    finetune_iters: int = 200
    seed: int = 0

    def validate(self) -> None:
        if self.method not in C.METHODS:
            raise QuantError(f"QUANT_CONFIG: unknown calibration method {self.method!r}; use one of "
                             f"{', '.join(C.METHODS)}")
        wm = self.wmethod
        if wm not in ("maxmin", "diffs", "mse"):
            raise QuantError(f"QUANT_CONFIG: weight method {wm!r}; use maxmin, diffs or mse")
        if self.replace_silu not in (None, "hardswish"):
            raise QuantError(f"QUANT_CONFIG: replace_silu {self.replace_silu!r}; use 'hardswish' or None")
        if isinstance(self.nodes_to_exclude, str) or not all(isinstance(n, str) and n
                                                               for n in self.nodes_to_exclude):
            raise QuantError(f"QUANT_CONFIG: nodes_to_exclude {self.nodes_to_exclude!r} must be a list of node names")
        for name in ("cle", "cle_to_relu6", "cle_bias_absorb"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise QuantError(f"QUANT_CONFIG: {name} {getattr(self, name)!r} is not a boolean")
        if self.bit_width != 8:
            raise QuantError(f"ILLEGAL_BITWIDTH: the DPU takes 8-bit tensors, not {self.bit_width}")
        if self.statistic is not None and self.statistic not in C.STATISTICS:
            raise QuantError(f"QUANT_CONFIG: unknown statistic {self.statistic!r}; use one of "
                             f"{', '.join(C.STATISTICS)}")
        if self.statistic == "modal" and self.method != "diffs":
            raise QuantError("QUANT_CONFIG: calib_statistic_method 'modal' is only valid with method 'diffs'")
        p = self.percentile
        if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)) or not np.isfinite(p) \
                or not 0 < p <= 100:
            raise QuantError(f"QUANT_CONFIG: percentile {p!r} is out of range; it must be in (0, 100]")
        for name, lo in (("batch_size", 1), ("calib_limit", 1), ("finetune_iters", 1), ("eltwise_spread", 0),
                         ("seed", 0), ("cle_steps", 1)):
            v = getattr(self, name)
            if v is None and name == "calib_limit":
                continue
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise QuantError(f"QUANT_CONFIG: {name} {v!r} is not an integer")
            if v < lo:
                raise QuantError(f"QUANT_CONFIG: {name} {v} is out of range; it must be >= {lo}")

    @property
    def wmethod(self) -> str:
        if self.weight_method:
            return self.weight_method
        return "maxmin" if self.method == "maxmin" else "diffs"


# --------------------------------------------------------------------------------------------------
# calibration data
# --------------------------------------------------------------------------------------------------

_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def _load_array(path: str, what: str = "calibration data") -> np.ndarray:
    """The array of an .npy file, or of an .npz ('x', 'input' or its only array); never unpickles.

    Errors name the file and say what it is instead (a directory, not an .npy file, Python objects...)."""
    if os.path.isdir(path):
        raise QuantError(f"{what} {path} is a directory, not a file")
    if not os.path.isfile(path):
        raise QuantError(f"{what} {path}: no such file")
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise QuantError(f"{what} {path}: cannot read it ({e.strerror or e})") from None
    is_npz = head[:4] == _ZIP_MAGIC
    if not is_npz and head != _NPY_MAGIC:
        raise QuantError(f"{what} {path}: not an .npy file (no NumPy header)"
                         + ("" if path.endswith(".npy") else "; give an .npy, an .npz or a folder of .npy files"))
    try:
        if is_npz:
            with np.load(path, allow_pickle=False) as z:
                keys = list(z.keys())
                key = "x" if "x" in keys else ("input" if "input" in keys else (keys[0] if len(keys) == 1 else None))
                if key is None:
                    raise QuantError(f"{what} {path}: an .npz needs an array named 'x' (has {keys})")
                return z[key]
        return np.load(path, allow_pickle=False)
    except QuantError:
        raise
    except ValueError as e:
        if "pickle" in str(e):
            raise QuantError(f"{what} {path}: holds Python objects (dtype object); give a numeric array") from None
        raise QuantError(f"{what} {path}: corrupt {'.npz' if is_npz else '.npy'} file "
                         f"({' '.join(str(e).split())[:160]})") from None
    except Exception as e:  # noqa: BLE001 - zip/format errors of a damaged file come in many types
        raise QuantError(f"{what} {path}: corrupt {'.npz' if is_npz else '.npy'} file ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:160]})") from None


def calib_arrays(calib, shape: list[int], limit: int | None = None, what: str = "calibration data",
                 check_values: bool = True) -> np.ndarray:
    """Calibration samples as one float32 [N, C, H, W] array (checked: shape, finite values and, with
    `check_values`, not constant: `check_calib_values`).

    `calib`: an array ([N,C,H,W] or one [C,H,W] sample), a .npy/.npz file, a folder of .npy files or an
    iterable of arrays. `what` names the data in errors ("calibration data", "evaluation data")."""
    items: list[tuple[str, np.ndarray]] = []
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
        raise QuantError(f"{what}: limit {limit!r} must be an integer >= 1")
    if isinstance(calib, (str, os.PathLike)):
        p = os.fspath(calib)
        if os.path.isdir(p):
            files = sorted(f for f in os.listdir(p) if f.endswith((".npy", ".npz")))
            if not files:
                raise QuantError(f"{what} folder {p} has no .npy or .npz files")
            items = [(os.path.join(p, f), _load_array(os.path.join(p, f), what)) for f in files]
        elif os.path.lexists(p):
            items = [(p, _load_array(p, what))]
        else:
            raise QuantError(f"{what} {p}: no such file or folder")
    elif isinstance(calib, np.ndarray):
        items = [("array", calib)]
    elif calib is None:
        raise QuantError(f"NO_CALIBRATION: no {what} given")
    else:
        try:
            items = [(f"item {i}", np.asarray(a)) for i, a in enumerate(calib)]
        except (TypeError, ValueError) as e:
            raise QuantError(f"{what} must be an array, a path or an iterable of arrays, not "
                             f"{type(calib).__name__} ({type(e).__name__})") from None
    want = [int(d) for d in shape[1:]]
    out = []
    for where, a in items:
        a = np.asarray(a)
        if a.dtype.kind not in "fiu":
            raise QuantError(f"{what} {where}: dtype {a.dtype} is not a real number type (give float32 values)")
        if list(a.shape) == want:
            a = a[None]
        if a.ndim != len(want) + 1 or list(a.shape[1:]) != want:
            raise QuantError(f"{what} {where}: shape {list(a.shape)} does not match the model input "
                             f"{[1] + want} (NCHW; give [N, {', '.join(map(str, want))}] or one sample)")
        with np.errstate(over="ignore", invalid="ignore"):
            a = a.astype(np.float32)
        bad = ~np.isfinite(a)
        if bad.any():
            i = int(np.argwhere(bad.reshape(a.shape[0], -1).any(axis=1))[0][0])
            raise QuantError(f"{what} {where}: sample {i} contains NaN or Inf, or a value beyond float32 "
                             f"(TENSOR_VALUE_INVALID)")
        out.append(a)
    x = np.concatenate(out, axis=0) if out else np.zeros([0] + want, np.float32)
    if x.shape[0] == 0:
        src = ", ".join(w for w, _ in items) if items and items[0][0] != "array" else ""
        raise QuantError(f"NO_CALIBRATION: the {what}{' ' + src if src else ''} is empty (0 samples)")
    x = x[:limit] if limit else x
    if check_values:
        check_calib_values(x, f"{what} {_data_name(calib)}")
    return x


def _data_name(data) -> str:
    return os.fspath(data) if isinstance(data, (str, os.PathLike)) else "array"


# ---- calibration data statistics (docs/quantizer.md "Calibration data checks") -------------------------------
CALIB_OUTLIER_FACTOR = 16       # a sample's max |x| >= 16x the median sample's: the others lose >= 4 of 8 bits
CALIB_CONSTANT_SHARE = 0.5      # at least half of the samples constant (blank, padded): a warning


def check_calib_values(x: np.ndarray, where: str) -> None:
    """QuantError when every value of the calibration data is the same (zero variance): the fix points would be
    those of one constant input, whatever the model later sees."""
    lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        raise QuantError(f"{where}: every value of the {len(x)} sample(s) is {lo:g} (zero variance); the fix points "
                         f"would describe one constant input, not real data: give representative inputs")


def calib_warnings(x: np.ndarray, where: str) -> list[str]:
    """What is legal but suspicious in calibration data `x` [N, ...] (checked by calib_arrays), one line each:
    all samples identical; at least CALIB_CONSTANT_SHARE of them constant; one sample's max |x| at least
    CALIB_OUTLIER_FACTOR times the median sample's; a spread below one step of the input's own 8-bit fix point
    (maxmin), so the DPU sees one constant input."""
    out: list[str] = []
    n = len(x)
    flat = x.reshape(n, -1)
    smin, smax = flat.min(axis=1), flat.max(axis=1)
    amax = np.maximum(np.abs(smin), np.abs(smax)).astype(np.float64)
    lo, hi = float(smin.min()), float(smax.max())
    if lo == hi:                     # refused by check_calib_values; nothing more to say
        return out
    if n >= 2 and smin.min() == smin.max() and smax.min() == smax.max() and bool(np.all(flat == flat[0])):
        out.append(f"{where}: the {n} samples are identical; calibration sees one input (give varied, representative "
                   f"inputs)")
    elif flat.shape[1] > 1:
        const = np.flatnonzero(smin == smax)
        if len(const) and len(const) >= CALIB_CONSTANT_SHARE * n:
            i = int(const[0])
            out.append(f"{where}: {len(const)} of {n} samples are constant images (sample {i}: every value is "
                       f"{float(smin[i]):g}); blank or padded inputs narrow the activation ranges")
    if n >= 3:
        med = float(np.median(amax))
        i = int(np.argmax(amax))
        if med > 0 and amax[i] >= CALIB_OUTLIER_FACTOR * med:
            bits = float(np.log2(amax[i] / med))
            out.append(f"{where}: sample {i} reaches |x| = {amax[i]:g}, {amax[i] / med:.0f}x the largest |x| of the "
                       f"median sample ({med:g}); the input's fix point follows it and the other samples keep about "
                       f"{max(0.0, 7 - bits):.0f} of its 7 magnitude bits (an outlier, or data in another scale?)")
    fp = C.maxmin_fix_point(max(abs(lo), abs(hi)))
    qlo, qhi = (int(v) for v in C.quantize(np.array([lo, hi]), fp))
    if qlo == qhi:
        out.append(f"{where}: the values {lo:.7g}..{hi:.7g} differ by less than one step (2^{-fp}) of the input's "
                   f"8-bit fix point {fp}: the DPU sees every sample as the same constant input {qlo}")
    return out


def eval_arrays(data, shape: list[int], labels=None, classes: int | None = None,
                what: str = "evaluation labels 'y'") -> tuple[np.ndarray, np.ndarray | None]:
    """Evaluation samples and optional labels, checked like calibration data but named "evaluation data".

    Meant to be called before calibration starts, so a bad evaluation set costs nothing. `labels`: one class
    index per sample (integers, or integral floats), or None; with `classes` (the model's, `output_classes`) each
    must be in 0..classes-1 (`check_labels`)."""
    x = calib_arrays(data, shape, what="evaluation data", check_values=False)
    if labels is None:
        return x, None
    y = np.asarray(labels)
    if y.dtype.kind not in "iuf" or y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise QuantError(f"evaluation labels 'y': dtype {y.dtype} is not class indices (integers)")
    y = y.reshape(-1) if y.ndim > 1 and y.size == len(x) else y
    if y.ndim != 1 or len(y) != len(x):
        raise QuantError(f"evaluation labels 'y': shape {list(y.shape)} for {len(x)} samples 'x' (give one class "
                         f"index per sample)")
    if y.dtype.kind == "f":
        if not np.all(y == np.round(y)):
            raise QuantError("evaluation labels 'y': non-integral values (give class indices)")
        y = y.astype(np.int64)
    if classes is not None:
        check_labels(y, classes, what)
    return x, y


def evaluation_metrics(fl: np.ndarray, qu: np.ndarray, y: np.ndarray | None = None) -> dict:
    """From the float and quantized first outputs of every sample: top-1 agreement, output SQNR, accuracies (y)."""
    fa, qa = fl.reshape(len(fl), -1).argmax(1), qu.reshape(len(qu), -1).argmax(1)
    err = fl.astype(np.float64) - qu
    rep = {"samples": int(len(fl)), "top1_agreement": float(np.mean(fa == qa)),
           "output_sqnr_db": float(10 * np.log10(np.mean(fl.astype(np.float64) ** 2) / max(np.mean(err ** 2), 1e-30)))}
    if y is not None:
        y = np.asarray(y).reshape(-1)
        check_labels(y, int(np.prod(fl.shape[1:])))
        rep["float_accuracy"] = float(np.mean(fa == y))
        rep["quant_accuracy"] = float(np.mean(qa == y))
    return rep


def check_labels(y: np.ndarray, classes: int, what: str = "evaluation labels 'y'") -> None:
    """Class indices `y` must lie in 0..classes-1 (the model's output gives `classes` scores): a label outside can
    never be predicted, so an accuracy over it is 0 % by construction. QuantError naming how many are outside,
    their range and the model's."""
    y = np.asarray(y).reshape(-1)
    bad = (y < 0) | (y >= classes)
    if bad.any():
        lo, hi = int(y[bad].min()), int(y[bad].max())
        raise QuantError(f"{what}: {int(bad.sum())} of {len(y)} labels are outside the model's {classes} classes "
                         f"0..{classes - 1} (found {lo if lo == hi else f'{lo}..{hi}'}); labels are class indices "
                         f"of the model's output")


def output_classes(model, input_shape=None) -> int | None:
    """The number of classes of a classifier: the size of its first output without the batch (shape inference at
    `input_shape`, NCHW), which is what argmax runs over; None when shape inference leaves it unknown. `model`:
    a path or an `onnx.ModelProto`."""
    m = load_onnx(model)
    src = os.fspath(model) if isinstance(model, (str, os.PathLike)) else "model"
    fg = to_fgraph(m, src, input_shape)
    shp = fg.shapes.get(fg.outputs[0])
    return int(np.prod(shp[1:])) if shp else None


# --------------------------------------------------------------------------------------------------
# fix-point constraints
# --------------------------------------------------------------------------------------------------

class _Groups:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, a: str) -> str:
        self.parent.setdefault(a, a)
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def solve_fix_points(prep: Prepared, raw: dict[str, int], w_fp: dict[str, int], cfg: QuantConfig,
                     fixed: dict[str, int] | None = None):
    """Apply the DPU's fix-point rules to the calibrated positions; returns (act_fp, adjustments).

    Shared positions: max-pool (and with cfg.align_pool avg-pool), upsample, reshape, slice and tile in/out; a
    concat and its producers (with cfg.align_concat all of them, else those read by nothing but the concat: the
    others keep their own position, the concat takes the minimum, within ELEW's 15 of each). An avg pool keeps
    its own output position, at most fp_in + M + 7 (its ALU exponent, §7.4).
    Lowered (never raised) so nothing overflows: conv shift_cut = fp_in + fp_w - fp_out ≥ 0 (spec §7.2);
    eltwise-add input spread ≤ cfg.eltwise_spread (§7.5); ELEW shift_write ≤ 15 (§7.5); hard-sigmoid output 7;
    prelu shifts fp_in - fp_out and s + fp_in - fp_out ≥ -PRELU_SHIFT_MAX (§7.7). The shift limits are
    compiler.fixpoint's (conv_fp_out_max, elew_fp_out_max)."""
    g = _Groups()
    q = {n.name: n for n in prep.nodes}

    def qins(n):
        return [i for i in n.inputs if i in raw and q[i].quantized]

    for n in prep.nodes:
        if n.name not in raw:
            continue
        g.find(n.name)
        if not n.quantized:
            continue
        if n.kind in ("upsample", "reshape", "slice", "tile") or (n.kind == "pool" and (
                n.attrs.get("type") == "MAX" or cfg.align_pool)):
            for i in qins(n):
                g.union(n.name, i)
    outs = set(prep.outputs)
    unaligned: dict[str, list[str]] = {}       # concat -> the producers that keep their own fix point
    for n in prep.nodes:                       # topological: a concat feeding only a concat joins it as well
        if n.kind != "concat" or n.name not in raw or not n.quantized:
            continue
        for i in qins(n):
            r = g.find(i)
            members = [m for m in raw if g.find(m) == r]
            alone = not cfg.align_concat and any(
                m in outs or any(c.name != n.name and g.find(c.name) != r for c in prep.consumers(m))
                for m in members)
            if alone:
                unaligned.setdefault(n.name, []).append(i)
            else:
                g.union(n.name, i)
    fp: dict[str, int] = {}
    for name, v in raw.items():
        r = g.find(name)
        fp[r] = min(fp.get(r, v), v)
    adjustments = []
    for name, v in raw.items():
        if fp[g.find(name)] != v:
            adjustments.append({"tensor": name, "from": v, "to": fp[g.find(name)], "rule": "shared fix point "
                                "(concat / pool / upsample / reshape / slice / tile alignment)"})

    def get(name):
        return fp[g.find(name)]

    def lower(name, v, rule):
        r = g.find(name)
        if fp[r] > v:
            adjustments.append({"tensor": name, "from": fp[r], "to": v, "rule": rule})
            fp[r] = v
            return True
        return False

    for _ in range(1000):
        changed = False
        for n in prep.nodes:
            if n.name not in raw or not n.quantized:
                continue
            if n.kind == "pool" and n.attrs.get("type") == "AVG" and n.inputs[0] in raw \
                    and g.find(n.name) != g.find(n.inputs[0]):
                m = avg_geometry(n)[3]      # ALU avg pool: y = s·N·2^(fp_out - fp_in - M), exponent <= 7 (§7.4)
                changed |= lower(n.name, get(n.inputs[0]) + m + F.POOL_EXP_MAX,
                                 f"avg-pool fp_out - fp_in - M must be <= {F.POOL_EXP_MAX} (ALU shift_cut)")
            for i in unaligned.get(n.name, ()):  # the concat takes the minimum; the rescale is an ELEW shift
                changed |= lower(n.name, get(i), "concat output fix point <= each input's (min)")
                changed |= lower(i, get(n.name) + F.ELEW_SHIFT_WRITE_MAX,
                                 f"concat input fix point within {F.ELEW_SHIFT_WRITE_MAX} of the output (ELEW)")
            if n.kind == "hsigmoid":        # at most 7 ([0, 1]); lower is fine (a larger shift_hsigmoid), so the
                changed |= lower(n.name, HSIG_OUT_FP, "hard-sigmoid output fix point <= 7")   # rule only lowers
            if n.kind in CONV_KINDS and n.inputs[0] in raw:
                changed |= lower(n.name, F.conv_fp_out_max(get(n.inputs[0]), w_fp[n.name]),
                                 "shift_cut = fp_in + fp_w - fp_out must be >= 0")
            if n.kind == "prelu" and n.inputs[0] in raw:
                changed |= lower(n.name, get(n.inputs[0]) + min(0, w_fp.get(n.name, 0)) + F.PRELU_SHIFT_MAX,
                                 f"prelu shifts fp_in - fp_out (+ s) >= -{F.PRELU_SHIFT_MAX} (ALU shift codes)")
            if n.kind == "eltwise" and n.attrs["type"] == "ADD" and len(n.inputs) > 1:
                m = min(get(i) for i in n.inputs)
                for i in n.inputs:
                    changed |= lower(i, m + cfg.eltwise_spread,
                                     f"eltwise-add inputs within {cfg.eltwise_spread} fix points (DPU ELEW)")
            if n.kind == "eltwise":
                ref = min(get(i) for i in n.inputs) if n.attrs["type"] == "ADD" else sum(get(i) for i in n.inputs)
                changed |= lower(n.name, F.elew_fp_out_max(ref), "eltwise shift_write within 15")
        if fixed:
            for name, v in fixed.items():
                if name in raw and get(name) > v:
                    changed |= lower(name, v, "quant_info")
        if not changed:
            break
    else:
        raise QuantError("fix-point constraints did not converge")
    return {name: get(name) for name in raw}, adjustments


# --------------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------------

@dataclass
class QuantResult:
    prep: Prepared
    qp: QParams
    config: QuantConfig
    target: Target | None
    placements: dict
    adjustments: list
    calib_samples: int
    timings: dict = field(default_factory=dict)
    observers: dict = field(default_factory=dict)
    model_name: str = "model"
    notes: list = field(default_factory=list)
    _sessions: dict = field(default_factory=dict, repr=False)
    cle: dict = field(default_factory=dict)      # cross-layer equalization: pairs, absorption (`_cle`)

    # ---- views --------------------------------------------------------------------------------
    def xmodel(self):
        from opendpu.quant.xir_out import build_xmodel
        return build_xmodel(self.prep, self.qp)

    def qdq_onnx(self):
        return emit_onnx(self.prep, "qdq", self.qp)

    def dpu_onnx(self, all_outputs: bool = False):
        return emit_onnx(self.prep, "dpu", self.qp, all_outputs=all_outputs)

    def float_onnx(self, all_outputs: bool = False):
        return emit_onnx(self.prep, "float", None, all_outputs=all_outputs)

    def _sess(self, mode: str):
        if mode not in self._sessions:
            m = self.float_onnx(True) if mode == "float" else self.dpu_onnx(True)
            self._sessions[mode] = session(m)
        return self._sessions[mode]

    def run(self, x: np.ndarray, mode: str = "dpu", names: list[str] | None = None) -> dict[str, np.ndarray]:
        """Values of QNodes (default: the outputs) on input x ([N,C,H,W] float), float or DPU fake-quant."""
        names = list(names or self.prep.outputs)
        s = self._sess(mode)
        inp = self.prep.input_nodes[0].name
        x = np.asarray(x, np.float32)
        ask = [n for n in names if not (n == inp and mode == "float")]
        outs = dict(zip(ask, s.run([value_name(self.prep, n, mode) for n in ask], {inp: x})))
        if len(ask) != len(names):
            outs[inp] = x
        return {n: outs[n] for n in names}

    def int_value(self, name: str, v: np.ndarray) -> np.ndarray:
        return C.quantize(v, self.qp.act_fp[name], 8, "half_up")

    def to_xir_layout(self, name: str, v: np.ndarray) -> np.ndarray:
        return v.transpose(0, 2, 3, 1) if v.ndim == 4 else v

    def golden(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Per-layer DPU results for one sample (int8, XIR layout; floats for float ops) from the fake-quant model."""
        q = {n.name: n.quantized for n in self.prep.nodes}
        names = [n.name for n in self.prep.nodes if n.name in self.qp.act_fp or not n.quantized]
        vals = self.run(x[:1], "dpu", names)
        out = {}
        for n in names:
            v = self.to_xir_layout(n, vals[n])
            out[n] = self.int_value(n, v) if q[n] else v.astype(np.float32)
        return out

    def quant_info(self) -> dict:
        tensors = {}
        for n in self.prep.nodes:
            if n.name in self.qp.act_fp:
                tensors[n.name] = {"kind": "input" if n.kind == "input" else "activation", "bit_width": 8,
                                   "fix_point": int(self.qp.act_fp[n.name]),
                                   "round_mode": "DPU_ROUND"}
            if n.name in self.qp.w_fp:
                tensors[n.name + "_weights"] = {"kind": "weights", "bit_width": 8,
                                                "fix_point": int(self.qp.w_fp[n.name]), "round_mode": "PY3_ROUND"}
            if n.name in self.qp.b_fp:                  # a PReLU's slopes have no bias
                tensors[n.name + "_bias"] = {"kind": "bias", "bit_width": 8,
                                             "fix_point": int(self.qp.b_fp[n.name]), "round_mode": "PY3_ROUND"}
        return {"format": "opendpu.quant_info/1", "model": self.model_name,
                "target": getattr(self.target, "name", None), "config": asdict(self.config),
                "calibration_samples": self.calib_samples, "tensors": tensors,
                "adjustments": self.adjustments}

    def layer_errors(self, x: np.ndarray) -> list[dict]:
        """Per-layer SQNR (dB) and max error (LSB) of the DPU fake-quant model against the float model."""
        names = [n.name for n in self.prep.nodes if n.kind != "input"]
        f = self.run(x, "float", names)
        q = self.run(x, "dpu", names)
        rows = []
        for n in self.prep.nodes:
            if n.kind == "input":
                continue
            a, b = f[n.name].astype(np.float64), q[n.name].astype(np.float64)
            err = a - b
            p_s, p_e = float(np.mean(a * a)), float(np.mean(err * err))
            sqnr = float("inf") if p_e == 0 else 10 * np.log10(max(p_s, 1e-30) / p_e)
            fp = self.qp.act_fp.get(n.name)
            rows.append({"layer": n.name, "kind": n.kind, "device": n.device, "inputs": list(n.inputs),
                         "fix_point": fp,
                         "weight_fix_point": self.qp.w_fp.get(n.name), "bias_fix_point": self.qp.b_fp.get(n.name),
                         "sqnr_db": round(sqnr, 2), "max_abs_err": float(np.max(np.abs(err))) if err.size else 0.0,
                         "max_err_lsb": (float(np.max(np.abs(err))) * 2.0 ** fp
                                         if fp is not None and err.size else None)})
        return rows

    def evaluate(self, x: np.ndarray, y: np.ndarray | None = None, batch: int = 64) -> dict:
        """Float vs quantized (DPU fake-quant) outputs on a dataset: top-1 agreement, accuracy if labels."""
        out = self.prep.outputs[0]
        fl, qu = ([self.run(x[i:i + batch], m, [out])[out] for i in range(0, len(x), batch)] for m in ("float", "dpu"))
        return evaluation_metrics(np.concatenate(fl), np.concatenate(qu), y)

    def coverage(self) -> dict | None:
        """DPU coverage (% of MACs and of ops) by the target's rules, as `opendpu inspect` and meta.json give it;
        None without a target."""
        if self.target is None:
            return None
        from opendpu.compiler.partition import coverage_of
        from opendpu.quant.inspect import op_descs
        return coverage_of((d, n.device, n.reason) for n, d in zip(self.prep.nodes, op_descs(self.prep))
                           if n.kind != "input")

    def _cle_lines(self) -> list[str]:
        c = self.cle
        if not self.config.cle:
            return ["", "cross-layer equalization: off (--no-cle)"]
        pairs = c.get("pairs", [])
        lines = ["", f"cross-layer equalization: {len(pairs)} pair(s), {c.get('steps')} steps"
                 + (", forced through ReLU6" if c.get("to_relu6") else "")
                 + "  (channel-range spread, log2 max/min: first layer, second layer; before -> after)"]
        for p in pairs:
            via = "+".join(p["via"]) or "identity"
            lines.append(f"  {p['first']} -> {p['second']} via {via}{'' if p['exact'] else ' (inexact)'}: "
                         f"{p['spread_first'][0]:.1f} -> {p['spread_first'][1]:.1f}, "
                         f"{p['spread_second'][0]:.1f} -> {p['spread_second'][1]:.1f}; "
                         f"s {p['scale_min']:.3g}..{p['scale_max']:.3g}")
        for o, v in c.get("float_change_sqnr_db", {}).items():
            lines.append(f"  forced CLE changed the float model: output {o} SQNR "
                         f"{'inf' if v is None else f'{v:.2f}'} dB against the original (calibration samples)")
        for b in c.get("bias_absorbed", []):
            lines.append(f"  bias absorbed: {b['first']} -> {b['second']}: {b['channels']} channel(s), "
                         f"up to {b['max_shift']:.3g}")
        return lines

    def report_text(self, rows: list[dict]) -> str:
        t = self.target
        cov = self.coverage()
        lines = []
        if cov is not None and t is not None:        # a coverage comes with a target
            from opendpu.compiler.partition import format_coverage, target_label
            lines.append(format_coverage(cov, target_label(t)))
        lines += [f"opendpu quantize report: {self.model_name}",
                 f"target: {getattr(t, 'name', 'none')}  method: {self.config.method}  weights: {self.config.wmethod}"
                 f"  calibration samples: {self.calib_samples}", ""]
        cpu = [n for n in self.prep.nodes if n.device == "CPU"]
        lines.append(f"ops: {len(self.prep.nodes)}  DPU: {len(self.prep.nodes) - len(cpu)}  CPU: {len(cpu)}")
        for n in cpu:
            lines.append(f"  CPU  {n.name} ({n.kind}): {n.reason}")
        for tag, what in (("REPLACE_SIGMOID", "sigmoid -> hard-sigmoid (--replace-sigmoid)"),
                          ("REPLACE_SILU", "SiLU -> hard-swish (--replace-silu)")):
            names = [m.split(": ")[1] for m in self.notes if f"[QUANTIZER_TORCH_{tag}]: " in m]
            if names:                   # approximations: their cost shows in the SQNR of these layers below
                lines.append(f"replaced {what}, an approximation (see their SQNR below): {len(names)} op(s): "
                             + ", ".join(names))
        if self.adjustments:
            lines.append("")
            lines.append("fix-point adjustments (DPU constraints):")
            for a in self.adjustments:
                lines.append(f"  {a['tensor']}: {a['from']} -> {a['to']}  ({a['rule']})")
        if self.notes:
            lines.append("")
            lines.extend(self.notes)
        lines += self._cle_lines()
        lines.append("")
        lines.append(f"{'layer':48s} {'kind':9s} {'dev':3s} {'fp':>3s} {'w_fp':>4s} {'b_fp':>4s} {'SQNR dB':>8s} "
                     f"{'max err LSB':>11s}")
        for r in rows:
            def f(v):
                return "-" if v is None else str(v)
            lsb = "-" if r["max_err_lsb"] is None else f"{r['max_err_lsb']:.2f}"
            lines.append(f"{r['layer'][:48]:48s} {r['kind']:9s} {r['device']:3s} {f(r['fix_point']):>3s} "
                         f"{f(r['weight_fix_point']):>4s} {f(r['bias_fix_point']):>4s} {r['sqnr_db']:8.2f} {lsb:>11s}")
        return "\n".join(lines) + "\n"

    def write(self, out_dir: str, calib_x: np.ndarray | None = None, golden_input: np.ndarray | None = None,
              evaluate: dict | None = None, force: bool = False, inputs=(),
              xmodel_format: str = "xir") -> dict[str, str]:
        """Write every output into out_dir by the shared output rule (compiler.outdir): a missing directory is
        created, an existing one must be empty or opendpu's own unless `force`; only opendpu's files are
        replaced, and nothing is left behind when writing fails. `xmodel_format`: "xir" (our *-fix form) or
        "vai_q" (float ops + fix ops, as AMD's quantizers write it; quant/vai_q_out.py)."""
        from opendpu.compiler.outdir import DirOutput
        if xmodel_format not in XMODEL_FORMATS:
            raise QuantError(f"xmodel format {xmodel_format!r}: use one of {', '.join(XMODEL_FORMATS)}")
        out = DirOutput(out_dir, force=force, inputs=inputs, net=dump_stem(self.model_name))
        with out as tmp:
            paths = self._write_into(tmp, calib_x, golden_input, evaluate, xmodel_format)
        return {k: os.path.join(out_dir, os.path.relpath(v, tmp)) for k, v in paths.items()}

    def _write_into(self, d: str, calib_x, golden_input, evaluate, xmodel_format: str = "xir") -> dict[str, str]:
        import onnx
        base = dump_stem(self.model_name)
        paths = {}
        g = self.xmodel()
        if xmodel_format == "vai_q":
            from opendpu.quant.vai_q_out import to_vai_q
            g = to_vai_q(g)
        paths["xmodel"] = os.path.join(d, f"{base}_int.xmodel")
        g.save(paths["xmodel"])
        paths["onnx"] = os.path.join(d, f"{base}_int.onnx")
        onnx.save(self.qdq_onnx(), paths["onnx"])
        paths["quant_info"] = os.path.join(d, "quant_info.json")
        with open(paths["quant_info"], "w") as f:
            json.dump(self.quant_info(), f, indent=1)
        gx = golden_input if golden_input is not None else calib_x
        if gx is not None:
            gd = os.path.join(d, "golden")
            os.makedirs(gd)
            gold = self.golden(np.asarray(gx, np.float32)[:1])
            inputs = {n.name for n in self.prep.input_nodes}
            for name, v in gold.items():
                suffix = "_aquant" if name in inputs else ("_int8" if v.dtype == np.int8 else "_float")
                stem = os.path.join(gd, dump_stem(name) + suffix)
                v = np.ascontiguousarray(v)
                v.tofile(stem + ".bin")
                np.savetxt(stem + ".txt", v.reshape(-1), fmt="%d" if v.dtype == np.int8 else "%.8g")
            paths["golden"] = gd
        rows = self.layer_errors(calib_x[: min(len(calib_x), 8)]) if calib_x is not None else []
        paths["report"] = os.path.join(d, "report.txt")
        with open(paths["report"], "w") as f:
            f.write(self.report_text(rows))
        rep = {"coverage": self.coverage(), "model": self.model_name, "target": getattr(self.target, "name", None),
               "config": asdict(self.config), "timings_s": self.timings, "layers": rows,
               "cpu_ops": [{"op": n.name, "kind": n.kind, "reason": n.reason} for n in self.prep.nodes
                           if n.device == "CPU"],
               "adjustments": self.adjustments, "notes": self.notes, "cle": self.cle}
        if evaluate:
            rep["evaluate"] = evaluate
        paths["report_json"] = os.path.join(d, "report.json")
        with open(paths["report_json"], "w") as f:
            json.dump(rep, f, indent=1)
        return paths


# --------------------------------------------------------------------------------------------------
# the flow
# --------------------------------------------------------------------------------------------------

def place_nodes(prep: Prepared, target) -> dict:
    """DPU/CPU placement of every op by the shared rule set (compiler.rules)."""
    if target is None:
        return {}
    from opendpu.quant.inspect import op_descs
    from opendpu.compiler.rules import place
    out = {}
    for n, d in zip(prep.nodes, op_descs(prep)):
        p = place(d, target)
        out[n.name] = p
        if n.kind != "float" and not n.cpu:
            n.device, n.reason = p.device, p.reason
            if p.device == "CPU" and n.kind not in ("input", "pad"):
                n.cpu = True
                prep.notes.append(f"[VAIQ_WARN][QUANTIZER_TORCH_FLOAT_OP]: {n.name} ({n.kind}) stays float on the "
                                  f"CPU: {p.reason}")
    return out


WEIGHT_FP_LIFT_MAX = 24          # a lifted weight fix point stays far inside shift_cut's 0..63 (spec §6.4)


def _lost_at(w: np.ndarray, fp: int, axis: int, rnd: str) -> tuple[int, int, float]:
    """(live output channels all zero at fix point fp, output channels, share of nonzero weights zero at fp)."""
    q = C.quantize(w, fp, 8, rnd)
    other = tuple(i for i in range(w.ndim) if i != axis)
    live = np.any(w != 0, axis=other)
    zero = ~np.any(q != 0, axis=other)
    nz = w != 0
    return int(np.sum(live & zero)), int(w.shape[axis]), float(np.sum(nz & (q == 0)) / max(1, int(np.sum(nz))))


def _weights(prep: Prepared, cfg: QuantConfig, qp: QParams) -> list[dict]:
    """Weight fix points: conv-like ops by cfg.wmethod; PReLU slopes by maxmin, uncapped (the largest fix point at
    which no slope clips: one shift serves every channel, a clipped slope errs on every negative value of its
    channel, and each further bit halves the slopes' rounding error; `_prelu_slopes` applies the ALU's limit).

    vai_q caps fix points at 12 (`max_fix_position`). Where that cap would zero a whole output channel that is not
    zero in float, or more than half of the layer's nonzero weights (tiny weights: a BatchNorm of huge running
    variance folded in, as in PP-OCRv4 det's head, docs/quantizer.md "Why PP-OCRv4 det collapses without CLE"), the
    layer takes its uncapped fix point instead, up to WEIGHT_FP_LIFT_MAX; the DPU's shifts allow it (shift_cut =
    fp_in + fp_w - fp_out <= 63; the bias fix point is moved into shift_bias's range as always). Returned as
    adjustments."""
    lifted = []
    for n in prep.nodes:
        if n.kind in CONV_KINDS and n.quantized and n.weight is not None:     # (conv-like ops have weights)
            fp = C.weight_fix_point(n.weight, method=cfg.wmethod, bit_width=8, round_mode=cfg.weight_round)
            if cfg.weight_fp_lift and fp == C.default_max_fix_point(8) and np.any(n.weight):
                raw = C.weight_fix_point(n.weight, method=cfg.wmethod, bit_width=8, round_mode=cfg.weight_round,
                                         max_fp=None)
                axis = 1 if n.kind == "tconv" else 0
                dead, total, share = _lost_at(n.weight, fp, axis, cfg.weight_round)
                if raw > fp and (dead or share > 0.5):
                    to = min(raw, WEIGHT_FP_LIFT_MAX)
                    left, _, share_to = _lost_at(n.weight, to, axis, cfg.weight_round)
                    lifted.append({"tensor": n.name + "_weights", "from": fp, "to": to,
                                   "rule": f"above vai_q's cap {fp}: at {fp}, {share:.0%} of the nonzero weights and "
                                           f"{dead} of {total} output channels would be zero ({share_to:.0%} and "
                                           f"{left} at {to})"})
                    fp = to
            qp.w_fp[n.name] = fp
        elif n.kind == "prelu" and n.quantized:
            qp.w_fp[n.name] = _prelu_fix_point(n, cfg)
    return lifted


def _prelu_fix_point(n, cfg: QuantConfig) -> int:      # a PReLU's slopes: maxmin, uncapped (see `_weights`)
    return C.weight_fix_point(n.weight, method="maxmin", bit_width=8, round_mode=cfg.weight_round, max_fp=None,
                              name=n.name + "_weights")


def _prelu_slopes(prep: Prepared, cfg: QuantConfig, qp: QParams, adjustments: list) -> None:
    """int8 PReLU slopes at their fix point s, lowered when the ALU's negative-branch shift s + fp_in - fp_out
    would exceed PRELU_SHIFT_MAX (spec §7.7)."""
    for n in prep.nodes:
        if n.kind != "prelu" or not n.quantized:
            continue
        s = qp.w_fp[n.name]
        hi = F.PRELU_SHIFT_MAX - (qp.act_fp[n.inputs[0]] - qp.act_fp[n.name])
        if s > hi:
            adjustments.append({"tensor": n.name + "_weights", "from": s, "to": hi,
                                "rule": f"prelu shift s + fp_in - fp_out <= {F.PRELU_SHIFT_MAX} (ALU shift_prelu_n)"})
            s = qp.w_fp[n.name] = hi
        qp.w_q[n.name] = C.quantize(n.weight, s, 8, cfg.weight_round)


def _recalibrate(res, x: np.ndarray, need: list[str], progress=None) -> None:
    """Calibrate the activations again on x with the current (tuned) float weights, as `quantize` does after the
    weights: fix points, rules, integer weights and biases, PReLU slopes; the weight fix points of the conv-like
    layers stay (the tuned weights are rounded on their grid, and a lifted cap stays lifted), a PReLU's is derived
    afresh. Replaces res.observers and res.adjustments (fast finetune's recalibration)."""
    prep, cfg, qp = res.prep, res.config, res.qp
    observers: dict = {}
    raw = _calibrate(prep, cfg, x, need, observers, progress)
    qp.w_fp.update({n.name: _prelu_fix_point(n, cfg) for n in prep.nodes if n.kind == "prelu" and n.quantized})
    lifted = [a for a in res.adjustments if a["tensor"].endswith("_weights") and a["rule"].startswith("above vai_q")]
    qp.act_fp, adjustments = solve_fix_points(prep, raw, qp.w_fp, cfg, fixed=None)
    quantize_conv_params(prep, cfg, qp, adjustments)
    _prelu_slopes(prep, cfg, qp, adjustments)
    _check_fp_range(prep, qp, observers)
    res.adjustments[:] = lifted + adjustments
    res.observers.clear()
    res.observers.update(observers)
    res._sessions.clear()


def quantize(model, calib, target=None, config: QuantConfig | None = None, quant_info: dict | str | None = None,
             example_input=None, input_shape=None, progress=None) -> QuantResult:
    """Quantize a float ONNX model (path or ModelProto) or a torch.nn.Module (with example_input)."""
    cfg = config or QuantConfig()
    cfg.validate()
    t0 = time.perf_counter()
    timings = {}
    if target is not None and not hasattr(target, "cp"):
        from opendpu.isa.target import TargetError, get_target
        try:
            target = get_target(target)
        except TargetError as e:
            raise QuantError(f"target: {e}") from None
    if any(c.__module__.startswith("torch") for c in type(model).__mro__):    # a torch.nn.Module (subclass)
        m = torch_to_onnx(model, example_input if example_input is not None else
                          np.zeros(input_shape or (1, 3, 224, 224), np.float32))
        source = type(model).__name__
    else:
        m = load_onnx(model)
        source = os.fspath(model) if isinstance(model, (str, os.PathLike)) else (m.graph.name or "model")
    fg = to_fgraph(m, source, input_shape)
    prep = prepare(fg, cfg)
    if len(prep.input_nodes) != 1:
        raise QuantError(f"{source}: models with {len(prep.input_nodes)} inputs are not supported (one input)")
    inp = prep.input_nodes[0]
    qi = _load_quant_info(quant_info, prep) if quant_info is not None else None   # inputs checked before any work
    if qi is not None:
        _check_quant_info_cle(qi, cfg)
    x = calib_arrays(calib, inp.shape, cfg.calib_limit, check_values=qi is None)   # calibrated on: not constant
    placements = place_nodes(prep, target)
    timings["prepare"] = time.perf_counter() - t0
    cle_info = _cle(prep, cfg, x) if cfg.cle else {}
    timings["cle"] = time.perf_counter() - t0 - timings["prepare"]
    qp = QParams()
    t1 = time.perf_counter()
    if cfg.bias_corr:
        from opendpu.quant.finetune import bias_correction
        bias_correction(prep, cfg, x)
    lifted = _weights(prep, cfg, qp)
    timings["weights"] = time.perf_counter() - t1
    # which tensors get a fix point: every quantized op, the input, and float ops feeding quantized ops
    need = []
    for n in prep.nodes:
        if not n.quantized:
            if any(c.quantized for c in prep.consumers(n.name)):
                need.append(n.name)
        elif n.kind != "pad":
            need.append(n.name)
    t2 = time.perf_counter()
    observers: dict[str, C.Observer] = {}
    if qi is None:
        raw = _calibrate(prep, cfg, x, need, observers, progress)
    else:
        raw = qi["act"]
        for n, v in qi["w"].items():
            qp.w_fp[n] = v
    timings["calibrate"] = time.perf_counter() - t2
    adjustments: list = list(lifted) if qi is None else []     # quant_info's weight fix points replace them
    qp.act_fp, adj = solve_fix_points(prep, raw, qp.w_fp, cfg, fixed=None)
    adjustments += adj
    quantize_conv_params(prep, cfg, qp, adjustments)
    _prelu_slopes(prep, cfg, qp, adjustments)
    _check_fp_range(prep, qp, observers)
    if qi is not None:
        for n, v in qi["b"].items():
            qp.b_fp[n] = v
            qp.b_q[n] = C.quantize(prep.node(n).bias, v, 8, cfg.weight_round)
    res = QuantResult(prep, qp, cfg, target, placements, adjustments, int(len(x)), timings, observers,
                      _model_name(m, source), list(prep.notes))
    res.cle = cle_info
    if cfg.fast_finetune:
        t3 = time.perf_counter()
        from opendpu.quant.finetune import fast_finetune
        fast_finetune(res, x, recalibrate=(lambda r: _recalibrate(r, x, need, progress)) if qi is None
                      else None)                                      # recalibrates unless quant_info fixed them
        timings["fast_finetune"] = time.perf_counter() - t3
    timings["total"] = time.perf_counter() - t0
    return res


CLE_CHECK_SAMPLES = 8  # calibration samples on which a forced (inexact) CLE's change of the float model is measured


def _float_outputs(prep: Prepared, x: np.ndarray, names: list[str], batch: int) -> dict[str, list[np.ndarray]]:
    sess = session(emit_onnx(prep, "float", None, all_outputs=True))
    inp = prep.input_nodes[0].name
    out: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for b in range(0, len(x), batch):
        for n, v in zip(names, sess.run([value_name(prep, n, "float") for n in names], {inp: x[b:b + batch]})):
            out[n].append(v)
    return out


def _cle(prep: Prepared, cfg: QuantConfig, x: np.ndarray) -> dict:
    """Cross-layer equalization of the prepared float graph (quant/cle.py) before weights and calibration; returns
    the record for quant_info / the report: every pair, and for a forced (inexact, ReLU6) CLE the float model's
    output SQNR after CLE against before on the first CLE_CHECK_SAMPLES calibration samples."""
    from opendpu.quant import cle
    pairs = cle.find_pairs(prep, cfg.cle_to_relu6)
    inexact = any(not p.exact for p in pairs)
    xs = x[:CLE_CHECK_SAMPLES]
    before = _float_outputs(prep, xs, prep.outputs, cfg.batch_size) if inexact else None
    recs = cle.equalize(prep, cfg.cle_steps, cfg.cle_to_relu6)
    info: dict = {"steps": cfg.cle_steps, "to_relu6": cfg.cle_to_relu6, "pairs": recs}
    if before is not None:
        after = _float_outputs(prep, xs, prep.outputs, cfg.batch_size)
        info["float_change_sqnr_db"] = {}
        for o in prep.outputs:
            a, b = np.concatenate(before[o]).astype(np.float64), np.concatenate(after[o]).astype(np.float64)
            pe = float(np.mean((a - b) ** 2))
            info["float_change_sqnr_db"][o] = None if pe == 0 else \
                round(float(10 * np.log10(max(float(np.mean(a * a)), 1e-30) / pe)), 2)   # None: unchanged
    if cfg.cle_bias_absorb:
        cands = cle.absorb_candidates(prep, recs)
        if cands:
            vals = _float_outputs(prep, x, [n1.name for n1, _ in cands], cfg.batch_size)
            mins = {n: np.min(np.concatenate(v), axis=(0, 2, 3)) for n, v in vals.items()}
            info["bias_absorbed"] = cle.absorb_bias(cands, mins)
        else:
            info["bias_absorbed"] = []
    return info


FP_LIMIT = 64          # XIR's fix_point range (-64..64, the xmodel writer's check)


def _check_fp_range(prep: Prepared, qp: QParams, observers: dict) -> None:
    """A float range no 8-bit fix point covers (|x| ~ 2^70) is refused here, naming the tensor, instead of
    failing later on a derived constant."""
    for kind, table in (("activation", qp.act_fp), ("weight", qp.w_fp), ("bias", qp.b_fp)):
        for name, v in table.items():
            if not -FP_LIMIT <= v <= FP_LIMIT:
                o = observers.get(name)
                rng = f" (|values| up to {o.absmax:.3g})" if o is not None and o.batches else ""
                raise QuantError(f"TENSOR_VALUE_INVALID: {kind} tensor {name!r}{rng} needs fix point {v}, outside "
                                 f"-{FP_LIMIT}..{FP_LIMIT}: its range cannot be quantized to 8 bits")


def output_names(source: str) -> list[str]:
    """The files `QuantResult.write` writes for the model file `source` whatever the data (golden/ holds one file
    per tensor, whose names depend on the graph: "golden/" stands for that directory, where every existing file must
    be opendpu's): known before any work, so the CLI checks them first."""
    m = None
    if not (isinstance(source, str) and source.endswith(".onnx")):
        m = load_onnx(source)
    base = dump_stem(_model_name(m, source))
    return [f"{base}_int.xmodel", f"{base}_int.onnx", "quant_info.json", "report.txt", "report.json", "golden/"]


def _model_name(m, source: str) -> str:
    if isinstance(source, str) and source.endswith(".onnx"):
        return os.path.splitext(os.path.basename(source))[0]
    return m.graph.name or "model"


def _calibrate(prep: Prepared, cfg: QuantConfig, x: np.ndarray, need: list[str], observers: dict, progress) -> dict:
    kw = {"bit_width": 8, "round_mode": cfg.act_round, "percentile": cfg.percentile}
    if cfg.statistic:
        kw["statistic"] = cfg.statistic
    for name in need:
        if prep.node(name).kind == "hsigmoid" and prep.node(name).quantized:
            continue
        observers[name] = C.make_observer(name, cfg.method, **kw)
    sess = session(emit_onnx(prep, "float", None, all_outputs=True))
    inp = prep.input_nodes[0].name
    names = [n for n in observers if n != inp]
    onames = [value_name(prep, n, "float") for n in names]
    nb = (len(x) + cfg.batch_size - 1) // cfg.batch_size
    for b in range(nb):
        xb = x[b * cfg.batch_size:(b + 1) * cfg.batch_size]
        vals = sess.run(onames, {inp: xb})
        for n, v in zip([inp] + names, [xb] + vals):
            try:
                observers[n].update(v)
            except C.CalibError as e:
                raise QuantError(f"calibration batch {b}: {e}") from None
        if progress:
            progress(b + 1, nb)
    raw = {n: int(o.fix_point()) for n, o in observers.items()}
    for name in need:
        if name not in raw:
            raw[name] = HSIG_OUT_FP
    return raw


def _load_quant_info(qi, prep: Prepared) -> dict:
    src = "quant_info"
    if isinstance(qi, (str, os.PathLike)):
        src = os.fspath(qi)
        if os.path.isdir(src):
            raise QuantError(f"quant_info {src} is a directory, not a file")
        try:
            with open(src) as f:
                text = f.read()
            check_depth(text, f"quant_info {src}", QuantError)
            qi = json.loads(text)
        except QuantError:
            raise
        except FileNotFoundError:
            raise QuantError(f"quant_info {src}: no such file") from None
        except OSError as e:
            raise QuantError(f"cannot read quant_info {src}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise QuantError(f"quant_info {src}: not a JSON file (not UTF-8 text)") from None
        except ValueError as e:
            raise QuantError(f"quant_info {src}: not valid JSON ({' '.join(str(e).split())[:120]})") from None
        except RecursionError:
            raise QuantError(f"quant_info {src}: JSON nested too deeply") from None
    tensors = qi.get("tensors") if isinstance(qi, dict) else None
    if not isinstance(tensors, dict):
        raise QuantError(f"{src}: no 'tensors' table")
    act, w, b = {}, {}, {}
    names = {n.name for n in prep.nodes}
    for k, v in tensors.items():
        fp = v.get("fix_point") if isinstance(v, dict) else None
        if isinstance(fp, bool) or not isinstance(fp, int):
            raise QuantError(f"{src}: tensor {k!r} has no integer fix_point")
        if not -64 <= fp <= 64:
            raise QuantError(f"{src}: tensor {k!r}: fix_point {fp} is out of range -64..64")
        kind = v.get("kind")
        if kind == "weights":
            w[k[: -len("_weights")]] = fp
        elif kind == "bias":
            b[k[: -len("_bias")]] = fp
        else:
            act[k] = fp
    missing = [n.name for n in prep.nodes if n.kind in CONV_KINDS and n.quantized and n.name not in w] + \
              [n for n in names if n not in act and prep.node(n).quantized and prep.node(n).kind != "pad"]
    unknown = [k for k in list(act) + list(w) + list(b) if k not in names]
    if missing or unknown:
        raise QuantError(f"CALIB_RESULT_MISMATCH: {src} does not match the model: missing "
                         f"{missing[:5]}{'…' if len(missing) > 5 else ''}, unknown {unknown[:5]}")
    conf = qi.get("config")
    return {"act": act, "w": w, "b": b, "config": conf if isinstance(conf, dict) else None, "src": src}


def _check_quant_info_cle(qi: dict, cfg: QuantConfig) -> None:
    """The weights a quant_info's fix points were chosen for depend on CLE: a file made with other CLE settings (one
    from before CLE existed records none: no CLE) would clip or waste weight bits, so it is refused naming the
    option. A quant_info without a config table (written by hand) is not checked."""
    conf = qi.get("config")
    if conf is None:
        return
    was = {"cle": bool(conf.get("cle", False)), "cle_steps": conf.get("cle_steps", cfg.cle_steps),
           "cle_to_relu6": bool(conf.get("cle_to_relu6", False)), "cle_bias_absorb": bool(conf.get("cle_bias_absorb",
                                                                                                    False))}
    now = {"cle": cfg.cle, "cle_steps": cfg.cle_steps, "cle_to_relu6": cfg.cle_to_relu6,
           "cle_bias_absorb": cfg.cle_bias_absorb}
    if not was["cle"] and not now["cle"]:
        return
    diff = [k for k in was if was[k] != now[k]]
    if diff:
        k = diff[0]
        hint = " (give --no-cle)" if k == "cle" and not was["cle"] else ""
        raise QuantError(f"CALIB_RESULT_MISMATCH: {qi['src']} was made with {k}={was[k]!r}, this run has "
                         f"{k}={now[k]!r}{hint}: cross-layer equalization changes the weights its fix points are for")
