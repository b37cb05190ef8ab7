"""Checks of the paths kproxy will write, before it starts: ``kproxy run --check`` and ``kproxy run``.

The configuration loader (:mod:`kproxy.config`) already reads every path kproxy only reads: the
rules file or directory (through :mod:`kproxy.rules.reading`), the admin token file, and the TLS
files (loaded by ``kproxy.server.tls`` before start). What it did not check is the one path kproxy
writes: ``capture.dir``. A capture directory that cannot be made surfaced only once serving began,
as ``start_failed listener=bootstrap`` (exit 1), after ``--check`` had said "configuration ok".

:func:`path_problems` checks it the only reliable way, by doing it: permission bits say nothing
for root or for special file systems (root may "write" /proc by mode, and mkdir there fails), so
the directory is created (with its missing parents), a file is created in it and removed, and
whatever the check created is removed again. Each problem names the option, the path and why:
``capture.dir: cannot create /proc/nope: No such file or directory``.

:class:`OptionFailed` is the same failure when it happens at start anyway (the disk changed
between the check and the start): the server raises it so that the exit names the option.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Protocol


class OptionFailed(OSError):
    """A path an option names could not be used at start; says which (``option``, ``path``)."""

    def __init__(self, option: str, path: str, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.option = option
        self.path = path


class _Capture(Protocol):
    @property
    def dir(self) -> Path | None: ...


class _Config(Protocol):
    @property
    def capture(self) -> _Capture: ...


def path_problems(config: _Config) -> list[str]:
    """Every problem with a path ``config`` will write, as ``option: reason`` lines (none: [])."""
    problems: list[str] = []
    if config.capture.dir is not None:
        problem = writable_dir_problem(config.capture.dir)
        if problem is not None:
            problems.append(f"capture.dir: {problem}")
    return problems


def writable_dir_problem(directory: Path) -> str | None:
    """None when ``directory`` exists or can be created, and a file can be created in it; else why
    not (``cannot create PATH: reason``, ``PATH is not a directory``, ``cannot write in PATH: reason``).

    Leaves the file system as it found it: the probe file and any directory created are removed.
    """
    missing: list[Path] = []
    at = directory
    while not at.exists() and not at.is_symlink() and at != at.parent:
        missing.append(at)
        at = at.parent
    if at.exists() and not at.is_dir():
        return f"{directory} is not a directory" if at == directory else \
            f"cannot create {directory}: {at} is not a directory"
    try:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"cannot create {directory}: {exc.strerror or exc}"
        try:
            fd, probe = tempfile.mkstemp(prefix=".kproxy-check-", dir=directory)
        except OSError as exc:
            return f"cannot write in {directory}: {exc.strerror or exc}"
        os.close(fd)
        os.unlink(probe)
        return None
    finally:
        for made in missing:  # deepest first: what this check created, and nothing else
            with contextlib.suppress(OSError):
                made.rmdir()


__all__ = ["OptionFailed", "path_problems", "writable_dir_problem"]
