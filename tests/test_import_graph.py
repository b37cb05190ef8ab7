"""The shape of kproxy's import graph beyond the layers pyproject.toml's import contracts keep.

* No import circle anywhere in kproxy/, type-only imports (``if TYPE_CHECKING:``) included: a
  circle, even one that only the type checker follows, makes two modules one unit that neither
  can be read, tested or compiled without.
* Nothing outside kproxy/rules/actions/ names an action kind: the engine, the policy and the
  what-if find an action through :class:`~kproxy.rules.actions.base.RuleAction`'s hooks, so a kind
  is added or changed in its own module alone (rules/README.md, "Adding an action kind").

The graph is grimp's, the one ``lint-imports`` checks, built with type-only imports.
"""

from __future__ import annotations

import grimp
import pytest

# Circles that exist now in another engineer's area, with who removes them: each must be exactly
# as listed (a new module in it, or the circle gone, fails: then update or remove the entry).
KNOWN_CIRCLES: dict[frozenset[str], str] = {
    frozenset({"kproxy.protocol.offsets", "kproxy.protocol.produce_scan", "kproxy.protocol.scan"}):
        "issue 38 item 4 (one reader per byte layout): the readers' work breaks it",
}

# What of kproxy.rules.actions the rest of kproxy may import: the interface every kind implements,
# the draft its decide() writes into, and the registry the loader reads the kinds from.
ACTIONS = "kproxy.rules.actions"
ACTIONS_INTERFACE = frozenset({ACTIONS, f"{ACTIONS}.base", f"{ACTIONS}.draft", f"{ACTIONS}.registry"})


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("kproxy", exclude_type_checking_imports=False, cache_dir=None)


def circles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative:
    the graph is deep enough to reach Python's recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.find_modules_directly_imported_by(target)))))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def describe(graph: grimp.ImportGraph, circle: frozenset[str]) -> str:
    """One line per module of ``circle``: what it imports of the others (to find the import to cut)."""
    return "\n".join(f"  {m} -> {', '.join(sorted(graph.find_modules_directly_imported_by(m) & circle))}"
                     for m in sorted(circle))


def test_circles_finds_a_circle_and_only_it() -> None:
    g = grimp.ImportGraph()
    for name in ("p", "p.a", "p.b", "p.c", "p.d"):
        g.add_module(name)
    g.add_import(importer="p.a", imported="p.b")
    g.add_import(importer="p.b", imported="p.c")
    g.add_import(importer="p.c", imported="p.a")
    g.add_import(importer="p.d", imported="p.a")
    assert circles(g) == [frozenset({"p.a", "p.b", "p.c"})]


def test_no_import_circle_in_kproxy(graph: grimp.ImportGraph) -> None:
    new = [c for c in circles(graph) if c not in KNOWN_CIRCLES]
    assert not new, "import circles (type-only imports included):\n" + "\n\n".join(describe(graph, c) for c in new)


def test_the_known_circles_are_still_there(graph: grimp.ImportGraph) -> None:
    found = set(circles(graph))
    gone = [f"{sorted(c)} ({owner})" for c, owner in KNOWN_CIRCLES.items() if c not in found]
    assert not gone, f"known circles changed or gone: update KNOWN_CIRCLES in {__name__}: {gone}"


def test_nothing_outside_rules_actions_names_an_action_kind(graph: grimp.ImportGraph) -> None:
    """A module outside the package that imports a kind's module (kproxy.rules.actions.delay...)
    depends on that kind: the hooks of RuleAction are how it should ask."""
    kinds = {m for m in graph.find_children(ACTIONS)} - ACTIONS_INTERFACE
    assert {f"{ACTIONS}.delay", f"{ACTIONS}.throttle", f"{ACTIONS}.mutate_metadata"} <= kinds
    outside = graph.modules - graph.find_descendants(ACTIONS) - {ACTIONS}
    named = sorted(f"{m} imports {k}" for m in outside for k in graph.find_modules_directly_imported_by(m) & kinds)
    assert not named, "\n".join(named)
