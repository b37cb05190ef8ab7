"""SSL contexts for both sides, built from :mod:`kproxy.config`.

Client side and upstream side are independent: TLS to clients with plaintext
to brokers (a sidecar terminating TLS) and the reverse both work.
"""

from __future__ import annotations

import ssl

from kproxy.config import ClientTls, ConfigError, UpstreamTls


def client_side_context(tls: ClientTls) -> ssl.SSLContext | None:
    """Server context for client connections, or None when TLS to clients is off."""
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(str(tls.cert), str(tls.key))
        if tls.client_ca is not None:
            ctx.load_verify_locations(str(tls.client_ca))
            ctx.verify_mode = ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls.client: cannot load certificate or CA: {exc}") from None
    return ctx


def upstream_context(tls: UpstreamTls) -> ssl.SSLContext | None:
    """Client context for broker connections, or None when upstream TLS is off."""
    if not tls.enabled:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if tls.ca is not None:
            ctx.load_verify_locations(str(tls.ca))
        if tls.cert is not None:
            ctx.load_cert_chain(str(tls.cert), str(tls.key))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"tls.upstream: cannot load certificate or CA: {exc}") from None
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
