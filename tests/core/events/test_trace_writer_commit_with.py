"""`TraceWriter.commit_with`: a change and the events announcing it in one transaction — and,
when that transaction fails, nothing of the change and nothing lost of anyone else's events."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from metis.core.runtime import Core
from tests.helpers import insert_session

GAP = {"missing_from_seq": 1, "missing_to_seq": 1, "detected_by": "writer"}


async def _types(core: Core, session_id: str) -> list[str]:
    rows = await core.db.fetchall(
        "SELECT type FROM events WHERE session_id=? ORDER BY seq", (session_id,)
    )
    return [r["type"] for r in rows]


async def test_a_new_session_row_and_its_first_event_take_one_transaction(
    core: Core, tmp_path: Path
) -> None:
    before = core.writer.transactions
    view = await core.sessions.create(str(tmp_path))
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
    core: Core, tmp_path: Path
) -> None:
    """A store that refuses the row (here: the table made read-only by a trigger) answers an
    error; the session does not exist, and no seq counter of it is left behind."""
    await core.db.transaction(
        lambda conn: conn.execute(
            "CREATE TRIGGER no_new_sessions BEFORE INSERT ON sessions "
            "BEGIN SELECT RAISE(ABORT, 'sessions are read-only'); END"
        )
    )
    streams_before = set(core.bus._seq)
    with pytest.raises(sqlite3.IntegrityError, match="read-only"):
        await core.sessions.create(str(tmp_path))
    assert set(core.bus._seq) == streams_before
    assert await core.db.fetchall("SELECT id FROM sessions") == []
