"""What the protocol's scans (:mod:`kproxy.protocol.scan`, :mod:`kproxy.protocol.produce_scan`)
return, and what the readers of their results (:mod:`kproxy.protocol.offset_reads`, the metrics, the
capture) name: a module of its own, importing nothing of kproxy, so that none of them imports another
for a type."""

from __future__ import annotations

import uuid

Topic = str | uuid.UUID | None
Entry = tuple[Topic, int | None, int | None]
# A records field: its (start, end) offsets in the frame and the topic it belongs to (a name, or the
# id where the message names topics by id), so that per-topic counts need no second walk.
RecordsRange = tuple[int, int, Topic]
# What scan_request found: the entries and the records fields' ranges.
RequestScan = tuple[list[Entry], list[RecordsRange]]


class ScanEntries(list[Entry]):
    """A scan's entries (a list, as every scan gives) and, in values mode, the values it read
    (:data:`kproxy.protocol.offset_reads.OFFSET_FIELDS`), in the order of the body: ``(topic, partition,
    code, value)`` per partition-level struct holding one (``code`` None where the struct has none),
    ``(topic or None, value, code)`` per other struct holding one (a group, a Metadata topic, the top
    level), appended when that struct ends."""

    __slots__ = ("values",)
    values: list[tuple[object, ...]]  # set by whoever makes one (no __init__: one is made per scan)

    @classmethod
    def empty(cls) -> ScanEntries:
        found = cls()
        found.values = []
        return found
