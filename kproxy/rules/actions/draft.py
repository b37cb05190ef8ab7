"""The verdict of one request while its rules' actions write it: :class:`VerdictDraft`, sans-IO.

Each action's :meth:`~kproxy.rules.actions.base.RuleAction.decide` writes its part here (a hold,
a response delay, a dropped response, a closed connection...) and reports what it did as faults;
the rule policy (:mod:`kproxy.policy`) adds the request and response edits, counts and logs the
faults, and turns the draft into the session's ``Verdict``. The rules floor never imports the
session: this is the shape of a verdict in the rules' own words. It names no action kind, nor
:class:`~kproxy.rules.actions.base.RuleAction` itself (whose ``decide`` takes a draft): an action
that starts a lasting fault is kept as a value, compared later with its rule's actions.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from kproxy.toxics import Direction, Toxic

if TYPE_CHECKING:
    from kproxy.rules.bucket import Buckets
    from kproxy.rules.frame_facts import FrameFacts

# The hit counter key of one action of one rule: (rule id, action name, dry run "true"/"false").
HitKey = tuple[str, str, str]
# A charge of a response's size: called with it when the response comes (the request's facts' ``now``
# set to then), returns the throttle seconds that response is to report.
ResponseCharge = Callable[[int], float]
# A fault reported by an action: its hit counter key, its detail (the log line's), and whether it
# is a connection fault (counted as such too).
Fault = tuple[HitKey, str, bool]


class VerdictDraft:
    """What the actions that hit one request decided, in the order they decided it.

    * ``hold_s``: seconds to hold the request before forwarding it; ``response_delay_s``: seconds
      to hold its response; ``held_by``: the (rule, action) of the longest single hold;
    * ``throttle_ms``: the ``throttle_time_ms`` to report in the answer (the largest asked);
      ``response_charges``: what charges the response's size (see :data:`ResponseCharge`);
      ``throttled``: (rule id, seconds held) per throttle that held the request (both None: none);
    * ``drop``: swallow the response; ``blackhole``: let nothing more through this connection
      while the rule and action ``blackhole_by`` names is in force (an action is kept as a value,
      compared with its rule's actions: kproxy.policy.in_force) (``blackhole_forwards``:
      requests still reach the broker, only answers are lost);
      ``close_after_s``: then close it after that long; ``close_delay_s``: close the connection
      that long after it ends, while the rule and action ``close_delay_by`` names is in force
      (a slow close); ``closing``: close it now, as
      (reason, abort: a TCP RST rather than a FIN), the first asked;
    * ``wire``: byte-level toxics to install on the connection, as (key, action, direction, toxic)
      (None: none; the policy installs each once per connection: kproxy.policy.rule_toxics);
    * ``faults``: what each action reported, in order (see :data:`Fault`).

    ``buckets`` (the engine's token buckets) and ``facts`` (the request's) are for the actions that
    charge a bucket or read the request (None where a verdict is worked out ahead of any request: only the
    :attr:`~kproxy.rules.actions.base.RuleAction.verdict_from_draws` kinds run then).
    """

    # Class-level defaults, written per instance only by the actions that decide them: a draft is
    # made for every request a rule acts on, and most write one or two of these.
    hold_s = response_delay_s = longest_s = 0.0
    held_by: tuple[str, str] | None = None
    throttle_ms = 0
    response_charges: list[ResponseCharge] | None = None
    throttled: list[tuple[str, float]] | None = None
    drop = blackhole = blackhole_forwards = False
    blackhole_by: tuple[str, Hashable] | None = None
    close_delay_s = 0.0
    close_delay_by: tuple[str, Hashable] | None = None
    close_after_s: float | None = None
    closing: tuple[str, bool] | None = None
    wire: list[tuple[HitKey, Hashable, Direction, Toxic]] | None = None
    delays_ms: tuple[float, ...] = ()  # the current hit's drawn delays, taken in order
    drawn = 0

    def __init__(self, buckets: Buckets | None = None, facts: FrameFacts | None = None, request_size: int = 0
                 ) -> None:
        self.buckets = buckets
        self.facts = facts
        self.request_size = request_size
        self.faults: list[Fault] = []

    def hit(self, delays_ms: tuple[float, ...]) -> None:
        """Start the actions of the next hit, whose delays the engine worked out (one per action that
        :attr:`~kproxy.rules.actions.base.RuleAction.takes_delay`)."""
        self.delays_ms, self.drawn = delays_ms, 0

    def next_delay_ms(self) -> float:
        """The hit's next drawn delay (one per action that takes one, in order)."""
        ms = self.delays_ms[self.drawn]
        self.drawn += 1
        return ms

    def hold(self, seconds: float, key: HitKey, *, at_response: bool = False) -> None:
        """Hold the request (or, ``at_response``, its response) ``seconds`` more; the longest single
        hold names the action charged with the time (``held_by``)."""
        if at_response:
            self.response_delay_s += seconds
        else:
            self.hold_s += seconds
        if seconds > self.longest_s:
            self.longest_s, self.held_by = seconds, (key[0], key[1])

    def charge_response(self, charge: ResponseCharge) -> None:
        """Charge the response's size with ``charge`` when it comes."""
        if self.response_charges is None:
            self.response_charges = []
        self.response_charges.append(charge)

    def count_throttled(self, rule_id: str, seconds: float) -> None:
        """A throttle of rule ``rule_id`` held the request ``seconds`` (kproxy_rule_throttle_seconds_total)."""
        if self.throttled is None:
            self.throttled = []
        self.throttled.append((rule_id, seconds))

    def wire_toxic(self, key: HitKey, action: Hashable, direction: Direction, toxic: Toxic) -> None:
        """Install ``toxic`` on the connection's ``direction`` (from this request on, while ``action``'s
        rule is in force; once per connection however many requests hit it)."""
        if self.wire is None:
            self.wire = []
        self.wire.append((key, action, direction, toxic))

    def black_hole(self, key: HitKey, action: Hashable, *, forward: bool) -> None:
        """Let nothing more through the connection while ``action`` of rule ``key[0]`` is in force
        (``forward``: requests still reach the broker); the first black hole asked is the one kept."""
        if not self.blackhole:
            self.blackhole, self.blackhole_forwards, self.blackhole_by = True, forward, (key[0], action)

    def slow_close(self, key: HitKey, action: Hashable, seconds: float) -> None:
        """Close the connection ``seconds`` after it ends, while ``action`` of rule ``key[0]`` is in
        force (the longest delay asked is the one kept)."""
        if seconds > self.close_delay_s:
            self.close_delay_s, self.close_delay_by = seconds, (key[0], action)

    def close(self, key: HitKey, *, abort: bool) -> None:
        """Close the client connection instead of forwarding (the first close asked wins)."""
        if self.closing is None:
            self.closing = (f"rule {key[0]}: {key[1]}", abort)

    def fault(self, key: HitKey, detail: str) -> None:
        self.faults.append((key, detail, False))

    def connection_fault(self, key: HitKey, detail: str) -> None:
        self.faults.append((key, detail, True))


__all__ = ["Fault", "HitKey", "ResponseCharge", "VerdictDraft"]
