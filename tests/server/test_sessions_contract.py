"""REST contract items that other tests prove only weakly, against the real daemon.

- a PATCH queued mid-turn leaves the running turn on its model (observable
  because two distinct models are configured) and the next turn routes to the new sticky.
- two separate clients answering one confirmation at once; first answer wins.
- DELETE mid-turn as one socket sees it, up to the close.
- two concurrent cancels while the turn stays `cancelling`, then 409.
- `ws_url` from the bound address, a fresh token per GET, `no-store`.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.testing import FakeProviderServer, FakeReply, FakeToolCall
from tests.api import Api, api_session
from tests.server.test_sessions_api import HOLD, confirmation_url, hold_turn
from tests.ws_client import Closed, Ws, events_of, fake_models, types_of

HAIKU = "anthropic:claude-haiku-4-5"
SCRIPTED = "local:scripted"


def two_models(fake: FakeProviderServer) -> str:
    """The scripted model and a fake-provider model side by side (distinct, observable ids)."""
    return f"""
pricing_version: "test"
providers:
  anthropic: {{adapter: anthropic, base_url: "{fake.anthropic_base_url}", api_key: "ak-test"}}
  local: {{adapter: scripted}}
models:
  - id: {HAIKU}
    capabilities: {{max_context_tokens: 200000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "1", output_per_mtok: "5"}}
  - id: {SCRIPTED}
"""


def first(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(e for e in events if e["type"] == kind)


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


# ---- the queued swap -------------------------------------------------------------------------


async def test_queued_swap_keeps_the_running_turns_model_and_routes_the_next_turn(
    make_api: Callable[..., Any], fake: FakeProviderServer, workspace: Path
) -> None:
    _, api = await make_api(models=two_models(fake), config=HOLD)
    sid = (await api.create_session(workspace, initial_active_model=SCRIPTED))["id"]
    turn_id, request = await hold_turn(api, sid)  # turn 1 runs on the scripted model

    status, body = await api.call("PATCH", f"/sessions/{sid}", {"active_model": HAIKU})
    assert status == 200 and body == {
        "id": sid,
        "active_model": HAIKU,
        "swap_queued": True,
        "swap_queued_until_turn": turn_id,
    }
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["sticky_model"] == SCRIPTED
    assert got["pending_swap"] == {"sticky_model": HAIKU, "until_turn": turn_id}

    # Let turn 1 go on: the tool result makes it call the model again, after the PATCH.
    status, _ = await api.call(
        "POST", confirmation_url(sid, turn_id, request), {"decision": "allow"}
    )
    assert status == 200
    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.completed", terminal
    events = await api.turn_events(sid, turn_id)
    assert first(events, "route.decided")["payload"]["chosen_model"] == SCRIPTED
    calls = of_type(events, "llm.call_started")
    assert len(calls) == 2, types_of(events)
    assert [c["payload"]["model"] for c in calls] == [SCRIPTED, SCRIPTED]
    assert fake.requests == []  # the new model was never called during turn 1

    # The swap was applied at the turn's end and survives it.
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["sticky_model"] == HAIKU and got["active_model"] == HAIKU
    assert got["pending_swap"] is None and got["current_turn_id"] is None

    accepted, terminal = await api.run_turn(sid, "hello after the swap")
    assert accepted["model"] == HAIKU and terminal["type"] == "turn.completed", terminal
    events = await api.turn_events(sid, accepted["turn_id"])
    route = first(events, "route.decided")["payload"]
    assert route["chosen_model"] == HAIKU
    assert route["chain"][route["winner_index"]]["policy"] == "manual_sticky"
    assert [c["payload"]["model"] for c in of_type(events, "llm.call_started")] == [HAIKU]
    assert len(fake.requests) == 1 and fake.requests[0].api == "anthropic"


# ---- two clients answer one confirmation at once -----------------------------------------------


async def test_two_clients_allowing_at_once_apply_once_and_the_tool_runs_once(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    d, api_a = await make_api(config=HOLD)
    # The scripted model's read_file input is {"path": "metis-demo.txt"}: make it succeed.
    (workspace / "metis-demo.txt").write_text("contents of the conformance file\n")
    sid = (await api_a.create_session(workspace))["id"]
    turn_id, request = await hold_turn(api_a, sid)
    url = confirmation_url(sid, turn_id, request)
    async with api_session(d) as http_b:
        api_b = Api(http_b)
        answers = await asyncio.gather(
            api_a.call("POST", url, {"decision": "allow"}),
            api_b.call("POST", url, {"decision": "allow"}),
        )
    assert [status for status, _ in answers] == [200, 200], answers
    assert sorted(body["applied"] for _, body in answers) == [False, True], answers
    for _, body in answers:
        assert body["request_id"] == request["confirmation_request_id"]
        assert body["decision"] == "allow" and body["scope"] == "once"

    terminal = await api_a.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.completed", terminal
    events = await api_a.turn_events(sid, turn_id)
    tool_use_id = request["tool_use_id"]
    mine = [e for e in events if e["payload"].get("tool_use_id") == tool_use_id]
    assert types_of(mine) == [
        "tool.confirmation_requested",
        "tool.confirmation_resolved",
        "tool.called",
        "tool.completed",
    ]
    resolved, called, completed = mine[1], mine[2], mine[3]
    assert resolved["payload"]["decision"] == "allow" and resolved["actor"] == "user"
    assert called["parent_event_id"] == resolved["id"]
    assert completed["payload"]["is_error"] is False
    assert types_of(events).count("tool.called") == 1
    messages = (await api_a.messages(sid))["messages"]
    results = [m for m in messages if m["role"] == "tool"]
    assert len(results) == 1
    assert "contents of the conformance file" in str(results[0]["content"])
    rows = await d.core.db.fetchall("SELECT status FROM confirmations WHERE session_id=?", (sid,))
    assert [r["status"] for r in rows] == ["allowed"]


async def test_two_clients_answering_differently_at_once_one_wins_the_other_409(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    d, api_a = await make_api(config=HOLD)
    (workspace / "metis-demo.txt").write_text("contents\n")
    sid = (await api_a.create_session(workspace))["id"]
    turn_id, request = await hold_turn(api_a, sid)
    url = confirmation_url(sid, turn_id, request)
    async with api_session(d) as http_b:
        answers = await asyncio.gather(
            api_a.call("POST", url, {"decision": "allow"}),
            Api(http_b).call("POST", url, {"decision": "deny", "reason": "no"}),
        )
    winners = [body for status, body in answers if status == 200]
    losers = [body for status, body in answers if status != 200]
    assert len(winners) == 1 and winners[0]["applied"] is True, answers
    assert len(losers) == 1 and [s for s, _ in answers].count(409) == 1, answers
    error = losers[0]["error"]
    assert error["code"] == "confirmation_already_resolved"
    assert error["details"]["resolution"] == winners[0]["decision"]
    assert error["details"]["scope"] == "once"
    assert error["details"]["resolved_at"]

    await api_a.wait_turn(sid, turn_id)
    events = await api_a.turn_events(sid, turn_id)
    resolved = of_type(events, "tool.confirmation_resolved")
    assert len(resolved) == 1 and resolved[0]["payload"]["decision"] == winners[0]["decision"]
    if winners[0]["decision"] == "allow":
        assert types_of(events).count("tool.called") == 1
        assert first(events, "tool.completed")["payload"]["is_error"] is False
    else:
        assert "tool.called" not in types_of(events)
        assert first(events, "tool.failed")["payload"]["error_class"] == "user_denied"


# ---- DELETE mid-turn as a socket sees it --------------------------------------------------------


async def test_delete_mid_turn_socket_sees_cancel_then_end_then_close_1000(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    _, api = await make_api(config=HOLD)
    sid = (await api.create_session(workspace))["id"]
    ws, _ = await Ws.subscribed(api, sid)
    try:
        turn_id, _ = await hold_turn(api, sid)
        status, ended = await api.call("DELETE", f"/sessions/{sid}")
        assert status == 200 and ended["id"] == sid and ended["ended_at"]
        closed = await ws.closed()
    finally:
        await ws.close()
    assert isinstance(closed, Closed)
    assert closed.code == 1000 and closed.reason is not None
    assert closed.reason["code"] == "session_ended"

    events = events_of(ws.frames)
    types = types_of(events)
    # session.ended is the last frame before the close, right after the turn's terminal event.
    assert ws.frames[-1]["type"] == "event" and types[-1] == "session.ended", types
    assert types[-2] == "turn.cancelled", types
    cancelled, session_ended = events[-2], events[-1]
    assert cancelled["turn_id"] == turn_id and cancelled["payload"]["reason"] == "user_cancel"
    assert (
        session_ended["turn_id"] is None and session_ended["payload"]["disposition"] == "completed"
    )
    assert cancelled["seq"] < session_ended["seq"]
    turn = [e for e in events if e["turn_id"] == turn_id]
    assert types_of(turn).count("turn.cancelled") == 1
    assert "tool.confirmation_resolved" not in types_of(turn)
    assert first(turn, "tool.failed")["payload"]["error_class"] == "cancelled"

    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["attach_token"] is None and got["ws_url"] is None
    assert got["pending_confirmations"] == [] and got["current_turn_id"] is None


# ---- concurrent cancels ------------------------------------------------------------------------

# Ignores the first SIGTERM for a second, so the turn stays `cancelling` while both cancels land.
SLOW_TO_STOP = "trap 'sleep 1; exit 1' TERM; echo up > ready.txt; sleep 30 & wait"


async def test_two_concurrent_cancels_are_both_202_then_a_late_one_is_409(
    make_api: Callable[..., Any], fake: FakeProviderServer, workspace: Path
) -> None:
    config = "tools:\n  confirmation:\n    per_tool: {shell: auto}\n"
    d, api = await make_api(models=fake_models(fake), config=config)
    fake.enqueue(
        "anthropic",
        FakeReply(tool_calls=[FakeToolCall(name="shell", input={"command": SLOW_TO_STOP})]),
    )
    sid = (await api.create_session(workspace))["id"]
    status, accepted = await api.submit(sid, "run the slow command")
    assert status == 202, accepted
    turn_id = accepted["turn_id"]
    await api.wait_for_event(sid, lambda e: e["type"] == "tool.called")
    async with asyncio.timeout(5):
        while not (workspace / "ready.txt").exists():  # the trap is installed
            await asyncio.sleep(0.01)

    url = f"/sessions/{sid}/turns/{turn_id}/cancel"
    answers = await asyncio.gather(
        api.call("POST", url), api.call("POST", url, {"reason": "user_cancel"})
    )
    assert [status for status, _ in answers] == [202, 202], answers
    for _, body in answers:
        assert set(body) == {"turn_id", "cancellation_initiated"}, body
        assert body["turn_id"] == turn_id
    assert sorted(body["cancellation_initiated"] for _, body in answers) == [False, True]
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["current_turn_id"] == turn_id and got["current_turn_status"] == "cancelling"

    terminal = await api.wait_turn(sid, turn_id)
    assert terminal["type"] == "turn.cancelled" and terminal["payload"]["reason"] == "user_cancel"
    await d.core.turns.wait_all()
    status, body = await api.call("POST", url)
    assert status == 409 and body["error"]["code"] == "turn_already_completed"
    assert body["error"]["details"]["status"] == "cancelled"
    types = types_of(await api.turn_events(sid, turn_id))
    assert types.count("turn.cancelled") == 1 and types[-2:] == ["tool.failed", "turn.cancelled"]
    assert "llm.call_failed" not in types and types.count("llm.call_started") == 1


# ---- attach fields -----------------------------------------------------------------------------

TOKEN_RE = re.compile(r"atk_[A-Za-z0-9_-]{32}")


async def test_attach_fields_use_the_bound_address_fresh_tokens_and_no_store(
    make_api: Callable[..., Any], workspace: Path
) -> None:
    d, api = await make_api()
    sid = (await api.create_session(workspace))["id"]
    stream = f"ws://127.0.0.1:{d.port}/sessions/{sid}/stream?attach="
    tokens: list[str] = []
    for host in (f"127.0.0.1:{d.port}", f"localhost:{d.port}", f"LocalHost:{d.port}"):
        async with api.http.get(f"/sessions/{sid}", headers={"Host": host}) as r:
            assert r.status == 200
            assert r.headers["Cache-Control"] == "no-store"
            assert r.headers["X-Content-Type-Options"] == "nosniff"
            body = await r.json()
        assert TOKEN_RE.fullmatch(body["attach_token"]), body["attach_token"]
        assert body["attach_token_expires_at"]
        assert body["ws_url"] == stream + body["attach_token"], (host, body["ws_url"])
        tokens.append(body["attach_token"])
    assert len(set(tokens)) == 3

    # Earlier tokens stay valid after later mints: the first and the localhost one both attach.
    for token in (tokens[0], tokens[1]):
        ws = await api.http.ws_connect(stream + token)
        try:
            await ws.send_json({"type": "subscribe"})
            ack = await ws.receive_json(timeout=5)
            assert ack["type"] == "subscribe_ack"
        finally:
            await ws.close()


async def test_an_image_over_the_configured_limit_is_invalid_content(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The image size rule with `limits.max_image_bytes` lowered: the setting, not the
    5 MiB default, decides; the image at the limit is accepted."""
    d = await start_daemon(config="limits: {max_image_bytes: 1024}\n")
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]

        def image(size: int) -> dict[str, Any]:
            data = base64.b64encode(b"\x89PNG" + b"\0" * (size - 4)).decode()
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": data},
            }

        url = f"/sessions/{sid}/turns"
        status, body = await api.call("POST", url, {"content": [image(1025)]})
        assert status == 400 and body["error"]["code"] == "invalid_content"
        assert "1024" in body["error"]["details"]["errors"][0]["msg"]
        status, accepted = await api.call("POST", url, {"content": [image(1024)]})
        assert status == 202, accepted
        await api.wait_turn(sid, accepted["turn_id"])
