"""``kproxy credentials add|remove|list``: the users terminate mode checks (``sasl.client.credentials_file``).

The file holds no password (kproxy/sasl/credentials.py): ``add`` reads one and writes what checks
it. The password never comes as a flag's value (it would sit in the shell's history and in ``ps``):
it is asked twice on the terminal without echo, or read from ``--password-file`` (its first line)
or from standard input with ``--password-stdin`` (its first line), for scripts. The file is written
atomically, mode 0600; a file that does not load is never overwritten.

Contract: exit 0 when done; 2 for input kproxy refuses (one line on stderr: a bad password, a
user name, a file that does not load, no such user); 1 when the file cannot be written.
"""

from __future__ import annotations

import argparse
import functools
import getpass
import os
import sys
from collections.abc import Callable
from pathlib import Path

from kproxy.config.options import env_name
from kproxy.config.sections import CLIENT_MECHANISMS
from kproxy.sasl import scram
from kproxy.sasl.credentials import (
    PLAIN_ITERATIONS,
    CredentialsError,
    CredentialStore,
    user_credentials,
    with_user,
    without_user,
)

EXIT_OK = 0
EXIT_WRITE = 1
EXIT_USAGE = 2
FILE_VARIABLE = env_name("sasl.client.credentials_file")  # kproxy run's, as the default file here

_EPILOG = f"""\
The file is sasl.client.credentials_file of kproxy run (terminate mode), which re-reads it when it
changes. --file FILE names it; without it, ${FILE_VARIABLE}. PLAIN entries are salted
PBKDF2-HMAC-SHA-512 hashes, SCRAM entries what a Kafka broker stores (salt, iterations, StoredKey,
ServerKey): the file never holds a password. In Kubernetes, put the file in a Secret and mount it
(the Helm chart: sasl.client.credentialsSecret).
"""


def add_credentials_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "credentials", help="add, remove and list the users terminate mode checks",
        description="Edit the credentials file kproxy checks clients against in terminate mode "
                    "(sasl.client.mode: terminate).",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="credentials_command", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add a user, or set a user's password",
                             description="Add USER to the credentials file (created if missing), or replace its "
                                         "entries, for the password read (never a flag's value).")
    add.add_argument("user", metavar="USER")
    _file_argument(add)
    add.add_argument("--mechanisms", default=",".join(CLIENT_MECHANISMS), metavar="LIST",
                     help="comma-separated mechanisms the user may log in with "
                          f"(default {','.join(CLIENT_MECHANISMS)})")
    source = add.add_mutually_exclusive_group()
    source.add_argument("--password-file", type=Path, metavar="PATH",
                        help="read the password from this file's first line")
    source.add_argument("--password-stdin", action="store_true",
                        help="read the password from standard input's first line")
    add.add_argument("--plain-iterations", type=int, default=PLAIN_ITERATIONS, metavar="N",
                     help=f"PBKDF2 iterations of the PLAIN hash (default {PLAIN_ITERATIONS})")
    add.add_argument("--scram-iterations", type=int, default=scram.DEFAULT_ITERATIONS, metavar="N",
                     help=f"SCRAM iterations, {scram.MIN_ITERATIONS} to {scram.MAX_ITERATIONS} as Kafka takes "
                          f"(default {scram.DEFAULT_ITERATIONS})")
    add.set_defaults(handler=_run_add)
    remove = actions.add_parser("remove", help="remove a user", description="Remove USER from the credentials file.")
    remove.add_argument("user", metavar="USER")
    _file_argument(remove)
    remove.set_defaults(handler=_run_remove)
    listing = actions.add_parser("list", help="list the users and their mechanisms",
                                 description="Print each user of the credentials file with its mechanisms.")
    _file_argument(listing)
    listing.set_defaults(handler=_run_list)


def _file_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", type=Path, metavar="FILE", help=f"the credentials file (default ${FILE_VARIABLE})")


class _Refused(Exception):
    """Input the command refuses; the message says what (exit 2)."""


def _handled(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` with what it refuses printed as one line on stderr, exit 2."""
    @functools.wraps(run)
    def handler(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except _Refused as exc:
            return _fail(str(exc))
        except CredentialsError as exc:
            return _fail("; ".join(exc.problems))
    return handler


def _file(args: argparse.Namespace) -> Path:
    if args.file is not None:
        return Path(args.file)
    named = os.environ.get(FILE_VARIABLE)
    if not named:
        raise _Refused(f"no credentials file: --file FILE or ${FILE_VARIABLE}")
    return Path(named)


def _load(path: Path, *, missing_ok: bool) -> CredentialStore:
    from kproxy.sasl.credentials_file import load_credentials

    if missing_ok and not path.exists():
        return CredentialStore()
    return load_credentials(path)


def _fail(message: str, status: int = EXIT_USAGE) -> int:
    print(f"kproxy credentials: {message}", file=sys.stderr)
    return status


@_handled
def _run_add(args: argparse.Namespace) -> int:
    path = _file(args)
    store = _load(path, missing_ok=True)
    mechanisms = [m.strip().upper() for m in args.mechanisms.split(",") if m.strip()]
    entry = user_credentials(_password(args), mechanisms, plain_iterations=args.plain_iterations,
                             scram_iterations=args.scram_iterations)
    return _save(path, with_user(store, args.user, entry), f"{args.user}: {', '.join(entry.mechanisms)}")


@_handled
def _run_remove(args: argparse.Namespace) -> int:
    path = _file(args)
    try:
        store = without_user(_load(path, missing_ok=False), args.user)
    except KeyError:
        raise _Refused(f"{path}: no user {args.user!r}") from None
    return _save(path, store, f"{args.user}: removed")


@_handled
def _run_list(args: argparse.Namespace) -> int:
    store = _load(_file(args), missing_ok=False)
    for name in sorted(store.users):
        print(f"{name}\t{','.join(store.users[name].mechanisms)}")
    return EXIT_OK


def _save(path: Path, store: CredentialStore, said: str) -> int:
    from kproxy.sasl.credentials_file import save_credentials

    try:
        save_credentials(path, store)
    except OSError as exc:
        return _fail(f"cannot write {path}: {exc.strerror or exc}", EXIT_WRITE)
    print(f"{path}: {said}")
    return EXIT_OK


def _password(args: argparse.Namespace) -> str:
    """The password: a file's or standard input's first line (its line ending dropped), else asked
    twice on the terminal without echo."""
    if args.password_file is not None:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                return _first_line(f.readline(), str(args.password_file))
        except (OSError, UnicodeDecodeError) as exc:
            raise _Refused(f"cannot read {args.password_file}: {getattr(exc, 'strerror', None) or exc}") from None
    if args.password_stdin:
        return _first_line(sys.stdin.readline(), "standard input")
    if not sys.stdin.isatty():
        raise _Refused("no terminal to ask the password on: give --password-file PATH or --password-stdin")
    first = getpass.getpass(f"Password for {args.user}: ")
    if getpass.getpass("Again: ") != first:
        raise _Refused("the passwords differ")
    return first


def _first_line(line: str, where: str) -> str:
    password = line.removesuffix("\n").removesuffix("\r")
    if not password:
        raise _Refused(f"no password in {where} (an empty first line)")
    return password
