"""Text streaming on both APIs, SSE and JSON, through the real SDKs."""

from __future__ import annotations

import pytest

from metis.core.canonical.content import TextBlock
from metis.core.providers.base import MessageStart, TextDelta
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import APIS, caps, check_invariants, collect, request, user


@pytest.mark.parametrize("kind", APIS)
async def test_text_stream_orders_events_and_deltas_rebuild_final_content(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply.say("The quick brown fox jumps over the lazy dog.", chunk_chars=5))
    adapter = make_adapter(kind)
    req = request(kind, user("hi"))
    events, error = await collect(adapter.stream(req))
    assert error is None
    complete = check_invariants(events)
    assert isinstance(events[0], MessageStart)
    assert events[0].model == req.model and events[0].message_id == req.message_id
    deltas = [e for e in events if isinstance(e, TextDelta)]
    assert [d.text for d in deltas][:2] == ["The q", "uick "]
    assert all(d.content_block_index == 0 for d in deltas)
    assert complete.final_content == [
        TextBlock(text="The quick brown fox jumps over the lazy dog.")
    ]
    assert complete.stop_reason == "end_turn"
    assert complete.attempts == 1 and complete.first_token_ms is not None
    recorded = fake.requests[0]
    assert recorded.stream is True and recorded.reply_source == "queued" and recorded.completed


@pytest.mark.parametrize("kind", APIS)
async def test_complete_uses_json_mode_with_the_same_mapping(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply.say("plain answer"))
    adapter = make_adapter(kind)
    result = await adapter.complete(request(kind, user("hi")))
    assert result.final_content == [TextBlock(text="plain answer")]
    assert result.stop_reason == "end_turn"
    assert result.attempts == 1
    assert result.provider_stop_reason in ("end_turn", "stop")
    assert fake.requests[0].stream is False
    assert fake.requests[0].body.get("stream") in (None, False)


@pytest.mark.parametrize("kind", APIS)
async def test_default_reply_streams_the_scripted_echo(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    adapter = make_adapter(kind)
    events, error = await collect(adapter.stream(request(kind, user("ping me"))))
    assert error is None
    complete = check_invariants(events)
    assert complete.final_content == [TextBlock(text='You said: "ping me"')]
    assert fake.requests[0].reply_source == "default"


@pytest.mark.parametrize("kind", APIS)
async def test_empty_completed_message_still_opens_and_closes_the_stream(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply.say("", usage={"output_tokens": 0}))
    adapter = make_adapter(kind)
    events, error = await collect(adapter.stream(request(kind)))
    assert error is None
    assert [type(e).__name__ for e in events] == ["MessageStart", "MessageComplete"]
    assert events[-1].final_content == []


@pytest.mark.parametrize("kind", APIS)
async def test_capabilities_are_passed_through_on_every_request(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    adapter = make_adapter(kind)
    req = request(
        kind, user("hi"), capabilities=caps(max_output_tokens=1234), max_output_tokens=1234
    )
    await collect(adapter.stream(req))
    body = fake.requests[0].body
    assert body["model"] == "fake-model"
    field = "max_tokens" if kind == "anthropic" else "max_completion_tokens"
    assert body[field] == 1234
