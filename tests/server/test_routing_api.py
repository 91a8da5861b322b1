"""/routing/* and /models over HTTP against the real daemon."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.server.runner import Daemon
from tests.api import Api, api_session


async def test_policy_describes_the_shipped_default(api: Api) -> None:
    status, body = await api.call("GET", "/routing/policy")
    assert status == 200 and body["valid"] is True and body["source"] == "shipped_default"
    assert (
        len(body["version"]) == 64
        and body["rules"] == []
        and body["using_last_known_good"] is False
    )
    assert set(body["tiers"]) == {"fast", "balanced", "deep"}


async def test_check_with_the_seed_example_is_invalid_and_changes_nothing(api: Api) -> None:
    _, before = await api.call("GET", "/routing/policy")
    status, body = await api.call(
        "POST", "/routing/check", {"policy_yaml": "global_default: nonexistent:model\n"}
    )
    assert status == 200 and body["valid"] is False
    assert body["errors"][0].startswith(
        "global_default references unknown model: nonexistent:model"
    )
    assert body["diagnostics"][0]["line"] == 1
    _, after = await api.call("GET", "/routing/policy")
    assert after["version"] == before["version"]


async def test_check_without_body_checks_the_file_and_bad_bodies_are_400(api: Api) -> None:
    async with api.http.post("/routing/check") as r:
        assert r.status == 200 and (await r.json())["valid"] is True
    status, _ = await api.call("POST", "/routing/check", {})
    assert status == 200
    for bad in ({"policy_yaml": 5}, {"other": "x"}):
        status, body = await api.call("POST", "/routing/check", bad)
        assert status == 400 and body["error"]["code"] == "validation_error"
    async with api.http.post(
        "/routing/check", data=b"[1]", headers={"Content-Type": "application/json"}
    ) as r:
        assert r.status == 400
    status, body = await api.call("POST", "/routing/check", {"policy_yaml": "rules: [\n"})
    assert status == 200 and body["valid"] is False


async def test_invalid_edit_keeps_the_last_known_good_and_reload_reports_it(
    api: Api, metis_home: Path
) -> None:
    (metis_home / "routing.yaml").write_text("global_default: scripted\n")
    status, body = await api.call("POST", "/routing/reload")
    assert (
        status == 200
        and body["valid"] is True
        and body["source"] == "user_file"
        and body["changed"] is True
    )
    good = body["version"]
    (metis_home / "routing.yaml").write_text("global_default: nope:nope\n")
    status, body = await api.call("POST", "/routing/reload")
    assert status == 200 and body["valid"] is False and body["version"] == good
    _, policy = await api.call("GET", "/routing/policy")
    assert policy["valid"] is False and policy["using_last_known_good"] is True and policy["errors"]
    assert policy["global_default"] == "local:scripted"
    assert policy["fallback_model"] is None  # no real model is configured here
    status, body = await api.call("POST", "/routing/reload", params={"reset_availability": "true"})
    assert body["availability_reset"] is True
    status, body = await api.call("POST", "/routing/reload", params={"reset_availability": "maybe"})
    assert status == 400


async def test_turn_start_picks_up_an_edit_without_the_watcher(
    api: Api, metis_home: Path, workspace: Path, daemon: Daemon
) -> None:
    await daemon.core.policy.aclose()  # the watcher is off: only the turn-start hash check remains
    sid = (await api.create_session(workspace))["id"]
    (metis_home / "routing.yaml").write_text(
        "rules:\n  - name: everything\n    when: {}\n    use: scripted\n"
    )
    accepted, _ = await api.run_turn(sid, "hello")
    route = next(
        e for e in await api.turn_events(sid, accepted["turn_id"]) if e["type"] == "route.decided"
    )
    winner = route["payload"]["chain"][route["payload"]["winner_index"]]
    assert winner["policy"] == "rule" and winner["rule_name"] == "everything"


async def test_decisions_are_the_newest_of_every_session_first(api: Api, workspace: Path) -> None:
    turns = []
    for _ in range(3):
        sid = (await api.create_session(workspace))["id"]
        accepted, _ = await api.run_turn(sid, "hello")
        turns.append(accepted["turn_id"])
    status, body = await api.call("GET", "/routing/decisions?limit=2")
    assert status == 200
    decided = body["decisions"]
    assert [e["type"] for e in decided] == ["route.decided"] * 2
    assert [e["turn_id"] for e in decided] == [turns[2], turns[1]]
    assert decided[0]["payload"]["chosen_model"] == "local:scripted"
    status, body = await api.call("GET", "/routing/decisions")
    assert [e["turn_id"] for e in body["decisions"]] == turns[::-1]
    for bad in ("0", "201", "x"):
        status, body = await api.call("GET", f"/routing/decisions?limit={bad}")
        assert status == 400 and body["error"]["code"] == "validation_error"


async def test_models_lists_the_scripted_model_offline(api: Api) -> None:
    status, body = await api.call("GET", "/models")
    assert status == 200 and body["offline_mode"] is True
    scripted = next(m for m in body["models"] if m["id"] == "local:scripted")
    assert scripted["scripted"] is True and scripted["availability"] == "healthy"
    assert scripted["pricing"]["input_per_mtok"] == "0"
    assert {u["reason"] for u in body["unconfigured"]} == {"no_credentials"}
    assert all("env_var" in u for u in body["unconfigured"])


async def test_models_shows_an_unavailable_provider(start_daemon: Callable[..., Any]) -> None:
    models = (
        'pricing_version: "t"\nproviders:\n  anthropic: {adapter: anthropic, api_key: "k"}\nmodels:\n'
        "  - id: anthropic:claude-haiku-4-5\n    capabilities: {max_context_tokens: 200000, max_output_tokens: 8192}\n"
        '    pricing: {input_per_mtok: "1", output_per_mtok: "5"}\n'
    )
    d = await start_daemon(models=models)
    d.core.availability.record_failure("anthropic:claude-haiku-4-5", "auth")
    async with api_session(d) as http:
        _, body = await Api(http).call("GET", "/models")
    haiku = body["models"][0]
    assert haiku["availability"] == "provider_unavailable"
    assert (
        haiku["availability_detail"]["scope"] == "provider"
        and haiku["availability_detail"]["trigger_reason"] == "auth_error"
    )
    await asyncio.sleep(0)
