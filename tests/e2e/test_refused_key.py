"""A provider refusing the configured key: every surface says so, and none shows the key.

The daemon reads OpenAI's key from an environment variable named in models.yaml; the fake
provider expects another key and answers 401, through the real SDK. The failed turn, the
availability shown by `GET /models` and `metis models`, the next turn's `routing_failed` and
`metis chat` must all name the provider and the variable and say the provider refused the key;
`POST /models/{model}/reset` and `metis models reset` put the model back in rotation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.commands.chat import ChatSession
from metis.commands.daemon_client import resolve_daemon
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from metis.testing.serving import free_port
from tests.api import Api
from tests.cli import metis
from tests.commands.test_chat import Terminal

ENV_VAR = "METIS_TEST_OPENAI_KEY"
WRONG_KEY = "sk-mistyped-0123456789abcdefXYZ"
MODELS = """
pricing_version: "e2e-1"
providers:
  openai: {{adapter: openai, base_url: "{openai}", api_key_env: {env}}}
models:
  - id: openai:gpt-5
    aliases: [gpt5]
    capabilities: {{max_context_tokens: 272000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "1.25", output_per_mtok: "10.00"}}
"""
REFUSED = f"openai refused the key from ${ENV_VAR} (HTTP 401"


@pytest.fixture
async def fake() -> AsyncIterator[FakeProviderServer]:
    async with FakeProviderServer(expected_keys={"openai": "ok-the-right-key"}) as server:
        yield server


@pytest.fixture
async def daemon_with_wrong_key(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> Daemon:
    monkeypatch.setenv(ENV_VAR, WRONG_KEY)
    d: Daemon = await start_daemon(models=MODELS.format(openai=fake.openai_base_url, env=ENV_VAR))
    return d


def client(d: Daemon) -> aiohttp.ClientSession:
    """An HTTP client sending the daemon's key, found the way `metis` commands find it."""
    return aiohttp.ClientSession(base_url=d.base_url, headers=resolve_daemon().headers())


async def test_a_refused_key_is_named_in_the_turn_models_and_routing_failed(
    daemon_with_wrong_key: Daemon, fake: FakeProviderServer, workspace: Path
) -> None:
    async with client(daemon_with_wrong_key) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        _, terminal = await api.run_turn(sid, "hello")
        assert terminal["type"] == "turn.failed"
        failure = terminal["payload"]
        assert failure["error_class"] == "auth"
        assert failure["message"].startswith(REFUSED), failure
        assert "the provider refused this key" in failure["message"]
        assert f"set a valid key in {ENV_VAR}" in failure["message"]
        # what the provider said, once: its status and code are in the sentence already
        assert failure["message"].endswith("restart the daemon (provider said: fake 401 error)"), (
            failure["message"]
        )
        assert len(fake.requests_for("openai")) == 1

        _, models = await api.call("GET", "/models")
        detail = models["models"][0]["availability_detail"]
        assert detail["trigger_reason"] == "auth_error" and detail["message"].startswith(REFUSED)

        status, body = await api.submit(sid, "hello again")
        assert status == 503 and body["error"]["code"] == "routing_failed", body
        assert REFUSED in body["error"]["message"]
        [tried] = body["error"]["details"]["tried"]
        assert tried["model"] == "openai:gpt-5" and tried["reason"] == "provider_unavailable"
        assert tried["unavailable_reason"] == "auth_error"
        assert tried["recovers_at"] == detail["recovers_at"]
        assert tried["message"].startswith(REFUSED)
        # said to a person to the second, in UTC; the exact stamp is in the details
        readable = tried["recovers_at"][:19].replace("T", " ") + " UTC"
        assert f"routing tries it again after {readable})" in body["error"]["message"]
        assert len(fake.requests_for("openai")) == 1  # routing skipped the refused provider

        events = await api.events(sid)
        unavailable = [e for e in events if e["type"] == "routing.provider_unavailable"]
        for text in (json.dumps(events), json.dumps(models), json.dumps(body)):
            assert WRONG_KEY not in text
        assert not unavailable or unavailable[0]["payload"]["message"].startswith(REFUSED)


async def test_a_key_no_http_header_can_carry_is_never_sent_and_the_turn_says_where_it_is_set(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    workspace: Path,
) -> None:
    """A key pasted with typographic quotes fails the turn before any request, naming the
    variable, never the key, and without claiming the provider refused it; routing then takes
    the provider out as it does for a refused key."""
    monkeypatch.setenv(ENV_VAR, "\u201cok-the-right-key\u201d")
    d = await start_daemon(models=MODELS.format(openai=fake.openai_base_url, env=ENV_VAR))
    unsendable = (
        f"the key of provider 'openai' ({ENV_VAR}) holds a character an HTTP header cannot "
        "carry (a typographic quote copied with it?); fix it and restart metis"
    )
    async with client(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        _, terminal = await api.run_turn(sid, "hello")
        assert terminal["type"] == "turn.failed"
        assert terminal["payload"]["error_class"] == "auth"
        assert terminal["payload"]["message"] == unsendable
        _, models = await api.call("GET", "/models")
        assert models["models"][0]["availability_detail"]["message"] == unsendable
        status, body = await api.submit(sid, "hello again")
        assert status == 503 and unsendable in body["error"]["message"], body
        assert fake.requests_for("openai") == []
        assert "ok-the-right-key" not in json.dumps(await api.events(sid))


async def test_metis_chat_shows_why_the_key_was_refused(
    daemon_with_wrong_key: Daemon, workspace: Path
) -> None:
    term = Terminal()
    d = daemon_with_wrong_key
    chat = ChatSession(
        d.base_url,
        str(workspace),
        term.lines,
        term.out,
        headers=resolve_daemon(url=d.base_url).headers(),
    )
    term.type("hello")
    run = asyncio.create_task(chat.run())
    await term.wait_for("turn> failed")
    term.type("hello again", "/quit")
    assert await asyncio.wait_for(run, 15) == 0
    [failed] = term.labelled("turn")
    assert failed.startswith(f"turn> failed: {REFUSED}"), term.text
    assert "the provider refused this key" in failed
    # the daemon's sentence, not its code (routing_failed)
    [refused] = [line for line in term.labelled("error") if "no model can serve" in line]
    assert "routing_failed" not in refused
    assert REFUSED in refused and "routing tries it again after" in refused, term.text
    assert WRONG_KEY not in term.text


async def refuse_once(api: Api, workspace: Path) -> str:
    """A session whose first turn met the refused key; returns its id."""
    sid = (await api.create_session(workspace))["id"]
    _, terminal = await api.run_turn(sid, "hello")
    assert terminal["payload"]["error_class"] == "auth", terminal
    return sid


async def test_reset_over_rest_puts_the_model_back_in_rotation(
    daemon_with_wrong_key: Daemon, fake: FakeProviderServer, workspace: Path
) -> None:
    async with client(daemon_with_wrong_key) as http:
        api = Api(http)
        sid = await refuse_once(api, workspace)
        status, body = await api.call("POST", "/models/gpt5/reset")
        assert (status, body) == (200, {"model": "openai:gpt-5", "recovered": ["openai:gpt-5"]})
        _, models = await api.call("GET", "/models")
        assert models["models"][0]["availability"] == "healthy"
        status, body = await api.call("POST", "/models/openai:gpt-5/reset")
        assert (status, body) == (200, {"model": "openai:gpt-5", "recovered": []})

        fake.expected_keys["openai"] = WRONG_KEY  # as if the provider now accepted the key
        fake.enqueue("openai", FakeReply.say("served again"))
        _, terminal = await api.run_turn(sid, "hello again")
        assert terminal["type"] == "turn.completed", terminal

        fake.expected_keys["openai"] = "ok-the-right-key"
        await refuse_once(api, workspace)
        status, body = await api.call("POST", "/models/reset")
        assert (status, body) == (200, {"model": None, "recovered": ["openai:gpt-5"]})
        status, body = await api.call("POST", "/models/no-such-model/reset")
        assert status == 400 and body["error"]["code"] == "model_not_configured"
        recovered = [e for e in await api.events(sid) if e["type"] == "routing.provider_recovered"]
        assert all(e["payload"]["recovery_reason"] == "manual_reset" for e in recovered)
        _, doc = await api.call("GET", "/openapi.json")
        assert "post" in doc["paths"]["/models/reset"]
        one = doc["paths"]["/models/{model}/reset"]["post"]
        assert "model_not_configured" in one["x-error-codes"]


async def test_metis_models_shows_the_daemons_availability_and_resets_it(
    daemon_with_wrong_key: Daemon, workspace: Path
) -> None:
    url = daemon_with_wrong_key.base_url
    async with client(daemon_with_wrong_key) as http:
        await refuse_once(Api(http), workspace)
    code, listed, err = await metis("models", "--url", url)
    assert code == 0, err
    [row] = [line for line in listed.splitlines() if line.startswith("openai:gpt-5 ")]
    assert "unavailable until " in row and "auth_error" not in row
    assert f"openai:gpt-5: {REFUSED}" in listed
    assert "`metis models reset openai:gpt-5`" in listed
    assert f"source: the daemon at {url} (live availability)" in listed
    assert WRONG_KEY not in listed + err

    code, out, err = await metis("models", "reset", "gpt5", "--url", url)
    assert code == 0, err
    assert out.strip() == "reset openai:gpt-5; healthy again: openai:gpt-5"
    _, listed, _ = await metis("models", "--url", url)
    [row] = [line for line in listed.splitlines() if line.startswith("openai:gpt-5 ")]
    assert row.endswith("healthy"), listed
    code, out, err = await metis("models", "reset", "no-such-model", "--url", url)
    assert (code, out) == (2, "")  # refused, as `metis run --model` refuses one
    assert err.startswith("metis: ") and "no-such-model" in err, err


async def test_metis_models_without_a_daemon_shows_models_yaml_and_says_so(
    metis_home: Path,
) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, listed, err = await metis("models", "--url", url)
    assert code == 0, err
    assert f"no daemon answers at {url}" in listed
    assert "source: " in listed and "models.yaml" in listed
    code, _, err = await metis("models", "reset", "--url", url)
    assert code == 1 and f"no daemon answers at {url}" in err
