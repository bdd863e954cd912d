"""The adversarial campaign of issue 29, kept: one table of (command, expected exit code, text that must appear,
files that must not change) over every verb of `opendpu`.

Each case runs in a fresh directory of its own. `setup` (optional) lays out the scenario there and may add
placeholders; then the CLI runs in-process (`runtime.cli.main`, OPENDPU_DEBUG=1 so an internal error propagates as a
traceback and fails the case) with the case directory as the working directory. After the run:
- the exit code is the expected one, and never 3 (an internal error);
- every text of `must` appears in stdout + stderr (case-insensitive; a tuple means any one of them);
- every file of `keep` (paths relative to the case directory, or placeholders) still exists with its bytes, and
  every file present before the run that is not below `may_change` is unchanged: opendpu deletes or changes no file
  it did not write;
- on exit 2 (a mistake): one line `opendpu VERB: error: ...` on stderr, nothing new on disk, nothing on stdout,
  and (unless `compute` is set) no computation started (the sentinels of tests/test_bad_input.py).

`test_every_verb_has_a_case` makes each verb added to the parser join the table.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

from opendpu.runtime.cli import build_parser
from opendpu.runtime.cli import main as cli_main
from tests.conftest import MODELS, REPO

MNIST_SRC = os.path.join(MODELS, "dpu_mnist_classifier.xmodel")
DIGITS_SRC = os.path.join(REPO, "quant", "models", "digits_cnn.onnx")
ERR_LINE = re.compile(r"^opendpu(?: (?P<verb>[a-z]+))?: error: (?P<msg>.+)$")
pytestmark = pytest.mark.skipif(not os.path.isfile(MNIST_SRC), reason=f"shared models not present in {MODELS}")


# ====================================================================================================================
# shared inputs: made once per module in a read-only spirit (cases copy what they change)
# ====================================================================================================================
@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Placeholders every case may use: {mnist} (AMD's MNIST xmodel), {onnx} (the digits CNN, NCHW [N,1,8,8]),
    {calib} (40 digits images), {x} (an MNIST input), {q} (the digits CNN quantized for B512), {qdir} (its
    quantize output directory)."""
    d = tmp_path_factory.mktemp("campaign_inputs")
    p: dict[str, str] = {}
    p["mnist"] = str(d / "mnist.xmodel")
    shutil.copyfile(MNIST_SRC, p["mnist"])
    p["onnx"] = str(d / "digits_cnn.onnx")
    shutil.copyfile(DIGITS_SRC, p["onnx"])
    from opendpu.quant import zoo
    xtr = zoo.digits_data()[0]
    p["calib"] = str(d / "calib.npy")
    np.save(p["calib"], xtr[:40].astype(np.float32))
    p["x"] = str(d / "x.npy")
    np.save(p["x"], np.random.default_rng(0).random((1, 28, 28, 1)).astype(np.float32))
    p["qdir"] = str(d / "q")
    assert cli_main(["quantize", p["onnx"], "--calib", p["calib"], "-o", p["qdir"], "--target",
                     "DPUCZDX8G_ISA1_B512", "--method", "maxmin"]) == 0
    p["q"] = os.path.join(p["qdir"], "digits_cnn_int.xmodel")
    return p


# ====================================================================================================================
# the harness
# ====================================================================================================================
@dataclass
class Case:
    id: str
    argv: str | list            # a template (split on spaces) or a list of templates, formatted with the placeholders
    code: int = 2               # the expected exit code
    must: list = field(default_factory=list)       # texts that must appear in stdout + stderr
    keep: list = field(default_factory=list)       # files that must survive unchanged (templates)
    setup: Callable[[str, dict], None] | None = None   # (case directory, placeholders) -> lays out the scenario
    before: list = field(default_factory=list)     # argv templates run first (each must exit 0): earlier results
    may_change: list = field(default_factory=list)  # directories (templates) whose opendpu files may change
    compute: bool = False       # exit 2 found after work started is allowed (no sentinels)

    def fmt(self, s: str, p: dict) -> str:
        return s.format(**p)

    def args(self, tmpl: str | list, p: dict) -> list[str]:
        parts = tmpl.split() if isinstance(tmpl, str) else list(tmpl)
        return [self.fmt(x, p) for x in parts]


def _hash(p: str) -> str:
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _files(root: str) -> dict[str, str]:
    """Every regular file below root (symlinks not followed) -> content hash."""
    out = {}
    for r, dirs, files in os.walk(root):
        for f in files:
            q = os.path.join(r, f)
            if os.path.isfile(q) and not os.path.islink(q):
                out[os.path.relpath(q, root)] = _hash(q)
    return out


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = cli_main(list(argv))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    out, err = capsys.readouterr()
    return code, out, err


def check(case: Case, inputs: dict, tmp_path, monkeypatch, capsys) -> tuple[int, str, str]:
    from tests.test_bad_input import COMPUTE, _install_sentinels
    root = str(tmp_path / "case")
    outside = str(tmp_path / "outside")          # a directory beside the case: symlink escapes point here
    os.makedirs(root)
    os.makedirs(outside)
    p = {**inputs, "root": root, "outside": outside}
    monkeypatch.setenv("OPENDPU_DEBUG", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.chdir(root)
    if case.setup:
        case.setup(root, p)
    for b in case.before:
        code, out, err = _run(case.args(b, p), capsys)
        assert code == 0, f"setup command opendpu {b} exited {code}:\n{err}{out[-1500:]}"
    before_root, before_out = _files(root), _files(outside)
    before_inputs = {k: _hash(v) for k, v in inputs.items() if os.path.isfile(v)}
    argv = case.args(case.argv, p)
    if case.code == 2 and not case.compute:
        with monkeypatch.context() as m:
            _install_sentinels(m, COMPUTE)
            code, out, err = _run(argv, capsys)
    else:
        code, out, err = _run(argv, capsys)
    text = out + err
    assert "Traceback" not in text, text
    assert code != 3, f"opendpu {' '.join(argv)}: internal error (exit 3)\n{text[-3000:]}"
    assert code == case.code, f"opendpu {' '.join(argv)}: exit {code}, expected {case.code}\n{text[-3000:]}"
    low = text.lower()
    for s in case.must:
        alts = (s,) if isinstance(s, str) else tuple(s)
        alts = tuple(case.fmt(a, p).lower() for a in alts)
        assert any(a in low for a in alts), f"output does not contain {alts}:\n{text[-3000:]}"
    # files that are not opendpu's: unchanged
    after_root, after_out = _files(root), _files(outside)
    assert after_out == before_out, f"a file outside the case directory changed: {before_out} -> {after_out}"
    free = [os.path.relpath(case.fmt(d, p), root) for d in case.may_change]
    for rel, h in before_root.items():
        if any(rel == f or rel.startswith(f.rstrip("/") + "/") for f in free) and \
                not any(os.path.join(root, rel) == os.path.join(root, case.fmt(k, p)) for k in case.keep):
            continue
        assert after_root.get(rel) == h, f"{rel} was {'changed' if rel in after_root else 'deleted'}"
    for k in case.keep:
        q = os.path.join(root, case.fmt(k, p))
        assert os.path.isfile(q), f"{k} was deleted"
    assert {k: _hash(v) for k, v in inputs.items() if os.path.isfile(v)} == before_inputs, "a shared input changed"
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, f"expected one error line, got:\n{err}"
        assert ERR_LINE.match(lines[0]), lines[0]
        assert after_root == before_root, "a failed command left files behind"
        assert out.strip() == "", f"stdout not empty on an error:\n{out[-2000:]}"
    return code, out, err


# ====================================================================================================================
# the table: one section per area of issue 29; CAMPAIGN is their concatenation
# ====================================================================================================================
# ---- 1, 2: outputs (markers, symlinks, second nets, probes, name length) ----------------------------------------
OUTPUT_CASES: list[Case] = [
]

# ---- 2, 3: sweep specs, modes, ignored options --------------------------------------------------------------------
SWEEP_CASES: list[Case] = [
]

# ---- 3, 4, 5: plugins, evaluation data, layouts, messages ---------------------------------------------------------
DATA_CASES: list[Case] = [
]

# ---- 6: boards with any array ---------------------------------------------------------------------------------------
BOARD_CASES: list[Case] = [
]

# ---- one ordinary mistake per verb ----------------------------------------------------------------------------------
def _user_files(root: str, p: dict) -> None:
    """A working directory with the user's own files beside where opendpu writes."""
    with open(os.path.join(root, "notes.txt"), "w") as f:
        f.write("the user's notes\n")
    np.save(os.path.join(root, "mine.npy"), np.arange(5))


VERB_CASES: list[Case] = [
    Case("run_missing_input", "run {mnist} -i {root}/nonexistent.npy -o r.npz", must=["nonexistent.npy", "no such"]),
    Case("check_zero_inputs", "check {mnist} -n 0", must=["-n", "out of range"]),
    Case("races_unknown_subgraph", "races {mnist} --subgraph nope", must=["--subgraph", "nope"]),
    Case("disasm_missing_model", "disasm {root}/nonexistent.xmodel", must=["nonexistent.xmodel", "no such file"]),
    Case("xmodel_not_an_xmodel", "xmodel {calib}", must=["calib.npy", "not an xmodel"]),
    Case("targets_unknown_option", "targets --bogus", must=["--bogus"]),
    Case("profile_bad_timing", "profile {mnist} --timing ddr_latency=-3", must=["ddr_latency"]),
    Case("sweep_unknown_param", "sweep {mnist} --param nonsense=1,2", must=["nonsense"]),
    Case("cosim_unknown_simulator", "cosim {mnist} --rtl-sim nope", must=["--rtl-sim", "nope"]),
    Case("quantize_calib_shape", "quantize {onnx} --calib {x} -o q", must=["x.npy"]),
    Case("inspect_unknown_target", "inspect {onnx} --target B9999", must=["B9999"]),
    Case("zoo_unknown_model", "zoo nosuchnet", must=["nosuchnet"]),
    Case("compile_no_target", "compile -x {q} -o c -n net", must=["target"]),
    Case("build_unknown_target", "build {onnx} --calib {calib} --target B9999 -o b", must=["B9999"]),
    Case("compare_missing_build", "compare {onnx} {root}/nonexistent --data {calib}", must=["nonexistent"]),
    # ordinary successes beside the user's files: nothing of the user's changes
    Case("run_beside_user_files", "run {mnist} -i {x} -o r.npz --backend ref", code=0, setup=_user_files,
         keep=["notes.txt", "mine.npy"], must=["wrote r.npz"]),
    Case("quantize_beside_user_files", "quantize {onnx} --calib {calib} -o q --target DPUCZDX8G_ISA1_B512",
         code=0, setup=_user_files, keep=["notes.txt", "mine.npy"]),
    Case("targets_lists_presets", "targets", code=0, must=["DPUCZDX8G_ISA1_B4096"]),
]

CAMPAIGN: list[Case] = OUTPUT_CASES + SWEEP_CASES + DATA_CASES + BOARD_CASES + VERB_CASES


def _ids(cases):
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    return ids


@pytest.mark.parametrize("case", CAMPAIGN, ids=_ids(CAMPAIGN))
def test_campaign(case, inputs, tmp_path, monkeypatch, capsys):
    check(case, inputs, tmp_path, monkeypatch, capsys)


def test_every_verb_has_a_case():
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    verbs = set(sub.choices)
    covered = set()
    for c in CAMPAIGN:
        parts = c.argv.split() if isinstance(c.argv, str) else c.argv
        covered.add(parts[0])
    assert verbs <= covered, f"verbs without a campaign case: {sorted(verbs - covered)}"
