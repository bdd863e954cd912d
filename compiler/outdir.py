"""The one output rule of every opendpu verb that writes: never delete or change a file opendpu did not write.

A directory output is created when missing. An existing directory is used only when it is empty or carries
opendpu's marker file (`.opendpu-output`); anything else (`.`, an ancestor of an input, a foreign non-empty
directory) needs `force=True`. The marker (version 2) records every file opendpu wrote there with its size,
SHA-256 and net (the compiled net's `-n` name, the quantized model's stem, the exported zoo model):
`{"tool": "opendpu", "version": 2, "files": {"rel/path": {"size": N, "sha256": H, "net": NAME}}}`. A file counts
as opendpu's only while its bytes still match its record and its path has no symlink component (so it never
leaves the directory):
- a run replaces an existing file of one of its output names only when it is opendpu's; anything else of that name
  (a foreign file, one changed since, a symlink) is refused before any work (`check_dir(names=...)`), or with
  `force=True` replaced with a line saying so;
- a directory output is replaced per net: a rerun removes the files the earlier run of the same net wrote and this
  run does not, each with a line, and only while they still match; a listed file changed since is kept (with a
  line) and no longer counted as opendpu's. Files of other nets are kept; a name every net writes (compile's
  meta.json, quantize's quant_info.json) belongs to the newest net, and its replacement is printed;
- an old-style marker (a plain list, no hashes) licenses no deletion and no replacement.
Every check (a real probe file or directory created and removed, the file-name length, the names a run will
write) happens before any work. A regular file is never turned into a directory. A file output must carry its own
suffix; it may replace an existing file of that suffix, never an input of the command. Directories get ordinary
permissions (umask). Decisions: docs/decisions.md "Hardening".
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from typing import Callable

from opendpu.isa.errors import OpenDpuError
from opendpu.isa.jsonin import MAX_JSON_DEPTH, json_depth

MARKER = ".opendpu-output"
MARKER_VERSION = 2
PROBE = ".opendpu-probe-"


class OutputError(OpenDpuError, ValueError):
    """An output path that would destroy data or cannot be written; the message names it."""


def _real(p: str) -> str:
    return os.path.realpath(os.path.abspath(p))


def _is_within(child: str, parent: str) -> bool:
    child, parent = _real(child), _real(parent)
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def _clean_rel(x) -> str | None:
    """A marker's relative path, or None for one that could leave the directory or name a marker."""
    if not isinstance(x, str) or not x or "\0" in x or x.startswith("/") or "\\" in x:
        return None
    parts = x.split("/")
    if any(q in ("", ".", "..") for q in parts) or parts[-1] == MARKER:
        return None
    return x


def _marker_entries(d: str) -> dict[str, dict] | None:
    """Relative path -> record {"size", "sha256", "net"} of every file d's marker lists (an old-style marker's
    records have no size and hash: they license nothing), or None when d carries no valid marker (a marker that is
    a symlink is none)."""
    p = os.path.join(d, MARKER)
    if os.path.islink(p) or not os.path.isfile(p):
        return None
    try:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        if json_depth(text) > MAX_JSON_DEPTH:        # json would recurse once per level: no marker of opendpu's
            return None
        data = json.loads(text)
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    out: dict[str, dict] = {}
    if isinstance(files, list):                     # version 1: names only
        if not all(isinstance(x, str) for x in files):
            return None
        for x in files:
            if _clean_rel(x):
                out[x] = {"size": None, "sha256": None, "net": None}
        return out
    if not isinstance(files, dict):
        return None
    for x, e in files.items():
        if _clean_rel(x) and isinstance(e, dict):
            size, h, net = e.get("size"), e.get("sha256"), e.get("net")
            ok = isinstance(size, int) and not isinstance(size, bool) and isinstance(h, str) and len(h) == 64
            out[x] = {"size": size if ok else None, "sha256": h if ok else None,
                      "net": net if isinstance(net, str) else None}
    return out


def _sha256(p: str) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _record_of(p: str, net: str | None) -> dict:
    return {"size": os.lstat(p).st_size, "sha256": _sha256(p), "net": net}


def _symlink_in(d: str, rel: str) -> str | None:
    """The first path below d on the way to d/rel that is a symlink (or that leaves d), else None."""
    cur = d
    for part in rel.split("/"):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            return cur
    if os.path.lexists(cur) and not _is_within(cur, d):
        return cur
    return None


def _foreign(d: str, rel: str, rec: dict | None) -> str | None:
    """None when d/rel is the file opendpu wrote there (reached without a symlink, size and SHA-256 as the marker's
    record `rec` says), else why it is not, as a phrase after "it"."""
    s = _symlink_in(d, rel)
    p = os.path.join(d, rel)
    if s:
        return "is a symlink" if s == p else f"lies behind the symlink {s}"
    if not rec:
        return "was not written by opendpu"
    if rec.get("sha256") is None:
        return "is listed by an old-style marker without a content hash"
    try:
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        if st.st_size != rec["size"] or _sha256(p) != rec["sha256"]:
            return "was changed since opendpu wrote it"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return None


def _nearest_existing(path: str) -> str:
    anc = os.path.abspath(path)
    while not os.path.lexists(anc):
        anc = os.path.dirname(anc)
    return anc


def _check_name_lengths(path: str, names, what: str) -> None:
    """Every component of the directory still to be created and of every output name fits the file system's
    NAME_MAX (bytes)."""
    base = _nearest_existing(path)
    try:
        limit = os.pathconf(base if os.path.isdir(base) else os.path.dirname(base), "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    missing = os.path.relpath(os.path.abspath(path), base)
    parts = [] if missing == "." else missing.split(os.sep)
    for part in [*parts, *(q for name in names for q in name.split("/"))]:
        b = len(os.fsencode(part))
        if limit and limit > 0 and b > limit:
            raise OutputError(f"{what} {path}: the file name {part[:40]}... is {b} bytes long; the file system "
                              f"allows {limit}")


def _probe(where: str, path: str, what: str, *, directory: bool) -> None:
    """Create and remove a real probe (a directory holding a file, or a file) in `where`: os.access says yes to
    root everywhere, /proc and /sys included."""
    kind = "a directory" if directory else "a file"
    try:
        if directory:
            q = tempfile.mkdtemp(prefix=PROBE, dir=where)
            try:
                fd, f = tempfile.mkstemp(prefix=PROBE, dir=q)
                os.close(fd)
                os.remove(f)
            finally:
                os.rmdir(q)
        else:
            fd, f = tempfile.mkstemp(prefix=PROBE, dir=where)
            os.close(fd)
            os.remove(f)
    except OSError as e:
        raise OutputError(f"{what} {path}: cannot create {kind} in {where} ({e.strerror or e})") from None


def _check_names(d: str, names, *, force: bool, inputs, what: str) -> None:
    """The names a run will write into the existing directory d: none may be written through a symlink, replace a
    directory or an input, or (unless force) replace a file that is not opendpu's unchanged output."""
    recs = _marker_entries(d) or {}
    for n in names:
        parent = n.rsplit("/", 1)[0] if "/" in n else ""
        s = _symlink_in(d, parent) if parent else None
        if s:
            raise OutputError(f"{what} {d}: {n} would be written through the symlink {s}; opendpu never writes "
                              f"through a symlink inside its output")
        if n.endswith("/"):                 # a directory whose file names are known only after the work
            _check_subtree(d, n.rstrip("/"), recs, force=force, what=what)
            continue
        dst = os.path.join(d, n)
        if not os.path.lexists(dst):
            continue
        if os.path.isdir(dst) and not os.path.islink(dst):
            raise OutputError(f"{what} {d}: {n} is an existing directory; opendpu writes a file of that name")
        i = _is_input(dst, inputs)
        if i:
            raise OutputError(f"{what} {d}: {n} would replace the input {i}; choose another output directory")
        why = None if force else _foreign(d, n, recs.get(n))
        if why:
            raise OutputError(f"{what} {d}: {n} exists and {why}; opendpu replaces only its own unchanged files: "
                              f"move it away, or use --force to replace it")


def _check_subtree(d: str, sub: str, recs: dict, *, force: bool, what: str) -> None:
    """`sub` (e.g. quantize's golden/) will take files whose names depend on the work: it must not be a symlink or a
    file, and (unless force) every file already in it must be opendpu's unchanged output, so that nothing the run
    may write over is found only after the work."""
    dst = os.path.join(d, sub)
    s = _symlink_in(d, sub)
    if s:
        raise OutputError(f"{what} {d}: {sub}/ would be written through the symlink {s}; opendpu never writes "
                          f"through a symlink inside its output")
    if not os.path.lexists(dst):
        return
    if not os.path.isdir(dst):
        raise OutputError(f"{what} {d}: {sub} is an existing file; opendpu writes a directory of that name")
    if force:
        return
    for root, dirs, files in os.walk(dst):
        for f in sorted(files) + sorted(x for x in dirs if os.path.islink(os.path.join(root, x))):
            rel = os.path.relpath(os.path.join(root, f), d).replace(os.sep, "/")
            why = _foreign(d, rel, recs.get(rel))
            if why:
                raise OutputError(f"{what} {d}: {rel} exists and {why}; opendpu writes files of its own choosing "
                                  f"into {sub}/: move it away, or use --force to write beside it")


def _writable_parent(path: str, what: str) -> None:
    parent = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(parent):
        raise OutputError(f"{what} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path}: directory {parent} is not writable")


def check_dir(path: str, *, force: bool = False, inputs=(), what: str = "output directory", names=()) -> None:
    """Raise OutputError unless `path` may be used as a directory output. Nothing is left behind: a probe (a file
    in an existing directory, a directory in the nearest existing ancestor of one still to be created) is created
    and removed at once. `names`: the relative paths the run will write there, when known before the work; each
    must fit the file system's name length, and one that exists must be opendpu's unchanged output (or `force`),
    never an input, a directory or behind a symlink."""
    if not path:
        raise OutputError(f"{what}: empty path")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OutputError(f"{what} {path} is an existing file, not a directory (never replaced, even with --force)")
    names = [n.replace(os.sep, "/") for n in names]
    _check_name_lengths(path, names, what)
    if not os.path.isdir(path):
        # created later: its nearest existing ancestor must take a new directory
        anc = _nearest_existing(os.path.dirname(os.path.abspath(path)))
        if not os.path.isdir(anc):
            raise OutputError(f"{what} {path}: {anc} is not a directory")
        if not os.access(anc, os.W_OK | os.X_OK):
            raise OutputError(f"{what} {path}: cannot create it, {anc} is not writable")
        _probe(anc, path, what, directory=True)
        return
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path} is not writable")
    _probe(path, path, what, directory=False)
    entries = os.listdir(path)
    if entries and _marker_entries(path) is None and not force:
        holds = [i for i in inputs if i and _is_within(i, path)]
        why = (f"it holds the input {holds[0]}" if holds else
               f"it is not empty ({len(entries)} entries) and was not written by opendpu")
        raise OutputError(f"{what} {path}: {why}; use another directory, or --force to write opendpu's files beside "
                          f"the others (same-named files are then replaced, each named)")
    _check_names(path, names, force=force, inputs=inputs, what=what)


def check_file(path: str, *, suffixes: tuple[str, ...], inputs=(), what: str = "output") -> None:
    """Raise OutputError unless `path` may be written as a file output: it carries one of the output's own
    suffixes, its name fits the file system, its directory exists and really takes a new file (a probe file is
    created and removed there), and it is not an input of the command. An existing file with that suffix is
    replaced (re-running a command is normal)."""
    if not path:
        raise OutputError(f"{what}: empty path")
    if os.path.isdir(path):
        raise OutputError(f"{what} {path} is a directory; give a file name")
    if not path.lower().endswith(tuple(s.lower() for s in suffixes)):
        raise OutputError(f"{what} {path}: the file name must end in {' or '.join(suffixes)}")
    _writable_parent(path, what)
    parent = os.path.dirname(os.path.abspath(path))
    _check_name_lengths(parent, [os.path.basename(path)], what)
    _probe(parent, path, what, directory=False)
    if os.path.lexists(path):
        if _is_input(path, inputs):
            raise OutputError(f"{what} {path} is an input of this command; it is never overwritten")
        if not os.access(path, os.W_OK):
            raise OutputError(f"{what} {path} exists and is not writable")


def _write_marker(d: str, recs: dict[str, dict]) -> None:
    """Write d's marker atomically, through a new uniquely named sibling (ordinary permissions: umask)."""
    tmp = os.path.join(d, f"{MARKER}.{os.getpid()}-{os.urandom(4).hex()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w") as f:
            json.dump({"tool": "opendpu", "version": MARKER_VERSION, "files": {k: recs[k] for k in sorted(recs)}},
                      f, indent=1)
        os.replace(tmp, os.path.join(d, MARKER))
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)


def record(d: str, files: list[str], net: str | None = None) -> None:
    """Record files (relative to d) that opendpu wrote straight into d in its marker (size, hash, net), so a later
    run may replace them."""
    recs = {r: e for r, e in (_marker_entries(d) or {}).items() if e.get("sha256")}
    for f in files:
        rel = f.replace(os.sep, "/")
        recs[rel] = _record_of(os.path.join(d, rel), net)
    _write_marker(d, recs)


def _is_input(path: str, inputs) -> str | None:
    """The input that `path` is (same file), or None."""
    for i in inputs:
        if i and os.path.exists(i) and os.path.exists(path) and os.path.samefile(i, path):
            return i
    return None


def publish(tmp: str, d: str, inputs=(), *, net: str | Callable[[str], str | None] | None = None,
            force: bool = False, log: Callable[[str], None] | None = print) -> list[str]:
    """Move every file under `tmp` into `d` (merging directories) and record it in d's marker with its size, hash
    and net (`net`: a name, or a function of the relative path for a run that writes several nets). An existing
    file of the same name is replaced only when it is opendpu's unchanged output, or with `force` (printed); a
    name written by an earlier run of another net is taken over (printed). Then the earlier run's files of the
    nets written now that this run did not write are removed, each printed, only while they still match their
    record and are reached without a symlink; a changed one is kept (printed) and dropped from the marker. Files of
    other nets, inputs and files an old-style marker lists are never removed. Every conflict (an input that would be
    replaced, a foreign file, a file where a directory goes, a path through a symlink) is found before anything
    moves. A marker of a verb run inside this one (build's quantized/, compiled/) is merged into the marker of
    that subdirectory. Returns the relative paths written."""
    netof: Callable[[str], str | None] = net if callable(net) else (lambda _rel: net)
    say = log or (lambda _m: None)
    recs = _marker_entries(d) or {}
    moves = []                      # (source, destination, relative path, None | "own" | why it is not opendpu's)
    nested = []                     # subdirectories of tmp holding their own marker
    for root, _dirs, files in os.walk(tmp):
        rel_root = os.path.relpath(root, tmp).replace(os.sep, "/")
        dst_root = d if rel_root == "." else os.path.join(d, rel_root)
        s = _symlink_in(d, rel_root) if rel_root != "." else None
        if s:
            raise OutputError(f"cannot write into {dst_root}: {s} is a symlink (opendpu never writes through one)")
        if os.path.lexists(dst_root) and not os.path.isdir(dst_root):
            raise OutputError(f"cannot write into {dst_root}: it is an existing file")
        for f in sorted(files):
            if f == MARKER:
                if rel_root != ".":
                    nested.append(rel_root)
                continue
            rel = f if rel_root == "." else f"{rel_root}/{f}"
            dst = os.path.join(d, rel)
            if os.path.isdir(dst) and not os.path.islink(dst):
                raise OutputError(f"cannot write {dst}: it is an existing directory")
            i = _is_input(dst, inputs)
            if i:
                raise OutputError(f"output {dst} would replace the input {i}; choose another output directory")
            state = None
            if os.path.lexists(dst):
                state = _foreign(d, rel, recs.get(rel)) or "own"
                if state != "own" and not force:
                    raise OutputError(f"{dst} exists and {state}; opendpu replaces only its own unchanged files: "
                                      f"move it away, or use --force to replace it")
            moves.append((os.path.join(root, f), dst, rel, state))
    nested_recs = {sub: _marker_entries(os.path.join(tmp, sub)) or {} for sub in nested}
    written = [rel for _, _, rel, _ in moves]
    taken: dict[tuple, list[str]] = {}        # (earlier net, new net) -> names every net writes, taken over
    for src, dst, rel, state in moves:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)        # replaces a symlink itself, never its target
        old = recs.get(rel)
        if state not in (None, "own"):
            say(f"replaced {dst} (it {state}; --force)")
        elif state == "own" and old and old.get("net") != netof(rel):
            taken.setdefault((old.get("net"), netof(rel)), []).append(rel)
    for (was, now), rels in taken.items():
        shown = ", ".join(rels[:4]) + (f" and {len(rels) - 4} more" if len(rels) > 4 else "")
        say(f"replaced {len(rels)} file(s) of net {was} in {d} with net {now}'s (names every net writes): {shown}")
    nets = {netof(rel) for rel in written}
    keep: dict[str, dict] = {}
    legacy = 0
    for rel in sorted(set(recs) - set(written)):
        rec, p = recs[rel], os.path.join(d, rel)
        if rec.get("sha256") is None:
            legacy += 1                                     # an old-style marker: no license to delete
            continue
        if not os.path.lexists(p):
            continue
        if rec.get("net") not in nets or _is_input(p, inputs):
            keep[rel] = rec                                 # another net's file, or an input of this run: kept
            continue
        why = _foreign(d, rel, rec)
        if why:
            say(f"kept {p}: it {why} (the earlier run of net {rec.get('net')} wrote it); no longer counted as "
                f"opendpu's")
            continue
        os.remove(p)
        say(f"removed stale {p} (written by the earlier run of net {rec.get('net')})")
    if legacy:
        say(f"{d}: its old marker lists {legacy} file(s) without a content hash; none was removed or counted as "
            f"opendpu's")
    for rel in written:
        keep[rel] = _record_of(os.path.join(d, rel), netof(rel))
    _write_marker(d, keep)
    for sub, sub_recs in nested_recs.items():
        dsub = os.path.join(d, sub)
        merged = {r: e for r, e in (_marker_entries(dsub) or {}).items()
                  if e.get("sha256") and os.path.lexists(os.path.join(dsub, r))}
        merged.update(sub_recs)
        _write_marker(dsub, merged)
    return written


class DirOutput:
    """Write a directory output safely: files go to a hidden temporary directory inside the destination and
    are published (`publish`: per net, only opendpu's unchanged files replaced or removed, each removal printed by
    `log`) only when the block succeeds. On failure nothing is left: neither the temporary files nor a directory
    this object created.

        out = DirOutput(path, force=..., inputs=[...], net=NAME)
        with out as tmp:
            write files into tmp
        out.written  # relative paths
    """

    def __init__(self, path: str, *, force: bool = False, inputs=(), what: str = "output directory",
                 net: str | Callable[[str], str | None] | None = None, log: Callable[[str], None] | None = print):
        check_dir(path, force=force, inputs=inputs, what=what)
        self.path, self._inputs, self._force, self._net, self._log = path, list(inputs), force, net, log
        self.written: list[str] = []
        self._created = not os.path.isdir(path)

    def __enter__(self) -> str:
        os.makedirs(self.path, exist_ok=True)
        self._tmp = tempfile.mkdtemp(prefix=".opendpu-tmp-", dir=self.path)
        return self._tmp

    def __exit__(self, et, ev, tb) -> None:
        try:
            if et is None:
                self.written = publish(self._tmp, self.path, inputs=self._inputs, net=self._net, force=self._force,
                                       log=self._log)
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)
            if et is not None and self._created:
                shutil.rmtree(self.path, ignore_errors=True)
