"""The usual Produce request and answer read by hand (one topic, one partition: what producers send
most), instead of through the generated scanners of :mod:`kproxy.protocol.scan`: the same entries,
checked against those scanners on every version, cut and changed byte in tests/test_scan_shared.py.
Field layouts: Kafka's ProduceRequest and ProduceResponse message specs."""

from __future__ import annotations

import uuid

from librt.strings import read_i16_be, read_i32_be, read_i64_be

from kproxy.protocol.primitives import Malformed, read_uvarint
from kproxy.protocol.request_fields import transactional_id_at
from kproxy.protocol.scan_types import Entry, RequestScan, ScanEntries, Topic


def produce_answer_errors(buf: bytes, pos: int, api_version: int, values: bool = False) -> list[Entry] | None:
    """What the errors-only scanner of a Produce response finds in the body at ``buf[pos:]``, read
    by hand for the answer a producer usually gets: one topic, one partition, no record errors, no
    tagged fields (``[]`` when its error code is 0, else its one entry). None for any other shape,
    or for bytes it is not sure of: the generated scanner then decides (tests/test_scan_shared.py
    checks the two agree on every version, shape and corruption).

    ``values``: what the values-mode scanner finds too (consumer lag's log end offsets): the entries
    are then a :class:`ScanEntries` whose values hold the partition's ``(topic, index, code,
    base_offset)``.

    Per Produce answer this replaces a generated scan (two nested calls, an error-code tuple per
    partition) by a few reads in place (:func:`_produce_answer_at`).
    """
    found = _produce_answer_at(buf, pos, api_version)
    if found is None:
        return None
    start, end, index, code, base, _ = found
    if not (code or values) and api_version >= 13:
        return []  # (an id is any 16 bytes: nothing to check)
    try:
        topic = _produce_topic(buf, start, end, api_version)  # (the scanner reads a name whatever the code)
    except UnicodeDecodeError:
        return None
    if not values:
        return [(topic, index, code)] if code else []
    acc = ScanEntries()
    if code:
        acc.append((topic, index, code))
    base_offset: int = read_i64_be(buf, base)  # (within the answer: _produce_answer_at read past it)
    acc.values = [(topic, index, code, base_offset)]
    return acc


def produce_answer(buf: bytes, pos: int, api_version: int) -> tuple[Topic, int, int, int] | None:
    """The one partition of a Produce response of the usual shape (:func:`produce_answer_errors`),
    whatever its code: ``(topic, partition, error code, base_offset)``, the entry the full scanner
    finds for it and the one value its values mode reads (the capture keeps every partition of a
    Produce answer, and its log end offset). None for any other shape."""
    found = _produce_answer_at(buf, pos, api_version)
    if found is None:
        return None
    start, end, index, code, base, pos = found
    # The full scanner reads on to the body's end: throttle_time_ms (v1+), then (v9+) the body's
    # tagged fields (node_endpoints from v10, KIP-951): none, or the scanner decides.
    if api_version >= 1:
        pos += 4
    if api_version >= 9:
        if pos >= len(buf) or buf[pos]:
            return None
        pos += 1
    if pos > len(buf):
        return None
    try:
        topic = _produce_topic(buf, start, end, api_version)
    except UnicodeDecodeError:
        return None
    base_offset: int = read_i64_be(buf, base)  # (within the answer: _produce_answer_at read past it)
    return topic, index, code, base_offset


def produce_answer_untagged(buf: bytes, pos: int, api_version: int) -> bool:
    """True when the body at ``buf[pos:]`` is a flexible (v9+) Produce response of the usual shape
    (:func:`produce_answer_errors`) whose own tagged fields are none and end the frame: no
    ``node_endpoints`` (KIP-951, v10+) for the address rewrite to change, found by a few reads in
    place. False for any other shape or bytes this reader is not sure of: the rewrite's splice then
    walks the body (tests/test_scan_shared.py checks the two agree on every cut and changed byte)."""
    if api_version < 9:
        return False
    found = _produce_answer_at(buf, pos, api_version)
    if found is None:
        return False
    tags = found[5] + 4  # after throttle_time_ms: the body's tagged fields' count
    return tags + 1 == len(buf) and buf[tags] == 0


def _produce_topic(buf: bytes, start: int, end: int, api_version: int) -> Topic:
    """The topic a Produce request or response names at ``buf[start:end]``: its name, or from v13 its id."""
    if api_version >= 13:
        return uuid.UUID(bytes=bytes(buf[start:end]))
    return buf[start:end].decode("utf-8")


def _produce_answer_at(buf: bytes, pos: int, api_version: int) -> tuple[int, int, int, int, int, int] | None:
    """Where the topic of a Produce response of the usual shape lies, its one partition's index and
    error code, where its base_offset lies and where its topics array ends: ``(start, end, index,
    code, base, after)``; None for any
    other shape, or for bytes this reader is not sure of (up to the topics array's end).
    ProduceResponse.json in Kafka's message specs gives the layout (v0 base_offset; v2
    log_append_time_ms; v5 log_start_offset; v8 record_errors and error_message; v9 flexible;
    v13 topic_id)."""
    if not 0 <= api_version <= 13:
        return None  # a layout this reader does not know
    n = len(buf)
    try:
        found = _one_topic(buf, pos, api_version)
        if found is None:
            return None
        start, end = found
        if api_version < 9:
            partitions: int = read_i32_be(buf, end)
            index: int = read_i32_be(buf, end + 4)
            code: int = read_i16_be(buf, end + 8)
            if partitions != 1:
                return None
            base = end + 10  # base_offset
            # base_offset (v0), log_append_time_ms (v2), log_start_offset (v5): 8 bytes each.
            pos = base + (8 if api_version < 2 else 16 if api_version < 5 else 24)
            if api_version >= 8:
                if read_i32_be(buf, pos) != 0:  # record_errors
                    return None
                size: int = read_i16_be(buf, pos + 4)  # error_message
                if size < -1:
                    return None
                pos += 6 + max(size, 0)
        else:
            if buf[end] != 2:  # one partition (compact array: count + 1)
                return None
            index = read_i32_be(buf, end + 1)
            code = read_i16_be(buf, end + 5)
            base = end + 7
            pos = base + 24
            if buf[pos] > 1:  # record_errors: 0 (null) or 1 (empty)
                return None
            size = buf[pos + 1]  # error_message: 0 (null), else length + 1
            if size >= 0x80:
                return None
            pos += 2 + max(size - 1, 0)
            if buf[pos] or buf[pos + 1]:  # the partition's, then the topic's tagged fields: none
                return None
            pos += 2
        if pos > n:
            return None
    except (IndexError, ValueError):
        return None
    return start, end, index, code, base, pos


def produce_request_scan(buf: bytes, pos: int, api_version: int) -> RequestScan | None:
    """:func:`scan_request` of a Produce request naming one topic and one partition (what a producer
    sends to each broker most of the time), read by hand; None for any other shape, or for bytes it
    is not sure of: the generated scanner then decides (tests/test_scan_shared.py checks the two
    agree on every version, cut and changed byte). ProduceRequest.json gives the layout (v3
    transactional_id; v9 flexible; v13 topic_id)."""
    if not 0 <= api_version <= 13:
        return None  # a layout this reader does not know
    try:
        _, size, pos = transactional_id_at(buf, api_version, pos)
        if size < -1:
            return None
        found = _one_topic(buf, pos + 6, api_version)  # after acks, timeout_ms
        if found is None:
            return None
        start, end = found
        if api_version < 9:
            partitions: int = read_i32_be(buf, end)
            index: int = read_i32_be(buf, end + 4)
            size = read_i32_be(buf, end + 8)
            if partitions != 1 or size < -1:
                return None
            records = end + 12
            pos = records + max(size, 0)
        else:
            if buf[end] != 2:  # one partition (compact array: count + 1)
                return None
            index = read_i32_be(buf, end + 1)
            pos = end + 5
            size = buf[pos]  # records: length + 1, a varint
            if size < 0x80:
                pos += 1
            else:
                size, pos = read_uvarint(buf, pos)
            size -= 1
            records = pos
            pos += max(size, 0)
            if buf[pos] or buf[pos + 1] or buf[pos + 2]:  # the partition's, topic's and body's tagged fields
                return None
            pos += 3
        if pos > len(buf):
            return None
        topic: Topic = (uuid.UUID(bytes=buf[start:end]) if api_version >= 13
                        else buf[start:end].decode("utf-8"))
    except (IndexError, ValueError, Malformed):  # (UnicodeDecodeError is a ValueError)
        return None
    return [(topic, index, None)], [(records, records + size, topic)] if size > 0 else []


def _one_topic(buf: bytes, pos: int, api_version: int) -> tuple[int, int] | None:
    """Where the name (from v13 the id, KIP-516) of the only topic of the topics array at ``buf[pos]``
    lies, ``(start, end)``, in a Produce request or response of ``api_version`` (0-13): both open
    their topics alike. None when the array does not hold exactly one topic, or (v9+) when the name's
    compact length takes more than one byte: the generated scanner reads those."""
    if api_version < 9:
        topics: int = read_i32_be(buf, pos)
        size: int = read_i16_be(buf, pos + 4)
        if topics != 1 or size < 0:
            return None
        return pos + 6, pos + 6 + size
    # Compact arrays and strings carry length + 1 as a varint: only one-byte ones here.
    if buf[pos] != 2:
        return None
    if api_version >= 13:
        return pos + 1, pos + 17
    size = buf[pos + 1] - 1
    if not 0 <= size < 0x7F:
        return None
    return pos + 2, pos + 2 + size
