"""Messages: validated writes, lenient reads, and id-cursor pages."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import aiosqlite

from metis.core.canonical import (
    Message,
    decode_content_lenient,
    dump_content,
    dump_metadata,
    validate_message,
)
from metis.core.store.db import Database


def row_to_message(row: sqlite3.Row) -> Message:
    content, metadata = decode_content_lenient(row["id"], row["content_json"], row["metadata_json"])
    return Message(
        id=row["id"],
        session_id=row["session_id"],
        turn_id=row["turn_id"],
        role=row["role"],
        content=content,
        created_at_us=row["created_at_us"],
        metadata=metadata,
        schema_version=row["schema_version"],
    )


INSERT_MESSAGE_SQL = (
    "INSERT INTO messages (id, session_id, turn_id, role, status, content_json, metadata_json, "
    "created_at_us, schema_version) VALUES (?,?,?,?,?,?,?,?,?)"
)

INSERT_TOOL_CALL_SQL = (
    "INSERT INTO tool_calls (id, session_id, turn_id, message_id, provider_tool_use_id, name, "
    "side_effects, origin, status, input_sha256, created_at_us) "
    "VALUES (?,?,?,?,?,?,?,?,'pending',?,?)"
)


def message_row(message: Message, *, validate: bool = True) -> tuple[object, ...]:
    """The `INSERT_MESSAGE_SQL` parameters; every write is validated."""
    if validate:
        validate_message(message)
    return (
        message.id,
        message.session_id,
        message.turn_id,
        message.role,
        message.metadata.status,
        dump_content(message.content),
        dump_metadata(message.metadata),
        message.created_at_us,
        message.schema_version,
    )


async def insert_message(
    conn: aiosqlite.Connection, message: Message, *, validate: bool = True
) -> None:
    """Insert inside the caller's transaction; every write is validated."""
    await conn.execute(INSERT_MESSAGE_SQL, message_row(message, validate=validate))


@dataclass(frozen=True)
class MessagePage:
    messages: list[Message]
    has_more_before: bool
    has_more_after: bool


class MessageStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def page(
        self,
        session_id: str,
        *,
        before: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> MessagePage:
        """A page in ascending id order with flags for both ends (judged on the cursor if empty)."""
        base = "SELECT * FROM messages WHERE session_id=?"
        if after is not None:
            rows = await self.db.fetchall(
                f"{base} AND id>? ORDER BY id ASC LIMIT ?", (session_id, after, limit + 1)
            )
            has_after = len(rows) > limit
            rows = rows[:limit]
            edge = rows[0]["id"] if rows else after
            has_before = await self._exists(session_id, "<", edge, inclusive=not rows)
        else:
            if before is not None:
                rows = await self.db.fetchall(
                    f"{base} AND id<? ORDER BY id DESC LIMIT ?", (session_id, before, limit + 1)
                )
            else:
                rows = await self.db.fetchall(
                    f"{base} ORDER BY id DESC LIMIT ?", (session_id, limit + 1)
                )
            has_before = len(rows) > limit
            rows = list(reversed(rows[:limit]))
            if rows:
                has_after = await self._exists(session_id, ">", rows[-1]["id"], inclusive=False)
            elif before is not None:
                has_after = await self._exists(session_id, ">", before, inclusive=True)
            else:
                has_after = False
        return MessagePage([row_to_message(r) for r in rows], has_before, has_after)

    async def _exists(self, session_id: str, op: str, edge: str, *, inclusive: bool) -> bool:
        comparison = f"{op}=" if inclusive else op
        row = await self.db.fetchone(
            f"SELECT EXISTS(SELECT 1 FROM messages WHERE session_id=? AND id{comparison}?) AS e",
            (session_id, edge),
        )
        return bool(row and row["e"])

    async def all_for_session(self, session_id: str) -> list[Message]:
        rows = await self.db.fetchall(
            "SELECT * FROM messages WHERE session_id=? ORDER BY id", (session_id,)
        )
        return [row_to_message(r) for r in rows]

    async def get(self, message_id: str) -> Message | None:
        row = await self.db.fetchone("SELECT * FROM messages WHERE id=?", (message_id,))
        return row_to_message(row) if row else None
