"""Provider adapters: one per `providers.<name>` entry, built by `build_adapter`.

The agent loop imports only this package's public names; SDKs stay behind the adapters.
"""

from __future__ import annotations

from metis.core.canonical.redaction import register_secret
from metis.core.models.types import ProviderConfig
from metis.core.providers.base import (
    AttemptHooks,
    LLMRequest,
    LLMResult,
    MessageComplete,
    MessageStart,
    NoHooks,
    ProviderAdapter,
    StopReason,
    StreamEvent,
    TextDelta,
    ThinkingDelta,
    ToolIdMap,
    ToolUseEnd,
    ToolUseInputDelta,
    ToolUseStart,
)
from metis.core.providers.errors import (
    COUNTED_FOR_AVAILABILITY,
    RETRYABLE,
    ErrorClass,
    ProviderError,
)
from metis.core.providers.retry import DEFAULT_RETRY_POLICY, RetryPolicy

__all__ = [
    "COUNTED_FOR_AVAILABILITY",
    "RETRYABLE",
    "AttemptHooks",
    "ErrorClass",
    "LLMRequest",
    "LLMResult",
    "MessageComplete",
    "MessageStart",
    "NoHooks",
    "ProviderAdapter",
    "ProviderError",
    "RetryPolicy",
    "StopReason",
    "StreamEvent",
    "TextDelta",
    "ThinkingDelta",
    "ToolIdMap",
    "ToolUseEnd",
    "ToolUseInputDelta",
    "ToolUseStart",
    "build_adapter",
]


def build_adapter(
    provider: ProviderConfig, *, retry_policy: RetryPolicy | None = None
) -> ProviderAdapter:
    """The adapter for one provider entry; the registry keeps one instance per provider.

    SDK modules are imported lazily so a daemon that only runs the scripted model never pays for
    them. `retry_policy` exists for tests and benchmarks (fake sleep, seeded jitter).
    """
    register_secret(provider.api_key)
    policy = retry_policy or DEFAULT_RETRY_POLICY
    if provider.adapter == "anthropic":
        from metis.core.providers.anthropic import AnthropicAdapter

        return AnthropicAdapter(provider, policy=policy)
    if provider.adapter == "openai":
        from metis.core.providers.openai import OpenAIAdapter

        return OpenAIAdapter(provider, policy=policy)
    if provider.adapter == "scripted":
        from metis.core.providers.scripted import ScriptedAdapter

        return ScriptedAdapter(provider)
    raise ValueError(f"unknown adapter kind {provider.adapter!r}")
