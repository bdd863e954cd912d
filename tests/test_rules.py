"""DPU/CPU placement rules (compiler/rules.py). Every limit below is worked out by hand from the spec
(§3.3 presets, §3.4 engine limits, §4.3 field ranges, §6-§7) or UG1414 Table 28, not from rules.py.

Presets used (spec §3.3): B512 = PP 4, CP 8, bank_depth 2048, CV_LKRL 1, DW_LKRL 0, argmax 1;
B4096 = PP 8, CP 16, bank_depth 2048, CV_LKRL 1, DW_LKRL 0, argmax 1.
"""
import dataclasses

import pytest

from opendpu.compiler import rules_pool
from opendpu.compiler.rules import OpDesc, Placement, format_report, fusable_nonlinear, inspect_table, limits, place
from opendpu.isa.target import Target, get_target

B512 = get_target("DPUCZDX8G_ISA1_B512")
B4096 = get_target("DPUCZDX8G_ISA1_B4096")


def conv(k=3, s=1, ic=8, oc=8, hw=32, typ="conv2d", pad=None, **attrs):
    kw, kh = (k, k) if isinstance(k, int) else k
    sw, sh = (s, s) if isinstance(s, int) else s
    a = {"kernel": [kw, kh], "stride": [sw, sh], "pad": pad or [0, 0, 0, 0], **attrs}
    return OpDesc("c", typ, a, [[1, hw, hw, ic]], [1, hw // sh, hw // sw, oc], [oc, kh, kw, ic])


def dw(k=3, s=1, c=8, hw=32, pad=None, mult=1, **attrs):
    kw, kh = (k, k) if isinstance(k, int) else k
    a = {"kernel": [kw, kh], "stride": [s, s], "pad": pad or [0, 0, 0, 0], **attrs}
    return OpDesc("d", "depthwise-conv2d", a, [[1, hw, hw, c]], [1, hw // s, hw // s, c * mult],
                  [mult, kh, kw, c])


def pool(kind="MAX", k=3, s=1, hw=8, c=8, pad=None, out_hw=None, **attrs):
    kw, kh = (k, k) if isinstance(k, int) else k
    a = {"type": kind, "kernel": [kw, kh], "stride": [s, s], "pad": pad or [0, 0, 0, 0], **attrs}
    oh = out_hw if out_hw is not None else (hw + a["pad"][2] + a["pad"][3] - kh) // s + 1
    ow = out_hw if out_hw is not None else (hw + a["pad"][0] + a["pad"][1] - kw) // s + 1
    return OpDesc("p", "pool", a, [[1, hw, hw, c]], [1, oh, ow, c])


def dpu(p: Placement, engine: str | None = None) -> bool:
    return p.device == "DPU" and (engine is None or p.engine == engine)


def cpu(p: Placement, reason: str | None = None) -> bool:
    return p.device == "CPU" and p.engine == "" and (reason is None or p.reason == reason)


# ---- conv2d: kernel / stride (§3.4 conv_limit kernel "1-16", stride "1-8") -----------------------

def test_conv_kernel_16_ok_17_cpu():
    assert dpu(place(conv(k=16), B512), "conv")
    p = place(conv(k=17), B512)
    assert cpu(p, "conv kernel 17x17 > 16")
    assert p.hint
    assert cpu(place(conv(k=(17, 3)), B512), "conv kernel 17x3 > 16")     # one dimension is enough


def test_conv_stride_8_ok_9_cpu():
    assert dpu(place(conv(k=3, s=8, hw=64), B512))
    assert cpu(place(conv(k=3, s=9, hw=72), B512), "conv stride 9x9 > 8")
    assert cpu(place(conv(k=3, s=(1, 9), hw=72), B512), "conv stride 1x9 > 8")


def test_fix_suffix_and_case_are_ignored():
    op = conv(k=17)
    op.type = "Conv2d-Fix"
    assert cpu(place(op, B512), "conv kernel 17x17 > 16")


# ---- conv2d: weights in one CONVW bank, kw*kh*ceil(ic/CP) <= bank_depth (UG1414) -----------------

def test_conv_weights_fit_bank_b512_not_b4096():
    # 16x16 kernel: 256 lines per channel group.
    # B512 (CP 8): ic 64 -> ceil(64/8) = 8 groups -> 2048 lines == bank_depth 2048 -> DPU;
    #              ic 65 -> 9 groups -> 2304 > 2048 -> CPU.
    # B4096 (CP 16): ic 65 -> ceil(65/16) = 5 groups -> 1280 <= 2048 -> DPU.
    assert dpu(place(conv(k=16, ic=64), B512))
    p = place(conv(k=16, ic=65), B512)
    assert cpu(p, "conv weights 16*16*ceil(65/8) = 2304 lines > bank_depth 2048 (CONVW bank)")
    assert dpu(place(conv(k=16, ic=65), B4096))
    # 3x3 with ic 2048: B512 9*256 = 2304 > 2048; B4096 9*128 = 1152 <= 2048
    assert cpu(place(conv(k=3, ic=2048), B512))
    assert dpu(place(conv(k=3, ic=2048), B4096))


def test_conv_weight_rule_reads_bank_depth_from_target():
    # a parametric B512-like core with bank_depth 4096: 16*16*9 = 2304 <= 4096
    deep = Target.parametric(4, 8, 2, bank_depth=4096)
    assert dpu(place(conv(k=16, ic=65), deep))


def test_conv_channel_limits_256_cp():
    # CONV channel_group is 8 bits minus one (1..256) -> ic <= 256*CP; UG1414 oc <= 256*CP.
    # B512: 256*8 = 2048. 1x1 with ic 2056: weights 1*1*257 = 257 lines fit, but 257 groups do not.
    assert dpu(place(conv(k=1, ic=2048), B512))
    assert cpu(place(conv(k=1, ic=2056), B512), "conv input channels 2056 > 256*CP = 2048")
    assert dpu(place(conv(k=1, oc=2048), B512))
    assert cpu(place(conv(k=1, oc=2049), B512), "conv output channels 2049 > 256*CP = 2048")
    assert dpu(place(conv(k=1, oc=4096), B4096))                         # 256*16


def test_conv_dilation_times_ic():
    # UG1414: dilation*ic <= 256*CP; B512: 2*1024 = 2048 ok, 3*1024 = 3072 > 2048.
    assert dpu(place(conv(k=1, ic=1024, dilation=[2, 2]), B512))
    assert cpu(place(conv(k=1, ic=1024, dilation=[3, 3]), B512),
               "conv dilation 3 * input channels 1024 = 3072 > 256*CP = 2048")
    assert dpu(place(conv(k=1, ic=1024, dilation=[3, 3]), B4096))        # 3072 <= 4096


def test_conv_pad_at_most_k_minus_1_times_dilation():
    assert dpu(place(conv(k=3, pad=[1, 1, 1, 1]), B512))
    assert dpu(place(conv(k=3, pad=[2, 2, 2, 2]), B512))                  # (3-1)*1 = 2: the limit
    assert cpu(place(conv(k=3, pad=[0, 0, 0, 3]), B512), "conv pad_bottom 3 > kernel_h-1 = 2")
    # dilation 2: (3-1)*2 = 4
    assert dpu(place(conv(k=3, pad=[4, 4, 4, 4], dilation=[2, 2]), B512))
    assert cpu(place(conv(k=3, pad=[5, 0, 0, 0], dilation=[2, 2]), B512),
               "conv pad_left 5 > (kernel_w-1)*dilation_w = 4")


def test_conv_rows_must_fit_four_bank_passes():
    # §6.4: ceil(kh/stride_h) <= 4*PP. Presets have PP >= 4, so 16 rows always fit; a PP=2 core
    # (ARCH 10, (2, 8)) gathers at most 8 slots: 16x16 at stride 1 -> 16 > 8, at stride 2 -> 8.
    tiny = Target.parametric(2, 8, 1)
    assert dpu(place(conv(k=16), B512))
    assert cpu(place(conv(k=16), tiny), "conv window of 16 rows at stride 1 spans 16 bank rows > 4*PP = 8")
    assert dpu(place(conv(k=16, s=2), tiny))


# ---- conv2d: groups ------------------------------------------------------------------------------

def test_conv_groups():
    op = conv(k=3, ic=16, oc=16, group=2)
    op.weight_shape = [16, 3, 3, 8]
    assert cpu(place(op, B512), "conv groups 2 not 1 or C_in (16)")
    op = conv(k=3, ic=16, oc=16, group=4)
    assert cpu(place(op, B512), "conv groups 4 not 1 or C_in (16)")
    # group == C_in == C_out is a depthwise convolution (ALU engine)
    op = conv(k=3, ic=16, oc=16, group=16)
    op.weight_shape = [16, 3, 3, 1]
    p = place(op, B512)
    assert dpu(p, "alu") and "dwconv" in p.reason
    # group == C_in with C_out = 2*C_in: a channel multiplier of 2
    op = conv(k=3, ic=16, oc=32, group=16)
    op.weight_shape = [32, 3, 3, 1]
    assert cpu(place(op, B512), "depthwise channel multiplier 2 != 1")


# ---- conv2d: fused nonlinear (§6.1, §7.2) ---------------------------------------------------------

def test_conv_leaky_alpha_must_be_26_over_256():
    ok = place(conv(nonlinear="LEAKYRELU", LEAKYRELU_alpha=0.1015625), B4096)
    assert dpu(ok, "conv") and "LeakyReLU" in ok.reason
    p = place(conv(nonlinear="LEAKYRELU", LEAKYRELU_alpha=0.1), B4096)
    assert cpu(p, "conv: LeakyReLU alpha 0.1 != 26/256 (0.1015625), the slope hard-wired in the CONV engine")
    assert "0.1015625" in p.hint
    assert cpu(place(conv(nonlinear="LEAKYRELU", LEAKYRELU_alpha=0.1015626), B4096))   # exactly 26/256


def test_conv_leaky_needs_cv_lkrl():
    no_lk = dataclasses.replace(B4096, cv_lkrl=False)
    p = place(conv(nonlinear="LEAKYRELU", LEAKYRELU_alpha=26 / 256), no_lk)
    assert cpu(p) and "CV_LKRL" in p.reason and "separate op" in p.hint
    assert dpu(place(conv(nonlinear="RELU"), no_lk))
    assert dpu(place(conv(nonlinear="LEAKYRELU", LEAKYRELU_alpha=26 / 256), B4096))


@pytest.mark.parametrize("nl", ["PRELU", "HSIGMOID", "HSWISH"])
def test_conv_prelu_hsigmoid_hswish_not_fused(nl):
    p = place(conv(nonlinear=nl), B4096)
    assert cpu(p) and "not fused on the CONV engine" in p.reason and "separate op" in p.hint


@pytest.mark.parametrize("nl,text", [("NONE", "CONV engine"), ("RELU", "CONV engine, ReLU fused"),
                                     ("RELU6", "CONV engine, ReLU6 fused")])
def test_conv_relu_relu6_fused(nl, text):
    p = place(conv(nonlinear=nl), B512)
    assert dpu(p, "conv") and p.reason == text


def test_fusable_nonlinear_per_engine():
    assert fusable_nonlinear("eltwise", "RELU", B512) is None
    assert "ELEW" in fusable_nonlinear("eltwise", "RELU6", B512)              # ELEW act_type is 1 bit
    assert "DW_LKRL" in fusable_nonlinear("alu", "LEAKYRELU", B512, 26 / 256)  # presets: DW_LKRL 0
    dw_lk = dataclasses.replace(B512, dw_lkrl=True)
    assert fusable_nonlinear("alu", "LEAKYRELU", dw_lk, 26 / 256) is None
    assert fusable_nonlinear("alu", "HSWISH", B512) is not None


# ---- transposed conv ------------------------------------------------------------------------------

def test_convtranspose_output_padding():
    op = conv(k=4, s=2, typ="transposed-conv2d", output_padding=[1, 1])
    assert cpu(place(op, B512), "ConvTranspose output_padding must be 0")
    op.attrs["output_padding"] = [0, 0]
    assert dpu(place(op, B512), "conv")


def test_convtranspose_kernel_over_stride():
    # UG1414: kernel/stride in [1, 16]; phases are stride-1 convs with kernel ceil(k/s)
    assert dpu(place(conv(k=4, s=4, typ="transposed-conv2d"), B512))          # 4x4/s4 -> 1x1 phases
    assert dpu(place(conv(k=32, s=2, typ="transposed-conv2d", hw=8), B512))   # 32/2 = 16
    assert cpu(place(conv(k=34, s=2, typ="transposed-conv2d", hw=8), B512),
               "transposed-conv kernel/stride 34/2 x 34/2 -> 17x17 > 16")
    assert cpu(place(conv(k=33, s=2, typ="transposed-conv2d", hw=8), B512),   # ceil(33/2) = 17
               "transposed-conv kernel/stride 33/2 x 33/2 -> 17x17 > 16")
    assert cpu(place(conv(k=1, s=2, typ="transposed-conv2d"), B512))          # k < s
    assert cpu(place(conv(k=4, s=2, typ="transposed-conv2d", pad=[4, 0, 0, 0]), B512),
               "transposed-conv pad_left 4 > kernel_w-1 = 3")


# ---- depthwise (ALU, §3.4 alu_limit / pad_limit) ---------------------------------------------------

def test_depthwise_pad_left_16_cpu_right_16_ok():
    # 17x17 kernel: k-1 = 16, so only the 4-bit left/top field (0..15) limits; right/bottom are 8-bit.
    # B4096: rows ceil(17/1) = 17 <= 4*8 = 32; weights 17*17*1 = 289 lines.
    assert cpu(place(dw(k=17, pad=[16, 0, 0, 0]), B4096),
               "depthwise pad_left 16 > 15 (ALU pad_left field, pad_limit)")
    assert cpu(place(dw(k=17, pad=[0, 0, 16, 0]), B4096))
    assert dpu(place(dw(k=17, pad=[15, 16, 15, 16]), B4096), "alu")
    assert cpu(place(dw(k=3, pad=[0, 3, 0, 0]), B4096), "depthwise pad_right 3 > kernel_w-1 = 2")


def test_depthwise_kernel_stride_multiplier_channels():
    assert dpu(place(dw(k=3), B512), "alu")
    assert cpu(place(dw(k=3, mult=2), B512), "depthwise channel multiplier 2 != 1")
    # ALU kernel 1..256: 257 fails before any other rule
    assert cpu(place(dw(k=(257, 1)), B4096), "depthwise kernel 257x1 > 256")
    assert cpu(place(dw(k=3, s=257, hw=514), B4096), "depthwise stride 257x257 > 256")
    # ALU channel_group 1..256: B512 C <= 2048
    assert dpu(place(dw(k=1, c=2048), B512))
    assert cpu(place(dw(k=1, c=2056), B512), "depthwise channels 2056 > 256*CP = 2048")


def test_depthwise_weights_fit_dwconvw_and_rows():
    # DWCONVW lines kw*kh*ceil(C/CP): 9x9 with C 256 on B512 = 81*32 = 2592 > 2048; B4096 81*16 = 1296.
    assert cpu(place(dw(k=9, c=256), B512), "depthwise weights 9*9*ceil(256/8) = 2592 lines > bank_depth "
                                            "2048 (DWCONVW bank)")
    assert dpu(place(dw(k=9, c=256), B4096))
    # rows: 17 tall at stride 1 on B512 (4*PP = 16) -> CPU; on B4096 (32) -> DPU
    assert cpu(place(dw(k=17), B512), "depthwise window of 17 rows at stride 1 spans 17 bank rows > 4*PP = 16")
    assert dpu(place(dw(k=17), B4096))


def test_depthwise_leaky_needs_dw_lkrl():
    op = dw(nonlinear="LEAKYRELU", LEAKYRELU_alpha=26 / 256)
    assert cpu(place(op, B4096))                                   # DW_LKRL 0 in every preset
    assert dpu(place(op, dataclasses.replace(B4096, dw_lkrl=True)), "alu")
    assert cpu(place(dw(nonlinear="HSWISH"), B4096))
    assert dpu(place(dw(nonlinear="RELU6"), B4096))


# ---- pooling (ALU, §6.8, §7.4) ---------------------------------------------------------------------

def test_avgpool_3x3_multi_factor_7():
    # §7.4: 3x3 -> (N, M) = (7, 6)
    p = place(pool("AVG", k=3, pad=[1, 1, 1, 1]), B512)
    assert dpu(p, "alu") and "multi_factor 7" in p.reason
    assert "multi_factor 21" in place(pool("AVG", k=7, hw=7), B512).reason       # 7x7 -> (21, 10)


def test_avgpool_multi_factor_over_127(monkeypatch):
    # No window up to 256x256 needs N > 127 (the largest is 127 for 256x129), so the limit is exercised
    # with a substituted divisor table.
    monkeypatch.setattr(rules_pool, "avg_pool_factor", lambda kh, kw: (128, 10))
    assert cpu(place(pool("AVG", k=3), B512), "avg pool 3x3: multi_factor 128 > 127 (1/9 ~ 128/2^10)")
    monkeypatch.setattr(rules_pool, "avg_pool_factor", lambda kh, kw: (127, 10))
    assert dpu(place(pool("AVG", k=3), B512))


def test_avgpool_count_include_pad():
    assert cpu(place(pool("AVG", k=3, pad=[1, 1, 1, 1], count_include_pad=False), B512))
    assert dpu(place(pool("AVG", k=3, pad=[1, 1, 1, 1], count_include_pad=True), B512))
    assert dpu(place(pool("AVG", k=3, count_include_pad=False), B512))            # no pad: same divisor


def test_pool_ceil_mode_overrun():
    # 8x8, 3x3/s2, no pad: floor gives 3 outputs, ceil gives 4; the 4th window needs rows 6..8 -> 1 overrun
    mx = place(pool("MAX", k=3, s=2, out_hw=4, ceil_mode=True), B512)
    assert dpu(mx, "alu") and "+1 bottom" in mx.reason
    assert cpu(place(pool("AVG", k=3, s=2, out_hw=4, ceil_mode=True), B512))
    assert dpu(place(pool("AVG", k=3, s=2, out_hw=3), B512))
    # from the ceil formula alone (no out_shape)
    op = pool("AVG", k=3, s=2, ceil_mode=True)
    op.out_shape = []
    assert cpu(place(op, B512))


def test_pool_pads_and_kernel():
    assert cpu(place(pool("MAX", k=20, hw=40, pad=[16, 0, 0, 0]), B4096),
               "max pool pad_left 16 > 15 (ALU pad_left field, pad_limit)")
    assert cpu(place(pool("MAX", k=3, pad=[0, 0, 3, 0]), B512), "max pool pad_top 3 > kernel_h-1 = 2")
    assert cpu(place(pool("MAX", k=(257, 1), hw=300), B4096), "max pool kernel 257x1 > 256")
    # rows: 17 tall at stride 1 on B512 (4*PP = 16) -> CPU, stride 2 -> ceil(17/2) = 9 -> DPU
    assert cpu(place(pool("MAX", k=17, hw=40), B512))
    assert dpu(place(pool("MAX", k=17, s=2, hw=40), B512))
    assert cpu(place(pool("LP", k=2), B512))


def test_global_pool():
    # global 7x7 avg -> (21, 10); window ceil(7/PP)*7 lines
    op = OpDesc("g", "pool-fix", {"type": "AVG", "global": True}, [[1, 7, 7, 64]], [1, 1, 1, 64])
    p = place(op, B512)
    assert dpu(p, "alu") and "multi_factor 21" in p.reason
    # UG1414 ceil(h/PP)*w <= bank_depth: 128x128 on B512: 32*128 = 4096 > 2048; on B4096: 16*128 = 2048
    op = OpDesc("g", "pool", {"type": "MAX", "global": True}, [[1, 128, 128, 8]], [1, 1, 1, 8])
    assert cpu(place(op, B512), "max pool window ceil(128/PP=4)*128 = 4096 > bank_depth 2048")
    assert dpu(place(op, B4096))


# ---- eltwise (ELEW, §6.7) --------------------------------------------------------------------------

def elt(kind, shapes, out=None, **attrs):
    return OpDesc("e", "eltwise", {"type": kind, **attrs}, shapes, out or shapes[0])


def test_eltwise_add_inputs_and_relu():
    s = [1, 8, 8, 16]
    assert dpu(place(elt("ADD", [s, s], nonlinear="RELU"), B512), "eltwise")
    assert dpu(place(elt("ADD", [s] * 4), B512))
    assert cpu(place(elt("ADD", [s] * 5), B512), "eltwise ADD with 5 inputs > 4 (ELEW num field)")
    assert cpu(place(elt("ADD", [s, s], nonlinear="RELU6"), B512))
    assert cpu(place(elt("SUB", [s, s]), B512))


def test_eltwise_mul_two_inputs_and_broadcast():
    s = [1, 8, 8, 16]
    assert dpu(place(elt("MUL", [s, s]), B512))
    assert cpu(place(elt("MUL", [s, s, s]), B512), "eltwise MUL with 3 inputs != 2 (ELEW multiply takes 2)")
    # squeeze-excite channel scaling: [1,1,1,C] repeats rows (share_pp) and columns (jump_read 0)
    p = place(elt("MUL", [s, [1, 1, 1, 16]], out=s), B512)
    assert dpu(p, "eltwise") and "broadcast" in p.reason
    assert cpu(place(elt("MUL", [s, [1, 8, 8, 1]], out=s), B512))           # along channels
    # ELEW channel_group 1..256: B512 C <= 2048
    big = [1, 2, 2, 2056]
    assert cpu(place(elt("ADD", [big, big]), B512), "eltwise ADD channels 2056 > 256*CP = 2048")


# ---- data movement ----------------------------------------------------------------------------------

def test_concat_reshape_transpose():
    s = [1, 8, 8, 16]
    assert dpu(place(OpDesc("c", "concat", {"axis": 3}, [s, s], [1, 8, 8, 32]), B512), "load/save")
    assert dpu(place(OpDesc("c", "concat", {"axis": -1}, [s, s], [1, 8, 8, 32]), B512))
    assert cpu(place(OpDesc("c", "concat", {"axis": 0}, [s, s], [2, 8, 8, 16]), B512))
    assert dpu(place(OpDesc("r", "reshape", {}, [s], [1, 1024]), B512), "load/save")
    assert dpu(place(OpDesc("r", "flatten", {}, [s], [1, 1024]), B512))
    assert cpu(place(OpDesc("r", "reshape", {}, [s], [2, 512]), B512))
    assert cpu(place(OpDesc("t", "transpose", {"order": [0, 3, 1, 2]}, [s], [1, 16, 8, 8]), B512))
    assert dpu(place(OpDesc("t", "transpose", {"order": [0, 3, 1, 2]}, [[1, 1, 1, 16]], [1, 16, 1, 1]), B512))


def test_upsample():
    x = [1, 8, 8, 16]
    assert dpu(place(OpDesc("u", "upsample", {"mode": "NEAREST"}, [x], [1, 16, 16, 16]), B512), "eltwise")
    assert cpu(place(OpDesc("u", "upsample", {"mode": "BILINEAR"}, [x], [1, 16, 16, 16]), B512))
    assert cpu(place(OpDesc("u", "upsample", {}, [x], [1, 12, 12, 16]), B512))   # scale 1.5
    # UG1414: ceil(s/PP)*s*ceil(C/CP) <= bank_depth; B512 s=16: 4*16*ceil(256/8) = 2048 ok, C 264 -> 2112
    assert dpu(place(OpDesc("u", "upsample", {"scale": [16, 16]}, [[1, 2, 2, 256]], []), B512))
    assert cpu(place(OpDesc("u", "upsample", {"scale": [16, 16]}, [[1, 2, 2, 264]], []), B512),
               "upsample scale 16x16: ceil(16/PP=4)*16*ceil(264/8) = 2112 > bank_depth 2048")


def test_tile_strided_slice():
    # UG1414 reorg: reverse=false: stride^2*C <= 256*CP (B512 2048): 4*512 = 2048 ok, 4*520 = 2080 not
    assert dpu(place(OpDesc("t", "tile", {"stride": 2, "reverse": False}, [[1, 8, 8, 512]], []), B512))
    assert cpu(place(OpDesc("t", "tile", {"stride": 2, "reverse": False}, [[1, 8, 8, 520]], []), B512))
    assert dpu(place(OpDesc("t", "tile", {"stride": 2, "reverse": True}, [[1, 8, 8, 2048]], []), B512))
    s = [1, 8, 8, 16]
    assert dpu(place(OpDesc("s", "strided_slice", {"strides": [1, 2, 2, 1]}, [s], [1, 4, 4, 16]), B512))
    assert cpu(place(OpDesc("s", "strided_slice", {"strides": [1, 1, 1, 2]}, [s], [1, 8, 8, 8]), B512),
               "strided_slice channel stride 2 != 1")


# ---- activations as ops ---------------------------------------------------------------------------

def test_standalone_activations():
    s = [1, 8, 8, 16]
    assert dpu(place(OpDesc("h", "hard-sigmoid", {}, [s], s), B512), "alu")
    assert "exec_mode 7" in place(OpDesc("h", "hard-sigmoid-fix", {}, [s], s), B512).reason
    assert "multiply" in place(OpDesc("h", "hard-swish", {}, [s], s), B512).reason
    assert dpu(place(OpDesc("r", "relu", {}, [s], s), B512), "eltwise")
    assert dpu(place(OpDesc("p", "prelu", {}, [s], s, [16]), B512), "alu")
    # leaky as a separate op: ALU exec_mode 4, slope m/2^s with |m| <= 127: 26/256 = 13/2^7
    p = place(OpDesc("l", "leaky-relu", {"alpha": 26 / 256}, [s], s), B512)
    assert dpu(p, "alu") and "multi_factor 13" in p.reason
    assert cpu(place(OpDesc("l", "leaky-relu", {"alpha": 0.1}, [s], s), B512))
    assert dpu(place(OpDesc("l", "leaky-relu", {"alpha": 127 / 128}, [s], s), B512))
    assert cpu(place(OpDesc("l", "leaky-relu", {"alpha": 255 / 256}, [s], s), B512))   # m = 255


def test_transposed_depthwise_and_grouped_transposed():
    # phases of a 4x4/s2 transposed depthwise are 2x2 ALU dwconvs
    op = OpDesc("t", "transposed-depthwise-conv2d", {"kernel": [4, 4], "stride": [2, 2], "pad": [1, 1, 1, 1]},
                [[1, 8, 8, 16]], [1, 16, 16, 16], [1, 4, 4, 16])
    p = place(op, B512)
    assert dpu(p, "alu") and "2x2" in p.reason
    op.attrs["output_padding"] = [1, 0]
    assert cpu(place(op, B512), "ConvTranspose output_padding must be 0")
    # pads as depthwise: left <= 15 (ALU field) even when k-1 = 16
    op = OpDesc("t", "transposed-depthwise-conv2d", {"kernel": [17, 17], "stride": [1, 1], "pad": [16, 0, 0, 0]},
                [[1, 8, 8, 16]], [1, 8, 8, 16], [1, 17, 17, 16])
    assert cpu(place(op, B4096), "transposed-depthwise pad_left 16 > 15 (ALU pad_left field, pad_limit)")
    op.attrs["pad"] = [15, 16, 15, 16]
    assert dpu(place(op, B4096), "alu")
    g = OpDesc("t", "transposed-conv2d", {"kernel": [4, 4], "stride": [2, 2], "group": 16},
               [[1, 8, 8, 16]], [1, 16, 16, 16], [16, 4, 4, 1])
    assert dpu(place(g, B512), "alu")
    g.attrs["group"] = 4
    assert cpu(place(g, B512), "conv groups 4 not 1 or C_in (16)")


def test_matmul_as_1x1_conv():
    # FC with constant weights [out, in] is a 1x1 conv2d: in <= 256*CP (B512 2048, B4096 4096)
    fc = OpDesc("fc", "inner-product", {}, [[1, 2048]], [1, 10], [10, 2048])
    assert dpu(place(fc, B512), "conv")
    fc = OpDesc("fc", "matmul", {}, [[1, 4096]], [1, 10], [10, 4096])
    assert cpu(place(fc, B512), "matmul as 1x1 conv2d: conv input channels 4096 > 256*CP = 2048")
    assert dpu(place(fc, B4096))
    assert cpu(place(OpDesc("mm", "matmul", {}, [[1, 64], [64, 10]], [1, 10]), B4096))


def test_argmax_on_save():
    # §6.3: SAVE argmax writes one byte per item; keep channel <= 128; needs the argmax feature
    assert dpu(place(OpDesc("a", "argmax", {"axis": -1}, [[1, 8, 8, 128]], [1, 8, 8, 1]), B512), "load/save")
    assert cpu(place(OpDesc("a", "argmax", {"axis": -1}, [[1, 8, 8, 129]], [1, 8, 8, 1]), B512))
    assert cpu(place(OpDesc("a", "argmax", {"axis": 1}, [[1, 8, 8, 16]], [1, 1, 8, 16]), B512))
    old = Target.from_fingerprint(0x0101000016010201)      # B800 older revision: bit 30 clear, no argmax
    assert cpu(place(OpDesc("a", "argmax", {"axis": -1}, [[1, 8, 8, 16]], [1, 8, 8, 1]), old))


# ---- unsupported types ----------------------------------------------------------------------------

@pytest.mark.parametrize("typ", ["softmax", "sigmoid", "tanh", "exp"])
def test_cpu_only_types(typ):
    p = place(OpDesc("x", typ, {}, [[1, 10]], [1, 10]), B4096)
    assert cpu(p, f"{typ} is not supported by the DPU (DPUCZDX8G ISA1 has no {typ} engine)")


def test_unknown_type_and_data_const():
    assert cpu(place(OpDesc("x", "frobnicate"), B512),
               "frobnicate is not supported by the DPU (DPUCZDX8G ISA1 has no frobnicate engine)")
    assert place(OpDesc("in", "data"), B512).device == "USER"
    assert dpu(place(OpDesc("w", "const-fix"), B512), "load/save")


def test_missing_kernel_is_a_cpu_reason():
    p = place(OpDesc("c", "conv2d", {}, [[1, 8, 8, 8]], [1, 8, 8, 8]), B512)
    assert cpu(p) and "kernel" in p.reason


# ---- limits and report ----------------------------------------------------------------------------

def test_limits_b512_b4096():
    a, b = limits(B512), limits(B4096)
    assert a["conv_kernel"] == (1, 16) and a["conv_stride"] == (1, 8)
    assert a["conv_max_in_channels"] == 2048 and b["conv_max_in_channels"] == 4096     # 256*CP
    assert a["conv_weight_lines"] == 2048
    assert a["alu_kernel"] == (1, 256) and a["alu_pad_left_top"] == (0, 15)
    assert a["alu_pad_right_bottom"] == (0, 255)
    assert a["elew_add_inputs"] == (1, 4) and a["avg_pool_max_multi_factor"] == 127
    assert a["window_max_bank_rows"] == 16 and b["window_max_bank_rows"] == 32          # 4*PP
    assert "LEAKYRELU" in a["conv_nonlinear"] and "LEAKYRELU" not in a["alu_nonlinear"]
    assert "LEAKYRELU" not in limits(dataclasses.replace(B512, cv_lkrl=False))["conv_nonlinear"]


def test_format_report():
    ops = [conv(k=3), conv(k=17), OpDesc("sm", "softmax", {}, [[1, 10]], [1, 10])]
    ops[0].name, ops[1].name = "conv_ok", "conv_big"
    txt = format_report(ops, inspect_table(ops, B4096), B4096)
    assert "DPUCZDX8G_ISA1_B4096" in txt and "0x0101000056010407" in txt
    assert "conv_kernel" in txt and "1..16" in txt
    rows = [ln.split() for ln in txt.splitlines() if ln.split()[:1] and ln.split()[0] in ("conv_ok", "conv_big", "sm")]
    assert [r[:3] for r in rows] == [["conv_ok", "conv2d", "DPU"], ["conv_big", "conv2d", "CPU"],
                                     ["sm", "softmax", "CPU"]]
    assert "conv kernel 17x17 > 16" in txt
    assert format_report(ops, None, B4096) == txt
    with pytest.raises(ValueError):
        format_report(ops, [], B4096)


def test_non_finite_and_empty_attributes_go_to_the_cpu_with_a_reason():
    """inf / NaN slopes and scales and an empty input dimension are CPU placements that say why, never a raw
    OverflowError or ZeroDivisionError."""
    t = Target.from_name("DPUCZDX8G_ISA1_B512")
    cases = [(OpDesc("l", "leaky-relu", {"alpha": float("inf")}, [[1, 4, 4, 8]], [1, 4, 4, 8]), "alpha inf"),
             (OpDesc("u", "upsample", {"scale": [float("inf"), 2]}, [[1, 4, 4, 8]], []), "finite"),
             (OpDesc("u", "upsample", {"scale": [float("nan"), 2]}, [], []), "finite"),
             (OpDesc("u", "upsample", {}, [[1, 0, 4, 8]], [1, 8, 8, 8]), "empty dimension")]
    for op, why in cases:
        p = place(op, t)
        assert p.device == "CPU" and why in p.reason, (op, p)
