"""HistoryWriter: the one way messages join a session's history.

The session service (a surface's seed history), the turn service (a turn's input, in its
acceptance transaction), the turn runner (assistant messages with their tool calls) and the tool
dispatcher (tool results) all commit messages this way, so the store and the session cache
(metis/core/sessions/cache.py) never disagree about what a session said.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from metis.core.canonical.messages import Message
from metis.core.sessions.cache import SessionCache
from metis.core.store.messages import NewToolCall
from metis.core.store.store import Store
from metis.core.store.tx import Transaction

Flush = Callable[[], Awaitable[object]]
"""Make every event emitted so far readable (the trace writer's flush): what a service awaits
before acknowledging, so a crash after the answer cannot take its events back."""

SurfaceWrites = Callable[[Transaction, list[Message]], None]
"""A surface's own rows for a transaction that commits messages (a seed history, a turn's
acceptance): queued on it (through the surface's store extension, `tx.using(...)`); receives
the committed messages."""


R = TypeVar("R")


class CommitWithEvents(Protocol):
    """Rows and the events announcing them in one transaction (`TraceWriter.commit_with`)."""

    async def __call__(
        self, rows: Callable[[sqlite3.Connection], R], announce: Callable[[], object]
    ) -> R:
        """Commit `rows` with the events `announce` emits; the rows' result."""


class HistoryWriter:
    """Commits messages to the store and, once committed, appends them to the cached history."""

    def __init__(
        self, store: Store, cache: SessionCache, commit_with_events: CommitWithEvents
    ) -> None:
        self._store = store
        self._cache = cache
        self._commit_with_events = commit_with_events

    async def commit(
        self,
        session_id: str,
        messages: Sequence[Message],
        tool_calls: Sequence[NewToolCall] = (),
        surface_writes: SurfaceWrites | None = None,
        announce: Callable[[], object] | None = None,
    ) -> None:
        """Commit messages (validated before the write), the tool_calls rows of their tool
        uses and the surface's rows in one transaction, then add them to the cached history.
        `announce` as in `commit_with`."""

        def rows(tx: Transaction) -> None:
            tx.messages.insert(*messages)
            tx.messages.insert_tool_calls(tool_calls)
            if surface_writes is not None:
                surface_writes(tx, [*messages])

        await self.commit_with(session_id, messages, rows, announce)

    async def commit_with(
        self,
        session_id: str,
        messages: Sequence[Message],
        rows: Callable[[Transaction], None],
        announce: Callable[[], object] | None = None,
    ) -> None:
        """One transaction whose writes `rows` queues (it stores `messages` along with rows of
        its own: a turn's acceptance, a tool result linked to its call); once it has
        committed, `messages` join the cached history. With `announce`, the events it emits
        about those writes are stored in the same transaction (`TraceWriter.commit_with`):
        the change and its events are acknowledged in one transaction."""
        tx = self._store.transaction()
        rows(tx)
        if announce is None:
            await tx.commit()
        else:
            await self._commit_with_events(tx.handed_over(), announce)
        self._cache.committed(session_id, *messages)
