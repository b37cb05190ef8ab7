"""Which build runs (kproxy/native.py): the compiled hot path when it is built and every source it was
built from is unchanged, the pure sources otherwise; never a compiled module older than its source.

The tests that need a build copy the checkout's package, ``kproxy/_native/`` included, into a temporary
directory and run Python there: a stale build is made by editing a source of the copy."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import kproxy
from kproxy import native

ROOT = Path(kproxy.__file__).resolve().parent.parent
BUILT = (ROOT / "kproxy" / "_native" / "manifest.json").is_file()
needs_build = pytest.mark.skipif(not BUILT, reason="nothing compiled here (scripts/setup builds it with a C compiler)")
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
PROBE = ("import kproxy, kproxy.native as n, kproxy.proxy.session as s, kproxy.cli as c; "
         "print(n.BUILD.compiled, s.__file__.endswith(n.importlib.machinery.EXTENSION_SUFFIXES[0]), "
         "c.__file__.endswith('.py'))")

sys.path.insert(0, str(ROOT / "scripts"))
import native_build  # noqa: E402


def listed() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["kproxy"]["native"]["modules"])


def run(tree: Path, code: str = PROBE, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "KPROXY_PURE"}
    return subprocess.run([sys.executable, "-c", code], cwd=tree, env={**clean, "PYTHONPATH": str(tree), **env},
                          capture_output=True, text=True, timeout=60, check=True)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The checkout's package and its build, copied (file times kept, as a copy or a checkout may not)."""
    shutil.copytree(ROOT / "kproxy", tmp_path / "kproxy", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_this_run_uses_the_build_it_should() -> None:
    # scripts/test says which build each pytest pass must run on (the whole suite compiled where a C
    # compiler is, the pure pass pure): a build silently missing or stale fails here, not quietly pure.
    expected = os.environ.get("KPROXY_TEST_BUILD")
    if expected is not None:
        assert ("compiled" if native.BUILD.compiled else "pure") == expected, native.BUILD.describe()
    assert native.BUILD.compiled == native.inspect()[0].compiled
    if native.BUILD.compiled:
        assert list(native.BUILD.modules) == listed()


@needs_build
def test_the_listed_modules_come_from_the_build_and_the_others_from_their_sources() -> None:
    others = ["kproxy.cli", "kproxy.protocol.message_schemas", "kproxy.server.proxy_server"]
    found = run(ROOT, "import kproxy, kproxy.native as n, importlib, json; "
                      "print(json.dumps({m: importlib.import_module(m).__file__ for m in "
                      f"{[*listed(), *others]!r}}}))")
    files = json.loads(found.stdout)
    for name in listed():
        assert files[name].endswith(SUFFIX) and "/kproxy/_native/" in files[name], (name, files[name])
    for name in ("kproxy.cli", "kproxy.protocol.message_schemas", "kproxy.server.proxy_server"):
        assert files[name].endswith(".py"), (name, files[name])


@needs_build
def test_the_build_in_the_checkout_is_fresh_and_of_the_listed_modules() -> None:
    assert native_build.is_fresh()
    manifest = native.read_manifest()
    assert manifest is not None and manifest["modules"] == listed()


@needs_build
@pytest.mark.parametrize("edited", ["kproxy/proxy/session.py", "kproxy/protocol/message_schemas.py"])
def test_a_source_changed_after_the_build_runs_pure_and_says_which(copy: Path, edited: str) -> None:
    # A compiled module, or a module one imports (mypyc may have inlined its Final constants): the whole
    # build is refused (its modules call each other directly), with one line naming the file.
    assert run(copy).stdout.split() == ["True", "True", "True"]
    with open(copy / edited, "a") as f:
        f.write("\n# edited after the build\n")
    done = run(copy)
    assert done.stdout.split() == ["False", "False", "True"]
    assert done.stderr.splitlines() == [f"kproxy: running pure Python: {edited} changed after the compiled "
                                        f"modules were built (scripts/setup rebuilds them)"]


@needs_build
def test_a_source_the_build_does_not_read_may_change(copy: Path) -> None:
    with open(copy / "kproxy" / "cli.py", "a") as f:
        f.write("\n# edited after the build\n")
    done = run(copy)
    assert done.stdout.split() == ["True", "True", "True"] and done.stderr == ""


@needs_build
def test_sources_touched_but_unchanged_keep_the_build(copy: Path) -> None:
    # New file times (a checkout, an installed wheel): each file's contents are compared then.
    for path in (copy / "kproxy").rglob("*.py"):
        os.utime(path)
    done = run(copy)
    assert done.stdout.split() == ["True", "True", "True"] and done.stderr == ""


def hand_made_build(tmp_path: Path) -> tuple[Path, Path]:
    """A build as native_build.py stamps one, made by hand (no compiler needed): a package with one
    source and a compiled module's file (never loaded: only :func:`native.inspect` reads the build)."""
    source = tmp_path / "kproxy" / "proxy" / "session.py"
    source.parent.mkdir(parents=True)
    source.write_text("LIMIT = 1  # a constant mypyc may inline\n")
    native_dir = tmp_path / "kproxy" / "_native"
    native_dir.mkdir()
    (native_dir / f"session{SUFFIX}").write_bytes(b"\x7fELF")
    (native_dir / "manifest.json").write_text(json.dumps({
        "format": native.MANIFEST_FORMAT, "suffix": SUFFIX, "modules": ["kproxy.proxy.session"],
        "files": {"kproxy.proxy.session": f"session{SUFFIX}"}, "compiler": "mypyc (hand-made)",
        "sources": native_build.source_stamps([Path("kproxy/proxy/session.py")], tmp_path)}))
    return native_dir, source


def test_a_source_edited_keeping_its_size_and_time_makes_the_build_stale(tmp_path: Path) -> None:
    """Size and modification time say nothing of the contents: an edit that keeps both (a restored
    mtime, a tool that sets it, a coarse clock) is found by the source's hash all the same."""
    native_dir, source = hand_made_build(tmp_path)
    stamp = source.stat()  # (what the manifest holds)
    assert native.inspect(native_dir, {})[0].compiled  # as built
    os.utime(source, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))  # touched, unchanged: still the build's
    assert native.inspect(native_dir, {})[0].compiled
    source.write_text("LIMIT = 9  # a constant mypyc may inline\n")  # same size...
    os.utime(source, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # ... and time
    assert source.stat().st_size == stamp.st_size and source.stat().st_mtime_ns == stamp.st_mtime_ns
    build, paths = native.inspect(native_dir, {})
    assert not build.compiled and not paths
    assert build.reason == "stale: kproxy/proxy/session.py changed after the compiled modules were built"


@needs_build
def test_a_build_that_did_not_finish_or_is_for_another_python_is_not_loaded(copy: Path) -> None:
    manifest_path = copy / "kproxy" / "_native" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["suffix"] = ".cpython-39-x86_64-linux-gnu.so"
    manifest_path.write_text(json.dumps(manifest))
    done = run(copy, "import kproxy.native as n; print(n.BUILD.describe())")
    assert done.stdout.startswith("pure Python (compiled modules built for another Python")
    manifest_path.unlink()  # a build stopped midway writes no manifest
    done = run(copy, "import kproxy.native as n, kproxy.proxy.session as s; print(n.BUILD.describe(), s.__file__)")
    assert done.stdout.split("(")[1].startswith("no compiled modules built") and done.stdout.strip().endswith(".py")
    assert done.stderr == ""


def test_kproxy_pure_runs_the_sources_whatever_is_built() -> None:
    done = run(ROOT, KPROXY_PURE="1")
    assert done.stdout.split() == ["False", "False", "True"] and done.stderr == ""


def test_version_says_which_build_runs() -> None:
    kproxy_command = Path(sys.executable).parent / "kproxy"
    out = subprocess.run([str(kproxy_command), "--version"], capture_output=True, text=True, timeout=60,
                         check=True, env={k: v for k, v in os.environ.items() if k != "KPROXY_PURE"}).stdout
    first, second = out.splitlines()
    assert first == f"kproxy {kproxy.__version__}"
    build, _ = native.inspect(environ={})
    if build.compiled:
        assert second == f"build: compiled (mypyc {build.compiler.split()[-1]}: {len(listed())} modules: " \
                         f"{', '.join(listed())})"
    else:
        assert second.startswith("build: pure Python (")
    pure = subprocess.run([str(kproxy_command), "--version"], capture_output=True, text=True, timeout=60,
                          check=True, env={**os.environ, "KPROXY_PURE": "1"}).stdout
    assert pure.splitlines()[1] == "build: pure Python (KPROXY_PURE is set)"


def test_the_build_reads_each_compiled_module_and_what_it_imports() -> None:
    sources = {p.as_posix() for p in native_build.source_closure(["kproxy.proxy.session"])}
    assert {"kproxy/__init__.py", "kproxy/proxy/session.py", "kproxy/protocol/framing.py",
            "kproxy/proxy/exchange.py", "kproxy/toxics.py", "kproxy/protocol/message_schemas.py"} <= sources
    assert "kproxy/server/connection.py" not in sources and "kproxy/cli.py" not in sources


def test_every_listed_module_is_a_module_file_of_the_package() -> None:
    assert native_build.listed_modules() == listed()
    assert all(not m.endswith("__init__") for m in listed())


def test_a_wheel_built_pure_says_why(tmp_path: Path) -> None:
    # setup.py leaves its one line in the wheel when it builds it pure: kproxy --version prints it.
    built = tmp_path / "kproxy" / "_native"
    built.mkdir(parents=True)
    (built / native.NOT_BUILT).write_text("mypyc failed: kproxy/server/sockets.py:11: error: ... (all it said: x)\n")
    build, paths = native.inspect(built, environ={})
    assert (build.compiled, paths) == (False, {})
    assert build.describe() == ("pure Python (the wheel was built pure: mypyc failed: kproxy/server/sockets.py:11: "
                                "error: ... (all it said: x))")
    assert native.inspect(built, environ={"KPROXY_PURE": "1"})[0].reason == "KPROXY_PURE is set"
    (built / native.NOT_BUILT).unlink()
    assert native.inspect(built, environ={})[0].reason == "no compiled modules built"


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group(0)).lower()  # type: ignore[union-attr]


def test_the_wheel_build_environment_holds_what_mypyc_type_checks() -> None:
    """pip builds the wheel in an isolated environment holding only [build-system] requires; mypyc
    type-checks the compiled modules and every kproxy module they import, so every distribution
    those import (and PyYAML's stubs) must be there, or the wheel is pure (it was once a failed build)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)
    requires = {_name(r) for r in project["build-system"]["requires"]}
    imported: set[str] = set()
    for rel in native_build.source_closure(listed()):
        for node in ast.walk(ast.parse((ROOT / rel).read_bytes())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"kproxy", "__future__"}
    assert {"trio", "yaml"} <= third_party  # the scan sees the imports
    owners = importlib.metadata.packages_distributions()
    needed = {_name(dist) for module in third_party for dist in owners[module]}
    assert needed - requires == set(), "pyproject.toml [build-system] requires lacks what mypyc type-checks"
    assert "types-pyyaml" in requires  # PyYAML ships no types: its stubs
    # The same checker and stubs as the test extra's (what CI's mypy --strict ran).
    pins = {_name(r): r for r in project["project"]["optional-dependencies"]["test"]}
    for wanted in ("mypy", "types-pyyaml"):
        assert pins[wanted] in project["build-system"]["requires"], wanted
