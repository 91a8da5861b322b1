"""TraceWriter: persists bus events in batches, with their projections, in one transaction each.

It is an inline bus subscriber (the append is O(1)); a background task flushes on size, on a
short timer and at every turn boundary. Projections (turn and session counters,
tokens, Decimal costs, tool-call status) are written from the same events in the same
transaction, so the tables and the trace can never disagree after a crash.

After each transaction it tells its listener (the SessionHub, which shows clients only stored
events) which events are now stored, or lost for good; `expedite` asks for a commit at the next
event-loop tick instead of after the timer, for events a live client is waiting for: whatever
was emitted by then shares that one commit (a group commit).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections import defaultdict, deque
from collections.abc import Callable
from typing import TypeVar, cast

import aiosqlite

from metis.config import EventsSettings
from metis.core.eager import start_eagerly
from metis.core.events.bus import EventBus
from metis.core.events.catalog import TURN_TERMINAL
from metis.core.events.envelope import AnyEvent, Event
from metis.core.store.events import (
    EventStore,
    ToolCallAwaiting,
    ToolCallCalled,
    ToolCallChange,
    ToolCallEnded,
    TraceProjection,
    TurnEnded,
)
from metis.core.store.sessions import Spend

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_DELAYS_S = (0.1, 0.5, 2.0)
_TERMINAL_TOOL_STATUS = {
    "tool.completed": "completed",
    "tool.failed": "failed",
    "tool.input_invalid": "invalid",
}
_TURN_STATUS = {
    "turn.completed": "completed",
    "turn.cancelled": "cancelled",
    "turn.failed": "failed",
}


class TraceWriter:
    """Persists bus events and their projections in batched transactions, reports losses as seq
    gaps, and tells the hub which events are stored."""

    def __init__(self, events: EventStore, bus: EventBus, settings: EventsSettings) -> None:
        self.events = events
        self.bus = bus
        self.settings = settings
        self._pending: deque[Event] = deque()
        self._armed = asyncio.Event()
        self._urgent = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._warned = False
        self._announcing = False  # inside `commit_with`'s announce: its events go with it
        self._lost: dict[str, list[int]] = {}
        self.transactions = 0  # test hook: committed flushes
        self.sleep = asyncio.sleep
        self.fail_next_flushes = 0  # test hook: inject flush failures
        # Told after each batch: committed (True) or dropped for good (False).
        self.on_settled: Callable[[list[Event], bool], None] | None = None

    # -- bus side -----------------------------------------------------------------------------

    def __call__(self, event: AnyEvent) -> None:
        """The inline bus subscriber: queue a stored event in O(1) and arm the flush; past
        `writer_max_pending` the oldest batch is dropped and reported as a gap."""
        if not isinstance(event, Event):
            return
        self._pending.append(event)
        pending = len(self._pending)
        if pending > self.settings.writer_max_pending:
            self._drop_oldest_batch()
        elif pending > self.settings.writer_warn_pending and not self._warned:
            self._warned = True
            log.warning("trace writer has %d pending events", pending)
        if self._announcing:
            return  # the transaction announcing it stores it: no flush to arm or hurry
        if pending == 1:
            self._armed.set()  # starts the timer of the oldest unflushed event
        if pending >= self.settings.flush_batch_events or event.type in TURN_TERMINAL:
            self._armed.set()
            self._urgent.set()

    def _drop_oldest_batch(self) -> None:
        dropped = [
            self._pending.popleft()
            for _ in range(min(self.settings.max_batch_events, len(self._pending)))
        ]
        log.error(
            "trace writer over %d pending events; dropped %d",
            self.settings.writer_max_pending,
            len(dropped),
        )
        self._record_loss(dropped)
        self._settled(dropped, False)

    def _settled(self, batch: list[Event], stored: bool) -> None:
        if self.on_settled is not None:
            try:
                self.on_settled(batch, stored)
            except Exception:  # pragma: no cover - the listener's own bug; the trace is safe
                log.exception("trace writer listener failed")

    def expedite(self) -> None:
        """Commit what is pending at the next loop tick (a live client waits for it); inside an
        announce, the transaction about to begin commits it."""
        if self._pending and not self._announcing:
            self._armed.set()
            self._urgent.set()

    def _record_loss(self, events: list[Event]) -> None:
        for ev in events:
            span = self._lost.setdefault(ev.session_id, [ev.seq, ev.seq])
            span[0], span[1] = min(span[0], ev.seq), max(span[1], ev.seq)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the flush task, and have `bus.drain` flush the writer too."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="trace-writer")
        self.bus.add_drain_hook(self.flush)

    async def close(self) -> None:
        """Stop the flush loop without interrupting a write in progress, then flush the rest."""
        self._closed = True
        self._armed.set()
        self._urgent.set()
        if self._task is not None:
            await self._task
        await self.flush()

    async def _run(self) -> None:
        """Flush 50 ms after the oldest unflushed event, or at once when a flush is urgent."""
        interval = self.settings.flush_interval_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await self._armed.wait()
            self._armed.clear()
            if not self._urgent.is_set():
                # A timer that makes the flush urgent: cheaper than `wait_for`, which wraps the
                # wait in a task of its own (this runs once per turn, at least).
                timer = loop.call_later(interval, self._urgent.set)
                try:
                    await self._urgent.wait()
                finally:
                    timer.cancel()
            self._urgent.clear()
            try:
                await self.flush()
            except Exception:  # pragma: no cover - flush handles its own failures
                log.exception("trace writer loop error")
            if self._closed:
                return

    # -- flushing -----------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    async def flush(self) -> bool:
        """Write everything pending; True if anything was written (a bus drain hook).

        Always takes the flush lock, so a caller also waits for a batch that the background
        loop is writing right now: after `await flush()` every event emitted before is stored.
        Shielded, as `commit_with` is: a batch taken from the queue is always written, or
        reported lost, and its listener told, even when the caller is cancelled meanwhile.
        Started eagerly (`start_eagerly`): a flush that never waits costs no trip round the loop.
        """
        return await asyncio.shield(start_eagerly(self._flush()))

    async def _flush(self) -> bool:
        async with self._flush_lock:
            wrote = False
            failed_once = False
            if self._lost:
                self._report_losses()
            while self._pending:
                batch = [
                    self._pending.popleft()
                    for _ in range(min(self.settings.max_batch_events, len(self._pending)))
                ]
                if await self._write_with_retries(batch):
                    wrote = True
                elif failed_once:
                    self._record_loss(batch)
                    break  # storage is down: keep what is left for the next flush
                else:
                    failed_once = True
                    self._record_loss(batch)
                self._report_losses()  # the gap event is written by the next iteration
            return wrote

    async def commit_with(
        self, rows: Callable[[sqlite3.Connection], T], announce: Callable[[], object]
    ) -> T:
        """Write `rows` and the events `announce` emits about them in one transaction, with
        every other event pending, and return what `rows` returned: one SQLite transaction
        for a change acknowledged together with its event (a new session and its
        `session.created`), where a write then a flush took two.

        `announce` runs under the flush lock, so no other flush can store its events before
        their rows. If the transaction fails, its error is raised, the announced events are
        dropped (never shown; the change did not happen) and their seqs taken back (one that
        another event already followed becomes a reported gap), and the other events go back
        to the queue for the next flush. Shielded: a caller cancelled
        meanwhile does not stop a transaction already on its way, so what is pending and what is
        shown always follow what was committed.
        """
        return await asyncio.shield(start_eagerly(self._commit_with(rows, announce)))

    async def _commit_with(
        self, rows: Callable[[sqlite3.Connection], T], announce: Callable[[], object]
    ) -> T:
        async with self._flush_lock:
            if self._lost:
                self._report_losses()
            while len(self._pending) >= self.settings.max_batch_events:  # full batches first
                full = [self._pending.popleft() for _ in range(self.settings.max_batch_events)]
                if not await self._write_with_retries(full):
                    self._record_loss(full)
            before = len(self._pending)
            self._announcing = True
            try:
                announce()
            finally:
                self._announcing = False
            batch = list(self._pending)
            self._pending.clear()
            try:
                result = await self.events.append(batch, project(batch), rows)
            except BaseException:
                self._pending.extendleft(reversed(batch[:before]))
                if self._pending:
                    self._armed.set()
                announced = batch[before:]
                kept = [e for e in reversed(announced) if not self.bus.take_back(e)]
                self._record_loss(kept)  # seqs that others followed: a visible gap
                self._settled(announced, False)
                raise
            self.transactions += 1
            self._settled(batch, True)
            return cast(T, result)

    async def _write_with_retries(self, batch: list[Event]) -> bool:
        for attempt in range(len(RETRY_DELAYS_S) + 1):
            try:
                if self.fail_next_flushes > 0:
                    self.fail_next_flushes -= 1
                    raise aiosqlite.OperationalError("injected flush failure")
                await self._write(batch)
                self._settled(batch, True)
                return True
            except (aiosqlite.Error, OSError) as exc:
                if attempt == len(RETRY_DELAYS_S):
                    log.error("trace batch of %d events dropped after retries: %s", len(batch), exc)
                    self._settled(batch, False)
                    return False
                log.warning("trace flush failed (%s); retrying", exc)
                await self.sleep(RETRY_DELAYS_S[attempt])
        return False  # pragma: no cover

    def _report_losses(self) -> None:
        """Make every loss a visible seq gap: one `bus.gap_detected` per affected stream."""
        lost, self._lost = self._lost, {}
        for stream, (first, last) in lost.items():
            self.bus.emit(
                stream,
                "bus.gap_detected",
                {"missing_from_seq": first, "missing_to_seq": last, "detected_by": "writer"},
                actor="system",
            )

    async def _write(self, batch: list[Event]) -> None:
        """The batch and its projections in one transaction."""
        await self.events.append(batch, project(batch))
        self.transactions += 1


def project(batch: list[Event]) -> TraceProjection:
    """The projections of one batch, computed before its transaction."""
    turns: dict[str, Spend] = defaultdict(Spend)
    sessions: dict[str, Spend] = defaultdict(Spend)
    tool_calls: list[ToolCallChange] = []
    turn_ends: list[TurnEnded] = []
    for e in batch:
        p = e.payload
        if e.type in ("llm.call_completed", "llm.call_failed"):
            if e.turn_id:
                turns[e.turn_id].add_usage(p)
            sessions[e.session_id].add_usage(p)
            sessions[e.session_id].updated_at_us = e.timestamp_us
        elif e.type == "llm.call_started" and e.turn_id:
            turns[e.turn_id].llm_calls += 1
        elif e.type == "tool.confirmation_requested":
            tool_calls.append(ToolCallAwaiting(p["tool_use_id"]))
        elif e.type == "tool.called":
            if e.turn_id:
                turns[e.turn_id].tool_calls += 1
            status = "awaiting_client" if p["origin"] == "application" else "running"
            tool_calls.append(ToolCallCalled(p["tool_use_id"], status, e.timestamp_us))
        elif e.type in _TERMINAL_TOOL_STATUS:
            status = _TERMINAL_TOOL_STATUS[e.type]
            if p.get("error_class") == "cancelled":
                status = "cancelled"
            tool_calls.append(
                ToolCallEnded(
                    tool_use_id=p["tool_use_id"],
                    status=status,
                    ended_at_us=e.timestamp_us,
                    duration_ms=p.get("duration_ms"),
                    error_class=p.get("error_class"),
                    is_error=e.type != "tool.completed" or bool(p.get("is_error")),
                    result_message_id=p.get("result_message_id"),
                )
            )
        elif e.type in _TURN_STATUS and e.turn_id:
            turn_ends.append(
                TurnEnded(
                    turn_id=e.turn_id,
                    status=_TURN_STATUS[e.type],
                    stop_reason=p.get("stop_reason"),
                    end_reason=p.get("reason"),
                    error_message=p.get("message"),
                    ended_at_us=e.timestamp_us,
                )
            )
            sessions[e.session_id].updated_at_us = e.timestamp_us
    return TraceProjection(turns, sessions, tool_calls, turn_ends)
