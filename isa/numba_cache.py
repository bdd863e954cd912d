"""Where every opendpu Numba kernel is cached: one location for the CLI, `make` and the tests.

`isa` is the one package every other opendpu package imports, so the rule lives here and is applied by each
module that jits (`sim`, `quant.calib`) before it imports numba. NUMBA_CACHE_DIR defaults to
`$XDG_CACHE_HOME/opendpu/numba` (else `~/.cache/opendpu/numba`); a NUMBA_CACHE_DIR set by the user wins.
"""
from __future__ import annotations

import os
import sys


def default_numba_cache_dir() -> str:
    """`$XDG_CACHE_HOME/opendpu/numba`, or `~/.cache/opendpu/numba` (XDG: a relative value is ignored)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "opendpu", "numba")


def set_numba_cache_dir() -> None:
    os.environ.setdefault("NUMBA_CACHE_DIR", default_numba_cache_dir())
    if "numba" in sys.modules:        # imported earlier (e.g. by a library): make its config see the variable
        from numba.core import config
        config.reload_config()
