"""Throttle accuracy: the rate a real client achieves through kproxy under a `throttle` rule, vs its target.

    .venv/bin/python bench/bench_throttle.py [--seconds S] [--quick]

One Tansu broker, one `kproxy run --rules FILE` process in front of it (the product as users
run it), and librdkafka clients (confluent-kafka) in this process. Each target gets its own
topics, matched by its own rules (`burst_seconds: 0.05`, so the bucket's start-up credit is
negligible against the measured span):

* bytes/s targets, **produce**: 10 KB records, `linger.ms` 5, as fast as the producer can;
  achieved = record bytes / (first send .. last acknowledgement). kproxy charges request
  sizes, so framing overhead (~1 %) counts against the target too.
* bytes/s targets, **fetch**: a topic pre-filled straight into the broker in small batches,
  read from the start through kproxy with `max.partition.fetch.bytes` at 1/16 s of the rate
  (at least 16 KiB); achieved = record bytes after the first response / (first record .. last record).
  kproxy charges response sizes (rules/README.md), so the first response is free, as with a
  broker's quota: its records (the first `consume` call's) start the clock and are not counted.
* requests/s targets: **produce** one record per request (`batch.num.messages` 1, one request
  in flight); **fetch** one small batch per Fetch; achieved = the client's own request count
  (librdkafka statistics `req`) / span.

Every bucket starts with `burst_seconds` of credit, so short spans read high by about
burst / span (0.05 / 8 s: +0.6 %; --quick's 1.5 s: +3 %). A target is met when achieved is
within 10 % of it. Prints a Markdown table for
docs/PERFORMANCE.md. `--quick` (~20 s) checks the script works; figures from it are rough.
Do not run this on a busy machine: the client and kproxy share its cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

from _tansu import broker, free_port, wait_for_port  # noqa: E402
from _util import machine_line, table, verdict  # noqa: E402

from kproxy.testing import stop_process  # noqa: E402

KIB = 1024
RECORD = b"t" * 10_000
BURST_S = 0.05


@dataclass(frozen=True)
class Target:
    unit: str  # "B/s" or "req/s"
    rate: float

    @property
    def label(self) -> str:
        if self.unit == "req/s":
            return f"{self.rate:g} req/s"
        return f"{self.rate / KIB:g} KiB/s" if self.rate < 1024 * KIB else f"{self.rate / KIB / KIB:g} MiB/s"

    def throttle(self) -> str:
        key = "requests_per_second" if self.unit == "req/s" else "bytes_per_second"
        return f"{{{key}: {self.rate:g}, burst_seconds: {BURST_S}, scope: topic}}"


TARGETS = (Target("B/s", 256 * KIB), Target("B/s", 1024 * KIB), Target("B/s", 4096 * KIB),
           Target("req/s", 50), Target("req/s", 200))


@dataclass
class Row:
    target: Target
    direction: str
    achieved: float
    seconds: float
    note: str = ""

    @property
    def error(self) -> float:
        return (self.achieved - self.target.rate) / self.target.rate


# ------------------------------------------------------------------------------ processes


@contextlib.contextmanager
def kproxy(upstream: str, rules: Path, log: Path) -> Iterator[str]:
    """``kproxy run --rules`` in its own process; yields its bootstrap address."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "kproxy"), "run", "--upstream", upstream,
                                 "--listen", f"127.0.0.1:{port}", "--broker-port-base", "0", "--rules", str(rules),
                                 "--log-level", "warning"], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(proc)


def rules_text(cases: list[tuple[Target, str, str]]) -> str:
    lines = ["rules:"]
    for i, (target, api, topic) in enumerate(cases):
        lines += [f"  - id: bench-{i}", f"    match: {{api: {api}, topic: \"{topic}\"}}",
                  f"    actions: [throttle: {target.throttle()}]"]
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------------------- clients


def _create(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)


class Stats:
    def __init__(self) -> None:
        self.last: dict[str, Any] = {}

    def __call__(self, text: str) -> None:
        self.last = json.loads(text)

    def requests(self, api: str) -> int:
        return sum(int(b.get("req", {}).get(api, 0)) for b in self.last.get("brokers", {}).values()
                   if b.get("nodeid", -1) >= 0)


def measure_produce(bootstrap: str, topic: str, target: Target, seconds: float) -> Row:
    from confluent_kafka import Producer

    stats = Stats()
    per_request = target.unit == "req/s"
    config: dict[str, Any] = {"bootstrap.servers": bootstrap, "acks": "all", "statistics.interval.ms": 100,
                              "stats_cb": stats}
    config.update({"linger.ms": 0, "batch.num.messages": 1, "max.in.flight": 1} if per_request
                  else {"linger.ms": 5})
    producer = Producer(config)
    producer.produce(topic, value=b"warm-up")
    producer.flush(15)
    producer.poll(0.15)
    requests_before = stats.requests("Produce")
    count = max(10, int(target.rate * seconds / (1 if per_request else len(RECORD))))
    value = b"r" if per_request else RECORD
    started = time.monotonic()
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, value=value)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(seconds * 10 + 30) != 0:
        raise RuntimeError(f"{topic}: records still undelivered")
    elapsed = time.monotonic() - started
    if per_request:
        producer.poll(0.25)  # a statistics report after the last request
        achieved = (stats.requests("Produce") - requests_before) / elapsed
    else:
        achieved = count * len(RECORD) / elapsed
    return Row(target, "produce", achieved, elapsed)


def prefill(broker_address: str, topic: str, nbytes: int) -> int:
    """Write ``nbytes`` of records straight into the broker, in batches of ~4 records."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker_address, "linger.ms": 5, "batch.size": 40_000})
    count = max(16, nbytes // len(RECORD))
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, value=RECORD)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(60)
    return count


def measure_fetch(bootstrap: str, topic: str, target: Target, seconds: float, count: int) -> Row:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    stats = Stats()
    per_request = target.unit == "req/s"
    # Bytes: ~16 Fetches a second at the target. Requests: one ~4-record batch per Fetch.
    limit = 16 * KIB if per_request else max(16 * KIB, int(target.rate / 16))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-bench", "enable.auto.commit": False,
                         "max.partition.fetch.bytes": limit, "fetch.max.bytes": limit, "message.max.bytes": limit,
                         "statistics.interval.ms": 100, "stats_cb": stats})
    wanted = count if not per_request else min(count, max(40, int(target.rate * seconds * 4)))
    received = nbytes = 0
    first = last = 0.0
    fetches_before = 0
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + seconds * 10 + 30
        while received < wanted and time.monotonic() < deadline:
            batch = [m for m in consumer.consume(num_messages=500, timeout=0.1) if m.error() is None]
            if not batch:
                continue
            now = time.monotonic()
            if not received:  # the first response: the clock starts, its bytes are not counted
                first = now
                fetches_before = stats.requests("Fetch")
            else:
                nbytes += sum(len(m.value() or b"") for m in batch)
            last = now
            received += len(batch)
        consumer.poll(0.25)
        fetches = stats.requests("Fetch") - fetches_before if received else 0
    finally:
        consumer.close()
    span = max(last - first, 1e-9)
    if per_request:
        return Row(target, "fetch", fetches / span, span, f"{received} records in {fetches} Fetches")
    return Row(target, "fetch", nbytes / span, span)


# ------------------------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, help="target length of each measurement (default 8; with --quick 1.5)")
    parser.add_argument("--quick", action="store_true", help="1.5 s measurements unless --seconds (~20 s in all): "
                        "rough figures")
    args = parser.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 8.0)
    run = uuid.uuid4().hex[:6]
    cases: list[tuple[Target, str, str]] = []
    for i, target in enumerate(TARGETS):
        cases.append((target, "produce", f"bt-{run}-p{i}"))
        cases.append((target, "fetch", f"bt-{run}-f{i}"))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kproxy-bench-throttle-") as tmp:
        work = Path(tmp)
        rules = work / "rules.yaml"
        rules.write_text(rules_text(cases))
        broker_port = free_port()
        upstream = f"127.0.0.1:{broker_port}"
        with broker(broker_port, work / "tansu.log"), kproxy(upstream, rules, work / "kproxy.log") as bootstrap:
            filled: dict[str, int] = {}
            for target, api, topic in cases:
                _create(upstream, topic)
                if api == "fetch":
                    nbytes = int(target.rate * seconds * 1.2) if target.unit == "B/s" else 8 * 40_000 * int(
                        target.rate * seconds / 8 + 1)
                    filled[topic] = prefill(upstream, topic, nbytes)
            for target, api, topic in cases:
                row = (measure_produce(bootstrap, topic, target, seconds) if api == "produce"
                       else measure_fetch(bootstrap, topic, target, seconds, filled[topic]))
                rows.append(row)
                print(f"{target.label:>12} {api:<8} achieved {row.achieved:,.1f} {target.unit} "
                      f"({row.error:+.1%}) over {row.seconds:.2f} s", file=sys.stderr, flush=True)
    print(f"\nThrottle accuracy ({machine_line()}; {seconds:g} s per measurement"
          f"{', --quick' if args.quick else ''}; burst_seconds {BURST_S})\n")
    print(table(["target", "direction", "achieved", "error", "span (s)", "within 10 %", "note"],
                [[r.target.label, r.direction,
                  f"{r.achieved / KIB:,.0f} KiB/s" if r.target.unit == "B/s" else f"{r.achieved:,.1f} req/s",
                  f"{r.error:+.1%}", f"{r.seconds:.2f}", verdict(abs(r.error) <= 0.10), r.note] for r in rows]))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
