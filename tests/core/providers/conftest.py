"""Fixtures: a loopback fake provider (keys required) and adapters built on it with a fake clock.

Everything goes through the real SDKs over HTTP; the only things replaced are time (the retry
sleep records its delay and returns at once) and randomness (seeded jitter).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from metis.core.models.types import ProviderConfig
from metis.core.providers import RetryPolicy, build_adapter
from metis.testing import FakeProviderServer
from tests.core.providers.provider_kit import KEYS, FakeSleep


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviderServer]:
    server = FakeProviderServer(expected_keys=dict(KEYS))
    await server.start(host="127.0.0.1", port=0)
    yield server
    await server.stop()


@pytest.fixture
def fake_sleep() -> FakeSleep:
    return FakeSleep()


@pytest.fixture
def policy(fake_sleep: FakeSleep) -> RetryPolicy:
    return RetryPolicy(sleep=fake_sleep, rng=random.Random(1234))


AdapterFactory = Callable[..., Any]


@pytest.fixture
async def make_adapter(
    fake: FakeProviderServer, policy: RetryPolicy
) -> AsyncIterator[AdapterFactory]:
    built: list[Any] = []

    def factory(kind: str, **kw: Any) -> Any:
        base_url = fake.anthropic_base_url if kind == "anthropic" else fake.openai_base_url
        config: dict[str, Any] = {
            "name": kw.pop("name", kind),
            "adapter": kind,
            "base_url": base_url,
            "api_key": KEYS[kind],
            "read_timeout_s": 5.0,
            "connect_timeout_s": 2.0,
        }
        config.update(kw)
        adapter = build_adapter(ProviderConfig(**config), retry_policy=policy)
        built.append(adapter)
        return adapter

    yield factory
    for adapter in built:
        await adapter.aclose()
