"""Shared builders for routing tests: registries and policies from strings, a manual clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from metis.core.models.registry import ModelRegistry, load_models_bytes
from metis.core.routing.context import TurnContext
from metis.core.routing.loader import Policy, PolicyCheck, validate_policy

MODELS_YAML = """\
schema_version: 1
pricing_version: "2026-05-08"
providers:
  anthropic: {adapter: anthropic, api_key_env: ANTHROPIC_API_KEY}
  openai: {adapter: openai, api_key_env: OPENAI_API_KEY}
  ollama: {adapter: openai, base_url: "http://127.0.0.1:11434/v1", api_key_env: OLLAMA_KEY}
models:
  - id: anthropic:sonnet
    tier: balanced
    aliases: [sonnet, balanced]
    capabilities: {supports_images: true, max_context_tokens: 200000, max_output_tokens: 64000}
    pricing: {input_per_mtok: "3", output_per_mtok: "15"}
  - id: anthropic:opus
    tier: deep
    aliases: [opus]
    capabilities: {supports_images: true, max_context_tokens: 200000, max_output_tokens: 32000}
    pricing: {input_per_mtok: "15", output_per_mtok: "75"}
  - id: anthropic:haiku
    tier: fast
    aliases: [haiku]
    capabilities: {supports_images: true, max_context_tokens: 200000, max_output_tokens: 64000}
    pricing: {input_per_mtok: "1", output_per_mtok: "5"}
  - id: openai:gpt-5
    aliases: [gpt5]
    capabilities: {supports_images: true, max_context_tokens: 272000, max_output_tokens: 128000}
    pricing: {input_per_mtok: "1.25", output_per_mtok: "10"}
  - id: openai:mini
    aliases: [mini]
    capabilities: {supports_images: false, max_context_tokens: 272000, max_output_tokens: 128000}
    pricing: {input_per_mtok: "0.25", output_per_mtok: "2"}
  - id: ollama:small:3b
    aliases: [small]
    capabilities: {supports_tools: false, max_context_tokens: 8192, max_output_tokens: 2048}
    pricing: {input_per_mtok: "0", output_per_mtok: "0"}
"""
ALL_KEYS = {
    "ANTHROPIC_API_KEY": "sk-test-anthropic",
    "OPENAI_API_KEY": "sk-test-openai",
    "OLLAMA_KEY": "x1234",
}


class ManualClock:
    """Monotonic seconds and a matching UTC wall clock, advanced by hand."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.base = datetime(2026, 5, 8, 12, 0, tzinfo=UTC)

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> datetime:
        return self.base + timedelta(seconds=self.t - 1000.0)

    def advance(self, seconds: float) -> None:
        self.t += seconds


class EventLog(list[tuple[str, dict[str, Any]]]):
    """The `emit_system_event` callback: appends `(type, payload)`."""

    def __call__(self, event_type: str, payload: dict[str, Any]) -> None:
        self.append((event_type, payload))

    def of(self, event_type: str) -> list[dict[str, Any]]:
        return [p for t, p in self if t == event_type]


def make_registry(env: dict[str, str] | None = None, yaml_text: str = MODELS_YAML) -> ModelRegistry:
    result = load_models_bytes(yaml_text.encode(), env=ALL_KEYS if env is None else env)
    assert result.registry is not None, [d.render() for d in result.diagnostics]
    return result.registry


def check_policy(text: str, registry: ModelRegistry) -> PolicyCheck:
    return validate_policy(text.encode(), registry)


def make_policy(text: str, registry: ModelRegistry) -> Policy:
    result = check_policy(text, registry)
    assert result.policy is not None, result.errors
    return result.policy


def make_ctx(**overrides: Any) -> TurnContext:
    fields: dict[str, Any] = {
        "session_id": "sess_test",
        "turn_id": "turn_test",
        "workspace_path": "/work/project",
        "message_text": "hello",
        "estimated_input_tokens": 1000,
        "now": datetime(2026, 5, 8, 12, 0),
    }
    fields.update(overrides)
    return TurnContext(**fields)
