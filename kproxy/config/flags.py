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

from kproxy.config.options import OPTIONS, Alias, Option

_NOTES = "deprecated_flags"  # the namespace attribute holding the notes of the aliases used


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
