"""Cancellation — before the first token, mid-stream, hung providers, task cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from metis.core.providers import ProviderError
from metis.core.providers.base import ToolUseEnd, ToolUseInputDelta
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import (
    APIS,
    FakeSleep,
    RecordingHooks,
    check_invariants,
    request,
    user,
)

# Every wait cancelled here lasts a second or more (a 5 s first byte, a hung stream, a 1.2 s
# backoff): ending within half a second shows the cancel cut it short. An idle machine ends
# them within a few milliseconds; the whole suite running on every CPU once took 180 ms.
CANCEL_BUDGET_S = 0.5


def _cancel_later(
    event: asyncio.Event, delay: float, fake: FakeProviderServer | None = None, requests: int = 1
) -> list[float]:
    """Set `event` `delay` s after the server recorded `requests` requests (or after `delay` s).

    Waiting for the recording keeps the test about the provider wait, not about how long the
    SDK takes to build its first request. The returned list receives the moment it was set.
    """
    fired: list[float] = []

    async def fire() -> None:
        if fake is not None:
            await fake.wait_until(lambda: len(fake.requests) >= requests)
        await asyncio.sleep(delay)
        fired.append(time.perf_counter())
        event.set()

    _tasks.add(asyncio.ensure_future(fire()))
    return fired


_tasks: set[asyncio.Future[None]] = set()


@pytest.mark.parametrize("kind", APIS)
async def test_cancel_while_waiting_for_the_first_byte_yields_nothing_and_aborts(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply(first_byte_delay_ms=5000))
    hooks = RecordingHooks()
    req = request(kind, hooks=hooks)
    fired = _cancel_later(req.cancel, 0.05, fake)
    events = []
    with pytest.raises(ProviderError) as info:
        async for event in make_adapter(kind).stream(req):
            events.append(event)
    assert time.perf_counter() - fired[0] < CANCEL_BUDGET_S
    assert events == []
    assert info.value.error_class == "cancelled" and not info.value.counts_for_availability
    assert hooks.calls == [("started", 1), ("failed", 1, "cancelled", False)]
    await fake.wait_until(lambda: fake.requests[0].client_disconnected, timeout=2)


@pytest.mark.parametrize("kind", APIS)
async def test_cancel_mid_stream_closes_open_calls_and_completes_cancelled(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    # ~50 chunks 30 ms apart after the first input delta: a cancel that waited for the rest of
    # the stream would let the server finish. (The 100 ms budget is the hang tests' subject; a
    # wall-clock bound here failed once on a CI host stalled for 350 ms.)
    path = "some/" * 40 + "name.txt"
    reply = FakeReply.call("read_file", {"path": path}, text="Reading", chunk_chars=4)
    fake.enqueue(kind, reply.model_copy(update={"delay_ms": 30}))
    hooks = RecordingHooks()
    req = request(kind, user("go"), hooks=hooks)
    events = []
    async for event in make_adapter(kind).stream(req):
        events.append(event)
        if isinstance(event, ToolUseInputDelta):
            req.cancel.set()
    complete = check_invariants(events)
    assert complete.stop_reason == "cancelled"
    assert isinstance(events[-2], ToolUseEnd) and events[-2].final_input == {}
    assert complete.final_content[0].text == "Reading"
    # the call is billed though cut short: the prompt (Anthropic's message_start counted it;
    # OpenAI's usage chunk never came, so it is estimated) and the output streamed so far
    # (estimated at chars / 4, more than message_start's count), flagged estimated
    streamed = len("Reading") + sum(
        len(e.partial_json) for e in events if isinstance(e, ToolUseInputDelta)
    )
    assert complete.usage.input_tokens > 0
    assert complete.usage.output_tokens == -(-streamed // 4)
    assert complete.usage.estimated
    assert hooks.calls == [("started", 1)]  # the caller reports the cancelled attempt itself
    await fake.wait_until(lambda: fake.requests[0].client_disconnected, timeout=2)
    assert not fake.requests[0].completed


@pytest.mark.parametrize("kind", APIS)
async def test_cancel_unblocks_a_hung_stream_at_once(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(
        kind, FakeReply.hang_after(5 if kind == "anthropic" else 3, text="hello hanging world")
    )
    req = request(kind)
    events = []
    async for event in make_adapter(kind).stream(req):
        events.append(event)
        if len(events) == 2:
            fired = _cancel_later(req.cancel, 0.05)
    assert time.perf_counter() - fired[0] < CANCEL_BUDGET_S
    complete = check_invariants(events)
    assert complete.stop_reason == "cancelled"
    await fake.wait_until(lambda: fake.requests[0].client_disconnected, timeout=2)


@pytest.mark.parametrize("kind", APIS)
async def test_cancel_of_a_stream_hung_before_content_raises_cancelled(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply.hang_after(1))
    req = request(kind)
    fired = _cancel_later(req.cancel, 0.05, fake)
    with pytest.raises(ProviderError) as info:
        async for _ in make_adapter(kind).stream(req):
            pytest.fail("nothing may be yielded")
    assert info.value.error_class == "cancelled"
    assert time.perf_counter() - fired[0] < CANCEL_BUDGET_S


async def test_cancel_during_backoff_ends_the_wait_without_another_attempt(
    fake: FakeProviderServer, make_adapter, fake_sleep: FakeSleep
) -> None:
    fake_sleep.block = True
    fake.enqueue("openai", FakeReply.fail(500), FakeReply.say("never"))
    hooks = RecordingHooks()
    req = request("openai", hooks=hooks)
    fired = _cancel_later(req.cancel, 0.05, fake)
    with pytest.raises(ProviderError) as info:
        async for _ in make_adapter("openai").stream(req):
            pass
    assert info.value.error_class == "cancelled"
    assert time.perf_counter() - fired[0] < CANCEL_BUDGET_S
    assert len(fake.requests) == 1 and len(fake_sleep.delays) == 1
    assert hooks.calls == [("started", 1), ("failed", 1, "server_error", True)]


@pytest.mark.parametrize("kind", APIS)
async def test_cancel_before_the_call_sends_nothing(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    req = request(kind)
    req.cancel.set()
    with pytest.raises(ProviderError) as info:
        async for _ in make_adapter(kind).stream(req):
            pass
    assert info.value.error_class == "cancelled"
    with pytest.raises(ProviderError):
        await make_adapter(kind).complete(req)
    assert fake.requests == []


@pytest.mark.parametrize("kind", APIS)
async def test_task_cancellation_propagates_and_aborts_the_request(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply.slow(40, text="a slow reply that keeps streaming", chunk_chars=2))
    adapter = make_adapter(kind)
    seen: list[str] = []

    async def consume() -> None:
        async for event in adapter.stream(request(kind)):
            seen.append(event.type)

    task = asyncio.create_task(consume())
    await fake.wait_until(lambda: bool(fake.requests) and fake.requests[0].events_sent >= 3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "message.complete" not in seen
    await fake.wait_until(lambda: fake.requests[0].client_disconnected, timeout=2)


@pytest.mark.parametrize("kind", APIS)
async def test_complete_is_cancelled_while_waiting(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply(first_byte_delay_ms=5000))
    req = request(kind)
    fired = _cancel_later(req.cancel, 0.05, fake)
    with pytest.raises(ProviderError) as info:
        await make_adapter(kind).complete(req)
    assert info.value.error_class == "cancelled"
    assert time.perf_counter() - fired[0] < CANCEL_BUDGET_S
    await fake.wait_until(lambda: fake.requests[0].client_disconnected, timeout=2)
