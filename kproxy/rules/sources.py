"""Where a rule set is read from: one rule file, or a directory of them.

A directory is how Kubernetes mounts a ConfigMap: one file per key, each a symlink through
``..data`` (``rules.yaml -> ..data/rules.yaml``, ``..data -> ..2026_11_23_21_00_00.123``).
:func:`load_path` reads every ``*.yaml`` / ``*.yml`` entry of it whose name does not start with
a dot (the ``..data`` machinery), in name order, and merges them into one :class:`RuleSet`:

* rules keep their file order, files their name order (``00-base.yaml`` before ``10-chaos.yaml``):
  the first matching rule wins across files as within one;
* a rule id is unique across all files: a repeat is a problem at the repeat's ``id`` line;
* the seed: files that set a non-zero ``seed`` must agree (0, the default, counts as unset), so
  the seed in force never depends on which file was read last;
* every problem of every file is reported at once, each as ``file:line: key: reason``;
* an empty directory is an empty rule set (rules may arrive later), not an error, unless the
  caller says it must not be (``allow_empty=False``: the reloader, while rules are in force, so
  that an emptied mount or a directory put in a file's place never silently removes them);
* only regular files are read, and at most ``max_bytes`` of all the files together
  (:mod:`kproxy.rules.reading`: a FIFO or a device in a file's place is refused, never waited on).

The merged set's ``source`` is the directory: that is what the server watches and logs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import yaml

from kproxy.rules.load import Problem, RulesError, load_file, load_text
from kproxy.rules.model import Rule, RuleSet
from kproxy.rules.reading import DEFAULT_MAX_BYTES, read_rule_file
from kproxy.yaml_reader import YAML_LOADER

RULE_SUFFIXES = (".yaml", ".yml")


def rule_files(directory: str) -> list[str]:
    """The rule files of ``directory`` in name order; raises OSError when it cannot be listed.

    Dot entries are skipped (a mounted ConfigMap's ``..data`` and its timestamped directories),
    and so is anything that is not a regular file once symlinks are followed.
    """
    with os.scandir(directory) as entries:
        names = sorted(e.name for e in entries if not e.name.startswith(".") and e.name.endswith(RULE_SUFFIXES)
                       and e.is_file())
    return [os.path.join(directory, name) for name in names]


def load_path(path: str, max_bytes: int = DEFAULT_MAX_BYTES, *, allow_empty: bool = True) -> RuleSet:
    """Load a rule file, or every rule file of a directory merged (see the module's docstring).

    Raises :class:`RulesError` listing every problem found.
    """
    if os.path.isdir(path):
        return load_directory(path, max_bytes, allow_empty=allow_empty)
    return load_file(path, max_bytes)


def check_paths(paths: Sequence[str], max_bytes: int = DEFAULT_MAX_BYTES) -> list[Problem]:
    """Every problem of every rule file or directory in ``paths`` (empty when all load), as
    ``kproxy run --rules`` would load each of them."""
    problems: list[Problem] = []
    for path in paths:
        try:
            load_path(path, max_bytes)
        except RulesError as exc:
            problems.extend(exc.problems)
    return problems


def load_path_data(path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[RuleSet, dict[str, Any]]:
    """Load a rule file or directory as :func:`load_path` does (an empty directory is refused: it
    would remove every rule), and return its rules as plain data too: ``{"seed": N, "rules": [...]}``,
    a directory's files merged in name order. The data is what the admin API's ``PUT /rules`` and
    ``POST /rules`` take, read from the same text the rule set was loaded from; since the rule set
    loaded, every problem was found here, at its ``file:line``, and the API has none to report.

    Raises :class:`RulesError` listing every problem found.
    """
    if os.path.isdir(path):
        rule_set, texts = _load_directory(path, max_bytes, allow_empty=False)
    else:
        text = read_rule_file(path, max_bytes)
        rule_set, texts = load_text(text, path), [text]
    rules: list[Any] = []
    for text in texts:
        rules.extend(_data(text).get("rules") or ())
    return rule_set, {"seed": rule_set.seed, "rules": rules}


def _data(text: str) -> dict[str, Any]:
    """A rule file's text (known to load) as plain data meaning what the rules loader reads in it.

    Constructed by the loader's YAML loader, but for what the rules loader reads as raw text:
    a schedule window's times, which YAML 1.1 would turn into base-60 numbers (``10:30`` is 630).
    """
    loader = YAML_LOADER(text)
    try:
        root = loader.get_single_node()
        for rule in _items(_value(root, "rules")):
            window = _value(_value(_value(rule, "match"), "schedule"), "window")
            for key in ("start", "end"):
                node = _value(window, key)
                if isinstance(node, yaml.ScalarNode):
                    node.tag = "tag:yaml.org,2002:str"
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return data if isinstance(data, dict) else {}


def _value(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The value node of ``key`` in a mapping node (None if not a mapping, or no such key)."""
    if not isinstance(node, yaml.MappingNode):
        return None
    return next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)


def _items(node: yaml.Node | None) -> list[yaml.Node]:
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def load_directory(directory: str, max_bytes: int = DEFAULT_MAX_BYTES, *, allow_empty: bool = True) -> RuleSet:
    """Every rule file of ``directory`` merged (see the module's docstring); raises :class:`RulesError`."""
    return _load_directory(directory, max_bytes, allow_empty=allow_empty)[0]


def _load_directory(directory: str, max_bytes: int, *, allow_empty: bool) -> tuple[RuleSet, list[str]]:
    """The merged rule set of ``directory`` and the texts of its files, in name order."""
    try:
        files = rule_files(directory)
    except OSError as exc:
        raise RulesError([Problem(directory, 0, "(directory)", f"cannot list: {exc.strerror or exc}")]) from None
    if not files and not allow_empty:
        raise RulesError([Problem(directory, 0, "(directory)",
                                  f"a directory with no rule file ({', '.join('*' + s for s in RULE_SUFFIXES)}): "
                                  f"the rules in force are kept (to remove them all, load 'rules: []')")])
    problems: list[Problem] = []
    loaded: list[tuple[str, str, RuleSet]] = []
    budget = max_bytes  # for all the files together: the memory a load may take is the point
    for path in files:
        try:
            text = read_rule_file(path, budget)
            budget -= len(text) if text.isascii() else len(text.encode("utf-8"))
            loaded.append((path, text, load_text(text, path)))
        except RulesError as exc:
            problems.extend(exc.problems)
    rules: list[Rule] = []
    first_in: dict[str, str] = {}
    seed, seed_file = 0, ""
    for path, text, rule_set in loaded:
        lines = _Lines(text)
        if rule_set.seed:
            if seed and rule_set.seed != seed:
                problems.append(Problem(path, lines.of(("seed",)), "seed",
                                        f"{rule_set.seed} differs from seed {seed} of {seed_file}: files that set "
                                        f"a seed must agree"))
            elif not seed:
                seed, seed_file = rule_set.seed, path
        for i, rule in enumerate(rule_set.rules):
            if rule.id in first_in:
                problems.append(Problem(path, lines.of(("rules", i, "id")), f"rules[{i}].id",
                                        f"duplicate rule id {rule.id!r} (first in {first_in[rule.id]})"))
                continue
            first_in[rule.id] = path
            rules.append(rule)
    if problems:
        raise RulesError(problems)
    return RuleSet(tuple(rules), seed, directory), [text for _, text, _ in loaded]


class _Lines:
    """Lines of nodes in a file already known to load. Only problems across files need them, so
    the file is composed a second time on that path alone, and at most once however many there are."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.root: yaml.Node | None = None

    def of(self, keys: Sequence[str | int]) -> int:
        """The 1-based line of the node at ``keys`` (0 if not found)."""
        if self.root is None:
            self.root = YAML_LOADER(self.text).get_single_node()
        node: yaml.Node | None = self.root
        for key in keys:
            if isinstance(key, int) and isinstance(node, yaml.SequenceNode) and key < len(node.value):
                node = node.value[key]
            elif isinstance(key, str) and isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
            else:
                node = None
            if node is None:
                return 0
        return node.start_mark.line + 1 if node is not None else 0


__all__ = ["RULE_SUFFIXES", "check_paths", "load_directory", "load_path", "load_path_data", "rule_files"]
