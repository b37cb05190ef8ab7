"""kproxy.metrics.client_anomalies on its own: which answers are which kind, churn per minute, the producer
policy's batch check, and bounded state under hostile client ids (the e2e pairs with real clients are
tests/test_anomalies_e2e.py)."""

from __future__ import annotations

import logging
import struct
from typing import Any

import pytest

from kproxy.metrics.client_anomalies import (
    CHURN_WINDOW,
    CONNECTION_CHURN,
    KINDS,
    PRODUCER_FENCED,
    PRODUCER_SEQUENCE,
    REBALANCE_STORM,
    RETRY_STORM,
    STALE_GENERATION,
    UNCOMPRESSED_MIN_BYTES,
    VANISHED_MEMBER,
    AnomalyOptions,
    ClientAnomalies,
    anomaly_kind,
    uncompressed,
)
from kproxy.metrics.group_anomalies import (
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    MAX_GROUPS,
    MAX_MEMBERS,
    GroupWatch,
    MembershipRequest,
)
from kproxy.metrics.labels import OTHER, LabelCap
from kproxy.metrics.retries import MAX_BATCHES as RETRY_MAX_BATCHES
from kproxy.metrics.retries import RetryWatch
from kproxy.protocol.codes import ApiKey, ErrorCode


@pytest.mark.parametrize(("api", "code", "kind"), [
    (ApiKey.OFFSET_COMMIT, ErrorCode.ILLEGAL_GENERATION, STALE_GENERATION),
    (ApiKey.TXN_OFFSET_COMMIT, ErrorCode.UNKNOWN_MEMBER_ID, STALE_GENERATION),
    (ApiKey.HEARTBEAT, ErrorCode.UNKNOWN_MEMBER_ID, None),  # a rebalance's routine answer, not a commit
    (ApiKey.PRODUCE, ErrorCode.PRODUCER_FENCED, PRODUCER_FENCED),
    (ApiKey.END_TXN, ErrorCode.INVALID_PRODUCER_EPOCH, PRODUCER_FENCED),
    (ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, PRODUCER_SEQUENCE),
    (ApiKey.PRODUCE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER, PRODUCER_SEQUENCE),
    (ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, None),
])
def test_an_answer_code_is_the_kind_of_its_api(api: int, code: int, kind: str | None) -> None:
    assert anomaly_kind(int(api), int(code)) == kind


def test_churn_counts_once_per_minute_at_the_threshold() -> None:
    anomalies = ClientAnomalies(LabelCap(10), AnomalyOptions(churn_per_minute=3))
    for i in range(5):  # five closes within the minute: counted once, at the third
        anomalies.connection_closed("app", float(i))
    assert anomalies.series() == {(CONNECTION_CHURN, "app"): 1}
    for i in range(2):  # a new minute, under the threshold
        anomalies.connection_closed("app", CHURN_WINDOW + i)
    anomalies.connection_closed(None, CHURN_WINDOW)  # a connection that sent nothing: nobody's
    assert anomalies.series() == {(CONNECTION_CHURN, "app"): 1}
    anomalies.connection_closed("app", CHURN_WINDOW + 3)
    assert anomalies.series() == {(CONNECTION_CHURN, "app"): 2}


def test_the_first_anomaly_of_a_client_and_kind_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    anomalies = ClientAnomalies(LabelCap(10))
    with caplog.at_level(logging.WARNING, "kproxy.metrics"):
        for _ in range(3):
            anomalies.answer_error(int(ApiKey.PRODUCE), int(ErrorCode.PRODUCER_FENCED), "zombie producer")
    lines = [r.getMessage() for r in caplog.records if "client_anomaly" in r.getMessage()]
    assert lines == ['event=client_anomaly kind=producer_fenced client_id="zombie producer" detail=PRODUCER_FENCED']
    assert anomalies.series() == {(PRODUCER_FENCED, "zombie producer"): 3}


def test_state_stays_bounded_whatever_ids_clients_make_up() -> None:
    anomalies = ClientAnomalies(LabelCap(5), AnomalyOptions(churn_per_minute=1))
    for i in range(10_000):
        client = f"hostile-{i}-" + "x" * 1000
        anomalies.connection_closed(client, 0.0)
        for kind in KINDS:
            if kind != CONNECTION_CHURN:  # (counted by connection_closed)
                anomalies.seen(kind, client)
    assert len(anomalies.churn) <= 5
    assert len(anomalies.series()) <= 6 * len(KINDS)
    assert all(len(client) <= 128 for _, client in anomalies.series())
    assert (CONNECTION_CHURN, OTHER) not in anomalies.series()  # many clients' connections: no one's churn
    assert anomalies.series()[(STALE_GENERATION, OTHER)] == 10_000 - 5


def _batch(size: int, codec: int) -> bytes:
    """A v2 record batch's first bytes as the checks read them (base offset, length, epoch, magic,
    crc, attributes), padded to ``size``."""
    head = struct.pack(">qiibIh", 0, size - 12, 0, 2, 0, codec)
    return head + b"\0" * (size - len(head))


def test_a_big_batch_without_compression_is_uncompressed_and_a_small_one_is_not() -> None:
    big, small = UNCOMPRESSED_MIN_BYTES, UNCOMPRESSED_MIN_BYTES - 1
    for size, codec, expected in [(big, 0, True), (big, 4, False), (small, 0, False)]:
        frame = b"head" + _batch(size, codec)
        assert uncompressed(frame, [(4, 4 + size, "t")]) is expected, (size, codec)


def _join(watch: GroupWatch, group: str, member: str, now: float, session: float = 6.0) -> None:
    watch.exchange(MembershipRequest(JOIN_GROUP, group, [member], session, False), [], "app", now)


def test_joins_of_one_group_within_the_window_are_a_storm_once() -> None:
    anomalies = ClientAnomalies(LabelCap(10))
    watch = GroupWatch(anomalies, joins=3, window=60.0)
    for i in range(5):
        _join(watch, "g", f"m{i}", float(i))
    _join(watch, "other-group", "m", 1.0)
    # A join refused (MEMBER_ID_REQUIRED, say) is no join.
    watch.exchange(MembershipRequest(JOIN_GROUP, "quiet", ["m"], 6.0, False), [79], "app", 1.0)
    assert anomalies.series() == {(REBALANCE_STORM, "app"): 1}
    for i in range(3):  # the next window
        _join(watch, "g", f"m{i}", 60.0 + i)
    assert anomalies.series() == {(REBALANCE_STORM, "app"): 2}


def test_a_member_silent_past_its_session_without_leave_group_vanished() -> None:
    anomalies = ClientAnomalies(LabelCap(10))
    watch = GroupWatch(anomalies, joins=100, window=60.0)
    for member in ("gone", "left", "alive", "static"):
        watch.exchange(MembershipRequest(JOIN_GROUP, "g", [member], 6.0, member == "static"), [], member, 0.0)
    watch.exchange(MembershipRequest(LEAVE_GROUP, "g", ["left"], 0.0, False), [], "left", 1.0)
    for t in range(1, 12):
        watch.exchange(MembershipRequest(HEARTBEAT, "g", ["alive"], 0.0, False), [], "alive", float(t))
        watch.sweep(float(t))
    assert anomalies.series() == {(VANISHED_MEMBER, "gone"): 1}


def test_group_state_stays_bounded_whatever_groups_clients_make_up() -> None:
    anomalies = ClientAnomalies(LabelCap(5))
    watch = GroupWatch(anomalies, joins=100, window=60.0)
    for i in range(MAX_GROUPS + 500):
        _join(watch, f"group-{i}", f"member-{i}", 0.0)
    assert len(watch.groups) == MAX_GROUPS
    assert len(watch.members) == MAX_MEMBERS


def _idempotent_batch(producer: int, sequence: int, crc: int) -> bytes:
    """A v2 batch header (61 bytes) as the retry watch reads it."""
    return struct.pack(">qiibIhiqqqhii", 0, 49, 0, 2, crc, 0, 0, 0, 0, producer, 0, sequence, 1)


def test_batches_sent_again_within_the_minute_make_a_retry_storm() -> None:
    anomalies = ClientAnomalies(LabelCap(10))
    watch = RetryWatch(anomalies, retries_per_minute=3)
    batch = _idempotent_batch(7, 0, 1234)
    ranges: list[Any] = [(0, len(batch), "t")]
    for i in range(3):  # the first send and two re-sends: under the threshold
        watch.produce(batch, ranges, "app", float(i))
    other = _idempotent_batch(7, 0, 999)  # same producer and sequence, another partition's batch (CRC)
    watch.produce(other, ranges, "app", 3.0)
    plain = _idempotent_batch(-1, 0, 1234)  # not idempotent: never a retry
    for i in range(5):
        watch.produce(plain, ranges, "app", 4.0 + i)
    assert anomalies.series() == {}
    watch.produce(batch, ranges, "app", 10.0)
    assert anomalies.series() == {(RETRY_STORM, "app"): 1}
    watch.produce(batch, ranges, "app", 70.0)  # over a minute after its first send: a new batch's
    assert anomalies.series() == {(RETRY_STORM, "app"): 1}


def test_the_retry_watch_stays_bounded() -> None:
    watch = RetryWatch(ClientAnomalies(LabelCap(5)), retries_per_minute=3)
    for i in range(RETRY_MAX_BATCHES + 1000):
        batch = _idempotent_batch(i, 0, 0)
        watch.produce(batch, [(0, len(batch), "t")], f"client-{i}", 0.0)
    assert len(watch.batches) == RETRY_MAX_BATCHES
