"""The in-memory live session: routing facts kept up to date as messages are committed."""

from __future__ import annotations

from metis.core.canonical.content import TextBlock, ToolUseBlock
from metis.core.sessions.cache import CachedSession
from tests.core.providers.provider_kit import msg as _msg


def test_tool_calls_in_history_are_noticed_when_appended_later() -> None:
    live = CachedSession("s", [_msg("user", TextBlock(text="hi"))])
    assert not live.has_tool_calls()
    live.history.append(_msg("assistant", TextBlock(text="hello")))
    assert not live.has_tool_calls()
    live.history.append(_msg("assistant", ToolUseBlock(id="tu_1", name="read", input={})))
    assert live.has_tool_calls()
    assert live.has_tool_calls()
