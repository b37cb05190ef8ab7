"""What every rule action kind is: :class:`RuleAction`, the base of the one class each kind module defines.

An action kind is one frozen dataclass (its parameters, checked in ``__post_init__``) whose class
says, through the hooks below, everything the rest of kproxy asks of it:

* its YAML name (:attr:`RuleAction.kind`) and reader (:meth:`RuleAction.read`), found by the loader
  through :data:`kproxy.rules.actions.registry.ACTION_KINDS`;
* what it does to a request (:meth:`RuleAction.answer_request`, :meth:`RuleAction.request_step`)
  and to a response (:meth:`RuleAction.response_step`), run by :mod:`kproxy.rules.apply`;
* the number the engine works out for it on every hit (:attr:`RuleAction.takes_delay`,
  :meth:`RuleAction.hit_delay_ms`: a delay, drawn or ramping), kept in the hit so that runs replay;
* its part of the verdict (:meth:`RuleAction.decide`): what the session must time, drop or close,
  written into a :class:`~kproxy.rules.actions.draft.VerdictDraft` that the rule policy turns into
  the session's verdict, with the engine's token buckets at hand (:mod:`kproxy.rules.bucket`);
* what its response edits do to leader epochs (:attr:`RuleAction.leader_moves`);
* what the policy counts for it (the class flags and :attr:`RuleAction.injected_error`), what the
  admin listing shows of it (:meth:`RuleAction.live_state`) and what a what-if run over a capture
  charges it (:attr:`RuleAction.shares_state`, :meth:`RuleAction.whatif_hold_s`).

Nothing outside this package names a kind: the engine, the policy and the what-if find an action
through these hooks alone.

Every hook has a default that does nothing, so a kind defines only what it does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from kproxy.protocol.codes import api_snake_name
from kproxy.protocol.headers import RequestHeader
from kproxy.protocol.mutation import Mutation
from kproxy.protocol.record_faults import Selector
from kproxy.protocol.records import RecordBudget
from kproxy.rules.actions.draft import HitKey as HitKey  # every kind's decide() takes one

if TYPE_CHECKING:
    import yaml

    from kproxy.rules.actions.draft import VerdictDraft
    from kproxy.rules.bucket import Buckets
    from kproxy.rules.request_facts import RequestFacts
    from kproxy.rules.yaml_nodes import Bad, NodeReader

# Bounds on durations, so that nothing accepted overflows at run time (a delay, its jitter, a slow
# close, a throttle's burst): a week at most.
MAX_DURATION_S = 7 * 86400
MAX_DURATION_MS = MAX_DURATION_S * 1000

# A step of an action on one frame: the label its note starts with (the action's YAML name first,
# kproxy.policy reads it back) and the edit, which raises ProtocolError when it cannot apply.
Step = tuple[str, Callable[[bytes], Mutation]]


@dataclass(frozen=True, slots=True)
class LocalAnswer:
    """A request answered by kproxy instead of the broker: ``frame`` is the answer (``None``: no
    answer at all, the request is dropped, as for a Produce with acks=0); ``note`` says what was done."""

    note: str
    frame: bytes | None


@dataclass(frozen=True, slots=True)
class PartAnswer:
    """A request kproxy answers in part (the topic-partitions a rule selects): ``request`` goes to
    the broker in its place (the other partitions; the same frame when it is forwarded whole), and
    ``merge`` (None: no answer is expected, acks=0) completes the broker's answer with kproxy's part.
    ``note`` says what was done."""

    note: str
    request: bytes
    merge: Step | None


class RuleAction:
    """The base of every action kind (see the module docstring). Subclasses are frozen, slotted
    dataclasses; their instances are values shared by every connection, never changed."""

    __slots__ = ()

    kind: ClassVar[str]  # the YAML name: `- delay: {ms: 100}`; what logs and metrics label the action with
    keys: ClassVar[tuple[str, ...]] = ()  # the keys its YAML mapping takes (a kind with none is a bare name)
    apis: ClassVar[frozenset[int] | None] = None  # the api keys it can act on (None: any)
    # What the policy counts for it: a connection fault (kproxy_rule_connection_faults_total), the time
    # it holds requests (kproxy_rule_held_seconds), its throttle seconds (kproxy_rule_throttle_seconds_total).
    counts_connection_fault: ClassVar[bool] = False
    counts_held: ClassVar[bool] = False
    counts_throttled: ClassVar[bool] = False
    # Its verdict part reads the hit's draws alone (no frame, no clock, no bucket) and only counts its
    # hit: a fixed hit whose actions are all such is worked out once per rule set (kproxy.policy).
    verdict_from_draws: ClassVar[bool] = False
    # It has a verdict part: the policy calls decide() for it on every hit.
    decides: ClassVar[bool] = False
    # The engine works out one delay per hit for it (hit_delay_ms), in the hit's ``delays_ms``: its
    # decide() takes it from the draft (VerdictDraft.next_delay_ms), in the order of the rule's actions.
    takes_delay: ClassVar[bool] = False
    # It keeps state that every connection shares (a throttle's token buckets): a what-if run
    # replays the capture in one order for the rules that have one (kproxy.analysis.whatif).
    shares_state: ClassVar[bool] = False
    # Its frame edits act on the partitions its rule's topic/partition keys select only (the ``only``
    # of its hooks), so its fault lines name those only.
    partition_scoped: ClassVar[bool] = False

    # -- YAML ------------------------------------------------------------------------------
    @classmethod
    def read(cls, reader: NodeReader, m: dict[str, yaml.Node], at: yaml.Node, path: str,
             apis: frozenset[int] | None) -> RuleAction | Bad:
        """The action of a YAML mapping ``m`` (its keys already checked against :attr:`keys`; ``at``
        the node for problems, ``path`` the key path); ``apis`` the rule's ``match.api`` (None: any).
        Problems go to ``reader`` (:class:`~kproxy.rules.yaml_nodes.NodeReader`), which returns BAD."""
        return reader.build(at, path, cls)

    @classmethod
    def read_body(cls, reader: NodeReader, body: yaml.Node | None, node: yaml.Node, path: str,
                  apis: frozenset[int] | None) -> RuleAction | Bad | None:
        """A kind whose YAML body is not a mapping of :attr:`keys` reads it here (``None``: the body
        is that mapping, read by :meth:`read`)."""
        return None

    def check(self, apis: frozenset[int] | None) -> str | None:
        """Why this action cannot be in a rule matching ``apis`` (None: it can)."""
        if self.apis is not None and (apis is None or not apis <= self.apis):
            names = ", ".join(sorted(api_snake_name(k) for k in self.apis))
            return f"{self.kind} acts on {names} only: restrict match.api to them"
        return None

    # -- frames (kproxy.rules.apply) --------------------------------------------------------
    @property
    def edits_request(self) -> bool:
        """Whether :meth:`answer_request` or :meth:`request_step` may do something."""
        return False

    @property
    def edits_response(self) -> bool:
        """Whether :meth:`response_step` may do something."""
        return False

    @property
    def answers(self) -> bool:
        """Whether it answers requests itself (:meth:`answer_request`) instead of forwarding them."""
        return False

    @property
    def injected_error(self) -> int | None:
        """The Kafka error code it puts in answers (kproxy_injected_errors_total), if any."""
        return None

    def answer_request(self, request: bytes, header: RequestHeader, only: Selector | None = None
                       ) -> LocalAnswer | PartAnswer | str:
        """The local answer to ``request`` (size prefix included), or a note saying why there is none;
        ``only``: the partitions the rule selects (None: all), which may make it a :class:`PartAnswer`."""
        return f"{self.kind}: skipped (answers no request)"

    def request_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                     ) -> Step | None:
        """Its edit of a request of this api key and version (None: nothing to do). ``only``: the
        partitions the rule selects for record edits; ``budget``: the frame's, shared by its record readers."""
        return None

    def response_step(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget
                      ) -> Step | None:
        """Its edit of a response to a request of this api key and version, as :meth:`request_step`."""
        return None

    def response_step_from(self, api_key: int, api_version: int, only: Selector | None, budget: RecordBudget,
                           answering: int | None) -> Step | None:
        """Its edit of a response the broker ``answering`` gave (its node id; None: not known, as on
        the bootstrap connection): :meth:`response_step` unless the kind cares who answered."""
        return self.response_step(api_key, api_version, only, budget)

    # -- the hit's numbers (kproxy.rules.engine) ---------------------------------------------
    @property
    def delay_draws(self) -> bool:
        """Whether :meth:`hit_delay_ms` reads its ``draw`` (the engine hashes one only then)."""
        return False

    @property
    def delay_varies(self) -> bool:
        """Whether :meth:`hit_delay_ms` may differ from hit to hit (a draw, or a value that changes with
        time): False lets the engine work a hit out once per rule set."""
        return False

    def hit_delay_ms(self, elapsed_s: float, draw: float) -> float:
        """Its delay for a hit (when :attr:`takes_delay`), ``elapsed_s`` seconds after its rule's time
        conditions started, with ``draw`` the engine's reproducible uniform draw in [0, 1) for it."""
        return 0.0

    # -- the verdict (kproxy.policy) ---------------------------------------------------------
    def decide(self, draft: VerdictDraft, key: HitKey) -> None:
        """Its part of the verdict of a request it hit (not in a dry run), written into ``draft``;
        ``key`` is its hit counter key, for the faults it reports. Called when :attr:`decides`."""

    @property
    def leader_moves(self) -> frozenset[tuple[str, int]]:
        """The (topic, partition) pairs whose leader epoch its response edits raise: the policy keeps
        the epochs it sends as floors (kproxy.protocol.leader_epochs)."""
        return frozenset()

    # -- the admin listing and the what-if ---------------------------------------------------
    @property
    def has_live_state(self) -> bool:
        """Whether :meth:`live_state` shows something (its rule is then listed with its state)."""
        return False

    def live_state(self, elapsed_s: float, out: dict[str, Any]) -> None:
        """Write what the admin listing shows of it into its rule's state ``out``, ``elapsed_s``
        seconds after its rule's time conditions started."""

    def whatif_hold_s(self, buckets: Buckets, rule_id: str, facts: RequestFacts, nbytes: int) -> float:
        """The seconds it would hold a request of ``nbytes`` bytes, charged to ``buckets`` (the
        what-if's throttle column; 0: it holds by no quota)."""
        return 0.0

