"""Compile message schemas into specialised Python decoders, encoders and skippers.

An interpreter that walks a schema tree per byte is slow in Python; a few lines
of straight code per struct are not. For every struct of a :class:`MessageSchema`
this module writes Python source once (runs of fixed-width fields become a
single ``struct`` call, arrays of ints one ``unpack_from``), ``exec``s it, and
caches the functions per (api key, version, direction).

The generated code reads and writes through the primitives of
:mod:`kproxy.protocol.primitives` (varints, :class:`~kproxy.protocol.primitives.Malformed`), named in its
namespace by :mod:`kproxy.protocol.codegen_runtime`; :meth:`SchemaCompiler.build` returns a
:class:`CompiledSchema`.

One compiler, whose emit methods for decode, encode and skip recurse into each other per
field type (:mod:`kproxy.protocol.scan` subclasses it); what the generated code runs with (its
checks, the varint functions, the array readers) is :mod:`kproxy.protocol.codegen_runtime`.

Each schema gets two builds:

* the *fast* build, used for every call;
* a *traced* build with the same logic that records the byte offset and the
  field path before each read or write. It only runs after the fast build
  failed, to turn a bare ``struct.error`` into a :class:`DecodeError` that says
  where and what. Valid input never pays for diagnostics.

Contracts of the generated functions (``buf`` is ``bytes``):

* ``decode(buf, pos) -> (dict, pos)``: keys are the snake_case field names of
  this version; tagged fields appear only when present on the wire; unknown
  tagged fields are kept under ``"_unknown_tags"`` as ``{tag: raw bytes}``.
* ``encode(out: bytearray, value: dict) -> None`` appends the wire form.
* ``skip(buf, pos) -> pos`` moves past one value without building it.

Decoding is canonical: bytes that would not re-encode to themselves are a
``Malformed`` input (a bool byte other than 0/1, a varint not in its shortest
form, tagged fields out of order or repeated, a nullable-struct marker other
than -1/1). That keeps the round-trip contract true for *every* input that
decodes. Kafka's own encoders only write canonical bytes, and the proxy
forwards frames it does not rewrite untouched, so strictness drops nothing.

Null is accepted for strings, bytes, records and arrays in every version on
decode and written back as null on encode: kproxy must re-emit what a client
sent even when the client broke the spec's nullability (Metadata v0 requests
with a null topic list exist in the wild), so nullability is enforced by
neither side.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from kproxy.protocol.codegen_runtime import ARRAY_CACHE, BASE_NAMESPACE, DECODE_FORMAT, min_wire_size
from kproxy.protocol.message_schemas import FIXED_WIDTH, STRUCT_FORMAT, Field, MessageSchema


class FieldFunctions(NamedTuple):
    """The standalone functions of one top-level field's value (the splice path)."""

    decode: Callable[..., Any]  # (buf, pos) -> (value, pos)
    encode: Callable[..., Any]  # (out, value) -> None
    skip: Callable[..., Any]  # (buf, pos) -> pos


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """What :meth:`SchemaCompiler.build` gives for one schema.

    ``decode``/``encode``/``skip`` follow the contracts in the module docstring
    (the traced build's take ``trace, path`` after them); ``fields`` holds the
    functions of every top-level field by name; ``source`` is the generated code.
    """

    decode: Callable[..., Any]
    encode: Callable[..., Any]
    skip: Callable[..., Any]
    fields: Mapping[str, FieldFunctions]
    source: str


class _Writer:
    """Accumulates generated source with indentation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def indent(self) -> _Writer:
        self.depth += 1
        return self

    def dedent(self) -> None:
        self.depth -= 1


class SchemaCompiler:
    """Writes the functions for one schema; ``traced`` selects the diagnostic build."""

    def __init__(self, schema: MessageSchema, traced: bool) -> None:
        self.schema = schema
        self.flexible = schema.flexible
        self.traced = traced
        self.w = _Writer()
        self.ns: dict[str, Any] = dict(BASE_NAMESPACE)
        self.counter = 0
        self.struct_names: dict[int, tuple[str, str, str]] = {}

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    def constant(self, stem: str, value: Any) -> str:
        name = self.fresh(stem)
        self.ns[name] = value
        return name

    # -- tracing hooks -------------------------------------------------------------
    def trace(self, path: str, at: str = "pos") -> None:
        if self.traced:
            self.w(f"tr[0] = {at}; tr[1] = {path}")

    def sig(self, params: str) -> str:
        return f"{params}, tr, path" if self.traced else params

    def call(self, fn: str, args: str, path: str) -> str:
        return f"{fn}({args}, tr, {path})" if self.traced else f"{fn}({args})"

    # -- building ------------------------------------------------------------------
    def build(self) -> CompiledSchema:
        top = self.struct_functions(self.schema.fields, "Top")
        # One value codec per top-level field, for the splice path.
        fields: dict[str, tuple[str, str, str]] = {}
        for field in self.schema.fields:
            fields[field.name] = self.field_functions(field)
        source = "\n".join(self.w.lines) + "\n"
        code = compile(source, f"<kproxy codec {self.schema.name} v{self.schema.api_version}>", "exec")
        exec(code, self.ns)
        ns = self.ns
        return CompiledSchema(
            decode=ns[top[0]], encode=ns[top[1]], skip=ns[top[2]],
            fields=MappingProxyType({name: FieldFunctions(ns[dec], ns[enc], ns[skip])
                                     for name, (dec, enc, skip) in fields.items()}),
            source=source)

    def struct_functions(self, fields: tuple[Field, ...], stem: str) -> tuple[str, str, str]:
        # Sub-structs first: a function's source cannot be written inside another's.
        for f in fields:
            if f.type == "struct" and f.fields is not None:
                self.struct_functions(f.fields, f.name)
        dec = self.fresh(f"dec_{stem}_")
        enc = self.fresh(f"enc_{stem}_")
        skip = self.fresh(f"skip_{stem}_")
        self.struct_names[id(fields)] = (dec, enc, skip)
        self.emit_struct_decode(dec, fields)
        self.emit_struct_encode(enc, fields)
        self.emit_struct_skip(skip, fields)
        return dec, enc, skip

    def field_functions(self, field: Field) -> tuple[str, str, str]:
        """Standalone (decode, encode, skip) of one field's value."""
        dec = self.fresh(f"fdec_{field.name}_")
        enc = self.fresh(f"fenc_{field.name}_")
        skip = self.fresh(f"fskip_{field.name}_")
        w = self.w
        w(f"def {dec}({self.sig('buf, pos')}):")
        w.indent()
        if self.traced:
            w(f"path = path + {('.' + field.name)!r}")
        self.emit_value_decode(field, "v", "path" if self.traced else "''")
        w("return v, pos")
        w.dedent()
        w(f"def {enc}({self.sig('out, v')}):")
        w.indent()
        if self.traced:
            w(f"path = path + {('.' + field.name)!r}")
        self.emit_value_encode(field, "v", "path" if self.traced else "''")
        w("return None")
        w.dedent()
        w(f"def {skip}(buf, pos):")
        w.indent()
        self.emit_value_skip(field)
        w("return pos")
        w.dedent()
        return dec, enc, skip

    # -- decode --------------------------------------------------------------------
    def emit_struct_decode(self, name: str, fields: tuple[Field, ...]) -> None:
        w = self.w
        w(f"def {name}({self.sig('buf, pos')}):")
        w.indent()
        w("d = {}")
        regular = [f for f in fields if f.tag is None]
        i = 0
        while i < len(regular):
            run = self.fixed_run(regular, i)
            if len(run) > 1:
                fmt = ">" + "".join(DECODE_FORMAT[f.type] for f in run)
                unpacker = self.constant("U", struct.Struct(fmt).unpack_from)
                targets = ", ".join(f"d[{f.name!r}]" for f in run)
                w(f"{targets} = {unpacker}(buf, pos)")
                for f in run:
                    if f.type == "bool":
                        w(f"d[{f.name!r}] = _bool(d[{f.name!r}])")
                w(f"pos += {struct.calcsize(fmt)}")
                i += len(run)
                continue
            field = regular[i]
            path = f"path + {('.' + field.name)!r}" if self.traced else "''"
            self.emit_value_decode(field, f"d[{field.name!r}]", path)
            i += 1
        if self.flexible:
            self.emit_tags_decode(fields)
        w("return d, pos")
        w.dedent()

    def fixed_run(self, fields: list[Field], start: int) -> list[Field]:
        if self.traced:
            return [fields[start]]
        run = []
        for f in fields[start:]:
            if f.array or f.type not in STRUCT_FORMAT:
                break
            run.append(f)
        return run or [fields[start]]

    def emit_len(self, kind: str, target: str) -> None:
        """Read a length/count prefix into ``target``; null (-1) stays -1."""
        w = self.w
        if self.flexible:
            w(f"{target} = buf[pos]")
            w(f"if {target} < 0x80: pos += 1")
            w(f"else: {target}, pos = read_uvarint(buf, pos)")
            w(f"{target} -= 1")
        else:
            fmt = ">h" if kind == "string" else ">i"
            unp = self.constant("U", struct.Struct(fmt).unpack_from)
            w(f"{target}, = {unp}(buf, pos)")
            w(f"pos += {struct.calcsize(fmt)}")
            w(f"if {target} < -1: raise Malformed('negative length ' + str({target}))")

    def emit_value_decode(self, field: Field, target: str, path: str) -> None:
        w = self.w
        self.trace(path)
        if field.array:
            n = self.fresh("n")
            self.emit_len("array", n)
            w(f"if {n} < 0: {target} = None")
            w("else:")
            w.indent()
            elem = self.element(field)
            if elem.type in STRUCT_FORMAT and elem.type != "bool" and not self.traced:
                # unpack_from checks the buffer's length before it allocates: no count check needed.
                c = STRUCT_FORMAT[elem.type]
                w(f"if {n} < {ARRAY_CACHE}: {target} = list(AU_{ord(c)}[{n}](buf, pos))")
                w(f"else: {target} = list(unpack_from('>%d{c}' % {n}, buf, pos))")
                w(f"pos += {FIXED_WIDTH[elem.type]} * {n}")
            else:
                size = min_wire_size(elem, self.flexible)
                w(f"if {n} * {max(size, 1)} > len(buf) - pos: _count({n}, pos, buf, {max(size, 1)})")
                lst = self.fresh("lst")
                idx = self.fresh("i")
                w(f"{lst} = []")
                w(f"for {idx} in range({n}):")
                w.indent()
                item = self.fresh("item")
                ipath = f"{path} + '[' + str({idx}) + ']'" if self.traced else "''"
                self.emit_scalar_decode(elem, item, ipath)
                w(f"{lst}.append({item})")
                w.dedent()
                w(f"{target} = {lst}")
            w.dedent()
        else:
            self.emit_scalar_decode(field, target, path)

    def element(self, field: Field) -> Field:
        return Field(field.name, field.type, False, False, None, None, field.fields, field.entity_type)

    def emit_scalar_decode(self, field: Field, target: str, path: str) -> None:
        w = self.w
        t = field.type
        self.trace(path)
        if t in STRUCT_FORMAT:
            unp = self.constant("U", struct.Struct(">" + DECODE_FORMAT[t]).unpack_from)
            w(f"{target}, = {unp}(buf, pos)")
            if t == "bool":
                w(f"{target} = _bool({target})")
            w(f"pos += {FIXED_WIDTH[t]}")
        elif t == "uuid":
            w("if pos + 16 > len(buf): _check_len(buf, pos + 16)")
            w(f"{target} = _uuid_from(buf[pos:pos + 16])")
            w("pos += 16")
        elif t in ("string", "bytes", "records"):
            n = self.fresh("n")
            self.emit_len(t, n)
            w(f"if {n} < 0: {target} = None")
            w("else:")
            w.indent()
            w(f"end = pos + {n}")
            w("if end > len(buf): _check_len(buf, end)")
            conv = "buf[pos:end].decode('utf-8')" if t == "string" else "buf[pos:end]"
            w(f"{target} = {conv}")
            w("pos = end")
            w.dedent()
        elif t == "struct":
            dec = self.struct_fns(field)[0]
            if field.nullable:
                w("if buf[pos] == 0xFF:")
                w.indent()
                w(f"{target} = None")
                w("pos += 1")
                w.dedent()
                w("elif buf[pos] != 1: raise Malformed('nullable struct marker ' + str(buf[pos]) + ', not -1 or 1')")
                w("else:")
                w.indent()
                w(f"{target}, pos = {self.call(dec, 'buf, pos + 1', path)}")
                w.dedent()
            else:
                w(f"{target}, pos = {self.call(dec, 'buf, pos', path)}")
        else:
            raise AssertionError(f"unknown type {t}")

    def emit_tags_decode(self, fields: tuple[Field, ...]) -> None:
        w = self.w
        tagged = [f for f in fields if f.tag is not None]
        self.trace("path + '._tagged_fields'" if self.traced else "''")
        w("nt = buf[pos]")
        w("if nt < 0x80: pos += 1")
        w("else: nt, pos = read_uvarint(buf, pos)")
        w("if nt:")
        w.indent()
        w("_count(nt, pos, buf, 2)")
        w("unknown = None")
        w("last = -1")
        w("for _ in range(nt):")
        w.indent()
        w("tag, pos = read_uvarint(buf, pos)")
        w("if tag <= last: raise Malformed('tagged field ' + str(tag) + ' out of order or repeated')")
        w("last = tag")
        w("size, pos = read_uvarint(buf, pos)")
        w("tend = pos + size")
        w("if tend > len(buf): _check_len(buf, tend)")
        first = True
        for f in tagged:
            kw = "if" if first else "elif"
            first = False
            w(f"{kw} tag == {f.tag}:")
            w.indent()
            path = f"path + {('.' + f.name)!r}" if self.traced else "''"
            self.emit_value_decode(f, f"d[{f.name!r}]", path)
            w("if pos != tend: raise Malformed('tagged field ' + str(tag) + ' size mismatch')")
            w.dedent()
        if tagged:
            w("else:")
            w.indent()
        w("if unknown is None: unknown = d[UNKNOWN_TAGS] = {}")
        w("unknown[tag] = buf[pos:tend]")
        w("pos = tend")
        if tagged:
            w.dedent()
        w.dedent()
        w.dedent()

    # -- encode --------------------------------------------------------------------
    def emit_struct_encode(self, name: str, fields: tuple[Field, ...]) -> None:
        w = self.w
        w(f"def {name}({self.sig('out, d')}):")
        w.indent()
        regular = [f for f in fields if f.tag is None]
        i = 0
        while i < len(regular):
            run = self.fixed_run(regular, i)
            if len(run) > 1:
                fmt = ">" + "".join(STRUCT_FORMAT[f.type] for f in run)
                packer = self.constant("P", struct.Struct(fmt).pack)
                args = ", ".join(f"d[{f.name!r}]" for f in run)
                w(f"out += {packer}({args})")
                i += len(run)
                continue
            field = regular[i]
            path = f"path + {('.' + field.name)!r}" if self.traced else "''"
            self.trace(path, "len(out)")
            w(f"v = d[{field.name!r}]")
            self.emit_value_encode(field, "v", path)
            i += 1
        if self.flexible:
            self.emit_tags_encode(fields)
        w("return None")
        w.dedent()

    def emit_write_len(self, kind: str, n: str) -> None:
        """Write a length/count ``n`` (already >= 0)."""
        w = self.w
        if self.flexible:
            w(f"if {n} < 0x7F: out.append({n} + 1)")
            w(f"else: write_uvarint(out, {n} + 1)")
        else:
            fmt = ">h" if kind == "string" else ">i"
            packer = self.constant("P", struct.Struct(fmt).pack)
            w(f"out += {packer}({n})")

    def null_marker(self, kind: str) -> bytes:
        if self.flexible:
            return b"\x00"
        return b"\xff\xff" if kind == "string" else b"\xff\xff\xff\xff"

    def emit_value_encode(self, field: Field, var: str, path: str) -> None:
        w = self.w
        if field.array:
            w(f"if {var} is None: out += {self.null_marker('array')!r}")
            w("else:")
            w.indent()
            n = self.fresh("n")
            w(f"{n} = len({var})")
            self.emit_write_len("array", n)
            elem = self.element(field)
            if elem.type in STRUCT_FORMAT and not self.traced:
                c = STRUCT_FORMAT[elem.type]
                w(f"if {n} < {ARRAY_CACHE}: out += AP_{ord(c)}[{n}](*{var})")
                w(f"else: out += pack('>%d{c}' % {n}, *{var})")
            else:
                item = self.fresh("item")
                idx = self.fresh("i")
                w(f"for {idx}, {item} in enumerate({var}):")
                w.indent()
                ipath = f"{path} + '[' + str({idx}) + ']'" if self.traced else "''"
                self.trace(ipath, "len(out)")
                self.emit_scalar_encode(elem, item, ipath)
                w.dedent()
            w.dedent()
        else:
            self.emit_scalar_encode(field, var, path)

    def emit_scalar_encode(self, field: Field, var: str, path: str) -> None:
        w = self.w
        t = field.type
        if t in STRUCT_FORMAT:
            packer = self.constant("P", struct.Struct(">" + STRUCT_FORMAT[t]).pack)
            w(f"out += {packer}({var})")
        elif t == "uuid":
            w(f"out += {var}.bytes")
        elif t in ("string", "bytes", "records"):
            w(f"if {var} is None: out += {self.null_marker(t)!r}")
            w("else:")
            w.indent()
            raw = self.fresh("raw")
            w(f"{raw} = {var}.encode('utf-8') if {var}.__class__ is str else {var}" if t == "string"
              else f"{raw} = {var}")
            n = self.fresh("n")
            w(f"{n} = len({raw})")
            self.emit_write_len(t, n)
            w(f"out += {raw}")
            w.dedent()
        elif t == "struct":
            enc = self.struct_fns(field)[1]
            if field.nullable:
                w(f"if {var} is None: out.append(0xFF)")
                w("else:")
                w.indent()
                w("out.append(1)")
                w(self.call(enc, f"out, {var}", path))
                w.dedent()
            else:
                w(self.call(enc, f"out, {var}", path))
        else:
            raise AssertionError(f"unknown type {t}")

    def emit_tags_encode(self, fields: tuple[Field, ...]) -> None:
        w = self.w
        tagged = [f for f in fields if f.tag is not None]
        names = [f.name for f in tagged] + ["_unknown_tags"]
        cond = " or ".join(f"{n!r} in d" for n in names)
        w(f"if not ({cond}): out.append(0)")
        w("else:")
        w.indent()
        w("tags = []")
        for f in tagged:
            w(f"if {f.name!r} in d:")
            w.indent()
            w("sub = bytearray()")
            w(f"v = d[{f.name!r}]")
            path = f"path + {('.' + f.name)!r}" if self.traced else "''"
            # encode into `sub`: temporarily rebind `out`
            w("outer = out; out = sub")
            self.emit_value_encode(f, "v", path)
            w("out = outer")
            w(f"tags.append(({f.tag}, bytes(sub)))")
            w.dedent()
        w("if UNKNOWN_TAGS in d: tags.extend(d[UNKNOWN_TAGS].items())")
        w("tags.sort(key=lambda t: t[0])")
        w("write_uvarint(out, len(tags))")
        w("for tag, data in tags:")
        w.indent()
        w("write_uvarint(out, tag)")
        w("write_uvarint(out, len(data))")
        w("out += data")
        w.dedent()
        w.dedent()

    # -- skip ----------------------------------------------------------------------
    def emit_struct_skip(self, name: str, fields: tuple[Field, ...]) -> None:
        w = self.w
        w(f"def {name}(buf, pos):")
        w.indent()
        fixed = 0
        for field in fields:
            if field.tag is not None:
                continue
            if not field.array and field.type in FIXED_WIDTH:
                fixed += FIXED_WIDTH[field.type]
                continue
            if not field.array and field.type == "uuid":
                fixed += 16
                continue
            if fixed:
                w(f"pos += {fixed}")
                fixed = 0
            self.emit_value_skip(field)
        if fixed:
            w(f"pos += {fixed}")
        if self.flexible:
            self.emit_tags_skip()
        w("if pos > len(buf): _check_len(buf, pos)")
        w("return pos")
        w.dedent()

    def emit_tags_skip(self) -> None:
        """Move past a tagged-field section without reading any tag."""
        w = self.w
        w("nt = buf[pos]")
        w("if nt < 0x80: pos += 1")
        w("else: nt, pos = read_uvarint(buf, pos)")
        w("for _ in range(nt):")
        w.indent()
        w("tag, pos = read_uvarint(buf, pos)")
        w("size, pos = read_uvarint(buf, pos)")
        w("pos += size")
        w.dedent()

    def emit_value_skip(self, field: Field) -> None:
        w = self.w
        if field.array:
            n = self.fresh("n")
            self.emit_len("array", n)
            elem = self.element(field)
            if elem.type in FIXED_WIDTH:
                w(f"if {n} > 0: pos += {FIXED_WIDTH[elem.type]} * {n}")
            elif elem.type == "uuid":
                w(f"if {n} > 0: pos += 16 * {n}")
            else:
                size = max(min_wire_size(elem, self.flexible), 1)
                w(f"if {n} * {size} > len(buf) - pos: _count({n}, pos, buf, {size})")
                w(f"for _ in range({n}):")
                w.indent()
                self.emit_scalar_skip(elem)
                w.dedent()
            w("if pos > len(buf): _check_len(buf, pos)")
        else:
            self.emit_scalar_skip(field)

    def emit_scalar_skip(self, field: Field) -> None:
        w = self.w
        t = field.type
        if t in FIXED_WIDTH:
            w(f"pos += {FIXED_WIDTH[t]}")
        elif t == "uuid":
            w("pos += 16")
        elif t in ("string", "bytes", "records"):
            n = self.fresh("n")
            self.emit_len(t, n)
            w(f"if {n} > 0: pos += {n}")
        elif t == "struct":
            skip = self.struct_fns(field)[2]
            if field.nullable:
                w(f"pos = pos + 1 if buf[pos] == 0xFF else {skip}(buf, pos + 1)")
            else:
                w(f"pos = {skip}(buf, pos)")
        else:
            raise AssertionError(f"unknown type {t}")

    def struct_fns(self, field: Field) -> tuple[str, str, str]:
        assert field.fields is not None
        return self.struct_names[id(field.fields)]
