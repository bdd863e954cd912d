"""Program fingerprints (issue 31, item 1): the sha256 of every DPU program's `mc_code` and CONST bytes for the zoo
topologies at small input sizes and the digits CNN, compiled for every preset, against the values recorded in
tests/data/program_fingerprints.json.

This is a guard for moves that must not change a single instruction (splitting the code generator, options as
data): a refactor that changes a program fails here and names the programs. A deliberate change (a new cost model,
a quantizer change) re-records them, in its own commit, with

    .venv/bin/python tests/test_fingerprints.py --update

which prints every entry that changed (`--add-missing` records only the pairs of a newly added model). Each entry
also records the programs' instruction count, so a change can be judged. The default suite checks one preset per
model (cycling through the presets, so every preset appears), except YOLOv2 and the two YOLOv3 heads, whose
quantization alone takes half a minute; `-m slow` checks the whole matrix.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compile_helpers import PRESET_KEYS, compile_model, quantized, target  # noqa: E402
from opendpu.compiler.xir.dpu_abi import CONST  # noqa: E402
from opendpu.quant import zoo  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "program_fingerprints.json")
SIZE = 32                                                   # the smallest input every zoo topology takes
MODELS = [("digits", None)] + [(n, 96 if n == "inception_v3" else SIZE) for n in zoo.NAMES]   # v3 needs >= 75
MATRIX = [(m, s, k) for m, s in MODELS for k in PRESET_KEYS]
_CHEAP = [(m, s) for m, s in MODELS if m not in ("yolov2", "yolov3", "yolov3_voc")]   # 20-40 s to quantize each
FAST = [(m, s, PRESET_KEYS[i % len(PRESET_KEYS)]) for i, (m, s) in enumerate(_CHEAP)]


def key_of(model: str, size: int | None, tkey: str) -> str:
    return f"{model}@{size}/{tkey}" if size else f"{model}/{tkey}"


def fingerprint(model: str, size: int | None, tkey: str) -> dict:
    """sha256 over the programs in name order: name, mc_code, CONST register bytes; and the instruction count."""
    c = compile_model(quantized(model, size), target(tkey), model)
    h = hashlib.sha256()
    n = 0
    for name, p in sorted(c.programs.items()):
        h.update(name.encode() + b"\0")
        h.update(p.mc_code)
        for r in p.registers.registers():
            if r.context == CONST:
                h.update(r.params or b"")
        n += len(p.instructions)
    return {"sha256": h.hexdigest(), "programs": len(c.programs), "instructions": n}


def _recorded() -> dict:
    with open(DATA) as f:
        return json.load(f)


def _check(model: str, size: int | None, tkey: str) -> None:
    want = _recorded().get(key_of(model, size, tkey))
    assert want is not None, f"{key_of(model, size, tkey)} has no recorded fingerprint: run {__file__} --update"
    got = fingerprint(model, size, tkey)
    assert got == want, (f"{key_of(model, size, tkey)}: the compiled programs changed ({want['instructions']} -> "
                         f"{got['instructions']} instructions); if on purpose, re-record with {__file__} --update")


@pytest.mark.parametrize("model,size,tkey", FAST, ids=[key_of(*x) for x in FAST])
def test_fingerprint(model, size, tkey):
    _check(model, size, tkey)


@pytest.mark.slow
@pytest.mark.parametrize("model,size,tkey", [x for x in MATRIX if x not in FAST],
                         ids=[key_of(*x) for x in MATRIX if x not in FAST])
def test_fingerprint_matrix(model, size, tkey):
    _check(model, size, tkey)


def test_matrix_is_recorded():
    """Every (model, preset) pair of the matrix has an entry, and nothing else does."""
    assert set(_recorded()) == {key_of(*x) for x in MATRIX}


def main(argv: list[str]) -> int:
    if argv not in (["--update"], ["--add-missing"]):
        print(f"usage: {sys.argv[0]} --update | --add-missing   (re-record every fingerprint, or only those of new "
              f"(model, preset) pairs; prints what changed)")
        return 2
    old = _recorded() if os.path.exists(DATA) else {}
    new = {}
    for m, s, k in MATRIX:
        if argv == ["--add-missing"] and key_of(m, s, k) in old:
            new[key_of(m, s, k)] = old[key_of(m, s, k)]
            continue
        new[key_of(m, s, k)] = fingerprint(m, s, k)
        was = old.get(key_of(m, s, k))
        if was != new[key_of(m, s, k)]:
            print(f"{key_of(m, s, k)}: {was and was['instructions']} -> {new[key_of(m, s, k)]['instructions']} "
                  f"instructions ({'changed' if was else 'new'})", flush=True)
    os.makedirs(os.path.dirname(DATA), exist_ok=True)
    with open(DATA, "w") as f:
        json.dump(new, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {DATA}: {len(new)} fingerprints, {sum(old.get(k) != v for k, v in new.items())} changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
