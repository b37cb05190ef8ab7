"""From a session's exchanges to capture records: one observer per client connection.

:class:`CaptureObserver` implements :class:`kproxy.proxy.session.SessionObserver`
for one connection, so each record knows its connection (id, client address,
listener, broker). The session calls it from :meth:`Session.report`, after the
frames have been written: building a record is never on the path of a request
or a response. Records go to ``sink`` (the writer's non-blocking ``offer``).

What is read, and how far:

* every request: its header (client id) and a topic/partition scan of the body
  (records skipped by length, their byte ranges noted); Produce's acks and
  transactional id read in place; group and transaction requests (small)
  decoded fully for ``group_id`` / ``transactional_id``. Produce and Fetch
  bodies are never decoded.
* every response: a scan for error codes per partition and for Fetch's record
  batches. Responses other than Produce and Fetch keep only their non-zero
  per-partition codes (a Metadata response lists every partition of the
  cluster; that is not traffic).
* records are counted from batch headers (no decompression); keys and values
  are decoded only with ``include_payloads``, cut to ``payload_max_bytes``.

The principal is the TLS client certificate's subject, or the SASL user once a
SaslAuthenticate succeeds on the connection (PLAIN's authcid, RFC 4616; SCRAM's
``n=`` attribute, RFC 5802); the password is never read past, nor kept.

Fetch v13+ names topics by id: :class:`TopicNames` (shared by all connections)
learns id -> name from Metadata responses, the only responses decoded in full.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kproxy.capture.schema import SCHEMA_VERSION
from kproxy.protocol.errors import DecodeError, ProtocolError
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.messages import decode_body
from kproxy.protocol.records import count_records, decode_all
from kproxy.protocol.scan import SCAN_FAILURES, Entry, scanner
from kproxy.protocol.schema import Direction
from kproxy.protocol.tables import ApiKey, api_name
from kproxy.protocol.wire import Malformed, read_uvarint
from kproxy.proxy.session import Exchange, SessionObserver

log = logging.getLogger("kproxy.capture")

# Plain ints, bound once: compared per exchange (an IntEnum member compares at about twice the cost).
PRODUCE, FETCH, METADATA = int(ApiKey.PRODUCE), int(ApiKey.FETCH), int(ApiKey.METADATA)
FIND_COORDINATOR = int(ApiKey.FIND_COORDINATOR)
SASL_HANDSHAKE, SASL_AUTHENTICATE = int(ApiKey.SASL_HANDSHAKE), int(ApiKey.SASL_AUTHENTICATE)
_RECORD_APIS = frozenset({PRODUCE, FETCH})
# Requests decoded in full for group_id / transactional_id: all small, none carries records
# (DescribeGroups takes a list of groups: not decoded).
_ID_APIS = frozenset(int(key) for key in (
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.FIND_COORDINATOR, ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT,
    ApiKey.LEAVE_GROUP, ApiKey.SYNC_GROUP, ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN,
    ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.OFFSET_DELETE,
    ApiKey.CONSUMER_GROUP_HEARTBEAT))
TOPIC_NAMES_CAP = 100_000
Sink = Callable[[dict[str, Any]], bool]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionInfo:
    """Who a connection is: what every record of it carries."""

    connection_id: str
    client_host: str
    client_port: int | None
    listener: str
    upstream: str
    principal: str | None = None

    @property
    def node_id(self) -> int | None:
        """The broker behind a ``broker-N`` listener; None behind the bootstrap listener."""
        prefix, _, node = self.listener.partition("-")
        return int(node) if prefix == "broker" and node.lstrip("-").isdigit() else None


def split_peer(peer: str) -> tuple[str, int | None]:
    """``host:port`` (as the server logs it) -> (host, port)."""
    host, sep, port = peer.rpartition(":")
    if not sep or not port.isdigit():
        return peer, None
    return host.strip("[]"), int(port)


class TopicNames:
    """Topic id -> name, learned from Metadata responses; bounded (the oldest forgotten first)."""

    def __init__(self, cap: int = TOPIC_NAMES_CAP) -> None:
        self.cap = cap
        self._names: dict[uuid.UUID, str] = {}

    def learn(self, topic_id: uuid.UUID, name: str) -> None:
        if topic_id.int == 0 or self._names.get(topic_id) == name:
            return
        if len(self._names) >= self.cap:
            del self._names[next(iter(self._names))]
        self._names[topic_id] = name

    def name(self, topic: object) -> str | None:
        if topic is None:
            return None
        if isinstance(topic, uuid.UUID):
            return self._names.get(topic, str(topic))
        return str(topic)


class _Ranges(list[tuple[int, int, int]]):
    """The scanner's ``recs`` list, noting for each records field which entry it belongs to.

    A generated scanner appends a partition's records range while walking the
    partition struct and appends the partition's entry when the struct ends, so
    a range belongs to the entry at index ``len(acc)`` at the time it is noted.
    """

    __slots__ = ("acc",)

    def __init__(self, acc: list[Entry]) -> None:
        super().__init__()
        self.acc = acc

    def append(self, span: Any) -> None:
        super().append((len(self.acc), span[0], span[1]))


@dataclass(frozen=True, slots=True, kw_only=True)
class PayloadOptions:
    include: bool = False
    max_bytes: int = 1024
    max_records: int = 100  # per request/response pair


class CaptureObserver:
    """Capture records of one connection; see the module docstring for what is read."""

    __slots__ = ("_clock_offset", "_mechanism", "_pending", "conn", "node_id", "payloads", "principal", "sink",
                 "topics")

    def __init__(self, conn: ConnectionInfo, sink: Sink, topics: TopicNames,
                 payloads: PayloadOptions = PayloadOptions()) -> None:
        self.conn = conn
        self.node_id = conn.node_id
        self.sink = sink
        self.topics = topics
        self.payloads = payloads
        # Exchange times come from the session's perf_counter clock; records carry UTC wall time.
        self._clock_offset = time.time() - time.perf_counter()
        self._pending: dict[int, tuple[Exchange, dict[str, Any]]] = {}
        self._mechanism: str | None = None
        self.principal = conn.principal

    # -- SessionObserver --------------------------------------------------------------
    def request(self, exchange: Exchange) -> None:
        try:
            req = self._read_request(exchange, exchange.request)
        except (ProtocolError, Malformed, *SCAN_FAILURES) as exc:
            log.debug("event=capture_request_unreadable api=%s reason=%s", exchange.api, type(exc).__name__)
            req = {"client_id": None, "partitions": {}}
        self._pending[id(exchange)] = (exchange, req)

    def close(self) -> None:
        """The connection ended: requests still unanswered become records without a response."""
        pending, self._pending = self._pending, {}
        for exchange, req in pending.values():
            self.sink(self._record(exchange, req, scan_response=False))

    def complete(self, exchange: Exchange) -> None:
        _, req = self._pending.pop(id(exchange), (None, {"client_id": None, "partitions": {}}))
        try:
            record = self._record(exchange, req)
        except (ProtocolError, Malformed, *SCAN_FAILURES) as exc:
            log.debug("event=capture_response_unreadable api=%s reason=%s", exchange.api, type(exc).__name__)
            req["partitions"] = {}
            record = self._record(exchange, req, scan_response=False)
        self.sink(record)

    # -- reading -----------------------------------------------------------------------
    def _read_request(self, ex: Exchange, frame: bytes) -> dict[str, Any]:
        body = ex.request_body_offset  # the header as the session parsed it
        if body is None:
            raise DecodeError("truncated request header", offset=4)
        out: dict[str, Any] = {"client_id": ex.client_id}
        parts: dict[tuple[str | None, int | None], list[Any]] = {}
        out["partitions"] = parts
        fn = scanner(ex.api_key, ex.api_version, Direction.REQUEST)
        if fn is not None:
            acc: list[Entry] = []
            recs = _Ranges(acc)
            fn(frame, body, acc, recs, None)
            self._merge(parts, acc, recs, frame, keep_all=True)
            if ex.api_key == PRODUCE and self.payloads.include:
                out["payloads"] = self._payloads(acc, recs, frame)
        if ex.api_key == PRODUCE:
            out["transactional_id"], out["acks"] = _produce_head(frame, body, ex.api_version)
        elif ex.api_key == SASL_HANDSHAKE:
            mechanism = decode_body(ex.api_key, ex.api_version, Direction.REQUEST, frame, body).get("mechanism")
            self._mechanism = mechanism.upper() if isinstance(mechanism, str) else None
        elif ex.api_key == SASL_AUTHENTICATE:
            auth = decode_body(ex.api_key, ex.api_version, Direction.REQUEST, frame, body).get("auth_bytes")
            if isinstance(auth, bytes | bytearray | memoryview):
                out["sasl_user"] = sasl_user(self._mechanism, bytes(auth))
        elif ex.api_key in _ID_APIS:
            decoded = decode_body(ex.api_key, ex.api_version, Direction.REQUEST, frame, body)
            out["group_id"] = decoded.get("group_id")
            out["transactional_id"] = decoded.get("transactional_id")
            if ex.api_key == FIND_COORDINATOR:
                key = decoded.get("key") or next(iter(decoded.get("coordinator_keys") or ()), None)
                if key is not None:
                    out["transactional_id" if decoded.get("key_type") == 1 else "group_id"] = key
        return out

    def _merge(self, parts: dict[tuple[str | None, int | None], list[Any]], acc: list[Entry],
               recs: _Ranges, frame: bytes, *, keep_all: bool) -> None:
        counts: dict[int, tuple[int, int]] = {}
        if recs:
            view = memoryview(frame)
            for index, start, end in recs:
                n, size = counts.get(index, (0, 0))
                counts[index] = (n + count_records(view[start:end]), size + end - start)
        for i, (topic, partition, code) in enumerate(acc):
            n, size = counts.get(i, (0, 0))
            if not keep_all and not code and not n:
                continue
            if topic is None and partition is None:
                continue  # a top-level code: the record's error_code
            key = (self.topics.name(topic), partition)
            entry = parts.get(key)
            if entry is None:
                parts[key] = [key[0], partition, code, n, size]
            else:
                if code is not None:
                    entry[2] = code
                entry[3] += n
                entry[4] += size

    def _payloads(self, acc: list[Entry], recs: _Ranges, frame: bytes) -> list[dict[str, Any]]:
        cap, limit = self.payloads.max_bytes, self.payloads.max_records
        out: list[dict[str, Any]] = []
        view = memoryview(frame)
        for index, start, end in recs:
            topic, partition, _ = acc[index] if index < len(acc) else (None, None, None)
            try:
                records = decode_all(view[start:end], check_crc=False)
            except ProtocolError:
                continue
            for rec in records:
                if len(out) >= limit:
                    return out
                out.append({"topic": self.topics.name(topic), "partition": partition, "offset": rec.offset,
                            "key": None if rec.key is None else bytes(rec.key[:cap]),
                            "value": None if rec.value is None else bytes(rec.value[:cap]),
                            "key_size": -1 if rec.key is None else len(rec.key),
                            "value_size": -1 if rec.value is None else len(rec.value)})
        return out

    def _record(self, ex: Exchange, req: dict[str, Any], *, scan_response: bool = True) -> dict[str, Any]:
        parts: dict[tuple[str | None, int | None], list[Any]] = req["partitions"]
        top_code: int | None = None
        payloads = req.get("payloads")
        response = ex.response
        if response is not None and scan_response:
            if ex.api_key == METADATA:
                self._learn_topic_ids(ex, response)
            fn = scanner(ex.api_key, ex.api_version, Direction.RESPONSE)
            if fn is not None:
                offset = ex.response_body_offset or response_body_offset(response, ex.api_key, ex.api_version)
                acc: list[Entry] = []
                recs = _Ranges(acc)
                fn(response, offset, acc, recs, None)
                for topic, partition, code in acc:
                    if topic is None and partition is None and code is not None:
                        top_code = code if top_code is None or not top_code else top_code
                self._merge(parts, acc, recs, response, keep_all=ex.api_key in _RECORD_APIS)
                if ex.api_key == FETCH and self.payloads.include:
                    payloads = self._payloads(acc, recs, response)
        if ex.api_key == SASL_AUTHENTICATE and top_code == 0 and req.get("sasl_user"):
            self.principal = "User:" + req["sasl_user"]  # this record and every later one of the connection
        wall = self._clock_offset
        partitions = [{"topic": t, "partition": p, "error_code": c, "record_count": n, "record_bytes": b}
                      for t, p, c, n, b in parts.values()]
        broker = ex.broker_seconds
        return {
            "schema_version": SCHEMA_VERSION,
            "request_time": int((ex.read_at + wall) * 1_000_000),
            "response_time": int((ex.completed_at + wall) * 1_000_000) if response is not None else None,
            "connection_id": self.conn.connection_id,
            "client_host": self.conn.client_host,
            "client_port": self.conn.client_port,
            "client_id": req["client_id"],
            "principal": self.principal,
            "listener": self.conn.listener,
            "node_id": self.node_id,
            "upstream": self.conn.upstream,
            "api_key": ex.api_key,
            "api_name": api_name(ex.api_key),
            "api_version": ex.api_version,
            "correlation_id": ex.correlation_id,
            "request_bytes": ex.request_size,
            "response_bytes": len(response) if response is not None else None,
            "broker_latency_ms": broker * 1000.0 if broker is not None else None,
            "kproxy_latency_ms": ex.overhead_seconds * 1000.0,
            "local_response": ex.local,
            "error_code": top_code,
            "acks": req.get("acks"),
            "group_id": req.get("group_id"),
            "transactional_id": req.get("transactional_id"),
            "record_count": sum(p["record_count"] for p in partitions),
            "record_bytes": sum(p["record_bytes"] for p in partitions),
            "partitions": partitions,
            "rule_decisions": [],  # filled once the rules engine reports its decisions
            "payloads": payloads if self.payloads.include else None,
        }

    def _learn_topic_ids(self, ex: Exchange, response: bytes) -> None:
        if ex.api_version < 10:  # topic ids appear in Metadata v10 (KIP-516)
            return
        offset = ex.response_body_offset or response_body_offset(response, ex.api_key, ex.api_version)
        body = decode_body(METADATA, ex.api_version, Direction.RESPONSE, response, offset)
        for topic in body.get("topics") or ():
            topic_id, name = topic.get("topic_id"), topic.get("name")
            if isinstance(topic_id, uuid.UUID) and isinstance(name, str):
                self.topics.learn(topic_id, name)


def sasl_user(mechanism: str | None, auth: bytes) -> str | None:
    """The user name in a client's first SASL message, for PLAIN and SCRAM; None for others."""
    try:
        if mechanism == "PLAIN":  # [authzid] NUL authcid NUL passwd (RFC 4616): the password is not read
            parts = auth.split(b"\x00", 2)
            return parts[1].decode("utf-8") if len(parts) == 3 and parts[1] else None
        if mechanism is not None and mechanism.startswith("SCRAM-"):  # "n,,n=user,r=nonce" (RFC 5802)
            for attr in auth.decode("utf-8").split(",")[2:]:
                if attr.startswith("n="):
                    return attr[2:].replace("=2C", ",").replace("=3D", "=") or None
    except UnicodeDecodeError:
        return None
    return None


class Tee:
    """Two session observers as one: metrics first, then capture."""

    __slots__ = ("first", "second")

    def __init__(self, first: SessionObserver, second: SessionObserver) -> None:
        self.first = first
        self.second = second

    def request(self, exchange: Exchange) -> None:
        self.first.request(exchange)
        self.second.request(exchange)

    def complete(self, exchange: Exchange) -> None:
        self.first.complete(exchange)
        self.second.complete(exchange)


def _produce_head(frame: bytes, body: int, api_version: int) -> tuple[str | None, int | None]:
    """A Produce request's transactional id (v3+) and acks, read in place (the body is never decoded)."""
    pos = body
    txn: str | None = None
    try:
        if api_version >= 9:  # compact nullable string: length + 1, 0 = null
            n, pos = read_uvarint(frame, pos)
            if n:
                txn = bytes(frame[pos:pos + n - 1]).decode("utf-8", "replace")
                pos += n - 1
        elif api_version >= 3:
            n = int.from_bytes(frame[pos:pos + 2], "big", signed=True)
            pos += 2
            if n >= 0:
                txn = bytes(frame[pos:pos + n]).decode("utf-8", "replace")
                pos += n
        acks = int.from_bytes(frame[pos:pos + 2], "big", signed=True)
        return txn, acks
    except (Malformed, IndexError):
        return None, None
