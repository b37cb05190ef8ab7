"""Compiles kproxy's hot path with mypyc into ``kproxy/_native/`` (see kproxy/native.py for how it is loaded).

Two callers, one build:

* ``setup.py`` when a wheel is built (``pip wheel .``, the Dockerfile's build stage): the
  extensions and the manifest go into the wheel, under ``kproxy/_native/``;
* ``scripts/setup`` in a checkout, through ``python scripts/native_build.py``: built in place into
  ``kproxy/_native/`` (git ignores it), only when the manifest there does not match the sources.

The modules compiled are the explicit list ``[tool.kproxy.native] modules`` of pyproject.toml, and
only those: a module not listed stays interpreted, whatever it imports. In a checkout, a listed
module that mypyc cannot compile fails the build (CI runs scripts/setup: the failure shows there,
not at run time); a wheel is never refused for it: setup.py builds it pure and says why in one line.
With no C compiler or no Python headers, nothing is built and one line says so: kproxy runs as pure
Python, which is the same code.

The manifest (``kproxy/_native/manifest.json``) is written last, once every extension is built, and
removed before a build starts: a build that failed midway leaves none, so nothing of it is loaded.
It names the interpreter's extension suffix, the modules and their files, and every source the
build read (each compiled module and every kproxy module it imports, transitively), with size,
modification time and SHA-256: kproxy/native.py refuses the build if any of them changed.

    python scripts/native_build.py            # build in place if stale; exit 1 if a build fails
    python scripts/native_build.py --check    # exit 0 when the in-place build is fresh, 1 when not
    python scripts/native_build.py --force    # build even when fresh
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import importlib.machinery
import io
import json
import os
import shutil
import sys
import sysconfig
import time
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NATIVE = Path("kproxy") / "_native"
MANIFEST_FORMAT = 1  # kproxy.native.MANIFEST_FORMAT
GROUP = "kproxy_native"  # the shared library's module name is GROUP + "__mypyc"
C_DIR = Path("build") / "mypyc"  # the generated C and the compiler's objects (git ignores build/)


def listed_modules(root: Path = ROOT) -> list[str]:
    """The modules to compile, as pyproject.toml lists them (dotted names)."""
    with open(root / "pyproject.toml", "rb") as f:
        config = tomllib.load(f)
    modules = config["tool"]["kproxy"]["native"]["modules"]
    for name in modules:
        path = module_path(name, root)
        if path.name == "__init__.py" or not path.is_file():
            raise SystemExit(f"pyproject.toml [tool.kproxy.native]: {name} is not a module file (packages' "
                             f"__init__ are not compiled)")
    return list(modules)


def module_path(name: str, root: Path = ROOT) -> Path:
    base = root.joinpath(*name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _kproxy_imports(path: Path, name: str, root: Path) -> set[str]:
    """The kproxy modules ``path`` (module ``name``) imports, type-checking-only imports included."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for dotted in names:
            parts = dotted.split(".")
            # Every package on the way is imported too (its __init__ runs).
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix.split(".")[0] == "kproxy" and _exists(prefix, root):
                    found.add(prefix)
    return found


def _exists(name: str, root: Path) -> bool:
    return module_path(name, root).is_file()


def source_closure(modules: list[str], root: Path = ROOT) -> list[Path]:
    """Every source a build of ``modules`` depends on: theirs and every kproxy module they import, transitively."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_kproxy_imports(module_path(name, root), name, root) - seen)
    return sorted(module_path(name, root).relative_to(root) for name in seen)


def source_stamps(sources: list[Path], root: Path = ROOT) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for rel in sources:
        path = root / rel
        st = path.stat()
        out[rel.as_posix()] = [st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()]
    return out


class NotBuilt(Exception):
    """mypyc could not build the listed modules: ``str()`` is one line saying why, ``output`` all mypyc said."""

    def __init__(self, why: str, output: str) -> None:
        super().__init__(why)
        self.output = output


def compiler_missing() -> str | None:
    """Why nothing can be compiled here (no C compiler, no Python headers), or None."""
    # The compiler setuptools will run: $CC when set (as setuptools honours it), else Python's own.
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    include = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not include.is_file():
        return f"no Python headers ({include})"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (it comes with mypy, the test extra)"
    return None


def extensions(modules: list[str], root: Path = ROOT) -> list[Any]:
    """mypyc's C extensions of ``modules`` (it type-checks the whole package for their types).

    Raises :class:`NotBuilt` when mypyc fails (a type error, a module it cannot compile, a type it
    cannot find): the one line names the first error and the file keeping all of them."""
    from mypyc.build import mypycify

    cwd = os.getcwd()
    os.chdir(root)  # mypy reads pyproject.toml's [tool.mypy] from here; paths are relative to it
    said = io.StringIO()
    try:
        # mypyc prints its notes ("Treating generator comprehension as list": code it compiles less
        # well, not errors) and its errors on stdout: kept in a file, so that a first `scripts/setup`
        # or demo is not opened by a screen of them.
        with contextlib.redirect_stdout(said):
            built = mypycify([module_path(m, Path(".")).as_posix() for m in modules], opt_level="3",
                             debug_level="0", group_name=GROUP, target_dir=C_DIR.as_posix())
    except (Exception, SystemExit) as exc:  # mypyc ends a failed type check with SystemExit
        output = said.getvalue()
        log = root / C_DIR / "mypyc-errors.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(output)
        errors = [line for line in output.splitlines() if ": error:" in line]
        first = errors[0] if errors else (str(exc) or type(exc).__name__)
        more = f" and {len(errors) - 1} more" if len(errors) > 1 else ""
        raise NotBuilt(f"mypyc failed: {first}{more} (all it said: {log})", output) from exc
    finally:
        os.chdir(cwd)
    notes = said.getvalue()
    if notes.strip():
        log = root / C_DIR / "mypyc-notes.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(notes)
        print(f"kproxy: mypyc's {len(notes.splitlines())} notes on the code it compiles less well: {log}", flush=True)
    return built


def native_file(ext_name: str) -> Path:
    """Where the extension of ``ext_name`` goes, relative to the tree holding ``kproxy/``."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    parts = ext_name.split(".")
    return NATIVE.joinpath(*parts[:-1], parts[-1] + suffix)


def write_manifest(lib_root: Path, modules: list[str], sources: dict[str, list[Any]]) -> None:
    """The manifest of a finished build, into ``lib_root/kproxy/_native`` (``lib_root``: the checkout or the
    wheel's build tree). ``sources``: :func:`source_stamps` taken *before* mypyc read them, so that a
    source edited while the build ran is found stale."""
    import mypy.version

    files = {name: native_file(name).relative_to(NATIVE).as_posix() for name in [*modules, f"{GROUP}__mypyc"]}
    manifest = {
        "format": MANIFEST_FORMAT,
        "suffix": importlib.machinery.EXTENSION_SUFFIXES[0],
        "compiler": f"mypyc {mypy.version.__version__}",
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "modules": modules,
        "files": files,
        "sources": sources,
    }
    target = lib_root / NATIVE / "manifest.json"
    target.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def clear(lib_root: Path) -> None:
    """Remove a previous build from ``lib_root/kproxy/_native`` (its manifest first)."""
    native = lib_root / NATIVE
    (native / "manifest.json").unlink(missing_ok=True)
    if native.exists():
        shutil.rmtree(native)


def is_fresh(root: Path = ROOT) -> bool:
    """Whether the in-place build matches the sources and the module list (kproxy.native's own check)."""
    sys.path.insert(0, str(root))
    try:
        from kproxy import native
    finally:
        sys.path.pop(0)
    manifest = native.read_manifest(root / NATIVE)
    if manifest is None or manifest.get("modules") != listed_modules(root):
        return False
    build, _ = native.inspect(root / NATIVE, environ={})
    return build.compiled


def build_in_place(force: bool = False) -> int:
    """scripts/setup's build: 0 when fresh or built (or when nothing can be built here), 1 when a build failed."""
    if not force and is_fresh():
        return 0
    missing = compiler_missing()
    if missing is not None:
        clear(ROOT)
        print(f"kproxy: {missing}: the compiled hot path is not built; kproxy runs as pure Python")
        return 0
    clear(ROOT)
    modules = listed_modules()
    sources = source_stamps(source_closure(modules))  # before mypyc reads them: see write_manifest
    started = time.monotonic()
    print(f"kproxy: compiling {len(modules)} modules with mypyc (a few minutes)...", flush=True)
    from setuptools import Distribution

    try:
        built = extensions(modules)
    except NotBuilt as failed:  # in a checkout, a module mypyc cannot compile fails (CI runs this)
        sys.stdout.write(failed.output)
        print(f"kproxy: {failed}", flush=True)
        return 1
    dist = Distribution({"name": "kproxy-native", "ext_modules": built,
                         "cmdclass": {"build_ext": build_ext_class(ROOT)}})
    dist.script_name = "native_build.py"
    cmd = dist.get_command_obj("build_ext")
    cmd.build_temp = str(ROOT / C_DIR / "temp")  # type: ignore[attr-defined]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        dist.run_command("build_ext")
    finally:
        os.chdir(cwd)
    write_manifest(ROOT, modules, sources)
    print(f"kproxy: compiled {len(modules)} modules in {time.monotonic() - started:.0f} s", flush=True)
    return 0


def build_ext_class(target: Path | None = None) -> type:
    """setuptools' build_ext, putting every extension under ``kproxy/_native/`` of ``target`` (the
    checkout), or of the build tree a wheel is made from (None): never beside its source."""
    from setuptools.command.build_ext import build_ext

    class NativeBuildExt(build_ext):  # type: ignore[misc]
        def get_ext_fullpath(self, ext_name: str) -> str:
            return str((target or Path(self.build_lib)) / native_file(ext_name))

    return NativeBuildExt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 0 when the in-place build is fresh")
    parser.add_argument("--force", action="store_true", help="build even when fresh")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if is_fresh() else 1
    return build_in_place(force=args.force)


if __name__ == "__main__":
    sys.exit(main())
