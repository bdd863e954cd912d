"""Float (CPU) XIR ops for the reference executor.

The INT8 quantizer keeps the ops the DPU cannot run as FLOAT XIR ops (as vai_q does with a
target); this module evaluates them.  Every handler takes float inputs (integer arrays are accepted
and converted), computes in float64 and returns float32.

Layouts and attributes are XIR's (spec dpuczdx8g-isa1.md §7.9): feature maps NHWC, conv weights
OHWI, depthwise weights [multiplier, kh, kw, C] (output channel c*multiplier + m uses
weights[m, :, :, c]), bias 1-D; ``kernel``/``stride``/``dilation`` are [w, h], ``pad`` is
[left, right, top, bottom]; output sizes come from the output tensor shape (ceil mode, output
padding and SAME padding follow from it).  Transposed convs insert stride-1 zeros, pad
d*(k-1)-pad per side and run a stride-1 conv with the same, unflipped OHWI weights.

Registered op types: conv2d, depthwise-conv2d, transposed-conv2d, transposed-depthwise-conv2d
(alias depthwise-transposed-conv2d), maxpool2d, avgpool2d, pool (attr ``type`` MAX/AVG), add,
sub, mul, div, concat, upsample, resize, hard-sigmoid, hard-swish, prelu, tanh, exp, clamp, and onnx-op (an
ONNX node kept as it is by the quantizer, run by onnx's reference evaluator).

avgpool2d divisor (as VART's cpu-runner): ``count_include_pad`` (default true) counts the
attribute padding; ``count_include_invalid`` (default true, XIR's default) also counts window
positions past the padded input (ceil mode), i.e. the full kernel area.  ONNX / PyTorch
``ceil_mode`` with ``count_include_pad=1`` corresponds to ``count_include_invalid=False``.
With ``count_include_pad`` false the divisor is the number of real input elements in the window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._common import (
    RefError,  # noqa: F401  (re-exported for callers of this module)
    _Ctx,
    _conv_acc_chunks,
    _conv_geometry,
    _dw_acc_rows,
    _fit_window,
    _register,
    _transpose_input,
)

__all__ = ["FLOAT_OPS"]

# bytes of float64 scratch a depthwise chunk may use
_CHUNK_BYTES = 1 << 25


# --------------------------------------------------------------------------------------------------
# input helpers
# --------------------------------------------------------------------------------------------------

def _fin(ctx: _Ctx, i: int, what: str = "input") -> np.ndarray:
    """Input i as a float64 array; rejects bool / complex / non-numeric data."""
    a = ctx.inputs[i]
    if a is None:
        raise ctx.error(f"{what} (input {i}) is missing")
    a = np.asarray(a)
    if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.floating)
                                   or np.issubdtype(a.dtype, np.integer)):
        raise ctx.error(f"{what} (input {i}) has unsupported dtype {a.dtype}")
    return a.astype(np.float64)


def _need_4d(ctx: _Ctx, a: np.ndarray, what: str) -> None:
    if a.ndim != 4:
        raise ctx.error(f"{what} must be 4-D, got shape {list(a.shape)}")


def _out_4d(ctx: _Ctx) -> tuple[int, int, int, int]:
    if len(ctx.out_shape) != 4:
        raise ctx.error(f"output must be 4-D (NHWC), got {list(ctx.out_shape)}")
    return tuple(ctx.out_shape)


def _f32(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(a, dtype=np.float64).astype(np.float32)


# --------------------------------------------------------------------------------------------------
# activations
# --------------------------------------------------------------------------------------------------

def _hsigmoid(x: np.ndarray) -> np.ndarray:
    return np.clip(x + 3.0, 0.0, 6.0) / 6.0


_NONLINEARS = ("NONE", "RELU", "RELU6", "LEAKYRELU", "HSIGMOID", "HSWISH")


def _nonlinear(ctx: _Ctx) -> str:
    nl = str(ctx.attrs.get("nonlinear", "NONE") or "NONE").upper()
    nl = {"LEAKY-RELU": "LEAKYRELU", "HARD-SIGMOID": "HSIGMOID", "HARD-SWISH": "HSWISH"}.get(nl, nl)
    if nl not in _NONLINEARS:
        raise ctx.error(f"nonlinear '{nl}' is not supported for float ops "
                        f"({', '.join(_NONLINEARS)})")
    return nl


def _activate(ctx: _Ctx, v: np.ndarray, nl: str) -> np.ndarray:
    if nl == "NONE":
        return v
    if nl == "RELU":
        return np.maximum(v, 0.0)
    if nl == "RELU6":
        return np.clip(v, 0.0, 6.0)
    if nl == "LEAKYRELU":
        a = ctx.attrs.get("LEAKYRELU_alpha", None)
        try:
            a = 26 / 256 if a is None else float(a)
        except (TypeError, ValueError):
            raise ctx.error(f"LEAKYRELU_alpha must be a number, got {a!r}") from None
        return np.where(v < 0, v * a, v)
    if nl == "HSIGMOID":
        return _hsigmoid(v)
    if nl == "HSWISH":
        return v * _hsigmoid(v)
    raise ctx.error(f"nonlinear '{nl}' is not supported")   # pragma: no cover - _nonlinear guards


# --------------------------------------------------------------------------------------------------
# convolutions
# --------------------------------------------------------------------------------------------------

def _conv_inputs(ctx: _Ctx):
    ctx.need_inputs(2, 3)
    x = _fin(ctx, 0, "input")
    w = _fin(ctx, 1, "weights")
    _need_4d(ctx, x, "input (NHWC)")
    _need_4d(ctx, w, "weights")
    _out_4d(ctx)
    b = None
    if len(ctx.inputs) == 3 and ctx.inputs[2] is not None:
        b = _fin(ctx, 2, "bias").reshape(-1)
    return x, w, b


def _check_bias(ctx: _Ctx, b, n_out: int):
    if b is not None and b.size != n_out:
        raise ctx.error(f"bias has {b.size} values, expected {n_out}")


def _check_out(ctx: _Ctx, N: int, O: int, what: str):
    on, oh, ow, oc = ctx.out_shape
    if on != N or oc != O:
        raise ctx.error(f"output shape {list(ctx.out_shape)} does not match batch {N} / "
                        f"{O} output channels ({what})")
    return oh, ow


def _conv_float(ctx: _Ctx, transposed: bool) -> np.ndarray:
    x, w, b = _conv_inputs(ctx)
    N, H, W, C = x.shape
    O, kh, kw, Ig = w.shape
    groups = ctx.int_attr("group", 1)
    if groups < 1:
        raise ctx.error(f"bad group {groups}")
    if C != Ig * groups or O % groups:
        raise ctx.error(f"channels do not match: input C={C}, weights {list(w.shape)} (OHWI), "
                        f"group={groups}")
    _check_bias(ctx, b, O)
    nl = _nonlinear(ctx)
    strides, dils, pads = _conv_geometry(ctx, (H, W), (kh, kw), transposed)
    if transposed:
        x, strides, pads = _transpose_input(ctx, x, (kh, kw), strides, dils, pads)
    oh, ow = _check_out(ctx, N, O, f"weights {list(w.shape)}")
    out = np.empty((N, oh, ow, O), dtype=np.float32)
    for n, r0, r1, acc in _conv_acc_chunks(ctx, x, w, groups, (oh, ow), strides, dils, pads, exact=False):
        if b is not None:
            acc = acc + b
        out[n, r0:r1] = _f32(_activate(ctx, acc, nl))
    return out


def _dwconv_float(ctx: _Ctx, transposed: bool) -> np.ndarray:
    x, w, b = _conv_inputs(ctx)
    N, H, W, C = x.shape
    M, kh, kw, Cw = w.shape
    if Cw != C:
        raise ctx.error(f"channels do not match: input C={C}, depthwise weights {list(w.shape)} "
                        f"([multiplier, kh, kw, C])")
    _check_bias(ctx, b, C * M)
    nl = _nonlinear(ctx)
    strides, dils, pads = _conv_geometry(ctx, (H, W), (kh, kw), transposed)
    if transposed:
        x, strides, pads = _transpose_input(ctx, x, (kh, kw), strides, dils, pads)
    oh, ow = _check_out(ctx, N, C * M, f"depthwise weights {list(w.shape)}")
    xp = _fit_window(ctx, x, (oh, ow), (kh, kw), strides, dils, pads, 0.0)
    out = np.empty((N, oh, ow, C * M), dtype=np.float32)
    rows = max(1, _CHUNK_BYTES // (8 * 2 * max(1, N * ow * C * M)))
    for r0 in range(0, oh, rows):
        r1 = min(oh, r0 + rows)
        acc = _dw_acc_rows(xp, w, r0, r1, ow, strides, dils, dtype=np.float64)
        if b is not None:
            acc = acc + b
        out[:, r0:r1] = _f32(_activate(ctx, acc, nl))
    return out


@_register("conv2d")
def _op_conv2d(ctx: _Ctx) -> np.ndarray:
    return _conv_float(ctx, transposed=False)


@_register("transposed-conv2d")
def _op_tconv2d(ctx: _Ctx) -> np.ndarray:
    return _conv_float(ctx, transposed=True)


@_register("depthwise-conv2d")
def _op_dwconv2d(ctx: _Ctx) -> np.ndarray:
    return _dwconv_float(ctx, transposed=False)


@_register("transposed-depthwise-conv2d", "depthwise-transposed-conv2d")
def _op_tdwconv2d(ctx: _Ctx) -> np.ndarray:
    return _dwconv_float(ctx, transposed=True)


# --------------------------------------------------------------------------------------------------
# pooling
# --------------------------------------------------------------------------------------------------

def _pool_geometry(ctx: _Ctx, H: int, W: int, oh: int, ow: int):
    """(kh, kw), (sh, sw), (top, bottom, left, right)."""
    if ctx.bool_attr("global", False):
        return (H, W), (1, 1), (0, 0, 0, 0)
    kw, kh = ctx.ints("kernel", None, 2)
    sw, sh = ctx.ints("stride", [kw, kh], 2)
    if min(kh, kw, sh, sw) < 1:
        raise ctx.error(f"kernel {[kw, kh]} and stride {[sw, sh]} must be >= 1")
    dil = ctx.attrs.get("dilation", None)
    if dil is not None and ctx.ints("dilation", None, 2) != [1, 1]:
        raise ctx.error(f"dilation {list(dil)} is not supported for pooling")
    if "pad" in ctx.attrs:
        pl, pr, pt, pb = ctx.ints("pad", None, 4)
    elif str(ctx.attrs.get("pad_mode", "FLOOR")).upper() == "SAME":
        th = max((oh - 1) * sh + kh - H, 0)
        tw = max((ow - 1) * sw + kw - W, 0)
        pt, pb, pl, pr = th // 2, th - th // 2, tw // 2, tw - tw // 2
    else:
        pl = pr = pt = pb = 0
    if min(pl, pr, pt, pb) < 0:
        raise ctx.error(f"negative pad {[pl, pr, pt, pb]}")
    return (kh, kw), (sh, sw), (pt, pb, pl, pr)


def _window_count(n_out: int, k: int, s: int, lo: int, hi: int, top: int) -> np.ndarray:
    """Per output index: how many of the k window positions (starting at o*s - top, input
    coordinates) fall inside [lo, hi)."""
    start = np.arange(n_out) * s - top
    return np.clip(np.minimum(start + k, hi) - np.maximum(start, lo), 0, None).astype(np.float64)


def _pool_float(ctx: _Ctx, typ: str) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = _fin(ctx, 0, "input")
    _need_4d(ctx, x, "input (NHWC)")
    N, H, W, C = x.shape
    on, oh, ow, oc = _out_4d(ctx)
    if on != N or oc != C:
        raise ctx.error(f"output shape {list(ctx.out_shape)} does not match input {list(x.shape)}")
    (kh, kw), (sh, sw), (pt, pb, pl, pr) = _pool_geometry(ctx, H, W, oh, ow)
    if typ == "MAX":
        xp = _fit_window(ctx, x, (oh, ow), (kh, kw), (sh, sw), (1, 1), (pt, pb, pl, pr), -np.inf)
    else:
        xp = _fit_window(ctx, x, (oh, ow), (kh, kw), (sh, sw), (1, 1), (pt, pb, pl, pr), 0.0)
    acc: Any = None                             # the first window's copy, then the running max / sum
    for ky in range(kh):
        for kx in range(kw):
            sl = xp[:, ky:ky + (oh - 1) * sh + 1:sh, kx:kx + (ow - 1) * sw + 1:sw, :]
            if acc is None:
                acc = sl.copy()
            elif typ == "MAX":
                np.maximum(acc, sl, out=acc)
            else:
                acc += sl
    if typ == "MAX":
        return _f32(acc)
    if ctx.bool_attr("count_include_pad", True):
        if ctx.bool_attr("count_include_invalid", True):
            div_y = np.full(oh, float(kh))
            div_x = np.full(ow, float(kw))
        else:                                   # clip the window to the padded input
            div_y = _window_count(oh, kh, sh, -pt, H + pb, pt)
            div_x = _window_count(ow, kw, sw, -pl, W + pr, pl)
    else:                                       # count real input elements only
        div_y = _window_count(oh, kh, sh, 0, H, pt)
        div_x = _window_count(ow, kw, sw, 0, W, pl)
    div = div_y[:, None] * div_x[None, :]
    if np.any(div <= 0):
        raise ctx.error("a pooling window holds no element to average (padding too large)")
    return _f32(acc / div[None, :, :, None])


@_register("maxpool2d")
def _op_maxpool2d(ctx: _Ctx) -> np.ndarray:
    return _pool_float(ctx, "MAX")


@_register("avgpool2d")
def _op_avgpool2d(ctx: _Ctx) -> np.ndarray:
    return _pool_float(ctx, "AVG")


@_register("pool")
def _op_pool(ctx: _Ctx) -> np.ndarray:
    typ = ctx.str_attr("type", "MAX").upper()
    if typ in ("AVE", "AVERAGE", "MEAN"):
        typ = "AVG"
    if typ not in ("MAX", "AVG"):
        raise ctx.error(f"pool type '{typ}' is not supported (MAX, AVG)")
    return _pool_float(ctx, typ)


# --------------------------------------------------------------------------------------------------
# elementwise
# --------------------------------------------------------------------------------------------------

def _broadcast(ctx: _Ctx, xs: list[np.ndarray]) -> list[np.ndarray]:
    try:
        return list(np.broadcast_arrays(*xs))
    except ValueError:
        raise ctx.error(f"input shapes {[list(x.shape) for x in xs]} do not broadcast") from None


def _nary(ctx: _Ctx, fn, lo: int, hi: int | None) -> np.ndarray:
    ctx.need_inputs(lo, hi)
    xs = _broadcast(ctx, [_fin(ctx, i) for i in range(len(ctx.inputs))])
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        acc = xs[0].copy()
        for x in xs[1:]:
            acc = fn(acc, x)
    return _f32(acc)


@_register("add")
def _op_add(ctx: _Ctx) -> np.ndarray:
    return _nary(ctx, np.add, 1, None)


@_register("mul")
def _op_mul(ctx: _Ctx) -> np.ndarray:
    return _nary(ctx, np.multiply, 1, None)


@_register("sub")
def _op_sub(ctx: _Ctx) -> np.ndarray:
    return _nary(ctx, np.subtract, 2, 2)


@_register("div")
def _op_div(ctx: _Ctx) -> np.ndarray:
    return _nary(ctx, np.divide, 2, 2)


def _unary(ctx: _Ctx, fn) -> np.ndarray:
    ctx.need_inputs(1, 1)
    x = _fin(ctx, 0)
    with np.errstate(over="ignore", invalid="ignore"):
        return _f32(fn(x))


@_register("hard-sigmoid")
def _op_hard_sigmoid(ctx: _Ctx) -> np.ndarray:
    return _unary(ctx, _hsigmoid)


@_register("hard-swish")
def _op_hard_swish(ctx: _Ctx) -> np.ndarray:
    return _unary(ctx, lambda x: x * _hsigmoid(x))


@_register("prelu")
def _op_prelu(ctx: _Ctx) -> np.ndarray:
    """XIR prelu: x < 0 ? x·weight[c] : x, with weight one value per channel (the last, NHWC axis) or one shared."""
    ctx.need_inputs(2, 2)
    x, w = _fin(ctx, 0), _fin(ctx, 1, "weight").reshape(-1)
    c = x.shape[-1] if x.ndim else 1
    if w.size not in (1, c):
        raise ctx.error(f"weight of {w.size} values for {c} channels (one per channel or one shared)")
    return _f32(np.where(x < 0, x * (w if w.size == 1 else w.reshape((1,) * (x.ndim - 1) + (c,))), x))


@_register("tanh")
def _op_tanh(ctx: _Ctx) -> np.ndarray:
    return _unary(ctx, np.tanh)


@_register("exp")
def _op_exp(ctx: _Ctx) -> np.ndarray:
    return _unary(ctx, np.exp)


def _float_attr(ctx: _Ctx, key: str, default):
    v = ctx.attrs.get(key, default)
    if v is not None and not np.isscalar(v):
        v = list(v)
        if len(v) != 1:
            raise ctx.error(f"attribute '{key}' must be a number, got {v!r}")
        v = v[0]
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        raise ctx.error(f"attribute '{key}' must be a number, got {v!r}") from None


@_register("clamp")
def _op_clamp(ctx: _Ctx) -> np.ndarray:
    lo = _float_attr(ctx, "min", None)
    hi = _float_attr(ctx, "max", None)
    if lo is None and hi is None:
        raise ctx.error("needs attribute 'min' and/or 'max'")
    if lo is not None and hi is not None and lo > hi:
        raise ctx.error(f"min {lo} > max {hi}")
    return _unary(ctx, lambda x: np.clip(x, lo, hi))


# --------------------------------------------------------------------------------------------------
# data movement
# --------------------------------------------------------------------------------------------------

@_register("concat")
def _op_concat(ctx: _Ctx) -> np.ndarray:
    ctx.need_inputs(1)
    xs = [_fin(ctx, i) for i in range(len(ctx.inputs))]
    nd = xs[0].ndim
    if any(x.ndim != nd for x in xs):
        raise ctx.error(f"inputs have different ranks: {[list(x.shape) for x in xs]}")
    axis = ctx.int_attr("axis", 0)
    if not -nd <= axis < nd:
        raise ctx.error(f"axis {axis} out of range for {nd}-D inputs")
    ax = axis % nd
    for x in xs[1:]:
        if x.shape[:ax] + x.shape[ax + 1:] != xs[0].shape[:ax] + xs[0].shape[ax + 1:]:
            raise ctx.error(f"cannot concatenate shapes {[list(x.shape) for x in xs]} "
                            f"along axis {axis}")
    return _f32(np.concatenate(xs, axis=ax))


def _src_linear(n_out: int, n_in: int, align_corners: bool, half_pixel: bool):
    """Bilinear source indices (i0, i1) and weight of i1 per output index (TF / XIR convention)."""
    o = np.arange(n_out, dtype=np.float64)
    if align_corners:
        src = o * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    elif half_pixel:
        src = np.maximum((o + 0.5) * (n_in / n_out) - 0.5, 0.0)
    else:
        src = o * (n_in / n_out)
    src = np.minimum(src, n_in - 1)
    i0 = np.floor(src).astype(np.int64)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, src - i0


@_register("upsample", "resize")
def _op_resize(ctx: _Ctx) -> np.ndarray:
    """NEAREST (asymmetric, floor: output (y, x) takes input (⌊y·H_in/H_out⌋, ⌊x·W_in/W_out⌋))
    or BILINEAR (align_corners / half_pixel_centers / asymmetric); the size comes from the output
    shape (a second `size` / `scale` input is ignored)."""
    ctx.need_inputs(1, 2)
    x = _fin(ctx, 0)
    _need_4d(ctx, x, "input (NHWC)")
    N, H, W, C = x.shape
    on, oh, ow, oc = _out_4d(ctx)
    if on != N or oc != C:
        raise ctx.error(f"output shape {list(ctx.out_shape)} does not match input {list(x.shape)}")
    if min(oh, ow) < 1 or min(H, W) < 1:
        raise ctx.error(f"empty input {list(x.shape)} or output {list(ctx.out_shape)}")
    mode = ctx.str_attr("mode", "NEAREST").upper()
    ac = ctx.bool_attr("align_corners", False)
    hp = ctx.bool_attr("half_pixel_centers", False)
    if mode == "NEAREST":
        if ac or hp:
            raise ctx.error("NEAREST with align_corners / half_pixel_centers is not supported")
        iy = (np.arange(oh) * H) // oh
        ix = (np.arange(ow) * W) // ow
        return _f32(x[:, iy][:, :, ix])
    if mode in ("BILINEAR", "LINEAR"):
        if ac and hp:
            raise ctx.error("align_corners and half_pixel_centers are mutually exclusive")
        y0, y1, fy = _src_linear(oh, H, ac, hp)
        x0, x1, fx = _src_linear(ow, W, ac, hp)
        fy = fy[None, :, None, None]
        fx = fx[None, None, :, None]
        top = x[:, y0][:, :, x0] * (1 - fx) + x[:, y0][:, :, x1] * fx
        bot = x[:, y1][:, :, x0] * (1 - fx) + x[:, y1][:, :, x1] * fx
        return _f32(top * (1 - fy) + bot * fy)
    raise ctx.error(f"mode '{mode}' is not supported (NEAREST, BILINEAR)")


_ONNX_CACHE: dict[bytes, Any] = {}


@_register("onnx-op")
def _op_onnx(ctx: _Ctx) -> np.ndarray:
    """An ONNX node the quantizer kept as it is (attr `onnx_model`: a one-node model with inputs x0.., outputs
    y0..; `output_index` picks one), run by onnx's own reference evaluator, in ONNX's layout."""
    import hashlib
    blob = ctx.attrs.get("onnx_model")
    if not isinstance(blob, (bytes, bytearray)) or not blob:
        raise ctx.error("missing attribute 'onnx_model' (the serialized one-node ONNX model)")
    try:
        import onnx
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        raise ctx.error("running an ONNX op on the CPU needs the onnx package (pip install onnx)") from None
    key = hashlib.sha1(bytes(blob)).digest()
    ev = _ONNX_CACHE.get(key)
    if ev is None:
        try:
            ev = ReferenceEvaluator(onnx.load_from_string(bytes(blob)))
        except Exception as e:
            raise ctx.error(f"cannot load its ONNX model: {' '.join(str(e).split())[:200]}") from None
        if len(_ONNX_CACHE) > 256:
            _ONNX_CACHE.clear()
        _ONNX_CACHE[key] = ev
    names = list(ev.input_names)
    if len(names) != len(ctx.inputs):
        raise ctx.error(f"expects {len(names)} inputs, got {len(ctx.inputs)}")
    feeds = {n: np.asarray(v, np.float32) for n, v in zip(names, ctx.inputs)}
    k = int(ctx.attrs.get("output_index", 0))
    try:
        outs = list(ev.run(None, feeds))
    except Exception as e:
        raise ctx.error(f"{' '.join(str(e).split())[:200]}") from None
    if not 0 <= k < len(outs):
        raise ctx.error(f"output_index {k} out of range (the op has {len(outs)} outputs)")
    y = np.asarray(outs[k])
    return y.astype(np.float32) if y.dtype.kind == "f" else y


FLOAT_OPS: frozenset[str] = frozenset(("onnx-op",
    "conv2d", "depthwise-conv2d", "transposed-conv2d", "transposed-depthwise-conv2d",
    "depthwise-transposed-conv2d", "maxpool2d", "avgpool2d", "pool", "add", "sub", "mul", "div",
    "concat", "upsample", "resize", "hard-sigmoid", "hard-swish", "prelu", "tanh", "exp", "clamp"))
