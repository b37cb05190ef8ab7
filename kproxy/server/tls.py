"""SSL contexts for both sides, built from :mod:`kproxy.config`.

Client side and upstream side are independent: TLS to clients with plaintext
to brokers (a sidecar terminating TLS) and the reverse both work.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

from kproxy.config import ClientTls, ConfigError, UpstreamTls


def _load(what: str, files: list[Path | None], load: Callable[[], None]) -> None:
    """Run one load step; a failure names the option and the file(s), not only OpenSSL's words."""
    try:
        load()
    except (ssl.SSLError, OSError) as exc:
        names = " and ".join(str(f) for f in files if f is not None)
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise ConfigError(f"{what}: cannot load {names}: {reason}") from None


def client_side_context(tls: ClientTls) -> ssl.SSLContext | None:
    """Server context for client connections, or None when TLS to clients is off."""
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _load("tls.client.cert/key", [tls.cert, tls.key], lambda: ctx.load_cert_chain(str(tls.cert), str(tls.key)))
    if tls.client_ca is not None:
        _load("tls.client.client_ca", [tls.client_ca], lambda: ctx.load_verify_locations(str(tls.client_ca)))
        ctx.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def upstream_context(tls: UpstreamTls) -> ssl.SSLContext | None:
    """Client context for broker connections, or None when upstream TLS is off."""
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if tls.ca is not None:
        _load("tls.upstream.ca", [tls.ca], lambda: ctx.load_verify_locations(str(tls.ca)))
    if tls.cert is not None:
        _load("tls.upstream.cert/key", [tls.cert, tls.key], lambda: ctx.load_cert_chain(str(tls.cert), str(tls.key)))
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
