"""Classification of every provider error, for both adapters' error mappings."""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from metis.core.models.types import ProviderConfig
from metis.core.providers import ProviderError, RetryPolicy, build_adapter
from metis.core.providers.anthropic import classify as classify_anthropic
from metis.core.providers.connection import Endpoint
from metis.core.providers.errors import parse_retry_after
from metis.core.providers.openai import classify as classify_openai
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import APIS, KEYS, FakeSleep, collect, request, user

RETRYABLE = {"rate_limit", "server_error", "network"}
ENDPOINT = Endpoint("p", "127.0.0.1:1", connect_timeout_s=1.0, read_timeout_s=1.0)

ANTHROPIC_ROWS = [
    (400, "invalid_request_error", None, "messages: bad field", "invalid_request"),
    (
        400,
        "invalid_request_error",
        None,
        "prompt is too long: 210000 tokens > 200000",
        "context_overflow",
    ),
    (400, "invalid_request_error", None, "input exceeds the context window", "context_overflow"),
    (401, "authentication_error", None, None, "auth"),
    (403, "permission_error", None, None, "auth"),
    (404, "not_found_error", None, None, "invalid_request"),
    (408, None, None, None, "network"),
    (413, "request_too_large", None, None, "context_overflow"),
    (422, None, None, None, "invalid_request"),
    (429, "rate_limit_error", None, None, "rate_limit"),
    (500, "api_error", None, None, "server_error"),
    (503, None, None, None, "server_error"),
    (529, "overloaded_error", None, None, "server_error"),
]
OPENAI_ROWS = [
    (400, None, None, "bad request", "invalid_request"),
    (400, None, "context_length_exceeded", None, "context_overflow"),
    (400, None, "content_filter", None, "content_filter"),
    (400, None, "content_policy_violation", None, "content_filter"),
    (401, None, None, None, "auth"),
    (403, None, None, None, "auth"),
    (404, None, None, None, "invalid_request"),
    (408, None, None, None, "network"),
    (413, None, None, None, "context_overflow"),
    (422, None, None, None, "invalid_request"),
    (429, "insufficient_quota", "insufficient_quota", None, "auth"),
    (429, None, None, None, "rate_limit"),
    (500, None, None, None, "server_error"),
    (503, None, None, None, "server_error"),
]


async def _fail_with(make_adapter, fake, kind: str, reply: FakeReply) -> ProviderError:
    fake.enqueue(kind, reply.model_copy(update={"repeat": 3}))
    events, error = await collect(make_adapter(kind).stream(request(kind, user("hi"))))
    assert events == [] and error is not None
    return error


@pytest.mark.parametrize(("status", "etype", "code", "message", "expected"), ANTHROPIC_ROWS)
async def test_anthropic_status_table(
    status, etype, code, message, expected, fake: FakeProviderServer, make_adapter
) -> None:
    reply = FakeReply.fail(status, etype, code=code, message=message)
    error = await _fail_with(make_adapter, fake, "anthropic", reply)
    assert error.error_class == expected
    assert error.http_status == status and error.provider == "anthropic"
    assert error.model == "anthropic:fake-model" and not error.after_first_token
    assert error.attempts == (3 if expected in RETRYABLE else 1)
    assert error.counts_for_availability is (expected in RETRYABLE | {"auth"})


@pytest.mark.parametrize(("status", "etype", "code", "message", "expected"), OPENAI_ROWS)
async def test_openai_status_table(
    status, etype, code, message, expected, fake: FakeProviderServer, make_adapter
) -> None:
    reply = FakeReply.fail(status, etype, code=code, message=message)
    error = await _fail_with(make_adapter, fake, "openai", reply)
    assert error.error_class == expected
    assert error.http_status == status
    assert error.attempts == (3 if expected in RETRYABLE else 1)


@pytest.mark.parametrize("kind", APIS)
async def test_complete_classifies_like_stream(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply.fail(401))
    with pytest.raises(ProviderError) as info:
        await make_adapter(kind).complete(request(kind))
    assert info.value.error_class == "auth"


@pytest.mark.parametrize("kind", APIS)
async def test_unexpected_redirect_status_is_other(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    error = await _fail_with(make_adapter, fake, kind, FakeReply.fail(304))
    assert error.error_class == "other"


@pytest.mark.parametrize(
    ("kind", "etype", "expected"),
    [
        ("anthropic", "overloaded_error", "server_error"),
        ("anthropic", "api_error", "server_error"),
        ("anthropic", "rate_limit_error", "rate_limit"),
        ("anthropic", "invalid_request_error", "invalid_request"),
        ("openai", None, "server_error"),
        ("openai", "rate_limit_exceeded", "rate_limit"),
    ],
)
async def test_stream_error_events_are_classed_by_their_type(
    kind: str, etype: str | None, expected: str, fake: FakeProviderServer, make_adapter
) -> None:
    error = await _fail_with(
        make_adapter, fake, kind, FakeReply.error_event_after(1, error_type=etype)
    )
    assert error.error_class == expected
    assert error.http_status is None


@pytest.mark.parametrize("kind", APIS)
async def test_malformed_json_body_is_server_error(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply.malformed_after(0, repeat=3))
    with pytest.raises(ProviderError) as info:
        await make_adapter(kind).complete(request(kind))
    assert info.value.error_class == "server_error" and info.value.attempts == 3


@pytest.mark.parametrize("kind", APIS)
async def test_connection_refused_is_network(kind: str, fake_sleep: FakeSleep) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}" + ("/v1" if kind == "openai" else "")
    adapter = build_adapter(
        ProviderConfig(name=kind, adapter=kind, base_url=base, api_key="k", connect_timeout_s=1),
        retry_policy=RetryPolicy(sleep=fake_sleep),
    )
    try:
        events, error = await collect(adapter.stream(request(kind)))
    finally:
        await adapter.aclose()
    assert events == [] and error is not None
    assert error.error_class == "network" and error.attempts == 3
    assert len(fake_sleep.delays) == 2


@pytest.mark.parametrize("kind", APIS)
async def test_read_timeout_is_network(kind: str, fake: FakeProviderServer, make_adapter) -> None:
    fake.enqueue(kind, FakeReply(first_byte_delay_ms=2000, repeat=3))
    adapter = make_adapter(kind, read_timeout_s=0.05)
    events, error = await collect(adapter.stream(request(kind)))
    assert events == [] and error is not None and error.error_class == "network"


@pytest.mark.parametrize("kind", APIS)
async def test_error_messages_never_carry_the_key(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    leak = f"Incorrect API key provided: {KEYS[kind]} and sk-abcdefghijklmnop"
    error = await _fail_with(make_adapter, fake, kind, FakeReply.fail(401, message=leak))
    assert KEYS[kind] not in error.message and "sk-abcdefghijklmnop" not in error.message
    assert "[redacted]" in error.message and KEYS[kind] not in repr(error)


def test_unexpected_exceptions_become_other_with_a_logged_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR):
        for classify in (classify_anthropic, classify_openai):
            try:
                {}["boom"]
            except KeyError as exc:
                error = classify(exc, endpoint=ENDPOINT, model="p:m")
            assert error.error_class == "other"
            assert error.message == "internal adapter error: KeyError"
    assert "Traceback" in caplog.text


def test_retry_after_parsing() -> None:
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "-3"}) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None
    now = datetime(2030, 1, 1, tzinfo=UTC)
    future = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"retry-after": future}, now=now.timestamp()) == 30.0
    past = format_datetime(now - timedelta(seconds=30), usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now.timestamp()) == 0.0


@pytest.mark.parametrize("kind", APIS)
@pytest.mark.parametrize("streamed", [True, False])
async def test_a_key_no_http_header_can_carry_fails_the_call_as_auth_naming_where_it_came_from(
    kind: str,
    streamed: bool,
    fake: FakeProviderServer,
    make_adapter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A key pasted with typographic quotes cannot be sent: the call fails before any request
    as an `auth` error (so availability counts it) that says where the key came from, not as
    an "internal adapter error" with a traceback; the key itself is never shown."""
    key = "\u201czz-quoted-key\u201d"
    adapter = make_adapter(kind, api_key=key, api_key_env="QUOTED_KEY")
    with caplog.at_level(logging.DEBUG):
        if streamed:
            events, error = await collect(adapter.stream(request(kind)))
            assert events == []
        else:
            with pytest.raises(ProviderError) as info:
                await adapter.complete(request(kind))
            error = info.value
    assert error is not None and error.error_class == "auth" and error.attempts == 1
    assert error.message == (
        f"the key of provider '{kind}' (QUOTED_KEY) holds a character an HTTP header cannot "
        "carry (a typographic quote copied with it?); fix it and restart metis"
    )
    assert fake.requests == []
    assert "zz-quoted-key" not in caplog.text and "Traceback" not in caplog.text
