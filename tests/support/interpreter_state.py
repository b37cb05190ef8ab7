"""Interpreter-wide settings a test changed and left changed: what the tests after it, in the same
worker, then run under.

A trace or profile function, the switch interval, the recursion limit, the collector's thresholds
and on/off: each applies to every thread of the process, so one test that sets one and does not
put it back makes every later test of its worker slower or different (a trace function alone runs
pure-Python code tens of times slower). :class:`StateWatch` notes them when a test begins and when
it ends, and names the test that changed one; tests/conftest.py prints them at the end of a run.
"""

from __future__ import annotations

import gc
import sys


def interpreter_state() -> dict[str, str]:
    """The settings :class:`StateWatch` follows, as text to compare and print."""
    trace, profile = sys.gettrace(), sys.getprofile()
    return {
        "trace function": "none" if trace is None else repr(trace),
        "profile function": "none" if profile is None else repr(profile),
        "switch interval": f"{sys.getswitchinterval():g} s",
        "recursion limit": str(sys.getrecursionlimit()),
        "collector": f"{'on' if gc.isenabled() else 'off'}, thresholds {gc.get_threshold()}",
    }


class StateWatch:
    """What one test changed of :func:`interpreter_state` and left so."""

    def __init__(self) -> None:
        self._before: dict[str, str] = {}

    def begin(self) -> None:
        self._before = interpreter_state()

    def end(self) -> list[str]:
        """``setting: before -> after`` for each setting that differs from :meth:`begin`'s."""
        after = interpreter_state()
        return [f"{key}: {self._before[key]} -> {value}" for key, value in after.items()
                if self._before.get(key, value) != value]
