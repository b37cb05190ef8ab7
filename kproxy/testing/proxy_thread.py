"""Run a kproxy server in a background thread (for callers that are not trio code), or in this trio run.

The demo and the tests drive kproxy with blocking Kafka clients (librdkafka,
kafka-python); they run the server on its own trio loop in a thread and talk
to it through :meth:`ProxyThread.call`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import trio

from kproxy.config import Config, build_config
from kproxy.server.proxy_server import ProxyServer


class ProxyThread:
    """``with ProxyThread(config) as p: p.bootstrap`` -- kproxy serving until the block ends."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.server: ProxyServer | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="kproxy", daemon=True)

    def _main(self) -> None:
        async def serve() -> None:
            self.server = ProxyServer(self.config, handle_signals=False)
            self._token = trio.lowlevel.current_trio_token()
            async with trio.open_nursery() as nursery:
                await nursery.start(self.server.run)
                self._started.set()

        try:
            trio.run(serve)
        except BaseException as exc:  # surfaced by start()/stop()
            self._error = exc
            self._started.set()

    def start(self) -> ProxyThread:
        self._thread.start()
        if not self._started.wait(20):
            raise TimeoutError("kproxy did not start within 20 s")
        if self._error is not None:
            raise self._error
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.bootstrap_port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, fn: Any, *args: Any) -> Any:
        """Run a sync function on the proxy's trio thread."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def stop(self, timeout: float = 20.0) -> None:
        if self.server is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                self.call(self.server.shutdown)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("kproxy did not stop")
        if self._error is not None:
            raise self._error

    def __enter__(self) -> ProxyThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def proxy_config(upstream: str, **options: Any) -> Config:
    """Loopback, ephemeral bootstrap and broker ports, short shutdown grace; ``options``
    are config paths with ``__`` for dots (``limits__max_in_flight=10``)."""
    raw: dict[str, tuple[Any, str]] = {
        "upstream": (upstream, "test"),
        "listen": ("127.0.0.1:0", "test"),
        "broker_port_base": (0, "test"),
        "limits.shutdown_grace": (5, "test"),
    }
    for key, value in options.items():
        raw[key.replace("__", ".")] = (value, "test")
    return build_config(raw)


@contextlib.contextmanager
def running_proxy(upstream: str, **options: Any) -> Iterator[ProxyThread]:
    with ProxyThread(proxy_config(upstream, **options)) as proxy:
        yield proxy


@contextlib.asynccontextmanager
async def running_server(config: Config) -> AsyncIterator[ProxyServer]:
    """A :class:`ProxyServer` serving in the current trio run; cancelled on exit."""
    async with trio.open_nursery() as nursery:
        server = ProxyServer(config, handle_signals=False)
        await nursery.start(server.run)
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
