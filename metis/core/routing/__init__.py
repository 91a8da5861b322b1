"""Routing: which model serves each turn.

`loader` validates and compiles `routing.yaml`, `predicates` holds the `when:` vocabulary,
`engine` runs the chain, `alias` parses the `@alias` prefix, `availability` tracks provider
health and `manager` owns reloads and last-known-good. None of them imports the event bus:
system events leave through an injected `emit_system_event(type, payload)` callback.
"""

from metis.core.routing.alias import OverrideResolution, resolve_override
from metis.core.routing.availability import Availability
from metis.core.routing.clock import SYSTEM_CLOCK, Clock, SystemClock
from metis.core.routing.context import TurnContext, estimate_input_tokens
from metis.core.routing.engine import (
    ChainEntry,
    RouteDecision,
    RoutingEngine,
    StaticPolicy,
)
from metis.core.routing.loader import (
    BUILTIN_EMPTY,
    EMPTY_POLICY_VERSION,
    Policy,
    PolicyCheck,
    validate_policy,
)
from metis.core.routing.manager import PolicyManager

__all__ = [
    "BUILTIN_EMPTY",
    "EMPTY_POLICY_VERSION",
    "SYSTEM_CLOCK",
    "Availability",
    "ChainEntry",
    "Clock",
    "OverrideResolution",
    "Policy",
    "PolicyCheck",
    "PolicyManager",
    "RouteDecision",
    "RoutingEngine",
    "StaticPolicy",
    "SystemClock",
    "TurnContext",
    "estimate_input_tokens",
    "resolve_override",
    "validate_policy",
]
