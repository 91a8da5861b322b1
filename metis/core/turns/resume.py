"""Suspend/resume of tool calls: the `suspend` confirmation policy's second half.

A turn under the `suspend` policy ends with `turn.completed{tool_use}` when the dispatcher parks
calls (untrusted server tools awaiting permission, application tools awaiting the client's
result). The next turn of that session is a *resolution*: it must answer every pending call
exactly once, and only then does the agent loop continue. This module owns that second half:

1. `prepare_resolution` reads the pending calls from the store (they survive restarts) and
   matches the answers against them: a user message while calls are pending raises
   `PendingToolCalls`; missing, unknown, duplicate or wrong-kind answers raise
   `InvalidResolution` — both before anything is written.
2. `accept` builds the acceptance-time messages (application results verbatim, denials as
   `Tool call denied[: reason]`) once the turn id is minted, and `acceptance_rows` stores them with
   the turn row, the confirmation rows and the surface's own writes in one transaction.
3. `run_resolution` is the resolution turn's first step, after `turn.started` and
   `route.decided`: per answer in tool_use order `tool.confirmation_resolved` (+
   `tool.failed{user_denied}`) or `tool.completed`; then granted calls redo the sandbox
   pre-check and execute through the dispatcher, their results stored in tool_use order.

`close_unanswered` is the other direction: a turn that ends any other way than `tool_use` — a
cancel while calls are parked, or a model reply holding tool uses that stopped for another
reason (`max_tokens`, `end_turn`, `refusal`) — leaves no call pending: each gets
`Tool call cancelled`.

Core stays surface-agnostic: the surface hands over plain answers and, optionally, a callback
that adds its own rows to the acceptance transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from metis.core.canonical.content import (
    ImageBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    content_errors,
)
from metis.core.canonical.jsontext import canonical_json
from metis.core.canonical.messages import Message
from metis.core.canonical.times import now_us
from metis.core.confirmations import ConfirmationBroker, Decision
from metis.core.errors import InvalidContent, InvalidResolution, PendingToolCalls
from metis.core.events.bus import EventBus
from metis.core.models.registry import ModelRegistry
from metis.core.routing.alias import OverrideResolution, resolve_override
from metis.core.sessions.history import Flush, SurfaceWrites
from metis.core.store.events import EventStore
from metis.core.store.sessions import NewTurn
from metis.core.store.store import Store
from metis.core.store.tx import Transaction
from metis.core.tools.dispatcher import Dispatcher, TurnTools
from metis.core.tools.results import (
    ToolOutcome,
    cancelled_text,
    failed,
    tool_result_message,
    user_denied_text,
)
from metis.core.tools.sandbox import Sandboxes

if TYPE_CHECKING:  # the runner imports this module
    from metis.core.turns.runner import TurnRun

log = logging.getLogger(__name__)

CallKind = Literal["permission", "application"]


# ---------------------------------------------------------------------------------------------
# Answers and pending calls
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PermissionAnswer:
    """The answer to a suspended permission request (`tool_permission` in AAP)."""

    tool_use_id: str
    granted: bool
    reason: str | None = None


@dataclass(frozen=True)
class ApplicationResult:
    """The client's result for an application tool call (`tool` message in AAP)."""

    tool_use_id: str
    content: tuple[TextBlock | ImageBlock, ...]
    is_error: bool = False


Answer = PermissionAnswer | ApplicationResult


@dataclass(frozen=True)
class PendingCall:
    """A parked tool use of a suspended turn, as the store knows it."""

    tool_use_id: str
    name: str
    kind: CallKind
    turn_id: str
    message_id: str
    confirmation_id: str | None
    requested_event_id: str | None
    called_at_us: int


async def load_pending(store: Store, session_id: str) -> list[PendingCall]:
    """Pending calls in tool_use order, from committed rows only (so they survive restarts).

    A permission is pending while its `suspend` confirmation row is; an application call while
    it has no stored result. Neither depends on event projections.
    """
    return [
        PendingCall(
            tool_use_id=r.id,
            name=r.name,
            kind="permission" if r.confirmation_id is not None else "application",
            turn_id=r.turn_id,
            message_id=r.message_id,
            confirmation_id=r.confirmation_id,
            requested_event_id=r.requested_event_id,
            called_at_us=r.started_at_us or r.created_at_us,
        )
        for r in await store.messages.parked_calls(session_id)
    ]


async def pending_ids(store: Store, session_id: str) -> list[str]:
    """What a surface shows as "waiting for an answer" (e.g. AAP history checks)."""
    return [p.tool_use_id for p in await load_pending(store, session_id)]


# ---------------------------------------------------------------------------------------------
# Matching (before anything is written)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolutionPlan:
    """Answers matched to their pending calls, in tool_use order."""

    resumes_turn_id: str
    items: tuple[tuple[PendingCall, Answer], ...]

    def fingerprint(self) -> bytes:
        """The bytes `turn.started.content_sha256/content_bytes` describe for a resolution."""
        return canonical_json([_answer_json(a) for _, a in self.items]).encode()


def _answer_json(answer: Answer) -> dict[str, Any]:
    if isinstance(answer, PermissionAnswer):
        return {
            "tool_use_id": answer.tool_use_id,
            "granted": answer.granted,
            "reason": answer.reason,
        }
    return {
        "tool_use_id": answer.tool_use_id,
        "content": [b.model_dump(mode="json") for b in answer.content],
        "is_error": answer.is_error,
    }


def _match_ids(pending: Sequence[PendingCall], answers: Sequence[Answer]) -> dict[str, Answer]:
    """Every pending call answered exactly once with the right kind, else `InvalidResolution`."""
    by_id = {p.tool_use_id: p for p in pending}
    seen: dict[str, Answer] = {}
    unknown: list[str] = []
    duplicate: list[str] = []
    wrong_kind: list[str] = []
    for answer in answers:
        key = answer.tool_use_id
        call = by_id.get(key)
        if call is None:
            if key not in unknown:
                unknown.append(key)
            continue
        if key in seen:
            if key not in duplicate:
                duplicate.append(key)
            continue
        seen[key] = answer
        expected: CallKind = "permission" if isinstance(answer, PermissionAnswer) else "application"
        if call.kind != expected:
            wrong_kind.append(key)
    missing = [p.tool_use_id for p in pending if p.tool_use_id not in seen]
    if missing or unknown or duplicate or wrong_kind or not answers:
        raise InvalidResolution(
            missing=missing, unknown=unknown, duplicate=duplicate, wrong_kind=wrong_kind
        )
    return seen


def match_answers(
    pending: Sequence[PendingCall], answers: Sequence[Answer], *, max_image_bytes: int
) -> ResolutionPlan:
    """The answers matched to the pending calls (`_match_ids`), with valid content."""
    seen = _match_ids(pending, answers)
    errors: list[dict[str, Any]] = []
    for call in pending:
        answer = seen[call.tool_use_id]
        if isinstance(answer, ApplicationResult):
            block = ToolResultBlock(
                tool_use_id=call.tool_use_id, content=list(answer.content), is_error=answer.is_error
            )
            for error in content_errors("tool", [block], max_image_bytes=max_image_bytes):
                errors.append({**error, "tool_use_id": call.tool_use_id})
            if not answer.content:
                errors.append(
                    {
                        "index": None,
                        "msg": "a tool result needs content",
                        "tool_use_id": call.tool_use_id,
                    }
                )
    if errors:
        raise InvalidContent(errors)
    resumes = max(p.turn_id for p in pending)
    return ResolutionPlan(resumes, tuple((p, seen[p.tool_use_id]) for p in pending))


async def prepare_resolution(
    store: Store, session_id: str, answers: Sequence[Answer] | None, *, max_image_bytes: int
) -> ResolutionPlan | None:
    """None for a plain user-message turn; the matched plan for a resolution; or raise."""
    pending = await load_pending(store, session_id)
    if answers is None:
        if pending:
            raise PendingToolCalls([p.tool_use_id for p in pending])
        return None
    return match_answers(pending, answers, max_image_bytes=max_image_bytes)


# ---------------------------------------------------------------------------------------------
# Acceptance (the turn id is known from here on)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptedAnswer:
    """One pending call with its answer; application results and denials carry the message stored at
    acceptance, a granted permission has none yet (the tool runs later)."""

    call: PendingCall
    answer: Answer
    message: Message | None  # stored at acceptance: application results and denials
    outcome: ToolOutcome | None


@dataclass(frozen=True)
class Resolution:
    """An accepted resolution, carried by the resolution turn's `TurnRun`."""

    resumes_turn_id: str
    accepted: tuple[AcceptedAnswer, ...]

    @property
    def messages(self) -> list[Message]:
        """The messages stored at acceptance, in tool_use order."""
        return [a.message for a in self.accepted if a.message is not None]


def accept(plan: ResolutionPlan, session_id: str, turn_id: str) -> Resolution:
    """Build the acceptance-time `tool` messages, in tool_use order."""
    stamp = now_us()
    accepted: list[AcceptedAnswer] = []
    for call, answer in plan.items:
        outcome: ToolOutcome | None = None
        if isinstance(answer, ApplicationResult):
            size = sum(len(b.text.encode()) for b in answer.content if isinstance(b, TextBlock))
            outcome = ToolOutcome(
                error_class=None,
                content=tuple(answer.content),
                is_error=answer.is_error,
                output_bytes=size,
                duration_ms=max(0, (stamp - call.called_at_us) // 1000),
            )
        elif not answer.granted:
            outcome = failed("user_denied", user_denied_text(answer.reason or None))
        message = (
            tool_result_message(session_id, turn_id, call.tool_use_id, outcome, stamp)
            if outcome is not None
            else None
        )
        accepted.append(AcceptedAnswer(call, answer, message, outcome))
    return Resolution(plan.resumes_turn_id, tuple(accepted))


def acceptance_rows(
    tx: Transaction,
    turn: NewTurn,
    messages: list[Message],
    resolution: Resolution | None,
    surface_writes: SurfaceWrites | None,
) -> None:
    """The acceptance transaction's writes: turn row, input messages, answered calls and
    confirmation rows, and the surface's own rows — all or nothing."""
    tx.sessions.insert_turn(turn, messages)
    if resolution is not None:
        _settle_rows(tx, resolution, turn.id)
    if surface_writes is not None:
        surface_writes(tx, messages)


def _settle_rows(tx: Transaction, resolution: Resolution, turn_id: str) -> None:
    stamp = now_us()
    for item in resolution.accepted:
        call = item.call
        gone = _gone(call)
        if item.message is not None:
            tx.messages.link_unanswered_result(call.tool_use_id, item.message.id, gone)
        if isinstance(item.answer, PermissionAnswer):
            tx.confirmations.settle_suspended(
                call.confirmation_id,
                granted=item.answer.granted,
                reason=item.answer.reason if not item.answer.granted else None,
                stamp=stamp,
                turn_id=turn_id,
                gone=gone,
            )


def _gone(call: PendingCall) -> Callable[[], InvalidResolution]:
    """A call answered or closed concurrently (session end): the whole acceptance rolls back."""
    return lambda: InvalidResolution(
        missing=[], unknown=[call.tool_use_id], duplicate=[], wrong_kind=[]
    )


# ---------------------------------------------------------------------------------------------
# The resolution turn's first step
# ---------------------------------------------------------------------------------------------


def _blocks_by_id(history: Sequence[Message], message_ids: set[str]) -> dict[str, ToolUseBlock]:
    return {
        b.id: b
        for m in history
        if m.id in message_ids
        for b in m.content
        if isinstance(b, ToolUseBlock)
    }


async def _called_event_ids(events: EventStore, turn_id: str) -> dict[str, str]:
    called = await events.of_turn(turn_id, "tool.called")
    return {cast(str, e.payload.get("tool_use_id")): e.id for e in called}


async def run_resolution(
    run: TurnRun,
    *,
    bus: EventBus,
    dispatcher: Dispatcher,
    broker: ConfirmationBroker,
    sandboxes: Sandboxes,
    events: EventStore,
    flush: Flush,
) -> None:
    """Announce every answer in tool_use order, then execute the grants.

    `run` is the resolution turn's `TurnRun`; events carry its turn id. An application
    result's outcome names its `tool.called`, read from the store once the events are flushed.
    """
    resolution = run.resolution
    assert resolution is not None
    session_id, turn_id = run.session_id, run.turn_id
    blocks = _blocks_by_id(run.session.history, {a.call.message_id for a in resolution.accepted})
    called: dict[str, str] = {}
    if any(a.call.kind == "application" for a in resolution.accepted):
        await flush()
        called = await _called_event_ids(events, resolution.resumes_turn_id)
    grants: list[tuple[ToolUseBlock, str | None]] = []
    for item in resolution.accepted:
        call, answer = item.call, item.answer
        block = blocks.get(call.tool_use_id) or ToolUseBlock(
            id=call.tool_use_id, name=call.name, input={}
        )
        if isinstance(answer, ApplicationResult):
            assert item.message is not None and item.outcome is not None
            dispatcher.emit_outcome(
                session_id,
                turn_id,
                block,
                item.outcome,
                item.message.id,
                called.get(call.tool_use_id),
            )
            continue
        decision: Decision = "allow" if answer.granted else "deny"
        resolved = bus.emit(
            session_id,
            "tool.confirmation_resolved",
            {
                "confirmation_request_id": call.confirmation_id,
                "tool_use_id": call.tool_use_id,
                "decision": decision,
                "scope": "once",
                "remembered": False,
                "reason": None if answer.granted else answer.reason,
            },
            actor="user",
            turn_id=turn_id,
            parent_event_id=call.requested_event_id,
        )
        if call.confirmation_id is not None:
            broker.settle_suspended(call.confirmation_id, decision)
        resolved_id = resolved.id if resolved else None
        if answer.granted:
            grants.append((block, resolved_id))
        else:
            assert item.message is not None and item.outcome is not None
            dispatcher.emit_outcome(
                session_id, turn_id, block, item.outcome, item.message.id, resolved_id
            )
    if not grants:
        return
    tools = TurnTools(
        session_id=session_id,
        turn_id=turn_id,
        workspace=run.workspace,
        sandbox=sandboxes.for_workspace(run.workspace),
        confirmation_policy="suspend",
        cancel=run.slot.cancel_event,
        surface_policy=run.surface_policy,
        application_tools=run.application_tools,
    )
    await dispatcher.run_granted(tools, grants, parent_event_id=run.route_event_id)


async def close_unanswered(
    broker: ConfirmationBroker,
    dispatcher: Dispatcher,
    session_id: str,
    turn_id: str,
    tool_uses: Sequence[ToolUseBlock],
    parent_event_id: str | None = None,
) -> None:
    """A turn ending without `tool_use` leaves no tool use unanswered:
    otherwise the next turn would be refused for pending calls, and providers reject a history
    with a call and no result. Open requests are withdrawn; each call gets a stored
    `Tool call cancelled` and its `tool.failed{cancelled}`, which also closes its row."""
    await broker.withdraw_turn(turn_id)
    for block in tool_uses:
        outcome = failed("cancelled", cancelled_text())
        message = await dispatcher.store_result(session_id, turn_id, block.id, outcome)
        dispatcher.emit_outcome(session_id, turn_id, block, outcome, message.id, parent_event_id)


# ---------------------------------------------------------------------------------------------
# The suspending turn strategy (what the AAP façade supplies to `TurnService.submit`)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuspendingTurn:
    """A turn whose confirmations and application tool calls suspend it: the answers come
    back as the next turn's request (`answers`), matched against the pending calls before
    anything is written. The user's text is stored verbatim (the model choice comes from the
    request's override field only, and an unavailable override falls back to routing), and
    `surface_writes` adds the surface's own rows to the acceptance transaction."""

    answers: Sequence[Answer] | None = None
    surface_writes: SurfaceWrites | None = None
    confirmation_policy: Literal["suspend"] = "suspend"
    override_strict: bool = False

    def override(
        self, blocks: list[Any], registry: ModelRegistry, field: str | None
    ) -> OverrideResolution:
        """The override comes from the request's field only; the text is never scanned for an
        `@alias`."""
        return OverrideResolution(blocks, resolve_override([], registry, field=field).override)

    async def plan(
        self, store: Store, session_id: str, *, max_image_bytes: int
    ) -> ResolutionPlan | None:
        """The pending calls matched against this request's answers; None for a plain user message
        with nothing pending."""
        return await prepare_resolution(
            store, session_id, self.answers, max_image_bytes=max_image_bytes
        )

    def writes(self, tx: Transaction, inputs: list[Message]) -> None:
        """Add the surface's own rows to the acceptance transaction."""
        if self.surface_writes is not None:
            self.surface_writes(tx, inputs)


async def check_answer_ids(store: Store, session_id: str, answers: Sequence[Answer] | None) -> None:
    """The pending calls judged by id and kind only, before a surface parses the answers'
    content (the AAP contract's order: overrides, then the answers, then content). The
    content is judged once, at acceptance (`match_answers`)."""
    pending = await load_pending(store, session_id)
    if answers is None:
        if pending:
            raise PendingToolCalls([p.tool_use_id for p in pending])
        return
    _match_ids(pending, answers)
