"""The import graph of opendpu follows its layering: an allowed-edges table between packages, no import cycles.

The graph is built with `ast` from the source tree (every `import` / `from ... import` of `opendpu.*`, at any
depth of the module, relative imports resolved), so it sees function-level imports that an import-time
check would miss. The layers (docs/architecture.md): isa is the base; sim, hw and compiler sit on it; the
golden (compiler.ref) stands apart from the compiler it checks; quant builds on compiler; runtime on all.
"""
from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_DIRS = ("isa", "sim", "compiler", "runtime", "quant", "hw")     # top-level dirs, installed as opendpu.<dir>
ROOT = "opendpu"

# layer -> the other layers its modules may import (imports within a layer are always allowed)
ALLOWED = {
    "isa": set(),
    "sim": {"isa"},
    "hw": {"isa"},
    "compiler": {"isa"},                      # compiler passes never import runtime, hw or the golden; of sim
                                              # only sim.timing (MODULES below), never the executor
    "compiler.ref": {"isa"},                  # the golden keeps its own derivations: nothing of the compiler
    "quant": {"isa", "compiler"},
    "runtime": {"isa", "sim", "hw", "compiler", "compiler.ref", "quant"},
}
# single modules of another layer a layer may import: the compiler decides by the one cycle model (issue 31)
MODULES = {"compiler": {"opendpu.sim.timing"}}


def module_files(repo: str = REPO) -> dict[str, str]:
    """{module name: file path} of every opendpu module in the source tree."""
    out = {}
    for d in SOURCE_DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(repo, d)):
            dirnames[:] = [n for n in dirnames if n != "__pycache__"]
            rel = os.path.relpath(dirpath, repo).split(os.sep)
            for f in files:
                if f.endswith(".py"):
                    parts = rel + ([] if f == "__init__.py" else [f[:-3]])
                    out[".".join([ROOT] + parts)] = os.path.join(dirpath, f)
    return out


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute module named by `from <level dots><name> import ...` inside `module`."""
    if not level:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def imports_of(module: str, path: str, known: set[str]) -> set[str]:
    """The opendpu modules `module` imports anywhere in its file, plus bare top-level source names (`isa`,
    `sim`, ...) it imports (a bug under the one-namespace install: they are returned as they are)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_package = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, is_package, node.level, node.module)
            # `from pkg import sub` imports the submodule pkg.sub; `from mod import name` the module itself
            targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in known else src for a in node.names]
        else:
            continue
        for t in targets:
            top = t.split(".")[0]
            if top == ROOT and t != ROOT:
                while t not in known and "." in t:        # `import opendpu.sim.timing.x`: the deepest module
                    t = t.rsplit(".", 1)[0]
                out.add(t)
            elif top in SOURCE_DIRS:
                out.add(t)
    out.discard(module)
    return out


def import_graph(repo: str = REPO) -> dict[str, set[str]]:
    """{module: the modules it imports} over opendpu's source tree."""
    files = module_files(repo)
    known = set(files)
    return {m: imports_of(m, p, known) for m, p in files.items()}


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] != ROOT:
        return "<bare " + parts[0] + ">"
    if parts[1:3] == ["compiler", "ref"]:
        return "compiler.ref"
    return parts[1]


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """One line per import that crosses layers against ALLOWED (or names a bare top-level source package)."""
    out = []
    for src in sorted(graph):
        a = layer(src)
        for dst in sorted(graph[src]):
            b = layer(dst)
            if b.startswith("<bare"):
                out.append(f"{src} imports {dst}: a bare top-level name; import it as {ROOT}.{dst}")
            elif a != b and b not in ALLOWED[a] and dst not in MODULES.get(a, ()):
                out.append(f"{src} imports {dst}: layer {a} may import only {sorted(ALLOWED[a]) or 'nothing'}")
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted; [] when acyclic."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = [0]

    def visit(v: str) -> None:                      # iterative: no recursion limit on long chains
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


GRAPH = import_graph()


def test_graph_is_built():
    """The parser sees the tree: every package, and edges of each import form (absolute, relative, function-level)."""
    assert {layer(m) for m in GRAPH} == set(ALLOWED)
    assert len(GRAPH) > 60
    assert "opendpu.isa.fields" in GRAPH["opendpu.sim.timing"]              # absolute, module level
    assert "opendpu.sim._kernels" in GRAPH["opendpu.sim._timing"]           # `from . import _kernels`
    assert "opendpu.sim.executor" in GRAPH["opendpu.sim"]                   # relative in a package __init__
    assert "opendpu.hw.harness" in GRAPH["opendpu.runtime.cosim"]           # inside a function


def test_layering():
    bad = layering_violations(GRAPH)
    assert not bad, "imports against the layering (ALLOWED):\n" + "\n".join(bad)


def test_no_import_cycles():
    cycles = import_cycles(GRAPH)
    assert not cycles, "import cycles (modules of one strongly connected component):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def _with_edge(src: str, dst: str) -> dict[str, set[str]]:
    g = {m: set(d) for m, d in GRAPH.items()}
    g[src].add(dst)
    return g


def test_checker_reports_an_upward_import_and_a_cycle():
    """Injected edges are reported: an upward import (isa -> runtime), the golden used by a compiler pass, a
    bare top-level name, and a cycle."""
    base = set(layering_violations(GRAPH))
    new = set(layering_violations(_with_edge("opendpu.isa.fields", "opendpu.runtime.cli"))) - base
    assert new == {"opendpu.isa.fields imports opendpu.runtime.cli: layer isa may import only nothing"}
    new = set(layering_violations(_with_edge("opendpu.compiler.outdir", "opendpu.compiler.ref.ops"))) - base
    assert new == {"opendpu.compiler.outdir imports opendpu.compiler.ref.ops: layer compiler may import only ['isa']"}
    new = set(layering_violations(_with_edge("opendpu.compiler.codegen", "opendpu.sim.executor"))) - base
    assert new == {"opendpu.compiler.codegen imports opendpu.sim.executor: layer compiler may import only ['isa']"}
    assert "opendpu.sim.timing" in GRAPH["opendpu.compiler.codegen.plans"]     # the one cycle model: allowed
    new = set(layering_violations(_with_edge("opendpu.sim.timing", "isa.fields"))) - base
    assert new == {"opendpu.sim.timing imports isa.fields: a bare top-level name; import it as opendpu.isa.fields"}
    g = _with_edge("opendpu.isa.fields", "opendpu.isa.program")                   # program imports fields
    assert ["opendpu.isa.fields", "opendpu.isa.program"] in import_cycles(g)
    g = _with_edge("opendpu.isa.fields", "opendpu.sim.timing")                    # a longer loop, across layers
    assert any({"opendpu.isa.fields", "opendpu.sim.timing", "opendpu.isa.program"} <= set(c)
               for c in import_cycles(g))


def test_resolve_relative():
    assert _resolve("opendpu.sim.timing", False, 1, "executor") == "opendpu.sim.executor"
    assert _resolve("opendpu.sim", True, 1, "executor") == "opendpu.sim.executor"
    assert _resolve("opendpu.compiler.ref.ops", False, 2, "xir.graph") == "opendpu.compiler.xir.graph"
    assert _resolve("opendpu.compiler.ref", True, 2, None) == "opendpu.compiler"
