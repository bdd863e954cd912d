"""JSON the user gives (issue 29): the nesting depth is measured before parsing (isa/jsonin.py), so a deeply
nested --options, quant_info.json, arch.json or meta.json is a one-line error naming it, never a RecursionError."""
from __future__ import annotations

import json

import numpy as np
import pytest

from opendpu.compiler.pipeline import CompileError, parse_options
from opendpu.isa.jsonin import MAX_JSON_DEPTH, check_depth, json_depth
from opendpu.isa.target import Target, TargetError
from opendpu.quant.onnx_in import QuantError

DEEP = "[" * 100000 + "]" * 100000


@pytest.mark.parametrize("text, depth", [
    ("1", 0), ('"[[[{"', 0), ("[]", 1), ("{}", 1), ('{"a": [1, {"b": [[]]}]}', 5),
    ('["]]]]", "[[[["]', 1),                            # brackets inside strings do not count
    ('["\\"[[", "\\\\", [2]]', 2),                       # nor escaped quotes; an escaped backslash ends a string
    ('{"a\\\\": [1]}', 2), ("[[[", 3), ("]]][", 0),     # invalid JSON: the parser judges it, not the depth
    (DEEP, 100000), ('{"a":' * 300 + "1" + "}" * 300, 300),
])
def test_depth_by_hand(text, depth):
    assert json_depth(text) == depth
    if depth < 900:                                     # where Python's parser can tell, it agrees
        try:
            json.loads(text)
        except ValueError:
            return
        assert depth == _depth(json.loads(text))


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


def test_check_depth_names_the_document():
    check_depth("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "x", ValueError)
    with pytest.raises(QuantError, match=rf"^doc: JSON nested {MAX_JSON_DEPTH + 1} levels deep \(at most "
                                         rf"{MAX_JSON_DEPTH}; why\)$"):
        check_depth("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1), "doc", QuantError, hint="why")


def test_every_user_json_refuses_deep_nesting(tmp_path):
    with pytest.raises(CompileError, match="^--options: JSON nested 100000 levels deep"):
        parse_options(DEEP)
    assert parse_options('{"input_shape": [[1, 8, 8, 1]]}') == {"input_shape": [[1, 8, 8, 1]]}
    p = tmp_path / "deep.json"
    p.write_text(DEEP)
    with pytest.raises(TargetError, match=f"^arch.json {p}: JSON nested 100000 levels deep"):
        Target.from_arch_json(str(p))
    from opendpu.quant import zoo
    from opendpu.quant.quantize import quantize
    x = zoo.digits_data()[0][:4].astype(np.float32)
    with pytest.raises(QuantError, match=f"^quant_info {p}: JSON nested 100000 levels deep"):
        quantize(zoo.DIGITS_ONNX, x, quant_info=str(p))
    from opendpu.runtime.compare import CompareError, find_xmodel
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "meta.json").write_text(DEEP)
    with pytest.raises(CompareError, match="meta.json: JSON nested 100000 levels deep"):
        find_xmodel(tmp_path / "b")
