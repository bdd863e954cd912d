"""The library flow (runtime.flow): the README's Python API snippet runs as written, on the digits CNN, in seconds;
its products agree with what the files say and with the command line's `compile` of the quantized file."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from opendpu.compiler.xir.graph import Graph
from opendpu.runtime.cli import main as cli
from opendpu.runtime.flow import FlowError, build, check_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_flow_snippet() -> str:
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    section = text[text.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "from opendpu.runtime.flow import build" in code
    return code


def test_readme_snippet_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_readme_flow_snippet(), "README.md", "exec"), scope)       # noqa: S102 - the README's own code
    r, b4096 = scope["r"], scope["b4096"]
    assert r.ok and len(r.checks) == 1 and r.checks[0].bytes_compared > 0
    assert r.coverage["macs_dpu_pct"] == 100.0
    assert r.verdict["min_sqnr_db"] > 20 and r.verdict["samples"] == 5          # the last 40 // 8 held out
    assert r.calib.shape[0] == 35 and r.quant.calib_samples == 35
    # what was written is what the result holds
    assert Graph.load("digits.xmodel").serialize() == r.compiled.graph.serialize()
    assert open("out/compiled/digits_cnn.xmodel", "rb").read() == r.compiled.graph.serialize()
    assert open("out/quantized/digits_cnn_int.xmodel", "rb").read() == r.quantized.serialize()
    assert os.path.isfile("out/accuracy.json") and os.path.isfile("out/.opendpu-output")
    assert b4096.meta["target"] != r.compiled.meta["target"]
    # the command line's compile of the written quantized file gives the same program
    assert cli(["compile", "out/quantized/digits_cnn_int.xmodel", "--target", "DPUCZDX8G_ISA1_B4096", "-o", "c"]) == 0
    capsys.readouterr()
    assert Graph.load("c/digits_cnn.xmodel").serialize() == b4096.graph.serialize()


def test_check_step_needs_dpu_subgraphs():
    from opendpu.quant import zoo
    r = build(zoo.DIGITS_ONNX, zoo.digits_data()[0][:8], "B512", accuracy=False, samples=1)
    assert r.verdict is None and r.ok and r.checks[0].samples == 1
    with pytest.raises(FlowError, match="has no DPU subgraph"):
        check_step(r.quantized)
    import onnx
    with pytest.raises(FlowError, match="from its file"):          # refused before any work
        build(onnx.load(zoo.DIGITS_ONNX), zoo.digits_data()[0][:8], "B512")
    x = np.zeros((4, 1, 8, 8), np.float32)
    with pytest.raises(Exception, match="constant"):
        build(zoo.DIGITS_ONNX, x, "B512")


def test_a_check_that_compared_nothing_does_not_pass():
    """0 mismatching bytes out of 0 compared proves nothing: such a subgraph check fails and says 0 bytes."""
    from opendpu.runtime.flow import SubgraphCheck
    empty = SubgraphCheck("sg", "DPUCZDX8G_ISA1_B512", 10, 2, 0, 0, 0, None, 0.0)
    assert not empty.ok and empty.line().startswith("FAIL sg:") and "0 bytes compared" in empty.line()
    assert SubgraphCheck("sg", "DPUCZDX8G_ISA1_B512", 10, 2, 64, 0, 1, None, 0.0).ok
