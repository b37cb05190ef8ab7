"""What the protocol's scans (:mod:`kproxy.protocol.scan`, :mod:`kproxy.protocol.produce_scan`)
return: a module of its own so that both can name them without importing each other."""

from __future__ import annotations

import uuid

Topic = str | uuid.UUID | None
Entry = tuple[Topic, int | None, int | None]
# A records field: its (start, end) offsets in the frame and the topic it belongs to (a name, or the
# id where the message names topics by id), so that per-topic counts need no second walk.
RecordsRange = tuple[int, int, Topic]
# What scan_request found: the entries and the records fields' ranges.
RequestScan = tuple[list[Entry], list[RecordsRange]]
