"""The stdio transport's stop, with a real process: what happens when it is cut short."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import anyio

from metis.core.tools.groups import ProcessGroupLedger
from metis.core.tools.mcp.transport import (
    Liveness,
    StdioProcess,
    server_environment,
    stdio_transport,
)
from tests.processes import gone


async def test_a_stop_cut_short_kills_the_group_at_once_and_keeps_its_note(tmp_path: Path) -> None:
    """A shutdown past its grace cancels the owner task while the transport stops a server
    that ignores SIGTERM: the group is SIGKILLed there and then, and its note stays in the
    ledger for the next start (it leaves only once the process is known to have exited)."""
    ledger = ProcessGroupLedger(tmp_path / "groups")
    started: list[StdioProcess] = []

    async def connection() -> None:
        async with stdio_transport(
            "/bin/sh",
            ("-c", "trap '' TERM; exec sleep 1003"),
            server_environment({}),
            None,
            ledger=ledger,
            stderr_path=None,
            started=started,
        ):
            await anyio.sleep(3600)

    task = asyncio.create_task(connection())
    while not started:
        await asyncio.sleep(0.01)
    pid = started[0].pid
    task.cancel()  # the stop begins: stdin closed, then a grace before SIGTERM
    await asyncio.sleep(0.3)
    task.cancel()  # and is cut short
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert await gone(pid, timeout_s=1.0)  # not after the 4 s the whole stop would take
    assert (tmp_path / "groups" / str(pid)).exists()


def test_a_stray_stdout_line_is_kept_once_escaped_and_cut() -> None:
    """The first line that is not JSON-RPC says why a server never answered; it is the server's
    text, shown to a person: its control characters escaped, cut to 80 characters."""
    process = StdioProcess(1, "m", Liveness())
    process.note_stray("\x1b[2Jlistening on " + "x" * 200 + "\n")
    process.note_stray("second line")
    assert process.stray_line == repr("\x1b[2Jlistening on " + "x" * 62 + "…")
    assert "\x1b" not in process.stray_line
