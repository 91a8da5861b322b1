"""Ctrl-C in a one-shot command waiting for a daemon that does not answer (stopped, stuck: a
call then waits up to a minute) ends it as a shell expects, exit 130 with one line, not
with a Python traceback."""

from __future__ import annotations

import asyncio
import signal

import pytest

from tests.cli import start_metis


@pytest.mark.parametrize(
    "command",
    [("sessions", "list"), ("status",), ("mcp", "list"), ("models",)],
    ids=lambda c: " ".join(c),
)
async def test_ctrl_c_while_a_command_waits_for_the_daemon_ends_it_quietly(
    command: tuple[str, ...],
) -> None:
    connected = asyncio.Event()
    silent = await asyncio.start_server(lambda *_: connected.set(), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        proc = await start_metis(*command, "--url", url)
        await asyncio.wait_for(connected.wait(), 30)  # it waits for an answer now
        proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        silent.close()
    said = err.decode()
    assert proc.returncode == 130, said
    assert "Traceback" not in said and said.endswith("metis: interrupted\n"), said
    assert out == b""
