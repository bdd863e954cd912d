"""JSON the user gives (--options, --quant-info, arch.json, a build's meta.json), read with one rule.

Python's json module recurses once per nesting level, so a deeply nested document ("[[[[…") ends in a
RecursionError, which the CLI would report as an internal error. Every opendpu JSON document is shallow (an
arch.json or --options is 2 levels deep, a quant_info.json 3), so the depth is measured first, without
recursion (`check_depth`), and a document deeper than `MAX_JSON_DEPTH` is refused with a one-line error that names
the file or option and the depth found. Only then is the text parsed (each reader keeps its own message for
invalid JSON).
"""
from __future__ import annotations

import re

import numpy as np

MAX_JSON_DEPTH = 64     # far beyond any opendpu document (<= 4 levels), far below Python's recursion limit

_ESCAPE = re.compile(r"\\.", re.S)       # a backslash and the character it escapes
_STRING = re.compile(r'"[^"]*"')          # a string once its escapes are gone: linear, no backtracking


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON `text` (brackets inside strings do not count); 0 for a
    scalar. Linear time, no recursion; meant for text that may not be valid JSON (the parser judges that)."""
    if "[" not in text and "{" not in text:
        return 0
    bare = _STRING.sub("", _ESCAPE.sub("", text)).encode("utf-8", "replace")
    b = np.frombuffer(bare, dtype=np.uint8)
    step = np.zeros(len(b), dtype=np.int64)
    step[(b == ord("[")) | (b == ord("{"))] = 1
    step[(b == ord("]")) | (b == ord("}"))] = -1
    return int(np.cumsum(step).max(initial=0))


def check_depth(text: str, where: str, error: type[Exception], max_depth: int = MAX_JSON_DEPTH,
                hint: str = "") -> None:
    """An `error` naming `where` and the depth when `text` nests deeper than `max_depth` (checked before parsing)."""
    depth = json_depth(text)
    if depth > max_depth:
        raise error(f"{where}: JSON nested {depth} levels deep (at most {max_depth}"
                    + (f"; {hint}" if hint else "") + ")")

