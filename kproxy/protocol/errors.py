"""The codec's exceptions: one small hierarchy, so callers catch one type.

Every decoder in :mod:`kproxy.protocol` raises only these (a bare ``ValueError``,
``KeyError``, ``IndexError`` or ``struct.error`` escaping is a bug). Each carries
*where* the problem was (a byte offset into the input the caller passed, and a
field path when one is known) and *what* was wrong, so a log line or the
``kproxy decode`` command can name both.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Bytes that are not valid Kafka protocol where kproxy expected them.

    ``offset`` is the byte offset into the buffer handed to the failing call
    (``None`` when it is not known); ``field`` a dotted path such as
    ``topics[0].partitions[3].records`` when the failure is inside a message.
    """

    def __init__(self, reason: str, *, offset: int | None = None, field: str | None = None) -> None:
        self.reason = reason
        self.offset = offset
        self.field = field
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.offset is not None:
            where.append(f"at byte {self.offset}")
        if self.field:
            where.append(f"in {self.field}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason


class FrameSizeError(ProtocolError):
    """A frame's 4-byte size prefix is negative or above the configured limit."""


class DecodeError(ProtocolError):
    """A frame, header, message body or record batch could not be read."""


class EncodeError(ProtocolError):
    """Values handed to an encoder do not fit the schema (missing field, bad type, out of range)."""


class UnknownApiError(DecodeError):
    """The (api key, api version) pair has no schema in kproxy's tables.

    Not a reason to drop traffic: the proxy forwards such frames untouched. Only
    callers that need the body (``kproxy decode``, a rule) see this.
    """

    def __init__(self, api_key: int, api_version: int, *, offset: int | None = None) -> None:
        self.api_key = api_key
        self.api_version = api_version
        super().__init__(f"no schema for api key {api_key} version {api_version}", offset=offset)


class CorruptRecordsError(DecodeError):
    """A record batch or legacy message whose CRC, length or compression is wrong."""
