"""``kproxy demo``'s second part: fault-injection rules at work, seen from the client's side.

A second kproxy, running :data:`DEMO_RULES` (seeded), sits in front of the same broker.
Real librdkafka clients then measure what each rule does to them, beside a control that
no rule matches (another topic or client id, through the same kproxy):

* ``demo-not-leader``: the broker writes a quarter of the Produce requests, and kproxy
  replaces its answer with NOT_LEADER_OR_FOLLOWER (``mode: replace``): the client must
  retry records the broker already has. An idempotent producer's retries are
  de-duplicated by the broker (producer id and sequence numbers, KIP-98), so every record
  arrives exactly once; the same rule against a producer without idempotence shows the
  duplicates this saves, which is also what proves the exactly-once check can fail.
* ``demo-slow-produce``: 150 ms ± 20 ms (uniform) on every Produce of one client id: the
  acknowledgement latency librdkafka measures for each record moves by that much.
* ``demo-quota``: 512 KiB/s on Produce to one topic: the client's throughput meets the rate
  and the client reports the ``throttle_time_ms`` it was given.
* ``demo-slow-fetch`` and ``demo-fetch-quota``: 100 ms on every Fetch of one consumer's
  client id, 1 MiB/s of Fetch *responses* for another's: one topic read three times (a
  control, then each rule), the added time per Fetch and the read rate measured by the client.
* ``demo-cut-reads``: a byte-level toxic (rules/README.md, "Byte-level toxics"): a
  ``limit_data`` of 1.25 MiB on the connections of a fourth consumer, which kproxy closes once that
  many bytes went to it; the consumer reconnects and reads every record (the cuts are kproxy's
  count). Toxiproxy's other toxics (``bandwidth``, ``slicer``, ``delay`` at ``wire``) are rules
  of the same kind. Each cut costs the consumer a reconnection, which the demo's timings show.

Every figure comes from the clients (delivery reports, consumed records, librdkafka
statistics, wall clock) except the count of injected errors, which is kproxy's own.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kproxy.metrics.fault_stats import FaultStats
from kproxy.testing import ProxyThread, proxy_config

DELAY_MS, JITTER_MS = 150, 20
FETCH_DELAY_MS = 100
FETCH_QUOTA_BYTES_PER_SECOND = 1024 * 1024
READ_BYTES = 3 * 1024 * 1024  # the topic the consumers read
FETCH_LIMIT = 128 * 1024  # the consumers' bytes per Fetch (fetch.max.bytes): many Fetches per read
QUOTA_BYTES_PER_SECOND = 512 * 1024
NOT_LEADER_PROBABILITY = 0.25
SEED = 9

# Topic and client-id patterns the rules name; the scenario's own names are built from them.
RETRY_TOPIC, QUOTA_TOPIC, SLOW_CLIENT = "kproxy-demo-retry-", "kproxy-demo-quota-", "kproxy-demo-slow-writer"
SLOW_READER, QUOTA_READER = "kproxy-demo-slow-reader", "kproxy-demo-quota-reader"
CUT_READER = "kproxy-demo-cut-reader"
CUT_BYTES = 1280 * 1024  # limit_data per connection: two cuts over the READ_BYTES read

DEMO_RULES = f"""\
seed: {SEED}
rules:
  - id: demo-not-leader
    description: the broker writes the records, the client is told NOT_LEADER_OR_FOLLOWER and retries
    match: {{api: produce, topic: "{RETRY_TOPIC}*", probability: {NOT_LEADER_PROBABILITY}}}
    actions:
      - inject_error: {{error: NOT_LEADER_OR_FOLLOWER, mode: replace}}
  - id: demo-slow-produce
    match: {{api: produce, client_id: "{SLOW_CLIENT}"}}
    actions:
      - delay: {{ms: {DELAY_MS}, jitter_ms: {JITTER_MS}}}
  - id: demo-quota
    match: {{api: produce, topic: "{QUOTA_TOPIC}*"}}
    actions:
      - throttle: {{bytes_per_second: {QUOTA_BYTES_PER_SECOND}, burst_seconds: 0.05}}
  - id: demo-slow-fetch
    match: {{api: fetch, client_id: "{SLOW_READER}"}}
    actions:
      - delay: {{ms: {FETCH_DELAY_MS}}}
  - id: demo-fetch-quota
    description: a fetch quota is on the bytes the consumer is sent
    match: {{api: fetch, client_id: "{QUOTA_READER}"}}
    actions:
      - throttle: {{bytes_per_second: {FETCH_QUOTA_BYTES_PER_SECOND}, burst_seconds: 0.05}}
  - id: demo-cut-reads
    description: a byte-level toxic, as Toxiproxy's limit_data; bandwidth, slicer and delay at wire are its kin
    match: {{api: fetch, client_id: "{CUT_READER}"}}
    actions:
      - limit_data: {{bytes: {CUT_BYTES}}}
"""

KeyValue = tuple[bytes | None, bytes | None]


# ----------------------------------------------------------------------- exactly once


@dataclass(frozen=True)
class Delivery:
    """What a consumer read back, against what was produced (records identified by key and value)."""

    produced: int
    received: int
    duplicates: int  # records read more than once (each extra copy counts)
    missing: int  # produced records never read
    unexpected: int  # records read that were never produced

    @property
    def exactly_once(self) -> bool:
        return self.received == self.produced and not (self.duplicates or self.missing or self.unexpected)


def check_delivery(sent: Iterable[KeyValue], received: Iterable[KeyValue]) -> Delivery:
    """Compare two multisets of (key, value): every record sent read once, nothing else."""
    sent_c, got_c = Counter(sent), Counter(received)
    return Delivery(
        produced=sum(sent_c.values()),
        received=sum(got_c.values()),
        duplicates=sum(n - 1 for n in got_c.values() if n > 1),
        missing=sum((sent_c - got_c).values()),
        unexpected=sum(n for kv, n in got_c.items() if kv not in sent_c),
    )


# ------------------------------------------------------------------------ the clients


class _Stats:
    """librdkafka statistics (``statistics.interval.ms``), as the client reports them."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def __call__(self, text: str) -> None:
        self.reports.append(json.loads(text))

    def last(self) -> dict[str, Any]:
        return self.reports[-1] if self.reports else {}

    def brokers(self) -> Iterable[dict[str, Any]]:
        """Per-broker sections of every report (bootstrap pseudo-brokers excluded)."""
        for report in self.reports:
            for b in report.get("brokers", {}).values():
                if b.get("nodeid", -1) >= 0:
                    yield b

    def mean_rtt_ms(self) -> float | None:
        """Mean request round trip over every window (each report covers the last interval)."""
        total = count = 0
        for b in self.brokers():
            rtt = b.get("rtt", {})
            total += rtt.get("sum", 0)
            count += rtt.get("cnt", 0)
        return total / count / 1000 if count else None  # librdkafka reports microseconds

    def max_throttle_ms(self) -> int:
        return max((int(b.get("throttle", {}).get("max", 0)) for b in self.brokers()), default=0)


def _producer(bootstrap: str, stats: _Stats, **config: Any) -> Any:
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "statistics.interval.ms": 250,
                     "stats_cb": stats, **config})


def _produce_all(producer: Any, topic: str, records: list[KeyValue], timeout: float = 60,
                 latencies: list[float] | None = None) -> tuple[list[Any], float]:
    """Produce every record and wait for every delivery report: the delivery errors the
    application saw (none expected) and the seconds from the first send to the last report.
    With ``latencies``, each record is sent alone once the one before it was acknowledged, and
    its latency as librdkafka measured it (send to acknowledgement) is appended."""
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)
        elif latencies is not None:
            latencies.append(msg.latency())

    started = time.monotonic()

    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        if latencies is not None:
            producer.flush(timeout)
    if producer.flush(timeout) != 0:
        raise RuntimeError(f"producer could not deliver to {topic} within {timeout:g} s")
    seconds = time.monotonic() - started
    producer.poll(0.6)  # one more statistics report, covering the end
    return errors, seconds


def _read_all(bootstrap: str, topic: str, partitions: int, count: int, stats: _Stats | None = None,
              timeout: float = 60, **config: Any) -> list[KeyValue]:
    """Read ``count`` records from the start (assigned, no group), then a little more to see duplicates."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    extra: dict[str, Any] = {"statistics.interval.ms": 250, "stats_cb": stats} if stats is not None else {}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", **extra, **config})
    got: list[KeyValue] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            got += [(m.key(), m.value()) for m in consumer.consume(num_messages=500, timeout=0.2) if m.error() is None]
        got += [(m.key(), m.value()) for m in consumer.consume(num_messages=500, timeout=0.3) if m.error() is None]
    finally:
        consumer.close()
    return got


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a collected client cancels its futures
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def _records(tag: str, n: int, size: int = 100) -> list[KeyValue]:
    return [(f"{tag}-{i:05d}".encode(), (f"{tag}:{i}:" * (size // 8 + 1)).encode()[:size]) for i in range(n)]


# ------------------------------------------------------------------------- the scenario


@dataclass
class RetryOutcome:
    """One producer under ``demo-not-leader``."""

    idempotent: bool
    delivery: Delivery
    app_errors: int  # delivery reports with an error: what reached the application
    sent_on_wire: int  # records the client put in Produce requests, retries included (stats ``txmsgs``)
    produce_requests: int  # Produce requests the client sent (stats ``req.Produce``)
    injected: int  # of them, answered NOT_LEADER_OR_FOLLOWER by kproxy (kproxy's counter)


@dataclass
class LatencyOutcome:
    """Records produced one at a time by one client id; librdkafka's latency of each, in ms."""

    client_id: str
    latencies_ms: list[float]

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@dataclass
class QuotaOutcome:
    topic: str
    nbytes: int
    seconds: float
    max_throttle_ms: int  # the largest throttle_time_ms the client reported (stats ``throttle.max``)

    @property
    def bytes_per_second(self) -> float:
        return self.nbytes / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class ReadOutcome:
    """One consumer reading the demo's topic from the start."""

    client_id: str
    records: int
    fetches: int  # Fetch requests the client sent (stats ``req.Fetch``)
    seconds: float  # assignment to the last record
    rate: float  # record bytes after the first response / first .. last record (B/s); 0: all came at once
    max_throttle_ms: int
    nbytes: int = 0  # record bytes read

    @property
    def overall_rate(self) -> float:
        """Record bytes / (assignment .. last record), in B/s."""
        return self.nbytes / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class RulesResult:
    retries: list[RetryOutcome] = field(default_factory=list)
    latencies: list[LatencyOutcome] = field(default_factory=list)
    quotas: list[QuotaOutcome] = field(default_factory=list)
    reads: list[ReadOutcome] = field(default_factory=list)

    def read(self, client_id: str) -> ReadOutcome | None:
        return next((r for r in self.reads if r.client_id == client_id), None)

    @property
    def fetch_delay_ms(self) -> float | None:
        """Time each Fetch of the slow reader took beyond the control's, in ms."""
        base, slow = self.read("kproxy-demo-reader"), self.read(SLOW_READER)
        if base is None or slow is None or not slow.fetches:
            return None
        return (slow.seconds - base.seconds) / slow.fetches * 1000

    @property
    def ok(self) -> bool:
        """The idempotent producer got every record exactly once, after real retries, with no
        error reaching the application; the delay and the quota showed in the control's
        comparison."""
        idem = [r for r in self.retries if r.idempotent]
        return (bool(idem) and all(r.delivery.exactly_once and r.app_errors == 0 and r.injected > 0 for r in idem)
                and bool(self.latencies) and bool(self.quotas) and len(self.reads) == 4)


def _injected(counts: FaultStats) -> int:
    return sum(n for (api, error), n in counts.injected_errors.items()
               if api == "produce" and error == "NOT_LEADER_OR_FOLLOWER")


def run_retries(proxy: ProxyThread, messages: int, *, idempotent: bool, partitions: int = 2) -> RetryOutcome:
    """Produce ``messages`` records to a topic ``demo-not-leader`` matches, read them back."""
    assert proxy.server is not None
    counts = proxy.server.stats.faults
    topic = f"{RETRY_TOPIC}{'idempotent' if idempotent else 'plain'}-{uuid.uuid4().hex[:8]}"
    _create(proxy.bootstrap, topic, partitions)
    sent = _records("retry", messages)
    stats = _Stats()
    before = proxy.call(_injected, counts)
    producer = _producer(proxy.bootstrap, stats, **{"enable.idempotence": idempotent, "linger.ms": 5,
                                                   "batch.num.messages": 50})
    errors, _ = _produce_all(producer, topic, sent)
    injected = proxy.call(_injected, counts) - before
    last = stats.last()
    requests = sum(int(b.get("req", {}).get("Produce", 0)) for b in last.get("brokers", {}).values())
    received = _read_all(proxy.bootstrap, topic, partitions, len(sent))
    return RetryOutcome(idempotent, check_delivery(sent, received), len(errors), int(last.get("txmsgs", 0)),
                        requests, injected)


def run_latency(proxy: ProxyThread, topic: str, records: int, client_id: str) -> LatencyOutcome:
    """Produce ``records`` records to ``topic`` one at a time as ``client_id``, timing each."""
    producer = _producer(proxy.bootstrap, _Stats(), **{"client.id": client_id, "linger.ms": 0})
    _produce_all(producer, topic, [(None, b"warm-up")])  # metadata and connection first
    latencies: list[float] = []
    errors, _ = _produce_all(producer, topic, _records("latency", records), latencies=latencies)
    if errors:
        raise RuntimeError(f"delivery errors: {errors[:3]}")
    return LatencyOutcome(client_id, [s * 1000 for s in latencies])


def run_quota(proxy: ProxyThread, topic: str, nbytes: int) -> QuotaOutcome:
    """Produce ``nbytes`` of 10 KB records to ``topic``, timing from the first byte to the last ack."""
    _create(proxy.bootstrap, topic, 1)
    stats = _Stats()
    producer = _producer(proxy.bootstrap, stats, **{"linger.ms": 5})
    _produce_all(producer, topic, [(None, b"warm-up")])  # metadata and connection first
    payload = b"q" * 10_000
    errors, seconds = _produce_all(producer, topic, [(None, payload)] * (nbytes // len(payload)))
    if errors:
        raise RuntimeError(f"delivery errors under the quota: {errors[:3]}")
    return QuotaOutcome(topic, nbytes // len(payload) * len(payload), seconds, stats.max_throttle_ms())


def run_read(proxy: ProxyThread, topic: str, records: int, client_id: str) -> ReadOutcome:
    """Read ``topic`` (one partition) from the start as ``client_id``, ``FETCH_LIMIT`` bytes a Fetch."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    stats = _Stats()
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": f"{topic}-{client_id}",
                         "client.id": client_id, "enable.auto.commit": False, "fetch.max.bytes": FETCH_LIMIT,
                         "max.partition.fetch.bytes": FETCH_LIMIT, "message.max.bytes": FETCH_LIMIT,
                         "statistics.interval.ms": 250, "stats_cb": stats})
    received = nbytes = total = 0
    first = last = 0.0
    try:
        started = time.monotonic()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = started + 60
        while received < records and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(num_messages=500, timeout=0.1) if m.error() is None]
            if not batch:
                continue
            last = time.monotonic()
            if not received:
                first = last  # the first response: a quota lets it go, so the rate counts from it
            else:
                nbytes += sum(len(m.value() or b"") for m in batch)
            received += len(batch)
            total += sum(len(m.value() or b"") for m in batch)
        consumer.poll(0.3)  # a statistics report covering the end
    finally:
        consumer.close()
    fetches = sum(int(b.get("req", {}).get("Fetch", 0)) for b in stats.last().get("brokers", {}).values()
                  if b.get("nodeid", -1) >= 0)
    return ReadOutcome(client_id, received, fetches, last - started, nbytes / max(last - first, 1e-9),
                       stats.max_throttle_ms(), total)


def drive_rules(proxy: ProxyThread, messages: int = 1000) -> RulesResult:
    """The scenario, against a kproxy running :data:`DEMO_RULES`."""
    result = RulesResult()
    result.retries.append(run_retries(proxy, messages, idempotent=True))
    result.retries.append(run_retries(proxy, messages, idempotent=False))

    topic = f"kproxy-demo-latency-{uuid.uuid4().hex[:8]}"
    _create(proxy.bootstrap, topic, 1)
    result.latencies.append(run_latency(proxy, topic, 30, "kproxy-demo-writer"))
    result.latencies.append(run_latency(proxy, topic, 30, SLOW_CLIENT))

    nbytes = 3 * QUOTA_BYTES_PER_SECOND
    result.quotas.append(run_quota(proxy, f"kproxy-demo-free-{uuid.uuid4().hex[:8]}", nbytes))
    result.quotas.append(run_quota(proxy, f"{QUOTA_TOPIC}{uuid.uuid4().hex[:8]}", nbytes))

    topic = f"kproxy-demo-read-{uuid.uuid4().hex[:8]}"
    _create(proxy.bootstrap, topic, 1)
    records = READ_BYTES // 10_000
    # Small batches: a Fetch returns whole batches, up to the consumer's byte limit.
    _produce_all(_producer(proxy.bootstrap, _Stats(), **{"linger.ms": 5, "batch.size": 40_000}), topic,
                 [(None, b"r" * 10_000)] * records)
    for client_id in ("kproxy-demo-reader", SLOW_READER, QUOTA_READER, CUT_READER):
        result.reads.append(run_read(proxy, topic, records, client_id))
    return result


# ------------------------------------------------------------------------------ report


def report_rules(result: RulesResult, counts: FaultStats, out: TextIO) -> None:
    w = out.write
    w("\nfault-injection rules (a second kproxy, same broker; controls go through it unmatched)\n")
    w("================================================================================\n")
    for line in DEMO_RULES.splitlines():
        w(f"  | {line}\n")
    w(f"\n1. demo-not-leader: NOT_LEADER_OR_FOLLOWER on ~{NOT_LEADER_PROBABILITY:.0%} of Produce, "
      "after the broker wrote the records\n")
    for r in result.retries:
        d = r.delivery
        name = "idempotent producer" if r.idempotent else "producer without idempotence (control)"
        w(f"   {name}:\n")
        w(f"     Produce requests sent {r.produce_requests}, answered NOT_LEADER_OR_FOLLOWER {r.injected} "
          f"(kproxy's count); records put on the wire {r.sent_on_wire} for {d.produced} produced "
          f"({r.sent_on_wire - d.produced} re-sent by retries); errors reaching the application {r.app_errors}\n")
        verdict = "EXACTLY ONCE" if d.exactly_once else "NOT exactly once"
        w(f"     read back {d.received}: duplicates {d.duplicates}, missing {d.missing}, unexpected {d.unexpected} "
          f"-> {verdict}\n")
    w(f"\n2. demo-slow-produce: +{DELAY_MS} ms ± {JITTER_MS} ms (uniform) on Produce of client id {SLOW_CLIENT}\n")
    for lo in result.latencies:
        w(f"   {lo.client_id:<26} {len(lo.latencies_ms)} records one at a time: acknowledgement latency "
          f"(librdkafka) min {min(lo.latencies_ms, default=float('nan')):.1f} p50 {lo.quantile(0.5):.1f} "
          f"max {max(lo.latencies_ms, default=float('nan')):.1f} ms\n")
    if len(result.latencies) == 2:
        base, slow = result.latencies
        w(f"   p50 moved by {slow.quantile(0.5) - base.quantile(0.5):+.1f} ms (rule: +{DELAY_MS} ms, "
          f"each between {DELAY_MS - JITTER_MS} and {DELAY_MS + JITTER_MS}, plus the broker's own time)\n")
    w(f"\n3. demo-quota: {QUOTA_BYTES_PER_SECOND / 1024:g} KiB/s on Produce to {QUOTA_TOPIC}*\n")
    for qo in result.quotas:
        w(f"   {qo.topic:<34} {qo.nbytes} bytes in {qo.seconds:.2f} s = {qo.bytes_per_second / 1024:,.0f} KiB/s; "
          f"largest throttle_time_ms the client reported {qo.max_throttle_ms}\n")
    if result.quotas:
        got = result.quotas[-1].bytes_per_second
        w(f"   throttled rate {got / QUOTA_BYTES_PER_SECOND:.0%} of the configured rate\n")
    w(f"\n4. demo-slow-fetch: +{FETCH_DELAY_MS} ms on Fetch of {SLOW_READER}; demo-fetch-quota: "
      f"{FETCH_QUOTA_BYTES_PER_SECOND / 1024:g} KiB/s of Fetch responses to {QUOTA_READER}\n")
    for read in result.reads:
        after = (f"after the first response {read.rate / 1024:,.0f} KiB/s" if read.rate
                 else "all read before the first poll returned")
        w(f"   {read.client_id:<26} read {read.records} records in {read.fetches} Fetches, {read.seconds:.2f} s "
          f"({read.overall_rate / 1024:,.0f} KiB/s; {after}); largest throttle_time_ms reported "
          f"{read.max_throttle_ms}\n")
    added = result.fetch_delay_ms
    if added is not None:
        w(f"   each Fetch of {SLOW_READER} took {added:.1f} ms longer than the control's "
          f"(rule: +{FETCH_DELAY_MS} ms)\n")
    quota = result.read(QUOTA_READER)
    if quota is not None:
        w(f"   {QUOTA_READER} read at {quota.rate / FETCH_QUOTA_BYTES_PER_SECOND:.0%} of the configured rate\n")
    cut = result.read(CUT_READER)
    if cut is not None:
        cuts = counts.connection_faults.get(("demo-cut-reads", "limit_data"), 0)
        w(f"\n5. demo-cut-reads: limit_data {CUT_BYTES // 1024} KiB per connection of {CUT_READER} (a byte-level "
          f"toxic)\n   its connections were cut {cuts} times (kproxy's count); it reconnected and read {cut.records} "
          f"records in {cut.seconds:.2f} s\n")
    hits = ", ".join(f"{rule} {action} x{n}" for (rule, action, dry), n in sorted(counts.hits.items())
                     if dry == "false" and n)
    w(f"\nkproxy's fault counters: {hits or 'none'}\n")
    w(f"rules scenario: {'OK' if result.ok else 'FAILED'} (the idempotent producer's records arrived exactly once "
      "despite the retries)\n")


def run_rules_demo(bootstrap: str, out: TextIO, messages: int = 1000, rules: str = DEMO_RULES,
                   wait_warm: Callable[[ProxyThread], None] | None = None, **proxy_options: Any) -> RulesResult:
    """Start a kproxy with ``rules`` in front of ``bootstrap``, run the scenario, write the report."""
    with tempfile.TemporaryDirectory(prefix="kproxy-demo-") as tmp:
        path = Path(tmp) / "demo-rules.yaml"
        path.write_text(rules)
        with ProxyThread(proxy_config(bootstrap, rules=str(path), **proxy_options)) as proxy:
            assert proxy.server is not None
            if wait_warm is not None:
                wait_warm(proxy)
            result = drive_rules(proxy, messages)
            report_rules(result, proxy.call(_copy_counts, proxy.server.stats.faults), out)
    return result


def _copy_counts(counts: FaultStats) -> FaultStats:
    return FaultStats(dict(counts.hits), dict(counts.injected_errors), dict(counts.throttle_seconds),
                      dict(counts.connection_faults), counts.rules_loaded)
