"""Response transformations for fault injection: throttle time, metadata, ApiVersions, error codes.

Each function takes a whole response frame (size prefix included, see
:mod:`kproxy.protocol.mutation`) and the api key and version of the request
it answers, and returns a :class:`~kproxy.protocol.mutation.Mutation`. Only
the top-level fields that change are decoded and re-encoded
(:func:`~kproxy.protocol.splice.splice_body`); every other byte is copied. With
nothing to change, the same frame object comes back.

Bad input: :class:`~kproxy.protocol.errors.DecodeError` for a frame that does
not parse; a :class:`~kproxy.protocol.errors.MutationError` subclass for a
frame that parses but cannot take the transformation (the field is not in this
version).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from kproxy.protocol.codes import error_name
from kproxy.protocol.error_response import set_error_codes
from kproxy.protocol.errors import (
    ApiVersionsMutationError,
    ErrorCodeMutationError,
    MetadataMutationError,
    ThrottleTimeError,
)
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.message_schemas import PARTITION_FIELDS, MessageType, message_schema
from kproxy.protocol.messages import require_codec
from kproxy.protocol.mutation import Mutation, reframe
from kproxy.protocol.splice import Edit, splice_body

API_VERSIONS, FETCH = 18, 1
UNSUPPORTED_VERSION = 35
LEADER_NOT_AVAILABLE = 5
_INT32_MAX = 2**31 - 1


def _splice(frame: bytes, api_key: int, api_version: int, edits: Mapping[str, Edit], count: list[int],
            offset: int | None = None) -> Mutation:
    """Apply top-level edits to a response frame; ``count[0]`` is what the edits counted."""
    if offset is None:
        offset = response_body_offset(frame, api_key, api_version, whole=True)
    new_body, _ = splice_body(api_key, api_version, MessageType.RESPONSE, frame, edits, offset)
    if new_body is None or not count[0]:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, offset, new_body), count[0])


# ------------------------------------------------------------------------ throttle time


def set_throttle_time(frame: bytes, api_key: int, api_version: int, throttle_time_ms: int, *,
                      at_least: bool = True) -> Mutation:
    """Set the top-level ``throttle_time_ms`` of a response.

    With ``at_least`` (the default) the broker's own value is kept when it is
    already larger: a quota kproxy adds never hides a broker's. The value is
    clamped to [0, 2**31 - 1]. Raises :class:`ThrottleTimeError` when this
    response version has no such field (ApiVersions v0, Produce v0...).
    """
    schema = message_schema(api_key, api_version, MessageType.RESPONSE)
    if schema is None or not any(f.name == "throttle_time_ms" and f.tag is None for f in schema.fields):
        raise ThrottleTimeError(f"api key {api_key} v{api_version} responses have no throttle_time_ms")
    wanted = min(max(int(throttle_time_ms), 0), _INT32_MAX)
    count = [0]

    def edit(old: int) -> int:
        new = max(old, wanted) if at_least else wanted
        count[0] = int(new != old)
        return new

    offset = response_body_offset(frame, api_key, api_version, whole=True)
    if api_key == API_VERSIONS and _api_versions_error(frame, offset) == UNSUPPORTED_VERSION:
        raise ThrottleTimeError("an UNSUPPORTED_VERSION ApiVersions answer is a v0 body: no throttle_time_ms")
    return _splice(frame, api_key, api_version, {"throttle_time_ms": edit}, count, offset)


# ---------------------------------------------------------------------------- metadata


class HiddenLeader(enum.Enum):
    """What a partition led by a hidden broker reports."""

    LEADER_NOT_AVAILABLE = "leader_not_available"  # error 5, leader -1: the client refreshes and retries
    MOVE = "move"  # the first in-sync replica that is not hidden leads (error 5 when there is none)


# (topic name, partition index); a partition of None selects every partition of the topic.
PartitionKey = tuple[str, int | None]


@dataclass(frozen=True, slots=True)
class MetadataEdits:
    """What to change in Metadata, DescribeCluster and DescribeTopicPartitions answers.

    Partition selectors are ``(topic, partition)`` keys; ``(topic, None)``
    selects every partition of the topic. A hidden broker disappears from the
    broker list (and from ``controller_id``, which becomes -1), leaves every
    ISR and is listed in ``offline_replicas`` where it is a replica; the
    partitions it led behave as ``hidden_leader`` says. The broker that answers
    is never hidden from its own answer, and no answer is left listing no
    broker (see :func:`mutate_metadata`): a running cluster always lists the
    broker answering. A hidden partition stays listed, with no leader
    (``leader_id`` -1) and LEADER_NOT_AVAILABLE, as a cluster lists a partition
    whose leader is gone: removed from the answer, clients would take it for
    one that does not exist. ``move_leader`` gives a
    partition a new leader and bumps its ``leader_epoch`` (clients ignore
    metadata with an older epoch than they know, KIP-320), ``shrink_isr`` and
    ``offline_replicas`` replace those lists.
    """

    hide_brokers: frozenset[int] = frozenset()
    hide_partitions: frozenset[PartitionKey] = frozenset()
    move_leader: Mapping[PartitionKey, int] = field(default_factory=dict)
    shrink_isr: Mapping[PartitionKey, tuple[int, ...]] = field(default_factory=dict)
    offline_replicas: Mapping[PartitionKey, tuple[int, ...]] = field(default_factory=dict)
    hidden_leader: HiddenLeader = HiddenLeader.LEADER_NOT_AVAILABLE


def _lookup(table: Mapping[PartitionKey, Any] | Collection[PartitionKey], topic: str | None,
            partition: int) -> Any:
    if topic is None:
        return None
    if isinstance(table, Mapping):
        found = table.get((topic, partition))
        return found if found is not None else table.get((topic, None))
    return True if (topic, partition) in table or (topic, None) in table else None


def mutate_metadata(frame: bytes, api_key: int, api_version: int, edits: MetadataEdits,
                    answering: int | None = None) -> Mutation:
    """Apply :class:`MetadataEdits` to a Metadata (3), DescribeCluster (60) or
    DescribeTopicPartitions (75) response; ``changed`` counts edited brokers
    and partitions. Raises :class:`MetadataMutationError` for a response with
    neither ``brokers`` nor ``topics``.

    ``answering`` is the node id of the broker that answered (None: not known,
    as on a bootstrap connection): it is never hidden. When every broker the
    answer lists would be hidden all the same (an unknown answering broker),
    the first it lists stays, with the partitions it leads: the answer lists at
    least one broker whenever the broker's did.
    """
    schema = message_schema(api_key, api_version, MessageType.RESPONSE)
    names = {f.name for f in schema.fields if f.tag is None} if schema is not None else set()
    if not names & {"brokers", "topics"}:
        raise MetadataMutationError(f"api key {api_key} v{api_version} responses have no brokers or topics")
    count = [0]
    # The brokers hidden from this answer: the broker list (before the controller and the topics,
    # in every schema that has them) may keep one more.
    hidden = [edits.hide_brokers if answering is None else edits.hide_brokers - {answering}]
    out: dict[str, Edit] = {}
    if hidden[0] and "brokers" in names:
        def brokers(value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
            if value is None:
                return None
            kept = [b for b in value if _node(b) not in hidden[0]]
            if value and not kept:
                kept = value[:1]
                hidden[0] = hidden[0] - {_node(value[0])}
            count[0] += len(value) - len(kept)
            return kept
        out["brokers"] = brokers
    if hidden[0] and "controller_id" in names:
        def controller(value: int) -> int:
            if value in hidden[0]:
                count[0] += 1
                return -1
            return value
        out["controller_id"] = controller
    if "topics" in names:
        def topics(value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
            for topic in value or ():
                for p in topic.get("partitions") or ():
                    _edit_partition(topic.get("name"), p, edits, hidden[0], count)
            return value
        out["topics"] = topics
    return _splice(frame, api_key, api_version, out, count)


def _node(broker: dict[str, Any]) -> Any:
    """A broker entry's node id (``node_id`` in Metadata, ``broker_id`` in DescribeCluster)."""
    return broker.get("node_id", broker.get("broker_id"))


def _edit_partition(topic: str | None, p: dict[str, Any], edits: MetadataEdits, hidden: frozenset[int],
                    count: list[int]) -> None:
    """Edit one partition entry in place (``hidden``: the brokers hidden from this answer)."""
    index = p.get("partition_index", -1)
    before = dict(p)
    if _lookup(edits.hide_partitions, topic, index):
        _leaderless(p)
        if p != before:
            count[0] += 1
        return
    if hidden:
        replicas = p.get("replica_nodes") or []
        # A hidden broker is out of sync and, in DescribeTopicPartitions (KIP-966), not eligible to lead.
        for name in ("isr_nodes", "eligible_leader_replicas"):
            if p.get(name) is not None:
                p[name] = [n for n in p[name] if n not in hidden]
        if "offline_replicas" in p and p["offline_replicas"] is not None:
            p["offline_replicas"] = list(p["offline_replicas"]) + [
                n for n in replicas if n in hidden and n not in p["offline_replicas"]]
        if p.get("leader_id") in hidden:
            candidates = [n for n in (p.get("isr_nodes") or replicas) if n not in hidden]
            if edits.hidden_leader is HiddenLeader.MOVE and candidates:
                _set_leader(p, candidates[0])
            else:
                _leaderless(p)
    leader = _lookup(edits.move_leader, topic, index)
    if leader is not None and leader != p.get("leader_id"):
        _set_leader(p, leader)
    isr = _lookup(edits.shrink_isr, topic, index)
    if isr is not None and "isr_nodes" in p:
        p["isr_nodes"] = list(isr)
    offline = _lookup(edits.offline_replicas, topic, index)
    if offline is not None and "offline_replicas" in p:
        p["offline_replicas"] = list(offline)
    if p != before:
        count[0] += 1


def _leaderless(p: dict[str, Any]) -> None:
    """A partition whose leader is gone: no leader, LEADER_NOT_AVAILABLE (the client asks again later)."""
    p["leader_id"] = -1
    p["error_code"] = LEADER_NOT_AVAILABLE


def _set_leader(p: dict[str, Any], leader: int) -> None:
    p["leader_id"] = leader
    if p.get("leader_epoch", -1) >= 0:
        p["leader_epoch"] += 1


# ------------------------------------------------------------------------- ApiVersions


def _api_versions_error(frame: bytes, offset: int) -> int:
    # The error code is the first field of every ApiVersions response version.
    if len(frame) < offset + 2:
        raise ApiVersionsMutationError("ApiVersions response too short for its error code")
    return int(struct.unpack_from(">h", frame, offset)[0])


def downgrade_api_versions(frame: bytes, api_version: int, max_versions: Mapping[int, int]) -> Mutation:
    """Lower the advertised ``max_version`` of the given api keys in an ApiVersions response.

    A cap is never applied below the entry's ``min_version`` (an API stays
    usable at its lowest version); api keys not advertised are not added.
    A broker's UNSUPPORTED_VERSION answer is a v0 body whatever the request
    version (KIP-511) and is edited as one. ``changed`` counts lowered entries.
    """
    offset = response_body_offset(frame, API_VERSIONS, api_version, whole=True)
    version = 0 if _api_versions_error(frame, offset) == UNSUPPORTED_VERSION else api_version
    if message_schema(API_VERSIONS, version, MessageType.RESPONSE) is None:
        raise ApiVersionsMutationError(f"no ApiVersions response schema for v{version}")
    count = [0]

    def cap(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for entry in entries or ():
            top = max_versions.get(entry["api_key"])
            if top is None:
                continue
            new = max(entry["min_version"], min(entry["max_version"], top))
            if new != entry["max_version"]:
                entry["max_version"] = new
                count[0] += 1
        return entries

    new_body, _ = splice_body(API_VERSIONS, version, MessageType.RESPONSE, frame, {"api_keys": cap}, offset)
    if new_body is None or not count[0]:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, offset, new_body), count[0])


# -------------------------------------------------------------------------- error codes


def replace_error_codes(frame: bytes, api_key: int, api_version: int, error_code: int, *,
                        partitions: Collection[int] | None = None, message: str | None = None) -> Mutation:
    """Replace the broker's error codes in a response: every code, or those of the given partitions.

    An ``error_message`` beside a replaced code gets ``message`` (default:
    the error's name, marked as injected). A Fetch partition whose code is
    replaced loses its records, as a broker sends none with an error. The
    body is decoded and re-encoded whole (codes sit at every level); the
    header is kept. ``changed`` counts replaced codes. Raises
    :class:`ErrorCodeMutationError` when the response has no code to replace
    (or none of the given partitions).
    """
    codec = require_codec(api_key, api_version, MessageType.RESPONSE)
    offset = response_body_offset(frame, api_key, api_version, whole=True)
    body = codec.decode(frame, offset)
    chosen = None if partitions is None else frozenset(partitions)
    if message is None:
        message = f"{error_name(error_code)} (injected by kproxy)"
    changed = set_error_codes(codec.schema.fields, body, error_code, partitions=chosen, message=message)
    if not changed:
        raise ErrorCodeMutationError(f"no error code to replace in api key {api_key} v{api_version}"
                                     + ("" if chosen is None else f" for partitions {sorted(chosen)}"))
    if api_key == FETCH:
        _drop_fetch_records(body, chosen)
    return Mutation(reframe(frame, offset, codec.encode(body)), changed)


def _drop_fetch_records(body: dict[str, Any], chosen: frozenset[int] | None) -> None:
    for topic in body.get("responses") or ():
        for p in topic.get("partitions") or ():
            index = next((p[k] for k in PARTITION_FIELDS if k in p), None)
            if (chosen is None or index in chosen) and p.get("records") is not None:
                p["records"] = b""
