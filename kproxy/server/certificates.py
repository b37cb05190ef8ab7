"""What the certificates of a PEM file are: their subject and validity, read with ``cryptography``.

OpenSSL (through :mod:`ssl`) loads the TLS files into a context but says nothing of the
certificates it holds: the standard library has no public way to read a certificate's dates.
So each file kproxy loads is also read here, for the expiry metric and to refuse a rotated
certificate that has already expired. ``cryptography`` is imported on first use only: without TLS
kproxy never pays its import.

Files are read as every operator's file is (kproxy/files.py): regular files only, bounded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from kproxy.files import FileRefused, read_regular_file

# A PEM certificate is a few kilobytes; a CA bundle (a system's whole trust store) a few hundred.
MAX_PEM_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Certificate:
    """One certificate's facts: its subject (RFC 4514, as ``openssl x509 -subject -nameopt RFC2253``
    prints it), serial number and validity (Unix seconds, UTC)."""

    subject: str
    serial: int
    not_before: float
    not_after: float

    def expired(self, now: float) -> bool:
        return now >= self.not_after


def utc_text(seconds: float) -> str:
    """A certificate's date as log lines write it: ``2027-02-27T08:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def read_certificates(path: Path) -> list[Certificate]:
    """Every certificate of the PEM file at ``path``, in file order; ValueError saying why (in an
    operator's words, without the path: the caller names the option and the file) when the file
    cannot be read or holds none."""
    from cryptography import x509  # imported when TLS is on only (see the module's docstring)

    try:
        data = read_regular_file(str(path), MAX_PEM_BYTES)
    except FileRefused as exc:
        raise ValueError(exc.reason) from None
    try:
        loaded = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise ValueError(f"no PEM certificate could be read ({exc})") from None
    return [Certificate(subject=c.subject.rfc4514_string(), serial=c.serial_number,
                        not_before=c.not_valid_before_utc.timestamp(), not_after=c.not_valid_after_utc.timestamp())
            for c in loaded]
