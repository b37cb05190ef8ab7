"""Which build of kproxy runs: the compiled hot path (mypyc) or pure Python, and the guard that
keeps a stale compiled module from ever running.

The modules listed in pyproject.toml (``[tool.kproxy.native] modules``) can be compiled to C
extensions by mypyc from the very same ``.py`` sources (native_build.py; ``scripts/setup`` does
it in a checkout, a wheel build does it when a C compiler is there). The extensions are never put
next to their sources, where Python's import system would prefer them to the ``.py`` whatever
happened to the ``.py`` since: they live in ``kproxy/_native/`` with a manifest, and only the
finder installed here (:func:`activate`, from ``kproxy/__init__.py``) loads them, and only when:

* ``KPROXY_PURE`` is not set to a true value (``1``, ``true``, ``yes``): that runs pure Python
  whatever is built;
* the manifest was written for this interpreter (its extension suffix) by a build that finished;
* every source the build read is as it was then: each compiled module and every kproxy module
  they import, directly or not (mypyc may inline a ``Final`` constant of an imported module).
  Each file's size is compared, then its SHA-256, always: a file edited after the build is found
  whatever its size and times say (an edit that keeps both, a restored modification time). Its
  modification time, in the manifest too, is not trusted. Hashing the sources of a build (some
  140 files, 1.3 MB) is a few milliseconds of the start.

Otherwise nothing compiled is loaded at all (the modules of one build call each other directly,
so one stale module makes the whole build stale): the pure sources run, and when a build exists
but is stale, one line on stderr says so and which file changed (``scripts/setup`` rebuilds).

Imports nothing of kproxy: it runs first, before any module it may load.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

PURE_VARIABLE = "KPROXY_PURE"
NATIVE_DIR = Path(__file__).resolve().parent / "_native"
MANIFEST = "manifest.json"
NOT_BUILT = "not-built.txt"  # written by setup.py into a wheel built pure: why
MANIFEST_FORMAT = 1
_TRUE = frozenset(("1", "true", "yes", "on"))


@dataclass(frozen=True)
class Build:
    """The build in use: ``compiled`` (its extension modules loaded instead of the sources) or not,
    and why not (``reason``: forced pure, none built, built for another Python, stale)."""

    compiled: bool
    modules: tuple[str, ...] = ()
    reason: str = ""
    compiler: str = ""

    def describe(self) -> str:
        """One line for ``kproxy --version``."""
        if self.compiled:
            return f"compiled ({self.compiler}: {len(self.modules)} modules: {', '.join(self.modules)})"
        return f"pure Python ({self.reason})"


class _NativeFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules of one build (by full name) in ``kproxy/_native``, nothing else."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        found = self.paths.get(fullname)
        if found is None:
            return None
        loader = importlib.machinery.ExtensionFileLoader(fullname, str(found))
        return importlib.util.spec_from_file_location(fullname, found, loader=loader)


def pure_forced(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get(PURE_VARIABLE, "").strip().lower() in _TRUE


def read_manifest(native_dir: Path = NATIVE_DIR) -> dict[str, object] | None:
    """The manifest of the build in ``native_dir``; None when there is none (or it is unreadable)."""
    try:
        found = json.loads((native_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def not_built(native_dir: Path = NATIVE_DIR) -> str | None:
    """Why the wheel installed here was built pure (setup.py's one line), or None (none said)."""
    try:
        lines = (native_dir / NOT_BUILT).read_text(errors="replace").strip().splitlines()
    except OSError:
        return None
    return lines[0][:500] if lines else None


def stale_source(manifest: dict[str, object], package_root: Path) -> str | None:
    """The first source (path relative to ``package_root``, the directory holding ``kproxy/``) that
    is not the file the build read (its size, then its contents: see the module docstring); None
    when every one is."""
    sources = manifest.get("sources")
    if not isinstance(sources, dict) or not sources:
        return "(no sources in the manifest)"
    for key, stamp in sources.items():
        rel = str(key)
        if not isinstance(stamp, list) or len(stamp) < 3:
            return rel
        size, digest = stamp[0], stamp[2]  # (stamp[1], the modification time: not trusted)
        try:
            data = (package_root / rel).read_bytes()
        except OSError:
            return rel
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            return rel
    return None


def inspect(native_dir: Path = NATIVE_DIR, environ: dict[str, str] | os._Environ[str] = os.environ
            ) -> tuple[Build, dict[str, Path]]:
    """What :func:`activate` would do: the build, and the files of the modules it would load."""
    if pure_forced(environ):
        return Build(False, reason=f"{PURE_VARIABLE} is set"), {}
    manifest = read_manifest(native_dir)
    if manifest is None:
        why = not_built(native_dir)
        return Build(False, reason=f"the wheel was built pure: {why}" if why else "no compiled modules built"), {}
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if manifest.get("format") != MANIFEST_FORMAT or manifest.get("suffix") != suffix:
        return Build(False, reason=f"compiled modules built for another Python ({manifest.get('suffix')})"), {}
    changed = stale_source(manifest, native_dir.parent.parent)
    if changed is not None:
        return Build(False, reason=f"stale: {changed} changed after the compiled modules were built"), {}
    files = manifest.get("files")
    modules = manifest.get("modules")
    if not isinstance(files, dict) or not isinstance(modules, list):
        return Build(False, reason="unreadable manifest"), {}
    paths = {name: native_dir / rel for name, rel in files.items()}
    if not all(path.is_file() for path in paths.values()):
        return Build(False, reason="compiled modules missing"), {}
    return Build(True, tuple(modules), compiler=str(manifest.get("compiler", "mypyc"))), paths


BUILD = Build(False, reason="not activated")


def activate() -> Build:
    """Install the finder of the compiled modules when they may be used (see the module docstring);
    the build in use either way. Called once, by ``kproxy/__init__.py``, before anything it loads."""
    global BUILD
    build, paths = inspect()
    if paths:
        sys.meta_path.insert(0, _NativeFinder(paths))
    elif build.reason.startswith("stale"):
        print(f"kproxy: running pure Python: {build.reason[len('stale: '):]} (scripts/setup rebuilds them)",
              file=sys.stderr)
    BUILD = build
    return build
