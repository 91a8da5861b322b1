"""Turn facts the AAP façade gives routing on the real daemon."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.aap.client import WEATHER, tool_result
from tests.aap.conftest import roots
from tests.api import api_session

RESUMING_RULE = """
schema_version: 1
rules:
  - name: resuming
    when: {tool_use_in_progress: true}
    use: local:scripted
"""


async def test_a_turn_resuming_tool_calls_has_tool_use_in_progress(
    start_daemon: Callable[..., Any], client_for: Callable[..., Any], workspace: Path
) -> None:
    """The turn that carries the results of the last assistant message's tool calls matches
    `tool_use_in_progress: true`; the turn that made the calls does not."""
    daemon = await start_daemon(routing=RESUMING_RULE, **roots(workspace))
    aap = await client_for(daemon)
    sid = await aap.create(client_tools=[WEATHER])
    first = await aap.say(sid, "please use tool", "none")
    [call] = first.tool_calls()
    second = await aap.turn(sid, [tool_result(call["toolCallId"], "rain")], "none")
    assert second.stop == "end_turn"
    async with (
        api_session(daemon) as http,
        http.get(f"/sessions/{sid}/events", params={"event_types": "route.decided"}) as r,
    ):
        decided = [e["payload"] for e in (await r.json())["events"]]
    winners = [d["chain"][d["winner_index"]]["rule_name"] for d in decided]
    assert winners == [None, "resuming"]
