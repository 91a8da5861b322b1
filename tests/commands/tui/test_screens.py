"""The terminal app's screens, built outside a running app where they are pure rendering."""

from __future__ import annotations

import asyncio
from typing import Any

from textual.app import App
from textual.widgets._toast import Toast

from metis.commands.client import ApiFailure
from metis.commands.tui.screens import SessionPicker


async def _no_search(_: str) -> list[dict[str, Any]]:
    return []


def test_the_session_picker_names_a_sessions_waiting_calls_before_its_title() -> None:
    listed = [
        {"id": "sess_a", "title": "Fix the flaky test", "pending_confirmation_count": 2},
        {"id": "sess_b", "title": "Refactor the parser", "pending_confirmation_count": 0},
    ]
    waiting, idle = SessionPicker(listed, "sess_b", _no_search)._options()
    assert waiting.prompt.renderables[0].plain == "  2 to confirm · Fix the flaky test"
    assert idle.prompt.renderables[0].plain == "● Refactor the parser"


async def test_a_failed_search_is_said_as_written_never_read_as_markup() -> None:
    """The daemon's refusal can quote what was typed: `[/]` in it stopped the app (Textual
    read the notification as markup, and a tag closing nothing is an error)."""

    async def refused(_: str) -> list[dict[str, Any]]:
        body = {"error": {"code": "invalid_query", "message": "cannot search for [/] or [b]x"}}
        raise ApiFailure(400, body)

    app = App[None]()
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await app.push_screen(SessionPicker([{"id": "sess_a", "title": "t"}], None, refused))
        await pilot.press("x")
        async with asyncio.timeout(5):
            while not app.screen.query(Toast):
                await pilot.pause(0.05)
        [toast] = app.screen.query(Toast)
        assert "cannot search for [/] or [b]x" in str(toast.render())
        assert app.is_running
