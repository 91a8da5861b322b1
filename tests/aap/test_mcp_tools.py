"""An MCP server's tools through AAP: `/meta` lists them with the agent's tools, a client
enables and trusts one for its session, and a turn uses it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.testing import FakeProviderServer
from metis.testing.fake_provider import FakeReply
from tests.aap.conftest import fake_models, roots
from tests.core.tools.mcp_servers import DEMO, python_server

CONFIG = f"""
mcp:
  servers:
    demo: {python_server(DEMO)}
"""


@pytest.mark.parametrize("stream", ["none", "message"])
async def test_meta_lists_mcp_tools_and_a_turn_uses_one(
    api_key: str,
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    client_for: Callable[..., Any],
    workspace: Path,
    stream: str,
) -> None:
    d = await start_daemon(config=CONFIG, models=fake_models(fake), **roots(workspace))
    await d.core.mcp.wait_ready(30)
    aap = await client_for(d)
    for client, key in ((aap, "parameters"), (aap.v1, "inputSchema")):
        meta = await client.request("GET", "/meta", auth=False)
        [agent] = meta.body["agents"]
        tools = {t["name"]: t for t in agent["tools"]}
        assert {"shell", "mcp__demo__add", "mcp__demo__slow"} <= set(tools)
        add = tools["mcp__demo__add"]
        assert add["title"] == "demo: add" and add["description"].startswith("Add two integers.")
        assert add[key]["required"] == ["a"]
    sid = await aap.create(tools=[{"name": "mcp__demo__add", "trust": True}])
    fake.enqueue("anthropic", FakeReply.call("mcp__demo__add", {"a": 20, "b": 22}))
    fake.enqueue("anthropic", FakeReply.say("It is 42."))
    reply = await aap.say(sid, "add them", stream=stream)
    assert reply.status == 200 and reply.stop == "end_turn"
    [call] = reply.tool_calls()
    assert call["name"] == "mcp__demo__add"
    [result] = reply.tool_results()
    content = result["content"]
    text = content if isinstance(content, str) else content[0]["text"]
    assert text == "42"
    assert reply.text().endswith("It is 42.")
    # the session offered only what the client enabled
    offered = [t["name"] for t in fake.requests_for("anthropic")[0].body["tools"]]
    assert offered == ["mcp__demo__add"]


async def test_an_untrusted_mcp_tool_is_parked_for_the_client(
    api_key: str,
    fake: FakeProviderServer,
    start_daemon: Callable[..., Any],
    client_for: Callable[..., Any],
    workspace: Path,
) -> None:
    d = await start_daemon(config=CONFIG, models=fake_models(fake), **roots(workspace))
    await d.core.mcp.wait_ready(30)
    aap = await client_for(d)
    sid = await aap.create(tools=[{"name": "mcp__demo__whoami"}])
    fake.enqueue("anthropic", FakeReply.call("mcp__demo__whoami", {}))
    reply = await aap.say(sid, "who are you")
    assert reply.status == 200 and reply.stop == "tool_use"  # waits for the client's answer
