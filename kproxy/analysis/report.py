"""What people read of an analysis: a console summary and one self-contained HTML file.

The HTML embeds its plots as PNG (:mod:`kproxy.analysis.plots`; each is also
written beside it, under ``plots/``) and its tables as plain HTML, so it can be
mailed or attached to a ticket as one file. Error codes carry their class
(routine, retriable, error).
"""

from __future__ import annotations

import base64
import html
import os
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from kproxy.analysis.interval import label
from kproxy.analysis.job import Analysis
from kproxy.analysis.log_histogram import BUCKETS_PER_OCTAVE, RELATIVE_ERROR
from kproxy.analysis.plots import plot_titles, plots
from kproxy.protocol.codes import error_class, error_name

_TABLES = (
    ("latency_by_api", "Latency per API (ms)"),
    ("errors", "Error codes by API (requests whose response carried the code)"),
    ("top_clients", "Top clients by bytes (frames: requests from the client, responses to it; record batches "
                    "produced and fetched, as kproxy_client_bytes_total counts them)"),
    ("by_cluster", "Traffic by cluster (the config's clusters:; empty for records written before the column)"),
    ("consumer_lag", "Consumer lag at the capture's end, per group and topic (as kproxy_consumergroup_lag_sum, "
                     "and in seconds as kproxy_consumergroup_lag_seconds, '-' where no write time was captured; "
                     "as it stood at its time: the end of the last interval an offset was answered in)"),
    ("top_topics", "Top topics"),
    ("hot_partitions", "Hot partitions (Produce + Fetch)"),
    ("connection_churn", "Connection churn per {per}"),
    ("faults", "Faults injected by rule (dry runs: matched, nothing done), and what the client did next on "
               "that connection"),
    ("client_anomalies", "Client anomalies by kind and client id (as kproxy_client_anomalies_total counts them, "
                         "with the run's settings)"),
)
_WHATIF_TABLES = (
    ("whatif_rules", "Per rule: requests it would have matched (of the captured requests of its apis), what it "
                     "would have done, first and last time"),
    ("whatif_by_api", "By api"),
    ("whatif_by_client", "By client id"),
    ("whatif_by_topic", "By topic (a request naming several topics counts for each)"),
    ("whatif_errors", "Errors it would have injected"),
)


def error_label(code: int) -> str:
    """``NOT_LEADER_OR_FOLLOWER (6)``: the name people search for, and the code clients log."""
    return f"{error_name(code)} ({code})"


APPROXIMATE = (f"from log-scale histograms ({BUCKETS_PER_OCTAVE} buckets a doubling): each within "
               f"{RELATIVE_ERROR:.1%} of the exact value, maxima exact")


def summary(analysis: Analysis, out: TextIO) -> None:
    """A few lines per aggregate: what a person reads in the terminal."""
    w = out.write
    w(f"{analysis.records} records from {analysis.files} capture input(s), {analysis.first} .. {analysis.last} UTC; "
      f"time series per {label(analysis.interval)}\n")
    for problem in analysis.problems:
        w(f"skipped {problem}\n")
    if not analysis.exact_percentiles:
        w(f"percentiles approximate: {APPROXIMATE}\n")
    w("\napi                        requests  broker p50/p99/max ms      kproxy p99 ms\n")
    for r in analysis.tables["latency_by_api"]:
        broker = "-" if r["broker_p50_ms"] is None else (
            f"{r['broker_p50_ms']:.2f}/{r['broker_p99_ms']:.2f}/{r['broker_max_ms']:.2f}")
        w(f"{r['api_name']:<26} {r['requests']:>9}  {broker:<26} {r['kproxy_p99_ms']:.3f}\n")
    errors = analysis.tables["errors"]
    if errors:
        w("\nerrors: " + ", ".join(f"{r['api_name']} {error_label(r['code'])} [{error_class(r['code'])}]: "
                                   f"{r['requests']} ({r['rate']:.1%})" for r in errors[:10]) + "\n")
    faults = analysis.tables["faults"]
    if faults:
        _faults_summary(faults, w)
    clients = analysis.tables["top_clients"]
    if clients:
        w("\nclient id                             bytes in / out (frames)      produced / fetched bytes  requests\n")
        for r in clients[:10]:
            w(f"{r['client_id'] or '-':<36} {r['request_bytes']:>12} / {r['response_bytes']:<12} "
              f"{r['produced_bytes']:>12} / {r['fetched_bytes']:<12} {r['requests']:>8}\n")
    lag = lag_at_end(analysis.tables["consumer_lag"])
    if lag:
        w("\ngroup / topic                                                 lag  partitions      lag s  at (UTC)\n")
        for r in lag[:10]:
            late = "-" if r["lag_seconds"] is None else f"{r['lag_seconds']:.1f}"
            w(f"{r['group_id'] + ' / ' + r['topic']:<56} {r['lag']:>11} {r['partitions']:>11} {late:>10}  "
              f"{r['time']}\n")
        if any(r["lag"] for r in lag) and all(r["lag_seconds"] is None for r in lag if r["lag"]):
            w("lag in seconds: no write times in the capture (files older than schema version 4, or no Produce "
              "answered through kproxy)\n")
    topics = analysis.tables["top_topics"]
    if topics:
        w("\ntopic                                requests    produced records / bytes     fetched records / bytes"
          "  errors\n")
        for r in topics[:10]:
            w(f"{r['topic']:<36} {r['requests']:>8} {r['produced_records']:>12} / {r['produced_bytes']:<12} "
              f"{r['fetched_records']:>11} / {r['fetched_bytes']:<12} {r['errors']:>6}\n")
    anomalies = analysis.tables["client_anomalies"]
    if anomalies or analysis.untold_anomalies:
        w("\nclient anomaly         client id                                  count\n")
        for r in anomalies[:20]:
            w(f"{r['kind']:<22} {r['client_id'] or '-':<42} {r['count']:>5}\n")
        if len(anomalies) > 20:
            w(f"... {len(anomalies) - 20} more (report.html, client_anomalies/)\n")
        for kind, why in sorted((analysis.untold_anomalies or {}).items()):
            w(f"{kind}: not told: {why}\n")
    if analysis.whatif is not None:
        _whatif_summary(analysis, w)


def lag_at_end(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last row of each (group, topic) of ``consumer_lag``: its lag when the capture ends, most
    behind first."""
    last: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:  # sorted by time: the later row wins
        last[(r["group_id"], r["topic"])] = r
    ranked = sorted(last.values(), key=lambda r: (-r["lag"], r["group_id"], r["topic"]))
    return [{"group_id": r["group_id"], "topic": r["topic"], "lag": r["lag"], "partitions": r["partitions"],
             "lag_seconds": r.get("lag_seconds"), "time": r["time"]} for r in ranked]


def live_summary(rows: Sequence[dict[str, Any]], out: TextIO) -> None:
    """``--follow``'s last table (per minute and api), summed per api: what was seen until it stopped."""
    per_api: dict[str, list[int]] = {}
    for r in rows:
        totals = per_api.setdefault(r["api_name"], [0, 0, 0, 0])
        for i, key in enumerate(("requests", "errors", "bytes", "records")):
            totals[i] += r[key] or 0
    minutes = sorted({r["minute"] for r in rows})
    span = f"{minutes[0]} .. {minutes[-1]} UTC" if minutes else "no records"
    out.write(f"\nlast update: {len(minutes)} minute(s), {span}\n")
    out.write("api                        requests    errors         bytes     records\n")
    for api, (requests, errors, size, records) in sorted(per_api.items(), key=lambda kv: -kv[1][0]):
        out.write(f"{api:<26} {requests:>9} {errors:>9} {size:>13} {records:>11}\n")


def _faults_summary(faults: Sequence[dict[str, Any]], w: Any) -> None:
    """One line per rule action (dry runs flagged): requests acted on per api, and what the
    clients did next."""
    per_action: dict[tuple[str, str, bool], dict[str, Any]] = {}
    for r in faults:
        entry = per_action.setdefault((r["rule"], r["action"], r["dry_run"]),
                                      {"requests": 0, "apis": defaultdict(int), "then": defaultdict(int)})
        entry["requests"] += r["requests"]
        entry["apis"][r["api_name"]] += r["requests"]
        entry["then"][r["then"]] += r["requests"]
    w("\nfaults injected by rule (what the client did next on that connection)\n")
    for (rule, action, dry_run), entry in per_action.items():
        apis = ", ".join(f"{n} {api}" for api, n in sorted(entry["apis"].items(), key=lambda kv: -kv[1]))
        then = ", ".join(f"{outcome} {n}" for outcome, n in sorted(entry["then"].items(), key=lambda kv: -kv[1]))
        w(f"{rule} ({action}{', dry run' if dry_run else ''}) on {apis}: then {then}\n")


def _whatif_summary(analysis: Analysis, w: Any) -> None:
    info = analysis.whatif
    assert info is not None
    w(f"\nwhat-if {info.source} (seed {info.seed}, {info.ordering} order): what each rule would have done\n")
    w("rule                          requests  of api's  conns  errors   delay ms  throttle ms  first .. last\n")
    errors: dict[str, list[str]] = defaultdict(list)
    for r in analysis.tables["whatif_errors"]:
        errors[r["rule"]].append(f"{error_label(r['error_code'])} x{r['requests']} on {r['api_name']}")
    for r in analysis.tables["whatif_rules"]:
        flag = " [dry run]" if r["dry_run"] else "" if r["enabled"] else " [disabled]"
        span = "-" if r["first"] is None else f"{r['first']} .. {r['last']}"
        w(f"{r['rule'] + flag:<29} {r['requests']:>8} {r['of_requests']:>9} {r['connections']:>6} {r['errors']:>7} "
          f"{r['delay_ms']:>10.1f} {r['throttle_ms']:>12.1f}  {span}\n")
        if errors[r["rule"]]:
            w(f"    injects {', '.join(errors[r['rule']])}\n")


def write_html(analysis: Analysis, path: str) -> None:
    parts = ["<!doctype html><meta charset='utf-8'><title>kproxy capture analysis</title>",
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}th{background:#eee}"
             "td:first-child{text-align:left}</style>",
             "<h1>kproxy capture analysis</h1>",
             f"<p>{analysis.records} records from {analysis.files} input(s), "
             f"{html.escape(str(analysis.first))} .. {html.escape(str(analysis.last))} UTC. Time series per "
             f"{label(analysis.interval)} (the tables' <code>interval_s</code>).</p>"]
    if not analysis.exact_percentiles:
        parts.append(f"<p>Percentiles approximate: {html.escape(APPROXIMATE)}.</p>")
    if analysis.problems:
        parts.append("<h2>Inputs left out</h2><ul>" + "".join(
            f"<li>{html.escape(str(p))}</li>" for p in analysis.problems) + "</ul>")
    span = (analysis.first, analysis.last) if isinstance(analysis.first, datetime) and isinstance(
        analysis.last, datetime) else None
    pictures = plots(analysis.tables, error_class, span, analysis.interval)
    titles = plot_titles(analysis.interval)
    plot_dir = os.path.join(os.path.dirname(path), "plots")
    os.makedirs(plot_dir, exist_ok=True)
    for name, png in pictures.items():
        with open(os.path.join(plot_dir, f"{name}.png"), "wb") as f:
            f.write(png)
        parts.append(f"<h2>{html.escape(titles[name])}</h2><img alt='{name}' src='data:image/png;base64,"
                     f"{base64.b64encode(png).decode()}'>")
    for name, title in _TABLES:
        rows = lag_at_end(analysis.tables[name]) if name == "consumer_lag" else analysis.tables[name]
        # (the bins' width is in the title: not a column repeated on every row)
        rows = [{k: v for k, v in r.items() if k != "interval_s"} for r in rows]
        title = title.format(per=label(analysis.interval))
        parts.append(f"<h2>{html.escape(title)}</h2>" + _table(_labelled(rows)))
        if name == "client_anomalies" and analysis.untold_anomalies:
            parts.append("<p>Not told:</p><ul>" + "".join(
                f"<li><code>{html.escape(kind)}</code>: {html.escape(why)}</li>"
                for kind, why in sorted(analysis.untold_anomalies.items())) + "</ul>")
    if analysis.whatif is not None:
        info = analysis.whatif
        parts.append(f"<h2>What-if: {html.escape(info.source)}</h2><p>Seed {info.seed}; requests evaluated in "
                     f"{info.ordering} order"
                     + (f" (rules with state shared by connections: {html.escape(', '.join(info.shared))})"
                        if info.shared else "")
                     + f"; time conditions count from the first captured request, "
                       f"{html.escape(str(info.start))} UTC. Dry-run rules are flagged: live, they only log.</p>")
        for name, title in _WHATIF_TABLES:
            parts.append(f"<h3>{html.escape(title)}</h3>" + _table(_labelled(analysis.tables[name])))
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))


def _table(rows: Sequence[dict[str, Any]]) -> str:
    if not rows:
        return "<p>none</p>"
    cols = list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r[c]))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _labelled(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with error codes shown by name and code (``code``, ``error_code`` columns)."""
    out = []
    for r in rows:
        r = dict(r)
        for key in ("code", "error_code"):
            if isinstance(r.get(key), int):
                if key == "code":
                    r["class"] = error_class(r[key])
                r[key] = error_label(r[key])
        if "error_code" in r:
            r.pop("error", None)  # the name is in the label now
        out.append(r)
    return out


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)
