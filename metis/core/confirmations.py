"""ConfirmationBroker: one mechanism, two policies.

- `wait` (metis surface): the request is committed and announced, and the tool use waits for
  the first answer (REST), a timeout, or a withdrawal by cancel/session end.
- `suspend` (AAP surface): the request is committed and announced, and the turn ends; a later
  turn's answers resolve it (`resolve_suspended`).

Every state change is decided in one synchronous step (first answer wins, no await between the
check and the set), then committed, then announced — so a client never sees an event for a row
that is not stored.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from metis.core.canonical.ids import new_ulid
from metis.core.canonical.times import format_us, now_us
from metis.core.errors import (
    ConfirmationAlreadyResolved,
    ConfirmationNotFound,
    ConfirmationPolicyMismatch,
)
from metis.core.events.bus import EventBus
from metis.core.store.confirmations import NewConfirmation
from metis.core.store.store import Store

log = logging.getLogger(__name__)

Decision = Literal["allow", "deny"]
Outcome = Literal["allow", "deny", "timeout", "withdrawn"]
_ROW_STATUS = {"allow": "allowed", "deny": "denied", "timeout": "expired", "withdrawn": "withdrawn"}
_RESOLUTION_OF_STATUS = {
    "allowed": "allow",
    "denied": "deny",
    "expired": "timeout",
    "withdrawn": "withdrawn",
}


@dataclass(frozen=True)
class ConfirmationRequest:
    """What the dispatcher knows about a tool use that needs an answer."""

    session_id: str
    turn_id: str
    tool_use_id: str
    tool_name: str
    side_effects: str
    input_summary: str
    projected_modifications: list[str] | None
    command_summary: str | None
    message_id: str
    parent_event_id: str | None


@dataclass(frozen=True)
class ConfirmationAnswer:
    """How a `wait` request ended for the waiting tool use (allowed, denied, timeout or withdrawn),
    with the event that resolved it."""

    outcome: Outcome
    scope: str | None = None
    reason: str | None = None
    resolved_event_id: str | None = None


@dataclass(frozen=True)
class ResolveResult:
    """The outcome of a REST answer: `applied` is False when the same answer had already been
    applied (repeating it is not an error)."""

    applied: bool
    decision: str
    scope: str


@dataclass(eq=False)
class _Pending:
    id: str
    request: ConfirmationRequest
    policy: Literal["wait", "suspend"]
    expires_at_us: int | None
    requested_event_id: str | None = None
    status: str = "pending"
    scope: str | None = None
    resolved_at_us: int | None = None
    future: asyncio.Future[ConfirmationAnswer] | None = None
    remember_any: bool = False
    payload: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """The PendingConfirmation object (a session's `pending_confirmations` item)."""
        return {
            **self.payload,
            "turn_id": self.request.turn_id,
            "requested_event_id": self.requested_event_id,
        }


# A suspended request is answered by the surface that suspended it, never by the `wait` path;
# the surface that refuses says where to answer instead (its own wire message).
SUSPEND_ANSWERED_ELSEWHERE = "this request is answered through the surface that suspended it"


class ConfirmationBroker:
    """Every confirmation request of the daemon: pending `wait` requests with their futures,
    suspended ones, and the decisions remembered per session and tool."""

    def __init__(self, store: Store, bus: EventBus, *, timeout_s: float = 300.0) -> None:
        self.store = store
        self.bus = bus
        self.timeout_s = timeout_s
        self._requests: dict[str, _Pending] = {}
        self._remembered: dict[tuple[str, str], Decision] = {}

    async def load(self) -> None:
        """Reload remembered session decisions and pending suspend requests after a restart."""
        for row in await self.store.confirmations.remembered():
            self._remembered[(row.session_id, row.tool_name)] = (
                "allow" if row.status == "allowed" else "deny"
            )
        await self._load_suspended()

    async def _load_suspended(self) -> None:
        """Suspended requests outlive a restart: list them again (their event holds the summary)."""
        for row in await self.store.confirmations.suspended():
            payload = row.payload
            if payload is None:
                continue
            request = ConfirmationRequest(
                session_id=row.session_id,
                turn_id=row.turn_id,
                tool_use_id=row.tool_use_id,
                tool_name=row.tool_name,
                side_effects=payload["side_effects"],
                input_summary=payload["input_summary"],
                projected_modifications=payload["projected_modifications"],
                command_summary=payload["command_summary"],
                message_id=payload["message_id"],
                parent_event_id=None,
            )
            pending = _Pending(
                row.id, request, "suspend", None, requested_event_id=row.requested_event_id
            )
            pending.payload = payload
            self._requests[row.id] = pending

    # -- remembered decisions -----------------------------------------------------------------

    def remembered(self, session_id: str, tool_name: str) -> Decision | None:
        """The decision remembered for this tool in this session (`session` scope), if any: it
        answers later requests without asking."""
        return self._remembered.get((session_id, tool_name))

    # -- requesting ---------------------------------------------------------------------------

    async def _open(
        self, request: ConfirmationRequest, policy: Literal["wait", "suspend"]
    ) -> _Pending:
        request_id = new_ulid()
        stamp = now_us()
        expires = stamp + int(self.timeout_s * 1_000_000) if policy == "wait" else None
        pending = _Pending(request_id, request, policy, expires)
        if policy == "wait":
            # exists before the request is visible, so a withdrawal can always resolve it
            pending.future = asyncio.get_running_loop().create_future()
        pending.payload = {
            "confirmation_request_id": request_id,
            "tool_use_id": request.tool_use_id,
            "tool_name": request.tool_name,
            "side_effects": request.side_effects,
            "policy": policy,
            "input_summary": request.input_summary,
            "projected_modifications": request.projected_modifications,
            "command_summary": request.command_summary,
            "message_id": request.message_id,
            "allowed_scopes": ["once", "session"] if policy == "wait" else ["once"],
            "expires_at": format_us(expires),
        }
        async with self.store.transaction() as tx:
            tx.confirmations.insert(
                NewConfirmation(
                    id=request_id,
                    session_id=request.session_id,
                    turn_id=request.turn_id,
                    tool_use_id=request.tool_use_id,
                    tool_name=request.tool_name,
                    policy=policy,
                    requested_at_us=stamp,
                    expires_at_us=expires,
                )
            )
        self._requests[request_id] = pending
        event = self.bus.emit(
            request.session_id,
            "tool.confirmation_requested",
            pending.payload,
            actor="system",
            turn_id=request.turn_id,
            parent_event_id=request.parent_event_id,
        )
        pending.requested_event_id = event.id if event else None
        async with self.store.transaction() as tx:
            tx.confirmations.set_requested_event(request_id, pending.requested_event_id)
        return pending

    async def ask(
        self, request: ConfirmationRequest, *, cancel: asyncio.Event, remember_any: bool = False
    ) -> ConfirmationAnswer:
        """`wait` policy: block this tool use until an answer, the timeout or a withdrawal.

        `cancel` is the turn's cancel signal: a cancel that lands while the request is being
        opened withdraws it too. `remember_any` (mode `prompt_once`): any answer is remembered.
        """
        pending = await self._open(request, "wait")
        pending.remember_any = remember_any
        future = pending.future
        assert future is not None
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            waited: set[asyncio.Future[Any]] = {future, cancelled}
            await asyncio.wait(waited, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            cancelled.cancel()
        if future.done():
            return future.result()
        if cancel.is_set():
            await self._withdraw([pending])
            return await future  # set by this withdrawal or by one already under way
        pending.status, pending.resolved_at_us = "expired", now_us()
        await self._store_resolution(pending, remembered=False, reason=None)
        event = self.bus.emit(
            request.session_id,
            "tool.confirmation_resolved",
            {
                "confirmation_request_id": pending.id,
                "tool_use_id": request.tool_use_id,
                "decision": "timeout",
                "scope": None,
                "remembered": False,
                "reason": None,
            },
            actor="system",
            turn_id=request.turn_id,
            parent_event_id=pending.requested_event_id,
        )
        answer = ConfirmationAnswer("timeout", resolved_event_id=event.id if event else None)
        future.set_result(answer)
        return answer

    async def park(self, request: ConfirmationRequest) -> str:
        """`suspend` policy: commit and announce the request; the turn then ends."""
        return (await self._open(request, "suspend")).id

    # -- answering ----------------------------------------------------------------------------

    async def resolve(
        self,
        session_id: str,
        turn_id: str,
        request_id: str,
        decision: Decision,
        scope: str,
        reason: str | None,
    ) -> ResolveResult:
        """The REST answer to a `wait` request (first answer wins)."""
        pending = self._requests.get(request_id)
        if (
            pending is None
            or pending.request.session_id != session_id
            or pending.request.turn_id != turn_id
        ):
            return await self._resolve_settled_from_store(
                session_id, turn_id, request_id, decision, scope
            )
        if pending.policy == "suspend":
            raise ConfirmationPolicyMismatch(SUSPEND_ANSWERED_ELSEWHERE, policy="suspend")
        if pending.status != "pending":
            resolution = _RESOLUTION_OF_STATUS[pending.status]
            if resolution == decision and pending.scope == scope:
                return ResolveResult(False, decision, scope)
            raise ConfirmationAlreadyResolved(
                resolution, format_us(pending.resolved_at_us), pending.scope
            )
        # check-and-set: no await between the status check above and this assignment
        pending.status, pending.scope, pending.resolved_at_us = (
            _ROW_STATUS[decision],
            scope,
            now_us(),
        )
        remembered = scope == "session" or pending.remember_any
        if remembered:
            self._remembered[(session_id, pending.request.tool_name)] = decision
        await self._store_resolution(pending, remembered=remembered, reason=reason)
        event = self.bus.emit(
            session_id,
            "tool.confirmation_resolved",
            {
                "confirmation_request_id": request_id,
                "tool_use_id": pending.request.tool_use_id,
                "decision": decision,
                "scope": scope,
                "remembered": remembered,
                "reason": reason,
            },
            actor="user",
            turn_id=turn_id,
            parent_event_id=pending.requested_event_id,
        )
        if pending.future is not None and not pending.future.done():
            pending.future.set_result(
                ConfirmationAnswer(decision, scope, reason, event.id if event else None)
            )
        return ResolveResult(True, decision, scope)

    async def _resolve_settled_from_store(
        self, session_id: str, turn_id: str, request_id: str, decision: str, scope: str
    ) -> ResolveResult:
        """Requests settled before a restart stay known until purge."""
        row = await self.store.confirmations.get(request_id, session_id, turn_id)
        if row is None:
            raise ConfirmationNotFound(request_id)
        if row.policy == "suspend":
            raise ConfirmationPolicyMismatch(SUSPEND_ANSWERED_ELSEWHERE, policy="suspend")
        resolution = _RESOLUTION_OF_STATUS.get(row.status, "timeout")
        if resolution == decision and row.scope == scope:
            return ResolveResult(False, decision, scope)
        raise ConfirmationAlreadyResolved(resolution, format_us(row.resolved_at_us), row.scope)

    async def _store_resolution(
        self, pending: _Pending, *, remembered: bool, reason: str | None
    ) -> None:
        async with self.store.transaction() as tx:
            tx.confirmations.resolve(
                pending.id,
                status=pending.status,
                scope=pending.scope,
                remembered=remembered,
                reason=reason,
                resolved_at_us=pending.resolved_at_us,
            )

    # -- withdrawal and views -----------------------------------------------------------------

    async def withdraw_turn(self, turn_id: str) -> list[str]:
        """Cancel/session end: withdraw the turn's open `wait` requests (no resolved event)."""
        open_requests = [
            p
            for p in self._requests.values()
            if p.request.turn_id == turn_id and p.status == "pending" and p.policy == "wait"
        ]
        await self._withdraw(open_requests)
        return [p.request.tool_use_id for p in open_requests]

    async def _withdraw(self, requests: list[_Pending]) -> None:
        live = [p for p in requests if p.status == "pending"]
        for pending in live:  # one synchronous step: no answer can win after it
            pending.status, pending.resolved_at_us = "withdrawn", now_us()
        for pending in live:
            await self._store_resolution(pending, remembered=False, reason=None)
            if pending.future is not None and not pending.future.done():
                pending.future.set_result(ConfirmationAnswer("withdrawn"))

    def settle_suspended(self, request_id: str, decision: Decision) -> None:
        """AAP resolution (metis/core/turns/resume.py): the row was settled in the acceptance
        transaction; mirror it here so `pending()` stops listing the request."""
        pending = self._requests.get(request_id)
        if pending is not None and pending.policy == "suspend" and pending.status == "pending":
            pending.status, pending.scope = _ROW_STATUS[decision], "once"
            pending.resolved_at_us = now_us()

    def pending(self, session_id: str) -> list[dict[str, Any]]:
        """Open requests of the session, oldest first (snapshot and GET /sessions/{id})."""
        return [
            p.public()
            for p in self._requests.values()
            if p.request.session_id == session_id and p.status == "pending"
        ]

    async def withdraw_suspended(self, session_id: str) -> None:
        """Session end: every suspended request of the session is withdrawn (row and memory)."""
        stamp = now_us()
        for pending in self._requests.values():
            if pending.request.session_id == session_id and pending.status == "pending":
                pending.status, pending.resolved_at_us = "withdrawn", stamp
        async with self.store.transaction() as tx:
            tx.confirmations.withdraw_pending(session_id, stamp)

    def holds(self, session_id: str) -> bool:
        """Whether anything of the session is still kept (pending requests, remembered decisions);
        the memory test checks that an ended session leaves nothing."""
        return any(p.request.session_id == session_id for p in self._requests.values()) or any(
            key[0] == session_id for key in self._remembered
        )

    def forget_session(self, session_id: str) -> None:
        """End or purge: drop every trace of the session from memory (the store keeps the
        requests and their answers; a late answer is judged from there)."""
        for key in [k for k, p in self._requests.items() if p.request.session_id == session_id]:
            del self._requests[key]
        for remembered in [k for k in self._remembered if k[0] == session_id]:
            del self._remembered[remembered]
