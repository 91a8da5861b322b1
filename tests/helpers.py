"""Small helpers for tests that need rows before the session service creates them, or a
daemon named by its home's lock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from metis.core.canonical.ids import new_session_id, new_ulid
from metis.core.canonical.times import now_us
from metis.core.store.db import Database
from metis.server.lock import acquire

# config.yaml text under which every read_file call waits for a confirmation: a turn that
# reads a file stays in flight until the test answers.
HOLD = "tools:\n  confirmation:\n    per_tool: {read_file: prompt}\n"


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


def model_changed(core: Any, sid: str) -> None:
    """One real bus event that changes nothing (`session.model_changed` to no model): volume
    for replay, snapshot and pruning tests without running turns."""
    core.bus.emit(
        sid,
        "session.model_changed",
        {
            "previous_active_model": None,
            "active_model": None,
            "queued": False,
            "applies_after_turn_id": None,
        },
        actor="user",
    )


def text_delta(core: Any, sid: str, text: str) -> None:
    """One transient `text.delta` of a made-up message: stream volume without a provider."""
    core.bus.emit_transient(
        sid,
        "text.delta",
        {"message_id": "01JZZZZZZZZZZZZZZZZZZZZZZZ", "content_block_index": 0, "text": text},
        turn_id="01JZZZZZZZZZZZZZZZZZZZZZZY",
        parent_event_id=None,
    )


@contextmanager
def named_by_home_lock(home: Path, url: str) -> Iterator[None]:
    """The home's lock held and naming `url`, as `metis serve` holds it: clients then take the
    daemon at `url` for the one running on `home` (an in-process daemon holds no lock)."""
    lock = acquire(home)
    lock.record(url)
    try:
        yield
    finally:
        lock.release()
