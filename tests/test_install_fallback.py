"""The README's wheel build where the compiled part fails, not only for want of a compiler: mypyc
failing (as it did in every README install, for want of kproxy's dependencies in pip's isolated
build environment) or the C compiler failing on mypyc's output gives a pure wheel and one line saying
why, never a failed install. (No compiler at all: test_install_pure.py.)
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from tests.support.install import (
    PURE_LINE,
    PURE_WHEEL,
    Venv,
    clone,
    command,
    fresh_venv,
    one_native_module,
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


def test_when_the_compiler_fails_on_mypycs_output_the_wheel_is_pure(tmp_path: Path) -> None:
    """The compiler found, but failing on mypyc's C: the wheel, declared with extensions, is pure all
    the same. The compiler fails on whatever C it is given, so mypyc is given one module's worth."""
    checkout = clone(tmp_path / "kproxy")
    venv = fresh_venv(tmp_path / "venv", system_path())
    failing = Venv(venv.path, {**venv.env, "CC": "false"})
    with one_native_module(checkout):
        lines = pure_lines(failing.sh(verbose_wheel(), checkout))
    assert len(lines) == 1 and lines[0].startswith(f"{PURE_LINE}the C compiler failed on mypyc's output: "), lines
    assert wheels(checkout) == [PURE_WHEEL]
    with zipfile.ZipFile(checkout / "dist" / PURE_WHEEL) as archive:
        names = archive.namelist()
        assert "kproxy/_native/not-built.txt" in names and not [n for n in names if n.endswith(".so")], names
        assert "Root-Is-Purelib: true" in archive.read("kproxy_kafka-0.1.0.dist-info/WHEEL").decode()
