"""The WebSocket handshake, attach tokens, subscribe, client frames, heartbeats and closes.

Real daemon on a loopback port, real aiohttp WebSocket client, real SQLite. Timing tests lower
the `websocket:` settings instead of sleeping.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.core.events.catalog import PERSISTED, STREAMING
from metis.server.runner import Daemon
from tests.api import Api, api_session
from tests.helpers import HOLD
from tests.ws_client import RawWs, Ws, events_of, is_event, types_of


@pytest.fixture
async def sid(api: Api, workspace: Path) -> str:
    return (await api.create_session(workspace))["id"]


@pytest.fixture
def tuned(make_api: Callable[..., Any]) -> Callable[..., Any]:
    """A daemon with lowered websocket settings (and a config.yaml), with an Api on it."""

    async def make(config: str | None = None, **websocket: Any) -> tuple[Daemon, Api]:
        return await make_api(config=config, websocket=websocket)  # type: ignore[no-any-return]

    return make


async def token_of(api: Api, session_id: str) -> str:
    status, body = await api.call("GET", f"/sessions/{session_id}")
    assert status == 200
    return body["attach_token"]


HANDSHAKE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
}


async def upgrade(api: Api, path: str, **headers: str) -> tuple[int, Any]:
    """Attempt an upgrade: (101, the socket) when accepted, else (status, error envelope).

    A refusal is read as a plain HTTP response to a complete handshake request, which also
    proves that no upgrade happened."""
    async with api.http.get(path, headers={**HANDSHAKE, **headers}) as r:
        if r.status != 101:
            assert r.headers.get("Upgrade") is None
            return r.status, await r.json()
    raise AssertionError("a raw handshake was accepted; use `accept` for expected upgrades")


async def accept(api: Api, path: str, **headers: str) -> aiohttp.ClientWebSocketResponse:
    return await api.http.ws_connect(path, headers=headers or None)


# ---- handshake refusals (test 18) and tokens (test 17) ------------------------------------------


async def test_missing_unknown_and_reused_tokens_are_401_without_upgrade(
    api: Api, sid: str
) -> None:
    for query in ("", "?attach=", "?attach=atk_nope"):
        status, body = await upgrade(api, f"/sessions/{sid}/stream{query}")
        assert status == 401 and body["error"]["code"] == "attach_token_invalid"
        assert body["error"]["details"] == {}
    token = await token_of(api, sid)
    await (await accept(api, f"/sessions/{sid}/stream?attach={token}")).close()
    status, body = await upgrade(api, f"/sessions/{sid}/stream?attach={token}")
    assert status == 401 and body["error"]["code"] == "attach_token_invalid"


async def test_expired_token_is_401(daemon: Daemon, api: Api, sid: str) -> None:
    token = await token_of(api, sid)
    hub = daemon.core.hub
    real = hub.clock
    hub.clock = lambda: real() + hub.token_ttl_s + 0.001  # injected clock: 60 s later
    try:
        status, body = await upgrade(api, f"/sessions/{sid}/stream?attach={token}")
    finally:
        hub.clock = real
    assert status == 401 and body["error"]["code"] == "attach_token_invalid"


async def test_token_of_another_session_is_403_and_not_consumed(
    api: Api, sid: str, workspace: Path
) -> None:
    other = (await api.create_session(workspace))["id"]
    token = await token_of(api, sid)
    status, body = await upgrade(api, f"/sessions/{other}/stream?attach={token}")
    assert status == 403 and body["error"]["code"] == "attach_token_wrong_session"
    await (await accept(api, f"/sessions/{sid}/stream?attach={token}")).close()


async def test_two_concurrent_upgrades_with_one_token_get_exactly_one_101(
    api: Api, sid: str
) -> None:
    token = await token_of(api, sid)
    path = f"/sessions/{sid}/stream?attach={token}"
    results = await asyncio.gather(
        *(api.http.ws_connect(path) for _ in range(2)), return_exceptions=True
    )
    accepted = [r for r in results if isinstance(r, aiohttp.ClientWebSocketResponse)]
    refused = [r for r in results if isinstance(r, aiohttp.WSServerHandshakeError)]
    assert len(accepted) == 1 and len(refused) == 1 and refused[0].status == 401
    await accepted[0].close()


async def test_minting_keeps_at_most_the_cap_and_delete_revokes(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(websocket={"attach_tokens_per_session_max": 5})
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        tokens = [await token_of(api, sid) for _ in range(12)]
        assert d.core.hub.token_count(sid) == 5
        status, _ = await upgrade(api, f"/sessions/{sid}/stream?attach={tokens[0]}")
        assert status == 401  # the oldest were evicted
        for _ in range(10_000):  # the same cap at scale, straight on the hub GET uses
            d.core.hub.mint_token(sid)
        assert d.core.hub.token_count(sid) == 5
        await api.call("DELETE", f"/sessions/{sid}")
        assert d.core.hub.token_count(sid) == 0
        status, body = await upgrade(api, f"/sessions/{sid}/stream?attach={tokens[-1]}")
        assert status == 409 and body["error"]["code"] == "session_already_ended"


async def test_expired_tokens_are_pruned_on_mint(daemon: Daemon, api: Api, sid: str) -> None:
    await token_of(api, sid)
    hub = daemon.core.hub
    real = hub.clock
    hub.clock = lambda: real() + hub.token_ttl_s + 1
    try:
        hub.mint_token(sid)
        assert len(hub._tokens) == 1
    finally:
        hub.clock = real


async def test_foreign_origin_is_403_while_own_or_none_is_101(
    daemon: Daemon, api: Api, sid: str
) -> None:
    path = f"/sessions/{sid}/stream?attach="
    status, body = await upgrade(api, path + await token_of(api, sid), Origin="http://evil.example")
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"
    status, body = await upgrade(api, path + await token_of(api, sid), Origin="null")
    assert status == 403
    own = f"http://127.0.0.1:{daemon.port}"
    await (await accept(api, path + await token_of(api, sid), Origin=own)).close()
    await (await accept(api, path + await token_of(api, sid))).close()


async def test_plain_get_is_426_unknown_session_404_ended_409(
    api: Api, sid: str, workspace: Path
) -> None:
    token = await token_of(api, sid)
    status, body = await api.call("GET", f"/sessions/{sid}/stream?attach={token}")
    assert status == 426 and body["error"]["code"] == "upgrade_required"
    status, body = await upgrade(api, "/sessions/sess_01JZZZZZZZZZZZZZZZZZZZZZZZ/stream?attach=x")
    assert status == 404 and body["error"]["code"] == "session_not_found"
    await (await accept(api, f"/sessions/{sid}/stream?attach={token}")).close()
    token = await token_of(api, sid)
    await api.call("DELETE", f"/sessions/{sid}")
    status, body = await upgrade(api, f"/sessions/{sid}/stream?attach={token}")
    assert status == 409 and body["error"]["code"] == "session_already_ended"


async def test_upgrade_during_shutdown_is_503(daemon: Daemon, api: Api, sid: str) -> None:
    token = await token_of(api, sid)
    daemon.state.shutting_down = True
    try:
        status, body = await upgrade(api, f"/sessions/{sid}/stream?attach={token}")
    finally:
        daemon.state.shutting_down = False
    assert status == 503 and body["error"]["code"] == "service_shutting_down"


async def test_refusals_precede_token_checks_in_contract_order(api: Api, sid: str) -> None:
    # A bad token on a plain GET is still 426 (upgrade is checked first), and a foreign
    # Origin on a plain GET is 403 (Origin is checked before the upgrade).
    status, body = await api.call("GET", f"/sessions/{sid}/stream")
    assert status == 426
    status, body = await api.call(
        "GET", f"/sessions/{sid}/stream", headers={"Origin": "http://evil.example"}
    )
    assert status == 403 and body["error"]["code"] == "origin_not_allowed"


# ---- subscribe (tests 12, 13, 19, 20) --------------------------------------------------------------


async def test_ack_expands_both_presets(api: Api, sid: str) -> None:
    full_types = sorted([*PERSISTED, *STREAMING])
    client, ack = await Ws.subscribed(api, sid)
    assert ack == {
        "type": "subscribe_ack",
        "protocol": 1,
        "resolved_filter": {
            "preset": "full",
            "event_types": full_types,
            "actors": None,
            "include_worker_sessions": False,
        },
        "since": None,
        "snapshot": False,
        "replay_event_count": 0,
    }
    await client.close()
    client, ack = await Ws.subscribed(api, sid, filter="preset:chat")
    chat = ack["resolved_filter"]["event_types"]
    assert ack["resolved_filter"]["preset"] == "chat" and chat == sorted(chat)
    assert "session.ended" in chat and set(STREAMING) <= set(chat)
    assert "session.created" not in chat and "bus.gap_detected" not in chat
    await client.close()


async def test_custom_filter_is_echoed_resolved(api: Api, sid: str) -> None:
    client, ack = await Ws.subscribed(
        api,
        sid,
        filter={
            "event_types": ["text.delta", "turn.completed"],
            "actors": ["worker", "agent"],
            "include_worker_sessions": True,
        },
    )
    assert ack["resolved_filter"] == {
        "preset": None,
        "event_types": ["text.delta", "turn.completed"],
        "actors": ["agent", "worker"],
        "include_worker_sessions": True,
    }
    await client.close()
    client, ack = await Ws.subscribed(api, sid, filter={"actors": ["user"]})
    assert ack["resolved_filter"]["event_types"] == sorted([*PERSISTED, *STREAMING])
    await client.close()


@pytest.mark.parametrize(
    ("filter_", "field"),
    [
        ({"event_types": ["made.up.thing", "text.delta"]}, "filter.event_types"),
        ({"event_types": []}, "filter.event_types"),
        ({"actors": []}, "filter.actors"),
        ({"actors": ["robot"]}, "filter.actors.0"),
        ({"colour": "blue"}, "filter.colour"),
        ({"include_worker_sessions": "yes"}, "filter.include_worker_sessions"),
        ({"event_types": "text.delta"}, "filter.event_types"),
        ("preset:everything", "filter"),
        ("text.delta", "filter"),
        (5, "filter"),
    ],
)
async def test_invalid_filters_are_refused_then_closed_1008(
    api: Api, sid: str, filter_: Any, field: str
) -> None:
    client = await Ws.open(api, sid)
    error = await client.subscribe(filter=filter_)
    assert error["type"] == "subscribe_error" and error["code"] == "invalid_filter"
    assert error["details"]["field"] == field
    if filter_ == {"event_types": ["made.up.thing", "text.delta"]}:
        assert error["details"]["unknown_event_types"] == ["made.up.thing"]
    closed = await client.closed()
    assert closed.code == 1008 and closed.reason["code"] == "invalid_filter"


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "cancel", "turn_id": "01JZZZZZZZZZZZZZZZZZZZZZZZ"},
        {"type": "ping"},
        {"type": "subscribe", "since": "01JZZZZZZZZZZZZZZZZZZZZZZZ", "snapshot": True},
        {"type": "subscribe", "since": "not-a-ulid"},
        {"type": "subscribe", "since": 5},
        {"type": "subscribe", "snapshot": "yes"},
    ],
)
async def test_bad_first_frames_are_invalid_subscribe(
    api: Api, sid: str, frame: dict[str, Any]
) -> None:
    client = await Ws.open(api, sid)
    await client.send(frame)
    error = await client.recv()
    assert error["type"] == "subscribe_error" and error["code"] == "invalid_subscribe"
    closed = await client.closed()
    assert closed.code == 1008 and closed.reason["code"] == "invalid_subscribe"
    assert client.frames == [error]  # nothing else was sent


async def test_unknown_subscribe_fields_are_ignored(api: Api, sid: str) -> None:
    client, ack = await Ws.subscribed(api, sid, colour="blue", snapshot=False)
    assert ack["snapshot"] is False
    await client.close()


async def test_nothing_is_sent_before_subscribe_and_timeout_closes_1008(
    tuned: Callable[..., Any], workspace: Path
) -> None:
    _, api = await tuned(subscribe_timeout_s=0.2)
    sid = (await api.create_session(workspace))["id"]
    client = await Ws.open(api, sid)
    await api.run_turn(sid, "hello")  # events of a turn before subscribe are not sent
    closed = await client.closed(timeout=5)
    assert closed.code == 1008 and closed.reason["code"] == "subscribe_timeout"
    assert client.ws.close_code == 1008  # the close handshake completed
    assert client.frames == []


async def test_second_subscribe_and_non_json_are_protocol_errors(api: Api, sid: str) -> None:
    escaped_surrogate = '{"type": "ping", "nonce": "\\ud800"}'
    for bad in (
        json.dumps({"type": "subscribe"}),
        "not json",
        "[1, 2]",
        '{"type": 5}',
        escaped_surrogate,
    ):
        client, _ = await Ws.subscribed(api, sid)
        await client.ws.send_str(bad)
        closed = await client.closed()
        assert closed.code == 1008 and closed.reason["code"] == "protocol_error", bad
    client, _ = await Ws.subscribed(api, sid)
    await client.ws.send_str('{"type": "cancel", "type": "ping", "nonce": "n"}')
    closed = await client.closed()
    assert closed.code == 1008 and closed.reason == {
        "code": "protocol_error",
        "message": 'frame is not JSON: Detected duplicate key "type" at line 1 column 27',
    }


async def test_binary_frame_is_1003_and_oversized_frame_is_1009(api: Api, sid: str) -> None:
    client, _ = await Ws.subscribed(api, sid)
    await client.ws.send_bytes(b"\x00\x01")
    closed = await client.closed()
    assert closed.code == 1003 and closed.reason["code"] == "unsupported_data"
    client, _ = await Ws.subscribed(api, sid)
    await client.send({"type": "ping", "nonce": "x", "pad": "p" * 70 * 1024})
    closed = await client.closed()
    assert closed.code == 1009 and closed.reason["code"] == "message_too_big"
    client, _ = await Ws.subscribed(api, sid)
    await client.send({"type": "ping", "nonce": "fits", "pad": "p" * 60 * 1024})
    assert await client.recv() == {"type": "pong", "nonce": "fits"}
    await client.close()


async def test_text_that_is_not_utf8_and_a_malformed_frame_are_1008_protocol_error(
    daemon: Daemon, api: Api, sid: str
) -> None:
    """aiohttp refuses both itself, with the RFC's 1007 and 1002; the close table of this
    surface has one pair for a bad frame from the client, 1008 `protocol_error`."""
    client, _ = await Ws.subscribed(api, sid)
    await client.ws.send_frame(b'{"type":"ping","nonce":"\xff"}', aiohttp.WSMsgType.TEXT)
    closed = await client.closed()
    assert closed.code == 1008 and closed.reason is not None
    assert closed.reason["code"] == "protocol_error"
    raw = await RawWs.connect(
        "127.0.0.1", daemon.port, f"/sessions/{sid}/stream?attach={await token_of(api, sid)}"
    )
    try:
        await raw.send_text('{"type":"subscribe"}')
        # a text frame with a reserved bit set (RSV1: no extension was negotiated), masked
        await asyncio.get_running_loop().sock_sendall(raw.sock, bytes([0xC1, 0x80]) + b"\0\0\0\0")
        frames, code, reason = await raw.read_until_close()
    finally:
        raw.close()
    assert [f["type"] for f in frames] == ["subscribe_ack"]
    assert code == 1008 and reason is not None and reason["code"] == "protocol_error"


async def test_unknown_frame_type_is_ignored_and_socket_stays_open(api: Api, sid: str) -> None:
    client, _ = await Ws.subscribed(api, sid)
    await client.send({"type": "hologram", "beam": True})
    await client.send({"type": "ping", "nonce": "n1", "extra": 1})
    assert await client.recv() == {"type": "pong", "nonce": "n1"}
    accepted, _ = await api.run_turn(sid, "still here")
    events = await client.turn(accepted["turn_id"])
    assert types_of(events)[-1] == "turn.completed"
    await client.close()


async def test_client_ping_gets_its_nonce_or_empty(api: Api, sid: str) -> None:
    client, _ = await Ws.subscribed(api, sid)
    await client.send({"type": "ping", "nonce": "abc123"})
    assert await client.recv() == {"type": "pong", "nonce": "abc123"}
    await client.send({"type": "ping"})
    assert await client.recv() == {"type": "pong", "nonce": ""}
    await client.close()


# ---- heartbeats (test 15) ---------------------------------------------------------------------------


async def test_server_pings_when_idle_and_pongs_keep_the_socket_open(
    tuned: Callable[..., Any], workspace: Path
) -> None:
    _, api = await tuned(ping_interval_s=0.1, ping_missed_max=2)
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    for _ in range(6):  # six intervals: three times longer than a silent client would last
        ping = await client.recv(timeout=2)
        assert ping["type"] == "ping" and len(ping["nonce"]) == 16
        int(ping["nonce"], 16)
        await client.send({"type": "pong", "nonce": ping["nonce"]})
    await client.close()


async def test_three_missed_pings_close_1008_heartbeat_timeout(
    tuned: Callable[..., Any], workspace: Path
) -> None:
    _, api = await tuned(ping_interval_s=0.1)
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    loop = asyncio.get_running_loop()
    started = loop.time()
    closed = await client.closed(timeout=5)
    assert closed.code == 1008 and closed.reason["code"] == "heartbeat_timeout"
    assert client.ws.close_code == 1008  # the close handshake completed
    pings = [f for f in client.frames if f["type"] == "ping"]
    assert len(pings) == 3 and len({p["nonce"] for p in pings}) == 3
    assert loop.time() - started >= 0.35  # about four intervals of silence


async def test_any_received_frame_resets_the_heartbeat(
    tuned: Callable[..., Any], workspace: Path
) -> None:
    _, api = await tuned(ping_interval_s=0.5, ping_missed_max=1)
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    for i in range(8):  # a frame every 100 ms (5× margin): no server ping
        await client.send({"type": "ping", "nonce": str(i)})
        assert await client.recv() == {"type": "pong", "nonce": str(i)}
        await asyncio.sleep(0.1)
    await client.close()


# ---- cancel frames (test 22) --------------------------------------------------------------------


async def test_cancel_frame_with_the_202_turn_id_records_user_cancel(
    tuned: Callable[..., Any], workspace: Path
) -> None:
    _, api = await tuned(config=HOLD)
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "please use server tool")
    assert status == 202, accepted
    turn_id = accepted["turn_id"]
    await client.until(is_event("tool.confirmation_requested"))
    await client.send({"type": "cancel", "turn_id": "01JZZZZZZZZZZZZZZZZZZZZZZZ"})  # unknown
    await client.send({"type": "cancel"})  # no turn id
    await client.send({"type": "cancel", "turn_id": turn_id, "reason": "timeout"})
    events = await client.turn(turn_id)
    assert events[-1]["type"] == "turn.cancelled"
    assert events[-1]["payload"]["reason"] == "user_cancel" and events[-1]["actor"] == "user"
    await client.send({"type": "ping", "nonce": "open"})  # the socket stayed open throughout
    assert await client.recv() == {"type": "pong", "nonce": "open"}
    await client.close()


async def test_frame_cancel_plus_rest_cancel_gives_one_turn_cancelled(
    tuned: Callable[..., Any], workspace: Path
) -> None:
    _, api = await tuned(config=HOLD)
    sid = (await api.create_session(workspace))["id"]
    client, _ = await Ws.subscribed(api, sid)
    status, accepted = await api.submit(sid, "please use server tool")
    turn_id = accepted["turn_id"]
    await client.until(is_event("tool.confirmation_requested"))
    await client.send({"type": "cancel", "turn_id": turn_id})
    status, body = await api.call("POST", f"/sessions/{sid}/turns/{turn_id}/cancel")
    assert status in (202, 409), body
    events = await client.turn(turn_id)
    await client.send({"type": "cancel", "turn_id": turn_id})  # after the end: ignored
    await client.expect_silence(0.2)
    assert types_of(events).count("turn.cancelled") == 1
    stored = await api.turn_events(sid, turn_id)
    assert types_of(stored).count("turn.cancelled") == 1
    await client.close()


# ---- closes (tests 27, 28) ----------------------------------------------------------------------


async def test_delete_delivers_session_ended_then_closes_1000(api: Api, sid: str) -> None:
    full, _ = await Ws.subscribed(api, sid)
    chat, _ = await Ws.subscribed(api, sid, filter="preset:chat")
    idle = await Ws.open(api, sid)  # not subscribed yet: closed all the same
    status, _ = await api.call("DELETE", f"/sessions/{sid}")
    assert status == 200
    for client in (full, chat):
        closed = await client.closed()
        assert closed.code == 1000 and closed.reason["code"] == "session_ended"
        assert types_of(events_of(client.frames))[-1] == "session.ended"
    closed = await idle.closed()
    assert closed.code == 1000 and closed.reason["code"] == "session_ended"
    assert idle.frames == []


async def test_purge_closes_1000_session_purged(api: Api, sid: str) -> None:
    client, _ = await Ws.subscribed(api, sid)
    status, _ = await api.call("DELETE", f"/sessions/{sid}", params={"purge": "true"})
    assert status == 200
    closed = await client.closed()
    assert closed.code == 1000 and closed.reason["code"] == "session_purged"
    assert "session.ended" not in types_of(events_of(client.frames))


async def test_in_band_closes_complete_the_handshake_with_the_client(
    api: Api, workspace: Path
) -> None:
    """The server waits for the client's close reply, so an aiohttp client records the
    server's 1000, not 1006 for a connection torn down under its reply."""
    for params, code in (({}, "session_ended"), ({"purge": "true"}, "session_purged")):
        sid = (await api.create_session(workspace))["id"]
        subscribed, _ = await Ws.subscribed(api, sid)
        idle = await Ws.open(api, sid)
        status, _ = await api.call("DELETE", f"/sessions/{sid}", params=params)
        assert status == 200
        for client in (subscribed, idle):
            closed = await client.closed()
            assert closed.code == 1000 and closed.reason["code"] == code
            assert client.ws.close_code == 1000, code


async def test_shutdown_sends_turn_cancelled_then_closes_1001(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(config=HOLD)
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        client, _ = await Ws.subscribed(api, sid)
        status, _ = await api.submit(sid, "please use server tool")
        assert status == 202
        await client.until(is_event("tool.confirmation_requested"))
        stopping = asyncio.ensure_future(d.stop())
        closed = await client.closed()
        await stopping
    assert closed.code == 1001 and closed.reason["code"] == "server_shutdown"
    assert client.ws.close_code == 1001  # the close handshake completed
    last = events_of(client.frames)[-1]
    assert last["type"] == "turn.cancelled" and last["payload"]["reason"] == "server_shutdown"


async def test_client_close_detaches_without_touching_the_session(
    daemon: Daemon, api: Api, sid: str
) -> None:
    client, _ = await Ws.subscribed(api, sid)
    assert daemon.core.hub.client_count(sid) == 1
    await client.close()
    for _ in range(100):
        if daemon.core.hub.client_count(sid) == 0:
            break
        await asyncio.sleep(0.01)
    assert daemon.core.hub.client_count(sid) == 0
    _, terminal = await api.run_turn(sid, "nobody listening")
    assert terminal["type"] == "turn.completed"


async def test_every_close_reason_is_compact_json_within_123_bytes() -> None:
    from metis.server.ws.protocol import CLOSE_MESSAGES, close_reason

    for code, message in CLOSE_MESSAGES.items():
        raw = close_reason(code, message)
        assert len(raw) <= 123 and json.loads(raw) == {"code": code, "message": message}
    raw = close_reason("client_too_slow", "é" * 400)
    assert len(raw) <= 123 and json.loads(raw)["code"] == "client_too_slow"
