"""Issue 11 acceptance: outputs never destroy what opendpu did not write; exact shapes and layouts; outputs with one
meaning (float by default, raw int8 + fix point on request); golden checks that account for every file."""
import hashlib
import os
import stat

import numpy as np
import pytest

from opendpu.compiler.outdir import MARKER, DirOutput, OutputError
from opendpu.compiler.xir.graph import Graph, dump_stem
from opendpu.quant import zoo
from opendpu.runtime.cli import main as cli
from tests.conftest import model_path


def _md5(p):
    return hashlib.md5(open(p, "rb").read()).hexdigest()


def _tree(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


@pytest.fixture(scope="module")
def digits_calib(tmp_path_factory):
    d = tmp_path_factory.mktemp("digits")
    xtr = zoo.digits_data()[0]
    np.save(d / "calib.npy", xtr[:40])
    return d / "calib.npy"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, digits_calib):
    """The digits CNN quantized once through the CLI: (output dir, xmodel path, golden dir)."""
    out = tmp_path_factory.mktemp("q") / "q"
    old = os.umask(0o022)             # a known umask: the created directories must then be 0755, not mkdtemp's 0700
    try:
        assert cli(["quantize", zoo.DIGITS_ONNX, "--calib", str(digits_calib), "-o", str(out), "--method",
                    "maxmin"]) == 0
    finally:
        os.umask(old)
    return out, out / "digits_cnn_int.xmodel", out / "golden"


# ---- outputs never destroy anything ------------------------------------------------------------------------
def test_quantize_into_dot_refuses_and_keeps_files(tmp_path, monkeypatch, capsys, digits_calib):
    model = tmp_path / "digits_cnn.onnx"
    model.write_bytes(open(zoo.DIGITS_ONNX, "rb").read())
    other = tmp_path / "notes.txt"
    other.write_text("my notes\n")
    before = {p: _md5(tmp_path / p) for p in _tree(tmp_path)}
    monkeypatch.chdir(tmp_path)
    rc = cli(["quantize", "digits_cnn.onnx", "--calib", str(digits_calib), "-o", "."])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "holds the input" in err[0] and "--force" in err[0]
    assert {p: _md5(tmp_path / p) for p in _tree(tmp_path)} == before      # both files survive, nothing added


def test_existing_foreign_directory_needs_force_and_force_replaces_only_own_files(tmp_path, capsys, digits_calib):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("not opendpu's")
    (out / "quant_info.json").write_text("an old file of the user's with an opendpu name")
    rc = cli(["quantize", zoo.DIGITS_ONNX, "--calib", str(digits_calib), "-o", str(out), "--method", "maxmin"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(out) in err[0] and "not empty" in err[0] and "--force" in err[0]
    assert _tree(out) == ["keep.txt", "quant_info.json"]
    rc = cli(["quantize", zoo.DIGITS_ONNX, "--calib", str(digits_calib), "-o", str(out), "--method", "maxmin",
              "--force"])
    assert rc == 0
    assert (out / "keep.txt").read_text() == "not opendpu's"                 # the foreign file survives
    assert (out / "quant_info.json").read_text().startswith("{")              # the same-named file is replaced
    assert (out / "digits_cnn_int.xmodel").is_file() and (out / MARKER).is_file()
    assert not [p for p in os.listdir(out) if p.startswith(".opendpu-tmp")]


def test_created_directories_have_normal_permissions(quantized):
    out, xm, golden = quantized
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o755                   # not mkdtemp's 0700
    assert stat.S_IMODE(os.stat(golden).st_mode) == 0o755


def test_marked_directory_is_reused_and_stale_own_files_removed(tmp_path):
    d = tmp_path / "o"
    with DirOutput(str(d)) as t:
        open(os.path.join(t, "a.bin"), "w").write("1")
        open(os.path.join(t, "b.bin"), "w").write("1")
    (d / "user.txt").write_text("u")
    # user.txt makes it non-empty, but the marker says the directory is opendpu's: allowed, user.txt kept
    with DirOutput(str(d)) as t:
        open(os.path.join(t, "a.bin"), "w").write("2")
    assert _tree(d) == sorted([MARKER, "a.bin", "user.txt"])                  # stale own b.bin removed
    assert (d / "a.bin").read_text() == "2"


def test_failed_write_leaves_nothing(tmp_path):
    d = tmp_path / "new"
    with pytest.raises(RuntimeError):
        with DirOutput(str(d)) as t:
            open(os.path.join(t, "half.bin"), "w").write("x")
            raise RuntimeError("disk full")
    assert not d.exists()
    e = tmp_path / "existing"
    e.mkdir()
    with pytest.raises(RuntimeError):
        with DirOutput(str(e)) as t:
            open(os.path.join(t, "half.bin"), "w").write("x")
            raise RuntimeError("disk full")
    assert os.listdir(e) == []


def test_regular_file_is_never_a_directory_output(tmp_path):
    f = tmp_path / "f"
    f.write_text("data")
    for force in (False, True):
        with pytest.raises(OutputError, match="existing file"):
            DirOutput(str(f), force=force)
    assert f.read_text() == "data"


def test_run_output_into_missing_directory_fails_before_running(tmp_path, capsys):
    mnist = model_path("dpu_mnist_classifier")
    np.save(tmp_path / "x.npy", np.zeros((1, 28, 28, 1), np.float32))
    rc = cli(["run", mnist, "-i", str(tmp_path / "x.npy"), "--backend", "ref", "-o", str(tmp_path / "no" / "o.npz")])
    out, err = capsys.readouterr()
    assert rc == 2 and "does not exist" in err and "ran " not in out


def test_run_never_overwrites_an_input(tmp_path, capsys):
    mnist = model_path("dpu_mnist_classifier")
    x = tmp_path / "x.npz"
    np.savez(x, quant_input_1=np.zeros((1, 28, 28, 1), np.float32))
    h = _md5(x)
    rc = cli(["run", mnist, "-i", str(x), "--backend", "ref", "-o", str(x), "--force"])
    assert rc == 2 and "input" in capsys.readouterr().err and _md5(x) == h


# ---- shapes and layouts ----------------------------------------------------------------------------------
def test_nchw_refused_or_transposed_explicitly(tmp_path, capsys):
    mnist = model_path("dpu_mnist_classifier")
    rng = np.random.default_rng(1)
    nhwc = rng.random((1, 28, 28, 1), dtype=np.float32)
    np.save(tmp_path / "nhwc.npy", nhwc)
    np.save(tmp_path / "nchw.npy", np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2)))
    rc = cli(["run", mnist, "-i", str(tmp_path / "nchw.npy"), "--backend", "ref", "-o", str(tmp_path / "a.npz")])
    err = capsys.readouterr().err
    assert rc == 2 and "[1, 1, 28, 28]" in err and "[1, 28, 28, 1]" in err and "NHWC" in err and "--layout" in err
    assert not (tmp_path / "a.npz").exists()
    assert cli(["run", mnist, "-i", str(tmp_path / "nhwc.npy"), "--backend", "ref", "-o", str(tmp_path / "a.npz")]) == 0
    out = capsys.readouterr().out
    assert "NHWC (as given)" in out
    assert cli(["run", mnist, "-i", str(tmp_path / "nchw.npy"), "--backend", "ref", "--layout", "nchw",
                "-o", str(tmp_path / "b.npz")]) == 0
    assert "transposed from NCHW" in capsys.readouterr().out
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


# ---- outputs have one meaning ----------------------------------------------------------------------------------
def test_float_output_by_default_and_raw_with_fix_point(quantized, tmp_path, capsys):
    out, xm, golden = quantized
    g = Graph.load(str(xm))
    inp = golden / "input_aquant.bin"
    assert cli(["run", str(xm), "--backend", "ref", "-i", str(inp), "-o", str(tmp_path / "f.npz")]) == 0
    assert cli(["run", str(xm), "--backend", "ref", "-i", str(inp), "--raw", "-o", str(tmp_path / "r.npz")]) == 0
    f, r = np.load(tmp_path / "f.npz"), np.load(tmp_path / "r.npz")
    names = [k for k in r if not k.endswith(".fix_point")]
    assert names and sorted(f) == sorted(names)
    for name in names:
        op = next(o for o in g.ops.values() if o.output.name == name)
        fp = op.output.fix_point
        assert int(r[name + ".fix_point"]) == fp                             # the xmodel's own fix point
        assert r[name].dtype == np.int8 and f[name].dtype == np.float32
        gold = np.fromfile(golden / (dump_stem(name) + "_int8.bin"), np.int8)  # independent: onnxruntime golden
        assert np.array_equal(r[name].reshape(-1), gold)
        assert np.array_equal(f[name], r[name].astype(np.float32) * np.float32(2.0 ** -fp))


PLUGIN = """import numpy as np
from opendpu.runtime import register_op


def mylayer(op, ins):          # AMD's example custom op: a PReLU with a learned alpha
    x, alpha = ins
    return np.where(x > 0, x, alpha[None] * x)


register_op("Mylayer", mylayer)
"""


def test_op_plugin_and_amd_model_float_and_raw_outputs(tmp_path, capsys):
    """tf2_custom_op needs its custom op: refused before any work without --op-plugin; with it, its output (an
    AMD graph ending in fix2float) is float by default and the int8 source with its fix point under --raw."""
    from opendpu.runtime import unregister_op
    m = model_path("tf2_custom_op")
    g = Graph.load(m)
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).random((1, 28, 28, 1), dtype=np.float32))
    rc = cli(["run", m, "-i", str(x), "--backend", "ref"])
    o, err = capsys.readouterr()
    assert rc == 2 and "Mylayer" in err and "--op-plugin" in err and "ran " not in o
    plug = tmp_path / "mylayer.py"
    plug.write_text(PLUGIN)
    try:
        assert cli(["run", m, "-i", str(x), "--op-plugin", str(plug), "-o", str(tmp_path / "f.npz")]) == 0
        assert "registered Mylayer" in capsys.readouterr().out
        assert cli(["run", m, "-i", str(x), "--op-plugin", str(plug), "--raw", "-o", str(tmp_path / "r.npz")]) == 0
    finally:
        unregister_op("Mylayer")
    f, r = np.load(tmp_path / "f.npz"), np.load(tmp_path / "r.npz")
    (name,) = list(f)
    op = next(o for o in g.ops.values() if o.output.name == name)
    assert op.type == "fix2float"
    fp = g.ops[op.input_ops()[0]].output.fix_point
    assert f[name].dtype == np.float32 and r[name].dtype == np.int8 and int(r[name + ".fix_point"]) == fp
    assert np.array_equal(f[name], r[name].astype(np.float32) * np.float32(2.0 ** -fp))


def test_op_plugin_errors_name_the_module(tmp_path, capsys):
    m = model_path("tf2_custom_op")
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28, 1), np.float32))
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\nraise ValueError('oops')\n")
    rc = cli(["run", m, "-i", str(x), "--op-plugin", str(bad)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "bad.py" in err[0] and "ValueError: oops" in err[0] and "line 2" in err[0]


def test_op_plugin_that_exits_is_an_error_naming_it(tmp_path, capsys):
    """sys.exit() in a plugin is never opendpu's exit: while importing it, an error naming the module (and the
    ops it registered before are unregistered again); inside a registered implementation at run time, an error
    naming the op and the plugin file, exit 2 and no output file (it was exit 0 with no output)."""
    from opendpu.runtime.ops import registered_ops, unregister_op
    m = model_path("tf2_custom_op")
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 28, 28, 1), np.float32))
    out = tmp_path / "r.npz"
    before = registered_ops()
    for body, code in (("sys.exit(0)", "0"), ("raise SystemExit(4)", "4"), ("exit()", "None")):
        plug = tmp_path / "exits.py"
        plug.write_text("import sys\nfrom opendpu.runtime import register_op\n"
                        f"register_op('Mylayer', lambda op, ins: ins[0])\n{body}\n")
        rc = cli(["run", m, "-i", str(x), "-o", str(out), "--op-plugin", str(plug)])
        o, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and o == "", err
        assert lines[0] == (f"opendpu run: error: --op-plugin {plug}: importing it called sys.exit({code}); a "
                            f"plugin module must only register ops (runtime.register_op), not exit")
        assert registered_ops() == before and not out.exists()
    plug = tmp_path / "runexit.py"
    plug.write_text("import sys\nfrom opendpu.runtime import register_op\n"
                    "def mylayer(op, ins):\n    sys.exit(0)\nregister_op('Mylayer', mylayer)\n")
    try:
        rc = cli(["run", m, "-i", str(x), "-o", str(out), "--op-plugin", str(plug), "--backend", "ref"])
    finally:
        unregister_op("Mylayer")
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and not out.exists()
    assert lines[0].startswith("opendpu run: error: op ") and "(Mylayer): the implementation registered from " \
        f"{plug} called sys.exit(0)" in lines[0]


# ---- checks account for everything -----------------------------------------------------------------------
def test_golden_on_empty_directory_is_an_error(quantized, tmp_path, capsys):
    out, xm, golden = quantized
    empty = tmp_path / "empty"
    empty.mkdir()
    rc = cli(["run", str(xm), "--backend", "ref", "-i", str(golden / "input_aquant.bin"), "--golden", str(empty)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(empty) in err[0]
    rc = cli(["run", str(xm), "--backend", "ref", "-i", str(golden / "input_aquant.bin"), "--golden",
              str(tmp_path / "missing")])
    assert rc == 2 and "no such directory" in capsys.readouterr().err


def test_golden_summary_counts_match_files(quantized, tmp_path, capsys):
    out, xm, golden = quantized
    g2 = tmp_path / "g"
    g2.mkdir()
    files = sorted(f for f in os.listdir(golden) if f.endswith(".bin"))
    for f in files[1:]:                                   # drop one golden file: its tensor has no golden
        (g2 / f).write_bytes((golden / f).read_bytes())
    (g2 / "unrelated_layer_int8.bin").write_bytes(b"\x00" * 10)
    rc = cli(["run", str(xm), "--backend", "ref", "-i", str(golden / "input_aquant.bin"), "--golden", str(g2)])
    o = capsys.readouterr().out
    assert rc == 0
    line = [ln for ln in o.splitlines() if ln.startswith("compared ")][0]
    n_present = len(files)                              # (files - 1) + 1 unrelated
    assert line.startswith(f"compared {len(files) - 1} of {n_present} golden files; 0 kept on chip")
    assert "1 not of this model" in line
    assert o.count("compare data success") == len(files) - 1
    # a flipped byte in one golden file: exit 1 and the summary says so
    f = g2 / files[1]
    b = bytearray(f.read_bytes())
    b[0] ^= 1
    f.write_bytes(bytes(b))
    rc = cli(["run", str(xm), "--backend", "ref", "-i", str(golden / "input_aquant.bin"), "--golden", str(g2)])
    assert rc == 1 and "1 mismatching" in capsys.readouterr().out


def test_golden_counts_on_chip_layers_on_sim(tmp_path, capsys):
    """On sim only what a SAVE writes to DDR is observable: the rest of a golden dump is counted as on chip."""
    mnist = model_path("dpu_mnist_classifier")
    x = tmp_path / "x.npy"
    np.save(x, np.random.default_rng(0).random((1, 28, 28, 1), dtype=np.float32))
    ref_dump = tmp_path / "refdump"
    assert cli(["run", mnist, "-i", str(x), "--backend", "ref", "--dump", str(ref_dump)]) == 0
    capsys.readouterr()
    nfiles = len([f for f in os.listdir(ref_dump) if f.endswith(".bin")])
    rc = cli(["run", mnist, "-i", str(x), "--backend", "sim", "--golden", str(ref_dump)])
    o = capsys.readouterr().out
    line = [ln for ln in o.splitlines() if ln.startswith("compared ")][0]
    parts = line.replace(";", "").split()
    compared, total, on_chip = int(parts[1]), int(parts[3]), int(parts[6])
    assert rc == 0 and total == nfiles and compared + on_chip == nfiles and on_chip > 0 and compared > 0
    assert o.count("compare data success") == compared


# ---- issue 29: the marker proves nothing by being there (compiler/outdir.py) ---------------------------------------
def _put(d, files: dict, net=None):
    """Publish `files` (rel -> text) into d through DirOutput as net `net`; returns the lines it printed."""
    lines: list[str] = []
    with DirOutput(str(d), net=net, log=lines.append) as t:
        for rel, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(t, rel)), exist_ok=True)
            with open(os.path.join(t, rel), "w") as f:
                f.write(text)
    return lines


def _marker(d):
    import json
    return json.loads((d / MARKER).read_text())


def _sha(p):
    return hashlib.sha256(open(p, "rb").read()).hexdigest()


def test_marker_records_size_hash_and_net(tmp_path):
    d = tmp_path / "o"
    _put(d, {"a.bin": "12345", "sub/b.txt": "x"}, net="first")
    m = _marker(d)
    assert m["tool"] == "opendpu" and m["version"] == 2
    assert m["files"] == {"a.bin": {"size": 5, "sha256": _sha(d / "a.bin"), "net": "first"},
                          "sub/b.txt": {"size": 1, "sha256": _sha(d / "sub" / "b.txt"), "net": "first"}}


def test_foreign_file_listed_by_an_old_marker_survives(tmp_path):
    d = tmp_path / "o"
    d.mkdir()
    (d / "keep.txt").write_text("the user's")
    (d / MARKER).write_text('{"tool": "opendpu", "files": ["keep.txt", "a.bin"]}')
    lines = _put(d, {"b.bin": "1"}, net="n")
    assert (d / "keep.txt").read_text() == "the user's"
    assert any("2 file(s) without a content hash; none was removed" in ln for ln in lines)
    assert set(_marker(d)["files"]) == {"b.bin"}                 # rewritten as version 2: its own files only


def test_old_marker_never_licenses_a_replacement(tmp_path):
    """A file an old-style marker lists with one of the run's output names is refused up front; --force replaces
    it and says so."""
    from opendpu.compiler.outdir import check_dir
    d = tmp_path / "o"
    d.mkdir()
    (d / "meta.json").write_text("the user's")
    (d / MARKER).write_text('{"tool": "opendpu", "files": ["meta.json"]}')
    with pytest.raises(OutputError, match="meta.json exists and is listed by an old-style marker"):
        check_dir(str(d), names=["meta.json"])
    with pytest.raises(OutputError, match="--force"):
        _put(d, {"meta.json": "{}"}, net="n")
    assert (d / "meta.json").read_text() == "the user's"
    lines: list[str] = []
    with DirOutput(str(d), force=True, net="n", log=lines.append) as t:
        (open(os.path.join(t, "meta.json"), "w")).write("{}")
    assert (d / "meta.json").read_text() == "{}" and any("replaced" in ln and "--force" in ln for ln in lines)


def test_listed_file_with_another_hash_is_kept_and_dropped(tmp_path):
    d = tmp_path / "o"
    _put(d, {"a.bin": "1", "b.bin": "1"}, net="n")
    (d / "b.bin").write_text("edited by the user")
    lines = _put(d, {"a.bin": "2"}, net="n")
    assert (d / "b.bin").read_text() == "edited by the user"
    assert any("kept" in ln and "b.bin" in ln and "changed since" in ln for ln in lines)
    assert set(_marker(d)["files"]) == {"a.bin"}                 # no longer counted as opendpu's
    lines = _put(d, {"a.bin": "3"}, net="n")                      # and never touched again
    assert (d / "b.bin").read_text() == "edited by the user" and not lines


def test_symlink_escape_is_never_followed(tmp_path):
    """A marker entry lnk/victim.txt with lnk -> a directory outside, even with victim's true hash and the run's
    net: victim survives; writing through a symlinked subdirectory is refused, even with force."""
    import json
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("not opendpu's")
    d = tmp_path / "o"
    d.mkdir()
    (d / "lnk").symlink_to(outside)
    (d / MARKER).write_text(json.dumps({"tool": "opendpu", "version": 2, "files": {
        "lnk/victim.txt": {"size": victim.stat().st_size, "sha256": _sha(victim), "net": "n"}}}))
    lines = _put(d, {"a.bin": "1"}, net="n")
    assert victim.read_text() == "not opendpu's"
    assert any("symlink" in ln and "victim.txt" in ln for ln in lines)
    for force in (False, True):
        with pytest.raises(OutputError, match="symlink"):
            with DirOutput(str(d), force=force, net="n", log=None) as t:
                os.makedirs(os.path.join(t, "lnk"))
                open(os.path.join(t, "lnk", "victim.txt"), "w").write("overwritten")
    assert victim.read_text() == "not opendpu's" and os.listdir(outside) == ["victim.txt"]


def test_a_symlink_in_place_of_an_output_is_replaced_itself_never_its_target(tmp_path):
    from opendpu.compiler.outdir import check_dir
    target = tmp_path / "elsewhere.txt"
    target.write_text("not opendpu's")
    d = tmp_path / "o"
    _put(d, {"a.bin": "1"}, net="n")
    (d / "b.bin").symlink_to(target)
    with pytest.raises(OutputError, match="b.bin exists and is a symlink"):
        check_dir(str(d), names=["b.bin"])
    with DirOutput(str(d), force=True, net="n", log=None) as t:
        open(os.path.join(t, "b.bin"), "w").write("2")
    assert target.read_text() == "not opendpu's" and not (d / "b.bin").is_symlink() and (d / "b.bin").read_text() == "2"


def test_outputs_are_replaced_per_net(tmp_path):
    """compile -n first, then -n second: first's files stay; the names every net writes go to the newest net (said
    in one line); a rerun of first removes only first's own stale file, each removal printed."""
    d = tmp_path / "c"
    _put(d, {"first.xmodel": "f", "meta.json": "f", "dump_after_x.json": "f"}, net="first")
    lines = _put(d, {"second.xmodel": "s", "meta.json": "s"}, net="second")
    assert (d / "first.xmodel").read_text() == "f" and (d / "dump_after_x.json").is_file()
    assert (d / "meta.json").read_text() == "s"
    assert lines == [f"replaced 1 file(s) of net first in {d} with net second's (names every net writes): meta.json"]
    lines = _put(d, {"first.xmodel": "f2", "meta.json": "f2"}, net="first")
    assert (d / "second.xmodel").read_text() == "s" and not (d / "dump_after_x.json").exists()
    assert f"removed stale {d / 'dump_after_x.json'} (written by the earlier run of net first)" in lines
    assert {k: v["net"] for k, v in _marker(d)["files"].items()} == {"first.xmodel": "first", "meta.json": "first",
                                                                     "second.xmodel": "second"}


def test_several_nets_in_one_run_keep_other_exports(tmp_path):
    """zoo --export: each model is its own net; a later export of other models keeps the earlier ones."""
    d = tmp_path / "z"
    net = lambda rel: rel[:-len(".onnx")]                         # noqa: E731
    with DirOutput(str(d), net=net, log=None) as t:
        for n in ("a", "b"):
            open(os.path.join(t, f"{n}.onnx"), "w").write(n)
    with DirOutput(str(d), net=net, log=None) as t:
        open(os.path.join(t, "c.onnx"), "w").write("c")
    assert sorted(os.listdir(d)) == sorted([MARKER, "a.onnx", "b.onnx", "c.onnx"])


def test_check_dir_refuses_foreign_output_names_before_work(tmp_path):
    from opendpu.compiler.outdir import check_dir
    d = tmp_path / "o"
    _put(d, {"net.xmodel": "1"}, net="net")
    (d / "meta.json").write_text("the user's")                   # in an opendpu directory, but not opendpu's
    check_dir(str(d), names=["net.xmodel"])                        # its own unchanged file: fine
    with pytest.raises(OutputError, match="meta.json exists and was not written by opendpu.*--force"):
        check_dir(str(d), names=["net.xmodel", "meta.json"])
    check_dir(str(d), names=["meta.json"], force=True)
    (d / "net.xmodel").write_text("edited")
    with pytest.raises(OutputError, match="net.xmodel exists and was changed since opendpu wrote it"):
        check_dir(str(d), names=["net.xmodel"])
    with pytest.raises(OutputError, match="would replace the input"):
        check_dir(str(d), names=["net.xmodel"], inputs=[str(d / "net.xmodel")], force=True)


@pytest.mark.parametrize("path", ["/proc/x", "/sys/x", "/proc/x/y"])
def test_probe_finds_unwritable_directories_for_root_too(path, tmp_path):
    from opendpu.compiler.outdir import check_dir
    top = "/" + path.split("/")[1]
    if not os.path.isdir(top):
        pytest.skip(f"{top} is not mounted here")
    with pytest.raises(OutputError, match="cannot create a directory in /"):
        check_dir(path)


def test_probe_file_outputs_and_leave_nothing(tmp_path):
    from opendpu.compiler.outdir import check_dir, check_file
    if os.path.isdir("/proc"):
        with pytest.raises(OutputError, match="cannot create a file in /proc"):
            check_file("/proc/p.json", suffixes=(".json",))
    check_file(str(tmp_path / "p.json"), suffixes=(".json",))
    check_dir(str(tmp_path / "new" / "deeper"))
    check_dir(str(tmp_path))
    assert os.listdir(tmp_path) == []                              # the probes are gone


def test_file_names_longer_than_the_file_system_allows(tmp_path):
    from opendpu.compiler.outdir import check_dir, check_file
    from opendpu.compiler.pipeline import CompileError, check_name
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    with pytest.raises(OutputError, match=f"is {limit + 1} bytes long; the file system allows {limit}"):
        check_dir(str(tmp_path / "o"), names=["x" * (limit + 1)])
    with pytest.raises(OutputError, match="bytes long"):
        check_dir(str(tmp_path / ("d" * (limit + 1))))
    with pytest.raises(OutputError, match="bytes long"):
        check_file(str(tmp_path / ("f" * limit + ".json")), suffixes=(".json",))
    with pytest.raises(CompileError, match="300 bytes long"):
        check_name("n" * 300)
    assert check_name("n" * (255 - len("_org.xmodel"))) == "n" * 244   # the longest name whose files fit


def test_nested_markers_are_merged(tmp_path):
    """build runs quantize and compile inside its own output: their markers join those already in quantized/ and
    compiled/ instead of replacing them (compile -o b/compiled -n other's files stay opendpu's)."""
    b = tmp_path / "b"
    _put(b / "compiled", {"other.xmodel": "o"}, net="other")
    b.joinpath(MARKER).write_text('{"tool": "opendpu", "version": 2, "files": {}}')
    with DirOutput(str(b), net="net", log=None) as t:
        with DirOutput(os.path.join(t, "compiled"), net="net", log=None) as t2:
            open(os.path.join(t2, "net.xmodel"), "w").write("n")
    assert set(_marker(b / "compiled")["files"]) == {"other.xmodel", "net.xmodel"}
    assert set(_marker(b)["files"]) == {"compiled/net.xmodel"}


def test_build_prints_the_final_paths(tmp_path, capsys, digits_calib):
    out = tmp_path / "b"
    assert cli(["build", zoo.DIGITS_ONNX, "--calib", str(digits_calib), "--target", "DPUCZDX8G_ISA1_B512", "-o",
                str(out)]) == 0
    o = capsys.readouterr().out
    wrote = [ln for ln in o.splitlines() if ln.startswith("wrote")]
    assert len(wrote) == 12 and ".opendpu-tmp" not in o
    for ln in wrote[:-1]:
        assert os.path.exists(ln.split()[-1]), ln                  # every path printed exists


def test_quantize_output_names_are_what_it_writes(quantized):
    from opendpu.quant.quantize import output_names
    out, _, _ = quantized
    top = {f for f in os.listdir(out) if os.path.isfile(out / f) and f != MARKER}
    dirs = {f + "/" for f in os.listdir(out) if os.path.isdir(out / f)}
    assert set(output_names(zoo.DIGITS_ONNX)) == top | dirs == top | {"golden/"}
