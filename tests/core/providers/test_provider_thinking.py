"""Thinking blocks — signature round trip to Anthropic, dropped everywhere else."""

from __future__ import annotations

import pytest

from metis.core.canonical.content import RedactedThinkingBlock, TextBlock, ThinkingBlock
from metis.core.providers.base import ThinkingDelta
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import caps, check_invariants, collect, msg, request, user

THINKING_CAPS = caps(supports_thinking=True)


async def test_anthropic_thinking_streams_with_signature_on_the_last_delta(
    fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(
        "anthropic", FakeReply(thinking="Let me consider this.", text="Answer.", chunk_chars=6)
    )
    adapter = make_adapter("anthropic")
    req = request("anthropic", user("q"), capabilities=THINKING_CAPS, thinking_budget_tokens=2048)
    events, error = await collect(adapter.stream(req))
    assert error is None
    complete = check_invariants(events)
    thinking = [e for e in events if isinstance(e, ThinkingDelta)]
    assert all(e.signature is None for e in thinking[:-1])
    assert thinking[-1].text == "" and thinking[-1].signature == "fake-signature"
    assert complete.final_content == [
        ThinkingBlock(thinking="Let me consider this.", signature="fake-signature"),
        TextBlock(text="Answer."),
    ]
    assert fake.requests[0].body["thinking"] == {"type": "enabled", "budget_tokens": 2048}


async def test_anthropic_redacted_thinking_takes_a_block_index_without_deltas(
    fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue("anthropic", FakeReply(redacted_thinking="opaque==", text="Hi."))
    adapter = make_adapter("anthropic")
    events, _ = await collect(adapter.stream(request("anthropic", user("q"))))
    complete = check_invariants(events)
    assert complete.final_content == [RedactedThinkingBlock(data="opaque=="), TextBlock(text="Hi.")]
    assert events[1].content_block_index == 1


def _history(provider: str | None) -> list:
    return [
        user("first"),
        msg(
            "assistant",
            ThinkingBlock(thinking="hmm", signature="sig-1"),
            RedactedThinkingBlock(data="opaque"),
            ThinkingBlock(thinking="unsigned", signature=None),
            TextBlock(text="reply"),
            provider=provider,
        ),
        user("second"),
    ]


async def test_signed_anthropic_thinking_round_trips_when_thinking_is_enabled(
    fake: FakeProviderServer, make_adapter
) -> None:
    adapter = make_adapter("anthropic")
    req = request(
        "anthropic", *_history("anthropic"), capabilities=THINKING_CAPS, thinking_budget_tokens=100
    )
    await collect(adapter.stream(req))
    body = fake.requests[0].body
    assert body["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": "sig-1"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "reply"},
    ]
    # budget below Anthropic's minimum is raised to 1024
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert "temperature" not in body


@pytest.mark.parametrize(
    ("provider", "budget", "supports"),
    [("openai", 2048, True), ("anthropic", None, True), ("anthropic", 2048, False)],
    ids=["from_another_provider", "thinking_off", "model_without_thinking"],
)
async def test_thinking_is_dropped_unless_anthropic_produced_and_enabled(
    provider: str, budget: int | None, supports: bool, fake: FakeProviderServer, make_adapter
) -> None:
    adapter = make_adapter("anthropic")
    req = request(
        "anthropic",
        *_history(provider),
        capabilities=caps(supports_thinking=supports),
        thinking_budget_tokens=budget,
        temperature=0.3,
    )
    await collect(adapter.stream(req))
    body = fake.requests[0].body
    assert body["messages"][1]["content"] == [{"type": "text", "text": "reply"}]
    enabled = bool(budget) and supports
    assert ("thinking" in body) is enabled
    assert ("temperature" in body) is not enabled  # temperature only without thinking


async def test_thinking_budget_is_capped_below_max_tokens(
    fake: FakeProviderServer, make_adapter
) -> None:
    adapter = make_adapter("anthropic")
    req = request(
        "anthropic",
        user("q"),
        capabilities=THINKING_CAPS,
        thinking_budget_tokens=50_000,
        max_output_tokens=4000,
    )
    await collect(adapter.stream(req))
    assert fake.requests[0].body["thinking"]["budget_tokens"] == 3999


async def test_openai_never_receives_thinking_but_streams_reasoning_as_thinking(
    fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue("openai", FakeReply(thinking="reasoning here", text="done"))
    adapter = make_adapter("openai")
    req = request(
        "openai", *_history("anthropic"), capabilities=THINKING_CAPS, thinking_budget_tokens=2048
    )
    events, _ = await collect(adapter.stream(req))
    complete = check_invariants(events)
    assert complete.final_content == [
        ThinkingBlock(thinking="reasoning here", signature=None),
        TextBlock(text="done"),
    ]
    body = fake.requests[0].body
    assert body["messages"][1] == {"role": "assistant", "content": "reply"}
    assert "thinking" not in body and "reasoning" not in str(body["messages"])
