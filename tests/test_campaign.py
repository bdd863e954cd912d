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
    added = sorted(set(after_root) - set(before_root))
    removed = sorted(set(before_root) - set(after_root))
    changed = sorted(k for k in before_root if k in after_root and after_root[k] != before_root[k])
    first = next((ln for ln in err.splitlines() if ln.strip()), "") or next(
        (ln for ln in out.splitlines() if ln.strip()), "")
    # one line per case for the closing note's table (pytest -s tests/test_campaign.py | grep ^CAMPAIGN)
    print(f"\nCAMPAIGN | {case.id} | {code} | {first[:160]} | {len(before_root)} files before, +{len(added)} "
          f"-{len(removed)} ~{len(changed)} (removed/changed: opendpu's own) | keep {len(case.keep)} intact")
    return code, out, err


# ====================================================================================================================
# the table: one section per area of issue 29; CAMPAIGN is their concatenation
# ====================================================================================================================
# ---- 1, 2: outputs (markers, symlinks, second nets, probes, name length) ----------------------------------------
B512 = "--target DPUCZDX8G_ISA1_B512"
COMPILE_Q = "compile -x {q} " + B512
QUANTIZE = "quantize {onnx} --calib {calib} " + B512 + " --method maxmin"
BUILD = "build {onnx} --calib {calib} " + B512


def _write_marker(d: str, files) -> None:
    """An `.opendpu-output` marker as a copied template or a restored archive may carry: `files` is a list (the old
    form) or {rel: record}."""
    import json
    with open(os.path.join(d, ".opendpu-output"), "w") as f:
        json.dump({"tool": "opendpu", **({} if isinstance(files, list) else {"version": 2}), "files": files}, f)


def _marked_keep(sub: str, form: str, net: str = "net"):
    """`sub/` holds the user's keep.txt, which its marker lists: in the old form (names only), or in version 2
    with a hash that does not match (a marker copied with a template whose keep.txt was edited since)."""
    def setup(root, p):
        d = os.path.join(root, sub)
        os.makedirs(d)
        with open(os.path.join(d, "keep.txt"), "w") as f:
            f.write("the user's notes\n")
        _write_marker(d, ["keep.txt"] if form == "old" else
                      {"keep.txt": {"size": 17, "sha256": "0" * 64, "net": net}})
    return setup


def _symlink_escape(sub: str, form: str, net: str = "net"):
    """`sub/lnk` points to {outside}, which holds victim.txt; the marker lists lnk/victim.txt (old form, or version 2
    with victim.txt's true size and hash and the net of the run: the worst case)."""
    def setup(root, p):
        d = os.path.join(root, sub)
        os.makedirs(d)
        victim = os.path.join(p["outside"], "victim.txt")
        with open(victim, "w") as f:
            f.write("not opendpu's\n")
        os.symlink(p["outside"], os.path.join(d, "lnk"))
        _write_marker(d, ["lnk/victim.txt"] if form == "old" else
                      {"lnk/victim.txt": {"size": os.path.getsize(victim), "sha256": _hash(victim), "net": net}})
    return setup


def _edited_own(sub: str, name: str, net: str):
    """`sub/name` is listed in a version-2 marker as net's output, but its bytes changed since (the user's now)."""
    def setup(root, p):
        d = os.path.join(root, sub)
        os.makedirs(d)
        with open(os.path.join(d, name), "w") as f:
            f.write("edited by the user\n")
        _write_marker(d, {name: {"size": 3, "sha256": "1" * 64, "net": net}})
    return setup


def _need_dir(path: str):
    def setup(root, p):
        if not os.path.isdir(path):
            pytest.skip(f"{path} is not mounted here")
    return setup


def _long_model(root, p):
    """{long_onnx}: the digits CNN under a 250-byte file name, so <stem>_int.xmodel exceeds NAME_MAX."""
    p["long_onnx"] = os.path.join(root, "m" * 245 + ".onnx")
    shutil.copyfile(p["onnx"], p["long_onnx"])


def _second_model(root, p):
    """{other}: the digits CNN under another name: a second net for quantize."""
    p["other"] = os.path.join(root, "other.onnx")
    shutil.copyfile(p["onnx"], p["other"])


LONG_NAME = "n" * 300
def _deep_marker(root, p):
    """c/ holds the user's file and a marker nested far beyond Python's recursion limit."""
    d = os.path.join(root, "c")
    os.makedirs(d)
    with open(os.path.join(d, "keep.txt"), "w") as f:
        f.write("the user's notes\n")
    with open(os.path.join(d, ".opendpu-output"), "w") as f:
        f.write("[" * 100000 + "]" * 100000)


def _golden_foreign(root, p):
    """q/ is an earlier quantize output of the digits CNN with the user's file added to its golden/."""
    q = os.path.join(root, "q")
    assert cli_main(QUANTIZE.format(**p).split() + ["-o", q]) == 0
    with open(os.path.join(q, "golden", "mine.txt"), "w") as f:
        f.write("the user's notes\n")


OUTPUT_CASES: list[Case] = [
    # golden/ takes files named after the graph's tensors: a file there that is not opendpu's is found before work
    Case("quantize_foreign_file_in_golden", QUANTIZE + " -o q", must=["golden/mine.txt", "not written by opendpu"],
         setup=_golden_foreign),
    Case("quantize_foreign_file_in_golden_force", QUANTIZE + " -o q --force", 0, keep=["q/golden/mine.txt"],
         setup=_golden_foreign, may_change=["q"]),
    # a marker opendpu cannot have written (nested 100,000 deep) is no marker: the directory is foreign
    Case("compile_deep_marker_is_foreign", COMPILE_Q + " -o c -n net", must=["not written by opendpu"],
         setup=_deep_marker),
    # a marker lists a file opendpu did not write: it survives, and the run says why
    Case("compile_old_marker_lists_foreign_file", COMPILE_Q + " -o c -n net", 0, must=["none was removed"],
         keep=["c/keep.txt"], setup=_marked_keep("c", "old"), may_change=["c"]),
    Case("compile_marker_hash_mismatch_keeps_file", COMPILE_Q + " -o c -n net", 0, must=["kept", "changed since"],
         keep=["c/keep.txt"], setup=_marked_keep("c", "v2"), may_change=["c"]),
    Case("quantize_old_marker_lists_foreign_file", QUANTIZE + " -o q", 0, must=["none was removed"],
         keep=["q/keep.txt"], setup=_marked_keep("q", "old"), may_change=["q"]),
    Case("quantize_marker_hash_mismatch_keeps_file", QUANTIZE + " -o q", 0, must=["changed since"],
         keep=["q/keep.txt"], setup=_marked_keep("q", "v2", net="digits_cnn"), may_change=["q"]),
    # a marker entry through a symlink: the file outside -o survives (the harness checks {outside} is unchanged)
    Case("compile_symlink_escape", COMPILE_Q + " -o c -n net", 0, must=["symlink"],
         setup=_symlink_escape("c", "v2"), may_change=["c"]),
    Case("compile_symlink_escape_old_marker", COMPILE_Q + " -o c -n net", 0, setup=_symlink_escape("c", "old"),
         may_change=["c"]),
    Case("quantize_symlink_escape", QUANTIZE + " -o q", 0, must=["symlink"],
         setup=_symlink_escape("q", "v2", net="digits_cnn"), may_change=["q"]),
    # earlier results of other nets are kept; names every net writes are taken over, and that is said
    Case("compile_second_net_keeps_first", COMPILE_Q + " -o c -n second", 0, must=["net first", "meta.json"],
         keep=["c/first.xmodel", "c/first_org.xmodel"], before=[COMPILE_Q + " -o c -n first"], may_change=["c"]),
    Case("quantize_second_net_keeps_first", "quantize {other} --calib {calib} " + B512 + " -o q", 0,
         must=["net digits_cnn"], keep=["q/digits_cnn_int.xmodel", "q/digits_cnn_int.onnx"], setup=_second_model,
         before=[QUANTIZE + " -o q"], may_change=["q"]),
    Case("zoo_second_export_keeps_first", "zoo resnet18 --size 32 --export d", 0, keep=["d/squeezenet.onnx"],
         before=["zoo squeezenet --size 32 --export d"], may_change=["d"]),
    # a rerun of the same net removes its own stale files, each printed
    Case("compile_rerun_removes_own_stale_file", COMPILE_Q + " -o c -n net", 0,
         must=["removed stale c/dump_after_partition.json (written by the earlier run of net net)"],
         keep=["c/net.xmodel"], before=[COMPILE_Q + " -o c -n net --dump-after partition"], may_change=["c"]),
    # a file of an output name that is not opendpu's unchanged output: refused before any work; --force names it
    Case("compile_edited_output_refused", COMPILE_Q + " -o c -n net", must=["c: net.xmodel", "changed since",
                                                                          "--force"],
         setup=_edited_own("c", "net.xmodel", "net")),
    Case("compile_edited_output_forced", COMPILE_Q + " -o c -n net --force", 0, must=["replaced c/net.xmodel",
                                                                                     "--force"],
         setup=_edited_own("c", "net.xmodel", "net"), may_change=["c"]),
    Case("quantize_edited_quant_info_refused", QUANTIZE + " -o q", must=["quant_info.json", "changed since"],
         setup=_edited_own("q", "quant_info.json", "digits_cnn")),
    Case("zoo_export_edited_model_refused", "zoo resnet18 --size 32 --export d", must=["resnet18.onnx", "--force"],
         setup=_edited_own("d", "resnet18.onnx", "resnet18")),
    # outputs that cannot be created: found by a real probe, before any work, for root too
    Case("compile_o_proc", COMPILE_Q + " -o /proc/x -n net", must=["/proc"], setup=_need_dir("/proc")),
    Case("compile_o_sys", COMPILE_Q + " -o /sys/x -n net", must=["/sys"], setup=_need_dir("/sys")),
    Case("quantize_o_proc", QUANTIZE + " -o /proc/x", must=["/proc"], setup=_need_dir("/proc")),
    Case("quantize_o_sys", QUANTIZE + " -o /sys/x", must=["/sys"], setup=_need_dir("/sys")),
    Case("build_o_proc", BUILD + " -o /proc/x", must=["/proc"], setup=_need_dir("/proc")),
    Case("build_o_sys", BUILD + " -o /sys/x", must=["/sys"], setup=_need_dir("/sys")),
    Case("inspect_o_proc", "inspect {onnx} " + B512 + " -o /proc/x", must=["/proc"], setup=_need_dir("/proc")),
    Case("zoo_export_sys", "zoo resnet18 --size 32 --export /sys/x", must=["/sys"], setup=_need_dir("/sys")),
    Case("run_dump_proc", "run {mnist} -i {x} --backend ref --dump /proc/x", must=["/proc"],
         setup=_need_dir("/proc")),
    Case("run_o_proc", "run {mnist} -i {x} --backend ref -o /proc/out.npz", must=["/proc"],
         setup=_need_dir("/proc")),
    Case("cosim_waves_sys", "cosim --random 1 " + B512 + " --waves /sys/x", must=["/sys"], setup=_need_dir("/sys")),
    Case("profile_json_proc_missing_dir", "profile {mnist} --json /proc/x/p.json", must=["/proc/x"],
         setup=_need_dir("/proc")),
    Case("profile_json_proc", "profile {mnist} --trace t.json --json /proc/p.json", must=["/proc"],
         setup=_need_dir("/proc")),
    Case("profile_json_sys", "profile {mnist} --json /sys/p.json", must=["/sys"], setup=_need_dir("/sys")),
    # file names longer than the file system allows: found before any work
    Case("compile_net_name_300", COMPILE_Q + " -o c -n " + LONG_NAME, must=["300 bytes", "255"]),
    Case("build_net_name_300", BUILD + " -o b -n " + LONG_NAME, must=["300 bytes", "255"]),
    Case("quantize_long_model_stem", "quantize {long_onnx} --calib {calib} " + B512 + " -o q",
         must=["bytes long", "allows"], setup=_long_model),
    # build names the final paths, not those of its temporary directory
    Case("build_prints_final_paths", BUILD + " -o b", 0, must=["wrote xmodel     b/quantized/digits_cnn_int.xmodel",
                                                              "wrote b/compiled/digits_cnn.xmodel"]),
]

# ---- 2, 3: sweep specs, modes, ignored options --------------------------------------------------------------------
_SW_DIGITS = "[[model]]\nzoo = \"digits\"\n"
_SW_SPACE = "[[space]]\npreset = [\"B512\"]\n"


def _sw_file(name: str, data: str | bytes):
    """A setup that writes one file (text, or bytes as they are) into the case directory."""
    def setup(root: str, p: dict) -> None:
        with open(os.path.join(root, name), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
    return setup


def _sw_spec(body: str):
    """A setup that writes spec.toml: the digits CNN, then `body` (the keys under test)."""
    return _sw_file("spec.toml", _SW_DIGITS + body)


SW_ARCH = "sweep zoo:digits --param preset=B512,B1024 -o sw --cache cache"     # an architecture sweep
SW_TIMING = "sweep {mnist} --param ddr_latency=40,80"                          # a timing-only sweep
SWEEP_CASES: list[Case] = [
    # specs: bytes, syntax, every key's type, before any work
    Case("sweep_spec_not_utf8", "sweep --spec spec.toml -o sw --cache cache", must=["spec.toml", "not UTF-8"],
         setup=_sw_file("spec.toml", b"seed = 1\nname = \"\xff\xfe\"\n")),
    Case("sweep_spec_nested_too_deep", "sweep --spec spec.toml -o sw --cache cache", must=["spec.toml", "nested"],
         setup=_sw_spec("a = " + "[" * 5000 + "]" * 5000 + "\n")),
    Case("sweep_spec_bad_toml", "sweep --spec spec.toml -o sw", must=["spec.toml", "not valid TOML"],
         setup=_sw_spec("[[space]\n")),
    Case("sweep_spec_name_int", "sweep --spec spec.toml -o sw --cache cache",
         must=["spec.toml", "model[0]", "name must be a non-empty string", "integer"],
         setup=_sw_spec("name = 5\n" + _SW_SPACE)),
    Case("sweep_spec_zoo_list", "sweep --spec spec.toml -o sw", must=["model[0]", "zoo must be", "a list"],
         setup=_sw_file("spec.toml", "[[model]]\nzoo = [\"digits\"]\n" + _SW_SPACE)),
    Case("sweep_spec_size_string", "sweep --spec spec.toml -o sw", must=["size must be an integer or [H, W]"],
         setup=_sw_file("spec.toml", "[[model]]\nzoo = \"resnet18\"\nsize = \"64\"\n" + _SW_SPACE)),
    Case("sweep_spec_size_on_file", "sweep --spec spec.toml -o sw", must=["size is for zoo models"],
         setup=lambda root, p: _sw_file("spec.toml", f"[[model]]\npath = \"{p['onnx']}\"\nsize = 64\n"
                                        + _SW_SPACE)(root, p)),
    Case("sweep_spec_calib_on_zoo", "sweep --spec spec.toml -o sw", must=["calib is for ONNX files"],
         setup=_sw_spec("calib = \"c.npy\"\n" + _SW_SPACE)),
    Case("sweep_spec_constraints_int", "sweep --spec spec.toml -o sw", must=["constraints must be a string"],
         setup=_sw_file("spec.toml", "constraints = 5\n" + _SW_DIGITS + _SW_SPACE)),
    Case("sweep_spec_space_single_table", "sweep --spec spec.toml -o sw", must=["[[space]]", "double brackets"],
         setup=_sw_spec("[space]\npreset = [\"B512\"]\n")),
    Case("sweep_spec_seed_string", "sweep --spec spec.toml -o sw", must=["seed", "must be an integer"],
         setup=_sw_file("spec.toml", "seed = \"7\"\n" + _SW_DIGITS + _SW_SPACE)),
    Case("sweep_spec_value_nan", "sweep --spec spec.toml -o sw", must=["space[0]", "pp", "not a finite number"],
         setup=_sw_spec("[[space]]\npp = [nan]\ncp = [8]\n")),
    Case("sweep_spec_value_table", "sweep --spec spec.toml -o sw", must=["space[0]", "pp", "not a number"],
         setup=_sw_spec("[[space]]\npp = [{a = 1}]\ncp = [8]\n")),
    Case("sweep_spec_samples_in_grid", "sweep --spec spec.toml -o sw", must=["samples is only for mode", "grid"],
         setup=_sw_spec("[[space]]\nmode = \"grid\"\nsamples = 2\npp = [4, 8]\ncp = [8]\n")),
    Case("sweep_spec_samples_beyond_grid", "sweep --spec spec.toml -o sw", must=["samples = 9", "2 point(s)"],
         setup=_sw_spec("[[space]]\nmode = \"random\"\nsamples = 9\npp = [4, 8]\ncp = [8]\n")),
    Case("sweep_spec_list_with_axes", "sweep --spec spec.toml -o sw", must=["mode list", "pp", "ignored"],
         setup=_sw_spec("[[space]]\npp = [4]\npoints = [{preset = \"B512\"}]\n")),
    # models: a text file named .onnx is not an ONNX model (the quantizer's loader says so), before any work
    Case("sweep_text_named_onnx", "sweep fake.onnx --param preset=B512 -o sw --cache cache",
         must=["fake.onnx", "not an ONNX model"], setup=_sw_file("fake.onnx", "hello, not a protobuf\n")),
    Case("sweep_calib_without_onnx_model", SW_ARCH + " --calib {calib}", must=["--calib", "no MODEL argument"]),
    # --cache / --plot / -o: directories (existing or creatable), never a file; found before the sweep
    Case("sweep_cache_is_a_file", "sweep zoo:digits --param preset=B512 -o sw --cache afile",
         must=["--cache", "afile", "not a directory"], setup=_sw_file("afile", "mine\n"), keep=["afile"]),
    Case("sweep_plot_is_a_file", SW_ARCH + " --plot afile", must=["--plot", "afile", "not a directory"],
         setup=_sw_file("afile", "mine\n"), keep=["afile"]),
    Case("sweep_output_is_a_file", "sweep zoo:digits --param preset=B512 -o afile --cache cache",
         must=["afile", "is a file"], setup=_sw_file("afile", "mine\n"), keep=["afile"]),
    Case("sweep_plot_foreign_directory", SW_ARCH + " --plot figs", must=["--plot", "figs", "not empty"],
         setup=lambda root, p: (os.makedirs(os.path.join(root, "figs")),
                                _sw_file("figs/mine.png", b"png")(root, p)), keep=["figs/mine.png"]),
    # modes: named, never switched by an option; an option of the other mode is an error naming the mode
    Case("sweep_timing_with_output", SW_TIMING + " -o sw", must=["-o", "timing-only mode", "--csv",
                                                                 "architecture parameter"]),
    Case("sweep_timing_with_plot", SW_TIMING + " --plot figs", must=["--plot", "timing-only mode"]),
    Case("sweep_timing_with_samples", SW_TIMING + " --samples 1", must=["--samples", "timing-only mode"]),
    Case("sweep_timing_with_constraint", ["sweep", "{mnist}", "--param", "ddr_latency=40,80", "--constraint",
                                          "dsp <= 1248"], must=["--constraint", "timing-only mode"]),
    Case("sweep_timing_with_executor", SW_TIMING + " --executor ray", must=["--executor", "timing-only mode"]),
    Case("sweep_timing_with_verify_rtl", SW_TIMING + " --verify-rtl 1", must=["--verify-rtl", "timing-only mode"]),
    Case("sweep_timing_with_cache", SW_TIMING + " --cache cache", must=["--cache", "timing-only mode"]),
    Case("sweep_quantized_model_is_architecture", "sweep {q} --param ddr_latency=40,80",
         must=["architecture mode", "quantized xmodel, not a compiled one", "-o DIR"]),
    Case("sweep_quantized_model_needs_an_array", "sweep {q} --param ddr_latency=40,80 -o sw --cache cache",
         must=["architecture mode", "give a preset, a board, or both pp and cp"]),
    Case("sweep_arch_with_csv", SW_ARCH + " --csv s.csv", must=["--csv", "architecture mode", "timing-only mode"]),
    Case("sweep_arch_with_target", "sweep {onnx} --param preset=B512 -o sw --target DPUCZDX8G_ISA1_B512",
         must=["--target", "architecture mode", "{onnx} is not a compiled .xmodel"]),
    Case("sweep_compiled_model_with_arch_param_csv", "sweep {mnist} --param preset=B512 -o sw --csv s.csv",
         must=["--csv", "architecture mode", "--param preset is an architecture parameter"]),
    # combinations that would be ignored
    Case("sweep_address_without_ray", SW_ARCH + " --address 127.0.0.1:6379", must=["--address", "--executor ray"]),
    Case("sweep_workers_with_ray", SW_ARCH + " --executor ray --workers 2", must=["--workers", "--executor ray"]),
    Case("sweep_heatmap_without_plot", SW_ARCH + " --heatmap preset,pp", must=["--heatmap", "--plot DIR"]),
    Case("sweep_breakdown_not_a_hash", SW_ARCH + " --plot sw/plots --breakdown abc",
         must=["--breakdown", "16 hex digits"]),
    Case("sweep_samples_beyond_grid", SW_ARCH + " --samples 5", must=["--samples 5", "only 2 point(s)"]),
    Case("sweep_samples_without_param", "sweep --spec spec.toml -o sw --samples 2", must=["--samples", "--param"],
         setup=_sw_spec(_SW_SPACE)),
    # constraints: on parameters and resources, decided before any compile; on results, a stated line
    Case("sweep_constraint_excludes_every_point", ["sweep", "zoo:digits", "--param", "preset=B1024,B4096",
                                                   "--constraint", "dsp <= 100", "-o", "sw", "--cache", "cache"],
         must=["dsp <= 100", "exclude every point", "194"]),
    Case("sweep_constraint_on_results_met_by_none", ["sweep", "zoo:digits", "--param", "preset=B512",
                                                     "--constraint", "fps >= 1e12", "-o", "sw", "--cache", "cache"],
         code=0, must=["sweep: architecture mode (compile per point; zoo:digits is a zoo model)",
                       "checked on each computed point", "no ok point meets the constraint(s) fps >= 1e+12",
                       "pareto.csv is empty"]),
    Case("sweep_timing_names_its_mode", SW_TIMING + " --csv s.csv", code=0,
         must=["sweep: timing-only mode (one compiled program, timing parameters)", "to s.csv"]),
]

# ---- 3, 4, 5: plugins, evaluation data, layouts, messages ---------------------------------------------------------
def _text(name: str, text: str):
    """A setup that writes one text file into the case directory."""
    def setup(root: str, p: dict) -> None:
        with open(os.path.join(root, name), "w") as f:
            f.write(text)
    return setup


def _plugin(name: str, body: str):
    """A setup that writes an --op-plugin module (the registrations of one that fails are undone by the CLI)."""
    return _text(name, "import sys\nfrom opendpu.runtime import register_op\n" + body)


DEEP = "[" * 100000 + "]" * 100000                   # nested beyond Python's recursion limit
DEEP_OBJECT = '{{"a":' * 5000 + "1" + "}}" * 5000     # a template: {{ }} are the braces after formatting


def _labels(name: str, fn):
    """A setup that writes name.npz: the 40 calibration images as 'x' and labels fn(i) as 'y'."""
    def setup(root: str, p: dict) -> None:
        x = np.load(p["calib"])
        np.savez(os.path.join(root, name), x=x, y=np.array([fn(i) for i in range(len(x))]))
    return setup


def _calib_data(name: str, fn):
    """A setup that writes name.npy: fn(the 40 calibration images) (constant, repeated, an outlier, ...)."""
    def setup(root: str, p: dict) -> None:
        np.save(os.path.join(root, name), fn(np.load(p["calib"])).astype(np.float32))
    return setup


def _outlier(x):
    x = x.copy()
    x[3] *= 1000
    return x


def _fake_build(root: str, p: dict) -> None:
    """A build directory `b` whose meta.json is nested 100000 levels deep."""
    os.makedirs(os.path.join(root, "b"))
    with open(os.path.join(root, "b", "meta.json"), "w") as f:
        f.write(DEEP)


def _dynamic_model(root: str, p: dict) -> None:
    """{dyn}: the digits CNN with dynamic H and W (input [1, 1, 'H', 'W'])."""
    import onnx
    m = onnx.load(p["onnx"])
    for k, name in ((2, "H"), (3, "W")):
        d = m.graph.input[0].type.tensor_type.shape.dim[k]
        d.ClearField("dim_value")
        d.dim_param = name
    p["dyn"] = os.path.join(root, "dyn.onnx")
    onnx.save(m, p["dyn"])


COMPILE_C = COMPILE_Q + " -o c -n net"                 # a compiled digits CNN in c/, for compare
Q_DIGITS = "quantize {onnx} " + B512 + " --method maxmin"        # QUANTIZE, the calibration data left to the case
DATA_CASES: list[Case] = [
    # the accuracy verdict (issue 30 part 5): a floor that is no number is a mistake; a build below it fails (exit 1)
    # after writing its outputs, all opendpu's own under b/
    Case("build_min_sqnr_nan", BUILD + " -o b --min-sqnr nan", must=["--min-sqnr", "finite"]),
    Case("build_below_min_sqnr", BUILD + " -o b --min-sqnr 200", 1,
         must=["accuracy below --min-sqnr 200 dB", "wrote b/quantized"]),
    # plugins: sys.exit() / SystemExit in a plugin is the plugin's error, never opendpu's exit 0
    Case("run_plugin_exits_at_import", "run {mnist} -i {x} -o r.npz --op-plugin p.py",
         must=["--op-plugin p.py", "sys.exit(0)"], setup=_plugin("p.py", "sys.exit(0)\n")),
    Case("run_plugin_registers_then_exits", "run {mnist} -i {x} -o r.npz --backend ref --op-plugin p.py",
         must=["--op-plugin p.py", "sys.exit(3)"],
         setup=_plugin("p.py", "register_op('softmax', lambda op, ins: ins[0])\nsys.exit(3)\n")),
    Case("check_plugin_raises_systemexit", "check {mnist} --op-plugin p.py", must=["p.py", "sys.exit('bye')"],
         setup=_plugin("p.py", "raise SystemExit('bye')\n")),
    Case("profile_plugin_exits_at_import", "profile {mnist} --op-plugin p.py", must=["p.py", "sys.exit(None)"],
         setup=_plugin("p.py", "sys.exit()\n")),
    # JSON the user gives: nesting checked before parsing, one line naming the option or file
    Case("compile_options_nested_arrays", ["compile", "-x", "{q}", "--target", "DPUCZDX8G_ISA1_B512", "-o", "c",
                                           "-n", "net", "--options", DEEP], must=["--options", "nested 100000 levels"]),
    Case("compile_options_nested_objects", ["compile", "-x", "{q}", "--target", "DPUCZDX8G_ISA1_B512", "-o", "c",
                                            "-n", "net", "--options", DEEP_OBJECT],
         must=["--options", "nested 5000 levels"]),
    Case("build_options_nested", ["build", "{onnx}", "--calib", "{calib}", "--target", "DPUCZDX8G_ISA1_B512", "-o",
                                  "b", "--options", DEEP], must=["--options", "nested 100000 levels"]),
    Case("quantize_quant_info_nested", Q_DIGITS + " --calib {calib} -o q --quant-info deep.json",
         must=["deep.json", "nested"], setup=_text("deep.json", DEEP)),
    Case("compile_arch_json_nested", "compile -x {q} -a deep.json -o c -n net", must=["deep.json", "nested"],
         setup=_text("deep.json", DEEP)),
    Case("profile_target_arch_json_nested", "profile {mnist} --target deep.json", must=["deep.json", "nested"],
         setup=_text("deep.json", DEEP)),
    Case("compare_meta_json_nested", "compare {onnx} b --data {calib}", must=["meta.json", "nested"],
         setup=_fake_build),
    # evaluation labels: outside the model's classes is an error naming file, count and range, never "0.00 %"
    Case("quantize_evaluate_labels_beyond_classes", Q_DIGITS + " --calib {calib} -o q --evaluate ev.npz",
         must=["--evaluate ev.npz", "6 of 40 labels", "10 classes 0..9", "found 10..11"],
         setup=_labels("ev.npz", lambda i: i % 12)),
    Case("quantize_evaluate_negative_label", Q_DIGITS + " --calib {calib} -o q --evaluate ev.npz",
         must=["ev.npz", "1 of 40 labels", "found -1"], setup=_labels("ev.npz", lambda i: -1 if i == 7 else i % 10)),
    Case("quantize_evaluate_fractional_labels", Q_DIGITS + " --calib {calib} -o q --evaluate ev.npz",
         must=["ev.npz", "non-integral"], setup=_labels("ev.npz", lambda i: i % 10 + 0.5)),
    Case("compare_labels_beyond_classes", "compare {onnx} c --data ev.npz --backend ref",
         must=["ev.npz", "labels 'y'", "40 of 40 labels", "0..9"], before=[COMPILE_C],
         setup=_labels("ev.npz", lambda i: 100 + i)),
    Case("compare_labels_unused_by_task_raw", "compare {onnx} c --data ev.npz --backend ref --task raw", 0,
         must=["compare: warning: data ev.npz: labels 'y' are not used", "raw: per-output SQNR"],
         before=[COMPILE_C], setup=_labels("ev.npz", lambda i: i % 10)),
    Case("compare_labels_in_range_give_accuracy", "compare {onnx} c --data ev.npz --backend ref", 0,
         must=["top-1 accuracy float"], before=[COMPILE_C], setup=_labels("ev.npz", lambda i: i % 10)),
    # calibration data: constant is an error; suspicious data a warning line (docs/quantizer.md)
    Case("quantize_constant_calibration", Q_DIGITS + " -o q --calib zeros.npy", must=["zeros.npy", "zero variance"],
         setup=_calib_data("zeros.npy", np.zeros_like)),
    Case("build_constant_calibration", "build {onnx} --calib gray.npy " + B512 + " -o b",
         must=["gray.npy", "every value of the 40 sample(s) is 0.5"],
         setup=_calib_data("gray.npy", lambda x: np.full_like(x, 0.5))),
    Case("quantize_identical_samples_warn", Q_DIGITS + " -o q --calib same.npy", 0,
         must=["quantize: warning: calibration data same.npy: the 40 samples are identical"],
         setup=_calib_data("same.npy", lambda x: np.repeat(x[:1], len(x), axis=0))),
    Case("quantize_outlier_sample_warns", Q_DIGITS + " -o q --calib out.npy", 0,
         must=["warning: calibration data out.npy: sample 3 reaches"], setup=_calib_data("out.npy", _outlier)),
    Case("quantize_near_constant_warns", Q_DIGITS + " -o q --calib flat.npy", 0,
         must=["warning", "less than one step", "same constant input"],
         setup=_calib_data("flat.npy", lambda x: 1000 + 1e-4 * x)),
    Case("quantize_blank_samples_warn", Q_DIGITS + " -o q --calib blank.npy", 0,
         must=["warning", "30 of 40 samples are constant images"],
         setup=_calib_data("blank.npy", lambda x: np.concatenate([np.full_like(x[:30], -1), x[30:]]))),
    Case("quantize_constant_calibration_with_quant_info", Q_DIGITS + " -o q --calib zeros.npy --quant-info "
         "{qdir}/quant_info.json", 0, setup=_calib_data("zeros.npy", np.zeros_like)),
    # layouts: every shape in the model's own layout, every message names its layout
    Case("compile_input_shape_nchw_of_the_onnx_model", COMPILE_C + " --options {{\"input_shape\":\"1,1,8,8\"}}",
         0, must=["input_shape 'input' [1, 1, 8, 8] read as NCHW (the ONNX model's layout) = [1, 8, 8, 1] NHWC"]),
    Case("compile_input_shape_nhwc_of_the_xmodel", COMPILE_C + " --options {{\"input_shape\":[1,8,8,1]}}", 0,
         must=["read as NHWC (the xmodel's layout)"]),
    Case("compile_input_shape_other_shape", COMPILE_C + " --options {{\"input_shape\":\"1,2,8,8\"}}",
         must=["[1, 2, 8, 8]", "[1, 8, 8, 1] NHWC", "[1, 1, 8, 8] NCHW", "--input-shape"]),
    Case("quantize_input_shape_in_nhwc", Q_DIGITS + " --calib {calib} -o q --input-shape 1,8,8,1",
         must=["--input-shape 1,8,8,1", "1,1,8,8 (NCHW)", "reads as NHWC"]),
    Case("quantize_dynamic_shape_from_calibration", "quantize {dyn} --calib {calib} -o q", 0,
         must=["input shape 1,1,H,W (NCHW) of {dyn} taken from the calibration data {calib}: 1,1,8,8; "
               "--input-shape N,C,H,W sets it"], setup=_dynamic_model),
    Case("build_dynamic_shape_from_calibration", "build {dyn} --calib {calib} " + B512 + " -o b", 0,
         must=["taken from the calibration data {calib}: 1,1,8,8"], setup=_dynamic_model),
    Case("inspect_dynamic_shape_needs_input_shape", "inspect {dyn} " + B512 + " -o i",
         must=["1,1,H,W (NCHW)", "dimension 2 (H) and dimension 3 (W) are dynamic", "give --input-shape"],
         setup=_dynamic_model),
    Case("inspect_dynamic_shape_given", "inspect {dyn} " + B512 + " -o i --input-shape 1,1,8,8", 0,
         must=["DPU coverage"], setup=_dynamic_model),
    # messages: ranges that mean something
    Case("cosim_random_zero", "cosim --random 0 " + B512, must=["--random", "0 is out of range (must be >= 1)"]),
    Case("profile_clock_mhz_tiny", "profile {mnist} --clock-mhz 1e-30", must=["--clock-mhz", "[1, 2000]"]),
    Case("profile_timing_clock_mhz_tiny", "profile {mnist} --timing clock_mhz=1e-30",
         must=["clock_mhz=1e-30", "must be >= 1 and <= 2000"]),
    Case("profile_arch_json_clock_mhz_tiny", "profile {mnist} --target a.json", must=["a.json", "clock_mhz"],
         setup=_text("a.json", '{"target": "DPUCZDX8G_ISA1_B4096", "timing": {"clock_mhz": 1e-30}}')),
    Case("run_clock_mhz_huge", "run {mnist} -i {x} --clock-mhz 5000", must=["--clock-mhz", "5000", "[1, 2000]"]),
    Case("sweep_param_clock_mhz_tiny", "sweep {mnist} --param clock_mhz=1e-30,300",
         must=["clock_mhz", ">= 1 and <= 2000"]),
]

# ---- 6: boards with any array ---------------------------------------------------------------------------------------
def _digits_input(root: str, p: dict) -> None:
    """d.npy: one NHWC input of the digits CNN."""
    np.save(os.path.join(root, "d.npy"), np.zeros((1, 8, 8, 1), np.float32))


BOARD_CASES: list[Case] = [
    # a B3136 design on a KR260: the board's clock, cores, DDR, host and DPU timing on the program's own array
    Case("profile_board_on_the_programs_array", "profile c/net.xmodel --board kr260", 0,
         must=["board kr260: timing of the board applied to the program's DPUCZDX8G_ISA1_B3136 array (the board "
               "ships DPUCZDX8G_ISA1_B4096)", "on DPUCZDX8G_ISA1_B3136", "1 core(s) at 300 MHz", "fps"],
         before=["compile -x {q} --target DPUCZDX8G_ISA1_B3136 -o c -n net"]),
    Case("run_board_on_the_programs_array", "run c/net.xmodel -i d.npy --board zcu102", 0,
         must=["board zcu102: timing of the board applied to the program's DPUCZDX8G_ISA1_B512 array",
               "at 281 MHz on DPUCZDX8G_ISA1_B512"],
         setup=_digits_input, before=[COMPILE_Q + " -o c -n net"]),
    Case("profile_unknown_board", "profile {mnist} --board zcu999", must=["zcu999", "kr260"]),
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
