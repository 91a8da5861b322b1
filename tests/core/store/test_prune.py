"""Trace retention: which events a prune deletes, the floor it records, and a
restart after it (seq continues, the pruned prefix is never reported as a gap)."""

from __future__ import annotations

from collections.abc import Callable

from metis.commands.trace import DAY_US
from metis.config import Settings
from metis.core.canonical.times import now_us
from metis.core.events.catalog import SYSTEM_STREAM
from metis.core.runtime import Core
from metis.core.store.db import Database
from metis.core.store.prune import PrunedStream, prune_events
from tests.helpers import insert_session, model_changed


async def stream_with(core: Core, events: int) -> str:
    sid = await insert_session(core.db)
    for _ in range(events):
        model_changed(core, sid)
    return sid


async def age(db: Database, stream: str, up_to_seq: int, days: int) -> None:
    """Back-date a stream's events up to `up_to_seq` by `days` (what time would have done)."""
    async with db.write() as conn:
        await conn.execute(
            "UPDATE events SET timestamp_us = timestamp_us - ? WHERE session_id=? AND seq<=?",
            (days * DAY_US, stream, up_to_seq),
        )


async def seqs(db: Database, stream: str) -> list[int]:
    rows = await db.fetchall("SELECT seq FROM events WHERE session_id=? ORDER BY seq", (stream,))
    return [r["seq"] for r in rows]


async def floor_of(db: Database, session_id: str) -> int:
    row = await db.fetchone("SELECT events_floor_seq FROM sessions WHERE id=?", (session_id,))
    assert row is not None
    return int(row["events_floor_seq"])


async def test_only_each_session_streams_old_prefix_goes_and_the_floor_is_its_last_seq(
    core: Core,
) -> None:
    partly_old, recent, all_old = [await stream_with(core, 10) for _ in range(3)]
    purged = {"purged_session_id": "sess_x", "messages_deleted": 0, "events_deleted": 0}
    core.bus.emit(SYSTEM_STREAM, "session.purged", purged, actor="system")
    await core.flush()
    system = await seqs(core.db, SYSTEM_STREAM)
    await age(core.db, partly_old, 7, days=40)
    await age(core.db, partly_old, 8, days=1)  # newer than the cutoff: the prefix ends at 7
    await age(core.db, all_old, 10, days=40)
    await age(core.db, SYSTEM_STREAM, 10**9, days=40)
    async with core.db.write() as conn:  # a hole right before the prefix's end
        await conn.execute("DELETE FROM events WHERE session_id=? AND seq=7", (partly_old,))

    pruned = await prune_events(core.db, now_us() - 30 * DAY_US, chunk_events=4)

    assert pruned == [PrunedStream(partly_old, 6, 6), PrunedStream(all_old, 9, 9)]
    assert await seqs(core.db, partly_old) == [8, 9, 10]
    assert await floor_of(core.db, partly_old) == 6  # the highest deleted seq, not 7
    assert await seqs(core.db, all_old) == [10]  # a stream keeps its newest event
    assert await floor_of(core.db, all_old) == 9
    assert await seqs(core.db, recent) == list(range(1, 11))
    assert await floor_of(core.db, recent) == 0
    assert await seqs(core.db, SYSTEM_STREAM) == system != []  # the system stream: never
    assert await prune_events(core.db, now_us() - 30 * DAY_US) == []  # idempotent


async def test_a_restart_after_a_prune_continues_the_stream_and_reports_no_gap(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    core = Core(settings)
    await core.start()
    sid = await stream_with(core, 5)
    await core.flush()
    await age(core.db, sid, 5, days=2)
    assert await prune_events(core.db, now_us() - DAY_US) == [PrunedStream(sid, 4, 4)]
    await core.stop()
    for _ in range(2):
        core = Core(settings)
        await core.start()
        model_changed(core, sid)
        await core.flush()
        gaps = await core.db.fetchall(
            "SELECT seq FROM events WHERE session_id=? AND type='bus.gap_detected'", (sid,)
        )
        await core.stop()
        assert gaps == []
    assert await _seqs_of(settings, sid) == [5, 6, 7]


async def _seqs_of(settings: Settings, stream: str) -> list[int]:
    db = Database(settings.db_path)
    await db.open()
    try:
        return await seqs(db, stream)
    finally:
        await db.close()
