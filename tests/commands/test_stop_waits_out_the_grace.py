"""`metis stop` waits as long as the daemon may take: twice the shutdown grace config.yaml
gives it. A daemon given a grace shorter or longer than the default is not waited for a
minute, or called stuck (with `kill -9` proposed) while still within its grace."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from metis.server.lock import LOCK_FILE
from tests.cli import metis
from tests.commands.test_detach_and_stop import HOLDER


@pytest.fixture
async def slow_to_stop(metis_home: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """A process holding the home's lock that answers SIGTERM with "TERM" and goes on."""
    metis_home.mkdir(mode=0o700)
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, str(metis_home / LOCK_FILE), stdout=asyncio.subprocess.PIPE
    )
    assert holder.stdout is not None
    try:
        assert (await holder.stdout.readline()).strip() == b"READY"
        yield holder
    finally:
        holder.kill()
        await holder.wait()


async def test_stop_waits_twice_the_configured_shutdown_grace(
    metis_home: Path, slow_to_stop: asyncio.subprocess.Process
) -> None:
    (metis_home / "config.yaml").write_text("limits:\n  shutdown_grace_s: 0.75\n")
    code, out, err = await metis("stop")
    assert (code, out) == (1, "")
    assert f"(pid {slow_to_stop.pid}) is still stopping after 1.5 s;" in err, err
