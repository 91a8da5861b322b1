"""A request with no HTTP answer says which provider (its models.yaml name), where, and why."""

from __future__ import annotations

import socket

import aiohttp
import httpx2
import pytest

from metis.core.models.types import ProviderConfig
from metis.core.providers import RetryPolicy, build_adapter
from metis.core.providers.connection import Endpoint, describe
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import APIS, FakeSleep, collect, request

ENDPOINT = Endpoint("deadai", "127.0.0.1:18699", connect_timeout_s=2.0, read_timeout_s=7.5)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _raised(exc: BaseException, *causes: BaseException) -> BaseException:
    """`exc` raised from `causes[0]`, raised from `causes[1]`… (as the SDKs chain them)."""
    current = exc
    for cause in causes:
        current.__cause__ = cause
        current = cause
    return exc


@pytest.mark.parametrize("kind", APIS)
async def test_a_refused_connection_names_the_provider_and_its_address(
    kind: str, fake_sleep: FakeSleep
) -> None:
    """The "Ollama isn't running" case: the openai SDK over aiohttp calls it a timeout."""
    port = _closed_port()
    base = f"http://127.0.0.1:{port}" + ("/v1" if kind == "openai" else "")
    adapter = build_adapter(
        ProviderConfig(name="deadai", adapter=kind, base_url=base, api_key="k"),
        retry_policy=RetryPolicy(sleep=fake_sleep),
    )
    try:
        events, error = await collect(adapter.stream(request(kind)))
    finally:
        await adapter.aclose()
    assert events == [] and error is not None and error.error_class == "network"
    assert error.message == f"deadai: cannot connect to 127.0.0.1:{port} (connection refused)"
    assert error.provider == "deadai" and error.attempts == 3


@pytest.mark.parametrize("kind", APIS)
async def test_a_read_timeout_names_the_setting(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    fake.enqueue(kind, FakeReply(first_byte_delay_ms=2000, repeat=3))
    adapter = make_adapter(kind, name="slowai", read_timeout_s=0.05)
    events, error = await collect(adapter.stream(request(kind)))
    assert events == [] and error is not None and error.error_class == "network"
    assert error.message == (
        f"slowai: no reply from 127.0.0.1:{fake.port} within 0.05 s (read_timeout_s)"
    )


@pytest.mark.parametrize("kind", APIS)
async def test_an_error_answer_names_the_provider_not_its_adapter(
    kind: str, fake: FakeProviderServer, make_adapter
) -> None:
    """Two providers on the openai adapter (a local server and OpenAI) are told apart."""
    fake.enqueue(kind, FakeReply.fail(400))
    adapter = make_adapter(kind, name="ollama")
    events, error = await collect(adapter.stream(request(kind)))
    assert events == [] and error is not None
    assert error.message.startswith("ollama HTTP 400 ("), error.message


@pytest.mark.parametrize(
    ("chain", "expected"),
    [
        (
            (httpx2.ConnectError("x"), socket.gaierror(-2, "Name or service not known")),
            "deadai: cannot connect to 127.0.0.1:18699 (host not found)",
        ),
        (  # the SDK's own httpx stack (a proxy is set)
            (httpx2.ConnectError("x"), OSError(113, "No route to host")),
            "deadai: cannot connect to 127.0.0.1:18699 (no route to host)",
        ),
        (
            (httpx2.ConnectTimeout("x"), aiohttp.ConnectionTimeoutError("x")),
            "deadai: cannot connect to 127.0.0.1:18699 (no answer within 2 s, connect_timeout_s)",
        ),
        (  # the openai SDK maps a dropped connection to ConnectTimeout: aiohttp's word counts
            (httpx2.ConnectTimeout("x"), aiohttp.ServerDisconnectedError()),
            "deadai: the connection to 127.0.0.1:18699 failed (ServerDisconnectedError)",
        ),
        (
            (httpx2.ReadTimeout("x"),),
            "deadai: no reply from 127.0.0.1:18699 within 7.5 s (read_timeout_s)",
        ),
        ((TimeoutError(),), "deadai: the request to 127.0.0.1:18699 timed out"),
        (
            (ConnectionResetError(104, "Connection reset by peer"),),
            "deadai: the connection to 127.0.0.1:18699 failed (ConnectionResetError)",
        ),
    ],
)
def test_the_chain_says_what_happened(chain: tuple[BaseException, ...], expected: str) -> None:
    assert describe(_raised(*chain), ENDPOINT) == expected


@pytest.mark.parametrize(
    ("base_url", "address"),
    [
        ("https://api.anthropic.com", "api.anthropic.com:443"),
        ("http://localhost:11434/v1/", "localhost:11434"),
        ("http://[::1]:8080/v1", "[::1]:8080"),
        ("http://ollama.lan/v1", "ollama.lan:80"),
    ],
)
def test_the_endpoint_is_host_and_port(base_url: str, address: str) -> None:
    config = ProviderConfig(name="p", adapter="openai", base_url=base_url, read_timeout_s=9)
    assert Endpoint.of(config, base_url) == Endpoint("p", address, 10.0, 9.0)
