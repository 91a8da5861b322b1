"""The sessions' search text (`session_search_text`): which words of a conversation a search
finds, kept with every write, and filled by schema v4 from what an earlier release stored.

- A user or assistant message's text blocks are searched; tool calls, their results, thinking
  and a tool message are not.
- Schema v4 fills the table from the stored messages and titles, skipping a message that cannot
  be decoded and one whose session is gone; the file is backed up first.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from metis.core.canonical.content import (
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from metis.core.canonical.ids import new_session_id, new_ulid
from metis.core.canonical.messages import Message
from metis.core.canonical.text import stored_text
from metis.core.canonical.times import now_us
from metis.core.runtime import Core
from metis.core.sessions.search import session_search
from metis.core.store.db import Database
from metis.core.store.migrations import MIGRATIONS
from metis.core.store.sessions import SessionStore
from tests.helpers import insert_session


def _message(session_id: str, role: str, *content: object, **metadata: object) -> Message:
    return Message.model_validate(
        {
            "id": new_ulid(),
            "session_id": session_id,
            "turn_id": None,
            "role": role,
            "content": list(content),
            "created_at_us": now_us(),
            "metadata": metadata,
        }
    )


async def _found(sessions: SessionStore, text: str) -> list[str]:
    listed, _ = await sessions.page(limit=50, search=session_search(text))
    return [s.row.id for s in listed]


async def test_prompts_and_replies_are_searched_tool_work_and_thinking_are_not(
    core: Core,
) -> None:
    sid = await insert_session(core.db)
    use = ToolUseBlock(id="toolu_1", name="shell", input={"command": "grep hidden_input"})
    async with core.store.transaction() as tx:
        tx.messages.insert(
            _message(sid, "user", TextBlock(text="Find the Größe bug")),
            _message(
                sid,
                "assistant",
                ThinkingBlock(thinking="secret_thought"),
                TextBlock(text="Looking at the parser."),
                use,
            ),
            _message(
                sid,
                "tool",
                ToolResultBlock(
                    tool_use_id="toolu_1", content=[TextBlock(text="tool_output_word")]
                ),
                tool_use_id="toolu_1",
            ),
        )
    sessions = core.store.sessions
    assert await _found(sessions, "GRÖSSE parser") == [sid]
    for hidden in ("hidden_input", "secret_thought", "tool_output_word", "shell"):
        assert await _found(sessions, hidden) == [], hidden


def _v3_database(path: Path) -> dict[str, str]:
    """A store as a release at schema v3 left it: sessions with prompts, a reply, a title, a
    tool message, an undecodable prompt and a message whose session is gone."""
    ids = {name: new_session_id() for name in ("plain", "titled", "broken")}
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:3]:
        conn.executescript(script)
    for session_id in ids.values():
        conn.execute(
            "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, "
            "created_at_us, updated_at_us) VALUES (?, '/tmp', 'v', 'active', 1, 1)",
            (session_id,),
        )
    conn.execute(
        "INSERT INTO session_titles (session_id, title, updated_at_us) VALUES (?, 'Straße', 1)",
        (ids["titled"],),
    )
    rows = [
        (ids["plain"], "user", json.dumps([{"type": "text", "text": "migrate the Ledger"}])),
        (ids["plain"], "assistant", json.dumps([{"type": "text", "text": "Done with it"}])),
        (ids["plain"], "tool", json.dumps([{"type": "text", "text": "toolword"}])),
        (ids["broken"], "user", "[{not json"),
        (new_session_id(), "user", json.dumps([{"type": "text", "text": "orphan ledger"}])),
    ]
    for session_id, role, content in rows:
        conn.execute(
            "INSERT INTO messages (id, session_id, turn_id, role, status, content_json, "
            "metadata_json, created_at_us, schema_version) "
            "VALUES (?, ?, NULL, ?, 'complete', ?, '{}', 1, 1)",
            (new_ulid(), session_id, role, content),
        )
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    return ids


async def test_schema_v4_fills_the_search_text_from_what_was_stored(tmp_path: Path) -> None:
    path = tmp_path / "metis.db"
    ids = _v3_database(path)
    db = Database(path)
    await db.open()
    try:
        sessions = SessionStore(db)
        assert await _found(sessions, "ledger") == [ids["plain"]]  # not the orphan's
        assert await _found(sessions, "done migrate") == [ids["plain"]]
        assert await _found(sessions, "strasse") == [ids["titled"]]
        assert await _found(sessions, "toolword") == []
        assert await _found(sessions, "json") == []
        rows = await db.fetchall("SELECT session_id FROM session_search_text")
        assert sorted(r["session_id"] for r in rows) == sorted([ids["plain"]] * 2 + [ids["titled"]])
    finally:
        await db.close()
    backup = sqlite3.connect(tmp_path / "metis.db.pre-v3.bak")
    assert backup.execute("PRAGMA user_version").fetchone() == (3,)
    backup.close()


def test_text_that_cannot_be_read_is_no_text_and_never_an_error() -> None:
    """The migration's SQL function runs on rows any release wrote: an exception in it would
    stop the daemon from opening its store."""
    assert stored_text('[{"type": "text", "text": "ok"}, {"type": "text", "text": 3}]') == "ok"
    for unreadable in ("[{not json", "[" * 100_000 + "]" * 100_000, b"\xff\xfe", '{"a": 1}'):
        assert stored_text(unreadable) is None  # type: ignore[arg-type]
