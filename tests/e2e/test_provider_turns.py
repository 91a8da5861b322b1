"""Turns through the real daemon and the real SDK adapters against the fake provider server.

Each test starts the daemon with a models.yaml whose Anthropic and OpenAI providers point at the
fake server on loopback, scripts the provider's replies, and checks what the daemon did: events,
stored messages, files in the workspace, costs, and the requests the provider received.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from metis.testing.serving import (
    SERVE_START_DEADLINE_S,
    free_port,
    spawn_serve,
    wait_until_serving,
)
from tests.api import Api, api_session, home_headers

MODELS = """
pricing_version: "e2e-1"
providers:
  anthropic: {{adapter: anthropic, base_url: "{anthropic}", api_key: "ak-test"}}
  openai: {{adapter: openai, base_url: "{openai}", api_key: "ok-test"}}
models:
  - id: anthropic:claude-sonnet-4-6
    aliases: [sonnet]
    capabilities: {{supports_images: true, supports_thinking: true, max_context_tokens: 200000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "3.00", output_per_mtok: "15.00", cache_read_per_mtok: "0.30", cache_write_per_mtok: "3.75"}}
  - id: openai:gpt-5
    aliases: [gpt5]
    capabilities: {{max_context_tokens: 272000, max_output_tokens: 8192}}
    pricing: {{input_per_mtok: "1.25", output_per_mtok: "10.00", cache_read_per_mtok: "0.125", cache_write_per_mtok: "0"}}
"""
AUTO_TOOLS = "tools:\n  confirmation:\n    default: {none: auto, read: auto, write: auto, execute: auto, network: auto}\n"
MODEL_OF = {"anthropic": "anthropic:claude-sonnet-4-6", "openai": "openai:gpt-5"}


def models_yaml(fake: FakeProviderServer) -> str:
    return MODELS.format(anthropic=fake.anthropic_base_url, openai=fake.openai_base_url)


async def serve_auto_tools(
    fake: FakeProviderServer, metis_home: Path, log: Path
) -> tuple[asyncio.subprocess.Process, int]:
    """A `metis serve` subprocess on a free port whose models are the fake provider's and whose
    tools run without asking (its output to `log`): a daemon a test can SIGKILL mid-tool."""
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "models.yaml").write_text(models_yaml(fake))
    (metis_home / "config.yaml").write_text(AUTO_TOOLS)
    port = free_port()
    with log.open("wb") as out:
        return await spawn_serve(metis_home, port, output=out), port


async def session_on(api: Api, workspace: Path, api_name: str) -> str:
    return (await api.create_session(workspace, initial_active_model=MODEL_OF[api_name]))["id"]


def types_of(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


@pytest.mark.parametrize("api_name", ["anthropic", "openai"])
async def test_full_tool_loop_with_every_builtin_tool(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path, api_name: str
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, api_name)
    fake.enqueue(
        api_name,
        FakeReply.call("write_file", {"path": "notes.txt", "content": "alpha\nbeta\n"}),
        FakeReply.call("read_file", {"path": "notes.txt"}),
        FakeReply.call(
            "patch_file", {"path": "notes.txt", "old_text": "beta", "new_text": "gamma"}
        ),
        FakeReply.call("list_dir", {}),
        FakeReply.call("grep_files", {"pattern": "gam+a"}),
        FakeReply.call("shell", {"command": "cat notes.txt"}),
        FakeReply.say("All done."),
    )
    accepted, terminal = await api.run_turn(sid, "edit the notes")
    assert terminal["type"] == "turn.completed" and terminal["payload"]["tool_call_count"] == 6
    assert (workspace / "notes.txt").read_text() == "alpha\ngamma\n"
    events = await api.turn_events(sid, accepted["turn_id"])
    assert types_of(events).count("tool.completed") == 6 and "tool.failed" not in types_of(events)
    messages = (await api.messages(sid))["messages"]
    results = [m["content"][0] for m in messages if m["role"] == "tool"]
    texts = [r["content"][0]["text"] for r in results]
    assert texts[0].startswith("Wrote 11 bytes to notes.txt (created)")
    assert texts[1] == "alpha\nbeta\n"
    assert texts[4].startswith("1 matches in 1 files") and "notes.txt:2: gamma" in texts[4]
    assert texts[5].splitlines()[0] == "exit_code: 0" and "gamma" in texts[5]
    assert messages[-1]["content"] == [{"type": "text", "text": "All done."}]
    # the result of each call travels back in the next request, in the provider's own format
    requests = fake.requests_for(api_name)
    assert len(requests) == 7
    second = requests[1].body
    first_call_id = next(m for m in messages if m["role"] == "assistant")["content"][-1]["id"]
    if api_name == "anthropic":
        block = second["messages"][-1]["content"][0]
        assert block["type"] == "tool_result" and block["tool_use_id"] == first_call_id
    else:
        tool_message = second["messages"][-1]
        assert (
            tool_message["role"] == "tool"
            and tool_message["tool_call_id"] == "call_" + first_call_id[3:]
        )


@pytest.mark.parametrize(
    ("api_name", "expected"),
    [("anthropic", "0.007875"), ("openai", "0.003875")],
)
async def test_costs_are_exact_decimals_per_call_turn_and_session(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path, api_name: str, expected: str
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, api_name)
    usage = {
        "input_tokens": 1000,
        "output_tokens": 200,
        "cache_read_tokens": 5000,
        "cache_write_tokens": 100,
    }
    if api_name == "openai":
        usage["cache_write_tokens"] = 0
    fake.enqueue(api_name, FakeReply.say("hi", usage=usage))
    accepted, terminal = await api.run_turn(sid, "price this")
    completed = next(
        e
        for e in await api.turn_events(sid, accepted["turn_id"])
        if e["type"] == "llm.call_completed"
    )
    assert (
        completed["payload"]["cost_usd"] == expected
        and completed["payload"]["pricing_version"] == "e2e-1"
    )
    assert (
        completed["payload"]["input_tokens"] == 1000
        and completed["payload"]["cache_read_tokens"] == 5000
    )
    assert terminal["payload"]["total_cost_usd"] == expected
    _, got = await api.call("GET", f"/sessions/{sid}")
    assert got["cost_so_far_usd"] == expected
    assistant = (await api.messages(sid))["messages"][-1]
    assert (
        assistant["metadata"]["usage"]["cost_usd"] == expected
        and assistant["metadata"]["model"] == MODEL_OF[api_name]
    )


async def test_tool_errors_reach_the_model_as_error_results(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic", FakeReply.call("read_file", {"path": "missing.txt"}), FakeReply.say("ok")
    )
    accepted, _ = await api.run_turn(sid, "read it")
    failed = next(
        e for e in await api.turn_events(sid, accepted["turn_id"]) if e["type"] == "tool.failed"
    )
    assert failed["payload"]["error_class"] == "tool_error"
    block = fake.requests_for("anthropic")[1].body["messages"][-1]["content"][0]
    assert (
        block["is_error"] is True and block["content"][0]["text"] == "File not found: missing.txt"
    )


@pytest.mark.parametrize(
    "path", ["../outside.txt", "/etc/metis-e2e.txt", "a/../../x.txt", "bad\u0000name"]
)
async def test_path_escapes_are_refused_and_nothing_is_written_outside(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path, path: str
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        FakeReply.call("write_file", {"path": path, "content": "x"}),
        FakeReply.say("ok"),
    )
    accepted, _ = await api.run_turn(sid, "write outside")
    events = await api.turn_events(sid, accepted["turn_id"])
    failed = next(e for e in events if e["type"] == "tool.failed")
    assert failed["payload"]["error_class"] == "permission_denied"
    assert "tool.called" not in types_of(events)
    assert (
        not (workspace.parent / "outside.txt").exists() and not Path("/etc/metis-e2e.txt").exists()
    )


async def test_symlink_out_of_the_workspace_is_refused(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path, tmp_path: Path
) -> None:
    _, api, fake = env
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (workspace / "link.txt").symlink_to(secret)
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic", FakeReply.call("read_file", {"path": "link.txt"}), FakeReply.say("ok")
    )
    accepted, _ = await api.run_turn(sid, "read the link")
    failed = next(
        e for e in await api.turn_events(sid, accepted["turn_id"]) if e["type"] == "tool.failed"
    )
    assert failed["payload"]["error_class"] == "permission_denied"
    assert "top secret" not in str((await api.messages(sid))["messages"])


async def test_server_errors_are_retried_then_fail_the_turn(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue("anthropic", FakeReply.fail(500, "api_error", retry_after=0, repeat=3))
    accepted, terminal = await api.run_turn(sid, "hello")
    assert terminal["type"] == "turn.failed" and terminal["payload"]["reason"] == "provider_error"
    assert terminal["payload"]["error_class"] == "server_error"
    events = await api.turn_events(sid, accepted["turn_id"])
    failures = [e["payload"] for e in events if e["type"] == "llm.call_failed"]
    assert [(f["attempt"], f["will_retry"]) for f in failures] == [(1, True), (2, True), (3, False)]
    assert (
        types_of(events).count("llm.call_started") == 3
        and terminal["payload"]["llm_call_count"] == 3
    )
    assert len(fake.requests_for("anthropic")) == 3


async def test_auth_error_fails_the_turn_and_marks_the_provider_unavailable(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, "openai")
    fake.enqueue("openai", FakeReply.fail(401, "invalid_api_key"))
    _, terminal = await api.run_turn(sid, "hello")
    assert terminal["payload"]["error_class"] == "auth"
    _, models = await api.call("GET", "/models")
    gpt5 = next(m for m in models["models"] if m["id"] == "openai:gpt-5")
    assert gpt5["availability"] == "provider_unavailable"
    assert len(fake.requests_for("openai")) == 1  # auth is never retried


async def test_drop_after_first_token_stores_the_partial_message_and_is_not_retried(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        FakeReply.drop_after(6, text="a long answer that will be cut short", chunk_chars=4),
    )
    accepted, terminal = await api.run_turn(sid, "hello")
    assert terminal["type"] == "turn.failed" and terminal["payload"]["error_class"] == "network"
    events = await api.turn_events(sid, accepted["turn_id"])
    failures = [e["payload"] for e in events if e["type"] == "llm.call_failed"]
    assert len(failures) == 1 and failures[0]["will_retry"] is False
    assert len(fake.requests_for("anthropic")) == 1
    assistant = (await api.messages(sid))["messages"][-1]
    assert assistant["metadata"]["status"] == "error" and assistant["content"][0][
        "text"
    ].startswith("a long")


async def test_first_call_fails_over_to_the_next_candidate(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    routing = (
        "global_default: gpt5\nrules:\n  - name: prefer sonnet\n    when: {}\n    use: sonnet\n"
    )
    d = await start_daemon(config=AUTO_TOOLS, models=models_yaml(fake), routing=routing)
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        fake.enqueue("anthropic", FakeReply.fail(429, "rate_limit_error", retry_after=0, repeat=3))
        fake.enqueue("openai", FakeReply.say("served by the fallback"))
        accepted, terminal = await api.run_turn(sid, "hello")
        assert terminal["type"] == "turn.completed"
        events = await api.turn_events(sid, accepted["turn_id"])
        assert types_of(events).count("route.decided") == 1
        starts = [e["payload"] for e in events if e["type"] == "llm.call_started"]
        assert [(s["model"], s["attempt"]) for s in starts] == [
            ("anthropic:claude-sonnet-4-6", 1),
            ("anthropic:claude-sonnet-4-6", 2),
            ("anthropic:claude-sonnet-4-6", 3),
            ("openai:gpt-5", 1),
        ]
        assert (await api.messages(sid))["messages"][-1]["metadata"]["model"] == "openai:gpt-5"


async def test_cancel_during_streaming_stores_the_partial_message(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    d, api, fake = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue("anthropic", FakeReply.say("word " * 400, chunk_chars=5, delay_ms=5))
    status, accepted = await api.submit(sid, "talk a lot")
    assert status == 202
    await fake.wait_for_requests(1)
    await asyncio.sleep(0.3)
    status, body = await api.call("POST", f"/sessions/{sid}/turns/{accepted['turn_id']}/cancel")
    assert status == 202 and body["cancellation_initiated"] is True
    terminal = await api.wait_turn(sid, accepted["turn_id"])
    assert terminal["type"] == "turn.cancelled"
    events = await api.turn_events(sid, accepted["turn_id"])
    assert types_of(events)[-2:] == ["llm.call_failed", "turn.cancelled"]
    assert events[-2]["payload"][
        "error_class"
    ] == "cancelled" and "llm.call_completed" not in types_of(events)
    assistant = (await api.messages(sid))["messages"][-1]
    assert assistant["metadata"]["status"] == "cancelled" and assistant["content"][0][
        "text"
    ].startswith("word")
    await d.core.turns.wait_all()
    await fake.wait_until(lambda: fake.requests[-1].client_disconnected, timeout=5)
    _, models = await api.call("GET", "/models")
    assert all(m["availability"] == "healthy" for m in models["models"])


async def test_cancel_during_a_running_shell_kills_it(
    env: tuple[Daemon, Api, FakeProviderServer], workspace: Path
) -> None:
    _, api, fake = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic", FakeReply.call("shell", {"command": "echo started; sleep 30 & sleep 30; wait"})
    )
    _, accepted = await api.submit(sid, "run it")
    await api.wait_for_event(sid, lambda e: e["type"] == "tool.called")
    await asyncio.sleep(0.3)
    await api.call("POST", f"/sessions/{sid}/turns/{accepted['turn_id']}/cancel")
    terminal = await api.wait_turn(sid, accepted["turn_id"], timeout=15)
    assert terminal["type"] == "turn.cancelled"
    events = await api.turn_events(sid, accepted["turn_id"])
    failed = next(e for e in events if e["type"] == "tool.failed")
    assert failed["payload"]["error_class"] == "cancelled"
    result = next(m for m in (await api.messages(sid))["messages"] if m["role"] == "tool")
    assert result["content"][0]["content"][0]["text"].startswith("Tool call cancelled")
    assert "started" in result["content"][0]["content"][0]["text"]
    assert len(fake.requests_for("anthropic")) == 1  # no further LLM call after the cancel


async def test_daemon_killed_mid_turn_recovers_on_restart(
    fake: FakeProviderServer, metis_home: Path, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "models.yaml").write_text(models_yaml(fake))
    (metis_home / "config.yaml").write_text(AUTO_TOOLS)
    port = free_port()
    proc = await spawn_serve(metis_home, port)
    fake.enqueue("anthropic", FakeReply.hang_after(4, text="never finished"))
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/health")
            api = Api(http, home_headers(metis_home))
            sid = await session_on(api, workspace, "anthropic")
            status, accepted = await api.submit(sid, "this turn will be interrupted")
            assert status == 202
            # the first turn of a fresh `metis serve` waits for its provider SDK's import
            await fake.wait_for_requests(1, timeout=SERVE_START_DEADLINE_S)
            status, body = await api.call("PATCH", f"/sessions/{sid}", {"active_model": "gpt5"})
            assert body["swap_queued"] is True
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    d = await start_daemon()
    async with api_session(d) as http:
        api = Api(http)
        terminal = await api.wait_turn(sid, accepted["turn_id"])
        assert (
            terminal["type"] == "turn.failed" and terminal["payload"]["reason"] == "daemon_restart"
        )
        events = await api.events(sid)
        assert types_of(events).count("turn.failed") == 1
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        _, got = await api.call("GET", f"/sessions/{sid}")
        assert got["sticky_model"] == "openai:gpt-5" and got["pending_swap"] is None
        assert (await api.messages(sid))["messages"][0]["id"] == accepted["user_message_id"]
        fake.enqueue("openai", FakeReply.say("back again"))
        _, terminal = await api.run_turn(sid, "are you there?")
        assert terminal["type"] == "turn.completed"


SMALL_MODEL = """
pricing_version: "e2e-1"
providers:
  anthropic: {{adapter: anthropic, base_url: "{anthropic}", api_key: "ak-test"}}
models:
  - id: anthropic:small
    capabilities: {{max_context_tokens: 8192, max_output_tokens: 512}}
    pricing: {{input_per_mtok: "1", output_per_mtok: "1"}}
"""


async def test_history_beyond_the_context_window_is_compacted_not_refused(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    d = await start_daemon(models=SMALL_MODEL.format(anthropic=fake.anthropic_base_url))
    async with api_session(d) as http:
        api = Api(http)
        sid = (await api.create_session(workspace))["id"]
        for i in range(4):  # each message is ~3,000 tokens; the window holds about two
            fake.enqueue("anthropic", FakeReply.say(f"answer {i}"))
            _, terminal = await api.run_turn(sid, f"part {i} " + "lorem ipsum " * 1000)
            assert terminal["type"] == "turn.completed", terminal
        assert len((await api.messages(sid))["messages"]) == 8  # the stored history is complete
        last_request = fake.requests_for("anthropic")[-1].body
        assert len(last_request["messages"]) < 7
        assert last_request["messages"][-1]["content"][0]["text"].startswith("part 3")
