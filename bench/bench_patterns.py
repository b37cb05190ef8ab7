"""In-process cost of rule patterns on the rules' hot path, per request, side by side across trees.

    .venv/bin/python bench/bench_patterns.py [DIR ...]

Rule patterns are RE2 (kproxy/rules/patterns.py): linear-time, but one call through the
``google-re2`` binding costs several times what ``re`` did. The engine matches a client id once per
client (its peer cache) and a group id, transactional id or topic once per distinct text (its
memo), so what a request pays depends on whether its text was seen before. This times
``RuleEngine.evaluate`` for each case (µs per request, median of 7 runs of 20,000 requests), and one
bare whole-text match, in this tree and in each ``DIR`` (another checkout, e.g. ``git archive
COMMIT | tar -x -C DIR``), each in a child process. Prints a Markdown table.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import timeit
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent

RULES = """\
rules:
  - id: g
    match: {api: heartbeat, group_id: "payments-.*"}
    actions: [{delay: {ms: 1}}]
  - id: t
    match: {api: produce, transactional_id: "tx-[0-9]+"}
    actions: [{delay: {ms: 1}}]
  - id: c
    match: {api: fetch, client_id: "batch-.*"}
    actions: [{delay: {ms: 1}}]
  - id: p
    match: {api: metadata, topic: {regex: "orders-audit(-v[0-9]+)?"}}
    actions: [{delay: {ms: 1}}]
"""
N = 20_000


def measure() -> dict[str, float]:
    """Run inside the tree under test (its kproxy first on sys.path)."""
    from kproxy.rules import RuleEngine, load_text
    from kproxy.rules.request_facts import StaticFacts

    rules = load_text(RULES)

    def facts(**kw: Any) -> Any:
        return StaticFacts(client_id=kw.pop("client_id", "c"), **kw)

    cases = {
        "group_id, the same id each request": [facts(api_key=12, api_version=4, group="payments-eu")] * N,
        "group_id, a new id each request": [facts(api_key=12, api_version=4, group=f"payments-{i}") for i in range(N)],
        "transactional_id, the same id": [facts(api_key=0, api_version=7, transactional="tx-42")] * N,
        "client_id, the same client": [facts(api_key=1, api_version=11, client_id="batch-loader")] * N,
        "client_id, a new client each request": [facts(api_key=1, api_version=11, client_id=f"batch-{i}")
                                                 for i in range(N)],
        "topic regex, the same topic": [facts(api_key=3, api_version=9,
                                              topic_partitions={"orders-audit-v2": frozenset({0})})] * N,
    }
    out: dict[str, float] = {}
    for name, requests in cases.items():
        runs = []
        for _ in range(7):
            engine = RuleEngine(rules)
            started = time.perf_counter()
            for request in requests:
                engine.evaluate(request)
            runs.append((time.perf_counter() - started) / len(requests) * 1e6)
        out[name] = statistics.median(runs)
    match = rules.rules[0].match.group_id
    assert match is not None
    fullmatch = match.fullmatch
    out["one whole-text match (the pattern alone)"] = min(
        timeit.repeat(lambda: fullmatch("payments-eu"), number=100_000, repeat=7)) / 100_000 * 1e6
    return out


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        sys.path.insert(0, sys.argv[2])
        print(json.dumps(measure()))
        return
    trees = [str(HERE), *sys.argv[1:]]
    results = {}
    for tree in trees:
        done = subprocess.run([sys.executable, __file__, "--worker", tree], capture_output=True, text=True,
                              check=True, cwd=tree)
        results[tree] = json.loads(done.stdout)
    print("| case (µs per request) | " + " | ".join(Path(t).name for t in trees) + " |")
    print("| --- |" + " --- |" * len(trees))
    for case in results[trees[0]]:
        print(f"| {case} | " + " | ".join(f"{results[t].get(case, float('nan')):.2f}" for t in trees) + " |")


if __name__ == "__main__":
    main()
