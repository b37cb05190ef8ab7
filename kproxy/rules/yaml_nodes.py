"""PyYAML node readers that report problems instead of raising: the primitives of the rules loader.

:class:`NodeReader` walks PyYAML's *composed* node tree, whose nodes keep their line numbers.
Each reader returns the value, or :data:`BAD` after recording a :class:`Problem`
(``file:line: key.path: reason``), so a loader collects every problem of a file in one pass and
nothing downstream repeats a problem already reported. :mod:`kproxy.rules.load` (the document,
rules and match keys) and :mod:`kproxy.rules.actions` (each action kind reads its own parameters) build on it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from kproxy.logfmt import excerpt
from kproxy.protocol import _tables
from kproxy.protocol.codes import api_key, api_snake_name
from kproxy.rules.patterns import UserPattern, compile_pattern

T = TypeVar("T")

API_NAMES = tuple(api_snake_name(k) for k in _tables.API_NAMES)
INT32 = (-(2**31), 2**31 - 1)


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong in a rule file, printed as ``file:line: key.path: reason``."""

    file: str
    line: int
    key: str
    reason: str

    def __str__(self) -> str:  # (a key path is made of a file's keys, of any length: an excerpt of it)
        return f"{self.file}:{self.line}: {excerpt(self.key, quoted=False)}: {self.reason}"


class RulesError(Exception):
    """A rule file that cannot be loaded; ``problems`` lists every problem found, in file order."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line))
        super().__init__("\n".join(str(p) for p in self.problems))


class Bad:
    """Marks a value that already produced a problem (so nothing downstream repeats it)."""


BAD = Bad()


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""




class NodeReader:
    """Reads scalars, mappings, lists and checked values from one YAML document's nodes."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []
        self._yaml: yaml.SafeLoader | yaml.CSafeLoader | None = None

    # -- reporting ------------------------------------------------------------------
    def fail(self, node: yaml.Node, key: str, reason: str) -> Bad:
        self.problems.append(Problem(self.source, node.start_mark.line + 1, key, reason))
        return BAD

    def build(self, node: yaml.Node, key: str, make: Callable[[], T]) -> T | Bad:
        """Construct a model value; its own ValueError becomes a problem at ``node``."""
        try:
            return make()
        except ValueError as exc:
            return self.fail(node, key, str(exc))

    # -- Kafka values -------------------------------------------------------------------
    def made(self, at: yaml.Node, path: str, kw: dict[str, Any], make: Callable[..., T]) -> T | Bad:
        """``make(**kw)``, unless a value of ``kw`` already failed (BAD: nothing more to report)."""
        if any(isinstance(v, Bad) for v in kw.values()):
            return BAD
        return self.build(at, path, lambda: make(**kw))

    def required(self, m: dict[str, yaml.Node], at: yaml.Node, path: str, key: str, what: str) -> yaml.Node | None:
        """``m[key]``, or None after reporting it missing (``what``: what it should be)."""
        if key not in m:
            self.fail(at, f"{path}.{key}", f"missing ({what})")
            return None
        return m[key]

    def api(self, node: yaml.Node, path: str) -> int | Bad:
        value = self.scalar(node)
        if isinstance(value, int) and not isinstance(value, bool):
            if value not in _tables.API_NAMES:
                return self.fail(node, path, f"unknown api key {value}")
            return value
        if isinstance(value, str):
            key = api_key(value)
            if key is None:
                return self.fail(node, path, f"unknown api {excerpt(value)}{did_you_mean(value.lower(), API_NAMES)}")
            return key
        return self.fail(node, path, f"expected an api name or key, got {node_kind(node, value)}")

    # -- primitives -----------------------------------------------------------------------
    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return BAD
        assert self._yaml is not None
        try:
            return self._yaml.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError):  # (ValueError: an int of more digits than Python reads)
            # A tag the safe loader has no constructor for (a local '!pi', or a plain '=' read as
            # the YAML 1.1 value key): not a value a rule can mean; the caller reports the node as
            # being of the wrong kind, at its line.
            return BAD

    def mapping(self, node: yaml.Node, path: str, keys: Sequence[str]) -> dict[str, yaml.Node] | None:
        if not isinstance(node, yaml.MappingNode):
            self.fail(node, path or "(top)", f"expected a mapping, got {node_kind(node, self.scalar(node))}")
            return None
        out: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            where = f"{path}.{key}" if path else key
            if key not in keys:
                self.fail(key_node, where, f"unknown key{did_you_mean(key, keys)}")
            elif key in out:
                self.fail(key_node, where, f"duplicate key (first at line {out[key].start_mark.line + 1})")
            else:
                out[key] = value_node
        return out

    def sequence(self, node: yaml.Node, path: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            self.fail(node, path, f"expected a list, got {node_kind(node, self.scalar(node))}")
            return []
        return list(node.value)

    def items(self, node: yaml.Node, path: str, read: Callable[[yaml.Node, str], Any]) -> tuple[Any, ...] | Bad:
        got = [read(n, f"{path}[{i}]") for i, n in enumerate(self.sequence(node, path))]
        if not isinstance(node, yaml.SequenceNode) or any(isinstance(g, Bad) for g in got):
            return BAD
        return tuple(got)

    def one_or_many(self, node: yaml.Node, path: str, read: Callable[[yaml.Node, str], Any],
                    container: Callable[[list[Any]], Any] = frozenset) -> Any:
        """A single value or a list of them (``api: produce`` or ``api: [produce, fetch]``)."""
        if isinstance(node, yaml.SequenceNode):
            got = [read(n, f"{path}[{i}]") for i, n in enumerate(node.value)]
            if not got:
                return self.fail(node, path, "empty list: it would never match")
        else:
            got = [read(node, path)]
        if any(isinstance(g, Bad) for g in got):
            return BAD
        return container(got)

    def string_map(self, node: yaml.Node, path: str, check: Callable[[yaml.Node, str, str], Any]) -> Any:
        if not isinstance(node, yaml.MappingNode) or not node.value:
            return self.fail(node, path, "expected a non-empty map of strings")
        out: list[tuple[str, str]] = []
        bad = False
        for k, v in node.value:
            key = self.string(k, f"{path}.{k.value}")
            value = self.string(v, f"{path}.{k.value}")
            if isinstance(key, Bad) or isinstance(value, Bad):
                bad = True
                continue
            if isinstance(check(k, f"{path}.{key}", key), Bad) or isinstance(check(v, f"{path}.{key}", value), Bad):
                bad = True
                continue
            out.append((key, value))
        return BAD if bad else out

    def string(self, node: yaml.Node, path: str) -> str | Bad:
        value = self.scalar(node)
        if isinstance(value, bool | int | float) and isinstance(node, yaml.ScalarNode) and not node.style:
            # What was written: YAML 1.1 reads an id `off` as false and a topic `1e3` as 1000.0.
            # (A plain scalar's style is None from PyYAML's parser, '' from libyaml's.)
            return str(node.value)
        if not isinstance(value, str):
            return self.fail(node, path, f"expected a string, got {node_kind(node, value)}")
        return value

    def boolean(self, node: yaml.Node, path: str) -> bool | Bad:
        value = self.scalar(node)
        if not isinstance(value, bool):
            return self.fail(node, path, f"expected true or false, got {node_kind(node, value)}")
        return value

    def integer(self, node: yaml.Node, path: str, lo: int | None = None, hi: int | None = None,
                reason: str | None = None) -> int | Bad:
        value = self.scalar(node)
        if not isinstance(value, int) or isinstance(value, bool):
            return self.fail(node, path, f"expected an integer, got {node_kind(node, value)}")
        if lo is not None and value < lo:
            return self.fail(node, path, reason or f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            return self.fail(node, path, f"must be <= {hi}, got {value}")
        return value

    def number(self, node: yaml.Node, path: str, lo: float | None = None, exclusive: bool = False,
               reason: str | None = None, hi: float | None = None) -> float | Bad:
        value = self.scalar(node)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return self.fail(node, path, f"expected a number, got {node_kind(node, value)}")
        if value != value or value in (float("inf"), float("-inf")):
            return self.fail(node, path, "expected a finite number")
        if lo is not None and (value <= lo if exclusive else value < lo):
            return self.fail(node, path, reason or f"must be {'>' if exclusive else '>='} {lo:g}, "
                                                   f"got {value}")
        if hi is not None and value > hi:
            return self.fail(node, path, f"must be <= {hi:g}, got {value}")
        return float(value)

    def regex(self, node: yaml.Node, path: str, captures: bool = False) -> UserPattern | Bad:
        """A user pattern, compiled with RE2 (:mod:`kproxy.rules.patterns`: linear-time matching;
        what RE2 refuses, or a pattern too big, is a problem here, at the pattern's line)."""
        text = self.string(node, path)
        if isinstance(text, Bad):
            return BAD
        try:
            return compile_pattern(text, captures=captures)
        except ValueError as exc:
            return self.fail(node, path, f"bad regex: {exc}")

    def choice(self, node: yaml.Node, path: str, kind: Any) -> Any:
        value = self.scalar(node)
        names = [member.value for member in kind]
        if isinstance(value, str) and value in names:
            return kind(value)
        shown = node_text(node, value)
        return self.fail(node, path, f"expected one of {', '.join(names)}, got {shown}"
                                     f"{did_you_mean(str(value), names) if isinstance(value, str) else ''}")



def node_kind(node: yaml.Node, value: Any) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if value is None:
        return "nothing (null)"
    if isinstance(value, Bad):  # a scalar whose tag has no meaning here (a local '!tag', a plain '=')
        tag = getattr(node, "tag", "")
        return f"an untyped value {excerpt(node.value)}" + (f" (tag {tag})" if tag.startswith("!") else "")
    name = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(type(value))
    return f"{name} {node_text(node, value)}" if name else f"{type(value).__name__} {excerpt(node.value)}"


def node_text(node: yaml.Node, value: Any) -> str:
    return excerpt(node.value) if isinstance(node, yaml.ScalarNode) else node_kind(node, value)
