"""The trace writer when a write fails or its caller goes away: `commit_with` (a change and the
events announcing it in one transaction) stores nothing of a failed change and loses nothing of
anyone else's events, and a cancelled caller never leaves a batch half-handled."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from metis.core.events.hub import HubClient
from metis.core.runtime import Core
from tests.helpers import insert_session

GAP = {"missing_from_seq": 1, "missing_to_seq": 1, "detected_by": "writer"}


async def _types(core: Core, session_id: str) -> list[str]:
    rows = await core.db.fetchall(
        "SELECT type FROM events WHERE session_id=? ORDER BY seq", (session_id,)
    )
    return [r["type"] for r in rows]


async def test_a_new_session_row_and_its_first_event_take_one_transaction(
    core: Core, workspace: Path
) -> None:
    before = core.writer.transactions
    view = await core.sessions.create(str(workspace))
    assert core.writer.transactions - before == 1
    assert await _types(core, view.id) == ["session.created"]
    row = await core.db.fetchone("SELECT status FROM sessions WHERE id=?", (view.id,))
    assert row is not None and row["status"] == "active"


async def test_rows_that_fail_store_nothing_of_theirs_and_keep_everyone_elses_events(
    core: Core,
) -> None:
    other = await insert_session(core.db)
    core.bus.emit(other, "bus.gap_detected", GAP, actor="system")  # pending, someone else's
    shown: list[tuple[list[str], bool]] = []
    core.writer.on_settled = lambda batch, stored: shown.append(([e.type for e in batch], stored))

    def failing(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO no_such_table VALUES (1)")

    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        await core.writer.commit_with(
            failing,
            lambda: core.bus.emit("ses_never_made", "bus.gap_detected", GAP, actor="system"),
        )
    assert shown == [(["bus.gap_detected"], False)]  # the announced event: dropped, never shown
    assert core.writer.pending_count == 1  # the other session's event waits for the next flush
    await core.writer.flush()
    assert await _types(core, other) == ["bus.gap_detected"]
    assert await _types(core, "ses_never_made") == []


async def test_a_session_whose_row_cannot_be_written_is_not_created_and_leaves_no_counter(
    core: Core, workspace: Path
) -> None:
    """A store that refuses the row (here: the table made read-only by a trigger) answers an
    error; the session does not exist, and no seq counter of it is left behind."""
    await core.db.transaction(
        lambda conn: conn.execute(
            "CREATE TRIGGER no_new_sessions BEFORE INSERT ON sessions "
            "BEGIN SELECT RAISE(ABORT, 'sessions are read-only'); END"
        )
    )
    announced: list[str] = []
    core.bus.subscribe(
        "test-created",
        lambda e: announced.append(e.session_id) if e.type == "session.created" else None,
    )
    with pytest.raises(sqlite3.IntegrityError, match="read-only"):
        await core.sessions.create(str(workspace))
    (session_id,) = announced
    assert core.bus.last_seq(session_id) == 0  # its seq was taken back: the counter is gone
    assert await core.db.fetchall("SELECT id FROM sessions") == []


async def test_a_dropped_event_that_another_followed_keeps_its_seq_as_a_reported_gap(
    core: Core,
) -> None:
    """The announced event's seq can only be taken back while it is its stream's latest; here
    another event of its stream is emitted while the transaction waits for the writer (held by
    another write), so the dropped one stays a hole that the trace reports."""
    sid = await insert_session(core.db)

    def failing(conn: sqlite3.Connection) -> None:
        raise sqlite3.IntegrityError("refused")

    def announce() -> None:
        core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")  # seq 1, to be dropped

    async with core.db.write_lock:  # another write holds the writer
        committing = asyncio.ensure_future(core.writer.commit_with(failing, announce))
        while core.bus.last_seq(sid) < 1:
            await asyncio.sleep(0)
        core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")  # seq 2: it is kept
    with pytest.raises(sqlite3.IntegrityError):
        await committing
    await core.writer.flush()
    rows = await core.db.fetchall(
        "SELECT seq, payload_json FROM events WHERE session_id=? ORDER BY seq", (sid,)
    )
    assert [r["seq"] for r in rows] == [2, 3]  # the other event, then the gap reporting seq 1
    report = rows[1]["payload_json"].replace(" ", "")
    assert '"missing_from_seq":1' in report and '"missing_to_seq":1' in report


async def test_a_cancelled_caller_does_not_undo_a_commit_on_its_way(
    core: Core, workspace: Path
) -> None:
    """The transaction and its bookkeeping run to their end in a shielded task: the session the
    cancelled request asked for exists, with its event, and its seq counter is kept."""
    async with core.db.write_lock:  # another write holds the writer: the commit waits for it
        task = asyncio.create_task(core.sessions.create(str(workspace)))
        await asyncio.sleep(0)  # the commit is on its way
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await core.writer.flush()
    (row,) = await core.db.fetchall("SELECT id FROM sessions")
    assert await _types(core, row["id"]) == ["session.created"]
    assert core.bus.last_seq(row["id"]) == 1
    assert core.writer.pending_count == 0


async def test_a_flush_whose_caller_is_cancelled_still_stores_and_shows_its_batch(
    core: Core,
) -> None:
    sid = await insert_session(core.db)
    shown: list[tuple[list[int], bool]] = []
    core.writer.on_settled = lambda batch, stored: shown.append(([e.seq for e in batch], stored))
    core.bus.emit(sid, "bus.gap_detected", GAP, actor="system")
    async with core.db.write_lock:  # another write holds the writer: the batch waits for it
        flushing = asyncio.create_task(core.writer.flush())
        await asyncio.sleep(0)  # the batch is taken from the queue and on its way
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await flushing
        assert shown == []
    await core.writer.flush()  # waits for the shielded write under the flush lock
    assert shown == [([1], True)]
    assert await _types(core, sid) == ["bus.gap_detected"]


async def test_a_failed_change_hides_only_its_own_events_from_live_clients(core: Core) -> None:
    """Events of the session waiting for the writer when a change fails go back to the queue
    and are stored by the next flush, so live clients must see them. They used to be dropped
    from what the hub held together with the failed change's own event: stored, yet never
    shown live, a gap nothing reported."""
    sid = await insert_session(core.db)
    client = HubClient(sid, maxsize=100)
    core.hub.attach(client)
    core.hub.handoff_point(client, None, lambda: "0")
    gap = ("bus.gap_detected", GAP)

    def failing(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    async with core.writer._flush_lock:  # a flush under way: what is emitted now waits
        core.bus.emit(sid, *gap, actor="system")  # seq 1
        # first in line for the lock, so seq 1 goes into the change's transaction
        committing = core.writer.commit_with(
            failing, lambda: core.bus.emit(sid, *gap, actor="system")
        )
    with pytest.raises(sqlite3.OperationalError):
        await committing  # its own event is dropped (its seq taken back); seq 1 is queued again
    await core.writer.flush()
    rows = await core.db.fetchall("SELECT seq FROM events WHERE session_id=?", (sid,))
    assert [r["seq"] for r in rows] == [1]
    shown = [item.seq for item in client.queue]  # type: ignore[union-attr]
    assert shown == [1]
