"""The fenced code blocks of kproxy's Markdown docs, each with what the test suite does with it.

Every fenced block of a covered file (:data:`DOCS`) is preceded by a marker, an HTML comment
that rendered Markdown does not show::

    <!-- doc-test: MODE [ARGS] -->
    ```sh
    ...
    ```

The marker is the line right before the fence (blank lines between are allowed). Modes
(``tests/test_doc_examples.py`` runs them):

* ``pytest``: a Python test module of one test function taking the ``kproxy`` fixture: run in
  the test process with the pytest plugin's own fixture, against the test session's real broker
  (tests/plugin/ runs a user's suite in a pytest process of its own, as a user does);
* ``python``: a Python script, run as it is;
* ``sh``: shell commands, run one after the other by ``bash -e`` in a scratch directory that
  mirrors the repository (so ``rules/examples/*.yaml`` resolves), with kproxy's ``bin`` first on
  ``PATH``; ``files=NAME,NAME`` asks for example input files the runner makes
  (``EXAMPLE_FILES`` of tests/test_doc_examples.py);
* ``serve``: one ``kproxy run ...`` command: started against the real broker (its
  ``127.0.0.1:9092`` is the broker, every other loopback address a free port), ready on
  ``/readyz``, then stopped with SIGTERM and expected to exit 0; or one ``kproxy broker ...``
  command: started on a free port (for its ``127.0.0.1:9092``), its address printed and served
  to a real client, then stopped with SIGINT (Ctrl-C) and expected to exit 0;
* ``rules``: a rule file, loaded by kproxy's rules loader;
* ``config``: a configuration file, accepted by ``kproxy run --config FILE --check``;
* ``json``: a JSON document, parsed;
* ``skip REASON``: not run, and why (a Kubernetes cluster, minutes of benchmark, output shown).

A block without a marker fails the suite: a new example is run, or says why it is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/*.md", "rules/README.md", "deploy/README.md", "deploy/kubernetes/README.md",
        "helm/kproxy/README.md")
MODES = ("pytest", "python", "sh", "serve", "rules", "config", "json", "skip")

_MARKER = re.compile(r"<!--\s*doc-test:\s*(?P<mode>[a-z]+)(?P<args>.*?)\s*-->\s*$")
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is (``path`` relative to the repository, ``line`` of its opening
    fence, 1-based), its fence info string, its text, and its marker's mode and arguments
    (``mode`` None: no marker)."""

    path: str
    line: int
    info: str
    text: str
    mode: str | None
    args: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files(root: Path = ROOT) -> list[Path]:
    """The covered Markdown files that exist, in a stable order."""
    found: list[Path] = []
    for pattern in DOCS:
        found.extend(sorted(p for p in root.glob(pattern) if p.is_file()))
    return found


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    """Every fenced block of one Markdown file, with the marker before it (if any)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    last_marker: re.Match[str] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        opening = _FENCE.match(line)
        if opening is None:
            marker = _MARKER.search(line)
            if marker is not None:
                last_marker = marker
            elif line.strip():
                last_marker = None  # a marker speaks for the very next block only
            i += 1
            continue
        fence = opening["fence"]
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence):
            end += 1
        found.append(Block(str(path.relative_to(root)), i + 1, opening["info"].strip(),
                           "\n".join(lines[i + 1:end]) + "\n",
                           last_marker["mode"] if last_marker else None,
                           last_marker["args"].strip() if last_marker else ""))
        last_marker = None
        i = end + 1
    return found


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [block for path in doc_files(root) for block in blocks_of(path, root)]


def commands(text: str) -> list[str]:
    """A shell block's commands: comment lines and blank lines left out, ``\\`` continuations
    joined, a trailing ``# comment`` kept (bash ignores it)."""
    joined: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    if pending:
        joined.append(pending)
    return joined
