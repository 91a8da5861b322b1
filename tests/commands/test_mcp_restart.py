"""`metis mcp restart` against a real daemon whose MCP servers change under it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from metis.testing.fake_provider import FakeProviderServer
from tests.api import Api, api_session
from tests.cli import metis
from tests.core.tools.mcp_servers import python_server
from tests.e2e.test_provider_turns import models_yaml


@pytest.mark.usefixtures("brief_mcp_exit_grace")
async def test_a_restart_whose_server_a_reload_removes_meanwhile_says_so_without_a_traceback(
    fake: FakeProviderServer, start_daemon: Callable[..., Any], metis_home: Path
) -> None:
    # it followed GET /mcp with `next()` over the servers and died of a StopIteration
    config = "mcp:\n  servers:\n    sleepy: {}\n".format(
        python_server("-c", "import time; time.sleep(60)", connect_timeout_seconds=60)
    )
    d = await start_daemon(config=config, models=models_yaml(fake))
    restart = asyncio.create_task(
        metis("mcp", "restart", "sleepy", "--wait", "20", "--url", d.base_url)
    )
    server = d.core.mcp.servers["sleepy"]
    for _ in range(200):
        if server.restarts:
            break
        await asyncio.sleep(0.05)
    (metis_home / "config.yaml").write_text("mcp:\n  servers: {}\n")
    async with api_session(d) as http:
        code, body = await Api(http).call("POST", "/mcp/reload")
        assert code == 200 and body["applied"]["removed"] == ["sleepy"], body
    code, out, err = await restart
    assert code == 1 and out == "", (out, err)
    assert "Traceback" not in err
    assert err == (
        "metis: MCP server 'sleepy' is no longer configured: config.yaml was applied without "
        "it while it restarted\n"
    )
