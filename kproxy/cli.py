"""The ``kproxy`` command line: one subcommand per job.

Contract of :func:`main`: it never raises for user errors and never prints a
traceback. It returns the exit status: 0 on success, 2 for bad flags (after
argparse's usage message) and for input a command cannot read (after one
line on stderr). ``--help`` returns 0.

Adding a subcommand: write ``_add_<name>(subparsers)`` that registers its
parser and, with ``set_defaults``, sets ``handler`` (parsed namespace to exit
status) and optionally ``check`` (cross-flag validation that calls
``parser.error``), and list it in :data:`_SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import select
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from kproxy import __version__, native
from kproxy.config import ConfigError, FileSections, UpstreamTls, add_run_arguments, config_from_args, deprecation_notes
from kproxy.config.flags import take_cluster_flags
from kproxy.config.options import CLUSTERS
from kproxy.host_port import HostPort, parse_host_port
from kproxy.protocol.codes import api_key as api_key_by_name
from kproxy.subcommands.decode import DecodeOptions, decode_input
from kproxy.subcommands.hexdump import InputError

EXIT_OK = 0
EXIT_USAGE = 2  # argparse's status for bad flags; kproxy decode uses it for input it cannot read too
DISTRIBUTION = "kproxy-kafka"  # kproxy's name on PyPI (pyproject.toml): what `pip install` takes

_INT16_MIN, _INT16_MAX = -(2**15), 2**15 - 1


class SuggestingParser(argparse.ArgumentParser):
    """argparse's parser (subcommands' parsers are of the same class), refusing a flag it does not
    know with a did-you-mean among its own flags: ``kproxy run: error: unrecognized argument
    --metric-listen (did you mean --metrics-listen?)``. A close match that is a deprecated alias
    suggests the flag that replaces it (its action's ``preferred``)."""

    # Takes flags argparse cannot list beforehand out of the extras (``kproxy run``'s clusters' flags):
    # returns the extras left and the problems of those taken.
    claim_extras: Callable[[argparse.Namespace, list[str]], tuple[list[str], list[str]]] | None = None

    def parse_known_args(  # type: ignore[override]
            self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None,
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if self.claim_extras is not None:
            extras, problems = self.claim_extras(parsed, extras)
            if problems:
                self.error("; ".join(problems))
        for extra in extras:
            if extra.startswith("--") and len(extra) > 2:
                self.error(f"unrecognized argument {extra}{self._suggestion(extra.split('=', 1)[0])}")
        return parsed, extras

    def _suggestion(self, flag: str) -> str:
        preferred = {option: getattr(action, "preferred", option)
                     for action in self._actions for option in action.option_strings}
        close = difflib.get_close_matches(flag, list(preferred), n=1, cutoff=0.6)
        return f" (did you mean {preferred[close[0]]}?)" if close else ""


class _RunHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help lines wrapped at spaces only, so a flag or a variable is never cut at a hyphen."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)


def version_text() -> str:
    """What ``kproxy --version`` prints: the version, then which build runs (kproxy/native.py)."""
    return f"kproxy {__version__}\nbuild: {native.BUILD.describe()}\n"


class _VersionAction(argparse.Action):
    """``--version``: :func:`version_text` as it is (argparse's own would rewrap it), then exit 0."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        sys.stdout.write(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The ``kproxy`` parser with every subcommand registered."""
    parser: argparse.ArgumentParser = SuggestingParser(
        prog="kproxy", description="A Kafka-protocol-aware proxy and its tools.")
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="show the version and the build, and exit")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``kproxy`` with ``argv`` (default ``sys.argv[1:]``) and return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        check: Callable[[argparse.Namespace], None] | None = getattr(args, "check", None)
        if check is not None:
            check(args)
    except SystemExit as exc:  # argparse has printed usage or help already
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        status = handler(args)
        sys.stdout.flush()  # here, not at exit: a reader gone shows in the last write or in this flush
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise  # a socket's broken pipe, say: not the quiet case below
        # Whoever read our output has all they wanted (kproxy rules list | head): no traceback.
        _silence_stdout()
        return EXIT_OK
    return status


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll says POLLERR on its write end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no real descriptor (captured output), no poll()
        return False


# ---------------------------------------------------------------------------- decode

_DECODE_EPILOG = """\
Input: raw bytes, or hex as tcpdump, Wireshark, xxd or hexdump -C print it
(offset and ASCII columns are dropped), with or without 4-byte size prefixes.
Output: one JSON object per frame; bytes fields are lowercase hex, record
keys and values are text when printable UTF-8, else {"hex": ...}.
Requests decode on their own. A response decodes when a request with the
same correlation id comes earlier in the input, or with --api-key and
--api-version. Unknown api keys or versions print the header and the body
as hex (exit 0). Bad input exits 2 with one line naming the byte offset
(for hex input, the offset in the decoded bytes and the hex line/column).
"""


def _add_decode(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "decode", help="print Kafka frames (raw or hex) as JSON",
        description="Decode Kafka protocol frames and print each as a JSON object.",
        epilog=_DECODE_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", nargs="?", default="-", metavar="FILE",
                        help="file to read; '-' (the default) reads stdin")
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--hex", dest="input_format", action="store_const", const="hex",
                      help="the input is a hex dump")
    form.add_argument("--raw", dest="input_format", action="store_const", const="raw",
                      help="the input is binary")
    parser.set_defaults(input_format="auto")
    parser.add_argument("--no-size", action="store_true",
                        help="the input is a single frame without its 4-byte size prefix "
                             "(default: detected)")
    parser.add_argument("--direction", choices=("auto", "request", "response"), default="auto",
                        help="what every frame is (default: detected per frame)")
    parser.add_argument("--api-key", type=_api_key, metavar="K",
                        help="api key (number or name, e.g. 3 or Metadata) of responses with no "
                             "request before them")
    parser.add_argument("--api-version", type=_int16, metavar="V", help="api version of those responses")
    parser.add_argument("--records", action="store_true",
                        help="also decode the records of each record batch")
    parser.add_argument("--pretty", action="store_true", help="indent the JSON")
    parser.set_defaults(handler=_run_decode, check=_decode_checker(parser))


def _decode_checker(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], None]:
    def check(args: argparse.Namespace) -> None:
        if (args.api_key is None) != (args.api_version is None):
            parser.error("--api-key and --api-version go together")  # exits 2 after the usage
    return check


def _int16(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not _INT16_MIN <= value <= _INT16_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside the int16 range")
    return value


def _api_key(text: str) -> int:
    key = api_key_by_name(text)
    return key if key is not None else _int16(text)


def _run_decode(args: argparse.Namespace) -> int:
    options = DecodeOptions(
        input_format=args.input_format, size_prefix=False if args.no_size else None,
        direction=args.direction, api_key=args.api_key, api_version=args.api_version,
        records=args.records)
    try:
        raw = _read(args.input)
    except OSError as exc:
        return _fail(f"cannot read {args.input}: {exc.strerror or exc}")
    return _print_frames(raw, options, indent=2 if args.pretty else None, out=sys.stdout)


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    with open(path, "rb") as f:
        return f.read()


def _print_frames(raw: bytes, options: DecodeOptions, *, indent: int | None, out: TextIO) -> int:
    """Print frames as they decode; on bad input, one line on stderr after the good frames."""
    try:
        for frame in decode_input(raw, options):
            out.write(json.dumps(frame, indent=indent) + "\n")
    except InputError as exc:
        out.flush()
        return _fail(str(exc))
    return EXIT_OK  # a reader gone away (head, less) is main's to handle, as for every command


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (captured output): nothing to flush
        pass


def _fail(message: str) -> int:
    print(f"kproxy decode: {message}", file=sys.stderr)
    return EXIT_USAGE


# ------------------------------------------------------------------------------- run

_RUN_EPILOG = """\
Every option has one name: its key in the YAML file given with --config
(nested: limits.max_in_flight), its flag (--limits-max-in-flight) and its
environment variable (KPROXY_LIMITS_MAX_IN_FLIGHT), shown at the end of each
option's help. Flags win over the environment, the environment over the file.
Without a file: kproxy run --upstream 127.0.0.1:9092 --listen 127.0.0.1:19092
(broker N is then served on port 19093+N). Several clusters: clusters: in the
file, each cluster's options as --clusters-NAME-OPTION and KPROXY_CLUSTERS_<NAME>_<OPTION>
(--clusters-orders-upstream). Stops on SIGTERM/SIGINT after
letting in-flight requests finish (--limits-shutdown-grace).
"""


def _add_run(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run", help="run the proxy", description="Run kproxy in front of a Kafka cluster.",
        usage="%(prog)s [--config FILE] [--check] [OPTION ...]",
        epilog=_RUN_EPILOG, formatter_class=_RunHelpFormatter)
    add_run_arguments(parser)
    if isinstance(parser, SuggestingParser):
        parser.claim_extras = take_cluster_flags
    parser.add_argument("--check", action="store_true", dest="check_only",
                        help="check the configuration (file, KPROXY_* environment, flags; the rules, TLS and "
                             "token files it reads, the capture directory it writes) and exit: "
                             "0 when valid, 2 listing every problem")
    parser.set_defaults(handler=_run_proxy)


def _run_proxy(args: argparse.Namespace) -> int:
    deprecated = deprecation_notes(args)
    try:
        config = config_from_args(args)
        problems = _start_problems(FileSections(config.client_tls, config.upstream_tls, config.capture))
        for cluster in config.clusters:  # each cluster's own upstream TLS material
            problems += [f"{CLUSTERS}.{cluster.name}.{problem}"
                         for problem in _upstream_tls_problems(cluster.upstream_tls)]
    except ConfigError as exc:
        # The files of the sections that are valid are checked too: every problem in one round.
        problems = [*exc.problems, *(_start_problems(exc.files) if exc.files is not None else [])]
    if problems:
        for note in deprecated:
            print(f"kproxy run: warning: {note}", file=sys.stderr)
        for problem in problems:
            print(f"kproxy run: invalid configuration: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.check_only:
        for note in deprecated:
            print(f"kproxy run: warning: {note}", file=sys.stderr)
        print("kproxy run --check: configuration ok (" + "; ".join(
            (f"cluster {c.name}: " if config.clusters else "") + f"upstream {','.join(map(str, c.upstream))}, "
            f"listen {c.listen}" for c in config.every_cluster) + ")")
        return EXIT_OK
    from kproxy.server.app import run

    if deprecated:  # as log lines of the configured format: a JSON log stays all JSON
        import logging

        from kproxy.logfmt import q, setup_logging

        setup_logging(config.log_level, config.log_format)
        for note in deprecated:
            logging.getLogger("kproxy.config").warning(
                "event=flag_deprecated flag=%s use=%s option=%s detail=%s", note.flag, note.use,
                note.option.path, q(str(note)))
    return run(config)


def _upstream_tls_problems(tls: UpstreamTls) -> list[str]:
    """The problems of the TLS material kproxy loads to connect to brokers (loaded now)."""
    from kproxy.server.tls import upstream_context

    try:
        upstream_context(tls)
    except ConfigError as exc:
        return list(exc.problems)
    return []


def _start_problems(files: FileSections) -> list[str]:
    """The problems of the files kproxy loads or writes before it serves: TLS material (loaded
    here so that a bad certificate is a start-up error, not a per-connection one), the capture
    directory (written: :mod:`kproxy.paths`) and pyarrow for a capture."""
    from kproxy.paths import path_problems
    from kproxy.server.tls import client_side_context

    problems: list[str] = []
    try:
        client_side_context(files.client_tls)
    except ConfigError as exc:
        problems.extend(exc.problems)
    problems.extend(_upstream_tls_problems(files.upstream_tls))
    problems.extend(path_problems(files))
    if files.capture.enabled:
        try:
            if not files.capture.process:
                import kproxy.capture.writer  # noqa: F401 (imports pyarrow)
            elif importlib.util.find_spec("pyarrow") is None:  # found, not imported: the worker imports it
                raise ImportError("No module named 'pyarrow'")
        except ImportError as exc:
            problems.append(f"capture.dir: traffic capture needs pyarrow ({exc}); "
                            f"install it with: pip install '{DISTRIBUTION}[capture]'")
    return problems


# ------------------------------------------------------------------------------ demo


def _add_demo(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo", help="show kproxy at work against an embedded broker",
        description="Start an embedded Tansu broker (unless --upstream is given), put kproxy in front of "
                    "it, run real producers and consumers through it, and print what kproxy saw.")
    parser.add_argument("--upstream", metavar="HOST:PORT", help="use this cluster instead of the embedded broker")
    parser.add_argument("--messages", type=_positive, default=1000, metavar="N",
                        help="messages to produce and consume (default 1000)")
    parser.add_argument("--no-rules", dest="rules", action="store_false",
                        help="skip the second part: fault-injection rules and what the clients saw of them")
    parser.set_defaults(handler=_run_demo)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _run_demo(args: argparse.Namespace) -> int:
    from kproxy.subcommands.demo import run_demo
    from kproxy.testing import BrokerUnavailable

    try:
        return run_demo(args.upstream, sys.stdout, messages=args.messages, rules=args.rules)
    except (BrokerUnavailable, ImportError) as exc:
        print(f"kproxy demo: {exc}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------------- broker


def _add_broker(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "broker", help="run the embedded broker (the demo extra) until Ctrl-C, to put kproxy run in front of",
        description="Run the embedded Kafka-compatible broker of kproxy demo and the pytest fixture (Tansu, "
                    "in-memory storage; needs the demo extra) until SIGINT (Ctrl-C) or SIGTERM. Prints its "
                    "bootstrap address once it accepts connections.")
    parser.add_argument("--listen", type=_listen_address, default=None, metavar="HOST:PORT",
                        help="where it listens and what its Metadata advertises (default 127.0.0.1:9092)")
    parser.set_defaults(handler=_run_broker)


def _listen_address(text: str) -> HostPort:
    try:
        return parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _run_broker(args: argparse.Namespace) -> int:
    from kproxy.subcommands.broker import DEFAULT_LISTEN, BrokerError, serve_broker

    try:
        serve_broker(args.listen or DEFAULT_LISTEN, sys.stdout)
    except BrokerError as exc:
        print(f"kproxy broker: {exc}", file=sys.stderr)
        return 1
    return EXIT_OK


# ---------------------------------------------------------------------------- health


def _add_health(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from kproxy.subcommands.health import DEFAULT_URL

    parser = subparsers.add_parser(
        "health", help="probe a running kproxy's /healthz (for container HEALTHCHECKs)",
        description="Exit 0 when a running kproxy answers /healthz with HTTP 200, 1 otherwise "
                    "(one line on stderr saying why). No curl or wget needed in the image.")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--config", type=Path, metavar="FILE",
                       help="take the address from this kproxy config file's metrics_listen")
    where.add_argument("--url", default=None, help=f"URL to probe (default {DEFAULT_URL})")
    parser.add_argument("--timeout", type=float, default=3.0, metavar="SECONDS",
                        help="give up after this long (default 3)")
    parser.set_defaults(handler=_run_health)


def _run_health(args: argparse.Namespace) -> int:
    from kproxy.subcommands.health import DEFAULT_URL, probe, url_from_config

    try:
        url = url_from_config(args.config) if args.config is not None else (args.url or DEFAULT_URL)
    except ConfigError as exc:
        print(f"kproxy health: {exc}", file=sys.stderr)
        return EXIT_USAGE
    ok, said = probe(url, args.timeout)
    if not ok:
        print(f"kproxy health: unhealthy: {said}", file=sys.stderr)
        return 1
    return EXIT_OK


# ----------------------------------------------------------------------------- rules


def _add_rules(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "rules", help="check rule files; list and change the rules of a running kproxy",
        description="Fault-injection rule files (YAML; the format is kproxy's fault-injection rules "
                    "reference): `kproxy rules check` validates them, the other actions change the rules of "
                    "a running kproxy.")
    actions = parser.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check", help="validate rule files",
        description="Load each rule file as kproxy run --rules would. Exit 0 when all are valid; exit 2 "
                    "listing every problem of every file as file:line: key: reason. Rules that load but can "
                    "never act (shadowed by an earlier rule that stops evaluation, or matching on a key their "
                    "api's requests do not carry, or a version outside its range) are listed as "
                    "file:line: warning: key: reason, and leave the exit status as it is.")
    check.add_argument("files", nargs="+", metavar="PATH",
                       help="rule files (YAML), or directories of them merged as kproxy run --rules DIR merges them")
    check.set_defaults(handler=_run_rules_check)
    from kproxy.subcommands.rules_admin import add_admin_commands  # argparse only: the client loads when run

    add_admin_commands(actions)


def _run_rules_check(args: argparse.Namespace) -> int:
    from kproxy.rules.lint import warnings_of_paths
    from kproxy.rules.sources import check_paths

    problems = check_paths(args.files)
    for problem in problems:
        print(problem, file=sys.stderr)
    for warning in warnings_of_paths(args.files):  # of the paths that load
        print(f"{warning.file}:{warning.line}: warning: {warning.key}: {warning.reason}", file=sys.stderr)
    if problems:
        return EXIT_USAGE
    for path in args.files:
        print(f"{path}: ok")
    return EXIT_OK


# --------------------------------------------------------------------------- analyze

_ANALYZE_EPILOG = """\
Reads capture files written by kproxy run --capture-dir and writes, under --out,
Parquet aggregates and report.html (latency percentiles over time, errors by
api and code, top clients and topics, throughput per topic per minute, hot
partitions, connection churn), and prints a summary. Inputs that cannot be
read are listed with the reason; the rest is analysed. With --rules FILE, also
what that rule file would have done to the captured requests (the proxy's own
rule engine, same seed, same decisions), per rule, api, client and topic. Needs the 'analysis'
extra (PySpark, Java 17+): pip install '{distribution}[analysis]'.
"""


def _add_analyze(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "analyze", help="analyse capture files with Spark",
        description="Analyse kproxy capture files with Spark (local[*] by default).",
        epilog=_ANALYZE_EPILOG.format(distribution=DISTRIBUTION), formatter_class=argparse.RawDescriptionHelpFormatter)
    from kproxy.analysis.arguments import add_arguments  # argparse only: no Spark loaded

    add_arguments(parser)
    parser.set_defaults(handler=_run_analyze)


def _run_analyze(args: argparse.Namespace) -> int:
    # The one place that reaches kproxy.analysis, lazily: the proxy never loads Spark.
    try:
        from kproxy.analysis.arguments import anomaly_flags
        from kproxy.analysis.main import analyze
    except ImportError as exc:
        print(f"kproxy analyze: needs the 'analysis' extra ({exc}): pip install '{DISTRIBUTION}[analysis]'",
              file=sys.stderr)
        return EXIT_USAGE
    return analyze(args.captures, master=args.master, out=args.out, stdout=sys.stdout, stderr=sys.stderr,
                   follow=args.follow, conf=args.conf, rules=args.rules, seed=args.seed,
                   exact_percentiles=args.exact_percentiles, verbose=args.verbose, interval=args.interval,
                   anomalies=anomaly_flags(args))


def _add_credentials(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from kproxy.subcommands.credentials_command import add_credentials_command  # argparse only until it runs

    add_credentials_command(subparsers)


_SUBCOMMANDS: Sequence[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = (
    _add_run,
    _add_demo,
    _add_broker,
    _add_decode,
    _add_health,
    _add_rules,
    _add_credentials,
    _add_analyze,
)
