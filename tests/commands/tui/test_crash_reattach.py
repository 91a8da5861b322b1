"""`metis chat` when the daemon under it is killed (SIGKILL) while a tool runs: a real
`metis serve` subprocess, then a daemon started again on the same home and port, whose recovery
ends the turn and stores the tool's interrupted result. The app, re-attached by itself, must not
leave the card saying the call still runs."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from metis.commands.tui.app import ChatApp
from metis.commands.tui.widgets import ToolCard
from metis.config import load_settings
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from metis.testing.serving import wait_until_serving
from tests.api import home_headers
from tests.commands.tui.test_app import attached, notes, send, until
from tests.e2e.test_provider_turns import MODEL_OF, serve_auto_tools


@contextlib.asynccontextmanager
async def chat_under_a_killed_daemon(
    fake: FakeProviderServer, metis_home: Path, workspace: Path, tmp_path: Path
) -> AsyncIterator[tuple[ChatApp, Any, str, int]]:
    """`metis chat` on a real `metis serve` killed (SIGKILL) while its turn's shell tool runs:
    (the app, its pilot, the daemon's URL and port) once the app has lost the stream."""
    proc, port = await serve_auto_tools(fake, metis_home, tmp_path / "serve.log")
    url = f"http://127.0.0.1:{port}"
    fake.enqueue(
        "anthropic", FakeReply.call("shell", {"command": "sleep 30", "timeout_seconds": 60})
    )
    try:
        async with aiohttp.ClientSession(base_url=url) as http:
            await wait_until_serving(http, "/health")
        app = ChatApp(
            url,
            home_headers(metis_home),
            workspace=str(workspace),
            home=metis_home,
            model=MODEL_OF["anthropic"],
        )
        async with attached(app) as pilot:
            send(app, "run the slow command")
            await until(lambda: [c.state for c in app.query(ToolCard)] == ["running"], timeout=30)
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
            await until(lambda: not app.stream.connected)
            yield app, pilot, url, port
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_tool_running_when_the_daemon_is_killed_reads_interrupted_after_reattaching(
    fake: FakeProviderServer,
    metis_home: Path,
    workspace: Path,
    tmp_path: Path,
) -> None:
    restarted: list[Daemon] = []
    try:
        async with chat_under_a_killed_daemon(fake, metis_home, workspace, tmp_path) as (
            app,
            _,
            url,
            port,
        ):
            # its recovery fails the turn and stores the tool's interrupted result
            again = Daemon(load_settings(home=metis_home, port=port))
            await again.start()
            restarted.append(again)
            await until(lambda: app.stream.connected and app.turn.id is None, timeout=20)
            [card] = app.query(ToolCard)
            await until(lambda: card.result is not None)
            assert card.state == "interrupted", card.state
            assert "metis stopped before the tool finished" in (card.result or "")
            await until(lambda: "turn failed: metis stopped" in notes(app))  # replayed
            session_id = app.session_id
        # opened again later, the session reads the same
        resumed = ChatApp(
            url,
            home_headers(metis_home),
            workspace=str(workspace),
            home=metis_home,
            session_id=session_id,
        )
        async with attached(resumed):
            await until(lambda: len(resumed.query(ToolCard)) == 1)
            [card] = resumed.query(ToolCard)
            await until(lambda: card.result is not None)
            assert card.state == "interrupted", card.state
    finally:
        for d in restarted:
            await d.stop()


async def test_with_the_daemon_killed_mid_turn_a_second_ctrl_c_quits(
    fake: FakeProviderServer,
    metis_home: Path,
    workspace: Path,
    tmp_path: Path,
) -> None:
    """The daemon is killed and stays down while a turn runs: the first Ctrl-C's cancel cannot
    be sent (said), the second quits, and the farewell does not claim the turn still runs."""
    async with chat_under_a_killed_daemon(fake, metis_home, workspace, tmp_path) as (
        app,
        pilot,
        _,
        _,
    ):
        await pilot.press("ctrl+c")
        await until(lambda: "could not cancel the turn: cannot reach the daemon" in notes(app))
        assert app.is_running and app.turn.id is not None
        await pilot.press("ctrl+c")
        await until(lambda: app.return_value is not None)
    assert app.farewell() == (
        f"`metis chat --session {app.session_id}` continues this session "
        "(its turn was running when the connection to the daemon was lost)"
    )
