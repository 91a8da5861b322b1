"""`GET /mcp`: the configured MCP servers, their state and their tools.

Secrets stay out: environment variables and headers are listed by name only.
"""

from typing import Literal

from aiohttp import web

from metis.core.datamodel import DataModel
from metis.server.http import RouteTable, json_response
from metis.server.state import STATE_KEY

routes = RouteTable()


class McpToolItem(DataModel):
    name: str  # as offered to the model: mcp__<server>__<tool>
    remote_name: str  # the server's own name of the tool
    policy: Literal["auto", "prompt", "prompt_once", "deny"]


class McpServerItem(DataModel):
    name: str
    transport: Literal["stdio", "http"]
    enabled: bool
    state: Literal["starting", "ready", "restarting", "stopped", "disabled"]
    command: str | None
    args: list[str]
    url: str | None
    env: list[str]  # names only
    headers: list[str]  # names only
    policy: Literal["auto", "prompt", "prompt_once", "deny"]
    tools: list[McpToolItem]
    restarts: int
    last_error: str | None


class McpResponse(DataModel):
    servers: list[McpServerItem]


@routes.route("GET", "/mcp", response_model=McpResponse)
async def list_mcp(request: web.Request) -> web.Response:
    """The MCP servers of `config.yaml` (`mcp.servers`), in configuration order."""
    return json_response(request.app[STATE_KEY].app.mcp.status())
