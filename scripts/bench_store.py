"""Benchmark: events/s through the bus and the trace writer into SQLite, and /health p50.

Goals (issue 2): ≥ 20,000 events/s on a 2-core machine; /health p50 < 1 ms with 0 and with
10,000 stored sessions. Run: `python scripts/bench_store.py`.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from metis.config import load_settings
from metis.core.canonical.ids import new_session_id
from metis.core.canonical.times import now_us
from metis.core.runtime import Core
from metis.server.runner import Daemon, freeze_startup_heap

EVENTS = 100_000
STREAMS = 10
STARTED = {
    "request_id": "r",
    "attempt": 1,
    "message_id": "m",
    "model": "local:scripted",
    "provider": "local",
    "estimated_input_tokens": 100,
    "max_output_tokens": 1000,
}


async def bench_events(home: Path) -> float:
    core = Core(load_settings(home=home, port=0))
    await core.start()
    sessions = [new_session_id() for _ in range(STREAMS)]
    stamp = now_us()
    async with core.db.write() as conn:
        await conn.executemany(
            "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, created_at_us, updated_at_us) "
            "VALUES (?, '/tmp', 'v', 'active', ?, ?)",
            [(s, stamp, stamp) for s in sessions],
        )
    t0 = time.perf_counter()
    for i in range(EVENTS):
        core.bus.emit(sessions[i % STREAMS], "llm.call_started", STARTED, actor="agent")
        if i % 500 == 0:
            await asyncio.sleep(0)  # let the writer run, as a live daemon would
    await core.flush()
    elapsed = time.perf_counter() - t0
    stored = (await core.db.fetchone("SELECT COUNT(*) FROM events WHERE session_id != 'system'"))[0]
    assert stored == EVENTS, stored
    await core.stop()
    return EVENTS / elapsed


async def health_p50(session: aiohttp.ClientSession, n: int = 500) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with session.get("/health") as r:
            await r.read()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1000


async def bench_health(home: Path) -> tuple[float, float]:
    daemon = Daemon(load_settings(home=home, port=0))
    await daemon.start()
    await daemon.warmed()  # the SDKs imported in the background are in
    freeze_startup_heap()  # as `metis serve` does
    async with aiohttp.ClientSession(base_url=daemon.base_url) as session:
        empty = await health_p50(session)
        stamp = now_us()
        async with daemon.core.db.write() as conn:
            await conn.executemany(
                "INSERT INTO sessions (id, workspace_path, routing_policy_version, status, created_at_us, "
                "updated_at_us) VALUES (?, '/tmp', 'v', 'active', ?, ?)",
                [(new_session_id(), stamp, stamp) for _ in range(10_000)],
            )
        full = await health_p50(session)
    await daemon.stop()
    return empty, full


async def main() -> None:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        rate = await bench_events(Path(a))
        empty, full = await bench_health(Path(b))
    print(f"bus + trace writer: {rate:,.0f} events/s ({EVENTS:,} events, {STREAMS} streams)")
    print(
        f"/health p50 (client round trip, loopback): {empty:.3f} ms with 0 sessions, {full:.3f} ms with 10,000"
    )


if __name__ == "__main__":
    asyncio.run(main())
