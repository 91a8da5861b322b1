"""Small helpers for tests that need rows before the session service creates them."""

from __future__ import annotations

from metis.core.canonical.ids import new_session_id, new_ulid
from metis.core.canonical.times import now_us
from metis.core.store.db import Database


async def insert_session(
    db: Database, session_id: str | None = None, workspace: str = "/tmp"
) -> str:
    session_id = session_id or new_session_id()
    stamp = now_us()
    async with db.write() as conn:
        await conn.execute(
            "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, created_at_us, "
            "updated_at_us) VALUES (?,?,?,'active',?,?)",
            (session_id, workspace, "v", stamp, stamp),
        )
    return session_id


async def insert_running_turn(db: Database, session_id: str, model: str = "local:scripted") -> str:
    turn_id = new_ulid()
    async with db.write() as conn:
        await conn.execute(
            "INSERT INTO turns (id, session_id, ordinal, status, trigger, model, confirmation_policy, "
            "started_at_us) VALUES (?,?,(SELECT COUNT(*)+1 FROM turns WHERE session_id=?),'running',"
            "'user_message',?,'wait',?)",
            (turn_id, session_id, session_id, model, now_us()),
        )
    return turn_id
