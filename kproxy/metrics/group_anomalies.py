"""Consumer group anomalies read off the wire: rebalance storms and members that vanish.

Fed by :class:`~kproxy.metrics.traffic_observer.BrokerObserver` with the exchanges of the group membership
apis only (JoinGroup, Heartbeat, LeaveGroup: :data:`MEMBERSHIP_APIS`): their requests decoded here when
read (:meth:`GroupWatch.read`; a member heartbeats every few seconds: nothing per Produce or Fetch),
and their answers' error codes when they complete. Counted into
:class:`~kproxy.metrics.client_anomalies.ClientAnomalies` under the client id of the exchange:

* ``rebalance_storm``: a group whose JoinGroups answered NONE (one per member per rebalance) reached
  ``rebalance_joins`` within ``rebalance_window`` seconds: counted once per such window, for the
  client whose join reached it;
* ``vanished_member``: a member kproxy saw join (a JoinGroup naming its member id, as clients since
  KIP-394 send it) that has had no Heartbeat or JoinGroup answered for longer than its session
  timeout (1.5 times, for the heartbeat in flight) without a LeaveGroup answered: the broker expired
  its session, and its partitions waited that long. Static members (``group.instance.id``) leave
  without LeaveGroup by design and are not watched. Members are looked at by :meth:`GroupWatch.sweep`,
  which the observer calls on membership exchanges and connection closes (at most once a second).

Bounded whatever clients send: at most :data:`MAX_GROUPS` groups and :data:`MAX_MEMBERS` members are
kept, the least recently seen dropped first (a dropped member is not counted as vanished).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from kproxy.metrics.client_anomalies import REBALANCE_STORM, VANISHED_MEMBER, ClientAnomalies
from kproxy.protocol.api_keys import HEARTBEAT, JOIN_GROUP, LEAVE_GROUP
from kproxy.protocol.codes import ErrorCode
from kproxy.protocol.errors import ProtocolError
from kproxy.protocol.message_schemas import MessageType
from kproxy.protocol.messages import decode_body

MEMBERSHIP_APIS: Final = frozenset({JOIN_GROUP, HEARTBEAT, LEAVE_GROUP})
MAX_GROUPS: Final = 10_000
MAX_MEMBERS: Final = 10_000
SESSION_SLACK: Final = 1.5  # a member is gone after this many session timeouts without an answer
SWEEP_EVERY: Final = 1.0  # seconds between two sweeps of the members
_UNKNOWN_MEMBER: Final = int(ErrorCode.UNKNOWN_MEMBER_ID)


class JoinWindow:
    """One group's JoinGroups answered in its current window."""

    __slots__ = ("joins", "start")

    def __init__(self, start: float) -> None:
        self.start = start
        self.joins = 0


class Member:
    """A member kproxy saw join: its client id, session timeout (seconds) and last answer's time."""

    __slots__ = ("client_id", "seen", "session")

    def __init__(self, client_id: str | None, session: float, seen: float) -> None:
        self.client_id = client_id
        self.session = session
        self.seen = seen


class MembershipRequest:
    """What a JoinGroup, Heartbeat or LeaveGroup request says: its api key, group, the member ids it
    names, the session timeout (seconds; JoinGroup) and whether the member is static."""

    __slots__ = ("api_key", "group", "members", "session", "static")

    def __init__(self, api_key: int, group: str, members: list[str], session: float, static: bool) -> None:
        self.api_key = api_key
        self.group = group
        self.members = members
        self.session = session
        self.static = static


class GroupWatch:
    """Rebalance storms and vanished members (see the module docstring); sans-IO, times passed in."""

    __slots__ = ("anomalies", "groups", "joins", "members", "swept", "window")

    def __init__(self, anomalies: ClientAnomalies, joins: int, window: float) -> None:
        self.anomalies = anomalies
        self.joins = joins
        self.window = window
        self.groups: OrderedDict[str, JoinWindow] = OrderedDict()
        self.members: OrderedDict[tuple[str, str], Member] = OrderedDict()
        self.swept = 0.0

    @staticmethod
    def read(api_key: int, api_version: int, request: bytes, body_offset: int | None) -> MembershipRequest | None:
        """What a membership request says (read while the session holds its frame); None: unreadable."""
        if body_offset is None:
            return None
        try:
            body = decode_body(api_key, api_version, MessageType.REQUEST, request, body_offset)
        except (ProtocolError, ValueError, IndexError):
            return None
        group = body.get("group_id")
        if not isinstance(group, str):
            return None
        members = body.get("members")
        named = [m.get("member_id") for m in members] if isinstance(members, list) else [body.get("member_id")]
        session = body.get("session_timeout_ms")
        return MembershipRequest(api_key, group, [m for m in named if isinstance(m, str)],
                                 session / 1000.0 if isinstance(session, int) else 0.0,
                                 body.get("group_instance_id") is not None)

    def exchange(self, request: MembershipRequest, answer_codes: list[int] | None, client_id: str | None,
                 now: float) -> None:
        """A membership exchange completed at ``now``: its request and the answer's non-zero error codes
        (None: no answer, or one kproxy could not read)."""
        if answer_codes is None:
            return
        if request.api_key == JOIN_GROUP:
            if not answer_codes:
                self._joined(request, client_id, now)
        elif request.api_key == HEARTBEAT:
            for member in request.members:
                self._answered(request.group, member, _UNKNOWN_MEMBER in answer_codes, now)
        elif not answer_codes:  # LeaveGroup, answered: the members named left
            for member in request.members:
                self.members.pop((request.group, member), None)

    def _joined(self, request: MembershipRequest, client_id: str | None, now: float) -> None:
        group = request.group
        window = self.groups.get(group)
        if window is None or now - window.start >= self.window:
            window = JoinWindow(now)
            self.groups[group] = window
            if len(self.groups) > MAX_GROUPS:
                self.groups.popitem(last=False)
        self.groups.move_to_end(group)
        window.joins += 1
        if window.joins == self.joins:
            self.anomalies.seen(REBALANCE_STORM, client_id,
                                f"group={group} joins={window.joins} within {self.window:g} s")
        if request.members and request.members[0] and request.session > 0 and not request.static:
            key = (group, request.members[0])
            self.members[key] = Member(client_id, request.session, now)
            self.members.move_to_end(key)
            if len(self.members) > MAX_MEMBERS:
                self.members.popitem(last=False)

    def _answered(self, group: str, member_id: str, unknown: bool, now: float) -> None:
        key = (group, member_id)
        member = self.members.get(key)
        if member is None:
            return
        if unknown:  # the broker no longer knows it: it rejoins under a new member id, or was expired
            del self.members[key]
        else:
            member.seen = now

    def sweep(self, now: float) -> None:
        """Count the members gone past their session timeout (at most once per :data:`SWEEP_EVERY`)."""
        if now - self.swept < SWEEP_EVERY:
            return
        self.swept = now
        gone = [key for key, member in self.members.items() if now - member.seen > member.session * SESSION_SLACK]
        for key in gone:
            member = self.members.pop(key)
            self.anomalies.seen(VANISHED_MEMBER, member.client_id,
                                f"group={key[0]} member_id={key[1]} silent for {now - member.seen:.1f} s")
