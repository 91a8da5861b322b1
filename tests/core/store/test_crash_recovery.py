"""A SIGKILLed daemon process loses nothing it committed, and its running turn is failed."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from metis.config import Settings
from metis.core.runtime import Core

WORKER = Path(__file__).with_name("crash_worker.py")


async def test_kill_mid_batch_keeps_every_committed_event_and_fails_the_turn(
    make_settings: Callable[..., Settings], metis_home: Path
) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "METIS_HOME": str(metis_home)},
    )
    assert proc.stdout is not None
    _, sid, tid = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split()
    committed = 0
    for _ in range(8):
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split()
        committed = int(line[1])
    proc.send_signal(signal.SIGKILL)
    await proc.wait()

    core = Core(make_settings())
    await core.start()
    try:
        rows = await core.db.fetchall(
            "SELECT seq, type FROM events WHERE session_id=? ORDER BY seq", (sid,)
        )
        seqs = [r["seq"] for r in rows]
        assert seqs == list(range(1, len(seqs) + 1)), "no holes and no repeated seq"
        assert len(seqs) > committed, "everything reported committed survived"
        assert [r["type"] for r in rows].count("turn.failed") == 1
        assert rows[-1]["type"] == "turn.failed"
        turn = await core.db.fetchone("SELECT status, end_reason FROM turns WHERE id=?", (tid,))
        assert (turn["status"], turn["end_reason"]) == ("failed", "daemon_restart")
    finally:
        await core.stop()
