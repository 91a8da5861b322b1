"""AAP v1 at /aap/v1 and interop with v3 on the same sessions."""

from __future__ import annotations

from typing import Any

import pytest

from metis.server.runner import Daemon
from tests.aap.client import AapClient, check_stream, permission

WEATHER_V1 = {
    "name": "get_weather",
    "description": "Get current weather for a location",
    "inputSchema": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}


def _put_body(aap: AapClient, messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "agent": {"name": "metis", "options": {"workspace": aap.workspace}},
        "messages": messages,
        **extra,
    }


async def test_put_session_none_creates_and_runs(aap: AapClient) -> None:
    messages = [
        {"role": "user", "content": "What's the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Thanks"},
    ]
    reply = await aap.v1.request("PUT", "/session", _put_body(aap, messages))
    assert reply.status == 201
    sid = reply.body["sessionId"]
    assert reply.body["stopReason"] == "end_turn"
    assert reply.body["messages"] == [{"role": "assistant", "content": 'You said: "Thanks"'}]
    session = await aap.v1.request("GET", f"/session/{sid}")
    assert session.status == 200
    assert session.body["history"]["full"][:3] == messages
    assert session.body["history"]["compacted"] == session.body["history"]["full"]


@pytest.mark.parametrize("mode", ["delta", "message"])
async def test_put_session_stream_starts_with_session_start(aap: AapClient, mode: str) -> None:
    reply = await aap.v1.request(
        "PUT", "/session", _put_body(aap, [{"role": "user", "content": "hi"}], stream=mode)
    )
    check_stream(reply, mode, session_start=True)
    sid = reply.data("session_start")[0]["sessionId"]
    assert reply.names[:2] == ["session_start", "turn_start"]
    assert (await aap.request("GET", f"/sessions/{sid}")).status == 200


async def test_put_session_needs_a_final_user_message_and_leaves_nothing(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    daemon, aap = daemon_and_aap
    before = await daemon.core.db.fetchone("SELECT COUNT(*) FROM sessions")
    for messages in (
        [],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    ):
        reply = await aap.v1.request("PUT", "/session", _put_body(aap, messages))
        assert reply.status == 400 and reply.error == "invalid_seed"
    bad_content = await aap.v1.request(
        "PUT", "/session", _put_body(aap, [{"role": "user", "content": ""}])
    )
    assert bad_content.status == 400 and bad_content.error == "invalid_content"
    after = await daemon.core.db.fetchone("SELECT COUNT(*) FROM sessions")
    assert tuple(before) == tuple(after)


async def test_v1_client_tool_round_trip_with_input_schema(aap: AapClient) -> None:
    reply = await aap.v1.request(
        "PUT",
        "/session",
        _put_body(aap, [{"role": "user", "content": "use tool"}], tools=[WEATHER_V1]),
    )
    assert reply.status == 201 and reply.body["stopReason"] == "tool_use"
    sid = reply.body["sessionId"]
    [call] = [b for b in reply.body["messages"][0]["content"] if b["type"] == "tool_use"]
    answer = await aap.v1.turn(
        sid, [{"role": "tool", "toolCallId": call["toolCallId"], "content": "warm"}], "delta"
    )
    assert answer.stop == "end_turn"
    session = await aap.v1.request("GET", f"/session/{sid}")
    assert session.body["tools"] == [WEATHER_V1]
    named = await aap.v1.request(
        "PUT",
        "/session",
        _put_body(
            aap,
            [{"role": "user", "content": "x"}],
            tools=[{"name": "t", "description": "d", "parameters": {"type": "object"}}],
        ),
    )
    assert named.status == 400 and named.error == "validation_error"
    assert named.body["error"]["details"]["errors"][0]["loc"][-1] == "inputSchema"


async def test_one_session_through_both_versions(aap: AapClient) -> None:
    sid = await aap.create(tools=[{"name": "list_dir"}])
    first = await aap.v1.turn(sid, [{"role": "user", "content": "use server tool"}], "message")
    assert first.stop == "tool_use"
    [call] = first.tool_calls()
    second = await aap.turn(sid, [permission(call["toolCallId"], True)], "delta")
    assert second.stop == "end_turn" and second.data("tool_result")
    v1_session = await aap.v1.request("GET", f"/session/{sid}")
    assert v1_session.body["history"]["full"] == await aap.history(sid)
    assert (await aap.request("GET", "/sessions")).body["sessions"][0]["sessionId"] == sid
    assert (await aap.v1.request("GET", "/sessions")).body["sessions"][0] == sid
    assert (await aap.v1.request("DELETE", f"/session/{sid}")).status == 204
    assert (await aap.request("GET", f"/sessions/{sid}")).status == 404
    assert (await aap.v1.request("GET", f"/sessions/{sid}/history?type=full")).status == 404
