"""`metis serve` in the foreground when its terminal goes away (SIGHUP): the daemon stops as on
Ctrl-C, so the turn it was running is cancelled for the shutdown and stored so, rather than
left for the next start to find interrupted (with, when the shell is not sandboxed, the
command it was running left behind)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from metis.testing.serving import (
    SERVE_START_DEADLINE_S,
    free_port,
    spawn_serve,
    wait_until_serving,
)
from tests.api import Api, home_headers

SLOW = """
pricing_version: "test"
providers:
  local: {adapter: scripted, options: {chunk_chars: 1, delta_delay_ms: 100}}
models:
  - id: local:scripted
"""


async def test_a_hangup_stops_the_daemon_as_ctrl_c_does(
    metis_home: Path,
    workspace: Path,
    tmp_path: Path,
    start_daemon: Callable[..., Any],
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "models.yaml").write_text(SLOW)
    port = free_port()
    with (tmp_path / "serve.log").open("wb") as log:
        proc = await spawn_serve(metis_home, port, output=log)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/health")
            api = Api(http, home_headers(metis_home))
            sid = (await api.create_session(workspace))["id"]
            status, accepted = await api.submit(sid, "a reply long enough to be cut short")
            assert status == 202, accepted
            await api.wait_for_event(
                sid, lambda e: e["type"] == "llm.call_started", SERVE_START_DEADLINE_S
            )
        proc.send_signal(signal.SIGHUP)
        assert await asyncio.wait_for(proc.wait(), 30) == 0, (tmp_path / "serve.log").read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    again = await start_daemon()
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{again.port}") as http:
        api = Api(http, home_headers(metis_home))
        ends = await api.events(sid, event_types="turn.completed,turn.cancelled,turn.failed")
    assert [(e["type"], e["payload"]["reason"]) for e in ends] == [
        ("turn.cancelled", "server_shutdown")
    ]


def _ignoring_hangups() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup` starts a command


async def test_a_daemon_started_under_nohup_keeps_serving_through_a_hangup(
    metis_home: Path, tmp_path: Path
) -> None:
    port = free_port()
    with (tmp_path / "serve.log").open("wb") as log:
        proc = await spawn_serve(metis_home, port, output=log, preexec_fn=_ignoring_hangups)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/health")
            proc.send_signal(signal.SIGHUP)
            for _ in range(3):  # the loop has long seen a signal that came
                async with http.get("/health") as r:
                    assert r.status == 200
        assert proc.returncode is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_a_daemon_whose_stdout_reader_is_gone_serves_and_stops_cleanly(
    metis_home: Path, tmp_path: Path
) -> None:
    """`metis serve | something` whose reader has exited: the banner cannot be written. The
    daemon serves all the same (its logs go to stderr), and stops on SIGTERM, instead of
    saying it cannot start while its process lives on holding the store."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the banner
    port = free_port()
    key = {"METIS_API_KEY": "k" * 32}  # a first start's note of the key it made goes there too
    try:
        with (tmp_path / "serve.log").open("wb") as log:
            proc = await spawn_serve(
                metis_home, port, output=log, environ={**os.environ, **key}, stdout=write_end
            )
    finally:
        os.close(write_end)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            try:
                await wait_until_serving(http, "/health", deadline_s=30)
            except AssertionError:
                raise AssertionError((tmp_path / "serve.log").read_text()) from None
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0, (tmp_path / "serve.log").read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
