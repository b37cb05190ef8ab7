"""kproxy's upstream login credentials, their secret re-read from its file when the file changes.

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

from kproxy.config import SaslUpstream
from kproxy.config.secrets import read_secret
from kproxy.logfmt import q
from kproxy.sasl.client import Credentials

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

    def __init__(self, sasl: SaslUpstream) -> None:
        assert sasl.mechanism is not None and sasl.secret_file is not None
        self.mechanism = sasl.mechanism
        self.username = sasl.username
        token = sasl.mechanism == "OAUTHBEARER"
        self.secret = SecretFile(sasl.secret_file, "sasl.upstream." + ("token_file" if token else "password_file"),
                                 token=token)

    def current(self) -> Credentials:
        return Credentials(self.mechanism, self.username, self.secret.current())
