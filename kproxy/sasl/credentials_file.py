"""The credentials file of terminate mode (``sasl.client.credentials_file``), read and written.

What it holds is :mod:`kproxy.sasl.credentials`'s (the document and its checks); this module is
the file: YAML (JSON is YAML too), read as :mod:`kproxy.files` reads, so that whatever sits at
the path, reading ends soon (only a regular file, symlinks followed, at most :data:`MAX_BYTES`,
UTF-8), parsed by kproxy's one YAML reader (:mod:`kproxy.yaml_reader`: aliases cannot make a small
file a big document), its refusal naming at most :data:`MAX_PROBLEMS` problems, and written by
``kproxy credentials`` atomically (a temporary file in the same directory,
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
from kproxy.yaml_reader import YamlRefused
from kproxy.yaml_reader import load as load_yaml

# 16 MiB: some 25,000 users with all three mechanisms (about 650 bytes each in the written form).
MAX_BYTES = 16 * 1024 * 1024
# Problems a refusal names, at most (each quotes at most an excerpt): a reload logs them on one line.
MAX_PROBLEMS = 20
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
        data = load_yaml(text)  # (kproxy's one YAML reader: syntax, depth and aliases bounded)
    except YamlRefused as exc:
        where = f"{name}:{exc.line}" if exc.line else name
        raise CredentialsError([f"{where}: {'not YAML: ' if exc.syntax else ''}{exc.reason}"]) from None
    try:
        return parse_document(data)
    except CredentialsError as exc:
        problems = exc.problems
        shown = [f"{name}: {p}" for p in problems[:MAX_PROBLEMS]]
        if len(problems) > MAX_PROBLEMS:
            shown.append(f"{name}: ... and {len(problems) - MAX_PROBLEMS} more problems")
        raise CredentialsError(shown) from None


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
