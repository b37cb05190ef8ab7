"""FrameSplitter.split, the proxy's hot path: any chunking gives back the same frames."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.protocol.framing import LARGE_FRAME, FrameSplitter, frame

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


def test_a_large_frame_is_assembled_once_in_its_own_buffer() -> None:
    big = frame(b"y" * (2 * LARGE_FRAME))
    splitter = FrameSplitter()
    assert splitter.split(big[:1000])[0] == []
    assert splitter.buffered == 1000
    assert splitter.split(big[1000:5000])[0] == []
    got, _, _ = splitter.split(big[5000:] + frame(b"tail"))
    assert [bytes(f) for f in got] == [big, frame(b"tail")]
