"""What an installed user reads and types: the distribution's name, and help without repository paths.

``kproxy`` on PyPI is an unrelated project, so every ``pip install`` the docs and messages give
names kproxy's own distribution; and ``--help`` points to nothing that only a checkout has.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

from kproxy.cli import DISTRIBUTION, build_parser

ROOT = Path(__file__).resolve().parent.parent
PIP_INSTALL = re.compile(r"pip install [^\n`]*?'?([A-Za-z0-9_.-]+)\[[a-z,]+\]")


def test_the_distribution_is_not_the_unrelated_kproxy_and_the_cli_names_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION != "kproxy"
    assert project["scripts"]["kproxy"] == "kproxy.cli:main"  # the command keeps its name


def test_every_pip_install_with_extras_names_the_distribution() -> None:
    found = 0
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "kproxy").rglob("*.py")]:
        for match in PIP_INSTALL.finditer(path.read_text(encoding="utf-8")):
            found += 1
            assert match.group(1) in (DISTRIBUTION, "."), f"{path.relative_to(ROOT)}: {match.group(0)}"
    assert found >= 4


def test_the_readme_says_how_to_install_build_the_image_and_point_the_chart_at_it() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    sections = re.split(r"^## ", readme, flags=re.M)
    assert sections[1].startswith("Two commands") and sections[2].startswith("Install\n")
    install = sections[2]
    for needed in (f"'{DISTRIBUTION}[analysis]'", "pip wheel", "docker build", "image.repository", "Dockerfile"):
        assert needed in install, needed


def test_the_image_installs_the_wheel_of_the_distribution() -> None:
    wheel_prefix = re.sub(r"[-_.]+", "_", DISTRIBUTION) + "-"
    assert f"/wheels/{wheel_prefix}*.whl" in (ROOT / "Dockerfile").read_text()


def _texts(parser: argparse.ArgumentParser, where: str) -> Iterator[tuple[str, str]]:
    yield where, f"{parser.description or ''} {parser.epilog or ''}"
    for action in parser._actions:
        if action.help and action.help is not argparse.SUPPRESS:
            yield f"{where} {'/'.join(action.option_strings) or action.dest}", action.help
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _texts(sub, f"{where} {name}")


def test_help_points_to_nothing_only_a_checkout_has() -> None:
    texts = list(_texts(build_parser(), "kproxy"))
    assert len(texts) > 100  # every subcommand's help was walked
    for where, text in texts:
        # A path of the checkout (rules/README.md), not one of the HTTP API (PUT /rules/ID).
        assert not re.search(r"(?<![/\w])(docs|rules|deploy|helm|bench|scripts)/[\w.-]+", text), (where, text)
