"""What a 2xx acknowledged survives a SIGKILL that follows it at once, events included.

Session lifecycle events are flushed before the answer (every session has at least one event,
so a snapshot's `snapshot_at_event_id` is never null). A real `metis serve`
subprocess is killed right after each response and restarted on the same METIS_HOME.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from metis.testing.serving import free_port, spawn_serve, wait_until_serving
from tests.api import Api, home_headers
from tests.e2e.test_provider_turns import types_of


@asynccontextmanager
async def serving(metis_home: Path, log: Path) -> AsyncIterator[tuple[Api, Callable[[], Any]]]:
    """A `metis serve` subprocess and a way to SIGKILL it."""
    port = free_port()
    with log.open("ab") as out:
        proc = await spawn_serve(metis_home, port, output=out)

    async def kill() -> None:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()

    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/health")
            yield Api(http, home_headers(metis_home)), kill
    finally:
        await kill()


async def test_lifecycle_events_acknowledged_before_a_crash_are_kept(
    metis_home: Path, workspace: Path, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    async with serving(metis_home, log) as (api, kill):
        created = await api.create_session(workspace)
        await kill()
    async with serving(metis_home, log) as (api, kill):
        sid = created["id"]
        assert types_of(await api.events(sid)) == ["session.created"]
        status, _ = await api.call("PATCH", f"/sessions/{sid}", {"active_model": "scripted"})
        assert status == 200
        await kill()
    async with serving(metis_home, log) as (api, kill):
        assert types_of(await api.events(sid))[-1] == "session.model_changed"
        status, _ = await api.call("DELETE", f"/sessions/{sid}")
        assert status == 200
        await kill()
    async with serving(metis_home, log) as (api, _kill):
        assert types_of(await api.events(sid))[-1] == "session.ended"
        events = await api.events(sid)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
