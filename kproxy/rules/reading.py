"""Reading a rule file's text without ever blocking or reading without end.

A rules path is named by an operator and watched while kproxy serves: whatever sits there next,
reading it must end, soon, with the text or with one :class:`~kproxy.rules.yaml_nodes.Problem`.

* Only a **regular file** is read (symlinks followed). A FIFO would block ``open`` until a writer
  comes, and its ``read`` until the writer closes; ``/dev/zero`` or ``/dev/urandom`` never end. So
  the file is opened with ``O_NONBLOCK`` (a FIFO's open returns at once, writer or not) and its
  kind checked with ``fstat`` on that descriptor, the very object that would be read, before one
  byte is read: no window between a check and the read for a swap to slip in.
* At most ``max_bytes`` are read (:data:`DEFAULT_MAX_BYTES`, the ``rules_max_bytes`` option): a
  bigger file is refused, by its size before reading, and by what was read if it grew since.
* Bytes must be UTF-8.

Every refusal is a problem at line 0, key ``(file)``, naming the path:
``rules.yaml:0: (file): not a regular file (a FIFO): only regular files are read``.
"""

from __future__ import annotations

import os
import stat

from kproxy.rules.yaml_nodes import Problem, RulesError

# 16 MiB: some 150,000 rules in the block style of rules/README.md, far past any hand-written or
# generated set seen, and small enough that parsing it stays within seconds of a worker thread.
DEFAULT_MAX_BYTES = 16 * 1024 * 1024

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in an operator's words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def too_big(path: str, size: int | str, max_bytes: int) -> RulesError:
    return RulesError([Problem(path, 0, "(file)", f"{size} bytes, over the limit of {max_bytes} bytes "
                                                  f"(rules_max_bytes, --rules-max-bytes)")])


def read_rule_file(path: str, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The text of the regular file at ``path``, at most ``max_bytes`` long.

    Raises :class:`RulesError` (one problem at line 0) when it cannot be opened, is not a regular
    file, is bigger than ``max_bytes`` or is not UTF-8. Never blocks on what it finds (see the
    module's docstring).
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise _cannot_read(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RulesError([Problem(path, 0, "(file)",
                                      f"not a regular file ({file_kind(st.st_mode)}): only regular files are read")])
        if st.st_size > max_bytes:
            raise too_big(path, st.st_size, max_bytes)
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:  # one byte past the limit says the file grew over it since fstat
            chunk = os.read(fd, min(max_bytes + 1 - got, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            raise too_big(path, f"more than {max_bytes}", max_bytes)
        data = b"".join(chunks)
    except OSError as exc:
        raise _cannot_read(path, exc) from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RulesError([Problem(path, 0, "(file)", f"cannot read: {exc}")]) from None


def _cannot_read(path: str, exc: OSError) -> RulesError:
    return RulesError([Problem(path, 0, "(file)", f"cannot read: {exc.strerror or exc}")])


__all__ = ["DEFAULT_MAX_BYTES", "file_kind", "read_rule_file"]
