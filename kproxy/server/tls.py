"""SSL contexts for both sides, built from :mod:`kproxy.config`, with the certificates they hold.

Client side and upstream side are independent: TLS to clients with plaintext
to brokers (a sidecar terminating TLS) and the reverse both work.

A side's files are loaded by OpenSSL and read once more for their certificates' facts
(kproxy/server/certificates.py): :class:`TlsMaterial` is both. At start a certificate is loaded
whatever its dates (the log says when one has expired, and so do the peers); a rotated one
(kproxy/server/tls_reload.py) is refused when it has expired, the one in force kept.
"""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kproxy.config import ClientTls, ConfigError, UpstreamTls
from kproxy.files import file_kind
from kproxy.server.certificates import Certificate, read_certificates, utc_text

LISTENER, UPSTREAM = "listener", "upstream"  # the two sides, as the expiry metric's ``side`` label names them


@dataclass(frozen=True)
class TlsMaterial:
    """One side's context and every certificate of the files it was loaded from: its own chain first
    (``own``: the certificate it presents, then its intermediates), then the CAs it trusts (``trusted``;
    none read when the system's store is used)."""

    side: str
    context: ssl.SSLContext
    own: tuple[Certificate, ...] = ()
    trusted: tuple[Certificate, ...] = ()

    @property
    def certificates(self) -> tuple[Certificate, ...]:
        return self.own + self.trusted


def _load(what: str, files: list[Path | None], load: Callable[[], None]) -> None:
    """Run one load step; a failure names the option and the file(s), not only OpenSSL's words.

    OpenSSL opens the files itself: each is first checked to be a regular file, so that a FIFO or
    a device in a file's place is refused at once instead of holding the loader (kproxy/files.py).
    """
    for f in files:
        try:
            mode = os.stat(f).st_mode if f is not None else stat.S_IFREG
        except OSError:
            continue  # said by the load, in OpenSSL's words as before
        if not stat.S_ISREG(mode):
            raise ConfigError(f"{what}: cannot load {f}: not a regular file ({file_kind(mode)})")
    try:
        load()
    except (ssl.SSLError, OSError) as exc:
        names = " and ".join(str(f) for f in files if f is not None)
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise ConfigError(f"{what}: cannot load {names}: {reason}") from None


def _read(what: str, path: Path) -> tuple[Certificate, ...]:
    try:
        return tuple(read_certificates(path))
    except ValueError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc}") from None


def _check_own(what: str, path: Path, chain: tuple[Certificate, ...], now: float | None) -> None:
    """A chain to present must not have expired: a peer would refuse every handshake."""
    if now is None:
        return
    for cert in chain:
        if cert.expired(now):
            raise ConfigError(f"{what}: {path}: certificate {cert.subject!r} (serial {cert.serial:x}) expired at "
                              f"{utc_text(cert.not_after)}")


def _check_trusted(what: str, path: Path, cas: tuple[Certificate, ...], now: float | None) -> None:
    """A CA file must hold one CA that has not expired: with none, every peer would be refused (an
    expired CA among valid ones, a rotation's overlap, is kept: it verifies nothing)."""
    if now is not None and cas and all(c.expired(now) for c in cas):
        latest = max(c.not_after for c in cas)
        raise ConfigError(f"{what}: {path}: every certificate has expired (the last at {utc_text(latest)})")


def client_side_material(tls: ClientTls, *, refuse_expired_at: float | None = None) -> TlsMaterial | None:
    """Server context for client connections and its certificates, or None when TLS to clients is
    off; ``refuse_expired_at`` (Unix seconds): refuse files whose certificates have expired then
    (:func:`_check_own`, :func:`_check_trusted`). ConfigError names the option and file."""
    if not tls.enabled:
        return None
    assert tls.cert is not None  # enabled says so
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load("tls.client.cert/key", [tls.cert, tls.key], lambda: ctx.load_cert_chain(str(tls.cert), str(tls.key)))
    own = _read("tls.client.cert", tls.cert)
    _check_own("tls.client.cert", tls.cert, own, refuse_expired_at)
    trusted: tuple[Certificate, ...] = ()
    if tls.client_ca is not None:
        _load("tls.client.client_ca", [tls.client_ca], lambda: ctx.load_verify_locations(str(tls.client_ca)))
        ctx.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
        trusted = _read("tls.client.client_ca", tls.client_ca)
        _check_trusted("tls.client.client_ca", tls.client_ca, trusted, refuse_expired_at)
    return TlsMaterial(LISTENER, ctx, own, trusted)


def upstream_material(tls: UpstreamTls, *, refuse_expired_at: float | None = None) -> TlsMaterial | None:
    """Client context for broker connections and its certificates, or None when upstream TLS is
    off; ``refuse_expired_at`` as in :func:`client_side_material`."""
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    trusted: tuple[Certificate, ...] = ()
    own: tuple[Certificate, ...] = ()
    if tls.ca is not None:
        _load("tls.upstream.ca", [tls.ca], lambda: ctx.load_verify_locations(str(tls.ca)))
        trusted = _read("tls.upstream.ca", tls.ca)
        _check_trusted("tls.upstream.ca", tls.ca, trusted, refuse_expired_at)
    if tls.cert is not None:
        _load("tls.upstream.cert/key", [tls.cert, tls.key], lambda: ctx.load_cert_chain(str(tls.cert), str(tls.key)))
        own = _read("tls.upstream.cert", tls.cert)
        _check_own("tls.upstream.cert", tls.cert, own, refuse_expired_at)
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return TlsMaterial(UPSTREAM, ctx, own, trusted)


def client_side_context(tls: ClientTls) -> ssl.SSLContext | None:
    """Server context for client connections, or None when TLS to clients is off."""
    material = client_side_material(tls)
    return material.context if material is not None else None


def upstream_context(tls: UpstreamTls) -> ssl.SSLContext | None:
    """Client context for broker connections, or None when upstream TLS is off."""
    material = upstream_material(tls)
    return material.context if material is not None else None
