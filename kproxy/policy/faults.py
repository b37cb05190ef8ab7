"""What the policy keeps of each fault done: :class:`FaultRecord` (the admin API's ``/faults``),
and the small accounting helpers its log lines and counters share.

Every fault done (dry runs included, marked ``dry_run=true``) is one log line::

    event=fault rule=ID action=NAME connection=PEER correlation_id=N api=... topic=... partition=... detail=...

so a run can be explained afterwards, and two runs with one seed compared line by line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kproxy.metrics.fault_stats import FaultStats
from kproxy.protocol.codes import api_snake_name
from kproxy.proxy.session import Exchange
from kproxy.ratelimit import LogRateLimit
from kproxy.rules.actions.base import HitKey

log = logging.getLogger("kproxy.faults")
_OVER_BUDGET_LOG = LogRateLimit(60.0)  # the first frame over its records budget, then one line a minute
DRY_RUN_DETAIL = "dry run: nothing done"


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One fault done (or, ``dry_run``, only matched): what the fault log line says, kept in
    :attr:`~kproxy.policy.live_rules.LiveRules.recent` for the admin API's ``/faults``."""

    time: float  # wall clock, seconds since the epoch
    rule: str
    action: str
    connection: str
    correlation_id: int
    api: str
    topics: tuple[str, ...]
    partitions: tuple[int, ...]
    detail: str
    dry_run: bool


def over_budget(counts: FaultStats, peer: str) -> None:
    """A frame's record actions gave up (kproxy.protocol.records.budget): counted, logged rate-limited."""
    counts.records_over_budget += 1
    held = _OVER_BUDGET_LOG.due()
    if held is not None:
        log.warning("event=records_over_budget reader=rules connection=%s frames=%d", peer, held)


def decided(ex: Exchange, key: HitKey, detail: str) -> None:
    """Note one action done (or matched, in a dry run) on the exchange, for its observers."""
    ex.rule_decisions = (*ex.rule_decisions, (key[0], key[1], detail, key[2] == "true"))


def count(table: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
    table[key] = table.get(key, 0) + 1


_API_LABELS: dict[int, str] = {}


def api_label(api_key: int) -> str:
    """:func:`api_snake_name`, remembered (it runs a regex substitution per fault line). Bounded:
    a rule for every api key sees whatever keys clients make up."""
    found = _API_LABELS.get(api_key)
    if found is None:
        found = api_snake_name(api_key)
        if len(_API_LABELS) < 1024:
            _API_LABELS[api_key] = found
    return found


def note_action(note: str) -> str:
    """The action name a note of kproxy.rules.apply starts with (``inject_error NOT_LEADER...: ...``)."""
    return note.split(" ", 1)[0].split(":", 1)[0]


__all__ = ["DRY_RUN_DETAIL", "FaultRecord", "api_label", "count", "decided", "log", "note_action", "over_budget"]
