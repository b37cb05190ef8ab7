"""The ``inject_error`` action: answer with a Kafka error code, or put it in the broker's answer.

YAML: ``- inject_error: {error: NOT_LEADER_OR_FOLLOWER, partitions: [0], message: ..., mode: respond|replace}``.
``respond`` (the default) answers locally and does not forward the request (a Produce with
``acks=0`` gets no answer at all, injected or not); ``replace`` forwards it and replaces the
error codes of the broker's response (``partitions`` limits either to those: a partial failure).

A rule with ``topic``/``partition`` keys acts on the topic-partitions they select only
(:mod:`kproxy.protocol.partition_split`): in ``respond`` mode the others of the request are
forwarded (a request rewritten without the selected ones, or the whole request for read-only
APIs such as Fetch) and the broker's answer gets error entries for the selected ones; when
every partition is selected the request is answered locally, with partition-level codes. In
``replace`` mode only the selected partitions' codes are replaced.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.protocol import _tables
from kproxy.protocol.api_keys import PRODUCE
from kproxy.protocol.codes import ApiKey, error_code, error_name
from kproxy.protocol.error_response import error_response
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import RequestHeader
from kproxy.protocol.partition_split import (
    READ_ONLY_APIS,
    Split,
    replace_entries,
    replace_selected_codes,
    split_request,
)
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.protocol.response_faults import replace_error_codes
from kproxy.rules.actions.base import LocalAnswer, PartAnswer, RuleAction, Step
from kproxy.rules.frame_facts import FrameFacts
from kproxy.rules.yaml_nodes import BAD, INT32, Bad, NodeReader, did_you_mean, node_kind

if TYPE_CHECKING:
    import yaml

ERROR_NAMES = tuple(name for name, _ in _tables.ERRORS.values())


class InjectMode(enum.Enum):
    RESPOND = "respond"  # answer locally, the request is not forwarded
    REPLACE = "replace"  # forward, then replace the broker's error codes in its response


@dataclass(frozen=True, slots=True)
class InjectError(RuleAction):
    """Answer with a Kafka error code; ``partitions`` limits it to those (partial failure)."""

    error_code: int
    partitions: frozenset[int] | None = None
    message: str | None = None
    mode: InjectMode = InjectMode.RESPOND

    kind: ClassVar[str] = "inject_error"
    partition_scoped: ClassVar[bool] = True
    keys: ClassVar[tuple[str, ...]] = ("error", "partitions", "message", "mode")

    def __post_init__(self) -> None:
        if self.error_code == 0:
            raise ValueError("NONE (0) is not an error")
        if not -(2**15) <= self.error_code < 2**15:
            raise ValueError("an error code is an int16")

    def check(self, apis: frozenset[int] | None) -> str | None:
        if self._partial_produce(apis):
            return "a partial Produce failure needs mode: replace"
        return RuleAction.check(self, apis)

    def _partial_produce(self, apis: frozenset[int] | None) -> bool:
        return (self.partitions is not None and self.mode is InjectMode.RESPOND
                and (apis is None or ApiKey.PRODUCE in apis))

    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        kw: dict[str, Any] = {}
        err = reader.required(m, at, path, "error", "a Kafka error name or code")
        kw["error_code"] = BAD if err is None else _error(reader, err, f"{path}.error")
        if "partitions" in m:
            kw["partitions"] = reader.one_or_many(m["partitions"], f"{path}.partitions",
                                                  lambda n, p: reader.integer(n, p, 0, INT32[1]))
        if "message" in m:
            kw["message"] = reader.string(m["message"], f"{path}.message")
        if "mode" in m:
            kw["mode"] = reader.choice(m["mode"], f"{path}.mode", InjectMode)
        made = reader.made(at, path, kw, cls)
        if isinstance(made, InjectError) and made._partial_produce(apis):
            return reader.fail(m.get("partitions", at), f"{path}.partitions",
                               "a partial Produce failure needs mode: replace (answering without forwarding "
                               "would acknowledge records that were never written)")
        return made

    @property
    def edits_request(self) -> bool:
        return self.mode is InjectMode.RESPOND

    @property
    def edits_response(self) -> bool:
        return self.mode is InjectMode.REPLACE

    @property
    def answers(self) -> bool:
        return self.mode is InjectMode.RESPOND

    @property
    def injected_error(self) -> int | None:
        return self.error_code

    def answer_request(self, request: bytes, header: RequestHeader, only: Selector | None = None
                       ) -> LocalAnswer | PartAnswer | str:
        label = f"inject_error {error_name(self.error_code)} respond"
        acks_0 = header.api_key == PRODUCE and FrameFacts(request, header).acks() == 0
        partitions = self.partitions
        try:
            if only is not None:
                split = split_request(request, self._chosen(only))
                if split is not None:
                    if not split.selected:
                        return f"{label}: skipped (no partition of the request is selected)"
                    if split.request is not None:
                        return self._part(label, split, request, acks_0)
                    partitions = frozenset(i for _, parts in split.order for i, _ in parts)  # codes per partition
            if acks_0:
                return LocalAnswer(f"{label}: acks=0, request dropped without an answer", None)
            answer = error_response(request, self.error_code, partitions=partitions, message=self.message)
        except ProtocolError as exc:
            return f"{label}: skipped ({exc.reason})"
        return LocalAnswer(label, answer)

    def _chosen(self, only: Selector) -> Selector:
        """The rule's selection, narrowed to the action's ``partitions`` when it has some."""
        parts = self.partitions
        return only if parts is None else (lambda topic, partition: partition in parts and only(topic, partition))

    def _part(self, label: str, split: Split, request: bytes, acks_0: bool) -> PartAnswer:
        """The answer to a request some of whose partitions the rule selects (see the module docstring)."""
        code, message = self.error_code, self.message
        api_key, api_version = split.api_key, split.api_version
        total = sum(len(parts) for _, parts in split.order)
        note = f"{label}: {len(split.selected)} of {total} partitions"
        if api_key in READ_ONLY_APIS:
            chosen = frozenset(split.selected)
            return PartAnswer(f"{note}, request forwarded whole", request,
                              (label, lambda f: replace_entries(f, api_key, api_version, code,
                                                                lambda t, p: (t, p) in chosen, message=message)))
        assert split.request is not None
        if acks_0:
            return PartAnswer(f"{note} dropped (acks=0), the others forwarded", split.request, None)
        return PartAnswer(f"{note}, the others forwarded", split.request,
                          (label, lambda f: split.merge(f, code, message)))

    def response_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                      ) -> Step | None:
        if self.mode is not InjectMode.REPLACE:
            return None
        code, partitions, message = self.error_code, self.partitions, self.message
        label = f"inject_error {error_name(code)} replace"
        if only is not None:
            chosen = self._chosen(only)
            return (label, lambda f: replace_selected_codes(f, api_key, api_version, code, chosen, message=message))
        return (label,
                lambda f: replace_error_codes(f, api_key, api_version, code, partitions=partitions, message=message))


def _error(reader: NodeReader, node: yaml.Node, path: str) -> int | Bad:
    """A Kafka error, by name or code (never NONE)."""
    value = reader.scalar(node)
    if isinstance(value, int) and not isinstance(value, bool):
        if value == 0:
            return reader.fail(node, path, "NONE (0) is not an error")
        if not -(2**15) <= value < 2**15:
            return reader.fail(node, path, f"{value} is not an int16 error code")
        return value
    if isinstance(value, str):
        code = error_code(value)
        if code is None:
            return reader.fail(node, path, f"unknown Kafka error {value!r}{did_you_mean(value.upper(), ERROR_NAMES)}")
        if code == 0:
            return reader.fail(node, path, "NONE (0) is not an error")
        return code
    return reader.fail(node, path, f"expected a Kafka error name or code, got {node_kind(node, value)}")
