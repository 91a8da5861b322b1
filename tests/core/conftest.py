"""A started Core on a real SQLite file, stopped after the test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from metis.config import Settings
from metis.core.runtime import Core


@pytest.fixture
async def core(make_settings: Callable[..., Settings]) -> AsyncIterator[Core]:
    c = Core(make_settings())
    await c.start()
    try:
        yield c
    finally:
        await c.stop()
