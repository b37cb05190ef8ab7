"""The credentials file of terminate mode (``sasl.client.credentials_file``), read and written.

What it holds is :mod:`kproxy.sasl.credentials`'s (the document and its checks); this module is
the file: YAML (JSON is YAML too), read as :mod:`kproxy.files` reads, so that whatever sits at
the path, reading ends soon (only a regular file, symlinks followed, at most :data:`MAX_BYTES`,
UTF-8), and written by ``kproxy credentials`` atomically (a temporary file in the same directory,
flushed, renamed over the old one) with mode 0600: a reader, kproxy's reloader among them, sees
the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import yaml

from kproxy.files import FileRefused, read_regular_file
from kproxy.sasl.credentials import CredentialsError, CredentialStore, parse_document, to_document

# 16 MiB: some 25,000 users with all three mechanisms (about 650 bytes each in the written form).
MAX_BYTES = 16 * 1024 * 1024
_HEADER = ("# kproxy credentials (sasl.client.credentials_file), written by `kproxy credentials`.\n"
           "# No password is stored: PLAIN as a salted PBKDF2-HMAC-SHA-512 hash, SCRAM as Kafka stores it.\n")


def load_credentials(path: str | os.PathLike[str]) -> CredentialStore:
    """The users of the file at ``path``; :class:`CredentialsError` naming each problem
    (``PATH: users.alice.PLAIN.hash: not base64``, ``PATH: cannot read: No such file or directory``)."""
    name = os.fspath(path)
    try:
        text = read_regular_file(name, MAX_BYTES).decode("utf-8")
    except FileRefused as exc:
        raise CredentialsError([f"{name}: {exc.reason}"]) from None
    except UnicodeDecodeError as exc:
        raise CredentialsError([f"{name}: not UTF-8: {exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise CredentialsError([f"{name}{where}: not YAML: {getattr(exc, 'problem', None) or exc}"]) from None
    try:
        return parse_document(data)
    except CredentialsError as exc:
        raise CredentialsError(f"{name}: {p}" for p in exc.problems) from None


def dump_credentials(store: CredentialStore) -> str:
    """The file's text for ``store``."""
    return _HEADER + yaml.safe_dump(to_document(store), sort_keys=False, default_flow_style=False, width=200)


def save_credentials(path: str | os.PathLike[str], store: CredentialStore) -> None:
    """Write ``store`` to ``path`` atomically, mode 0600 (OSError when it cannot)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(dump_credentials(store))
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o600)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
