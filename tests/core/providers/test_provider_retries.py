"""The retry policy through real SDK calls, with a fake clock and seeded jitter."""

from __future__ import annotations

import random

import pytest

from metis.core.providers import ProviderError, RetryPolicy
from metis.core.providers.base import MessageComplete, MessageStart
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import (
    APIS,
    FakeSleep,
    RecordingHooks,
    check_invariants,
    collect,
    request,
    user,
)


def _error(error_class: str = "server_error", **kw) -> ProviderError:
    return ProviderError(error_class, "x", provider="p", model="p:m", **kw)  # type: ignore[arg-type]


def test_backoff_doubles_with_jitter_and_caps_at_30_seconds() -> None:
    policy = RetryPolicy(rng=random.Random(7), max_attempts=10)
    draws = random.Random(7)
    for attempt, base in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 30.0), (8, 30.0)]:
        expected = base * draws.uniform(0.75, 1.25)
        assert policy.delay_before_retry(attempt, _error()) == pytest.approx(expected)


def test_retry_after_is_exact_up_to_60_seconds_and_longer_means_no_retry() -> None:
    policy = RetryPolicy()
    assert policy.delay_before_retry(1, _error("rate_limit", retry_after_s=60.0)) == 60.0
    assert policy.delay_before_retry(1, _error("rate_limit", retry_after_s=0.0)) == 0.0
    assert policy.delay_before_retry(1, _error("rate_limit", retry_after_s=60.5)) is None


@pytest.mark.parametrize(
    "error_class",
    ["auth", "invalid_request", "context_overflow", "content_filter", "cancelled", "other"],
)
def test_only_rate_limit_server_and_network_errors_are_retried(error_class: str) -> None:
    assert RetryPolicy().delay_before_retry(1, _error(error_class)) is None


def test_no_retry_after_the_last_attempt_or_after_the_first_token() -> None:
    policy = RetryPolicy()
    assert policy.delay_before_retry(3, _error("network")) is None
    assert policy.delay_before_retry(1, _error("network", after_first_token=True)) is None


@pytest.mark.parametrize("kind", APIS)
async def test_two_server_errors_then_success_is_invisible_downstream(
    kind: str, fake: FakeProviderServer, make_adapter, fake_sleep: FakeSleep
) -> None:
    fake.enqueue(kind, FakeReply.fail(500, repeat=2), FakeReply.say("finally"))
    hooks = RecordingHooks()
    events, error = await collect(make_adapter(kind).stream(request(kind, hooks=hooks)))
    assert error is None
    complete = check_invariants(events)
    assert complete.attempts == 3
    assert sum(isinstance(e, MessageStart) for e in events) == 1
    assert hooks.calls == [
        ("started", 1),
        ("failed", 1, "server_error", True),
        ("started", 2),
        ("failed", 2, "server_error", True),
        ("started", 3),
    ]
    draws = random.Random(1234)  # the fixture's seed
    assert fake_sleep.delays == pytest.approx(
        [1.0 * draws.uniform(0.75, 1.25), 2.0 * draws.uniform(0.75, 1.25)]
    )
    assert len(fake.requests) == 3


@pytest.mark.parametrize("kind", APIS)
async def test_three_failures_exhaust_the_attempts(
    kind: str, fake: FakeProviderServer, make_adapter, fake_sleep: FakeSleep
) -> None:
    fake.enqueue(kind, FakeReply.fail(529 if kind == "anthropic" else 503, repeat=3))
    hooks = RecordingHooks()
    events, error = await collect(make_adapter(kind).stream(request(kind, hooks=hooks)))
    assert events == [] and error is not None and error.attempts == 3
    assert [c for c in hooks.calls if c[0] == "failed"] == [
        ("failed", 1, "server_error", True),
        ("failed", 2, "server_error", True),
        ("failed", 3, "server_error", False),
    ]
    assert len(fake_sleep.delays) == 2


@pytest.mark.parametrize("kind", APIS)
async def test_retry_after_one_second_is_honoured_without_jitter(
    kind: str, fake: FakeProviderServer, make_adapter, fake_sleep: FakeSleep
) -> None:
    fake.enqueue(kind, FakeReply.fail(429, retry_after=1), FakeReply.say("ok"))
    events, error = await collect(make_adapter(kind).stream(request(kind)))
    assert error is None and events[-1].attempts == 2
    assert fake_sleep.delays == [1.0]


async def test_retry_after_ms_wins_over_retry_after(
    fake: FakeProviderServer, make_adapter, fake_sleep: FakeSleep
) -> None:
    reply = FakeReply.fail(429, headers={"retry-after-ms": "250", "retry-after": "9"})
    fake.enqueue("anthropic", reply, FakeReply.say("ok"))
    _events, error = await collect(make_adapter("anthropic").stream(request("anthropic")))
    assert error is None and fake_sleep.delays == [0.25]


@pytest.mark.parametrize("kind", APIS)
async def test_retry_after_over_60_seconds_is_not_retried(
    kind: str, fake: FakeProviderServer, make_adapter, fake_sleep: FakeSleep
) -> None:
    fake.enqueue(kind, FakeReply.fail(429, retry_after=61), FakeReply.say("never"))
    hooks = RecordingHooks()
    events, error = await collect(make_adapter(kind).stream(request(kind, hooks=hooks)))
    assert events == [] and error is not None
    assert error.error_class == "rate_limit" and error.retry_after_s == 61.0 and error.attempts == 1
    assert hooks.calls == [("started", 1), ("failed", 1, "rate_limit", False)]
    assert fake_sleep.delays == [] and len(fake.requests) == 1


@pytest.mark.parametrize("kind", APIS)
@pytest.mark.parametrize("status", [401, 400])
async def test_auth_and_invalid_requests_get_one_attempt(
    kind: str, status: int, fake: FakeProviderServer, make_adapter, fake_sleep: FakeSleep
) -> None:
    fake.enqueue(kind, FakeReply.fail(status), FakeReply.say("never"))
    _events, error = await collect(make_adapter(kind).stream(request(kind)))
    assert error is not None and error.attempts == 1 and len(fake.requests) == 1
    assert fake_sleep.delays == []


@pytest.mark.parametrize("kind", APIS)
async def test_drop_before_the_first_token_is_retried(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    before_content = 2 if kind == "anthropic" else 1  # message_start + ping / the role chunk
    fake.enqueue(kind, FakeReply.drop_after(before_content), FakeReply.say("second try"))
    hooks = RecordingHooks()
    events, error = await collect(make_adapter(kind).stream(request(kind, hooks=hooks)))
    assert error is None
    complete = check_invariants(events)
    assert complete.attempts == 2 and complete.final_content[0].text == "second try"
    assert hooks.calls[1] == ("failed", 1, "network", True)


@pytest.mark.parametrize("kind", APIS)
@pytest.mark.parametrize(
    ("failure", "error_class"), [("drop", "network"), ("malformed", "server_error")]
)
async def test_failure_after_the_first_token_closes_the_message_and_is_not_retried(
    kind: str, failure: str, error_class: str, fake: FakeProviderServer, make_adapter
) -> None:
    after = 6 if kind == "anthropic" else 4  # a few text deltas in
    reply = FakeReply(
        text="abcdefghijklmnopqrstuvwxyz", chunk_chars=2, fail_after_events=after, failure=failure
    )  # type: ignore[arg-type]
    fake.enqueue(kind, reply, FakeReply.say("never"))
    hooks = RecordingHooks()
    events, error = await collect(make_adapter(kind).stream(request(kind, hooks=hooks)))
    assert error is not None
    assert error.error_class == error_class and error.after_first_token and error.attempts == 1
    complete = check_invariants(events)
    assert isinstance(complete, MessageComplete) and complete.stop_reason == "error"
    assert complete.final_content and complete.final_content[0].text.startswith("ab")
    assert len(fake.requests) == 1
    assert hooks.calls == [("started", 1), ("failed", 1, error_class, False)]


async def test_failure_after_a_tool_call_started_closes_the_call(
    fake: FakeProviderServer, make_adapter
) -> None:
    reply = FakeReply.call("read_file", {"path": "a/long/path.txt"}, chunk_chars=4)
    fake.enqueue("anthropic", reply.model_copy(update={"fail_after_events": 6, "failure": "drop"}))
    events, error = await collect(make_adapter("anthropic").stream(request("anthropic")))
    assert error is not None and error.after_first_token
    complete = check_invariants(events)
    assert complete.stop_reason == "error"
    assert [e.type for e in events[-2:]] == ["tool.use_end", "message.complete"]
    assert events[-2].final_input == {}


@pytest.mark.parametrize("kind", APIS)
async def test_complete_retries_like_stream(
    kind: str, fake: FakeProviderServer, make_adapter, fake_sleep: FakeSleep
) -> None:
    fake.enqueue(kind, FakeReply.fail(500), FakeReply.say("ok"))
    hooks = RecordingHooks()
    result = await make_adapter(kind).complete(request(kind, user("x"), hooks=hooks))
    assert result.attempts == 2 and len(fake_sleep.delays) == 1
    assert hooks.calls == [("started", 1), ("failed", 1, "server_error", True), ("started", 2)]
