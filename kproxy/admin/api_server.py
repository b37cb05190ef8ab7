"""The admin API's HTTP side: JSON in and out, served by kproxy/http_server.py (as /metrics is).

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
    GET    /faults?limit=N&rule=ID   the most recent faults done, newest first, and the rules never fired since load
    GET    /healthz               {"status": "ok"}

Errors are ``{"errors": [{"path": ..., "reason": ..., "hint": ...}]}`` with 400 (invalid input,
JSON nested deeper than 32 levels or with a number over 40 characters: kproxy/admin/jsonbody.py),
401 (token), 404, 405, 409 (id taken), 413 (body over 1 MiB), 500 (a failure of kproxy's own:
logged as ``event=admin_error``; the process goes on), 503 (the rules kept changing under an edit).

Serving (kproxy/http_server.py): at most ``limits.max_http_connections`` connections open, the
request head within 5 s, the whole request within 10 s. Authentication: with a token configured,
every request needs ``Authorization: Bearer <token>`` (the scheme case-insensitive, per RFC 7235;
the token exact: no empty, prefix or suffixed token), compared in constant time
(:func:`hmac.compare_digest`) as soon as the head is in: without it, the answer is 401 and no byte
of the body is read. Without a token, the listener is on loopback (kproxy.config refuses anything
else at start).

Off the loop: decoding a body, planning an edit and building its rule set
(:meth:`RuleBook.edit`), building and encoding a listing all run in worker threads; only putting a
change in force and taking a snapshot run on the trio thread, between two awaits, so a change is
atomic for the connections reading the rules (kproxy/policy/live_rules.py's contract). Once a request
is read whole, its change is carried out and the answer says what happened, however long it takes.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import trio

from kproxy.admin import jsonbody
from kproxy.admin.book import (
    AdminError,
    Change,
    RuleBook,
    error,
    plan_add,
    plan_apply,
    plan_delete,
    plan_put,
    plan_reset,
    plan_set_state,
)
from kproxy.admin.listing import View, describe, listing, never_fired
from kproxy.http_server import HttpLimits, HttpServer, Request, Response
from kproxy.logfmt import q
from kproxy.offloop import off_loop_build

log = logging.getLogger("kproxy.admin")

MAX_BODY = 1024 * 1024
JSON = "application/json"
Reply = tuple[int, Any]
_UNAUTHORIZED = {"errors": [{"path": "(auth)", "reason": "missing or wrong bearer token "
                                                         "(Authorization: Bearer <token>)"}]}


class AdminServer:
    """Serves the admin API for one :class:`RuleBook` on one address."""

    def __init__(self, book: RuleBook, *, token: str | None = None, max_connections: int = 64) -> None:
        self.book = book
        self._token = token.encode() if token else None
        self.http = HttpServer("admin", self, HttpLimits(max_connections=max_connections, max_body=MAX_BODY),
                               log=log)

    @property
    def port(self) -> int:
        return self.http.port

    async def serve(self, host: str, port: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        await self.http.serve(host, port, details=f"auth={'bearer' if self._token else 'none'}",
                              task_status=task_status)

    # -- the HTTP server's handler --------------------------------------------------------
    def check(self, request: Request) -> Response | None:
        """The token, from the head alone: a request without it never has its body read."""
        if self._token is not None and not self._authorized(request.headers.get(b"authorization", b"")):
            return _json_response(401, _dumps(_UNAUTHORIZED))
        return None

    def error(self, status: int, reason: str) -> Response:
        return _json_response(status, _dumps({"errors": [{"path": "(request)", "reason": reason}]}))

    async def respond(self, request: Request) -> Response:
        status, payload = await self.answer(request.method, request.target, request.body)
        if isinstance(payload, View):  # a listing: built and encoded off the loop (it grows with the rules)
            view = payload
            return _json_response(status, await trio.to_thread.run_sync(_made_off_loop, lambda: listing(view)))
        if callable(payload):
            return _json_response(status, await trio.to_thread.run_sync(_made_off_loop, payload))
        return _json_response(status, _dumps(payload))

    # -- routing ------------------------------------------------------------------------
    async def answer(self, method: str, target: str, body: bytes) -> Reply:
        """One request -> (status, answer). The answer is a JSON value, a :class:`View` to list, or a
        function making the JSON value (both made off the loop). Never raises for a client's mistake."""
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.strip("/").split("/")] if url.path.strip("/") else []
        try:
            return await self._route(method, parts, parse_qs(url.query), _Body(body))
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

    async def _route(self, method: str, parts: list[str], query: dict[str, list[str]], body: _Body) -> Reply:
        book = self.book
        match parts:
            case ["healthz"]:
                _only(method, "GET")
                return 200, {"status": "ok"}
            case ["rules"]:
                if method == "GET":
                    return 200, book.view()
                if method == "POST":
                    return 201, self._rule_answer(await book.edit(lambda d: plan_add(d, body.json())))
                if method == "PUT":
                    await book.edit(lambda d: plan_apply(d, body.json()))
                    return 200, book.view()
                raise _not_allowed(method, "GET, POST, PUT")
            case ["rules", rule_id]:
                if method == "GET":
                    view = book.view()
                    rule = view.find(rule_id)
                    if rule is None:
                        raise error(404, "id", f"no rule {rule_id!r}")
                    return 200, lambda: describe(view, rule)
                if method == "PUT":
                    change = await book.edit(lambda d: plan_put(d, rule_id, body.json()))
                    return (201 if change.created else 200), self._rule_answer(change)
                if method == "PATCH":
                    return 200, self._rule_answer(await book.edit(lambda d: plan_set_state(d, rule_id,
                                                                                           *_state(body.json()))))
                if method == "DELETE":
                    change = await book.edit(lambda d: plan_delete(d, rule_id))
                    return 200, {"generation": change.generation, "deleted": change.rule_id}
                raise _not_allowed(method, "GET, PUT, PATCH, DELETE")
            case ["rules", rule_id, ("enable" | "disable") as verb]:
                _only(method, "POST")
                return 200, self._rule_answer(await book.edit(lambda d: plan_set_state(d, rule_id,
                                                                                       verb == "enable")))
            case ["reset"]:
                _only(method, "POST")
                await book.edit(plan_reset)
                return 200, book.view()
            case ["faults"]:
                _only(method, "GET")
                limit = _int_param(query, "limit", 100, 1, 100_000)
                of_rule = query.get("rule", [None])[-1]
                faults, view = book.faults(limit, of_rule), book.view()
                return 200, lambda: {"faults": faults, "never_fired": never_fired(view, of_rule)}
        raise error(404, "(url)", "no such resource: try /rules, /rules/{id}, /reset, /faults (docs/ADMIN.md)")

    def _rule_answer(self, change: Change) -> Callable[[], dict[str, Any]]:
        """The answer to an edit of one rule, as it is right after the edit went in force (the view is
        taken now, on the trio thread; the JSON is made off the loop)."""
        view = self.book.view()
        rule = change.rule
        assert rule is not None
        return lambda: {"generation": view.generation, "rule": describe(view, view.find(rule.id) or rule)}


class _Body:
    """A request's body, decoded (:func:`jsonbody.decode`) where it is first needed: inside an edit's
    planner, in the worker thread and in the edit's turn, so edits go in force in the order their
    requests were read, a big body's decoding included."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._decoded = False
        self._value: Any = None

    def json(self) -> Any:
        if not self._decoded:
            self._value = jsonbody.decode(self.raw) if self.raw else None
            self._decoded = True
        return self._value


def _made_off_loop(make: Callable[[], Any]) -> bytes:
    """An answer's JSON made and encoded in a worker thread, the loop served first meanwhile."""
    with off_loop_build():
        return _dumps(make())


def _dumps(value: Any) -> bytes:
    return json.dumps(value, indent=1).encode() + b"\n"


def _json_response(status: int, data: bytes) -> Response:
    headers = (("www-authenticate", 'Bearer realm="kproxy-admin"'),) if status == 401 else ()
    return Response(status, data, JSON, headers)


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
