"""A second Ctrl-C while `metis serve` shuts down gives the terminal back at once: the daemon
exits 130 without waiting for what is slow to stop (here an MCP server that ignores SIGTERM,
which the shutdown would otherwise wait seconds for), and the next start reaps what it left."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from metis.testing.serving import free_port, spawn_serve, wait_until_serving

MARK = "61.25"  # the stubborn server's `sleep` argument, to find its process


def stubborn_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", MARK.encode()]:
            pids.append(int(entry.name))
    return pids


async def until(check: Callable[[], bool], seconds: float) -> bool:
    for _ in range(int(seconds / 0.05)):
        if check():
            return True
        await asyncio.sleep(0.05)
    return check()


async def test_a_second_ctrl_c_exits_at_once_and_the_next_start_reaps_what_was_left(
    metis_home: Path, tmp_path: Path, start_daemon: Callable[..., Any]
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "config.yaml").write_text(
        "mcp:\n  servers:\n    stubborn:\n      command: sh\n"
        f"      args: ['-c', \"trap '' TERM; exec sleep {MARK}\"]\n"
    )
    port = free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        offline = {**os.environ, "METIS_OFFLINE": "1"}
        proc = await spawn_serve(metis_home, port, output=log, environ=offline)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/health")
        assert await until(lambda: bool(stubborn_pids()), 10), log_path.read_text()
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(0.3)  # the shutdown is under way, waiting for the server
        assert proc.returncode is None
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 2) == 130, log_path.read_text()
        said = log_path.read_text()
        assert "interrupted again: exiting without waiting for the shutdown to finish" in said
        assert stubborn_pids(), "left for the next start"
        await start_daemon(mcp={"servers": {}})  # none started again: only the reaping
        assert await until(lambda: not stubborn_pids(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for pid in stubborn_pids():
            os.kill(pid, signal.SIGKILL)
