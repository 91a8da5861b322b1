"""A call that ends its turn commits the assistant message with `llm.call_completed` and
`turn.completed` in one transaction — and a refused commit shows none of them and still ends
the turn, failed."""

from __future__ import annotations

from pathlib import Path

from metis.core.runtime import Core
from metis.core.turns.service import TurnRequest

HELLO = [{"type": "text", "text": "hello"}]


async def _types(core: Core, session_id: str) -> list[str]:
    await core.flush()
    rows = await core.db.fetchall(
        "SELECT type FROM events WHERE session_id=? ORDER BY seq", (session_id,)
    )
    return [r["type"] for r in rows]


async def _assistant_messages(core: Core, session_id: str) -> int:
    rows = await core.db.fetchall(
        "SELECT id FROM messages WHERE session_id=? AND role='assistant'", (session_id,)
    )
    return len(rows)


async def test_a_turn_its_last_call_ends_stores_its_message_and_its_end(
    core: Core, workspace: Path
) -> None:
    session = await core.sessions.create(str(workspace))
    accepted = await core.turns.submit(TurnRequest(session.id, HELLO))
    await core.turns.wait_all()
    types = await _types(core, session.id)
    assert types[-2:] == ["llm.call_completed", "turn.completed"]
    assert await _assistant_messages(core, session.id) == 1
    turn = await core.db.fetchone("SELECT status FROM turns WHERE id=?", (accepted.turn_id,))
    assert turn is not None and turn["status"] == "completed"
    assert core.slots.get(session.id) is None


async def test_the_message_and_the_turns_end_commit_together_or_not_at_all(
    core: Core, workspace: Path
) -> None:
    """The store refuses `turn.completed` (a trigger here, as a full disk would refuse the
    whole write): the assistant message is not stored either, neither event is shown or
    leaves a hole in the seqs, and the turn still ends, with `turn.failed`."""
    session = await core.sessions.create(str(workspace))
    await core.db.transaction(
        lambda conn: conn.execute(
            "CREATE TRIGGER no_completion BEFORE INSERT ON events "
            "WHEN NEW.type = 'turn.completed' BEGIN SELECT RAISE(ABORT, 'disk full'); END"
        )
    )
    accepted = await core.turns.submit(TurnRequest(session.id, HELLO))
    await core.turns.wait_all()

    types = await _types(core, session.id)
    assert "turn.completed" not in types and "llm.call_completed" not in types
    assert types[-1] == "turn.failed"
    assert await _assistant_messages(core, session.id) == 0
    failed = await core.db.fetchone(
        "SELECT payload_json FROM events WHERE turn_id=? AND type='turn.failed'",
        (accepted.turn_id,),
    )
    assert failed is not None and '"internal_error"' in failed["payload_json"]
    seqs = await core.db.fetchall("SELECT seq FROM events WHERE session_id=?", (session.id,))
    assert sorted(r["seq"] for r in seqs) == list(range(1, len(seqs) + 1))
    turn = await core.db.fetchone("SELECT status FROM turns WHERE id=?", (accepted.turn_id,))
    assert turn is not None and turn["status"] == "failed"
    assert core.slots.get(session.id) is None

    await core.db.transaction(lambda conn: conn.execute("DROP TRIGGER no_completion"))
    await core.turns.submit(TurnRequest(session.id, HELLO))
    await core.turns.wait_all()
    assert (await _types(core, session.id))[-1] == "turn.completed"
    assert await _assistant_messages(core, session.id) == 1
