"""Topic ids (KIP-516) learnt from Metadata responses, for requests that name topics by id only.

Fetch v13+ (and other newer versions) carry a topic's 16-byte id instead of its name; the name
is known only from a Metadata v10+ response, often on another connection than the request that
uses the id. :class:`TopicIdNames` keeps what the Metadata answers taught; the rules read ids
through it (a ``topic`` key matches by name), the capture writes names in its records and the
metrics label per-topic traffic with them.

A Metadata answer is read for its (id, name) pairs by a generated reader that decodes those two
fields of each topic and skips everything else by length (:func:`topic_id_pairs`): the
partitions of a big cluster are walked, never decoded, so learning costs about what the metrics'
errors-only scan of the same answer costs, a fraction of a full decode.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from kproxy.protocol.api_keys import METADATA
from kproxy.protocol.codegen import SchemaCompiler
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.headers import response_body_offset
from kproxy.protocol.message_schemas import Field, MessageSchema, MessageType, message_schema
from kproxy.protocol.scan import SCAN_FAILURES, _is_topic_id, _is_topic_name

METADATA_TOPIC_IDS = 10  # the first Metadata version whose response carries topic_id (KIP-516)
TOPIC_ID_NAMES_CAP = 100_000


class TopicIdNames(dict[uuid.UUID, str]):
    """Topic id -> name, learnt from Metadata responses; a mapping, so a reader looks ids up as in
    any dict. Bounded: past ``cap`` ids the oldest learnt is forgotten, and :attr:`forgotten`
    counts them (a reader that remembers what a Metadata answer taught knows it is stale once
    the count moved). One instance is read and taught by one thread."""

    def __init__(self, cap: int = TOPIC_ID_NAMES_CAP) -> None:
        super().__init__()
        self.cap = cap
        self.forgotten = 0
        # The last Metadata answer learnt: (version, its bytes past the correlation id hashed, the
        # forgotten count then, the topics it named). Clients refresh metadata with the same answer
        # again and again; a full decode of a big one holds its thread (0.7 s at 100,000 partitions).
        self._last: tuple[int, int, int, int] | None = None

    def learn(self, topic_id: uuid.UUID, name: str) -> None:
        """Remember ``topic_id``'s name; the zero id ("no id": a topic before v10) is not an id."""
        if topic_id.int == 0 or self.get(topic_id) == name:
            return
        if topic_id not in self and len(self) >= self.cap:
            del self[next(iter(self))]
            self.forgotten += 1
        self[topic_id] = name

    def learn_metadata(self, response: bytes, api_version: int, body_offset: int = 0) -> int | None:
        """Learn the (topic id, name) pairs of a Metadata response frame (size prefix included;
        ``body_offset``: where its body starts, 0 to read it from the header). Returns how many
        topics it names, 0 before v10, None when the response cannot be read (it teaches nothing)."""
        if api_version < METADATA_TOPIC_IDS:
            return 0
        # Hashing the bytes costs a small fraction of decoding them.
        seen = hash(memoryview(response)[8:]) if type(response) is bytes else None
        last = self._last
        if last is not None and seen == last[1] and last[0] == api_version and last[2] == self.forgotten:
            return last[3]  # the same answer as the last one learnt, and nothing of it forgotten since
        try:
            offset = body_offset or response_body_offset(response, METADATA, api_version)
        except ProtocolError:
            return None
        pairs = topic_id_pairs(response, offset, api_version)
        if pairs is None:
            return None
        for topic_id, name in pairs:
            self.learn(topic_id, name)
        n = len(pairs)
        if seen is not None:
            self._last = (api_version, seen, self.forgotten, n)
        return n

    def name(self, topic: object) -> str | None:
        """A topic as a scan gives it (a name, an id, or None) as its name: an id not learnt reads
        as the id's text."""
        if topic is None:
            return None
        if isinstance(topic, uuid.UUID):
            return self.get(topic, str(topic))
        return str(topic)


# -- reading the (id, name) pairs of a Metadata answer --------------------------------------------

class _TopicIdCompiler(SchemaCompiler):
    """Writes ``ids_S(buf, pos, acc) -> pos``: the top-level arrays of structs that carry a topic
    name and a topic id (Metadata's ``topics``) are walked, each struct's pair appended to ``acc``
    as ``(topic_id, name)`` when both are set (a null name is left out); every other field is
    skipped by length, as the codec's skip functions do."""

    def build_reader(self) -> Callable[..., int]:
        top = self.struct_reader(self.schema.fields, "Top")
        source = "\n".join(self.w.lines) + "\n"
        exec(compile(source, f"<kproxy topic ids {self.schema.name} v{self.schema.api_version}>", "exec"), self.ns)
        return self.ns[top]  # type: ignore[no-any-return]

    def struct_reader(self, fields: tuple[Field, ...], stem: str) -> str:
        subs: dict[int, str] = {}
        for f in fields:
            if f.type == "struct" and f.fields is not None:
                if f.tag is None and f.array and _has_pair(f.fields):
                    subs[id(f)] = self.struct_reader(f.fields, f.name)
                else:
                    self.struct_functions(f.fields, f.name)  # for its skip function
        name = self.fresh(f"ids_{stem}_")
        pair = _has_pair(fields)
        w = self.w
        w(f"def {name}(buf, pos, acc):")
        w.indent()
        if pair:
            w("topic = None")
        for f in fields:
            if f.tag is not None:
                continue
            if pair and _is_topic_name(f):
                self.emit_scalar_decode(f, "topic", "''")
            elif pair and _is_topic_id(f):
                self.emit_scalar_decode(f, "tid", "''")
            elif id(f) in subs:
                n = self.fresh("n")
                self.emit_len("array", n)
                w(f"if {n} > len(buf) - pos: _count({n}, pos, buf, 1)")
                w(f"for _ in range({n}):")
                w.indent()
                w(f"pos = {subs[id(f)]}(buf, pos, acc)")
                w.dedent()
            else:
                self.emit_value_skip(f)
        if self.flexible:
            self.emit_tags_skip()
        w("if pos > len(buf): _check_len(buf, pos)")
        if pair:
            w("if topic is not None: acc.append((tid, topic))")
        w("return pos")
        w.dedent()
        return name


def _has_pair(fields: tuple[Field, ...]) -> bool:
    return any(_is_topic_name(f) for f in fields) and any(_is_topic_id(f) for f in fields)


_readers: dict[int, Callable[..., int] | None] = {}  # Metadata version -> its reader (None: no schema)
_lock = threading.Lock()


def _reader(api_version: int) -> Callable[..., int] | None:
    if api_version in _readers:
        return _readers[api_version]
    with _lock:
        schema: MessageSchema | None = message_schema(METADATA, api_version, MessageType.RESPONSE)
        fn = None if schema is None else _TopicIdCompiler(schema, traced=False).build_reader()
        if schema is not None:  # only versions with a schema are kept: a bounded cache
            _readers[api_version] = fn
    return fn


def topic_id_pairs(response: bytes, body_offset: int, api_version: int) -> list[tuple[uuid.UUID, str]] | None:
    """The ``(topic_id, name)`` pairs of the Metadata response body at ``response[body_offset:]``, in
    order (topics with a null name left out; the zero id, "no id", kept: the caller judges). None
    when the version has no schema or the bytes cannot be read. What :func:`decode_body` would give
    for those two fields, other fields skipped by length, not checked."""
    fn = _reader(api_version)
    if fn is None:
        return None
    acc: list[tuple[uuid.UUID, str]] = []
    try:
        fn(response, body_offset, acc)
    except (*SCAN_FAILURES, UnicodeDecodeError):
        return None
    return acc
