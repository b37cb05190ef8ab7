"""The README's wheel build where mypyc fails (as it did in every README install, for want of
kproxy's dependencies in pip's isolated build environment): a pure wheel and one line saying why,
never a failed install. (No compiler, or one failing on mypyc's output: test_install_pure.py.)
"""

from __future__ import annotations

from pathlib import Path

from tests.support.install import (
    PURE_LINE,
    PURE_WHEEL,
    clone,
    command,
    fresh_venv,
    pure_lines,
    system_path,
    verbose_wheel,
    version,
    wheels,
)


def test_when_mypyc_fails_the_wheel_is_pure_and_says_why(tmp_path: Path) -> None:
    checkout = clone(tmp_path / "kproxy")
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text()
    start = text.index("requires = [", text.index("[build-system]"))
    end = text.index("]\n", start) + 2
    pyproject.write_text(text[:start] + 'requires = ["setuptools>=77", "wheel", "mypy==2.4.1"]\n' + text[end:])
    venv = fresh_venv(tmp_path / "venv", system_path())
    lines = pure_lines(venv.sh(verbose_wheel(), checkout))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{PURE_LINE}mypyc failed: ") and 'module named "trio"' in lines[0], lines
    assert wheels(checkout) == [PURE_WHEEL]
    venv.sh(command("pip install --find-links dist"), checkout)
    said = version(venv, tmp_path)
    assert said.startswith("kproxy 0.1.0\nbuild: pure Python (the wheel was built pure: mypyc failed: "), said

