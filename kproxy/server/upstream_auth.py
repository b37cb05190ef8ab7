"""kproxy's own SASL login to the brokers (``sasl.upstream``): :class:`UpstreamLogins` makes each
upstream connection's :class:`~kproxy.sasl.upstream_login.UpstreamLogin` (the credentials as they
are, the SCRAM keys remembered, the counters); :func:`authenticate` drives one over a bare upstream
stream (broker discovery's connection). Client connections log in through their session instead
(kproxy/proxy/session.py), which holds the client's requests meanwhile."""

from __future__ import annotations

import logging

import trio

from kproxy.config import Config
from kproxy.logfmt import q
from kproxy.metrics.stats import TrafficStats
from kproxy.protocol.framing import FrameSplitter
from kproxy.sasl.client import ScramKeys
from kproxy.sasl.secret_file import UpstreamCredentials
from kproxy.sasl.upstream_login import SUCCESS, LoginResult, UpstreamLogin

log = logging.getLogger("kproxy.server")


class UpstreamLogins:
    """kproxy's logins for one server with ``sasl.upstream`` set: one per upstream connection."""

    def __init__(self, config: Config, stats: TrafficStats) -> None:
        sasl = config.sasl_upstream
        assert sasl.mechanism is not None and sasl.secret_file is not None  # the configuration's check
        self.credentials = UpstreamCredentials(sasl.mechanism, sasl.username, sasl.secret_file)
        self.timeout = config.limits.connect_timeout
        self.stats = stats
        self.scram_keys = ScramKeys()
        stats.sasl_mechanism_used("upstream", self.credentials.mechanism)

    def login(self, peer: str | None = None) -> UpstreamLogin:
        """The login of one upstream connection; ``peer``: the client it logs in for (None: kproxy's
        own connection, broker discovery)."""
        mechanism = self.credentials.mechanism

        def client_sasl() -> None:
            log.warning("event=client_sasl_refused peer=%s mechanism=%s detail=%s", peer, mechanism,
                        q("the client began its own SASL login: kproxy logs in to the cluster itself "
                          "(sasl.upstream), so it was answered ILLEGAL_SASL_STATE; configure the client without SASL"))

        return UpstreamLogin(self.credentials.current, timeout=self.timeout, report=self._ended,
                             keys=self.scram_keys, on_client_sasl=client_sasl)

    def _ended(self, result: LoginResult) -> None:
        self.stats.sasl_authenticated("upstream", result.mechanism, result.result, result.reauthentication)


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
