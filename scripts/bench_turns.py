"""Benchmark: POST /sessions/{id}/turns → turn.completed, 100 turns of one session.

The fake provider runs in its own process and streams a 200-delta reply per call with no delay,
so what is measured is the daemon: HTTP handling, routing, the SDK adapter parsing the stream,
event emission, commits and the trace flush at the turn boundary. The turn's end is observed
in-process by a bus subscriber (no client polling in the measurement).

Goals (issue 5): p50 ≤ 5 ms of daemon time; turns 91–100 ≤ 1.2 × turns 1–10. Daemon time is
this process's CPU time per turn (the provider runs elsewhere); wall time is printed too.
Run: `python scripts/bench_turns.py [--turns 100] [--deltas 200]`.
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
from metis.server.runner import Daemon
from metis.testing.bench import bench_models_yaml, spawn_fake_provider, stop_process


async def run_turns(
    daemon: Daemon, url: str, workspace: str, turns: int, deltas: int, profile: str | None
) -> tuple[list[float], list[float]]:
    """(wall ms, daemon CPU ms) per turn; stops at the first turn that does not complete."""
    ended: dict[str, float] = {}
    outcome: dict[str, str] = {}
    waiters: dict[str, asyncio.Event] = {}

    def on_event(event: AnyEvent) -> None:
        if event.type in TURN_TERMINAL and event.turn_id:
            ended[event.turn_id] = time.perf_counter()
            outcome[event.turn_id] = event.type
            waiters.setdefault(event.turn_id, asyncio.Event()).set()

    daemon.core.bus.subscribe("bench", on_event)
    reply = {"text": "x" * (8 * deltas), "chunk_chars": 8, "repeat": turns}
    samples: list[float] = []
    cpu: list[float] = []
    async with aiohttp.ClientSession() as http:
        await http.post(f"{url}/_fake/enqueue", json={"api": "anthropic", "replies": [reply]})
        async with http.post(
            f"{daemon.base_url}/sessions",
            json={"workspace_path": workspace, "initial_active_model": "sonnet"},
        ) as r:
            session_id = (await r.json())["id"]
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        for i in range(turns):
            body = {"content": [{"type": "text", "text": f"turn {i}"}]}
            cpu_started = time.process_time()
            started = time.perf_counter()
            async with http.post(f"{daemon.base_url}/sessions/{session_id}/turns", json=body) as r:
                turn_id = (await r.json())["turn_id"]
            await waiters.setdefault(turn_id, asyncio.Event()).wait()
            if outcome[turn_id] != "turn.completed":
                raise SystemExit(f"turn {i + 1} ended with {outcome[turn_id]}; see the log")
            samples.append((ended[turn_id] - started) * 1000)
            cpu.append((time.process_time() - cpu_started) * 1000)
            await daemon.core.turns.wait_all()  # the slot is released before the next POST
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
    return samples, cpu


async def main(turns: int, deltas: int, profile: str | None) -> None:
    fake, url = await spawn_fake_provider()
    try:
        with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as workspace:
            Path(home, "models.yaml").write_text(bench_models_yaml(url))
            daemon = Daemon(load_settings(home=Path(home), port=0))
            await daemon.start()
            try:
                samples, cpu = await run_turns(daemon, url, workspace, turns, deltas, profile)
            finally:
                await daemon.stop()
    finally:
        await stop_process(fake)
    print(f"{turns} turns, {deltas} deltas each (fake provider in its own process)")
    for label, values in (("wall time", samples), ("daemon CPU time", cpu)):
        first, last = statistics.median(values[:10]), statistics.median(values[-10:])
        print(
            f"{label}: p50 {statistics.median(values):.2f} ms; turns 1–10 p50 {first:.2f} ms; "
            f"turns {turns - 9}–{turns} p50 {last:.2f} ms; ratio {last / first:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--profile", metavar="FILE", help="write cProfile stats of the turns here")
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.deltas, args.profile))
