"""kproxy's shared HTTP server (kproxy/http_server.py) on real sockets: its limits and its catch-all.

The handlers are small real ones written here (one fails on purpose, as a handler's bug would);
the server, its sockets and h11 are the real ones. The same server under the metrics endpoint and
the admin API is exercised through them in test_admin_hostile.py and test_admin_descriptors.py.
"""

from __future__ import annotations

import logging

import pytest
import trio

from kproxy.http_server import HttpLimits, HttpServer, Request, Response

log = logging.getLogger("kproxy.test_http")


class Handler:
    """Answers ``/ok``; ``/boom`` raises, as a handler's bug would; ``/secret`` needs a header."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    def check(self, request: Request) -> Response | None:
        if request.target == "/secret" and request.headers.get(b"x-token") != b"yes":
            return Response(401, b"no\n")
        return None

    async def respond(self, request: Request) -> Response:
        self.bodies.append(request.body)
        if request.target == "/boom":
            raise RecursionError("maximum recursion depth exceeded")
        return Response(200, b"ok\n")

    def error(self, status: int, reason: str) -> Response:
        return Response(status, f"refused: {reason}\n".encode())


async def exchange(port: int, data: bytes, *, timeout: float = 5) -> bytes:
    """Send ``data``, read until the server closes (or ``timeout``)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    got = bytearray()
    with trio.move_on_after(timeout):
        await stream.send_all(data)
        while chunk := await stream.receive_some(65536):
            got += chunk
    await stream.aclose()
    return bytes(got)


def get(path: str, headers: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n"


async def serving(nursery: trio.Nursery, handler: Handler, **limits: float) -> HttpServer:
    server = HttpServer("test", handler, HttpLimits(**limits), log=log)  # type: ignore[arg-type]
    await nursery.start(server.serve, "127.0.0.1", 0)
    return server


def test_a_handler_that_raises_is_a_500_and_one_log_line_and_the_server_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server = await serving(nursery, Handler())
            with caplog.at_level(logging.ERROR, "kproxy.test_http"):
                boom = await exchange(server.port, get("/boom"))
            assert boom.startswith(b"HTTP/1.1 500 "), boom
            assert b"refused: internal error (RecursionError)" in boom
            assert (await exchange(server.port, get("/ok"))).startswith(b"HTTP/1.1 200 ")
            assert server.open == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ['event=test_error method=GET path=/boom error=RecursionError '
                     'detail="maximum recursion depth exceeded"']


def test_connections_over_the_cap_are_closed_at_once_and_counted_free_again_when_closed(
        caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server = await serving(nursery, Handler(), max_connections=3, head_timeout=30, request_timeout=30)
            idle = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(3)]
            while server.open < 3:
                await trio.sleep(0.01)
            with caplog.at_level(logging.WARNING, "kproxy.test_http"), trio.fail_after(2):
                assert await exchange(server.port, get("/ok")) == b"", "a fourth connection was served"
                assert await exchange(server.port, get("/ok")) == b""
            await idle.pop().aclose()
            with trio.fail_after(5):
                while server.open > 2:
                    await trio.sleep(0.01)
                assert (await exchange(server.port, get("/ok"))).startswith(b"HTTP/1.1 200 ")
            for stream in idle:
                await stream.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)
    refusals = [r.getMessage() for r in caplog.records if "connection_refused" in r.getMessage()]
    assert refusals == ["event=connection_refused listener=test reason=max_connections max_connections=3 "
                        "occurrences=1"], "one line per 10 s, not one per refusal"


def test_a_head_refused_by_check_is_answered_before_the_body_and_the_body_never_read() -> None:
    async def main() -> None:
        handler = Handler()
        async with trio.open_nursery() as nursery:
            server = await serving(nursery, handler, request_timeout=30)
            head = b"PUT /secret HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n"
            with trio.fail_after(3):  # the body never comes: the answer must not wait for it
                answer = await exchange(server.port, head + b"x" * 100, timeout=3)
            assert answer.startswith(b"HTTP/1.1 401 "), answer
            with trio.fail_after(3):
                over = await exchange(server.port, get("/ok", b"Content-Length: 70000\r\n"), timeout=3)
            assert over.startswith(b"HTTP/1.1 413 ") and b"body over 65536 bytes" in over
            chunked = (b"PUT /ok HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                       + b"10000\r\n" + b"y" * 0x10000 + b"\r\n" + b"1\r\nz\r\n0\r\n\r\n")
            assert (await exchange(server.port, chunked)).startswith(b"HTTP/1.1 413 ")
            assert handler.bodies == [], "a refused request reached the handler"
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_slow_heads_and_slow_bodies_are_cut_at_their_deadlines() -> None:
    async def main() -> None:
        handler = Handler()
        async with trio.open_nursery() as nursery:
            server = await serving(nursery, handler, head_timeout=0.5, request_timeout=1.5)
            started = trio.current_time()
            assert await exchange(server.port, b"GET /ok HTTP/1.1\r\nHost: t\r\n") == b""
            head_took = trio.current_time() - started
            started = trio.current_time()
            slow_body = b"PUT /ok HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nabc"
            assert await exchange(server.port, slow_body) == b""
            body_took = trio.current_time() - started
            assert 0.4 < head_took < 1.5 and 1.4 < body_took < 3, (head_took, body_took)
            assert handler.bodies == []
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.parametrize("garbage", [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,
                                     b"GET / HTTP/1.1\r\nHost: t\r\nContent-Length: 9" + b"9" * 5000 + b"\r\n\r\n",
                                     b"GET / HTTP/1.1\r\n" + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n",
                                     b"GET / HTTP/1.1\r\n\r\n"],
                         ids=["tls-hello", "huge-content-length", "head-over-16KiB", "no-host"])
def test_malformed_requests_get_a_4xx_or_a_close_and_the_server_goes_on(garbage: bytes) -> None:
    async def main() -> None:
        handler = Handler()
        async with trio.open_nursery() as nursery:
            server = await serving(nursery, handler)
            answer = await exchange(server.port, garbage)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer
            assert (await exchange(server.port, get("/ok"))).startswith(b"HTTP/1.1 200 ")
            assert handler.bodies == [b""]
            nursery.cancel_scope.cancel()

    trio.run(main)
