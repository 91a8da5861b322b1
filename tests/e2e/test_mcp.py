"""MCP servers as tool sources, end to end: a real daemon, the fake provider through the real
SDKs, and real MCP servers written with the official SDK (tests/core/tools/mcp_servers/demo.py)
over stdio and over Streamable HTTP on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from metis.cli import setup_logging
from metis.core.canonical.redaction import redact
from metis.core.tools.mcp.server import McpServer
from metis.core.tools.mcp.transport import MAX_MESSAGE_BYTES
from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from metis.testing.serving import free_port, spawn_serve, wait_until_serving
from tests.api import Api, api_session, home_headers
from tests.commands.test_run_and_sessions import metis
from tests.core.tools.mcp_servers import DEMO, MALFORMED, python_server
from tests.e2e.test_provider_turns import models_yaml, session_on, types_of
from tests.processes import gone, live_group_members

AUTO = "{none: auto, read: auto, write: auto, execute: auto, network: auto}"


def mcp_config(
    log: Path | None, *, policy: str = "auto", extra: str = "", http_url: str = ""
) -> str:
    """The stdio server `demo` (logging to `log`; none when `log` is None) and, given its
    `http_url`, the Streamable HTTP server `remote`."""
    lines = [
        "tools:",
        f"  confirmation: {{default: {AUTO}}}",
        "  max_result_bytes: 65536",
        "mcp:",
        "  restart_initial_seconds: 0.2",
        "  servers:",
    ]
    if log is not None:
        lines += [
            "    demo:",
            f"      command: {json.dumps(sys.executable)}",
            f"      args: [{json.dumps(str(DEMO))}]",
            f"      env: {{MCP_DEMO_LOG: {json.dumps(str(log))}, DEMO_TOKEN: '${{METIS_TEST_DEMO_TOKEN}}'}}",
            f"      policy: {policy}",
            "      tools: {add: {policy: auto}, slow: {timeout_seconds: 30}}",
        ]
    if http_url:
        lines += [
            "    remote:",
            f"      url: {http_url}",
            "      headers: {X-Api-Key: '${METIS_TEST_DEMO_TOKEN}'}",
            "      policy: auto",
        ]
    return "\n".join(lines) + "\n" + extra


@pytest.fixture
async def env(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Daemon, Api, FakeProviderServer, Path]]:
    monkeypatch.setenv("METIS_TEST_DEMO_TOKEN", "tok-5ecret-value-123")
    log = tmp_path / "demo.log"
    d = await start_daemon(config=mcp_config(log, policy="prompt"), models=models_yaml(fake))
    await d.core.mcp.wait_ready(30)
    async with api_session(d) as http:
        yield d, Api(http), fake, log


def log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


async def until(predicate: Callable[[], Any], timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met")
        await asyncio.sleep(0.05)


async def answer_all(
    api: Api, sid: str, turn_id: str, decision: str = "allow", timeout: float = 30.0
) -> dict[str, Any]:
    """Answer every confirmation the turn asks for until it ends; its terminal event."""
    answered: set[str] = set()
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        for e in await api.turn_events(sid, turn_id):
            if e["type"] in ("turn.completed", "turn.cancelled", "turn.failed"):
                return e
            request_id = e["payload"].get("confirmation_request_id")
            if e["type"] == "tool.confirmation_requested" and request_id not in answered:
                code, body = await api.answer(sid, turn_id, request_id, decision, scope="once")
                assert code == 200, body
                answered.add(request_id)
        await asyncio.sleep(0.05)
    raise TimeoutError("the turn did not end")


async def allow_first_request(api: Api, sid: str, turn_id: str) -> None:
    """Allow, once, the confirmation the turn asks for first."""
    requested = await api.wait_for_event(sid, lambda e: e["type"] == "tool.confirmation_requested")
    request_id = requested["payload"]["confirmation_request_id"]
    await api.answer(sid, turn_id, request_id, "allow", scope="once")


async def tool_failed(api: Api, sid: str, turn_id: str) -> dict[str, Any]:
    """The turn's first `tool.failed` event."""
    return next(e for e in await api.turn_events(sid, turn_id) if e["type"] == "tool.failed")


async def mcp_status(api: Api) -> dict[str, Any]:
    status, body = await api.call("GET", "/mcp")
    assert status == 200, body
    return {s["name"]: s for s in body["servers"]}


@pytest.mark.parametrize("api_name", ["anthropic", "openai"])
async def test_the_model_calls_an_mcp_tool_and_uses_its_result(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path, api_name: str
) -> None:
    _, api, fake, log = env
    sid = await session_on(api, workspace, api_name)
    fake.enqueue(
        api_name,
        FakeReply.call("mcp__demo__add", {"a": 40}),
        FakeReply.say("The answer is 42."),
    )
    accepted, terminal = await api.run_turn(sid, "add")
    assert terminal["type"] == "turn.completed", terminal
    events = await api.turn_events(sid, accepted["turn_id"])
    called = next(e for e in events if e["type"] == "tool.called")
    assert called["payload"]["tool_name"] == "mcp__demo__add"
    assert called["payload"]["origin"] == "builtin" and called["payload"]["timeout_seconds"] == 120
    assert "tool.completed" in types_of(events) and "tool.confirmation_requested" not in types_of(
        events
    )
    assert log_lines(log) == ["add 40 2"]  # the server's own default, applied by the server
    # the tool is offered with the server's schema, and its result reaches the model
    first, second = fake.requests_for(api_name)[-2:]
    if api_name == "anthropic":
        offered = {t["name"]: t for t in first.body["tools"]}
        schema = offered["mcp__demo__add"]["input_schema"]
        block = second.body["messages"][-1]["content"][0]
        assert block["type"] == "tool_result" and block["content"][0]["text"] == "42"
    else:
        offered = {t["function"]["name"]: t["function"] for t in first.body["tools"]}
        schema = offered["mcp__demo__add"]["parameters"]
        assert second.body["messages"][-1]["content"] == "42"
    assert schema["required"] == ["a"] and schema["properties"]["b"]["minimum"] == 0
    assert {"read_file", "shell", "mcp__demo__slow", "mcp__demo__picture"} <= set(offered)


async def test_get_mcp_lists_servers_tools_and_only_secret_names(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    _, api, fake, _ = env
    status, raw = await api.call("GET", "/mcp")
    assert status == 200 and "tok-5ecret-value-123" not in json.dumps(raw)
    demo = (await mcp_status(api))["demo"]
    assert demo["state"] == "ready" and demo["transport"] == "stdio"
    assert demo["env"] == ["DEMO_TOKEN", "MCP_DEMO_LOG"] and demo["last_error"] is None
    tools = {t["remote_name"]: t for t in demo["tools"]}
    assert tools["add"] == {
        "name": "mcp__demo__add",
        "remote_name": "add",
        "policy": "auto",
        "description": "Add two integers.",
    }
    assert tools["slow"]["policy"] == "prompt"
    # the same through the CLI
    d = env[0]
    code, out, err = await metis("mcp", "list", "--url", d.base_url)
    assert code == 0, err
    assert out.splitlines()[0].startswith("demo\tready\tstdio\t")
    assert "  env: DEMO_TOKEN, MCP_DEMO_LOG" in out and "  mcp__demo__add\tauto" in out
    assert "tok-5ecret" not in out
    code, out, _ = await metis("mcp", "list", "--json", "--url", d.base_url)
    assert code == 0 and json.loads(out)["servers"][0]["name"] == "demo"
    # the server got the variable it was configured with, not the provider's or daemon's keys
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        FakeReply.call("mcp__demo__env", {"name": "DEMO_TOKEN"}),
        FakeReply.call("mcp__demo__env", {"name": "METIS_API_KEY"}),
        FakeReply.say("ok"),
    )
    _, accepted = await api.submit(sid, "env")
    terminal = await answer_all(api, sid, accepted["turn_id"])
    assert terminal["type"] == "turn.completed"
    results = [
        m["content"][0]["content"][0]["text"]
        for m in (await api.messages(sid))["messages"]
        if m["role"] == "tool"
    ]
    assert results == ["set", "unset"]


def gated_demo(gate: Path, **env: str) -> str:
    """A `demo` server entry that starts only once `gate` exists: the test decides that it
    finishes starting after the others, where a fixed delay (1.5 s a start, restarts included)
    only made it likely."""
    script = f"while [ ! -e {gate} ]; do sleep 0.02; done; exec {sys.executable} {DEMO}"
    return json.dumps({"command": "/bin/sh", "args": ["-c", script], "env": env})


async def test_a_tool_name_two_servers_offer_is_held_by_the_one_listed_first_in_config_yaml(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], metis_home: Path, tmp_path: Path
) -> None:
    """`demo`'s `x__add` and `demo__x`'s `add` are both offered as `mcp__demo__x__add`: the
    server listed first holds it even when it finishes starting last, and after a restart of
    either; the other says so in `last_error` and keeps its other tools. Reordered in the file
    and reloaded, the name moves; the holder withdrawn, the other gets it back."""
    name = "mcp__demo__x__add"

    def config(**servers: str) -> str:
        return "mcp:\n  servers:\n" + "".join(f"    {n}: {e}\n" for n, e in servers.items())

    def write(**servers: str) -> None:
        (metis_home / "config.yaml").write_text(config(**servers))

    gate = tmp_path / "demo-may-start"
    demo, demo_x = gated_demo(gate, MCP_DEMO_ALIAS="x__add"), python_server(DEMO)
    d = await start_daemon(config=config(demo=demo, demo__x=demo_x), models=models_yaml(fake))
    registry = d.core.tool_registry
    servers = d.core.mcp.servers
    await until(lambda: servers["demo__x"].state == "ready")
    assert registry.source_of(name) == "mcp:demo__x"  # alone so far
    assert servers["demo"].state != "ready"
    gate.touch()  # `demo`, listed first, finishes starting last
    await d.core.mcp.wait_ready(30)

    async def holder_and_notes() -> tuple[str | None, dict[str, str | None]]:
        status = await mcp_status(api)
        holders = [n for n, s in status.items() if name in {t["name"] for t in s["tools"]}]
        assert len(holders) == 1 and registry.source_of(name) == f"mcp:{holders[0]}"
        assert all(s["state"] == "ready" for s in status.values())
        assert "mcp__demo__slow" in {t["name"] for t in status["demo"]["tools"]}
        assert "mcp__demo__x__slow" in {t["name"] for t in status["demo__x"]["tools"]}
        return holders[0], {n: s["last_error"] for n, s in status.items()}

    def taken_from(remote: str, holder: str) -> str:
        return (
            f"tool {remote!r} skipped: {name} is taken by MCP server "
            f'"{holder}", listed before it in config.yaml'
        )

    async with api_session(d) as http:
        api = Api(http)
        expected = ("demo", {"demo": None, "demo__x": taken_from("add", "demo")})
        assert await holder_and_notes() == expected
        for restarted in ("demo", "demo__x"):
            code, body = await api.call("POST", f"/mcp/{restarted}/restart")
            assert code == 202, body
            await until(lambda: all(s.state == "ready" for s in servers.values()))
            assert await holder_and_notes() == expected
        write(demo__x=demo_x, demo=demo)  # the same entries, in the other order
        code, body = await api.call("POST", "/mcp/reload")
        assert code == 200 and [s["name"] for s in body["servers"]] == ["demo__x", "demo"], body
        assert await holder_and_notes() == (
            "demo__x",
            {"demo__x": None, "demo": taken_from("x__add", "demo__x")},
        )
        write(demo__x=json.dumps({**json.loads(demo_x), "enabled": False}), demo=demo)
        code, body = await api.call("POST", "/mcp/reload")
        assert code == 200, body
        status = await mcp_status(api)
        assert name in {t["name"] for t in status["demo"]["tools"]}
        assert status["demo"]["last_error"] is None and registry.source_of(name) == "mcp:demo"


async def test_a_listing_with_unreadable_tools_offers_the_others_and_says_which_were_skipped(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    server = python_server(MALFORMED, policy="auto")
    config = (
        f"tools:\n  confirmation: {{default: {AUTO}}}\nmcp:\n  servers:\n    sloppy: {server}\n"
    )
    d = await start_daemon(config=config, models=models_yaml(fake))
    await d.core.mcp.wait_ready(30)
    async with api_session(d) as http:
        api = Api(http)
        sloppy = (await mcp_status(api))["sloppy"]
        assert sloppy["state"] == "ready"
        assert [t["name"] for t in sloppy["tools"]] == ["mcp__sloppy__good"]
        assert sloppy["last_error"] == (
            "tool 'bad' (#1) skipped: not valid MCP (description: Input should be a valid string; "
            "inputSchema: Field required); tool #3 skipped: not valid MCP (name: Field required)"
        )
        # the tool that was kept works: the SDK's session reads its calls as usual
        sid = await session_on(api, workspace, "anthropic")
        fake.enqueue("anthropic", FakeReply.call("mcp__sloppy__good", {}), FakeReply.say("done"))
        accepted, terminal = await api.run_turn(sid, "use the good one")
        assert terminal["type"] == "turn.completed", terminal
        assert "tool.completed" in types_of(await api.turn_events(sid, accepted["turn_id"]))
        results = [m for m in (await api.messages(sid))["messages"] if m["role"] == "tool"]
        assert results[0]["content"][0]["content"] == [{"type": "text", "text": "good ran"}]


DB_URL = "postgresql://admin:hunter2pw@db.example/prod"
REFUSES = (
    "import json, sys\n"
    "message = json.loads(sys.stdin.readline())\n"
    "error = {'code': -32001, 'message': 'bad licence key'}\n"
    "print(json.dumps({'jsonrpc': '2.0', 'id': message['id'], 'error': error}), flush=True)\n"
)


async def test_a_server_that_cannot_start_says_why_and_keeps_the_last_runs_stderr(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], metis_home: Path, tmp_path: Path
) -> None:
    """The reason is the server's own (its exit, its error answer, its stray output) or what
    metis saw (no answer in time), never the exit metis caused by stopping it; an entry only
    an edit can fix is not retried until the edit is applied."""
    crash = "import sys; sys.stderr.write('boom at start'); sys.exit(7)"
    chatty = "echo hello world; echo '{not json'; cat >/dev/null"
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    head = "mcp:\n  restart_initial_seconds: 0.1\n  servers:\n"
    config = (
        f"    crashes: {python_server('-c', crash)}\n"
        f"    nowhere: {python_server(DEMO, cwd='/no/such/dir')}\n"
        f"    malformed: {python_server(MALFORMED, 'not-a-list')}\n"
        f"    refuses: {python_server('-c', REFUSES)}\n"
        f'    chatty: {{command: /bin/sh, args: ["-c", "{chatty}"], connect_timeout_seconds: 0.5}}\n'
        f"    noexec: {{command: {tmp_path / 'not-executable'}, args: [{DB_URL}]}}\n"
    )
    unset = "    unset: {command: /bin/true, env: {X: '${METIS_TEST_UNSET}'}}\n"
    d = await start_daemon(config=head + config + unset, models=models_yaml(fake))
    servers = d.core.mcp.servers
    async with api_session(d) as http:
        api = Api(http)
        await until(lambda: (metis_home / "logs" / "mcp" / "crashes.stderr.log.1").exists())
        await until(lambda: servers["crashes"].restarts >= 2)
        await until(lambda: all(s.last_error is not None for s in servers.values()))
        await until(lambda: servers["chatty"].restarts >= 2)
        status = await mcp_status(api)
        assert status["refuses"]["last_error"] == "MCP error -32001: bad licence key"
        assert status["chatty"]["last_error"] == (
            "no answer to initialize / tools/list within 0.5 s (connect_timeout_seconds); the "
            "server wrote non-JSON-RPC to "
            "stdout: 'hello world' (stdout carries MCP messages only; logs belong on stderr)"
        )
        assert status["noexec"]["last_error"] == (
            f"command is not executable: {tmp_path / 'not-executable'}"
        )
        # a password written into a URL among the arguments is not shown
        assert status["noexec"]["args"] == ["postgresql://***@db.example/prod"]
        assert "hunter2pw" not in json.dumps(status)
        assert status["unset"]["last_error"] == (
            "mcp.servers.unset.env.X: ${METIS_TEST_UNSET} is not set in the daemon's "
            "environment; not retried until config.yaml changes (then `metis mcp reload`)"
        )
        assert status["unset"]["state"] == "stopped" and status["unset"]["restarts"] == 0
        # the edit applied: started again, and failing now for its own reason
        (metis_home / "config.yaml").write_text(head + config + "    unset: {command: /bin/true}\n")
        code, body = await api.call("POST", "/mcp/reload")
        assert code == 200 and body["applied"]["changed"] == ["unset"], body
        await until(lambda: "exited with status 0" in (servers["unset"].last_error or ""))
        servers = await mcp_status(api)
    assert "exited with status 7" in servers["crashes"]["last_error"]
    assert "crashes.stderr.log" in servers["crashes"]["last_error"]
    assert servers["nowhere"]["last_error"] == "working directory not found: /no/such/dir"
    # a listing with no list of tools is refused whole: said as such, not as the exit of the
    # process the client then hung up on
    assert servers["malformed"]["state"] != "ready" and servers["malformed"]["tools"] == []
    assert servers["malformed"]["last_error"] == (
        "its tools/list answer is not valid MCP: tools: Input should be a valid list"
    )
    logs = metis_home / "logs" / "mcp"
    assert "boom at start" in (logs / "crashes.stderr.log.1").read_text()


async def with_a_silent_server(
    fake: FakeProviderServer, start_daemon: Callable[..., Any]
) -> tuple[Daemon, McpServer, int]:
    """A daemon whose server `silent` never answers `initialize` (its connect timeout is a
    minute), once its process runs: the daemon, the server and its process id."""
    silent = python_server("-c", "import time; time.sleep(120)", connect_timeout_seconds=60)
    config = f"mcp:\n  servers:\n    silent: {silent}\n"
    d = await start_daemon(config=config, models=models_yaml(fake))
    server = d.core.mcp.servers["silent"]
    await until(lambda: server.pid is not None)
    assert server.pid is not None
    return d, server, server.pid


@pytest.mark.usefixtures("brief_mcp_exit_grace")
async def test_shutdown_does_not_wait_for_a_server_that_never_answers_initialize(
    fake: FakeProviderServer, start_daemon: Callable[..., Any]
) -> None:
    d, _server, pid = await with_a_silent_server(fake, start_daemon)
    started = asyncio.get_running_loop().time()
    await d.stop()
    assert asyncio.get_running_loop().time() - started < 20  # its connect timeout is 60 s
    assert await gone(pid)


def holds_on_after_eof(eof: Path, **settings: object) -> str:
    """An entry whose server never answers, and once its stdin closes (metis stopping it after
    the connect timeout) notes `eof`, then ignores SIGTERM: its stop runs the whole 4 s."""
    script = f"trap '' TERM; cat >/dev/null; touch {eof}; exec sleep 1003"
    return json.dumps({"command": "/bin/sh", "args": ["-c", script], **settings})


async def test_a_server_stopped_while_its_failed_start_is_cleaned_up_is_stopped_for_good(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], metis_home: Path, tmp_path: Path
) -> None:
    """A reload that removes a server, and the daemon's stop, each arriving while a server
    that timed out is being stopped, wait for that stop: the process does not run on, and its
    note in the ledger goes only with it."""
    head = "mcp:\n  restart_initial_seconds: 60\n  servers:\n"
    late = f"    late: {holds_on_after_eof(tmp_path / 'late', connect_timeout_seconds=3)}\n"
    early = f"    early: {holds_on_after_eof(tmp_path / 'early', connect_timeout_seconds=0.5)}\n"
    d = await start_daemon(config=head + early + late, models=models_yaml(fake))
    ledger = metis_home / "run" / "shell-groups"
    servers = d.core.mcp.servers
    await until(lambda: servers["early"].pid is not None and servers["late"].pid is not None)
    early_pid, late_pid = servers["early"].pid, servers["late"].pid
    assert early_pid is not None and late_pid is not None
    await until(lambda: (tmp_path / "early").exists())  # being stopped
    (metis_home / "config.yaml").write_text(head + late)
    async with api_session(d) as http:
        code, body = await Api(http).call("POST", "/mcp/reload")
    assert code == 200 and body["applied"]["removed"] == ["early"], body
    assert await gone(early_pid) and not (ledger / str(early_pid)).exists()
    await until(lambda: (tmp_path / "late").exists())
    await d.stop()
    assert await gone(late_pid) and list(ledger.iterdir()) == []


async def test_confirmation_required_then_allowed_or_denied(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    _, api, fake, log = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        FakeReply.call("mcp__demo__slow", {"seconds": 0}),
        FakeReply.say("done"),
        FakeReply.call("mcp__demo__slow", {"seconds": 0}),
        FakeReply.say("fine"),
    )
    for decision in ("allow", "deny"):
        _, accepted = await api.submit(sid, decision)
        requested = await api.wait_for_event(
            sid,
            lambda e, t=accepted["turn_id"]: (
                e["type"] == "tool.confirmation_requested" and e["turn_id"] == t
            ),
        )
        payload = requested["payload"]
        assert payload["tool_name"] == "mcp__demo__slow"
        assert payload["input_summary"] == 'demo: slow {"seconds":0}'
        code, _ = await api.answer(
            sid, accepted["turn_id"], payload["confirmation_request_id"], decision, scope="once"
        )
        assert code == 200
        terminal = await api.wait_turn(sid, accepted["turn_id"])
        assert terminal["type"] == "turn.completed"
        events = types_of(await api.turn_events(sid, accepted["turn_id"]))
        if decision == "allow":
            assert "tool.completed" in events
        else:
            assert "tool.called" not in events
            failed = await tool_failed(api, sid, accepted["turn_id"])
            assert failed["payload"]["error_class"] == "user_denied"
    assert log_lines(log) == ["slow started", "slow finished"]


async def test_a_policy_deny_refuses_without_asking(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("METIS_TEST_DEMO_TOKEN", "x")
    log = tmp_path / "demo.log"
    d = await start_daemon(config=mcp_config(log, policy="deny"), models=models_yaml(fake))
    await d.core.mcp.wait_ready(30)
    async with api_session(d) as http:
        api = Api(http)
        sid = await session_on(api, workspace, "anthropic")
        fake.enqueue("anthropic", FakeReply.call("mcp__demo__whoami", {}), FakeReply.say("denied"))
        accepted, _ = await api.run_turn(sid, "who")
        failed = await tool_failed(api, sid, accepted["turn_id"])
        assert failed["payload"]["error_class"] == "policy_denied"
        assert log_lines(log) == []


async def test_input_violating_the_schema_never_reaches_the_server(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    _, api, fake, log = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        FakeReply.call("mcp__demo__add", {"a": "forty", "b": -1, "c": 1}),
        FakeReply.say("sorry"),
    )
    accepted, terminal = await api.run_turn(sid, "add badly")
    assert terminal["type"] == "turn.completed"
    events = await api.turn_events(sid, accepted["turn_id"])
    invalid = next(e for e in events if e["type"] == "tool.input_invalid")
    paths = {e["path"] for e in invalid["payload"]["errors"]}
    assert {"$.a", "$.b"} <= paths
    assert "tool.called" not in types_of(events) and log_lines(log) == []
    text = fake.requests_for("anthropic")[-1].body["messages"][-1]["content"][0]["content"][0]
    assert text["text"].startswith("Invalid input for mcp__demo__add:")


async def test_cancel_during_a_slow_mcp_call_cancels_it_on_the_server(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    _d, api, fake, log = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue("anthropic", FakeReply.call("mcp__demo__slow", {"seconds": 60}))
    _status, accepted = await api.submit(sid, "wait")
    await allow_first_request(api, sid, accepted["turn_id"])
    await api.wait_for_event(sid, lambda e: e["type"] == "tool.called")
    await until(lambda: "slow started" in log_lines(log))
    started = asyncio.get_running_loop().time()
    code, _ = await api.call("POST", f"/sessions/{sid}/turns/{accepted['turn_id']}/cancel")
    assert code in (200, 202)
    terminal = await api.wait_turn(sid, accepted["turn_id"])
    assert terminal["type"] == "turn.cancelled"
    assert asyncio.get_running_loop().time() - started < 5
    failed = await tool_failed(api, sid, accepted["turn_id"])
    assert failed["payload"]["error_class"] == "cancelled"
    await until(lambda: "slow cancelled" in log_lines(log))  # notifications/cancelled arrived
    assert "slow finished" not in log_lines(log)
    assert (await mcp_status(api))["demo"]["state"] == "ready"  # the server stays up


async def test_an_mcp_tool_timeout_names_the_server_and_the_setting_that_raises_it(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    """`Timed out after N s.` (as for a builtin), then which server's tool it was and what in
    config.yaml allows it longer: the tool's own timeout when it has one (the server's would
    change nothing), else that or the server's."""
    config = (
        f"tools:\n  confirmation: {{default: {AUTO}}}\nmcp:\n  servers:\n"
        f"    demo: {python_server(DEMO, policy='auto', tools={'slow': {'timeout_seconds': 1}})}\n"
        f"    other-demo: {python_server(DEMO, policy='auto', timeout_seconds=1)}\n"
    )
    d = await start_daemon(config=config, models=models_yaml(fake))
    await d.core.mcp.wait_ready(30)
    said = "was cancelled at its limit; raise"
    expected = {
        "mcp__demo__slow": 'Timed out after 1 s.\nThe call to tool "slow" of MCP server "demo" '
        f"{said} mcp.servers.demo.tools.slow.timeout_seconds in config.yaml to allow it longer.",
        "mcp__other_demo__slow": 'Timed out after 1 s.\nThe call to tool "slow" of MCP server '
        f'"other-demo" {said} mcp.servers.other-demo.tools.slow.timeout_seconds or '
        "mcp.servers.other-demo.timeout_seconds in config.yaml to allow it longer.",
    }
    async with api_session(d) as http:
        api = Api(http)
        for tool, text in expected.items():
            sid = await session_on(api, workspace, "anthropic")
            fake.enqueue("anthropic", FakeReply.call(tool, {"seconds": 60}), FakeReply.say("ok"))
            accepted, terminal = await api.run_turn(sid, "wait")
            assert terminal["type"] == "turn.completed", terminal
            failed = await tool_failed(api, sid, accepted["turn_id"])
            assert failed["payload"]["error_class"] == "timeout"
            assert failed["payload"]["message"] == text
            results = [m for m in (await api.messages(sid))["messages"] if m["role"] == "tool"]
            assert results[0]["content"][0]["content"] == [{"type": "text", "text": text}]


async def a_slow_call_running(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> tuple[McpServer, int, str, str]:
    """A turn whose call of `demo`'s slow tool is running (the model then replies): the
    server, its process id, the session and the turn."""
    d, api, fake, log = env
    server = d.core.mcp.servers["demo"]
    assert server.pid is not None
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic", FakeReply.call("mcp__demo__slow", {"seconds": 60}), FakeReply.say("cut")
    )
    _status, accepted = await api.submit(sid, "wait")
    await allow_first_request(api, sid, accepted["turn_id"])
    await until(lambda: "slow started" in log_lines(log))
    return server, server.pid, sid, accepted["turn_id"]


async def test_server_killed_mid_call_fails_the_call_and_is_restarted(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    _d, api, fake, _log = env
    server, pid, sid, turn_id = await a_slow_call_running(env, workspace)
    os.kill(pid, signal.SIGKILL)
    terminal = await api.wait_turn(sid, turn_id, timeout=15)
    assert terminal["type"] == "turn.completed"
    failed = await tool_failed(api, sid, turn_id)
    assert failed["payload"]["error_class"] == "tool_error"
    assert 'MCP server "demo" stopped during the call' in failed["payload"]["message"]
    # restarted with a new process; its tools work again
    await until(lambda: server.state == "ready" and server.pid not in (None, pid))
    demo = (await mcp_status(api))["demo"]
    assert demo["restarts"] >= 1 and demo["state"] == "ready"
    assert await gone(pid)
    fake.enqueue("anthropic", FakeReply.call("mcp__demo__add", {"a": 1}), FakeReply.say("ok"))
    accepted, terminal = await api.run_turn(sid, "again")
    assert "tool.completed" in types_of(await api.turn_events(sid, accepted["turn_id"]))


async def test_a_restart_on_request_replaces_the_process_and_fails_the_call_in_flight(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    _d, api, _fake, _log = env
    server, pid, sid, turn_id = await a_slow_call_running(env, workspace)
    code, body = await api.call("POST", "/mcp/demo/restart")
    assert code == 202, body
    assert body["name"] == "demo" and body["state"] == "restarting" and body["last_error"] is None
    terminal = await api.wait_turn(sid, turn_id, timeout=15)
    assert terminal["type"] == "turn.completed"
    failed = await tool_failed(api, sid, turn_id)
    assert failed["payload"]["message"] == (
        'MCP server "demo" stopped during the call (restarted on request); '
        "the call's outcome is unknown."
    )
    await until(lambda: server.state == "ready" and server.pid not in (None, pid))
    assert await gone(pid)
    demo = (await mcp_status(api))["demo"]
    assert demo["restarts"] == 1 and demo["last_error"] is None
    assert "mcp__demo__add" in {t["name"] for t in demo["tools"]}


async def test_a_restart_on_request_skips_the_backoff_of_a_server_fixed_meanwhile(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    fixed = tmp_path / "fixed"
    start = (
        "import os, runpy, sys\n"
        f"os.path.exists({str(fixed)!r}) or sys.exit('not fixed yet')\n"
        f"sys.argv = [{str(DEMO)!r}]\n"
        f"runpy.run_path({str(DEMO)!r}, run_name='__main__')\n"
    )
    config = (
        "mcp:\n  restart_initial_seconds: 60\n  servers:\n"
        f"    late: {python_server('-c', start)}\n"
        "    spare: {command: /bin/true, enabled: false}\n"
    )
    d = await start_daemon(config=config, models=models_yaml(fake))
    server = d.core.mcp.servers["late"]
    await until(lambda: server.state == "restarting" and server.last_error is not None)
    assert server.restarts == 1  # the next try is a minute away
    # asked for while it is still broken: the new attempt fails, and the command says why
    code, out, err = await metis("mcp", "restart", "late", "--url", d.base_url)
    assert code == 1, (out, err)
    assert out.startswith("late: restarting, 0 tools\n  last error: the server process exited")
    assert server.restarts == 2  # the one it waited for, sooner, and the next
    fixed.touch()
    started = asyncio.get_running_loop().time()
    code, out, err = await metis("mcp", "restart", "late", "--url", d.base_url)
    assert code == 0, err
    assert out.startswith("late: ready, ") and out.rstrip().endswith(" tools"), out
    assert asyncio.get_running_loop().time() - started < 30  # well inside the minute
    code, out, err = await metis("mcp", "restart", "spare", "--url", d.base_url)
    assert code == 1 and out == "" and "'spare' is disabled" in err, err
    async with api_session(d) as http:
        api = Api(http)
        late = (await mcp_status(api))["late"]
        assert late["restarts"] == 2 and late["last_error"] is None and late["tools"]
        # a name no server has, and a disabled server, are refused with their own codes
        code, body = await api.call("POST", "/mcp/nowhere/restart")
        assert code == 404 and body["error"]["code"] == "mcp_server_not_found", body
        code, body = await api.call("POST", "/mcp/spare/restart")
        assert code == 409 and body["error"]["code"] == "mcp_server_disabled", body
        assert (await mcp_status(api))["spare"]["state"] == "disabled"
    async with (
        aiohttp.ClientSession() as anonymous,
        anonymous.post(f"{d.base_url}/mcp/late/restart") as response,
    ):
        assert response.status == 401


async def test_a_restart_applies_the_entry_config_yaml_has_now(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    """Fixed, added, broken, disabled, enabled again, removed: each edit of config.yaml is
    applied by the restart of the server it names, with no daemon restart."""
    head = "mcp:\n  restart_initial_seconds: 60\n  servers:\n"
    d = await start_daemon(
        config=head + '    demo: {command: "/no/such/mcp-server\\e[2J"}\n', models=models_yaml(fake)
    )
    config = metis_home / "config.yaml"
    mcp = d.core.mcp

    def write(**servers: str) -> None:
        config.write_text(head + "".join(f"    {n}: {e}\n" for n, e in servers.items()))

    def offered(server: str) -> list[str]:
        return [t.name for t in d.core.tool_registry.all() if t.name.startswith(f"mcp__{server}__")]

    async with api_session(d) as http:
        api = Api(http)
        await until(lambda: mcp.servers["demo"].last_error is not None)  # command not found
        # the command's error is shown, its control characters escaped, never obeyed
        code, out, err = await metis("mcp", "restart", "demo", "--url", d.base_url)
        assert code == 1, err
        assert out == (
            "demo: restarting, 0 tools\n  last error: command not found: /no/such/mcp-server\\x1b[2J\n"
        )
        write(demo=python_server(DEMO))
        code, body = await api.call("POST", "/mcp/demo/restart")
        assert code == 202 and body["command"] == sys.executable, body
        await until(lambda: mcp.servers["demo"].state == "ready")
        assert "mcp__demo__add" in offered("demo")
        # an error in the file: refused, saying where, and nothing changes
        config.write_text(head + "    demo: {command: x, colour: blue}\n")
        code, body = await api.call("POST", "/mcp/demo/restart")
        assert code == 409 and body["error"]["code"] == "config_invalid", body
        assert "config.yaml:4: mcp.servers.demo.colour: unknown key" in body["error"]["message"]
        assert mcp.servers["demo"].state == "ready" and offered("demo")
        # a server added to the file: its restart starts it
        write(demo=python_server(DEMO), more=python_server(DEMO))
        code, body = await api.call("POST", "/mcp/more/restart")
        assert code == 202, body
        await until(lambda: mcp.servers["more"].state == "ready")
        assert "mcp__more__add" in offered("more")
        # disabled in the file: stopped, its tools withdrawn, refused as disabled
        write(demo=python_server(DEMO, enabled=False), more=python_server(DEMO))
        pid = mcp.servers["demo"].pid
        code, body = await api.call("POST", "/mcp/demo/restart")
        assert code == 409 and body["error"]["code"] == "mcp_server_disabled", body
        status = await mcp_status(api)
        assert status["demo"]["state"] == "disabled" and status["demo"]["tools"] == []
        assert offered("demo") == [] and pid is not None and await gone(pid)
        # enabled again: started afresh
        write(demo=python_server(DEMO), more=python_server(DEMO))
        code, body = await api.call("POST", "/mcp/demo/restart")
        assert code == 202, body
        await until(lambda: mcp.servers["demo"].state == "ready")
        assert "mcp__demo__add" in offered("demo")
        # removed from the file: stopped, its tools withdrawn, and gone
        write(demo=python_server(DEMO))
        code, body = await api.call("POST", "/mcp/more/restart")
        assert code == 404 and body["error"]["code"] == "mcp_server_not_found", body
        assert "more" not in await mcp_status(api) and offered("more") == []
        assert offered("demo")


async def test_a_reload_applies_what_changed_in_config_yaml_and_leaves_the_rest(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    """Started with no server at all: servers added, changed, kept and removed by reloads,
    from the command line and over REST, with no daemon restart."""
    d = await start_daemon(models=models_yaml(fake))
    config = metis_home / "config.yaml"
    mcp = d.core.mcp

    def write(**servers: str) -> None:
        lines = "".join(f"    {n}: {e}\n" for n, e in servers.items())
        config.write_text("mcp:\n  restart_initial_seconds: 60\n  servers:\n" + lines)

    write(kept=python_server(DEMO), changed=python_server(DEMO))
    code, out, err = await metis("mcp", "reload", "--url", d.base_url)
    assert code == 0, err
    said, _, listed = out.partition("\n")
    assert said == "config.yaml applied: added kept, changed", out
    assert listed.startswith("kept\t") and "\nchanged\t" in listed, out  # the file's order
    await until(lambda: all(s.state == "ready" for s in mcp.servers.values()))
    kept = mcp.servers["kept"]
    pid = kept.pid
    async with api_session(d) as http:
        api = Api(http)
        # one entry changed (a tool's policy), one server added, none removed: only those move
        write(
            kept=python_server(DEMO),
            changed=python_server(DEMO, tools={"add": {"policy": "deny"}}),
            added=python_server(DEMO),
        )
        code, body = await api.call("POST", "/mcp/reload")
        assert code == 200, body
        assert [s["name"] for s in body["servers"]] == ["kept", "changed", "added"]
        assert body["applied"] == {"added": ["added"], "changed": ["changed"], "removed": []}
        await until(lambda: all(s.state == "ready" for s in mcp.servers.values()))
        status = await mcp_status(api)
        policies = {t["remote_name"]: t["policy"] for t in status["changed"]["tools"]}
        assert policies["add"] == "deny" and status["changed"]["restarts"] == 1
        assert kept.pid == pid and kept.restarts == 0  # untouched
        # an error in the file: refused, nothing changes
        config.write_text("mcp:\n  servers: [not, a, mapping]\n")
        code, body = await api.call("POST", "/mcp/reload")
        assert code == 409 and body["error"]["code"] == "config_invalid", body
        assert set(mcp.servers) == {"kept", "changed", "added"}
        # removed from the file: stopped, their tools withdrawn, gone
        write(kept=python_server(DEMO))
        code, body = await api.call("POST", "/mcp/reload")
        assert code == 200 and [s["name"] for s in body["servers"]] == ["kept"], body
        assert body["applied"] == {"added": [], "changed": [], "removed": ["changed", "added"]}
        code, body = await api.call("POST", "/mcp/reload")  # the file as it was: nothing to do
        assert body["applied"] == {"added": [], "changed": [], "removed": []}
        names = [t.name for t in d.core.tool_registry.all()]
        assert not any(n.startswith(("mcp__changed__", "mcp__added__")) for n in names)
        assert kept.pid == pid and kept.state == "ready"


@pytest.mark.usefixtures("brief_mcp_exit_grace")
async def test_a_restart_on_request_ends_a_server_stuck_starting(
    fake: FakeProviderServer, start_daemon: Callable[..., Any]
) -> None:
    d, server, pid = await with_a_silent_server(fake, start_daemon)
    async with api_session(d) as http:
        code, body = await Api(http).call("POST", "/mcp/silent/restart")
    assert code == 202, body
    # its connect timeout is a minute: the stuck start is ended now, and a new one begun
    await until(lambda: server.pid not in (None, pid))
    assert await gone(pid)
    assert server.state == "restarting" and server.restarts == 1


async def test_a_down_server_fails_its_tools_at_once(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    d, api, fake, _ = env
    server = d.core.mcp.servers["demo"]
    await server.stop()  # down, its tools still known
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue("anthropic", FakeReply.call("mcp__demo__add", {"a": 1}), FakeReply.say("down"))
    accepted, terminal = await api.run_turn(sid, "add")
    assert terminal["type"] == "turn.completed"
    failed = await tool_failed(api, sid, accepted["turn_id"])
    assert failed["payload"]["error_class"] == "tool_error"
    assert failed["payload"]["message"].startswith('MCP server "demo" is not available (stopped')


async def test_a_10_mb_result_is_capped_and_images_map_to_image_blocks(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    _d, api, fake, _ = env
    sid = await session_on(api, workspace, "anthropic")
    fake.enqueue(
        "anthropic",
        FakeReply.call("mcp__demo__big", {"megabytes": 10}),
        FakeReply.call("mcp__demo__picture", {}),
        FakeReply.call("mcp__demo__fail", {}),
        FakeReply.say("done"),
    )
    _, accepted = await api.submit(sid, "big")
    terminal = await answer_all(api, sid, accepted["turn_id"])
    assert terminal["type"] == "turn.completed", terminal
    events = await api.turn_events(sid, accepted["turn_id"])
    completed = [e for e in events if e["type"] == "tool.completed"]
    assert completed[0]["payload"]["truncated"] is True
    assert completed[0]["payload"]["output_bytes"] == 10 * 1024 * 1024
    results = [
        m["content"][0] for m in (await api.messages(sid))["messages"] if m["role"] == "tool"
    ]
    text = results[0]["content"][0]["text"]
    assert len(text.encode()) <= 65536 and text.endswith("of 10485760 bytes shown]")
    assert [b["type"] for b in results[1]["content"]] == ["text", "image"]
    assert results[1]["content"][1]["source"]["media_type"] == "image/png"
    failed = next(e for e in events if e["type"] == "tool.failed")
    assert failed["payload"]["error_class"] == "tool_error"
    assert "Error executing tool fail" in failed["payload"]["message"]


async def test_a_message_over_the_size_limit_fails_the_call_and_the_server_restarts(
    env: tuple[Daemon, Api, FakeProviderServer, Path], workspace: Path
) -> None:
    """A server's output is held until its line ends: past the limit the connection is closed
    (the daemon does not grow with what a server writes) and the server started again."""
    d, api, fake, _ = env
    server = d.core.mcp.servers["demo"]
    first_pid = server.pid
    sid = await session_on(api, workspace, "anthropic")
    megabytes = MAX_MESSAGE_BYTES // (1024 * 1024) + 1
    fake.enqueue(
        "anthropic", FakeReply.call("mcp__demo__big", {"megabytes": megabytes}), FakeReply.say("ok")
    )
    _, accepted = await api.submit(sid, "too big")
    terminal = await answer_all(api, sid, accepted["turn_id"])
    assert terminal["type"] == "turn.completed", terminal
    failed = await tool_failed(api, sid, accepted["turn_id"])
    assert "the server sent a message over 16 MiB" in failed["payload"]["message"], failed
    await until(lambda: server.state == "ready" and server.pid not in (None, first_pid))
    fake.enqueue("anthropic", FakeReply.call("mcp__demo__add", {"a": 1}), FakeReply.say("ok"))
    accepted, _terminal = await api.run_turn(sid, "again")
    assert "tool.completed" in types_of(await api.turn_events(sid, accepted["turn_id"]))


@contextlib.contextmanager
def daemon_log() -> Iterator[list[str]]:
    """The lines `metis serve`'s logging set-up lets through, collected; the test run's own
    logging is restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    setup_logging("INFO", Collect())
    try:
        yield lines
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


async def test_a_streamable_http_server_on_loopback(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("METIS_TEST_DEMO_TOKEN", "tok-5ecret-value-123")
    port = free_port()
    http_log = tmp_path / "http.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(DEMO),
        "http",
        str(port),
        env={**os.environ, "MCP_DEMO_LOG": str(http_log)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        async with aiohttp.ClientSession() as probe:
            for _ in range(200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with probe.get(f"http://127.0.0.1:{port}/mcp") as r:
                        if r.status:
                            break
                await asyncio.sleep(0.05)
        # only the remote server: a stdio one beside it would prove nothing here; its URL
        # carries credentials, which neither its status nor the daemon's log shows
        url = f"http://mcpuser:urlpw-4444@127.0.0.1:{port}/mcp?api_key=qk-secret-999&x=1"
        with daemon_log() as logged:
            d = await start_daemon(config=mcp_config(None, http_url=url), models=models_yaml(fake))
            await d.core.mcp.wait_ready(30)
            async with api_session(d) as http:
                api = Api(http)
                remote = (await mcp_status(api))["remote"]
                assert remote["url"] == f"http://***@127.0.0.1:{port}/mcp?api_key=***&x=1"
                assert remote["state"] == "ready" and remote["transport"] == "http"
                assert remote["headers"] == ["X-Api-Key"]
                sid = await session_on(api, workspace, "anthropic")
                fake.enqueue(
                    "anthropic",
                    FakeReply.call("mcp__remote__add", {"a": 1, "b": 2}),
                    FakeReply.say("3"),
                )
                accepted, terminal = await api.run_turn(sid, "add remotely")
                assert terminal["type"] == "turn.completed"
                events = await api.turn_events(sid, accepted["turn_id"])
                assert "tool.completed" in types_of(events)
                assert log_lines(http_log) == ["add 1 2"]
        assert any("MCP server remote ready" in line for line in logged)
        assert not [line for line in logged if "qk-secret" in line or "urlpw" in line]
        # and an error that quotes the URL is scrubbed of them
        assert (
            redact(url) == f"http://mcpuser:[redacted]@127.0.0.1:{port}/mcp?api_key=[redacted]&x=1"
        )
    finally:
        proc.kill()
        await proc.wait()


async def test_no_orphan_after_a_daemon_kill_9_and_restart(
    fake: FakeProviderServer,
    metis_home: Path,
    start_daemon: Callable[..., Any],
    tmp_path: Path,
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("METIS_TEST_DEMO_TOKEN", "t")
    metis_home.mkdir(parents=True, exist_ok=True)
    (metis_home / "models.yaml").write_text(models_yaml(fake))
    (metis_home / "config.yaml").write_text(mcp_config(tmp_path / "demo.log"))
    port = free_port()
    with (tmp_path / "serve.log").open("wb") as out:
        proc = await spawn_serve(metis_home, port, output=out)
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as http:
            await wait_until_serving(http, "/health")
            api = Api(http, home_headers(metis_home))
            for _ in range(300):
                if (await mcp_status(api))["demo"]["state"] == "ready":
                    break
                await asyncio.sleep(0.05)
            sid = await session_on(api, workspace, "anthropic")
            fake.enqueue(
                "anthropic",
                FakeReply.call("mcp__demo__whoami", {}),
                FakeReply.call("mcp__demo__spawn", {}),
                FakeReply.say("ok"),
            )
            _accepted, terminal = await api.run_turn(sid, "spawn")
            assert terminal["type"] == "turn.completed", terminal
            server_pid, child_pid = (
                int(m["content"][0]["content"][0]["text"])
                for m in (await api.messages(sid))["messages"]
                if m["role"] == "tool"
            )
        assert live_group_members(server_pid)
        ledger = metis_home / "run" / "shell-groups"
        assert (ledger / str(server_pid)).exists()  # noted like a shell group
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # the sleep the server started is still there (the server may have exited on its stdin's EOF)
    assert os.path.exists(f"/proc/{child_pid}")
    d = await start_daemon()
    try:
        assert not live_group_members(server_pid)  # reaped before serving
        assert not (ledger / str(server_pid)).exists()
        await d.core.mcp.wait_ready(30)
        new_pid = d.core.mcp.servers["demo"].pid
        assert new_pid is not None and new_pid != server_pid
    finally:
        await d.stop()
    # a clean stop leaves nothing either
    assert await gone(new_pid) and list(ledger.iterdir()) == []
