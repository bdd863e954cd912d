"""A sweep's run: its tasks (model x point) planned, the finished ones taken from the store, the rest evaluated
by an executor (a local process pool or Ray), each result stored as it arrives, so a re-run skips finished points."""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Callable

from opendpu.isa.target import Target

from .cache import PreparedModel, compile_key, compiler_version
from .evaluate import Task, base_row
from .executors import run_local, run_ray
from .points import build_points, point_id, pre_constraints
from .spec import ROW_COLUMNS, SweepError, SweepSpec
from .store import RESULT_VERSION, Store


def plan(spec: SweepSpec, models: list[PreparedModel], cache_dir: str | None,
         built: list[tuple[dict, Target | None, str]] | None = None) -> tuple[list[Task], list[dict]]:
    """The tasks of a sweep (model x point), and the points excluded by a resource constraint (rows, not run).
    A point whose target cannot be built is a task with its reason (a failed row). `built`: build_points(spec),
    when the caller has it already."""
    if built is None:
        built = build_points(spec)
    pre = pre_constraints(spec)
    tasks, excluded = [], []
    for m in models:
        for p, t, why in built:
            h = hashlib.sha256(json.dumps([RESULT_VERSION, m.hash, point_id(p), spec.options, compiler_version()],
                                          sort_keys=True).encode()).hexdigest()[:16]
            task = Task(m.label, m.hash, p, h, t, compile_key(m.hash, t, spec.options) if t else "", cache_dir,
                        spec.options, why)
            if t is not None and pre:
                row = base_row(task)
                bad = [c for c in pre if not c.ok(row[c.name])]
                if bad:
                    row.update(status="excluded", reason="constraint " + ", ".join(
                        f"{c} ({c.name} = {row[c.name]:g})" for c in bad), meets_constraints=False)
                    excluded.append(row)
                    continue
            tasks.append(task)
    return tasks, excluded


@dataclass
class SweepResult:
    rows: list[dict]
    results: dict[str, dict]           # hash -> full result
    computed: int                      # points evaluated in this run
    reused: int                        # points taken from the directory (an earlier run)
    excluded: int


def run(spec: SweepSpec, models: list[PreparedModel], store: Store, cache_dir: str | None,
        executor: str = "local", workers: int | None = None, address: str | None = None,
        progress: Callable[[int, int, str], None] | None = None, retries: int = 2,
        on_result: Callable[[dict], None] | None = None) -> SweepResult:
    """Evaluate every task not already in `store`; rows in task order (excluded points last)."""
    tasks, excluded = plan(spec, models, cache_dir)
    done: dict[str, dict] = {}
    for t in tasks:
        r = store.get(t.hash)
        if r is not None:
            done[t.hash] = r
    todo = [t for t in tasks if t.hash not in done]
    reused = len(done)
    srcs = {m.hash: m.path for m in models}
    total = len(tasks)
    k = [reused]

    def finished(task: Task, res: dict, seconds: float) -> None:
        store.put(res)
        store.log({"time": time.time(), "model": task.model, "point": point_id(task.point), "hash": task.hash,
                   "status": res["status"], "reason": res["reason"], "compile_cached": res.get("compile_cached"),
                   "seconds": round(seconds, 3)})
        done[task.hash] = res
        k[0] += 1
        if progress is not None:
            progress(k[0], total, f"{task.model} {point_id(task.point)}")
        if on_result is not None:
            on_result(res)

    if progress is not None:
        progress(reused, total, "resumed" if reused else "start")
    # points sharing a compiled program run after the first one that compiles it (no duplicate compiles)
    order = sorted(range(len(todo)), key=lambda i: (todo[i].key, i))
    todo = [todo[i] for i in order]
    if executor == "local":
        run_local(todo, srcs, finished, workers, retries)
    elif executor == "ray":
        run_ray(todo, srcs, finished, address, retries)
    else:
        raise SweepError(f"executor {executor!r}; choose local or ray")
    rows = []
    for t in tasks:
        r = done[t.hash]
        rows.append({c: r.get(c) for c in ROW_COLUMNS})
    post = [c for c in spec.constraints]
    for r in rows:
        if r["status"] == "ok":
            r["meets_constraints"] = all(c.ok(r[c.name]) for c in post)
    rows += excluded
    return SweepResult(rows, dict(done), len(todo), reused, len(excluded))
