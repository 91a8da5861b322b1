"""Stream behaviour against the fake provider through the real SDK:
thinking and block order, stop reasons, provider errors mid-stream, disconnects, cancels,
heartbeats, concurrency and routing failures."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.server.runner import Daemon
from metis.testing import FakeProviderServer, FakeReply
from tests.aap.client import AapClient, check_stream
from tests.aap.conftest import fake_models, roots
from tests.aap.sse import SseParser
from tests.api import Api, api_session

Fake = tuple[Daemon, AapClient, FakeProviderServer]
SLOW = {"chunk_chars": 1, "delay_ms": 15}


async def _events(daemon: Daemon, sid: str, kind: str) -> list[dict[str, Any]]:
    await daemon.core.flush()
    rows = await daemon.core.db.fetchall(
        "SELECT payload_json FROM events WHERE session_id=? AND type=? ORDER BY seq", (sid, kind)
    )
    return [json.loads(r[0]) for r in rows]


@pytest.mark.parametrize("mode", ["delta", "message"])
async def test_thinking_keeps_block_order(fake_aap: Fake, mode: str) -> None:
    _, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply(thinking="Let me think.", text="The answer is 4."))
    sid = await aap.create()
    reply = await aap.say(sid, "2+2?", mode)
    assert reply.stop == "end_turn"
    if mode == "delta":
        names = [n for n in reply.names if n.endswith("_delta")]
        assert names.index("thinking_delta") < names.index("text_delta")
        assert "".join(d["delta"] for d in reply.data("thinking_delta")) == "Let me think."
        assert "".join(d["delta"] for d in reply.data("text_delta")) == "The answer is 4."
    else:
        assert reply.names == ["turn_start", "thinking", "text", "turn_stop"]
        assert reply.data("thinking") == [{"thinking": "Let me think."}]
    [_, assistant] = await aap.history(sid)
    assert assistant["content"] == [
        {"type": "thinking", "thinking": "Let me think."},
        {"type": "text", "text": "The answer is 4."},
    ]


@pytest.mark.parametrize("mode", ["none", "delta", "message"])
@pytest.mark.parametrize(
    ("reply", "stop"),
    [
        (FakeReply.say("cut sho", stop_reason="max_tokens"), "max_tokens"),
        (FakeReply(refusal="I can't help with that."), "refusal"),
    ],
)
async def test_stop_reasons(fake_aap: Fake, mode: str, reply: FakeReply, stop: str) -> None:
    _, aap, fake = fake_aap
    fake.enqueue("anthropic", reply)
    sid = await aap.create()
    result = await aap.say(sid, "go", mode)
    assert result.status == 200 and result.stop == stop


@pytest.mark.parametrize("mode", ["none", "delta", "message"])
async def test_provider_error_mid_stream_still_ends_with_turn_stop(
    fake_aap: Fake, mode: str
) -> None:
    daemon, aap, fake = fake_aap
    fake.enqueue(
        "anthropic", FakeReply.error_event_after(6, text="partial answer text", chunk_chars=3)
    )
    sid = await aap.create()
    reply = await aap.say(sid, "go", mode)
    assert reply.status == 200 and reply.stop == "error"
    if mode == "delta":
        assert reply.data("text_delta")  # some text went out before the failure
    history = await aap.history(sid)
    partial = history[-1]
    assert partial["role"] == "assistant" and "partial"[:3] in json.dumps(partial)
    assert partial["interrupted"] is True
    if mode == "none":
        assert reply.body["messages"] == [history[-1]]
    [failed] = await _events(daemon, sid, "turn.failed")
    assert failed["reason"] == "provider_error"


async def test_auth_error_is_an_error_stop(fake_aap: Fake) -> None:
    _, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply.fail(401, "authentication_error"))
    sid = await aap.create()
    reply = await aap.say(sid, "go", "delta")
    assert reply.stop == "error"


async def test_routing_failure_is_503_before_any_byte(fake_aap: Fake) -> None:
    daemon, aap, _ = fake_aap
    sid = await aap.create()
    daemon.core.availability.record_failure("anthropic:claude-haiku-4-5", "auth")
    reply = await aap.say(sid, "go", "delta")
    assert reply.status == 503 and reply.error == "routing_failed"
    assert reply.body["error"]["details"]["tried"][0]["model"] == "anthropic:claude-haiku-4-5"
    assert await aap.history(sid) == []


async def test_client_disconnect_cancels_the_turn(fake_aap: Fake) -> None:
    daemon, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply.say("x" * 400, **SLOW))
    sid = await aap.create()
    body = {"stream": "delta", "messages": [{"role": "user", "content": "go"}]}
    parser = SseParser()
    async with aap.http.post(f"/aap/sessions/{sid}/turns", json=body, headers=aap.auth()) as r:
        async for chunk in r.content.iter_any():
            if any(e.event == "text_delta" for e in parser.feed(chunk)):
                break  # leave mid-stream; the context manager closes the connection
    for _ in range(200):
        cancelled = await _events(daemon, sid, "turn.cancelled")
        if cancelled:
            break
        await asyncio.sleep(0.025)
    assert cancelled == [cancelled[0]] and cancelled[0]["reason"] == "client_disconnect"
    await asyncio.sleep(0.05)
    history = await aap.history(sid)  # consistent: the user message and the partial answer
    assert [m["role"] for m in history] == ["user", "assistant"]
    # The partial answer says it was cut, on every surface that shows it.
    assert history[-1]["interrupted"] is True and history[-1]["content"].startswith("x")
    assert (await aap.history(sid, "compacted"))[-1]["interrupted"] is True
    v1 = await aap.v1.request("GET", f"/session/{sid}")
    assert v1.body["history"]["full"][-1]["interrupted"] is True
    async with api_session(daemon) as http:
        stored = (await Api(http).messages(sid))["messages"]
    assert stored[-1]["metadata"]["status"] == "cancelled"
    again = await aap.say(sid, "next")
    assert again.status == 200
    history = await aap.history(sid)
    assert "interrupted" not in history[-1] and "interrupted" not in history[0]


async def test_none_mode_client_disconnect_cancels_too(fake_aap: Fake) -> None:
    daemon, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply.say("y" * 400, **SLOW))
    sid = await aap.create()
    body = {"messages": [{"role": "user", "content": "go"}]}
    task = asyncio.ensure_future(
        aap.http.post(f"/aap/sessions/{sid}/turns", json=body, headers=aap.auth())
    )
    await fake.wait_until(lambda: any(r.events_sent > 3 for r in fake.requests))
    task.cancel()
    for _ in range(200):
        cancelled = await _events(daemon, sid, "turn.cancelled")
        if cancelled:
            break
        await asyncio.sleep(0.025)
    assert cancelled[0]["reason"] == "client_disconnect"


async def _stream_while(
    aap: AapClient, sid: str, during: Any, fake: FakeProviderServer
) -> tuple[list[str], Any]:
    body = {"stream": "message", "messages": [{"role": "user", "content": "go"}]}
    parser = SseParser()
    outcome = None
    async with aap.http.post(f"/aap/sessions/{sid}/turns", json=body, headers=aap.auth()) as r:
        assert r.status == 200
        await fake.wait_until(lambda: any(x.events_sent > 3 for x in fake.requests))
        outcome = await during()
        async for chunk in r.content.iter_any():
            parser.feed(chunk)
    return [e.event for e in parser.events], outcome


async def test_metis_cancel_during_a_stream_ends_it_with_error(fake_aap: Fake) -> None:
    daemon, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply.say("z" * 400, **SLOW))
    sid = await aap.create()
    api = Api(aap.http, aap.auth())

    async def cancel() -> int:
        status, session = await api.call("GET", f"/sessions/{sid}")
        status, _ = await api.call(
            "POST", f"/sessions/{sid}/turns/{session['current_turn_id']}/cancel"
        )
        return status

    names, status = await _stream_while(aap, sid, cancel, fake)
    assert status == 202
    assert names[0] == "turn_start" and names[-1] == "turn_stop"
    [cancelled] = await _events(daemon, sid, "turn.cancelled")
    assert cancelled["reason"] == "user_cancel"


async def test_delete_during_a_stream_ends_it_with_error(fake_aap: Fake) -> None:
    _, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply.say("w" * 400, **SLOW))
    sid = await aap.create()

    async def delete() -> int:
        return (await aap.request("DELETE", f"/sessions/{sid}")).status

    body = {"stream": "delta", "messages": [{"role": "user", "content": "go"}]}
    parser = SseParser()
    async with aap.http.post(f"/aap/sessions/{sid}/turns", json=body, headers=aap.auth()) as r:
        await fake.wait_until(lambda: any(x.events_sent > 3 for x in fake.requests))
        status = await delete()
        async for chunk in r.content.iter_any():
            parser.feed(chunk)
    assert status == 204
    assert parser.events[-1].event == "turn_stop"
    assert parser.events[-1].json() == {"stopReason": "error"}
    assert (await aap.request("GET", f"/sessions/{sid}")).status == 404


async def test_concurrent_turn_is_409(fake_aap: Fake) -> None:
    _, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply.say("v" * 200, **SLOW))
    sid = await aap.create()

    async def second() -> tuple[int, str]:
        reply = await aap.say(sid, "me too")
        return reply.status, reply.error

    names, outcome = await _stream_while(aap, sid, second, fake)
    assert outcome == (409, "turn_in_flight")
    assert names[-1] == "turn_stop"


async def test_heartbeats_are_comments_the_parser_ignores(
    api_key: str, fake: FakeProviderServer, start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    overrides = roots(workspace)
    overrides["aap"]["sse_heartbeat_seconds"] = 0.1
    daemon = await start_daemon(models=fake_models(fake), **overrides)
    aap = await client_for(daemon)
    fake.enqueue("anthropic", FakeReply.call("shell", {"command": "sleep 0.6; echo done"}))
    sid = await aap.create(tools=[{"name": "shell", "trust": True}])
    reply = await aap.say(sid, "run it", "delta")
    check_stream(reply, "delta")
    assert reply.comments.count("keepalive") >= 2
    [result] = reply.data("tool_result")
    assert "done" in result["content"] and reply.stop == "end_turn"


async def test_image_reaches_the_provider(fake_aap: Fake) -> None:
    _, aap, fake = fake_aap
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x01" * 40).decode()
    sid = await aap.create()
    content = [
        {"type": "text", "text": "what is this"},
        {"type": "image", "url": f"data:image/png;base64,{png}"},
    ]
    reply = await aap.turn(sid, [{"role": "user", "content": content}])
    assert reply.status == 200
    body = fake.requests_for("anthropic")[-1].body
    assert png in json.dumps(body)
    [user, _] = await aap.history(sid)
    assert user == {"role": "user", "content": content}


async def test_a_slow_reader_still_gets_every_event(fake_aap: Fake) -> None:
    _, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply.say("abcdefghij" * 300, chunk_chars=3))
    sid = await aap.create()
    body = {"stream": "delta", "messages": [{"role": "user", "content": "go"}]}
    parser = SseParser()
    base = str(aap.http._base_url)  # type: ignore[attr-defined]
    async with (
        aiohttp.ClientSession(base_url=base, read_bufsize=256) as slow,
        slow.post(f"/aap/sessions/{sid}/turns", json=body, headers=aap.auth()) as r,
    ):
        while chunk := await r.content.read(64):
            parser.feed(chunk)
            await asyncio.sleep(0.001)
    assert parser.events[-1].json() == {"stopReason": "end_turn"}
    text = "".join(e.json()["delta"] for e in parser.events if e.event == "text_delta")
    assert text == "abcdefghij" * 300


@pytest.mark.parametrize("choice", ["given", "fresh2"])
async def test_v1_put_refused_by_routing_leaves_no_session_and_no_scratch_directory(
    fake_aap: Fake, choice: str
) -> None:
    daemon, aap, _ = fake_aap
    daemon.core.availability.record_failure("anthropic:claude-haiku-4-5", "auth")
    before = await daemon.core.db.fetchone("SELECT COUNT(*) FROM sessions")
    body = {
        "agent": {
            "name": "metis",
            "options": {"workspace": aap.workspace if choice == "given" else choice},
        },
        "stream": "delta",
        "messages": [{"role": "user", "content": "hi"}],
    }
    reply = await aap.v1.request("PUT", "/session", body)
    assert reply.status == 503 and reply.error == "routing_failed"
    after = await daemon.core.db.fetchone("SELECT COUNT(*) FROM sessions")
    assert tuple(before) == tuple(after)
    assert (await aap.v1.request("GET", "/sessions")).body["sessions"] == []
    assert not (daemon.settings.home / "workspaces" / "fresh2").exists()


async def test_a_reader_that_stops_reading_cancels_the_turn(
    api_key: str, fake: FakeProviderServer, start_daemon: Any, workspace: Path
) -> None:
    """A stream reader that takes nothing for `websocket.slow_client_timeout_s` while the turn
    waits for room in its queue has gone: the turn is cancelled as `client_disconnect`. (A
    reader that keeps reading gets every delta: tests/aap/test_burst_delivery.py.)"""
    overrides = roots(workspace)
    overrides["aap"]["stream_queue_limit"] = 3
    daemon = await start_daemon(
        models=fake_models(fake), websocket={"slow_client_timeout_s": 0.5}, **overrides
    )
    # 10 MB of deltas: far more than the kernel's socket buffers hold for a reader that stops.
    fake.enqueue("anthropic", FakeReply.say("x" * 10_000_000, chunk_chars=2_000, single_write=True))
    async with aiohttp.ClientSession(base_url=daemon.base_url) as http:
        aap = AapClient(http, api_key, workspace=str(workspace.resolve()))
        sid = await aap.create()
    body = json.dumps({"stream": "delta", "messages": [{"role": "user", "content": "flood me"}]})
    request = (
        f"POST /aap/sessions/{sid}/turns HTTP/1.1\r\nHost: 127.0.0.1:{daemon.port}\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    )
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", daemon.port))
        await loop.sock_sendall(sock, request.encode())  # then never read a byte
        async with asyncio.timeout(30):
            while not await _events(daemon, sid, "turn.cancelled"):
                await asyncio.sleep(0.1)
    finally:
        sock.close()
    [cancelled] = await _events(daemon, sid, "turn.cancelled")
    assert cancelled["reason"] == "client_disconnect"


async def test_message_mode_keeps_an_idle_stream_alive_while_the_model_writes(
    api_key: str, fake: FakeProviderServer, start_daemon: Any, client_for: Any, workspace: Path
) -> None:
    """In message mode the deltas of a long reply reach the response but write nothing: that is
    silence on the wire, so keepalives must flow while they arrive (not only when no event
    comes at all), or a proxy's idle timeout cuts the stream before the text is sent."""
    overrides = roots(workspace)
    overrides["aap"]["sse_heartbeat_seconds"] = 0.5
    daemon = await start_daemon(models=fake_models(fake), **overrides)
    aap = await client_for(daemon)
    fake.enqueue("anthropic", FakeReply.say("y" * 240, **SLOW))  # ≥3.6 s of deltas
    sid = await aap.create()
    body = {"stream": "message", "messages": [{"role": "user", "content": "go"}]}
    parser = SseParser()
    loop = asyncio.get_running_loop()
    arrivals: list[float] = []
    async with aap.http.post(f"/aap/sessions/{sid}/turns", json=body, headers=aap.auth()) as r:
        async for chunk in r.content.iter_any():
            arrivals.append(loop.time())
            parser.feed(chunk)
    assert [e.event for e in parser.events] == ["turn_start", "text", "turn_stop"]
    assert parser.events[1].json() == {"text": "y" * 240}
    assert parser.comments.count("keepalive") >= 2
    longest = max(b - a for a, b in itertools.pairwise(arrivals))
    assert longest < 2.0, f"{longest:.1f} s without a byte"


async def test_message_mode_notices_a_client_gone_while_the_model_writes(fake_aap: Fake) -> None:
    """A message-mode client that leaves while the model is still writing gets its turn
    cancelled then, not once the whole reply (and its cost) has been produced."""
    daemon, aap, fake = fake_aap
    fake.enqueue("anthropic", FakeReply.say("z" * 600, **SLOW))  # ≈9 s of deltas
    sid = await aap.create()
    body = {"stream": "message", "messages": [{"role": "user", "content": "go"}]}
    parser = SseParser()
    async with aap.http.post(f"/aap/sessions/{sid}/turns", json=body, headers=aap.auth()) as r:
        async for chunk in r.content.iter_any():
            if any(e.event == "turn_start" for e in parser.feed(chunk)):
                break
        await fake.wait_until(lambda: any(x.events_sent > 3 for x in fake.requests))
    async with asyncio.timeout(4):
        while not (cancelled := await _events(daemon, sid, "turn.cancelled")):
            await asyncio.sleep(0.05)
    assert cancelled[0]["reason"] == "client_disconnect"
    [request] = fake.requests
    assert request.events_sent < 400  # the reply was cut, not streamed to its end
