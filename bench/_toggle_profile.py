"""Runs a benchmark process (bench/pipe.py, bench/run_kproxy.py) with a cProfile its caller turns on and off.

    .venv/bin/python bench/_toggle_profile.py OUT_PREFIX SCRIPT [ARGS...]

SIGUSR1 starts a profile of the main thread (the event loop's); SIGUSR2 stops it and writes it to
``OUT_PREFIX.N`` (N = 1, 2, ...; pstats format), then writes ``OUT_PREFIX.N.done`` so the caller
knows it is complete. bench_instructions.py ``--calls`` uses it to count the Python calls per request
a path makes (call counts are deterministic where CPU times are not): every interpreted function,
and every built-in or compiled function called from interpreted code. Functions compiled by mypyc
calling each other are not seen (native calls), which is the point: what is left is what still
passes through the interpreter.
"""

from __future__ import annotations

import cProfile
import runpy
import signal
import sys
from pathlib import Path
from types import FrameType


def main() -> None:
    out, script, *args = sys.argv[1:]
    profiler: list[cProfile.Profile] = []
    dumps = [0]

    def start(signum: int, frame: FrameType | None) -> None:
        if not profiler:
            profiler.append(cProfile.Profile())
            profiler[0].enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        if profiler:
            p = profiler.pop()
            p.disable()
            dumps[0] += 1
            path = f"{out}.{dumps[0]}"
            p.dump_stats(path)
            Path(path + ".done").touch()

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
