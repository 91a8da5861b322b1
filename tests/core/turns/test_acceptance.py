"""A turn's acceptance: its rows and the events announcing it (`turn.started`, `route.decided`)
commit in one transaction before the 202 — and a refused acceptance leaves no trace of them."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from metis.core.turns.service import TurnRequest
from metis.server.runner import Daemon

HELLO = [{"type": "text", "text": "hello"}]


async def _types(daemon: Daemon, session_id: str) -> list[str]:
    await daemon.core.flush()
    rows = await daemon.core.db.fetchall(
        "SELECT type FROM events WHERE session_id=? ORDER BY seq", (session_id,)
    )
    return [r["type"] for r in rows]


async def test_a_turn_is_accepted_in_one_transaction_with_its_start_stored(
    daemon: Daemon, workspace: Path
) -> None:
    core = daemon.core
    session = await core.sessions.create(str(workspace))
    before = core.writer.transactions
    accepted = await core.turns.submit(TurnRequest(session.id, HELLO))
    # returned before the runner's first step: only the acceptance has been committed
    assert core.writer.transactions - before == 1
    row = await core.db.fetchone(
        "SELECT type FROM events WHERE turn_id=? ORDER BY seq LIMIT 1", (accepted.turn_id,)
    )
    assert row is not None and row["type"] == "turn.started"
    await core.turns.wait_all()


async def test_a_refused_acceptance_stores_and_shows_nothing_and_frees_the_slot(
    daemon: Daemon, workspace: Path
) -> None:
    """The store refuses the turn row (a trigger here, as a full disk would): the submit fails,
    neither the turn nor its events exist, the session's seq continues without a gap and the
    next turn is accepted."""
    core = daemon.core
    session = await core.sessions.create(str(workspace))
    last_seq = core.bus.last_seq(session.id)
    await core.db.transaction(
        lambda conn: conn.execute(
            "CREATE TRIGGER no_turns BEFORE INSERT ON turns "
            "BEGIN SELECT RAISE(ABORT, 'no turns today'); END"
        )
    )
    with pytest.raises(sqlite3.IntegrityError, match="no turns today"):
        await core.turns.submit(TurnRequest(session.id, HELLO))
    assert core.bus.last_seq(session.id) == last_seq
    assert core.slots.get(session.id) is None
    assert await core.db.fetchall("SELECT id FROM turns") == []
    assert await _types(daemon, session.id) == ["session.created"]

    await core.db.transaction(lambda conn: conn.execute("DROP TRIGGER no_turns"))
    await core.turns.submit(TurnRequest(session.id, HELLO))
    await core.turns.wait_all()
    types = await _types(daemon, session.id)
    assert types[:3] == ["session.created", "turn.started", "route.decided"]
    assert types[-1] == "turn.completed"
    seqs = await core.db.fetchall("SELECT seq FROM events WHERE session_id=?", (session.id,))
    assert sorted(r["seq"] for r in seqs) == list(range(1, len(seqs) + 1))  # no hole


async def test_a_submit_cancelled_while_its_acceptance_commits_still_runs_the_turn(
    daemon: Daemon, workspace: Path
) -> None:
    """The caller (a WebSocket that closed, say) is gone, the acceptance is not: the committed
    turn runs to its end and frees its slot."""
    core = daemon.core
    session = await core.sessions.create(str(workspace))
    async with core.db.write_lock:  # another write holds the writer: the acceptance waits
        submit = asyncio.create_task(core.turns.submit(TurnRequest(session.id, HELLO)))
        while core.slots.get(session.id) is None:  # claimed: the acceptance is on its way
            await asyncio.sleep(0)
        submit.cancel()
        with pytest.raises(asyncio.CancelledError):
            await submit
    for _ in range(200):
        if core.slots.get(session.id) is None:
            break
        await asyncio.sleep(0.01)
    await core.turns.wait_all()
    assert core.slots.get(session.id) is None
    types = await _types(daemon, session.id)
    assert types[1:3] == ["turn.started", "route.decided"] and types[-1] == "turn.completed"
