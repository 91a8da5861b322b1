"""Sessions and turns rows: direct writes committed before the response that reports them."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import aiosqlite

from metis.core.canonical import Message
from metis.core.store.db import Database, Statement, execute_all, run_on_thread
from metis.core.store.messages import INSERT_MESSAGE_SQL, message_row

_QUARTET = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")


@dataclass(frozen=True)
class SessionRow:
    id: str
    workspace_path: str
    surface: str
    active_model: str | None
    pending_model_set: bool
    pending_model: str | None
    routing_policy_version: str
    status: str
    disposition: str | None
    turn_count: int
    tokens: dict[str, int]
    cost_so_far_usd: Decimal
    events_floor_seq: int
    created_at_us: int
    updated_at_us: int
    ended_at_us: int | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> SessionRow:
        return cls(
            id=row["id"],
            workspace_path=row["workspace_path"],
            surface=row["surface"],
            active_model=row["active_model"],
            pending_model_set=bool(row["pending_model_set"]),
            pending_model=row["pending_model"],
            routing_policy_version=row["routing_policy_version"],
            status=row["status"],
            disposition=row["disposition"],
            turn_count=row["turn_count"],
            tokens={k: row[k] for k in _QUARTET},
            cost_so_far_usd=Decimal(row["cost_so_far_usd"]),
            events_floor_seq=row["events_floor_seq"],
            created_at_us=row["created_at_us"],
            updated_at_us=row["updated_at_us"],
            ended_at_us=row["ended_at_us"],
        )


@dataclass(frozen=True)
class NewTurn:
    id: str
    session_id: str
    trigger: str
    user_message_id: str | None
    resumes_turn_id: str | None
    model: str
    confirmation_policy: str
    surface: str
    started_at_us: int


class SessionStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._queued: set[str] | None = None  # sessions with a swap queued behind a turn

    async def _queued_swaps(self) -> set[str]:
        """Sessions whose `pending_model_set` is 1, read once and then kept in memory.

        Only `set_sticky_or_queue` sets the flag, so after this first read the set is exact,
        and the release of a turn with no queued swap (nearly every turn) writes nothing.
        """
        if self._queued is None:
            rows = await self.db.fetchall("SELECT id FROM sessions WHERE pending_model_set=1")
            if self._queued is None:
                self._queued = {row["id"] for row in rows}
        return self._queued

    async def insert(
        self,
        session_id: str,
        workspace_path: str,
        surface: str,
        active_model: str | None,
        policy_version: str,
        stamp: int,
    ) -> None:
        async with self.db.write() as conn:
            await conn.execute(
                "INSERT INTO sessions (id, workspace_path, surface, active_model, routing_policy_version, "
                "status, created_at_us, updated_at_us) VALUES (?,?,?,?,?,'active',?,?)",
                (session_id, workspace_path, surface, active_model, policy_version, stamp, stamp),
            )

    async def get(self, session_id: str) -> SessionRow | None:
        row = await self.db.fetchone("SELECT * FROM sessions WHERE id=?", (session_id,))
        return SessionRow.from_row(row) if row else None

    async def exists(self, session_id: str) -> bool:
        return (
            await self.db.fetchone("SELECT 1 FROM sessions WHERE id=?", (session_id,)) is not None
        )

    async def page(
        self,
        *,
        limit: int,
        before_id: str | None = None,
        workspace_path: str | None = None,
        surface: str | None = None,
        status: str | None = None,
    ) -> tuple[list[SessionRow], bool]:
        """Newest first (id descending); ids are creation-ordered so cursors never shift."""
        sql = "SELECT * FROM sessions WHERE 1=1"
        params: list[object] = []
        for column, value in (
            ("workspace_path", workspace_path),
            ("surface", surface),
            ("status", status),
        ):
            if value is not None:
                sql += f" AND {column}=?"
                params.append(value)
        if before_id is not None:
            sql += " AND id<?"
            params.append(before_id)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(limit + 1)
        rows = await self.db.fetchall(sql, tuple(params))
        return [SessionRow.from_row(r) for r in rows[:limit]], len(rows) > limit

    async def set_sticky_or_queue(
        self, session_id: str, model: str | None, stamp: int, holder: Callable[[], str | None]
    ) -> str | None:
        """Apply the sticky now, or queue it behind the turn `holder()` names; returns that turn.

        The choice is made inside the write transaction, so it serialises with the release of
        a turn (`apply_pending_and_release`): a PATCH can never queue behind a turn that has
        already released its slot. Applying now drops a swap an earlier PATCH queued (the turn
        may have ended between the two): the last PATCH wins. `holder` may raise to refuse.
        """
        queued = await self._queued_swaps()
        async with self.db.write() as conn:
            turn_id = holder()
            if turn_id is not None:
                queued.add(session_id)  # in the step that read the slot: the release sees it
            if turn_id is None:
                queued.discard(session_id)  # an earlier queued PATCH must not win at release
                await conn.execute(
                    "UPDATE sessions SET active_model=?, pending_model_set=0, pending_model=NULL, "
                    "updated_at_us=? WHERE id=?",
                    (model, stamp, session_id),
                )
            else:
                await conn.execute(
                    "UPDATE sessions SET pending_model_set=1, pending_model=?, updated_at_us=? WHERE id=?",
                    (model, stamp, session_id),
                )
        return turn_id

    async def apply_pending_and_release(
        self, session_id: str, stamp: int, release: Callable[[], None]
    ) -> None:
        """Apply a queued swap and free the turn slot with no await in between.

        A PATCH marks its swap queued in the same synchronous step in which it finds the turn
        still holding the slot, so a release that finds nothing queued can free the slot at
        once: a later PATCH finds the slot free and applies its model directly.
        """
        queued = await self._queued_swaps()
        if session_id in queued:
            apply = (
                "UPDATE sessions SET active_model=pending_model, pending_model_set=0, "
                "pending_model=NULL, updated_at_us=? WHERE id=? AND pending_model_set=1",
                (stamp, session_id),
            )
            await self.db.transaction(lambda conn: execute_all(conn, [apply]))
            queued.discard(session_id)
        release()

    async def end(self, session_id: str, stamp: int) -> None:
        async with self.db.write() as conn:
            await conn.execute(
                "UPDATE sessions SET status='ended', disposition='completed', ended_at_us=?, updated_at_us=? "
                "WHERE id=?",
                (stamp, stamp, session_id),
            )

    async def purge(self, session_id: str) -> tuple[int, int]:
        """Delete the session and everything of it in one transaction; returns (messages, events)."""
        async with self.db.write() as conn:
            async with conn.execute(
                "SELECT COUNT(*) FROM messages WHERE session_id=?", (session_id,)
            ) as cur:
                messages = (await cur.fetchone())[0]  # type: ignore[index]
            cur2 = await conn.execute("DELETE FROM events WHERE session_id=?", (session_id,))
            events = cur2.rowcount
            await conn.execute("DELETE FROM sessions WHERE id=?", (session_id,))
        return int(messages), int(events)

    async def insert_turn(self, turn: NewTurn, messages: list[Message]) -> None:
        """The turn row, `turn_count + 1` and the turn's input messages in one transaction."""
        statements = turn_statements(turn, messages)
        await self.db.transaction(lambda conn: execute_all(conn, statements))

    async def turn(self, turn_id: str) -> sqlite3.Row | None:
        return await self.db.fetchone("SELECT * FROM turns WHERE id=?", (turn_id,))


def turn_statements(turn: NewTurn, messages: list[Message]) -> list[Statement]:
    """Insert the turn row (ordinal = `turn_count + 1`), count it, and store its input messages
    (validated here, before any transaction begins)."""
    return [
        (
            "INSERT INTO turns (id, session_id, ordinal, status, surface, trigger, user_message_id, "
            "resumes_turn_id, model, confirmation_policy, started_at_us) "
            "SELECT ?, ?, turn_count + 1, 'running', ?, ?, ?, ?, ?, ?, ? FROM sessions WHERE id=?",
            (
                turn.id,
                turn.session_id,
                turn.surface,
                turn.trigger,
                turn.user_message_id,
                turn.resumes_turn_id,
                turn.model,
                turn.confirmation_policy,
                turn.started_at_us,
                turn.session_id,
            ),
        ),
        (
            "UPDATE sessions SET turn_count=turn_count+1, updated_at_us=? WHERE id=?",
            (turn.started_at_us, turn.session_id),
        ),
        *((INSERT_MESSAGE_SQL, message_row(message)) for message in messages),
    ]


async def write_turn(conn: aiosqlite.Connection, turn: NewTurn, messages: list[Message]) -> None:
    """`turn_statements` inside the caller's transaction (the AAP acceptance transaction adds
    more rows to it)."""
    statements = turn_statements(turn, messages)
    await run_on_thread(conn, lambda c: execute_all(c, statements))
