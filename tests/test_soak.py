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

Faults: ``KPROXY_SOAK_ARGS`` is appended to the kproxy command line, so
``KPROXY_SOAK_ARGS='--rules FILE'`` soaks under that rule file's faults, with the same checks
(docs/RELIABILITY.md says what a run under rules/examples/leader-election-storm.yaml shows).
The clients are tests/support/soak.py's.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kproxy.testing import Broker, free_port, stop_process, wait_for_port
from tests.support.e2e import create_topic, unique
from tests.support.soak import (
    AdminCalls,
    GroupConsumer,
    IdempotentProducer,
    Observed,
    PipeliningClient,
    Worker,
    read_log,
    rss_sampler,
    run_workers,
)

SECONDS = float(os.environ.get("KPROXY_SOAK_SECONDS", "60"))
EXTRA_ARGS = shlex.split(os.environ.get("KPROXY_SOAK_ARGS", ""))
# The same run with the clients on the broker itself: the baseline to compare a finding with.
DIRECT = os.environ.get("KPROXY_SOAK_DIRECT") == "1"
PARTITIONS = 3
RSS_SLACK_KB = 8 * 1024  # allocator noise and the first full-size buffers of late connections


@dataclass
class KproxyRun:
    """``kproxy run`` in its own process: its bootstrap and metrics ports."""

    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int


@dataclass
class SoakResult:
    observed: Observed  # what the clients saw during the soak
    read_back: dict[tuple[int, int], bytes]  # the whole log, afterwards, through kproxy
    direct: dict[tuple[int, int], bytes]  # what read_back missed, read from the broker itself
    requests: int  # kproxy_requests_total at the end


@contextlib.contextmanager
def kproxy_run(upstream: str, log_path: Path) -> Iterator[KproxyRun]:
    """``kproxy run`` in front of ``upstream`` (with ``KPROXY_SOAK_ARGS``) until the block ends."""
    port, metrics_port = free_port(), free_port()
    with log_path.open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kproxy", "run", "--upstream", upstream,
                                 "--listen", f"127.0.0.1:{port}", "--broker-port-base", str(free_port() - 111),
                                 "--metrics-listen", f"127.0.0.1:{metrics_port}", "--shutdown-grace", "5",
                                 "--log-level", "warning", *EXTRA_ARGS], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port("127.0.0.1", port)
            yield KproxyRun(proc, port, metrics_port)
        finally:
            stop_process(proc, grace=15)


def run_traffic(bootstrap: str, kproxy: KproxyRun, topic: str, group: str) -> Observed:
    """Every client of the soak for ``SECONDS``, then every acknowledged produce given (bounded)
    to the group: what they all saw."""
    observed = Observed()
    stop = threading.Event()
    producers = [IdempotentProducer(bootstrap, topic, f"p{i}", observed) for i in range(2)]
    group_consumer = GroupConsumer(bootstrap, topic, group, observed)
    admin = AdminCalls(bootstrap, topic)
    raw = PipeliningClient(kproxy.port, topic, PARTITIONS, observed)
    try:
        workers = [Worker(f"producer-{i}", p.step, stop) for i, p in enumerate(producers)]
        workers += [Worker("consumer", group_consumer.step, stop), Worker("admin", admin.step, stop),
                    Worker("raw", raw.step, stop), Worker("rss", rss_sampler(kproxy.proc.pid, observed), stop)]
        run_workers(workers, stop, SECONDS, alive=lambda: kproxy.proc.poll() is None)
        for producer in producers:
            assert producer.flush(60) == 0, "produces still unacknowledged a minute after the soak"
        group_consumer.catch_up(set(observed.acked_where()), timeout=20)
    finally:
        stop.set()
        group_consumer.close()
        admin.close()
        raw.close()
    return observed


def report(observed: Observed, requests: int) -> None:
    """One line of what the soak did, for the log of a long run."""
    rss = observed.rss
    third = max(len(rss) // 3, 1)
    first, last = sum(rss[:third]) / third, sum(rss[-third:]) / third
    short = len(observed.acked_where().keys() - observed.consumed.keys())
    print(f"soak: {SECONDS:.0f} s, {len(observed.acked)} produces acknowledged, {len(observed.consumed)} records "
          f"consumed, {observed.raw_requests} pipelined raw requests, {requests} requests through kproxy; "
          f"group short by {short} records 20 s after the end; "
          f"RSS first third {first:.0f} KiB, last third {last:.0f} KiB, max {max(rss, default=0)} KiB")


@pytest.fixture(scope="module")
def soak(tansu: Broker, tmp_path_factory: pytest.TempPathFactory) -> SoakResult:
    """Run the soak once; the tests below each check one of its promises."""
    with kproxy_run(tansu.bootstrap, tmp_path_factory.mktemp("soak") / "kproxy.log") as kproxy:
        bootstrap = tansu.bootstrap if DIRECT else f"127.0.0.1:{kproxy.port}"
        topic, group = unique("soak"), unique("soak-group")
        create_topic(bootstrap, topic, partitions=PARTITIONS)
        observed = run_traffic(bootstrap, kproxy, topic, group)
        # The verdict reads the log back through kproxy; and, only if something is missing, from
        # the broker directly, to say which of the two lost it.
        wanted = set(observed.acked_where())
        through_kproxy = read_log(bootstrap, topic, PARTITIONS, wanted)
        missing = wanted - through_kproxy.keys()
        direct = read_log(tansu.bootstrap, topic, PARTITIONS, missing) if missing else {}
        requests = requests_total(kproxy.metrics_port)
    report(observed, requests)
    return SoakResult(observed, through_kproxy, direct, requests)


def test_soak_every_acknowledged_produce_is_consumed_where_the_broker_said(soak: SoakResult) -> None:
    seen = soak.observed
    assert not seen.produce_errors, f"produce errors: {seen.produce_errors[:5]}"
    assert len(seen.acked) > 100, f"only {len(seen.acked)} produces acknowledged: the soak did not run"
    wanted = seen.acked_where()
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
    consumed = soak.observed.consumed
    assert len(consumed) > 100, "the consumer group consumed almost nothing"
    wrong = [(w, v, soak.read_back.get(w)) for w, v in consumed.items() if soak.read_back.get(w, v) != v]
    assert not wrong, f"the group was handed records that are not at those offsets: {wrong[:5]}"


def test_soak_no_answer_reaches_the_wrong_request(soak: SoakResult) -> None:
    assert soak.observed.raw_requests > 100
    assert not soak.observed.mismatches, f"answers reached the wrong request: {soak.observed.mismatches[:5]}"


def test_soak_memory_is_flat(soak: SoakResult) -> None:
    rss = soak.observed.rss
    assert len(rss) >= 6, "too few RSS samples"
    third = len(rss) // 3
    first, last = sum(rss[:third]) / third, sum(rss[-third:]) / third
    assert last <= first + RSS_SLACK_KB, f"kproxy's RSS grew from {first:.0f} to {last:.0f} KiB: {rss}"


def requests_total(metrics_port: int) -> int:
    """Requests kproxy read (its own counter); its error-code counters are printed alongside."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    errors = [line for line in text.splitlines() if line.startswith("kproxy_response_errors_total")]
    print("soak: kproxy saw error codes:", errors or "none")
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("kproxy_requests_total")))
