"""Where every opendpu Numba kernel is cached: one location for the CLI, `make` and the tests.

`isa` is the one package every other opendpu package imports, so the rule lives here and is applied by each
module that jits (`sim`, `quant.calib`, `compiler.ref._kernels`) before it imports numba. NUMBA_CACHE_DIR defaults to
`$XDG_CACHE_HOME/opendpu/numba/src-<key>` (else under `~/.cache`); a NUMBA_CACHE_DIR set by the user wins.

The `<key>` hashes the sources of every module that jits and of what its kernels inline (every `*.py` of `isa/` and
`sim/`, `quant/calib.py` and `compiler/ref/_kernels.py`). Numba's own cache invalidation looks only at the file
that defines a kernel: a kernel in sim/_kernels.py that calls one from sim/_fastmac.py or isa/check.py would
otherwise load stale machine code after an edit of those. A changed source gives a new directory, so an edit can
never reuse old code (the old directory stays until removed; each is a few MB).
"""
from __future__ import annotations

import hashlib
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # isa/, sim/ and quant/ are siblings here
# (directory, one file or every *.py)
JIT_SOURCES = (("isa", None), ("sim", None), ("quant", "calib.py"), ("compiler/ref", "_kernels.py"))


def source_key(root: str = _ROOT) -> str:
    """12 hex digits of sha256 over the names and contents of the JIT_SOURCES files under `root`."""
    h = hashlib.sha256()
    for d, only in JIT_SOURCES:
        path = os.path.join(root, d)
        names = [only] if only else sorted(f for f in os.listdir(path) if f.endswith(".py")) \
            if os.path.isdir(path) else []
        for f in names:
            fp = os.path.join(path, f)
            if os.path.isfile(fp):
                with open(fp, "rb") as fh:
                    h.update(f"{d}/{f}\0".encode() + fh.read() + b"\0")
    return h.hexdigest()[:12]


def default_numba_cache_dir() -> str:
    """`$XDG_CACHE_HOME/opendpu/numba/src-<key>`, or under `~/.cache` (XDG: a relative value is ignored)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opendpu", "numba", f"src-{source_key()}")


def set_numba_cache_dir() -> None:
    os.environ.setdefault("NUMBA_CACHE_DIR", default_numba_cache_dir())
    if "numba" in sys.modules:        # imported earlier (e.g. by a library): make its config see the variable
        from numba.core import config
        config.reload_config()
