"""AAP turns whose model call ends unusually, against the fake provider through the real SDK:

- a `max_tokens` reply leaves no unanswered `tool_use` in history (each gets a
  stored `Tool call cancelled`), so the next user turn is accepted; a call cut off by the limit
  is neither announced nor stored.
- once a resolution turn has run a granted tool,
  the model is locked; a provider failure then ends the turn instead of failing over.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.server.runner import Daemon
from metis.testing import FakeProviderServer, FakeReply
from tests.aap.client import WEATHER, AapClient, permission
from tests.aap.conftest import fake_models, roots
from tests.e2e.test_turn_endings import CUT_OFF_REPLIES

Fake = tuple[Daemon, AapClient, FakeProviderServer]
MODES = ("none", "delta", "message")
CANCELLED = "Tool call cancelled"


async def _events(daemon: Daemon, session_id: str) -> list[tuple[str, dict[str, Any]]]:
    await daemon.core.flush()
    rows = await daemon.core.db.fetchall(
        "SELECT type, payload_json FROM events WHERE session_id=? ORDER BY seq", (session_id,)
    )
    return [(r["type"], json.loads(r["payload_json"])) for r in rows]


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_call_in_a_max_tokens_reply_does_not_block_the_next_turn(
    fake_aap: Fake, mode: str
) -> None:
    _, aap, fake = fake_aap
    fake.enqueue(
        "anthropic",
        FakeReply.call("get_weather", {"location": "Paris"}, stop_reason="max_tokens"),
    )
    sid = await aap.create(client_tools=[WEATHER])
    reply = await aap.say(sid, "weather?", mode)
    assert reply.status == 200 and reply.stop == "max_tokens"
    [call] = reply.tool_calls()  # complete, so stored and announced
    assert call["name"] == "get_weather" and call["input"] == {"location": "Paris"}
    if reply.is_stream:
        assert reply.tool_results() == []  # a client call never gets a tool_result
    history = await aap.history(sid)
    assert history[-1] == {"role": "tool", "toolCallId": call["toolCallId"], "content": CANCELLED}
    assert history[-2]["role"] == "assistant"

    fake.enqueue("anthropic", FakeReply.say("Sorry, where was I?"))
    again = await aap.say(sid, "go on", mode)
    assert again.status == 200 and again.stop == "end_turn"


@pytest.mark.parametrize("mode", MODES)
async def test_a_call_cut_off_by_the_limit_is_not_announced(fake_aap: Fake, mode: str) -> None:
    _, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply(raw_sse=CUT_OFF_REPLIES["anthropic"]))
    sid = await aap.create(tools=[{"name": "read_file"}, {"name": "write_file"}])
    reply = await aap.say(sid, "read, then write", mode)
    assert reply.stop == "max_tokens"
    [call] = reply.tool_calls()
    assert call["name"] == "read_file"
    # the complete call is answered and reported like any server-side result
    assert reply.tool_results() == [{"toolCallId": call["toolCallId"], "content": CANCELLED}]
    history = await aap.history(sid)
    assert "write_file" not in json.dumps(history)
    assert [m["role"] for m in history] == ["user", "assistant", "tool"]
    assert (await aap.say(sid, "next")).status == 200


def _two_models(server: FakeProviderServer) -> str:
    """Two models on the fake provider: routing picks haiku and keeps sonnet as its fallback."""
    return fake_models(server) + (
        "  - id: anthropic:claude-sonnet-4-6\n"
        "    aliases: [sonnet]\n"
        "    capabilities: {max_context_tokens: 200000, max_output_tokens: 1024}\n"
        '    pricing: {input_per_mtok: "3", output_per_mtok: "15"}\n'
    )


ROUTING = "global_default: sonnet\nrules:\n  - name: prefer haiku\n    when: {}\n    use: haiku\n"


@pytest.mark.parametrize(
    ("granted", "stop", "models_called"),
    [
        (True, "error", ["claude-haiku-4-5"] * 3),  # list_dir ran: locked, the turn fails
        (False, "end_turn", ["claude-haiku-4-5"] * 3 + ["claude-sonnet-4-6"]),  # nothing ran
    ],
    ids=["granted_tool_ran", "denied_nothing_ran"],
)
async def test_a_resolution_turn_that_ran_a_tool_does_not_fail_over(
    api_key: str,
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    client_for: Callable[..., Any],
    workspace: Path,
    granted: bool,
    stop: str,
    models_called: list[str],
) -> None:
    daemon = await start_daemon(models=_two_models(fake), routing=ROUTING, **roots(workspace))
    aap = await client_for(daemon)
    sid = await aap.create(tools=[{"name": "list_dir"}])
    fake.enqueue("anthropic", FakeReply.call("list_dir", {}, match_model="claude-haiku-4-5"))
    first = await aap.say(sid, "look around", "delta")
    assert first.stop == "tool_use"
    [call] = first.tool_calls()
    decided = [p for t, p in await _events(daemon, sid) if t == "route.decided"]
    assert decided[0]["chosen_model"] == "anthropic:claude-haiku-4-5"
    assert decided[0]["fallbacks"] == ["anthropic:claude-sonnet-4-6"]

    fake.reset()
    fake.enqueue(
        "anthropic",
        FakeReply.fail(500, "api_error", retry_after=0, repeat=3, match_model="claude-haiku-4-5"),
        FakeReply.say("served by the fallback", match_model="claude-sonnet-4-6"),
    )
    second = await aap.turn(sid, [permission(call["toolCallId"], granted)], "delta")
    assert second.stop == stop
    assert [r.model for r in fake.requests_for("anthropic")] == models_called

    events = await _events(daemon, sid)
    turn_start = max(i for i, (t, _) in enumerate(events) if t == "turn.started")
    kinds = [t for t, _ in events[turn_start:]]
    assert kinds.count("route.decided") == 1
    if granted:
        assert kinds.index("tool.called") < kinds.index("llm.call_started")
        assert kinds[-1] == "turn.failed"
        terminal = events[-1][1]
        assert terminal["reason"] == "provider_error"
        assert terminal["error_class"] == "server_error"
        assert "served by the fallback" not in json.dumps(await aap.history(sid))
    else:
        assert "tool.called" not in kinds and kinds[-1] == "turn.completed"
