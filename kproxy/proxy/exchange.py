"""One request and its response, as the session tracks them: :class:`Exchange`, split by concern.

* :class:`Exchange` itself is what the protocol knows: api key, version, correlation id, sizes,
  times and the frames, with the header's client id and body offset read on first use.
* :class:`Ruling` is what a policy's :class:`~kproxy.proxy.verdict.Verdict` left on it (a release
  time, a response delay or edit, a drop, the hold charged, the rule actions that acted). It is
  made only when a verdict or a rule decision exists: ``Exchange.ruling`` is None on the common path.
* :class:`ObserverMemo` is what readers of the exchange work out once and share (where the
  response body starts, the rewritten body, the request body's scan). It is made by the first
  reader that has something to keep: ``Exchange.memo`` is None until then.

An Exchange is made for every request on the hot path: each field costs every request, so the
two concerns that most requests never touch live in objects of their own, made when needed. Each
of the three writes its own ``__init__`` (the dataclass decorator keeps it, and makes ``__eq__`` and
``__repr__``): compiled (kproxy/native.py), it is native code, where the decorator's would be an
interpreted function setting each field through a descriptor, several times slower.
:class:`SessionObserver` is what observers (metrics, capture) implement to see exchanges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from kproxy.protocol.api_keys import PRODUCE
from kproxy.protocol.codes import api_name
from kproxy.protocol.errors import DecodeError
from kproxy.protocol.framing import Spanned
from kproxy.protocol.headers import request_body_offset as find_request_body
from kproxy.protocol.message_schemas import MessageType
from kproxy.protocol.messages import decode_body
from kproxy.protocol.offset_reads import Produced
from kproxy.protocol.request_fields import produce_acks, request_client_id
from kproxy.protocol.scan import RequestScan, scan_request
from kproxy.proxy.addresses import BrokerRoute

_UNREAD: object = object()  # a memo not computed yet (fields holding it are typed Any: see their readers)

# One action of a rule that acted on an exchange: (rule id, action name, detail, dry run).
RuleDecision = tuple[str, str, str, bool]


@dataclass(slots=True)
class Ruling:
    """What a policy decided about one exchange's response, as the session keeps it.

    * ``release_at``: the response leaves no earlier than this (session clock; 0: no such bound);
    * ``response_delay``: ... nor earlier than this many seconds after the answer came;
    * ``on_response``: edits the broker's (address-rewritten) answer;
    * ``drop``: the response is swallowed when it comes: the client never gets an answer;
    * ``held_by``: who a hold is charged to (the verdict's ``held_by``);
    * ``held``: set at release, only when a hold (of this response or of one ahead of it that it
      queued behind) kept it back: ``(seconds of that wait, who it is charged to)``;
    * ``rule_decisions``: what the policy's rules did, in order: one ``(rule, action, detail,
      dry_run)`` per action that acted or matched in a dry run. The policy appends response-side
      actions when the response is edited, so observers read it at ``complete``;
    * ``request_replaced``: the frame forwarded was the verdict's, not the one read (its records may
      differ: consumer lag does not count them).
    """

    release_at: float = 0.0
    response_delay: float = 0.0
    on_response: Callable[[bytes], bytes] | None = None
    drop: bool = False
    held_by: tuple[str, str] | None = None
    held: tuple[float, tuple[str, str] | None] | None = None
    rule_decisions: tuple[RuleDecision, ...] = ()
    request_replaced: bool = False

    def __init__(self, release_at: float = 0.0, response_delay: float = 0.0,
                 on_response: Callable[[bytes], bytes] | None = None, drop: bool = False,
                 held_by: tuple[str, str] | None = None, held: tuple[float, tuple[str, str] | None] | None = None,
                 rule_decisions: tuple[RuleDecision, ...] = (), request_replaced: bool = False) -> None:
        self.release_at = release_at
        self.response_delay = response_delay
        self.on_response = on_response
        self.drop = drop
        self.held_by = held_by
        self.held = held
        self.rule_decisions = rule_decisions
        self.request_replaced = request_replaced


@dataclass(slots=True)
class ObserverMemo:
    """What the exchange's readers work out once and share.

    * ``response_body_offset``: where the response body starts, when the session found it
      rewriting the response (0: not computed: a reader finds it from the header layout);
    * ``response_body``: the rewritten response's body as the rewriter returned it (None: not
      rewritten, or edited after): for a repeated answer the rewrite memo's own object, which
      the metrics' scan memo keys on;
    * ``request_scan``: :attr:`Exchange.request_scan`'s result, once asked;
    * ``produced``: a Produce request's records per partition, ``(topic, partition, records)``, when
      a reader counted them while the frame was held (consumer lag reads the answer with them:
      :func:`kproxy.protocol.offset_reads.produce_record_counts`); None: not counted;
    * ``group_id``: the group a group member's request named, as consumer lag keys it, read while
      the frame was held (its answer says whether the coordinator accepted the member); None: not read.
    """

    response_body_offset: int = 0
    response_body: bytes | None = None
    # RequestScan | None once read; typed Any for the sentinel (a compiled build checks declared
    # types at run time): :attr:`Exchange.request_scan` is its typed reader.
    request_scan: Any = _UNREAD
    produced: list[Produced] | None = None
    group_id: str | None = None

    def __init__(self, response_body_offset: int = 0, response_body: bytes | None = None,
                 request_scan: Any = _UNREAD, produced: list[Produced] | None = None,
                 group_id: str | None = None) -> None:
        self.response_body_offset = response_body_offset
        self.response_body = response_body
        self.request_scan = request_scan
        self.produced = produced
        self.group_id = group_id


@dataclass(slots=True)
class Exchange:
    """One request in flight and, once it arrived or was made, its response: what the protocol knows.

    The request header is parsed once, here: api key, version and correlation id
    when the frame is read; the client id and the body offset only when someone
    asks (:attr:`client_id`, :attr:`request_body_offset`: nothing on the common
    path). ``request`` is the request frame (size prefix included) until the
    observer has seen it (with no observer: until the exchange ends); then the
    session lets it go, so a Produce's bytes are not held for the broker's round trip.
    Its body is scanned at most once, for whoever asks first (:attr:`request_scan`).

    Times come from the session's clock: ``read_at`` when the chunk holding the
    request was read, ``forwarded_at`` when the session let it go upstream,
    ``received_at`` when the response was read (or made, for a ``local`` answer),
    ``completed_at`` when it was released to the client (in order).

    ``ruling`` (None unless a policy decided something) and ``memo`` (None until a reader
    keeps something) hold the other two concerns; :attr:`rule_decisions`, :attr:`held`,
    :attr:`response_body_offset` and :attr:`response_body` read through them.
    """

    correlation_id: int
    api_key: int
    api_version: int
    request_size: int
    read_at: float
    forwarded_at: float
    request: bytes = b""
    local: bool = False
    response: bytes | None = None
    # With no observer, a response that came in several reads and goes on untouched: the pieces that
    # brought it, written as they are (``response`` is then b""; nothing else reads the bytes).
    response_parts: Spanned | None = None
    received_at: float = 0.0
    completed_at: float = 0.0
    routes: Sequence[BrokerRoute] = ()
    seq: int = 0  # the session's request count when it arrived: orders it among acks=0 Produce
    acks: int | None = None  # a Produce's acks, as the session read them (None: not a Produce, or unreadable)
    ruling: Ruling | None = None
    memo: ObserverMemo | None = None
    _request_body_offset: int = -1  # -1: not read yet, -2: unreadable
    _client_id: Any = _UNREAD  # str | None once read (typed Any for the sentinel: see client_id)

    def __init__(self, correlation_id: int, api_key: int, api_version: int, request_size: int, read_at: float,
                 forwarded_at: float, request: bytes = b"") -> None:
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.request_size = request_size
        self.read_at = read_at
        self.forwarded_at = forwarded_at
        self.request = request
        self.local = False
        self.response = None
        self.response_parts = None
        self.received_at = 0.0
        self.completed_at = 0.0
        self.routes = ()
        self.seq = 0
        self.acks = None
        self.ruling = None
        self.memo = None
        self._request_body_offset = -1
        self._client_id = _UNREAD

    @property
    def api(self) -> str:
        return api_name(self.api_key)

    @property
    def client_id(self) -> str | None:
        """The request header's client id (None: null, absent or unreadable), decoded on first use."""
        found = self._client_id
        if found is _UNREAD:
            found = self._client_id = request_client_id(self.request, self.api_key, self.api_version)
        return cast("str | None", found)

    @client_id.setter
    def client_id(self, value: str | None) -> None:
        """Given by a reader that knows it already (a policy remembering its connection's client id)."""
        self._client_id = value

    @property
    def request_body_offset(self) -> int | None:
        """Where the request body starts in :attr:`request`; None when the header cannot be read."""
        found = self._request_body_offset
        if found == -1:
            offset = find_request_body(self.request, self.api_key, self.api_version)
            found = self._request_body_offset = -2 if offset is None else offset
        return None if found == -2 else found

    @request_body_offset.setter
    def request_body_offset(self, value: int | None) -> None:
        """Given by a reader that knows it already (a policy remembering its connection's header)."""
        self._request_body_offset = -2 if value is None else value

    @property
    def request_scan(self) -> RequestScan | None:
        """The request body's scan (:func:`kproxy.protocol.scan.scan_request`: topics, partitions,
        records ranges), done on first use and shared by every reader of this request: a rules
        policy's topics, the metrics' record count, the capture's early read. None when the header
        or body cannot be read. Read it while :attr:`request` holds the frame (until the observer
        has seen it)."""
        memo = self.memo
        if memo is None:
            memo = self.memo = ObserverMemo()
        found = memo.request_scan
        if found is _UNREAD:
            offset = self.request_body_offset
            found = memo.request_scan = None if offset is None else scan_request(
                self.api_key, self.api_version, self.request, offset)
        return cast("RequestScan | None", found)

    def request_body(self) -> dict[str, Any]:
        """The request body, decoded in full (for a policy deciding before it is forwarded: a
        partial read through :mod:`kproxy.protocol.scan` is cheaper where it is enough).

        Raises :class:`~kproxy.protocol.errors.ProtocolError` when it cannot be read.
        """
        offset = self.request_body_offset
        if offset is None:
            raise DecodeError(f"{self.api} v{self.api_version} request header cannot be read", offset=4)
        return decode_body(self.api_key, self.api_version, MessageType.REQUEST, self.request, offset)

    @property
    def rule_decisions(self) -> tuple[RuleDecision, ...]:
        """The policy's rule actions that acted on this exchange (:attr:`Ruling.rule_decisions`; () when none)."""
        ruling = self.ruling
        return () if ruling is None else ruling.rule_decisions

    @rule_decisions.setter
    def rule_decisions(self, value: tuple[RuleDecision, ...]) -> None:
        """Set by the policy as its rules act (the exchange's :class:`Ruling` is made then if need be)."""
        ruling = self.ruling
        if ruling is None:
            ruling = self.ruling = Ruling()
        ruling.rule_decisions = value

    @property
    def held(self) -> tuple[float, tuple[str, str] | None] | None:
        """The hold that kept the response back, charged (:attr:`Ruling.held`; None when none did)."""
        ruling = self.ruling
        return None if ruling is None else ruling.held

    @property
    def response_body_offset(self) -> int:
        """Where the response body starts, when the session found it (:attr:`ObserverMemo.response_body_offset`;
        0: not computed)."""
        memo = self.memo
        return 0 if memo is None else memo.response_body_offset

    @property
    def response_body(self) -> bytes | None:
        """The rewritten response's body (:attr:`ObserverMemo.response_body`; None: not rewritten)."""
        memo = self.memo
        return None if memo is None else memo.response_body

    @property
    def broker_seconds(self) -> float | None:
        """The broker's share: forwarded -> response read. None for local answers and acks=0."""
        if self.local or self.response is None:
            return None
        return self.received_at - self.forwarded_at

    @property
    def overhead_seconds(self) -> float:
        """kproxy's share: request read -> forwarded, plus response read -> released, less the
        time a policy held the response (:attr:`held`: the rules' time is not kproxy's)."""
        request_side = self.forwarded_at - self.read_at
        if self.response is None:
            return request_side
        held = self.held
        return request_side + (self.completed_at - self.received_at - (held[0] if held is not None else 0.0))


class SessionObserver(Protocol):
    """What the server's metrics see of a session (the session calls; it never awaits).

    ``request`` sees each request read, its frame still in ``exchange.request``;
    ``complete`` each exchange done (its response released, or none due).
    """

    def request(self, exchange: Exchange) -> None: ...

    def complete(self, exchange: Exchange) -> None: ...


def produce_acks_zero(ex: Exchange, frame: bytes) -> bool:
    """A Produce with acks=0 (an unreadable one is tracked: the broker's to refuse). Reads the body
    offset into the exchange itself: this runs on every Produce, the property's checks would not pay;
    the acks too (:attr:`Exchange.acks`: the metrics label producer batches with them)."""
    offset: int | None = ex._request_body_offset
    if offset == -1:  # not read yet (a rules policy may have read it: then it is not read twice)
        offset = find_request_body(frame, PRODUCE, ex.api_version)
        ex._request_body_offset = -2 if offset is None else offset
    elif offset == -2:
        offset = None
    if offset is None:
        return False
    acks = ex.acks = produce_acks(frame, ex.api_version, offset)
    return acks == 0
