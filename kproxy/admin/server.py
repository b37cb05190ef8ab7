"""The admin API's HTTP side: HTTP/1.1 on trio with h11 (as kproxy/metrics/exposition.py), JSON in and out.

Routes (documented for users in docs/ADMIN.md); the logic behind them is :class:`~kproxy.admin.book.RuleBook`::

    GET    /rules                 the rules in force, state, hits, divergence from the file
    PUT    /rules                 replace every rule ({"seed": N, "rules": [...]}, a rule file as JSON)
    POST   /rules                 add one rule (appended last)             201
    GET    /rules/{id}            one rule
    PUT    /rules/{id}            replace one rule in place (or add it)    200 / 201
    PATCH  /rules/{id}            {"enabled": bool, "dry_run": bool}, either or both
    POST   /rules/{id}/enable     same as PATCH {"enabled": true}
    POST   /rules/{id}/disable    same as PATCH {"enabled": false}
    DELETE /rules/{id}            remove one rule
    POST   /reset                 back to the file's rules (or none)
    GET    /faults?limit=N&rule=ID   the most recent faults done, newest first
    GET    /healthz               {"status": "ok"}

Errors are ``{"errors": [{"path": ..., "reason": ..., "hint": ...}]}`` with 400 (invalid input),
401 (token), 404, 405, 409 (id taken), 413 (body over 1 MiB).

Authentication: with a token configured, every request needs ``Authorization: Bearer <token>``,
compared in constant time (:func:`hmac.compare_digest`). Without one, the listener is on loopback
(kproxy.config refuses anything else at start).

Every request runs on the server's trio thread, between two awaits: a change is atomic for the
connections reading the rules (kproxy/server/live_rules.py's contract).
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import h11
import trio

from kproxy.admin.book import AdminError, RuleBook, error
from kproxy.metrics.exposition import accept_connections
from kproxy.server.logfmt import q

log = logging.getLogger("kproxy.admin")

MAX_BODY = 1024 * 1024
JSON = "application/json"
Reply = tuple[int, Any]


class AdminServer:
    """Serves the admin API for one :class:`RuleBook` on one address."""

    def __init__(self, book: RuleBook, *, token: str | None = None) -> None:
        self.book = book
        self._token = token.encode() if token else None
        self.port = 0

    async def serve(self, host: str, port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        log.info("event=admin_listening address=%s:%d auth=%s", host, self.port,
                 "bearer" if self._token else "none")
        task_status.started()
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                nursery.start_soon(self._accept, listener, nursery)

    async def _accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        await accept_connections(listener, nursery, self._handle, name="admin")

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(10):
                await self._exchange(stream)
        except (trio.BrokenResourceError, h11.RemoteProtocolError, OSError):
            pass  # the caller went away: nothing was changed for a request not read whole
        finally:
            await trio.aclose_forcefully(stream)

    async def _exchange(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = bytearray()
        too_large = False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                conn.receive_data(data)
                if not data and request is None:
                    return
                continue
            if isinstance(event, h11.Request):
                request = event
                if conn.they_are_waiting_for_100_continue:  # curl asks before sending a body over 1 KiB
                    await stream.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
            elif isinstance(event, h11.Data):
                if len(body) + len(event.data) > MAX_BODY:
                    too_large = True
                    break
                body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        if request is None:
            return
        if too_large:
            status, payload = 413, {"errors": [{"path": "(body)", "reason": f"over {MAX_BODY} bytes"}]}
        else:
            status, payload = self.respond(request.method.decode("latin-1"), request.target.decode("latin-1"),
                                           dict(request.headers), bytes(body))
        data = json.dumps(payload, indent=1).encode() + b"\n"
        headers = [("content-type", JSON), ("content-length", str(len(data))), ("connection", "close")]
        if status == 401:
            headers.append(("www-authenticate", 'Bearer realm="kproxy-admin"'))
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
        await stream.send_all(conn.send(h11.Data(data=data)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")

    # -- routing ------------------------------------------------------------------------
    def respond(self, method: str, target: str, headers: dict[bytes, bytes], body: bytes) -> Reply:
        """One request -> (status, JSON value). Never raises for a client's mistake."""
        if self._token is not None and not self._authorized(headers.get(b"authorization", b"")):
            return 401, {"errors": [{"path": "(auth)", "reason": "missing or wrong bearer token "
                                                                  "(Authorization: Bearer <token>)"}]}
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.strip("/").split("/")] if url.path.strip("/") else []
        try:
            value: Any = None
            if body:
                try:
                    value = json.loads(body)
                except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                    raise error(400, "(body)", f"not JSON: {exc}") from None
            return self._route(method, parts, parse_qs(url.query), value)
        except AdminError as exc:
            if exc.status >= 400 and method != "GET":
                log.info("event=admin_refused method=%s path=%s status=%d reason=%s", method, q(url.path),
                         exc.status, q(str(exc)[:300]))
            return exc.status, {"errors": exc.errors}

    def _authorized(self, header: bytes) -> bool:
        assert self._token is not None
        scheme, _, given = header.partition(b" ")
        # compare_digest on equal-type bytes: its time does not depend on where they differ.
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self._token)

    def _route(self, method: str, parts: list[str], query: dict[str, list[str]], body: Any) -> Reply:
        book = self.book
        match parts:
            case ["healthz"]:
                _only(method, "GET")
                return 200, {"status": "ok"}
            case ["rules"]:
                if method == "GET":
                    return 200, book.listing()
                if method == "POST":
                    rule = book.add(body)
                    return 201, {"generation": book.live.generation, "rule": book.get(rule.id)}
                if method == "PUT":
                    book.apply(body)
                    return 200, book.listing()
                raise _not_allowed(method, "GET, POST, PUT")
            case ["rules", rule_id]:
                if method == "GET":
                    return 200, book.get(rule_id)
                if method == "PUT":
                    _, created = book.put(rule_id, body)
                    return (201 if created else 200), {"generation": book.live.generation, "rule": book.get(rule_id)}
                if method == "PATCH":
                    enabled, dry_run = _state(body)
                    book.set_state(rule_id, enabled=enabled, dry_run=dry_run)
                    return 200, {"generation": book.live.generation, "rule": book.get(rule_id)}
                if method == "DELETE":
                    book.delete(rule_id)
                    return 200, {"generation": book.live.generation, "deleted": rule_id}
                raise _not_allowed(method, "GET, PUT, PATCH, DELETE")
            case ["rules", rule_id, ("enable" | "disable") as verb]:
                _only(method, "POST")
                book.set_state(rule_id, enabled=verb == "enable")
                return 200, {"generation": book.live.generation, "rule": book.get(rule_id)}
            case ["reset"]:
                _only(method, "POST")
                book.reset()
                return 200, book.listing()
            case ["faults"]:
                _only(method, "GET")
                limit = _int_param(query, "limit", 100, 1, 100_000)
                of_rule = query.get("rule", [None])[-1]
                return 200, {"faults": book.faults(limit, of_rule)}
        raise error(404, "(url)", "no such resource: try /rules, /rules/{id}, /reset, /faults (docs/ADMIN.md)")


def _only(method: str, allowed: str) -> None:
    if method != allowed:
        raise _not_allowed(method, allowed)


def _not_allowed(method: str, allowed: str) -> AdminError:
    return error(405, "(method)", f"{method} is not allowed here (allowed: {allowed})")


def _state(body: Any) -> tuple[bool | None, bool | None]:
    if not isinstance(body, dict) or not body:
        raise error(400, "(body)", 'expected {"enabled": true|false, "dry_run": true|false} (either or both)')
    unknown = sorted(set(body) - {"enabled", "dry_run"})
    if unknown:
        raise error(400, unknown[0], "unknown key: PATCH sets enabled and dry_run only (PUT replaces a rule)")
    out: list[bool | None] = []
    for key in ("enabled", "dry_run"):
        value = body.get(key)
        if value is not None and not isinstance(value, bool):
            raise error(400, key, f"must be true or false, got {value!r}")
        out.append(value)
    return out[0], out[1]


def _int_param(query: dict[str, list[str]], name: str, default: int, lo: int, hi: int) -> int:
    if name not in query:
        return default
    text = query[name][-1]
    try:
        value = int(text)
    except ValueError:
        raise error(400, name, f"must be an integer, got {text!r}") from None
    if not lo <= value <= hi:
        raise error(400, name, f"must be between {lo} and {hi}, got {value}")
    return value


__all__ = ["AdminServer"]
