"""A tool call whose arguments are not valid JSON, through the real daemon, the real SDK adapter
and the fake provider: the model is told its JSON was broken (not that every field is missing),
and the stored call can still be sent back to the provider."""

from __future__ import annotations

from pathlib import Path

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api
from tests.core.providers.test_provider_tool_calls import anthropic_call
from tests.e2e.test_provider_turns import session_on

WHY = "arguments were not valid JSON (EOF while parsing a string at line 1 column 33, 33 chars)"


async def test_broken_json_arguments_reach_the_model_as_broken_json(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, "anthropic")
    broken = FakeReply(raw_sse=anthropic_call('{"path": "a.txt", "content": "abc', "tool_use"))
    fake.enqueue("anthropic", broken, FakeReply.say("Let me fix that."))
    accepted, terminal = await api.run_turn(sid, "write a.txt")
    assert terminal["type"] == "turn.completed"
    assert not (workspace / "a.txt").exists()

    events = await api.turn_events(sid, accepted["turn_id"])
    [invalid] = [e["payload"] for e in events if e["type"] == "tool.input_invalid"]
    assert invalid["errors"] == [{"path": "$", "message": WHY}]
    messages = (await api.messages(sid))["messages"]
    [result] = [m["content"][0] for m in messages if m["role"] == "tool"]
    assert result["is_error"] and result["content"][0]["text"] == (
        f"Invalid input for write_file:\n- $: {WHY}"
    )

    # the call goes back to the provider as a JSON object, with why it did not run
    resent = fake.requests_for("anthropic")[1].body["messages"]
    call = resent[1]["content"][-1]
    assert call["type"] == "tool_use" and call["input"] == {"metis_unparsed_arguments": WHY}
    assert WHY in str(resent[2]["content"][0]["content"])
