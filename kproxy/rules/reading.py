"""Reading a rule file's text without ever blocking or reading without end.

A rules path is named by an operator and watched while kproxy serves: whatever sits there next,
reading it must end, soon, with the text or with one :class:`~kproxy.rules.yaml_nodes.Problem`.

It reads as :mod:`kproxy.files` does (only a regular file, never blocking, at most ``max_bytes``:
:data:`DEFAULT_MAX_BYTES`, the ``rules_max_bytes`` option), and the bytes must be UTF-8.

Every refusal is a problem at line 0, key ``(file)``, naming the path:
``rules.yaml:0: (file): not a regular file (a FIFO): only regular files are read``.
"""

from __future__ import annotations

from kproxy.files import FileRefused, file_kind, read_regular_file
from kproxy.rules.yaml_nodes import Problem, RulesError

# 16 MiB: some 150,000 rules in the block style of rules/README.md, far past any hand-written or
# generated set seen, and small enough that parsing it stays within seconds of a worker thread.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


def too_big(path: str, size: int | str, max_bytes: int) -> RulesError:
    return RulesError([Problem(path, 0, "(file)", f"{size} bytes, over the limit of {max_bytes} bytes "
                                                  f"(rules_max_bytes, --rules-max-bytes)")])


def read_rule_file(path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The text of the regular file at ``path``, at most ``max_bytes`` long.

    Raises :class:`RulesError` (one problem at line 0) when it cannot be opened, is not a regular
    file, is bigger than ``max_bytes`` or is not UTF-8. Never blocks on what it finds
    (:mod:`kproxy.files`).
    """
    try:
        data = read_regular_file(path, max_bytes)
    except FileRefused as exc:
        if exc.size is not None:
            raise too_big(path, exc.size, max_bytes) from None
        raise RulesError([Problem(path, 0, "(file)", exc.reason)]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RulesError([Problem(path, 0, "(file)", f"cannot read: {exc}")]) from None


__all__ = ["DEFAULT_MAX_BYTES", "file_kind", "read_rule_file"]
