"""Trace retention: delete each session stream's old prefix and raise its floor.

Only `events` rows of streams that have a `sessions` row are deleted, so the `system` stream,
messages, turns and tool calls are never touched. Each stream keeps its newest event whatever
its age: the daemon seeds a stream's next seq from `MAX(seq)` and the hand-off point of a snapshot
from the latest stored event, so an emptied stream would restart at seq 1 below its own floor.

Rows go in short transactions of at most `CHUNK_EVENTS`, each deleting a run of the prefix and
setting `sessions.events_floor_seq` to the highest seq it deleted. Everything at or below the
floor is therefore gone at every commit, and the daemon may keep running: its writes wait at
most one chunk (well inside `busy_timeout`) instead of behind one long delete.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from functools import partial

from metis.core.store.db import Database

CHUNK_EVENTS = 5000

# Per session stream: its floor, its newest seq, and the first seq not older than the cutoff
# (NULL when every event is older). The prefix to delete ends below both of the last two.
_PLAN_SQL = """
SELECT s.id AS session_id, s.events_floor_seq AS floor, MAX(e.seq) AS last_seq,
       MIN(CASE WHEN e.timestamp_us >= ? THEN e.seq END) AS first_kept
FROM sessions s JOIN events e ON e.session_id = s.id
GROUP BY s.id ORDER BY s.id
"""


@dataclass(frozen=True)
class PrunedStream:
    """A session stream that lost events to retention: how many, and its new floor seq."""

    session_id: str
    deleted: int
    floor_seq: int


async def prune_events(
    db: Database, older_than_us: int, *, chunk_events: int = CHUNK_EVENTS
) -> list[PrunedStream]:
    """Delete every session stream's prefix of events stamped before `older_than_us`.

    Returns the streams that lost events (in session id order), with how many and their new
    floor.
    """
    pruned: list[PrunedStream] = []
    for plan in await db.fetchall(_PLAN_SQL, (older_than_us,)):
        session_id, floor = plan["session_id"], int(plan["floor"])
        end = int(plan["last_seq"])
        if plan["first_kept"] is not None:
            end = min(end, int(plan["first_kept"]))
        deleted = 0
        while True:
            chunk = await db.transaction(
                partial(
                    _delete_chunk, session_id=session_id, above=floor, end=end, limit=chunk_events
                )
            )
            if chunk is None:
                break
            floor, count = chunk
            deleted += count
        if deleted:
            pruned.append(PrunedStream(session_id, deleted, floor))
    return pruned


async def count_prunable(db: Database, older_than_us: int) -> list[PrunedStream]:
    """What `prune_events` with the same cutoff would delete, deleting nothing: the streams
    that would lose events, with how many and the floor they would get."""
    would: list[PrunedStream] = []
    for plan in await db.fetchall(_PLAN_SQL, (older_than_us,)):
        end = int(plan["last_seq"])
        if plan["first_kept"] is not None:
            end = min(end, int(plan["first_kept"]))
        row = await db.fetchone(
            "SELECT COUNT(*), MAX(seq) FROM events WHERE session_id=? AND seq>? AND seq<?",
            (plan["session_id"], int(plan["floor"]), end),
        )
        if row is not None and row[0]:
            would.append(PrunedStream(plan["session_id"], int(row[0]), int(row[1])))
    return would


def _delete_chunk(
    conn: sqlite3.Connection, *, session_id: str, above: int, end: int, limit: int
) -> tuple[int, int] | None:
    """Delete the next `limit` events with seq in (above, end) and raise the floor to the last
    of them; returns (new floor, rows deleted), or None when nothing is left below `end`."""
    row = conn.execute(
        "SELECT MAX(seq) FROM (SELECT seq FROM events WHERE session_id=? AND seq>? AND seq<? "
        "ORDER BY seq LIMIT ?)",
        (session_id, above, end, limit),
    ).fetchone()
    if row[0] is None:
        return None
    upto = int(row[0])
    deleted = conn.execute(
        "DELETE FROM events WHERE session_id=? AND seq<=?", (session_id, upto)
    ).rowcount
    conn.execute(
        "UPDATE sessions SET events_floor_seq=MAX(events_floor_seq, ?) WHERE id=?",
        (upto, session_id),
    )
    return upto, deleted
