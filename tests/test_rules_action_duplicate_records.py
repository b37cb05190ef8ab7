"""The ``duplicate_records`` action (kproxy/rules/actions/duplicate_records.py) through its
interface: a duplicated Produce batch stored twice by a real broker. The byte-level edit itself:
tests/test_protocol_mutations.py."""

from __future__ import annotations

from kproxy.protocol.record_faults import duplicate_records
from kproxy.protocol.records import Record, decode_all, encode_batch_v2
from kproxy.testing import Broker
from tests.support.e2e import create_topic, unique
from tests.test_protocol_mutations import produce_request, records_of
from tests.test_rules_apply import FETCH, PRODUCE, _fetch, _produce


def test_a_duplicated_produce_batch_is_stored_twice(tansu: Broker) -> None:
    """Without an idempotent producer nothing tells the copies apart: the broker appends both
    (Kafka 3.x refuses more than one batch per partition in Produce v3+ with INVALID_RECORD, 87)."""
    topic = unique("dup")
    create_topic(tansu.bootstrap, topic, partitions=1)
    batch = encode_batch_v2([Record(i, 1_700_000_000_000, None, b"v%d" % i, []) for i in range(3)])
    frame = produce_request(9, batch, topics=(topic,))
    doubled = records_of(PRODUCE, 9, duplicate_records(frame, PRODUCE, 9).frame)[0]
    code = _produce(tansu.bootstrap, topic, doubled)
    assert code in (0, 87)
    if code == 0:
        stored = decode_all(records_of(FETCH, 11, _fetch(tansu.bootstrap, topic))[0])
        assert [(r.offset, r.value) for r in stored] == [(i, b"v%d" % (i % 3)) for i in range(6)]
