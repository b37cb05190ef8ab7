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
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kproxy.config.options import BY_PATH, CLUSTER_PATHS, CLUSTERS, cluster_path
from kproxy.config.sections import ConfigError
from kproxy.config.values import cluster_name
from kproxy.logfmt import excerpt
from kproxy.rules.yaml_nodes import BAD, Problem, did_you_mean, node_kind
from kproxy.yaml_reader import Loader, YamlRefused, compose


def _children(paths: Iterable[str]) -> dict[str, list[str]]:
    """Every section of options ("tls", "tls.client", "limits", ...), with the names under it."""
    children: dict[str, list[str]] = {}
    for path in paths:
        parts = path.split(".")
        for depth in range(len(parts) - 1):
            names = children.setdefault(".".join(parts[:depth + 1]), [])
            if parts[depth + 1] not in names:
                names.append(parts[depth + 1])
    return children


_CHILDREN = _children(BY_PATH)
_EVERY_KEY = (*BY_PATH, CLUSTERS, *_CHILDREN)
# A cluster's section (``clusters: {orders: {...}}``): its own options only.
_CLUSTER_KEYS = frozenset(CLUSTER_PATHS)
_CLUSTER_CHILDREN = _children(CLUSTER_PATHS)


@dataclass
class ConfigFile:
    """What a config file sets: ``values`` maps an option's path to (raw value, where it was
    written: ``file:line: path``); ``problems`` are the file's own (keys, syntax), in line order."""

    values: dict[str, tuple[Any, str]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    # The clusters of ``clusters:``, in file order, each with where it was written (``file:line: clusters.NAME``).
    clusters: dict[str, str] = field(default_factory=dict)


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

    def section(self, node: yaml.MappingNode, prefix: str, cluster: str | None = None) -> None:
        """The options of ``node`` (a section at ``prefix``); of ``cluster``'s section, its own only."""
        keys, children = (_CLUSTER_KEYS, _CLUSTER_CHILDREN) if cluster is not None else (BY_PATH, _CHILDREN)
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            path = f"{prefix}.{key}" if prefix else key
            shown = cluster_path(cluster, path) if cluster is not None else path
            line = key_node.start_mark.line + 1
            if path in seen:
                self.fail(key_node, shown, f"duplicate key (first at line {seen[path]})")
                continue
            seen[path] = line
            if path in keys:
                try:
                    self.out.values[shown] = (_value(self.loader, value_node), f"{self.source}:{line}: {shown}")
                except ValueError as exc:
                    self.fail(value_node, shown, str(exc))
            elif path in children and isinstance(value_node, yaml.MappingNode):
                self.section(value_node, path, cluster)
            elif path in children:
                kind = node_kind(value_node, _value_or_bad(self.loader, value_node))
                self.fail(value_node, shown, f"is a section of options ({', '.join(children[path])}), not {kind}")
            elif path == CLUSTERS and cluster is None:
                self.clusters(value_node)
            elif cluster is not None:
                close = difflib.get_close_matches(path, sorted(keys | children.keys()), n=1)
                where = "not an option of a cluster" if path in BY_PATH or path in _CHILDREN else "unknown key"
                self.fail(key_node, shown, f"{where}{did_you_mean(path, close) if close else ''}")
            else:
                self.fail(key_node, path, f"unknown key{_suggestion(path, prefix)}")

    def clusters(self, node: yaml.Node) -> None:
        """``clusters:``: a mapping of each cluster's name to its section (it may be empty: a
        cluster whose options all come from the environment or flags)."""
        if not isinstance(node, yaml.MappingNode) or not node.value:
            kind = node_kind(node, _value_or_bad(self.loader, node))
            self.fail(node, CLUSTERS, f"must map each cluster's name to its options "
                                      f"({', '.join(_top(CLUSTER_PATHS))}), not {kind}")
            return
        seen: dict[str, int] = {}
        for name_node, section_node in node.value:
            name = str(name_node.value) if isinstance(name_node, yaml.ScalarNode) else "?"
            line = name_node.start_mark.line + 1
            try:
                cluster_name(name)
            except ValueError as exc:
                self.fail(name_node, f"{CLUSTERS}.{excerpt(name, quoted=False)}", str(exc))
                continue
            if name in seen:
                self.fail(name_node, f"{CLUSTERS}.{name}", f"duplicate cluster (first at line {seen[name]})")
                continue
            seen[name] = line
            self.out.clusters[name] = f"{self.source}:{line}: {CLUSTERS}.{name}"
            if isinstance(section_node, yaml.ScalarNode) and section_node.tag.endswith(":null"):
                continue
            if not isinstance(section_node, yaml.MappingNode):
                kind = node_kind(section_node, _value_or_bad(self.loader, section_node))
                self.fail(section_node, f"{CLUSTERS}.{name}", f"is a cluster's options, not {kind}")
                continue
            self.section(section_node, "", name)


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


def _top(paths: Iterable[str]) -> list[str]:
    """The top-level names of ``paths``, in order, once each."""
    return list(dict.fromkeys(p.split(".", 1)[0] for p in paths))


def _top_names() -> list[str]:
    return [p for p in _EVERY_KEY if "." not in p]
