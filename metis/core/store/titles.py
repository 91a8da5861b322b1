"""Session titles: the `session_titles` rows (a title set by a client) and the text of each
session's first user message (what a title falls back to; the rule is SessionService's).

A title row cascades with its session, so a purge removes it; setting a title keeps its search
text (`search.py`) in the same transaction.
"""

from __future__ import annotations

import sqlite3

from metis.core.canonical.text import stored_text
from metis.core.store.db import Database, execute_all
from metis.core.store.search import set_title_statements


class TitleStore:
    """Reads and writes of `session_titles`, and the first user prompt a title falls back to."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def parts(self, session_id: str) -> tuple[str | None, str | None] | None:
        """What a session's title is made of: its set title and the text of its first user
        message (None for either it lacks, or a message whose content cannot be decoded); None
        when there is no such session. A read by key on the event loop's thread (GET
        /sessions/{id}, a WebSocket snapshot: no round trip to the reader's thread); a page
        reads the same columns in its own query (`SessionStore.page`)."""
        row = await self.db.fetchone(_PARTS, (session_id,))
        if row is None:
            return None
        return row["title"], None if row["prompt"] is None else stored_text(row["prompt"])

    async def set(self, session_id: str, title: str | None, stamp: int) -> bool:
        """Set the title (None clears it). False when the session row is gone: a purge
        committed since the caller's check leaves nothing to title (its foreign key would
        otherwise fail inside the write)."""

        def work(conn: sqlite3.Connection) -> bool:
            execute_all(conn, set_title_statements(session_id, title))
            if title is None:
                conn.execute("DELETE FROM session_titles WHERE session_id = ?", (session_id,))
                return True
            cursor = conn.execute(
                "INSERT INTO session_titles (session_id, title, updated_at_us) "
                "SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?) "
                "ON CONFLICT (session_id) DO UPDATE SET title = excluded.title, "
                "updated_at_us = excluded.updated_at_us",
                (session_id, title, stamp, session_id),
            )
            return bool(cursor.rowcount)

        return await self.db.transaction(work)


TITLE_COLUMNS = (
    "(SELECT title FROM session_titles WHERE session_id = sessions.id) AS title, "
    "(SELECT content_json FROM messages WHERE session_id = sessions.id AND role = 'user' "
    "ORDER BY id LIMIT 1) AS prompt"
)
"""A `sessions` row's set title and its first user message's stored content, as columns."""

_PARTS = f"SELECT {TITLE_COLUMNS} FROM sessions WHERE id = ?"
