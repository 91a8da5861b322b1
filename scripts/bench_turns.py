"""Benchmark: POST /sessions/{id}/turns → the turn's slot released, 100 turns of one session.

The fake provider runs in its own process and streams a 200-delta reply per call with no delay;
the client that posts the turns runs in another (as `bench_all.py`'s REST client does). What this
process spends is then the daemon's alone: HTTP handling, routing, the SDK adapter parsing the
stream, event emission, commits and the trace flush. A turn is timed from the moment the client
is told to post it to its release (terminal event emitted, its events stored, slot freed), seen
in-process (a bus subscriber and the slot's event; no client polling in the measurement).

Goals (issue 5): p50 ≤ 5 ms of daemon time; turns 91–100 ≤ 1.2 × turns 1–10. Daemon time is
this process's CPU time per turn (its SQLite threads included); wall time is printed too.

The growth figure compares turns 91–100 of the long session with turns 1–10 of a second, fresh
session run interleaved with them (one turn each, alternately): both sets are measured in the
same seconds, so the host's speed drifting during the run does not pass for growth. The long
session's own turns 1–10, measured a minute earlier, are printed for reference.

With `--context-tokens 20000` the long session outgrows its model's window after ~30 turns, so
its later turns are compacted at every model call while the fresh session's are not: the growth
figure then says what a session that filled its window pays per turn.
Run: `python scripts/bench_turns.py [--turns 100] [--deltas 200] [--context-tokens N]
[--profile FILE]`.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import http.client
import json
import statistics
import sys
import tempfile
import time
from asyncio.subprocess import PIPE
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
    """Has the client process post turns, and times each one to its release in this process."""

    def __init__(self, daemon: Daemon, http: aiohttp.ClientSession) -> None:
        self.daemon = daemon
        self.http = http
        self.headers = daemon_headers(daemon)
        self._client: asyncio.subprocess.Process | None = None
        self._waiting: dict[str, asyncio.Future[str]] = {}
        self._subscription = daemon.core.bus.subscribe("bench", self._on_event)

    def _on_event(self, event: AnyEvent) -> None:
        if event.type in TURN_TERMINAL:
            waiter = self._waiting.pop(event.session_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(event.type)

    async def __aenter__(self) -> TurnClock:
        key = self.headers["Authorization"].removeprefix("Bearer ")
        self._client = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--client",
            str(self.daemon.port),
            key,
            stdin=PIPE,
            stdout=PIPE,
        )
        assert self._client.stdout is not None
        if await self._client.stdout.readline() != b"READY\n":
            raise SystemExit("the client process did not start")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.daemon.core.bus.unsubscribe(self._subscription)
        client = self._client
        if client is not None and client.stdin is not None:
            client.stdin.close()
            await client.wait()

    async def session(self, workspace: str) -> str:
        body = {"workspace_path": workspace, "initial_active_model": "sonnet"}
        url = f"{self.daemon.base_url}/sessions"
        async with self.http.post(url, json=body, headers=self.headers) as r:
            return str((await r.json())["id"])

    async def turn(self, session_id: str, text: str) -> tuple[float, float]:
        """(wall ms, daemon CPU ms) of one turn; stops the run if it does not complete."""
        assert self._client is not None and self._client.stdin is not None
        ended = self._waiting[session_id] = asyncio.get_running_loop().create_future()
        cpu_started = time.process_time()
        started = time.perf_counter()
        self._client.stdin.write(f"{session_id} {text}\n".encode())
        try:
            async with asyncio.timeout(30):
                outcome = await ended
        except TimeoutError:
            raise SystemExit(f"no turn of {session_id} ended; see the client's error") from None
        await self.daemon.core.turns.wait_all()  # released: its events stored, slot free
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        if outcome != "turn.completed":
            raise SystemExit(f"a turn of {session_id} ended with {outcome}; see the log")
        return wall * 1000, cpu * 1000


def client_main(port: int, key: str) -> None:
    """The client process: one `POST …/turns` per line read (`session_id text`), each checked
    for its 202, over one keep-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    print("READY", flush=True)
    for line in sys.stdin:
        session_id, text = line.rstrip("\n").split(" ", 1)
        body = json.dumps({"content": [{"type": "text", "text": text}]})
        conn.request("POST", f"/sessions/{session_id}/turns", body, headers)
        response = conn.getresponse()
        answer = response.read()
        if response.status != 202:
            sys.exit(f"POST …/turns answered {response.status}: {answer[:500]!r}")


Samples = dict[str, list[tuple[float, float]]]


async def run_turns(
    daemon: Daemon, url: str, workspace: str, turns: int, deltas: int, profile: str | None
) -> Samples:
    """The long session's turns, then its last ten interleaved with a fresh session's first ten."""
    reply = bench_reply(deltas, repeat=turns + 10)
    async with aiohttp.ClientSession() as http, TurnClock(daemon, http) as clock:
        await http.post(f"{url}/_fake/enqueue", json={"api": "anthropic", "replies": [reply]})
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


async def main(turns: int, deltas: int, context_tokens: int, profile: str | None) -> None:
    fake, url = await spawn_fake_provider()
    try:
        with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as workspace:
            models = bench_models_yaml(url, context_tokens=context_tokens)
            Path(home, "models.yaml").write_text(models)
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
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(int(sys.argv[2]), sys.argv[3])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=200_000,
        help="the model's window; a small one (20000) compacts the long session's later turns",
    )
    parser.add_argument("--profile", metavar="FILE", help="write cProfile stats of the turns here")
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.deltas, args.context_tokens, args.profile))
