"""Socket helpers of the server: connecting to an upstream, naming a peer, and a connect
failure's root cause in a few words."""

from __future__ import annotations

import errno
import functools
import ipaddress
import socket

import trio


async def open_tcp(host: str, port: int) -> trio.SocketStream:
    """``trio.open_tcp_stream(host, port)``, without its machinery when ``host`` is an IP address.

    For a name, open_tcp_stream resolves it and races the addresses (happy eyeballs, RFC 8305)
    in a nursery of its own. An address literal has nothing to race: one socket and one
    ``connect`` do, and cost a fraction of the nursery, its cancel scopes and its task, which
    every client connection would otherwise pay. TCP_NODELAY is set by ``trio.SocketStream``.
    """
    family = literal_family(host)
    if family is None:
        return await trio.open_tcp_stream(host, port)
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


@functools.lru_cache(maxsize=64)
def literal_family(host: str) -> int | None:
    """AF_INET or AF_INET6 when ``host`` is an IP address literal, None for a name."""
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None


def os_reason(exc: BaseException) -> str:
    """The root cause in a few words: trio wraps per-address failures of one connect in a group."""
    root: BaseException = exc
    while True:
        if isinstance(root, OSError) and root.errno == errno.ECONNREFUSED:
            return "connection refused"
        nxt = root.exceptions[0] if isinstance(root, BaseExceptionGroup) else root.__cause__
        if nxt is None:
            break
        root = nxt
    return str(root) or type(root).__name__


def peer_name(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "unknown"
