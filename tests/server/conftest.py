"""Fixtures shared by the server tests: a loopback fake provider and daemons with an Api."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from metis.server.runner import Daemon
from metis.testing import FakeProviderServer
from tests.api import Api, api_session


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviderServer]:
    async with FakeProviderServer() as server:
        yield server


@pytest.fixture
async def api(daemon: Daemon) -> AsyncIterator[Api]:
    """An Api on the default test daemon."""
    async with api_session(daemon) as http:
        yield Api(http)


@pytest.fixture
async def make_api(start_daemon: Callable[..., Any]) -> AsyncIterator[Callable[..., Any]]:
    """Start a daemon with the given config files and return it with an Api."""
    opened: list[aiohttp.ClientSession] = []

    async def make(**kw: Any) -> tuple[Daemon, Api]:
        d = await start_daemon(**kw)
        http = api_session(d)
        opened.append(http)
        return d, Api(http)

    yield make
    for http in opened:
        await http.close()
