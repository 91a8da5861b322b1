"""The fake provider server, exercised with the raw SDKs and plain HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from metis.testing import FakeProviderServer, FakeReply

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"anthropic": "ak-fake", "openai": "ok-fake"}
CALLS = [{"name": "read_file", "input": {"path": "a"}}, {"name": "list_dir", "input": {}}]


@pytest.fixture
async def server() -> AsyncIterator[FakeProviderServer]:
    async with FakeProviderServer(expected_keys=dict(KEYS)) as srv:
        yield srv


@pytest.fixture
async def ant(server: FakeProviderServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(
        api_key=KEYS["anthropic"], base_url=server.anthropic_base_url, max_retries=0, timeout=5
    )
    yield client
    await client.close()


@pytest.fixture
async def oai(server: FakeProviderServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        api_key=KEYS["openai"], base_url=server.openai_base_url, max_retries=0, timeout=5
    )
    yield client
    await client.close()


def ant_params(**kw: Any) -> dict[str, Any]:
    return {
        "model": "claude-x",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
        **kw,
    }


def oai_params(**kw: Any) -> dict[str, Any]:
    return {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}], **kw}


# ---------------------------------------------------------------------------------------------
# Anthropic wire
# ---------------------------------------------------------------------------------------------


async def test_anthropic_sse_parses_every_block_kind(server: FakeProviderServer, ant) -> None:
    server.enqueue(
        "anthropic",
        FakeReply(
            thinking="ponder",
            redacted_thinking="opaque",
            text="Hello world",
            tool_calls=CALLS,
            usage={
                "input_tokens": 11,
                "output_tokens": 7,
                "cache_read_tokens": 5,
                "cache_write_tokens": 2,
            },
            chunk_chars=4,
        ),
    )
    stream = await ant.messages.create(**ant_params(), stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    start = events[0].message
    assert start.id == "msg_fake_0" and start.usage.input_tokens == 11
    assert start.usage.cache_read_input_tokens == 5 and start.usage.cache_creation_input_tokens == 2
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in starts] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
        "tool_use",
    ]
    assert [b.id for b in starts if b.type == "tool_use"] == ["toolu_fake_0_0", "toolu_fake_0_1"]
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.text for d in deltas if d.type == "text_delta") == "Hello world"
    assert [d.signature for d in deltas if d.type == "signature_delta"] == ["fake-signature"]
    args = "".join(d.partial_json for d in deltas if d.type == "input_json_delta")
    assert args == '{"path":"a"}{}'
    assert events[-2].delta.stop_reason == "tool_use" and events[-2].usage.output_tokens == 7
    record = server.requests[0]
    assert record.events_sent == len(kinds) + 1  # + the ping the SDK filters out
    assert record.completed and record.status == 200 and record.stream


async def test_anthropic_json_mode_returns_a_full_message(server: FakeProviderServer, ant) -> None:
    server.enqueue("anthropic", FakeReply(thinking="t", text="Hi", tool_calls=CALLS[:1]))
    message = await ant.messages.create(**ant_params())
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].signature == "fake-signature"
    assert message.content[2].input == {"path": "a"} and message.stop_reason == "tool_use"
    assert message.usage.output_tokens > 0


@pytest.mark.parametrize(
    ("status", "etype", "exc"),
    [
        (401, None, anthropic.AuthenticationError),
        (400, None, anthropic.BadRequestError),
        (429, None, anthropic.RateLimitError),
        (500, None, anthropic.InternalServerError),
        (529, "overloaded_error", anthropic.APIStatusError),
    ],
)
async def test_anthropic_error_statuses_use_the_error_shape(
    status: int, etype: str | None, exc: type[Exception], server: FakeProviderServer, ant
) -> None:
    server.enqueue("anthropic", FakeReply.fail(status, etype, retry_after=3))
    with pytest.raises(exc) as info:
        await ant.messages.create(**ant_params(), stream=True)
    err = info.value
    assert err.status_code == status
    assert err.body["type"] == "error" and err.body["error"]["type"] == (
        etype
        or {
            401: "authentication_error",
            400: "invalid_request_error",
            429: "rate_limit_error",
            500: "api_error",
        }[status]
    )
    assert err.response.headers["retry-after"] == "3"


async def test_anthropic_error_event_mid_stream(server: FakeProviderServer, ant) -> None:
    server.enqueue("anthropic", FakeReply.error_event_after(3, text="some text"))
    stream = await ant.messages.create(**ant_params(), stream=True)
    with pytest.raises(anthropic.APIStatusError) as info:
        async for _ in stream:
            pass
    assert info.value.body["error"]["type"] == "overloaded_error"


# ---------------------------------------------------------------------------------------------
# OpenAI wire
# ---------------------------------------------------------------------------------------------


async def test_openai_sse_parses_text_reasoning_calls_and_usage(
    server: FakeProviderServer, oai
) -> None:
    server.enqueue(
        "openai",
        FakeReply(
            thinking="why",
            text="Hello",
            tool_calls=CALLS,
            usage={"input_tokens": 10, "cache_read_tokens": 4},
        ),
    )
    stream = await oai.chat.completions.create(
        **oai_params(), stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert all(c.id == "chatcmpl-fake-0" and c.created == 0 for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content", "")
        for c in chunks
        if c.choices
    )
    assert text == "Hello" and reasoning == "why"
    heads = [
        tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or []) if tc.id
    ]
    assert [(h.index, h.id, h.function.name) for h in heads] == [
        (0, "call_fake_0_0", "read_file"),
        (1, "call_fake_0_1", "list_dir"),
    ]
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["tool_calls"]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.prompt_tokens == 14
    assert usage.prompt_tokens_details.cached_tokens == 4
    assert server.requests[0].events_sent == len(chunks) + 1  # + [DONE]


async def test_openai_usage_chunk_only_when_requested(server: FakeProviderServer, oai) -> None:
    server.enqueue("openai", FakeReply.say("a"), FakeReply.say("b", omit_usage=True))
    plain = [c async for c in await oai.chat.completions.create(**oai_params(), stream=True)]
    assert all(c.usage is None for c in plain)
    omitted = [
        c
        async for c in await oai.chat.completions.create(
            **oai_params(), stream=True, stream_options={"include_usage": True}
        )
    ]
    assert all(c.usage is None for c in omitted)


@pytest.mark.parametrize(
    "quirk", ["same_index_parallel", "omit_tool_index", "name_late", "arguments_as_object"]
)
async def test_openai_quirk_streams_still_parse(
    quirk: str, server: FakeProviderServer, oai
) -> None:
    server.enqueue("openai", FakeReply(tool_calls=CALLS, **{quirk: True}))
    chunks = [c async for c in await oai.chat.completions.create(**oai_params(), stream=True)]
    fragments = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    if quirk == "same_index_parallel":
        assert {f.index for f in fragments} == {0}
    if quirk == "omit_tool_index":
        assert {f.index for f in fragments} == {None}
    if quirk == "name_late":
        assert fragments[0].function.name is None and fragments[1].function.name == "read_file"
    if quirk == "arguments_as_object":
        assert fragments[0].function.arguments == {"path": "a"}


async def test_openai_json_mode_returns_a_chat_completion(server: FakeProviderServer, oai) -> None:
    server.enqueue("openai", FakeReply(text="Hi", tool_calls=CALLS[:1], refusal=None))
    completion = await oai.chat.completions.create(**oai_params())
    message = completion.choices[0].message
    assert completion.object == "chat.completion" and completion.id == "chatcmpl-fake-0"
    assert message.content == "Hi" and message.tool_calls[0].function.arguments == '{"path":"a"}'
    assert completion.choices[0].finish_reason == "tool_calls" and completion.usage.total_tokens > 0


@pytest.mark.parametrize(
    ("reply", "exc", "status"),
    [
        (FakeReply.fail(401), openai.AuthenticationError, 401),
        (FakeReply.fail(429, code="insufficient_quota", retry_after=2), openai.RateLimitError, 429),
        (FakeReply.fail(400, code="context_length_exceeded"), openai.BadRequestError, 400),
        (FakeReply.fail(500), openai.InternalServerError, 500),
    ],
)
async def test_openai_error_statuses_use_the_error_shape(
    reply: FakeReply, exc: type[Exception], status: int, server: FakeProviderServer, oai
) -> None:
    server.enqueue("openai", reply)
    with pytest.raises(exc) as info:
        await oai.chat.completions.create(**oai_params())
    assert info.value.status_code == status
    if reply.error_code:
        assert info.value.code == reply.error_code
    if reply.retry_after:
        headers = info.value.response.headers
        assert headers["retry-after"] == "2" and headers["retry-after-ms"] == "2000"


async def test_openai_error_chunk_and_malformed_chunk(server: FakeProviderServer, oai) -> None:
    server.enqueue("openai", FakeReply.error_event_after(2), FakeReply.malformed_after(2))
    with pytest.raises(openai.APIError):
        async for _ in await oai.chat.completions.create(**oai_params(), stream=True):
            pass
    with pytest.raises(json.JSONDecodeError):
        async for _ in await oai.chat.completions.create(**oai_params(), stream=True):
            pass


# ---------------------------------------------------------------------------------------------
# failures and timing
# ---------------------------------------------------------------------------------------------


async def test_drop_closes_the_connection_mid_body(server: FakeProviderServer, oai) -> None:
    server.enqueue("openai", FakeReply.drop_after(2, text="abcdefghijklmnop", chunk_chars=2))
    with pytest.raises(openai.APIConnectionError):
        async for _ in await oai.chat.completions.create(**oai_params(), stream=True):
            pass
    record = server.requests[0]
    assert record.events_sent == 2 and not record.completed and not record.client_disconnected


async def test_hang_keeps_the_stream_silent_until_the_client_leaves(
    server: FakeProviderServer,
) -> None:
    client = anthropic.AsyncAnthropic(
        api_key=KEYS["anthropic"], base_url=server.anthropic_base_url, max_retries=0, timeout=0.2
    )
    server.enqueue("anthropic", FakeReply.hang_after(3))
    with pytest.raises(Exception) as info:  # the SDK raises the raw httpx2 read timeout mid-stream
        async for _ in await client.messages.create(**ant_params(), stream=True):
            pass
    await client.close()
    assert "Timeout" in type(info.value).__name__
    await server.wait_until(lambda: server.requests[0].client_disconnected)
    assert server.requests[0].events_sent == 3


async def test_delays_slow_the_first_byte_and_each_event(server: FakeProviderServer, oai) -> None:
    server.enqueue(
        "openai", FakeReply.say("abcd", chunk_chars=1, delay_ms=15, first_byte_delay_ms=60)
    )
    start = time.perf_counter()
    stream = await oai.chat.completions.create(**oai_params(), stream=True)
    first = time.perf_counter() - start
    chunks = [c async for c in stream]
    total = time.perf_counter() - start
    assert first >= 0.06
    assert total >= 0.06 + 0.015 * len(chunks)


# ---------------------------------------------------------------------------------------------
# auth, script, recording
# ---------------------------------------------------------------------------------------------


async def test_wrong_key_gets_401_and_consumes_no_reply(server: FakeProviderServer) -> None:
    server.enqueue("anthropic", FakeReply.say("kept"))
    server.enqueue("openai", FakeReply.say("kept"))
    bad_ant = anthropic.AsyncAnthropic(
        api_key="nope", base_url=server.anthropic_base_url, max_retries=0
    )
    bad_oai = openai.AsyncOpenAI(api_key="nope", base_url=server.openai_base_url, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        await bad_ant.messages.create(**ant_params())
    with pytest.raises(openai.AuthenticationError):
        await bad_oai.chat.completions.create(**oai_params())
    await bad_ant.close()
    await bad_oai.close()
    assert [r.reply_source for r in server.requests] == ["auth_failure", "auth_failure"]
    assert [r.status for r in server.requests] == [401, 401]
    assert server.pending("anthropic") == 1 and server.pending("openai") == 1


async def test_x_api_key_header_is_accepted(server: FakeProviderServer) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            server.anthropic_base_url + "/v1/messages",
            json=ant_params(),
            headers={"x-api-key": KEYS["anthropic"]},
        ) as response,
    ):
        assert response.status == 200
        assert (await response.json())["type"] == "message"


async def test_queue_order_any_match_model_and_repeat(server: FakeProviderServer, oai) -> None:
    server.enqueue("any", FakeReply.say("from any"))
    server.enqueue("openai", FakeReply.say("for gpt-y", match_model="gpt-y"))
    server.enqueue("openai", FakeReply.say("twice", repeat=2))

    async def ask(model: str) -> str:
        completion = await oai.chat.completions.create(**oai_params(model=model))
        return completion.choices[0].message.content

    assert await ask("gpt-x") == "twice"
    assert await ask("gpt-y") == "for gpt-y"
    assert await ask("gpt-x") == "twice"
    assert await ask("gpt-x") == "from any"
    assert await ask("gpt-x") == 'You said: "hi"'
    assert [r.reply_source for r in server.requests] == ["queued"] * 4 + ["default"]


async def test_recorded_request_fields(server: FakeProviderServer, ant) -> None:
    await ant.messages.create(**ant_params(system="be brief"), stream=True)
    [record] = await server.wait_for_requests(1)
    await server.wait_until(lambda: record.completed)
    assert record.index == 0 and record.api == "anthropic" and record.path == "/v1/messages"
    assert record.model == "claude-x" and record.stream is True
    assert record.body["system"] == "be brief"
    assert all(name == name.lower() for name in record.headers)
    assert record.headers["authorization"] == f"Bearer {KEYS['anthropic']}"
    assert record.reply_source == "default" and record.status == 200
    assert record.events_sent > 0 and not record.client_disconnected


async def test_bodies_are_deterministic_apart_from_counters(
    server: FakeProviderServer, oai
) -> None:
    first = await oai.chat.completions.create(**oai_params())
    second = await oai.chat.completions.create(**oai_params())
    a, b = first.model_dump(), second.model_dump()
    assert (a.pop("id"), b.pop("id")) == ("chatcmpl-fake-0", "chatcmpl-fake-1")
    assert a == b


async def test_control_routes_enqueue_list_and_reset(server: FakeProviderServer, oai) -> None:
    async with aiohttp.ClientSession(base_url=server.base_url) as http:
        async with http.post(
            "/_fake/enqueue", json={"api": "openai", "replies": [{"text": "remote"}]}
        ) as response:
            assert response.status == 200 and (await response.json())["queued"] == 1
        completion = await oai.chat.completions.create(**oai_params())
        assert completion.choices[0].message.content == "remote"
        async with http.get("/_fake/requests") as response:
            listed = (await response.json())["requests"]
        assert [(r["api"], r["reply_source"], r["status"]) for r in listed] == [
            ("openai", "queued", 200)
        ]
        async with http.post(
            "/_fake/enqueue", json={"api": "openai", "replies": [{"bogus": 1}]}
        ) as response:
            assert response.status == 400
        async with http.post("/_fake/reset") as response:
            assert response.status == 200
        assert server.requests == [] and server.pending("openai") == 0
        async with http.get("/v1/models") as response:
            assert response.status == 404 and "error" in await response.json()
        async with http.get("/v1/nope", headers={"anthropic-version": "x"}) as response:
            body = await response.json()
            assert response.status == 404 and body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com"])
async def test_non_loopback_hosts_are_refused(host: str) -> None:
    with pytest.raises(ValueError):
        await FakeProviderServer().start(host=host)


async def test_localhost_is_accepted() -> None:
    server = FakeProviderServer()
    await server.start(host="localhost")
    try:
        assert server.port > 0 and server.openai_base_url.endswith("/v1")
    finally:
        await server.stop()


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


async def test_cli_prints_base_urls_serves_a_script_and_stops_on_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"openai": [{"text": "scripted via file"}]}))
    proc = _spawn("scripts/fake_provider.py", "--port", "0", "--script", str(script))
    try:
        assert proc.stdout is not None
        ant_line = await asyncio.to_thread(proc.stdout.readline)
        oai_line = await asyncio.to_thread(proc.stdout.readline)
        assert ant_line.startswith("ANTHROPIC_BASE_URL=http://127.0.0.1:")
        assert oai_line.startswith(
            "OPENAI_BASE_URL=http://127.0.0.1:"
        ) and oai_line.strip().endswith("/v1")
        client = openai.AsyncOpenAI(
            api_key="k", base_url=oai_line.strip().split("=", 1)[1], max_retries=0
        )
        completion = await client.chat.completions.create(**oai_params())
        await client.close()
        assert completion.choices[0].message.content == "scripted via file"
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.communicate, timeout=10)
    assert proc.returncode == 0


async def test_cli_refuses_non_loopback_hosts() -> None:
    proc = _spawn("-m", "metis.testing.fake_provider", "--host", "0.0.0.0")
    _, stderr = await asyncio.to_thread(proc.communicate, timeout=10)
    assert proc.returncode == 2
    assert "non-loopback" in stderr
