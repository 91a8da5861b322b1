"""Fixtures shared by the command tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from metis.server.runner import Daemon
from tests.api import Api, api_session


@pytest.fixture
async def api_of() -> AsyncIterator[Callable[[Daemon], Api]]:
    """Factory: an Api on a daemon's base URL (its HTTP session closed at teardown)."""
    opened: list[aiohttp.ClientSession] = []

    def make(d: Daemon) -> Api:
        http = api_session(d)
        opened.append(http)
        return Api(http)

    yield make
    for http in opened:
        await http.close()
