"""The two AAP history views of a session.

`full` is every stored message in storage order, unredacted. `compacted` is the core's own
context view: the list the TurnRunner would send on its next model call — assembled and
compacted by `metis.core.context` for the model the session would use — with pending tool_use
blocks kept as they are (their answers are still to come) and seeded system messages kept in
their stored place (the core sends them as part of the system prompt). Without compaction it
equals `full`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from metis.aap.config import application_tools, surface_policy
from metis.aap.store import AapSession
from metis.core.agent import with_seeded_instructions
from metis.core.canonical import Message
from metis.core.context import SYSTEM_PROMPT, assemble, compact, workspace_facts
from metis.core.resume import pending_ids
from metis.core.routing.context import estimate_input_tokens


async def _model_for_next_call(core: Any, session: AapSession) -> Any:
    model = await core.session_store.latest_turn_model(session.session_id)
    if model is None:
        model = core.engine.default_model_for(session.workspace_path)
    return core.registry.get(model) if model else None


async def compacted_view(core: Any, session: AapSession, full: Sequence[Message]) -> list[Message]:
    pending = set(await pending_ids(core.store, session.session_id))
    entry = await _model_for_next_call(core, session)
    context = assemble(full)
    if entry is not None:
        caps = entry.capabilities
        max_out = min(caps.max_output_tokens, core.settings.limits.max_output_tokens_per_call)
        system = with_seeded_instructions(SYSTEM_PROMPT, full)
        system = f"{system}\n{workspace_facts(session.workspace_path)}"
        offered = core.dispatcher.offered(
            surface_policy(session.agent_tools), application_tools(session)
        )

        def estimate_of(messages: Sequence[Message]) -> int:
            return estimate_input_tokens(
                system_prompt=system, tools=offered, history=[m.content for m in messages]
            )

        context = compact(context, caps.max_context_tokens - max_out, estimate_of)
    owners = {m.id for m in full if m.role == "assistant"}
    kept = [
        m
        for m in context
        if not (m.role == "tool" and m.id in owners and m.metadata.tool_use_id in pending)
    ]
    # Seeded system messages go back where they were stored, so that without compaction the
    # view equals `full`. Context messages keep their ids (a synthetic result
    # shares its assistant's), and the sort is stable.
    position = {m.id: i for i, m in enumerate(full)}
    return sorted([*(m for m in full if m.role == "system"), *kept], key=lambda m: position[m.id])
