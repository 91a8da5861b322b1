#!/usr/bin/env python3
"""What one streamed model call costs the daemon, and who spends it.

A turn's CPU has a part that does not depend on the reply's length (`bench_turns.py --deltas 1`
shows it: most of a 200-delta turn) and a part per delta. This script times one model call four
ways against the fake provider in its own process (so its CPU is not counted), one call at a
time, each a whole call of a reply of `--deltas` text deltas:

- adapter: `AnthropicAdapter.stream` to its `message.complete` (body building, the SDK's raw
  request, metis's event-stream decoding, the translator);
- SDK request: the same prebuilt body through the SDK's documented raw request
  (`client.post(..., stream=True)`, as the adapter makes it) and its body read;
- bare aiohttp: the same body and headers POSTed with the aiohttp client the SDK runs on;
- bare socket: the same request written on a kept-alive socket by an asyncio protocol that only
  waits for the body's last chunk: what receiving the reply costs any client on this event loop.

With one delta (the default), adapter minus SDK request is metis's own work per call and SDK
request minus bare aiohttp is what the SDK and its httpx layer add to every call, which the
daemon cannot shed while its providers are the official SDKs. With many (`--deltas 2000`), the
differences per delta say what each layer adds to a delta, and bare socket what the event loop's
wake-ups for the reply's network pieces cost.

Run: `python scripts/bench_request.py [--deltas 1] [--calls 400] [--rounds 5]` (medians of the
rounds, which alternate the ways so that the host's drift hits each alike).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import anthropic
import httpx2
from bench_providers import llm_request

from metis.core.models.types import ProviderConfig
from metis.core.providers.anthropic import AnthropicAdapter
from metis.testing.bench import bench_reply, spawn_fake_provider, stop_process

Call = Callable[[], Awaitable[None]]
WARM_UP = 20


async def _cpu_ms_per_call(call: Call, calls: int) -> float:
    started = time.process_time()
    for _ in range(calls):
        await call()
    return (time.process_time() - started) / calls * 1000


WAYS = ("adapter", "SDK request", "bare aiohttp", "bare socket")


class _BodyEnd(asyncio.Protocol):
    """A kept-alive connection that only notices a chunked body's end (`0\r\n\r\n`)."""

    def __init__(self) -> None:
        self.ended: asyncio.Future[None] | None = None
        self._tail = b""

    def data_received(self, data: bytes) -> None:
        self._tail = (self._tail + data)[-7:]
        if self._tail.endswith(b"\r\n0\r\n\r\n") and self.ended is not None:
            self.ended.set_result(None)
            self._tail = b""


async def measure(url: str, calls: int, rounds: int, deltas: int = 1) -> dict[str, list[float]]:
    """CPU ms per call of each way, one figure per round, against the fake provider at `url`
    (it is given exactly the replies the calls take, so its queue is left as it was)."""
    async with aiohttp.ClientSession() as control:
        reply = bench_reply(deltas, repeat=len(WAYS) * (WARM_UP + calls * rounds))
        await control.post(f"{url}/_fake/enqueue", json={"api": "anthropic", "replies": [reply]})
    adapter = AnthropicAdapter(
        ProviderConfig(name="anthropic", adapter="anthropic", base_url=url, api_key="k")
    )
    sdk = anthropic.AsyncAnthropic(
        api_key="k", base_url=url, max_retries=0, http_client=anthropic.DefaultAioHttpClient()
    )
    bare = aiohttp.ClientSession()
    body = json.dumps(
        {
            "model": "bench",
            "max_tokens": 100,
            "stream": True,
            "messages": [{"role": "user", "content": "benchmark"}],
        }
    ).encode()
    headers = {
        "x-api-key": "k",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
        "accept": "application/json",
    }

    async def via_adapter() -> None:
        async for _ in adapter.stream(llm_request("anthropic")):
            pass

    async def via_sdk() -> None:
        response = await sdk.post(
            "/v1/messages", cast_to=httpx2.Response, content=body, stream=True
        )
        async for _ in response.aiter_raw():
            pass
        await response.aclose()

    async def via_aiohttp() -> None:
        async with bare.post(f"{url}/v1/messages", data=body, headers=headers) as response:
            async for _ in response.content.iter_any():
                pass

    loop = asyncio.get_running_loop()
    host, port = url.removeprefix("http://").split(":")
    socket, reader = await loop.create_connection(_BodyEnd, host, int(port))
    request = (
        f"POST /v1/messages HTTP/1.1\r\nHost: {host}:{port}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def via_socket() -> None:
        reader.ended = loop.create_future()
        socket.write(request)
        await reader.ended

    ways: dict[str, Call] = dict(
        zip(WAYS, (via_adapter, via_sdk, via_aiohttp, via_socket), strict=True)
    )
    figures: dict[str, list[float]] = {name: [] for name in ways}
    try:
        for call in ways.values():  # warm-up: connections open, code paths taken once
            for _ in range(WARM_UP):
                await call()
        for _ in range(rounds):
            for name, call in ways.items():
                figures[name].append(await _cpu_ms_per_call(call, calls))
    finally:
        socket.close()
        await bare.close()
        await sdk.close()
        await adapter.aclose()
    return figures


async def main(deltas: int, calls: int, rounds: int) -> None:
    proc, url = await spawn_fake_provider()
    try:
        figures = await measure(url, calls, rounds, deltas)
    finally:
        await stop_process(proc)
    medians = {name: statistics.median(values) for name, values in figures.items()}
    print(f"CPU per call, {deltas}-delta reply ({calls} calls × {rounds} rounds, medians)")
    for name, value in medians.items():
        runs = ", ".join(f"{v:.3f}" for v in figures[name])
        print(f"  {name:13s} {value:.3f} ms  [{runs}]")
    layers = [
        ("metis's own work (adapter − SDK request)", "adapter", "SDK request"),
        ("the SDK's layers (SDK request − bare aiohttp)", "SDK request", "bare aiohttp"),
        ("aiohttp's client (bare aiohttp − bare socket)", "bare aiohttp", "bare socket"),
    ]
    for label, above, below in layers:
        spent = medians[above] - medians[below]
        each = f", {spent / deltas * 1000:.2f} µs a delta" if deltas > 1 else ""
        print(f"  {label}: {spent:.3f} ms a call{each}")
    if deltas > 1:
        print(f"  bare socket: {medians['bare socket'] / deltas * 1000:.2f} µs a delta")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=1)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.deltas, args.calls, args.rounds))
