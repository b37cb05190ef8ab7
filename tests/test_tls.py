"""TLS on each side of kproxy, independently, with real certificates (trustme) and real clients.

Topology for upstream TLS: client -> kproxy A (plaintext in, TLS out) -> kproxy B
(TLS in, plaintext out) -> Tansu. B is a real TLS server with a certificate of
its own CA, so A's verification, SNI and client certificates are exercised
against a real handshake rather than a mock.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from confluent_kafka.admin import AdminClient

from kproxy.logfmt import parse_logfmt
from kproxy.protocol import decode_response, encode_request
from kproxy.protocol.headers import RequestHeader
from kproxy.testing import Broker, running_proxy

# The client certificate's subject as Kafka's SSL principal builder names it: RFC 2253, the last RDN first.
PRINCIPAL = "User:CN=kproxy-test-client,OU=Payments,O=Acme\\, Inc."


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate, as PEM files."""
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    other_ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    # Its subject reads O, OU, CN in the certificate; a comma in O must be escaped in a principal.
    client = ca.issue_cert("kproxy-test-client", common_name="kproxy-test-client", organization_name="Acme, Inc.",
                           organization_unit_name="Payments")
    files = {
        "ca": d / "ca.pem", "other_ca": d / "other-ca.pem", "cert": d / "server.pem", "key": d / "server.key",
        "client_cert": d / "client.pem", "client_key": d / "client.key",
    }
    ca.cert_pem.write_to_path(files["ca"])
    other_ca.cert_pem.write_to_path(files["other_ca"])
    server.private_key_pem.write_to_path(files["key"])
    server.cert_chain_pems[0].write_to_path(files["cert"])
    client.private_key_pem.write_to_path(files["client_key"])
    client.cert_chain_pems[0].write_to_path(files["client_cert"])
    return files


def _api_versions_over(sock: socket.socket) -> dict[str, object]:
    header = RequestHeader(api_key=18, api_version=3, correlation_id=7, client_id="tls-test", header_version=2)
    payload = encode_request(header, {"client_software_name": "kproxy-test", "client_software_version": "1"})
    sock.sendall(len(payload).to_bytes(4, "big") + payload)
    size = int.from_bytes(_recv_exact(sock, 4), "big")
    response = decode_response(_recv_exact(sock, size), 18, 3)
    assert response.header.correlation_id == 7
    return response.body


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


@pytest.fixture
def tls_front(tansu: Broker, pki: dict[str, Path]) -> Iterator[str]:
    """kproxy B: serves TLS (client certificates optional), forwards plaintext to Tansu."""
    with running_proxy(tansu.bootstrap, tls__client__cert=str(pki["cert"]), tls__client__key=str(pki["key"]),
                       tls__client__client_ca=str(pki["ca"])) as front:
        yield front.bootstrap


def test_client_side_tls_with_a_real_client(tls_front: str, pki: dict[str, Path]) -> None:
    admin = AdminClient({"bootstrap.servers": tls_front, "security.protocol": "SSL",
                         "ssl.ca.location": str(pki["ca"]), "ssl.endpoint.identification.algorithm": "none"})
    md = admin.list_topics(timeout=15)
    assert md.brokers
    for broker in md.brokers.values():
        # Broker listeners serve TLS too: the metadata call above reached one through them.
        assert broker.host == "127.0.0.1"


def test_plaintext_client_on_a_tls_port_is_refused_without_harm(tls_front: str, pki: dict[str, Path]) -> None:
    host, port = tls_front.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(b"\x00\x00\x00\x0a" + b"\x00" * 10)  # a Kafka frame, not a TLS ClientHello
        raw.settimeout(10)
        # kproxy may answer with a TLS alert, but then it must close: read until EOF or reset.
        received = b""
        try:
            while chunk := raw.recv(100):
                received += chunk
                assert len(received) < 4096, "a plaintext client got a stream of data from a TLS port"
        except ConnectionResetError:
            pass
        assert not received.startswith(b"\x00\x00"), "no Kafka bytes may reach a client that skipped TLS"
    # The listener still serves TLS clients afterwards.
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    with socket.create_connection((host, int(port)), timeout=10) as s, \
            ctx.wrap_socket(s, server_hostname="localhost") as tls:
        assert _api_versions_over(tls)["error_code"] == 0


def test_upstream_tls_verifies_the_broker_and_sends_a_client_certificate(
        tls_front: str, pki: dict[str, Path]) -> None:
    with running_proxy(tls_front, tls__upstream__enabled=True, tls__upstream__ca=str(pki["ca"]),
                       tls__upstream__server_name="localhost", tls__upstream__cert=str(pki["client_cert"]),
                       tls__upstream__key=str(pki["client_key"])) as back:
        host, port = back.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            assert _api_versions_over(s)["error_code"] == 0


def test_upstream_tls_refuses_a_broker_signed_by_another_ca(tls_front: str, pki: dict[str, Path]) -> None:
    with running_proxy(tls_front, tls__upstream__enabled=True, tls__upstream__ca=str(pki["other_ca"]),
                       tls__upstream__server_name="localhost") as back:
        host, port = back.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.settimeout(15)
            # Verification fails: kproxy closes the client connection instead of talking to an impostor.
            assert s.recv(100) == b""
        assert back.server is not None
        assert sum(back.server.stats.upstream_connect_failures.values()) >= 1


def test_client_certificate_required(tansu: Broker, pki: dict[str, Path]) -> None:
    with running_proxy(tansu.bootstrap, tls__client__cert=str(pki["cert"]), tls__client__key=str(pki["key"]),
                       tls__client__client_ca=str(pki["ca"]), tls__client__require_client_cert=True) as front:
        host, port = front.bootstrap.rsplit(":", 1)
        anonymous = ssl.create_default_context(cafile=str(pki["ca"]))
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.settimeout(10)
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)), \
                    anonymous.wrap_socket(s, server_hostname="localhost") as tls:
                _api_versions_over(tls)
        with_cert = ssl.create_default_context(cafile=str(pki["ca"]))
        with_cert.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
        with socket.create_connection((host, int(port)), timeout=10) as s, \
                with_cert.wrap_socket(s, server_hostname="localhost") as tls:
            assert _api_versions_over(tls)["error_code"] == 0


def test_upstream_tls_refuses_the_right_ca_with_the_wrong_name(tls_front: str, pki: dict[str, Path]) -> None:
    """B's certificate is signed by the CA kproxy trusts but names localhost/127.0.0.1: asked to
    reach another name, kproxy must refuse it (a certificate of any host under that CA is not
    this broker's)."""
    with running_proxy(tls_front, tls__upstream__enabled=True, tls__upstream__ca=str(pki["ca"]),
                       tls__upstream__server_name="not-this-broker.example") as back:
        host, port = back.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.settimeout(15)
            # Verification fails: kproxy closes the client connection; an answer means it went on.
            header = RequestHeader(api_key=18, api_version=3, correlation_id=7, client_id="tls-test",
                                   header_version=2)
            payload = encode_request(header, {"client_software_name": "t", "client_software_version": "1"})
            try:
                s.sendall(len(payload).to_bytes(4, "big") + payload)
                answer = s.recv(100)
            except (ConnectionResetError, BrokenPipeError):
                answer = b""
            assert answer == b"", f"kproxy talked to a broker whose certificate names another host: {answer[:12]!r}..."
        assert back.server is not None
        assert sum(back.server.stats.upstream_connect_failures.values()) >= 1
        # The same CA and the right name: accepted (so the refusal above was the name).
    with running_proxy(tls_front, tls__upstream__enabled=True, tls__upstream__ca=str(pki["ca"]),
                       tls__upstream__server_name="localhost") as good:
        host, port = good.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            assert _api_versions_over(s)["error_code"] == 0


def test_capture_names_the_client_certificate_as_principal(tansu: Broker, pki: dict[str, Path],
                                                          tmp_path: Path) -> None:
    import pyarrow.parquet as pq
    with running_proxy(tansu.bootstrap, tls__client__cert=str(pki["cert"]), tls__client__key=str(pki["key"]),
                       tls__client__client_ca=str(pki["ca"]), capture__dir=str(tmp_path)) as front:
        host, port = front.bootstrap.rsplit(":", 1)
        for cert in (True, False):
            context = ssl.create_default_context(cafile=str(pki["ca"]))
            if cert:
                context.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
            with socket.create_connection((host, int(port)), timeout=10) as s, \
                    context.wrap_socket(s, server_hostname="localhost") as tls:
                assert _api_versions_over(tls)["error_code"] == 0
    rows = [r for f in sorted(tmp_path.rglob("capture-*.parquet")) for r in pq.ParquetFile(f).read().to_pylist()]
    principals = sorted((r["principal"] or "") for r in rows if r["client_id"] == "tls-test")
    assert len(principals) == 2
    assert principals[0] == ""  # no certificate: no principal
    # As Kafka's SSL principal builder names it (RFC 2253: the subject's last RDN first).
    assert principals[1] == PRINCIPAL


def test_connection_lines_name_the_client_certificate_as_principal(
        tansu: Broker, pki: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy")
    with running_proxy(tansu.bootstrap, tls__client__cert=str(pki["cert"]), tls__client__key=str(pki["key"]),
                       tls__client__client_ca=str(pki["ca"])) as front:
        host, port = front.bootstrap.rsplit(":", 1)
        for cert in (True, False):
            context = ssl.create_default_context(cafile=str(pki["ca"]))
            if cert:
                context.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
            with socket.create_connection((host, int(port)), timeout=10) as s, \
                    context.wrap_socket(s, server_hostname="localhost") as tls:
                assert _api_versions_over(tls)["error_code"] == 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and len(closes(caplog)) < (1 if cert else 2):
                time.sleep(0.02)
    with_cert, without = (parse_logfmt(line) for line in closes(caplog))
    assert with_cert["client_id"] == without["client_id"] == "tls-test"
    assert with_cert["principal"] == PRINCIPAL
    assert "principal" not in without  # no certificate: the pair is left out


def closes(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("event=connection_closed")]


def test_a_rule_for_the_certificates_principal_hits_that_client_only(tansu: Broker, pki: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """``match.principal`` against a verified client certificate's subject, in Kafka's RFC 2253 form
    (here the whole principal, as an ACL writes it; tests/test_rules_principal.py has the other forms)."""
    rules = tmp_path / "cert.yaml"
    rules.write_text('rules:\n  - id: acme-payments\n'
                     '    match: {api: api_versions, principal: "User:CN=kproxy-test-client,OU=Payments,.*"}\n'
                     "    actions:\n      - inject_error: {error: CLUSTER_AUTHORIZATION_FAILED}\n")
    with running_proxy(tansu.bootstrap, tls__client__cert=str(pki["cert"]), tls__client__key=str(pki["key"]),
                       tls__client__client_ca=str(pki["ca"]), rules=str(rules)) as front:
        host, port = front.bootstrap.rsplit(":", 1)
        codes = {}
        for cert in (True, False):
            context = ssl.create_default_context(cafile=str(pki["ca"]))
            if cert:
                context.load_cert_chain(str(pki["client_cert"]), str(pki["client_key"]))
            with socket.create_connection((host, int(port)), timeout=10) as s, \
                    context.wrap_socket(s, server_hostname="localhost") as tls:
                codes[cert] = _api_versions_over(tls)["error_code"]
    assert codes == {True: 31, False: 0}  # CLUSTER_AUTHORIZATION_FAILED for the certificate's principal only
