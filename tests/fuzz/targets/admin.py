"""Fuzz target of the admin HTTP server: raw bytes in, an HTTP answer (or a close) out.

Each input is one connection to a real :class:`~kproxy.admin.api_server.AdminServer` (bearer token
:data:`TOKEN`, one file rule in force) serving on loopback, inside one ``trio.run`` of its own:
the input is sent whole, the client half-closes, and reads until the server closes. Written
against that public behaviour only (bytes in, an answer out), not the serving loop's insides.

The contract: the server never raises (its task, and so the run, would end with the exception);
what comes back is informational responses (``100 Continue``) then either nothing (a close) or one
complete final response (a status and the whole body its headers announce), within
:data:`ANSWER_SECONDS`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

from tests.fuzz.targets.registry import target
from tests.fuzz.targets.rules import BASE_RULE, SAMPLE_RULES

TOKEN = "fuzz-token"
ANSWER_SECONDS = 4.0  # the server's own limit per connection is longer: a half-closed request must not wait for it


def _request(method: str, path: str, body: bytes = b"", *, token: str | None = TOKEN,
             extra: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nhost: localhost\r\n".encode()
    if token is not None:
        head += f"authorization: Bearer {token}\r\n".encode()
    if body or method in ("PUT", "POST", "PATCH"):
        head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


def _admin_http_seeds() -> Iterator[bytes]:
    rule = json.dumps(SAMPLE_RULES[1]).encode()
    yield _request("GET", "/healthz")
    yield _request("GET", "/rules")
    yield _request("GET", "/rules/base")
    yield _request("GET", "/faults?limit=5&rule=base")
    yield _request("POST", "/rules", rule)
    yield _request("PUT", "/rules", json.dumps({"seed": 1, "rules": SAMPLE_RULES[:3]}).encode())
    yield _request("PUT", "/rules/groups", rule)
    yield _request("PATCH", "/rules/base", b'{"enabled": false}')
    yield _request("POST", "/rules/base/disable")
    yield _request("DELETE", "/rules/base")
    yield _request("POST", "/reset")
    yield _request("GET", "/rules", token="wrong")
    yield _request("GET", "/rules", token=None)
    yield _request("POST", "/rules", rule, extra=b"expect: 100-continue\r\n")
    yield (b"POST /rules HTTP/1.1\r\nhost: x\r\nauthorization: Bearer " + TOKEN.encode() +
           b"\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n" % len(rule) + rule + b"\r\n0\r\n\r\n")
    yield _request("GET", "/healthz") + _request("GET", "/rules")  # pipelined: one answer, then a close


def first_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first exception inside (nested) exception groups: what a finding's signature is read from."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


_INFORMATIONAL = re.compile(rb"HTTP/1\.1 1\d\d [^\r\n]*\r\n(?:[^\r\n]+\r\n)*\r\n")


def _check_answer(reply: bytes, head: bool = False) -> None:
    """Informational responses (100 Continue), then nothing (a close: the request was not whole) or one
    complete final response, read as an HTTP client (h11) reads it. ``head``: the request was a HEAD,
    whose answer carries the headers a GET's would (its content-length too) and no body (RFC 9110 9.3.2)."""
    import h11

    at = 0
    while (m := _INFORMATIONAL.match(reply, at)) is not None:
        at = m.end()
    if at == len(reply):
        return
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="HEAD" if head else "GET", target="/", headers=[("host", "localhost")]))
    client.send(h11.EndOfMessage())
    client.receive_data(reply[at:])
    client.receive_data(b"")
    final = None
    while True:
        try:
            event = client.next_event()
        except h11.RemoteProtocolError as exc:
            raise AssertionError(f"not an HTTP answer ({exc}): {reply[:200]!r}") from None
        if isinstance(event, h11.Response):
            final = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            break
        elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
            raise AssertionError(f"the answer stops short: {reply[:200]!r}")
    assert final is not None and 200 <= final < 600, f"no final status: {reply[:200]!r}"


@target(_admin_http_seeds, warm=True)
def fuzz_admin_http(data: bytes) -> None:
    """Raw bytes into a real AdminServer on loopback: never raises; a whole HTTP answer or a close, in seconds."""
    import trio

    from kproxy.admin.api_server import AdminServer
    from kproxy.admin.book import RuleBook
    from kproxy.metrics.fault_stats import FaultStats
    from kproxy.policy.live_rules import LiveRules
    from kproxy.rules.load import load_text

    live = LiveRules(load_text(BASE_RULE, "rules.yaml"), counts=FaultStats(), mutable=True)
    server = AdminServer(RuleBook(live), token=TOKEN)
    reply = bytearray()

    async def one_connection() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, "127.0.0.1", 0)
            with trio.fail_after(ANSWER_SECONDS):
                stream = await trio.open_tcp_stream("127.0.0.1", server.port)
                async with stream:
                    try:
                        await stream.send_all(data)
                        await stream.send_eof()
                    except trio.BrokenResourceError:
                        pass  # the server answered and closed before reading it all: what came back is checked
                    while True:
                        try:
                            chunk = await stream.receive_some(65536)
                        except trio.BrokenResourceError:
                            break  # reset after its answer
                        if not chunk:
                            break
                        reply.extend(chunk)
            nursery.cancel_scope.cancel()

    try:
        trio.run(one_connection)
    except BaseExceptionGroup as group:
        leaf = first_leaf(group)
        if isinstance(leaf, trio.TooSlowError):
            raise AssertionError(f"no answer nor close within {ANSWER_SECONDS} s") from None
        raise leaf from None  # the server's own exception, with its traceback: the finding
    except trio.TooSlowError:
        raise AssertionError(f"no answer nor close within {ANSWER_SECONDS} s") from None
    _check_answer(bytes(reply), head=data.startswith(b"HEAD "))
