"""AAP turn requests → core turns.

A turn request carries either one `user` message or the answers to the session's pending tool
calls (`tool` results for client tools, `tool_permission`s for untrusted server tools), plus
optional overrides of the session's agent tools, options and client tools. Everything is
checked before the turn is submitted, in a fixed order (overrides, then the answers against
the pending calls by id and kind — a core check — then content); core then matches the answers
with their content, claims the turn slot, routes, and commits overrides, inputs and the turn
row in one transaction. The turn is a `SuspendingTurn`: AAP's strategy for core's turn
pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from metis.aap.config import (
    application_tools,
    check_agent_tools,
    check_client_tools,
    merge_options,
    model_override,
    surface_policy,
)
from metis.aap.errors import AapError, validation_error
from metis.aap.http import AapState
from metis.aap.mapping import parse_content
from metis.aap.store import AapSession, AapWrites, ContentShape
from metis.aap.stream import Renderer, TurnPlan
from metis.aap.wire import AgentOverride, ToolMessage, ToolPermissionMessage, UserMessage
from metis.core.application import (
    Answer,
    ApplicationResult,
    PermissionAnswer,
    SuspendingTurn,
    Transaction,
    TurnAccepted,
    TurnRequest,
)
from metis.core.canonical.messages import Message
from metis.core.canonical.times import now_us


@dataclass(frozen=True)
class TurnInput:
    content: list[dict[str, Any]] | None  # canonical user blocks (None for a resolution)
    user_form: ContentShape | None
    answers: list[Answer] | None
    answer_forms: dict[str, ContentShape]  # tool_use_id → form of the client's result

    @property
    def application_ids(self) -> frozenset[str]:
        return frozenset(self.answer_forms)


def check_shape(messages: Sequence[Any]) -> None:
    """One user message, or tool answers only (which calls they answer is judged next)."""
    if not messages:
        raise validation_error(
            [{"loc": ["body", "messages"], "msg": "at least one message is required"}]
        )
    users = [m for m in messages if isinstance(m, UserMessage)]
    if users and len(users) != len(messages):
        raise AapError(
            "invalid_tool_answers",
            "a turn carries either one user message or tool answers, not both",
            {"missing": [], "unknown": [], "duplicate": [], "wrong_kind": []},
        )
    if len(users) > 1:
        raise validation_error(
            [{"loc": ["body", "messages"], "msg": "send exactly one user message per turn"}]
        )


async def check_answers(state: AapState, session_id: str, messages: Sequence[Any]) -> None:
    """The answers are judged against the pending calls before any content.

    Only ids and kinds are judged here (`TurnService.check_answers`); the content is judged
    at acceptance, once parsed.
    """
    answers: list[Answer] | None = None
    if not isinstance(messages[0], UserMessage):
        answers = [
            PermissionAnswer(m.tool_call_id, m.granted)
            if isinstance(m, ToolPermissionMessage)
            else ApplicationResult(m.tool_call_id, ())
            for m in messages
        ]
    await state.app.turns.check_answers(session_id, answers)


def parse_turn_messages(messages: Sequence[Any], max_image_bytes: int) -> TurnInput:
    """The content of messages that passed `check_shape`: the last check before core is called."""
    if isinstance(messages[0], UserMessage):
        blocks, form = parse_content(
            "user",
            messages[0].content,
            max_image_bytes=max_image_bytes,
            where="messages[0].content",
        )
        return TurnInput([b.model_dump(mode="json") for b in blocks], form, None, {})
    answers: list[Answer] = []
    forms: dict[str, ContentShape] = {}
    for i, message in enumerate(messages):
        if isinstance(message, ToolPermissionMessage):
            answers.append(
                PermissionAnswer(message.tool_call_id, message.granted, message.reason or None)
            )
            continue
        assert isinstance(message, ToolMessage)
        blocks, form = parse_content(
            "tool", message.content, max_image_bytes=max_image_bytes, where=f"messages[{i}].content"
        )
        answers.append(ApplicationResult(message.tool_call_id, tuple(blocks)))
        forms.setdefault(message.tool_call_id, form)
    return TurnInput(None, None, answers, forms)


@dataclass(frozen=True)
class PreparedTurn:
    session: AapSession  # with this request's overrides applied (persisted at acceptance)
    changed: bool
    input: TurnInput


async def prepare_turn(
    state: AapState,
    session: AapSession,
    agent_override: AgentOverride | None,
    raw_tools: Sequence[Mapping[str, Any]] | None,
    messages: Sequence[Any],
    version: int,
) -> PreparedTurn:
    """The checks after the session lookup, in the contract's order: overrides → answers vs
    pending → content. `messages` passed `check_shape` with the body. Nothing is written."""
    agent = state.agents.get(session.agent_name)
    if agent is None:
        raise AapError("unknown_agent", f"agent {session.agent_name!r} is no longer served")
    updated = session
    if agent_override is not None:
        if agent_override.name is not None and agent_override.name != session.agent_name:
            raise validation_error(
                [{"loc": ["body", "agent", "name"], "msg": "the agent name cannot be changed"}]
            )
        if agent_override.tools is not None:
            updated = replace(updated, agent_tools=check_agent_tools(agent, agent_override.tools))
        if agent_override.options is not None:
            values = merge_options(agent, session, agent_override.options)
            updated = replace(updated, options=values.options, secret_options=values.secrets)
    if raw_tools is not None:
        updated = replace(updated, client_tools=check_client_tools(agent, raw_tools, version))
    await check_answers(state, session.session_id, messages)
    parsed = parse_turn_messages(messages, state.settings.max_image_bytes)
    return PreparedTurn(updated, updated != session, parsed)


def plan_turn(
    state: AapState,
    prepared: PreparedTurn,
    mode: str,
    cors_headers: dict[str, str],
    *,
    session_start: str | None = None,
    status_json: int = 200,
) -> TurnPlan:
    app = state.app
    session, turn_input = prepared.session, prepared.input

    def surface_writes(tx: Transaction, inputs: list[Message]) -> None:
        aap = tx.using(AapWrites)
        if prepared.changed:
            aap.update_config(session, now_us())
        forms: list[tuple[str, ContentShape]] = []
        for message in inputs:
            if message.role == "user" and turn_input.user_form is not None:
                forms.append((message.id, turn_input.user_form))
            elif message.metadata.tool_use_id in turn_input.answer_forms:
                forms.append((message.id, turn_input.answer_forms[message.metadata.tool_use_id]))
        aap.insert_content_shapes(session.session_id, forms)

    async def start() -> TurnAccepted:
        return await app.turns.submit(
            TurnRequest(
                session.session_id,
                turn_input.content,
                model_override(app.models, session.options),
                surface="aap",
                surface_policy=surface_policy(session.agent_tools),
                application_tools=application_tools(session),
                strategy=SuspendingTurn(turn_input.answers, surface_writes),
            )
        )

    renderer = Renderer(
        app.history,
        "message" if mode == "message" else "delta",
        frozenset(t["name"] for t in session.client_tools),
        turn_input.application_ids,
    )
    return TurnPlan(
        session_id=session.session_id,
        mode=mode,
        start=start,
        renderer=renderer,
        answered_application_ids=turn_input.application_ids,
        cors_headers=cors_headers,
        session_start=session_start,
        status_json=status_json,
    )
