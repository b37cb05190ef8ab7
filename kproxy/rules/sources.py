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
* an empty directory is an empty rule set (rules may arrive later), not an error.

The merged set's ``source`` is the directory: that is what the server watches and logs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import yaml

from kproxy.rules.load import Problem, RulesError, load_file, load_text
from kproxy.rules.model import Rule, RuleSet

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


def load_path(path: str) -> RuleSet:
    """Load a rule file, or every rule file of a directory merged (see the module's docstring).

    Raises :class:`RulesError` listing every problem found.
    """
    if os.path.isdir(path):
        return load_directory(path)
    return load_file(path)


def check_paths(paths: Sequence[str]) -> list[Problem]:
    """Every problem of every rule file or directory in ``paths`` (empty when all load), as
    ``kproxy run --rules`` would load each of them."""
    problems: list[Problem] = []
    for path in paths:
        try:
            load_path(path)
        except RulesError as exc:
            problems.extend(exc.problems)
    return problems


def load_directory(directory: str) -> RuleSet:
    try:
        files = rule_files(directory)
    except OSError as exc:
        raise RulesError([Problem(directory, 0, "(directory)", f"cannot list: {exc.strerror or exc}")]) from None
    problems: list[Problem] = []
    loaded: list[tuple[str, str, RuleSet]] = []
    for path in files:
        try:
            text = _read(path)
            loaded.append((path, text, load_text(text, path)))
        except RulesError as exc:
            problems.extend(exc.problems)
    rules: list[Rule] = []
    first_in: dict[str, str] = {}
    seed, seed_file = 0, ""
    for path, text, rule_set in loaded:
        if rule_set.seed:
            if seed and rule_set.seed != seed:
                problems.append(Problem(path, _line(text, ("seed",)), "seed",
                                        f"{rule_set.seed} differs from seed {seed} of {seed_file}: files that set "
                                        f"a seed must agree"))
            elif not seed:
                seed, seed_file = rule_set.seed, path
        for i, rule in enumerate(rule_set.rules):
            if rule.id in first_in:
                problems.append(Problem(path, _line(text, ("rules", i, "id")), f"rules[{i}].id",
                                        f"duplicate rule id {rule.id!r} (first in {first_in[rule.id]})"))
                continue
            first_in[rule.id] = path
            rules.append(rule)
    if problems:
        raise RulesError(problems)
    return RuleSet(tuple(rules), seed, directory)


def _read(path: str) -> str:
    """A file's text; an unreadable file is one problem at line 0 (as :func:`kproxy.rules.load_file`)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RulesError([Problem(path, 0, "(file)", f"cannot read: {reason}")]) from None


def _line(text: str, keys: Sequence[str | int]) -> int:
    """The 1-based line of the node at ``keys`` in a file already known to load (0 if not found).

    Only problems across files need it, so the file is composed a second time on that path alone.
    """
    node: yaml.Node | None = yaml.compose(text, Loader=yaml.SafeLoader)
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


__all__ = ["RULE_SUFFIXES", "load_directory", "load_path", "rule_files"]
