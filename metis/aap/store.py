"""The AAP surface tables (`aap_sessions`, `aap_message_forms`): the AAP store extension.

Core never reads these: they hold what only the AAP façade knows — the agent configuration,
trust flags, client tools, option values, and which content form (string or block list) a
client used for each message it supplied, so history re-renders exactly what was sent.
Both cascade with the session row, so a purge removes them in the same transaction.

The tables have their own migration track, `aap` (`AAP_MIGRATIONS`), registered with the core
store by `extension()`. Databases from before migration tracks already hold these tables
(core schema v2 created them): the track's first step adopts them as they are.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from metis.core.store.db import Database
from metis.core.store.store import StoreExtension
from metis.core.store.tx import TxWrites

TRACK = "aap"

# AAP_MIGRATIONS[i] upgrades the `aap` track from version i to i + 1.
AAP_MIGRATIONS: tuple[str, ...] = (
    """
CREATE TABLE IF NOT EXISTS aap_sessions (session_id TEXT PRIMARY KEY REFERENCES sessions(id) ON DELETE CASCADE,
  agent_name TEXT NOT NULL, created_via INTEGER NOT NULL CHECK (created_via IN (1, 3)),
  agent_tools_json TEXT NOT NULL, options_json TEXT NOT NULL, secret_options_json TEXT NOT NULL DEFAULT '{}',
  client_tools_json TEXT NOT NULL, created_at_us INTEGER NOT NULL, updated_at_us INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS aap_sessions_created ON aap_sessions(created_at_us, session_id);
CREATE TABLE IF NOT EXISTS aap_message_forms (message_id TEXT PRIMARY KEY, session_id TEXT NOT NULL
  REFERENCES sessions(id) ON DELETE CASCADE, form TEXT NOT NULL CHECK (form IN ('string', 'blocks')));
CREATE INDEX IF NOT EXISTS aap_message_forms_session ON aap_message_forms(session_id);
""",
)


def extension(recover: Callable[[], Awaitable[object]] | None = None) -> StoreExtension:
    """The AAP tables as a store extension; `recover` is the surface's start-up repair."""
    return StoreExtension(TRACK, AAP_MIGRATIONS, recover)


ContentShape = Literal["string", "blocks"]


@dataclass(frozen=True)
class AapSession:
    session_id: str
    agent_name: str
    created_via: int
    agent_tools: list[dict[str, Any]]  # [{name, trust}]
    options: dict[str, str]  # non-secret values
    secret_options: dict[str, str]
    client_tools: list[dict[str, Any]]  # {name, title?, description, parameters}, key order kept
    created_at_us: int
    updated_at_us: int
    workspace_path: str
    status: str

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> AapSession:
        return cls(
            session_id=row["session_id"],
            agent_name=row["agent_name"],
            created_via=row["created_via"],
            agent_tools=json.loads(row["agent_tools_json"]),
            options=json.loads(row["options_json"]),
            secret_options=json.loads(row["secret_options_json"]),
            client_tools=json.loads(row["client_tools_json"]),
            created_at_us=row["created_at_us"],
            updated_at_us=row["updated_at_us"],
            workspace_path=row["workspace_path"],
            status=row["status"],
        )


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


_SELECT = "SELECT a.*, s.workspace_path, s.status FROM aap_sessions a JOIN sessions s ON s.id = a.session_id"


class AapStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, session_id: str) -> AapSession | None:
        row = await self.db.fetchone(f"{_SELECT} WHERE a.session_id=?", (session_id,))
        return AapSession.from_row(row) if row else None

    async def page(
        self, after: tuple[int, str] | None, limit: int
    ) -> tuple[list[AapSession], bool]:
        """Newest first by (created_at_us, session_id); the page after `after` is strictly older."""
        sql, params = _SELECT, ()  # type: tuple[str, tuple[Any, ...]]
        if after is not None:
            sql += " WHERE a.created_at_us < ? OR (a.created_at_us = ? AND a.session_id < ?)"
            params = (after[0], after[0], after[1])
        sql += " ORDER BY a.created_at_us DESC, a.session_id DESC LIMIT ?"
        rows = await self.db.fetchall(sql, (*params, limit + 1))
        return [AapSession.from_row(r) for r in rows[:limit]], len(rows) > limit

    async def content_shapes(self, session_id: str) -> dict[str, ContentShape]:
        rows = await self.db.fetchall(
            "SELECT message_id, form FROM aap_message_forms WHERE session_id=?", (session_id,)
        )
        return {r["message_id"]: r["form"] for r in rows}

    async def unfinished_creations(self) -> list[str]:
        """AAP-surface sessions without their `aap_sessions` row (a crash between the two
        commits of a creation)."""
        rows = await self.db.fetchall(
            "SELECT id FROM sessions WHERE surface='aap' "
            "AND id NOT IN (SELECT session_id FROM aap_sessions)"
        )
        return [r["id"] for r in rows]


class AapWrites(TxWrites):
    """The AAP rows, queued in a core store transaction: `tx.using(AapWrites)`."""

    def insert(self, session: AapSession) -> None:
        params = (
            session.session_id,
            session.agent_name,
            session.created_via,
            _dumps(session.agent_tools),
            _dumps(session.options),
            _dumps(session.secret_options),
            _dumps(session.client_tools),
            session.created_at_us,
            session.updated_at_us,
        )
        self._add(
            lambda conn: conn.execute(
                "INSERT INTO aap_sessions (session_id, agent_name, created_via, agent_tools_json, "
                "options_json, secret_options_json, client_tools_json, created_at_us, updated_at_us) "
                "VALUES (?,?,?,?,?,?,?,?,?)",
                params,
            )
        )

    def update_config(self, session: AapSession, stamp: int) -> None:
        params = (
            _dumps(session.agent_tools),
            _dumps(session.options),
            _dumps(session.secret_options),
            _dumps(session.client_tools),
            stamp,
            session.session_id,
        )
        self._add(
            lambda conn: conn.execute(
                "UPDATE aap_sessions SET agent_tools_json=?, options_json=?, secret_options_json=?, "
                "client_tools_json=?, updated_at_us=? WHERE session_id=?",
                params,
            )
        )

    def insert_content_shapes(self, session_id: str, forms: list[tuple[str, ContentShape]]) -> None:
        if forms:
            rows = [(message_id, session_id, form) for message_id, form in forms]
            self._add(
                lambda conn: conn.executemany(
                    "INSERT INTO aap_message_forms (message_id, session_id, form) VALUES (?,?,?)",
                    rows,
                )
            )
