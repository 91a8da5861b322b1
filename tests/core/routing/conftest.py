"""Fixtures for routing unit tests (builders live in `routing_kit`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from metis.core.models.registry import ModelRegistry
from metis.core.routing.availability import Availability
from metis.core.routing.engine import RoutingEngine, StaticPolicy
from tests.core.routing.routing_kit import EventLog, ManualClock, make_policy, make_registry


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def events() -> EventLog:
    return EventLog()


@pytest.fixture
def registry() -> ModelRegistry:
    return make_registry()


@pytest.fixture
def availability(registry: ModelRegistry, events: EventLog, clock: ManualClock) -> Availability:
    return Availability(registry, emit_system_event=events, clock=clock)


@pytest.fixture
def make_engine(
    registry: ModelRegistry, availability: Availability
) -> Callable[..., RoutingEngine]:
    def build(
        policy_text: str = "", reg: ModelRegistry | None = None, **kwargs: Any
    ) -> RoutingEngine:
        reg = reg or registry
        avail = availability if reg is registry else Availability(reg)
        return RoutingEngine(reg, StaticPolicy(make_policy(policy_text, reg)), avail, **kwargs)

    return build
