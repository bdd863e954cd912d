"""`opendpu targets`: the ISA1 presets."""
from __future__ import annotations

import json

from opendpu.runtime.cli.common import add_verb


def register(sub) -> None:
    t = add_verb(sub, "targets", "list the ISA1 presets")
    t.add_argument("--json", action="store_true", help="print the presets as JSON (Target.to_dict) instead of a table")
    t.set_defaults(fn=run)


def run(a) -> int:
    from opendpu.isa.target import PRESETS, Target
    ts = [Target.from_name(n) for n in PRESETS]
    if a.json:
        print(json.dumps([t.to_dict() for t in ts], indent=1))
        return 0
    print(f"{'name':24s} {'fingerprint':18s} {'PP':>3s} {'CP':>3s} {'ALU_PP':>6s} {'depth':>5s} {'banks':>5s} "
          f"{'ops/cycle':>9s}")
    for t in ts:
        print(f"{t.name:24s} 0x{t.fingerprint:016X} {t.pp:3d} {t.cp:3d} {t.alu_pp:6d} {t.bank_depth:5d} "
              f"{t.num_banks:5d} {t.peak_ops_per_cycle:9d}")
    return 0
