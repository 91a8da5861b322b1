"""Several server events arriving in one network chunk behave as if they came one by one.

The adapters decode a chunk's events as a batch; a cancel set by the consumer, or a failing
event, must still land between two events, and the partial content must be exactly what was
delivered. A whole reply is served from memory as a single chunk to make that deterministic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from metis.core.models.types import ProviderConfig
from metis.core.providers.anthropic import AnthropicAdapter
from metis.core.providers.base import LLMRequest, MessageComplete, TextDelta
from metis.core.providers.sse import SseBody
from metis.testing.fake_wire import sse_frame
from tests.core.providers.provider_kit import check_invariants, collect, request, user


def frame(name: str, data: dict[str, Any]) -> bytes:
    return sse_frame(name, data).encode()


def reply_body(chunks: list[str], *, break_after: int | None = None) -> bytes:
    body = frame("message_start", {"type": "message_start", "message": {"usage": {}}})
    body += frame(
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
    )
    for i, text in enumerate(chunks):
        if i == break_after:
            body += b"event: content_block_delta\ndata: {not json\n\n"
        delta = {"type": "text_delta", "text": text}
        body += frame(
            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
        )
    body += frame("content_block_stop", {"type": "content_block_stop", "index": 0})
    body += frame(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 5},
        },
    )
    return body + frame("message_stop", {"type": "message_stop"})


class _OneChunk:
    """An HTTP response stand-in whose whole body is one network chunk."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        yield self.body

    async def aclose(self) -> None:
        return None


class OneChunkAdapter(AnthropicAdapter):
    def __init__(self, body: bytes) -> None:
        super().__init__(
            ProviderConfig(name="anthropic", adapter="anthropic", base_url="http://127.0.0.1:9")
        )
        self.body = body

    async def open_stream(self, req: LLMRequest) -> Any:
        return SseBody(_OneChunk(self.body))


CHUNKS = ["one ", "two ", "three ", "four ", "five"]


async def test_a_whole_reply_in_one_chunk_streams_every_delta() -> None:
    adapter = OneChunkAdapter(reply_body(CHUNKS))
    events, error = await collect(adapter.stream(request("anthropic", user("hi"))))
    assert error is None
    complete = check_invariants(events)
    assert [e.text for e in events if isinstance(e, TextDelta)] == CHUNKS
    assert complete.stop_reason == "end_turn"
    await adapter.aclose()


async def test_a_cancel_lands_between_two_events_of_one_chunk() -> None:
    adapter = OneChunkAdapter(reply_body(CHUNKS))
    req = request("anthropic", user("hi"))
    events = []
    async for event in adapter.stream(req):
        events.append(event)
        if isinstance(event, TextDelta) and event.text == "two ":
            req.cancel.set()
    complete = check_invariants(events)
    assert isinstance(events[-1], MessageComplete) and complete.stop_reason == "cancelled"
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["one ", "two "]
    assert complete.final_content[0].text == "one two "  # exactly what was delivered
    await adapter.aclose()


async def test_a_bad_event_after_the_first_token_still_delivers_the_events_before_it() -> None:
    adapter = OneChunkAdapter(reply_body(CHUNKS, break_after=3))
    events, error = await collect(adapter.stream(request("anthropic", user("hi"))))
    assert error is not None and error.error_class == "server_error" and error.after_first_token
    assert [e.text for e in events if isinstance(e, TextDelta)] == CHUNKS[:3]
    complete = check_invariants(events)
    assert complete.stop_reason == "error" and complete.final_content[0].text == "one two three "
    await adapter.aclose()


class _TwoChunks(_OneChunk):
    """A response whose body goes on after the reply's last event (a trailing chunk)."""

    def __init__(self, body: bytes) -> None:
        super().__init__(body)
        self.reading_closed = False
        self.closed = False

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        try:
            yield self.body
            yield b": trailing comment\n\n"
        finally:
            self.reading_closed = True

    async def aclose(self) -> None:
        self.closed = True


async def test_a_stream_left_after_its_last_event_closes_its_reading_at_once() -> None:
    """The reply ends before its body does; the body's readers are closed with the response,
    not left to the garbage collector (whose asyncio hook wakes the loop and runs a task)."""
    response = _TwoChunks(reply_body(CHUNKS))

    class Adapter(OneChunkAdapter):
        async def open_stream(self, req: LLMRequest) -> Any:
            return SseBody(response)

    adapter = Adapter(b"")
    events = [event async for event in adapter.stream(request("anthropic", user("hi")))]
    assert isinstance(events[-1], MessageComplete)
    assert response.reading_closed and response.closed  # before any other turn of the loop
    await adapter.aclose()
