"""MCP servers run by a real daemon (real subprocesses written with the SDK or by hand, the
fake provider over loopback): how a server's odd answers reach the person and the model."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from metis.server.runner import Daemon
from metis.testing.fake_provider import FakeProviderServer, FakeReply
from metis.testing.serving import free_port
from tests.api import Api, api_session
from tests.core.tools.mcp_servers import GROWING, MALFORMED, TELLTALE, python_server
from tests.e2e.test_mcp import AUTO, mcp_status
from tests.e2e.test_provider_turns import models_yaml, session_on, types_of


def servers_config(**servers: str) -> str:
    entries = "".join(f"    {name}: {entry}\n" for name, entry in servers.items())
    return f"tools:\n  confirmation: {{default: {AUTO}}}\nmcp:\n  servers:\n{entries}"


async def started_with(
    start_daemon: Callable[..., Any], fake: FakeProviderServer, **servers: str
) -> Daemon:
    """A daemon whose config.yaml runs `servers` (their entries), once each has settled."""
    d: Daemon = await start_daemon(config=servers_config(**servers), models=models_yaml(fake))
    await d.core.mcp.wait_ready(30)
    return d


async def call_in_a_turn(
    api: Api, fake: FakeProviderServer, sid: str, tool: str
) -> list[dict[str, Any]]:
    """A turn of session `sid` in which the model calls `tool` (no arguments), then answers; it
    must complete. Its events."""
    fake.enqueue("anthropic", FakeReply.call(tool, {}), FakeReply.say("ok"))
    accepted, terminal = await api.run_turn(sid, f"use {tool}")
    assert terminal["type"] == "turn.completed", terminal
    events: list[dict[str, Any]] = await api.turn_events(sid, accepted["turn_id"])
    return events


async def test_a_tool_whose_input_schema_lacks_type_object_is_skipped_not_the_server(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    # `inputSchema: {}` (a tool without arguments, written loosely) used to fail the SDK's
    # reading of the whole listing: no tool of the server was offered, and it restarted for ever
    d = await started_with(
        start_daemon, fake, loose=python_server(MALFORMED, "no-type", policy="auto")
    )
    async with api_session(d) as http:
        api = Api(http)
        loose = (await mcp_status(api))["loose"]
        assert loose["state"] == "ready" and loose["restarts"] == 0, loose
        assert [t["name"] for t in loose["tools"]] == ["mcp__loose__good"]
        assert loose["last_error"] == (
            "tool 'bare' (#1) skipped: not valid MCP (inputSchema.type: Field required)"
        )
        sid = await session_on(api, workspace, "anthropic")
        events = await call_in_a_turn(api, fake, sid, "mcp__loose__good")
        assert "tool.completed" in types_of(events)


async def test_secrets_a_server_repeats_in_its_failures_are_scrubbed_from_what_the_model_sees(
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the event was scrubbed, but the tool result stored and sent to the provider was not
    monkeypatch.setenv("METIS_TEST_TELLTALE", "tt-5ecret-from-env-77")
    env = {"FROM_ENV": "${METIS_TEST_TELLTALE}", "DB_PASSWORD": "pw-literal-4242"}
    d = await started_with(start_daemon, fake, tell=python_server(TELLTALE, env=env, policy="auto"))
    async with api_session(d) as http:
        api = Api(http)
        sid = await session_on(api, workspace, "anthropic")
        for tool in ("error_result", "error_answer"):
            for name in ("FROM_ENV", "DB_PASSWORD"):
                fake.enqueue(
                    "anthropic",
                    FakeReply.call(f"mcp__tell__{tool}", {"name": name}),
                    FakeReply.say("noted"),
                )
                accepted, terminal = await api.run_turn(sid, f"{tool} {name}")
                assert terminal["type"] == "turn.completed", terminal
                failed = next(
                    e
                    for e in await api.turn_events(sid, accepted["turn_id"])
                    if e["type"] == "tool.failed"
                )
                assert "cannot connect with [redacted]" in failed["payload"]["message"]
        stored = json.dumps((await api.messages(sid))["messages"])
        sent = json.dumps([r.body for r in fake.requests_for("anthropic")])
    for seen in (stored, sent):
        assert seen.count("cannot connect with [redacted]") >= 4
        assert "tt-5ecret-from-env-77" not in seen and "pw-literal-4242" not in seen


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` served on a loopback port for the test's length; its `/mcp` url."""
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def answering(status: int) -> AsyncIterator[str]:
    """An HTTP server on loopback that answers every request with `status`; its MCP url."""

    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=status, text="no")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    async with serving(app) as url:
        yield url


async def test_an_http_server_that_is_refused_or_unreachable_says_so_by_status_or_address(
    fake: FakeProviderServer, start_daemon: Callable[..., Any]
) -> None:
    # the SDK made a 401 `MCP error -32603: Server returned an error response`, and a closed
    # port `ConnectError: All connection attempts failed`: neither named the cause
    closed = free_port()
    async with answering(401) as unauthorized, answering(404) as misplaced:
        config = servers_config(
            locked=json.dumps({"url": unauthorized, "headers": {"Authorization": "Bearer x"}}),
            moved=json.dumps({"url": misplaced}),
            away=json.dumps({"url": f"http://127.0.0.1:{closed}/mcp"}),
        )
        d = await start_daemon(config=config, models=models_yaml(fake))
        async with api_session(d) as http:
            api = Api(http)
            servers: dict[str, Any] = {}

            async def all_failed() -> bool:
                servers.update(await mcp_status(api))
                return all(s["last_error"] for s in servers.values())

            for _ in range(200):
                if await all_failed():
                    break
                await asyncio.sleep(0.05)
    assert servers["locked"]["last_error"] == (
        "the server refused the request: HTTP 401 Unauthorized "
        "(check the credentials in its headers or url)"
    )
    assert servers["moved"]["last_error"] == (
        "the server refused the request: HTTP 404 Not Found (check the url's path)"
    )
    assert (
        servers["away"]["last_error"]
        == f"cannot connect to 127.0.0.1:{closed} (connection refused)"
    )


async def test_a_tool_with_an_empty_name_is_skipped_not_offered_as_the_bare_prefix(
    fake: FakeProviderServer, start_daemon: Callable[..., Any]
) -> None:
    # it was offered to the model as `mcp__blank__`, a name that says nothing
    d = await started_with(start_daemon, fake, blank=python_server(MALFORMED, "blank-name"))
    async with api_session(d) as http:
        blank = (await mcp_status(Api(http)))["blank"]
    assert [t["name"] for t in blank["tools"]] == ["mcp__blank__good"]
    assert blank["last_error"] == "a tool with an empty name skipped"
    assert "mcp__blank__" not in d.core.tool_registry.offered_names(None)


@contextlib.asynccontextmanager
async def gatekeeper(call_status: int, refused: str = "tools/call") -> AsyncIterator[str]:
    """A Streamable HTTP MCP server on loopback answering in JSON (no event stream) that
    initializes and lists its tool `guarded`, then refuses every request of method `refused`
    with `call_status`, as a server whose token expired mid-session does; its MCP url."""

    async def post(request: web.Request) -> web.Response:
        message = await request.json()
        method = message.get("method")
        if "id" not in message:
            return web.Response(status=202)
        if method == refused:
            return web.Response(status=call_status, text="refused")
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "gatekeeper", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": [{"name": "guarded", "inputSchema": {"type": "object"}}]}
        else:
            result = {}
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})

    async def not_offered(request: web.Request) -> web.Response:
        return web.Response(status=405)

    app = web.Application()
    app.router.add_post("/mcp", post)
    app.router.add_route("*", "/mcp", not_offered)
    async with serving(app) as url:
        yield url


async def test_a_call_an_http_server_refuses_says_the_status_not_the_sdks_stand_in(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    # it read `MCP server "gate": Server returned an error response`, which hides an expired token
    async with gatekeeper(401) as url:
        d = await started_with(start_daemon, fake, gate=json.dumps({"url": url, "policy": "auto"}))
        async with api_session(d) as http:
            api = Api(http)
            sid = await session_on(api, workspace, "anthropic")
            events = await call_in_a_turn(api, fake, sid, "mcp__gate__guarded")
            failed = next(e for e in events if e["type"] == "tool.failed")
    assert failed["payload"]["message"] == (
        'MCP server "gate" refused the call: HTTP 401 Unauthorized '
        "(check the credentials in its headers or url)"
    )


async def test_a_server_whose_tools_change_is_listed_again_and_offers_its_new_tools(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    # `notifications/tools/list_changed` was ignored: the new tool was never offered, and the
    # withdrawn one stayed offered until the server restarted
    d = await started_with(start_daemon, fake, growing=python_server(GROWING, policy="auto"))
    offered = d.core.tool_registry.offered_names
    assert "mcp__growing__grow" in offered(None)
    async with api_session(d) as http:
        api = Api(http)
        sid = await session_on(api, workspace, "anthropic")
        await call_in_a_turn(api, fake, sid, "mcp__growing__grow")
        for _ in range(200):
            if "mcp__growing__grown" in offered(None):
                break
            await asyncio.sleep(0.05)
        assert "mcp__growing__grown" in offered(None) and "mcp__growing__grow" not in offered(None)
        growing = (await mcp_status(api))["growing"]
        assert [t["name"] for t in growing["tools"]] == ["mcp__growing__grown"]
        assert growing["state"] == "ready" and growing["restarts"] == 0
        events = await call_in_a_turn(api, fake, sid, "mcp__growing__grown")
        assert "tool.completed" in types_of(events)


async def test_a_result_is_never_checked_against_the_tools_output_schema(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    # the SDK checked it with a backtracking regex on the event loop: a result a server chose
    # held the whole daemon for minutes, and one that did not match lost its text to an error
    d = await started_with(
        start_daemon, fake, shaped=python_server(MALFORMED, "output-schema", policy="auto")
    )
    async with api_session(d) as http:
        api = Api(http)
        sid = await session_on(api, workspace, "anthropic")
        events = await call_in_a_turn(api, fake, sid, "mcp__shaped__good")
        assert "tool.completed" in types_of(events)
        results = [m for m in (await api.messages(sid))["messages"] if m["role"] == "tool"]
        assert results[0]["content"][0]["content"] == [{"type": "text", "text": "good ran"}]


async def test_a_tool_description_past_the_cap_is_cut_and_said_not_sent_whole_every_call(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    # a 208,000-character description went with every model call: ~52,000 tokens each
    d = await started_with(
        start_daemon, fake, wordy=python_server(MALFORMED, "long-description", policy="auto")
    )
    async with api_session(d) as http:
        api = Api(http)
        wordy = (await mcp_status(api))["wordy"]
        assert wordy["state"] == "ready", wordy
        assert wordy["last_error"] == (
            "tool 'good': its description cut to 8,000 of its 208,000 characters"
        )
        sid = await session_on(api, workspace, "anthropic")
        fake.enqueue("anthropic", FakeReply.say("ok"))
        _, terminal = await api.run_turn(sid, "hi")
        assert terminal["type"] == "turn.completed", terminal
    offered = next(
        t
        for t in fake.requests_for("anthropic")[-1].body["tools"]
        if t["name"] == "mcp__wordy__good"
    )
    assert offered["description"].startswith("Use it well. ")
    assert len(offered["description"]) < 8_100


async def test_a_restart_ends_a_listing_of_changed_tools_the_server_never_answers(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    # the listing held the owner task until connect_timeout_seconds: a restart or a stop
    # asked for meanwhile waited that long
    entry = python_server(GROWING, "stalls", policy="auto", connect_timeout_seconds=120)
    d = await started_with(start_daemon, fake, growing=entry)
    server = d.core.mcp.servers["growing"]
    async with api_session(d) as http:
        api = Api(http)
        sid = await session_on(api, workspace, "anthropic")
        await call_in_a_turn(api, fake, sid, "mcp__growing__grow")
        await asyncio.sleep(0.5)  # the listing it asked for goes unanswered
        first = server.pid
        code, _ = await api.call("POST", "/mcp/growing/restart")
        assert code == 202
        for _ in range(400):  # well inside the 120 s the listing was allowed
            if server.state == "ready" and server.pid not in (None, first):
                break
            await asyncio.sleep(0.05)
        assert server.state == "ready" and server.pid not in (None, first), server.status()
        assert [t["name"] for t in (await mcp_status(api))["growing"]["tools"]] == [
            "mcp__growing__grow"
        ]


async def test_a_ping_an_http_server_refuses_says_the_status(
    fake: FakeProviderServer, start_daemon: Callable[..., Any]
) -> None:
    # it read `ping failed: MCP error -32603: Server returned an error response`
    async with gatekeeper(403, refused="ping") as url:
        config = servers_config(gate=json.dumps({"url": url})) + "  ping_interval_seconds: 0.2\n"
        d = await start_daemon(config=config, models=models_yaml(fake))
        server = d.core.mcp.servers["gate"]
        for _ in range(200):
            if server.last_error is not None:
                break
            await asyncio.sleep(0.05)
    assert server.last_error == (
        "ping refused: HTTP 403 Forbidden (check the credentials in its headers or url)"
    )
