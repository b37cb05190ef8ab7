"""``kproxy demo``'s rules scenario against the real broker: its figures are measured, not asserted."""

from __future__ import annotations

import io
import re

import pytest

from kproxy.cli import build_parser
from kproxy.subcommands.demo_rules import (
    CUT_READER,
    DELAY_MS,
    FETCH_DELAY_MS,
    FETCH_QUOTA_BYTES_PER_SECOND,
    JITTER_MS,
    QUOTA_BYTES_PER_SECOND,
    QUOTA_READER,
    SLOW_READER,
    RulesResult,
    check_delivery,
    run_rules_demo,
)
from kproxy.testing import Broker

RECORDS = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(5)]


def test_check_delivery_counts_duplicates_missing_and_unexpected_records() -> None:
    assert check_delivery(RECORDS, list(reversed(RECORDS))).exactly_once
    twice = check_delivery(RECORDS, [*RECORDS, RECORDS[2]])
    assert (twice.duplicates, twice.missing, twice.exactly_once) == (1, 0, False)
    # Same count, yet not exactly once: one record read twice, another never.
    swapped = check_delivery(RECORDS, [*RECORDS[:4], RECORDS[0]])
    assert (swapped.received, swapped.duplicates, swapped.missing, swapped.exactly_once) == (5, 1, 1, False)
    stranger = check_delivery(RECORDS, [*RECORDS, (b"k9", b"v9")])
    assert (stranger.unexpected, stranger.exactly_once) == (1, False)


@pytest.fixture(scope="module")
def scenario(tansu: Broker) -> tuple[RulesResult, str]:
    out = io.StringIO()
    result = run_rules_demo(tansu.bootstrap, out, messages=400)
    return result, out.getvalue()


def test_the_idempotent_producer_is_retried_and_gets_every_record_exactly_once(
        scenario: tuple[RulesResult, str]) -> None:
    result, text = scenario
    assert result.ok
    idem = next(r for r in result.retries if r.idempotent)
    assert idem.injected > 0, "the rule should have failed some Produce requests"
    assert idem.sent_on_wire > idem.delivery.produced, "librdkafka should have re-sent the failed batches"
    assert idem.produce_requests > idem.injected
    assert idem.app_errors == 0
    assert idem.delivery.exactly_once and idem.delivery.received == 400
    assert f"records put on the wire {idem.sent_on_wire} for 400 produced" in text
    assert "read back 400: duplicates 0, missing 0, unexpected 0 -> EXACTLY ONCE" in text


def test_the_same_faults_without_idempotence_show_duplicates_so_the_check_can_fail(
        scenario: tuple[RulesResult, str]) -> None:
    result, text = scenario
    plain = next(r for r in result.retries if not r.idempotent)
    assert plain.injected > 0
    d = plain.delivery
    # The broker wrote every batch kproxy then failed: each retry wrote it again.
    assert d.duplicates > 0 and not d.exactly_once and d.missing == 0
    assert d.duplicates == d.received - d.produced == plain.sent_on_wire - d.produced
    assert f"read back {d.received}: duplicates {d.duplicates}, missing 0, unexpected 0 -> NOT exactly once" in text


def test_the_delay_moves_the_acknowledgement_latency_by_the_configured_time(
        scenario: tuple[RulesResult, str]) -> None:
    result, text = scenario
    base, slow = result.latencies
    assert base.quantile(0.5) < 50
    assert min(slow.latencies_ms) >= DELAY_MS - JITTER_MS
    moved = slow.quantile(0.5) - base.quantile(0.5)
    assert DELAY_MS - JITTER_MS <= moved <= DELAY_MS + JITTER_MS + 30
    assert re.search(rf"p50 moved by \+{moved:.1f} ms", text)


def test_the_quota_caps_the_throughput_and_the_client_reports_throttle_time(
        scenario: tuple[RulesResult, str]) -> None:
    result, _ = scenario
    free, capped = result.quotas
    assert abs(capped.bytes_per_second - QUOTA_BYTES_PER_SECOND) / QUOTA_BYTES_PER_SECOND <= 0.10
    assert capped.max_throttle_ms > 0 and free.max_throttle_ms == 0
    assert free.bytes_per_second > 2 * QUOTA_BYTES_PER_SECOND


def test_fetch_delay_and_fetch_quota_show_in_what_the_consumers_measured(scenario: tuple[RulesResult, str]) -> None:
    result, text = scenario
    base, slow, quota = (result.read(c) for c in ("kproxy-demo-reader", SLOW_READER, QUOTA_READER))
    assert base is not None and slow is not None and quota is not None
    assert base.records == slow.records == quota.records > 0
    assert slow.fetches >= 10, "the read should take many Fetches"
    added = result.fetch_delay_ms
    assert added is not None and FETCH_DELAY_MS * 0.8 <= added <= FETCH_DELAY_MS * 1.3
    assert f"took {added:.1f} ms longer" in text
    assert abs(quota.rate - FETCH_QUOTA_BYTES_PER_SECOND) / FETCH_QUOTA_BYTES_PER_SECOND <= 0.10
    assert quota.max_throttle_ms > 0 and base.max_throttle_ms == 0
    assert base.overall_rate > 3 * FETCH_QUOTA_BYTES_PER_SECOND, "the control is not held to the quota"
    assert quota.overall_rate <= 1.10 * FETCH_QUOTA_BYTES_PER_SECOND


def test_the_limit_data_toxic_cuts_a_consumer_s_connections_and_it_reads_every_record(
        scenario: tuple[RulesResult, str]) -> None:
    result, text = scenario
    base, cut = result.read("kproxy-demo-reader"), result.read(CUT_READER)
    assert base is not None and cut is not None
    assert cut.records == base.records > 0
    found = re.search(r"its connections were cut (\d+) times", text)
    assert found is not None and int(found.group(1)) >= 2, "3 MiB read through 1 MiB connections"


def test_the_rules_part_runs_by_default_and_can_be_skipped() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).rules is True
    assert parser.parse_args(["demo", "--no-rules"]).rules is False
