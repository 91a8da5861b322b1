"""Subprocess for the crash test: emits events forever, reporting each committed seq.

Run as `python tests/core/store/crash_worker.py`; the parent SIGKILLs it mid-batch.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from metis.config import load_settings
from metis.core.runtime import Core
from tests.helpers import insert_running_turn, insert_session

GAP = {"missing_from_seq": 1, "missing_to_seq": 1, "detected_by": "writer"}


async def main() -> None:
    core = Core(load_settings())
    await core.start()
    sid = await insert_session(core.db)
    tid = await insert_running_turn(core.db, sid)
    print(f"session {sid} {tid}", flush=True)
    while True:
        for _ in range(50):
            core.bus.emit(sid, "bus.gap_detected", GAP, actor="system", turn_id=tid)
        await core.flush()
        print(f"committed {core.bus.last_seq(sid)}", flush=True)
        for _ in range(30):  # left pending: the kill lands while these are unflushed
            core.bus.emit(sid, "bus.gap_detected", GAP, actor="system", turn_id=tid)
        await asyncio.sleep(0.002)


if __name__ == "__main__":
    asyncio.run(main())
