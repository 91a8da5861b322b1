"""`metis chat` when the daemon takes calls but never answers them (a stopped process, a stuck
one): each call gives up after the call timeout, made short here, and says so in a note; the
typed draft stays, and the keys work while a call waits. A loopback server that accepts and
never answers stands in for the daemon (or for it once the app is attached)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from metis.commands.daemon_client import resolve_daemon
from metis.commands.tui.app import ChatApp, finish
from metis.commands.tui.widgets import UserMessage
from metis.server.runner import Daemon
from tests.api import Api
from tests.commands.tui.test_app import SIZE, attached, make_app, notes, type_text, until


@asynccontextmanager
async def silent_daemon() -> AsyncIterator[str]:
    """The URL of a server that accepts connections and reads requests, never answering."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up and closes
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


def waiting(app: ChatApp) -> bool:
    """A typed line is still being handled (its call waits for the daemon)."""
    return any(w.is_running for w in app.workers if w.group == "input")


async def test_a_daemon_that_never_answers_at_start_up_is_said_and_the_app_exits_1(
    workspace: Path,
) -> None:
    target = resolve_daemon()
    async with silent_daemon() as url:
        app = ChatApp(
            url, target.headers(), workspace=str(workspace), home=target.home, call_timeout_s=0.3
        )
        async with app.run_test(size=SIZE) as pilot:
            assert app.status.fields["connection"] == "connecting to the daemon…"
            await until(lambda: app.prompt.disabled)
            assert f"the daemon at {url} did not answer within 0.3 s" in notes(app)
            assert app.start_failure is not None and app.session_id is None
            await pilot.press("ctrl+c")  # once: there is nothing to lose
        assert app.return_value == 1 and finish(app) == 1
        # while it waits (the full timeout), the screen is drawn and Ctrl-Q leaves at once
        patient = ChatApp(url, target.headers(), workspace=str(workspace), home=target.home)
        async with patient.run_test(size=SIZE) as pilot:
            await pilot.pause(0.1)
            assert waiting(patient)
            await pilot.press("ctrl+q")
        assert patient.return_value == 0 and patient.start_failure is None


async def test_a_message_the_daemon_does_not_answer_keeps_its_draft_and_the_keys_work(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    d = await start_daemon()
    _, session = await api_of(d).call("POST", "/sessions", {"workspace_path": str(workspace)})
    async with silent_daemon() as url:
        app = make_app(d, workspace, session_id=session["id"], call_timeout_s=1.0)
        async with attached(app) as pilot:
            app.api.url = url  # the daemon stops answering REST
            await type_text(pilot, app, "my precious draft")
            assert waiting(app) and app.query(UserMessage)  # shown while it is being sent
            await pilot.press("!")  # a key is handled while the send waits
            await until(lambda: "not sent" in notes(app))
            assert f"not sent: the daemon at {url} did not answer within 1 s" in notes(app)
            assert app.prompt.text == "my precious draft!"  # the draft stays, as edited
            assert not app.query(UserMessage)
            await type_text(pilot, app, "/title stuck")
            assert waiting(app)
            asked = time.monotonic()
            await pilot.press("ctrl+q")  # leaves while the call waits, not after
            await until(lambda: app.return_value is not None)
            assert time.monotonic() - asked < 1.0
        assert app.return_value == 0
