"""The mutation audit of docs/TESTING.md: put each deliberate bug into kproxy/, run the test modules
that should catch it, say which test failed first, and put the code back.

    .venv/bin/python scripts/mutation_audit.py            # every bug, a Markdown table on stdout
    .venv/bin/python scripts/mutation_audit.py 4 17       # some of them

Runs on the pure build (``KPROXY_PURE=1``: an edited module is what runs), one pytest process per bug
with ``-x``. A bug whose text is no longer in its file is reported as such (the code moved: the
audit's table needs the bug written again), never silently skipped. The tree is restored after each
bug, also when interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SASL = ("tests/test_sasl_scram.py", "tests/test_sasl_server.py", "tests/test_sasl_credentials.py",
        "tests/test_client_auth_session.py")
LAG = ("tests/test_lag_metrics.py", "tests/test_lag_seconds.py", "tests/test_offsets.py")
TRAFFIC = ("tests/test_metrics_traffic.py", "tests/test_scan_shared.py", "tests/test_offsets.py")
TOXICS = ("tests/test_wire_toxics.py", "tests/test_rules_toxics.py")


@dataclass(frozen=True)
class Bug:
    """One deliberate bug: in ``path``, the first ``old`` (after ``after``, when given) becomes ``new``."""

    number: int
    what: str
    path: str
    old: str
    new: str
    modules: tuple[str, ...]
    after: str = ""

    def apply(self, text: str) -> str | None:
        """``text`` with the bug in it; None when the code it changes is not there."""
        start = text.find(self.after) if self.after else 0
        at = text.find(self.old, start) if start >= 0 else -1
        if at < 0:
            return None
        return text[:at] + self.new + text[at + len(self.old):]


BUGS = (
    Bug(1, "SCRAM proof checked against the server key", "kproxy/sasl/scram.py",
        "signature = _hmac(cred.mechanism, cred.stored_key, auth_message)",
        "signature = _hmac(cred.mechanism, cred.server_key, auth_message)", SASL),
    Bug(2, "SCRAM iterations above Kafka's maximum accepted", "kproxy/sasl/scram.py",
        "if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:", "if not MIN_ITERATIONS <= iterations:", SASL),
    Bug(3, "PLAIN cache accepts a password after the stored hash changed", "kproxy/sasl/server.py",
        "return found is not None and found[0] == stored and hmac.compare_digest(",
        "return found is not None and hmac.compare_digest(", SASL),
    Bug(4, "PLAIN password length bound doubled", "kproxy/sasl/server.py",
        "if len(password) > PASSWORD_MAX:", "if len(password) > 2 * PASSWORD_MAX:", SASL),
    Bug(5, "SCRAM client-final nonce not checked", "kproxy/sasl/server.py",
        "if not hmac.compare_digest(attrs[1][2:].encode(), self._nonce.encode()):",
        "if not self._nonce.startswith(attrs[1][2:]):", SASL),
    Bug(6, "consumer lag off by one", "kproxy/metrics/consumer_lag.py",
        "lag = out.lag[gtp] = max(0, mark[0] - offset)", "lag = out.lag[gtp] = max(0, mark[0] - offset - 1)", LAG),
    Bug(7, "lag seconds from a timestamp read as centiseconds", "kproxy/metrics/consumer_lag.py",
        "wall - written_at(written[0], offset) / 1000)", "wall - written_at(written[0], offset) / 100)", LAG),
    Bug(8, "Produce bytes not counted per client", "kproxy/metrics/traffic.py",
        "tally = client.tallies[PRODUCE]\n                    tally.bytes += size\n",
        "tally = client.tallies[PRODUCE]\n", TRAFFIC),
    Bug(9, "batch size histogram off by one at a bound (one-batch Produce path)", "kproxy/metrics/traffic.py",
        "hist.counts[bisect_left(hist.bounds, size)] += 1\n                    hist.sum += size",
        "hist.counts[bisect_left(hist.bounds, size + 1)] += 1\n                    hist.sum += size", TRAFFIC),
    Bug(10, "limit_data: a piece of exactly the bytes left does not end the stream", "kproxy/toxics.py",
        "if len(data) >= self.left:", "if len(data) > self.left:", TOXICS),
    Bug(11, "slicer: slices of one size only", "kproxy/toxics.py",
        "size = draw(low, high) if high > low else low", "size = low", TOXICS),
    Bug(12, "topic split: selected partitions not counted", "kproxy/protocol/partition_split.py",
        "items[i] = visit(f.fields, item)\n                    count += 1", "items[i] = visit(f.fields, item)",
        ("tests/test_partition_split.py",)),
    Bug(13, "topic split: error message not set on the replaced entries", "kproxy/protocol/partition_split.py",
        "            entry[f.name] = message", "            pass", ("tests/test_partition_split.py",)),
    Bug(14, "leader epochs: the broker's equal epoch does not end the override", "kproxy/protocol/leader_epochs.py",
        "if epoch >= found.epoch or _recreated(found, topic_id):",
        "if epoch > found.epoch or _recreated(found, topic_id):",
        ("tests/test_leader_epochs.py",)),
    Bug(15, "leader epochs: a hint for another leader keeps the raised epoch", "kproxy/protocol/leader_epochs.py",
        "return found.epoch if leader == found.leader else epoch", "return found.epoch",
        ("tests/test_leader_epochs.py",)),
    Bug(16, "analysis lag: negative lag when a commit passes the watermark", "kproxy/analysis/capture_lag.py",
        "lag = max(0, mark - committed_at[key])", "lag = mark - committed_at[key]", ("tests/test_analysis_views.py",)),
    Bug(17, "analysis anomalies: the last deprecated version not flagged", "kproxy/analysis/capture_anomalies.py",
        'F.col("api_version") <= F.coalesce(', 'F.col("api_version") < F.coalesce(',
        ("tests/test_analysis_anomalies.py",)),
    Bug(18, "codec: Fetch response error_code from v8 instead of v7", "kproxy/protocol/_tables.py",
        "('error_code', 'int16', (7, 32767)", "('error_code', 'int16', (8, 32767)",
        ("tests/test_codec_crosscheck.py", "tests/test_codec_golden.py"), after="    (1, 1): ("),
)

# A short summary line: the test id (parameters may hold spaces), then " - " and the error.
_FAILED = re.compile(r"^FAILED (.+?)(?: - |$)", re.MULTILINE)
_ERROR = re.compile(r"^ERROR (.+?)(?: - |$)", re.MULTILINE)


def run(bug: Bug) -> tuple[str, float]:
    """The first test that failed with ``bug`` in the code (or why none could), and the seconds it took."""
    path = ROOT / bug.path
    text = path.read_text()
    mutated = bug.apply(text)
    if mutated is None:
        return f"the bug's code is not in {bug.path} any more: write it again", 0.0
    started = time.monotonic()
    try:
        path.write_text(mutated)
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-rfE", "-p", "no:randomly",
                               "-p", "no:cacheprovider", "--module-times=0", *bug.modules],
                              cwd=ROOT, env={**os.environ, "KPROXY_PURE": "1"}, capture_output=True, text=True,
                              timeout=1800, check=False)
    finally:
        path.write_text(text)
    took = time.monotonic() - started
    found = _FAILED.search(done.stdout) or _ERROR.search(done.stdout)
    if found:
        return f"`{found.group(1)}`", took
    if done.returncode == 0:
        return "**not caught**", took
    return f"pytest exited {done.returncode} without a failed test: {done.stdout[-300:]!r}", took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("numbers", type=int, nargs="*", help="the bugs to run (default: all)")
    args = parser.parse_args()
    chosen = [b for b in BUGS if not args.numbers or b.number in args.numbers]
    print("| # | bug (file) | tests run | caught by | seconds |")
    print("| --- | --- | --- | --- | --- |")
    missed = 0
    for bug in chosen:
        caught, took = run(bug)
        missed += not caught.startswith("`")
        modules = ", ".join(Path(m).name for m in bug.modules)
        print(f"| {bug.number} | {bug.what} (`{bug.path.removeprefix('kproxy/')}`) | {modules} | {caught} | "
              f"{took:.0f} |", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
