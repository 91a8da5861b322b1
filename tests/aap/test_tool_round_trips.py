"""Plain turns and every tool round trip, in all three response modes.

The offline scripted model drives the turns: "use tool" calls the first client tool (else the
first server tool), "use server tool" the first server tool, "use all tools" every offered tool.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from metis.server.runner import Daemon
from tests.aap.client import WEATHER, AapClient, permission, tool_result

MODES = ("none", "delta", "message")
pytestmark = pytest.mark.parametrize("mode", MODES)


def assistant_texts(history: list[dict]) -> list[str]:
    out = []
    for m in history:
        if m["role"] == "assistant":
            content = m["content"]
            out.append(
                content
                if isinstance(content, str)
                else "".join(b["text"] for b in content if b["type"] == "text")
            )
    return out


def tool_messages(history: list[dict], call_id: str) -> list[dict]:
    return [m for m in history if m["role"] == "tool" and m["toolCallId"] == call_id]


async def test_plain_turn_ends_turn_and_matches_history(aap: AapClient, mode: str) -> None:
    sid = await aap.create()
    reply = await aap.say(sid, "hello there", mode)
    assert reply.status == 200 and reply.stop == "end_turn"
    if mode == "none":
        assert reply.headers["Content-Type"].startswith("application/json")
        assert reply.body["messages"] == [
            {"role": "assistant", "content": 'You said: "hello there"'}
        ]
    else:
        assert reply.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        assert reply.headers["Cache-Control"] == "no-cache"
    history = await aap.history(sid)
    assert history[0] == {"role": "user", "content": "hello there"}
    assert assistant_texts(history) == [reply.text()] == ['You said: "hello there"']


async def test_client_tool_round_trip(aap: AapClient, mode: str) -> None:
    sid = await aap.create(client_tools=[WEATHER])
    first = await aap.say(sid, "please use tool", mode)
    assert first.stop == "tool_use"
    [call] = first.tool_calls()
    assert call["name"] == "get_weather" and call["input"] == {"location": "conformance"}
    assert first.tool_results() == []  # client calls never get a tool_result
    for kind in ("full", "compacted"):  # the pending call is visible in both histories
        history = await aap.history(sid, kind)
        assert history[-1]["content"][-1]["toolCallId"] == call["toolCallId"]
    second = await aap.turn(sid, [tool_result(call["toolCallId"], "Tokyo: 18°C")], mode)
    assert second.stop == "end_turn"
    assert second.tool_results() == []
    assert "get_weather (ok): Tokyo: 18°C" in second.text()
    history = await aap.history(sid)
    results = tool_messages(history, call["toolCallId"])
    assert results == [{"role": "tool", "toolCallId": call["toolCallId"], "content": "Tokyo: 18°C"}]
    index = history.index(results[0])
    assert history[index - 1]["role"] == "assistant"  # stored right after its tool_use


async def test_untrusted_server_tool_runs_only_after_the_grant(
    daemon_and_aap: tuple[Daemon, AapClient], mode: str
) -> None:
    daemon, aap = daemon_and_aap
    sid = await aap.create(tools=[{"name": "list_dir"}])
    first = await aap.say(sid, "please use server tool", mode)
    assert first.stop == "tool_use" and first.tool_results() == []
    [call] = first.tool_calls()
    assert call["name"] == "list_dir"
    row = await daemon.core.db.fetchone(
        "SELECT status FROM tool_calls WHERE id=?", (call["toolCallId"],)
    )
    assert row["status"] == "awaiting_confirmation"  # not executed before the grant
    second = await aap.turn(sid, [permission(call["toolCallId"], True)], mode)
    assert second.stop == "end_turn"
    [result] = second.tool_results()
    assert result["toolCallId"] == call["toolCallId"] and "README.md" in result["content"]
    history = await aap.history(sid)
    assert len(tool_messages(history, call["toolCallId"])) == 1
    assert not any(m["role"] == "tool_permission" for m in history)


@pytest.mark.parametrize("reason", [None, "", "not now"])
async def test_denied_server_tool_stores_the_exact_denial(
    aap: AapClient, workspace: Path, mode: str, reason: str | None
) -> None:
    sid = await aap.create(tools=[{"name": "write_file", "trust": False}])
    first = await aap.say(sid, "use server tool", mode)
    [call] = first.tool_calls()
    second = await aap.turn(sid, [permission(call["toolCallId"], False, reason)], mode)
    expected = "Tool call denied: not now" if reason else "Tool call denied"
    assert second.stop == "end_turn"
    assert second.tool_results() == [{"toolCallId": call["toolCallId"], "content": expected}]
    history = await aap.history(sid)
    assert tool_messages(history, call["toolCallId"]) == [
        {"role": "tool", "toolCallId": call["toolCallId"], "content": expected}
    ]


async def test_trusted_tool_runs_inline_without_a_stop(aap: AapClient, mode: str) -> None:
    sid = await aap.create(tools=[{"name": "list_dir", "trust": True}])
    reply = await aap.say(sid, "use server tool", mode)
    assert reply.stop == "end_turn"
    [call] = reply.tool_calls()
    [result] = reply.tool_results()
    assert result["toolCallId"] == call["toolCallId"] and "README.md" in result["content"]
    if reply.is_stream:
        names = reply.names
        assert names.index("tool_call") < names.index("tool_result")
    history = await aap.history(sid)
    assert len(tool_messages(history, call["toolCallId"])) == 1


async def test_parallel_calls_one_step_answered_together(aap: AapClient, mode: str) -> None:
    sid = await aap.create(
        tools=[{"name": "read_file", "trust": True}, {"name": "list_dir"}],
        client_tools=[WEATHER],
    )
    first = await aap.say(sid, "use all tools", mode)
    assert first.stop == "tool_use"
    calls = {c["name"]: c["toolCallId"] for c in first.tool_calls()}
    assert set(calls) == {"read_file", "list_dir", "get_weather"}
    # the trusted call was reported inline; the two others wait for this one request
    assert [r["toolCallId"] for r in first.tool_results()] == [calls["read_file"]]
    second = await aap.turn(
        sid,
        [permission(calls["list_dir"], True), tool_result(calls["get_weather"], "rain")],
        mode,
    )
    assert second.stop == "end_turn"
    assert [r["toolCallId"] for r in second.tool_results()] == [calls["list_dir"]]
    history = await aap.history(sid)
    for call_id in calls.values():
        assert len(tool_messages(history, call_id)) == 1
