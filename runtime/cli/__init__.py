"""The `opendpu` command line: one module per verb (as TVMC's), each registering its parser (`register(sub)`) and
a thin `run(args)` that validates, calls the library (runtime.flow, runtime.profile, quant, compiler ...) and prints.
`common` holds what the verbs share (the parser class, the formatter, the output rule, shared helpers); `checks`
the up-front validation (argparse types with ranges, input files, timing overrides). The sweep verb registers
itself from its package (runtime.sweep.cli).

Verbs: run, check, races, disasm, xmodel, profile, sweep, cosim (xdputil-like and the emulator's own), quantize,
inspect, zoo, compile (vai_c_xir), build, compare, targets.
"""
from __future__ import annotations

import argparse
import os
import sys

from opendpu.runtime.cli.checks import CliError
from opendpu.runtime.cli.common import _VERB, _Fmt, _Parser, _UsageError, _version
from opendpu.runtime.cli.common import _clock_mhz_type  # noqa: F401 - its old import path (tests/test_target.py)

__all__ = ["main", "build_parser", "CliError", "VERBS"]

# the verbs in the order `opendpu --help` lists them: (name, module under runtime.cli, or the sweep package's)
VERBS = ("run", "check", "races", "disasm", "xmodel", "profile", "sweep", "cosim", "quantize", "inspect", "zoo",
         "compile", "build", "compare", "targets")


def _register(sub, verb: str) -> None:
    import importlib
    if verb == "sweep":
        from opendpu.runtime.sweep.cli import register
    else:
        register = importlib.import_module(f"{__name__}.{verb}").register
    register(sub)


def build_parser() -> argparse.ArgumentParser:
    """The top parser with every verb's subparser (each verb module registers its own)."""
    p = _Parser(prog="opendpu", description="Open emulator of the AMD DPUCZDX8G (ISA1)", formatter_class=_Fmt)
    p.add_argument("--version", action="version", version=f"opendpu {_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="VERB")
    for verb in VERBS:
        _register(sub, verb)
    return p


def main(argv: list[str] | None = None) -> int:
    from opendpu.compiler.xir.graph import XModelError
    from opendpu.isa.errors import OpenDpuError
    from opendpu.runtime.dpu import RuntimeErrorDPU
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as e:
        print(f"{e.prog}: error: {e}", file=sys.stderr)
        return 2
    _VERB[0] = f"opendpu {args.cmd}"
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:
        return 0
    except OpenDpuError as e:                   # every package error (isa/errors.py)
        msg = " ".join(str(e).split("\n")).strip() or type(e).__name__
        model = getattr(args, "model", None)
        if isinstance(e, (XModelError, RuntimeErrorDPU)) and model and model not in msg:
            msg = f"{model}: {msg}"             # name the file the damaged subgraph came from
        print(f"opendpu {args.cmd}: error: {msg}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"opendpu {args.cmd}: error: out of memory (the model or the data is larger than this machine can "
              f"hold)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"opendpu {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - a bug: one line for the user, the traceback on request
        if os.environ.get("OPENDPU_DEBUG"):
            raise
        msg = " ".join(str(e).split("\n")).strip()
        print(f"opendpu {args.cmd}: internal error: {type(e).__name__}: {msg} (a bug in opendpu; rerun with "
              f"OPENDPU_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return 3
