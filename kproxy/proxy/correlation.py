"""The correlation ids a client may not reuse yet, acks=0 Produce included.

A response is matched to its request by correlation id, so a client must never have
two requests the broker may answer under one id. An id is taken (:attr:`CorrelationIds.taken`)
from the request's arrival until its answer is released to the client; the session adds and
discards those itself, on every request and release.

An acks=0 Produce has no answer, yet a broker may send one anyway (Tansu does). Brokers answer
in order (the Kafka protocol's guarantee), so an acks=0 id stays taken until the broker answers
it or answers a request sent after it. At most ``ACKS0_REMEMBERED`` such ids are kept; older
ones pushed out stay taken as a span (lowest to highest) until a request sent after the newest
of them is answered. A client counting ids up (every Kafka client) never meets that span again
before it is cleared, except for a counter wrapping inside it, which costs that client one reconnect.
"""

from __future__ import annotations

from collections import deque

# acks=0 Produce correlation ids remembered, in case a broker answers them anyway.
ACKS0_REMEMBERED = 1024


class CorrelationIds:
    """Which correlation ids a new request may not use, and which answers are to acks=0 Produce.

    ``taken``: the ids of requests in flight and of remembered acks=0 Produce (never both: a
    request reusing a taken id is refused before it is tracked). ``acks0``: remembered acks=0
    Produce, oldest first, as ``(seq, correlation id)`` where ``seq`` is the session's request
    count when it arrived (None until the connection's first acks=0 Produce: an empty deque keeps
    a block of 64 slots, and most connections never send one). ``forgotten``: acks=0 ids
    pushed out while still answerable, as ``(lowest, highest, the newest one's seq)``, or None.
    """

    __slots__ = ("acks0", "forgotten", "taken")

    def __init__(self) -> None:
        self.taken: set[int] = set()
        self.acks0: deque[tuple[int, int]] | None = None
        self.forgotten: tuple[int, int, int] | None = None

    def refuses(self, correlation_id: int) -> bool:
        """Whether a new request may not use this id (see the module's contract)."""
        if correlation_id in self.taken:
            return True
        span = self.forgotten
        return span is not None and span[0] <= correlation_id <= span[1]

    @staticmethod
    def why_taken(api: str, api_version: int, correlation_id: int, in_flight: bool) -> str:
        """Why a request may not reuse ``correlation_id`` (``in_flight``: a request in flight has it)."""
        why = "a request in flight" if in_flight else "an acks=0 Produce the broker may still answer"
        return f"{api} v{api_version} request reuses correlation id {correlation_id} of {why}: its answer could not " \
               f"be told apart"

    def remember_acks0(self, seq: int, correlation_id: int) -> None:
        """An acks=0 Produce went upstream: its id is taken until the broker can no longer answer it."""
        acks0 = self.acks0
        if acks0 is None:
            acks0 = self.acks0 = deque()
        if len(acks0) >= ACKS0_REMEMBERED:
            old_seq, old = acks0.popleft()
            self.taken.discard(old)
            span = self.forgotten
            self.forgotten = (old, old, old_seq) if span is None else (min(span[0], old), max(span[1], old), old_seq)
        acks0.append((seq, correlation_id))
        self.taken.add(correlation_id)

    def answered_in_order(self, seq: int) -> None:
        """The broker answered request ``seq``: acks=0 Produce sent before it never will be."""
        acks0 = self.acks0
        while acks0 and acks0[0][0] < seq:
            self.taken.discard(acks0.popleft()[1])
        if self.forgotten is not None and self.forgotten[2] < seq:
            self.forgotten = None

    def answers_acks0(self, correlation_id: int) -> bool:
        """Whether an answer with this id (not the oldest request's) is the broker's answer to an acks=0
        Produce, remembered or pushed out; the memory of those up to it is dropped then.

        Answers come in order, so those sent before it, remembered or pushed out, never will be
        answered. Nearly always the oldest one: not a scan in practice.
        """
        acks0 = self.acks0
        if acks0 is not None:
            for i, (_, remembered) in enumerate(acks0):
                if remembered == correlation_id:
                    for _ in range(i + 1):
                        self.taken.discard(acks0.popleft()[1])
                    self.forgotten = None
                    return True
        span = self.forgotten
        return span is not None and span[0] <= correlation_id <= span[1]
