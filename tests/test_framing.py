"""FrameSplitter.split, the proxy's hot path: any chunking gives back the same frames."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.protocol.framing import FrameSplitter, frame

LARGE_FRAME = 1024 * 1024  # a Fetch response's order of size: it spans several 256 KiB reads

SIZES = st.sampled_from([0, 1, 7, 300, 70_000, LARGE_FRAME - 4, LARGE_FRAME, LARGE_FRAME + 123, 3 * LARGE_FRAME])


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(SIZES, min_size=1, max_size=6), cuts=st.lists(st.integers(1, 4 * LARGE_FRAME), max_size=40),
       data=st.data())
def test_any_chunking_gives_the_same_frames(sizes: list[int], cuts: list[int], data: st.DataObject) -> None:
    frames = [frame(bytes([i % 251 + 1]) * size) for i, size in enumerate(sizes)]
    stream = b"".join(frames)
    splitter = FrameSplitter()
    out: list[bytes] = []
    pos = 0
    for cut in [*cuts, len(stream)]:
        if pos >= len(stream):
            break
        chunk = stream[pos : pos + cut]
        got, whole, exact = splitter.split(chunk)
        assert whole == chunk
        if exact:
            assert b"".join(got) == chunk, "exact means the chunk is exactly these frames"
        out.extend(bytes(f) for f in got)
        pos += cut
    assert out == frames
    assert splitter.buffered == 0
    assert splitter.consumed == len(stream)


def test_a_chunk_that_is_one_frame_is_returned_without_a_copy() -> None:
    one = frame(b"x" * 100)
    got, _, exact = FrameSplitter().split(one)
    assert exact and got[0] is one


def test_a_large_frame_is_joined_once_from_the_chunks_that_brought_it() -> None:
    big = frame(b"y" * (2 * LARGE_FRAME))
    splitter = FrameSplitter()
    assert splitter.split(big[:1000])[0] == []
    assert splitter.buffered == 1000
    assert splitter.split(big[1000:5000])[0] == []
    got, _, exact = splitter.split(big[5000:] + frame(b"tail"))
    assert got == [big, frame(b"tail")]
    assert not exact
    assert all(type(f) is bytes for f in got)


def test_a_frame_spanning_chunks_is_not_copied_before_it_is_whole() -> None:
    """The chunks are held as they came: 16 reads of 64 KiB into a 4 MiB frame add no buffer of their size."""
    chunks = [bytes([i]) * (64 * 1024) for i in range(16)]  # the reader's objects, alive either way
    head = (4 * LARGE_FRAME).to_bytes(4, "big")
    splitter = FrameSplitter()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        splitter.split(head + b"x" * 10)
        for chunk in chunks:
            assert splitter.split(chunk)[0] == []
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert splitter.buffered == 4 + 10 + 16 * 64 * 1024
    assert held < 64 * 1024, f"{held} bytes allocated to hold 1 MiB of chunks the reader already has"


def test_a_size_prefix_cut_across_chunks_is_read_whole() -> None:
    stream = frame(b"a" * 5) + frame(b"b" * 300) + frame(b"")
    splitter = FrameSplitter()
    out: list[bytes] = []
    for i in range(len(stream)):  # one byte at a time: every prefix is cut
        out += splitter.split(stream[i : i + 1])[0]
    assert out == [frame(b"a" * 5), frame(b"b" * 300), frame(b"")]
    assert splitter.consumed == len(stream) and splitter.buffered == 0


def test_split_without_join_hands_back_the_pieces_of_a_frame_that_spans_chunks() -> None:
    big, small = frame(b"y" * 600_000), frame(b"s" * 10)
    stream = big + small
    reads = [stream[:1000], stream[1000:300_000], stream[300_000:]]
    splitter = FrameSplitter()
    assert splitter.split(reads[0], join=False)[0] == [] and splitter.split(reads[1], join=False)[0] == []
    got, _, exact = splitter.split(reads[2], join=False)
    [pieces, tail] = got
    assert isinstance(pieces, list) and pieces[1] is reads[1], "the chunk as read, not a copy"
    assert b"".join(pieces) == big and tail == small and not exact
    assert splitter.buffered == 0 and splitter.consumed == len(stream)


def test_a_peer_trickling_a_byte_per_read_costs_about_a_byte_per_byte() -> None:
    """Small reads are held in one buffer, not as an object each (~35 bytes per byte sent)."""
    splitter = FrameSplitter()
    reads = [bytes([i % 256]) for i in range(20_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        splitter.split((50 * LARGE_FRAME).to_bytes(4, "big"))
        for read in reads:
            splitter.split(read)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert splitter.buffered == 4 + len(reads)
    assert held < 3 * len(reads), f"{held} bytes held for {len(reads)} bytes received"
