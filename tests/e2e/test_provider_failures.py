"""Provider failures as a user meets them, through a real daemon, the real adapters and `metis
run`: a server that is not running, a rate limit with a short or a long `retry-after`, a turn
that fails over to its fallback."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.core import providers
from metis.core.providers import RetryPolicy
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api, api_session
from tests.cli import metis
from tests.e2e.test_provider_turns import AUTO_TOOLS, models_yaml

SONNET, GPT5 = "anthropic:claude-sonnet-4-6", "openai:gpt-5"


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon's back-off in hundredths of seconds (a provider's `retry-after` still counts)."""
    monkeypatch.setattr(providers, "DEFAULT_RETRY_POLICY", RetryPolicy(base_delay_s=0.01))


def with_local_model(fake: FakeProviderServer, provider: str, base_url: str, alias: str) -> str:
    """The suite's models.yaml plus an OpenAI-compatible `provider` at `base_url` serving one
    model, `<provider>:m`, also called `alias`."""
    local = (
        f'  {provider}: {{adapter: openai, base_url: "{base_url}", api_key: "x"}}\n'
        "models:\n"
        f"  - id: {provider}:m\n    aliases: [{alias}]\n"
        "    capabilities: {max_context_tokens: 8000, max_output_tokens: 1000}\n"
        '    pricing: {input_per_mtok: "0", output_per_mtok: "0"}\n'
    )
    return models_yaml(fake).replace("models:\n", local, 1)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _models(api: Api) -> dict[str, dict[str, Any]]:
    _, body = await api.call("GET", "/models")
    return {m["id"]: m for m in body["models"]}


async def _llm_events(api: Api, sid: str, turn_id: str, kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in await api.turn_events(sid, turn_id) if e["type"] == kind]


@pytest.mark.usefixtures("quick_retries")
async def test_a_server_that_is_not_running_is_named_with_its_address(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    port = _closed_port()
    models = with_local_model(fake, "deadai", f"http://127.0.0.1:{port}/v1", alias="dead")
    d = await start_daemon(config=AUTO_TOOLS, models=models)
    code, out, err = await metis(
        "run", "--model", "dead", "hi", "--workspace", str(workspace), "--url", d.base_url
    )
    said = f"deadai: cannot connect to 127.0.0.1:{port} (connection refused)"
    assert code == 1 and out == "", err
    assert f"metis: turn failed: {said} · " in err, err
    assert err.count(f"metis: deadai:m: {said}; retrying in ") == 2, err


async def test_a_long_retry_after_takes_the_model_out_until_then(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = (await api.create_session(workspace, initial_active_model=SONNET))["id"]
    fake.enqueue("anthropic", FakeReply.fail(429, "rate_limit_error", retry_after=120))
    accepted, terminal = await api.run_turn(sid, "one")
    assert terminal["type"] == "turn.failed", terminal
    assert terminal["payload"]["message"].endswith("(rate-limited; retry after 120 s)")
    [failed] = await _llm_events(api, sid, accepted["turn_id"], "llm.call_failed")
    assert (failed["will_retry"], failed["retry_in_s"]) == (False, None)
    sonnet = (await _models(api))[SONNET]
    assert sonnet["availability"] == "model_unavailable"
    detail = sonnet["availability_detail"]
    assert detail["trigger_reason"] == "retry_after"
    assert detail["message"] == "rate-limited; retry after 120 s" and detail["recovers_at"]
    assert (await _models(api))[GPT5]["availability"] == "healthy"
    await api.submit(sid, "two")  # routing no longer sends it to the rate-limited model
    assert len(fake.requests_for("anthropic")) == 1


async def test_a_short_retry_after_is_waited_out_and_said(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    d, api, fake = env
    fake.enqueue("anthropic", FakeReply.fail(429, "rate_limit_error", retry_after=0.3))
    fake.enqueue("anthropic", FakeReply.say("answered"))
    code, out, err = await metis(
        "run", "--model", "sonnet", "hi", "--workspace", str(workspace), "--url", d.base_url
    )
    assert (code, out) == (0, "answered\n"), err
    [note] = [line for line in err.splitlines() if "retrying" in line]
    assert note.startswith(f"metis: {SONNET}: anthropic HTTP 429 (rate_limit_error)"), note
    assert note.endswith("; retrying in 0.3 s"), note
    assert (await _models(api))[SONNET]["availability"] == "healthy"


async def test_the_retry_wait_is_in_the_event(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = (await api.create_session(workspace, initial_active_model=SONNET))["id"]
    fake.enqueue("anthropic", FakeReply.fail(529, "overloaded_error", retry_after=0.2))
    fake.enqueue("anthropic", FakeReply.say("answered"))
    accepted, terminal = await api.run_turn(sid, "hi")
    assert terminal["type"] == "turn.completed"
    [failed] = await _llm_events(api, sid, accepted["turn_id"], "llm.call_failed")
    assert (failed["will_retry"], failed["retry_in_s"]) == (True, 0.2)


async def test_a_failed_over_turn_is_charged_to_the_model_that_answered(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    routing = (
        "global_default: gpt5\nrules:\n"
        "  - {name: fb first, when: {message_matches: 'fb'}, use: sonnet}\n"
        "  - {name: fb second, when: {message_matches: 'fb'}, use: gpt5}\n"
    )
    d = await start_daemon(config=AUTO_TOOLS, models=models_yaml(fake), routing=routing)
    fake.enqueue("anthropic", FakeReply.fail(529, "overloaded_error", retry_after=0, repeat=3))
    usage = {"input_tokens": 100, "output_tokens": 40}
    fake.enqueue("openai", FakeReply.say("from openai", usage=usage))
    code, out, err = await metis(
        "run", "fb please", "--workspace", str(workspace), "--url", d.base_url, "--keep"
    )
    assert (code, out) == (0, "from openai\n"), err
    assert f"metis: {SONNET} failed; failing over to {GPT5}\n" in err
    async with api_session(d) as http:
        api = Api(http)
        _, costs = await api.call("GET", "/costs")
        assert [(m["key"], m["cost_usd"]) for m in costs["by_model"]] == [(GPT5, "0.000525")]
        [turn] = await d.core.store.sessions.turns_since(0)
        assert turn.model == GPT5
        starts = await _llm_events(api, turn.session_id, turn.id, "llm.call_started")
        assert [(s["model"], s["failover_from"]) for s in starts] == [
            (SONNET, None),
            (SONNET, None),
            (SONNET, None),
            (GPT5, SONNET),
        ]


async def test_a_base_url_without_its_v1_is_named_as_what_to_check(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """A local server's base_url written without `/v1` answers every call 404; the server's
    own words ("no route") do not say which setting is wrong."""
    models = with_local_model(fake, "nov1", fake.base_url, alias="nov1")
    d = await start_daemon(config=AUTO_TOOLS, models=models)
    code, out, err = await metis(
        "run", "--model", "nov1", "hi", "--workspace", str(workspace), "--url", d.base_url
    )
    assert code == 1 and out == "", err
    assert "nov1 HTTP 404 (unknown_url): no route for POST /chat/completions" in err, err
    assert (
        f"the server has no {fake.base_url}/chat/completions: check the provider's base_url "
        "in models.yaml (OpenAI-compatible servers usually serve under /v1)"
    ) in err, err
