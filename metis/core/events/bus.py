"""The in-process event bus: ordered per-session delivery with isolated subscribers.

`emit` is synchronous and never awaits: validate → take the stream's next seq → stamp → hand to
each subscriber, all in one step on the event-loop thread. Because nothing yields, every
subscriber sees a stream in seq order with streaming-only events exactly where they were emitted,
and a slow or failing subscriber can never delay the emitter or anyone else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from metis.core.canonical.ids import new_ulid
from metis.core.canonical.times import now_us
from metis.core.errors import EventValidationError, UnknownEventType
from metis.core.events.catalog import PERSISTED, STREAMING
from metis.core.events.envelope import AnyEvent, Event, TransientEvent

log = logging.getLogger(__name__)

InlineHandler = Callable[[AnyEvent], None]
QueuedHandler = Callable[[Event], Awaitable[None]]
DrainHook = Callable[[], Awaitable[bool]]
_ERROR_LOG_INTERVAL_S = 5.0


@dataclass(eq=False)
class Subscription:
    """An inline subscriber, called in the emitting step; `transient` ones also receive
    streaming-only events. Its errors are logged at most once per interval."""

    name: str
    handler: InlineHandler
    transient: bool
    last_error_log: float = field(default=0.0)
    suppressed_errors: int = 0


@dataclass(eq=False)
class QueuedSubscription:
    """A subscriber served from its own bounded queue by its own task; detached (and told through
    `on_overflow`) when it falls behind."""

    name: str
    handler: QueuedHandler
    queue: asyncio.Queue[Event]
    on_overflow: Callable[[], None] | None
    task: asyncio.Task[None] | None = None


class EventBus:
    """The daemon's one event bus: per-stream seq counters, validation against the catalog, and
    delivery to subscribers in the emitting step."""

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self._seq: dict[str, int] = {}
        self._inline: list[Subscription] = []
        # The inline subscribers that take streaming-only events too, in the same order: a
        # streamed delta is delivered to these alone, without a look at every other one.
        self._transient: list[Subscription] = []
        self._queued: list[QueuedSubscription] = []
        self._drain_hooks: list[DrainHook] = []

    # -- sequence counters --------------------------------------------------------------------

    def seed(self, counters: dict[str, int]) -> None:
        """Continue every stream after its highest stored seq (startup)."""
        for stream, seq in counters.items():
            self._seq[stream] = max(self._seq.get(stream, 0), seq)

    def last_seq(self, stream: str) -> int:
        return self._seq.get(stream, 0)

    def forget_stream(self, stream: str) -> None:
        """Drop a purged session's counter."""
        self._seq.pop(stream, None)

    def take_back(self, event: Event) -> bool:
        """Free the seq of a stream's latest event, which will never be stored (the change it
        announced failed): the stream's next event takes that seq, so no gap is left. False for
        an event with others after it on its stream: it keeps its seq."""
        stream = event.session_id
        if self._seq.get(stream) != event.seq:
            return False
        if event.seq > 1:
            self._seq[stream] = event.seq - 1
        else:
            del self._seq[stream]
        return True

    # -- subscribers --------------------------------------------------------------------------

    def subscribe(
        self, name: str, handler: InlineHandler, *, transient: bool = False
    ) -> Subscription:
        """Register an inline subscriber: a sync callable doing O(1) in-memory work, no I/O."""
        sub = Subscription(name, handler, transient)
        self._inline.append(sub)
        if transient:
            self._transient.append(sub)
        log.debug("bus subscriber %s registered", name)
        return sub

    def subscribe_queued(
        self,
        name: str,
        handler: QueuedHandler,
        *,
        maxsize: int = 10_000,
        on_overflow: Callable[[], None] | None = None,
    ) -> QueuedSubscription:
        """Register a subscriber with its own bounded queue and consumer task (bus events only)."""
        sub = QueuedSubscription(name, handler, asyncio.Queue(maxsize), on_overflow)
        sub.task = asyncio.get_running_loop().create_task(self._consume(sub), name=f"bus:{name}")
        self._queued.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription | QueuedSubscription) -> None:
        if isinstance(sub, Subscription):
            if sub in self._inline:
                self._inline.remove(sub)
            if sub in self._transient:
                self._transient.remove(sub)
        elif sub in self._queued:
            self._queued.remove(sub)
            if sub.task is not None:
                sub.task.cancel()
        log.debug("bus subscriber %s removed", sub.name)

    def add_drain_hook(self, hook: DrainHook) -> None:
        """`hook()` flushes its pending work and returns True if it did anything."""
        self._drain_hooks.append(hook)

    # -- emitting -----------------------------------------------------------------------------

    def _validated(
        self, event_type: str, payload: Any, catalog: Mapping[str, type[BaseModel]]
    ) -> dict[str, Any] | None:
        model = catalog.get(event_type)
        try:
            if model is None:
                raise UnknownEventType(f"unknown event type {event_type!r}")
            instance = payload if isinstance(payload, model) else model.model_validate(payload)
            return instance.model_dump(mode="json")
        except UnknownEventType:
            if self.strict:
                raise
            log.error("dropped event of unknown type %r", event_type)
        except ValidationError as exc:
            if self.strict:
                raise EventValidationError(f"invalid {event_type} payload: {exc}") from None
            log.error("dropped invalid %s event: %s", event_type, exc.errors(include_input=False))
        return None

    def emit(
        self,
        session_id: str,
        event_type: str,
        payload: BaseModel | dict[str, Any],
        *,
        actor: str,
        turn_id: str | None = None,
        parent_event_id: str | None = None,
    ) -> Event | None:
        """Publish a catalog event; returns its envelope (None if dropped in lenient mode)."""
        data = self._validated(event_type, payload, PERSISTED)
        if data is None:
            return None
        seq = self._seq.get(session_id, 0) + 1
        self._seq[session_id] = seq
        event = Event(
            id=new_ulid(),
            seq=seq,
            timestamp_us=now_us(),
            session_id=session_id,
            turn_id=turn_id,
            parent_event_id=parent_event_id,
            type=event_type,
            actor=actor,
            payload=data,
        )
        self._deliver(event)
        for sub in list(self._queued):
            try:
                sub.queue.put_nowait(event)
            except asyncio.QueueFull:
                self._overflow(sub)
        return event

    def emit_transient(
        self,
        session_id: str,
        event_type: str,
        payload: BaseModel | dict[str, Any],
        *,
        turn_id: str,
        parent_event_id: str | None,
        typed: bool = False,
    ) -> TransientEvent | None:
        """Publish a streaming-only event through the same ordered channel (hub only).

        `typed=True` says the payload dict came from a provider stream model whose fields are
        the catalog's (tests/core/events pin the two together); it skips the catalog round
        trip, which would otherwise be the largest cost of a streamed delta.
        """
        data: dict[str, Any] | None
        if typed and isinstance(payload, dict):
            data = payload
        else:
            data = self._validated(event_type, payload, STREAMING)
        if data is None:
            return None
        event = TransientEvent(session_id, turn_id, parent_event_id, event_type, data)
        self._deliver(event)
        return event

    def _deliver(self, event: AnyEvent) -> None:
        for sub in self._transient if event.transient else self._inline:
            try:
                sub.handler(event)
            except Exception:
                self._log_subscriber_error(sub, event)

    def _log_subscriber_error(self, sub: Subscription, event: AnyEvent) -> None:
        now = time.monotonic()
        if now - sub.last_error_log < _ERROR_LOG_INTERVAL_S:
            sub.suppressed_errors += 1
            return
        seq = getattr(event, "seq", None)
        log.exception(
            "bus subscriber %s failed on %s (stream %s, seq %s; %d similar errors suppressed)",
            sub.name,
            event.type,
            event.session_id,
            seq,
            sub.suppressed_errors,
        )
        sub.last_error_log, sub.suppressed_errors = now, 0

    def _overflow(self, sub: QueuedSubscription) -> None:
        log.error("bus subscriber %s overflowed its queue; detached", sub.name)
        self.unsubscribe(sub)
        if sub.on_overflow is not None:
            try:
                sub.on_overflow()
            except Exception:
                log.exception("overflow callback of %s failed", sub.name)

    async def _consume(self, sub: QueuedSubscription) -> None:
        while True:
            event = await sub.queue.get()
            try:
                await sub.handler(event)
            except Exception:
                log.exception("queued subscriber %s failed on %s", sub.name, event.type)
            finally:
                sub.queue.task_done()

    # -- draining -----------------------------------------------------------------------------

    async def drain(self) -> None:
        """Wait until every queue is empty and every drain hook (the trace writer) has flushed.

        Loops because handlers may emit follow-up events while being drained.
        """
        while True:
            busy = False
            for sub in list(self._queued):
                if not sub.queue.empty():
                    busy = True
                    await sub.queue.join()
            for hook in list(self._drain_hooks):
                busy = await hook() or busy
            if not busy:
                return

    async def close(self) -> None:
        """Shutdown: drain what is queued, then detach the queued subscribers."""
        await self.drain()
        for sub in list(self._queued):
            self.unsubscribe(sub)
