"""A client's identity as Kafka names it, from what kproxy sees of the client connection.

TLS: Kafka's default principal builder (DefaultKafkaPrincipalBuilder, SSL) names a client by
its certificate's subject, ``User:`` and the distinguished name as Java's
``X500Principal.getName()`` writes it: RFC 2253, whose section 2.1 starts from the *last*
RDN of the certificate's sequence (so a subject encoded ``O, OU, CN`` reads
``CN=...,OU=...,O=...``). Operators match log lines and captures against ACLs written
that way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Python's ssl module spells attributes out; RFC 2253 section 2.3 keywords (others keep Python's name).
_KEYWORDS = {"commonName": "CN", "localityName": "L", "stateOrProvinceName": "ST", "organizationName": "O",
             "organizationalUnitName": "OU", "countryName": "C", "streetAddress": "STREET",
             "domainComponent": "DC", "userId": "UID"}
_SPECIAL = ',+"\\<>;'  # escaped with a backslash anywhere in a value (RFC 2253 section 2.4)


def tls_principal(cert: Mapping[str, Any] | None) -> str | None:
    """``User:<subject>`` of a verified client certificate, as :meth:`ssl.SSLSocket.getpeercert`
    returns it (None or empty when the client sent none, or kproxy does not ask for one: no
    ``tls.client.client_ca``); None then."""
    if not cert:
        return None
    rdns = cert.get("subject", ())
    if not rdns:
        return None
    names = ("+".join(f"{_KEYWORDS.get(key, key)}={_escape(str(value))}" for key, value in rdn)
             for rdn in reversed(rdns))
    return "User:" + ",".join(names)


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in _SPECIAL else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out
