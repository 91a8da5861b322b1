"""The closed catalog and the bus: validation modes, seq numbering, ordering and isolation."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest

from metis.core.errors import EventValidationError, UnknownEventType
from metis.core.events.bus import EventBus
from metis.core.events.catalog import PERSISTED, STREAMING, sensitivity_of
from metis.core.events.envelope import Event, TransientEvent

CATALOG = {
    "session.created",
    "session.resumed",
    "session.model_changed",
    "session.ended",
    "session.purged",
    "session.instructions_loaded",
    "turn.started",
    "turn.completed",
    "turn.cancelled",
    "turn.failed",
    "route.decided",
    "routing.policy_loaded",
    "routing.policy_invalid",
    "routing.provider_unavailable",
    "routing.provider_recovered",
    "llm.call_started",
    "llm.call_completed",
    "llm.call_failed",
    "tool.input_invalid",
    "tool.confirmation_requested",
    "tool.confirmation_resolved",
    "tool.called",
    "tool.completed",
    "tool.failed",
    "bus.gap_detected",
}
STREAMING_TYPES = {
    "message.start",
    "text.delta",
    "thinking.delta",
    "tool.use_start",
    "tool.use_input_delta",
    "tool.use_end",
    "message.complete",
}
GAP = {"missing_from_seq": 1, "missing_to_seq": 2, "detected_by": "writer"}
DELTA = {"message_id": "m", "content_block_index": 0, "text": "x"}


def test_registered_types_equal_the_catalog() -> None:
    assert set(PERSISTED) == CATALOG
    assert set(STREAMING) == STREAMING_TYPES
    for name in PERSISTED:
        assert not name.startswith(("message.", "text.", "thinking.", "tool.use_"))


@pytest.mark.parametrize("event_type", sorted(CATALOG | STREAMING_TYPES))
def test_every_payload_model_forbids_extra_fields(event_type: str) -> None:
    model = PERSISTED.get(event_type) or STREAMING[event_type]
    assert model.model_config.get("extra") == "forbid"


def test_sensitivity_follows_the_type() -> None:
    assert sensitivity_of("turn.started") == "private"
    assert sensitivity_of("llm.call_started") == "private"
    assert sensitivity_of("tool.called") == "private"
    assert sensitivity_of("turn.completed") == "pseudonymous"
    assert sensitivity_of("route.decided") == "pseudonymous"


def test_strict_mode_raises_on_unknown_type_and_bad_payload() -> None:
    bus = EventBus(strict=True)
    with pytest.raises(UnknownEventType):
        bus.emit("s", "made.up", {}, actor="system")
    with pytest.raises(EventValidationError):
        bus.emit("s", "bus.gap_detected", {**GAP, "extra": 1}, actor="system")
    assert bus.last_seq("s") == 0


def test_lenient_mode_drops_without_using_a_seq(caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus(strict=False)
    with caplog.at_level(logging.ERROR):
        assert bus.emit("s", "made.up", {}, actor="system") is None
        assert bus.emit("s", "bus.gap_detected", {"missing_from_seq": "x"}, actor="system") is None
    event = bus.emit("s", "bus.gap_detected", GAP, actor="system")
    assert event is not None and event.seq == 1
    assert "made.up" in caplog.text


def test_seq_starts_at_one_per_stream_and_streams_are_independent() -> None:
    bus = EventBus(strict=True)
    a = [bus.emit("a", "bus.gap_detected", GAP, actor="system") for _ in range(3)]
    b = bus.emit("system", "bus.gap_detected", GAP, actor="system")
    assert [e.seq for e in a] == [1, 2, 3] and b.seq == 1
    assert [e.id for e in a] == sorted(e.id for e in a)
    bus2 = EventBus(strict=True)
    bus2.seed({"a": 3})
    assert bus2.emit("a", "bus.gap_detected", GAP, actor="system").seq == 4


def test_transient_events_reach_only_transient_subscribers_in_emission_position() -> None:
    bus = EventBus(strict=True)
    seen_all: list[object] = []
    seen_bus: list[object] = []
    bus.subscribe("hub", seen_all.append, transient=True)
    bus.subscribe("writer", seen_bus.append)
    bus.emit("s", "bus.gap_detected", GAP, actor="system")
    bus.emit_transient("s", "text.delta", DELTA, turn_id="t", parent_event_id=None)
    bus.emit("s", "bus.gap_detected", GAP, actor="system")
    assert [type(e) for e in seen_all] == [Event, TransientEvent, Event]
    assert [type(e) for e in seen_bus] == [Event, Event]
    assert "id" not in seen_all[1].wire() and "seq" not in seen_all[1].wire()


async def test_random_concurrent_emits_arrive_in_seq_order_per_stream() -> None:
    bus = EventBus(strict=True)
    seen: list[Event | TransientEvent] = []
    bus.subscribe("hub", seen.append, transient=True)
    rng = random.Random(7)

    async def emitter(stream: str) -> None:
        for _ in range(200):
            if rng.random() < 0.3:
                bus.emit_transient(stream, "text.delta", DELTA, turn_id="t", parent_event_id=None)
            else:
                bus.emit(stream, "bus.gap_detected", GAP, actor="system")
            if rng.random() < 0.5:
                await asyncio.sleep(0)

    await asyncio.gather(*(emitter(f"s{i}") for i in range(5)))
    for i in range(5):
        seqs = [e.seq for e in seen if isinstance(e, Event) and e.session_id == f"s{i}"]
        assert seqs == list(range(1, len(seqs) + 1))


def test_a_raising_subscriber_never_reaches_the_emitter_or_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus(strict=True)
    received: list[object] = []

    def broken(event: object) -> None:
        raise RuntimeError("boom")

    bus.subscribe("broken", broken)
    bus.subscribe("good", received.append)
    with caplog.at_level(logging.ERROR):
        for _ in range(10):
            bus.emit("s", "bus.gap_detected", GAP, actor="system")
    assert len(received) == 10
    assert "broken" in caplog.text


async def test_a_slow_queued_subscriber_does_not_delay_emitters_and_overflow_detaches_it() -> None:
    bus = EventBus(strict=True)
    gate = asyncio.Event()
    overflowed: list[bool] = []

    async def slow(event: Event) -> None:
        await gate.wait()

    bus.subscribe_queued("slow", slow, maxsize=5, on_overflow=lambda: overflowed.append(True))
    for _ in range(20):
        bus.emit("s", "bus.gap_detected", GAP, actor="system")
    assert overflowed == [True]
    gate.set()
    await bus.drain()
