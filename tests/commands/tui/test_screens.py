"""The terminal app's screens, built outside a running app where they are pure rendering."""

from __future__ import annotations

from typing import Any

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
