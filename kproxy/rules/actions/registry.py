"""Every rule action kind, by its YAML name: the one place a new kind is registered.

The loader (:mod:`kproxy.rules.load_actions`) finds a kind's reader here; everything else asks
the action itself (its class's hooks, :class:`~kproxy.rules.actions.base.RuleAction`).
"""

from __future__ import annotations

from kproxy.rules.actions.bandwidth import Bandwidth
from kproxy.rules.actions.base import RuleAction
from kproxy.rules.actions.blackhole import Blackhole
from kproxy.rules.actions.close_connection import CloseClientConnection
from kproxy.rules.actions.corrupt_records import CorruptRecords
from kproxy.rules.actions.delay import Delay
from kproxy.rules.actions.downgrade_api_versions import DowngradeApiVersions
from kproxy.rules.actions.drop_response import DropResponse
from kproxy.rules.actions.duplicate_records import DuplicateRecords
from kproxy.rules.actions.inject_error import InjectError
from kproxy.rules.actions.invalid_schema_id import InvalidSchemaId
from kproxy.rules.actions.limit_data import LimitData
from kproxy.rules.actions.mutate_metadata import MutateMetadata
from kproxy.rules.actions.reset_connection import ResetConnection
from kproxy.rules.actions.rewrite import Rewrite
from kproxy.rules.actions.rewrite_addresses import RewriteAddresses
from kproxy.rules.actions.slicer import Slicer
from kproxy.rules.actions.slow_close import SlowClose
from kproxy.rules.actions.throttle import Throttle

# In the order rules/README.md documents them.
ACTION_KINDS: dict[str, type[RuleAction]] = {kind.kind: kind for kind in (
    InjectError,
    Delay,
    Throttle,
    DropResponse,
    CloseClientConnection,
    ResetConnection,
    Blackhole,
    SlowClose,
    Bandwidth,
    Slicer,
    LimitData,
    CorruptRecords,
    DuplicateRecords,
    InvalidSchemaId,
    RewriteAddresses,
    MutateMetadata,
    DowngradeApiVersions,
    Rewrite,
)}

__all__ = ["ACTION_KINDS"]
