"""Read side of the trace: event pages, cursor resolution, seq seeding and the gap scan."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from metis.core.errors import CursorNotFound
from metis.core.events.envelope import Event
from metis.core.store.db import Database


def row_to_event(row: sqlite3.Row) -> Event:
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
    def __init__(self, db: Database) -> None:
        self.db = db

    async def seq_of(self, session_id: str, event_id: str) -> int:
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

    async def latest(self, session_id: str) -> Event | None:
        row = await self.db.fetchone(
            "SELECT * FROM events WHERE session_id=? ORDER BY seq DESC LIMIT 1", (session_id,)
        )
        return row_to_event(row) if row else None

    async def max_seqs(self) -> dict[str, int]:
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
