"""Fuzz targets of the rules loader: rule files as YAML text, and the admin API's JSON bodies.

``rules_yaml``: the first byte of an input picks one file (bit 0 clear) or a directory of
files (bit 0 set: the rest is cut at :data:`FILE_SEPARATOR` into up to four files,
``00.yaml``...), loaded as ``kproxy run --rules PATH`` loads them
(:func:`kproxy.rules.sources.load_path`). Only a :class:`~kproxy.rules.RuleSet` or a
:class:`~kproxy.rules.RulesError` may come out, each problem printed ``file:line: key: reason``
with a line inside the file; a rule set loaded must also build its injector (what a reload puts
in force) and let one connection's requests through it (:func:`meet_requests`: matching, every
action, response edits) with no exception and within the per-input time bound.

``rules_json``: the first byte picks a route (``PUT /rules``, ``POST /rules``,
``PUT /rules/{id}``, ``PATCH /rules/{id}``), the rest is the request's body, answered by
:meth:`kproxy.admin.api_server.AdminServer.respond` over a :class:`~kproxy.admin.book.RuleBook`
with one file rule in force (:func:`answer`). Only the book's refusals (an ``AdminError``, answered 4xx) or a
success may come out: an exception, a 5xx or an answer that is not JSON is a finding.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.fuzz.targets.registry import target

ROOT = Path(__file__).resolve().parents[3]
FILE_SEPARATOR = b"\n#8<\n"  # cuts a directory input into its files
MAX_FILES = 4

# Rules covering every match key and action, in the file format (each also a JSON body seed).
SAMPLE_RULES: list[dict[str, Any]] = [
    {"id": "errors", "description": "d", "enabled": True, "continue": True, "dry_run": False, "seed": 7,
     "match": {"api": ["produce", 1], "api_version": {"min": 3, "max": 9}, "client_id": "app-.*",
               "client_address": ["10.0.0.0/8", "::1"], "broker_id": [1, 2],
               "topic": ["orders-*", {"regex": "pay(ment)?s"}],
               "partition": [0, 1], "acks": ["all", 1], "probability": 0.5,
               "schedule": {"after_requests": 2, "first": 5, "every": 2, "after_seconds": 1, "for_seconds": 60,
                            "window": {"start": "22:00", "end": "02:00"}}},
     "actions": [{"inject_error": {"error": "NOT_LEADER_OR_FOLLOWER", "partitions": [0], "message": "m",
                                   "mode": "replace"}}]},
    {"id": "groups", "match": {"api": "join_group", "group_id": "g-[0-9]+", "transactional_id": "t.*"},
     "actions": [{"delay": {"ms": 20, "jitter_ms": 5, "distribution": "uniform"}}, "drop_response"]},
    {"id": "throttle", "match": {}, "actions": [{"throttle": {"bytes_per_second": 1048576, "burst_seconds": 0.1}}]},
    {"id": "rps", "match": {"api": "fetch"},
     "actions": [{"throttle": {"requests_per_second": 100, "scope": "client_id"}}]},
    {"id": "close", "match": {"api": "metadata"}, "actions": ["close_connection"]},
    {"id": "reset", "match": {"api": "metadata"}, "actions": ["reset_connection"]},
    {"id": "hole", "match": {"api": "heartbeat"}, "actions": ["blackhole"]},
    {"id": "slow", "match": {"api": "heartbeat"}, "actions": [{"slow_close": {"delay_ms": 100}}]},
    {"id": "crc", "match": {"api": "fetch", "topic": "events"}, "actions": [{"corrupt_records": {"target": "crc"}}]},
    {"id": "value", "match": {"api": "produce"}, "actions": [{"corrupt_records": {"target": "value"}}]},
    {"id": "dup", "match": {"api": "fetch"}, "actions": [{"duplicate_records": {"copies": 2}}]},
    {"id": "schema", "match": {"api": "fetch"}, "actions": [{"invalid_schema_id": {"schema_id": 999999}}]},
    {"id": "addr", "match": {"api": "metadata"}, "actions": [{"rewrite_addresses": {"map": {"b1:9092": "b2:9092"}}}]},
    {"id": "addr-re", "match": {"api": "metadata"},
     "actions": [{"rewrite_addresses": {"pattern": "b([0-9]+)", "replacement": "x\\1"}}]},
    {"id": "meta", "match": {"api": "metadata"},
     "actions": [{"mutate_metadata": {"hide_brokers": 2, "hide_partitions": [{"topic": "t", "partition": 1}],
                                      "move_leader": [{"topic": "t", "partition": 0, "to": 1}],
                                      "shrink_isr": [{"topic": "t", "partition": 1, "to": [2]}]}}]},
    {"id": "down", "match": {"api": "api_versions"},
     "actions": [{"downgrade_api_versions": {"produce": 7, "fetch": 11}}]},
    {"id": "rewrite", "match": {"api": "produce"},
     "actions": [{"rewrite": {"direction": "request", "set": {"acks": 1, "topic_data[].name": "renamed"},
                              "topic_prefix": {"old-": "new-"}}}]},
    {"id": "rewrite-map", "match": {"api": "produce"},
     "actions": [{"rewrite": {"map": {"topic_data[].name": {"a": "b"}}}}]},
]


def _rule_files() -> Iterator[str]:
    """The project's own rule files: the examples and the README's format block."""
    for path in sorted((ROOT / "rules" / "examples").glob("*.yaml")):
        yield path.read_text(encoding="utf-8")
    readme = (ROOT / "rules" / "README.md").read_text(encoding="utf-8")
    for block in readme.split("```yaml\n")[1:]:
        yield block.split("```", 1)[0]


def _rules_yaml_seeds() -> Iterator[bytes]:
    import yaml

    files = [text.encode() for text in _rule_files()]
    sample = yaml.safe_dump({"seed": 3, "rules": SAMPLE_RULES}, sort_keys=False).encode()
    files.append(sample)
    files.append(b"rules:\n  - id: a\n    match: {topc: x}\n    actions: [{delay: {ms: soon}}]\n")  # problems
    files.append(b"rules: []\n")
    for text in files:
        yield b"\x00" + text
    # Directories: two files that merge, and two that clash (same id, different seeds).
    yield b"\x01" + files[0] + FILE_SEPARATOR + sample
    clash = b"seed: 3\nrules:\n- {id: a, match: {}, actions: [blackhole]}\n"
    yield b"\x01" + clash + FILE_SEPARATOR + clash.replace(b"seed: 3", b"seed: 4")
    yield b"\x01"  # an empty directory


class _Scratch:
    """One directory per fuzzing process, emptied and refilled per input (cheap on a tmpfs or page cache)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="kproxy-fuzz-rules-"))
        atexit.register(shutil.rmtree, self.root, True)

    def fill(self, files: list[bytes]) -> Path:
        directory = self.root / "rules.d"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        for i, data in enumerate(files):
            (directory / f"{i:02d}.yaml").write_bytes(data)
        return directory


_SCRATCH: list[_Scratch] = []


def _scratch() -> _Scratch:
    if not _SCRATCH:
        _SCRATCH.append(_Scratch())
    return _SCRATCH[0]


@target(_rules_yaml_seeds, warm=True)
def fuzz_rules_yaml(data: bytes) -> None:
    """Rule files and directories: only RulesError (file:line) or a RuleSet that builds and meets traffic."""
    from kproxy.metrics.fault_stats import FaultStats
    from kproxy.policy.injector import FaultInjector
    from kproxy.rules import RulesError, RuleSet
    from kproxy.rules.sources import load_path

    if not data:
        return
    body = data[1:]
    files = body.split(FILE_SEPARATOR)[:MAX_FILES] if data[0] & 1 else [body]
    if data[0] & 1 and not body:
        files = []
    directory = _scratch().fill(files)
    path = str(directory) if data[0] & 1 else os.path.join(directory, "00.yaml")
    try:
        rules = load_path(path)
    except RulesError as exc:
        assert exc.problems, "a RulesError with no problem"
        # YAML breaks lines at \r, \x85, \u2028 too: splitlines() counts those (and a few more: a bound).
        lines = {f"{i:02d}.yaml": len(f.decode("utf-8", "replace").splitlines()) + 1 for i, f in enumerate(files)}
        for problem in exc.problems:
            assert isinstance(problem.line, int) and problem.line >= 0, f"problem without a line: {problem}"
            name = os.path.basename(problem.file)
            if name in lines:
                assert problem.line <= lines[name], f"line {problem.line} past the file's end: {problem}"
            assert str(problem).startswith(f"{problem.file}:{problem.line}: "), "not file:line: key: reason"
        return
    assert isinstance(rules, RuleSet)
    FaultInjector(rules, counts=FaultStats(), register=False)
    meet_requests(rules)


HOSTILE_TEXT = "a" * 23 + "!"  # a backtracking (a+)+$ takes ~2 s on it with re (4x per "a" more): over the bound
_TRAFFIC: list[tuple[bytes, bytes]] = []


def _traffic() -> list[tuple[bytes, bytes]]:
    """(request, response) whole frames every rule kind can act on: Produce and Fetch with records,
    Metadata, ApiVersions, JoinGroup; client id, group id, transactional id and a topic all
    :data:`HOSTILE_TEXT`."""
    if _TRAFFIC:
        return _TRAFFIC
    from kproxy.protocol.frame_builder import request_frame, response_frame
    from tests.fuzz.targets.capture import fetch_frames, produce_frames, records_fields

    records = next(r for magic, r in records_fields() if magic == 2)
    brokers = [{"node_id": 1, "host": "b1.internal", "port": 9092}]
    topics = [{"name": "orders", "partitions": [{"partition_index": 0, "leader_id": 1, "replica_nodes": [1],
                                                 "isr_nodes": [1]}]}]
    out = [produce_frames(9, 1, records), fetch_frames(12, 2, records),
           (request_frame(3, 12, 3, client_id=HOSTILE_TEXT, topics=[{"name": HOSTILE_TEXT}]),
            response_frame(3, 12, 3, brokers=brokers, topics=topics)),
           (request_frame(18, 3, 4, client_software_name="k", client_software_version="1"),
            response_frame(18, 3, 4, api_keys=[{"api_key": 0, "min_version": 0, "max_version": 11}])),
           (request_frame(11, 7, 5, client_id=HOSTILE_TEXT, group_id=HOSTILE_TEXT, member_id="",
                          protocol_type="consumer"),
            response_frame(11, 7, 5, member_id="m"))]
    transactional = request_frame(0, 9, 6, client_id=HOSTILE_TEXT, transactional_id=HOSTILE_TEXT, acks=-1,
                                  timeout_ms=1000, topic_data=[{"name": HOSTILE_TEXT, "partition_data": [
                                      {"index": 0, "records": records}]}])
    out.append((transactional, produce_frames(9, 6, records)[1]))
    out += [produce_frames(9, 7, records), fetch_frames(12, 8, records)]  # again: throttles charge the 2nd
    _TRAFFIC.extend(out)
    return _TRAFFIC


def meet_requests(rules: Any) -> None:
    """One connection under ``rules`` (a real Session and its rule policy) meets :func:`_traffic`:
    no exception, whatever the rules do (answer, delay, edit, close); timers fired at once."""
    from kproxy.metrics.fault_stats import FaultStats
    from kproxy.policy.live_rules import LiveRules
    from kproxy.proxy.address_rewrite import ResponseRewriter
    from kproxy.proxy.addresses import AddressMap
    from kproxy.proxy.commands import CloseConnection, ForwardUpstream, WakeAt
    from kproxy.proxy.session import Session

    live = LiveRules(rules, counts=FaultStats())
    now = [0.0]
    session = Session(ResponseRewriter(AddressMap("kproxy.test", 40000)), clock=lambda: now[0],
                      policy=live.policy("10.1.2.3:5555", broker_id=1))
    for request, response in _traffic():
        commands = session.receive_client(request, now[0])
        while True:
            if any(isinstance(c, CloseConnection) for c in commands):
                return
            wakes = [c.when for c in commands if isinstance(c, WakeAt)]
            forwarded = any(isinstance(c, ForwardUpstream) for c in commands)
            if forwarded:
                commands = session.receive_upstream(response)
                continue
            if not wakes:
                break
            now[0] = max(now[0], min(wakes))
            commands = session.on_timer(now[0])
        now[0] += 1.0


# -- the admin API's JSON bodies -------------------------------------------------------------------
ROUTES = (("PUT", "/rules"), ("POST", "/rules"), ("PUT", "/rules/base"), ("PATCH", "/rules/base"))
BASE_RULE = "rules:\n  - id: base\n    match: {api: produce}\n    actions: [drop_response]\n"
_OK = frozenset({200, 201})
_REFUSED = frozenset({400, 404, 405, 409, 413})


def _rules_json_seeds() -> Iterator[bytes]:
    import yaml

    for text in _rule_files():
        yield b"\x00" + json.dumps(yaml.safe_load(text), default=str).encode()
    yield b"\x00" + json.dumps({"seed": 3, "rules": SAMPLE_RULES}).encode()
    for i, rule in enumerate(SAMPLE_RULES):
        yield b"\x01" + json.dumps(rule).encode()
        if i % 3 == 0:
            yield b"\x02" + json.dumps({k: v for k, v in rule.items() if k != "id"}).encode()
    yield b"\x03" + json.dumps({"enabled": False, "dry_run": True}).encode()
    yield b"\x03" + b'{"enabled": 1}'
    yield b"\x00" + b'{"rules": [{"id": "x", "match": {"probability": 1e999}, "actions": ["blackhole"]}]}'


def answer(server: Any, method: str, url: str, body: bytes) -> tuple[int, Any]:
    """(status, JSON value) of one admin request, read whole, through the server's own handler.

    Two shapes of the handler are known: ``respond(method, target, headers, body)`` answering
    ``(status, value)`` on the caller's thread, and the shared HTTP server's ``async
    respond(Request) -> Response`` (encoded JSON; work off the loop), run in a trio run of its own.
    """
    import inspect

    if not inspect.iscoroutinefunction(server.respond):
        status, value = server.respond(method, url, {}, body)
        return status, value
    import trio

    from kproxy.http_server import Request  # type: ignore[import-not-found,unused-ignore]

    response = trio.run(server.respond, Request(method=method, target=url, headers={}, body=body))
    try:
        return response.status, json.loads(response.body)
    except ValueError:
        raise AssertionError(f"{method} {url} answered {response.status}, not JSON: {response.body[:200]!r}"
                             ) from None


@target(_rules_json_seeds, warm=True)
def fuzz_rules_json(data: bytes) -> None:
    """Admin API JSON bodies (PUT/POST /rules, PUT/PATCH /rules/{id}): a 2xx or a 4xx refusal, never an error."""
    from kproxy.admin.api_server import AdminServer
    from kproxy.admin.book import RuleBook
    from kproxy.metrics.fault_stats import FaultStats
    from kproxy.policy.live_rules import LiveRules
    from kproxy.rules.load import load_text

    if not data:
        return
    method, url = ROUTES[data[0] % len(ROUTES)]
    live = LiveRules(load_text(BASE_RULE, "rules.yaml"), counts=FaultStats(), mutable=True)
    status, payload = answer(AdminServer(RuleBook(live)), method, url, data[1:])
    assert status in _OK or status in _REFUSED, f"{method} {url} answered {status}: {payload!r:.300}"
    json.dumps(payload)  # the server sends it as JSON: it must be plain data
    if status in _REFUSED:
        errors = payload.get("errors") if isinstance(payload, dict) else None
        assert errors and all(isinstance(e, dict) and "path" in e and "reason" in e for e in errors), (
            f"a refusal without its errors: {payload!r:.300}")
