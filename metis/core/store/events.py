"""Read side of the trace: event pages, cursor resolution, seq seeding and the gap scan."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pydantic_core import to_json

from metis.core.errors import CursorNotFound
from metis.core.events.envelope import Event
from metis.core.store.db import Database
from metis.core.store.sessions import Spend, add_spend

# Tool-call statuses only move forward: a projection never undoes a direct write.
T = TypeVar("T")

_TOOL_STATUS_BEFORE = {
    status: "(" + ", ".join(f"'{s}'" for s in earlier) + ")"
    for status, earlier in {
        "awaiting_confirmation": ("pending",),
        "awaiting_client": ("pending", "awaiting_confirmation"),
        "running": ("pending", "awaiting_confirmation", "awaiting_client"),
        "terminal": ("pending", "awaiting_confirmation", "awaiting_client", "running"),
    }.items()
}
_SET_TOOL_STATUS = {
    status: f"UPDATE tool_calls SET status=? WHERE id=? AND status IN {before}"
    for status, before in _TOOL_STATUS_BEFORE.items()
    if status != "terminal"
}
_TOOL_CALLED = {
    status: "UPDATE tool_calls SET status=?, started_at_us=? WHERE id=? AND status IN "
    + _TOOL_STATUS_BEFORE[status]
    for status in ("awaiting_client", "running")
}
_TOOL_ENDED = (
    "UPDATE tool_calls SET status=?, ended_at_us=?, duration_ms=?, error_class=?, is_error=?, "
    "result_message_id=COALESCE(result_message_id, ?) WHERE id=? "
    f"AND status IN {_TOOL_STATUS_BEFORE['terminal']}"
)


@dataclass(frozen=True)
class ToolCallAwaiting:
    """`tool.confirmation_requested`: the call waits for an answer."""

    tool_use_id: str


@dataclass(frozen=True)
class ToolCallCalled:
    """`tool.called`: `running`, or `awaiting_client` for an application tool."""

    tool_use_id: str
    status: str
    started_at_us: int


@dataclass(frozen=True)
class ToolCallEnded:
    """A terminal tool event: `completed`, `failed`, `cancelled` or `invalid`."""

    tool_use_id: str
    status: str
    ended_at_us: int
    duration_ms: int | None
    error_class: str | None
    is_error: bool
    result_message_id: str | None


ToolCallChange = ToolCallAwaiting | ToolCallCalled | ToolCallEnded


@dataclass(frozen=True)
class TurnEnded:
    """A turn's terminal state, projected onto its `turns` row in the batch that stores its terminal
    event."""

    turn_id: str
    status: str
    stop_reason: str | None
    end_reason: str | None
    error_message: str | None
    ended_at_us: int


@dataclass(frozen=True)
class TraceProjection:
    """What a batch of events changes in the other tables, written in the batch's transaction."""

    turns: dict[str, Spend]
    sessions: dict[str, Spend]
    tool_calls: list[ToolCallChange]
    turn_ends: list[TurnEnded]

    def apply(self, conn: sqlite3.Connection) -> None:
        """Inside the batch's transaction."""
        for turn_id, spend in self.turns.items():
            add_spend(conn, "turns", turn_id, spend)
        for session_id, spend in self.sessions.items():
            add_spend(conn, "sessions", session_id, spend)
        for change in self.tool_calls:
            if isinstance(change, ToolCallAwaiting):
                conn.execute(
                    _SET_TOOL_STATUS["awaiting_confirmation"],
                    ("awaiting_confirmation", change.tool_use_id),
                )
            elif isinstance(change, ToolCallCalled):
                conn.execute(
                    _TOOL_CALLED[change.status],
                    (change.status, change.started_at_us, change.tool_use_id),
                )
            else:
                conn.execute(
                    _TOOL_ENDED,
                    (
                        change.status,
                        change.ended_at_us,
                        change.duration_ms,
                        change.error_class,
                        1 if change.is_error else 0,
                        change.result_message_id,
                        change.tool_use_id,
                    ),
                )
        if self.turn_ends:
            conn.executemany(
                "UPDATE turns SET status=?, stop_reason=?, end_reason=?, error_message=?, "
                "ended_at_us=? WHERE id=? AND status='running'",
                [
                    (
                        t.status,
                        t.stop_reason,
                        t.end_reason,
                        t.error_message,
                        t.ended_at_us,
                        t.turn_id,
                    )
                    for t in self.turn_ends
                ],
            )


def row_to_event(row: sqlite3.Row) -> Event:
    """A stored `events` row as an `Event`; the payload is not validated again, so old rows stay
    readable."""
    return Event(
        id=row["id"],
        seq=row["seq"],
        timestamp_us=row["timestamp_us"],
        session_id=row["session_id"],
        turn_id=row["turn_id"],
        parent_event_id=row["parent_event_id"],
        type=row["type"],
        actor=row["actor"],
        payload=json.loads(row["payload_json"]),
    )


class EventStore:
    """The `events` table: batched appends with their projections, pages, cursors, seq counters and
    the gap scan."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def append(
        self,
        batch: list[Event],
        projection: TraceProjection,
        rows: Callable[[sqlite3.Connection], T] | None = None,
    ) -> T | None:
        """The batch and its projections in one transaction;
        `rows`, the writes those events announce (a new session's row), go first in it, and
        their result is returned."""
        values = [
            (
                e.id,
                e.session_id,
                e.seq,
                e.turn_id,
                e.parent_event_id,
                e.type,
                e.actor,
                e.timestamp_us,
                to_json(e.payload).decode(),  # Rust encoder: ~5x faster than json.dumps here
            )
            for e in batch
        ]

        def write(conn: sqlite3.Connection) -> T | None:
            result = rows(conn) if rows is not None else None
            conn.executemany("INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?)", values)
            projection.apply(conn)
            return result

        return await self.db.transaction(write)

    async def set_turn_model(self, turn_id: str, model: str) -> None:
        """A turn that failed over belongs to the model it went on with (its cost, `GET /costs`'
        by model, `metis sessions show`), not to the one routing chose; the events keep both
        (`llm.call_started.failover_from`)."""
        await self.db.transaction(
            lambda conn: conn.execute("UPDATE turns SET model=? WHERE id=?", (model, turn_id))
        )

    async def of_turn(self, turn_id: str, event_type: str) -> list[Event]:
        """The turn's stored events of one type, in no particular order."""
        rows = await self.db.fetchall(
            "SELECT * FROM events WHERE turn_id=? AND type=?", (turn_id, event_type)
        )
        return [row_to_event(r) for r in rows]

    async def first_id_of_type(self, turn_id: str, event_type: str) -> str | None:
        """The id of a turn's first event of a type (recovery parents `turn.failed` on
        `turn.started`)."""
        row = await self.db.fetchone(
            "SELECT id FROM events WHERE turn_id=? AND type=?", (turn_id, event_type)
        )
        return row["id"] if row else None

    async def seq_of(self, session_id: str, event_id: str) -> int:
        """The seq of an event of this session, or `CursorNotFound`."""
        row = await self.db.fetchone(
            "SELECT seq FROM events WHERE id=? AND session_id=?", (event_id, session_id)
        )
        if row is None:
            raise CursorNotFound(event_id)
        return int(row["seq"])

    async def page(
        self,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        types: Sequence[str] | None = None,
        limit: int = 100,
    ) -> tuple[list[Event], bool]:
        """Events with seq in (after_seq, until_seq], ascending; plus whether more match.

        `types=None` selects every type; an empty `types` selects nothing (a filter naming
        only streaming types matches no stored event), never everything.
        """
        if types is not None and not types:
            return [], False
        sql = "SELECT * FROM events WHERE session_id=? AND seq>?"
        params: list[object] = [session_id, after_seq]
        if until_seq is not None:
            sql += " AND seq<=?"
            params.append(until_seq)
        if types is not None:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            params.extend(types)
        sql += " ORDER BY seq LIMIT ?"
        params.append(limit + 1)
        rows = await self.db.fetchall(sql, tuple(params))
        return [row_to_event(r) for r in rows[:limit]], len(rows) > limit

    async def newest_of_type(self, event_type: str, limit: int) -> list[Event]:
        """The newest stored events of one type across all sessions, newest first.

        Read backwards in the order the rows were written (rowid), no index: the types asked
        for (a turn's route decision) come every few rows, so `limit` of them are found near
        the end of the table, and no index on `type` slows every append for this one read."""
        rows = await self.db.fetchall(
            "SELECT * FROM events NOT INDEXED WHERE type=? ORDER BY rowid DESC LIMIT ?",
            (event_type, limit),
        )
        return [row_to_event(r) for r in rows]

    async def latest(self, session_id: str) -> Event | None:
        """The session's newest stored event, if any."""
        row = await self.db.fetchone(
            "SELECT * FROM events WHERE session_id=? ORDER BY seq DESC LIMIT 1", (session_id,)
        )
        return row_to_event(row) if row else None

    async def max_seqs(self) -> dict[str, int]:
        """The highest stored seq of every stream, to continue numbering after a restart."""
        rows = await self.db.fetchall(
            "SELECT session_id, MAX(seq) AS m FROM events GROUP BY session_id"
        )
        return {r["session_id"]: int(r["m"]) for r in rows}

    async def find_gaps(self) -> list[tuple[str, int, int]]:
        """Holes per stream above its retention floor: (stream, first missing, last missing).

        A hole already covered by a persisted `bus.gap_detected` with the same range is skipped,
        so restarting never reports the same loss twice.
        """
        rows = await self.db.fetchall(
            """
            WITH floors AS (
              SELECT e.session_id, COALESCE(s.events_floor_seq, 0) AS floor
              FROM (SELECT DISTINCT session_id FROM events) e
              LEFT JOIN sessions s ON s.id = e.session_id),
            ordered AS (
              SELECT e.session_id, e.seq,
                     LAG(e.seq) OVER (PARTITION BY e.session_id ORDER BY e.seq) AS prev, f.floor
              FROM events e JOIN floors f ON f.session_id = e.session_id
              WHERE e.seq > f.floor)
            SELECT session_id, COALESCE(prev, floor) + 1 AS first_missing, seq - 1 AS last_missing
            FROM ordered WHERE seq > COALESCE(prev, floor) + 1
            ORDER BY session_id, seq
            """
        )
        reported = {
            (r["session_id"], p["missing_from_seq"], p["missing_to_seq"])
            for r in await self.db.fetchall(
                "SELECT session_id, payload_json FROM events WHERE type='bus.gap_detected'"
            )
            for p in [json.loads(r["payload_json"])]
        }
        return [
            (r["session_id"], int(r["first_missing"]), int(r["last_missing"]))
            for r in rows
            if (r["session_id"], int(r["first_missing"]), int(r["last_missing"])) not in reported
        ]
