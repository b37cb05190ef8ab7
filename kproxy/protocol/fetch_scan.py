"""The usual Fetch answer of a KIP-951 client (v16-v17) read by hand: whether it ends without
tagged fields of its own (the address rewrite), and what the errors-only scan finds in it (the
metrics and consumer lag). Compiled: once per Fetch answer.

From v16 a Fetch response may carry ``node_endpoints``, a top-level tagged field with broker
addresses (KIP-951), so the address rewrite must look at every Fetch answer of those versions:
the splice (:func:`kproxy.protocol.splice.splice_body`) walks the whole body with the generated
codec's skips to reach the tag section, interpreted, partition by partition; the metrics' scan
(:func:`kproxy.protocol.scan.scanner`, errors only) walks it again. A consumer's usual answer
has no tagged field anywhere and counts of one byte: this module walks it in place once per
reader and leaves any other answer to the splice and the scanner. Field layout: Kafka's
FetchResponse message spec (v16-v17: flexible, topics by id).
"""

from __future__ import annotations

import uuid
from typing import Final

from librt.strings import read_i16_be, read_i32_be, read_i64_be

from kproxy.protocol.primitives import Malformed, read_uvarint
from kproxy.protocol.scan_types import Entry, RecordsRange, RequestScan, ScanEntries

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
    return _walk(buf, pos, api_version, None, None) >= 0


def fetch_answer_scan(buf: bytes, pos: int, api_version: int, values: bool = False) -> RequestScan | None:
    """What the errors-only scanner of a Fetch response finds in the body at ``buf[pos:]``, for the
    answer :func:`fetch_answer_untagged` takes: ``(entries, records ranges)``, entries for each
    partition with a non-zero error code and then the body's own, a records range per partition
    that carried records. ``values``: the values-mode scanner's (consumer lag's high watermarks):
    the entries are then a :class:`ScanEntries` whose values hold each partition's ``(topic, index,
    code, high_watermark)``. None for any other answer: the generated scanner then decides
    (tests/test_scan_shared.py checks the two agree on every cut and changed byte)."""
    if not FIRST <= api_version <= LAST:
        return None  # (before making the lists: most Fetch answers of other clients end here)
    acc: list[Entry] = ScanEntries.empty() if values else []
    ranges: list[RecordsRange] = []
    if _walk(buf, pos, api_version, acc, ranges) < 0:
        return None
    code: int = read_i16_be(buf, pos + 4)
    if code:
        acc.append((None, None, code))
    return acc, ranges


def _walk(buf: bytes, pos: int, api_version: int, acc: list[Entry] | None, ranges: list[RecordsRange] | None) -> int:
    """Where the empty tag section of the usual v16-v17 answer at ``buf[pos:]`` is (its last byte),
    -1 for any other; with ``acc``, each partition's error entry (and, a ScanEntries, its value)
    and records range added as the scanner adds them."""
    if not FIRST <= api_version <= LAST:
        return -1
    values = acc.values if type(acc) is ScanEntries else None
    try:
        pos += 4 + 2 + 4  # throttle_time_ms, error_code, session_id
        topics = buf[pos]  # a compact array: its length + 1 (one byte up to 126 topics)
        pos += 1
        if topics == 0 or topics >= 0x80:
            return -1  # null (no answer has it), or more topics than this reader takes
        for _ in range(topics - 1):
            topic = uuid.UUID(bytes=bytes(buf[pos:pos + _TOPIC_ID])) if acc is not None else None
            pos += _TOPIC_ID
            partitions = buf[pos]
            pos += 1
            if partitions == 0 or partitions >= 0x80:
                return -1
            for _ in range(partitions - 1):
                if acc is not None:
                    index: int = read_i32_be(buf, pos)
                    code: int = read_i16_be(buf, pos + 4)
                    if code:
                        acc.append((topic, index, code))
                    if values is not None:
                        high_watermark: int = read_i64_be(buf, pos + 6)
                        values.append((topic, index, code, high_watermark))
                pos += _PARTITION_HEAD
                aborted = buf[pos]  # nullable: 0 is null
                pos += 1
                if aborted >= 0x80:
                    return -1
                for _ in range(aborted - 1 if aborted else 0):
                    pos += _ABORTED_ENTRY
                    if buf[pos]:
                        return -1
                    pos += 1
                pos += 4  # preferred_read_replica
                size = buf[pos]  # records, nullable: 0 is null
                pos += 1
                if size >= 0x80:
                    size, pos = read_uvarint(buf, pos - 1)
                if size > 1:
                    if ranges is not None:
                        ranges.append((pos, pos + size - 1, topic))
                    pos += size - 1
                if buf[pos]:  # the partition's tagged fields (diverging_epoch, current_leader...)
                    return -1
                pos += 1
            if buf[pos]:  # the topic's tagged fields
                return -1
            pos += 1
    except (IndexError, ValueError, Malformed):
        return -1
    return pos if pos + 1 == len(buf) and buf[pos] == 0 else -1
