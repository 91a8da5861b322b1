"""TurnEnvironment: the collaborators a running turn works with, typed.

`Core` (metis/core/runtime.py) builds them once and hands this bundle to the turn services
(`TurnService`, `TurnRunner`, suspend/resume in `resume.py`), so none of them holds the whole
`Core` or reaches through it: what a turn may touch is exactly what is listed here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from metis.config import Settings
from metis.core.canonical.messages import Message
from metis.core.confirmations import ConfirmationBroker
from metis.core.events.bus import EventBus
from metis.core.events.costs import CostAccumulator
from metis.core.events.hub import SessionHub
from metis.core.models.registry import ModelRegistry
from metis.core.routing.availability import Availability
from metis.core.sessions.cache import SessionCache
from metis.core.sessions.instructions import SessionInstructions
from metis.core.store.messages import NewToolCall
from metis.core.store.store import Store
from metis.core.tools.dispatcher import Dispatcher
from metis.core.tools.sandbox import Sandbox


@dataclass(frozen=True)
class TurnEnvironment:
    settings: Settings
    store: Store
    bus: EventBus
    costs: CostAccumulator
    hub: SessionHub
    session_cache: SessionCache
    registry: ModelRegistry
    availability: Availability
    dispatcher: Dispatcher
    broker: ConfirmationBroker
    instructions: SessionInstructions
    flush: Callable[[], Awaitable[object]]
    """Make every event emitted so far readable (the trace writer's flush)."""

    def sandbox_for(self, workspace: str) -> Sandbox:
        return Sandbox(workspace, self.settings.tools.sandbox.protected_dirs)

    async def commit_messages(
        self, session_id: str, messages: list[Message], tool_calls: Sequence[NewToolCall] = ()
    ) -> None:
        """Commit messages (and the tool_calls rows of their tool uses) in one transaction,
        then add them to the session's cached history."""
        async with self.store.transaction() as tx:
            tx.messages.insert(*messages)  # validated before the write
            tx.messages.insert_tool_calls(tool_calls)
        self.session_cache.committed(session_id, *messages)
