"""The installed distribution is one namespace, `opendpu` (plus the `opendpu` script): no generic top-level names."""
import os
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_PACKAGES = ("isa", "sim", "compiler", "runtime", "quant", "hw")


def test_wheel_installs_only_opendpu(tmp_path):
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), REPO],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = wheels.glob("opendpu-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    tops = {n.split("/")[0] for n in names}
    dist_info = [t for t in tops if t.endswith(".dist-info")]
    assert tops - set(dist_info) == {"opendpu"}, sorted(tops)
    assert "opendpu/__init__.py" not in names                   # a PEP 420 namespace: nothing to collide with
    for p in SOURCE_PACKAGES:                                    # every source directory is inside the namespace
        assert f"opendpu/{p}/__init__.py" in names
    assert "opendpu/compiler/xir/xir.proto" in names and "opendpu/quant/models/digits_cnn.onnx" in names
    assert not any(n.startswith("opendpu/tests/") for n in names)
    ep = zipfile.ZipFile(whl).read(f"{dist_info[0]}/entry_points.txt").decode()
    assert "opendpu = opendpu.runtime.cli:main" in ep
    # install it apart from the checkout and import it from a directory outside the repository
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(whl)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    installed = {p for p in os.listdir(site) if not p.endswith(".dist-info") and p != "bin"}
    assert installed == {"opendpu"}, sorted(installed)
    assert os.path.isfile(site / "bin" / "opendpu")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    code = ("import opendpu.isa, opendpu.runtime.cli, opendpu.quant.zoo as z, os\n"
            "print(opendpu.isa.__file__)\nprint(os.path.isfile(z.DIGITS_ONNX))\n"
            "import importlib.util\nprint([importlib.util.find_spec(n) is None for n in "
            f"{list(SOURCE_PACKAGES)!r}])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    r = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r})\n" + code],
                       cwd=outside, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    where, onnx_ok, absent = r.stdout.splitlines()
    assert where.startswith(str(site))                           # the installed copy, not the checkout
    assert onnx_ok == "True"
    assert absent == str([True] * len(SOURCE_PACKAGES))         # no generic top-level `isa`, `sim`, ...
