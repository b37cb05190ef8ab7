"""Fuzz target of the rules' record editors (kproxy/protocol/record_faults.py) on Produce and Fetch frames.

An input is three bytes, then a whole frame less its size prefix: the api (bit 0 of byte 0: 0
Produce request, 1 Fetch response), its version (byte 1, taken modulo the versions the tables
know), the editor (byte 2: :data:`EDITORS`; bit 7 edits partition 0 only).

The contract: an editor returns a :class:`~kproxy.protocol.mutation.Mutation` or raises a
:class:`~kproxy.protocol.errors.ProtocolError` (it declines); nothing else. What it returns:

* ``changed == 0`` gives back the very frame it was given;
* an edited frame has a size prefix that fits, the input's header, and decodes whenever the
  input did (same api, version and direction);
* editors that keep the checksums valid (every target but ``crc``, and the schema ids): a
  records field whose entries all decode with their CRC checked still does after the edit.

Decoding here runs under a decompression cap, so memory per input stays bounded.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from kproxy.protocol.errors import ProtocolError
from tests.fuzz.targets.capture import FETCH_VERSIONS, PRODUCE_VERSIONS, fetch_frames, produce_frames, records_fields
from tests.fuzz.targets.registry import target

PARTITION_0_ONLY = 0x80
BUDGET = 1 << 20  # bytes a check may decompress per records field


def _editors() -> list[tuple[str, Callable[..., Any], dict[str, Any], bool]]:
    """(name, editor, keyword arguments, keeps the CRCs valid)."""
    from kproxy.protocol.record_faults import CorruptTarget, corrupt_records, duplicate_records, replace_schema_ids

    out: list[tuple[str, Callable[..., Any], dict[str, Any], bool]] = [
        (f"corrupt_{t.value}", corrupt_records, {"target": t}, t is not CorruptTarget.CRC) for t in CorruptTarget]
    out += [("duplicate_1", duplicate_records, {"copies": 1}, True),
            ("duplicate_3", duplicate_records, {"copies": 3}, True),
            ("schema_id", replace_schema_ids, {"schema_id": 999_999}, True)]
    return out


EDITORS = [name for name, *_ in _editors()]


def _versions(api: int) -> tuple[int, int]:
    from kproxy.protocol.message_schemas import supported_versions

    span = supported_versions(api)
    assert span is not None
    return span


def _editor_seeds() -> Iterator[bytes]:
    count = 0
    for magic, records in records_fields():
        for api, versions in ((0, PRODUCE_VERSIONS), (1, FETCH_VERSIONS)):
            for version in versions:
                if (magic == 2) != (version >= (3 if api == 0 else 4)):
                    continue
                request, response = (produce_frames if api == 0 else fetch_frames)(version, 7, records)
                payload = (request if api == 0 else response)[4:]
                low, _ = _versions(api)
                count += 1
                for editor in (count % len(EDITORS), (count + 4) % len(EDITORS)):  # the editors in turn
                    yield bytes([api, version - low, editor | (PARTITION_0_ONLY if editor % 2 else 0)]) + payload


def _body(api: int, version: int, whole: bytes) -> tuple[int, Any] | None:
    """(body offset, decoded body) of a whole frame, or None when it does not decode."""
    from kproxy.protocol.headers import decode_request_header, response_body_offset
    from kproxy.protocol.message_schemas import MessageType
    from kproxy.protocol.messages import decode_body

    try:
        if api == 0:
            offset = 4 + decode_request_header(memoryview(whole)[4:]).size
            return offset, decode_body(api, version, MessageType.REQUEST, whole, offset)
        offset = response_body_offset(whole, api, version, whole=True)
        return offset, decode_body(api, version, MessageType.RESPONSE, whole, offset)
    except ProtocolError:
        return None


def _records(body: Any) -> list[Any]:
    """Every records field of a decoded Produce request or Fetch response body, in order."""
    out = []
    for topic in body.get("topic_data") or body.get("responses") or ():
        for part in topic.get("partition_data") or topic.get("partitions") or ():
            records = part.get("records")
            if records:
                out.append(bytes(records))
    return out


def _decodes_checked(records: bytes) -> bool:
    from kproxy.protocol.records import decode_records, iter_batches

    try:
        for batch in iter_batches(records):
            decode_records(batch, max_decompressed=BUDGET, check_crc=True)
    except ProtocolError:
        return False
    return True


@target(_editor_seeds, warm=True)
def fuzz_record_editors(data: bytes) -> None:
    """Record editors on Produce/Fetch frames: only ProtocolError; edited frames frame, decode, keep valid CRCs.

    An edited frame keeps its header and decodes when the input did (see the module docstring)."""
    if len(data) < 3:
        return
    api = data[0] & 1
    low, high = _versions(api)
    version = low + data[1] % (high - low + 1)
    name, editor, kwargs, keeps_crc = _editors()[(data[2] & 0x7F) % len(EDITORS)]
    whole = struct.pack(">i", len(data) - 3) + data[3:]
    only = (lambda _topic, partition: partition == 0) if data[2] & PARTITION_0_ONLY else None
    try:
        result = editor(whole, api, version, only=only, **kwargs)
    except ProtocolError:
        return
    out = result.frame
    if not result.changed:
        assert out is whole, f"{name}: nothing changed but a new frame came back"
        return
    (size,) = struct.unpack_from(">i", out)
    assert size == len(out) - 4, f"{name}: size prefix {size} for a frame of {len(out) - 4} bytes"
    before = _body(api, version, whole)
    if before is None:
        return
    after = _body(api, version, out)
    assert after is not None, f"{name}: the edited frame of a frame that decodes does not decode"
    assert out[4 : after[0]] == whole[4 : before[0]], f"{name}: the header changed"
    if keeps_crc:
        old, new = _records(before[1]), _records(after[1])
        checked = [_decodes_checked(r) for r in old]
        if all(checked) and len(old) == len(new):
            for i, records in enumerate(new):
                assert _decodes_checked(records), f"{name}: records field {i} no longer decodes with its CRC checked"
