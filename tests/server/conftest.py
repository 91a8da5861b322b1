"""Fixtures shared by the server tests: a loopback fake provider and daemons with an Api."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

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
def make_api(
    start_daemon: Callable[..., Any], api_of: Callable[[Daemon], Api]
) -> Callable[..., Any]:
    """Start a daemon with the given config files and return it with an Api."""

    async def make(**kw: Any) -> tuple[Daemon, Api]:
        d = await start_daemon(**kw)
        return d, api_of(d)

    return make
