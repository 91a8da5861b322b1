"""AAP fixtures: a real daemon with a known bearer key, the independent client, a fake provider."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.server.runner import Daemon
from metis.testing import FakeProviderServer
from tests.aap.client import AapClient

KEY = "aap-test-key-0123456789abcdef"


def fake_models(server: FakeProviderServer, *, context: int = 200_000) -> str:
    return f"""
pricing_version: "test"
providers:
  anthropic: {{adapter: anthropic, base_url: "{server.anthropic_base_url}", api_key: "ak-test"}}
models:
  - id: anthropic:claude-haiku-4-5
    aliases: [haiku]
    capabilities: {{max_context_tokens: {context}, max_output_tokens: 1024, supports_thinking: true, supports_images: true}}
    pricing: {{input_per_mtok: "1", output_per_mtok: "5"}}
"""


@pytest.fixture
def api_key(metis_home: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("METIS_API_KEY", KEY)
    return KEY


def roots(workspace: Path) -> dict[str, Any]:
    """Daemon overrides allowing the test workspace as an AAP `workspace` option value."""
    return {"aap": {"workspace_roots": [str(workspace)]}}


@pytest.fixture
async def client_for(api_key: str, workspace: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory: an AapClient bound to a daemon (sessions closed at teardown)."""
    opened: list[aiohttp.ClientSession] = []

    async def make(daemon: Daemon, key: str | None = api_key) -> AapClient:
        http = aiohttp.ClientSession(base_url=daemon.base_url)
        opened.append(http)
        return AapClient(http, key, workspace=str(workspace.resolve()))

    yield make
    for http in opened:
        await http.close()


@pytest.fixture
async def daemon_and_aap(
    api_key: str, start_daemon: Callable[..., Any], client_for: Callable[..., Any], workspace: Path
) -> tuple[Daemon, AapClient]:
    d = await start_daemon(**roots(workspace))
    return d, await client_for(d)


@pytest.fixture
async def aap(daemon_and_aap: tuple[Daemon, AapClient]) -> AapClient:
    return daemon_and_aap[1]


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviderServer]:
    server = FakeProviderServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def fake_aap(
    api_key: str,
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    client_for: Callable[..., Any],
    workspace: Path,
) -> tuple[Daemon, AapClient, FakeProviderServer]:
    d = await start_daemon(models=fake_models(fake), **roots(workspace))
    return d, await client_for(d), fake
