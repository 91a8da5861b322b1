"""The dispatcher's backstop guards on a turn's application tools.

The surfaces refuse bad declarations first (AAP answers `invalid_tools`); these guards make the
same mistakes impossible at the point where a turn's tools are assembled and dispatched.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from metis.config import EventsSettings
from metis.core.canonical.tools import ToolDefinition
from metis.core.confirmations import ConfirmationBroker
from metis.core.events.bus import EventBus
from metis.core.events.writer import TraceWriter
from metis.core.sessions.cache import SessionCache
from metis.core.sessions.history import HistoryWriter
from metis.core.store.db import Database
from metis.core.store.store import Store
from metis.core.tools.base import ToolNameConflict
from metis.core.tools.dispatcher import Dispatcher, TurnTools
from metis.core.tools.policy import SurfaceToolPolicy
from metis.core.tools.registry import ToolRegistry
from metis.core.tools.sandbox import Sandbox
from metis.core.tools.settings import ToolsSettings

ASK_USER = ToolDefinition(
    name="ask_user",
    description="Ask the user a question",
    input_schema={"type": "object", "properties": {"question": {"type": "string"}}},
    origin="application",
)


def application(name: str) -> ToolDefinition:
    return ASK_USER.model_copy(update={"name": name})


@pytest.fixture
def dispatcher(tmp_path: Path) -> Dispatcher:
    """Nothing here is dispatched, so the database is never opened."""
    settings = ToolsSettings()
    store, bus = Store(Database(tmp_path / "metis.db")), EventBus()
    return Dispatcher(
        store=store,
        bus=bus,
        broker=ConfirmationBroker(store, bus),
        registry=ToolRegistry.with_builtins(settings),
        settings=settings,
        history=HistoryWriter(
            store,
            SessionCache(store.messages),
            TraceWriter(store.events, bus, EventsSettings()).commit_with,
        ),
    )


def test_offered_lists_enabled_builtins_then_application_tools(dispatcher: Dispatcher) -> None:
    surface = SurfaceToolPolicy(enabled=frozenset({"read_file"}))
    offered = dispatcher.offered(surface, [ASK_USER], confirmation_policy="suspend")
    assert [t.name for t in offered] == ["read_file", "ask_user"]


def test_application_tool_named_like_an_enabled_builtin_is_a_conflict(
    dispatcher: Dispatcher,
) -> None:
    with pytest.raises(ToolNameConflict) as info:
        dispatcher.offered(None, [ASK_USER, application("shell")])
    assert info.value.name == "shell"
    # A builtin the session does not enable leaves its name free.
    surface = SurfaceToolPolicy(enabled=frozenset({"read_file"}))
    assert [t.name for t in dispatcher.offered(surface, [application("shell")])] == [
        "read_file",
        "shell",
    ]


def test_application_tools_in_a_wait_turn_are_a_programming_error(
    dispatcher: Dispatcher, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="ask_user"):
        dispatcher.offered(None, [ASK_USER], confirmation_policy="wait")
    assert dispatcher.offered(None, [], confirmation_policy="wait")
    with pytest.raises(ValueError, match="ask_user"):
        TurnTools(
            session_id="sess",
            turn_id="turn",
            workspace=str(tmp_path),
            sandbox=Sandbox(tmp_path, (".git",)),
            confirmation_policy="wait",
            cancel=asyncio.Event(),
            application_tools={"ask_user": ASK_USER},
        )
