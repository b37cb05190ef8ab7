"""Rewriting responses so that clients only ever see kproxy's addresses.

Which responses carry broker addresses is derived from the schemas, not listed
by hand: any response struct with ``host`` and ``port`` fields (Metadata
brokers, FindCoordinator, DescribeCluster, the KIP-951 ``node_endpoints`` of
Produce v10+ and Fetch v16+, ShareFetch/ShareAcknowledge, the KRaft quorum
APIs). A new API with endpoints in a newer spec is covered by regenerating the
tables.

Only the top-level fields that contain endpoints are decoded and re-encoded
(:func:`kproxy.protocol.splice.splice_body`); records and partition lists
around them are copied as they are.

ApiVersions responses are intersected with what kproxy can decode for the
APIs it must rewrite (KIP-511 and DESIGN.md): a client must never pick a
version of Metadata whose brokers kproxy could not rewrite.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kproxy.protocol.api_keys import API_VERSIONS, FETCH, PRODUCE
from kproxy.protocol.codes import ApiKey, ErrorCode
from kproxy.protocol.endpoints import endpoint_fields
from kproxy.protocol.endpoints import has_endpoint as _has_endpoint
from kproxy.protocol.errors import DecodeError, ProtocolError
from kproxy.protocol.fetch_scan import fetch_answer_untagged
from kproxy.protocol.framing import SIZE_PREFIX
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.kinds import rewritten_api_keys
from kproxy.protocol.message_schemas import Field, MessageType, message_schema, supported_versions
from kproxy.protocol.messages import codec
from kproxy.protocol.produce_scan import produce_answer_untagged
from kproxy.protocol.splice import splice_body
from kproxy.proxy.addresses import AddressMap, BrokerRoute, PortsExhausted
from kproxy.proxy.exchange import Exchange, ObserverMemo

# Plain ints, bound once (an int == IntEnum comparison costs about twice a plain one: kproxy/protocol/codes.py).
UNSUPPORTED_VERSION: Final = int(ErrorCode.UNSUPPORTED_VERSION)
MEMO_MAX_BODY: Final = 64 * 1024  # bodies above this (big Metadata, any Fetch) are rewritten every time
MEMO_MAX_TOTAL = 16 * 1024 * 1024  # bytes remembered (bodies, results, bookkeeping) before the memo starts over
# What one memo entry costs beside its body bytes: the dict slot, the key and result tuples, the
# bytes objects' headers and the endpoint list (tracemalloc finds less than this on CPython 3.11).
MEMO_ENTRY_OVERHEAD: Final = 256
# Responses that answer records (new offsets, new data every time) never repeat: remembering them
# would only fill the memo. Their endpoints (KIP-951 node_endpoints) are rewritten every time.
NEVER_REPEATS: Final = frozenset(int(k) for k in (ApiKey.PRODUCE, ApiKey.FETCH, ApiKey.SHARE_FETCH,
                                                  ApiKey.SHARE_ACKNOWLEDGE))
NODE_ID_FIELDS: Final = ("node_id", "broker_id", "leader_id")
Endpoint = tuple[int, str, int]  # (node id, upstream host, upstream port) as a response named it


@functools.cache
def _endpoint_struct_fields(api_key: int, api_version: int) -> tuple[Field, ...]:
    """The top-level Field objects named by :func:`endpoint_fields` (for the splice editors)."""
    names = endpoint_fields(api_key, api_version) or ()
    schema = message_schema(api_key, api_version, MessageType.RESPONSE)
    return tuple(f for f in schema.fields if f.name in names) if schema is not None else ()


@functools.cache
def _walks_part(api_key: int, api_version: int) -> bool:
    """True when splicing the endpoint fields leaves the end of the body unread: no endpoint
    field is tagged (tagged ones sit after every regular field, so the splice reads them all)."""
    return not any(f.tag is not None for f in _endpoint_struct_fields(api_key, api_version))


def _check_whole(api_key: int, api_version: int, frame: bytes, body_offset: int) -> None:
    """DecodeError unless ``frame[body_offset:]`` is exactly one body of this kind (walked, not built)."""
    c = codec(api_key, api_version, MessageType.RESPONSE)
    assert c is not None
    end = c.skip(frame, body_offset)
    if end != len(frame):
        raise DecodeError(f"{len(frame) - end} bytes left over after the {c.schema.name} v{api_version} body",
                          offset=end)


class RewriteFailed(ProtocolError):
    """A response that must be rewritten and cannot be: forwarding it could leak a broker address, so
    the connection ends (the session refuses it as it refuses any response it cannot take)."""


@dataclass(slots=True)
class Rewritten:
    """A rewritten response frame (size prefix included) and the brokers it advertises.

    ``body`` is ``frame``'s body: for a remembered answer, the memo's own object, the same one
    every time the broker repeats itself, so a reader that keys on it (the metrics' scan memo,
    kproxy/metrics/stats.py) hashes it once, not once per response. Immutable (``Final`` fields),
    built by its own ``__init__`` (native code in a compiled build: kproxy/proxy/commands.py says why).
    """

    frame: Final[bytes]
    routes: Final[list[BrokerRoute]]
    body: Final[bytes]

    def __init__(self, frame: bytes, routes: list[BrokerRoute], body: bytes) -> None:
        self.frame = frame
        self.routes = routes
        self.body = body


class ResponseRewriter:
    """Rewrites endpoint-carrying responses against one :class:`AddressMap`.

    ``pinned_api_keys`` are API keys kproxy must be able to *read* even without
    endpoints (Produce for acks, SaslHandshake for the mechanism, ApiVersions
    itself); they are capped in ApiVersions like the rewritten ones.

    ``answered`` are API keys kproxy answers itself, whatever the broker speaks (SaslHandshake and
    SaslAuthenticate in terminate mode: kproxy/sasl/authenticator.py), with the versions it
    answers: ApiVersions answers list those versions, added when the broker has none.
    """

    def __init__(self, addresses: AddressMap, pinned_api_keys: frozenset[int] = frozenset({0, 17, 18}),
                 answered: Mapping[int, tuple[int, int]] | None = None) -> None:
        self.addresses = addresses
        self.capped = rewritten_api_keys() | pinned_api_keys
        self.answered = dict(answered or {})
        # Brokers repeat themselves: every ApiVersions answer, and Metadata / FindCoordinator
        # answers between cluster changes, are byte-identical. Each distinct small body is
        # rewritten once; the address map never changes a node's port, so the result stays
        # right. What each body taught the address map is replayed on every hit, so a broker
        # that moves away and back is followed too.
        self._memo: dict[tuple[int, int, bytes], tuple[bytes | None, list[Endpoint]]] = {}
        self._memo_bytes = 0
        # api key -> (version, body) of the last body over MEMO_MAX_BODY that passed _check_whole
        # (see _check_whole_once): one body per api key with endpoints, so a few at most.
        self._whole: dict[int, tuple[int, bytes]] = {}
        # Keyed by api key and version in one int (api_version & 0xFFFF: an int16), as
        # headers.request_header_version's cache: no tuple made and hashed per request.
        self._unreadable: dict[int, bool] = {}
        # needs_rewrite per kind, keyed by one int (api key << 16 | version): asked for every response,
        # and endpoint_fields' functools.cache costs a call through its wrapper and a key tuple each time.
        self._needs: dict[int, bool] = {}

    def needs_rewrite(self, api_key: int, api_version: int) -> bool:
        if api_key == API_VERSIONS:
            return True
        key = (api_key << 16) | (api_version & 0xFFFF)
        found = self._needs.get(key)
        if found is None:
            found = endpoint_fields(api_key, api_version) is not None
            if len(self._needs) < 65536 and -0x8000 <= api_version < 0x8000:  # bounded, one key per kind
                self._needs[key] = found
        return found

    def unreadable(self, api_key: int, api_version: int) -> bool:
        """A request kproxy must not forward: an API it caps, at a version it cannot read.

        ApiVersions told the client which versions to use; a client that asks
        Metadata (or FindCoordinator, Produce...) at another version anyway would
        get a response kproxy could not rewrite, with real broker addresses in it.
        ApiVersions itself is exempt: unreadable versions get the KIP-511 answer.
        """
        if api_key not in self.capped or api_key == API_VERSIONS:
            return False
        key = api_key << 16 | (api_version & 0xFFFF)
        found = self._unreadable.get(key)
        if found is None:
            found = message_schema(api_key, api_version, MessageType.RESPONSE) is None
            if len(self._unreadable) < 65536 and -0x8000 <= api_version < 0x8000:  # bounded; one key a version
                self._unreadable[key] = found
        return found

    def rewrite_exchange(self, ex: Exchange, frame: bytes) -> bytes:
        """The response frame ``frame`` to ``ex`` as the client gets it (the same object when nothing
        changed); what it found is kept on the exchange for its readers (its routes, the body offset and
        rewritten body on its memo). Raises :class:`RewriteFailed` when it cannot be rewritten."""
        if not self.needs_rewrite(ex.api_key, ex.api_version):
            return frame
        try:
            body_offset = response_body_offset(frame, ex.api_key, ex.api_version)
            done = self.rewrite(ex.api_key, ex.api_version, frame, body_offset)
        except (DecodeError, PortsExhausted) as exc:
            raise RewriteFailed(f"cannot rewrite {ex.api} v{ex.api_version} response: {exc}") from None
        memo = ex.memo
        if memo is None:
            memo = ex.memo = ObserverMemo(body_offset)
        else:
            memo.response_body_offset = body_offset
        if done is None:
            return frame
        ex.routes = done.routes
        memo.response_body = done.body
        return done.frame

    def rewrite(self, api_key: int, api_version: int, frame: bytes, body_offset: int) -> Rewritten | None:
        """Rewrite a response frame; ``None`` when nothing changed.

        ``body_offset`` is where the body starts in ``frame`` (after the size
        prefix and the response header). Raises DecodeError on a malformed body,
        before the address map has learned anything from it.
        """
        if not self.needs_rewrite(api_key, api_version):
            return None
        if len(frame) - body_offset > MEMO_MAX_BODY or api_key in NEVER_REPEATS:
            new_body, learned = self._rewrite_body(api_key, api_version, frame, body_offset)
        else:
            key = (api_key, api_version, frame[body_offset:])
            found = self._memo.get(key)
            if found is None:
                found = self._rewrite_body(api_key, api_version, frame, body_offset)
                cost = 2 * len(key[2]) + MEMO_ENTRY_OVERHEAD  # the body, its rewrite (about as long), bookkeeping
                if self._memo_bytes + cost > MEMO_MAX_TOTAL:
                    self._memo.clear()
                    self._memo_bytes = 0
                self._memo[key] = found
                self._memo_bytes += cost
            new_body, learned = found
        addresses = self.addresses
        routes = [addresses.learn(node, host, port) for node, host, port in learned]
        if new_body is None:
            return None
        return Rewritten(_reframe(frame, body_offset, new_body), routes, new_body)

    def _rewrite_body(self, api_key: int, api_version: int, frame: bytes, body_offset: int
                      ) -> tuple[bytes | None, list[Endpoint]]:
        """The rewritten body (None: nothing to change) and the upstream endpoints it named."""
        if api_key == API_VERSIONS:
            return self._cap_api_versions(api_version, frame, body_offset), []
        if ((api_key == PRODUCE and produce_answer_untagged(frame, body_offset, api_version))
                or (api_key == FETCH and fetch_answer_untagged(frame, body_offset, api_version))):
            # A producer's or a consumer's usual answer, without node_endpoints: read in place, where
            # the splice would walk it with the generated codec's skips to find nothing to change.
            return None, []
        fields = endpoint_fields(api_key, api_version)
        routes: list[Endpoint] = []
        if fields == ():
            # Host and port at the top level (FindCoordinator v0-3): tiny, decode it whole.
            c = codec(api_key, api_version, MessageType.RESPONSE)
            assert c is not None
            body = c.decode(frame, body_offset)
            self._rewrite_struct(body, c.schema.fields, None, routes)
            new_body = c.encode(body)
        else:
            if _walks_part(api_key, api_version):
                # The splice stops after the last edited field: first make sure the whole body
                # parses as this response, or a broker list could come from bytes that are not one
                # (another API's answer read under a wrong correlation id, a truncated frame).
                self._check_whole_once(api_key, api_version, frame, body_offset)
            edits = {f.name: self._editor(f, routes) for f in _endpoint_struct_fields(api_key, api_version)}
            spliced, _ = splice_body(api_key, api_version, MessageType.RESPONSE, frame, edits, body_offset)
            if spliced is None:
                return None, []
            new_body = spliced
        return new_body, routes

    def _check_whole_once(self, api_key: int, api_version: int, frame: bytes, body_offset: int) -> None:
        """:func:`_check_whole`, walked once per distinct big body.

        A body over MEMO_MAX_BODY is not memoized, so without this every poll of a big cluster's
        Metadata would pay the walk (per partition), though brokers answer byte for byte alike
        between cluster changes. The last big body that passed is kept per api key and compared
        exactly (a copy and a memcmp, far cheaper than the walk); only the same
        bytes at the same version skip the walk, so what reaches the splice is always a whole body.
        """
        if len(frame) - body_offset <= MEMO_MAX_BODY or api_key in NEVER_REPEATS:
            _check_whole(api_key, api_version, frame, body_offset)  # memoized or never repeated: walk
            return
        body = frame[body_offset:]
        last = self._whole.get(api_key)
        if last is not None and last[0] == api_version and last[1] == body:
            return
        _check_whole(api_key, api_version, frame, body_offset)
        self._whole[api_key] = (api_version, bytes(body))

    def _editor(self, field: Field, routes: list[Endpoint]) -> Callable[[Any], Any]:
        def edit(value: Any) -> Any:
            self._rewrite_value(value, field, None, routes)
            return value

        return edit

    def _rewrite_value(self, value: Any, field: Field, parent_node: int | None,
                       routes: list[Endpoint]) -> None:
        if value is None or field.fields is None:
            return
        for item in value if field.array else (value,):
            self._rewrite_struct(item, field.fields, parent_node, routes)

    def _rewrite_struct(self, struct_value: dict[str, Any], fields: tuple[Field, ...],
                        parent_node: int | None, routes: list[Endpoint]) -> None:
        node = parent_node
        for name in NODE_ID_FIELDS:
            if name in struct_value:
                node = struct_value[name]
                break
        if "host" in struct_value and "port" in struct_value:
            host = struct_value["host"]
            # node -1 / empty host: "no coordinator", "leader unknown": nothing to map.
            if node is not None and node >= 0 and host:
                # Only noted here: the map learns it once the whole body has parsed (see rewrite).
                routes.append((node, host, struct_value["port"]))
                struct_value["host"] = self.addresses.advertised_host
                struct_value["port"] = self.addresses.port_for(node)
        for f in fields:
            if f.fields is not None and f.name in struct_value and _has_endpoint(f.fields):
                self._rewrite_value(struct_value[f.name], f, node, routes)

    # -- ApiVersions ------------------------------------------------------------------
    def _cap_api_versions(self, api_version: int, frame: bytes, body_offset: int) -> bytes | None:
        # A broker that cannot read the client's version answers with a v0 body and
        # UNSUPPORTED_VERSION (KIP-511); its error code is the first field in every version.
        if len(frame) < body_offset + 2:
            raise DecodeError("ApiVersions response too short for its error code", offset=body_offset)
        (error_code,) = struct.unpack_from(">h", frame, body_offset)
        version = 0 if error_code == UNSUPPORTED_VERSION else api_version
        if message_schema(API_VERSIONS, version, MessageType.RESPONSE) is None:
            return None

        answered = self.answered if error_code == 0 else {}  # an error answer lists only ApiVersions (KIP-511)

        def cap(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
            if entries is None:
                return None
            out = []
            for entry in entries:
                key = entry["api_key"]
                if key in answered:
                    continue  # listed below, with the versions kproxy answers
                if key in self.capped:
                    ours = supported_versions(key)
                    assert ours is not None
                    lo = max(entry["min_version"], ours[0])
                    hi = min(entry["max_version"], ours[1])
                    if lo > hi:
                        continue  # nothing both sides speak: hide the API
                    entry["min_version"], entry["max_version"] = lo, hi
                out.append(entry)
            if answered:
                out.extend({"api_key": key, "min_version": lo, "max_version": hi} for key, (lo, hi) in answered.items())
                out.sort(key=lambda entry: int(entry["api_key"]))
            return out

        new_body, _ = splice_body(API_VERSIONS, version, MessageType.RESPONSE, frame, {"api_keys": cap},
                                  body_offset)
        return new_body


def _reframe(frame: bytes, body_offset: int, new_body: bytes) -> bytes:
    header = frame[4:body_offset]
    return SIZE_PREFIX.pack(len(header) + len(new_body)) + header + new_body
