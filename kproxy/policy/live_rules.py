"""The rule set in force, replaceable while connections run (rule reloads, the admin API).

One :class:`LiveRules` per server. Every connection's :class:`~kproxy.policy.policy.RulePolicy`
holds it and reads :attr:`LiveRules.injector` once per request, so a :meth:`LiveRules.replace`
takes effect at the next request of every connection, open or new, with no connection dropped.
A request already decided keeps its decision: the verdict (and any response edit it carries) was
built from the injector of the moment it was read.

A replacement starts the new rule set afresh: its schedules count from the replacement, its
throttle buckets start full, its seeded draws restart. That is what makes a run reproducible from
the moment its rules were loaded: a reload of the rule file, and the admin API's replacement of
every rule (``PUT /rules``, a reset to the file), do that. An edit of some rules (the admin API's
add, replace, enable, disable, dry run or delete of one rule) is a replacement that *carries on*
(``carry=True``): every rule it leaves unchanged (the same rule, the same seed) keeps its schedule
(counters, the start of ``after_seconds``/``for_seconds``), its throttle buckets, its hits since
load, and clients keep their stream ordinals, so its seeded draws go on where they were; a rule
added, edited or enabled starts afresh (:meth:`FaultInjector.carry_on
<kproxy.policy.injector.FaultInjector.carry_on>`).

Contract for writers (the reload watcher, the admin API): call :meth:`replace` from the server's
trio thread only (sessions read the injector there; no lock is needed because nothing awaits
between a read and its use). ``generation`` grows by one on every replacement, including to "no
rules"; it is exported as a gauge so an operator can see which file version is in force.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator

from kproxy.metrics.fault_stats import FaultStats
from kproxy.policy.faults import FaultRecord
from kproxy.policy.injector import FaultInjector
from kproxy.policy.policy import RulePolicy, TopicIdLearningPolicy
from kproxy.protocol.leader_epochs import LeaderEpochFloors
from kproxy.rules import RuleSet

# Series keys looked at per turn of the loop by put_in_force: a turn short enough for the loop.
SERIES_CHUNK = 5000


class LiveRules:
    """The current :class:`FaultInjector` (or none), its generation, and where it came from."""

    __slots__ = ("clock", "counts", "epoch_floors", "generation", "injector", "mutable", "origin", "recent",
                 "wall_clock")

    def __init__(self, rules: RuleSet | None, *, counts: FaultStats, mutable: bool = False,
                 clock: Callable[[], float] = time.perf_counter, wall_clock: Callable[[], float] = time.time) -> None:
        self.counts = counts
        self.clock = clock
        self.wall_clock = wall_clock  # when a rule set went in force, as the admin API shows it
        self.injector: FaultInjector | None = None
        self.generation = 0
        self.origin = "none"
        # mutable: rules may arrive after start (a watched file, an admin API). Only then do
        # connections opened with no rules get a policy: with rules off for good, a request costs
        # nothing here.
        self.mutable = mutable
        # The last faults done, newest last (the admin API's /faults); None: not kept. Bounded by
        # its maxlen: one record per fault, never per request.
        self.recent: deque[FaultRecord] | None = None
        # The leader epochs rules raised above the upstream cluster's own, per partition: every
        # connection keeps advertising at least those until the broker's epochs reach them, whatever
        # rule set is in force (kproxy.protocol.leader_epochs). Empty unless a rule moved a leader.
        self.epoch_floors = LeaderEpochFloors()
        if rules is not None:
            self.replace(rules, origin=rules.source or "config")

    @property
    def rules(self) -> RuleSet | None:
        injector = self.injector
        return injector.rules if injector is not None else None

    def replace(self, rules: RuleSet | None, *, origin: str, carry: bool = False) -> int:
        """Put ``rules`` in force (``None``: no rules) and return the new generation; ``carry``: the
        rules left unchanged carry on (the module docstring).

        Builds on the calling thread: for a big rule set, :meth:`prepare` in a worker thread and
        :meth:`install` on the trio thread instead.
        """
        return self.install(self.prepare(rules, carry=carry), origin=origin)

    def prepare(self, rules: RuleSet | None, *, carry: bool = False) -> FaultInjector | None:
        """Build the injector for ``rules`` without touching anything shared: safe in a worker thread.

        The result goes to :meth:`install` (trio thread), which must put it in place of the injector
        in force now when ``carry`` (the admin book replans an edit when the rules changed meanwhile).
        Learnt topic ids outlive a replacement (clients do not re-read metadata because rules
        changed): the map is one object handed on.
        """
        if rules is None:
            return None
        current = self.injector
        names = current.topic_names if current is not None else None
        return FaultInjector(rules, counts=self.counts, clock=self.clock, topic_names=names, register=False,
                             previous=current if carry else None)

    def install(self, injector: FaultInjector | None, *, origin: str) -> int:
        """Put a :meth:`prepare`-d injector in force and return the new generation (trio thread only).

        The series of rules no longer loaded are removed
        (:meth:`FaultStats.keep_rules <kproxy.metrics.stats.FaultStats.keep_rules>`), so ``/metrics``
        stays bounded however often rules are replaced, and the new rules' series are born at zero
        (those of rules still loaded keep counting). That is a walk of the counter maps: for a big
        set, :meth:`put_in_force` spreads it over turns of the loop.
        """
        generation = self._swap(injector, origin, 0)
        for _ in self._series_steps(injector, 0):
            pass
        return generation

    async def put_in_force(self, injector: FaultInjector | None, *, origin: str,
                           turn: Callable[[], Awaitable[object]]) -> int:
        """:meth:`install`, with the series work done :data:`SERIES_CHUNK` keys per turn of the loop
        (100,000 rules' series at once held the loop for hundreds of milliseconds on a loaded machine),
        ``turn`` awaited between chunks (the event loop's checkpoint: ``trio.lowlevel.checkpoint``).
        The rules apply at once; a series not registered yet is created by its first count."""
        generation = self._swap(injector, origin, SERIES_CHUNK)
        for _ in self._series_steps(injector, SERIES_CHUNK):
            if self.injector is not injector:
                break  # replaced meanwhile: the replacement's own series work supersedes this
            await turn()
        return generation

    def _swap(self, injector: FaultInjector | None, origin: str, chunk: int) -> int:
        if injector is not None:
            if injector.previous is not None and injector.previous is not self.injector:
                injector.previous = None  # built to follow rules no longer in force: it starts afresh
            # Schedules count from the replacement, not from a build that may have taken a while.
            injector.carry_on(self.clock(), self.wall_clock())
            if not chunk or len(injector.series[0]) <= chunk:
                # With the swap, no turn of the loop between: every fault after it is one since the load.
                # A bigger set's counts are noted over the next turns (_series_steps): a fault of those
                # turns on a series not noted yet is read as from before the load.
                for _ in injector.note_load():
                    pass
        self.injector = injector
        # With the generation, not after the series work (which yields to the loop between chunks):
        # a scrape or the admin API never sees the new generation beside the old rule count.
        self.counts.rules_loaded = 0 if injector is None else injector.enabled_rules
        self.generation += 1
        self.counts.rules_generation = self.generation
        self.origin = origin
        return self.generation

    def _series_steps(self, injector: FaultInjector | None, chunk: int) -> Iterator[object]:
        if injector is not None and not injector.load_noted:
            yield from injector.note_load(chunk)
        yield from self.counts.keep_rules(injector.rule_ids if injector is not None else (), chunk)
        if injector is not None:
            yield from injector.series_steps(chunk)

    def policy(self, peer: str, broker_id: int | None = None, cluster: str | None = None) -> RulePolicy | None:
        """The policy of one client connection (of ``cluster``: the config's ``clusters:``), or ``None``
        when no rule can ever apply to it."""
        if self.injector is None and not self.mutable:
            return None
        if self.mutable or (self.injector is not None and self.injector.learns_topic_ids):
            return TopicIdLearningPolicy(self, peer, broker_id, cluster)  # topic keys may need Metadata's topic ids
        return RulePolicy(self, peer, broker_id, cluster)


__all__ = ["SERIES_CHUNK", "LiveRules"]
