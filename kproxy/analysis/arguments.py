"""The flags of ``kproxy analyze``, in one place for both ways in: the ``kproxy`` CLI and
``python -m kproxy.analysis.main`` / ``spark-submit`` of the same module. Needs no pyspark, so the
CLI can build its parser without the ``analysis`` extra installed."""

from __future__ import annotations

import argparse
from typing import Any

# Records up to which the job's latency percentiles are exact (kproxy.analysis.job says why not above).
EXACT_PERCENTILES_MAX = 1_000_000
# The rebalance storm's thresholds by default: the live detector's (metrics.client_anomalies_rebalance_joins
# and _window in kproxy.config.sections; tests/test_analysis_anomalies.py checks they agree).
REBALANCE_JOINS, REBALANCE_WINDOW = 50, 300.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("captures", nargs="+", metavar="CAPTURE",
                        help="capture directories or files (local paths, or any URI Spark reads)")
    parser.add_argument("--master", default="local[*]", metavar="URL",
                        help="Spark master (default local[*]: every core of this machine)")
    parser.add_argument("--out", default="kproxy-analysis", metavar="DIR",
                        help="where the Parquet aggregates and report.html go (default ./kproxy-analysis)")
    parser.add_argument("--follow", action="store_true",
                        help="keep per-minute aggregates up to date as the capture grows (Structured Streaming; "
                             "until Ctrl-C)")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting, e.g. spark.driver.memory=8g; repeatable")
    parser.add_argument("--exact-percentiles", type=int, default=EXACT_PERCENTILES_MAX, metavar="N",
                        help="latency percentiles are exact up to N records (default %(default)s); above, "
                             "approximate (log-scale histograms: within 2.2%% of the value, in bounded memory; "
                             "the report says so)")
    parser.add_argument("--rules", metavar="FILE",
                        help="what-if: evaluate this rule file against the captured requests, per rule "
                             "(an invalid file: exit 2, every problem listed)")
    parser.add_argument("--seed", type=int, metavar="N", help="with --rules: replaces the file's seed")
    parser.add_argument("--interval", type=int, metavar="SECONDS",
                        help="the time series' bin width: 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, "
                             "... seconds (default: chosen from the capture's span, at most 200 points: seconds "
                             "for a short capture, minutes for hours)")
    # The client anomaly detectors' settings: the capture records the run's (version 5); a flag overrides.
    recorded = "default: the capture's record of the run's setting, else "
    parser.add_argument("--rebalance-joins", type=int, metavar="N",
                        help="client anomalies: a group's JoinGroups within --rebalance-window that count as a "
                             f"rebalance storm, as metrics.client_anomalies_rebalance_joins ({recorded}"
                             f"{REBALANCE_JOINS})")
    parser.add_argument("--rebalance-window", type=float, metavar="SECONDS",
                        help="client anomalies: the rebalance storm's window, as "
                             f"metrics.client_anomalies_rebalance_window ({recorded}{REBALANCE_WINDOW:g})")
    parser.add_argument("--churn-per-minute", type=int, metavar="N",
                        help="client anomalies: connections of one client id closed within a minute that count as "
                             f"connection churn, as metrics.client_anomalies_churn_per_minute ({recorded}60)")
    parser.add_argument("--retries-per-minute", type=int, metavar="N",
                        help="client anomalies: batches of one client id sent again within a minute that count as "
                             f"a retry storm, as metrics.client_anomalies_retries_per_minute ({recorded}30)")
    parser.add_argument("--forbid-acks0", action=argparse.BooleanOptionalAction,
                        help="client anomalies: count Produce requests with acks=0 (acks0_producer), as "
                             "metrics.client_anomalies_forbid_acks0 (default: the capture's record of the run's "
                             "setting, else not told)")
    parser.add_argument("--require-compression", action=argparse.BooleanOptionalAction,
                        help="client anomalies: count Produce batches without compression (uncompressed_producer), "
                             "as metrics.client_anomalies_require_compression (default: the capture's record of "
                             "the run's setting, else not told)")
    parser.add_argument("--verbose", action="store_true",
                        help="let Spark write its progress bars and warnings to stderr (quiet by default: "
                             "stderr then holds kproxy analyze's own lines)")


# The flags above that set a client anomaly setting (kproxy.analysis.capture_anomalies.Settings' names).
ANOMALY_FLAGS = ("rebalance_joins", "rebalance_window", "churn_per_minute", "retries_per_minute", "forbid_acks0",
                 "require_compression")


def anomaly_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The client anomaly settings ``kproxy analyze``'s flags give, by name (None: not given)."""
    return {name: getattr(args, name) for name in ANOMALY_FLAGS}
