"""Up-front validation for the `opendpu` CLI: argparse types with ranges, input files, timing overrides.

Everything here runs before any computation, so a mistake costs nothing and leaves nothing behind. Errors are
`CliError` (or argparse's ArgumentTypeError inside a type) with one line naming the offending thing.
"""
from __future__ import annotations

import argparse
import math
import os
import zipfile

import numpy as np

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.target import TargetError, Timing


class CliError(OpenDpuError):
    """A user error the CLI reports as one line `opendpu VERB: error: ...` with exit code 2."""


# ---- argparse types ---------------------------------------------------------------------------------------
def int_range(lo: int | None = None, hi: int | None = None):
    """An argparse type: an integer in [lo, hi]; out-of-range values are called out of range."""
    def conv(s: str) -> int:
        try:
            v = int(s, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
        if lo is not None and v < lo:
            raise argparse.ArgumentTypeError(f"{v} is out of range (must be >= {lo})")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"{v} is out of range (must be <= {hi})")
        return v
    conv.__name__ = "integer"
    return conv


MAX_SHAPE_DIM = 1 << 16      # an input dimension beyond this is a typo, not a DPU input


def shape_arg(s: str) -> list[int]:
    """An argparse type: an NCHW shape like 1,3,224,224 (positive integers; the batch is run as 1)."""
    parts = [p.strip() for p in s.replace("x", ",").split(",")]
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a shape like 1,3,224,224") from None
    if not 1 <= len(dims) <= 8 or any(not 1 <= d <= MAX_SHAPE_DIM for d in dims):
        raise argparse.ArgumentTypeError(f"{s!r}: give 1..8 dimensions, each in 1..{MAX_SHAPE_DIM}")
    return dims


shape_arg.__name__ = "shape"


def names_arg(s: str) -> list[str]:
    """An argparse type: a comma-separated list of node names (ONNX names such as /conv1/Conv), none empty."""
    names = [p.strip() for p in s.split(",")]
    if not names or any(not n for n in names):
        raise argparse.ArgumentTypeError(f"{s!r} is not a list of node names like /dense5/Gemm,/prelu5/PRelu")
    return names


names_arg.__name__ = "names"


def float_range(lo: float, hi: float, lo_open: bool = True):
    """An argparse type: a finite float in (lo, hi] (or [lo, hi] when not lo_open)."""
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{s} is not a finite number")
        if (v <= lo if lo_open else v < lo) or v > hi:
            left = "(" if lo_open else "["
            raise argparse.ArgumentTypeError(f"{s} is out of range (must be in {left}{lo:g}, {hi:g}])")
        return v
    conv.__name__ = "number"
    return conv


SEED_MAX = 2**32 - 1        # one --seed range for every verb (the sweep's spec seeds and random.Random included)
SEED = int_range(0, SEED_MAX)


def input_file(path: str, what: str = "input") -> str:
    """An existing, readable regular file."""
    if not path:
        raise CliError(f"{what}: empty file name")
    if not os.path.lexists(path):
        raise CliError(f"{what} {path}: no such file")
    if os.path.isdir(path):
        raise CliError(f"{what} {path} is a directory, not a file")
    if not os.path.isfile(path):
        raise CliError(f"{what} {path} is not a regular file")
    if not os.access(path, os.R_OK):
        raise CliError(f"{what} {path} is not readable")
    return path


def input_dir(path: str, what: str) -> str:
    if not os.path.lexists(path):
        raise CliError(f"{what} {path}: no such directory")
    if not os.path.isdir(path):
        raise CliError(f"{what} {path} is not a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise CliError(f"{what} {path} is not readable")
    return path


def input_path(path: str, what: str) -> str:
    """A file or a directory that exists (calibration data may be a folder of .npy)."""
    if not os.path.lexists(path):
        raise CliError(f"{what} {path}: no such file or directory")
    return input_dir(path, what) if os.path.isdir(path) else input_file(path, what)


_NPY_MAGIC = b"\x93NUMPY"


def load_array(path: str, what: str = "input") -> np.ndarray:
    """An .npy file's array (no pickles), with a clear message for anything else."""
    input_file(path, what)
    with open(path, "rb") as f:
        head = f.read(6)
    if head != _NPY_MAGIC:
        kind = "a .npz archive" if head[:4] == b"PK\x03\x04" else "not an .npy file (no NumPy header)"
        raise CliError(f"{what} {path}: {kind}" + ("; give it as the only -i" if head[:4] == b"PK\x03\x04" else ""))
    try:
        a = np.load(path, allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e):
            raise CliError(f"{what} {path}: holds Python objects (dtype object); give a numeric array") from None
        raise CliError(f"{what} {path}: corrupt .npy file ({e})") from None
    except (OSError, EOFError) as e:
        raise CliError(f"{what} {path}: cannot read the .npy file ({e})") from None
    return a


def load_npz(path: str, what: str = "input") -> dict[str, np.ndarray]:
    input_file(path, what)
    if not zipfile.is_zipfile(path):
        raise CliError(f"{what} {path}: not an .npz archive")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except ValueError as e:
        if "pickle" in str(e):
            raise CliError(f"{what} {path}: holds Python objects (dtype object); give numeric arrays") from None
        raise CliError(f"{what} {path}: corrupt .npz archive ({e})") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as e:
        raise CliError(f"{what} {path}: corrupt .npz archive ({e})") from None


def load_bin(path: str, count: int, what: str = "input") -> np.ndarray:
    """A raw int8 .bin (the xdputil / golden layout: fixed point, NHWC) of exactly `count` bytes."""
    input_file(path, what)
    n = os.path.getsize(path)
    if n != count:
        raise CliError(f"{what} {path}: {n} bytes, the tensor needs {count} int8 values (raw fixed point)")
    return np.fromfile(path, dtype=np.int8)


# ---- timing overrides --------------------------------------------------------------------------------------
def timing_value(key: str, raw: str, what: str = "--timing"):
    """Parse and range-check one timing parameter by constructing a Timing with it."""
    fields = Timing.__dataclass_fields__
    if key not in fields:
        raise CliError(f"{what} {key}: unknown timing parameter; known: {', '.join(fields)}")
    try:
        v = float(raw) if key == "clock_mhz" else int(raw, 0)
    except ValueError:
        kind = "a number" if key == "clock_mhz" else "an integer"
        raise CliError(f"{what} {key}={raw}: not {kind}") from None
    if key == "clock_mhz" and not math.isfinite(v):
        raise CliError(f"{what} {key}={raw}: out of range (must be a finite number > 0)")
    try:
        Timing().replace(**{key: v})
    except (TargetError, OverflowError, ValueError) as e:
        raise CliError(f"{what} {key}={raw}: out of range ({e})") from None
    return v


def timing_overrides(pairs: list[str] | None, clock_mhz: float | None = None) -> dict:
    tm: dict = {}
    for kv in pairs or []:
        if "=" not in kv:
            raise CliError(f"--timing {kv!r}: expected KEY=VALUE (e.g. ddr_latency=80)")
        k, v = (s.strip() for s in kv.split("=", 1))
        if k in tm:
            raise CliError(f"--timing {k} is given twice")
        tm[k] = timing_value(k, v)
    if clock_mhz is not None:
        if "clock_mhz" in tm:
            raise CliError("--clock-mhz and --timing clock_mhz=... both given; give one")
        tm["clock_mhz"] = clock_mhz
    if tm:
        try:
            Timing().replace(**tm)
        except (TargetError, OverflowError, ValueError) as e:
            raise CliError(f"--timing: {e}") from None
    return tm
