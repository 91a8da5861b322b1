"""The end-to-end daemon: every tool class on `auto` and both providers pointed at the fake
provider server, so a scripted reply runs its tools without a confirmation in the way."""

from __future__ import annotations

import dataclasses
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


@pytest.fixture
def brief_shell_kill_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon started after it (so listed before `env`) gives a shell that ignores SIGTERM
    1.5 s before SIGKILL, not the contract's 5 s: `ToolLimits` keeps that grace out of
    config.yaml so that tests can lower it. For tests that need the grace under way, not its
    length."""
    from metis.core import runtime

    build = runtime.limits_from_settings

    def with_brief_grace(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(build(*args, **kwargs), shell_kill_grace_seconds=1.5)

    monkeypatch.setattr(runtime, "limits_from_settings", with_brief_grace)
