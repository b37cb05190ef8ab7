"""The usual Fetch answer read by hand, for what the address rewrite asks of it: whether it ends
without tagged fields of its own (compiled: once per Fetch answer to a KIP-951 client).

From v16 a Fetch response may carry ``node_endpoints``, a top-level tagged field with broker
addresses (KIP-951), so the address rewrite must look at every Fetch answer of those versions:
the splice (:func:`kproxy.protocol.splice.splice_body`) walks the whole body with the generated
codec's skips to reach the tag section, interpreted, partition by partition. A consumer's usual
answer has no tagged field anywhere: this reader walks it in place and says so, and leaves any
other answer to the splice. Field layout: Kafka's FetchResponse message spec (v16-v17: flexible,
topics by id).
"""

from __future__ import annotations

from typing import Final

from kproxy.protocol.primitives import Malformed, read_uvarint

FIRST: Final = 16  # the first version with node_endpoints
LAST: Final = 17  # the last version this reader knows the layout of
# Fixed-size fields before a partition's aborted transactions: partition_index, error_code,
# high_watermark, last_stable_offset, log_start_offset.
_PARTITION_HEAD: Final = 4 + 2 + 8 + 8 + 8
_TOPIC_ID: Final = 16
_ABORTED_ENTRY: Final = 8 + 8  # producer_id, first_offset (then the entry's tagged fields)


def fetch_answer_untagged(buf: bytes, pos: int, api_version: int) -> bool:
    """True when the body at ``buf[pos:]`` is a Fetch response of v16 or v17 with no tagged field
    anywhere (the body's, each topic's, each partition's, each aborted transaction's) and nothing
    after its own empty tag section: no ``node_endpoints`` for the address rewrite to change. False
    for any other answer or for bytes this reader is not sure of: the splice then decides
    (tests/test_scan_shared.py checks the two agree on every cut and changed byte)."""
    if not FIRST <= api_version <= LAST:
        return False
    n = len(buf)
    try:
        pos += 4 + 2 + 4  # throttle_time_ms, error_code, session_id
        topics = buf[pos]  # a compact array: its length + 1 (one byte up to 126 topics)
        pos += 1
        if topics == 0 or topics >= 0x80:
            return False  # null (no answer has it), or more topics than this reader takes: the splice
        for _ in range(topics - 1):
            pos += _TOPIC_ID
            partitions = buf[pos]
            pos += 1
            if partitions >= 0x80:  # (a varint of two bytes or more)
                partitions, pos = read_uvarint(buf, pos - 1)
            if partitions == 0:
                return False
            for _ in range(partitions - 1):
                pos += _PARTITION_HEAD
                aborted = buf[pos]  # nullable: 0 is null
                pos += 1
                if aborted >= 0x80:
                    aborted, pos = read_uvarint(buf, pos - 1)
                for _ in range(aborted - 1 if aborted else 0):
                    pos += _ABORTED_ENTRY
                    if buf[pos]:
                        return False
                    pos += 1
                pos += 4  # preferred_read_replica
                size = buf[pos]  # records, nullable: 0 is null
                pos += 1
                if size >= 0x80:
                    size, pos = read_uvarint(buf, pos - 1)
                if size:
                    pos += size - 1
                if buf[pos]:  # the partition's tagged fields (diverging_epoch, current_leader...)
                    return False
                pos += 1
            if buf[pos]:  # the topic's tagged fields
                return False
            pos += 1
    except (IndexError, ValueError, Malformed):
        return False
    return pos + 1 == n and buf[pos] == 0
