"""The SDKs' HTTP client: aiohttp by default, the SDK's own httpx client when a proxy is set.

Both paths stream through the same event-stream decoder; the second is exercised for real by
setting a proxy variable with the loopback fake provider exempted through NO_PROXY.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from metis.core.providers.transport import sdk_http_client
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import APIS, check_invariants, collect, request, user


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.mark.parametrize("sdk", [anthropic, openai], ids=["anthropic", "openai"])
def test_aiohttp_transport_is_used_without_a_proxy(sdk, no_proxy_env: None) -> None:
    client = sdk_http_client(sdk)
    assert isinstance(client, sdk.DefaultAioHttpClient)


@pytest.mark.parametrize("name", ["HTTPS_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_proxy_variable_keeps_the_sdk_default_client(
    name: str, no_proxy_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, "http://proxy.invalid:3128")
    assert sdk_http_client(anthropic) is None
    assert sdk_http_client(openai) is None


@pytest.mark.parametrize("kind", APIS)
async def test_streaming_works_through_the_sdk_default_client_too(
    kind: str,
    fake: FakeProviderServer,
    make_adapter,
    no_proxy_env: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    fake.enqueue(kind, FakeReply.say("through httpx", chunk_chars=3))
    adapter = make_adapter(kind)
    events, error = await collect(adapter.stream(request(kind, user("hi"))))
    assert error is None
    complete = check_invariants(events)
    assert complete.final_content[0].text == "through httpx"
