"""`GET /mcp`: the configured MCP servers, their state and their tools; `POST
/mcp/{name}/restart`: one of them connected again now, with its entry as config.yaml has it;
`POST /mcp/reload`: every change of config.yaml's `mcp` section applied.

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
    description: str  # the server's, as the model reads it ("" when it gave none)


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


class McpChanges(DataModel):
    """The servers a reload found added to, changed in or removed from config.yaml, by name."""

    added: list[str]
    changed: list[str]
    removed: list[str]


class McpReloadResponse(McpResponse):
    applied: McpChanges


@routes.route("GET", "/mcp", response_model=McpResponse)
async def list_mcp(request: web.Request) -> web.Response:
    """The MCP servers of `config.yaml` (`mcp.servers`), in configuration order."""
    return json_response(request.app[STATE_KEY].app.mcp.status())


@routes.route(
    "POST",
    "/mcp/{name}/restart",
    status=202,
    response_model=McpServerItem,
    errors=("mcp_server_not_found", "mcp_server_disabled", "config_invalid"),
)
async def restart_mcp_server(request: web.Request) -> web.Response:
    """End the server's connection (its process, for stdio) and connect again at once with its
    entry as config.yaml has it now, the restart backoff starting over: for a server fixed
    since it failed (the server or its entry), or stuck starting. A call in flight on it fails.
    A server added to config.yaml since start-up is started; one it disables or no longer has
    is stopped, its tools withdrawn, and refused (409, 404). Answered at once with the server
    as it is then (`restarting`); `GET /mcp` follows it."""
    name = request.match_info["name"]
    return json_response(await request.app[STATE_KEY].app.mcp.restart(name), status=202)


@routes.route("POST", "/mcp/reload", response_model=McpReloadResponse, errors=("config_invalid",))
async def reload_mcp_servers(request: web.Request) -> web.Response:
    """Apply config.yaml's `mcp` section as it is now: a server whose entry changed is
    restarted with it, an added one started, a disabled or removed one stopped and its tools
    withdrawn; the others go on untouched. Answers with the servers as `GET /mcp` shows them
    then (a restarted one `restarting`) and what it `applied`: the servers added, changed and
    removed."""
    return json_response(await request.app[STATE_KEY].app.mcp.reload())
