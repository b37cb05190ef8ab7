"""Entry point of ``kproxy analyze`` (and of ``spark-submit kproxy/analysis/main.py CAPTURE...``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from kproxy.analysis.arguments import EXACT_PERCENTILES_MAX, add_arguments, anomaly_flags
from kproxy.analysis.interval import check as check_interval
from kproxy.analysis.job import NoInput, find_inputs, run_analysis
from kproxy.analysis.report import live_summary, summary, write_html
from kproxy.analysis.spark_session import SparkNotStarted, java_problem, spark_session
from kproxy.analysis.whatif import WhatIfRules
from kproxy.rules.load import RulesError

EXIT_OK, EXIT_USAGE = 0, 2
FOLLOW_POLL_SECONDS = 1  # --follow: how soon after Ctrl-C the query is stopped (whole seconds: py4j)


def analyze(paths: list[str], *, master: str, out: str, stdout: TextIO, stderr: TextIO,
            follow: bool = False, conf: Sequence[str] = (), rules: str | None = None,
            seed: int | None = None, exact_percentiles: int = EXACT_PERCENTILES_MAX, verbose: bool = False,
            interval: int | None = None, anomalies: dict[str, Any] | None = None) -> int:
    """Run the job; 0 when something was analysed (inputs left out are listed), 2 when nothing could be
    or Java is missing. Every input is checked, and Java found, before Spark starts.

    ``follow``: stream over the one capture directory in ``paths`` until interrupted (Ctrl-C).
    ``conf``: Spark settings, ``KEY=VALUE`` each.
    ``exact_percentiles``: percentiles are exact up to that many records, approximate above.
    ``interval``: the time series' bin width in seconds (:mod:`kproxy.analysis.interval`); None: chosen
    from the capture's span.
    ``anomalies``: the client anomaly detectors' settings the flags give (:func:`anomaly_flags`; None
    values: not given, the capture's own then): the run's ``metrics.client_anomalies_*``.
    ``verbose``: Spark's progress bars and warnings on stderr too (else only this command's lines, and
    Spark's errors). A driver JVM that exits before it serves is exit 2, its own lines on stderr.
    ``rules``: a rule file to evaluate against the records (the what-if), ``seed`` replacing its
    ``seed``; a file the loader refuses is exit 2 with every problem as file:line: key: reason,
    before Spark starts.
    """
    settings = []
    for item in conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            stderr.write(f"kproxy analyze: --conf {item!r}: expected KEY=VALUE\n")
            return EXIT_USAGE
        settings.append((key, value))
    if interval is not None:
        try:
            check_interval(interval)
        except ValueError as exc:
            stderr.write(f"kproxy analyze: --interval: {exc}\n")
            return EXIT_USAGE
    given = anomalies or {}
    for name, least, above in (("rebalance_joins", 2, False), ("rebalance_window", 0, True),
                               ("churn_per_minute", 1, False), ("retries_per_minute", 1, False)):
        limit = given.get(name)
        if limit is not None and (limit <= least if above else limit < least):
            stderr.write(f"kproxy analyze: --{name.replace('_', '-')} {limit:g}: expected "
                         f"{'more than' if above else 'at least'} {least}\n")
            return EXIT_USAGE
    what_if = None
    if rules is not None:
        if follow:
            stderr.write("kproxy analyze: --rules does not combine with --follow\n")
            return EXIT_USAGE
        try:
            what_if = WhatIfRules.from_file(rules, seed)
        except RulesError as exc:
            for rule_problem in exc.problems:
                stderr.write(f"{rule_problem}\n")
            stderr.write(f"kproxy analyze: {rules}: rule file refused\n")
            return EXIT_USAGE
    elif seed is not None:
        stderr.write("kproxy analyze: --seed needs --rules\n")
        return EXIT_USAGE
    if follow:
        return _follow(paths, master=master, out=out, stdout=stdout, stderr=stderr, conf=settings, verbose=verbose)

    def progress(stage: str) -> None:
        stderr.write(f"kproxy analyze: {stage}\n")
        stderr.flush()

    progress("checking inputs")
    inputs = find_inputs(paths)
    if not inputs.files and not inputs.uris:
        for problem in inputs.problems:
            stderr.write(f"kproxy analyze: {problem}\n")
        stderr.write("kproxy analyze: no readable capture input\n")
        return EXIT_USAGE
    java = java_problem()
    if java is not None:
        stderr.write(f"kproxy analyze: {java}\n")
        return EXIT_USAGE
    local = "://" not in out
    if local:
        Path(out).mkdir(parents=True, exist_ok=True)
    try:
        spark = spark_session(master, settings, verbose=verbose)
    except SparkNotStarted as exc:
        stderr.write(f"kproxy analyze: Spark did not start ({exc}): the lines above say why\n")
        return EXIT_USAGE
    try:
        analysis = run_analysis(paths, out, spark, progress, rules=what_if, exact_percentiles_max=exact_percentiles,
                                inputs=inputs, interval=interval, anomalies=anomalies)
    except NoInput as exc:
        for problem in exc.problems:
            stderr.write(f"kproxy analyze: {problem}\n")
        stderr.write("kproxy analyze: no readable capture input\n")
        return EXIT_USAGE
    for problem in analysis.problems:
        stderr.write(f"kproxy analyze: skipped {problem}\n")
    report = os.path.join(out, "report.html")
    if local:
        write_html(analysis, report)
    summary(analysis, stdout)
    stdout.write(f"\nParquet aggregates in {out}/, report: {report}\n")
    return EXIT_OK


def _follow(paths: list[str], *, master: str, out: str, stdout: TextIO, stderr: TextIO,
            conf: Sequence[tuple[str, str]], verbose: bool) -> int:
    from kproxy.analysis.follow import LIVE_TABLE, follow

    if len(paths) != 1:
        stderr.write("kproxy analyze: --follow takes exactly one capture directory\n")
        return EXIT_USAGE
    if "://" not in paths[0] and not Path(paths[0]).is_dir():
        stderr.write(f"kproxy analyze: {paths[0]}: not a directory\n")
        return EXIT_USAGE

    java = java_problem()
    if java is not None:
        stderr.write(f"kproxy analyze: {java}\n")
        return EXIT_USAGE
    last: list[list[dict[str, Any]]] = []

    def on_batch(batch_id: int, rows: list[dict[str, Any]]) -> None:
        last[:] = [rows]
        stdout.write(f"batch {batch_id}: {len(rows)} minute/api rows in {os.path.join(out, LIVE_TABLE)}\n")
        stdout.flush()

    try:
        spark = spark_session(master, conf, verbose=verbose)
    except SparkNotStarted as exc:
        stderr.write(f"kproxy analyze: Spark did not start ({exc}): the lines above say why\n")
        return EXIT_USAGE
    # PySpark's own SIGINT handler cancels every job and raises inside the py4j call in progress
    # (tracebacks, exit 1): Ctrl-C only asks the loop below to stop the query.
    interrupted = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: interrupted.set())
    try:
        query = follow(spark, paths[0], out, on_batch=on_batch)
        while not interrupted.is_set() and not query.awaitTermination(FOLLOW_POLL_SECONDS):
            pass
        query.stop()
    finally:
        signal.signal(signal.SIGINT, previous)
    if last:
        live_summary(last[0], stdout)
    spark.stop()
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kproxy analyze")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return analyze(args.captures, master=args.master, out=args.out, stdout=sys.stdout, stderr=sys.stderr,
                   follow=args.follow, conf=args.conf, rules=args.rules, seed=args.seed,
                   exact_percentiles=args.exact_percentiles, verbose=args.verbose, interval=args.interval,
                   anomalies=anomaly_flags(args))


if __name__ == "__main__":
    sys.exit(main())
