"""The capture record: one definition, read by the writer and by the Spark job alike.

One record describes one request and its response (or its absence: Produce with
acks=0). The columns are declared once, here, as plain data; the writer derives
its Arrow schema from them (:mod:`kproxy.capture.writer`) and the analysis job
its Spark ``StructType`` (:mod:`kproxy.analysis.spark_schema`), so the two cannot
drift apart. This module is sans-IO and imports nothing else of kproxy, nor
pyarrow nor pyspark: the Spark job ships it to executors on its own.

Every capture file carries :data:`SCHEMA_VERSION` twice: in its file metadata
under :data:`VERSION_METADATA_KEY` (checked before a file is read) and in the
``schema_version`` column (so a mixed directory is visible in a query).
Bump the version when a column changes meaning or type; adding a nullable
column at the end is compatible and keeps it. :data:`READABLE_VERSIONS` are the
versions this kproxy reads with today's columns.

Version 2 added ``dry_run`` to the items of ``rule_decisions`` and began filling
that column (version 1 writers wrote it empty in every record): a reader of
version 1 would count dry-run matches as injected faults, so the version
changed, and it refuses version 2 files with a line instead. A version 1 file
reads as version 2: its ``rule_decisions`` lists are all empty, so the missing
field is missing from no item.

Version 3 added ``group_id``, ``committed_offset`` and ``high_watermark`` to the items of
``partitions`` (what consumer lag is made of: kproxy/protocol/offset_reads.py). Older files read
as version 3 with the three null in every item, which is what they mean there: nothing of
the kind was recorded. Readers name the fields they read (a reader of version 2 refuses
version 3 files, whose items it would not know).

Version 4 added ``base_offset``, ``last_offset`` and ``max_timestamp`` to the items of
``partitions``: when a range of the partition's offsets was written (lag in seconds: a Produce
answer's base offset for the records its request carried there, with their v2 batch headers' max
timestamp; a Fetch answer's records' batch headers). Older files read as version 4 with the three
null in every item: they recorded no write time, so their analysis has lag in offsets and no lag in
seconds (and says so).

Version 5 added what the client anomaly detectors read (:mod:`kproxy.analysis.capture_anomalies`):
``producer_id``, ``producer_epoch``, ``base_sequence``, ``batch_crc`` and ``codec`` to the items of
``partitions`` (a Produce request's first v2 batch header there: retry storms, uncompressed
producers), and ``member_id``, ``group_instance_id`` and ``session_timeout_ms`` at the end of the
record (members that vanish). It also writes one record per connection when it closes (connection
churn): ``api_key`` :data:`CONNECTION_CLOSED_KEY`, ``request_time`` the close's time, ``close_reason``
why, no request nor response; :func:`kproxy.analysis.job.read_captures` leaves these out of the
records every table but the client anomalies reads. Its files also carry the run's detector settings in their metadata
(:data:`ANOMALY_METADATA_KEY`). Older files read as version 5 with these null: their analysis
says which anomaly kinds it could not tell.

The columns a fault-injection rule can match on (api, version, client id,
client address, node id, topics and partitions, group id, transactional id,
acks) are all here, so a what-if run can evaluate rules against a capture.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 5
# Versions whose files read correctly under COLUMNS (see the module docstring): the writer's and older.
READABLE_VERSIONS: tuple[int, ...] = (1, 2, 3, 4, 5)
VERSION_METADATA_KEY = "kproxy.capture.schema_version"
# The api key and name of a connection's close record (version 5+): no request, the connection's end.
CONNECTION_CLOSED_KEY = -1
CONNECTION_CLOSED_NAME = "ConnectionClosed"
# The run's client anomaly detector settings (version 5+; JSON, AnomalyOptions' fields by name; absent
# when the run counted no client anomalies): what ``kproxy analyze`` counts with unless told otherwise.
ANOMALY_METADATA_KEY = "kproxy.capture.client_anomalies"

# Scalar types, named as Arrow and Spark both understand them (each side maps them once).
SCALAR_TYPES = frozenset({"bool", "int16", "int32", "int64", "float64", "string", "binary", "timestamp_us"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Column:
    """One column: a scalar, or (``type="list"``) a list of structs whose fields are ``items``."""

    name: str
    type: str
    doc: str
    nullable: bool = True
    items: tuple[Column, ...] = ()

    def __post_init__(self) -> None:
        if self.type == "list":
            if not self.items:
                raise ValueError(f"list column {self.name!r} needs item fields")
        elif self.type not in SCALAR_TYPES:
            raise ValueError(f"column {self.name!r}: unknown type {self.type!r}")


def _c(name: str, type_: str, doc: str, *, nullable: bool = True, items: tuple[Column, ...] = ()) -> Column:
    return Column(name=name, type=type_, doc=doc, nullable=nullable, items=items)


PARTITION_ITEMS: tuple[Column, ...] = (
    _c("topic", "string", "topic name; a Fetch v13+ topic id (UUID text) when the name was not learned"),
    _c("partition", "int32", "partition index; null for a topic-level entry"),
    _c("error_code", "int16", "the response's error code for this partition (or topic); null: none given"),
    _c("record_count", "int64", "records in this partition's record batches (Produce request, Fetch response)",
       nullable=False),
    _c("record_bytes", "int64", "bytes of those record batches as sent (compressed)", nullable=False),
    _c("group_id", "string", "the consumer group of committed_offset (version 3+; an OffsetFetch v8+ answer "
                             "names several groups: one item per group and partition)"),
    _c("committed_offset", "int64", "the offset the group committed here: an OffsetCommit request's whose "
                                    "answer accepted this partition, or an OffsetFetch answer's (version 3+)"),
    _c("high_watermark", "int64", "the partition's high watermark: a Fetch answer's (error code 0), or a "
                                  "ListOffsets answer's latest offset at read_uncommitted; or its log end offset "
                                  "after a Produce the answer accepted: base offset + the request's records there "
                                  "(version 3+)"),
    _c("base_offset", "int64", "the first offset of a range of the partition's records whose write time "
                               "max_timestamp gives: a Produce answer's base offset for the records its request "
                               "carried here, whose answer accepted them; a Fetch answer's first batch's base "
                               "offset here (version 4+)"),
    _c("last_offset", "int64", "the last offset of that range (version 4+)"),
    _c("max_timestamp", "int64", "when the range was written, ms since the epoch: the latest max timestamp of "
                                 "its v2 batch headers (CreateTime: the producer's; a Fetch answer's batches of a "
                                 "LogAppendTime topic: the broker's; version 4+)"),
    _c("producer_id", "int64", "a Produce request's first v2 batch here: its producer id (-1: not idempotent; "
                               "version 5+)"),
    _c("producer_epoch", "int16", "that batch's producer epoch (version 5+)"),
    _c("base_sequence", "int32", "that batch's base sequence (version 5+)"),
    _c("batch_crc", "int64", "that batch's CRC-32C as its header states it (version 5+)"),
    _c("codec", "int16", "that batch's compression codec: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd (version 5+)"),
)

RULE_DECISION_ITEMS: tuple[Column, ...] = (
    _c("rule", "string", "the rule's id", nullable=False),
    _c("action", "string", "the action, as the rule file names it: inject_error, delay, throttle, "
                           "close_connection, ...", nullable=False),
    _c("detail", "string", "what it did, e.g. the error's name and code or the delay in ms"),
    _c("dry_run", "bool", "the rule is a dry run: it matched and did nothing (null: a version 1 file)"),
)

PAYLOAD_ITEMS: tuple[Column, ...] = (
    _c("topic", "string", "topic of the record"),
    _c("partition", "int32", "partition of the record"),
    _c("offset", "int64", "the record's offset (as the batch states it; Produce requests: relative)"),
    _c("key", "binary", "the key, cut to the configured cap"),
    _c("value", "binary", "the value, cut to the configured cap"),
    _c("key_size", "int32", "the key's full size (-1: null key)", nullable=False),
    _c("value_size", "int32", "the value's full size (-1: null value)", nullable=False),
)

COLUMNS: tuple[Column, ...] = (
    _c("schema_version", "int16", "SCHEMA_VERSION of the writer", nullable=False),
    _c("request_time", "timestamp_us", "when the request was read from the client (UTC)", nullable=False),
    _c("response_time", "timestamp_us", "when the response was released to the client (UTC); null: none"),
    _c("connection_id", "string", "unique per client connection of one kproxy process", nullable=False),
    _c("client_host", "string", "client address", nullable=False),
    _c("client_port", "int32", "client port"),
    _c("client_id", "string", "the request header's client id"),
    _c("principal", "string", "TLS client certificate subject or SASL principal, when known"),
    _c("listener", "string", "kproxy listener: bootstrap or broker-N", nullable=False),
    _c("node_id", "int32", "broker node id behind the listener; null for the bootstrap listener"),
    _c("upstream", "string", "the broker address kproxy forwarded to"),
    _c("api_key", "int16", "Kafka api key", nullable=False),
    _c("api_name", "string", "Kafka api name (Produce, Fetch, ...)", nullable=False),
    _c("api_version", "int16", "request api version", nullable=False),
    _c("correlation_id", "int32", "request header correlation id", nullable=False),
    _c("request_bytes", "int64", "request frame size, size prefix included", nullable=False),
    _c("response_bytes", "int64", "response frame size as sent to the client; null: no response"),
    _c("broker_latency_ms", "float64", "forwarded upstream -> response read; null for local answers and acks=0"),
    _c("kproxy_latency_ms", "float64", "kproxy's own time: read -> forwarded, plus response read -> released",
       nullable=False),
    _c("local_response", "bool", "kproxy answered itself (the broker never saw the request)", nullable=False),
    _c("error_code", "int16", "top-level error code of the response; null: the response has none"),
    _c("acks", "int16", "Produce acks"),
    _c("group_id", "string", "consumer group id of group requests"),
    _c("transactional_id", "string", "transactional id of Produce and transaction requests"),
    _c("record_count", "int64", "records in the request (Produce) or response (Fetch)", nullable=False),
    _c("record_bytes", "int64", "bytes of those record batches", nullable=False),
    _c("partitions", "list", "per topic-partition entries of the request and response", nullable=False,
       items=PARTITION_ITEMS),
    _c("rule_decisions", "list", "each action of a fault-injection rule that acted on this request (or, "
                                 "for a dry-run rule, matched it), in the order they acted", nullable=False,
       items=RULE_DECISION_ITEMS),
    _c("payloads", "list", "record keys and values; null unless capture.include_payloads",
       items=PAYLOAD_ITEMS),
    _c("cluster", "string", "the cluster of the listener (the config's clusters:; default without); null: "
                            "written before kproxy served several clusters"),
    _c("member_id", "string", "the consumer group member id a group request names (a LeaveGroup v3+: its "
                              "first member's; version 5+)"),
    _c("group_instance_id", "string", "the static member id a group request names (version 5+)"),
    _c("session_timeout_ms", "int32", "a JoinGroup's session timeout (version 5+)"),
    _c("close_reason", "string", "a connection's close record (api_key -1): why it closed, as the "
                                 "connection_closed log line says (version 5+)"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)
_BY_NAME: Mapping[str, Column] = {c.name: c for c in COLUMNS}

# What to fill where a producer of records has nothing to say.
_EMPTY: Mapping[str, Any] = {"schema_version": SCHEMA_VERSION, "record_count": 0, "record_bytes": 0,
                             "local_response": False, "partitions": [], "rule_decisions": []}


def column(name: str) -> Column:
    return _BY_NAME[name]


def new_record(**values: Any) -> dict[str, Any]:
    """A record with every column present: ``values`` over the defaults (null, 0, empty lists).

    Unknown names raise :class:`KeyError`, so a typo cannot make a column silently null.
    """
    for name in values:
        if name not in _BY_NAME:
            raise KeyError(f"no capture column {name!r}")
    record = dict.fromkeys(COLUMN_NAMES)
    record.update(_EMPTY)
    record["partitions"] = []
    record["rule_decisions"] = []
    record.update(values)
    return record


def check_version(metadata: Mapping[bytes, bytes] | None, where: str) -> None:
    """Raise :class:`SchemaVersionError` unless ``metadata`` (a file's key/value metadata)
    names one of :data:`READABLE_VERSIONS`; ``where`` (a file name) goes in the message."""
    raw = (metadata or {}).get(VERSION_METADATA_KEY.encode())
    if raw is None:
        raise SchemaVersionError(f"{where}: not a kproxy capture file (no {VERSION_METADATA_KEY} metadata)")
    try:
        version = int(raw)
    except ValueError:
        raise SchemaVersionError(f"{where}: unreadable capture schema version {raw!r}") from None
    if version not in READABLE_VERSIONS:
        raise SchemaVersionError(f"{where}: capture schema version {version}, {version_support()}")


def version_support() -> str:
    """``this kproxy reads versions 1 to 4``: what a refusal of another version says."""
    low, high = min(READABLE_VERSIONS), max(READABLE_VERSIONS)
    return f"this kproxy reads version {high}" if low == high else f"this kproxy reads versions {low} to {high}"


class SchemaVersionError(Exception):
    """A capture file written with another schema version (or not a capture file)."""
