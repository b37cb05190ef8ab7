"""The RecordBatch v2 header's layout: the one place its fields' positions are written down.

Several readers look at a v2 batch header, each for what it needs and in place (no decode):
the full walker (:mod:`.entries`), the counting, dating and producer-head reads of the data path
(:mod:`.counting`), the live client-anomaly detectors (:mod:`kproxy.metrics.client_anomalies`,
:mod:`kproxy.metrics.retries`) and the record faults that rewrite headers
(:mod:`kproxy.protocol.record_faults`). They take each field's position from here: the data path's
readers (:mod:`.counting`'s ``v2_*``) read each field at its ``*_AT`` position in place, and
elsewhere a read of several fields is one struct built from their names by :func:`header_struct`,
so no reader counts padding bytes of its own and a position can be wrong in one place only
(tests/test_batch_layout.py checks every struct against a batch written field by field).

Positions are from the batch's first byte (its base offset); the magic byte sits at the same
position in every entry, legacy message sets included (the package's docstring).
"""

from __future__ import annotations

import struct
from typing import Final

# Each field: its position and its struct code (big-endian, as on the wire).
BASE_OFFSET_AT: Final = 0  # int64
BATCH_LENGTH_AT: Final = 8  # int32: the bytes after this field
PARTITION_LEADER_EPOCH_AT: Final = 12  # int32
MAGIC_AT: Final = 16  # int8: 2
CRC_AT: Final = 17  # uint32: CRC-32C from the attributes to the batch's end
ATTRIBUTES_AT: Final = 21  # int16: the codec in its low 3 bits (so in byte ATTRIBUTES_AT + 1)
LAST_OFFSET_DELTA_AT: Final = 23  # int32
BASE_TIMESTAMP_AT: Final = 27  # int64
MAX_TIMESTAMP_AT: Final = 35  # int64
PRODUCER_ID_AT: Final = 43  # int64: -1 when not idempotent
PRODUCER_EPOCH_AT: Final = 51  # int16
BASE_SEQUENCE_AT: Final = 53  # int32
RECORDS_COUNT_AT: Final = 57  # int32
V2_HEADER_SIZE: Final = 61  # the header, up to and including records_count
CODEC_MASK: Final = 0x07  # of the attributes

FIELDS: Final[tuple[tuple[str, int, str], ...]] = (
    ("base_offset", BASE_OFFSET_AT, "q"),
    ("batch_length", BATCH_LENGTH_AT, "i"),
    ("partition_leader_epoch", PARTITION_LEADER_EPOCH_AT, "i"),
    ("magic", MAGIC_AT, "b"),
    ("crc", CRC_AT, "I"),
    ("attributes", ATTRIBUTES_AT, "h"),
    ("last_offset_delta", LAST_OFFSET_DELTA_AT, "i"),
    ("base_timestamp", BASE_TIMESTAMP_AT, "q"),
    ("max_timestamp", MAX_TIMESTAMP_AT, "q"),
    ("producer_id", PRODUCER_ID_AT, "q"),
    ("producer_epoch", PRODUCER_EPOCH_AT, "h"),
    ("base_sequence", BASE_SEQUENCE_AT, "i"),
    ("records_count", RECORDS_COUNT_AT, "i"),
)
_BY_NAME: Final = {name: (at, code) for name, at, code in FIELDS}


def header_struct(*names: str) -> struct.Struct:
    """A struct that reads the fields ``names`` (in header order) from the position of the first
    of them: the bytes between them are skipped. ``unpack_from(data, batch_start + <first>_AT)``
    gives their values in that order. Raises ValueError for an unknown name or a name out of order."""
    out = ">"
    pos = -1
    for name in names:
        if name not in _BY_NAME:
            raise ValueError(f"no field {name!r} in a v2 batch header; fields: {', '.join(_BY_NAME)}")
        at, code = _BY_NAME[name]
        if pos < 0:
            pos = at
        elif at < pos:
            raise ValueError(f"{name!r} comes before the field read ahead of it: list the fields in header order")
        if at > pos:
            out += f"{at - pos}x"
        out += code
        pos = at + struct.calcsize(">" + code)
    return struct.Struct(out)
