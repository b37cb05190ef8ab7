"""The rule model: frozen, slotted values that a loaded rule file becomes.

Every class validates its own invariants in ``__post_init__`` and raises
:class:`ValueError` with a short reason; :mod:`kproxy.rules.load` turns those
into ``file:line: key: reason`` problems. Nothing here reads files or clocks:
a :class:`RuleSet` is an immutable value that the engine indexes and a reload
swaps whole.

Names follow Kafka's vocabulary (api keys by their snake-case names, error
codes by their protocol names, ``acks``, ``transactional_id``...).
"""

from __future__ import annotations

import enum
import ipaddress
import re
from dataclasses import dataclass, field
from statistics import NormalDist

from kproxy.protocol.tables import ApiKey, api_snake_name
from kproxy.rules.patterns import Template, UserPattern, compile_glob, compile_pattern, parse_replacement

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

RECORD_APIS: frozenset[int] = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})
METADATA_APIS: frozenset[int] = frozenset({ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER, ApiKey.DESCRIBE_TOPIC_PARTITIONS})


# Bounds on the actions' numbers, so that nothing accepted overflows at run time: a throttle holds
# a request debt / rate seconds and reports that in an int32 throttle_time_ms, and a rate of
# 5e-324 bytes/s made that hold infinite (round(inf) ended the connection).
MIN_BYTES_PER_SECOND = 1.0
MIN_REQUESTS_PER_SECOND = 0.001  # one request every ~17 minutes
MAX_RATE = 1e15  # per second, bytes or requests: far above any link, and rate * burst stays finite
MAX_DURATION_S = 7 * 86400  # a delay, its jitter, a slow close, a throttle's burst: a week at most
MAX_DURATION_MS = MAX_DURATION_S * 1000

# ------------------------------------------------------------------------------ match


@dataclass(frozen=True, slots=True)
class TopicPattern:
    """A topic glob (``orders-*``, fnmatch syntax) or regex (RE2), matched against the whole name.
    Both compile to RE2 (:mod:`kproxy.rules.patterns`): linear in the name; ValueError when refused."""

    pattern: str
    is_regex: bool = False
    compiled: UserPattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        compiled = compile_pattern(self.pattern) if self.is_regex else compile_glob(self.pattern)
        object.__setattr__(self, "compiled", compiled)

    def matches(self, topic: str) -> bool:
        return self.compiled.fullmatch(topic)


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """A daily UTC window, in seconds after midnight; ``end < start`` wraps past midnight."""

    start_s: int
    end_s: int

    def __post_init__(self) -> None:
        if not (0 <= self.start_s < 86400 and 0 <= self.end_s < 86400):
            raise ValueError("times of day are between 00:00 and 23:59:59")
        if self.start_s == self.end_s:
            raise ValueError("an empty window never matches (start equals end)")

    def contains(self, wall_time: float) -> bool:
        t = int(wall_time) % 86400
        if self.start_s < self.end_s:
            return self.start_s <= t < self.end_s
        return t >= self.start_s or t < self.end_s


@dataclass(frozen=True, slots=True)
class Schedule:
    """When a rule is live, counted over the requests that pass its other match keys.

    ``after_requests`` skips the first N such requests; ``first`` then takes at
    most N; ``every`` takes every Nth of those remaining (the 1st, N+1th...).
    ``after_s`` and ``for_s`` are seconds since the rule set was loaded;
    ``window`` is a daily UTC window. All given conditions must hold.
    """

    after_requests: int = 0
    first: int | None = None
    every: int | None = None
    after_s: float = 0.0
    for_s: float | None = None
    window: TimeWindow | None = None

    def __post_init__(self) -> None:
        if self.after_requests < 0:
            raise ValueError("after_requests must be >= 0")
        if self.first is not None and self.first < 1:
            raise ValueError("first must be >= 1 (first: 0 never matches)")
        if self.every is not None and self.every < 1:
            raise ValueError("every must be >= 1")
        if self.after_s < 0:
            raise ValueError("after_seconds must be >= 0")
        if self.for_s is not None and self.for_s <= 0:
            raise ValueError("for_seconds must be > 0 (a zero duration never matches)")

    @property
    def counts(self) -> bool:
        return self.after_requests > 0 or self.first is not None or self.every is not None


@dataclass(frozen=True, slots=True)
class Match:
    """What a request must be for a rule to apply; ``None`` means "any".

    Strings are RE2 patterns (:mod:`kproxy.rules.patterns`) matched whole: ``client_id: "batch-.*"``.
    A request matches when every given key matches; for ``topic`` and
    ``partition``, when at least one of the request's topic-partitions does.
    """

    apis: frozenset[int] | None = None
    min_version: int | None = None
    max_version: int | None = None
    client_id: UserPattern | None = None
    client_address: tuple[IpNetwork, ...] | None = None
    broker_ids: frozenset[int] | None = None
    topics: tuple[TopicPattern, ...] | None = None
    partitions: frozenset[int] | None = None
    group_id: UserPattern | None = None
    transactional_id: UserPattern | None = None
    acks: frozenset[int] | None = None
    probability: float | None = None
    schedule: Schedule | None = None

    def __post_init__(self) -> None:
        if self.probability is not None and not 0.0 < self.probability <= 1.0:
            raise ValueError("probability must be in (0, 1]")
        if self.min_version is not None and self.max_version is not None and self.min_version > self.max_version:
            raise ValueError("min is above max")
        if self.acks is not None and not self.acks <= {-1, 0, 1}:
            raise ValueError("acks is -1 (all), 0 or 1")
        if self.acks is not None and self.apis is not None and ApiKey.PRODUCE not in self.apis:
            raise ValueError("acks only exists on produce requests")

    @property
    def needs_topics(self) -> bool:
        return self.topics is not None or self.partitions is not None


# ---------------------------------------------------------------------------- actions


class InjectMode(enum.Enum):
    RESPOND = "respond"  # answer locally, the request is not forwarded
    REPLACE = "replace"  # forward, then replace the broker's error codes in its response


@dataclass(frozen=True, slots=True)
class InjectError:
    """Answer with a Kafka error code; ``partitions`` limits it to those (partial failure)."""

    error_code: int
    partitions: frozenset[int] | None = None
    message: str | None = None
    mode: InjectMode = InjectMode.RESPOND

    def __post_init__(self) -> None:
        if self.error_code == 0:
            raise ValueError("NONE (0) is not an error")
        if not -(2**15) <= self.error_code < 2**15:
            raise ValueError("an error code is an int16")


class Distribution(enum.Enum):
    UNIFORM = "uniform"  # ms + U(-jitter, +jitter)
    NORMAL = "normal"  # ms + N(0, jitter) (standard deviation), clamped at 0


class DelayPoint(enum.Enum):
    REQUEST = "request"  # before forwarding the request
    RESPONSE = "response"  # before releasing the response (still in request order)


@dataclass(frozen=True, slots=True)
class Delay:
    ms: float
    jitter_ms: float = 0.0
    distribution: Distribution = Distribution.UNIFORM
    at: DelayPoint = DelayPoint.REQUEST

    def __post_init__(self) -> None:
        if self.ms < 0 or self.jitter_ms < 0:
            raise ValueError("ms and jitter_ms must be >= 0")
        if not (self.ms <= MAX_DURATION_MS and self.jitter_ms <= MAX_DURATION_MS):
            raise ValueError(f"ms and jitter_ms must be <= {MAX_DURATION_MS} (a week)")

    def resolve(self, draw: float) -> float:
        """The delay in ms for a uniform draw in [0, 1) (the engine's, so runs replay)."""
        if self.jitter_ms == 0:
            return self.ms
        if self.distribution is Distribution.UNIFORM:
            return max(0.0, self.ms + (2 * draw - 1) * self.jitter_ms)
        # Inverse CDF of the same uniform draw: one draw per delay whatever the distribution.
        p = min(max(draw, 1e-12), 1 - 1e-12)
        return max(0.0, NormalDist(self.ms, self.jitter_ms).inv_cdf(p))


class ThrottleScope(enum.Enum):
    CLIENT_ID = "client_id"
    TOPIC = "topic"
    GLOBAL = "global"


@dataclass(frozen=True, slots=True)
class Throttle:
    """Token buckets (see :class:`kproxy.rules.bucket.TokenBucket`), one per scope key."""

    bytes_per_second: float | None = None
    requests_per_second: float | None = None
    scope: ThrottleScope = ThrottleScope.CLIENT_ID
    burst_s: float = 1.0  # bucket capacity, in seconds of the rate

    def __post_init__(self) -> None:
        if self.bytes_per_second is None and self.requests_per_second is None:
            raise ValueError("give bytes_per_second, requests_per_second or both")
        for rate, least, unit in ((self.bytes_per_second, MIN_BYTES_PER_SECOND, "bytes_per_second"),
                                  (self.requests_per_second, MIN_REQUESTS_PER_SECOND, "requests_per_second")):
            if rate is not None and not least <= rate <= MAX_RATE:
                raise ValueError(f"{unit} must be between {least:g} and {MAX_RATE:g}")
        if not 0 < self.burst_s <= MAX_DURATION_S:
            raise ValueError(f"burst_seconds must be > 0 and <= {MAX_DURATION_S} (a week)")


@dataclass(frozen=True, slots=True)
class DropResponse:
    """Forward the request, swallow the response: the client times out and retries."""


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the client connection (FIN) instead of forwarding."""


@dataclass(frozen=True, slots=True)
class ResetConnection:
    """Abort the client connection with a TCP RST (SO_LINGER 0)."""


@dataclass(frozen=True, slots=True)
class Blackhole:
    """Keep the connection open and never answer this request (nor later ones)."""


@dataclass(frozen=True, slots=True)
class SlowClose:
    """Stop answering, wait ``ms``, then close: a broker that hangs before it dies."""

    ms: float

    def __post_init__(self) -> None:
        if not 0 < self.ms <= MAX_DURATION_MS:
            raise ValueError(f"ms must be > 0 and <= {MAX_DURATION_MS} (a week)")


class RecordTarget(enum.Enum):
    CRC = "crc"  # flip a byte covered by the batch CRC-32C: clients see CORRUPT_MESSAGE / a CRC error
    KEY = "key"
    VALUE = "value"
    HEADERS = "headers"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class CorruptRecords:
    target: RecordTarget = RecordTarget.CRC


@dataclass(frozen=True, slots=True)
class DuplicateRecords:
    copies: int = 1

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise ValueError("copies must be >= 1")


@dataclass(frozen=True, slots=True)
class InvalidSchemaId:
    """Rewrite the 4-byte schema id of Confluent wire-format values (magic byte 0)."""

    schema_id: int = 2**31 - 1

    def __post_init__(self) -> None:
        if not -(2**31) <= self.schema_id < 2**31:
            raise ValueError("a schema id is an int32")


@dataclass(frozen=True, slots=True)
class RewriteAddresses:
    """Beyond the default mapping: exact ``host:port`` pairs, or a host regex (RE2, compiled with its
    groups) and replacement (:func:`~kproxy.rules.patterns.parse_replacement`'s syntax)."""

    mapping: tuple[tuple[str, str], ...] = ()
    pattern: UserPattern | None = None
    replacement: str | None = None
    template: Template = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if bool(self.mapping) == (self.pattern is not None):
            raise ValueError("give either map or pattern (with replacement)")
        if (self.pattern is None) != (self.replacement is None):
            raise ValueError("pattern and replacement go together")
        if self.pattern is not None and self.replacement is not None:
            object.__setattr__(self, "template", parse_replacement(self.pattern, self.replacement))


@dataclass(frozen=True, slots=True)
class PartitionRef:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class MutateMetadata:
    """Edit Metadata answers: hide brokers or partitions, move leaders, shrink the ISR."""

    hide_brokers: frozenset[int] = frozenset()
    hide_partitions: tuple[PartitionRef, ...] = ()
    move_leader: tuple[tuple[PartitionRef, int], ...] = ()
    shrink_isr: tuple[tuple[PartitionRef, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        if not (self.hide_brokers or self.hide_partitions or self.move_leader or self.shrink_isr):
            raise ValueError("nothing to mutate")


@dataclass(frozen=True, slots=True)
class DowngradeApiVersions:
    """Advertise at most these versions in ApiVersions answers: api key -> max version."""

    max_versions: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        if not self.max_versions:
            raise ValueError("name at least one api")


class RewriteDirection(enum.Enum):
    REQUEST = "request"
    RESPONSE = "response"


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Set fields (dotted paths, ``[]`` for every array element), map their values through a
    table (values not in it are kept), or map topic-name prefixes."""

    direction: RewriteDirection = RewriteDirection.REQUEST
    set_fields: tuple[tuple[str, object], ...] = ()
    topic_prefix: tuple[tuple[str, str], ...] = ()
    map_fields: tuple[tuple[str, tuple[tuple[object, object], ...]], ...] = ()

    def __post_init__(self) -> None:
        if not self.set_fields and not self.topic_prefix and not self.map_fields:
            raise ValueError("give set, map or topic_prefix")


Action = (InjectError | Delay | Throttle | DropResponse | CloseConnection | ResetConnection | Blackhole
          | SlowClose | CorruptRecords | DuplicateRecords | InvalidSchemaId | RewriteAddresses | MutateMetadata
          | DowngradeApiVersions | Rewrite)

# The YAML key of each action kind, and which APIs it can act on (None: any).
ACTION_NAMES: dict[str, type] = {
    "inject_error": InjectError,
    "delay": Delay,
    "throttle": Throttle,
    "drop_response": DropResponse,
    "close_connection": CloseConnection,
    "reset_connection": ResetConnection,
    "blackhole": Blackhole,
    "slow_close": SlowClose,
    "corrupt_records": CorruptRecords,
    "duplicate_records": DuplicateRecords,
    "invalid_schema_id": InvalidSchemaId,
    "rewrite_addresses": RewriteAddresses,
    "mutate_metadata": MutateMetadata,
    "downgrade_api_versions": DowngradeApiVersions,
    "rewrite": Rewrite,
}
ACTION_APIS: dict[type, frozenset[int]] = {
    CorruptRecords: RECORD_APIS,
    DuplicateRecords: RECORD_APIS,
    InvalidSchemaId: RECORD_APIS,
    MutateMetadata: METADATA_APIS,
    DowngradeApiVersions: frozenset({ApiKey.API_VERSIONS}),
}


# ------------------------------------------------------------------------------ rules

RULE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    match: Match
    actions: tuple[Action, ...]
    description: str | None = None
    enabled: bool = True
    continue_: bool = False  # YAML ``continue``: go on to later rules after this one matches
    dry_run: bool = False  # match, count and log, but the session executes nothing
    seed: int | None = None

    def __post_init__(self) -> None:
        if not RULE_ID.fullmatch(self.id):
            raise ValueError("an id is letters, digits and . _ : - (not starting with a symbol)")
        if not self.actions:
            raise ValueError("a rule needs at least one action")
        for action in self.actions:
            if (isinstance(action, InjectError) and action.partitions is not None
                    and action.mode is InjectMode.RESPOND
                    and (self.match.apis is None or ApiKey.PRODUCE in self.match.apis)):
                raise ValueError("a partial Produce failure needs mode: replace")
            allowed = ACTION_APIS.get(type(action))
            if allowed is None:
                continue
            if self.match.apis is None or not self.match.apis <= allowed:
                names = ", ".join(sorted(api_snake_name(k) for k in allowed))
                raise ValueError(f"{_action_name(action)} acts on {names} only: restrict match.api to them")


def _action_name(action: Action) -> str:
    return next(name for name, kind in ACTION_NAMES.items() if isinstance(action, kind))


def action_name(action: Action) -> str:
    """The YAML key of an action (``inject_error``...): what logs and metrics label it with."""
    return _action_name(action)


@dataclass(frozen=True, slots=True)
class RuleSet:
    """An ordered, immutable list of rules and the global seed."""

    rules: tuple[Rule, ...] = ()
    seed: int = 0
    source: str | None = None  # the file it came from, for logs

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"duplicate rule id {rule.id!r}")
            seen.add(rule.id)
