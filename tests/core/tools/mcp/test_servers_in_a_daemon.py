"""MCP servers run by a real daemon (real subprocesses written with the SDK or by hand, the
fake provider over loopback): how a server's odd answers reach the person and the model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from metis.testing.fake_provider import FakeProviderServer, FakeReply
from tests.api import Api, api_session
from tests.core.tools.mcp_servers import MALFORMED, python_server
from tests.e2e.test_mcp import AUTO, mcp_status
from tests.e2e.test_provider_turns import models_yaml, session_on, types_of


def servers_config(**servers: str) -> str:
    entries = "".join(f"    {name}: {entry}\n" for name, entry in servers.items())
    return f"tools:\n  confirmation: {{default: {AUTO}}}\nmcp:\n  servers:\n{entries}"


async def test_a_tool_whose_input_schema_lacks_type_object_is_skipped_not_the_server(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], workspace: Path
) -> None:
    # `inputSchema: {}` (a tool without arguments, written loosely) used to fail the SDK's
    # reading of the whole listing: no tool of the server was offered, and it restarted for ever
    config = servers_config(loose=python_server(MALFORMED, "no-type", policy="auto"))
    d = await start_daemon(config=config, models=models_yaml(fake))
    await d.core.mcp.wait_ready(30)
    async with api_session(d) as http:
        api = Api(http)
        loose = (await mcp_status(api))["loose"]
        assert loose["state"] == "ready" and loose["restarts"] == 0, loose
        assert [t["name"] for t in loose["tools"]] == ["mcp__loose__good"]
        assert loose["last_error"] == (
            "tool 'bare' (#1) skipped: not valid MCP (inputSchema.type: Field required)"
        )
        sid = await session_on(api, workspace, "anthropic")
        fake.enqueue("anthropic", FakeReply.call("mcp__loose__good", {}), FakeReply.say("done"))
        accepted, terminal = await api.run_turn(sid, "use it")
        assert terminal["type"] == "turn.completed", terminal
        assert "tool.completed" in types_of(await api.turn_events(sid, accepted["turn_id"]))
