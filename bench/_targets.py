"""bench_proxy.py's targets: kproxy against direct, the pipe and ``tansu proxy``; each feature's
cost over the variant without it; the A/A noise floor; everything on against the pipe.

Each function returns rows of a ``metric | measured | target | status`` table. Ratios between
variants are computed within a round (the same noise on both sides), then the median over rounds.
"""

from __future__ import annotations

import statistics

from _paths import AA, EVERYTHING, EVERYTHING_PURE, KPROXY, Hop
from _phases import Throughput
from _util import verdict

# (what, path, compared with, at most this much over it): the hot path's per-feature budgets.
FEATURE_BUDGETS = (
    ("metrics on", KPROXY, "kproxy no observer", 0.05),
    ("100 rules, none matching", "kproxy +100 rules", KPROXY, 0.05),
    ("1 matching 0 ms delay rule", "kproxy +1 matching rule", KPROXY, 0.10),
    ("capture on", "kproxy +capture", KPROXY, 0.10),
)

Rounds = dict[str, dict[str, list[float]]]  # phase label -> path name -> one figure per round


def median_ratio(a: list[float], b: list[float]) -> float:
    """Median over rounds of a[r] / b[r] (inf where b[r] is not positive)."""
    return statistics.median(x / y if y > 0 else float("inf") for x, y in zip(a, b, strict=True))


def cpu_per_gb(p: Hop) -> float | None:
    """CPU seconds of ``p``'s process per GB forwarded over the Produce and Fetch phases."""
    gb = (p.bytes_moved.get("produce", 0) + p.bytes_moved.get("fetch", 0)) / 1e9
    return (p.cpu_s.get("produce", 0.0) + p.cpu_s.get("fetch", 0.0)) / gb if gb else None


def latency_target_rows(ratios: dict[str, float]) -> list[list[str]]:
    """kproxy's added p50 over the pipe's (at most 1.2x) and over ``tansu proxy``'s (at most 0.6x)."""
    rows = []
    for what, ratio in ratios.items():
        target = 1.2 if what.endswith("pipe added p50") else 0.6
        rows.append([what, f"{ratio:.2f}x", f"<= {target}x", verdict(ratio <= target)])
    return rows


def throughput_target_rows(tp: Throughput) -> list[list[str]]:
    """kproxy's throughput: at least 90% of direct's, and twice ``tansu proxy``'s."""
    rows = []
    for label, rates in [*(("pipelined " + k, v) for k, v in tp.pipelined.items()), ("Produce", tp.produce),
                         ("Fetch", tp.fetch)]:
        share = rates[KPROXY] / rates["direct"]
        floor = f" (pipe: {100 * rates['pipe'] / rates['direct']:.1f}%)"
        rows.append([f"{label}: kproxy % of direct", f"{100 * share:.1f}%{floor}", ">= 90%", verdict(share >= 0.9)])
        if "tansu proxy" in rates:
            vs = rates[KPROXY] / rates["tansu proxy"]
            rows.append([f"{label}: kproxy / tansu proxy", f"{vs:.2f}x", ">= 2x", verdict(vs >= 2)])
    return rows


def feature_budget_rows(names: set[str], lat_rounds: Rounds, tp_rounds: Rounds) -> list[list[str]]:
    """Per feature of FEATURE_BUDGETS whose two variants ran: its added p50 and its throughput
    over the variant without it."""
    rows: list[list[str]] = []
    for what, path, base, budget in FEATURE_BUDGETS:
        if path not in names or base not in names:
            continue
        for label, added in lat_rounds.items():
            over = median_ratio(added[path], added[base]) - 1
            rows.append([f"{what}: {label}, added p50 over {base}", f"{100 * over:+.1f}%",
                         f"<= +{100 * budget:.0f}%", verdict(over <= budget)])
        for label, rates in tp_rounds.items():
            over = median_ratio(rates[base], rates[path]) - 1  # how much more time per unit of work
            rows.append([f"{what}: {label} throughput, over {base}", f"{100 * over:+.1f}%",
                         f"<= +{100 * budget:.0f}%", verdict(over <= budget)])
    return rows


def noise_floor_rows(lat_rounds: Rounds, tp_rounds: Rounds) -> list[list[str]]:
    """The A/A copy over plain kproxy: what two identical processes differ by in this run (no target)."""
    rows = []
    for label, added in lat_rounds.items():
        over = median_ratio(added[AA], added[KPROXY]) - 1
        rows.append([f"noise floor, an identical second kproxy: {label}, added p50 over {KPROXY}",
                     f"{100 * over:+.1f}%", "-", "(no target)"])
    for label, rates in tp_rounds.items():
        over = median_ratio(rates[KPROXY], rates[AA]) - 1
        rows.append([f"noise floor, an identical second kproxy: {label} throughput, over {KPROXY}",
                     f"{100 * over:+.1f}%", "-", "(no target)"])
    return rows


def tree_rows(trees: list[str], lat_rounds: Rounds, tp_rounds: Rounds) -> list[list[str]]:
    """This tree's kproxy over each other checkout's (``--kproxy-tree``: before/after in one run), each
    against a budget of the A/A noise floor of the same figure (its size, either way) plus 5 %: a
    change must cost less than two identical processes differ by, and 5 % more."""
    rows = []
    for tree in trees:
        for label, added in lat_rounds.items():
            over = median_ratio(added[KPROXY], added[tree]) - 1
            floor = abs(median_ratio(added[AA], added[KPROXY]) - 1)
            rows.append([f"{KPROXY} over {tree}: {label}, added p50", f"{100 * over:+.1f}%",
                         f"<= +{100 * (floor + 0.05):.1f}% (A/A {100 * floor:.1f}% + 5%)",
                         verdict(over <= floor + 0.05)])
        for label, rates in tp_rounds.items():
            over = median_ratio(rates[tree], rates[KPROXY]) - 1  # how much more time per unit of work
            floor = abs(median_ratio(rates[KPROXY], rates[AA]) - 1)
            rows.append([f"{KPROXY} over {tree}: {label} throughput", f"{100 * over:+.1f}%",
                         f"<= +{100 * (floor + 0.05):.1f}% (A/A {100 * floor:.1f}% + 5%)",
                         verdict(over <= floor + 0.05)])
    return rows


def cpu_per_request(p: Hop, phase: str) -> float | None:
    """CPU µs of ``p``'s process per request of a pipelined phase (over its rounds)."""
    n = p.requests.get(phase)
    return 1e6 * p.cpu_s[phase] / n if n else None


def everything_rows(by_name: dict[str, Hop], lat_rounds: Rounds, tp_rounds: Rounds,
                    name: str = EVERYTHING) -> list[list[str]]:
    """Every feature on (the variant ``name``: the compiled build, or the pure one) against the bare pipe
    (issue 26): added p50 (at most 1.1x), throughput (at least 90%), CPU per pipelined request (at most
    1.15x), CPU per GB forwarded (at most the pipe's + 10%)."""
    rows = []
    what = "everything on" if name == EVERYTHING else f"everything on ({name.removeprefix('kproxy everything, ')})"
    for label, added in lat_rounds.items():
        ratio = median_ratio(added[name], added["pipe"])
        rows.append([f"{what}: {label}, added p50 / pipe's", f"{ratio:.2f}x", "<= 1.1x", verdict(ratio <= 1.1)])
    for label, rates in tp_rounds.items():
        share = median_ratio(rates[name], rates["pipe"])
        rows.append([f"{what}: {label} throughput / pipe's", f"{100 * share:.1f}%", ">= 90%",
                     verdict(share >= 0.9)])
    for phase in [k for k in by_name["pipe"].requests if k.startswith("pipelined")]:
        ours_req, pipe_req = cpu_per_request(by_name[name], phase), cpu_per_request(by_name["pipe"], phase)
        if ours_req is not None and pipe_req is not None:
            ratio = ours_req / pipe_req
            rows.append([f"{what}: CPU µs per request, {phase} / pipe's",
                         f"{ours_req:.0f} / {pipe_req:.0f} = {ratio:.2f}x", "<= 1.15x", verdict(ratio <= 1.15)])
    ours, pipe = cpu_per_gb(by_name[name]), cpu_per_gb(by_name["pipe"])
    if ours is not None and pipe is not None:
        rows.append([f"{what}: CPU s per GB forwarded (Produce + Fetch), vs pipe's",
                     f"{ours:.2f} (pipe {pipe:.2f}, {100 * (ours / pipe - 1):+.0f}%)", "<= pipe +10%",
                     verdict(ours <= pipe * 1.1)])
    return rows


def feature_targets(paths: list[Hop], lat_rounds: Rounds, tp_rounds: Rounds) -> list[list[str]]:
    """The hot-path budget's rows: each feature's cost, the noise floor when the A/A copy ran,
    everything on against the pipe when both ran."""
    by_name = {p.name: p for p in paths}
    rows = feature_budget_rows(set(by_name), lat_rounds, tp_rounds)
    if AA in by_name:
        rows += noise_floor_rows(lat_rounds, tp_rounds)
        rows += tree_rows([p.name for p in paths if p.tree], lat_rounds, tp_rounds)
    for name in (EVERYTHING, EVERYTHING_PURE):
        if name in by_name and "pipe" in by_name:
            rows += everything_rows(by_name, lat_rounds, tp_rounds, name)
    return rows
