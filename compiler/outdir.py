"""The one output rule of every opendpu verb that writes: never destroy anything opendpu did not write.

A directory output is created when missing. An existing directory is used only when it is empty or carries
opendpu's marker file (`.opendpu-output`, a JSON list of the files opendpu wrote there); then only those files
are replaced and stale ones of opendpu's own removed. Anything else (`.`, an ancestor of an input, a foreign
non-empty directory) needs `force=True`, which writes opendpu's files beside the others and replaces only
same-named ones. A regular file is never turned into a directory. A file output must carry its own suffix; it
may replace an existing file of that suffix, never an input of the command. Directories get ordinary permissions
(umask). Decisions: docs/decisions.md "Hardening".
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from opendpu.isa.errors import OpenDpuError

MARKER = ".opendpu-output"


class OutputError(OpenDpuError, ValueError):
    """An output path that would destroy data or cannot be written; the message names it."""


def _real(p: str) -> str:
    return os.path.realpath(os.path.abspath(p))


def _is_within(child: str, parent: str) -> bool:
    child, parent = _real(child), _real(parent)
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _marker_files(d: str) -> list[str] | None:
    """Relative paths opendpu recorded in d's marker, or None when d carries no (valid) marker."""
    p = os.path.join(d, MARKER)
    if not os.path.isfile(p):
        return None
    try:
        with open(p) as f:
            data = json.load(f)
        files = data.get("files", []) if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    if not isinstance(files, list) or not all(isinstance(x, str) for x in files):
        return None
    return [x for x in files if not os.path.isabs(x) and ".." not in x.split("/")]


def _writable_parent(path: str, what: str) -> None:
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise OutputError(f"{what} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path}: directory {parent} is not writable")


def check_dir(path: str, *, force: bool = False, inputs=(), what: str = "output directory") -> None:
    """Raise OutputError unless `path` may be used as a directory output (creates nothing)."""
    if not path:
        raise OutputError(f"{what}: empty path")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OutputError(f"{what} {path} is an existing file, not a directory (never replaced, even with --force)")
    if not os.path.isdir(path):
        # created later: its nearest existing ancestor must be writable
        anc = os.path.dirname(os.path.abspath(path))
        while anc and not os.path.exists(anc):
            anc = os.path.dirname(anc)
        if not os.path.isdir(anc):
            raise OutputError(f"{what} {path}: {anc} is not a directory")
        if not os.access(anc, os.W_OK | os.X_OK):
            raise OutputError(f"{what} {path}: cannot create it, {anc} is not writable")
        return
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path} is not writable")
    entries = os.listdir(path)
    if not entries or _marker_files(path) is not None:
        return
    if force:
        return
    holds = [i for i in inputs if i and _is_within(i, path)]
    why = (f"it holds the input {holds[0]}" if holds else
           f"it is not empty ({len(entries)} entries) and was not written by opendpu")
    raise OutputError(f"{what} {path}: {why}; use another directory, or --force to write opendpu's files beside "
                      f"the others (only same-named files are replaced)")


def check_file(path: str, *, suffixes: tuple[str, ...], inputs=(), what: str = "output") -> None:
    """Raise OutputError unless `path` may be written as a file output (creates nothing): it carries one of the
    output's own suffixes, its directory exists and is writable, and it is not an input of the command. An
    existing file with that suffix is replaced (re-running a command is normal)."""
    if not path:
        raise OutputError(f"{what}: empty path")
    if os.path.isdir(path):
        raise OutputError(f"{what} {path} is a directory; give a file name")
    if not path.lower().endswith(tuple(s.lower() for s in suffixes)):
        raise OutputError(f"{what} {path}: the file name must end in {' or '.join(suffixes)}")
    _writable_parent(path, what)
    if os.path.lexists(path):
        if _is_input(path, inputs):
            raise OutputError(f"{what} {path} is an input of this command; it is never overwritten")
        if not os.access(path, os.W_OK):
            raise OutputError(f"{what} {path} exists and is not writable")


def _write_marker(d: str, files) -> None:
    tmp = os.path.join(d, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"tool": "opendpu", "files": sorted(files)}, f, indent=1)
    os.replace(tmp, os.path.join(d, MARKER))


def record(d: str, files: list[str]) -> None:
    """Add files (relative to d) that opendpu wrote straight into d to its marker, so a later run may replace
    them."""
    _write_marker(d, set(_marker_files(d) or []) | {f.replace(os.sep, "/") for f in files})


def _is_input(path: str, inputs) -> str | None:
    """The input that `path` is (same file), or None."""
    for i in inputs:
        if i and os.path.exists(i) and os.path.exists(path) and os.path.samefile(i, path):
            return i
    return None


def publish(tmp: str, d: str, inputs=()) -> list[str]:
    """Move every file under `tmp` into `d` (merging directories, replacing only same-named files), remove the
    stale files of opendpu's previous run in d (never one that is an input of this run), and make the marker list
    what opendpu's files there are. Every conflict (an input that would be replaced, a file where a directory goes,
    a directory where a file goes) is found before anything moves. Returns the relative paths written."""
    moves = []
    for root, _dirs, files in os.walk(tmp):
        rel_root = os.path.relpath(root, tmp)
        dst_root = d if rel_root == "." else os.path.join(d, rel_root)
        if os.path.lexists(dst_root) and not os.path.isdir(dst_root):
            raise OutputError(f"cannot write into {dst_root}: it is an existing file")
        for f in files:
            rel = os.path.normpath(os.path.join(rel_root, f)).replace(os.sep, "/")
            dst = os.path.join(d, rel)
            if os.path.isdir(dst):
                raise OutputError(f"cannot write {dst}: it is an existing directory")
            i = _is_input(dst, inputs)
            if i:
                raise OutputError(f"output {dst} would replace the input {i}; choose another output directory")
            moves.append((os.path.join(root, f), dst, rel))
    written = [rel for _, _, rel in moves]
    stale: list[str] = []
    kept: list[str] = []            # opendpu's own files of an earlier run; one that is an input now is kept
    for rel in sorted(set(_marker_files(d) or []) - set(written)):
        (kept if _is_input(os.path.join(d, rel), inputs) else stale).append(rel)
    for src, dst, _ in moves:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.move(src, dst)
    for rel in stale:
        p = os.path.join(d, rel)
        if os.path.isfile(p) or os.path.islink(p):
            os.remove(p)
    _write_marker(d, written + kept)
    return written


class DirOutput:
    """Write a directory output safely: files go to a hidden temporary directory inside the destination and
    are published only when the block succeeds. On failure nothing is left:
    neither the temporary files nor a directory this object created.

        out = DirOutput(path, force=..., inputs=[...])
        with out as tmp:
            write files into tmp
        out.written  # relative paths
    """

    def __init__(self, path: str, *, force: bool = False, inputs=(), what: str = "output directory"):
        check_dir(path, force=force, inputs=inputs, what=what)
        self.path, self._inputs = path, list(inputs)
        self.written: list[str] = []
        self._created = not os.path.isdir(path)

    def __enter__(self) -> str:
        os.makedirs(self.path, exist_ok=True)
        self._tmp = tempfile.mkdtemp(prefix=".opendpu-tmp-", dir=self.path)
        return self._tmp

    def __exit__(self, et, ev, tb) -> None:
        try:
            if et is None:
                self.written = publish(self._tmp, self.path, inputs=self._inputs)
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)
            if et is not None and self._created:
                shutil.rmtree(self.path, ignore_errors=True)
