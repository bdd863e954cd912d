"""Resource model (hw/resources.py, docs/resources.md): fit on six PG338 presets, predict B1152 and B3136, and the
estimate of every preset beside PG338's figures and our own RTL's synthesis.

    python benchmarks/bench_resources.py [--json OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys

from opendpu.hw import resources as r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the rows as JSON")
    a = ap.parse_args()
    rows = r.validate()
    train = [n for n in r.PG338_DSP if n not in r.HOLDOUT]
    c = r.fit(train)
    print(f"fitted on {', '.join(train)}; held out {', '.join(r.HOLDOUT)}")
    for k, v in c.items():
        print(f"  {k:10s} coefficients {[round(float(x), 4) for x in v]}")
    print(f"\n{'preset':7s} {'model':10s} {'PG338':>7s} {'predicted':>10s} {'error':>8s}")
    for x in rows:
        print(f"{x['preset']:7s} {x['model']:10s} {x['pg338']:7.0f} {x['predicted']:10.1f} {x['error_pct']:+7.2f}%"
              + ("  (held out)" if x["held_out"] else ""))
    worst = max(abs(x["error_pct"]) for x in rows if x["held_out"])
    print(f"\nlargest held-out error: {worst:.2f} % (goal <= 10 %)")
    print(f"\n{'preset':7s} {'DSP':>5s} {'BRAM36':>7s} {'LUT (PG338-scaled)':>19s}   "
          "our RTL (make synth): DSP, BRAM36, LUT, FF")
    for n in r.PG338_DSP:
        e = r.estimate(n)
        ours = r.OURS_SYNTH.get(n)
        o = f"{ours['dsp']}, {ours['bram36']}, {ours['lut']:,}, {ours['ff']:,}" if ours else "-"
        print(f"{n:7s} {e['dsp']:5d} {e['bram36']:7.1f} {e['lut']:19,d}   {o}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"coefficients": {k: [float(x) for x in v] for k, v in c.items()}, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
