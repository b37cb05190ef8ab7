"""Consumer lag as kproxy tracks and exports it (kproxy/metrics/consumer_lag.py, lag_exposition.py), sans-IO.

Frames built with kproxy's codec go through a real :class:`~kproxy.proxy.session.Session` whose
observer is the metrics' (as the server wires them), on a clock the test moves:

* every version of OffsetCommit, OffsetFetch, Fetch and ListOffsets teaches the tracker what it
  should (topic ids named from Metadata answers, learnt before or after);
* every version of Produce gives each partition it appended to its log end offset (the answer's
  base offset plus the request's records there), one partition or several, v2 batches or legacy
  message sets; acks=0, refused partitions, a request a rule replaced and answers older than one
  seen teach nothing;
* lag is watermark less committed offset, never below 0; values not seen again within the
  staleness window leave the series (and the tracker's tables), they never freeze;
* a group's committed offsets stay while kproxy sees the group (every version of every group
  request the coordinator accepted, an offset the broker accepted or reports), past the window of
  their commit; not after a LeaveGroup, nor those committed before a rebalance the group's members
  were seen to join; a request refused or not answered is no sighting;
* bounds: ids past 255 characters kept cut (and apart); each table within its keys and its bytes,
  keys evicted oldest first and counted; at most ``label_cap`` groups and topics named, the rest
  folded into ``other`` (lag_sum) or left out and counted; 100,000 groups and 100,000 topics leave
  /metrics under 1 MB;
* the options: per-partition lag only when asked; no lag series (and plain scans) when off.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.metrics.consumer_lag import ConsumerLag
from kproxy.metrics.exposition import LiveGauges, make_registry
from kproxy.metrics.labels import MAX_LABEL_LENGTH
from kproxy.metrics.lag_exposition import SERIES_PER_LABEL, ConsumerLagCollector, lag_series
from kproxy.metrics.stats import StatsOptions, TrafficStats
from kproxy.metrics.traffic_observer import MetricsObserver
from kproxy.protocol.compression import Codec
from kproxy.protocol.frame_builder import request_frame, response_frame
from kproxy.protocol.message_schemas import MessageType, supported_versions
from kproxy.protocol.offset_reads import GROUP_REQUESTS
from kproxy.protocol.records import Record, encode_batch_v2, encode_message_set
from kproxy.protocol.scan import scanner
from kproxy.proxy.address_rewrite import ResponseRewriter
from kproxy.proxy.addresses import AddressMap
from kproxy.proxy.session import Session

PRODUCE, FETCH, LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 2, 3, 8, 9
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
KEPT_CHARS = 255  # the longest group id or topic name the tracker keys (kproxy.metrics.consumer_lag.MAX_ID_LENGTH)
TOPIC_ID = uuid.UUID(int=0xABC)


def produce_records(n: int, version: int, codec: int = Codec.NONE) -> bytes:
    """``n`` records as a producer of that Produce version sends them: a v2 batch from v3 (KIP-98),
    a legacy message set before (magic 1 from v2, magic 0 before)."""
    found = [Record(offset=i, timestamp=1000 + i, key=None, value=b"v%d" % i) for i in range(n)]
    if version >= 3:
        return encode_batch_v2(found, codec=codec)
    return encode_message_set(found, magic=1 if version == 2 else 0, codec=codec)


def versions(api_key: int) -> range:
    span = supported_versions(api_key)
    assert span is not None
    return range(span[0], span[1] + 1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Proxy:
    """One connection's sans-IO session with the metrics' observer and a lag tracker, as the server wires them."""

    def __init__(self, *, stale_after: float = 300.0, max_keys: int = 50_000, lag: bool = True,
                 policy: Any = None) -> None:
        self.clock = Clock()
        self.lag = ConsumerLag(stale_after=stale_after, max_keys=max_keys) if lag else None
        self.stats = TrafficStats(StatsOptions(consumer_lag=lag))
        self.session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=self.clock,
                               observer=MetricsObserver(self.stats, self.lag).for_broker(None), policy=policy)
        self.correlation_id = 0

    def exchange(self, api_key: int, api_version: int, request: dict[str, Any], response: dict[str, Any] | None
                 ) -> list[Any]:
        """One request and its answer (None: none is due) through the session; the commands it returned."""
        self.correlation_id += 1
        out = self.session.receive_client(request_frame(api_key, api_version, self.correlation_id, **request))
        self.session.report()
        if response is not None:
            out += self.session.receive_upstream(response_frame(api_key, api_version, self.correlation_id,
                                                                **response))
            self.session.report()
        return out

    def produce(self, version: int, records: dict[int, int], bases: dict[int, int], *, topic: str = "orders",
                refused: tuple[int, ...] = (), acks: int = -1, codec: int = Codec.NONE) -> list[Any]:
        """A Produce of ``records[p]`` records to each partition ``p`` (one batch each, in the record format
        of that version), answered with base offset ``bases[p]`` (NOT_LEADER_OR_FOLLOWER for ``refused``)."""
        data = [{"index": p, "records": produce_records(n, version, codec)} for p, n in records.items()]
        answer = [{"index": p, "error_code": 6 if p in refused else 0, "base_offset": -1 if p in refused else bases[p]}
                  for p in records]
        return self.exchange(PRODUCE, version, {"acks": acks, "timeout_ms": 1000, "topic_data": [
            {"name": topic, "topic_id": TOPIC_ID, "partition_data": data}]},
            None if acks == 0 else {"responses": [{"name": topic, "topic_id": TOPIC_ID,
                                                   "partition_responses": answer}]})

    def group(self, api_key: int, version: int, group: str, code: int | None = 0) -> None:
        """A group request naming ``group``, answered with error code ``code`` (None: no answer)."""
        self.exchange(api_key, version, {"group_id": group, "member_id": "m-1", "groups": [{"group_id": group}]},
                      None if code is None else {"error_code": code})

    def commit(self, version: int, group: str, topic: str, offsets: dict[int, int], refused: tuple[int, ...] = ()
               ) -> None:
        self.exchange(OFFSET_COMMIT, version, {"group_id": group, "topics": [{
            "name": topic, "topic_id": TOPIC_ID, "partitions": [
                {"partition_index": p, "committed_offset": o} for p, o in offsets.items()]}]},
            {"topics": [{"name": topic, "topic_id": TOPIC_ID, "partitions": [
                {"partition_index": p, "error_code": 22 if p in refused else 0} for p in offsets]}]})

    def fetch(self, version: int, topic: str, marks: dict[int, int]) -> None:
        self.exchange(FETCH, version, {}, {"responses": [{"topic": topic, "topic_id": TOPIC_ID, "partitions": [
            {"partition_index": p, "high_watermark": hw} for p, hw in marks.items()]}]})

    def metadata(self, topic: str) -> None:
        self.exchange(METADATA, 12, {}, {"topics": [{"name": topic, "topic_id": TOPIC_ID}]})

    @property
    def view(self) -> Any:
        assert self.lag is not None
        return self.lag.view(self.clock.now)


@pytest.mark.parametrize("version", versions(OFFSET_COMMIT))
def test_every_offset_commit_version_commits_what_the_broker_accepted(version: int) -> None:
    proxy = Proxy()
    proxy.metadata("orders")  # (v10 names topics by id)
    proxy.commit(version, "billing", "orders", {0: 5, 1: 9, 2: 3}, refused=(1,))
    assert proxy.view.committed == {("billing", "orders", 0): 5, ("billing", "orders", 2): 3}


@pytest.mark.parametrize("version", versions(FETCH))
def test_every_fetch_version_gives_watermarks_and_the_lag(version: int) -> None:
    proxy = Proxy()
    proxy.metadata("orders")
    proxy.commit(8, "billing", "orders", {0: 5, 1: 9})
    proxy.fetch(version, "orders", {0: 12, 1: 9})
    view = proxy.view
    assert view.watermarks == {("orders", 0): 12, ("orders", 1): 9}
    assert view.lag == {("billing", "orders", 0): 7, ("billing", "orders", 1): 0}


@pytest.mark.parametrize("version", versions(OFFSET_FETCH))
def test_every_offset_fetch_version_reports_committed_offsets(version: int) -> None:
    proxy = Proxy()
    proxy.metadata("orders")
    partitions = [{"partition_index": 0, "committed_offset": 30}, {"partition_index": 1, "committed_offset": -1}]
    found = [{"name": "orders", "topic_id": TOPIC_ID, "partitions": partitions}]
    proxy.exchange(OFFSET_FETCH, version, {"group_id": "audit", "groups": [{"group_id": "audit"}]},
                   {"topics": found, "groups": [{"group_id": "audit", "topics": found}]})
    assert proxy.view.committed == {("audit", "orders", 0): 30}


@pytest.mark.parametrize("version", versions(LIST_OFFSETS))
def test_every_list_offsets_version_gives_the_latest_offset_as_watermark(version: int) -> None:
    proxy = Proxy()
    partitions = [{"partition_index": 0, "timestamp": -1}, {"partition_index": 1, "timestamp": -2}]
    proxy.exchange(LIST_OFFSETS, version, {"topics": [{"name": "orders", "partitions": partitions}]},
                   {"topics": [{"name": "orders", "partitions": [
                       {"partition_index": p, "offset": 50 - 50 * p, "old_style_offsets": [50 - 50 * p]}
                       for p in (0, 1)]}]})
    assert proxy.view.watermarks == {("orders", 0): 50}  # -2 (earliest) is not a watermark


@pytest.mark.parametrize("version", versions(PRODUCE))
def test_every_produce_version_gives_the_log_end_offsets_of_what_it_appended(version: int) -> None:
    proxy = Proxy()
    proxy.metadata("orders")  # (v13 names topics by id)
    proxy.commit(8, "billing", "orders", {0: 5, 1: 20, 2: 1})
    # One partition (the answer a producer usually gets, read by hand), then several (the generated scan).
    proxy.produce(version, {0: 3}, {0: 10})
    assert proxy.view.watermarks == {("orders", 0): 13}
    proxy.produce(version, {0: 4, 1: 7, 2: 2}, {0: 13, 1: 20, 2: 30}, refused=(2,), codec=Codec.GZIP)
    view = proxy.view
    assert view.watermarks == {("orders", 0): 17, ("orders", 1): 27}  # partition 2 refused: nothing appended
    assert view.lag == {("billing", "orders", 0): 12, ("billing", "orders", 1): 7}


def test_a_produce_with_acks_0_teaches_nothing_even_answered() -> None:
    proxy = Proxy()
    # acks=0: the client expects no answer; a broker that sends one anyway (Tansu does) has it dropped.
    proxy.produce(9, {0: 3}, {0: 10}, acks=0)
    proxy.session.receive_upstream(response_frame(PRODUCE, 9, proxy.correlation_id, responses=[
        {"name": "orders", "partition_responses": [{"index": 0, "base_offset": 50}]}]))
    proxy.session.report()
    assert not proxy.session.in_flight and proxy.view.watermarks == {}
    proxy.produce(9, {0: 3}, {0: 13}, acks=1)
    assert proxy.view.watermarks == {("orders", 0): 16}


def test_a_produce_answer_only_moves_a_watermark_forward_but_a_fetch_answer_sets_it() -> None:
    proxy = Proxy(stale_after=60)
    proxy.produce(9, {0: 5}, {0: 100})
    proxy.clock.now += 0.1
    proxy.produce(9, {0: 5}, {0: 90})  # another connection's answer, older: it reached kproxy later
    assert proxy.view.watermarks == {("orders", 0): 105}
    proxy.clock.now += 0.1
    proxy.fetch(11, "orders", {0: 103})  # acks=1: the followers have not all of it yet
    assert proxy.view.watermarks == {("orders", 0): 103}
    proxy.produce(9, {0: 1}, {0: 105})
    assert proxy.view.watermarks == {("orders", 0): 106}
    proxy.clock.now += 61  # stale: the topic was deleted and made again, say; a lower end is taken
    proxy.produce(9, {0: 2}, {0: 0})
    assert proxy.view.watermarks == {("orders", 0): 2}
    assert proxy.lag is not None and [v[:2] for v in proxy.lag.watermarks.values()] == [(2, proxy.clock.now)]


def test_a_produce_a_rule_replaced_teaches_nothing() -> None:
    from kproxy.metrics.fault_stats import FaultStats
    from kproxy.policy.live_rules import LiveRules
    from kproxy.rules import load_text

    rules = """
seed: 1
rules:
  - id: twice
    match: {api: produce, topic: dup}
    actions:
      - duplicate_records: {copies: 2}
  - id: held
    match: {api: produce, topic: orders}
    actions:
      - delay: {ms: 0}
"""
    proxy = Proxy(policy=LiveRules(load_text(rules), counts=FaultStats()).policy("127.0.0.1:5555"))
    sizes = []
    for topic in ("dup", "orders"):
        out = proxy.produce(9, {0: 3}, {0: 10}, topic=topic)
        sizes.append(sum(len(c.data) for c in out if type(c).__name__ == "ForwardUpstream"))
    assert sizes[0] > sizes[1] + 100  # the broker got three copies of the dup batch (nine records)...
    assert proxy.view.watermarks == {("orders", 0): 13}  # ... which the request read does not say: not counted


@pytest.mark.parametrize(("api_key", "version"), [(a, v) for a in sorted(GROUP_REQUESTS) for v in versions(a)])
def test_every_group_request_keeps_the_groups_committed_offsets_past_the_window(api_key: int, version: int) -> None:
    proxy = Proxy(stale_after=60)
    assert proxy.lag is not None
    if api_key == JOIN_GROUP:  # a sighting that begins a rebalance (kept: the offsets committed from then on)
        proxy.group(JOIN_GROUP, version, "billing")
        assert proxy.lag.groups["billing"] == (proxy.clock.now, proxy.clock.now)
        api_key, version = HEARTBEAT, 4
    proxy.commit(8, "billing", "orders", {0: 5})
    proxy.commit(8, "gone", "orders", {0: 7})
    for _ in range(12):  # ten minutes of the group's requests every 50 s, and of watermarks; no commit
        proxy.clock.now += 50
        proxy.group(api_key, version, "billing")
        proxy.fetch(11, "orders", {0: 40})
    view = proxy.view
    assert view.committed == {("billing", "orders", 0): 5} and view.lag == {("billing", "orders", 0): 35}
    assert proxy.lag is not None and [k[0] for k in proxy.lag.committed] == ["billing"]  # "gone" expired
    proxy.clock.now += 61  # no sighting since: it goes too
    assert proxy.view.committed == {}


@pytest.mark.parametrize("api_key", sorted(GROUP_REQUESTS))
def test_a_group_request_the_coordinator_refused_or_never_answered_is_no_sighting(api_key: int) -> None:
    """Any client can name any group: only the coordinator's answer without error says a member is
    there (UNKNOWN_MEMBER_ID, NOT_COORDINATOR, ... or no answer: nothing kept)."""
    proxy = Proxy(stale_after=60)
    assert proxy.lag is not None
    proxy.commit(8, "billing", "orders", {0: 5})
    version = versions(api_key)[-1]
    for code in (25, 16, 15):  # UNKNOWN_MEMBER_ID, NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE
        proxy.clock.now += 25
        proxy.group(api_key, version, "billing", code)
        proxy.group(api_key, version, f"probe-{code}", code)
    assert list(proxy.lag.groups) == ["billing"]  # (its commit's sighting only)
    assert proxy.view.committed == {}  # 75 s since the commit, the group not seen since
    proxy.group(api_key, version, "billing")
    assert list(proxy.lag.groups) == ["billing"] and proxy.lag.groups["billing"][0] == proxy.clock.now
    proxy.group(api_key, version, "probe-unanswered", None)  # (the last: answers go in order)
    assert list(proxy.lag.groups) == ["billing"]


def test_only_offsets_the_broker_accepted_or_reports_are_sightings_of_their_group() -> None:
    proxy = Proxy(stale_after=60)
    assert proxy.lag is not None
    proxy.commit(8, "refused", "orders", {0: 5, 1: 6}, refused=(0, 1))  # every partition refused
    proxy.exchange(OFFSET_FETCH, 8, {"groups": [{"group_id": "asked"}]}, {"groups": [  # none committed (-1)
        {"group_id": "asked", "topics": [{"name": "orders", "partitions": [
            {"partition_index": 0, "committed_offset": -1}]}]},
        {"group_id": "failed", "error_code": 16, "topics": []}]})
    proxy.exchange(OFFSET_FETCH, 7, {"group_id": "old"}, {"error_code": 16, "topics": []})
    assert not proxy.lag.groups and not proxy.lag.committed
    proxy.commit(8, "billing", "orders", {0: 5, 1: 6}, refused=(1,))
    proxy.exchange(OFFSET_FETCH, 8, {"groups": [{"group_id": "audit"}]}, {"groups": [
        {"group_id": "audit", "topics": [{"name": "orders", "partitions": [
            {"partition_index": 0, "committed_offset": 9}]}]}]})
    assert list(proxy.lag.groups) == ["billing", "audit"]
    assert proxy.view.committed == {("billing", "orders", 0): 5, ("audit", "orders", 0): 9}


def test_ids_past_the_cut_are_kept_short_and_apart_and_labelled_as_before() -> None:
    """Group ids (and topic names) of 32 KiB, two sharing all but their last character: each
    kept as a 255-character key of its own; the label is cut as every label is."""
    proxy = Proxy()
    assert proxy.lag is not None
    base = "g" * 32766
    proxy.commit(8, base + "1", "t" * 32767, {0: 1})
    proxy.commit(8, base + "2", "t" * 32767, {0: 2})
    proxy.group(HEARTBEAT, 4, base + "1")
    keys = list(proxy.lag.committed)
    assert len(keys) == 2 and keys[0][0] != keys[1][0] and keys[0][1] == keys[1][1]
    assert {len(k[0]) for k in keys} == {len(k[1]) for k in keys} == {KEPT_CHARS}  # type: ignore[arg-type]
    assert list(proxy.lag.groups) == [keys[0][0], keys[1][0]]  # the Heartbeat's is the commit's key
    assert all(k[0].startswith("g" * 200) and "~" in k[0] for k in keys)
    proxy.fetch(11, "t" * 32767, {0: 10})
    _, families = scrape(proxy)
    groups = [dict(k)["group"] for k in families["kproxy_consumergroup_lag_sum"]]
    assert sorted(groups) == ["g" * (MAX_LABEL_LENGTH - 1) + "~", "other"]


def test_each_table_keeps_within_its_byte_bound_and_counts_what_it_lets_go() -> None:
    """Confirmed commits and sightings of ever new long ids: each table stops at ``max_bytes`` (an
    estimate on the high side: tracemalloc counts less), evicting the oldest; when they go stale
    the estimate returns to nothing."""
    import tracemalloc

    budget = 1024 * 1024
    lag = ConsumerLag(stale_after=60, max_bytes=budget)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20_000):
            group = f"{i:08d}-" + "x" * 500
            lag.commit([(group, "orders-" + "y" * 300, i % 3, i)], 1000.0, True)
            lag.watermark([(f"{i:08d}" + "z" * 300, 0, i)], 1000.0)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    for table in ("committed", "watermark", "group"):
        assert 0 < getattr(lag, f"{table}_bytes") <= budget
    assert held < 3 * budget, f"{held} bytes held"
    kept = len(lag.committed), len(lag.watermarks), len(lag.groups)
    assert all(1000 < n < 20_000 for n in kept), kept
    assert lag.evicted == {"committed_offset": 20_000 - kept[0], "high_watermark": 20_000 - kept[1],
                           "group": 20_000 - kept[2], "write_time": 0}
    lag.watermark([], 1061.0)  # an expiry pass: everything is stale
    assert (lag.committed_bytes, lag.watermark_bytes, lag.group_bytes) == (0, 0, 0)
    assert not lag.committed and not lag.watermarks and not lag.groups


def test_a_leave_group_is_no_sighting() -> None:
    proxy = Proxy(stale_after=60)
    proxy.commit(8, "billing", "orders", {0: 5})
    proxy.clock.now += 50
    proxy.group(HEARTBEAT, 4, "billing")
    proxy.clock.now += 50
    proxy.group(LEAVE_GROUP, 5, "billing")
    assert proxy.view.committed == {("billing", "orders", 0): 5}
    proxy.clock.now += 11  # 61 s after the last heartbeat
    assert proxy.view.committed == {}


def test_a_rebalance_ends_the_keeping_of_offsets_committed_before_it() -> None:
    """A JoinGroup: the members ask for the offsets of the partitions they now have (OffsetFetch),
    which keeps those; a partition a member behind another kproxy now has ages out here."""
    proxy = Proxy(stale_after=60)
    proxy.commit(8, "billing", "orders", {0: 5, 1: 8})
    proxy.clock.now += 30
    proxy.group(JOIN_GROUP, 9, "billing")
    proxy.group(SYNC_GROUP, 5, "billing")
    partitions = [{"partition_index": 0, "committed_offset": 5}]  # this member was given partition 0
    proxy.exchange(OFFSET_FETCH, 8, {"groups": [{"group_id": "billing"}]}, {"groups": [
        {"group_id": "billing", "topics": [{"name": "orders", "partitions": partitions}]}]})
    for _ in range(6):
        proxy.clock.now += 20
        proxy.group(HEARTBEAT, 4, "billing")
    assert proxy.view.committed == {("billing", "orders", 0): 5}


def test_a_kept_offset_is_looked_at_once_a_window_and_the_group_table_is_bounded() -> None:
    proxy = Proxy(stale_after=60, max_keys=4)
    assert proxy.lag is not None
    proxy.commit(8, "billing", "orders", {0: 5, 1: 6})
    proxy.clock.now += 61
    proxy.group(HEARTBEAT, 4, "billing")  # an expiry pass: both put back, stamped now
    assert [v[:3] for v in proxy.lag.committed.values()] == [(5, 1000.0, proxy.clock.now), (6, 1000.0, proxy.clock.now)]
    proxy.clock.now += 30
    proxy.group(HEARTBEAT, 4, "billing")  # within their new window: not looked at again
    assert [v[2] for v in proxy.lag.committed.values()] == [1061.0, 1061.0]
    for i in range(5):
        proxy.group(HEARTBEAT, 4, f"other-{i}")
    assert len(proxy.lag.groups) == 4 and proxy.lag.evicted["group"] == 2  # billing, the oldest, went first
    assert proxy.view.committed == {}  # no longer kept: their commit is older than the window


def test_topic_ids_learnt_after_the_watermarks_name_them_at_the_next_scrape() -> None:
    proxy = Proxy()
    proxy.commit(8, "billing", "orders", {0: 5})
    proxy.fetch(13, "orders", {0: 8})  # by id, not known yet
    assert proxy.view.watermarks == {(str(TOPIC_ID), 0): 8} and proxy.view.lag == {}
    proxy.metadata("orders")
    assert proxy.view.watermarks == {("orders", 0): 8}
    assert proxy.view.lag == {("billing", "orders", 0): 3}
    proxy.clock.now += 10
    proxy.fetch(11, "orders", {0: 20})  # the same partition by name, later: the fresher counts
    assert proxy.view.watermarks == {("orders", 0): 20}


def test_lag_is_never_negative_and_follows_the_last_values_seen() -> None:
    proxy = Proxy()
    proxy.fetch(11, "orders", {0: 10})
    proxy.commit(8, "billing", "orders", {0: 14})  # committed past the last watermark seen: the log grew since
    assert proxy.view.lag == {("billing", "orders", 0): 0}
    proxy.clock.now += 5
    proxy.fetch(11, "orders", {0: 30})
    assert proxy.view.lag == {("billing", "orders", 0): 16}


def test_stale_values_disappear_from_the_series_and_the_tables() -> None:
    proxy = Proxy(stale_after=60)
    proxy.commit(8, "stopped", "orders", {0: 5})
    proxy.commit(8, "live", "orders", {0: 9})
    proxy.fetch(11, "orders", {0: 10})
    for _ in range(7):  # the live group commits and fetches every 10 s; the stopped one never again
        proxy.clock.now += 10
        proxy.commit(8, "live", "orders", {0: 10})
        proxy.fetch(11, "orders", {0: 10})
    view = proxy.view
    assert view.lag == {("live", "orders", 0): 0}
    assert ("stopped", "orders", 0) not in view.committed
    assert proxy.lag is not None and [k[0] for k in proxy.lag.committed] == ["live"]  # expired, not just hidden
    proxy.clock.now += 61  # nothing seen since: every series goes, none frozen
    assert proxy.view.committed == {} and proxy.view.watermarks == {} and proxy.view.lag == {}


def test_the_tables_are_bounded_oldest_first_and_evictions_counted() -> None:
    proxy = Proxy(max_keys=3)
    for group in ("a", "b", "c", "d", "e"):
        proxy.clock.now += 1
        proxy.commit(8, group, "orders", {0: 1})
    proxy.clock.now += 1
    proxy.commit(8, "c", "orders", {0: 2})  # updated: now the newest
    proxy.commit(8, "f", "orders", {0: 1})
    assert proxy.lag is not None
    assert [k[0] for k in proxy.lag.committed] == ["e", "c", "f"]
    assert proxy.lag.evicted == {"committed_offset": 3, "high_watermark": 0, "group": 3,
                                 "write_time": 0}  # (six groups seen)


def test_malformed_answers_and_requests_teach_nothing() -> None:
    proxy = Proxy()
    good = request_frame(OFFSET_COMMIT, 8, 1, group_id="g", topics=[{"name": "t", "partitions": [
        {"partition_index": 0, "committed_offset": 4}]}])
    answer = response_frame(OFFSET_COMMIT, 8, 1, topics=[{"name": "t", "partitions": [{"partition_index": 0}]}])
    fetch = response_frame(FETCH, 11, 2, responses=[{"topic": "t", "partitions": [{"high_watermark": 9}]}])
    cut = len(good) - 20
    for request, response in ((_resized(good[:cut]), answer), (good, _resized(answer[:-3]))):
        proxy.session.receive_client(request)
        proxy.session.report()
        proxy.session.receive_upstream(response)
        proxy.session.report()
    proxy.session.receive_client(request_frame(FETCH, 11, 2))
    proxy.session.report()
    proxy.session.receive_upstream(_resized(fetch[:-10]))
    proxy.session.report()
    assert proxy.lag is not None and not proxy.lag.committed and not proxy.lag.watermarks
    assert proxy.stats.undecodable_responses == {"offset_commit": 1, "fetch": 1}


def _resized(frame: bytes) -> bytes:
    """``frame`` with its size prefix fitted to what is left of it."""
    return (len(frame) - 4).to_bytes(4, "big") + frame[4:]


# -- exposition ---------------------------------------------------------------------------------------
def scrape(proxy: Proxy, *, label_cap: int = 100, partitions: bool = True) -> tuple[bytes, dict[str, Any]]:
    assert proxy.lag is not None
    collector = ConsumerLagCollector(proxy.lag, label_cap=label_cap, partitions=partitions, clock=proxy.clock)
    text = generate_latest(make_registry(proxy.stats, LiveGauges, lag=collector))
    return text, {f.name: {tuple(sorted(s.labels.items())): s.value for s in f.samples}
                  for f in text_string_to_metric_families(text.decode())}


def test_the_series_carry_kafka_exporters_names_and_per_partition_lag_only_when_asked() -> None:
    proxy = Proxy()
    proxy.commit(8, "billing", "orders", {0: 5, 1: 6})
    proxy.fetch(11, "orders", {0: 12, 1: 6})
    _, families = scrape(proxy)
    assert families["kproxy_consumergroup_lag_sum"] == {(("group", "billing"), ("topic", "orders")): 7}
    assert families["kproxy_consumergroup_lag"] == {
        (("group", "billing"), ("partition", "0"), ("topic", "orders")): 7,
        (("group", "billing"), ("partition", "1"), ("topic", "orders")): 0}
    assert families["kproxy_consumergroup_committed_offset"][
        (("group", "billing"), ("partition", "0"), ("topic", "orders"))] == 5
    assert families["kproxy_partition_high_watermark"][(("partition", "1"), ("topic", "orders"))] == 6
    _, families = scrape(proxy, partitions=False)
    assert "kproxy_consumergroup_lag" not in families and "kproxy_consumergroup_lag_sum" in families


def test_groups_and_topics_past_the_label_cap_fold_into_other_or_are_left_out() -> None:
    proxy = Proxy()
    for i, lag in enumerate((50, 40, 30, 20, 10)):
        proxy.commit(8, f"g{i}", f"t{i}", {0: 100})
        proxy.fetch(11, f"t{i}", {0: 100 + lag})
    _, families = scrape(proxy, label_cap=2)
    assert families["kproxy_consumergroup_lag_sum"] == {  # the two with the most lag named, the rest summed
        (("group", "g0"), ("topic", "t0")): 50, (("group", "g1"), ("topic", "t1")): 40,
        (("group", "other"), ("topic", "other")): 60}
    assert {dict(k)["group"] for k in families["kproxy_consumergroup_committed_offset"]} == {"g0", "g1"}
    assert {dict(k)["topic"] for k in families["kproxy_partition_high_watermark"]} == {"t0", "t1"}
    omitted = {dict(k)["family"]: v for k, v in families["kproxy_consumergroup_lag_series_omitted"].items()}
    assert omitted == {"lag_sum": 0, "lag": 3, "committed_offset": 3, "high_watermark": 3, "lag_seconds": 0,
                       "partition_lag_seconds": 0, "catchup_seconds": 0}


def test_long_names_are_cut_as_labels_and_a_clash_is_not_named() -> None:
    proxy = Proxy()
    base = "g" * 300
    proxy.commit(8, base + "1", "orders", {0: 1})
    proxy.commit(8, base + "2", "orders", {0: 2})
    proxy.fetch(11, "orders", {0: 10})
    _, families = scrape(proxy)
    groups = [dict(k)["group"] for k in families["kproxy_consumergroup_lag_sum"]]
    assert sorted(groups) == ["g" * (MAX_LABEL_LENGTH - 1) + "~", "other"]


def test_each_family_holds_at_most_its_series_budget() -> None:
    proxy = Proxy()
    cap = 2
    marks = {p: 10 for p in range(SERIES_PER_LABEL * cap + 5)}
    for group in ("a", "b"):
        proxy.commit(8, group, "orders", dict.fromkeys(marks, 1))
    proxy.fetch(11, "orders", marks)
    series = lag_series(proxy.view, cap, True)
    assert len(series.committed) == len(series.lag) == len(series.watermarks) == SERIES_PER_LABEL * cap
    assert series.omitted["committed_offset"] == 2 * len(marks) - SERIES_PER_LABEL * cap


def test_a_flood_of_groups_and_topics_leaves_metrics_under_a_megabyte() -> None:
    """100,000 groups and 100,000 topics (an OffsetFetch v8 answer naming each group, a Fetch answer
    of each topic's watermark): the tracker keeps its bound, /metrics stays small."""
    proxy = Proxy()
    n = 100_000
    proxy.exchange(OFFSET_FETCH, 8, {"groups": [{"group_id": "probe"}]}, {"groups": [
        {"group_id": f"group-{i:06d}-{'x' * 40}", "topics": [{"name": f"topic-{i:06d}", "partitions": [
            {"partition_index": 0, "committed_offset": 1}]}]} for i in range(n)]})
    proxy.exchange(FETCH, 11, {}, {"responses": [{"topic": f"topic-{i:06d}", "partitions": [
        {"partition_index": 0, "high_watermark": 2 + i % 7}]} for i in range(n)]})
    lag = proxy.lag
    assert lag is not None
    # The byte bound binds before the key cap (each entry carries its rate's fields too).
    assert 40_000 < len(lag.watermarks) <= 50_000 and lag.watermark_bytes <= lag.max_bytes
    assert 30_000 < len(lag.committed) < 50_000 and lag.committed_bytes <= lag.max_bytes
    assert lag.evicted == {"committed_offset": n - len(lag.committed), "high_watermark": n - len(lag.watermarks),
                           "group": n - len(lag.groups),
                           "write_time": 0}  # (each group reported with an offset: a sighting)
    text, families = scrape(proxy)
    assert len(text) < 1_000_000, len(text)
    assert len(families["kproxy_consumergroup_committed_offset"]) == 100
    assert sum(families["kproxy_consumergroup_lag_sum"].values()) == sum(proxy.view.lag.values())


def test_without_the_option_nothing_is_tracked_and_answers_are_scanned_as_before() -> None:
    proxy = Proxy(lag=False)
    proxy.commit(8, "billing", "orders", {0: 5})
    proxy.fetch(11, "orders", {0: 9})
    kinds = proxy.stats.brokers["bootstrap"].kinds
    assert not any(k.values for k in kinds.values())
    assert kinds[FETCH << 16 | 11].scanner is scanner(FETCH, 11, MessageType.RESPONSE, errors_only=True)
    with_lag = Proxy()
    with_lag.fetch(11, "orders", {0: 9})
    fetch = with_lag.stats.brokers["bootstrap"].kinds[FETCH << 16 | 11]
    assert fetch.values and fetch.scanner is scanner(FETCH, 11, MessageType.RESPONSE, errors_only=True, values=True)


@pytest.mark.parametrize(("options", "tracked", "per_partition"), [
    ({}, True, False),
    ({"metrics__consumer_lag_partitions": True}, True, True),
    ({"metrics__consumer_lag": False}, False, False),
    ({"metrics__scan_responses": False}, False, False),  # the lag reads the answers' scans
])
def test_kproxy_run_tracks_lag_by_default_and_as_its_options_say(options: dict[str, Any], tracked: bool,
                                                                  per_partition: bool) -> None:
    from kproxy.server.proxy_server import ProxyServer
    from kproxy.testing.proxy_thread import proxy_config

    server = ProxyServer(proxy_config("127.0.0.1:9", metrics__consumer_lag_stale_after=42, **options))
    assert (server.lag is not None) == tracked and server.stats.options.consumer_lag == tracked
    collector = server._lag_collector()
    assert (collector is not None) == tracked
    if collector is not None:
        assert server.lag is not None and server.lag.stale_after == 42
        names = {family.name for family in collector.collect()}
        assert ("kproxy_consumergroup_lag" in names) == per_partition
        assert "kproxy_consumergroup_lag_sum" in names
