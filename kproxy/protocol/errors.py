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


class OverBudgetError(ProtocolError):
    """Reading a frame's records needed more than its :class:`~kproxy.protocol.records.RecordBudget`.

    Not a fault of the bytes (they may be valid Kafka): the reader gave up on the
    frame, and the caller forwards it as it came.
    """


class MutationError(ProtocolError):
    """A fault-injection transformation was asked of a frame that cannot take it.

    The frame itself may be valid: the field is not in this version, a path
    names nothing, a value does not fit the field's type. Callers applying a
    rule leave the frame as it was (a fault must never break the protocol).
    Each transformation raises its own subclass.
    """


class ThrottleTimeError(MutationError):
    """The response has no top-level ``throttle_time_ms`` in this version."""


class MetadataMutationError(MutationError):
    """A Metadata-style mutation on a response without brokers or topics to edit."""


class ApiVersionsMutationError(MutationError):
    """An ApiVersions downgrade on a response that is not an ApiVersions answer it can edit."""


class ErrorCodeMutationError(MutationError):
    """Error codes replaced in a response that has no error code field."""


class FieldRewriteError(MutationError):
    """A field path that names nothing in this version, or a value the field cannot hold."""


class RecordsMutationError(MutationError):
    """A records transformation on an API without records, or on record bytes it cannot walk."""


class EndpointRewriteError(MutationError):
    """Endpoints rewritten in a response that carries none in this version."""
