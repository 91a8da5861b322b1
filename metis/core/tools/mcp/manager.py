"""All configured MCP servers: started in the background once the daemon listens, stopped
with it, their tools kept in the tool registry under the source `mcp:<server>`."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metis.core.errors import McpServerNotFound
from metis.core.tools.groups import ProcessGroupLedger
from metis.core.tools.mcp.settings import McpSettings
from metis.core.tools.registry import RegisteredTool, ToolRegistry

if TYPE_CHECKING:
    from metis.core.tools.mcp.server import McpServer

log = logging.getLogger(__name__)


class McpManager:
    """Every configured MCP server of the daemon; the MCP SDK is imported only when at least one
    server is configured."""

    def __init__(
        self,
        settings: McpSettings,
        registry: ToolRegistry,
        *,
        ledger: ProcessGroupLedger | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self._started = False
        self.servers: dict[str, McpServer] = {}
        if not settings.servers:
            return  # the MCP SDK takes ~1 s and tens of MiB to import: only for a server
        from metis.core.tools.mcp.server import McpServer

        self.servers = {
            name: McpServer(
                name,
                server,
                settings,
                on_tools=self._tools_listed,
                ledger=ledger,
                log_dir=log_dir,
            )
            for name, server in settings.servers.items()
        }

    def _tools_listed(self, server: McpServer, entries: list[RegisteredTool]) -> list[str]:
        refused = self.registry.replace_source(f"mcp:{server.name}", entries)
        if refused:  # names a builtin or another server holds: the server says which
            log.warning("MCP server %s: tools not registered: %s", server.name, ", ".join(refused))
        return refused

    def start(self) -> None:
        """Start every enabled server in the background (returns at once)."""
        if self._started:
            return
        self._started = True
        for server in self.servers.values():
            server.start()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Tests and tools: wait until every enabled server is ready (or the timeout)."""
        await asyncio.gather(
            *(s.wait_ready(timeout) for s in self.servers.values() if s.settings.enabled)
        )

    async def aclose(self) -> None:
        """Stop every server and wait for its processes to end (graceful shutdown)."""
        await asyncio.gather(*(s.stop() for s in self.servers.values()))

    def kill(self) -> None:
        """Past the shutdown grace: kill every server's processes without awaiting."""
        for server in self.servers.values():
            server.kill()

    def restart(self, name: str) -> dict[str, Any]:
        """Restart one server now (see `McpServer.restart`); its status once asked."""
        server = self.servers.get(name)
        if server is None:
            raise McpServerNotFound(name)
        server.restart()
        return server.status()

    def status(self) -> dict[str, Any]:
        """`GET /mcp`'s object: every configured server, enabled or not."""
        return {"servers": [s.status() for s in self.servers.values()]}
