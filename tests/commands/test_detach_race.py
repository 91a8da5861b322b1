"""Two `metis serve --detach` on one home at once: the one whose daemon loses the race for
the home's lock says which daemon runs there, as a second start does when it finds the home
taken, not "did not start" with the log of the daemon that won."""

from __future__ import annotations

import asyncio
from pathlib import Path

from metis.testing.serving import free_port
from tests.cli import start_metis
from tests.helpers import named_by_home_lock


async def test_a_detached_start_that_loses_the_lock_names_the_daemon_that_won(
    metis_home: Path,
) -> None:
    port = free_port()
    proc = await start_metis("serve", "--detach", "--port", str(port))
    log = metis_home / "logs" / "daemon.log"
    async with asyncio.timeout(30):  # its child is being started: the home was free
        while not log.exists():
            await asyncio.sleep(0.005)
    winner = "http://127.0.0.1:1"
    with named_by_home_lock(metis_home, winner):  # another daemon takes the home first
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    said = err.decode()
    assert proc.returncode == 1, said
    assert out == b""
    assert said.startswith(f"metis: a metis daemon is already running on {metis_home}: pid "), said
    assert f" at {winner}." in said and "did not start" not in said
