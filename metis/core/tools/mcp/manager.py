"""All configured MCP servers: started in the background once the daemon listens, stopped
with it, their tools kept in the tool registry under the source `mcp:<server>`.

Two servers may offer tools under one name (`demo`'s `x__add` and `demo__x`'s `add` are both
`mcp__demo__x__add`). The server listed first in config.yaml holds it, and the other says in
its status that it skipped its tool: whichever finishes starting first, and again after any
restart or reload. So every registration registers all the servers' tools again, in the
file's order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metis.core.canonical.redaction import redact
from metis.core.errors import ConfigError, McpConfigInvalid, McpServerDisabled, McpServerNotFound
from metis.core.tools.groups import ProcessGroupLedger
from metis.core.tools.mcp.settings import McpServerSettings, McpSettings
from metis.core.tools.registry import ToolRegistry

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
        current: Callable[[], McpSettings] | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self._ledger = ledger
        self._log_dir = log_dir
        self._current = current
        self._applying = asyncio.Lock()  # one restart or reload at a time: each reads the file
        self._started = False
        self.servers: dict[str, McpServer] = {}
        for name, server in settings.servers.items():
            self._add(name, server, settings)

    def _add(self, name: str, entry: McpServerSettings, section: McpSettings) -> McpServer:
        # the MCP SDK takes ~1 s and tens of MiB to import: only once a server is configured
        from metis.core.tools.mcp.server import McpServer

        server = McpServer(
            name,
            entry,
            section,
            on_tools=self._tools_listed,
            ledger=self._ledger,
            log_dir=self._log_dir,
        )
        self.servers[name] = server
        return server

    def _tools_listed(self, server: McpServer) -> None:
        """A server listed its tools (or withdrew them): register every server's again."""
        self._register_all()

    def _register_all(self) -> None:
        """Register the tools of every server in config.yaml's order, each server told which of
        its names an earlier server or a builtin holds (`settle`). All are taken out first: a
        name a later server holds goes to an earlier one that offers it now."""
        for server in self.servers.values():
            self.registry.replace_source(_source(server), [])
        holders: dict[str, str] = {}
        for server in self.servers.values():
            entries = [entry for _, entry in server.offered]
            refused = self.registry.replace_source(_source(server), entries)
            held = {name: holders.get(name, "a builtin") for name in refused}
            for name in {entry.name for entry in entries} - set(refused):
                holders[name] = f'MCP server "{server.name}", listed before it in config.yaml'
            server.settle(held)

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

    async def restart(self, name: str) -> dict[str, Any]:
        """Restart one server now (see `McpServer.restart`) with its entry as config.yaml has
        it now (`current`), so that a person who fixed the entry sees the fix applied; its
        status once asked. A server added to the file since start-up is started; one the file
        disables, or no longer has, is stopped and its tools withdrawn (then refused as
        disabled, or not found). A file that has become invalid changes nothing (ConfigError).
        """
        async with self._applying:
            section = self._current_section()
            server = await self._apply(name, section)
            if server is None:
                raise McpServerNotFound(name)
            if not server.settings.enabled:
                raise McpServerDisabled(name)
            server.restart()
            return server.status()

    async def reload(self) -> dict[str, Any]:
        """Apply config.yaml's `mcp` section as it is now to every server it changes: a server
        whose entry (or the section's backoff settings) changed is restarted with it, an added
        one started, a disabled or removed one stopped and its tools withdrawn; the others go
        on as they are, their connections untouched. `GET /mcp`'s object afterwards, with
        `applied`: the names of the servers added, changed and removed (what a person asked
        for the reload to do, which the servers' states alone do not tell). A file that has
        become invalid changes nothing (ConfigError)."""
        applied: dict[str, list[str]] = {"added": [], "changed": [], "removed": []}
        async with self._applying:
            section = self._current_section()
            shared = section.model_dump(exclude={"servers"})
            for name in dict.fromkeys([*self.servers, *section.servers]):
                known = self.servers.get(name)
                if (
                    known is not None
                    and known.settings == section.servers.get(name)
                    and known.section.model_dump(exclude={"servers"}) == shared
                ):
                    continue
                kind = (
                    "added"
                    if known is None
                    else "removed"
                    if name not in section.servers
                    else "changed"
                )
                applied[kind].append(name)
                server = await self._apply(name, section)
                if server is not None and server.settings.enabled:
                    server.restart()
            self.settings = section
            self._follow_file_order(section)
            return {**self.status(), "applied": applied}

    def _follow_file_order(self, section: McpSettings) -> None:
        """Keep the servers in the order `section` (config.yaml now) lists them, which decides
        who holds a tool name two servers offer: once it changed, the tools are registered
        again in the new order."""
        ordered = [n for n in section.servers if n in self.servers]
        servers = {n: self.servers[n] for n in [*ordered, *self.servers]}
        if list(servers) != list(self.servers):
            self.servers = servers
            self._register_all()

    async def _apply(self, name: str, section: McpSettings) -> McpServer | None:
        """Give server `name` its entry as `section` (config.yaml now) has it: added if new,
        stopped with its tools withdrawn if disabled; None when the section no longer has it
        (stopped, withdrawn, forgotten). Servers stay in the file's order."""
        entry = section.servers.get(name)
        server = self.servers.get(name)
        if entry is None:
            if server is not None:
                await server.withdraw()
                del self.servers[name]
                log.info("MCP server %s: no longer in config.yaml; stopped", name)
            return None
        if server is None:
            server = self._add(name, entry, section)
            self._follow_file_order(section)
        server.reconfigure(entry, section)
        if not entry.enabled and server.state != "disabled":
            await server.withdraw()
            log.info("MCP server %s: disabled in config.yaml; stopped", name)
        return server

    def _current_section(self) -> McpSettings:
        if self._current is None:
            return self.settings
        try:
            return self._current()
        except ConfigError as exc:
            raise McpConfigInvalid(redact(exc.message, limit=1000)) from None

    def status(self) -> dict[str, Any]:
        """`GET /mcp`'s object: every configured server, enabled or not."""
        return {"servers": [s.status() for s in self.servers.values()]}


def _source(server: McpServer) -> str:
    """A server's source in the tool registry."""
    return f"mcp:{server.name}"
