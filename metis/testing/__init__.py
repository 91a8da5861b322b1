"""Test support shipped with the package: the fake provider server.

Names are resolved lazily (PEP 562) so that `python -m metis.testing.fake_provider` does not
import the module twice.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FakeProviderServer", "FakeReply", "FakeToolCall", "FakeUsage", "RecordedRequest"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from metis.testing import fake_provider

        return getattr(fake_provider, name)
    raise AttributeError(f"module 'metis.testing' has no attribute {name!r}")
