"""Faults that end with their rule, met by real clients (librdkafka and kafkajs) through kproxy in
front of the real broker.

A black hole lasts while its rule does: when the rule's time window ends, or the rule is reloaded
away or deleted through the admin API, requests read from then on flow again, as over a healed
partition; those it swallowed stay unanswered, and their client times them out. The clients here
keep producing before, in and after the hole, on the connection that met it:

* kafkajs times a request out at its ``requestTimeout`` and sends it again on the same connection
  (it never closes it): every record, those the hole swallowed too, is acknowledged within 5 s of
  the rule's end.
* librdkafka times a request in flight out only at ``socket.timeout.ms`` (then it closes the
  connection and sends again on a new one): every record sent after the rule's end is acknowledged
  within 5 s of it, and the swallowed ones once that timeout (12 s here) has passed.

Before kproxy healed a black hole, neither recovered on the connection: kafkajs never, librdkafka
only at ``socket.timeout.ms``. Every record is then read back from the broker itself.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from kproxy.admin.api_client import AdminClient
from kproxy.protocol.frame_builder import request_frame
from kproxy.testing import Broker, ProxyThread, running_proxy
from tests.support.delivered import Outcome, read_back
from tests.support.e2e import create_topic, unique
from tests.support.kafkajs import run_node

HEAL_WITHIN_S = 5.0  # every record acknowledged this long after the rule ended, at the latest
HOLE_AFTER_S = 2.0  # the hole opens this long after the rules are loaded (the client is producing by then)
HOLE_FOR_S = 3.0
SEND_FOR_S = 7.0  # the clients send one record every INTERVAL_S for this long: before, in and after the hole
INTERVAL_S = 0.05
REQUEST_TIMEOUT_MS = 1500
METADATA = 3
SOCKET_TIMEOUT_MS = 12000  # librdkafka's timeout of a request in flight: well above HEAL_WITHIN_S, so not what heals


# -- the clients -----------------------------------------------------------------------------
def produce_librdkafka(bootstrap: str, topic: str, during: Callable[[float], None]) -> list[Outcome]:
    """One record every INTERVAL_S for SEND_FOR_S (no idempotence: retries go on the connection
    they were sent on), ``during(elapsed)`` called between sends; each record's outcome."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False,
                         "linger.ms": 0, "request.timeout.ms": REQUEST_TIMEOUT_MS, "retry.backoff.ms": 100,
                         "socket.timeout.ms": SOCKET_TIMEOUT_MS, "message.timeout.ms": 60000})
    outcomes: list[Outcome] = []
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < SEND_FOR_S:
        outcome: Outcome = {"i": i, "sent": time.time() * 1000, "acked": None, "error": None}
        outcomes.append(outcome)

        def report(err: Any, _msg: Any, outcome: Outcome = outcome) -> None:
            if err is None:
                outcome["acked"] = time.time() * 1000
            else:
                outcome["error"] = str(err)

        producer.produce(topic, value=f"v{i}".encode(), on_delivery=report)
        i += 1
        next_send = started + i * INTERVAL_S
        while (now := time.monotonic()) < next_send:
            producer.poll(next_send - now)
        during(time.monotonic() - started)
    producer.flush(SOCKET_TIMEOUT_MS / 1000 + HEAL_WITHIN_S)
    return outcomes


def produce_kafkajs(bootstrap: str, topic: str, during: Callable[[float], None]) -> list[Outcome]:
    """As :func:`produce_librdkafka`, by kafkajs in a Node process (``during`` runs beside it)."""
    import threading

    result: list[list[Outcome]] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(run_node("produce.js", {
                "brokers": [bootstrap], "topic": topic, "seconds": SEND_FOR_S, "interval_ms": INTERVAL_S * 1000,
                "wait_s": HOLE_FOR_S + HEAL_WITHIN_S + 5, "request_timeout_ms": REQUEST_TIMEOUT_MS}, timeout=90))
        except BaseException as exc:  # re-raised on the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    while thread.is_alive():
        thread.join(0.05)
        during(time.monotonic() - started)
    if failure:
        raise failure[0]
    return result[0]


CLIENTS = {"librdkafka": produce_librdkafka, "kafkajs": produce_kafkajs}


# -- the hole and how its rule ends ----------------------------------------------------------
def hole(topic: str, schedule: str) -> str:
    return f"""rules:
  - id: hole
    match: {{api: produce, topic: "{topic}", schedule: {{{schedule}}}}}
    actions:
      - blackhole
"""


class Ending:
    """How the test ends the rule (``schedule``: its window does; ``reload``: the file loses it;
    ``delete``: the admin API deletes it), and when it ended (epoch seconds)."""

    def __init__(self, how: str, proxy: ProxyThread, path: Path) -> None:
        self.how = how
        self.proxy = proxy
        self.path = path
        self.ended_at: float | None = None
        server = proxy.server
        assert server is not None
        self.live = server.rules
        self.loaded = time.time()  # an upper bound of the rule set's load time: the proxy is up
        if how == "schedule":
            self.ended_at = self.loaded + HOLE_AFTER_S + HOLE_FOR_S

    def during(self, elapsed: float) -> None:
        """Called as the client runs: end the rule once its HOLE_FOR_S are over."""
        if self.ended_at is not None or time.time() < self.loaded + HOLE_AFTER_S + HOLE_FOR_S:
            return
        generation = self.live.generation
        if self.how == "delete":
            assert self.proxy.server is not None and self.proxy.server.admin_server is not None
            AdminClient(f"http://127.0.0.1:{self.proxy.server.admin_server.port}").delete("hole")
        else:
            self.path.write_text("rules: []\n")
        deadline = time.monotonic() + 5
        while self.live.generation == generation:  # in force once the generation moves
            assert time.monotonic() < deadline, "the rule change never went in force"
            time.sleep(0.01)
        self.ended_at = time.time()


@pytest.fixture
def healing(tansu: Broker, tmp_path: Path) -> Iterator[Callable[[str], tuple[Ending, str]]]:
    """``healing(how)``: (the rule's ending, topic) with kproxy in front of Tansu running a
    black hole on the topic's Produce requests from HOLE_AFTER_S after loading."""
    opened: list[Any] = []

    def start(how: str) -> tuple[Ending, str]:
        topic = unique("heal")
        create_topic(tansu.bootstrap, topic, 1)
        path = tmp_path / "rules.yaml"
        window = f"after_seconds: {HOLE_AFTER_S}" + (f", for_seconds: {HOLE_FOR_S}" if how == "schedule" else "")
        path.write_text(hole(topic, window))
        options: dict[str, Any] = {"rules": str(path)}
        if how == "delete":
            options["admin__listen"] = "127.0.0.1:0"
        cm = running_proxy(tansu.bootstrap, **options)
        opened.append(cm)
        return Ending(how, cm.__enter__(), path), topic

    yield start
    for cm in reversed(opened):
        cm.__exit__(None, None, None)


def _after(ms: float | None, ended_at: float) -> str:
    return "never" if ms is None else f"{ms / 1000 - ended_at:.1f} s after it"


@pytest.mark.parametrize("client", sorted(CLIENTS))
@pytest.mark.parametrize("how", ["schedule", "reload", "delete"])
def test_after_a_black_hole_rule_ends_the_client_delivers_everything_within_5_s(
        healing: Callable[[str], tuple[Ending, str]], tansu: Broker, client: str, how: str) -> None:
    ending, topic = healing(how)
    outcomes = CLIENTS[client](ending.proxy.bootstrap, topic, ending.during)
    assert ending.ended_at is not None
    in_hole = [o for o in outcomes if ending.loaded + HOLE_AFTER_S + 0.5 <= o["sent"] / 1000 < ending.ended_at]
    assert in_hole, "no record was sent while the hole was open"
    # kafkajs sends what the hole swallowed again on the healed connection; librdkafka only after socket.timeout.ms.
    due = outcomes if client == "kafkajs" else [o for o in outcomes if o["sent"] / 1000 >= ending.ended_at]
    assert len(due) >= 20
    late = [o for o in due if o["acked"] is None or o["acked"] / 1000 > ending.ended_at + HEAL_WITHIN_S]
    assert not late, (f"{len(late)} of {len(due)} records not acknowledged within {HEAL_WITHIN_S} s of the "
                      f"rule's end; the first sent {late[0]['sent'] / 1000 - ending.ended_at:.1f} s after it, "
                      f"acknowledged {_after(late[0]['acked'], ending.ended_at)}, error {late[0]['error']}")
    unacked = [o for o in outcomes if o["acked"] is None]
    assert not unacked, f"{len(unacked)} records never acknowledged, the first: {unacked[0]}"
    written = read_back(tansu.bootstrap, topic, 1)
    missing = {f"v{o['i']}".encode() for o in outcomes} - set(written)
    assert not missing, f"{len(missing)} acknowledged records are not on the broker"


# -- slow_close: Toxiproxy's meaning -----------------------------------------------------------
def test_slow_close_passes_traffic_and_delays_the_close_as_toxiproxy_does(tansu: Broker, tmp_path: Path) -> None:
    topic = unique("slow-close")
    create_topic(tansu.bootstrap, topic, 1)
    path = tmp_path / "rules.yaml"
    path.write_text("""rules:
  - id: slow
    match: {api: [metadata, produce]}
    actions:
      - slow_close: {delay_ms: 1500}
""")
    with running_proxy(tansu.bootstrap, rules=str(path)) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "linger.ms": 5,
                             "message.timeout.ms": 10000})
        acked: list[bytes] = []
        for i in range(100):
            producer.produce(topic, value=f"s{i}".encode(),
                             on_delivery=lambda err, msg: acked.append(msg.value()) if err is None else None)
        started = time.monotonic()
        assert producer.flush(15) == 0
        assert len(acked) == 100 and time.monotonic() - started < 5, "slow_close should let traffic pass"
        # A client that ends its side sees kproxy's end of the connection delay_ms later.
        host, port = proxy.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(request_frame(METADATA, 9, 1, client_id="slow", topics=[], allow_auto_topic_creation=False))
            assert sock.recv(4), "the request should be answered"
            sock.shutdown(socket.SHUT_WR)
            ended = time.monotonic()
            while sock.recv(65536):
                pass
            waited = time.monotonic() - ended
        assert 1.4 <= waited < 5, f"the close came {waited:.2f} s after the client's"
    assert set(read_back(tansu.bootstrap, topic, 1)) >= set(acked)


# -- toxicity: Toxiproxy's per-connection draw ---------------------------------------------------
def _latencies(bootstrap: str, topic: str, client_id: str, records: int) -> list[float]:
    """Each record's delivery latency for one librdkafka producer (one connection to the broker),
    sending the next once the last is acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all", "linger.ms": 0,
                         "message.timeout.ms": 20000})
    out: list[float] = []
    for i in range(records):
        started = time.monotonic()
        producer.produce(topic, value=f"{client_id}-{i}".encode())
        assert producer.flush(15) == 0
        out.append(time.monotonic() - started)
    return out


@pytest.mark.parametrize("key", ["toxicity", "probability"])
def test_toxicity_picks_whole_connections_where_probability_picks_requests(
        tansu: Broker, tmp_path: Path, key: str) -> None:
    import threading

    topic = unique("toxicity")
    create_topic(tansu.bootstrap, topic, 1)
    path = tmp_path / "rules.yaml"
    path.write_text(f"""seed: 5
rules:
  - id: slow-some
    match: {{api: produce, {key}: 0.5}}
    actions:
      - delay: {{ms: 600}}
""")
    producers, records = 12, 6
    got: dict[int, list[float]] = {}
    with running_proxy(tansu.bootstrap, rules=str(path)) as proxy:
        threads = [threading.Thread(target=lambda n=n: got.__setitem__(n, _latencies(
            proxy.bootstrap, topic, f"tox-{key}-{n}", records)), daemon=True) for n in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(got) == producers
    slow = {n: sum(s >= 0.5 for s in lat) for n, lat in got.items()}
    mixed = [n for n, k in slow.items() if 0 < k < records]
    if key == "toxicity":  # each connection is drawn once: all its records held, or none
        assert not mixed, f"producers with some records held and some not: {[got[n] for n in mixed]}"
        assert 0 < sum(k == records for k in slow.values()) < producers
    else:  # drawn per request: most connections meet it on some requests and not others
        assert len(mixed) >= producers // 2, f"only {len(mixed)} of {producers} producers mixed"
