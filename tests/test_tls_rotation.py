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
import os
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

from kproxy.config import ClientTls, ConfigError
from kproxy.protocol import MessageType, RequestHeader, decode_response, default_body, encode_request, frame
from kproxy.protocol.headers import request_header_version
from kproxy.server.tls import client_side_context, client_side_material
from kproxy.server.tls_reload import LiveTls
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
        tls.sendall(frame(encode_request(header, default_body(18, 3, MessageType.REQUEST))))
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
            return bool(client.request(18, 3, default_body(18, 3, MessageType.REQUEST))["error_code"] == 0)
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


# -- the pieces, without a broker -------------------------------------------------------------------
def test_a_fifo_in_a_certificates_place_is_refused_at_once(tmp_path: Path) -> None:
    """OpenSSL opens the files itself: a FIFO there would hold the loader (at start, or a reload's
    worker thread) until a writer came. It is refused, naming the option and the file."""
    issued = Authority("kproxy-test-ca").issue("kproxy-server")
    key = tmp_path / "tls.key"
    key.write_bytes(issued.key_pem)
    fifo = tmp_path / "tls.crt"
    os.mkfifo(fifo)
    outcome: list[Exception | None] = []

    def load() -> None:
        try:
            client_side_context(ClientTls(cert=fifo, key=key))
        except Exception as exc:  # handed to the test's thread
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():  # let the stuck loader go before failing
        with open(fifo, "wb"):
            pass
        thread.join(5)
        pytest.fail("loading a FIFO as a certificate blocked")
    assert isinstance(outcome[0], ConfigError)
    assert str(outcome[0]) == f"tls.client.cert/key: cannot load {fifo}: not a regular file (a FIFO)"


def test_a_ca_file_is_refused_only_when_every_certificate_has_expired(tmp_path: Path) -> None:
    """A CA rotation's overlap (an expired CA beside a valid one) loads; a file of expired CAs only
    would refuse every peer, and is refused at a reload (at start it loads, as before)."""
    old, new = Authority("kproxy-ca-old", days=1), Authority("kproxy-ca-new")
    issued = new.issue("kproxy-server")
    files = {"cert": tmp_path / "tls.crt", "key": tmp_path / "tls.key", "ca": tmp_path / "ca.crt"}
    files["cert"].write_bytes(issued.cert_pem)
    files["key"].write_bytes(issued.key_pem)
    tls = ClientTls(cert=files["cert"], key=files["key"], client_ca=files["ca"])
    two_days_on = time.time() + 2 * 86400  # the old CA has expired then, the new one has not
    files["ca"].write_bytes(old.ca.cert_pem + new.ca.cert_pem)
    material = client_side_material(tls, refuse_expired_at=two_days_on)
    assert material is not None and [c.subject for c in material.trusted] == [old.ca.subject, new.ca.subject]
    files["ca"].write_bytes(old.ca.cert_pem)
    with pytest.raises(ConfigError, match=r"tls.client.client_ca: .*ca.crt: every certificate has expired"):
        client_side_material(tls, refuse_expired_at=two_days_on)
    assert client_side_material(tls) is not None  # at start: loaded whatever the dates


def test_of_two_certificates_with_one_subject_the_metric_shows_the_first_to_expire(tmp_path: Path) -> None:
    """A CA renewed under its own name sits beside the old one in a bundle: one series per subject
    (two would clash), with the expiry an alert must see."""
    ca = Authority("kproxy-ca")
    renewed = Authority("kproxy-ca", days=730)
    issued = ca.issue("kproxy-server")
    (tmp_path / "tls.crt").write_bytes(issued.cert_pem)
    (tmp_path / "tls.key").write_bytes(issued.key_pem)
    (tmp_path / "ca.crt").write_bytes(renewed.ca.cert_pem + ca.ca.cert_pem)
    side = LiveTls.listener(ClientTls(cert=tmp_path / "tls.crt", key=tmp_path / "tls.key",
                                      client_ca=tmp_path / "ca.crt"))
    assert side is not None
    validity = side.validity()
    assert validity[ca.ca.subject] == (ca.ca.cert.not_valid_before_utc.timestamp(), ca.ca.not_after)
    assert validity[issued.subject][1] == issued.not_after
    assert len(validity) == 2


def test_an_expired_certificate_at_start_is_served_and_said_once(tansu: Broker, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kproxy")
    ca = Authority("kproxy-ca")
    expired = ca.issue("kproxy-server-expired", not_before=NOW - 10 * DAY, not_after=NOW - DAY)
    (tmp_path / "tls.crt").write_bytes(expired.cert_pem)
    (tmp_path / "tls.key").write_bytes(expired.key_pem)
    with running_proxy(tansu.bootstrap, tls__client__cert=str(tmp_path / "tls.crt"),
                       tls__client__key=str(tmp_path / "tls.key")):
        pass
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("event=tls_certificate_expired")]
    assert said == [f'event=tls_certificate_expired side=listener subject="{expired.subject}"']
