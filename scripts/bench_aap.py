"""Benchmark the AAP façade: SSE relay throughput and the create + `none` turn round trip.

1. One v3 turn with `stream: "delta"` whose reply the fake provider streams as 5,000 deltas
   (no delay): `text_delta` events relayed per second, measured at the client from sending the
   request to reading `turn_stop` (so it includes the SDK adapter, the bus, the session hub,
   the renderer and the SSE writes, every one awaited).
2. `POST /aap/sessions` followed by one `POST /aap/sessions/:id/turns` with `stream: "none"`,
   repeated: the p50 of the pair, end to end over loopback.

The fake provider runs in its own process, so its CPU time does not count against the daemon.
Run: `python scripts/bench_aap.py [--deltas 5000] [--round-trips 100]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from metis.config import load_settings
from metis.server.runner import Daemon, freeze_startup_heap
from metis.testing.bench import (
    bench_models_yaml,
    bench_reply,
    spawn_fake_provider,
    stop_process,
)

KEY = "bench-aap-key-0123456789"


def count_events(buffer: bytearray, name: bytes) -> tuple[int, bool]:
    """Complete frames named `name` in the buffer, and whether `turn_stop` arrived."""
    frames = bytes(buffer).split(b"\n\n")
    return sum(f.startswith(b"event: " + name + b"\n") for f in frames), any(
        f.startswith(b"event: turn_stop\n") for f in frames
    )


async def relay(http: aiohttp.ClientSession, base: str, fake_url: str, deltas: int) -> float:
    reply = bench_reply(deltas, chunk_chars=1)
    await http.post(f"{fake_url}/_fake/enqueue", json={"api": "anthropic", "replies": [reply]})
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.post(
        f"{base}/aap/sessions", json={"agent": {"name": "metis"}}, headers=headers
    ) as r:
        session_id = (await r.json())["sessionId"]
    body = {"stream": "delta", "messages": [{"role": "user", "content": "stream please"}]}
    buffer = bytearray()
    started = time.perf_counter()
    async with http.post(
        f"{base}/aap/sessions/{session_id}/turns", json=body, headers=headers
    ) as r:
        async for chunk in r.content.iter_any():
            buffer += chunk
    elapsed = time.perf_counter() - started
    relayed, stopped = count_events(buffer, b"text_delta")
    assert stopped, "the stream did not end with turn_stop"
    assert relayed == deltas, f"relayed {relayed} of {deltas} deltas"
    return relayed / elapsed


async def round_trips(http: aiohttp.ClientSession, base: str, n: int) -> list[float]:
    headers = {"Authorization": f"Bearer {KEY}"}
    samples = []
    for i in range(n):
        started = time.perf_counter()
        async with http.post(
            f"{base}/aap/sessions", json={"agent": {"name": "metis"}}, headers=headers
        ) as r:
            session_id = (await r.json())["sessionId"]
        body = {"messages": [{"role": "user", "content": f"round trip {i}"}]}
        async with http.post(
            f"{base}/aap/sessions/{session_id}/turns", json=body, headers=headers
        ) as r:
            assert r.status == 200, await r.text()
            await r.read()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def main(deltas: int, n: int) -> None:
    fake, url = await spawn_fake_provider()
    os.environ["METIS_API_KEY"] = KEY
    try:
        with tempfile.TemporaryDirectory() as home:
            Path(home, "models.yaml").write_text(bench_models_yaml(url))
            daemon = Daemon(load_settings(home=Path(home), port=0))
            await daemon.start()
            await daemon.warmed()  # the SDKs imported in the background are in
            freeze_startup_heap()  # as `metis serve` does
            try:
                async with aiohttp.ClientSession() as http:
                    rate = await relay(http, daemon.base_url, url, deltas)
                    samples = await round_trips(http, daemon.base_url, n)
            finally:
                await daemon.stop()
    finally:
        await stop_process(fake)
    print(f"SSE relay: {rate:,.0f} text_delta events/s ({deltas} deltas in one turn)")
    print(
        f"POST /aap/sessions + one `none` turn: p50 {statistics.median(samples):.2f} ms "
        f"(p90 {statistics.quantiles(samples, n=10)[-1]:.2f} ms, {n} round trips)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deltas", type=int, default=5000)
    parser.add_argument("--round-trips", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(main(args.deltas, args.round_trips))
