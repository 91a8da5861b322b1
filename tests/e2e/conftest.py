"""The end-to-end daemon: every tool class on `auto` and both providers pointed at the fake
provider server, so a scripted reply runs its tools without a confirmation in the way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer
from tests.api import Api, api_session
from tests.e2e.test_provider_turns import AUTO_TOOLS, models_yaml


@pytest.fixture
async def env(
    fake: FakeProviderServer, start_daemon: Callable[..., Any]
) -> AsyncIterator[tuple[Daemon, Api, FakeProviderServer]]:
    d = await start_daemon(config=AUTO_TOOLS, models=models_yaml(fake))
    async with api_session(d) as http:
        yield d, Api(http), fake
