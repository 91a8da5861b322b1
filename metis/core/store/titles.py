"""Session titles: the `session_titles` rows (a title set by a client) and the text of each
session's first user message (what a title falls back to; the rule is SessionService's).

A title row cascades with its session, so a purge removes it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from metis.core.store.db import Database


class TitleStore:
    """Reads and writes of `session_titles`, and the first user prompt a title falls back to."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def set_titles(self, session_ids: Sequence[str]) -> dict[str, str]:
        """The titles set for these sessions (sessions without one are absent)."""
        if not session_ids:
            return {}
        marks = ",".join("?" * len(session_ids))
        rows = await self.db.fetchall(
            f"SELECT session_id, title FROM session_titles WHERE session_id IN ({marks})",
            tuple(session_ids),
        )
        return {row["session_id"]: row["title"] for row in rows}

    async def first_prompts(self, session_ids: Sequence[str]) -> dict[str, str]:
        """The text blocks of each session's first user message, joined by newlines (one
        query for a page; a message whose content cannot be decoded is left out)."""
        if not session_ids:
            return {}
        marks = ",".join("?" * len(session_ids))
        rows = await self.db.fetchall(
            "SELECT m.session_id, m.content_json FROM messages m WHERE m.id IN ("
            "SELECT MIN(id) FROM messages WHERE role = 'user' AND session_id IN "
            f"({marks}) GROUP BY session_id)",
            tuple(session_ids),
        )
        texts: dict[str, str] = {}
        for row in rows:
            text = _prompt_text(row["content_json"])
            if text is not None:
                texts[row["session_id"]] = text
        return texts

    async def title_of(self, session_id: str) -> tuple[str | None, str | None]:
        """One session's set title and the text of its first user message, in one read by key
        on the event loop's thread: a single session's view (GET /sessions/{id}, a WebSocket
        snapshot) then makes no round trip to the reader's thread, where `set_titles` and
        `first_prompts` (a page's worth) make one each."""
        row = await self.db.fetchone(
            "SELECT (SELECT title FROM session_titles WHERE session_id = ?1) AS title, "
            "(SELECT content_json FROM messages WHERE session_id = ?1 AND role = 'user' "
            "ORDER BY id LIMIT 1) AS prompt",
            (session_id,),
        )
        if row is None:
            return None, None
        prompt = row["prompt"]
        return row["title"], _prompt_text(prompt) if prompt is not None else None

    async def set(self, session_id: str, title: str | None, stamp: int) -> bool:
        """Set the title (None clears it). False when the session row is gone: a purge
        committed since the caller's check leaves nothing to title (its foreign key would
        otherwise fail inside the write)."""

        def work(conn: sqlite3.Connection) -> bool:
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


def _prompt_text(content_json: str) -> str | None:
    """The text blocks of a stored user message, joined by newlines; None when its content
    cannot be decoded."""
    try:
        blocks = json.loads(content_json)
    except ValueError:
        return None
    return "\n".join(
        b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
    )
