"""Application: the one typed interface the surfaces call.

The metis REST/WebSocket surface (`metis/server`), the AAP façade (`metis/aap`) and the
dashboard reach core only through an `Application` and the value types this module
re-exports; they never hold `Core`, the store, the bus, the slots or the hub
(`tests/test_architecture.py` checks it). Each service below is a narrow, typed view over the
components `Core` wires, so a surface can do exactly what its wire contract needs — and every
business rule stays in core, shared by all surfaces.

- `sessions`: the session lifecycle and titles (`SessionService`); `turns`: submit, cancel,
  AAP's pre-checks, the turn holding a session (`TurnService`, over a `TurnRequest`).
- `confirmations`: answering a turn's confirmation request.
- `history`: committed messages and events, and the context view of a session.
- `routing`, `models`: the routing policy and model health; the model registry.
- `streams`: live delivery (hub clients, attach tokens, the hand-off point of a new subscriber).
- `system`: what `/health` and `/server/version` report; `extend_store`: a surface's tables.
- lifecycle: `start`, `stop`, `shutdown`, `abort`, `flush`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from metis.config import Settings
from metis.core.canonical.messages import Message
from metis.core.canonical.tools import ToolDefinition
from metis.core.confirmations import Decision, ResolveResult
from metis.core.events.envelope import AnyEvent, Event
from metis.core.events.hub import (
    CloseMarker,
    HandoffPoint,
    HubClient,
    SharedEvent,
    StreamingMessage,
    token_fingerprint,
)
from metis.core.models.registry import ModelRegistry
from metis.core.models.types import ModelEntry
from metis.core.runtime import Core
from metis.core.sessions.history import SurfaceWrites
from metis.core.sessions.search import SEARCH_CHARS, SearchMatch
from metis.core.sessions.service import (
    ModelChange,
    NewSession,
    PurgeResult,
    SessionService,
    SessionView,
    expand_workspace,
)
from metis.core.sessions.titles import TITLE_CHARS, title_problem
from metis.core.store.db import Database
from metis.core.store.messages import MessagePage
from metis.core.store.sessions import SessionRow, TurnRow
from metis.core.store.store import StoreExtension
from metis.core.store.tx import Transaction
from metis.core.tools.base import ToolNameConflict
from metis.core.tools.policy import SurfaceToolPolicy
from metis.core.turns.context import assemble
from metis.core.turns.resume import (
    Answer,
    ApplicationResult,
    PermissionAnswer,
    SuspendingTurn,
    load_pending,
)
from metis.core.turns.service import CancelReason, TurnAccepted, TurnRequest, TurnService

__all__ = [
    "SEARCH_CHARS",
    "TITLE_CHARS",
    "Answer",
    "AnyEvent",
    "Application",
    "ApplicationResult",
    "CancelReason",
    "CloseMarker",
    "Confirmations",
    "Event",
    "HandoffPoint",
    "History",
    "HubClient",
    "MessagePage",
    "ModelChange",
    "ModelEntry",
    "Models",
    "NewSession",
    "PermissionAnswer",
    "PurgeResult",
    "Routing",
    "SearchMatch",
    "SessionRow",
    "SessionService",
    "SessionView",
    "SharedEvent",
    "StreamingMessage",
    "Streams",
    "SurfaceToolPolicy",
    "SurfaceWrites",
    "SuspendingTurn",
    "SystemInfo",
    "ToolNameConflict",
    "Transaction",
    "TurnAccepted",
    "TurnRequest",
    "TurnRow",
    "TurnService",
    "expand_workspace",
    "title_problem",
    "token_fingerprint",
]

R = TypeVar("R")


EVENTS_PER_READ = 1000
"""Events read a round trip when a session's whole trace is read."""


class Confirmations:
    """Answering a `wait` turn's confirmation request (the first answer wins)."""

    def __init__(self, core: Core) -> None:
        self._sessions = core.sessions
        self._turns = core.turns
        self._broker = core.broker

    async def answer(
        self,
        session_id: str,
        turn_id: str,
        request_id: str,
        decision: Decision,
        scope: str,
        reason: str | None,
    ) -> ResolveResult:
        """The session must exist and own the turn; then the broker settles the request."""
        await self._sessions.require(session_id)
        await self._turns.require_turn(session_id, turn_id)
        return await self._broker.resolve(session_id, turn_id, request_id, decision, scope, reason)


class History:
    """What is committed: a session's messages and events, read after a flush where the
    contract promises read-your-writes, and the context view of a session."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._store = core.store

    async def flush(self) -> None:
        """Make every event emitted so far readable: a read that must include them flushes first."""
        await self._core.flush()

    async def messages_page(
        self, session_id: str, *, before: str | None, after: str | None = None, limit: int
    ) -> MessagePage:
        """A page of the session's messages in id order, with flags for more on either side."""
        return await self._store.messages.page(session_id, before=before, after=after, limit=limit)

    async def all_messages(self, session_id: str) -> list[Message]:
        return await self._store.messages.all_for_session(session_id)

    async def turn_messages(self, session_id: str, turn_id: str | None) -> list[Message]:
        return await self._store.messages.of_turn(session_id, turn_id)

    async def message(self, message_id: str) -> Message | None:
        return await self._store.messages.get(message_id)

    async def events_page(
        self,
        session_id: str,
        *,
        after_seq: int = 0,
        until_seq: int | None = None,
        types: Sequence[str] | None = None,
        limit: int,
    ) -> tuple[list[Event], bool]:
        """Stored events of the session with seq in (after_seq, until_seq], oldest first, optionally
        of some types only; and whether more follow."""
        return await self._store.events.page(
            session_id, after_seq=after_seq, until_seq=until_seq, types=types, limit=limit
        )

    async def newest_events_of_type(self, event_type: str, limit: int) -> list[Event]:
        """The newest stored events of one type across every session, newest first (the last
        route decisions, wherever they were taken), after a flush."""
        await self._core.flush()
        return await self._store.events.newest_of_type(event_type, limit)

    async def all_events(self, session_id: str) -> list[Event]:
        """Every stored event of the session, oldest first, read a page at a time (a session's
        export)."""
        events: list[Event] = []
        more = True
        while more:
            after_seq = events[-1].seq if events else 0
            page, more = await self.events_page(
                session_id, after_seq=after_seq, limit=EVENTS_PER_READ
            )
            events.extend(page)
        return events

    async def seq_of(self, session_id: str, event_id: str) -> int:
        """The seq of a stored event of this session (`CursorNotFound` otherwise)."""
        return await self._store.events.seq_of(session_id, event_id)

    async def latest_event(self, session_id: str) -> Event | None:
        """The session's newest stored event (a subscriber's starting point)."""
        return await self._store.events.latest(session_id)

    async def session_row(self, session_id: str) -> SessionRow | None:
        """The stored row, even of an ended session (None once purged)."""
        return await self._store.sessions.get(session_id)

    async def turns_since(self, since_us: int) -> list[TurnRow]:
        """Turns started since `since_us`, for the dashboard."""
        return await self._store.sessions.turns_since(since_us)

    async def pending_tool_call_ids(self, session_id: str) -> list[str]:
        """The tool calls of suspended turns still waiting for an answer, in tool_use order."""
        return [p.tool_use_id for p in await load_pending(self._store, session_id)]

    async def context_view(
        self,
        session_id: str,
        workspace: str,
        full: Sequence[Message],
        *,
        surface_policy: SurfaceToolPolicy | None,
        application_tools: Sequence[ToolDefinition],
    ) -> list[Message]:
        """The session's history as its next model call would see it: assembled and compacted
        (`metis.core.turns.context`) for the model the session would use, with pending tool_use
        blocks kept as they are (their answers are still to come) and seeded system messages
        kept in their stored place (they are sent as part of the system prompt). Without
        compaction it equals `full`."""
        from metis.core.turns.runner import call_context  # the runner's own context rule

        core = self._core
        pending = set(await self.pending_tool_call_ids(session_id))
        model = await core.store.sessions.latest_turn_model(session_id)
        if model is None:
            model = core.engine.default_model_for(workspace)
        entry = core.registry.get(model) if model else None
        if entry is None:
            context = assemble(full)
        else:
            instructions = await core.instructions.in_use(session_id, workspace)
            offered = core.dispatcher.offered(surface_policy, application_tools)
            limits = core.settings.limits
            # fitted to the provider's count as the runner fits it, once a call reported one
            scale = core.session_cache.token_scale(session_id, entry.id)
            fitted = call_context(full, instructions, workspace, entry, limits, offered, scale)
            context = fitted.messages
        owners = {m.id for m in full if m.role == "assistant"}
        kept = [
            m
            for m in context
            if not (m.role == "tool" and m.id in owners and m.metadata.tool_use_id in pending)
        ]
        # Seeded system messages go back where they were stored, so that without compaction
        # the view equals `full`. Context messages keep their ids (a synthetic result shares
        # its assistant's), and the sort is stable.
        position = {m.id: i for i, m in enumerate(full)}
        return sorted(
            [*(m for m in full if m.role == "system"), *kept], key=lambda m: position[m.id]
        )

    async def project_instructions(self, session_id: str, workspace: str) -> dict[str, Any] | None:
        """The project instruction file in use (`{file, sha256, truncated}`), if any."""
        found = await self._core.instructions.in_use(session_id, workspace)
        return found.wire() if found is not None else None


class Routing:
    """The routing policy (describe, check, reload) and the models' health."""

    def __init__(self, core: Core) -> None:
        self._policy = core.policy
        self._availability = core.availability
        self._registry = core.registry

    def describe(self) -> dict[str, Any]:
        """`GET /routing`: the active policy, its source and version."""
        return self._policy.describe()

    def check(self, policy_yaml: str | None) -> dict[str, Any]:
        """`POST /routing/check`: validate a policy text, or the file on disk; never changes state."""
        return self._policy.check(policy_yaml)

    async def reload(self, *, reset_availability: bool) -> dict[str, Any]:
        """`POST /routing/reload`: re-read routing.yaml, optionally healing every provider too."""
        return await self._policy.reload("api", reset_availability=reset_availability)

    def reset_all(self) -> list[str]:
        """Every model back to available; returns those that were not."""
        recovered = self._availability.unavailable_models()
        self._availability.reset()
        return recovered

    def reset_model(self, model_id: str) -> list[str]:
        """`POST /models/{model}/reset`: heal one model and its provider; returns the models healthy
        again."""
        return self._availability.reset_model(model_id)


class Models:
    """The model registry as surfaces see it."""

    def __init__(self, core: Core) -> None:
        self._registry: ModelRegistry = core.registry
        self._availability = core.availability
        self._tools = core.tool_registry

    def prepare_adapters(self) -> None:
        """A client has come: import the configured providers' SDKs in the background now, so
        its first turn finds its adapter ready. An idle daemon never pays their memory. Once
        started (or over) this does nothing."""
        self._registry.warm_in_background()

    def describe(self) -> dict[str, Any]:
        """The `GET /models` body, with each model's health."""
        return self._registry.describe_models(self._availability)

    def resolve(self, reference: str) -> str | None:
        """A model id or alias → the canonical id (None if unknown)."""
        return self._registry.resolve(reference)

    def is_configured(self, model_id: str) -> bool:
        return self._registry.is_configured(model_id)

    def entries(self) -> list[ModelEntry]:
        return list(self._registry.models())

    def offered_tools(self) -> list[ToolDefinition]:
        """The daemon's enabled tools, as offered to a turn without a surface policy."""
        return list(self._tools.offered(None))


class Streams:
    """Live delivery of a session's ordered channel: bounded hub clients, single-use attach
    tokens, and the hand-off point where a new subscriber switches from the store to the queue."""

    def __init__(self, core: Core) -> None:
        self._hub = core.hub

    def attach(self, client: HubClient) -> None:
        """Start delivering the session's events to `client`."""
        self._hub.attach(client)

    def detach(self, client: HubClient) -> None:
        """Stop delivering to `client`."""
        self._hub.detach(client)

    def mint_token(self, session_id: str) -> tuple[str, float]:
        """A single-use attach token for the session, with its lifetime in seconds."""
        return self._hub.mint_token(session_id)

    def check_token(self, token: str | None, session_id: str) -> str:
        """Consume an attach token: 'ok', 'invalid' or 'wrong_session'."""
        return self._hub.check_token(token, session_id)

    def knows(self, session_id: str) -> bool:
        """Whether the hub already knows the session's latest event (else the surface seeds it with
        `note_event`)."""
        return self._hub.knows(session_id)

    def note_event(self, session_id: str, event_id: str, seq: int) -> None:
        """Seed the session's latest stored event, for a session this process has not seen emit yet."""
        self._hub.note_event(session_id, event_id, seq)

    def last_seq(self, session_id: str) -> int:
        return self._hub.last_seq(session_id)

    def handoff_point(
        self,
        client: HubClient,
        accept: Callable[[AnyEvent], bool] | None,
        unnamed_watermark: Callable[[], str],
    ) -> HandoffPoint:
        """The hand-off of a new subscriber, in one synchronous step: events after it arrive live,
        everything up to it is loaded from the store."""
        return self._hub.handoff_point(client, accept, unnamed_watermark)

    async def close_all(self, *, code: str, ws_code: int) -> None:
        """Close every live client in-band (shutdown)."""
        await self._hub.close_all(code=code, ws_code=ws_code)


class SystemInfo:
    """What `/health` and `/server/version` report about the running daemon."""

    def __init__(self, core: Core) -> None:
        self._core = core

    @property
    def started_at_us(self) -> int:
        return self._core.started_at_us

    @property
    def uptime_seconds(self) -> float:
        return self._core.uptime_seconds

    @property
    def shell_sandbox(self) -> str:
        """What contains shell commands: `bubblewrap` or `none` (`/health`, `/server/version`)."""
        return self._core.shell_sandbox_name

    @property
    def schema_version(self) -> int:
        return self._core.db.schema_version

    @property
    def start_up_digests(self) -> dict[str, str | None]:
        """The sha256 of each file read once at start-up, as it was read (None: the home held
        none), for a client to tell whether the file has changed since (`/server/version`)."""
        return dict(self._core.settings.start_up_digests)

    def active_turn_count(self) -> int:
        return self._core.active_turn_count()

    def active_session_count(self) -> int:
        return self._core.active_session_count()


class Application:
    """The daemon's core as the surfaces use it; built over a `Core` by the composition root
    (`metis/server/runner.py`, `metis/server/app.py`)."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self.settings: Settings = core.settings
        self.sessions: SessionService = core.sessions
        self.turns: TurnService = core.turns
        self.confirmations = Confirmations(core)
        self.history = History(core)
        self.routing = Routing(core)
        self.models = Models(core)
        self.streams = Streams(core)
        self.system = SystemInfo(core)
        self.mcp = core.mcp  # MCP servers (GET /mcp)

    @classmethod
    def build(cls, settings: Settings) -> Application:
        """An Application over a new Core built from the settings (not started)."""
        return cls(Core(settings))

    def extend_store(self, extension: StoreExtension, repository: Callable[[Database], R]) -> R:
        """Register a surface's tables (before `start`) and bind its repository, which reads
        through the database and writes in `Transaction`s (`tx.using(...)`)."""
        self._core.store.register(extension)
        return repository(self._core.db)

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Core start-up (store, recovery, routing); call before serving requests."""
        await self._core.start()

    async def shutdown(self) -> None:
        """Shutdown steps 2 and 3: running turns end with `turn.cancelled{server_shutdown}`,
        then every live client is closed (WebSocket 1001)."""
        await self._core.shutdown_turns()
        await self.streams.close_all(code="server_shutdown", ws_code=1001)

    async def stop(self) -> None:
        """Graceful shutdown's last step, after `shutdown`: close servers, writer, adapters and
        SQLite."""
        await self._core.stop()

    async def abort(self) -> None:
        """Past the shutdown grace: stop turn tasks and close what is left; start-up recovery
        repairs the rest."""
        await self._core.abort()

    async def flush(self) -> None:
        """Make every event emitted so far readable."""
        await self._core.flush()
