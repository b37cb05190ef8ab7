"""Entry point of ``kproxy analyze`` (and of ``spark-submit kproxy/analysis/main.py CAPTURE...``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TextIO

from kproxy.analysis.job import NoInput, run_analysis, spark_session
from kproxy.analysis.report import summary, write_html

EXIT_OK, EXIT_USAGE = 0, 2


def analyze(paths: list[str], *, master: str, out: str, stdout: TextIO, stderr: TextIO) -> int:
    """Run the job; 0 when something was analysed (inputs left out are listed), 2 when nothing could be."""
    def progress(stage: str) -> None:
        stderr.write(f"kproxy analyze: {stage}\n")
        stderr.flush()

    local = "://" not in out
    if local:
        Path(out).mkdir(parents=True, exist_ok=True)
    spark = spark_session(master)
    try:
        analysis = run_analysis(paths, out, spark, progress)
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("captures", nargs="+", metavar="CAPTURE",
                        help="capture directories or files (local paths, or any URI Spark reads)")
    parser.add_argument("--master", default="local[*]", metavar="URL",
                        help="Spark master (default local[*]: every core of this machine)")
    parser.add_argument("--out", default="kproxy-analysis", metavar="DIR",
                        help="where the Parquet aggregates and report.html go (default ./kproxy-analysis)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kproxy analyze")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return analyze(args.captures, master=args.master, out=args.out, stdout=sys.stdout, stderr=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
