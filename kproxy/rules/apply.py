"""Do what a rule's actions say to a frame: sans-IO, one call per request and per response.

The rule policy (kproxy.policy) asks the engine for a :class:`~kproxy.rules.engine.Decision`;
when it has hits, it hands their actions and the frame here, and each action does its own part
(:class:`~kproxy.rules.actions.base.RuleAction`'s frame hooks):

* :func:`apply_to_request` before forwarding a request: an action that answers requests itself
  (``inject_error`` in ``respond`` mode) answers it, and the request is not forwarded (or, when
  the rule selects some of its partitions, answers those: the rest is forwarded and the
  outcome's ``merge`` completes the broker's answer); the others edit it in turn (the record
  actions on a Produce's records, ``rewrite`` with ``direction: request``).
* :func:`apply_to_response` before releasing a response: each action edits it in turn
  (``inject_error`` in ``replace`` mode, the record actions on a Fetch's records,
  ``mutate_metadata``, ``downgrade_api_versions``, ``rewrite_addresses``, ``rewrite`` with
  ``direction: response``); a throttle's delay becomes ``throttle_time_ms``, set last.

Timing and connection actions (``delay``, ``throttle``'s waiting, ``drop_response``,
``close_connection``, ``reset_connection``, ``blackhole``, ``slow_close``) and the byte-level
toxics (``bandwidth``, ``slicer``, ``limit_data``, ``delay`` at ``wire``) have no frame hooks:
their part is the verdict's (:meth:`~kproxy.rules.actions.base.RuleAction.decide`).

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

from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.mutation import Mutation, request_header
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.protocol.response_faults import set_throttle_time
from kproxy.rules.actions.base import LocalAnswer, RuleAction, Step
from kproxy.rules.model import Match


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What to do with a request.

    ``frame`` is the request to forward (the same object when unchanged).
    ``answer`` is a response frame to send the client instead (``respond``
    mode); ``forward`` is False when the request must not reach the broker
    (answered locally, or a Produce acks=0 that an injected error swallows).
    ``merge`` is the first edit of the broker's answer when an action answered part of the
    request (its selected partitions); ``answered``: an action answered it, whole or in part.
    """

    frame: bytes
    forward: bool = True
    answer: bytes | None = None
    notes: tuple[str, ...] = ()
    over_budget: bool = False  # a record action gave up: the frame's records needed more than its budget
    merge: Step | None = None
    answered: bool = False


@dataclass(frozen=True, slots=True)
class ResponseOutcome:
    """The response to release (the same object when unchanged) and what was done to it."""

    frame: bytes
    notes: tuple[str, ...] = ()
    over_budget: bool = False  # as RequestOutcome's


def apply_to_request(actions: Sequence[RuleAction], frame: bytes, *, only: Selector | None = None) -> RequestOutcome:
    """Apply the request-side actions to a request frame (size prefix included).

    ``only`` limits the record actions and the answering ones to some partitions (see
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
    merge: Step | None = None
    answered = False
    for action in actions:
        if action.answers:
            if answered:
                continue  # the first to answer answers
            answer = action.answer_request(current, header, only)
            if isinstance(answer, str):  # it could not answer: the others go on
                notes.append(answer)
                continue
            notes.append(answer.note)
            if isinstance(answer, LocalAnswer):
                return RequestOutcome(current, False, answer.frame, tuple(notes), answered=True)
            current, merge, answered = answer.request, answer.merge, True  # the rest goes on, edited by the others
            continue
        step = action.request_step(header.api_key, header.api_version, only, budget)
        if step is not None:
            current = _run(step[0], step[1], current, notes)
    return RequestOutcome(current, True, None, tuple(notes), budget.exhausted, merge, answered)


def apply_to_response(actions: Sequence[RuleAction], frame: bytes, api_key: int, api_version: int, *,
                      throttle_time_ms: int | None = None, only: Selector | None = None,
                      merge: Step | None = None, answering: int | None = None) -> ResponseOutcome:
    """Apply the response-side actions to a response frame (size prefix included) answering a
    request of ``api_key``/``api_version``, given by broker ``answering`` (None: not known);
    ``merge`` (the request outcome's) runs first;
    ``throttle_time_ms`` (a throttle's delay) is set last when given, never lowering the broker's own."""
    notes: list[str] = []
    current = frame if merge is None else _run(merge[0], merge[1], frame, notes, quiet=True)
    budget = RecordBudget()
    for action in actions:
        step = action.response_step_from(api_key, api_version, only, budget, answering)
        if step is not None:
            current = _run(step[0], step[1], current, notes)
    if throttle_time_ms is not None and throttle_time_ms > 0:
        ms = throttle_time_ms
        current = _run(f"throttle throttle_time_ms={ms}",
                       lambda f: set_throttle_time(f, api_key, api_version, ms), current, notes)
    return ResponseOutcome(current, tuple(notes), budget.exhausted)


# ----------------------------------------------------------------------------- steps


def _run(name: str, run: Callable[[bytes], Mutation], frame: bytes, notes: list[str], quiet: bool = False) -> bytes:
    """``run``'s edit of ``frame``, noted in ``notes`` (when ``quiet``, only if it could not apply)."""
    try:
        result = run(frame)
    except ProtocolError as exc:
        notes.append(f"{name}: skipped ({exc.reason})")
        return frame
    if result.changed and not quiet:
        notes.append(f"{name}: {result.changed} changed")
    return result.frame


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


__all__ = ["RequestOutcome", "ResponseOutcome", "apply_to_request", "apply_to_response", "selector"]
