"""Calibration of the cycle model against published silicon figures (docs/calibration.md).

UG1414's vaitrace text summary of ResNet-50 on a DPUCZDX8G (Figure 37) gives per layer WL, RT, LdWB, LdFM and
StFM. `compare_resnet50` lines our profile of the zoo's Caffe ResNet-50 (`resnet50_caffe`) compiled for B4096 up
with it row by row, `score` gives the acceptance figures and `best_overhead` fits the one per-row launch cost of
vaitrace's fine-grained mode. UG1414's newer DPU Summary of the same network (Figure 34) gives each subgraph's Mem
IO, which `fig34_io` splits into parameters and maps and `compare_fig34` checks our LdWB against.
`PG338_FPS` / `PG338_ZOO` are PG338's fps table and our model for each row (an out-of-sample check of the board
model, sim/multicore.py, fitted on the Vitis AI 2.5 Model Zoo's tables by runtime/boardfit.py); `PG338_IO` its I/O
bandwidth table, which `io_bandwidth` gives for our programs. benchmarks/bench_calibration.py prints all of it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable


# UG1414 (v3.5) Figure 37, "vaitrace --txt" DPU Summary of ResNet-50: (SubGraph, WL GOP, RT ms, LdWB MB, LdFM MB,
# StFM MB). "-0" there (a value in (0, 0.001)) is 0.0 here. MB is 2**20 bytes: res5a_branch2b's LdWB 2.250 is
# its 3x3x512x512 weights. The board and clock are not named in UG1414; docs/calibration.md gives the assumption.
UG1414_RESNET50: tuple[tuple[str, float, float, float, float, float], ...] = (
    ("conv1", 0.239, 0.612, 0.009, 0.507, 0.191),
    ("res2a_branch2a", 0.026, 0.189, 0.004, 0.191, 0.191),
    ("res2a_branch2b", 0.231, 0.285, 0.035, 0.191, 0.191),
    ("res2a_branch2c", 0.104, 0.270, 0.036, 0.191, 0.766),
    ("res2a", 0.105, 0.566, 0.036, 0.957, 0.766),
    ("res2b_branch2a", 0.103, 0.242, 0.036, 0.766, 0.191),
    ("res2b_branch2b", 0.231, 0.334, 0.035, 0.191, 0.191),
    ("res2b", 0.105, 0.491, 0.036, 0.957, 0.766),
    ("res2c_branch2a", 0.103, 0.243, 0.036, 0.766, 0.191),
    ("res2c_branch2b_bias", 0.058, 0.183, 0.035, 0.191, 0.048),
    ("res2b_downsample_bp_by_fake_downsample_0", 0.026, 0.270, 0.036, 0.239, 0.191),
    ("res3a_branch2a", 0.051, 0.167, 0.031, 0.191, 0.096),
    ("res3a_branch2b", 0.231, 0.323, 0.141, 0.096, 0.096),
    ("res3a_branch2c", 0.103, 0.266, 0.063, 0.096, 0.383),
    ("res3a", 0.207, 0.527, 0.125, 0.574, 0.383),
    ("res3b_branch2a", 0.103, 0.289, 0.083, 0.383, 0.096),
    ("res3b_branch2b", 0.231, 0.323, 0.141, 0.096, 0.096),
    ("res3b", 0.104, 0.319, 0.063, 0.479, 0.383),
    ("res3c_branch2a", 0.103, 0.289, 0.063, 0.383, 0.096),
    ("res3c_branch2b", 0.231, 0.323, 0.141, 0.096, 0.096),
    ("res3c", 0.104, 0.320, 0.063, 0.479, 0.383),
    ("res3d_branch2a", 0.103, 0.288, 0.083, 0.383, 0.096),
    ("res3d_branch2b_bias", 0.058, 0.142, 0.141, 0.096, 0.024),
    ("res3c_downsample_bp_by_fake_downsample_1", 0.026, 0.289, 0.063, 0.120, 0.096),
    ("res4a_branch2a", 0.051, 0.144, 0.125, 0.096, 0.048),
    ("res4a_branch2b", 0.231, 0.307, 0.563, 0.048, 0.048),
    ("res4a_branch2c", 0.103, 0.289, 0.251, 0.048, 0.191),
    ("res4a", 0.206, 0.584, 0.591, 0.287, 0.191),
    ("res4b_branch2a", 0.103, 0.286, 0.250, 0.191, 0.048),
    ("res4b_branch2b", 0.231, 0.388, 0.563, 0.048, 0.048),
    ("res4b", 0.103, 0.423, 0.251, 0.239, 0.191),
    ("res4c_branch2a", 0.103, 0.286, 0.250, 0.191, 0.048),
    ("res4c_branch2b", 0.231, 0.387, 0.563, 0.048, 0.048),
    ("res4c", 0.103, 0.420, 0.251, 0.239, 0.191),
    ("res4d_branch2a", 0.103, 0.285, 0.250, 0.191, 0.048),
    ("res4d_branch2b", 0.231, 0.386, 0.563, 0.048, 0.048),
    ("res4d", 0.103, 0.422, 0.251, 0.239, 0.191),
    ("res4e_branch2a", 0.103, 0.285, 0.250, 0.191, 0.048),
    ("res4e_branch2b", 0.231, 0.387, 0.563, 0.048, 0.048),
    ("res4e", 0.103, 0.421, 0.251, 0.239, 0.191),
    ("res4f_branch2a", 0.103, 0.286, 0.250, 0.191, 0.048),
    ("res4f_branch2b_bias", 0.058, 0.159, 0.563, 0.048, 0.012),
    ("res4e_downsample_bp_by_fake_downsample_2", 0.026, 0.248, 0.251, 0.203, 0.048),
    ("res5a_branch2a", 0.051, 0.160, 0.500, 0.048, 0.024),
    ("res5a_branch2b", 0.231, 0.391, 2.250, 0.024, 0.024),
    ("res5a_branch2c", 0.103, 0.341, 1.002, 0.024, 0.096),
    ("res5a", 0.206, 0.438, 2.002, 0.144, 0.096),
    ("res5b_branch2a", 0.103, 0.234, 1.000, 0.096, 0.024),
    ("res5b_branch2b", 0.231, 0.394, 2.250, 0.024, 0.024),
    ("res5b", 0.103, 0.377, 1.002, 0.120, 0.096),
    ("res5c_branch2a", 0.103, 0.232, 1.000, 0.096, 0.024),
    ("res5c_branch2b", 0.231, 0.391, 2.250, 0.024, 0.024),
    ("res5c", 0.103, 0.374, 1.002, 0.120, 0.096),
    ("pool5", 0.0, 0.182, 0.0, 0.096, 0.002),
    ("fc1000_bias", 0.004, 0.312, 1.954, 0.002, 0.0),
)

# UG1414 (v3.5) Figure 34, the Vitis AI Profiler's "DPU Summary" of the same ResNet-50 on DPUCZDX8G_1 with newer
# tools (no downsample back-propagation: explicit fake_downsample subgraphs): (subgraph, avg ms, WL GOP, Mem IO MB).
# The figure is cropped to these 31 subgraphs, res2b to res4c. Mem IO is LdWB + LdFM + StFM in MB of 10**6 bytes
# (`fig34_io` reproduces every row to the printed 0.001 MB).
UG1414_FIG34: tuple[tuple[str, float, float, float], ...] = (
    ("res2b", 0.519, 0.103, 1.823), ("res2c_branch2a", 0.255, 0.103, 1.02), ("res2c_branch2b", 0.350, 0.231, 0.438),
    ("res2c", 0.517, 0.103, 1.823), ("fake_downsample_3", 0.168, 0.0, 0.401),
    ("fake_downsample_0", 0.170, 0.0, 0.401), ("res3a_branch2a", 0.164, 0.051, 0.334),
    ("res3a_branch2b", 0.331, 0.231, 0.348), ("res3a_branch2c", 0.278, 0.103, 0.568), ("res3a", 0.558, 0.206, 1.135),
    ("res3b_branch2a", 0.216, 0.103, 0.567), ("res3b_branch2b", 0.340, 0.231, 0.348), ("res3b", 0.336, 0.103, 0.969),
    ("res3c_branch2a", 0.216, 0.103, 0.567), ("res3c_branch2b", 0.339, 0.231, 0.348), ("res3c", 0.336, 0.103, 0.969),
    ("res3d_branch2a", 0.216, 0.103, 0.567), ("res3d_branch2b", 0.340, 0.231, 0.348), ("res3d", 0.336, 0.103, 0.969),
    ("fake_downsample_4", 0.117, 0.0, 0.201), ("fake_downsample_1", 0.117, 0.0, 0.201),
    ("res4a_branch2a", 0.149, 0.051, 0.282), ("res4a_branch2b", 0.322, 0.231, 0.69),
    ("res4a_branch2c", 0.303, 0.103, 0.514), ("res4a", 0.534, 0.206, 1.027), ("res4b_branch2a", 0.215, 0.103, 0.513),
    ("res4b_branch2b", 0.323, 0.231, 0.69), ("res4b", 0.445, 0.103, 0.715), ("res4c_branch2a", 0.214, 0.103, 0.513),
    ("res4c_branch2b", 0.323, 0.231, 0.69), ("res4c", 0.445, 0.103, 0.715),
)
_SIDE = {2: 56, 3: 28, 4: 14, 5: 7}
_WIDTH = {2: 64, 3: 128, 4: 256, 5: 512}


def fig34_io(name: str) -> tuple[int, int, int]:
    """(parameter bytes, feature-map bytes loaded, bytes stored) of a Figure 34 subgraph of the Caffe ResNet-50 when
    it loads its weights and biases (int8), its input and its residual once and stores its output once: the
    network's arithmetic alone. fake_downsample_0 / _3 pick every other pixel of stage 2's output (to 28x28x256),
    _1 / _4 of stage 3's (to 14x14x512)."""
    if name.startswith("fake_downsample_"):
        s = 2 if name[-1] in "03" else 3
        n = (_SIDE[s] // 2) ** 2 * 4 * _WIDTH[s]
        return 0, n, n
    m = _BLOCK.fullmatch(name)
    if not m:
        raise ValueError(f"{name!r} is not a Figure 34 subgraph")
    blk, br = m.groups()
    s, first = int(blk[3]), blk.endswith("a")
    px, w = _SIDE[s] ** 2, _WIDTH[s]
    cin = (4 * _WIDTH[s - 1] if s > 2 else 64) if first else 4 * w         # the block's input channels
    if br == "branch2a":
        return cin * w + w, px * cin, px * w
    if br == "branch2b":
        return 9 * w * w + w, px * w, px * w
    if br == "branch2c":                                                   # a first block's (the add is branch1's)
        return 4 * w * w + 4 * w, px * w, px * 4 * w
    if first:                                                              # branch1 + the add
        return 4 * w * cin + 4 * w, px * cin + px * 4 * w, px * 4 * w
    return 4 * w * w + 4 * w, px * w + px * 4 * w, px * 4 * w              # branch2c + the add


def _roots(parent: dict[str, str]):
    """The root finder of a union-find forest held in `parent` (rows grouped by the fused layers spanning them)."""
    def root(n: str) -> str:
        while parent[n] != n:
            n = parent[n]
        return n
    return root


def _known(rows: Iterable[str | None]) -> set[str]:
    """The row names of `rows` that are not None (ops and layers without a row)."""
    return {r for r in rows if r is not None}


def fig34_row(op: str) -> str | None:
    """The Figure 34 subgraph whose parameters our op `op` (an op name of `resnet50_caffe`) loads, or None."""
    m = _BLOCK.fullmatch(op)
    if not m:
        return None
    blk, br = m.groups()
    name = blk if br in (None, "branch1") or (br == "branch2c" and not blk.endswith("a")) else f"{blk}_{br}"
    return name if name in {r[0] for r in UG1414_FIG34} else None


@dataclass
class LdwbCheck:
    """Figure 34 rows beside our LdWB: AMD's LdWB is what Mem IO leaves after the feature maps (`fig34_io`)."""

    name: str
    layers: list[str]
    ldwb: int                 # ours, bytes
    amd_ldwb: int             # Mem IO minus the maps, bytes (to the printed 1,000 bytes)
    params: int               # the layers' weights and biases
    rows: int = 1

    @property
    def ok(self) -> bool:
        """Within 5 %, or within 500 bytes (Mem IO is printed to 1,000 bytes; it matters for the smallest layers)."""
        return abs(self.ldwb - self.amd_ldwb) <= max(0.05 * self.amd_ldwb, 500)


def compare_fig34(rows: list[dict], ops: dict[str, list[str]]) -> list[LdwbCheck]:
    """Our LdWB (profile rows, layer level, and `layer_ops`) per Figure 34 row that holds parameters; rows one of our
    layers spans (a fused conv pair) are compared as one group. Our layers are placed by the convs they hold."""
    order = {r[0]: k for k, r in enumerate(UG1414_FIG34)}
    parent = {n: n for n in order}
    root = _roots(parent)
    placed = []
    for r in rows:
        if r["level"] != "layer":
            continue
        names = sorted(_known(fig34_row(o) for o in ops.get(r["subgraph"], [])), key=order.__getitem__)
        for n in names[1:]:
            parent[root(n)] = root(names[0])
        if names:
            placed.append((r, names))
    groups: dict[str, list[str]] = {}
    for n in order:
        if fig34_io(n)[0]:
            groups.setdefault(root(n), []).append(n)
    out = []
    for g, members in sorted(groups.items(), key=lambda kv: order[kv[1][0]]):
        rs = [r for r, ns in placed if root(ns[0]) == g]
        amd = sum(round(UG1414_FIG34[order[m]][3] * 1e6) - sum(fig34_io(m)[1:]) for m in members)
        out.append(LdwbCheck(" + ".join(members), [r["subgraph"] for r in rs],
                             round(sum(r["ldwb_mb"] for r in rs) * 2 ** 20), amd,
                             sum(fig34_io(m)[0] for m in members), len(members)))
    return out


def fig34_rt(cmp: list[RowComparison]) -> list[tuple[str, float, float]]:
    """(row, Figure 34 average ms, ours ms) for the Figure 37 comparison rows (`compare_resnet50`, with the per-row
    overhead already added) that Figure 34 lists as the same computation: one row each, not a block whose layers
    the older tools (and we) back-propagate the downsample into (res2c, res3d, res4f: Figure 34 runs them full
    size). An out-of-sample check of the timing fitted on Figure 37."""
    f34 = {r[0]: r[1] for r in UG1414_FIG34}
    return [(c.name, f34[c.name], c.rt) for c in cmp
            if c.rows == 1 and c.name in f34 and c.name[:5] not in _BP_ROWS]


def format_fig34(checks: list[LdwbCheck]) -> str:
    lines = [f"{'Figure 34 row':32s} {'Mem IO':>7s} {'maps':>9s} {'LdWB AMD':>9s} {'ours':>9s} {'params':>9s} "
             f"{'ours/AMD':>8s}"]
    memio = {r[0]: r[3] for r in UG1414_FIG34}
    for c in checks:
        names = c.name.split(" + ")
        maps = sum(sum(fig34_io(n)[1:]) for n in names)
        lines.append(f"{c.name:32s} {sum(memio[n] for n in names):7.3f} {maps:9d} {c.amd_ldwb:9d} {c.ldwb:9d} "
                     f"{c.params:9d} {c.ldwb / c.amd_ldwb:8.4f}{'' if c.ok else ' *'}")
    n, ok = sum(c.rows for c in checks), sum(c.rows for c in checks if c.ok)
    lines.append(f"LdWB within 5 %: {ok}/{n} rows with parameters (the other {len(UG1414_FIG34) - n} of the 31 are "
                 f"fake_downsample subgraphs)")
    return "\n".join(lines)


# The last block of stages 2-4 runs at the next stage's stride in AMD's program (its 3x3 conv and its branch2c + add
# are computed only where the stride-2 1x1 convs of the next stage read: "downsample back-propagation"); vaitrace
# names the rows after it. Our compiler does the same (compiler/downsample.py); its pick of the previous block's
# output (`res2b_downsample_bp`, a 1x1 stride-2 max pool) belongs to that row too.
_BP_ROWS = {"res2c": "res2b_downsample_bp_by_fake_downsample_0", "res3d": "res3c_downsample_bp_by_fake_downsample_1",
            "res4f": "res4e_downsample_bp_by_fake_downsample_2"}
_BLOCK = re.compile(r"(res[2-5][a-f])(?:_(branch1|branch2[abc]))?")


def ug1414_row(layer: str) -> str | None:
    """The UG1414 ResNet-50 row that our `resnet50_caffe` layer `layer` (a layer name of our profile, with or
    without the `subgraph_` prefix) belongs to, or None. AMD's rows group layers as its compiler fuses them:
    conv1 with pool1; the eltwise add with the conv computed last before it (branch1 in a stage's first block,
    branch2c in the others)."""
    n = layer.removeprefix("subgraph_")
    if n in ("conv1", "pool1"):
        return "conv1"
    if n == "fc1000":
        return "fc1000_bias"
    if n == "pool5":
        return n
    if n.endswith("_downsample_bp"):
        prev = n.removesuffix("_downsample_bp")
        nxt = prev[:4] + chr(ord(prev[4]) + 1) if _BLOCK.fullmatch(prev) else ""
        return _BP_ROWS.get(nxt)
    m = _BLOCK.fullmatch(n)
    if not m:
        return None
    blk, br = m.groups()
    if blk in _BP_ROWS:
        if br == "branch2b":
            return blk + "_branch2b_bias"
        if br in ("branch2c", None):
            return _BP_ROWS[blk]
    if br is None or br == "branch1" or (br == "branch2c" and not blk.endswith("a")):
        return blk
    return f"{blk}_{br}"


@dataclass
class RowComparison:
    """UG1414 rows beside ours: one row, or several when one of our layers spans them (a fused pair); sums over
    the layers that `ug1414_row` maps there. RT in ms, sizes in MB; `rows` is how many UG1414 rows it holds."""

    name: str
    layers: list[str]
    wl: float
    rt: float
    ldwb: float
    ldfm: float
    stfm: float
    amd_wl: float
    amd_rt: float
    amd_ldwb: float
    amd_ldfm: float
    amd_stfm: float
    rows: int = 1

    @property
    def rt_ratio(self) -> float:
        return self.rt / self.amd_rt if self.amd_rt else math.inf

    @property
    def ldwb_ok(self) -> bool:
        """LdWB within 5 % (UG1414 prints 3 decimals: values under 0.001 MB count as equal to 0)."""
        if self.amd_ldwb < 0.001:
            return self.ldwb < 0.001
        return abs(self.ldwb / self.amd_ldwb - 1) <= 0.05


def layer_ops(profile) -> dict[str, list[str]]:
    """Layer name -> the ops it holds, for every layer of a `Profile` (a fused layer holds several)."""
    return {ly.name: list(ly.ops) for sp in profile.subgraphs for ly in sp.layers}


def compare_resnet50(rows: list[dict], ops: dict[str, list[str]] | None = None) -> list[RowComparison]:
    """Our profile rows (`Profile.rows()`, layer level) of `resnet50_caffe` grouped onto UG1414's rows, in its
    order. With `ops` (`layer_ops(profile)`), a layer is placed by the ops it holds, and UG1414 rows that one of
    our layers spans (a conv pair we fuse, AMD does not) are compared as one group. A UG1414 row with no layer of
    ours, or a layer of ours with a workload and no row, is an error."""
    order = {r[0]: k for k, r in enumerate(UG1414_RESNET50)}
    parent = {n: n for n in order}
    root = _roots(parent)
    placed: list[tuple[dict, list[str]]] = []
    for r in rows:
        if r["level"] != "layer":
            continue
        names = _known(ug1414_row(o) for o in (ops or {}).get(r["subgraph"], []))
        names = names or _known([ug1414_row(r["subgraph"])])
        if not names:
            if r["wl_gop"] > 0 or r["rt_ms"] > 0:
                raise ValueError(f"layer {r['subgraph']!r} has no UG1414 ResNet-50 row (is the model "
                                 f"resnet50_caffe?)")
            continue
        ns = sorted(names, key=order.__getitem__)
        for n in ns[1:]:
            parent[root(n)] = root(ns[0])
        placed.append((r, ns))
    covered = {n for _, ns in placed for n in ns}
    missing = [n for n in order if n not in covered]
    if missing:
        raise ValueError(f"no layer of ours for UG1414 row(s) {', '.join(missing)} (is the model resnet50_caffe?)")
    groups: dict[str, list[str]] = {}
    for n in order:
        groups.setdefault(root(n), []).append(n)
    ours: dict[str, list[dict]] = {}
    for r, ns in placed:
        ours.setdefault(root(ns[0]), []).append(r)
    out = []
    for g, members in sorted(groups.items(), key=lambda kv: order[kv[1][0]]):
        rs = ours[g]
        amd = [UG1414_RESNET50[order[m]] for m in members]
        wl, rt, ldwb, ldfm, stfm = (sum(r[k] for r in rs) for k in ("wl_gop", "rt_ms", "ldwb_mb", "ldfm_mb", "stfm_mb"))
        out.append(RowComparison(" + ".join(members), [r["subgraph"] for r in rs], wl, rt, ldwb, ldfm, stfm,
                                 sum(a[1] for a in amd), sum(a[2] for a in amd), sum(a[3] for a in amd),
                                 sum(a[4] for a in amd), sum(a[5] for a in amd), rows=len(members)))
    return out


def score(cmp: list[RowComparison], tol: float = 0.25) -> dict:
    """The acceptance figures, counted in UG1414 rows (a group of n rows counts n): rows with RT within `tol`,
    rows with LdWB within 5 %, total RT and its error."""
    rt, amd = sum(c.rt for c in cmp), sum(c.amd_rt for c in cmp)
    n = sum(c.rows for c in cmp)
    within = sum(c.rows for c in cmp if abs(c.rt_ratio - 1) <= tol)
    return {"rows": n, "groups": len(cmp), "rt_within": within, "rt_within_pct": 100.0 * within / n,
            "ldwb_within_5pct": sum(c.rows for c in cmp if c.ldwb_ok), "total_rt_ms": rt, "amd_total_rt_ms": amd,
            "total_rt_err_pct": 100.0 * (rt / amd - 1),
            "mean_abs_log_rt": sum(c.rows * abs(math.log(max(c.rt_ratio, 1e-9))) for c in cmp) / n}


def format_comparison(cmp: list[RowComparison]) -> str:
    head = (f"{'UG1414 row':42s} {'WL':>6s} {'WL ours':>7s} {'RT':>6s} {'RT ours':>7s} {'ratio':>6s} {'LdWB':>6s} "
            f"{'ours':>6s} {'LdFM':>6s} {'ours':>6s} {'StFM':>6s} {'ours':>6s}")
    lines = [head]
    for c in cmp:
        lines.append(f"{c.name:42s} {c.amd_wl:6.3f} {c.wl:7.3f} {c.amd_rt:6.3f} {c.rt:7.3f} {c.rt_ratio:6.2f} "
                     f"{c.amd_ldwb:6.3f} {c.ldwb:6.3f}{'' if c.ldwb_ok else '*'} {c.amd_ldfm:6.3f} {c.ldfm:6.3f} "
                     f"{c.amd_stfm:6.3f} {c.stfm:6.3f}")
    s = score(cmp)
    lines.append(f"{'total':42s} {sum(c.amd_wl for c in cmp):6.3f} {sum(c.wl for c in cmp):7.3f} "
                 f"{s['amd_total_rt_ms']:6.3f} {s['total_rt_ms']:7.3f} {s['total_rt_ms'] / s['amd_total_rt_ms']:6.2f} "
                 f"{sum(c.amd_ldwb for c in cmp):6.3f} {sum(c.ldwb for c in cmp):6.3f}  "
                 f"{sum(c.amd_ldfm for c in cmp):6.3f} {sum(c.ldfm for c in cmp):6.3f} "
                 f"{sum(c.amd_stfm for c in cmp):6.3f} {sum(c.stfm for c in cmp):6.3f}")
    lines.append(f"RT within 25 %: {s['rt_within']}/{s['rows']} rows ({s['rt_within_pct']:.0f} %); total RT "
                 f"{s['total_rt_err_pct']:+.1f} %; LdWB within 5 %: {s['ldwb_within_5pct']}/{s['rows']} rows "
                 f"(* marks the others)")
    return "\n".join(lines)


def with_overhead(cmp: list[RowComparison], overhead_ms: float) -> list[RowComparison]:
    """The comparison with `overhead_ms` added once per UG1414 row: vaitrace's fine-grained mode runs each row as
    its own DPU job, so every row pays the runtime's launch and completion cost once (docs/calibration.md)."""
    return [RowComparison(c.name, c.layers, c.wl, c.rt + c.rows * overhead_ms, c.ldwb, c.ldfm, c.stfm, c.amd_wl,
                          c.amd_rt, c.amd_ldwb, c.amd_ldfm, c.amd_stfm, c.rows) for c in cmp]


def best_overhead(cmp: list[RowComparison], step_ms: float = 0.005, max_ms: float = 0.5) -> float:
    """The per-row overhead (a multiple of `step_ms` up to `max_ms`) with the smallest mean |ln(RT ratio)|."""
    k = min(range(int(round(max_ms / step_ms)) + 1),
            key=lambda i: (score(with_overhead(cmp, i * step_ms))["mean_abs_log_rt"], i))
    return k * step_ms


# PG338's performance table (DPUCZDX8G product guide): model -> (workload GOPs, fps). The excerpt names neither the
# board nor the core count; docs/calibration.md takes the ZCU102 reference design (3 x B4096 at 281 MHz).
PG338_FPS: dict[str, tuple[float, float]] = {
    "Inception-v1": (3.2, 405.0),
    "ResNet50": (7.7, 175.0),
    "SqueezeNet": (0.698, 1048.0),
    "Tiny-YOLO": (6.97, 220.0),
    "YOLO-V2": (82.5, 24.0),
    "YOLO-V3 512x256": (53.7, 43.0),
}
# Our zoo topology and input size (H, W) for each PG338 row, or None where none is built. PG338's 82.5-GOP YOLO-V2
# is darknet's first YOLOv2 VOC release (yolo-voc.2.0.cfg: the passthrough reorgs the 512-channel map directly) at
# 640x640: 34.90 BFLOPs at 416 scale to 82.6 GOPs; the later yolo-voc.cfg / yolov2.cfg fit no standard size.
PG338_ZOO: dict[str, tuple[str, tuple[int, int]] | None] = {
    "Inception-v1": ("inception_v1_caffe", (224, 224)), "ResNet50": ("resnet50_caffe", (224, 224)),
    "SqueezeNet": ("squeezenet", (224, 224)), "Tiny-YOLO": ("tiny_yolo_v2", (416, 416)),
    "YOLO-V2": ("yolov2", (640, 640)), "YOLO-V3 512x256": ("yolov3", (256, 512)),
}


# PG338's I/O bandwidth table: one core at full speed, (average, peak) MB/s per model and architecture. PG338 does not
# define the window of its peak; ours is the largest rate over 1/TRACE_BINS of a frame (docs/calibration.md).
PG338_IO: dict[str, dict[str, tuple[float, float]]] = {
    "Inception-v1": {"B1152": (890.0, 1704.0), "B4096": (2474.0, 4626.0)},
    "ResNet50": {"B1152": (1017.0, 2052.0), "B4096": (3132.0, 5298.0)},
    "SSD ADAS vehicle": {"B1152": (684.0, 1516.0), "B4096": (2049.0, 5724.0)},
    "YOLO-V3-VOC": {"B1152": (986.0, 2076.0), "B4096": (3290.0, 6453.0)},
}
# Our topology for each row (None: no faithful topology; SSD ADAS vehicle is AMD's own detector). YOLO-V3-VOC: darknet
# YOLOv3 with the 20-class head at 416x416 (PG338 gives no size; 416 is the VOC release's).
PG338_IO_ZOO: dict[str, str | None] = {"Inception-v1": "zoo:inception_v1_caffe", "ResNet50": "zoo:resnet50_caffe",
                                       "SSD ADAS vehicle": None, "YOLO-V3-VOC": "zoo:yolov3_voc"}


def io_bandwidth(schedules, clock_mhz: float) -> tuple[float, float]:
    """(average, peak) MB/s (10^6 bytes) of one core running `schedules` (one frame's DPU runs) back to back: all DDR
    bytes over the DPU time, and the largest rate over a 1/TRACE_BINS slice of the frame (sim.multicore's trace)."""
    from opendpu.sim.multicore import TRACE_BINS, demand_trace
    sec = sum(s.total_cycles for s in schedules) / (clock_mhz * 1e6)
    tr = demand_trace(schedules, clock_mhz)
    total = float(sum(int(s.ddr_read.sum() + s.ddr_write.sum()) for s in schedules))
    return total / sec / 1e6, float(tr.max()) / (sec / TRACE_BINS) / 1e6
