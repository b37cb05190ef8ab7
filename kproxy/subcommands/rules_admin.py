"""``kproxy rules list|apply|add|enable|disable|delete|reset|faults``: a running kproxy's rules,
through its admin API (docs/ADMIN.md) and :class:`kproxy.admin.api_client.AdminClient`.

Contract of every command: exit 0 when done; 2 when the input cannot be read or kproxy refuses
(each problem on its own line of stderr: ``file:line: path: reason`` for a rule file, as
``kproxy rules check`` prints it, ``path: reason (hint)`` for kproxy's refusals); 1 when kproxy
cannot be reached. The API is found at ``--admin`` (a URL or ``HOST:PORT``), else
``$KPROXY_ADMIN``, else ``$KPROXY_ADMIN_URL`` (its older name), else ``http://127.0.0.1:9901``.

Rule files are loaded here, by the loader ``kproxy run --rules`` and ``kproxy rules check`` use
(:func:`kproxy.rules.sources.load_path_data`: a file, or a directory merged), before anything is
sent: kproxy, given parsed data and not the file, could only number the lines of that data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kproxy.admin.api_client import AdminClient

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_UNREACHABLE = 1

_EPILOG = """\
Talks to the admin API of a running kproxy (served with kproxy run --admin-listen).
Exit 0 when done; 2 when a rule file has problems (printed as kproxy rules check prints
them) or kproxy refuses (each problem printed as path: reason); 1 when kproxy cannot be
reached. --admin takes a URL or HOST:PORT (as --admin-listen does); without it,
KPROXY_ADMIN (or KPROXY_ADMIN_URL), else http://127.0.0.1:9901. The token may also come
from KPROXY_ADMIN_TOKEN.
"""

_RULES_OPERAND = "rule file (YAML or JSON), or a directory of them merged as kproxy run --rules DIR merges them"

# name, summary, operand (None, "FILE" or "ID")
_COMMANDS: tuple[tuple[str, str, str | None], ...] = (
    ("list", "list the rules in force, their state and hits", None),
    ("apply", "replace every rule with those of a rule file or directory", "FILE"),
    ("add", "add each rule of a rule file or directory, after the rules in force", "FILE"),
    ("enable", "enable one rule", "ID"),
    ("disable", "disable one rule", "ID"),
    ("delete", "delete one rule", "ID"),
    ("reset", "return to the rules of kproxy's rule file (none without one)", None),
    ("faults", "print the most recent faults done (dry runs included), newest first", None),
)


def add_admin_commands(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the admin commands under ``kproxy rules``."""
    for name, summary, operand in _COMMANDS:
        parser = actions.add_parser(name, help=f"{summary} (running kproxy)", description=summary[0].upper()
                                    + summary[1:] + ", through a running kproxy's admin API.",
                                    epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        if operand is not None:
            parser.add_argument("operand", metavar=operand, help=_RULES_OPERAND if operand == "FILE" else "rule id")
        parser.add_argument("--admin", metavar="URL", default=default_admin(),
                            help="the admin API: http://HOST:PORT or HOST:PORT (default: $KPROXY_ADMIN, "
                                 "else $KPROXY_ADMIN_URL, else http://127.0.0.1:9901)")
        token = parser.add_mutually_exclusive_group()
        token.add_argument("--token", metavar="TOKEN", default=os.environ.get("KPROXY_ADMIN_TOKEN"),
                           help="bearer token (default: $KPROXY_ADMIN_TOKEN)")
        token.add_argument("--token-file", type=Path, metavar="FILE", help="file holding the bearer token")
        if name in ("list", "faults"):
            parser.add_argument("--json", action="store_true", help="print the API's JSON as is")
        if name == "add":
            parser.add_argument("--replace", action="store_true",
                                help="replace a rule whose id is in force, in place (PUT /rules/ID), "
                                     "rather than refuse it (POST /rules)")
        if name == "faults":
            parser.add_argument("--rule", metavar="ID", help="only the faults of this rule")
            parser.add_argument("--limit", type=_limit, default=100, metavar="N",
                                help="at most N faults (default 100; kproxy keeps the last 1,000)")
        parser.set_defaults(handler=run_admin_command)


def default_admin() -> str:
    """Where the admin commands go without ``--admin``: like Toxiproxy's CLI, the local API."""
    from kproxy.admin.api_client import DEFAULT_URL

    return os.environ.get("KPROXY_ADMIN") or os.environ.get("KPROXY_ADMIN_URL") or DEFAULT_URL


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1 <= value <= 100_000:  # the API's own bounds (kproxy/admin/api_server.py)
        raise argparse.ArgumentTypeError(f"must be from 1 to 100000, got {value}")
    return value


def run_admin_command(args: argparse.Namespace) -> int:
    """Run ``kproxy rules <args.rules_command>`` against the admin API; returns the exit status."""
    from kproxy.admin.api_client import AdminClient, AdminRefused, AdminUnreachable, format_error

    command = f"kproxy rules {args.rules_command}"
    token = args.token
    if args.token_file is not None:
        try:
            token = args.token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            print(f"{command}: cannot read {args.token_file}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    client = AdminClient(args.admin, token=token or None)
    try:
        if args.rules_command == "list":
            listing = client.rules()
            print(json.dumps(listing, indent=2) if args.json else rules_table(listing))
        elif args.rules_command == "faults":
            report = client.faults_report(args.limit, args.rule)
            print(json.dumps(report, indent=2) if args.json
                  else faults_text(report["faults"], report.get("never_fired")))
        elif args.rules_command in ("apply", "add"):
            data = _read_rules(command, args.operand)
            if data is None:
                return EXIT_USAGE
            if args.rules_command == "add":
                return _add_rules(command, client, data["rules"], replace=args.replace)
            done = client.apply(data)
            print(f"{args.operand}: {len(done['rules'])} rules in force (generation {done['generation']})")
        elif args.rules_command == "reset":
            done = client.reset()
            print(f"reset to {done['file'] or 'no rules'}: {len(done['rules'])} rules in force "
                  f"(generation {done['generation']})")
        else:
            call = {"enable": client.enable, "disable": client.disable, "delete": client.delete}[args.rules_command]
            done = call(args.operand)
            print(f"{args.operand}: {args.rules_command}d (generation {done['generation']})")
    except AdminRefused as exc:
        for entry in exc.errors:
            print(format_error(entry), file=sys.stderr)
        return EXIT_USAGE
    except AdminUnreachable as exc:
        print(f"{command}: cannot reach kproxy: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return EXIT_OK


def _read_rules(command: str, path: str) -> dict[str, Any] | None:
    """The rules of a rule file or directory as the admin API takes them, or None after printing
    every problem, each at its ``file:line`` as ``kproxy rules check`` prints it."""
    from kproxy.rules import RulesError
    from kproxy.rules.sources import load_path_data

    try:
        return load_path_data(path)[1]
    except RulesError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"{command}: {path}: nothing sent to kproxy", file=sys.stderr)
        return None


def _add_rules(command: str, client: AdminClient, rules: list[dict[str, Any]], *, replace: bool) -> int:
    """Add (or with ``replace``, put) each rule in turn, one request each, printing each as done.
    A refusal stops there: the rules added before it stay (each was a change of its own), and the
    message says which they are."""
    from kproxy.admin.api_client import AdminRefused, format_error

    done_ids: list[str] = []
    for i, rule in enumerate(rules):
        try:
            done = client.put(rule) if replace else client.add(rule)
        except AdminRefused as exc:
            for entry in exc.errors:
                print(f"rules[{i}] ({rule.get('id')}): {format_error(entry)}", file=sys.stderr)
            print(f"{command}: stopped at rule {rule.get('id')!r}; added before it: "
                  f"{', '.join(done_ids) or 'none'}", file=sys.stderr)
            return EXIT_USAGE
        done_ids.append(str(rule.get("id")))
        print(f"{rule.get('id')}: {'put' if replace else 'added'} (generation {done['generation']})")
    return EXIT_OK


def rules_table(listing: dict[str, object]) -> str:
    """The listing of ``GET /rules`` as a header line and a table, one row per rule."""
    rules = listing.get("rules")
    age = listing.get("age_seconds")
    lines = [f"generation {listing.get('generation')}  origin {listing.get('origin')}  "
             f"diverged from file: {'yes' if listing.get('diverged') else 'no'}"
             + (f"  loaded {duration(age)} ago" if isinstance(age, int | float) else "")]
    rows = [("ID", "ENABLED", "DRY_RUN", "HITS", "DRY_RUN_HITS", "SINCE_LOAD", "ACTIONS", "STATE")]
    for rule in rules if isinstance(rules, list) else ():
        rows.append((str(rule["id"]), "yes" if rule["enabled"] else "no", "yes" if rule["dry_run"] else "no",
                     str(sum(rule["hits"].values())), str(sum(rule["dry_run_hits"].values())),
                     _since_load(rule), ",".join(rule["actions"]), _state(rule.get("state"))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def _state(state: Any) -> str:
    """A rule's live state (``GET /rules``' ``state``) in a few words: ``counted=2``, ``window=open
    for 12s``, ``ramp=255ms``, ``per=connection``, ``request_bytes>=1048576``; empty without one."""
    if not isinstance(state, dict):
        return ""
    words: list[str] = []
    for key, value in state.items():
        if key == "window_open":
            change = state.get("window_changes_in_seconds")
            words.append(f"window={'open' if value else 'closed'}"
                         + (f" for {duration(change)}" if isinstance(change, int | float) else ""))
        elif key == "ramp_ms":
            words.append("ramp=" + ",".join(f"{ms:g}ms" for ms in value if isinstance(ms, int | float)))
        elif key == "request_bytes" and isinstance(value, dict):
            words += [f"request_bytes{'>=' if k == 'min' else '<='}{v}" for k, v in value.items()]
        elif key != "window_changes_in_seconds":
            words.append(f"{key}={value}")
    return " ".join(words)


def _since_load(rule: dict[str, Any]) -> str:
    """A rule's hits since the rules went in force, ``never fired in 4m12s`` when none, ``-`` when
    disabled (or the kproxy answering predates the count)."""
    since, age = rule.get("hits_since_load"), rule.get("age_seconds")
    if not isinstance(since, int):
        return "-"
    if since == 0:
        return f"never fired in {duration(age)}" if isinstance(age, int | float) else "never fired"
    return str(since)


def duration(seconds: float) -> str:
    """``4m12s``, ``2h05m``, ``3d04h``, ``9s``: how long, to the unit that matters."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def faults_text(faults: list[dict[str, Any]], never_fired: list[dict[str, Any]] | None = None) -> str:
    """One line per fault record of ``GET /faults``, newest first: its UTC time, then its fields
    as the fault log line has them (``rule=... action=... api=... detail="..."``); then one line
    per enabled rule that has not fired since the rules went in force, with how long that has been."""
    lines = [f"never fired: rule={entry.get('id')} since load {duration(entry['age_seconds'])} ago"
             if isinstance(entry.get("age_seconds"), int | float) else f"never fired: rule={entry.get('id')}"
             for entry in never_fired or ()]
    if not faults:
        return "\n".join(["no faults", *lines])
    return "\n".join([*_fault_lines(faults), *lines])


def _fault_lines(faults: list[dict[str, Any]]) -> list[str]:
    lines = []
    for fault in faults:
        stamp = fault.get("time")
        when = (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamp)) + f".{int(stamp % 1 * 1000):03d}Z"
                if isinstance(stamp, int | float) else "?")
        fields = [f"rule={fault.get('rule')}", f"action={fault.get('action')}", f"api={fault.get('api')}",
                  f"connection={fault.get('connection')}", f"correlation_id={fault.get('correlation_id')}"]
        if fault.get("topics"):
            fields.append("topics=" + ",".join(map(str, fault["topics"])))
        if fault.get("partitions"):
            fields.append("partitions=" + ",".join(map(str, fault["partitions"])))
        if fault.get("dry_run"):
            fields.append("dry_run=true")
        fields.append(f"detail={json.dumps(str(fault.get('detail', '')))}")
        lines.append(f"{when} " + " ".join(fields))
    return lines


__all__ = ["add_admin_commands", "default_admin", "faults_text", "rules_table", "run_admin_command"]
