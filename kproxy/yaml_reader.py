"""The one reader of every YAML input kproxy takes (the config file, the credentials file, rule files).

Each is read as PyYAML's *composed* node tree, by libyaml's parser when PyYAML has it (the wheels
do): nodes keep their lines, and nothing is built from the document before it is checked.
:func:`compose` refuses, with a :class:`YamlRefused` naming the line:

* text that is not one YAML document (libyaml's terse wording replaced by PyYAML's own for a file
  small enough to be written by hand);
* collections nested deeper than :data:`MAX_DEPTH` (readers and PyYAML's constructor recurse);
* a node that holds itself (a recursive alias: ``&a [*a]``);
* aliases that expand the document past its own size: an alias names a node and its whole subtree,
  so a few hundred bytes of aliases of aliases stand for ten million nodes (a "billion laughs"),
  which whatever walks the values (a check, a copy, an error message quoting one) walks in full. A
  document may hold, aliases expanded, :data:`ALIAS_NODES` nodes more than its own, or
  :data:`ALIAS_FACTOR` times its own when that is more: aliases can make the work of reading a file
  at most a few times what its size allows.

The check walks each collection once (the subtree sizes of shared ones are remembered), a
fraction of what composing costs. :func:`load` is :func:`compose` and the values built (what
``yaml.safe_load`` gives). Refusals quote at most an excerpt (:func:`kproxy.logfmt.excerpt`).
"""

from __future__ import annotations

from typing import Any

import yaml

from kproxy.logfmt import excerpt

# libyaml's parser when PyYAML was built with it: composing is many times faster than the pure-Python one.
YAML_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
Loader = yaml.SafeLoader | yaml.CSafeLoader
MAX_DEPTH = 64  # collections within collections; kproxy's own files nest fewer than ten
ALIAS_NODES = 10_000  # nodes aliases may add to any document ...
ALIAS_FACTOR = 3  # ... or this many times the document's own nodes, when that is more
_REWORD_SYNTAX_MAX = 256 * 1024  # a syntax error in a file up to this long is worded by PyYAML's parser


class YamlRefused(ValueError):
    """A YAML text :func:`compose` does not read: ``line`` (1-based; 0: not known), ``reason`` (at
    most an excerpt of anything the text holds) and ``syntax``: the text is not YAML (else it is,
    but past a bound)."""

    def __init__(self, line: int, reason: str, *, syntax: bool = False) -> None:
        self.line = line
        self.reason = reason
        self.syntax = syntax
        super().__init__(f"line {line}: {reason}" if line else reason)


def compose(text: str) -> tuple[Loader, yaml.Node | None]:
    """The node tree of ``text`` (None: an empty document) and the loader that composed it, which
    constructs its scalars (``construct_object``); the caller disposes of it. :class:`YamlRefused`
    for what the module docstring lists."""
    loader = YAML_LOADER(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        loader.dispose()
        raise _syntax_refusal(text, exc) from None
    except RecursionError:  # (the pure-Python parser recurses per level; libyaml stops at its own depth)
        loader.dispose()
        raise YamlRefused(0, f"nested deeper than {MAX_DEPTH} levels") from None
    if root is not None:
        try:
            check_nodes(root)
        except YamlRefused:
            loader.dispose()
            raise
    return loader, root


def load(text: str) -> Any:
    """The values of ``text``, as ``yaml.safe_load`` would give them, once :func:`compose` read it;
    :class:`YamlRefused` when it does not, or when a value cannot be built (a tag the safe loader
    has no constructor for, an integer of more digits than Python reads)."""
    loader, root = compose(text)
    try:
        if root is None:
            return None
        try:
            return loader.construct_document(root)
        except yaml.YAMLError as exc:
            raise _refusal(exc) from None
        except ValueError as exc:  # (an int of more digits than Python reads: PyYAML lets int() raise)
            raise YamlRefused(0, f"a value cannot be read: {excerpt(exc, quoted=False)}") from None
    finally:
        loader.dispose()


def check_nodes(root: yaml.Node) -> int:
    """The number of nodes of the tree at ``root``, aliases expanded; :class:`YamlRefused` when it
    nests deeper than :data:`MAX_DEPTH`, holds itself, or aliases expand it past its bound (see the
    module docstring). Each collection is walked once (the size of one named again is remembered);
    the walk recurses at most :data:`MAX_DEPTH` deep."""
    if type(root) is yaml.ScalarNode:
        return 1
    walk = _NodeWalk()
    total = walk.size(root, 1)
    own = walk.own
    bound = own + max(ALIAS_NODES, ALIAS_FACTOR * own)
    if total > bound:
        where = _line(walk.widest) if walk.widest is not None else 0
        raise YamlRefused(where, f"aliases expand the document to {total} nodes (it has {own} of its own; at most "
                                 f"{bound} are read); the node named most starts at this line")
    return total


class _NodeWalk:
    """One walk of a node tree for :func:`check_nodes`. A class, not a closure: a recursive nested
    function holds itself through its own cell, a cycle left to the collector at every read (and
    kproxy freezes big rule-set builds: offloop.py)."""

    __slots__ = ("open", "own", "sizes", "widest", "widest_size")

    def __init__(self) -> None:
        self.sizes: dict[int, int] = {}  # id(collection) -> nodes of its subtree, aliases expanded
        self.open: set[int] = set()  # the collections on the path being walked
        self.own = 0  # the document's own nodes: its collections once each, every scalar written
        self.widest: yaml.Node | None = None  # the largest collection named again, for the message
        self.widest_size = 0

    def size(self, node: yaml.Node, depth: int) -> int:
        key = id(node)
        if depth > MAX_DEPTH:
            raise YamlRefused(_line(node), f"nested deeper than {MAX_DEPTH} levels")
        self.open.add(key)
        self.own += 1
        total = 1
        items = node.value if type(node) is yaml.SequenceNode else [n for pair in node.value for n in pair]
        for child in items:
            if type(child) is yaml.ScalarNode:
                total += 1
                self.own += 1
                continue
            size = self.sizes.get(id(child))
            if size is None:
                if id(child) in self.open:
                    raise YamlRefused(_line(child), "a node holds itself (a recursive alias)")
                size = self.size(child, depth + 1)
            elif size > self.widest_size:
                self.widest_size, self.widest = size, child
            total += size
        self.open.discard(key)
        self.sizes[key] = total
        return total


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _syntax_refusal(text: str, exc: yaml.YAMLError) -> YamlRefused:
    """The refusal of a text that is not YAML. libyaml words it tersely ("did not find expected
    ',' or '}'"); a text small enough to be written by hand is parsed once more by PyYAML's own
    parser, which says what it got instead, so the message is worth the milliseconds."""
    if YAML_LOADER is not yaml.SafeLoader and len(text) <= _REWORD_SYNTAX_MAX:
        again: yaml.SafeLoader | None = None
        try:
            # Made inside the try: PyYAML's reader refuses a control character as it is made.
            again = yaml.SafeLoader(text)
            again.get_single_node()
        except yaml.YAMLError as other:
            exc = other
        except RecursionError:
            pass
        finally:
            if again is not None:
                again.dispose()
    return _refusal(exc)


def _refusal(exc: yaml.YAMLError) -> YamlRefused:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        reason = str(exc.problem or exc.context)
        return YamlRefused(mark.line + 1 if mark is not None else 0, excerpt(reason, quoted=False), syntax=True)
    return YamlRefused(0, excerpt(str(exc), quoted=False), syntax=True)
