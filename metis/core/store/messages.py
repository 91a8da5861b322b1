"""Messages: validated writes, lenient reads, and id-cursor pages."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiosqlite

from metis.core.canonical.content import dump_content
from metis.core.canonical.messages import (
    Message,
    decode_content_lenient,
    dump_metadata,
    validate_message,
)
from metis.core.store.db import Database, Statement, execute_all
from metis.core.store.search import INSERT_SEARCH_TEXT_SQL, message_search_row
from metis.core.store.tx import TxWrites


def row_to_message(row: sqlite3.Row) -> Message:
    """A stored `messages` row as a `Message`, reading content leniently."""
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


def message_row(message: Message) -> tuple[object, ...]:
    """The `INSERT_MESSAGE_SQL` parameters; every write is validated."""
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


def message_statements(message: Message) -> list[Statement]:
    """The writes that store a message: its row and, when a search can find words in it, its
    search text's (`search.py`); validated here."""
    statements: list[Statement] = [(INSERT_MESSAGE_SQL, message_row(message))]
    searched = message_search_row(message)
    if searched is not None:
        statements.append((INSERT_SEARCH_TEXT_SQL, searched))
    return statements


async def insert_message(conn: aiosqlite.Connection, message: Message) -> None:
    """Insert inside the caller's transaction; every write is validated."""
    for sql, params in message_statements(message):
        await conn.execute(sql, params)


@dataclass(frozen=True)
class NewToolCall:
    """The `tool_calls` row of a tool use in a stored assistant reply (status `pending`)."""

    id: str
    session_id: str
    turn_id: str
    message_id: str
    provider_tool_use_id: str | None
    name: str
    side_effects: str | None
    origin: str
    input_sha256: str
    created_at_us: int

    def row(self) -> tuple[object, ...]:
        return (
            self.id,
            self.session_id,
            self.turn_id,
            self.message_id,
            self.provider_tool_use_id,
            self.name,
            self.side_effects,
            self.origin,
            self.input_sha256,
            self.created_at_us,
        )


@dataclass(frozen=True)
class ToolCallRef:
    """A tool use left without a result: its id and tool name."""

    id: str
    name: str


@dataclass(frozen=True)
class ParkedCallRow:
    """A tool use of a suspended turn that waits for an answer: a `suspend` permission still
    pending (`confirmation_id` set) or an application call without a stored result."""

    id: str
    name: str
    origin: str
    turn_id: str
    message_id: str
    created_at_us: int
    started_at_us: int | None
    confirmation_id: str | None
    requested_event_id: str | None


class MessageWrites(TxWrites):
    """Messages and tool-call rows, queued in a `Transaction`."""

    def insert(self, *messages: Message) -> None:
        """Store messages (each validated here, before the transaction begins)."""
        statements = [s for message in messages for s in message_statements(message)]
        if statements:
            self._add(lambda conn: execute_all(conn, statements))

    def insert_tool_calls(self, calls: Sequence[NewToolCall]) -> None:
        if calls:
            rows = [call.row() for call in calls]
            self._add(lambda conn: conn.executemany(INSERT_TOOL_CALL_SQL, rows))

    def link_result(self, tool_use_id: str, message_id: str) -> None:
        """The tool use's stored result is `message_id`."""
        params = (message_id, tool_use_id)
        self._add(
            lambda conn: conn.execute(
                "UPDATE tool_calls SET result_message_id=? WHERE id=?", params
            )
        )

    def link_unanswered_result(
        self, tool_use_id: str, message_id: str, gone: Callable[[], Exception]
    ) -> None:
        """Like `link_result`, for a call that must still be without one; else `gone()` is
        raised and the whole transaction rolls back."""
        params = (message_id, tool_use_id)

        def link(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                "UPDATE tool_calls SET result_message_id=? WHERE id=? AND result_message_id IS NULL",
                params,
            )
            if cur.rowcount != 1:
                raise gone()

        self._add(link)

    def fail_interrupted(self, tool_use_id: str, message_id: str, stamp: int) -> None:
        """Recovery: the call failed (`internal_error`) with the stored result `message_id`."""
        params = (message_id, stamp, tool_use_id)
        self._add(
            lambda conn: conn.execute(
                "UPDATE tool_calls SET status='failed', error_class='internal_error', is_error=1, "
                "result_message_id=?, ended_at_us=? WHERE id=?",
                params,
            )
        )


@dataclass(frozen=True)
class MessagePage:
    """One page of a session's messages, and whether there are more on either side."""

    messages: list[Message]
    has_more_before: bool
    has_more_after: bool


class MessageStore:
    """Reads of `messages` and `tool_calls` (pages, history, pending calls); writes go through
    `tx.messages`."""

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
        """A session's whole history in id order (read once per process by the session cache)."""
        rows = await self.db.fetchall(
            "SELECT * FROM messages WHERE session_id=? ORDER BY id", (session_id,)
        )
        return [row_to_message(r) for r in rows]

    async def get(self, message_id: str) -> Message | None:
        row = await self.db.fetchone("SELECT * FROM messages WHERE id=?", (message_id,))
        return row_to_message(row) if row else None

    async def of_turn(self, session_id: str, turn_id: str | None) -> list[Message]:
        """The messages a turn stored, in storage order."""
        rows = await self.db.fetchall(
            "SELECT * FROM messages WHERE session_id=? AND turn_id=? ORDER BY id",
            (session_id, turn_id),
        )
        return [row_to_message(r) for r in rows]

    async def assistant_metadata_json(self, turn_id: str) -> list[str]:
        """The raw `metadata_json` of the turn's replies (recovery reads their usage leniently)."""
        rows = await self.db.fetchall(
            "SELECT metadata_json FROM messages WHERE turn_id=? AND role='assistant'", (turn_id,)
        )
        return [r["metadata_json"] for r in rows]

    # -- tool calls ---------------------------------------------------------------------------

    async def interrupted_tool_calls(self, session_id: str, turn_id: str) -> list[str]:
        """Ids of the turn's tool uses (and those it resumed) left without a result, in order."""
        rows = await self.db.fetchall(
            "SELECT id FROM tool_calls WHERE result_message_id IS NULL AND session_id=? AND "
            "(turn_id=? OR id IN (SELECT tool_use_id FROM confirmations WHERE resolved_in_turn_id=?)) "
            "ORDER BY id",
            (session_id, turn_id, turn_id),
        )
        return [r["id"] for r in rows]

    async def suspended_tool_calls(self, session_id: str) -> list[ToolCallRef]:
        """Tool uses parked by suspended turns (awaiting a confirmation or the client), by id."""
        rows = await self.db.fetchall(
            "SELECT id, name FROM tool_calls WHERE session_id=? AND result_message_id IS NULL "
            "AND status IN ('awaiting_confirmation', 'awaiting_client') ORDER BY id",
            (session_id,),
        )
        return [ToolCallRef(r["id"], r["name"]) for r in rows]

    async def parked_calls(self, session_id: str) -> list[ParkedCallRow]:
        """Calls waiting for an answer, in tool_use order, from committed rows only (no event
        projection involved, so they survive restarts)."""
        rows = await self.db.fetchall(
            "SELECT tc.id, tc.name, tc.origin, tc.turn_id, tc.message_id, tc.created_at_us, "
            "tc.started_at_us, c.id AS confirmation_id, c.requested_event_id FROM tool_calls tc "
            "LEFT JOIN confirmations c ON c.tool_use_id = tc.id "
            "WHERE tc.session_id=? AND tc.result_message_id IS NULL AND "
            "((c.policy='suspend' AND c.status='pending') OR (c.id IS NULL AND tc.origin='application')) "
            "ORDER BY tc.message_id, tc.id",
            (session_id,),
        )
        return [
            ParkedCallRow(
                id=r["id"],
                name=r["name"],
                origin=r["origin"],
                turn_id=r["turn_id"],
                message_id=r["message_id"],
                created_at_us=r["created_at_us"],
                started_at_us=r["started_at_us"],
                confirmation_id=r["confirmation_id"],
                requested_event_id=r["requested_event_id"],
            )
            for r in rows
        ]
