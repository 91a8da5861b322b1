"""AAP sessions over core sessions: create, read, list, delete, history.

An AAP session *is* a metis session (`surface = "aap"`): core creates it, lists it, streams it
and purges it; the façade adds one `aap_sessions` row with what only AAP knows. Every check runs
before the first write, so a 400 leaves nothing behind.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from metis.aap.agents import HISTORY_TYPES, AgentSpec, WorkspaceChoice
from metis.aap.config import (
    application_tools,
    check_agent_tools,
    check_client_tools,
    create_options,
    session_info,
    surface_policy,
)
from metis.aap.errors import AapError
from metis.aap.http import AapState
from metis.aap.mapping import parse_content, render_history
from metis.aap.store import AapSession, AapWrites, ContentShape
from metis.aap.wire import AgentConfig, SeedMessage, SystemMessage, ToolMessage, UserMessage
from metis.core.application import NewSession, SurfaceWrites, Transaction
from metis.core.canonical.content import ContentBlock, TextBlock, ToolResultBlock, ToolUseBlock
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message, MessageMetadata, validate_message
from metis.core.canonical.times import now_us

log = logging.getLogger(__name__)

_PLACEHOLDER_SESSION = "sess_seed"


# ---- seed history ----------------------------------------------------------------------------


def _seed_error(message: str, index: int) -> AapError:
    return AapError("invalid_seed", message, {"index": index})


def parse_seed(
    messages: Sequence[SeedMessage], max_image_bytes: int
) -> list[tuple[Message, ContentShape | None]]:
    """Seed messages as canonical drafts (ids assigned at commit) with their client form.

    The seed must be *closed*: every tool_use answered exactly once by a later `tool` message,
    no `tool` message without an earlier tool_use, unique toolCallIds — so a seed can never
    create pending calls.
    """
    drafts: list[tuple[Message, ContentShape | None]] = []
    declared: set[str] = set()
    answered: set[str] = set()
    for i, raw in enumerate(messages):
        where = f"messages[{i}].content"
        form: ContentShape | None = None
        metadata = MessageMetadata()
        blocks: list[ContentBlock]
        if isinstance(raw, SystemMessage):
            role, blocks = "system", [TextBlock(text=raw.content)]
        elif isinstance(raw, ToolMessage):
            inner, form = parse_content(
                "tool", raw.content, max_image_bytes=max_image_bytes, where=where
            )
            call_id = raw.tool_call_id
            if call_id not in declared:
                raise _seed_error(f"tool message {call_id!r} answers no earlier tool_use", i)
            if call_id in answered:
                raise _seed_error(f"tool_use {call_id!r} is answered more than once", i)
            answered.add(call_id)
            role = "tool"
            blocks = [ToolResultBlock(tool_use_id=call_id, content=inner)]
            metadata = MessageMetadata(tool_use_id=call_id)
        else:
            role = "user" if isinstance(raw, UserMessage) else "assistant"
            blocks, form = parse_content(
                role, raw.content, max_image_bytes=max_image_bytes, where=where
            )
            for block in blocks:
                if isinstance(block, ToolUseBlock):
                    if block.id in declared:
                        raise _seed_error(f"toolCallId {block.id!r} is used twice", i)
                    declared.add(block.id)
        draft = Message(
            id="0" * 26,
            session_id=_PLACEHOLDER_SESSION,
            turn_id=None,
            role=role,  # type: ignore[arg-type]
            content=blocks,
            created_at_us=0,
            metadata=metadata,
        )
        validate_message(draft, max_image_bytes=max_image_bytes)
        drafts.append((draft, form))
    unanswered = sorted(declared - answered)
    if unanswered:
        raise AapError(
            "invalid_seed",
            f"seed tool_use without a tool result: {', '.join(unanswered)}",
            {"unanswered": unanswered},
        )
    return drafts


# ---- create ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SessionDraft:
    """A fully validated create request; committing it is the first write."""

    agent: AgentSpec
    session: AapSession  # session_id / workspace filled in at commit
    workspace: WorkspaceChoice  # the `workspace` option, provisioned at commit
    seed: list[tuple[Message, ContentShape | None]]


def draft_session(
    state: AapState,
    agent_config: AgentConfig,
    raw_tools: Sequence[Mapping[str, Any]] | None,
    seed: Sequence[SeedMessage],
    version: int,
) -> SessionDraft:
    agent = state.agents.get(agent_config.name)
    if agent is None:
        raise AapError(
            "unknown_agent", f"no agent named {agent_config.name!r}", {"name": agent_config.name}
        )
    agent_tools = check_agent_tools(agent, agent_config.tools or [])
    values = create_options(agent, agent_config.options, state.workspaces)
    client_tools = check_client_tools(agent, raw_tools or [], version)
    drafts = parse_seed(seed, state.settings.max_image_bytes)
    session = AapSession(
        session_id="",
        agent_name=agent.name,
        created_via=version,
        agent_tools=agent_tools,
        options=values.options,
        secret_options=values.secrets,
        client_tools=client_tools,
        created_at_us=0,
        updated_at_us=0,
        workspace_path="",
        status="active",
    )
    assert values.workspace is not None  # create_options always resolves one
    return SessionDraft(agent, session, values.workspace, drafts)


async def discard_unfinished_creations(state: AapState) -> int:
    """Start-up: purge AAP-surface sessions without their `aap_sessions` row.

    Creation is one transaction now, but releases before it used two (the core session, then
    its AAP row): a crash between them left a bare session that AAP cannot see (404) and metis
    cannot drive (409 surface_mismatch), in a database this release may open. Its client
    never got a 201, so nothing acknowledged is lost."""
    session_ids = await state.aap_store.unfinished_creations()
    for session_id in session_ids:
        await state.app.sessions.discard(session_id)
        log.warning("discarded AAP session %s: a crash interrupted its creation", session_id)
    return len(session_ids)


async def commit_session(state: AapState, draft: SessionDraft, workspace: str) -> AapSession:
    """Core creates the session with its AAP row, content shapes and seed history in one
    transaction (and `session.created` in it): all of it, or nothing.

    `workspace` comes from `Workspaces.provisioned(draft.workspace)`. The façade has judged it
    against the AAP roots, which core applies instead of the metis setting
    `allowed_workspace_roots`.
    """
    created: list[AapSession] = []

    def seed(new: NewSession) -> tuple[list[Message], SurfaceWrites]:
        session = replace(
            draft.session,
            session_id=new.session_id,
            created_at_us=new.created_at_us,
            updated_at_us=new.created_at_us,
            workspace_path=new.workspace_path,
        )
        created.append(session)
        messages: list[Message] = []
        forms: list[tuple[str, ContentShape]] = []
        for message, form in draft.seed:
            stored = message.model_copy(
                update={"id": new_ulid(), "session_id": new.session_id, "created_at_us": now_us()}
            )
            messages.append(stored)
            if form is not None:
                forms.append((stored.id, form))

        def surface_writes(tx: Transaction, seeded: list[Message]) -> None:
            aap = tx.using(AapWrites)
            aap.insert(session)
            aap.insert_content_shapes(new.session_id, forms)

        return messages, surface_writes

    await state.app.sessions.create(
        workspace, None, surface="aap", allowed_roots=state.workspaces.roots(), seed=seed
    )
    return created[0]


# ---- reads -----------------------------------------------------------------------------------


async def require(state: AapState, session_id: str) -> AapSession:
    """The AAP session, or 404 (unknown, purged, or a metis-surface session)."""
    session = await state.aap_store.get(session_id) if session_id.startswith("sess_") else None
    if session is None:
        raise AapError("session_not_found", f"session {session_id} not found")
    return session


def info(state: AapState, session: AapSession, version: int) -> dict[str, Any]:
    return session_info(state.agents.get(session.agent_name), session, version)


def encode_cursor(session: AapSession) -> str:
    raw = f"c1|{session.created_at_us}|{session.session_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        tag, stamp, session_id = text.split("|")
        if tag != "c1" or not session_id.startswith("sess_") or not stamp.isdigit():
            raise ValueError(text)
        if int(stamp) >= 2**63:  # SQLite integers are 64-bit
            raise ValueError(text)
        return int(stamp), session_id
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise AapError(
            "invalid_cursor", "`after` is not a cursor this server issued", {"after": cursor}
        ) from None


async def page(state: AapState, after: str | None) -> tuple[list[AapSession], str | None]:
    position = decode_cursor(after) if after else None
    sessions, more = await state.aap_store.page(position, state.settings.page_size)
    return sessions, encode_cursor(sessions[-1]) if more and sessions else None


async def history(
    state: AapState, session: AapSession, kinds: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """`{"compacted": [...], "full": [...]}` for the requested kinds, in the AAP content form."""
    history = state.app.history
    full = await history.all_messages(session.session_id)
    forms = await state.aap_store.content_shapes(session.session_id)
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in kinds:
        messages = (
            full
            if kind == "full"
            else await history.context_view(
                session.session_id,
                session.workspace_path,
                full,
                surface_policy=surface_policy(session.agent_tools),
                application_tools=application_tools(session),
            )
        )
        out[kind] = render_history(messages, forms)
    return out


def history_kind(state: AapState, session: AapSession, kind: str | None) -> str:
    if kind not in HISTORY_TYPES:
        raise AapError("invalid_history_type", "`type` must be compacted or full", {"type": kind})
    agent = state.agents.get(session.agent_name)
    if agent is None or kind not in agent.history:
        raise AapError(
            "history_type_not_supported",
            f"the agent does not declare {kind} history",
            {"type": kind},
        )
    return kind


def declared_history(state: AapState, session: AapSession) -> list[str]:
    agent = state.agents.get(session.agent_name)
    return list(agent.history) if agent is not None else []
