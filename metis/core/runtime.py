"""Core: the daemon's components wired together, with start-up and shutdown in contract order.

Start-up (seed 003 §3.2): config (already loaded) → registry → SQLite → bus subscribers →
recovery → ready to bind. Shutdown: cancel turns → drain the bus → close adapters → close SQLite.
Surfaces receive a started Core and never construct components themselves.
"""

from __future__ import annotations

import logging
import time

from metis.config import Settings
from metis.core.canonical import now_us
from metis.core.events.bus import EventBus
from metis.core.events.costs import CostAccumulator
from metis.core.events.writer import TraceWriter
from metis.core.recovery import fail_orphaned_turns, report_gaps, seed_from_store
from metis.core.slots import TurnSlots
from metis.core.store.db import Database
from metis.core.store.events import EventStore
from metis.core.store.messages import MessageStore

log = logging.getLogger(__name__)


class Core:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings.db_path)
        self.bus = EventBus(strict=settings.events.strict)
        self.costs = CostAccumulator()
        self.writer = TraceWriter(self.db, self.bus, settings.events)
        self.events = EventStore(self.db)
        self.messages = MessageStore(self.db)
        self.slots = TurnSlots()
        self.started_at_us = 0
        self._started_monotonic = 0.0

    async def start(self) -> None:
        await self.db.open()
        self.bus.subscribe("trace-writer", self.writer)
        self.bus.subscribe("cost-accumulator", self.costs)
        await seed_from_store(self.db, self.bus, self.costs)
        self.writer.start()
        await report_gaps(self.db, self.bus)
        await fail_orphaned_turns(self.db, self.bus, self.costs)
        await self.writer.flush()
        self.started_at_us = now_us()
        self._started_monotonic = time.monotonic()
        log.info("core started (database %s, schema v%d)", self.db.path, self.db.schema_version)

    async def stop(self) -> None:
        await self.bus.drain()
        await self.writer.close()
        await self.db.close()
        log.info("core stopped")

    async def flush(self) -> None:
        """Make every event emitted so far readable (read-your-writes for REST and replay)."""
        await self.writer.flush()

    @property
    def uptime_seconds(self) -> float:
        return time.monotonic() - self._started_monotonic

    def active_turn_count(self) -> int:
        return len(self.slots)

    def active_session_count(self) -> int:
        """Non-ended sessions with a turn holding the slot or at least one attached client."""
        return len(self.slots)
