"""The partial decoder of the hot path: what metrics and rules need, nothing more.

:func:`scan_body` walks a request or response body with generated code that
reads only topic names/ids, partition indexes and error codes, and *skips*
everything else by length: strings are not decoded, records are not touched
(their byte ranges are noted so records can be counted later, on demand).

What a scan reports, as :class:`BodyScan.entries`, a list of
``(topic, partition, error_code)``:

* one entry per partition-level struct (a struct with a partition index field
  under a topic): ``(topic, partition, code)``, ``code`` being ``None`` where
  that struct has no error code (requests);
* one entry per struct that has an error code but no partition:
  ``(topic or None, None, code)``; top-level codes are ``(None, None, code)``;
* one entry per topic-level struct that has neither partitions nor an error
  code (``Metadata`` or ``DeleteTopics`` requests): ``(topic, None, None)``.

``topic`` is the topic name, or its :class:`uuid.UUID` where the message only
carries a topic id (Fetch v13+).

The values mode (``scanner(..., values=True)``) also reads the few fields consumer lag is made of
(:data:`OFFSET_FIELDS`: committed offsets, high watermarks, listed offsets, group ids, topic ids)
in the same walk, into the ``values`` list of the :class:`ScanEntries` it fills:

* ``(topic, partition, code, value)`` per partition-level struct holding one of them (``code``
  None where the struct has no error code);
* ``(topic or None, value, code)`` per other struct holding one (a group, a topic of a Metadata
  answer, the top level), appended when the struct ends: after its partitions' entries.

Shortcuts for the per-request path: :func:`scan_request`, the one scan of a
request body that every reader of it shares (the proxy session keeps it on the
exchange: rules read its topics, metrics and capture its records ranges);
:func:`~kproxy.protocol.produce_scan.produce_answer_errors`, the errors-only scan of the Produce answer a
producer usually gets (one topic, one partition), read by hand; and
:func:`~kproxy.protocol.fetch_scan.fetch_answer_scan`, the same of a KIP-951 consumer's usual Fetch
answer (v16-v17, no tagged fields).
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kproxy.protocol.api_keys import PRODUCE
from kproxy.protocol.codegen import SchemaCompiler
from kproxy.protocol.errors import DecodeError, UnknownApiError
from kproxy.protocol.message_schemas import PARTITION_FIELDS, Field, MessageSchema, MessageType, message_schema
from kproxy.protocol.offset_reads import OFFSET_FIELDS
from kproxy.protocol.produce_scan import produce_request_scan
from kproxy.protocol.scan_types import Entry as Entry
from kproxy.protocol.scan_types import RecordsRange as RecordsRange
from kproxy.protocol.scan_types import RequestScan as RequestScan
from kproxy.protocol.scan_types import ScanEntries
from kproxy.protocol.scan_types import Topic as Topic

# Request kinds whose shared scan (scan_request) is made in values mode.
_VALUE_REQUESTS = frozenset(api for api, direction in OFFSET_FIELDS if direction is MessageType.REQUEST)

_TOPIC_PARTITION_FIELDS = PARTITION_FIELDS | {"index"}


def _is_topic_name(f: Field) -> bool:
    return f.entity_type == "topicName" and f.type == "string" and not f.array and f.tag is None


def _is_topic_id(f: Field) -> bool:
    return f.name == "topic_id" and f.type == "uuid" and not f.array and f.tag is None


def _is_partition(f: Field) -> bool:
    return f.name in _TOPIC_PARTITION_FIELDS and f.type == "int32" and not f.array and f.tag is None


def _is_error(f: Field) -> bool:
    return f.is_error_code and f.tag is None


def _is_topic_struct(fields: tuple[Field, ...]) -> bool:
    return any(_is_topic_name(f) or _is_topic_id(f) for f in fields)


def request_names_topics(api_key: int, api_version: int) -> tuple[bool, bool]:
    """Whether a request of this kind can name topics, and partitions under them, as a scan of it
    reports them (what the rules' ``topic`` and ``partition`` keys are matched against): (topics,
    partitions); (False, False) for a kind the tables do not know."""
    schema = message_schema(api_key, api_version, MessageType.REQUEST)
    return (False, False) if schema is None else _names_topics(schema.fields, False)


def _names_topics(fields: tuple[Field, ...], under_topic: bool) -> tuple[bool, bool]:
    topic = under_topic or _is_topic_struct(fields)
    topics, partitions = topic, topic and any(_is_partition(f) for f in fields)
    for f in fields:
        if f.type == "struct" and f.fields is not None and f.tag is None:
            t, p = _names_topics(f.fields, topic)
            topics, partitions = topics or t, partitions or p
    return topics, partitions


def _interesting(fields: tuple[Field, ...]) -> bool:
    for f in fields:
        if f.tag is not None:
            continue
        if _is_topic_name(f) or _is_topic_id(f) or _is_partition(f) or _is_error(f) or f.type == "records":
            return True
        if f.type == "struct" and f.fields is not None and _interesting(f.fields):
            return True
    return False


def _has_errors(fields: tuple[Field, ...]) -> bool:
    """Does this subtree hold error codes or records (what an errors-only scan reads)?"""
    for f in fields:
        if f.tag is not None:
            continue
        if _is_error(f) or f.type == "records":
            return True
        if f.type == "struct" and f.fields is not None and _has_errors(f.fields):
            return True
    return False


def _has_partition_children(fields: tuple[Field, ...]) -> bool:
    for f in fields:
        if f.type == "struct" and f.fields is not None and f.tag is None and (
            any(_is_partition(g) for g in f.fields) or _has_partition_children(f.fields)
        ):
            return True
    return False


class _ScanCompiler(SchemaCompiler):
    """Adds ``scan_S(buf, pos, acc, recs, topic) -> pos`` functions to the skip build.

    Each records field met is appended to ``recs`` as ``(start, end, topic)`` (a
    :data:`RecordsRange`), ``topic`` being the enclosing topic struct's name or id.

    ``errors_only``: record only non-zero error codes (and records ranges), skip
    subtrees without either, and stop after the last top-level field that can
    hold one (returning -1: the rest of the body is not walked, nor checked).
    """

    def __init__(self, schema: MessageSchema, errors_only: bool, values: frozenset[str] = frozenset()) -> None:
        super().__init__(schema, traced=False)
        self.errors_only = errors_only
        self.values = values  # the OFFSET_FIELDS read (values mode); empty: the plain scanner

    def _value(self, f: Field) -> bool:
        return f.tag is None and f.name in self.values and f.type != "struct"

    def _has_values(self, fields: tuple[Field, ...]) -> bool:
        return any(self._value(f) or (f.type == "struct" and f.fields is not None and f.tag is None
                                      and self._has_values(f.fields)) for f in fields)

    def _wanted(self, fields: tuple[Field, ...]) -> bool:
        wanted = _has_errors(fields) if self.errors_only else _interesting(fields)
        return wanted or (bool(self.values) and self._has_values(fields))

    def emit_value_read(self, f: Field) -> None:
        """Read a values-mode field into ``val``: an int64 array gives its first item (ListOffsets v0's
        ``old_style_offsets``, latest first), None when empty; a string (a group id) is decoded with
        bad UTF-8 replaced, so the values mode refuses no body the plain scan reads; a topic id is the
        struct's topic too when it has no name."""
        w = self.w
        if f.array:
            if f.type != "int64":
                raise AssertionError(f"values mode reads no {f.type} array ({f.name})")
            n = self.fresh("n")
            self.emit_len("array", n)
            first = self.constant("U", struct.Struct(">q").unpack_from)
            w(f"if {n} > 0:")
            w.indent()
            w(f"val, = {first}(buf, pos)")
            w(f"pos += 8 * {n}")
            w("if pos > len(buf): _check_len(buf, pos)")
            w.dedent()
            return
        if f.type == "string":  # (a group id: read leniently, as the plain scan skips it unread)
            n = self.fresh("n")
            self.emit_len("string", n)
            w(f"if {n} >= 0:")
            w.indent()
            w(f"if pos + {n} > len(buf): _check_len(buf, pos + {n})")
            w(f"val = str(buf[pos:pos + {n}], 'utf-8', 'replace')")
            w(f"pos += {n}")
            w.dedent()
            return
        self.emit_scalar_decode(f, "val", "''")
        if _is_topic_id(f):
            w("if topic is None: topic = val")

    def emit_values_append(self, ctx: str, has_partition: bool, has_error: bool) -> None:
        code = "code" if has_error else "None"
        if has_partition:
            self.w(f"acc.values.append(({ctx}, part, {code}, val))")
        else:
            self.w(f"acc.values.append(({ctx}, val, {code}))")

    def build_scan(self) -> Callable[..., int]:
        top = self.scan_struct(self.schema.fields, "Top", top=True)
        source = "\n".join(self.w.lines) + "\n"
        exec(compile(source, f"<kproxy scan {self.schema.name} v{self.schema.api_version}>", "exec"), self.ns)
        return self.ns[top]  # type: ignore[no-any-return]

    def scan_struct(self, fields: tuple[Field, ...], stem: str, top: bool = False) -> str:
        subs: dict[int, str] = {}
        for f in fields:
            if f.type == "struct" and f.fields is not None and f.tag is None and self._wanted(f.fields):
                subs[id(f)] = self.scan_struct(f.fields, f.name)
            elif f.type == "struct" and f.fields is not None:
                self.struct_functions(f.fields, f.name)  # for its skip function
        name = self.fresh(f"scan_{stem}_")
        w = self.w
        w(f"def {name}(buf, pos, acc, recs, topic):")
        w.indent()
        topic_struct = _is_topic_struct(fields)
        has_name = any(_is_topic_name(f) for f in fields)
        has_partition = any(_is_partition(f) for f in fields)
        has_error = any(_is_error(f) for f in fields)
        valued = [f for f in fields if self._value(f)]
        if len(valued) > 1:
            raise AssertionError(f"values mode reads one field per struct: {[f.name for f in valued]}")
        if topic_struct:
            w("topic = None")
        if has_partition:
            w("part = None")
        if has_error:
            w("code = None")
        if valued:
            w("val = None")
        last_wanted = max((i for i, f in enumerate(fields) if f.tag is None and (
            _is_error(f) or f.type == "records" or id(f) in subs or self._value(f))), default=-1)
        for i, f in enumerate(fields):
            if f.tag is not None:
                continue
            if top and self.errors_only and i > last_wanted:
                if has_error:
                    w("if code: acc.append((None, None, code))")
                if valued:
                    self.emit_values_append("None", has_partition, has_error)
                w("return -1")  # nothing more to find: the rest is neither walked nor checked
                w.dedent()
                return name
            if valued and f is valued[0]:
                self.emit_value_read(f)
            elif _is_topic_name(f):
                self.emit_scalar_decode(f, "topic", "''")
            elif _is_topic_id(f):
                if has_name:
                    w("if topic is None:")
                    w.indent()
                    self.emit_scalar_decode(f, "topic", "''")
                    w.dedent()
                    w("else: pos += 16")
                else:
                    self.emit_scalar_decode(f, "topic", "''")
            elif _is_partition(f):
                self.emit_scalar_decode(f, "part", "''")
            elif _is_error(f):
                self.emit_scalar_decode(f, "code", "''")
            elif f.type == "records":
                n = self.fresh("n")
                self.emit_len("records", n)
                w(f"if {n} > 0:")
                w.indent()
                w(f"recs.append((pos, pos + {n}, topic))")  # the topic it belongs to (None at the top)
                w(f"pos += {n}")
                w.dedent()
            elif id(f) in subs:
                self.emit_scan_call(f, subs[id(f)])
            else:
                self.emit_value_skip(f)
        if self.flexible:
            self.emit_tags_skip()
        w("if pos > len(buf): _check_len(buf, pos)")
        ctx = "topic" if topic_struct or not top else "None"
        if self.errors_only:
            if has_error:
                w(f"if code: acc.append(({ctx}, {'part' if has_partition else 'None'}, code))")
        elif has_partition:
            w(f"acc.append(({ctx}, part, {'code' if has_error else 'None'}))")
        elif has_error:
            w(f"acc.append(({ctx}, None, code))")
        elif topic_struct and not _has_partition_children(fields):
            w("acc.append((topic, None, None))")
        if valued:
            self.emit_values_append(ctx, has_partition, has_error)
        w("return pos")
        w.dedent()
        return name

    def emit_scan_call(self, f: Field, fn: str) -> None:
        w = self.w
        call = f"pos = {fn}(buf, pos, acc, recs, topic)"
        if f.array:
            n = self.fresh("n")
            self.emit_len("array", n)
            w(f"if {n} > len(buf) - pos: _count({n}, pos, buf, 1)")
            w(f"for _ in range({n}):")
            w.indent()
            w(call)
            w.dedent()
        elif f.nullable:
            w("if buf[pos] == 0xFF: pos += 1")
            w("else:")
            w.indent()
            w("pos += 1")
            w(call)
            w.dedent()
        else:
            w(call)


@dataclass(frozen=True, slots=True)
class BodyScan:
    """What :func:`scan_body` found; ``records`` are (start, end) offsets of records fields (the
    per-frame readers, :func:`scan_request` and :func:`run_scanner`, also give each one's topic)."""

    entries: list[Entry]
    records: list[tuple[int, int]]
    data: bytes

    def error_codes(self) -> Iterator[int]:
        """Every error code found, zeros included (a response's verdict per partition)."""
        return (code for _, _, code in self.entries if code is not None)

    def errors(self) -> list[Entry]:
        """Entries whose error code is set and not NONE (0)."""
        return [e for e in self.entries if e[2]]

    def topics(self) -> list[Topic]:
        """Distinct topics in first-seen order."""
        seen: dict[Topic, None] = {}
        for topic, _, _ in self.entries:
            if topic is not None:
                seen.setdefault(topic, None)
        return list(seen)

    @property
    def values(self) -> list[tuple[object, ...]]:
        """The values mode's reads (see the module docstring); [] for a scan made without it."""
        entries = self.entries
        return entries.values if isinstance(entries, ScanEntries) else []

    def record_count(self) -> int:
        """Records in all records fields, from batch headers; legacy compressed wrappers are
        decompressed within one :class:`~kproxy.protocol.records.RecordBudget` for the frame (the
        ones past it are not counted)."""
        from kproxy.protocol.records import RecordBudget, count_records

        view = memoryview(self.data)
        budget = RecordBudget()
        return sum(count_records(view[start:end], budget=budget) for start, end in self.records)


# (api key, version, direction, errors only), and True after them for a values-mode scanner.
_scanners: dict[tuple[int, int, MessageType, bool] | tuple[int, int, MessageType, bool, bool], Callable[..., int]] = {}
_lock = threading.Lock()
# What a generated scanner can raise on bytes it cannot read (callers of `scanner` catch these): the
# codec's DecodeError (a wire rule broken) and what Python's own readers raise, which the scanner lets
# through for speed.
SCAN_FAILURES = (DecodeError, struct.error, IndexError, ValueError, OverflowError)


def scanner(api_key: int, api_version: int, direction: MessageType, errors_only: bool = False,
            values: bool = False) -> Callable[..., int] | None:
    """The generated scanner of a kind (None: no schema), made once. ``values``: the values mode,
    whose scanner must be given a :class:`ScanEntries` (:func:`run_values_scanner`); for a kind
    with no :data:`OFFSET_FIELDS` it is the plain scanner."""
    fields = OFFSET_FIELDS.get((api_key, direction), frozenset()) if values else frozenset()
    key: tuple[int, int, MessageType, bool] | tuple[int, int, MessageType, bool, bool] = (
        (api_key, api_version, direction, errors_only, True) if fields else (api_key, api_version, direction,
                                                                           errors_only))
    fn = _scanners.get(key)
    if fn is None:
        schema: MessageSchema | None = message_schema(api_key, api_version, direction)
        if schema is None:
            return None
        with _lock:
            fn = _scanners.get(key)
            if fn is None:
                fn = _scanners[key] = _ScanCompiler(schema, errors_only, fields).build_scan()
    return fn


def scan_body(api_key: int, api_version: int, direction: MessageType, data: bytes, offset: int = 0, *,
              errors_only: bool = False, values: bool = False) -> BodyScan:
    """Scan the body at ``data[offset:]``. Raises :class:`DecodeError` on malformed bytes.

    Unknown (api key, version) raises :class:`UnknownApiError`; the proxy treats
    that as "nothing to report", not as a reason to drop the frame.

    ``errors_only`` (the metrics path): ``entries`` holds only non-zero error
    codes, ``(topic or None, partition or None, code)``; subtrees without error
    codes or records are skipped, and the walk stops after the last field that
    could hold one, so trailing bytes are not checked.

    ``values``: the values mode; ``entries`` is then a :class:`ScanEntries` (:attr:`BodyScan.values`).
    """
    fn = scanner(api_key, api_version, direction, errors_only, values)
    if fn is None:
        raise UnknownApiError(api_key, api_version)
    acc: list[Entry] = ScanEntries.empty() if values else []
    recs: list[RecordsRange] = []
    try:
        end = fn(data, offset, acc, recs, None)
    except SCAN_FAILURES as exc:
        # The full decoder knows how to say where; ask it (only on this error path).
        from kproxy.protocol.messages import require_codec

        require_codec(api_key, api_version, direction).decode(data, offset)
        raise DecodeError(f"malformed body: {exc}", offset=offset) from None
    if end != len(data) and end != -1:
        raise DecodeError(f"{len(data) - end} bytes left over after the body", offset=end)
    return BodyScan(acc, [(start, stop) for start, stop, _ in recs], data)



# api_key << 16 | api_version -> the full request scanner (None: no schema), for scan_request: one int
# lookup (scanner()'s own cache hashes a key holding an Enum, a Python-level hash). Bounded: a client
# cycling through made-up versions is looked up afresh, not remembered.
REQUEST_SCANNERS_CAP = 4096
_REQUEST_SCANNERS: dict[int, Callable[..., int] | None] = {}
_UNSEEN = object()


def scan_request(api_key: int, api_version: int, frame: bytes | bytearray | memoryview, offset: int
                 ) -> RequestScan | None:
    """The full scan of the request body at ``frame[offset:]`` (the frame as the session holds it):
    ``(entries, records ranges)``, or None when the kind has no schema or the body cannot be read.

    As lenient as a broker: bytes after the body are not checked. The per-request path's one read
    of a request body: a rules policy's topics, the metrics' record count and the capture's early
    read all take it from here, through the session's exchange, instead of scanning again.
    ``bytes`` and ``bytearray`` are read in place (a one-topic one-partition Produce in ``bytes``,
    what the session holds, by hand); a body in a ``memoryview`` is copied first (the generated
    scanner decodes names from slices of the frame).
    """
    if api_key == PRODUCE and isinstance(frame, bytes):
        found = produce_request_scan(frame, offset, api_version)
        if found is not None:
            return found
    if not isinstance(frame, bytes | bytearray):
        frame = bytes(frame)
    kind = api_key << 16 | api_version
    fn = _REQUEST_SCANNERS.get(kind, _UNSEEN)
    valued = api_key in _VALUE_REQUESTS  # (the few small group and offset requests consumer lag reads)
    if fn is _UNSEEN:
        fn = scanner(api_key, api_version, MessageType.REQUEST, values=valued)
        if kind >= 0 and len(_REQUEST_SCANNERS) < REQUEST_SCANNERS_CAP:
            _REQUEST_SCANNERS[kind] = fn
    return run_values_scanner(fn, frame, offset) if valued else run_scanner(fn, frame, offset)


def run_scanner(fn: object, frame: bytes | bytearray, offset: int) -> RequestScan | None:
    """Run a generated scanner (:func:`scanner`; None: no schema) over the body at ``frame[offset:]``:
    (entries, records ranges with their topics), or None when there is no scanner or the bytes
    cannot be read. The scanner is called directly, not through :func:`scan_body`: callers run
    this per frame."""
    if fn is None:
        return None
    acc: list[Entry] = []
    recs: list[RecordsRange] = []
    try:
        fn(frame, offset, acc, recs, None)  # type: ignore[operator]
    except SCAN_FAILURES:
        return None
    return acc, recs


def run_values_scanner(fn: object, frame: bytes | bytearray, offset: int) -> RequestScan | None:
    """:func:`run_scanner` of a values-mode scanner: its entries are a :class:`ScanEntries`."""
    if fn is None:
        return None
    acc = ScanEntries()
    acc.values = []
    recs: list[RecordsRange] = []
    try:
        fn(frame, offset, acc, recs, None)  # type: ignore[operator]
    except SCAN_FAILURES:
        return None
    return acc, recs
