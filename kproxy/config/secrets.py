"""Secrets read from files (``sasl.upstream.password_file``, ``token_file``): what a file must hold.

One reader for the start-up check (``kproxy run --check`` and the start refuse a bad file, one line
naming the option) and for the re-reads while kproxy runs (kproxy/sasl/secret_file.py keeps the last
good secret when a new one is bad). A secret is the file's UTF-8 text: a password without its
trailing line breaks (``echo pw > file`` adds one; a Kubernetes Secret made ``--from-literal`` has
none), a token without any surrounding white space. The text of a secret never appears in a problem.
"""

from __future__ import annotations

import os
from pathlib import Path

# Bigger files are refused before they are read: a password or a JWT is far smaller (a JWT with
# many claims runs to a few KiB).
SECRET_MAX_BYTES = 64 * 1024


def read_secret(path: Path, *, token: bool = False) -> str:
    """The secret ``path`` holds (``token``: an OAUTHBEARER token); ValueError with one short
    reason (never the file's text) when it cannot be read or holds none."""
    try:
        with path.open("rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size > SECRET_MAX_BYTES:
                raise ValueError(f"{path} is {size} bytes, more than the {SECRET_MAX_BYTES} a secret may have")
            data = file.read(SECRET_MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > SECRET_MAX_BYTES:  # grew since the fstat (or not a regular file)
        raise ValueError(f"{path} holds more than the {SECRET_MAX_BYTES} bytes a secret may have")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    secret = text.strip() if token else text.rstrip("\r\n")
    if not secret:
        raise ValueError(f"{path} is empty")
    if token and any(c.isspace() for c in secret):
        raise ValueError(f"{path} holds white space inside the token (one token, on one line)")
    if "\x00" in secret:
        raise ValueError(f"{path} holds a NUL character (SASL PLAIN cannot carry it)")
    return secret
