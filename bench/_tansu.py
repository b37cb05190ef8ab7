"""Tansu processes for the benchmarks: the broker and Tansu's own Rust proxy.

The process helpers are kproxy's own (``kproxy.testing``, which the demo
and the tests use too); this module adds ``tansu proxy``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from kproxy.testing import free_port, stop_process, tansu_binary
from kproxy.testing import wait_for_port as _wait_for_port

__all__ = ["broker", "free_port", "proxy", "tansu", "tansu_binary", "wait_for_port"]


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    """Until something listens on ``port`` (the timeout is generous: the suite's smoke runs,
    tests/test_bench_smoke.py, start brokers and kproxy processes on cores other tests share)."""
    _wait_for_port("127.0.0.1", port, timeout)


@contextlib.contextmanager
def tansu(args: list[str], port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``tansu ARGS`` until the block exits; waits for ``port`` to accept first."""
    with log.open("wb") as out:
        proc = subprocess.Popen([tansu_binary(), *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "RUST_LOG": "warn"})
    try:
        wait_for_port(port)
        yield proc
    finally:
        stop_process(proc)


def broker(port: int, log: Path, advertised_port: int | None = None) -> contextlib.AbstractContextManager[
        subprocess.Popen[bytes]]:
    """A Tansu broker on ``port``; its Metadata answers give ``advertised_port`` (default ``port``)."""
    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://127.0.0.1:{advertised_port or port}"
    return tansu(["broker", "--listener-url", url, "--advertised-listener-url", advertised,
                  "--storage-engine", "memory://tansu/"], port, log)


def proxy(port: int, origin_port: int, log: Path) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    url = f"tcp://127.0.0.1:{port}"
    return tansu(["proxy", "--listener-url", url, "--advertised-listener-url", url,
                  "--origin-url", f"tcp://127.0.0.1:{origin_port}"], port, log)
