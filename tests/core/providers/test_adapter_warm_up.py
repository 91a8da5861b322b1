"""The provider SDKs are imported in a background thread once the daemon listens
(`ModelRegistry.warm_in_background`): a call made before that is over waits for it and then
goes through the real adapter, over the real SDK, to the fake provider."""

from __future__ import annotations

import pytest

from metis.core.models.registry import ModelRegistry, load_models_bytes
from metis.core.providers.base import MessageComplete, TextDelta
from metis.testing import FakeProviderServer, FakeReply
from tests.core.providers.provider_kit import KEYS, collect, request


def fake_registry(fake: FakeProviderServer) -> ModelRegistry:
    text = f"""
pricing_version: "test"
providers:
  anthropic: {{adapter: anthropic, base_url: "{fake.anthropic_base_url}", api_key: "{KEYS["anthropic"]}"}}
  openai: {{adapter: openai, base_url: "{fake.openai_base_url}", api_key: "{KEYS["openai"]}"}}
models:
  - id: anthropic:fake-model
    capabilities: {{max_context_tokens: 200000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "1", output_per_mtok: "5"}}
  - id: openai:fake-model
    capabilities: {{max_context_tokens: 200000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "1", output_per_mtok: "5"}}
"""
    loaded = load_models_bytes(text.encode(), env={})
    assert loaded.registry is not None, loaded.diagnostics
    return loaded.registry


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_call_made_before_the_warm_up_is_over_waits_for_it(
    fake: FakeProviderServer, kind: str
) -> None:
    registry = fake_registry(fake)
    fake.enqueue(kind, FakeReply.say("warm enough"))
    registry.warm_in_background()
    # The warm-up ends on the loop, which has not run since: this call must wait for it.
    early = registry.adapter_for(f"{kind}:fake-model")
    try:
        events, error = await collect(early.stream(request(kind)))
        assert error is None
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "warm enough"
        assert isinstance(events[-1], MessageComplete)
        # once warm, the registry hands out the real adapter, built once per provider
        real = registry.adapter_for(f"{kind}:fake-model")
        assert real is not early and registry.adapter_for(f"{kind}:fake-model") is real
    finally:
        await registry.aclose()


async def test_the_warm_up_builds_every_configured_provider_adapter(
    fake: FakeProviderServer,
) -> None:
    registry = fake_registry(fake)
    registry.warm_in_background()
    await registry.wait_warm()
    try:
        adapters = {registry.adapter_for(f"{k}:fake-model") for k in ("anthropic", "openai")}
        assert {type(a).__name__ for a in adapters} == {"AnthropicAdapter", "OpenAIAdapter"}
    finally:
        await registry.aclose()


async def test_a_registry_closed_during_the_warm_up_builds_nothing_after(
    fake: FakeProviderServer,
) -> None:
    """A daemon stopped while the SDKs load must not leave clients behind (unclosed sessions)."""
    registry = fake_registry(fake)
    registry.warm_in_background()
    await registry.aclose()
    await registry.wait_warm()
    assert registry._adapters == {}
