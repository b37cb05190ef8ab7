"""kproxy's own SASL login over a bare upstream stream (broker discovery's connection): the awaiting
around :class:`~kproxy.proxy.upstream_login.UpstreamLogin`, which does the rest. Client connections
log in through their session instead (kproxy/proxy/session.py), which holds the client's requests
meanwhile."""

from __future__ import annotations

import trio

from kproxy.protocol.framing import FrameSplitter
from kproxy.proxy.upstream_login import SUCCESS, LoginResult, UpstreamLogin


class UpstreamLoginFailed(Exception):
    """The broker refused kproxy's login, or it could not be completed; the text says why."""


async def authenticate(stream: trio.abc.Stream, login: UpstreamLogin, max_frame_size: int) -> LoginResult:
    """Log in on ``stream`` before anything else is sent on it (the caller bounds the time);
    raises :class:`UpstreamLoginFailed` unless the login succeeded."""
    splitter = FrameSplitter(max_frame_size)
    await stream.send_all(login.begin(lambda _: False))
    while True:
        data = await stream.receive_some(65536)
        if not data:
            raise UpstreamLoginFailed("upstream closed during kproxy's SASL login")
        splitter.feed(data)
        while (frame := splitter.next_raw()) is not None:
            correlation_id = int.from_bytes(frame[4:8], "big", signed=True)
            if not login.awaits(correlation_id):
                raise UpstreamLoginFailed(f"an answer with correlation id {correlation_id} during kproxy's SASL login")
            out, result = login.answer(correlation_id, frame, lambda _: False)
            if out:
                await stream.send_all(out)
            if result is not None:
                if result.result != SUCCESS:
                    raise UpstreamLoginFailed(result.reason)
                return result
