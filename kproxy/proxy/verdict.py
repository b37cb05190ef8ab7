"""The policy seam of a session: :class:`RequestPolicy` decides, :class:`Verdict` says what.

A policy (kproxy's rules, through the server) is asked about each Kafka request once, right
after its header is read and its correlation id checked; proxy/ never imports the rules.
The session carries a verdict out (kproxy/proxy/session.py) and keeps what concerns the
response on the exchange's :class:`~kproxy.proxy.exchange.Ruling`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kproxy.proxy.commands import CloseConnection
from kproxy.proxy.exchange import Exchange, Ruling
from kproxy.toxics import WireOrder


class InForce(Protocol):
    """What a connection-wide fault lasts as long as (a rule's action: kproxy.policy.in_force)."""

    def in_force(self) -> bool:
        """Whether the fault still holds: asked before each request it would act on."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What a :class:`RequestPolicy` decided about one request, in the session's own terms
    (the server's adapter translates fault-injection rules into it; proxy/ never sees a rule).

    * ``close``: end the connection instead; the request is not forwarded.
    * ``answer``: a response frame kproxy sends in the request's place (not forwarded);
      it waits its turn like any response. ``forward=False`` without an answer swallows
      the request (an acks=0 Produce, which has no answer anyway, or any request of a
      black hole: see ``blackhole``).
    * ``request``: the frame to forward instead of the one read (same correlation id).
    * ``hold_s``: the response leaves no earlier than this long after the request was
      read (a delay before forwarding, or a throttle: the client sees the same wait);
      ``response_delay_s``: no earlier than this long after the answer came (the broker's,
      or the one kproxy made in its place).
      ``held_by``: who that wait is charged to, a pair of names the session hands to the
      observer as it is (``Ruling.held``; the server's policy names a rule and action).
    * ``on_response``: edits the broker's answer, after the default address rewrite.
    * ``drop_response``: the broker's answer is swallowed: the client times out.
    * ``blackhole``: from this request on, nothing more passes on the connection while
      ``blackhole_lasts`` is in force (None: for the rest of the connection): this request and
      every later one read meanwhile get no answer, and with ``forward=False`` none reaches the
      broker either (read and discarded, as a partitioned network loses them); with
      ``forward=True`` they are forwarded and only their answers are lost. With ``close_after_s``
      the connection then ends that long after, unless the black hole ended first. Answers to
      requests forwarded before it still flow; once it ends, requests read from then on flow again
      (those it swallowed stay unanswered), as over a healed partition.
    * ``close_delay_s``: from this request on, while ``close_delay_lasts`` is in force (None: for
      the rest of the connection), the connection's sockets close that long after it ended (a slow
      close: traffic passes meanwhile as ever; :meth:`Session.close_delay_s`).
    * ``wire``: byte-level toxics for the connection to install from this request on
      (:mod:`kproxy.toxics`; the session hands them to the server: ``Session.wire_orders``).

    Every guarantee of the session holds whatever the verdict: responses that do leave
    keep request order and correlation ids, and an acks=0 Produce never gets an answer.

    Immutable (frozen: one verdict may serve many requests); made with keywords.
    """

    close: CloseConnection | None = None
    answer: bytes | None = None
    forward: bool = True
    request: bytes | None = None
    hold_s: float = 0.0
    response_delay_s: float = 0.0
    on_response: Callable[[bytes], bytes] | None = None
    drop_response: bool = False
    blackhole: bool = False
    close_after_s: float | None = None
    blackhole_lasts: InForce | None = None
    close_delay_s: float = 0.0
    close_delay_lasts: InForce | None = None
    held_by: tuple[str, str] | None = None
    wire: tuple[WireOrder, ...] = ()


# What every request in a black hole gets: read and discarded, never forwarded nor answered; in
# a black hole with ``forward=True``: forwarded, its answer swallowed.
BLACKHOLED = Verdict(forward=False, drop_response=True)
BLACKHOLED_FORWARDED = Verdict(drop_response=True)


class RequestPolicy(Protocol):
    """Where a rule decides about a request (kproxy.rules fills it through the server; proxy/ never
    imports it).

    Called once per Kafka request, right after its header is parsed and its id
    checked, before anything else happens to it (the acks=0 and KIP-511 branches included), with
    ``exchange.request`` holding the whole frame. Returns None to let the request go
    on as usual (the common case: it must cost next to nothing), or a :class:`Verdict`.

    ``principal`` is the connection's principal (``User:...``; None while unknown), written by
    the session when it becomes known or changes (kproxy/proxy/session.py: ``Session.principal``),
    before the next request is decided.
    """

    principal: str | None

    def decide(self, exchange: Exchange) -> Verdict | None: ...


def keep_ruling(ex: Exchange, verdict: Verdict) -> None:
    """Keep what a verdict says of the exchange's response (and whether the request forwarded was
    another frame) on its :class:`Ruling` (made now unless the policy made it, recording its rule
    decisions)."""
    ruling = ex.ruling
    if ruling is None:
        ruling = ex.ruling = Ruling()
    if verdict.hold_s:
        ruling.release_at = ex.read_at + verdict.hold_s
    ruling.response_delay = verdict.response_delay_s
    ruling.on_response = verdict.on_response
    ruling.drop = verdict.drop_response or verdict.blackhole
    ruling.held_by = verdict.held_by
    ruling.request_replaced = verdict.request is not None
