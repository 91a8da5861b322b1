"""A reply delivered in one socket write reaches every client that keeps reading, whole.

The fake provider writes the whole event stream at once, so the SDK parses every delta from
one buffer and the turn emits thousands of events without waiting on the network. Clients
that read must still get every frame (the turn waits for their queues to drain); the queue
bound only ever closes a client that stops reading (tests/server/ws/test_backpressure.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.testing import FakeProviderServer, FakeReply
from tests.api import Api, api_session
from tests.ws_client import RawWs, Ws, fake_models, types_of


@pytest.mark.parametrize(("deltas", "readers"), [(5_000, 1), (5_000, 10), (50_000, 1)])
async def test_a_single_write_reply_reaches_every_reading_client_whole(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    workspace: Path,
    deltas: int,
    readers: int,
) -> None:
    daemon = await start_daemon(models=fake_models(fake))
    assert deltas > daemon.settings.websocket.queue_max_events  # the bound a burst used to hit
    text = "".join(f"{i % 10}" for i in range(deltas))
    fake.enqueue("anthropic", FakeReply.say(text, chunk_chars=1, single_write=True))
    async with api_session(daemon) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        clients = [(await Ws.subscribed(api, sid))[0] for _ in range(readers)]
        status, accepted = await api.submit(sid, "burst")
        assert status == 202, accepted
        turns = await asyncio.gather(
            *(client.turn(accepted["turn_id"], timeout=120) for client in clients)
        )
        for events in turns:
            assert types_of(events)[-1] == "turn.completed"
            received = [e["payload"]["text"] for e in events if e["type"] == "text.delta"]
            assert len(received) == deltas and "".join(received) == text
        for client in clients:
            await client.close()


async def test_a_client_that_stops_reading_during_a_burst_is_closed_and_the_turn_goes_on(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """The turn waits for its readers only while they read: a socket that takes nothing for
    `slow_client_timeout_s` is closed 1008 `client_too_slow`, and a reader beside it still
    receives the whole reply."""
    daemon = await start_daemon(
        models=fake_models(fake),
        websocket={"queue_max_events": 50, "slow_client_timeout_s": 0.5},
    )
    deltas = 20_000
    text = "".join(f"{i % 10}" for i in range(deltas))
    fake.enqueue("anthropic", FakeReply.say(text, chunk_chars=1, single_write=True))
    async with api_session(daemon) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        _status, body = await api.call("GET", f"/sessions/{sid}")
        stalled = await RawWs.connect(
            "127.0.0.1", daemon.port, f"/sessions/{sid}/stream?attach={body['attach_token']}"
        )
        await stalled.send_text('{"type":"subscribe"}')
        reader, _ = await Ws.subscribed(api, sid)
        status, accepted = await api.submit(sid, "burst")
        assert status == 202, accepted
        events = await reader.turn(accepted["turn_id"], timeout=60)
        assert types_of(events)[-1] == "turn.completed"
        assert "".join(e["payload"]["text"] for e in events if e["type"] == "text.delta") == text
        _frames, code, reason = await stalled.read_until_close()
        stalled.close()
        assert code == 1008 and reason is not None and reason["code"] == "client_too_slow"
        await reader.close()
