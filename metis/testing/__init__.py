"""Test support shipped with the package: the fake provider server (providers.md §8)."""

from metis.testing.fake_provider import (
    FakeProviderServer,
    FakeReply,
    FakeToolCall,
    FakeUsage,
    RecordedRequest,
)

__all__ = ["FakeProviderServer", "FakeReply", "FakeToolCall", "FakeUsage", "RecordedRequest"]
