"""kproxy's upstream login secrets (``sasl.upstream.password_file``, ``token_file``): what a file must
hold, and the secret re-read when its file changes.

:func:`read_secret` is the one reader, for the start-up check (``kproxy run --check`` and the start
refuse a bad file, one line naming the option: kproxy/config/layering.py) and for the re-reads while
kproxy runs. A secret is the file's UTF-8 text: a password without its trailing line breaks
(``echo pw > file`` adds one; a Kubernetes Secret made ``--from-literal`` has none), a token
without any surrounding white space. The text of a secret never appears in a problem.

:class:`SecretFile` checks the file at every new login (one ``stat``, microseconds on the tmpfs a
Kubernetes Secret is mounted on) and reads it again when its identity or times changed: a rotated
Kubernetes Secret is a symlink swap (``..data`` points at a new directory), which ``stat`` follows
to a new inode; an edit in place changes its times or size. The new secret is used from the next
login on; logins of established connections keep the one they used (re-authentications, KIP-368,
read it afresh). A file that is missing, unreadable or holds no secret keeps the last good secret,
and says so in one log line until the file changes again (the secret itself is never logged).
Write a secret file atomically (a rename, as Kubernetes does): a login reading a half-written file
would fail, once.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from kproxy.logfmt import q
from kproxy.sasl.client import Credentials

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


log = logging.getLogger("kproxy.sasl")

Signature = tuple[int, int, int, int, int] | None  # (device, inode, size, mtime_ns, ctime_ns); None: no stat


def _signature(path: Path) -> Signature:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class SecretFile:
    """The secret in ``path`` (``token``: an OAUTHBEARER token), read at start (ValueError when it
    cannot be: the configuration check has said so already) and again when the file changed."""

    def __init__(self, path: Path, option: str, *, token: bool = False) -> None:
        self.path = path
        self.option = option
        self.token = token
        self._signature = _signature(path)
        self._secret = read_secret(path, token=token)
        self._problem: str | None = None

    def current(self) -> str:
        signature = _signature(self.path)
        if signature != self._signature:
            self._signature = signature
            try:
                secret = read_secret(self.path, token=self.token)
            except ValueError as exc:
                if str(exc) != self._problem:
                    self._problem = str(exc)
                    log.warning("event=sasl_secret_unreadable option=%s action=kept_previous detail=%s",
                                self.option, q(self._problem))
            else:
                if secret != self._secret or self._problem is not None:
                    log.info("event=sasl_secret_reloaded option=%s file=%s", self.option, q(str(self.path)))
                self._secret, self._problem = secret, None
        return self._secret


class UpstreamCredentials:
    """What kproxy logs in with (``sasl.upstream``), its secret as the file holds it now."""

    def __init__(self, mechanism: str, username: str | None, secret_file: Path) -> None:
        self.mechanism = mechanism
        self.username = username
        token = mechanism == "OAUTHBEARER"
        self.secret = SecretFile(secret_file, "sasl.upstream." + ("token_file" if token else "password_file"),
                                 token=token)

    def current(self) -> Credentials:
        return Credentials(self.mechanism, self.username, self.secret.current())
