"""Backpressure: a client that stops reading is closed with
1008 `client_too_slow` right after its queue overflows — out of band, not behind its backlog —
while a second client on the same session receives every event and `emit` never waits.

The stalled client is a raw socket with a tiny receive buffer that simply stops reading, so the
server's writes back up within a few hundred kilobytes. Volume comes straight from the real bus.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from metis.server.runner import Daemon
from tests.api import Api, api_session
from tests.helpers import model_changed, text_delta
from tests.ws_client import RawWs, Ws, events_of

QUEUE = 50


@pytest.fixture
async def setup(
    start_daemon: Callable[..., Any], workspace: Path
) -> AsyncIterator[tuple[Daemon, Api, str]]:
    d = await start_daemon(websocket={"queue_max_events": QUEUE})
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        yield d, api, sid


def emit_burst(core: Any, sid: str, n: int, size: int) -> list[float]:
    """`n` events (a bus event every fourth) of about `size` bytes; returns each emit's time."""
    timings = []
    for i in range(n):
        started = time.perf_counter()
        if i % 4 == 0:
            model_changed(core, sid)
        else:
            text_delta(core, sid, "x" * size)
        timings.append(time.perf_counter() - started)
    return timings


async def test_a_stalled_client_is_closed_1008_at_once_and_others_get_everything(
    setup: tuple[Daemon, Api, str],
) -> None:
    d, api, sid = setup
    core = d.core
    _status, body = await api.call("GET", f"/sessions/{sid}")
    stalled = await RawWs.connect(
        "127.0.0.1", d.port, f"/sessions/{sid}/stream?attach={body['attach_token']}"
    )
    await stalled.send_text('{"type":"subscribe"}')
    healthy, _ = await Ws.subscribed(api, sid)
    received: list[dict[str, Any]] = []

    async def read_all() -> None:
        while True:
            received.append(await healthy.recv())

    reader = asyncio.create_task(read_all())
    emitted = 0
    timings: list[float] = []
    async with asyncio.timeout(20):
        while core.hub.client_count(sid) == 2:  # until the stalled client overflows
            timings += emit_burst(core, sid, 10, 8_000)
            emitted += 10
            await asyncio.sleep(0.002)  # the healthy client keeps up
    overflowed_at = emitted
    timings += emit_burst(core, sid, 40, 8_000)  # the session goes on for everyone else
    emitted += 40
    async with asyncio.timeout(10):
        while len(received) < emitted:
            await asyncio.sleep(0.01)
    reader.cancel()
    assert len(received) == emitted and all(f["type"] == "event" for f in received)
    # The stalled client now reads: what was already in flight, then the close — the rest
    # of its backlog (at least the queue's capacity) was discarded, not delivered first.
    frames, code, reason = await stalled.read_until_close()
    stalled.close()
    assert code == 1008 and reason is not None and reason["code"] == "client_too_slow"
    assert len(frames) <= overflowed_at - QUEUE
    got = events_of(frames[1:])
    assert got == events_of(received)[: len(got)]  # no gap before the close: a clean prefix
    # emit never waits on a client: typical emits stay tiny however far behind the stalled
    # socket is (the median, because a starved VM can stall any single call for 100s of ms)
    assert statistics.median(timings) < 0.005
    # Recovery: a new token and since = the last bus event it saw gets exactly the gap.
    last = [e for e in got if "id" in e][-1]
    again, ack = await Ws.subscribed(api, sid, since=last["id"])
    missed = [e for e in events_of(received) if "id" in e and e["seq"] > last["seq"]]
    assert ack["replay_event_count"] == len(missed)
    assert events_of(await again.take(len(missed))) == missed
    await again.close()
    await healthy.close()


async def test_a_client_that_pings_but_never_reads_is_closed_1008(
    setup: tuple[Daemon, Api, str],
) -> None:
    """Pongs are control frames, outside the event queue; a client flooding pings without
    reading must not grow the daemon's memory without bound: past the queue's size it is
    closed like any client too slow."""
    d, api, sid = setup
    _status, body = await api.call("GET", f"/sessions/{sid}")
    flooder = await RawWs.connect(
        "127.0.0.1", d.port, f"/sessions/{sid}/stream?attach={body['attach_token']}"
    )
    await flooder.send_text('{"type":"subscribe"}')
    ping = '{"type":"ping","nonce":"' + "n" * 60 + '"}'
    async with asyncio.timeout(20):
        while d.core.hub.client_count(sid) == 1:
            for _ in range(200):
                await flooder.send_text(ping)
            await asyncio.sleep(0.001)
    _frames, code, reason = await flooder.read_until_close()
    flooder.close()
    assert code == 1008 and reason is not None and reason["code"] == "client_too_slow"
