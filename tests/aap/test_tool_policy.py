"""Tool policy edges of the suspend path:
disabled and unknown tools, a configured deny, a grant for a tool disabled meanwhile, a cancel
while calls are parked, and compaction of the context view."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from metis.core.turns.context import OMITTED_RESULT
from metis.server.runner import Daemon
from metis.testing import FakeProviderServer, FakeReply
from tests.aap.client import WEATHER, AapClient, permission, tool_result
from tests.aap.conftest import fake_models, roots
from tests.api import Api

Fake = tuple[Daemon, AapClient, FakeProviderServer]


async def test_disabled_and_unknown_tools_are_answered_inline(
    fake_aap: Fake, workspace: Path
) -> None:
    _daemon, aap, fake = fake_aap
    fake.enqueue(
        "anthropic",
        FakeReply.call(
            "shell",
            {"command": "touch ran.txt"},
            more_calls=[{"name": "teleport", "input": {}}],
        ),
    )
    sid = await aap.create(tools=[{"name": "list_dir", "trust": True}])
    reply = await aap.say(sid, "go", "delta")
    assert reply.stop == "end_turn"
    offered = [t["name"] for t in fake.requests_for("anthropic")[0].body["tools"]]
    assert offered == ["list_dir"]  # not listed → not offered
    results = {r["toolCallId"]: r["content"] for r in reply.data("tool_result")}
    calls = {c["name"]: c["toolCallId"] for c in reply.data("tool_call")}
    assert results[calls["shell"]].startswith('Unknown tool "shell"')
    assert results[calls["teleport"]].startswith('Unknown tool "teleport"')
    assert not (workspace / "ran.txt").exists()


async def test_a_configured_deny_beats_trust(
    api_key: str, start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    daemon = await start_daemon(
        config="tools:\n  confirmation:\n    per_tool: {list_dir: deny}\n", **roots(workspace)
    )
    aap = await client_for(daemon)
    sid = await aap.create(tools=[{"name": "list_dir", "trust": True}])
    reply = await aap.say(sid, "use server tool", "message")
    assert reply.stop == "end_turn"
    [result] = reply.data("tool_result")
    assert "disabled by the local tool policy" in result["content"]


async def test_a_grant_for_a_tool_disabled_meanwhile_is_stored_as_denied(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    _, aap = daemon_and_aap
    sid = await aap.create(tools=[{"name": "list_dir"}])
    [call] = (await aap.say(sid, "use server tool")).tool_calls()
    reply = await aap.turn(
        sid, [permission(call["toolCallId"], True)], "delta", agent={"tools": []}
    )
    assert reply.stop == "end_turn"
    expected = "Tool call denied: tool list_dir is not enabled"
    assert reply.data("tool_result") == [{"toolCallId": call["toolCallId"], "content": expected}]


async def test_a_cancel_leaves_no_call_pending(fake_aap: Fake) -> None:
    _daemon, aap, fake = fake_aap
    fake.enqueue(
        "anthropic",
        FakeReply.call(
            "shell", {"command": "sleep 5"}, more_calls=[{"name": "list_dir", "input": {}}]
        ),
    )
    sid = await aap.create(
        tools=[{"name": "shell", "trust": True}, {"name": "list_dir"}], client_tools=[WEATHER]
    )
    api = Api(aap.http, aap.auth())

    async def cancel_when_running() -> None:
        for _ in range(200):
            _status, session = await api.call("GET", f"/sessions/{sid}")
            if session["pending_confirmations"]:
                break
            await asyncio.sleep(0.02)
        await api.call("POST", f"/sessions/{sid}/turns/{session['current_turn_id']}/cancel")

    reply, _ = await asyncio.gather(aap.say(sid, "go", "delta"), cancel_when_running())
    assert reply.stop == "error"
    calls = {c["name"]: c["toolCallId"] for c in reply.data("tool_call")}
    results = {r["toolCallId"]: r["content"] for r in reply.data("tool_result")}
    assert results[calls["list_dir"]] == "Tool call cancelled"
    assert results[calls["shell"]].startswith("Tool call cancelled")
    history = await aap.history(sid)
    for call_id in calls.values():
        assert sum(m.get("toolCallId") == call_id for m in history) == 1
    assert (await aap.say(sid, "next")).status == 200  # nothing pending any more


async def test_compacted_history_is_the_context_the_model_is_sent(
    api_key: str, fake: FakeProviderServer, start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    # Routing admits the turn (its estimate fits), but the runner's context also carries the
    # workspace listing, which no longer fits: the old tool result gets compacted away.
    for i in range(40):
        (workspace / f"file_{i:02d}_with_a_rather_long_name.txt").write_text("")
    daemon = await start_daemon(models=fake_models(fake, context=2100), **roots(workspace))
    aap = await client_for(daemon)
    long_result = "X" * 3000
    seed = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "toolCallId": "c1", "name": "get_weather", "input": {}}
            ],
        },
        {"role": "tool", "toolCallId": "c1", "content": long_result},
        {"role": "assistant", "content": "It is X."},
    ]
    sid = await aap.create(messages=seed, client_tools=[WEATHER])
    fake.enqueue("anthropic", FakeReply.call("get_weather", {"location": "here"}))
    first = await aap.say(sid, "again please")
    assert first.stop == "tool_use"
    [call] = first.tool_calls()
    full = await aap.history(sid, "full")
    compacted = await aap.history(sid, "compacted")
    assert compacted != full and len(compacted) == len(full)
    assert compacted[2] == {"role": "tool", "toolCallId": "c1", "content": OMITTED_RESULT}
    assert compacted[-1]["content"][-1]["toolCallId"] == call["toolCallId"]  # pending kept
    sent = json.dumps(fake.requests_for("anthropic")[0].body)
    assert OMITTED_RESULT in sent and long_result not in sent
    fake.enqueue("anthropic", FakeReply.say("done"))
    answered = await aap.turn(sid, [tool_result(call["toolCallId"], "mild")])
    assert answered.stop == "end_turn"
    sent = json.dumps(fake.requests_for("anthropic")[-1].body)
    assert OMITTED_RESULT in sent and "mild" in sent and long_result not in sent


async def test_compacted_history_counts_the_project_instructions_the_model_is_sent(
    api_key: str, fake: FakeProviderServer, start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    # The workspace's AGENTS.md goes into the system prompt; with it the context no longer fits,
    # and the compacted view says so as the request does.
    (workspace / "AGENTS.md").write_text("Answer in one short sentence. " * 50)
    daemon = await start_daemon(models=fake_models(fake, context=2100), **roots(workspace))
    aap = await client_for(daemon)
    seed = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "toolCallId": "c1", "name": "get_weather", "input": {}}
            ],
        },
        {"role": "tool", "toolCallId": "c1", "content": "X" * 3000},
        {"role": "assistant", "content": "It is X."},
    ]
    sid = await aap.create(messages=seed, client_tools=[WEATHER])
    fake.enqueue("anthropic", FakeReply.say("Still X."))
    assert (await aap.say(sid, "again please")).stop == "end_turn"
    sent = json.dumps(fake.requests_for("anthropic")[0].body)
    assert "Answer in one short sentence." in sent and OMITTED_RESULT in sent
    compacted = await aap.history(sid, "compacted")
    assert compacted[2] == {"role": "tool", "toolCallId": "c1", "content": OMITTED_RESULT}
