"""Usage buckets, estimation, cost, and stop-reason mapping."""

from __future__ import annotations

import json
import math
from decimal import Decimal

import pytest

from metis.core.canonical.content import TextBlock, ToolUseBlock
from metis.core.canonical.usage import TokenUsage, compute_cost
from metis.core.models.types import Pricing
from metis.core.routing.context import estimate_input_tokens
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import (
    APIS,
    READ_FILE,
    check_invariants,
    collect,
    msg,
    request,
    tool_msg,
    user,
)

FOUR = {
    "input_tokens": 1200,
    "output_tokens": 345,
    "cache_read_tokens": 800,
    "cache_write_tokens": 64,
}


async def _complete_event(make_adapter, fake, kind: str, reply: FakeReply, **kw):
    fake.enqueue(kind, reply)
    adapter = make_adapter(kind, **kw)
    events, error = await collect(adapter.stream(request(kind, user("hello world"))))
    assert error is None
    return check_invariants(events)


async def test_anthropic_reports_all_four_buckets(fake: FakeProviderServer, make_adapter) -> None:
    complete = await _complete_event(
        make_adapter, fake, "anthropic", FakeReply.say("x", usage=FOUR)
    )
    assert complete.usage == TokenUsage(**FOUR)
    fake.enqueue("anthropic", FakeReply.say("x", usage=FOUR))
    result = await make_adapter("anthropic").complete(request("anthropic"))
    assert result.usage == TokenUsage(**FOUR)


async def test_openai_subtracts_cached_tokens_from_the_prompt(
    fake: FakeProviderServer, make_adapter
) -> None:
    complete = await _complete_event(make_adapter, fake, "openai", FakeReply.say("x", usage=FOUR))
    # the wire said prompt_tokens = 2000 with 800 cached; no cache writes on OpenAI
    assert fake.requests[0].body["stream_options"] == {"include_usage": True}
    assert complete.usage == TokenUsage(
        input_tokens=1200, output_tokens=345, cache_read_tokens=800, cache_write_tokens=0
    )
    fake.enqueue("openai", FakeReply.say("x", usage=FOUR))
    result = await make_adapter("openai").complete(request("openai"))
    assert result.usage.input_tokens == 1200 and result.usage.cache_read_tokens == 800


def _openai_frames(usage: dict) -> list[str]:
    base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "fake-model"}
    return [
        "data: "
        + json.dumps({**base, "choices": [{"index": 0, "delta": {"content": "hi"}}]})
        + "\n\n",
        "data: "
        + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        + "\n\n",
        "data: " + json.dumps({**base, "choices": [], "usage": usage}) + "\n\n",
        "data: [DONE]\n\n",
    ]


async def test_openai_cached_tokens_above_prompt_are_clamped(
    fake: FakeProviderServer, make_adapter, caplog: pytest.LogCaptureFixture
) -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 25},
    }
    complete = await _complete_event(
        make_adapter, fake, "openai", FakeReply(raw_sse=_openai_frames(usage))
    )
    assert complete.usage == TokenUsage(input_tokens=0, output_tokens=3, cache_read_tokens=25)
    assert "clamped" in caplog.text


async def test_openai_usage_without_details_has_no_cache_reads(
    fake: FakeProviderServer, make_adapter
) -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    complete = await _complete_event(
        make_adapter, fake, "openai", FakeReply(raw_sse=_openai_frames(usage))
    )
    assert complete.usage == TokenUsage(input_tokens=10, output_tokens=3)


@pytest.mark.parametrize("how", ["omit_usage", "option_off"])
async def test_openai_missing_usage_is_estimated(
    how: str, fake: FakeProviderServer, make_adapter
) -> None:
    reply = FakeReply.say("twelve chars", omit_usage=(how == "omit_usage"))
    options = {"stream_include_usage": False} if how == "option_off" else {}
    complete = await _complete_event(make_adapter, fake, "openai", reply, options=options)
    usage = complete.usage
    assert usage.estimated is True
    assert usage.output_tokens == math.ceil(len("twelve chars") / 4)
    assert usage.input_tokens == math.ceil(len("hello world") / 4)
    assert usage.cache_read_tokens == 0


async def test_missing_usage_is_estimated_with_the_routing_formula(
    fake: FakeProviderServer, make_adapter
) -> None:
    """The estimate routing saw, so `llm.call_*` and routing never disagree."""
    call = ToolUseBlock(id="tu_1", name="read_file", input={"path": "a.py", "limit": 20})
    history = [
        user("read a.py"),
        msg("assistant", call, provider="openai"),
        tool_msg("tu_1", "print('hi')"),
    ]
    req = request(
        "openai", *history, system="You are metis.", system_volatile="cwd: /w", tools=[READ_FILE]
    )
    fake.enqueue("openai", FakeReply.say("done", omit_usage=True))
    events, error = await collect(make_adapter("openai").stream(req))
    assert error is None
    usage = check_invariants(events).usage
    assert usage.estimated is True
    assert usage.input_tokens == estimate_input_tokens(
        system_prompt="You are metis.\ncwd: /w",  # joined as the runner joins them
        tools=[READ_FILE],
        history=history,
    )


async def test_anthropic_message_delta_counts_replace_the_start_counts(
    fake: FakeProviderServer, make_adapter
) -> None:
    def frame(event: str, data: dict) -> str:
        return f"event: {event}\ndata: {json.dumps(data)}\n\n"

    start = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "model": "fake-model",
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": None},
    }
    frames = [
        frame("message_start", {"type": "message_start", "message": start}),
        frame(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
        frame(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "ok"},
            },
        ),
        frame("content_block_stop", {"type": "content_block_stop", "index": 0}),
        frame(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 9, "input_tokens": 7, "cache_read_input_tokens": 3},
            },
        ),
        frame("message_stop", {"type": "message_stop"}),
    ]
    complete = await _complete_event(make_adapter, fake, "anthropic", FakeReply(raw_sse=frames))
    assert complete.usage == TokenUsage(input_tokens=7, output_tokens=9, cache_read_tokens=3)


async def test_cost_is_exact_decimal_over_all_four_buckets() -> None:
    pricing = Pricing(
        input_per_mtok=Decimal("3.00"),
        output_per_mtok=Decimal("15.00"),
        cache_read_per_mtok=Decimal("0.30"),
        cache_write_per_mtok=Decimal("3.75"),
    )
    usage = TokenUsage(**FOUR, estimated=True)
    cost = compute_cost(usage, pricing)
    expected = (
        Decimal(1200) * Decimal("3.00")
        + Decimal(345) * Decimal("15.00")
        + Decimal(800) * Decimal("0.30")
        + Decimal(64) * Decimal("3.75")
    ) / Decimal(1_000_000)
    assert cost == expected == Decimal("0.009255")
    assert isinstance(cost, Decimal) and usage.estimated is True
    zero = Pricing(
        input_per_mtok=Decimal(0),
        output_per_mtok=Decimal(0),
        cache_read_per_mtok=Decimal(0),
        cache_write_per_mtok=Decimal(0),
    )
    assert compute_cost(usage, zero) == Decimal("0")


# ---------------------------------------------------------------------------------------------
# stop reasons
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "raw", "expected"),
    [
        ("anthropic", "end_turn", "end_turn"),
        ("anthropic", "max_tokens", "max_tokens"),
        ("anthropic", "stop_sequence", "stop_sequence"),
        ("anthropic", "model_context_window_exceeded", "max_tokens"),
        ("anthropic", "refusal", "refusal"),
        ("anthropic", "pause_turn", "end_turn"),
        ("anthropic", "brand_new_reason", "end_turn"),
        ("openai", "stop", "end_turn"),
        ("openai", "length", "max_tokens"),
        ("openai", "content_filter", "refusal"),
        ("openai", "function_call", "tool_use"),
        ("openai", "brand_new_reason", "end_turn"),
    ],
)
async def test_stop_reasons_map_and_keep_the_raw_value(
    kind: str, raw: str, expected: str, fake: FakeProviderServer, make_adapter
) -> None:
    complete = await _complete_event(
        make_adapter, fake, kind, FakeReply.say("partial text", stop_reason=raw)
    )
    assert complete.stop_reason == expected
    assert complete.provider_stop_reason == raw
    assert complete.final_content == [TextBlock(text="partial text")]
    fake.enqueue(kind, FakeReply.say("partial text", stop_reason=raw))
    result = await make_adapter(kind).complete(request(kind))
    assert (result.stop_reason, result.provider_stop_reason) == (expected, raw)


async def test_unknown_stop_reason_is_logged(
    fake: FakeProviderServer, make_adapter, caplog: pytest.LogCaptureFixture
) -> None:
    await _complete_event(make_adapter, fake, "anthropic", FakeReply.say("x", stop_reason="weird"))
    assert "'weird' mapped to end_turn" in caplog.text


@pytest.mark.parametrize("kind", APIS)
async def test_refusal_during_generation_completes_with_its_partial_text(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    reply = FakeReply(text="Sure, ", refusal="I can't help with that.")
    complete = await _complete_event(make_adapter, fake, kind, reply)
    assert complete.stop_reason == "refusal"
    assert complete.final_content == [TextBlock(text="Sure, I can't help with that.")]
    fake.enqueue(kind, reply)
    result = await make_adapter(kind).complete(request(kind))
    assert result.stop_reason == "refusal"
