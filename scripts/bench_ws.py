#!/usr/bin/env python3
"""WebSocket delivery benchmark (issue goals: ≥ 40,000 frames/s to 1 client, ≥ 250,000 frames/s
in total to 10 clients on one session).

Setup: the fake provider in its own process, the daemon in this process (real REST, real SQLite,
the real Anthropic adapter), the WebSocket clients in a third process and the client that posts
the turns (`bench_turns.TurnClock`) in a fourth. The clients are raw
sockets that count frames without decoding JSON, so the figures measure the daemon, not the
client. A run is 30 back-to-back turns of 200 text deltas each (207 frames per turn with the
turn's bus events).

Two figures per client count:
- end to end: frames received / time from the first to the last frame. The provider pipeline
  (HTTP request, the SDK's SSE parsing, commits) sits inside this, so it bounds it;
- fan-out: the same number of streaming frames emitted straight onto the bus in bursts, which
  measures the hub + writer + socket path alone.

Usage: .venv/bin/python scripts/bench_ws.py [--turns 30] [--deltas 200] [--clients 10]
       [--profile]   (cProfile of the daemon process during the 1-client turns run)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import json
import os
import pstats
import selectors
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
from bench_turns import TurnClock
from yarl import URL

from metis.config import load_settings
from metis.server.runner import Daemon, freeze_startup_heap
from metis.testing.bench import (
    bench_models_yaml,
    bench_reply,
    bench_workspace,
    daemon_headers,
    spawn_fake_provider,
    stop_process,
)

CHUNK = 8


# -- the client process ------------------------------------------------------------------------


def _handshake(host: str, port: int, path: str) -> socket.socket:
    sock = socket.create_connection((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    payload = b'{"type":"subscribe"}'
    mask = os.urandom(4)
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + body)
    return sock


EVENT_FRAME_MARK = b'{"type":"event"'


class _Counter:
    """Frame counting over a raw socket without a per-frame step in Python.

    Every event frame's payload starts with `EVENT_FRAME_MARK` and nothing inside a payload can
    repeat it (JSON escapes the quotes of any string value), so counting the mark in each
    received block counts the frames; the end marker is counted the same way. The last few
    bytes of a block are kept so a mark split between two reads is still seen exactly once.
    """

    def __init__(self, sock: socket.socket, end_marker: bytes, ends_needed: int) -> None:
        self.sock = sock
        self.tail = b""
        self.keep = max(len(EVENT_FRAME_MARK), len(end_marker)) - 1
        self.frames = 0
        self.first = 0.0
        self.last = 0.0
        self.end_marker = end_marker
        self.ends = 0
        self.ends_needed = ends_needed

    @property
    def done(self) -> bool:
        return self.ends >= self.ends_needed

    def feed(self, data: bytes) -> None:
        window = self.tail + data
        self.tail = window[-self.keep :]
        found = window.count(EVENT_FRAME_MARK)
        if found:
            now = time.monotonic()
            if not self.frames:
                self.first = now
            self.frames += found
            self.last = now
        self.ends += window.count(self.end_marker)


def client_main(host: str, port: int, ends: int, marker: str, paths: list[str]) -> None:
    socks = [_handshake(host, port, p) for p in paths]
    counters = [_Counter(s, marker.encode(), ends) for s in socks]
    selector = selectors.DefaultSelector()
    for counter in counters:
        counter.sock.setblocking(False)
        selector.register(counter.sock, selectors.EVENT_READ, counter)
    print("READY", flush=True)
    while not all(c.done for c in counters):
        ready = selector.select(timeout=30)
        if not ready:
            raise SystemExit("no frame for 30 s: the daemon is gone or stuck")
        for key, _ in ready:
            counter: _Counter = key.data
            data = counter.sock.recv(1 << 20)
            if not data:  # closed: read again, it would answer at once, for ever
                raise SystemExit("the daemon closed a WebSocket before the run ended")
            counter.feed(data)  # the ack is not an event: not counted
    print(json.dumps([{"frames": c.frames, "first": c.first, "last": c.last} for c in counters]))


# -- the driver --------------------------------------------------------------------------------


async def _clients(
    host: str, port: int, ends: int, marker: str, paths: list[str]
) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--client",
        host,
        str(port),
        str(ends),
        marker,
        *paths,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert (await proc.stdout.readline()).strip() == b"READY"
    return proc


async def _result(proc: asyncio.subprocess.Process) -> dict[str, float]:
    out, _ = await proc.communicate()
    rows = json.loads(out.decode().strip().splitlines()[-1])
    frames = sum(r["frames"] for r in rows)
    span = max(r["last"] for r in rows) - min(r["first"] for r in rows)
    return {"frames": frames, "seconds": span, "rate": frames / span if span else 0.0}


async def _attach_paths(http: aiohttp.ClientSession, sid: str, n: int) -> list[str]:
    paths = []
    for _ in range(n):
        async with http.get(f"/sessions/{sid}") as r:
            url = (await r.json())["ws_url"]
        paths.append(URL(url).path_qs)
    return paths


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process's threads have run so far, from the scheduler's own nanosecond
    accounting (Linux `schedstat`; `stat`'s clock ticks are too coarse for a 0.2 s run)."""
    tasks = Path(f"/proc/{pid}/task")
    return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks.iterdir()) / 1e9


async def run_turns(
    d: Daemon,
    http: aiohttp.ClientSession,
    fake_url: str,
    clients: int,
    turns: int,
    deltas: int,
    provider_pid: int | None = None,
) -> dict[str, float]:
    """The turns' figures; `daemon_busy` and (given `provider_pid`) `provider_busy` are the
    share of one CPU each process used while the turns ran. A daemon well under 100 % says
    the end-to-end figure is bound by the others: the provider, the clients, the scheduler."""
    core = d.core
    async with http.post("/sessions", json={"workspace_path": bench_workspace()}) as r:
        sid = (await r.json())["id"]
    paths = await _attach_paths(http, sid, clients)
    proc = (
        await _clients("127.0.0.1", d.port, turns, '"type":"turn.completed"', paths)
        if clients
        else None
    )
    while core.hub.client_count(sid) < clients or any(
        c.accept is not None for c in core.hub._sessions[sid].clients
    ):
        await asyncio.sleep(0.01)
    reply = bench_reply(deltas, chunk_chars=CHUNK, repeat=turns)
    async with aiohttp.ClientSession() as control:
        await control.post(
            f"{fake_url}/_fake/enqueue", json={"api": "anthropic", "replies": [reply]}
        )
    async with TurnClock(d, http) as clock:
        provider_started = process_cpu_s(provider_pid) if provider_pid else 0.0
        cpu_started, started = time.process_time(), time.monotonic()
        for _ in range(turns):
            await clock.turn(sid, "go")
        seconds = time.monotonic() - started
        daemon_cpu = time.process_time() - cpu_started
        provider_cpu = process_cpu_s(provider_pid) - provider_started if provider_pid else 0.0
    result = await _result(proc) if proc is not None else {}
    result["turn_seconds"] = seconds
    result["daemon_busy"] = daemon_cpu / seconds
    if provider_pid:
        result["provider_busy"] = provider_cpu / seconds
    return result


async def run_fanout(
    d: Daemon, http: aiohttp.ClientSession, clients: int, frames: int
) -> dict[str, float]:
    """Streaming frames emitted straight onto the bus in bursts (the WS path alone)."""
    core = d.core
    async with http.post("/sessions", json={"workspace_path": bench_workspace()}) as r:
        sid = (await r.json())["id"]
    paths = await _attach_paths(http, sid, clients)
    proc = await _clients("127.0.0.1", d.port, 1, '"text":"end"', paths)
    while core.hub.client_count(sid) < clients or any(
        c.accept is not None for c in core.hub._sessions[sid].clients
    ):
        await asyncio.sleep(0.01)
    payload = {"message_id": "01JZZZZZZZZZZZZZZZZZZZZZZZ", "content_block_index": 0}
    burst = max(1, core.settings.websocket.queue_max_events // 2)
    for i in range(frames):
        core.bus.emit_transient(
            sid,
            "text.delta",
            {**payload, "text": "end" if i == frames - 1 else "x" * CHUNK},
            turn_id="01JZZZZZZZZZZZZZZZZZZZZZZY",
            parent_event_id=None,
            typed=True,  # as the agent emits an adapter's deltas
        )
        if i % burst == burst - 1:
            while any(len(c.queue) > burst // 2 for c in core.hub._sessions[sid].clients):
                await asyncio.sleep(0)
    return await _result(proc)


async def main_async(args: argparse.Namespace) -> None:
    fake, fake_url = await spawn_fake_provider()
    home = Path(tempfile.mkdtemp(prefix="metis-bench-"))
    (home / "models.yaml").write_text(bench_models_yaml(fake_url))
    d = Daemon(load_settings(home=home, port=0, overrides={"log_level": "WARNING"}))
    await d.start()
    await d.warmed()  # the SDKs imported in the background are in
    freeze_startup_heap()  # as `metis serve` does
    frames_per_turn = args.deltas + 7
    try:
        async with aiohttp.ClientSession(base_url=d.base_url, headers=daemon_headers(d)) as http:
            await run_turns(d, http, fake_url, 1, 2, args.deltas)  # warm-up (SDK import, pools)
            alone = await run_turns(d, http, fake_url, 0, args.turns, args.deltas)
            profile = cProfile.Profile() if args.profile else None
            if profile:
                profile.enable()
            one = await run_turns(d, http, fake_url, 1, args.turns, args.deltas, fake.pid)
            if profile:
                profile.disable()
            many = await run_turns(
                d, http, fake_url, args.clients, args.turns, args.deltas, fake.pid
            )
            total = args.turns * frames_per_turn
            fan_one = await run_fanout(d, http, 1, total)
            fan_many = await run_fanout(d, http, args.clients, total)
    finally:
        await d.stop()
        await stop_process(fake)
    print(f"{args.turns} turns × {args.deltas} deltas ({frames_per_turn} frames/turn)")
    ceiling = args.turns * frames_per_turn / alone["turn_seconds"]
    print(
        f"turn pipeline, no client: {alone['turn_seconds']:.3f} s for the turns, i.e. at most "
        f"{ceiling:,.0f} frames/s per client whatever the socket layer does"
    )
    print(
        f"end to end, 1 client:    {one['rate']:>9,.0f} frames/s "
        f"({one['frames']:.0f} frames in {one['seconds']:.3f} s; goal ≥ 40,000); "
        f"CPU share: daemon {one['daemon_busy']:.0%}, fake provider {one['provider_busy']:.0%}"
    )
    print(
        f"end to end, {args.clients} clients:  {many['rate']:>9,.0f} frames/s in total "
        f"({many['frames']:.0f} frames in {many['seconds']:.3f} s; goal ≥ 250,000); "
        f"CPU share: daemon {many['daemon_busy']:.0%}, fake provider {many['provider_busy']:.0%}"
    )
    print(
        f"fan-out,    1 client:    {fan_one['rate']:>9,.0f} frames/s "
        f"({fan_one['frames']:.0f} frames in {fan_one['seconds']:.3f} s)"
    )
    print(
        f"fan-out,    {args.clients} clients:  {fan_many['rate']:>9,.0f} frames/s in total "
        f"({fan_many['frames']:.0f} frames in {fan_many['seconds']:.3f} s)"
    )
    if profile:
        print("\ncProfile of the daemon process, 1-client turns run (top 25 by own time):")
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        host, port, ends, marker, *paths = sys.argv[2:]
        client_main(host, int(port), int(ends), marker, paths)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--profile", action="store_true")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
