"""Soak: a bounded run of mixed real-client traffic through a kproxy process.

For ``KPROXY_SOAK_SECONDS`` (default 60; raise it for long runs) through one kproxy
process in front of the real Tansu broker:

* two confluent-kafka producers with idempotence (acks=all) write keyed records;
* a confluent-kafka consumer group reads the topic as it is written;
* kafka-python's admin client lists topics, describes the cluster and lists groups;
* a raw-socket client pipelines ApiVersions, Metadata and ListOffsets requests and
  checks that every answer is the one to its own request, in order.

Then: every produce the broker acknowledged is consumed back at the partition and
offset the broker reported, once; no answer reached the wrong request; kproxy's RSS
(/proc/<pid>/status) in the last third of the run is not above the first third's.

Rules: the rules engine does not exist yet. ``KPROXY_SOAK_ARGS`` is appended to the
kproxy command line; once ``--rules`` is accepted, a soak with random faults is
``KPROXY_SOAK_ARGS='--rules rules/soak.yaml'``. The checks above are the ones that
must still hold then: producers retry retriable errors, idempotence forbids duplicates.
"""

from __future__ import annotations

import os
import shlex
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from kafka.admin import KafkaAdminClient

from kproxy.protocol import decode_response
from kproxy.protocol.frame_builder import request_frame
from kproxy.testing import Broker, free_port, stop_process, wait_for_port
from tests.support.e2e import create_topic, unique
from tests.support.resilience import recv_frame, vm_rss_kb

SECONDS = float(os.environ.get("KPROXY_SOAK_SECONDS", "60"))
EXTRA_ARGS = shlex.split(os.environ.get("KPROXY_SOAK_ARGS", ""))
# The same run with the clients on the broker itself: the baseline to compare a finding with.
DIRECT = os.environ.get("KPROXY_SOAK_DIRECT") == "1"
PARTITIONS = 3
RSS_SLACK_KB = 8 * 1024  # allocator noise and the first full-size buffers of late connections


class Worker(threading.Thread):
    """Runs ``step`` until stopped; any exception is kept for the test to raise."""

    def __init__(self, name: str, step: Callable[[], None], stop: threading.Event) -> None:
        super().__init__(name=name, daemon=True)
        self.step, self.stop, self.error = step, stop, None  # type: ignore[assignment]
        self.error: BaseException | None = None
        self.steps = 0

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.step()
                self.steps += 1
        except BaseException as exc:
            self.error = exc


@dataclass
class SoakResult:
    acked: dict[bytes, tuple[int, int]]
    consumed: dict[tuple[int, int], bytes]  # by the consumer group, during the soak
    read_back: dict[tuple[int, int], bytes]  # the whole log, afterwards, through kproxy
    direct: dict[tuple[int, int], bytes]  # what read_back missed, read from the broker itself
    produce_errors: list[str]
    duplicates: list[tuple[int, int]]
    mismatches: list[str]
    raw_requests: int
    requests: int
    rss: list[int]


@pytest.fixture(scope="module")
def soak(tansu: Broker, tmp_path_factory: pytest.TempPathFactory) -> SoakResult:
    """Run the soak once; the tests below each check one of its promises."""
    port, metrics_port = free_port(), free_port()
    log = (tmp_path_factory.mktemp("soak") / "kproxy.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "kproxy", "run", "--upstream", tansu.bootstrap,
                             "--listen", f"127.0.0.1:{port}", "--broker-port-base", str(free_port() - 111),
                             "--metrics-listen", f"127.0.0.1:{metrics_port}", "--shutdown-grace", "5",
                             "--log-level", "warning", *EXTRA_ARGS], stdout=log, stderr=subprocess.STDOUT)
    stop = threading.Event()
    workers: list[Worker] = []
    try:
        wait_for_port("127.0.0.1", port)
        bootstrap = tansu.bootstrap if DIRECT else f"127.0.0.1:{port}"
        topic, group = unique("soak"), unique("soak-group")
        create_topic(bootstrap, topic, partitions=PARTITIONS)

        acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset) the broker reported
        produce_errors: list[str] = []
        consumed: dict[tuple[int, int], bytes] = {}
        duplicates: list[tuple[int, int]] = []
        mismatches: list[str] = []
        rss: list[int] = []
        raw_requests = [0]

        def producer_step(producer: Producer, tag: str, counter: list[int]) -> Callable[[], None]:
            def on_delivery(err: Any, msg: Any) -> None:
                if err is not None:
                    produce_errors.append(str(err))
                else:
                    acked[msg.value()] = (msg.partition(), msg.offset())

            def step() -> None:
                for _ in range(20):
                    n = counter[0]
                    counter[0] += 1
                    try:
                        producer.produce(topic, key=b"%d" % (n % 17), value=b"%s-%d" % (tag.encode(), n),
                                         on_delivery=on_delivery)
                    except BufferError:
                        break
                producer.poll(0.01)
            return step

        producers = [Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                               "linger.ms": 5, "message.timeout.ms": 60000}) for _ in range(2)]
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                             "enable.auto.commit": True, "session.timeout.ms": 10000})
        consumer.subscribe([topic])

        def consume_step() -> None:
            for msg in consumer.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    continue  # informational events (partition EOF); errors show as missing records
                where = (msg.partition(), msg.offset())
                if where in consumed:
                    duplicates.append(where)
                consumed[where] = msg.value()

        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)

        def admin_step() -> None:
            assert topic in admin.list_topics()
            admin.describe_cluster()
            admin.list_groups()
            admin.describe_topics([topic])
            time.sleep(0.2)

        raw_sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        kinds = [(18, 3, request_frame(18, 3, 0, client_software_name="soak", client_software_version="1")),
                 (3, 12, request_frame(3, 12, 0, topics=[{"name": topic}])),
                 (2, 7, request_frame(2, 7, 0, replica_id=-1, topics=[{"name": topic, "partitions": [
                     {"partition_index": p, "timestamp": -1} for p in range(PARTITIONS)]}]))]

        def raw_step() -> None:
            """Ten pipelined requests of mixed kinds, then their answers: each must be its own."""
            batch = []
            for i in range(10):
                api_key, version, frame = kinds[i % len(kinds)]
                cid = raw_requests[0] = raw_requests[0] + 1
                batch.append((api_key, version, cid))
                raw_sock.sendall(frame[:8] + struct.pack(">i", cid) + frame[12:])
            for api_key, version, cid in batch:
                answer = decode_response(recv_frame(raw_sock), api_key, version)  # decodes as its own kind
                if answer.header.correlation_id != cid:
                    mismatches.append(f"asked {cid} (api {api_key}), got {answer.header.correlation_id}")
            time.sleep(0.05)

        def rss_step() -> None:
            rss.append(vm_rss_kb(proc.pid))
            time.sleep(1)

        counters = [[0], [0]]
        workers = [Worker(f"producer-{i}", producer_step(p, f"p{i}", counters[i]), stop)
                   for i, p in enumerate(producers)]
        workers += [Worker("consumer", consume_step, stop), Worker("admin", admin_step, stop),
                    Worker("raw", raw_step, stop), Worker("rss", rss_step, stop)]
        started = time.monotonic()
        for worker in workers:
            worker.start()
        while time.monotonic() - started < SECONDS and all(w.error is None for w in workers):
            time.sleep(0.5)
            assert proc.poll() is None, "kproxy exited during the soak"
        stop.set()
        for worker in workers:
            worker.join(30)
        for worker in workers:
            if worker.error is not None:
                raise AssertionError(f"{worker.name} failed") from worker.error
        for producer in producers:
            assert producer.flush(60) == 0, "produces still unacknowledged a minute after the soak"
        # Everything acknowledged must come back: keep consuming until it has (bounded).
        wanted = {where: value for value, where in acked.items()}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not wanted.keys() <= consumed.keys():
            consume_step()
        consumer.close()
        # The verdict reads the log back with a fresh consumer (assigned, no group: a rebalance
        # cannot hide anything), through kproxy; and, only if something is missing, from the
        # broker directly, to say which of the two lost it.
        through_kproxy = read_log(bootstrap, topic, set(wanted))
        direct = read_log(tansu.bootstrap, topic, set(wanted) - through_kproxy.keys()) \
            if not wanted.keys() <= through_kproxy.keys() else {}
        admin.close()
        raw_sock.close()

        requests = _requests_total(metrics_port)
        third = max(len(rss) // 3, 1)
        first, last = sum(rss[:third]) / third, sum(rss[-third:]) / third
        print(f"soak: {SECONDS:.0f} s, {len(acked)} produces acknowledged, {len(consumed)} records consumed, "
              f"{raw_requests[0]} pipelined raw requests, {requests} requests through kproxy; "
              f"group short by {len(wanted.keys() - consumed.keys())} records 20 s after the end; "
              f"RSS first third {first:.0f} KiB, last third {last:.0f} KiB, max {max(rss)} KiB")
        return SoakResult(acked, consumed, through_kproxy, direct, produce_errors, duplicates, mismatches,
                          raw_requests[0], requests, rss)
    finally:
        stop.set()
        stop_process(proc, grace=15)
        log.close()


def test_soak_every_acknowledged_produce_is_consumed_where_the_broker_said(soak: SoakResult) -> None:
    assert not soak.produce_errors, f"produce errors: {soak.produce_errors[:5]}"
    assert len(soak.acked) > 100, f"only {len(soak.acked)} produces acknowledged: the soak did not run"
    wanted = {where: value for value, where in soak.acked.items()}
    missing = sorted(w for w in wanted if w not in soak.read_back)
    assert not missing, (f"{len(missing)} acknowledged produces not read back through kproxy, e.g. {missing[:5]}; "
                         f"the broker itself has {len(soak.direct)} of them")
    wrong = [(w, v, soak.read_back[w]) for w, v in wanted.items() if soak.read_back[w] != v]
    assert not wrong, f"records not where the broker said they were written: {wrong[:5]}"
    values = list(soak.read_back.values())
    assert len(values) == len(set(values)), "a record was written twice (idempotence broken)"


def test_soak_the_consumer_group_read_what_it_was_given(soak: SoakResult) -> None:
    """Every record the group consumed is the record at that offset (at-least-once allows a
    re-delivery after a rebalance, never a different record)."""
    assert len(soak.consumed) > 100, "the consumer group consumed almost nothing"
    wrong = [(w, v, soak.read_back.get(w)) for w, v in soak.consumed.items() if soak.read_back.get(w, v) != v]
    assert not wrong, f"the group was handed records that are not at those offsets: {wrong[:5]}"


def test_soak_no_answer_reaches_the_wrong_request(soak: SoakResult) -> None:
    assert soak.raw_requests > 100
    assert not soak.mismatches, f"answers reached the wrong request: {soak.mismatches[:5]}"


def test_soak_memory_is_flat(soak: SoakResult) -> None:
    rss = soak.rss
    assert len(rss) >= 6, "too few RSS samples"
    third = len(rss) // 3
    first, last = sum(rss[:third]) / third, sum(rss[-third:]) / third
    assert last <= first + RSS_SLACK_KB, f"kproxy's RSS grew from {first:.0f} to {last:.0f} KiB: {rss}"


def read_log(bootstrap: str, topic: str, wanted: set[tuple[int, int]], timeout: float = 60.0
             ) -> dict[tuple[int, int], bytes]:
    """Every partition of ``topic`` from the start, until ``wanted`` offsets are all seen (bounded)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("soak-reader"),
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    got: dict[tuple[int, int], bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not wanted <= got.keys():
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                if msg.error() is None:
                    got[(msg.partition(), msg.offset())] = msg.value()
    finally:
        consumer.close()
    return got


def _requests_total(metrics_port: int) -> int:
    """Requests kproxy read (its own counter); its error-code counters are printed alongside."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    errors = [line for line in text.splitlines() if line.startswith("kproxy_response_errors_total")]
    print("soak: kproxy saw error codes:", errors or "none")
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("kproxy_requests_total")))


