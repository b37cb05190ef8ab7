"""The TLS files reloaded while kproxy serves: a rotated certificate is used from the next handshake.

Each side's files are watched as the rules file is, by a stat poll every :data:`POLL_INTERVAL`
seconds (kproxy/files.py, ``stat_signature``: a Kubernetes Secret's ``..data`` symlink flip is a
new inode, an edit in place new times or size). The client side's are ``tls.client.cert``, ``key``
and ``client_ca``; the upstream side's ``tls.upstream.ca``, ``cert`` and ``key``. When any file of
a side changed, the whole side is loaded again, in a worker thread, into a new context
(kproxy/server/tls.py): handshakes that begin after it is put in force use it, and connections
already open keep the one they were made with (their SSL object holds it) until they close.

A side that does not load keeps the context in force: a key that does not match its certificate,
a file that cannot be read or holds no certificate, a certificate to present that has expired, a CA
file whose every certificate has expired. One warning line says so, once per distinct problem (a
rotation written file by file may show a mismatched pair between two writes: the next poll after
the last write loads it)::

    event=tls_reload_failed side=listener|upstream action=kept_previous detail="tls.client.cert/key: ..."
    event=tls_reloaded side=listener|upstream certificates=N subject=S serial=HEX not_after=ISO

``subject``, ``serial`` and ``not_after`` are those of the certificate the side presents (or of
its first CA when it presents none). The certificates in force are the series of
``kproxy_tls_certificate_expiry_timestamp_seconds{side,subject}`` and its ``not_before`` twin
(:meth:`LiveTls.validity`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import trio

from kproxy.config import ClientTls, ConfigError, UpstreamTls
from kproxy.files import Signature, stat_signature
from kproxy.logfmt import q
from kproxy.server.certificates import utc_text
from kproxy.server.tls import TlsMaterial, client_side_material, upstream_material

log = logging.getLogger("kproxy.tls")

POLL_INTERVAL = 0.5  # as the rules file's: a rotation is in force within a second of its write

Build = Callable[[float | None], TlsMaterial | None]  # refuse_expired_at -> the side's material


class LiveTls:
    """One side's TLS in force: :attr:`context` is what each new handshake of the side is made with.

    Made by :meth:`listener` or :meth:`upstream` (None when the side has no TLS), which load the
    files as at start (ConfigError when they do not load). The files' signature is taken before
    they are read, so that a rotation landing meanwhile is a change at the first poll.
    """

    def __init__(self, material: TlsMaterial, files: list[Path], build: Build, seen: tuple[Signature, ...]) -> None:
        self.side = material.side
        self.material = material
        self.context = material.context
        self.files = [str(f) for f in files]
        self._build = build
        self._seen = seen
        self._problem: str | None = None  # the last load failure logged (each distinct one once)

    @classmethod
    def _load(cls, files: list[Path | None], build: Build) -> LiveTls | None:
        named = [f for f in files if f is not None]
        seen = tuple(stat_signature(str(f)) for f in named)
        material = build(None)
        return cls(material, named, build, seen) if material is not None else None

    @classmethod
    def listener(cls, tls: ClientTls) -> LiveTls | None:
        return cls._load([tls.cert, tls.key, tls.client_ca],
                         lambda at: client_side_material(tls, refuse_expired_at=at))

    @classmethod
    def upstream(cls, tls: UpstreamTls) -> LiveTls | None:
        return cls._load([tls.ca, tls.cert, tls.key], lambda at: upstream_material(tls, refuse_expired_at=at))

    def changed(self) -> bool:
        """Whether a file of the side changed since the last look (one ``stat`` per file)."""
        now = tuple(stat_signature(f) for f in self.files)
        if now == self._seen:
            return False
        self._seen = now
        return True

    async def reload(self) -> bool:
        """Load the side's files now (in a worker thread) and put them in force; False, the context
        in force kept and the problem logged once, when they do not load."""
        try:
            material = await trio.to_thread.run_sync(self._build, time.time(), abandon_on_cancel=True,
                                                     thread_name="kproxy-tls-reload")
        except ConfigError as exc:
            detail = "; ".join(exc.problems)
            if detail != self._problem:
                self._problem = detail
                log.warning("event=tls_reload_failed side=%s action=kept_previous detail=%s", self.side, q(detail))
            return False
        assert material is not None  # the side's TLS is on: it was at start
        recovered, self._problem = self._problem is not None, None
        if material.certificates == self.material.certificates and not recovered:
            return True  # the same certificates (a touch, the same Secret flipped again): nothing to say
        self.material, self.context = material, material.context
        shown = (material.own or material.trusted)[0]
        log.info("event=tls_reloaded side=%s certificates=%d subject=%s serial=%x not_after=%s", self.side,
                 len(material.certificates), q(shown.subject), shown.serial, utc_text(shown.not_after))
        return True

    def validity(self) -> dict[str, tuple[float, float]]:
        """``(not_before, not_after)`` of each subject among the certificates in force; of two with
        one subject (a CA and its renewal side by side in a bundle), the one that expires first:
        an alert on expiry must see it."""
        out: dict[str, tuple[float, float]] = {}
        for cert in self.material.certificates:
            known = out.get(cert.subject)
            if known is None or cert.not_after < known[1]:
                out[cert.subject] = (cert.not_before, cert.not_after)
        return out

    def expired_in_force(self, now: float) -> list[str]:
        """The subjects of the certificates in force that have expired at ``now``."""
        return [c.subject for c in self.material.certificates if c.expired(now)]


class TlsReloader:
    """Polls every side's files and reloads a side whose files changed; ``await run()`` in the
    server's nursery until cancelled. Every reload is made by that one task, so two never overlap."""

    def __init__(self, sides: list[LiveTls], *, interval: float = POLL_INTERVAL) -> None:
        self.sides = sides
        self.interval = interval

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        now = time.time()
        for side in self.sides:  # loaded whatever their dates at start: an expired one is said, once
            for subject in side.expired_in_force(now):
                log.warning("event=tls_certificate_expired side=%s subject=%s", side.side, q(subject))
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            for side in self.sides:
                if side.changed():
                    await side.reload()


__all__ = ["POLL_INTERVAL", "LiveTls", "TlsReloader"]
