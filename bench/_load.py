"""bench_proxy.py's load generator: raw sockets, requests pre-encoded, responses counted by size.

The client costs the same on every path: nothing is decoded, a response is counted by its
size prefix and its correlation id checked against the order the requests went out in.
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

import _wire as wire

_HEAD = struct.Struct(">ii")


class FrameCounter:
    """Counts response frames in a byte stream by their size prefix, checking that correlation
    ids come back in the order ``expected`` cycles through them."""

    __slots__ = ("expected", "frames", "head", "next", "skip")

    def __init__(self, expected: list[int]) -> None:
        self.expected = expected
        self.next = 0
        self.head = b""
        self.skip = 0
        self.frames = 0

    def feed(self, data: bytes) -> int:
        pos, n, done = 0, len(data), 0
        while pos < n:
            if self.skip:
                take = min(self.skip, n - pos)
                self.skip -= take
                pos += take
                if not self.skip:
                    done += 1
                continue
            need = 8 - len(self.head)
            self.head += data[pos:pos + need]
            pos += need
            if len(self.head) < 8:
                break
            size, cid = _HEAD.unpack(self.head)
            if cid != self.expected[self.next]:
                raise RuntimeError(f"correlation id {cid}, expected {self.expected[self.next]}: stream out of sync")
            self.next = (self.next + 1) % len(self.expected)
            self.head = b""
            self.skip = size - 4
            if not self.skip:
                done += 1
        self.frames += done
        return done


@dataclass
class LoadResult:
    responses: int
    seconds: float
    bytes_sent: int
    bytes_received: int
    all_responses: int  # warm-up and drain included


def run_load(port: int, frame: bytes, *, connections: int, depth: int, count: int | None = None,
             duration: float | None = None, warmup: float = 0.0, on_ready: Callable[[], object] | None = None,
             on_drained: Callable[[], object] | None = None) -> LoadResult:
    """Keep ``depth`` requests in flight on each of ``connections`` connections.

    Stops after ``count`` requests per connection, or ``duration`` seconds after
    ``warmup``; in-flight requests are always drained before returning. Only
    responses (and bytes) after the warm-up are counted.

    With ``on_ready``, every connection first makes one round trip of its own (so the proxy has
    accepted it and connected upstream), then ``on_ready`` is called and the load starts; those
    round trips are not counted. ``on_drained`` is called once every response is in, before the
    connections close: CPU read between the two is the load's alone, not opening and closing.
    """
    # Every request in flight on a connection carries its own correlation id (Kafka clients number
    # them; kproxy refuses a connection that reuses one in flight): a cycle of twice the depth.
    (cid,) = struct.unpack_from(">i", frame, 8)
    cids = [(cid + i) % 2**31 for i in range(2 * depth)]
    variants = [frame[:8] + struct.pack(">i", c) + frame[12:] for c in cids]

    def frames(start: int, n: int) -> bytes:
        return b"".join(variants[(start + i) % len(variants)] for i in range(n))

    sel = selectors.DefaultSelector()
    socks = [wire.connect(port) for _ in range(connections)]
    if on_ready is not None:
        for s in socks:
            s.sendall(variants[0])
            wire.recv_frame(s)
        on_ready()
    state = {}
    for s in socks:
        s.setblocking(False)
        first = min(depth, count) if count is not None else depth
        state[s] = {"out": bytearray(frames(0, first)), "sent": first, "inflight": first,
                    "counter": FrameCounter(cids)}
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    start = time.perf_counter()
    counting_from = start + warmup
    stop_at = counting_from + duration if duration is not None else None
    counted = 0
    sent_bytes = received_bytes = 0
    counting = warmup == 0
    t_count = start
    stopping = False
    try:
        while any(st["inflight"] or st["out"] for st in state.values()):
            now = time.perf_counter()
            if not counting and now >= counting_from:
                counting, t_count = True, now
            if stop_at is not None and now >= stop_at and not stopping:
                stopping, t_end = True, now
            for key, events in sel.select(timeout=1.0):
                s = key.fileobj
                st = state[s]  # type: ignore[index]
                if events & selectors.EVENT_WRITE and st["out"]:
                    k = s.send(st["out"])  # type: ignore[union-attr]
                    del st["out"][:k]
                    if counting:
                        sent_bytes += k
                    if not st["out"]:
                        sel.modify(s, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    data = s.recv(1 << 20)  # type: ignore[union-attr]
                    if not data:
                        raise ConnectionError("server closed the connection")
                    done = st["counter"].feed(data)
                    if counting:
                        received_bytes += len(data)
                    if done:
                        st["inflight"] -= done
                        if counting and not stopping:
                            counted += done
                        more = done
                        if stopping:
                            more = 0
                        elif count is not None:
                            more = min(done, count - st["sent"])
                        if more:
                            was_empty = not st["out"]
                            st["out"] += frames(st["sent"], more)
                            st["sent"] += more
                            st["inflight"] += more
                            if was_empty:
                                sel.modify(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        if not stopping:
            t_end = time.perf_counter()
            counted = sum(st["counter"].frames for st in state.values()) if count is not None else counted
        if on_drained is not None:
            on_drained()
    finally:
        sel.close()
        for s in socks:
            s.close()
    total = sum(st["counter"].frames for st in state.values())
    return LoadResult(counted, t_end - t_count, sent_bytes, received_bytes, total)


def round_trips(sock: socket.socket, frame: bytes, n: int) -> list[float]:
    """Seconds for each of ``n`` sequential request/response round trips."""
    out = []
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        sock.sendall(frame)
        wire.recv_frame(sock)
        out.append(clock() - t0)
    return out
