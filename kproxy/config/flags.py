"""``kproxy run``'s flags, one per option of :data:`kproxy.config.options.OPTIONS`, and their
deprecated aliases.

Each option's help ends with its YAML key and its environment variable, so ``kproxy run --help``
is the whole table. A deprecated alias works as it did (``--upstream-no-verify`` still turns
verification off) and leaves a :class:`Deprecation` in the parsed namespace;
:func:`deprecation_notes` returns them, one per alias used, each naming the flag to use instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kproxy.config.options import BY_PATH, CLUSTER_PATHS, CLUSTERS, OPTIONS, Alias, Option, cluster_path, flag_name

_NOTES = "deprecated_flags"  # the namespace attribute holding the notes of the aliases used
# The namespace attribute holding the clusters' flags given (option path -> value and flag).
CLUSTER_FLAGS = "cluster_flags"
_CLUSTERS_FLAG = flag_name(CLUSTERS) + "-"
# A cluster option's flag after the cluster's name (``upstream``, ``tls-upstream-ca``), longest first:
# a name may end in what is also the start of a longer one.
_CLUSTER_FLAG_SUFFIXES = sorted(((flag_name(p)[2:], p) for p in CLUSTER_PATHS), key=lambda item: -len(item[0]))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--config``, one flag (two for a boolean: ``--X``/``--no-X``) per option and the
    options' deprecated aliases (hidden from ``--help``, named in their option's help)."""
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML configuration file")
    for opt in OPTIONS:
        help_text = f"{opt.full_help} [YAML {opt.path}; env {opt.env}"
        if opt.aliases:
            help_text += f"; deprecated: {', '.join(a.flag for a in opt.aliases)}"
        help_text += "]"
        if opt.boolean:
            parser.add_argument(opt.flag, dest=opt.dest, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        elif opt.repeatable:
            parser.add_argument(opt.flag, dest=opt.dest, action="append", metavar=opt.metavar, help=help_text)
        else:
            parser.add_argument(opt.flag, dest=opt.dest, metavar=opt.metavar, help=help_text)
        for alias in opt.aliases:
            parser.add_argument(alias.flag, dest=opt.dest, action=_DeprecatedFlag, option=opt, alias=alias,
                                nargs=0 if alias.sets is not None else None, metavar=opt.metavar,
                                default=None, help=argparse.SUPPRESS)


@dataclass(frozen=True)
class Deprecation:
    """A deprecated ``flag`` was given; ``use`` replaces it (the flag of ``option``)."""

    flag: str
    use: str
    option: Option

    def __str__(self) -> str:
        return (f"{self.flag} is deprecated and goes in the next release: use {self.use} "
                f"({self.option.path} in YAML, {self.option.env})")


def deprecation_notes(args: argparse.Namespace) -> list[Deprecation]:
    """One per deprecated flag given (once however often it is given), in the order given."""
    return list(getattr(args, _NOTES, None) or [])


def replacement(opt: Option, alias: Alias) -> str:
    """The flag to write instead of ``alias``: the option's flag, or ``--no-X`` for an alias that
    turns a boolean option off."""
    if alias.sets is False and opt.negative_flag is not None:
        return opt.negative_flag
    return opt.flag


class _DeprecatedFlag(argparse.Action):
    """An option's earlier flag: sets the option as the option's own flag would, and notes it."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, option: Option, alias: Alias,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.option = option
        self.alias = alias
        self.preferred = replacement(option, alias)  # what a did-you-mean suggests instead

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        if self.alias.sets is not None:
            value: Any = self.alias.sets
        elif self.option.repeatable:
            value = [*(getattr(namespace, self.dest, None) or []), values]
        else:
            value = values
        setattr(namespace, self.dest, value)
        note = Deprecation(self.alias.flag, self.preferred, self.option)
        notes = deprecation_notes(namespace)
        if note not in notes:
            setattr(namespace, _NOTES, [*notes, note])


def take_cluster_flags(namespace: argparse.Namespace, extras: list[str]) -> tuple[list[str], list[str]]:
    """Take the clusters' flags out of what argparse did not know (``extras``, in the order given):
    ``--clusters-NAME-PATH VALUE`` (or ``=VALUE``), ``--clusters-NAME-PATH`` / ``--no-clusters-NAME-PATH``
    for a boolean, into ``namespace``'s :data:`CLUSTER_FLAGS`. Returns the extras left and the
    problems (a value missing, a name that is no cluster's name), one line each."""
    from kproxy.config.values import cluster_name  # (values imports the model, which is not needed before)

    taken: dict[str, tuple[Any, str]] = dict(getattr(namespace, CLUSTER_FLAGS, None) or {})
    left: list[str] = []
    problems: list[str] = []
    i = 0
    while i < len(extras):
        arg = extras[i]
        i += 1
        flag, eq, text = arg.partition("=")
        negative = flag.startswith("--no-" + _CLUSTERS_FLAG[2:])
        rest = flag[len("--no-" + _CLUSTERS_FLAG[2:]):] if negative else (
            flag[len(_CLUSTERS_FLAG):] if flag.startswith(_CLUSTERS_FLAG) else None)
        found = next(((rest[:-len(suffix) - 1], path) for suffix, path in _CLUSTER_FLAG_SUFFIXES
                      if rest is not None and rest.endswith("-" + suffix) and len(rest) > len(suffix) + 1), None)
        if found is None:
            left.append(arg)
            continue
        name, path = found
        opt = BY_PATH[path]
        try:
            cluster_name(name)
        except ValueError as exc:
            problems.append(f"{flag}: {exc}")
            continue
        value: Any
        if opt.boolean:
            if eq:
                problems.append(f"{flag}: takes no value")
                continue
            value = not negative
        elif negative:
            problems.append(f"{flag}: not a true/false option")
            continue
        elif eq:
            value = text
        elif i < len(extras) and not extras[i].startswith("--"):
            value = extras[i]
            i += 1
        else:
            problems.append(f"{flag}: expected a value ({opt.metavar})")
            continue
        key = cluster_path(name, path)
        if opt.repeatable:
            previous = taken.get(key, ([], flag))[0]
            value = [*previous, value]
        taken[key] = (value, flag)
    setattr(namespace, CLUSTER_FLAGS, taken)
    return left, problems
