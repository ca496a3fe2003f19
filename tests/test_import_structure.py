"""The package's import graph, read with `ast` (nothing is imported): no cycles, and imports only point down.

Every `import` / `from ... import` counts, also the deferred ones inside functions and those under
`if TYPE_CHECKING:` (a type-only import is still a dependency). Relative imports are resolved; `from pkg import
name` is an edge to the submodule `pkg.name` when that is a module, else to `pkg`. Importing `a.b.c` also runs
`a/__init__` and `a/b/__init__`, but those implicit edges are left out: a package's `__init__` re-exporting its
submodules is not a cycle.

The layers, top to bottom:

    clients/           the `evenflow` CLI verbs, `evenflow bench`, service files      (may import tui)
    tui/               the Textual monitor and chat                                    (never clients)
    link/              where a client connects, with which key; LAN discovery          (never clients, tui)
    daemon/ (api, server) -> daemon/store, daemon/engine, ... -> backends/

Inside daemon/api/, rooms (docs/architecture.md): a folder per dialect (ollama/, openai/, anthropic/, responses/),
the shared request pipeline (pipeline/), the HTTP house (http/), the model routes (models/) and remote models
(remote/). Dialects do not import each other (Responses is translated to a chat completion: responses/ may use
openai/); the pipeline and the HTTP house import no dialect; the HTTP house imports nothing else of the API.
Remote models run the one pipeline: pipeline/ and a dialect's prepare step use remote/ (an upstream engine is
another source of deltas, its request is built in remote/'s terms); remote/ uses no dialect, the pipeline or the
model routes, so it writes no dialect's replies. A dialect's reply reads deltas and never knows their source: it
imports neither source (engine_stream, upstream_stream), remote/, the engine nor the model manager.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]  # the repository root is the package `evenflow`
PACKAGE = "evenflow"

# (importer, imported, why, exempt importers): no module under `importer` (a dotted prefix below `evenflow`) may
# import one under `imported`, unless it is under one of the exempt prefixes.
FORBIDDEN: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("backends", "daemon", "backends are the bottom layer", ()),
    ("backends", "clients", "backends are the bottom layer", ()),
    ("backends", "tui", "backends are the bottom layer", ()),
    ("backends", "link", "backends are the bottom layer", ()),
    ("daemon", "clients", "the daemon knows nothing of its clients", ()),
    ("daemon", "tui", "the daemon knows nothing of its clients", ()),
    ("daemon", "link", "the daemon knows nothing of its clients", ()),
    ("daemon", "daemon.api", "the HTTP API is the daemon's top: only it and the server use it",
     ("daemon.api", "daemon.server")),
    ("daemon", "daemon.server", "the server is the daemon's top: it mounts the API, nothing in daemon/ reaches back",
     ()),
    ("daemon.engine", "daemon.api", "the engine sits below the HTTP API", ()),
    ("daemon.engine", "daemon.store", "the engine sits below the model store", ()),
    ("link", "clients", "link/ is what clients/ and tui/ share: it sits below both", ()),
    ("link", "tui", "link/ is what clients/ and tui/ share: it sits below both", ()),
    ("tui", "clients", "clients/ opens the TUI, not the other way round (what both need lives in link/)", ()),
)

DIALECTS = ("ollama", "openai", "anthropic", "responses")
# (importer, imported): the one edge between dialects, and why
DIALECT_EDGES = {("responses", "openai"): "a Responses request runs as the chat completion it translates to"}
FORBIDDEN += tuple(
    (f"daemon.api.{a}", f"daemon.api.{b}", "dialects do not import each other: what two share is the pipeline's", ())
    for a in DIALECTS for b in DIALECTS if a != b and (a, b) not in DIALECT_EDGES)
FORBIDDEN += tuple(
    (f"daemon.api.{room}", f"daemon.api.{d}", "the pipeline and the HTTP house serve every dialect: they import none",
     ()) for room in ("pipeline", "http") for d in DIALECTS)
FORBIDDEN += tuple(
    ("daemon.api.http", f"daemon.api.{room}", "the HTTP house is the API's floor: the other rooms stand on it", ())
    for room in ("pipeline", "models", "remote"))
FORBIDDEN += tuple(
    ("daemon.api.remote", f"daemon.api.{room}", "remote/ stands below the pipeline: the pipeline runs remote models "
     "and the dialects' replies answer them", ()) for room in (*DIALECTS, "pipeline", "models"))
FORBIDDEN += tuple(
    (f"daemon.api.{d}.reply", below, "a reply reads deltas, whichever source gives them", ())
    for d in DIALECTS for below in ("daemon.api.pipeline.engine_stream", "daemon.api.pipeline.upstream_stream",
                                    "daemon.api.remote", "daemon.engine.engine", "daemon.manager"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def package_files() -> list[Path]:
    """evenflow/__init__.py and every .py file of its subpackages (top-level folders with an __init__.py)."""
    files = [ROOT / "__init__.py"]
    for sub in sorted(p for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"):
        files += sorted(sub.rglob("*.py"))
    return files


def _resolve(name: str, modules: set[str]) -> str | None:
    """`name` if it is a module of the package, else its nearest enclosing one (an attribute import)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path, modules: set[str]) -> dict[str, int]:
    """The package modules `path` imports -> the first line that does so."""
    me = module_name(path)
    here = me if path.name == "__init__.py" else me.rpartition(".")[0]  # the package relative imports start from
    out: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        resolved = _resolve(target, modules)
        if resolved is not None and resolved != me:
            out.setdefault(resolved, line)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                if node.level > 1:
                    base = base[:-(node.level - 1)]
                assert base, f"{path}:{node.lineno}: relative import above the package"
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
                if target != PACKAGE and not target.startswith(PACKAGE + "."):
                    continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                add(sub if sub in modules else target, node.lineno)
    return out


def build_graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    files = {module_name(p): p for p in package_files()}
    modules = set(files)
    return {m: imports_of(p, modules) for m, p in files.items()}, files


GRAPH, FILES = build_graph()


def _under(module: str, prefix: str) -> bool:
    full = f"{PACKAGE}.{prefix}"
    return module == full or module.startswith(full + ".")


def _edge(a: str, b: str) -> str:
    return f"{a} -> {b}  ({FILES[a].relative_to(ROOT)}:{GRAPH[a][b]})"


def find_cycles(graph: dict[str, dict[str, int]]) -> list[tuple[list[str], list[str]]]:
    """(component, cycle) per strongly connected component of more than one module: its modules, and one concrete
    cycle (a, b, ..., a) through the first of them."""
    succ = {a: sorted(b for b in bs if b in graph) for a, bs in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0
    for root in sorted(succ):  # Tarjan, iterative (no recursion limit to worry about)
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            child = next(it, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    components.append(sorted(comp))
    cycles = []
    for comp in components:  # the shortest way back to the first module, within the component
        members, start = set(comp), comp[0]
        prev: dict[str, str] = {}
        frontier, seen = [start], {start}
        path = None
        while frontier and path is None:
            nxt = []
            for a in frontier:
                for b in succ[a]:
                    if b == start:
                        path = [b]
                        while a != start:
                            path.append(a)
                            a = prev[a]
                        path.append(start)
                        path.reverse()
                        break
                    if b in members and b not in seen:
                        seen.add(b)
                        prev[b] = a
                        nxt.append(b)
                if path is not None:
                    break
            frontier = nxt
        cycles.append((comp, path))
    return cycles


def _describe(component: list[str], cycle: list[str]) -> str:
    return f"{len(component)} modules ({', '.join(component)}), e.g.\n    " + \
        "\n    ".join(_edge(a, b) for a, b in zip(cycle, cycle[1:]))


def test_the_graph_is_read():
    """The walk sees the whole package and resolves relative imports (a vacuous graph would pass everything)."""
    assert len(GRAPH) > 100
    for sub in ("daemon", "backends", "clients", "tui", "link"):
        assert f"{PACKAGE}.{sub}" in GRAPH, sub
    assert "evenflow.daemon.api.pipeline.prepare" in GRAPH["evenflow.daemon.api.anthropic.prepare"]  # the rooms are seen
    assert "evenflow.daemon.api.remote.convert" in GRAPH["evenflow.daemon.api.anthropic.prepare"]
    assert "evenflow.daemon.settings" in GRAPH["evenflow.clients.cli"]  # from ..daemon.settings import ...
    assert "evenflow.tui.app" in GRAPH["evenflow.tui.demo"]  # deferred, and under TYPE_CHECKING
    assert "evenflow.tui" in GRAPH["evenflow.clients.cli"]  # from .. import tui
    for importer, imported, _, exempt in FORBIDDEN:  # a misspelt layer would make its rule pass vacuously
        for prefix in (importer, imported, *exempt):
            assert f"{PACKAGE}.{prefix}" in GRAPH, prefix


def test_no_import_cycles():
    cycles = find_cycles(GRAPH)
    assert not cycles, "import cycles (break each; a lower module can hold what both sides need):\n  " + \
        "\n  ".join(_describe(*c) for c in cycles)


def _violations(graph: dict[str, dict[str, int]], rule: tuple[str, str, str, tuple[str, ...]]) -> list[tuple[str, str]]:
    importer, imported, _, exempt = rule
    return [(a, b) for a, bs in graph.items() if _under(a, importer) and not any(_under(a, e) for e in exempt)
            for b in bs if _under(b, imported)]


@pytest.mark.parametrize("rule", FORBIDDEN, ids=[f"{r[0]}-x->{r[1]}" for r in FORBIDDEN])
def test_layering(rule):
    bad = [_edge(a, b) for a, b in _violations(GRAPH, rule)]
    assert not bad, f"{rule[0]} must not import {rule[1]} ({rule[2]}):\n  " + "\n  ".join(bad)


def test_the_checks_catch_a_new_cycle_and_an_upward_import():
    """The checks themselves: a cycle and an upward edge added to a copy of the graph are both reported."""
    graph = {a: dict(bs) for a, bs in GRAPH.items()}
    graph["evenflow.daemon.settings"]["evenflow.clients.cli"] = 1  # clients.cli -> daemon.settings -> clients.cli
    found = find_cycles(graph)
    assert any({"evenflow.daemon.settings", "evenflow.clients.cli"} <= set(comp) for comp, _ in found), found
    for comp, c in found:  # each reported cycle is real: it closes, and every step is an import
        assert c[0] == c[-1] and set(c) <= set(comp) and all(b in graph[a] for a, b in zip(c, c[1:])), c
    rule = next(r for r in FORBIDDEN if r[:2] == ("daemon", "clients"))
    assert _violations(graph, rule) == [("evenflow.daemon.settings", "evenflow.clients.cli")]
    graph["evenflow.daemon.api.anthropic.routes"]["evenflow.daemon.api.ollama.prepare"] = 1  # a dialect crossing
    rule = next(r for r in FORBIDDEN if r[:2] == ("daemon.api.anthropic", "daemon.api.ollama"))
    assert _violations(graph, rule) == [("evenflow.daemon.api.anthropic.routes", "evenflow.daemon.api.ollama.prepare")]
    graph["evenflow.daemon.api.remote.hub"]["evenflow.daemon.api.ollama.reply"] = 1  # remote writing a dialect's reply
    rule = next(r for r in FORBIDDEN if r[:2] == ("daemon.api.remote", "daemon.api.ollama"))
    assert _violations(graph, rule) == [("evenflow.daemon.api.remote.hub", "evenflow.daemon.api.ollama.reply")]
