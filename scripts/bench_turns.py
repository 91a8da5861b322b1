"""Benchmark: POST /sessions/{id}/turns → turn.completed, 100 turns of one session.

The fake provider runs in its own process and streams a 200-delta reply per call with no delay,
so what is measured is the daemon: HTTP handling, routing, the SDK adapter parsing the stream,
event emission, commits and the trace flush at the turn boundary. The turn's end is observed
in-process by a bus subscriber (no client polling in the measurement).

Goals (issue 5): p50 ≤ 5 ms of daemon time; turns 91–100 ≤ 1.2 × turns 1–10. Daemon time is
this process's CPU time per turn (the provider runs elsewhere); wall time is printed too.

The growth figure compares turns 91–100 of the long session with turns 1–10 of a second, fresh
session run interleaved with them (one turn each, alternately): both sets are measured in the
same seconds, so the host's speed drifting during the run does not pass for growth. The long
session's own turns 1–10, measured a minute earlier, are printed for reference.
Run: `python scripts/bench_turns.py [--turns 100] [--deltas 200] [--profile FILE]`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from metis.config import load_settings
from metis.core.events.catalog import TURN_TERMINAL
from metis.core.events.envelope import AnyEvent
from metis.server.runner import Daemon, freeze_startup_heap
from metis.testing.bench import (
    bench_models_yaml,
    bench_reply,
    daemon_headers,
    spawn_fake_provider,
    stop_process,
)


class TurnClock:
    """Submits turns over REST and times each one to its terminal event on the bus."""

    def __init__(self, daemon: Daemon, http: aiohttp.ClientSession) -> None:
        self.daemon = daemon
        self.http = http
        self.headers = daemon_headers(daemon)
        self._ended: dict[str, tuple[float, str]] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        daemon.core.bus.subscribe("bench", self._on_event)

    def _on_event(self, event: AnyEvent) -> None:
        if event.type in TURN_TERMINAL and event.turn_id:
            self._ended[event.turn_id] = (time.perf_counter(), event.type)
            self._waiters.setdefault(event.turn_id, asyncio.Event()).set()

    async def session(self, workspace: str) -> str:
        body = {"workspace_path": workspace, "initial_active_model": "sonnet"}
        url = f"{self.daemon.base_url}/sessions"
        async with self.http.post(url, json=body, headers=self.headers) as r:
            return str((await r.json())["id"])

    async def turn(self, session_id: str, text: str) -> tuple[float, float]:
        """(wall ms, daemon CPU ms) of one turn; stops the run if it does not complete."""
        body = {"content": [{"type": "text", "text": text}]}
        url = f"{self.daemon.base_url}/sessions/{session_id}/turns"
        cpu_started = time.process_time()
        started = time.perf_counter()
        async with self.http.post(url, json=body, headers=self.headers) as r:
            turn_id = (await r.json())["turn_id"]
        await self._waiters.setdefault(turn_id, asyncio.Event()).wait()
        ended, outcome = self._ended[turn_id]
        if outcome != "turn.completed":
            raise SystemExit(f"turn {turn_id} ended with {outcome}; see the log")
        cpu = (time.process_time() - cpu_started) * 1000
        await self.daemon.core.turns.wait_all()  # the slot is released before the next POST
        return (ended - started) * 1000, cpu


Samples = dict[str, list[tuple[float, float]]]


async def run_turns(
    daemon: Daemon, url: str, workspace: str, turns: int, deltas: int, profile: str | None
) -> Samples:
    """The long session's turns, then its last ten interleaved with a fresh session's first ten."""
    reply = bench_reply(deltas, repeat=turns + 10)
    async with aiohttp.ClientSession() as http:
        await http.post(f"{url}/_fake/enqueue", json={"api": "anthropic", "replies": [reply]})
        clock = TurnClock(daemon, http)
        long_session, fresh_session = await clock.session(workspace), await clock.session(workspace)
        samples: Samples = {"long": [], "fresh": []}
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        for i in range(turns - 10):
            samples["long"].append(await clock.turn(long_session, f"turn {i}"))
        for i in range(10):
            samples["fresh"].append(await clock.turn(fresh_session, f"turn {i}"))
            samples["long"].append(await clock.turn(long_session, f"turn {turns - 10 + i}"))
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
    return samples


async def main(turns: int, deltas: int, profile: str | None) -> None:
    fake, url = await spawn_fake_provider()
    try:
        with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as workspace:
            Path(home, "models.yaml").write_text(bench_models_yaml(url))
            daemon = Daemon(load_settings(home=Path(home), port=0))
            await daemon.start()
            await daemon.warmed()  # the SDKs imported in the background are in
            freeze_startup_heap()  # as `metis serve` does
            try:
                samples = await run_turns(daemon, url, workspace, turns, deltas, profile)
            finally:
                await daemon.stop()
    finally:
        await stop_process(fake)
    print(f"{turns} turns, {deltas} deltas each (fake provider in its own process)")
    for column, label in ((1, "daemon CPU time"), (0, "wall time")):
        long = [s[column] for s in samples["long"]]
        fresh = statistics.median(s[column] for s in samples["fresh"])
        late = statistics.median(long[-10:])
        print(
            f"{label}: p50 {statistics.median(long):.2f} ms; turns {turns - 9}–{turns} p50 "
            f"{late:.2f} ms vs a fresh session's turns 1–10 p50 {fresh:.2f} ms (same seconds): "
            f"ratio {late / fresh:.2f}; this session's turns 1–10 p50 "
            f"{statistics.median(long[:10]):.2f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--profile", metavar="FILE", help="write cProfile stats of the turns here")
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.deltas, args.profile))
