"""A sweep directory: one JSON result per point hash, the per-point log and the spec that made it."""
from __future__ import annotations

import json
import os

import numpy as np

from .cache import atomic_write
from .spec import SweepError

RESULT_VERSION = 1
MARKER = "opendpu-sweep.json"          # marks a directory as a sweep's own (safe to add results to)


class Store:
    """A sweep directory: one JSON result per point hash (points/), the per-point log (sweep.log, JSON lines), the
    spec that made it; results are written atomically, so an interrupted sweep keeps every finished point."""

    def __init__(self, root: str):
        self.root = root
        self.points = os.path.join(root, "points")

    def check(self) -> None:
        """Refuse a path that is a file or a directory with other contents than a sweep's."""
        if os.path.exists(self.root):
            if not os.path.isdir(self.root):
                raise SweepError(f"sweep directory {self.root} is a file")
            if os.listdir(self.root) and not os.path.isfile(os.path.join(self.root, MARKER)):
                raise SweepError(f"sweep directory {self.root} exists and is not a sweep's (no {MARKER}); choose "
                                 f"a new or empty directory, nothing was written")

    def open(self, spec_text: str) -> None:
        self.check()
        os.makedirs(self.points, exist_ok=True)
        mk = os.path.join(self.root, MARKER)
        if not os.path.isfile(mk):
            atomic_write(mk, json.dumps({"opendpu_sweep": RESULT_VERSION}).encode())
        with open(os.path.join(self.root, "sweep.spec.json"), "w") as f:
            f.write(spec_text)

    def path(self, h: str) -> str:
        return os.path.join(self.points, f"{h}.json")

    def get(self, h: str) -> dict | None:
        try:
            with open(self.path(h)) as f:
                r = json.load(f)
            return r if isinstance(r, dict) and r.get("hash") == h else None
        except (OSError, ValueError):
            return None

    def put(self, result: dict) -> None:
        atomic_write(self.path(result["hash"]), json.dumps(result, default=_json_default).encode())

    def log(self, entry: dict) -> None:
        with open(os.path.join(self.root, "sweep.log"), "a") as f:
            f.write(json.dumps(entry, default=_json_default) + "\n")


def _json_default(v):
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    raise TypeError(f"{type(v).__name__} is not JSON serialisable")

