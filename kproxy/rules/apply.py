"""Do what a rule's actions say to a frame: sans-IO, one call per request and per response.

The proxy's rule policy asks the engine for a :class:`~kproxy.rules.engine.Decision`
per request; when it has hits, the policy hands their actions and the frame here:

* :func:`apply_to_request` before forwarding a request: ``inject_error`` in
  ``respond`` mode builds the answer (the request is not forwarded; a Produce
  with ``acks=0`` gets no answer at all, injected or not); ``corrupt_records``,
  ``duplicate_records`` and ``invalid_schema_id`` edit a Produce request's
  records; ``rewrite`` with ``direction: request`` edits fields.
* :func:`apply_to_response` before releasing a response: ``inject_error`` in
  ``replace`` mode replaces the broker's codes; the record actions edit a
  Fetch response; ``mutate_metadata``, ``downgrade_api_versions``,
  ``rewrite_addresses`` and ``rewrite`` with ``direction: response`` edit
  fields; a throttle's delay becomes ``throttle_time_ms``.

Timing and connection actions (``delay``, ``throttle``'s waiting,
``drop_response``, ``close_connection``, ``reset_connection``, ``blackhole``,
``slow_close``) are the session's to execute; they are ignored here.

Faults never break the protocol: an action that cannot apply to this frame
(the field is not in this version, the body does not parse, its records need
more than the frame's :class:`~kproxy.protocol.records.RecordBudget`: the
outcome's ``over_budget``) leaves the frame as it was and says why in its note.
A frame that no action changed comes back as the very same object. Each
outcome carries one short note per action that did (or could not do)
something, for the fault log line.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kproxy.host_port import split_host_port
from kproxy.protocol.endpoints import EndpointMap, endpoint_fields, rewrite_endpoints
from kproxy.protocol.error_response import error_response
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.field_rewrite import FieldEdit, rename_topics, rewrite_fields
from kproxy.protocol.mutation import Mutation, request_header
from kproxy.protocol.record_faults import (
    CorruptTarget,
    Selector,
    corrupt_records,
    duplicate_records,
    replace_schema_ids,
)
from kproxy.protocol.records import RecordBudget
from kproxy.protocol.response_faults import (
    MetadataEdits,
    downgrade_api_versions,
    mutate_metadata,
    replace_error_codes,
    set_throttle_time,
)
from kproxy.protocol.schema import Direction
from kproxy.protocol.tables import ApiKey, error_name
from kproxy.rules.facts import FrameFacts
from kproxy.rules.model import (
    METADATA_APIS,
    Action,
    CorruptRecords,
    DowngradeApiVersions,
    DuplicateRecords,
    InjectError,
    InjectMode,
    InvalidSchemaId,
    Match,
    MutateMetadata,
    Rewrite,
    RewriteAddresses,
    RewriteDirection,
)
from kproxy.rules.patterns import substitute

# Plain ints, bound once: compared per frame (an IntEnum member compares at about twice the cost).
PRODUCE, FETCH, API_VERSIONS = int(ApiKey.PRODUCE), int(ApiKey.FETCH), int(ApiKey.API_VERSIONS)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What to do with a request.

    ``frame`` is the request to forward (the same object when unchanged).
    ``answer`` is a response frame to send the client instead (``respond``
    mode); ``forward`` is False when the request must not reach the broker
    (answered locally, or a Produce acks=0 that an injected error swallows).
    """

    frame: bytes
    forward: bool = True
    answer: bytes | None = None
    notes: tuple[str, ...] = ()
    over_budget: bool = False  # a record action gave up: the frame's records needed more than its budget


@dataclass(frozen=True, slots=True)
class ResponseOutcome:
    """The response to release (the same object when unchanged) and what was done to it."""

    frame: bytes
    notes: tuple[str, ...] = ()
    over_budget: bool = False  # as RequestOutcome's


def apply_to_request(actions: Sequence[Action], frame: bytes, *, only: Selector | None = None) -> RequestOutcome:
    """Apply the request-side actions to a request frame (size prefix included).

    ``only`` limits the record actions to some partitions (see
    :func:`selector`); by default they touch every partition of the request.
    """
    if not actions:
        return RequestOutcome(frame)
    try:
        header = request_header(frame)
    except ProtocolError as exc:  # the session forwards what it cannot read; so do the rules
        return RequestOutcome(frame, notes=(f"skipped: unreadable request header ({exc.reason})",))
    notes: list[str] = []
    current = frame
    budget = RecordBudget()  # one for the frame, whichever record actions read it
    for action in actions:
        if isinstance(action, InjectError) and action.mode is InjectMode.RESPOND:
            label = f"inject_error {error_name(action.error_code)} respond"
            if header.api_key == PRODUCE and FrameFacts(frame, header).acks() == 0:
                notes.append(f"{label}: acks=0, request dropped without an answer")
                return RequestOutcome(frame, False, None, tuple(notes))
            try:
                answer = error_response(frame, action.error_code, partitions=action.partitions,
                                        message=action.message)
            except ProtocolError as exc:
                notes.append(f"{label}: skipped ({exc.reason})")
                continue
            notes.append(label)
            return RequestOutcome(frame, False, answer, tuple(notes))
        step = _request_step(action, header.api_key, header.api_version, only, budget)
        if step is None:
            continue
        name, run = step
        current = _run(name, run, current, notes)
    return RequestOutcome(current, True, None, tuple(notes), budget.exhausted)


def apply_to_response(actions: Sequence[Action], frame: bytes, api_key: int, api_version: int, *,
                      throttle_time_ms: int | None = None, only: Selector | None = None) -> ResponseOutcome:
    """Apply the response-side actions to a response frame (size prefix included) answering a
    request of ``api_key``/``api_version``; ``throttle_time_ms`` (a throttle's delay) is set
    last when given, never lowering the broker's own."""
    notes: list[str] = []
    current = frame
    budget = RecordBudget()
    for action in actions:
        step = _response_step(action, api_key, api_version, only, budget)
        if step is not None:
            current = _run(step[0], step[1], current, notes)
    if throttle_time_ms is not None and throttle_time_ms > 0:
        ms = throttle_time_ms
        current = _run(f"throttle throttle_time_ms={ms}",
                       lambda f: set_throttle_time(f, api_key, api_version, ms), current, notes)
    return ResponseOutcome(current, tuple(notes), budget.exhausted)


# -------------------------------------------------------------------------- dispatch

Step = tuple[str, Callable[[bytes], Mutation]]


def _run(name: str, run: Callable[[bytes], Mutation], frame: bytes, notes: list[str]) -> bytes:
    try:
        result = run(frame)
    except ProtocolError as exc:
        notes.append(f"{name}: skipped ({exc.reason})")
        return frame
    if result.changed:
        notes.append(f"{name}: {result.changed} changed")
    return result.frame


def _records_step(action: Action, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                  ) -> Step | None:
    if isinstance(action, CorruptRecords):
        target = CorruptTarget(action.target.value)
        return (f"corrupt_records {target.value}",
                lambda f: corrupt_records(f, api_key, api_version, target, only=only, budget=budget))
    if isinstance(action, DuplicateRecords):
        copies = action.copies
        return (f"duplicate_records copies={copies}",
                lambda f: duplicate_records(f, api_key, api_version, copies, only=only))
    if isinstance(action, InvalidSchemaId):
        schema_id = action.schema_id
        return (f"invalid_schema_id {schema_id}",
                lambda f: replace_schema_ids(f, api_key, api_version, schema_id, only=only, budget=budget))
    return None


def _rewrite_step(action: Rewrite, api_key: int, api_version: int, direction: Direction) -> Step:
    edits = [FieldEdit(path, value=value) for path, value in action.set_fields]
    edits += [FieldEdit(path, values=dict(table)) for path, table in action.map_fields]
    prefixes = action.topic_prefix

    def run(frame: bytes) -> Mutation:
        changed = 0
        if edits:
            frame, changed = rewrite_fields(frame, api_key, api_version, direction, edits)
        if prefixes:
            frame, renamed = rename_topics(frame, api_key, api_version, direction, prefixes)
            changed += renamed
        return Mutation(frame, changed)

    paths = ", ".join([e.path for e in edits] + ["topic names" for _ in prefixes[:1]])
    return f"rewrite {direction.name.lower()} {paths}", run


def _request_step(action: Action, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                  ) -> Step | None:
    if api_key == PRODUCE:
        step = _records_step(action, api_key, api_version, only, budget)
        if step is not None:
            return step
    if isinstance(action, Rewrite) and action.direction is RewriteDirection.REQUEST:
        return _rewrite_step(action, api_key, api_version, Direction.REQUEST)
    return None


def _response_step(action: Action, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                   ) -> Step | None:
    if isinstance(action, InjectError) and action.mode is InjectMode.REPLACE:
        code, partitions, message = action.error_code, action.partitions, action.message
        return (f"inject_error {error_name(code)} replace",
                lambda f: replace_error_codes(f, api_key, api_version, code, partitions=partitions, message=message))
    if api_key == FETCH:
        step = _records_step(action, api_key, api_version, only, budget)
        if step is not None:
            return step
    if isinstance(action, MutateMetadata) and api_key in METADATA_APIS:
        edits = metadata_edits(action)
        return "mutate_metadata", lambda f: mutate_metadata(f, api_key, api_version, edits)
    if isinstance(action, DowngradeApiVersions) and api_key == API_VERSIONS:
        caps = dict(action.max_versions)
        return "downgrade_api_versions", lambda f: downgrade_api_versions(f, api_version, caps)
    if isinstance(action, RewriteAddresses) and endpoint_fields(api_key, api_version) is not None:
        mapping = address_map(action)
        return "rewrite_addresses", lambda f: rewrite_endpoints(f, api_key, api_version, mapping)
    if isinstance(action, Rewrite) and action.direction is RewriteDirection.RESPONSE:
        return _rewrite_step(action, api_key, api_version, Direction.RESPONSE)
    return None


# ----------------------------------------------------------------- action parameters


def metadata_edits(action: MutateMetadata) -> MetadataEdits:
    """The protocol-level edits a ``mutate_metadata`` action stands for."""
    return MetadataEdits(
        hide_brokers=action.hide_brokers,
        hide_partitions=frozenset((ref.topic, ref.partition) for ref in action.hide_partitions),
        move_leader={(ref.topic, ref.partition): to for ref, to in action.move_leader},
        shrink_isr={(ref.topic, ref.partition): isr for ref, isr in action.shrink_isr},
    )


def address_map(action: RewriteAddresses) -> EndpointMap:
    """The endpoint mapping of a ``rewrite_addresses`` action.

    ``map``: exact ``host:port`` -> ``host:port``. ``pattern``: an RE2 regex whose every
    match in the ``host:port`` text of an endpoint is replaced (groups inserted with ``\\1`` or
    ``\\g<name>``: :func:`~kproxy.rules.patterns.parse_replacement`); a result without a port
    keeps the endpoint's port.
    """
    if action.pattern is None:
        table: dict[tuple[str, int | None], tuple[str, int | None]] = {
            split_host_port(k): split_host_port(v) for k, v in action.mapping}

        def by_table(host: str, port: int) -> tuple[str, int] | None:
            found = table.get((host, port))
            if found is None:
                return None
            return found[0], port if found[1] is None else found[1]

        return by_table
    pattern, template = action.pattern, action.template

    def by_pattern(host: str, port: int) -> tuple[str, int] | None:
        text = f"{host}:{port}"
        new = substitute(pattern, template, text)
        if new == text:
            return None
        new_host, new_port = split_host_port(new)
        return new_host, port if new_port is None else new_port

    return by_pattern


def selector(match: Match, topic_names: Mapping[uuid.UUID, str] | None = None) -> Selector | None:
    """The partitions a rule's ``topic``/``partition`` keys select, for the record actions
    (``None``: the rule names none, every partition). Topic ids are looked up in
    ``topic_names``; an id not found there is not selected by a topic pattern."""
    topics, partitions = match.topics, match.partitions
    if topics is None and partitions is None:
        return None

    def chosen(topic: str | uuid.UUID | None, partition: int) -> bool:
        if partitions is not None and partition not in partitions:
            return False
        if topics is None:
            return True
        name = topic_names.get(topic) if isinstance(topic, uuid.UUID) and topic_names else topic
        return isinstance(name, str) and any(t.matches(name) for t in topics)

    return chosen


__all__ = ["RequestOutcome", "ResponseOutcome", "address_map", "apply_to_request", "apply_to_response",
           "metadata_edits", "selector"]
