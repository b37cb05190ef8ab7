"""Act on some topic-partitions of a request only: split it, merge the broker's answer, replace entries.

A rule that names topics or partitions injects its error into the topic-partitions it names and
leaves the others of the same request alone. Two ways, both read from the schemas (no per-API
code), for every API whose request carries a top-level topics -> partitions array mirrored by a
topics -> partitions array in its response:

* APIs with side effects (Produce, OffsetCommit, TxnOffsetCommit, DeleteRecords,
  AddPartitionsToTxn v0-v3...): :func:`split_request` takes the selected partitions out of the
  request (a topic left without partitions is dropped); the rest is forwarded, and
  :meth:`Split.merge` puts error entries for the removed ones into the broker's answer, in the
  request's order, so the client sees one answer listing every partition it asked for.
* Read-only APIs (:data:`READ_ONLY_APIS`: Fetch, ListOffsets, OffsetFetch,
  OffsetForLeaderEpoch, DescribeProducers): the request is forwarded whole and
  :func:`replace_entries` replaces the selected partitions' entries of the answer by error
  entries. Fetch must go whole: a fetch session (KIP-227) remembers the partitions each Fetch
  named, and one left out of a session's creation would never be fetched again.

An error entry is what a broker answers for a failed partition: every field at its default, the
partition index kept, the values Kafka writes on an error path (``base_offset`` -1, Fetch's
``high_watermark`` -1 and empty records...: :func:`~kproxy.protocol.error_response.error_values`),
the error code and ``error_message``.

Topics named by id (Fetch v13+, Produce v13+...) are selected as the selector decides (it looks
ids up by name; an id it cannot name is not selected).
"""

from __future__ import annotations

import functools
import uuid
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from kproxy.protocol.api_keys import DESCRIBE_PRODUCERS, FETCH, LIST_OFFSETS, OFFSET_FETCH, OFFSET_FOR_LEADER_EPOCH
from kproxy.protocol.codes import error_name
from kproxy.protocol.error_response import build_error_body, error_values
from kproxy.protocol.headers import request_body_offset, response_body_offset
from kproxy.protocol.message_schemas import ERROR_CODE_FIELDS, PARTITION_FIELDS, Field, MessageType, message_schema
from kproxy.protocol.messages import Body, default_struct, require_codec
from kproxy.protocol.mutation import Mutation, reframe, request_header
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.splice import splice_body

# APIs that read and change nothing: their requests are forwarded whole (see the module docstring).
READ_ONLY_APIS = frozenset({FETCH, LIST_OFFSETS, OFFSET_FETCH, OFFSET_FOR_LEADER_EPOCH, DESCRIBE_PRODUCERS})
_INDEX_FIELDS = PARTITION_FIELDS | {"index"}

TopicKey = str | uuid.UUID | None


def _topic_field(fields: tuple[Field, ...]) -> Field | None:
    """The field naming a struct's topic: its name (preferred) or its id."""
    named = [f for f in fields if f.tag is None and not f.array]
    return next((f for f in named if f.type == "string" and f.entity_type == "topicName"),
                next((f for f in named if f.type == "uuid" and f.name == "topic_id"), None))


def _index_field(fields: tuple[Field, ...]) -> Field | None:
    """The partition index of a partition-level struct."""
    return next((f for f in fields if f.tag is None and not f.array and f.type == "int32"
                 and f.name in _INDEX_FIELDS), None)


def _partition_array(fields: tuple[Field, ...], bare: bool) -> Field | None:
    """A topic struct's partition array: structs with an index, or (``bare``) a list of indexes."""
    for f in fields:
        if f.tag is not None or not f.array:
            continue
        if f.type == "struct" and f.fields is not None and _index_field(f.fields) is not None:
            return f
        if bare and f.type == "int32" and "partition" in f.name:
            return f
    return None


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the topic-partitions sit in one (api key, version)'s request and response."""

    request_topics: str  # the request's top-level topic array
    request_topic: str  # the field naming a request topic (name or id)
    request_partitions: str  # its partition array
    request_index: str | None  # a request partition's index field (None: a list of bare indexes)
    response_topics: str
    response_topic: str
    response_partitions: str
    response_index: str


@functools.cache
def layout(api_key: int, api_version: int) -> Layout | None:
    """The topic-partition layout of an (api key, version), or None when it has none to split."""
    request = message_schema(api_key, api_version, MessageType.REQUEST)
    response = message_schema(api_key, api_version, MessageType.RESPONSE)
    if request is None or response is None:
        return None
    candidates: list[tuple[bool, Field, Field, Field]] = []
    for f in request.fields:
        if f.tag is None and f.array and f.type == "struct" and f.fields is not None:
            topic, parts = _topic_field(f.fields), _partition_array(f.fields, bare=True)
            if topic is not None and parts is not None:
                candidates.append((parts.type != "struct", f, topic, parts))
    if not candidates:
        return None
    _, topics, topic, parts = min(candidates, key=lambda c: c[0])  # structs before bare indexes (Fetch)
    for f in response.fields:
        if f.tag is None and f.array and f.type == "struct" and f.fields is not None:
            r_topic, r_parts = _topic_field(f.fields), _partition_array(f.fields, bare=False)
            if r_topic is None or r_parts is None or r_topic.type != topic.type:
                continue
            assert r_parts.fields is not None
            r_index = _index_field(r_parts.fields)
            assert r_index is not None
            index = _index_field(parts.fields) if parts.fields is not None else None
            return Layout(topics.name, topic.name, parts.name, None if index is None else index.name,
                          f.name, r_topic.name, r_parts.name, r_index.name)
    return None


def _default_message(error_code: int, message: str | None) -> str:
    return message if message is not None else f"{error_name(error_code)} (injected by kproxy)"


@dataclass(frozen=True, slots=True)
class Split:
    """A request with its selected partitions taken out (:func:`split_request`).

    ``selected``: the (topic, partition) pairs taken out, in request order; ``request``: the
    rest, a whole frame to forward (None: nothing is left, every partition was selected).
    :meth:`merge` completes the broker's answer to ``request`` with their error entries.
    """

    api_key: int
    api_version: int
    layout: Layout
    selected: tuple[tuple[TopicKey, int], ...]
    request: bytes | None
    order: tuple[tuple[TopicKey, tuple[tuple[int, bool], ...]], ...]  # per topic: (index, taken out)
    removed: tuple[Body, ...]  # request topic structs holding the taken-out partitions only

    def merge(self, response: bytes, error_code: int, message: str | None = None) -> Mutation:
        """The broker's answer to :attr:`request` with error entries for the selected partitions,
        every topic and partition in the original request's order (entries the broker added that
        the request did not name follow, as the broker gave them). ``changed``: entries added."""
        lay = self.layout
        injected = build_error_body(self.api_key, self.api_version, {lay.request_topics: list(self.removed)},
                                    error_code, partitions={p for _, p in self.selected},
                                    message=_default_message(error_code, message))[lay.response_topics]
        by_topic: dict[TopicKey, deque[Body]] = {}
        for entry in injected:
            by_topic.setdefault(entry.get(lay.response_topic), deque()).append(entry)

        def edit(got: list[Body] | None) -> list[Body]:
            return _merge(lay, self.order, list(got or ()), by_topic)

        offset = response_body_offset(response, self.api_key, self.api_version, whole=True)
        new_body, _ = splice_body(self.api_key, self.api_version, MessageType.RESPONSE, response,
                                  {lay.response_topics: edit}, offset)
        if new_body is None:
            return Mutation(response, 0)
        return Mutation(reframe(response, offset, new_body), len(self.selected))


def _merge(lay: Layout, order: tuple[tuple[TopicKey, tuple[tuple[int, bool], ...]], ...], got: list[Body],
           injected: dict[TopicKey, deque[Body]]) -> list[Body]:
    topic_key, parts_key, index_key = lay.response_topic, lay.response_partitions, lay.response_index
    broker: dict[TopicKey, deque[Body]] = {}
    for entry in got:
        broker.setdefault(entry.get(topic_key), deque()).append(entry)
    out: list[Body] = []
    for topic, partitions in order:
        mine = injected[topic].popleft() if any(taken for _, taken in partitions) and injected.get(topic) else None
        theirs = broker[topic].popleft() if not all(taken for _, taken in partitions) and broker.get(topic) else None
        mine_parts = _by_index(mine[parts_key] if mine else (), index_key)
        their_parts = _by_index((theirs.get(parts_key) or ()) if theirs else (), index_key)
        merged = [q.popleft() for index, taken in partitions
                  if (q := (mine_parts if taken else their_parts).get(index))]
        merged.extend(p for q in their_parts.values() for p in q)  # what the broker added, kept
        base = theirs if theirs is not None else mine
        if base is not None:
            base[parts_key] = merged
            out.append(base)
    out.extend(entry for q in broker.values() for entry in q)
    return out


def _by_index(entries: Collection[Body], index_key: str) -> dict[int, deque[Body]]:
    out: dict[int, deque[Body]] = {}
    for entry in entries:
        out.setdefault(entry.get(index_key, -1), deque()).append(entry)
    return out


def split_request(frame: bytes, chosen: Selector) -> Split | None:
    """Take the partitions ``chosen`` selects out of a request frame (size prefix included).

    None when the request's api and version have no topics -> partitions layout
    (:func:`layout`). A :class:`Split` with no ``selected`` pairs when nothing was chosen
    (``request`` is then the frame itself). Raises :class:`~kproxy.protocol.errors.DecodeError`
    for a body that does not parse.
    """
    header = request_header(frame)
    api_key, api_version = header.api_key, header.api_version
    lay = layout(api_key, api_version)
    offset = request_body_offset(frame, api_key, api_version)
    if lay is None or offset is None:
        return None
    selected: list[tuple[TopicKey, int]] = []
    order: list[tuple[TopicKey, tuple[tuple[int, bool], ...]]] = []
    removed: list[Body] = []

    def edit(topics: list[Body] | None) -> list[Body]:
        kept: list[Body] = []
        for entry in topics or ():
            topic = entry.get(lay.request_topic)
            parts = entry.get(lay.request_partitions) or []
            marks: list[tuple[int, bool]] = []
            stay: list[Any] = []
            gone: list[Any] = []
            for p in parts:
                index = p if lay.request_index is None else p.get(lay.request_index, -1)
                taken = chosen(topic, index)
                marks.append((index, taken))
                (gone if taken else stay).append(p)
                if taken:
                    selected.append((topic, index))
            order.append((topic, tuple(marks)))
            if gone:
                removed.append({**entry, lay.request_partitions: gone})
            if stay or not parts:
                kept.append({**entry, lay.request_partitions: stay} if gone else entry)
        return kept

    new_body, _ = splice_body(api_key, api_version, MessageType.REQUEST, frame, {lay.request_topics: edit}, offset)
    if not selected or new_body is None:
        return Split(api_key, api_version, lay, (), frame, tuple(order), ())
    rest = None if all(all(taken for _, taken in parts) for _, parts in order) else reframe(frame, offset, new_body)
    return Split(api_key, api_version, lay, tuple(selected), rest, tuple(order), tuple(removed))


# ---------------------------------------------------------------------- the answer, in place


def _each_selected(fields: tuple[Field, ...], body: Body, topic: TopicKey, chosen: Selector,
                   visit: Callable[[tuple[Field, ...], Body], Body]) -> int:
    """Replace each partition-level struct of ``body`` that ``chosen`` selects by ``visit``'s
    result; how many were visited. Topics are read from the structs that name them, at any depth."""
    named = _topic_field(fields)
    if named is not None:
        topic = body.get(named.name)
    count = 0
    for f in fields:
        if f.tag is not None or f.type != "struct" or f.fields is None:
            continue
        value = body.get(f.name)
        if value is None:
            continue
        index = _index_field(f.fields)
        items = value if f.array else [value]
        if index is not None and named is not None:
            for i, item in enumerate(items):
                if chosen(topic, item.get(index.name, -1)):
                    items[i] = visit(f.fields, item)
                    count += 1
        else:
            for item in items:
                count += _each_selected(f.fields, item, topic, chosen, visit)
        if not f.array:
            body[f.name] = items[0]
    return count


def _set_code(fields: tuple[Field, ...], entry: Body, error_code: int, message: str) -> None:
    for f in fields:
        if f.tag is None and not f.array and f.type == "int16" and f.name in ERROR_CODE_FIELDS:
            entry[f.name] = error_code
        elif f.tag is None and f.name == "error_message" and f.type == "string":
            entry[f.name] = message


def _edit_selected(frame: bytes, api_key: int, api_version: int, chosen: Selector,
                   visit: Callable[[tuple[Field, ...], Body], Body]) -> Mutation:
    codec = require_codec(api_key, api_version, MessageType.RESPONSE)
    offset = response_body_offset(frame, api_key, api_version, whole=True)
    body = codec.decode(frame, offset)
    changed = _each_selected(codec.schema.fields, body, None, chosen, visit)
    if not changed:
        return Mutation(frame, 0)
    return Mutation(reframe(frame, offset, codec.encode(body)), changed)


def replace_entries(frame: bytes, api_key: int, api_version: int, error_code: int, chosen: Selector, *,
                    message: str | None = None) -> Mutation:
    """A response with the entries of the partitions ``chosen`` selects replaced by error entries
    (the read-only APIs' way, see the module docstring); ``changed``: entries replaced."""
    text = _default_message(error_code, message)
    fixes = error_values(api_key)

    def visit(fields: tuple[Field, ...], entry: Body) -> Body:
        out = default_struct(fields)
        index = _index_field(fields)
        assert index is not None
        out[index.name] = entry.get(index.name, -1)
        for f in fields:
            if f.tag is None and f.name in fixes and not f.array and f.type != "struct":
                out[f.name] = fixes[f.name]
        _set_code(fields, out, error_code, text)
        return out

    return _edit_selected(frame, api_key, api_version, chosen, visit)


def replace_selected_codes(frame: bytes, api_key: int, api_version: int, error_code: int, chosen: Selector, *,
                           message: str | None = None) -> Mutation:
    """A response with the error codes of the partitions ``chosen`` selects replaced (their other
    fields kept; a Fetch partition's records dropped, as a broker sends none with an error)."""
    text = _default_message(error_code, message)

    def visit(fields: tuple[Field, ...], entry: Body) -> Body:
        _set_code(fields, entry, error_code, text)
        if api_key == FETCH and entry.get("records") is not None:
            entry["records"] = b""
        return entry

    return _edit_selected(frame, api_key, api_version, chosen, visit)


__all__ = ["READ_ONLY_APIS", "Layout", "Split", "layout", "replace_entries",
           "replace_selected_codes", "split_request"]
