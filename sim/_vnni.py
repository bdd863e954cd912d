"""CONV multiply-accumulate in exact int32 on the CPU's int8 dot-product instruction (AVX-512 VNNI `vpdpbusd`), the
fast path of `sim._kernels` on CPUs that have it (`HAVE_VNNI`); elsewhere the float32 kernels of `sim._fastmac` run.

`vpdpbusd(acc, a, b)` adds, to each of 16 int32 lanes j, Σ_{b<4} u8(a[4j+b])·s8(b[4j+b]): unsigned × signed bytes. The
activations are signed int8, so the tile holds them offset to unsigned, u = x + 128 (x XOR 0x80), and the offset is
taken back out exactly: Σ u·w = Σ x·w + 128·Σ w. Every position of the tile enters the sum (a padded or
channel_offset position holds x = 0, u = 128, and its weight is counted in Σ w like any other), so the correction
is 128 times the sum of the output channel's weights over the whole kernel window.

Exactness: one product is at most 255·128 < 2^15 in magnitude, so QUADS_MAX = 2^14 dot-products of 4 (2^16
products) keep every int32 lane below 2^31; the kernel flushes its int32 lanes into int64 accumulators before that
(`conv_acc_vnni`), and vpdpbusd does not saturate. The result is the integer sum, bit for bit.

Layout: the tile Xu uint8 [rows_in, cols_in·IC] as in `sim._fastmac` (a window of output pixel x in kernel row ky
is the contiguous run Xu[h·stride_h + ky, x·stride_w·IC + (0 .. kernel_w·IC)]). The weights Wv int8
[kernel_h·kernel_w·IC / 4, LANES, 4]: quad k of the window's products, output channel lane j, its 4 bytes adjacent
(`sim._weightcache.weights_vnni` keeps them so). IC is a multiple of CP ≥ 8, so a window is whole quads.

The kernel (`_tile8`) is written in LLVM IR through a Numba intrinsic: 8 output pixels × 16 output channels, eight
<16 × i32> accumulators held in registers over the reduction, one 64-byte weight load and eight broadcasts of 4
activation bytes per quad. Measured on the 2-core AMD EPYC (Zen 4): about 230 GMAC/s on one core for reductions of
1,024 products, against 45–50 for the float32 outer-product kernel. `_tile8_generic` is the same loop in portable
vector IR (no VNNI), which LLVM compiles for any CPU; it is what a CPU without VNNI would run if the float32 kernels
were not chosen there, and tests/test_sim_fast.py checks it against the VNNI one.
"""
from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# Whether LLVM may emit the 512-bit vpdpbusd here (the host features it compiles for). compiler/ref/_intgemm.py asks
# another question of /proc/cpuinfo (does onnxruntime's kernel use any VNNI, AVX-VNNI included), and the golden
# must not import sim, so the two checks stay apart.
HAVE_VNNI = bool(llvm.get_host_cpu_features().get("avx512vnni", False))
NP = 8                 # output pixels per tile
LANES = 16             # output channels per tile (16 int32 lanes)
QUADS_MAX = 1 << 14    # dot-products of 4 per int32 run: 2^16 products of < 2^15 stay below 2^31

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_V16 = ir.VectorType(_I32, LANES)
_V64 = ir.VectorType(_I8, 4 * LANES)


def _dpbusd(builder, acc, a, b, vnni: bool):
    """acc + Σ_{b<4} u8(a)·s8(b) per int32 lane (a, b: <16 × i32> holding 4 bytes each)."""
    if vnni:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16, _V64, _V64]),
                                            "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, [acc, builder.bitcast(a, _V64), builder.bitcast(b, _V64)])
    wide = ir.VectorType(_I32, 4 * LANES)
    p = builder.mul(builder.zext(builder.bitcast(a, _V64), wide), builder.sext(builder.bitcast(b, _V64), wide))
    for k in range(4):
        acc = builder.add(acc, builder.shuffle_vector(p, p, ir.Constant(_V16, [4 * j + k for j in range(LANES)])))
    return acc


def _make_tile8(vnni: bool):
    @intrinsic
    def tile8(typingctx, X, offs, W, w0, ws, n4, nrows, xstep, init, acc):
        """acc[t, j] (+)= Σ_{r<nrows} Σ_{q<n4} Σ_{b<4} X[offs[t] + r·xstep + 4q + b] · W[w0 + ws·(r·n4 + q) + 4j + b]
        for t < 8, j < 16: nrows runs of n4 quads of activations (kernel rows, xstep bytes apart) against consecutive
        weight quad rows (X uint8, W int8, acc int32 [8, 16] C-contiguous; offsets, w0, the quad row stride ws and
        xstep in bytes; n4, nrows ≥ 0). init ≠ 0 starts from zero instead of acc."""
        sig = types.void(X, offs, W, types.int64, types.int64, types.int64, types.int64, types.int64, types.int64,
                         acc)

        def codegen(context, builder, signature, args):
            xa, oa, wa, w0v, wsv, n4v, nrv, xsv, initv, aa = args
            data = [context.make_array(signature.args[k])(context, builder, v).data
                    for k, v in ((0, xa), (1, oa), (2, wa), (9, aa))]
            xp, op, wp, ap = (builder.bitcast(d, t.as_pointer()) for d, t in zip(data, (_I8, _I64, _I8, _I32)))
            wp = builder.gep(wp, [w0v])
            c0, c1, c4 = (ir.Constant(_I64, v) for v in (0, 1, 4))
            xptrs = [builder.gep(xp, [builder.load(builder.gep(op, [ir.Constant(_I64, t)]))]) for t in range(NP)]
            aptrs = [builder.bitcast(builder.gep(ap, [ir.Constant(_I64, LANES * t)]), _V16.as_pointer())
                     for t in range(NP)]
            fresh = builder.icmp_signed("!=", initv, c0)
            zero = ir.Constant(_V16, [0] * LANES)
            acc0 = [builder.select(fresh, zero, builder.load(p, align=4)) for p in aptrs]
            total = builder.mul(n4v, nrv)
            jump = builder.sub(xsv, builder.mul(n4v, c4))      # from the end of one run to the next run's start
            pre = builder.block
            loop = builder.function.append_basic_block("vnni_loop")
            done = builder.function.append_basic_block("vnni_done")
            builder.cbranch(builder.icmp_signed(">", total, c0), loop, done)
            builder.position_at_end(loop)
            i, q, xo = builder.phi(_I64), builder.phi(_I64), builder.phi(_I64)
            for ph in (i, q, xo):
                ph.add_incoming(c0, pre)
            accs = []
            for a in acc0:
                ph = builder.phi(_V16)
                ph.add_incoming(a, pre)
                accs.append(ph)
            wv = builder.load(builder.bitcast(builder.gep(wp, [builder.mul(i, wsv)]), _V16.as_pointer()), align=1)
            undef = ir.Constant(_V16, ir.Undefined)
            new = []
            for t in range(NP):
                x4 = builder.load(builder.bitcast(builder.gep(xptrs[t], [xo]), _I32.as_pointer()), align=1)
                xv = builder.shuffle_vector(builder.insert_element(undef, x4, ir.Constant(_I32, 0)), undef, zero)
                new.append(_dpbusd(builder, accs[t], xv, wv, vnni))
            i_n = builder.add(i, c1)
            q1 = builder.add(q, c1)
            wrap = builder.icmp_signed("==", q1, n4v)
            q_n = builder.select(wrap, c0, q1)
            xo_n = builder.add(builder.add(xo, c4), builder.select(wrap, jump, c0))
            end = builder.block
            i.add_incoming(i_n, end)
            q.add_incoming(q_n, end)
            xo.add_incoming(xo_n, end)
            for ph, v in zip(accs, new):
                ph.add_incoming(v, end)
            builder.cbranch(builder.icmp_signed("<", i_n, total), loop, done)
            builder.position_at_end(done)
            fin = []
            for t in range(NP):                   # every phi first: LLVM wants them at the top of the block
                ph = builder.phi(_V16)
                ph.add_incoming(acc0[t], pre)
                ph.add_incoming(new[t], end)
                fin.append(ph)
            for t in range(NP):
                builder.store(fin[t], aptrs[t], align=4)
            return context.get_dummy_value()

        return sig, codegen
    return tile8


_tile8 = _make_tile8(HAVE_VNNI)
_tile8_generic = _make_tile8(False)


@njit(cache=True)
def tile8_generic(X, offs, W, w0, ws, n4, nrows, xstep, init, acc):
    """The portable form of the tile kernel, callable from Python (tests)."""
    _tile8_generic(X, offs, W, w0, ws, n4, nrows, xstep, init, acc)


@njit(cache=True)
def tile8(X, offs, W, w0, ws, n4, nrows, xstep, init, acc):
    """The host's form of the tile kernel (VNNI where the CPU has it), callable from Python (tests)."""
    _tile8(X, offs, W, w0, ws, n4, nrows, xstep, init, acc)


@njit(cache=True)
def conv_acc_vnni(Xu, Wv, wsum, A, vpp, length, ocp, ic, kh, kw, sh, sw):
    """A[h, x·ocp + o] = Σ_{ky, q} x[h·sh + ky, x·sw·ic + q]·w[o, ky, q] exactly (A int64, C-contiguous), from the
    offset tile Xu (uint8, C-contiguous) and the weights Wv int32 [kh·kw·ic/4, nb·LANES] (each word the 4 bytes of
    one quad, in order; C-contiguous); wsum[o] = Σ of output channel o's weights.
    Output pixels of all vpp rows form one list, NP at a time (the last tile repeats the last pixel); a tile's
    whole window is one kernel call when it has at most QUADS_MAX quads, else runs of QUADS_MAX flushed to int64."""
    L4 = kw * ic // 4
    P = vpp * length
    nb = Wv.shape[1] // LANES
    cols = Xu.shape[1]
    Xf = Xu.reshape(-1)
    Wf = Wv.reshape(-1).view(np.int8)
    lane_row = Wv.shape[1] * 4                  # bytes per quad row of Wv
    one_run = kh * L4 <= QUADS_MAX
    Af = A.reshape(-1)
    corr = 128 * wsum                           # the offset of the unsigned activations, per output channel
    base = np.empty(P, np.int64)                # each output pixel's window start in kernel row 0
    for p in range(P):
        base[p] = (p // length) * sh * cols + (p % length) * sw * ic
    acc = np.zeros((NP, LANES), np.int32)
    tot = np.zeros((NP, LANES), np.int64)
    off = np.empty(NP, np.int64)
    for p0 in range(0, P, NP):
        nt = min(NP, P - p0)
        for ob in range(nb):
            if one_run:                         # tot stays zero
                for t in range(NP):
                    off[t] = base[p0 + min(t, nt - 1)]
                _tile8(Xf, off, Wf, ob * LANES * 4, lane_row, L4, kh, cols, 1, acc)
            else:
                tot[:] = 0
                acc[:] = 0
                used = 0
                for ky in range(kh):
                    for q0 in range(0, L4, QUADS_MAX):
                        n4 = min(QUADS_MAX, L4 - q0)
                        if used + n4 > QUADS_MAX:       # flush before an int32 lane could reach 2^31
                            for t in range(NP):
                                for j in range(LANES):
                                    tot[t, j] += acc[t, j]
                            acc[:] = 0
                            used = 0
                        for t in range(NP):
                            off[t] = base[p0 + min(t, nt - 1)] + ky * cols + 4 * q0
                        _tile8(Xf, off, Wf, (ky * L4 + q0) * lane_row + ob * LANES * 4, lane_row, n4, 1, 0, 0, acc)
                        used += n4
            o0 = ob * LANES
            nl = min(LANES, ocp - o0)
            cr = corr[o0:o0 + nl]
            for t in range(nt):                 # A[h, x·ocp + o] is Af[p·ocp + o]: a run of nl per pixel
                dst = Af[(p0 + t) * ocp + o0:(p0 + t) * ocp + o0 + nl]
                at = acc[t]
                tt = tot[t]
                for j in range(nl):
                    dst[j] = tt[j] + at[j] - cr[j]
