"""Rule files for the benchmarks: loaded rules that never match, and one that always does.

The rules format is rules/README.md. Each set is text, written into a temporary
directory by the caller (bench_proxy.py's presets) or loaded directly
(bench_hotpath.py), so both benchmarks measure the same rules.
"""

from __future__ import annotations

# Every api the benchmarks send: a rule naming one of these is looked at per request (the
# engine's per-api index lets a rule on an api nobody sends cost nothing).
SENT_APIS = "[api_versions, metadata, produce, fetch, heartbeat]"
OTHER_APIS = ("list_offsets", "offset_commit", "offset_fetch", "find_coordinator", "join_group",
              "sync_group", "leave_group", "describe_groups", "init_producer_id", "add_partitions_to_txn")


def none_match(count: int = 100) -> str:
    """``count`` enabled rules that match no request the benchmarks send, mixed as a real file
    would be: a third on other apis, a third on the apis sent but for other client ids, a third
    on produce / fetch of other topics (which makes the engine read the request's topics)."""
    lines = ["seed: 7", "rules:"]
    for i in range(count):
        lines.append(f"  - id: never-{i:03d}")
        kind = i % 3
        if kind == 0:
            lines.append(f"    match: {{api: {OTHER_APIS[i % len(OTHER_APIS)]}}}")
        elif kind == 1:
            lines.append(f"    match: {{api: {SENT_APIS}, client_id: \"other-client-{i}-.*\"}}")
        else:
            lines.append(f"    match: {{api: [produce, fetch], topic: \"other-topic-{i}-*\"}}")
        lines.append("    actions: [{delay: {ms: 50}}]")
    return "\n".join(lines) + "\n"


def same_api_client_ids(count: int = 100) -> str:
    """``count`` rules on the apis sent that fail on the client id alone: the engine's worst
    common case before the topic scan (every rule is tried for every request)."""
    lines = ["seed: 7", "rules:"]
    for i in range(count):
        lines += [f"  - id: client-{i:03d}", f"    match: {{api: {SENT_APIS}, client_id: \"other-client-{i}-.*\"}}",
                  "    actions: [{delay: {ms: 50}}]"]
    return "\n".join(lines) + "\n"


def one_zero_delay() -> str:
    """One rule matching every request with a 0 ms delay: the whole decide path (engine match,
    verdict building, hit counters, the fault log's level check) and no effect on the traffic.
    The verdict comes out empty (nothing to hold), so the session forwards as usual."""
    return "seed: 7\nrules:\n  - id: zero-delay\n    match: {}\n    actions: [{delay: {ms: 0}}]\n"


PRESETS = {"none-match": none_match, "same-api-client-ids": same_api_client_ids, "one-zero-delay": one_zero_delay}
