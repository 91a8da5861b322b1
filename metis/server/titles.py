"""Session titles: set with `PATCH /sessions/{id}` `{"title": …}`, else the first line of the
session's first user message (shortened), else null.

A set title lives in the `session_titles` table, a store extension with its own migration track
(`metis.core.store.store.StoreExtension`); it cascades with its session, so a purge removes it.
"""

from __future__ import annotations

import json
from typing import Any

from metis.core.canonical.times import now_us
from metis.core.errors import SessionNotFound
from metis.core.store.db import Database
from metis.core.store.store import StoreExtension

TRACK = "session_titles"
TITLE_CHARS = 200
MIGRATIONS: tuple[str, ...] = (
    """
CREATE TABLE IF NOT EXISTS session_titles (session_id TEXT PRIMARY KEY
  REFERENCES sessions(id) ON DELETE CASCADE, title TEXT NOT NULL, updated_at_us INTEGER NOT NULL);
""",
)


def extension() -> StoreExtension:
    return StoreExtension(TRACK, MIGRATIONS)


def first_line(text: str) -> str | None:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:TITLE_CHARS]
    return None


async def session_titles(db: Any, session_ids: list[str]) -> dict[str, str]:
    """Each session's title: the one set, else its first prompt's first line (one query each
    for the page)."""
    if not session_ids:
        return {}
    marks = ",".join("?" * len(session_ids))
    ids = tuple(session_ids)
    titles: dict[str, str] = {}
    rows = await db.fetchall(
        "SELECT m.session_id, m.content_json FROM messages m WHERE m.id IN ("
        "SELECT MIN(id) FROM messages WHERE role = 'user' AND session_id IN "
        f"({marks}) GROUP BY session_id)",
        ids,
    )
    for row in rows:
        try:
            blocks = json.loads(row["content_json"])
        except ValueError:
            continue
        text = "\n".join(
            b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text"
        )
        title = first_line(text)
        if title:
            titles[row["session_id"]] = title
    for row in await db.fetchall(
        f"SELECT session_id, title FROM session_titles WHERE session_id IN ({marks})", ids
    ):
        titles[row["session_id"]] = row["title"]
    return titles


async def set_title(db: Any, session_id: str, title: str | None) -> None:
    """Set the title (None: back to the first prompt's first line)."""

    def work(conn: Any) -> bool:
        if title is None:
            conn.execute("DELETE FROM session_titles WHERE session_id = ?", (session_id,))
            return True
        # Only while the session row exists: a purge committed since the handler's check
        # leaves nothing to title (a 404, where the row's foreign key made it a 500).
        cursor = conn.execute(
            "INSERT INTO session_titles (session_id, title, updated_at_us) "
            "SELECT ?, ?, ? WHERE EXISTS (SELECT 1 FROM sessions WHERE id = ?) "
            "ON CONFLICT (session_id) DO UPDATE SET title = excluded.title, "
            "updated_at_us = excluded.updated_at_us",
            (session_id, title, now_us(), session_id),
        )
        return bool(cursor.rowcount)

    if not await db.transaction(work):
        raise SessionNotFound(session_id)


class TitleStore:
    """The titles repository, bound to the daemon's database by `Application.extend_store`
    (the surface never holds the database itself)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def titles(self, session_ids: list[str]) -> dict[str, str]:
        return await session_titles(self._db, session_ids)

    async def set(self, session_id: str, title: str | None) -> None:
        await set_title(self._db, session_id, title)
