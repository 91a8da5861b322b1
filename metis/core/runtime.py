"""Core: the daemon's components wired together, with start-up and shutdown in contract order.

Start-up: config (already loaded) → registry → SQLite → bus subscribers →
recovery → ready to bind. Shutdown: cancel turns → drain the bus → close adapters → close SQLite.
Surfaces receive a started Core and never construct components themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from metis.config import Settings, current_file_settings
from metis.core.canonical.times import now_us
from metis.core.confirmations import ConfirmationBroker
from metis.core.datamodel import build_deferred_models
from metis.core.events.bus import EventBus
from metis.core.events.catalog import SYSTEM_STREAM
from metis.core.events.costs import CostAccumulator
from metis.core.events.hub import SessionHub
from metis.core.events.writer import TraceWriter
from metis.core.models.registry import ModelRegistry, load_registry
from metis.core.routing.availability import Availability
from metis.core.routing.engine import RoutingEngine
from metis.core.routing.manager import PolicyManager
from metis.core.sessions.cache import SessionCache
from metis.core.sessions.history import HistoryWriter
from metis.core.sessions.instructions import InstructionsReader, SessionInstructions
from metis.core.sessions.service import SessionService
from metis.core.store.db import Database
from metis.core.store.store import Store
from metis.core.tools.bwrap import ShellSandbox, detect
from metis.core.tools.dispatcher import Dispatcher
from metis.core.tools.executor import ToolExecutor
from metis.core.tools.groups import ProcessGroupLedger
from metis.core.tools.mcp.manager import McpManager
from metis.core.tools.registry import ToolRegistry
from metis.core.tools.sandbox import MetisHome, Sandboxes
from metis.core.tools.settings import check_env_passthrough, limits_from_settings
from metis.core.turns.control import TurnControl
from metis.core.turns.recovery import fail_orphaned_turns, report_gaps, seed_from_store
from metis.core.turns.runner import TurnRun, TurnRunner
from metis.core.turns.service import TurnService
from metis.core.turns.slots import TurnSlots

log = logging.getLogger(__name__)


class Core:
    """The daemon's components, built once from the settings and shared by every surface; owns
    start-up and shutdown order."""

    def __init__(self, settings: Settings, *, registry: ModelRegistry | None = None) -> None:
        self.settings = settings
        # config → registry: an invalid models.yaml stops start-up here (ConfigError).
        self.registry = registry or load_registry(settings.models_path)
        self.db = Database(settings.db_path)
        self.store = Store(self.db)
        self.bus = EventBus(strict=settings.events.strict)
        self.costs = CostAccumulator()
        self.writer = TraceWriter(self.store.events, self.bus, settings.events)
        ws = settings.websocket
        self.hub = SessionHub(
            token_ttl_s=ws.attach_token_ttl_s,
            tokens_per_session=ws.attach_tokens_per_session_max,
            stall_timeout_s=ws.slow_client_timeout_s,
        )
        self.hub.hold_until_stored(self.writer)  # clients see only what a crash cannot take back
        self.event_store = self.store.events
        self.message_store = self.store.messages
        self.session_store = self.store.sessions
        self.slots = TurnSlots()
        self.availability = Availability(self.registry, emit_system_event=self.emit_system_event)
        self.policy = PolicyManager(
            self.registry,
            home=settings.home,
            shipped_path=settings.shipped_routing_path,
            emit_system_event=self.emit_system_event,
            availability=self.availability,
        )
        self.engine = RoutingEngine(
            self.registry,
            self.policy,
            self.availability,
            max_output_tokens_per_call=settings.limits.max_output_tokens_per_call,
        )
        tools = settings.tools
        # models.yaml is read once at start-up (never reloaded), so its key variables are fixed
        # for the daemon's life: refused in env_passthrough and stripped from every command.
        key_envs = [p.api_key_env for p in self.registry.providers() if p.api_key_env]
        check_env_passthrough(tools, key_envs)
        self.shell_sandbox = self._detect_shell_sandbox()
        self.tool_registry = ToolRegistry.with_builtins(tools, self.shell_sandbox)
        self.shell_groups = ProcessGroupLedger(settings.home / "run" / "shell-groups")
        self.broker = ConfirmationBroker(
            self.store, self.bus, timeout_s=tools.confirmation.timeout_seconds
        )
        self.session_cache = SessionCache(self.message_store)
        self.history = HistoryWriter(self.store, self.session_cache, self.writer.commit_with)
        # the daemon's own files: out of reach of workspaces, tools and instruction files
        metis_home = MetisHome.at(settings.home, settings.scratch_workspaces_path)
        self.sandboxes = Sandboxes(tools.sandbox.protected_dirs, metis_home)
        # AGENTS.md / CLAUDE.md per turn
        self.instructions = SessionInstructions(self.bus, InstructionsReader(metis_home=metis_home))
        self._model_builds: asyncio.Task[None] | None = None
        # called once the deferred models are built (`metis serve` freezes them then, as it does
        # the SDKs' types: `ModelRegistry.on_warm`)
        self.on_models_built: Callable[[], None] | None = None
        self.dispatcher = Dispatcher(
            store=self.store,
            bus=self.bus,
            broker=self.broker,
            registry=self.tool_registry,
            settings=tools,
            executor=ToolExecutor(
                tools,
                limits_from_settings(tools, key_envs),
                groups=self.shell_groups,
                shell_sandbox=self.shell_sandbox,
            ),
            history=self.history,
        )
        # MCP servers: their process groups share the shell's ledger (reaped at start-up)
        self.mcp = McpManager(
            settings.mcp,
            self.tool_registry,
            ledger=self.shell_groups,
            log_dir=settings.home / "logs" / "mcp",
            current=lambda: current_file_settings(settings).mcp,
        )
        # each service gets the collaborators it uses, nothing more (no service holds Core)
        control = TurnControl(self.slots, self.broker, self.dispatcher, self.store)
        self.sessions = SessionService(
            settings=settings,
            store=self.session_store,
            titles=self.store.titles,
            history=self.history,
            session_cache=self.session_cache,
            bus=self.bus,
            flush=self.writer.flush,
            costs=self.costs,
            broker=self.broker,
            clients=self.hub,
            registry=self.registry,
            control=control,
            policy=self.policy,
            engine=self.engine,
            metis_home=metis_home,
            # what a session that is over leaves behind in memory, dropped at its end
            forget_when_over=(
                self.session_cache.forget,
                self.costs.forget_session,
                self.broker.forget_session,
                self.dispatcher.forget_session,
                self.hub.forget,
                self.instructions.forget,
            ),
        )
        self.turns = TurnService(
            sessions=self.sessions,
            control=control,
            policy=self.policy,
            engine=self.engine,
            limits=settings.limits,
            store=self.store,
            registry=self.registry,
            session_cache=self.session_cache,
            history=self.history,
            dispatcher=self.dispatcher,
            costs=self.costs,
            bus=self.bus,
            broker=self.broker,
            flush=self.writer.flush,
            instructions=self.instructions,
            runner_for=self._runner_for,
        )
        self.started_at_us = 0
        self._started_monotonic = 0.0

    def _runner_for(self, run: TurnRun) -> TurnRunner:
        """The agent loop of one accepted turn, over the collaborators it calls."""
        return TurnRunner(
            run,
            limits=self.settings.limits,
            registry=self.registry,
            availability=self.availability,
            bus=self.bus,
            hub=self.hub,
            costs=self.costs,
            history=self.history,
            dispatcher=self.dispatcher,
            sandboxes=self.sandboxes,
            broker=self.broker,
            instructions=self.instructions,
            events=self.event_store,
            flush=self.writer.flush,
        )

    def _detect_shell_sandbox(self) -> ShellSandbox | None:
        """Once at start-up: bubblewrap for the shell, or one WARNING saying why not."""
        tools = self.settings.tools
        if "shell" not in tools.enabled:
            return None
        sandbox, why = detect(
            mode=tools.shell.sandbox,
            bwrap_path=tools.shell.bwrap_path,
            network=tools.shell.network,
            metis_home=str(self.settings.home),
        )
        if sandbox is None:
            log.warning(
                "shell commands run unsandboxed (%s): every shell call asks for confirmation",
                why,
            )
        return sandbox

    @property
    def shell_sandbox_name(self) -> str:
        """What contains shell commands: `bubblewrap` or `none` (`/health`, `/server/version`)."""
        return "none" if self.shell_sandbox is None else self.shell_sandbox.name

    def emit_system_event(self, event_type: str, payload: dict[str, Any]) -> None:
        """Daemon-level events (routing, purge) go to the `system` stream."""
        self.bus.emit(SYSTEM_STREAM, event_type, payload, actor="system")

    async def start(self) -> None:
        """Start-up in contract order: open the store, subscribe the writer, accumulator and hub,
        seed seqs and spend, repair what a crash left, load confirmations and the routing policy."""
        await self.store.open()
        self.bus.subscribe("trace-writer", self.writer)
        self.bus.subscribe("cost-accumulator", self.costs)
        self.bus.subscribe("session-hub", self.hub, transient=True)
        await seed_from_store(self.store, self.bus, self.costs)
        self.writer.start()
        await report_gaps(self.store, self.bus)
        await fail_orphaned_turns(self.store, self.bus, self.costs)
        self.shell_groups.reap()  # commands a crashed daemon left running
        await self.broker.load()
        await self.policy.start()
        self.policy.start_watcher()
        await self.writer.flush()
        await self.store.recover_extensions()  # a surface's own repairs, before requests
        self.started_at_us = now_us()
        self._started_monotonic = time.monotonic()
        log.info(
            "core started (database %s, schema v%d, %s)",
            self.db.path,
            self.db.schema_version,
            "offline: scripted model only" if self.registry.offline_mode else "models configured",
        )

    def start_background(self) -> None:
        """Once the daemon listens: what may take its time starts, never awaited: MCP servers,
        and building the pydantic models start-up did not need (core/datamodel.py)."""
        self.mcp.start()
        self._model_builds = asyncio.get_running_loop().create_task(
            self._build_models(), name="metis-build-deferred-models"
        )

    async def _build_models(self) -> None:
        await build_deferred_models()
        if self.on_models_built is not None:
            self.on_models_built()

    async def models_built(self) -> None:
        """Return once the background build of the deferred models is over."""
        if self._model_builds is not None:
            await asyncio.shield(self._model_builds)

    async def _stop_model_builds(self) -> None:
        if self._model_builds is not None and not self._model_builds.done():
            self._model_builds.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._model_builds

    async def shutdown_turns(self) -> None:
        """Shutdown step 2: running turns end with `turn.cancelled{server_shutdown}`."""
        await self.turns.cancel_all("server_shutdown")

    async def abort(self) -> None:
        """Past the shutdown grace: stop turn tasks and close what is left; recovery repairs the rest."""
        self.turns.abort_all()
        self.mcp.kill()
        await self._stop_model_builds()
        await self.policy.aclose()
        await self.registry.aclose()
        await self.db.close()

    async def stop(self) -> None:
        """Graceful shutdown after the turns ended: stop MCP servers and the policy watcher, drain
        the bus, flush and close the writer, adapters and SQLite."""
        await self.turns.wait_all()
        await self._stop_model_builds()
        await self.mcp.aclose()  # no turn uses the servers any more
        await self.policy.aclose()
        await self.bus.drain()
        await self.writer.close()
        await self.registry.aclose()
        await self.db.close()
        log.info("core stopped")

    async def flush(self) -> None:
        """Make every event emitted so far readable (read-your-writes for REST and replay)."""
        await self.writer.flush()

    @property
    def uptime_seconds(self) -> float:
        return time.monotonic() - self._started_monotonic

    def active_turn_count(self) -> int:
        return len(self.slots)

    def active_session_count(self) -> int:
        """Non-ended sessions with a turn holding the slot or at least one attached client."""
        return len({s.session_id for s in self.slots.all()} | self.hub.sessions_with_clients())
