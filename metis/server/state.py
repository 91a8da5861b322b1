"""Per-app server state: the application it fronts, the bound address and the shutdown flag."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from metis.config import Settings
from metis.core.application import Application
from metis.server.auth import ServerAuth


@dataclass
class ServerState:
    settings: Settings
    app: Application
    host: str
    port: int
    shutting_down: bool = False
    # set by `create_app` (the key is the AAP façade's, loaded once); None refuses every request
    auth: ServerAuth | None = None

    @property
    def base_host(self) -> str:
        """The bound host as it appears in URLs (IPv6 in brackets)."""
        return f"[{self.host}]" if ":" in self.host else self.host


STATE_KEY = web.AppKey("metis.state", ServerState)
