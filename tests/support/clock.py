"""A hand-set clock for sans-IO tests: what a Session or a rule set reads as the time."""

from __future__ import annotations


class Clock:
    """Seconds as ``now`` says: starts at 100.0 and moves only when a test sets or adds to it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
