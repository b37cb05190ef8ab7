"""Rules reloaded under live traffic: the real broker (Tansu), a real client (librdkafka), kproxy run.

What a user of ``kproxy run --rules`` relies on: a rules file rewritten (or a ConfigMap flipped)
while a producer streams takes effect within a second and stops as fast when removed; no
connection is dropped and no message lost or doubled; a broken file changes nothing but a log
line and a counter; SIGHUP reloads and never kills the process.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient

from kproxy.testing import Broker, ProxyThread, free_port, running_proxy, wait_for_port
from tests.support.e2e import consume_confluent, create_topic, unique
from tests.support.rules_reload import ConfigMapVolume
from tests.test_e2e_clients import messages, same_records

KPROXY = [sys.executable, "-m", "kproxy"]
PARTITIONS = 2


def inject(rule_id: str, topic: str, error: str) -> str:
    return f"""rules:
  - id: {rule_id}
    match: {{api: produce, topic: "{topic}"}}
    actions:
      - inject_error: {{error: {error}}}
"""


NO_RULES = "rules: []\n"


def on_server(proxy: ProxyThread, read: Callable[[Any], Any]) -> Any:
    """``read(server)`` on kproxy's own trio thread."""
    return proxy.call(lambda: read(proxy.server))


def hits(proxy: ProxyThread, rule_id: str) -> int:
    return int(on_server(proxy, lambda s: sum(n for (r, _, _), n in s.stats.faults.hits.items() if r == rule_id)))


class Stream:
    """An idempotent producer sending one message every few milliseconds, counting deliveries."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                  "linger.ms": 2, "message.timeout.ms": 60000})
        self.sent: list[tuple[bytes | None, bytes | None]] = []
        self.delivered = 0
        self.errors: list[KafkaError] = []
        self._pool = iter(messages(unique("m"), 100_000, size=64))

    def _report(self, err: KafkaError | None, _msg: Any) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.errors.append(err)

    def run_until(self, done: Callable[[], bool], within: float) -> float:
        """Keep producing until ``done()``; seconds it took (fails after ``within``)."""
        started = time.monotonic()
        while not done():
            assert time.monotonic() - started < within, f"not within {within} s"
            key, value = next(self._pool)
            self.producer.produce(self.topic, key=key, value=value, on_delivery=self._report)
            self.sent.append((key, value))
            self.producer.poll(0.005)
        return time.monotonic() - started

    def run_for(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        self.run_until(lambda: time.monotonic() >= until, seconds + 1)

    def finish(self) -> None:
        assert self.producer.flush(60) == 0, "messages still undelivered after 60 s"
        assert not self.errors, f"delivery errors: {self.errors[:5]}"
        assert self.delivered == len(self.sent)


def closed_connections(caplog: pytest.LogCaptureFixture) -> int:
    return sum(1 for r in caplog.records if "event=connection_closed" in r.getMessage())


def test_a_rule_written_mid_stream_applies_within_a_second_and_stops_when_removed_losing_nothing(
        tansu: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kproxy")
    topic = unique("reload")
    path = tmp_path / "rules.yaml"
    path.write_text(NO_RULES)  # empty at start: connections opened now must see the rule later
    with running_proxy(tansu.bootstrap, rules=str(path)) as proxy:
        create_topic(proxy.bootstrap, topic, PARTITIONS)
        stream = Stream(proxy.bootstrap, topic)
        stream.run_until(lambda: stream.delivered >= 50, within=20)  # connected, metadata known, flowing
        closed = closed_connections(caplog)
        accepted = on_server(proxy, lambda s: s.connections_total)

        path.write_text(inject("leader-storm", topic, "NOT_LEADER_OR_FOLLOWER"))  # in place, as an editor would
        took_on = stream.run_until(lambda: hits(proxy, "leader-storm") > 0, within=5)
        stream.run_for(1.0)  # the storm rages: every Produce to the topic fails (retriable) meanwhile
        during = stream.delivered
        storm = hits(proxy, "leader-storm")

        path.write_text(NO_RULES)
        took_off = stream.run_until(lambda: on_server(proxy, lambda s: s.rules.generation) == 3, within=5)
        assert hits(proxy, "leader-storm") == 0, "the removed rule's series went with it"
        stream.run_for(1.5)
        assert hits(proxy, "leader-storm") == 0, "the removed rule still injected errors"
        stream.finish()

        assert took_on < 1.0 and took_off < 1.0, f"applied after {took_on:.2f} s, removed after {took_off:.2f} s"
        assert storm > 0 and stream.delivered > during
        assert closed_connections(caplog) == closed, "a connection was closed during the reloads"
        assert on_server(proxy, lambda s: s.connections_total) == accepted, "the client had to reconnect"
        assert on_server(proxy, lambda s: s.stats.faults.reloads) == {"success": 2, "failure": 0}
        same_records(consume_confluent(proxy.bootstrap, topic, PARTITIONS, len(stream.sent)), stream.sent)
    print(f"rule applied {took_on * 1000:.0f} ms after the write, removed {took_off * 1000:.0f} ms after; "
          f"{len(stream.sent)} messages, {storm} Produce requests failed on purpose")


# POLICY_VIOLATION fails the message and nothing more; librdkafka would remember an authorization
# error for the topic and refuse later messages itself, whatever kproxy does by then.
def produce_one(producer: Producer, topic: str) -> KafkaError | None:
    errors: list[KafkaError | None] = []
    producer.produce(topic, value=b"x", on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(15) == 0
    return errors[0]


def test_a_broken_file_keeps_the_rules_in_force_and_a_fixed_one_applies(
        tansu: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "kproxy.rules")
    topic = unique("reload-broken")
    path = tmp_path / "rules.yaml"
    path.write_text(inject("deny", topic, "POLICY_VIOLATION"))
    with running_proxy(tansu.bootstrap, rules=str(path)) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 10000})
        assert produce_one(producer, topic).code() == KafkaError.POLICY_VIOLATION  # type: ignore[union-attr]

        path.write_text(inject("deny", topic, "POLICY_VIOLATON"))
        deadline = time.monotonic() + 5
        while on_server(proxy, lambda s: s.stats.faults.reloads["failure"]) == 0:
            assert time.monotonic() < deadline, "the broken file was not noticed"
            time.sleep(0.05)
        line = next(r.getMessage() for r in caplog.records if "event=rules_reload_failed" in r.getMessage())
        assert f"{path}:5: rules[0].actions[0].inject_error.error: unknown Kafka error" in line
        assert on_server(proxy, lambda s: s.rules.generation) == 1
        assert produce_one(producer, topic).code() == KafkaError.POLICY_VIOLATION  # type: ignore[union-attr]

        path.write_text(NO_RULES)
        deadline = time.monotonic() + 5
        while on_server(proxy, lambda s: s.rules.generation) != 2:
            assert time.monotonic() < deadline, "the fixed file was not loaded"
            time.sleep(0.05)
        assert produce_one(producer, topic) is None


def test_a_configmap_flip_applies_to_open_connections(tansu: Broker, tmp_path: Path) -> None:
    topic = unique("reload-configmap")
    volume = ConfigMapVolume(tmp_path)
    volume.publish({"rules.yaml": NO_RULES})
    with running_proxy(tansu.bootstrap, rules=str(tmp_path)) as proxy:
        create_topic(proxy.bootstrap, topic, 1)
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 10000})
        assert produce_one(producer, topic) is None
        volume.publish({"rules.yaml": NO_RULES, "deny.yaml": inject("deny", topic, "POLICY_VIOLATION")})
        started = time.monotonic()
        while on_server(proxy, lambda s: s.rules.generation) != 2:
            assert time.monotonic() - started < 1.0, "the flip was not applied within a second"
            time.sleep(0.02)
        assert produce_one(producer, topic).code() == KafkaError.POLICY_VIOLATION  # type: ignore[union-attr]
        volume.publish({"rules.yaml": NO_RULES})
        started = time.monotonic()
        while on_server(proxy, lambda s: s.rules.generation) != 3:
            assert time.monotonic() - started < 1.0, "the flip back was not applied within a second"
            time.sleep(0.02)
        assert produce_one(producer, topic) is None


# -- kproxy run, a real process ----------------------------------------------------------------------
class KproxyProcess:
    def __init__(self, tansu: Broker, tmp_path: Path, *extra: str) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        self.log = tmp_path / "kproxy.log"
        argv = [*KPROXY, "run", "--upstream", tansu.bootstrap, "--listen", f"127.0.0.1:{self.port}",
                "--broker-port-base", "0", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
                "--shutdown-grace", "5", *extra]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        wait_for_port("127.0.0.1", self.port)
        wait_for_port("127.0.0.1", self.metrics_port)

    def serves(self) -> bool:
        md = AdminClient({"bootstrap.servers": f"127.0.0.1:{self.port}"}).list_topics(timeout=15)
        return bool(md.brokers)

    def metric(self, line_start: str) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            text = resp.read().decode()
        return next(line for line in text.splitlines() if line.startswith(line_start))

    def wait_for_log(self, fragment: str, count: int = 1, within: float = 5.0) -> None:
        deadline = time.monotonic() + within
        while self.log.read_text().count(fragment) < count:
            assert self.proc.poll() is None, f"kproxy exited ({self.proc.returncode}):\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"no {fragment!r} in the log:\n{self.log.read_text()}"
            time.sleep(0.05)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def test_sighup_reloads_the_rules_and_the_process_keeps_serving(tansu: Broker, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(inject("deny", "some-topic", "TOPIC_AUTHORIZATION_FAILED"))
    kproxy = KproxyProcess(tansu, tmp_path, "--rules", str(rules))
    try:
        assert kproxy.serves()
        assert kproxy.metric("kproxy_rules_generation ") == "kproxy_rules_generation 1.0"
        kproxy.proc.send_signal(signal.SIGHUP)
        kproxy.wait_for_log("event=rules_reloaded generation=2")
        assert kproxy.proc.poll() is None and kproxy.serves()
        rules.write_text("rules: [\n")  # broken: the change is refused, and so is a SIGHUP after it
        kproxy.wait_for_log("event=rules_reload_failed")
        kproxy.proc.send_signal(signal.SIGHUP)
        kproxy.wait_for_log("event=rules_reload_failed", count=2)
        assert kproxy.serves()
        assert kproxy.metric('kproxy_rules_reloads_total{result="success"}').endswith(" 1.0")
        assert kproxy.metric('kproxy_rules_reloads_total{result="failure"}').endswith(" 2.0")
        assert kproxy.metric("kproxy_rules_generation ") == "kproxy_rules_generation 2.0"
        assert kproxy.terminate() == 0
    finally:
        kproxy.kill()
    text = kproxy.log.read_text()
    assert "event=signal signal=SIGHUP action=reload_rules" in text
    assert [line.split("trigger=")[1].split()[0] for line in text.splitlines() if "event=rules_reload" in line] == [
        "sighup", "change", "sighup"]
    assert "event=stopped" in text and "Traceback" not in text


def test_sighup_without_a_rules_file_is_logged_and_harmless(tansu: Broker, tmp_path: Path) -> None:
    kproxy = KproxyProcess(tansu, tmp_path)
    try:
        assert kproxy.serves()
        kproxy.proc.send_signal(signal.SIGHUP)
        kproxy.wait_for_log("event=signal signal=SIGHUP action=none")
        assert kproxy.serves()
        kproxy.proc.send_signal(signal.SIGTERM)
        kproxy.proc.send_signal(signal.SIGHUP)  # during the drain, or on the way out: harmless too
        assert kproxy.proc.wait(timeout=15) == 0
    finally:
        kproxy.kill()
    assert 'reason="no rules file configured (--rules)"' in kproxy.log.read_text()
