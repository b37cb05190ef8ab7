"""Certificates made by the tests with ``cryptography``: CAs, and leaves they sign with the dates asked
(an expired one included), for the TLS rotation tests; and a Kubernetes-like Secret volume to rotate
them in (the ``..data`` symlink flip the kubelet makes)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kproxy tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@dataclass
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    @property
    def serial(self) -> int:
        return self.cert.serial_number

    @property
    def subject(self) -> str:
        return self.cert.subject.rfc4514_string()

    @property
    def not_after(self) -> float:
        return self.cert.not_valid_after_utc.timestamp()


class Authority:
    """A self-signed CA that issues leaves for 127.0.0.1 and localhost (servers) or a name (clients)."""

    def __init__(self, name: str, *, days: int = 365) -> None:
        key = _key()
        cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(_name(name))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(NOW - DAY).not_valid_after(NOW + days * DAY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                             crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        self.ca = Issued(cert, key)

    def issue(self, common_name: str, *, client: bool = False, not_before: datetime.datetime = NOW - DAY,
              not_after: datetime.datetime = NOW + 30 * DAY) -> Issued:
        key = _key()
        builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(self.ca.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(not_before).not_valid_after(not_after)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                         else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
        if not client:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return Issued(builder.sign(self.ca.key, hashes.SHA256()), key)


class SecretVolume:
    """A directory laid out as the kubelet lays out a mounted Secret: ``name -> ..data/name``,
    ``..data -> ..<version>``; :meth:`publish` writes a new version and flips ``..data`` with one
    rename, as the kubelet does on rotation (the old version is then removed)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.versions = 0
        root.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.root / name

    def publish(self, files: dict[str, bytes]) -> None:
        self.versions += 1
        version = f"..2026_11_29_00_00_{self.versions:02d}.{os.getpid()}"
        (self.root / version).mkdir()
        for name, data in files.items():
            (self.root / version / name).write_bytes(data)
        old = os.readlink(self.root / "..data") if (self.root / "..data").is_symlink() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version)
        os.replace(tmp, self.root / "..data")
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        if old is not None:
            for f in (self.root / old).iterdir():
                f.unlink()
            (self.root / old).rmdir()
