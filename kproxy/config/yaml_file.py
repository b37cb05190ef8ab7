"""The config file: YAML read into option values, each with the line it was written on.

The file is read as PyYAML's *composed* node tree by kproxy's one YAML reader
(:mod:`kproxy.yaml_reader`: syntax, depth and aliases bounded), as rule files are, because nodes
keep their line numbers. Nothing stops at the first
problem: unknown keys, duplicate keys and misplaced sections are all collected, and every
value found is kept (with ``file:line: key.path`` as where it came from) so that its own
problems are reported in the same round. Problems print as the rules loader prints them::

    kproxy.yaml:4: limits.idle_timeout: must be a number of seconds, got 'ten'
    kproxy.yaml:7: metrcs: unknown key (did you mean 'metrics'?)
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kproxy.config.model import ConfigError
from kproxy.config.options import BY_PATH
from kproxy.logfmt import excerpt
from kproxy.rules.yaml_nodes import BAD, Problem, did_you_mean, node_kind
from kproxy.yaml_reader import Loader, YamlRefused, compose

# Every section of options ("tls", "tls.client", "limits", ...), with the names under it.
_CHILDREN: dict[str, list[str]] = {}
for _path in BY_PATH:
    _parts = _path.split(".")
    for _depth in range(len(_parts) - 1):
        _names = _CHILDREN.setdefault(".".join(_parts[:_depth + 1]), [])
        if _parts[_depth + 1] not in _names:
            _names.append(_parts[_depth + 1])
_EVERY_KEY = (*BY_PATH, *_CHILDREN)


@dataclass
class ConfigFile:
    """What a config file sets: ``values`` maps an option's path to (raw value, where it was
    written: ``file:line: path``); ``problems`` are the file's own (keys, syntax), in line order."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def read_config_file(path: Path) -> ConfigFile:
    """Read ``path``; its values are not parsed yet (:func:`kproxy.config.layering.build_config` does that)."""
    out = ConfigFile()
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else f"not UTF-8 text ({exc.reason})"
        raise ConfigError(f"{source}: cannot read: {reason}") from None
    try:
        loader, root = compose(text)  # (kproxy's one YAML reader: syntax, depth and aliases bounded)
    except YamlRefused as exc:
        where = f"{source}:{exc.line}" if exc.line else source
        raise ConfigError(f"{where}: {'invalid YAML: ' if exc.syntax else ''}{exc.reason}") from None
    try:
        if root is None:
            return out
        if not isinstance(root, yaml.MappingNode):
            raise ConfigError(f"{source}: the top level must be a mapping of options, got "
                              f"{node_kind(root, _value_or_bad(loader, root))}")
        _Walk(loader, source, out).section(root, "")
    finally:
        loader.dispose()
    out.problems.sort(key=lambda p: p.line)
    return out


def _value(loader: Loader, node: yaml.Node) -> Any:
    """The Python value of a node, as ``yaml.safe_load`` would give it; a tag the safe loader
    cannot construct (``!python/object``) is a ValueError."""
    try:
        return loader.construct_object(node, deep=True)
    except ValueError as exc:  # (an int of more digits than Python reads: PyYAML lets int() raise)
        raise ValueError(f"cannot be read: {excerpt(exc, quoted=False)}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"cannot be read: {excerpt(getattr(exc, 'problem', None) or exc, quoted=False)}") from None


@dataclass
class _Walk:
    loader: Loader
    source: str
    out: ConfigFile

    def fail(self, node: yaml.Node, key: str, reason: str) -> None:
        self.out.problems.append(Problem(self.source, node.start_mark.line + 1, key, reason))

    def section(self, node: yaml.MappingNode, prefix: str) -> None:
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            path = f"{prefix}.{key}" if prefix else key
            line = key_node.start_mark.line + 1
            if path in seen:
                self.fail(key_node, path, f"duplicate key (first at line {seen[path]})")
                continue
            seen[path] = line
            if path in BY_PATH:
                try:
                    self.out.values[path] = (_value(self.loader, value_node), f"{self.source}:{line}: {path}")
                except ValueError as exc:
                    self.fail(value_node, path, str(exc))
            elif path in _CHILDREN and isinstance(value_node, yaml.MappingNode):
                self.section(value_node, path)
            elif path in _CHILDREN:
                kind = node_kind(value_node, _value_or_bad(self.loader, value_node))
                self.fail(value_node, path, f"is a section of options ({', '.join(_CHILDREN[path])}), not {kind}")
            else:
                self.fail(key_node, path, f"unknown key{_suggestion(path, prefix)}")


def _value_or_bad(loader: Loader, node: yaml.Node) -> Any:
    """The node's value, or :data:`BAD` (shown as "an untyped value") when it cannot be constructed."""
    try:
        return _value(loader, node)
    except ValueError:
        return BAD


def _suggestion(path: str, prefix: str) -> str:
    """A did-you-mean among the keys of the same section first (``metrcs`` is the metrics
    section, not metrics_listen), then among every key (``max_in_flight`` at the top level
    means ``limits.max_in_flight``)."""
    siblings = [f"{prefix}.{name}" if prefix else name for name in _CHILDREN.get(prefix, _top_names())]
    close = difflib.get_close_matches(path, siblings, n=1)
    return did_you_mean(path, close) if close else did_you_mean(path, _EVERY_KEY)


def _top_names() -> list[str]:
    return [p for p in _EVERY_KEY if "." not in p]
