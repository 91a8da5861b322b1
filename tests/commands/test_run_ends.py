"""How `metis run` leaves the session it made when the run does not end the usual way: its
terminal closing under it (SIGHUP), and a daemon that stops during the turn and so cannot end
the session afterwards."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.server.runner import Daemon
from tests.api import Api
from tests.cli import start_metis
from tests.ws_client import SLOW_SCRIPTED

PROMPT = "a reply long enough to be cut off " * 4


async def test_a_hangup_during_the_turn_cancels_it_and_ends_the_session_it_made(
    start_daemon: Callable[..., Any], workspace: Path, api_of: Callable[[Daemon], Api]
) -> None:
    """The terminal a run was started from closes: the turn is not left running (and asking
    questions) in a session nobody follows."""
    d = await start_daemon(models=SLOW_SCRIPTED)
    proc = await start_metis("run", PROMPT, "--workspace", str(workspace), "--url", d.base_url)
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.read(1), 30)  # the reply is streaming
    proc.send_signal(signal.SIGHUP)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    said = err.decode()
    assert proc.returncode == 1, said
    assert "metis: hung up: cancelling the turn\n" in said and "Traceback" not in said
    [session] = (await api_of(d).call("GET", "/sessions?status=all"))[1]["sessions"]
    _, session = await api_of(d).call("GET", f"/sessions/{session['id']}")
    assert session["current_turn_id"] is None and session["ended_at"] is not None


async def test_a_session_the_stopping_daemon_could_not_end_is_said_to_be_left_active(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    proc = await start_metis(
        "run", PROMPT, "--json", "--workspace", str(workspace), "--url", d.base_url
    )
    async with asyncio.timeout(30):  # the turn runs
        while not len(d.core.slots):
            await asyncio.sleep(0.02)
    await d.stop()  # `metis stop`, say: the run's end of its session is refused
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    said = err.decode()
    assert proc.returncode == 1, said
    ended = json.loads(out)
    sid = ended["session_id"]
    assert (ended["status"], ended["reason"]) == ("cancelled", "server_shutdown"), ended
    assert f"metis: session {sid} was left active" in said, said
    assert f"`metis sessions end {sid}`" in said, said


def _ignoring_hangups() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup` starts a command


async def test_a_run_started_under_nohup_goes_on_through_a_hangup(
    start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(models=SLOW_SCRIPTED)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "metis.cli",
        "run",
        "a short reply",
        "--workspace",
        str(workspace),
        "--url",
        d.base_url,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=_ignoring_hangups,
    )
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.read(1), 30)  # the reply is streaming
    proc.send_signal(signal.SIGHUP)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "hung up" not in err.decode()
