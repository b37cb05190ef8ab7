"""kproxy's sans-IO Kafka codec.

Layers, bottom up (none does I/O; this package imports nothing else of kproxy):

* :mod:`.wire`     - varints, tagged-field sections, the ``Malformed`` signal.
* :mod:`.framing`  - 4-byte size-prefixed frames out of arbitrary chunks.
* :mod:`.headers`  - request/response headers and their derived versions.
* :mod:`.request_fields` - a request's client id, acks, body offset, read in place from its frame.
* :mod:`.schema`   - per-(api key, version) layouts from the generated tables.
* :mod:`.codegen`  - the compiler behind messages and scan: schemas to Python functions
  (:mod:`.codegen_runtime`: what the functions it writes run with).
* :mod:`.messages` - full decode/encode of bodies (byte-exact round trips).
* :mod:`.payloads` - a request's or response's header and body, decoded or encoded together.
* :mod:`.scan`     - partial decode for the hot path (topics, partitions, error codes).
* :mod:`.splice`   - rewrite a few top-level fields, copy the rest untouched.
* :mod:`.records`  - RecordBatch v2 and legacy MessageSets, decoded lazily (a package split by job).
* :mod:`.frame_builder` - request/response frames of any version from version-independent values;
  :mod:`.error_response` answers a request with an error code.
* :mod:`.mutation` - what every frame transformation returns, and re-framing an edited body; the
  transformations: :mod:`.response_faults`, :mod:`.record_faults`, :mod:`.field_rewrite`,
  :mod:`.endpoints`.
* :mod:`.topic_ids` - topic ids (KIP-516) learnt from Metadata answers, for requests naming topics by id.
* :mod:`.kinds`    - which (api key, version) kinds carry broker endpoints, which to warm up.
* :mod:`.tables`   - ``ApiKey``, ``ErrorCode``; API names, error codes: printable lookups that never raise.
"""

from kproxy.protocol.errors import (
    CorruptRecordsError,
    DecodeError,
    EncodeError,
    FrameSizeError,
    ProtocolError,
    UnknownApiError,
)
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameSplitter, frame
from kproxy.protocol.headers import (
    RequestHeader,
    ResponseHeader,
    peek_correlation_id,
    peek_request,
    request_header_version,
    response_header_version,
)
from kproxy.protocol.messages import codec, decode_body, default_body, encode_body
from kproxy.protocol.payloads import Request, Response, decode_request, decode_response, encode_request, encode_response
from kproxy.protocol.scan import BodyScan, scan_body
from kproxy.protocol.schema import Direction, message_schema
from kproxy.protocol.splice import splice_body

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE",
    "BodyScan",
    "CorruptRecordsError",
    "DecodeError",
    "Direction",
    "EncodeError",
    "FrameSizeError",
    "FrameSplitter",
    "ProtocolError",
    "Request",
    "RequestHeader",
    "Response",
    "ResponseHeader",
    "UnknownApiError",
    "codec",
    "decode_body",
    "decode_request",
    "decode_response",
    "default_body",
    "encode_body",
    "encode_request",
    "encode_response",
    "frame",
    "message_schema",
    "peek_correlation_id",
    "peek_request",
    "request_header_version",
    "response_header_version",
    "scan_body",
    "splice_body",
]
