"""The façade over the same core: live on the metis WebSocket, suspended calls surviving a
restart, and the layering rule."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import metis.core
from metis.server.runner import Daemon
from tests.aap.client import WEATHER, AapClient, permission, tool_result
from tests.aap.conftest import roots
from tests.api import Api, api_session
from tests.ws_client import Ws, is_event, rebuild, types_of


async def test_an_aap_turn_is_observed_live_on_the_metis_websocket(
    daemon_and_aap: tuple[Daemon, AapClient],
) -> None:
    _, aap = daemon_and_aap
    sid = await aap.create()
    client, _ = await Ws.subscribed(Api(aap.http, aap.auth()), sid)
    reply = await aap.say(sid, "watched from metis", "delta")
    assert reply.stop == "end_turn"
    started = await client.until(is_event("turn.started"))
    turn_id = started[-1]["event"]["turn_id"]
    events = await client.turn(turn_id)
    assert types_of(events)[:2] == ["turn.started", "route.decided"]
    assert "text.delta" in types_of(events) and types_of(events)[-1] == "turn.completed"
    complete = [e for e in events if e["type"] == "message.complete"][-1]
    rebuilt = rebuild(events, complete["payload"]["message_id"])
    assert rebuilt == [{"type": "text", "text": reply.text()}]
    await client.close()


async def test_a_suspended_call_survives_a_restart(
    api_key: str, start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    first = await start_daemon(**roots(workspace))
    aap = await client_for(first)
    sid = await aap.create(tools=[{"name": "list_dir"}], client_tools=[WEATHER])
    reply = await aap.say(sid, "use all tools")
    calls = {c["name"]: c["toolCallId"] for c in reply.tool_calls()}
    await first.stop()
    second = await start_daemon(**roots(workspace))
    aap2 = await client_for(second)
    async with (
        api_session(second) as http,
        http.get(f"/sessions/{sid}") as r,
    ):
        pending = (await r.json())["pending_confirmations"]
    assert [(p["tool_use_id"], p["policy"]) for p in pending] == [(calls["list_dir"], "suspend")]
    answered = await aap2.turn(
        sid,
        [permission(calls["list_dir"], True), tool_result(calls["get_weather"], "fog")],
        "delta",
    )
    assert answered.stop == "end_turn"
    [result] = answered.data("tool_result")
    assert result["toolCallId"] == calls["list_dir"] and "README.md" in result["content"]
    assert "get_weather (ok): fog" in answered.text()
    async with (
        api_session(second) as http,
        http.get(f"/sessions/{sid}") as r,
    ):
        assert (await r.json())["pending_confirmations"] == []


async def test_a_granted_call_interrupted_by_a_stop_gets_the_interruption_result(
    api_key: str, start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    daemon = await start_daemon(**roots(workspace))
    aap = await client_for(daemon)
    sid = await aap.create(tools=[{"name": "shell"}])
    reply = await aap.say(sid, "use all tools")
    [call] = reply.tool_calls()
    assert call["name"] == "shell"
    # Simulate a crash right after the grant was accepted: the row says "resolved in turn T",
    # T is still running, nothing was executed.
    from metis.core.canonical.ids import new_ulid
    from metis.core.canonical.times import now_us

    turn_id = new_ulid()
    async with daemon.core.db.write() as conn:
        await conn.execute(
            "INSERT INTO turns (id, session_id, ordinal, status, surface, trigger, resumes_turn_id, "
            "model, confirmation_policy, started_at_us) VALUES (?,?,99,'running','aap',"
            "'tool_resolution',NULL,'local:scripted','suspend',?)",
            (turn_id, sid, now_us()),
        )
        await conn.execute(
            "UPDATE confirmations SET status='allowed', resolved_in_turn_id=? WHERE tool_use_id=?",
            (turn_id, call["toolCallId"]),
        )
    await daemon.stop()
    restarted = await start_daemon(**roots(workspace))
    aap2 = await client_for(restarted)
    history = await aap2.history(sid)
    assert history[-1] == {
        "role": "tool",
        "toolCallId": call["toolCallId"],
        "content": "Tool call interrupted: metis stopped before the tool finished",
    }
    assert (await aap2.say(sid, "carry on")).stop == "end_turn"


def test_core_imports_neither_the_facade_nor_aiohttp_web() -> None:
    root = Path(metis.core.__file__).parent
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                assert not name.startswith("metis.aap"), (path, name)
                assert not name.startswith("aiohttp.web") and name != "aiohttp", (path, name)
