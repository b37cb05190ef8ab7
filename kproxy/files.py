"""Reading a file an operator names, without ever blocking or reading without end.

Rules, credentials and secrets files are named by an operator and re-read while kproxy serves:
whatever sits at the path next, reading it must end, soon, with the bytes or one reason.

* Only a **regular file** is read (symlinks followed). A FIFO would block ``open`` until a writer
  comes, and its ``read`` until the writer closes; ``/dev/zero`` or ``/dev/urandom`` never end. So
  the file is opened with ``O_NONBLOCK`` (a FIFO's open returns at once, writer or not) and its
  kind checked with ``fstat`` on that descriptor, the very object that would be read, before one
  byte is read: no window between a check and the read for a swap to slip in.
* At most ``max_bytes`` are read: a bigger file is refused, by its size before reading, and by
  what was read if it grew since.

Seeing that such a file changed is :func:`stat_signature`'s job, which every watcher of a file
compares from one poll to the next (the rules, the credentials, the TLS files): a stat poll through
the symlinks sees a Kubernetes ``..data`` flip, which inotify does not (kproxy/server/rules_reload.py
says why).

A leaf: the standard library only, so that every floor can read its files the same way.
"""

from __future__ import annotations

import os
import stat

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class FileRefused(Exception):
    """A file that was not read; ``reason`` says why in an operator's words (``not a regular file (a
    FIFO): only regular files are read``), ``size`` is set when it was too big (bytes, or text)."""

    def __init__(self, reason: str, size: int | str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.size = size


Signature = tuple[object, ...]


def stat_signature(path: str) -> Signature:
    """What a poll compares to see that the file at ``path`` changed: ``(device, inode, mtime_ns,
    size)``, symlinks followed. Never raises: a file that cannot be stat'ed gives ``(errno,)``, so
    that its disappearance and its return are changes too."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return (exc.errno,)
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in an operator's words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_regular_file(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them; :class:`FileRefused`
    when it cannot be opened or read, is not a regular file or is bigger (see the module's docstring)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        raise FileRefused(f"cannot read: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"not a regular file ({file_kind(st.st_mode)}): only regular files are read")
        if st.st_size > max_bytes:
            raise FileRefused(f"{st.st_size} bytes, over the limit of {max_bytes} bytes", st.st_size)
        chunks: list[bytes] = []
        got = 0
        while got <= max_bytes:  # one byte past the limit says the file grew over it since fstat
            chunk = os.read(fd, min(max_bytes + 1 - got, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            raise FileRefused(f"more than {max_bytes} bytes, over the limit of {max_bytes} bytes",
                              f"more than {max_bytes}")
        return b"".join(chunks)
    except OSError as exc:
        raise FileRefused(f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
