#!/usr/bin/env python3
"""Generate kproxy's compact protocol tables from Kafka's JSON message specs.

Usage: python scripts/gen_protocol_tables.py [SPECS_DIR] [--check]

SPECS_DIR defaults to ../shared/kafka-specs next to the checkout. The outputs,
``kproxy/protocol/_tables.py`` and ``kproxy/protocol/api_keys.py`` (each api key as a
plain int constant), hold facts only (field names, types, version ranges, tags,
defaults): no prose from the specs. kproxy never reads the specs at run time;
``--check`` exits 1 when a committed output differs from what the specs give (the
test suite runs it when the specs are present).

Merging rule (from the specs' README): for every version, the newest spec file
whose ``validVersions`` holds it wins. Folders are listed oldest first below.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "kproxy" / "protocol" / "_tables.py"
API_KEYS_OUT = ROOT / "kproxy" / "protocol" / "api_keys.py"
# Oldest first: a later folder wins for the versions it covers.
FOLDERS = ("apache-kafka-4.0-snapshot", "kafka-python-3.0.12")
SEED_ERRORS = "seeds/002_d894aee6dcf38706.txt"
MAX_VERSION = 0x7FFF

PRIMITIVES = {
    "bool", "int8", "int16", "int32", "int64", "uint16", "uint32", "float64",
    "string", "bytes", "records", "uuid",
}


def strip_comments(text: str) -> str:
    """The specs are JSON with // line comments."""
    return re.sub(r"^\s*//.*$", "", text, flags=re.M)


def version_range(spec: str | None) -> tuple[int, int] | None:
    """'3+' -> (3, MAX), '1-4' -> (1, 4), '5' -> (5, 5), 'none'/None -> None."""
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return (int(spec[:-1]), MAX_VERSION)
    if "-" in spec:
        lo, hi = spec.split("-")
        return (int(lo), int(hi))
    return (int(spec), int(spec))


def snake(name: str) -> str:
    """Kafka's CamelCase field names in snake_case: 'IsrNodes' -> 'isr_nodes'."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


def parse_default(ftype: str, raw: Any) -> Any:
    """Spec defaults are strings or numbers; give them Python values.

    ``None`` means the spec gives no default; an explicit null stays "null".
    """
    if raw is None or raw == "null":
        return raw
    if isinstance(raw, bool):
        return raw
    if ftype.startswith("[]") or ftype not in PRIMITIVES:
        return raw
    if ftype == "bool":
        return str(raw).lower() == "true"
    if ftype in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        text = str(raw)
        return int(text, 16) if text.lower().startswith("0x") else int(text)
    if ftype == "float64":
        return float(raw)
    return raw


def convert_fields(fields: list[dict[str, Any]], common: dict[str, list[dict[str, Any]]]) -> tuple[Any, ...]:
    out = []
    seen: set[str] = set()
    for f in fields:
        ftype = f["type"]
        base = ftype[2:] if ftype.startswith("[]") else ftype
        sub: tuple[Any, ...] | None = None
        if base not in PRIMITIVES:
            body = f.get("fields")
            if body is None:
                body = common[base]
            sub = convert_fields(body, common)
        name = snake(f["name"])
        if name in seen:
            raise SystemExit(f"duplicate field name {name}")
        seen.add(name)
        out.append((
            name,
            ftype if sub is None else ("[]" if ftype.startswith("[]") else "") + "struct",
            version_range(f["versions"]),
            version_range(f.get("nullableVersions")),
            None if f.get("tag") is None else int(f["tag"]),  # one spec spells a tag "0"
            version_range(f.get("taggedVersions")),
            parse_default(ftype, f.get("default")),
            sub,
            f.get("entityType"),
        ))
    return tuple(out)


def load_specs(specs: Path) -> tuple[dict[int, str], dict[tuple[int, int], list[Any]]]:
    names: dict[int, str] = {}
    variants: dict[tuple[int, int], list[Any]] = {}
    for folder in FOLDERS:
        for path in sorted((specs / folder).glob("*.json")):
            spec = json.loads(strip_comments(path.read_text()))
            kind = spec["type"]
            if kind not in ("request", "response") or "apiKey" not in spec:
                continue
            key = spec["apiKey"]
            if kind == "request":
                names[key] = spec["name"].removesuffix("Request")
            valid = version_range(spec["validVersions"])
            if valid is None:
                continue
            flex = version_range(spec["flexibleVersions"])
            common = {c["name"]: c["fields"] for c in spec.get("commonStructs", [])}
            entry = (valid[0], valid[1], flex[0] if flex else None, convert_fields(spec["fields"], common))
            # Newer folder first: lookups take the first variant holding a version.
            variants.setdefault((key, 0 if kind == "request" else 1), []).insert(0, entry)
    return names, variants


def load_deprecated(specs: Path) -> dict[int, tuple[int, int]]:
    """Api key -> the request versions its spec marks deprecated (``deprecatedVersions``): the
    newest folder that marks any wins."""
    deprecated: dict[int, tuple[int, int]] = {}
    for folder in FOLDERS:
        for path in sorted((specs / folder).glob("*Request.json")):
            spec = json.loads(strip_comments(path.read_text()))
            span = version_range(spec.get("deprecatedVersions"))
            if spec.get("type") == "request" and "apiKey" in spec and span is not None:
                deprecated.setdefault(spec["apiKey"], span)
    return deprecated


def load_errors(shared: Path) -> dict[int, tuple[str, bool]]:
    """Error codes, names and retriable flags: the official guide's table first."""
    errors: dict[int, tuple[str, bool]] = {}
    pattern = re.compile(r"^([A-Z][A-Z0-9_]+) (-?\d+) (True|False)\b")
    for line in (shared / SEED_ERRORS).read_text().splitlines():
        m = pattern.match(line)
        if m:
            errors[int(m.group(2))] = (m.group(1), m.group(3) == "True")
    # The guide stops at 104; kafka-python (a test dependency) knows the newer codes.
    import inspect

    import kafka.errors

    for obj in vars(kafka.errors).values():
        code = getattr(obj, "errno", None)
        if inspect.isclass(obj) and isinstance(code, int) and code not in errors:
            errors[code] = (obj.message, bool(getattr(obj, "retriable", False)))
    return errors


def render(names: dict[int, str], variants: dict[tuple[int, int], list[Any]],
           errors: dict[int, tuple[str, bool]], deprecated: dict[int, tuple[int, int]]) -> str:
    lines = [
        "# Generated by scripts/gen_protocol_tables.py from Kafka's JSON message specs",
        "# and the error table of the protocol guide. Facts only. Do not edit by hand.",
        "# fmt: off",
        "# Field: (name, type, versions, nullable_versions, tag, tagged_versions, default, fields, entity_type)",
        "# Variant: (first_version, last_version, first_flexible_version | None, fields)",
        "from enum import IntEnum",
        "from typing import Any",
        "",
        f"MAX_VERSION = {MAX_VERSION}",
        "",
        "API_NAMES: dict[int, str] = {",
    ]
    lines += [f"    {k}: {names[k]!r}," for k in sorted(names)]
    lines += ["}", "", "ERRORS: dict[int, tuple[str, bool]] = {"]
    lines += [f"    {k}: {errors[k]!r}," for k in sorted(errors)]
    lines += ["}", ""]
    lines += render_enums(names, errors)
    lines += ["", "# Api key -> (first, last) request version its spec marks deprecated.",
              "DEPRECATED_VERSIONS: dict[int, tuple[int, int]] = {"]
    lines += [f"    {k}: {deprecated[k]!r}," for k in sorted(deprecated)]
    lines += ["}"]
    lines += ["", "MESSAGES: dict[tuple[int, int], tuple[Any, ...]] = {"]
    for key in sorted(variants):
        lines.append(f"    {key!r}: (")
        for v in variants[key]:
            lines.append(f"        ({v[0]}, {v[1]}, {v[2]!r}, (")
            for field in v[3]:
                lines.append(f"            {field!r},")
            lines.append("        )),")
        lines.append("    ),")
    lines += ["}", ""]
    return "\n".join(lines)


def enum_member(name: str) -> str:
    """A Python identifier in Kafka's own constant style: 'FindCoordinator' -> 'FIND_COORDINATOR'."""
    member = snake(name).upper()
    if not member.isidentifier():
        raise SystemExit(f"{name!r} makes no enum member name")
    return member


def render_enums(names: dict[int, str], errors: dict[int, tuple[str, bool]]) -> list[str]:
    """``ApiKey`` and ``ErrorCode`` (IntEnums, members named as Kafka's ApiKeys and Errors
    enums name them) and ``RETRIABLE``, the codes Kafka marks retriable."""
    lines = ["", "class ApiKey(IntEnum):", '    """Kafka\'s api keys."""', ""]
    members = {enum_member(names[k]): k for k in sorted(names)}
    if len(members) != len(names):
        raise SystemExit("two api names make the same enum member")
    lines += [f"    {m} = {k}" for m, k in members.items()]
    lines += ["", "", "RETRIABLE: frozenset[int] = frozenset({"]
    lines += [f"    {k}," for k in sorted(errors) if errors[k][1]]
    lines += ["})", "", "", "class ErrorCode(IntEnum):",
              '    """Kafka\'s error codes; ``retriable`` is Kafka\'s own flag (the client retries by itself)."""', ""]
    codes = {errors[k][0]: k for k in sorted(errors)}
    if len(codes) != len(errors) or not all(name.isidentifier() for name in codes):
        raise SystemExit("error names are not unique identifiers")
    lines += [f"    {name} = {k}" for name, k in codes.items()]
    lines += ["", "    @property", "    def retriable(self) -> bool:", "        return self.value in RETRIABLE", ""]
    return lines


def render_api_keys(names: dict[int, str]) -> str:
    """``api_keys.py``: each api key as a ``Final`` int named as its ``ApiKey`` member. Code that
    compares api keys per frame imports these: a plain int compares faster than an ``IntEnum``
    member, and mypyc inlines a ``Final`` int literal of an imported module into its callers."""
    lines = [
        '"""Kafka\'s api keys as plain int constants, named as :class:`kproxy.protocol.codes.ApiKey` names',
        "them: what per-frame code compares api keys with (an ``int == IntEnum`` comparison goes through",
        "the enum's ``__eq__``; mypyc inlines these literals into compiled callers).",
        "",
        "Generated by scripts/gen_protocol_tables.py with ``_tables.py``, from the same specs. Do not edit",
        'by hand."""',
        "",
        "from typing import Final",
        "",
    ]
    lines += [f"{enum_member(names[k])}: Final = {k}" for k in sorted(names)]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if not a.startswith("--")]
    shared = Path(args[0]).resolve().parent if args else ROOT.parent / "shared"
    specs = Path(args[0]) if args else shared / "kafka-specs"
    names, variants = load_specs(specs)
    outputs = {OUT: render(names, variants, load_errors(shared), load_deprecated(specs)),
               API_KEYS_OUT: render_api_keys(names)}
    if check:
        stale = [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path} is stale: run scripts/gen_protocol_tables.py")
        if not stale:
            print("tables up to date")
        return 1 if stale else 0
    for path, text in outputs.items():
        path.write_text(text)
        print(f"wrote {path} ({len(text)} bytes)")
    print(f"{len(variants)} message kinds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
