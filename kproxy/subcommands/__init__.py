"""The work behind ``kproxy`` subcommands, importable and testable without argparse.

Modules here take and return plain values (bytes, option dataclasses, dicts);
:mod:`kproxy.cli` parses the flags, reads the input, prints, and maps
exceptions to exit statuses.
"""
