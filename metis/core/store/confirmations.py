"""Confirmation rows: requests for permission to run a tool use, and how each was settled."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from metis.core.store.db import Database
from metis.core.store.tx import TxWrites


@dataclass(frozen=True)
class NewConfirmation:
    """A `confirmations` row to insert when a request is announced."""

    id: str
    session_id: str
    turn_id: str
    tool_use_id: str
    tool_name: str
    policy: str
    requested_at_us: int
    expires_at_us: int | None


@dataclass(frozen=True)
class RememberedDecision:
    """A `session`-scoped answer of a still active session."""

    session_id: str
    tool_name: str
    status: str


@dataclass(frozen=True)
class SuspendedRequest:
    """A pending `suspend` request with the payload of its `tool.confirmation_requested`
    event (None when that event was lost)."""

    id: str
    session_id: str
    turn_id: str
    tool_use_id: str
    tool_name: str
    requested_event_id: str | None
    payload: dict[str, Any] | None


@dataclass(frozen=True)
class ConfirmationRow:
    """A stored request as an answer needs it: whose it is, its policy and how it was settled."""

    id: str
    session_id: str
    turn_id: str
    policy: str
    status: str
    scope: str | None
    resolved_at_us: int | None


class ConfirmationStore:
    """Reads of the `confirmations` table (restart reload, settled requests); writes go through
    `tx.confirmations`."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def remembered(self) -> list[RememberedDecision]:
        """Remembered decisions of active sessions, oldest resolution first."""
        rows = await self.db.fetchall(
            "SELECT c.session_id, c.tool_name, c.status FROM confirmations c JOIN sessions s ON s.id=c.session_id "
            "WHERE c.remembered=1 AND s.status='active' ORDER BY c.resolved_at_us"
        )
        return [RememberedDecision(r["session_id"], r["tool_name"], r["status"]) for r in rows]

    async def suspended(self) -> list[SuspendedRequest]:
        """Every pending `suspend` request, by id."""
        rows = await self.db.fetchall(
            "SELECT c.*, e.payload_json FROM confirmations c LEFT JOIN events e ON e.id = c.requested_event_id "
            "WHERE c.policy='suspend' AND c.status='pending' ORDER BY c.id"
        )
        return [
            SuspendedRequest(
                id=r["id"],
                session_id=r["session_id"],
                turn_id=r["turn_id"],
                tool_use_id=r["tool_use_id"],
                tool_name=r["tool_name"],
                requested_event_id=r["requested_event_id"],
                payload=json.loads(r["payload_json"]) if r["payload_json"] is not None else None,
            )
            for r in rows
        ]

    async def get(self, request_id: str, session_id: str, turn_id: str) -> ConfirmationRow | None:
        """A request of this session and turn, settled or not; None if it names another session's."""
        row = await self.db.fetchone(
            "SELECT * FROM confirmations WHERE id=? AND session_id=? AND turn_id=?",
            (request_id, session_id, turn_id),
        )
        if row is None:
            return None
        return ConfirmationRow(
            id=row["id"],
            session_id=row["session_id"],
            turn_id=row["turn_id"],
            policy=row["policy"],
            status=row["status"],
            scope=row["scope"],
            resolved_at_us=row["resolved_at_us"],
        )


class ConfirmationWrites(TxWrites):
    """Confirmation rows, queued in a `Transaction`."""

    def insert(self, request: NewConfirmation) -> None:
        params = (
            request.id,
            request.session_id,
            request.turn_id,
            request.tool_use_id,
            request.tool_name,
            request.policy,
            request.requested_at_us,
            request.expires_at_us,
        )
        self._add(
            lambda conn: conn.execute(
                "INSERT INTO confirmations (id, session_id, turn_id, tool_use_id, tool_name, policy, status, "
                "requested_at_us, expires_at_us) VALUES (?,?,?,?,?,?,'pending',?,?)",
                params,
            )
        )

    def set_requested_event(self, request_id: str, event_id: str | None) -> None:
        """Point the row at the `tool.confirmation_requested` event announcing it."""
        params = (event_id, request_id)
        self._add(
            lambda conn: conn.execute(
                "UPDATE confirmations SET requested_event_id=? WHERE id=?", params
            )
        )

    def resolve(
        self,
        request_id: str,
        *,
        status: str,
        scope: str | None,
        remembered: bool,
        reason: str | None,
        resolved_at_us: int | None,
    ) -> None:
        """Record how a request was settled; `remembered` marks a decision reloaded after a restart."""
        params = (status, scope, int(remembered), reason, resolved_at_us, request_id)
        self._add(
            lambda conn: conn.execute(
                "UPDATE confirmations SET status=?, scope=?, remembered=?, reason=?, resolved_at_us=? WHERE id=?",
                params,
            )
        )

    def withdraw_pending(self, session_id: str, stamp: int) -> None:
        """Session end: every pending request of the session is withdrawn."""
        params = (stamp, session_id)
        self._add(
            lambda conn: conn.execute(
                "UPDATE confirmations SET status='withdrawn', resolved_at_us=? WHERE session_id=? AND status='pending'",
                params,
            )
        )

    def expire_waiting(self, turn_id: str, stamp: int) -> None:
        """Recovery: the turn's pending `wait` requests expire."""
        params = (stamp, turn_id)
        self._add(
            lambda conn: conn.execute(
                "UPDATE confirmations SET status='expired', resolved_at_us=? "
                "WHERE turn_id=? AND policy='wait' AND status='pending'",
                params,
            )
        )

    def settle_suspended(
        self,
        request_id: str | None,
        *,
        granted: bool,
        reason: str | None,
        stamp: int,
        turn_id: str,
        gone: Callable[[], Exception],
    ) -> None:
        """A resolution turn answers a pending `suspend` request (scope `once`); if it is no
        longer pending, `gone()` is raised and the whole transaction rolls back."""
        params = ("allowed" if granted else "denied", reason, stamp, turn_id, request_id)

        def settle(conn: sqlite3.Connection) -> None:
            cur = conn.execute(
                "UPDATE confirmations SET status=?, scope='once', remembered=0, reason=?, "
                "resolved_at_us=?, resolved_in_turn_id=? WHERE id=? AND status='pending'",
                params,
            )
            if cur.rowcount != 1:
                raise gone()

        self._add(settle)
