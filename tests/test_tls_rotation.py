"""TLS files rotated under a running kproxy while a real TLS client keeps producing (issue 39).

The certificates are made here with ``cryptography`` (tests/support/certs.py), and rotated as the
kubelet rotates a mounted Secret: a new directory, then one rename of the ``..data`` symlink. After
each rotation a fresh handshake (the standard library's ssl client) must see the new certificate,
a rotation that does not load (a key of another certificate, an expired certificate, a file that is
no certificate) must leave the one in force and say so once, and a confluent-kafka producer whose
connections were opened before every rotation must go on producing without an error: at the end
its client certificate is one kproxy no longer accepts on a new connection, so its records can only
go through the connections it had (kept with their context, as the issue asks).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from kproxy.protocol import Direction, RequestHeader, decode_response, default_body, encode_request, frame
from kproxy.protocol.headers import request_header_version
from kproxy.testing import Broker, free_port, running_proxy
from tests.support.certs import DAY, NOW, Authority, Issued, SecretVolume
from tests.support.rawkafka import RawKafka

EXPIRY = "kproxy_tls_certificate_expiry_timestamp_seconds"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what} (last: {got!r})")
        time.sleep(0.1)


def client_context(trust: Path, client: Issued | None, tmp: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(trust))
    if client is not None:
        cert, key = tmp / f"probe-{client.serial:x}.pem", tmp / f"probe-{client.serial:x}.key"
        cert.write_bytes(client.cert_pem)
        key.write_bytes(client.key_pem)
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def served_serial(address: str, ctx: ssl.SSLContext) -> int:
    """The serial of the certificate a new handshake with kproxy gets, once an ApiVersions request
    went through (a client certificate is judged after the TLS 1.3 handshake: a refusal shows on
    the first read). Raises when kproxy refuses the connection."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        header = RequestHeader(18, 3, 1, "tls-rotation-probe", request_header_version(18, 3))
        tls.sendall(frame(encode_request(header, default_body(18, 3, Direction.REQUEST))))
        answer = b""
        while len(answer) < 4 or len(answer) < 4 + int.from_bytes(answer[:4], "big"):
            chunk = tls.recv(65536)
            if not chunk:
                raise EOFError("kproxy closed the connection")
            answer += chunk
        assert decode_response(answer[4:], 18, 3).body["error_code"] == 0
        return x509.load_der_x509_certificate(der).serial_number


def serial_or_refused(address: str, ctx: ssl.SSLContext) -> int | None:
    """:func:`served_serial`, or None when kproxy refused the connection."""
    try:
        return served_serial(address, ctx)
    except (ssl.SSLError, OSError, EOFError):
        return None


def refused(address: str, ctx: ssl.SSLContext) -> bool:
    return serial_or_refused(address, ctx) is None


def expiry_series(metrics: str) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {(s.labels["side"], s.labels["subject"]): s.value for family in text_string_to_metric_families(text)
            if family.name == EXPIRY for s in family.samples}


@dataclass
class Producing:
    """A confluent-kafka producer in a thread of its own, producing one record every 20 ms until
    stopped (or two minutes passed): how many were delivered, and every delivery error."""

    config: dict[str, str]
    topic: str
    delivered: int = 0
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        producer = Producer(self.config)

        def report(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                self.delivered += 1
            else:
                self.errors.append(str(err))

        deadline = time.monotonic() + 120
        while not self.stop.is_set() and time.monotonic() < deadline:
            producer.produce(self.topic, b"record", on_delivery=report)
            producer.poll(0)
            time.sleep(0.02)
        producer.flush(15)

    def goes_on(self) -> None:
        """Wait until at least five more records were delivered."""
        then = self.delivered
        wait_for("the producer to deliver more records", lambda: self.delivered >= then + 5)


@contextmanager
def producing(config: dict[str, str], topic: str) -> Iterator[Producing]:
    work = Producing(config, topic)
    thread = threading.Thread(target=work.run, name="tls-rotation-producer")
    thread.start()
    try:
        yield work
    finally:
        work.stop.set()
        thread.join(30)
    assert not thread.is_alive()


def failures(caplog: pytest.LogCaptureFixture, side: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.getMessage().startswith(f"event=tls_reload_failed side={side} ")]


def reloads(caplog: pytest.LogCaptureFixture, side: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"event=tls_reloaded side={side} ")]


def new_topic(tansu: Broker) -> str:
    topic = f"tls-rotation-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    return topic


def test_listener_certificates_rotate_under_a_producing_client(tansu: Broker, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy")
    old_ca, new_ca = Authority("kproxy-test-ca-1"), Authority("kproxy-test-ca-2")
    first, second, third = (ca.issue(f"kproxy-server-{n}") for n, ca in ((1, old_ca), (2, old_ca), (3, new_ca)))
    old_client, new_client = old_ca.issue("producer-1", client=True), new_ca.issue("producer-2", client=True)
    # The clients trust both CAs from the start: a CA rotation distributes the new CA first.
    trust = tmp_path / "trust.pem"
    trust.write_bytes(old_ca.ca.cert_pem + new_ca.ca.cert_pem)
    (tmp_path / "producer.pem").write_bytes(old_client.cert_pem)
    (tmp_path / "producer.key").write_bytes(old_client.key_pem)
    secret = SecretVolume(tmp_path / "secret")
    secret.publish({"tls.crt": first.cert_pem, "tls.key": first.key_pem, "ca.crt": old_ca.ca.cert_pem})
    metrics = f"127.0.0.1:{free_port()}"
    topic = new_topic(tansu)
    with running_proxy(tansu.bootstrap, tls__client__cert=str(secret.path("tls.crt")),
                       tls__client__key=str(secret.path("tls.key")), tls__client__client_ca=str(secret.path("ca.crt")),
                       tls__client__require_client_cert=True, metrics_listen=metrics) as front:
        with_old = client_context(trust, old_client, tmp_path)
        with_new = client_context(trust, new_client, tmp_path)
        assert served_serial(front.bootstrap, with_old) == first.serial
        assert expiry_series(metrics) == {("listener", first.subject): first.not_after,
                                          ("listener", old_ca.ca.subject): old_ca.ca.not_after}
        config = {"bootstrap.servers": front.bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(trust),
                  "ssl.certificate.location": str(tmp_path / "producer.pem"),
                  "ssl.key.location": str(tmp_path / "producer.key"), "linger.ms": "0"}
        with producing(config, topic) as producer:
            producer.goes_on()

            # A renewed certificate of the same CA: new handshakes get it.
            secret.publish({"tls.crt": second.cert_pem, "tls.key": second.key_pem, "ca.crt": old_ca.ca.cert_pem})
            wait_for("the renewed certificate", lambda: served_serial(front.bootstrap, with_old) == second.serial)
            producer.goes_on()

            # Rotations that do not load keep the certificate in force, each problem said once.
            expired = old_ca.issue("kproxy-server-expired", not_before=NOW - 10 * DAY, not_after=NOW - DAY)
            bad = [("key", {"tls.crt": second.cert_pem, "tls.key": first.key_pem}),
                   ("key", {"tls.crt": second.cert_pem, "tls.key": first.key_pem}),  # the same again: no new line
                   ("expired", {"tls.crt": expired.cert_pem, "tls.key": expired.key_pem}),
                   ("no certificate", {"tls.crt": b"not a certificate\n", "tls.key": second.key_pem})]
            lines = 0
            for n, (what, files) in enumerate(bad):
                secret.publish({**files, "ca.crt": old_ca.ca.cert_pem})
                if n != 1:
                    lines += 1
                    wait_for(f"the failed reload ({what})", lambda n=lines: len(failures(caplog, "listener")) == n)
                else:
                    time.sleep(1.5)  # three polls
                assert served_serial(front.bootstrap, with_old) == second.serial
            said = failures(caplog, "listener")
            assert len(said) == 3, said
            assert "KEY_VALUES_MISMATCH" in said[0] or "key values mismatch" in said[0].lower(), said[0]
            assert "expired at" in said[1] and "kproxy-server-expired" in said[1], said[1]
            assert "no PEM certificate" in said[2] or "cannot load" in said[2], said[2]
            assert all("action=kept_previous" in line for line in said)
            producer.goes_on()

            # A CA rotation: a certificate of the new CA, both CAs trusted for clients meanwhile...
            secret.publish({"tls.crt": third.cert_pem, "tls.key": third.key_pem,
                            "ca.crt": old_ca.ca.cert_pem + new_ca.ca.cert_pem})
            wait_for("the new CA's certificate", lambda: serial_or_refused(front.bootstrap, with_new) == third.serial)
            assert served_serial(front.bootstrap, with_old) == third.serial
            producer.goes_on()
            # ...then the old CA dropped: a new connection with its client certificate is refused.
            secret.publish({"tls.crt": third.cert_pem, "tls.key": third.key_pem, "ca.crt": new_ca.ca.cert_pem})
            wait_for("the old CA's clients refused", lambda: refused(front.bootstrap, with_old))
            assert served_serial(front.bootstrap, with_new) == third.serial
            # The producer's connections, opened with the old CA's certificate, still carry its records.
            producer.goes_on()
            producer.goes_on()
        assert producer.errors == []
        assert wait_for("the expiry series to follow", lambda: expiry_series(metrics) == {
            ("listener", third.subject): third.not_after, ("listener", new_ca.ca.subject): new_ca.ca.not_after})
    said = reloads(caplog, "listener")
    assert len(said) == 3, said  # the renewal, the new CA's certificate with both CAs, the old CA gone
    assert said[0].endswith(f"serial={second.serial:x} not_after="
                               f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(second.not_after))}")


def answered_through(address: str) -> bool:
    """Whether a new plaintext connection through kproxy gets an answer: kproxy opens a new
    upstream connection for it, whose handshake must succeed."""
    try:
        with RawKafka(address, "tls-rotation-probe") as client:
            return bool(client.request(18, 3, default_body(18, 3, Direction.REQUEST))["error_code"] == 0)
    except (OSError, EOFError):
        return False


def test_upstream_ca_and_client_certificate_rotate_under_a_producing_client(
        tansu: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """kproxy A (plaintext in, TLS out, its files rotated) -> kproxy B (TLS in, a real TLS server that
    asks for client certificates) -> Tansu. B moves to a certificate of a new CA: A's new upstream
    connections fail until A's CA file is rotated too, with its own client certificate."""
    caplog.set_level(logging.INFO, logger="kproxy")
    old_ca, new_ca = Authority("kproxy-test-ca-1"), Authority("kproxy-test-ca-2")
    broker_old, broker_new = old_ca.issue("broker-1"), new_ca.issue("broker-2")
    client_old, client_new = old_ca.issue("kproxy-a-1", client=True), new_ca.issue("kproxy-a-2", client=True)
    back = SecretVolume(tmp_path / "b")
    back.publish({"tls.crt": broker_old.cert_pem, "tls.key": broker_old.key_pem,
                  "ca.crt": old_ca.ca.cert_pem + new_ca.ca.cert_pem})
    front_files = SecretVolume(tmp_path / "a")
    front_files.publish({"ca.crt": old_ca.ca.cert_pem, "tls.crt": client_old.cert_pem, "tls.key": client_old.key_pem})
    metrics = f"127.0.0.1:{free_port()}"
    topic = new_topic(tansu)
    with running_proxy(tansu.bootstrap, tls__client__cert=str(back.path("tls.crt")),
                       tls__client__key=str(back.path("tls.key")), tls__client__client_ca=str(back.path("ca.crt")),
                       tls__client__require_client_cert=True) as b, \
            running_proxy(b.bootstrap, tls__upstream__enabled=True, tls__upstream__ca=str(front_files.path("ca.crt")),
                          tls__upstream__cert=str(front_files.path("tls.crt")),
                          tls__upstream__key=str(front_files.path("tls.key")),
                          tls__upstream__server_name="localhost", metrics_listen=metrics) as a:
        assert answered_through(a.bootstrap)
        assert expiry_series(metrics) == {("upstream", old_ca.ca.subject): old_ca.ca.not_after,
                                          ("upstream", client_old.subject): client_old.not_after}
        with producing({"bootstrap.servers": a.bootstrap, "linger.ms": "0"}, topic) as producer:
            producer.goes_on()
            # The broker side moves to the new CA: A, trusting the old one only, refuses it on new connections.
            back.publish({"tls.crt": broker_new.cert_pem, "tls.key": broker_new.key_pem,
                          "ca.crt": old_ca.ca.cert_pem + new_ca.ca.cert_pem})
            wait_for("A to refuse the new CA's broker", lambda: not answered_through(a.bootstrap))
            producer.goes_on()
            # A's rotation: the new CA, and a client certificate of its own from it.
            front_files.publish({"ca.crt": new_ca.ca.cert_pem, "tls.crt": client_new.cert_pem,
                                 "tls.key": client_new.key_pem})
            wait_for("A to trust the new CA", lambda: answered_through(a.bootstrap))
            # B drops the old CA: A's new connections present the new client certificate, so still answered.
            back.publish({"tls.crt": broker_new.cert_pem, "tls.key": broker_new.key_pem, "ca.crt": new_ca.ca.cert_pem})
            wait_for("B's CA rotation", lambda: len(reloads(caplog, "listener")) == 2)
            assert answered_through(a.bootstrap)
            producer.goes_on()
        assert producer.errors == []
        assert expiry_series(metrics) == {("upstream", new_ca.ca.subject): new_ca.ca.not_after,
                                          ("upstream", client_new.subject): client_new.not_after}
    assert failures(caplog, "upstream") == []
    assert len(reloads(caplog, "upstream")) == 1
