"""A global_default that cannot serve turns does not take routing down: the real daemon sends
the turn to the first configured model of models.yaml (the fake provider's OpenAI) and its
`route.decided` says why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api, api_session

# Anthropic's key comes from a variable nobody sets; OpenAI's is the fake provider's.
MODELS = """
pricing_version: "e2e-1"
providers:
  anthropic: {{adapter: anthropic, base_url: "{anthropic}", api_key_env: REV_ANTH_KEY}}
  openai: {{adapter: openai, base_url: "{openai}", api_key: "ok-test"}}
models:
  - id: anthropic:claude-sonnet-4-6
    aliases: [sonnet]
    capabilities: {{max_context_tokens: 200000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
  - id: openai:gpt-5
    capabilities: {{max_context_tokens: 272000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "1.25", output_per_mtok: "10.00"}}
"""


async def test_a_global_default_without_a_key_falls_through_to_a_configured_model(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REV_ANTH_KEY", raising=False)
    daemon = await start_daemon(
        models=MODELS.format(anthropic=fake.anthropic_base_url, openai=fake.openai_base_url),
        routing="schema_version: 1\nglobal_default: sonnet\n",
    )
    async with api_session(daemon) as http:
        api = Api(http)
        session = await api.create_session(workspace)
        assert session["active_model"] == "openai:gpt-5"  # what the turn will get
        fake.enqueue("openai", FakeReply.say("hi"))
        accepted, terminal = await api.run_turn(session["id"], "hello")
        assert terminal["type"] == "turn.completed", terminal
        events = await api.turn_events(session["id"], accepted["turn_id"])
    decided = next(e["payload"] for e in events if e["type"] == "route.decided")
    assert decided["chosen_model"] == "openai:gpt-5"
    rejected, chose = decided["chain"][-2:]
    assert (rejected["candidate_model"], rejected["validation_failure"]) == (
        "anthropic:claude-sonnet-4-6",
        "not_configured",
    )
    assert (chose["policy"], chose["verdict"], chose["reason"]) == (
        "global_default",
        "chose",
        "registry default (first configured model), as global_default "
        "anthropic:claude-sonnet-4-6 was rejected (not_configured)",
    )
    assert len(fake.requests_for("openai")) == 1 and not fake.requests_for("anthropic")
