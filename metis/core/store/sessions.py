"""Sessions and turns rows: direct writes committed before the response that reports them."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from metis.core.canonical.messages import Message
from metis.core.canonical.money import decimal_str
from metis.core.canonical.text import stored_text
from metis.core.store.db import Database, Statement, execute_all
from metis.core.store.messages import message_statements
from metis.core.store.search import SearchHit, SessionSearch
from metis.core.store.titles import TITLE_COLUMNS
from metis.core.store.tx import TxWrites

SEARCH_BATCH = 500
"""Sessions a search looks through in one round trip to the reader's thread (a few ms on a small
machine)."""

_QUARTET = ("input_tokens", "cache_read_tokens", "cache_write_tokens", "output_tokens")


@dataclass(frozen=True)
class SessionRow:
    """A `sessions` row: workspace, surface, models (sticky and queued), status, counters and spend."""

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
class TurnRow:
    """A `turns` row: its ordinal in the session, status, model, and the projected counters and
    spend."""

    id: str
    session_id: str
    ordinal: int
    status: str
    model: str
    tokens: dict[str, int]
    cost_usd: Decimal
    llm_call_count: int
    tool_call_count: int
    started_at_us: int
    ended_at_us: int | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> TurnRow:
        return cls(
            id=row["id"],
            session_id=row["session_id"],
            ordinal=row["ordinal"],
            status=row["status"],
            model=row["model"],
            tokens={k: row[k] for k in _QUARTET},
            cost_usd=Decimal(row["cost_usd"]),
            llm_call_count=row["llm_call_count"],
            tool_call_count=row["tool_call_count"],
            started_at_us=row["started_at_us"],
            ended_at_us=row["ended_at_us"],
        )


@dataclass(frozen=True)
class SessionSpend:
    """What a session has spent so far (seeds the cost accumulator at start-up)."""

    session_id: str
    tokens: dict[str, int]
    cost: Decimal


@dataclass
class Spend:
    """Spend to add to a turn or session row: the token quartet, the cost, and for a turn its
    call counters; for a session, the time of the event that carried it."""

    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_QUARTET, 0))
    cost: Decimal = Decimal(0)
    llm_calls: int = 0
    tool_calls: int = 0
    updated_at_us: int = 0

    def add_usage(self, payload: dict[str, Any]) -> None:
        """Add an LLM call event's tokens and cost."""
        for key in _QUARTET:
            self.tokens[key] += int(payload.get(key, 0))
        self.cost += Decimal(payload.get("cost_usd", "0"))


@dataclass(frozen=True)
class ListedSession:
    """A listed session's row, its set title and its first prompt's text (None for either it
    lacks, or a prompt whose stored content cannot be decoded): what its title is made of;
    and in a search's results, where it holds the words searched (`SessionSearch.hit`)."""

    row: SessionRow
    set_title: str | None
    prompt: str | None
    hit: SearchHit | None = None


def _listed(row: sqlite3.Row, prompt: str | None, hit: SearchHit | None = None) -> ListedSession:
    return ListedSession(SessionRow.from_row(row), row["title"], prompt, hit)


def _prompt_of(row: sqlite3.Row) -> str | None:
    """The text of the first prompt the row's `TITLE_COLUMNS` hold."""
    content = row["prompt"]
    return None if content is None else stored_text(content)


def _newest_first(
    select: str, params: list[object], before_id: str | None, limit: int
) -> tuple[str, tuple[object, ...]]:
    """`select` narrowed to ids before `before_id` (when given), newest first, `limit` rows."""
    if before_id is None:
        return f"{select} ORDER BY id DESC LIMIT ?", (*params, limit)
    return f"{select} AND id<? ORDER BY id DESC LIMIT ?", (*params, before_id, limit)


def _search_batch(
    filters: str, params: list[object], before_id: str | None, search: SessionSearch, wanted: int
) -> Callable[[sqlite3.Connection], tuple[list[ListedSession], int, str | None]]:
    """The reader's work for one batch of a search: of the next `SEARCH_BATCH` sessions the
    filters keep (before `before_id`), the ones `search` matches, up to `wanted`; how many
    sessions the batch held, and the last one's id (where the next batch starts)."""
    batch_sql, batch_args = _newest_first(
        f"SELECT id FROM sessions WHERE 1=1{filters}", params, before_id, SEARCH_BATCH
    )
    condition, condition_args = search.condition()

    def work(conn: sqlite3.Connection) -> tuple[list[ListedSession], int, str | None]:
        ids = [row[0] for row in conn.execute(batch_sql, batch_args)]
        if not ids:
            return [], 0, None
        rows = conn.execute(
            f"SELECT *, {TITLE_COLUMNS} FROM sessions WHERE id<=? AND id>=?{filters} "
            f"AND {condition} ORDER BY id DESC LIMIT ?",
            (ids[0], ids[-1], *params, *condition_args, wanted),
        ).fetchall()
        found = [
            _listed(row, _prompt_of(row), search.hit(conn, row["id"], row["title"])) for row in rows
        ]
        return found, len(ids), ids[-1]

    return work


def add_spend(conn: sqlite3.Connection, table: str, row_id: str, spend: Spend) -> None:
    """Add `spend` to a `turns` or `sessions` row: a Decimal read-modify-write inside the
    caller's transaction (never SQL arithmetic on TEXT); a missing row is skipped."""
    cost_col = "cost_usd" if table == "turns" else "cost_so_far_usd"
    row = conn.execute(f"SELECT {cost_col} FROM {table} WHERE id=?", (row_id,)).fetchone()
    if row is None:
        return
    cost = decimal_str(Decimal(row[0]) + spend.cost)
    sets = ", ".join(f"{k}={k}+?" for k in _QUARTET)
    params: list[Any] = [spend.tokens[k] for k in _QUARTET]
    extra = ""
    if table == "turns":
        extra = ", llm_call_count=llm_call_count+?, tool_call_count=tool_call_count+?"
        params += [spend.llm_calls, spend.tool_calls]
    elif spend.updated_at_us:
        extra = ", updated_at_us=MAX(updated_at_us, ?)"
        params.append(spend.updated_at_us)
    conn.execute(
        f"UPDATE {table} SET {sets}, {cost_col}=?{extra} WHERE id=?",
        (*params[:4], cost, *params[4:], row_id),
    )


@dataclass(frozen=True)
class NewTurn:
    """A `turns` row to insert when a turn is accepted."""

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
    """The `sessions` and `turns` tables: reads, and the direct writes committed before the response
    that reports them."""

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

    @staticmethod
    def inserting(
        session_id: str,
        workspace_path: str,
        surface: str,
        active_model: str | None,
        policy_version: str,
        stamp: int,
    ) -> Callable[[sqlite3.Connection], SessionRow]:
        """The write of a new session's row, returning it as stored (its defaults filled in):
        run by the trace writer in the transaction that stores the session's first event
        (`TraceWriter.commit_with`), so a new session costs one SQLite transaction."""

        def insert(conn: sqlite3.Connection) -> SessionRow:
            (row,) = conn.execute(  # fetchall: the statement is done before the COMMIT
                "INSERT INTO sessions (id, workspace_path, surface, active_model, routing_policy_version, "
                "status, created_at_us, updated_at_us) VALUES (?,?,?,?,?,'active',?,?) RETURNING *",
                (session_id, workspace_path, surface, active_model, policy_version, stamp, stamp),
            ).fetchall()
            return SessionRow.from_row(row)

        return insert

    async def spends(self) -> list[SessionSpend]:
        """The stored spend of every session, to seed the cost accumulator at start-up."""
        rows = await self.db.fetchall(
            "SELECT id, cost_so_far_usd, input_tokens, cache_read_tokens, cache_write_tokens, "
            "output_tokens FROM sessions"
        )
        return [
            SessionSpend(r["id"], {k: r[k] for k in _QUARTET}, Decimal(r["cost_so_far_usd"]))
            for r in rows
        ]

    async def get(self, session_id: str) -> SessionRow | None:
        row = await self.db.fetchone("SELECT * FROM sessions WHERE id=?", (session_id,))
        return SessionRow.from_row(row) if row else None

    async def page(
        self,
        *,
        limit: int,
        before_id: str | None = None,
        workspace_path: str | None = None,
        surface: str | None = None,
        status: str | None = None,
        search: SessionSearch | None = None,
    ) -> tuple[list[ListedSession], bool]:
        """Newest first (id descending); ids are creation-ordered so cursors never shift. Each
        with what its title is made of, read in the same query. `search` keeps only the
        sessions it matches."""
        filters = ""
        params: list[object] = []
        for column, value in (
            ("workspace_path", workspace_path),
            ("surface", surface),
            ("status", status),
        ):
            if value is not None:
                filters += f" AND {column}=?"
                params.append(value)
        if search is not None:
            listed = await self._search(filters, params, before_id, search, limit + 1)
        else:
            sql, args = _newest_first(
                f"SELECT *, {TITLE_COLUMNS} FROM sessions WHERE 1=1{filters}",
                params,
                before_id,
                limit + 1,
            )
            listed = [_listed(r, _prompt_of(r)) for r in await self.db.fetchall(sql, args)]
        return listed[:limit], len(listed) > limit

    async def _search(
        self,
        filters: str,
        params: list[object],
        before_id: str | None,
        search: SessionSearch,
        wanted: int,
    ) -> list[ListedSession]:
        """The sessions `search` matches, newest first, up to `wanted`: `SEARCH_BATCH` sessions
        looked through a round trip to the reader, which is free between two, so a search
        through many sessions never holds up the other long reads (a transcript, an event
        page) for long."""
        found: list[ListedSession] = []
        while True:
            batch = _search_batch(filters, params, before_id, search, wanted - len(found))
            matched, looked_at, before_id = await self.db.read(batch)
            found += matched
            if len(found) >= wanted or looked_at < SEARCH_BATCH:
                return found

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
        """Mark the session ended (completed) at `stamp`, committed at once."""
        async with self.db.write() as conn:
            await conn.execute(
                "UPDATE sessions SET status='ended', disposition='completed', ended_at_us=?, updated_at_us=? "
                "WHERE id=?",
                (stamp, stamp, session_id),
            )

    async def purge(self, session_id: str) -> tuple[int, int]:
        """Delete the session and everything of it in one transaction, erased from the files
        (`Database.erasing`); returns (messages, events)."""
        async with self.db.erasing() as conn:
            async with conn.execute(
                "SELECT COUNT(*) FROM messages WHERE session_id=?", (session_id,)
            ) as cur:
                messages = (await cur.fetchone())[0]  # type: ignore[index]
            cur2 = await conn.execute("DELETE FROM events WHERE session_id=?", (session_id,))
            events = cur2.rowcount
            await conn.execute("DELETE FROM sessions WHERE id=?", (session_id,))
        return int(messages), int(events)

    async def apply_all_pending_swaps(self, stamp: int) -> None:
        """Start-up: every queued model swap becomes the session's active model."""
        await self.db.transaction(
            lambda conn: conn.execute(
                "UPDATE sessions SET active_model=pending_model, pending_model_set=0, "
                "pending_model=NULL, updated_at_us=? WHERE pending_model_set=1",
                (stamp,),
            )
        )

    async def turn(self, turn_id: str) -> TurnRow | None:
        row = await self.db.fetchone("SELECT * FROM turns WHERE id=?", (turn_id,))
        return TurnRow.from_row(row) if row else None

    async def running_turns(self) -> list[TurnRow]:
        """Turns still `running` (at start-up: interrupted by a stop), by id."""
        rows = await self.db.fetchall("SELECT * FROM turns WHERE status='running' ORDER BY id")
        return [TurnRow.from_row(r) for r in rows]

    async def latest_turn_model(self, session_id: str) -> str | None:
        """The model of the session's latest turn (None before its first)."""
        row = await self.db.fetchone(
            "SELECT model FROM turns WHERE session_id=? ORDER BY ordinal DESC LIMIT 1",
            (session_id,),
        )
        return row["model"] if row else None

    async def turns_since(self, since_us: int) -> list[TurnRow]:
        """Turns started at or after `since_us`, by id (the dashboard's costs summary)."""
        rows = await self.db.fetchall(
            "SELECT * FROM turns WHERE started_at_us >= ? ORDER BY id", (since_us,)
        )
        return [TurnRow.from_row(r) for r in rows]


class SessionWrites(TxWrites):
    """Session and turn rows, queued in a `Transaction`."""

    def insert_turn(self, turn: NewTurn, messages: list[Message]) -> None:
        """The turn row, `turn_count + 1` and the turn's input messages."""
        statements = turn_statements(turn, messages)
        self._add(lambda conn: execute_all(conn, statements))

    def add_turn_spend(self, turn_id: str, spend: Spend) -> None:
        """Add spend to a turn's row (recovery of spend a crash left unprojected)."""
        self._add(lambda conn: add_spend(conn, "turns", turn_id, spend))

    def add_session_spend(self, session_id: str, spend: Spend) -> None:
        """Add spend to a session's row, like `add_turn_spend`."""
        self._add(lambda conn: add_spend(conn, "sessions", session_id, spend))


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
        *(s for message in messages for s in message_statements(message)),
    ]
