"""No import circle among kproxy's modules, type-only imports included.

A circle of imports means the modules in it cannot be read, tested or compiled one without the
others, and an import done only under ``TYPE_CHECKING`` still ties the two for mypy and mypyc: the
graph here is every ``import`` statement in the sources, wherever it stands. ``from package import
module`` is an edge to that module (what import-linter's graph holds too), not to the package's
``__init__``.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import kproxy

ROOT = Path(kproxy.__file__).resolve().parent.parent

# The packages checked. kproxy.rules is left out until its actions stop importing the engine that
# imports them (issue 38 item 2, which another change takes on); add it then.
PACKAGES = ("kproxy.protocol", "kproxy.proxy", "kproxy.metrics", "kproxy.capture", "kproxy.server",
            "kproxy.policy", "kproxy.config", "kproxy.sasl", "kproxy.analysis")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in (ROOT / "kproxy").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "_native" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """module -> the kproxy modules it imports (any import statement, type-checking-only ones too)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # kproxy.x.y.Name -> kproxy.x.y
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_finder_finds_a_circle_through_a_type_only_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_in(package: str) -> None:
    inside = [c for c in circles(dict(import_graph())) if any(m == package or m.startswith(package + ".") for m in c)]
    assert inside == [], f"import circles through {package}: {inside}"
