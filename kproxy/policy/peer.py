"""A client connection's address, as the rule engine keys its per-peer cache with it."""

from __future__ import annotations

import ipaddress

from kproxy.host_port import split_host_port

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class _HashedOnce:
    """An address whose hash is computed once (:func:`client_ip` sets it): the engine keys its
    per-peer cache with the client address on every request (kproxy/rules/engine.py), and
    ipaddress hashes ``hex(int(ip))`` on every call. Equal, and hashing equal, to the
    plain address. Mixed into each ipaddress class below, which holds the slot (a slotted
    ipaddress base leaves no room for a mixin's own)."""

    __slots__ = ()
    _hash: int

    def __hash__(self) -> int:
        return self._hash


class _PeerIPv4(_HashedOnce, ipaddress.IPv4Address):
    __slots__ = ("_hash",)


class _PeerIPv6(_HashedOnce, ipaddress.IPv6Address):
    __slots__ = ("_hash",)


def client_ip(peer: str) -> IpAddress | None:
    """The address of a ``host:port`` peer (``[v6]:port`` too), its hash kept; None for a name."""
    host = split_host_port(peer)[0]
    ip: _PeerIPv4 | _PeerIPv6
    try:
        ip = _PeerIPv4(host)
        ip._hash = ipaddress.IPv4Address.__hash__(ip)
    except ValueError:
        try:
            ip = _PeerIPv6(host)
        except ValueError:
            return None
        ip._hash = ipaddress.IPv6Address.__hash__(ip)
    return ip


__all__ = ["IpAddress", "client_ip"]
