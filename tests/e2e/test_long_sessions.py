"""A session that outgrows its model's window, through the real daemon and the fake provider."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from metis.core.turns.context import DROPPED_NOTE, OMITTED_RESULT
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api, api_session
from tests.e2e.test_provider_turns import AUTO_TOOLS

SMALL = "anthropic:small"
WINDOW, OUTPUT = 6000, 1000
MODELS = """
pricing_version: "long-1"
providers:
  anthropic: {{adapter: anthropic, base_url: "{anthropic}", api_key: "ak-test"}}
models:
  - id: anthropic:small
    capabilities: {{max_context_tokens: {window}, max_output_tokens: {output}}}
    pricing: {{input_per_mtok: "3.00", output_per_mtok: "15.00"}}
"""

Env = tuple[Daemon, Api, FakeProviderServer]


@pytest.fixture
async def small(fake: FakeProviderServer, start_daemon: Callable[..., Any]) -> AsyncIterator[Env]:
    models = MODELS.format(anthropic=fake.anthropic_base_url, window=WINDOW, output=OUTPUT)
    d = await start_daemon(config=AUTO_TOOLS, models=models)
    async with api_session(d) as http:
        yield d, Api(http), fake


async def test_a_turn_whose_tool_results_outgrow_the_window_is_still_sent_within_it(
    small: Env, workspace: Path
) -> None:
    _, api, fake = small
    for name in "abcd":
        (workspace / f"{name}.txt").write_text((name * 79 + "\n") * 100)  # 8,000 chars each
    sid = (await api.create_session(workspace, initial_active_model=SMALL))["id"]
    fake.enqueue(
        "anthropic",
        *(FakeReply.call("read_file", {"path": f"{name}.txt"}) for name in "abcd"),
        FakeReply.say("read them all"),
    )
    accepted, terminal = await api.run_turn(sid, "read the four files")
    assert terminal["type"] == "turn.completed", terminal
    events = await api.turn_events(sid, accepted["turn_id"])
    started = [e["payload"] for e in events if e["type"] == "llm.call_started"]
    assert len(started) == 5 and all(
        p["estimated_input_tokens"] <= WINDOW - OUTPUT for p in started
    )
    last = fake.requests_for("anthropic")[-1].body["messages"]
    results = [b for m in last for b in m["content"] if b["type"] == "tool_result"]
    assert len(results) == 4 and OMITTED_RESULT in str(results[0]["content"])
    assert "d" * 79 in str(results[-1]["content"])  # the newest read, in full
    # and the call says what fitting left out, for the clients to show
    assert (started[0]["messages_left_out"], started[0]["tool_results_omitted"]) == (0, 0)
    omitted = sum(OMITTED_RESULT in str(result["content"]) for result in results)
    assert (started[-1]["messages_left_out"], started[-1]["tool_results_omitted"]) == (0, omitted)


async def test_a_conversation_past_the_window_tells_the_model_its_start_was_left_out(
    small: Env, workspace: Path
) -> None:
    _, api, fake = small
    sid = (await api.create_session(workspace, initial_active_model=SMALL))["id"]
    for i in range(4):  # ~2,000 tokens a turn against a budget of 5,000
        fake.enqueue("anthropic", FakeReply.say(f"answer {i} " + "r" * 8000))
        accepted, terminal = await api.run_turn(sid, f"question {i}")
        assert terminal["type"] == "turn.completed", terminal
    sent = [r.body for r in fake.requests_for("anthropic")]
    assert DROPPED_NOTE not in str(sent[0]["system"]) and DROPPED_NOTE not in str(sent[1]["system"])
    last = sent[-1]
    assert DROPPED_NOTE in str(last["system"])
    assert last["messages"][0]["content"] != [{"type": "text", "text": "question 0"}]
    assert last["messages"][-1]["content"] == [{"type": "text", "text": "question 3"}]
    events = await api.turn_events(sid, accepted["turn_id"])
    (started,) = [e["payload"] for e in events if e["type"] == "llm.call_started"]
    assert started["messages_left_out"] == 7 - len(last["messages"])  # of 7 stored so far


async def test_a_provider_that_counts_more_than_the_estimate_gets_calls_within_its_count(
    small: Env, workspace: Path
) -> None:
    """Code and most non-English text take more tokens than `chars / 4`: once the provider has
    reported its count, a full session is compacted to what it counts, not to the estimate,
    which it would refuse as over its window at every call from then on."""
    _, api, fake = small
    sid = (await api.create_session(workspace, initial_active_model=SMALL))["id"]
    estimates, counts = [], []
    for i in range(5):  # ~1,000 estimated tokens a turn; the second call is counted at twice that
        usage = {"input_tokens": 4300} if i == 1 else None
        fake.enqueue("anthropic", FakeReply.say(f"answer {i} " + "r" * 4000, usage=usage))
        accepted, terminal = await api.run_turn(sid, f"question {i}")
        assert terminal["type"] == "turn.completed", terminal
        events = await api.turn_events(sid, accepted["turn_id"])
        (started,) = [e["payload"] for e in events if e["type"] == "llm.call_started"]
        (completed,) = [e["payload"] for e in events if e["type"] == "llm.call_completed"]
        estimates.append(started["estimated_input_tokens"])
        counts.append(completed["input_tokens"])
    scale = counts[1] / estimates[1]
    assert scale > 1.5 and all(c < e for e, c in zip(estimates[2:], counts[2:], strict=True))
    assert all(e * scale <= WINDOW - OUTPUT for e in estimates[2:]), (scale, estimates)


async def test_a_call_the_provider_refuses_as_too_long_is_fitted_to_its_count_and_sent_again(
    small: Env, workspace: Path
) -> None:
    """A provider's refusal (as on the first call after a restart, before any count was seen)
    says it counts more than its window where the estimate was lower: the call is fitted again
    with room for that many tokens per estimated one, once; a second refusal fails the turn."""
    _, api, fake = small
    sid = (await api.create_session(workspace, initial_active_model=SMALL))["id"]
    for i in range(2):
        fake.enqueue("anthropic", FakeReply.say(f"answer {i} " + "r" * 4000))
        await api.run_turn(sid, f"question {i}")
    too_long = FakeReply(
        status=400,
        error_type="invalid_request_error",
        error_message=f"prompt is too long: {WINDOW + 100} tokens > {WINDOW} maximum",
    )
    fake.enqueue("anthropic", too_long, FakeReply.say("fits now"))
    accepted, terminal = await api.run_turn(sid, "question 2")
    assert terminal["type"] == "turn.completed", terminal
    events = await api.turn_events(sid, accepted["turn_id"])
    refused, sent = [e["payload"] for e in events if e["type"] == "llm.call_started"]
    (failed,) = [e["payload"] for e in events if e["type"] == "llm.call_failed"]
    assert failed["error_class"] == "context_overflow"
    at_least = WINDOW / refused["estimated_input_tokens"]  # tokens counted per estimated one
    assert sent["estimated_input_tokens"] * at_least <= WINDOW - OUTPUT

    fake.enqueue("anthropic", too_long, too_long)
    _, terminal = await api.run_turn(sid, "question 3")
    assert terminal["type"] == "turn.failed", terminal
    assert terminal["payload"]["error_class"] == "context_overflow"
    assert terminal["payload"]["llm_call_count"] == 2


async def test_a_project_instruction_file_counts_when_routing_sizes_a_turn(
    small: Env, workspace: Path
) -> None:
    """The window check happens before any model is called: an AGENTS.md the small model cannot
    hold beside its output refuses the turn there, naming both sizes, instead of a call the
    provider would refuse."""
    _, api, fake = small
    sid = (await api.create_session(workspace, initial_active_model=SMALL))["id"]
    (workspace / "AGENTS.md").write_text("Always answer in haiku.\n" * 1000)  # 24,000 chars
    status, body = await api.submit(sid, "hi")
    assert status == 503 and body["error"]["code"] == "routing_failed", body
    needed = re.search(r"needs at least ~([\d,]+) input tokens", body["error"]["message"])
    assert needed is not None and int(needed[1].replace(",", "")) > 6000, body  # the file's 6,000
    assert f"takes {WINDOW - OUTPUT:,} beside its output reserve" in body["error"]["message"]
    assert fake.requests_for("anthropic") == []
    # a file it holds is sized in: the decision's estimate counts it
    (workspace / "AGENTS.md").write_text("Always answer in haiku.\n" * 100)  # 2,400 chars
    fake.enqueue("anthropic", FakeReply.say("ok"))
    accepted, terminal = await api.run_turn(sid, "hi")
    assert terminal["type"] == "turn.completed", terminal
    events = await api.turn_events(sid, accepted["turn_id"])
    decided = next(e["payload"] for e in events if e["type"] == "route.decided")
    sent = next(e["payload"] for e in events if e["type"] == "llm.call_started")
    assert decided["estimated_input_tokens"] > 600
    assert abs(decided["estimated_input_tokens"] - sent["estimated_input_tokens"]) < 50
