"""kproxy's small HTTP/1.1 server (h11 on trio): the metrics endpoint and the admin API both serve
through it, so every limit on what an HTTP client may hold is written once, here.

One request per connection (every answer says ``connection: close``). What a client can hold:

* **connections**: at most ``max_connections`` open at once per server; one more is closed as soon
  as it is accepted (one log line per 10 s, with the count). Descriptors the Kafka listeners need
  cannot be taken through an HTTP port.
* **the request head** (request line and headers, at most :data:`MAX_HEAD` bytes: h11's own
  limit) must be in within ``head_timeout`` of the accept, else the connection is closed.
* :meth:`Handler.check` sees the head before any byte of the body is read and can answer at once
  (the admin API's 401): an unauthenticated client never makes kproxy read or buffer a body.
* **the body** is at most ``max_body`` bytes (a larger one is answered 413 without reading it), and
  the whole request must be in within ``request_timeout`` of the accept.
* **the answer** (:meth:`Handler.respond`) has no deadline: once the request is read whole, what it
  asks is carried out and the answer says what happened; only its writing is bounded
  (``write_timeout``), for a client that does not read.
* **any exception** out of a handler is one log line ``event=<name>_error`` and, if no answer was
  started yet, a 500: nothing a client sends ends the server, nor the process it runs in.

A client that went away (reset, closed early, a malformed request) is dropped quietly: nothing was
asked of the handler for a request not read whole.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import h11
import trio

from kproxy.logfmt import q
from kproxy.metrics.stats import ACCEPT_CAPACITY_ERRORS
from kproxy.ratelimit import LogRateLimit

MAX_HEAD = 16 * 1024  # request line and headers together (h11's default incomplete-event limit)
_LINGER_SECONDS = 1.0  # after an early answer: read (and drop) what the client still sends, so the
_LINGER_BYTES = 1024 * 1024  # close is not a reset that destroys the answer before it is read
_ACCEPT_BACKOFF = 0.1


@dataclass(frozen=True)
class Request:
    """One request: ``headers`` keyed by lower-cased name (the last value of a repeated one);
    ``body`` is empty when :meth:`Handler.check` sees it (nothing of the body is read yet)."""

    method: str
    target: str
    headers: Mapping[bytes, bytes]
    body: bytes = b""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


class Handler(Protocol):
    """What a server serves: three methods, called on the server's trio thread."""

    def check(self, request: Request) -> Response | None:
        """An answer from the head alone (before any body byte is read), or None to go on."""

    async def respond(self, request: Request) -> Response:
        """The answer to a request read whole. May raise: the client gets a 500."""

    def error(self, status: int, reason: str) -> Response:
        """The server's own refusals (400 malformed, 413 too large, 500) in the handler's format."""


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 64
    max_body: int = 64 * 1024
    head_timeout: float = 5.0
    request_timeout: float = 10.0
    write_timeout: float = 10.0


class HttpServer:
    """Serves one :class:`Handler` on the listeners of one address; ``name`` names it in log lines
    (``listener=admin``, ``event=admin_error``)."""

    def __init__(self, name: str, handler: Handler, limits: HttpLimits, *, log: logging.Logger) -> None:
        self.name = name
        self.handler = handler
        self.limits = limits
        self.log = log
        self.port = 0
        self.open = 0  # connections accepted and not closed yet
        self._refusals = LogRateLimit()
        self._accept_failures = LogRateLimit()

    async def serve(self, host: str, port: int, *, details: str = "",
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on ``host:port`` (0: any free port, then in :attr:`port`) and serve until cancelled;
        ``details`` (``key=value ...``) end the ``event=<name>_listening`` line."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        self.log.info("event=%s_listening address=%s:%d max_connections=%d%s", self.name, host, self.port,
                      self.limits.max_connections, f" {details}" if details else "")
        task_status.started()
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        """trio.serve_listeners, but out of descriptors it logs one logfmt line per 10 s (trio's own
        logs a traceback per failed accept) and keeps accepting; over the cap it closes at once."""
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    error = errno.errorcode.get(exc.errno or 0, "")
                    if error not in ACCEPT_CAPACITY_ERRORS:
                        raise
                    count = self._accept_failures.due()
                    if count is not None:
                        self.log.warning("event=accept_failed listener=%s error=%s occurrences=%d retry_in_s=%.1f",
                                         self.name, error, count, _ACCEPT_BACKOFF)
                    await trio.sleep(_ACCEPT_BACKOFF)
                    continue
                if self.open >= self.limits.max_connections:
                    count = self._refusals.due()
                    if count is not None:
                        self.log.warning("event=connection_refused listener=%s reason=max_connections "
                                         "max_connections=%d occurrences=%d", self.name,
                                         self.limits.max_connections, count)
                    await trio.aclose_forcefully(stream)
                    continue
                self.open += 1
                nursery.start_soon(self._connection, stream)

    async def _connection(self, stream: trio.SocketStream) -> None:
        exchange = _Exchange(stream, self.limits)
        try:
            await self._serve_one(exchange)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client went away
        except h11.RemoteProtocolError as exc:
            await exchange.answer_if_unanswered(self.handler.error(exc.error_status_hint, f"malformed request: {exc}"))
        except Exception as exc:  # a handler's bug, or an input it did not foresee: one answer, one line
            self.log.error("event=%s_error method=%s path=%s error=%s detail=%s", self.name,
                           q(exchange.method), q(exchange.path[:200]), type(exc).__name__, q(str(exc)[:300]))
            await exchange.answer_if_unanswered(self.handler.error(500, f"internal error ({type(exc).__name__}); "
                                                                        "kproxy logged it"))
        finally:
            self.open -= 1
            await trio.aclose_forcefully(stream)

    async def _serve_one(self, exchange: _Exchange) -> None:
        limits = self.limits
        read: Request | Response | None = None
        with trio.move_on_after(limits.request_timeout):
            read = await exchange.read(self.handler)
        if read is None:
            return  # closed, or too slow: nothing was asked
        if isinstance(read, Response):
            await exchange.send(read)
            await exchange.linger()
            return
        await exchange.send(await self.handler.respond(read))


class _Exchange:
    """One connection's request and answer."""

    def __init__(self, stream: trio.SocketStream, limits: HttpLimits) -> None:
        self.stream = stream
        self.limits = limits
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.method = "-"
        self.path = "-"
        self.head_only = False  # a HEAD request: the answer has no body
        self.started = False  # an answer's first byte was handed to the socket

    async def _next_event(self) -> h11.Event | type[h11.PAUSED]:
        while True:
            event = self.conn.next_event()
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]  # mypy does not narrow a sentinel class
            data = await self.stream.receive_some(65536)
            self.conn.receive_data(data)

    async def read(self, handler: Handler) -> Request | Response | None:
        """The request read whole, an answer to give instead (early), or None (closed, head too slow)."""
        event: h11.Event | type[h11.PAUSED] | None = None
        with trio.move_on_after(self.limits.head_timeout):
            event = await self._next_event()
        if not isinstance(event, h11.Request):
            return None
        self.method = event.method.decode("latin-1")
        self.path = event.target.decode("latin-1").split("?", 1)[0]
        self.head_only = event.method == b"HEAD"
        head = Request(self.method, event.target.decode("latin-1"), dict(event.headers))
        early = handler.check(head)
        if early is not None:
            return early
        length = head.headers.get(b"content-length")
        if length is not None and (len(length) > 18 or int(length) > self.limits.max_body):  # h11: digits
            return handler.error(413, f"body over {self.limits.max_body} bytes")
        if self.conn.they_are_waiting_for_100_continue:  # curl asks before sending a body over 1 KiB
            await self.stream.send_all(self.conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = bytearray()
        while True:
            event = await self._next_event()
            if isinstance(event, h11.Data):
                if len(body) + len(event.data) > self.limits.max_body:  # chunked: no length said up front
                    return handler.error(413, f"body over {self.limits.max_body} bytes")
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return Request(head.method, head.target, head.headers, bytes(body))
            else:  # ConnectionClosed: the client gave up half way
                return None

    async def send(self, response: Response) -> None:
        headers = [("content-type", response.content_type), ("content-length", str(len(response.body))),
                   ("connection", "close"), *response.headers]
        with trio.move_on_after(self.limits.write_timeout):
            self.started = True
            data = self.conn.send(h11.Response(status_code=response.status, headers=headers)) or b""
            if not self.head_only:
                data += self.conn.send(h11.Data(data=response.body)) or b""
            data += self.conn.send(h11.EndOfMessage()) or b""
            await self.stream.send_all(data)

    async def answer_if_unanswered(self, response: Response) -> None:
        """The server's own answer after a failure, unless one was started (then only the close)."""
        if self.started:
            return
        # h11 lets a server answer in IDLE or SEND_RESPONSE even once the client's side is in ERROR.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.LocalProtocolError):
            await self.send(response)

    async def linger(self) -> None:
        """After an answer given before the body was read: stop sending, then read and drop what the
        client still sends, for a moment, so that closing does not reset the connection (a reset can
        destroy the answer in the client's buffers before it reads it)."""
        try:
            await self.stream.send_eof()
            dropped = 0
            with trio.move_on_after(_LINGER_SECONDS):
                while dropped < _LINGER_BYTES:
                    data = await self.stream.receive_some(65536)
                    if not data:
                        return
                    dropped += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass


__all__ = ["MAX_HEAD", "Handler", "HttpLimits", "HttpServer", "Request", "Response"]
