"""``host:port`` text, as configs, rules and peers write it, read in one place.

Stands alone (the standard library only), so every floor reads addresses the same way: the
config (``upstream``, ``listen``), the rules (``rewrite_addresses`` maps), the capture and the
policy (a client's peer address as the server writes it).

Forms: ``host:port``, ``[v6]:port`` (the brackets are not part of the host), and a bare IPv6
address with its port after the last colon (``::1:9092``), as Kafka's own clients read them.
A port is 1-65535 (0, "any free port", only where the caller allows it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostPort:
    """A host and a port; written back as ``host:port``, or ``[host]:port`` when the host holds a colon."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_host_port(text: str, *, default_port: int | None = None, allow_port_zero: bool = False) -> HostPort:
    """``text`` (``host:port`` or ``[v6]:port``, spaces around ignored) as a :class:`HostPort`.

    ``default_port`` is taken when ``text`` names no port; ``allow_port_zero`` accepts port 0 (a
    listener on any free port). Raises ValueError with a one-line message that quotes ``text``
    and says what is wrong with it.
    """
    text = text.strip()
    if not text:
        raise ValueError("empty address: expected host:port")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"unclosed '[' in address {text!r}: expected [host]:port")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{rest!r} after ']' in address {text!r}: expected [host]:port")
        port_text = rest[1:]
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    if not port_text:
        if default_port is None:
            raise ValueError(f"address {text!r} has no port: expected host:port")
        port_text = str(default_port)
    lowest = 0 if allow_port_zero else 1
    if not (port_text.isascii() and port_text.isdigit()) or not lowest <= int(port_text) <= 65535:
        raise ValueError(f"bad port {port_text!r} in address {text!r}: expected {lowest}-65535")
    if not host:
        raise ValueError(f"address {text!r} has no host: expected host:port")
    return HostPort(host, int(port_text))


def split_host_port(text: str) -> tuple[str, int | None]:
    """``(host, port)`` of ``text`` read as :func:`parse_host_port` reads it, or ``(text, None)``
    when it is not a ``host:port`` (a peer name a test gave, say): for text kproxy wrote itself
    or checked already, where a bad address is not the reader's to report."""
    try:
        found = parse_host_port(text)
    except ValueError:
        return text, None
    return found.host, found.port


# A DNS label in lower case: what a cluster's name is (the config's ``clusters:``, the rules'
# ``match.cluster``), since it names the cluster in metrics and logs and may in a host name.
DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
CLUSTER_NAME_RULE = "lower-case letters, digits and '-' (not first or last), at most 63"
