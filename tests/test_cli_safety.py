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
