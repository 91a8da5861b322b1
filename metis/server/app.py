"""The aiohttp application: routes from the route tables, guards, lifecycle hooks."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from aiohttp import web

from metis.aap import app as aap  # the one place the metis surface knows AAP: its mount
from metis.config import Settings
from metis.core.application import Application
from metis.dashboard import routes as dashboard
from metis.http.routes import RouteSpec, add_routes, unique_specs
from metis.server import ws
from metis.server.auth import SESSIONS_FILE, ServerAuth
from metis.server.middleware import SELF_GUARDED_KEY, add_security_headers, metis_middleware
from metis.server.openapi import build_openapi
from metis.server.routes import export, login, mcp, routing, sessions, system, turns
from metis.server.state import STATE_KEY, ServerState
from metis.version import metis_version

log = logging.getLogger(__name__)

ROUTE_TABLES = (
    sessions.routes,
    export.routes,
    turns.routes,
    routing.routes,
    system.routes,
    mcp.routes,
    login.routes,
    dashboard.routes,
    ws.routes,
)


def all_specs() -> list[RouteSpec]:
    return [spec for table in ROUTE_TABLES for spec in table.specs]


def create_app(state: ServerState) -> web.Application:
    limits = state.settings.limits
    app = web.Application(middlewares=[metis_middleware], client_max_size=limits.max_request_bytes)
    app[STATE_KEY] = state
    specs = add_routes(app, all_specs())
    # AAP v1 at /aap/v1 and v3 at /aap (own pipeline, metis/aap/app.py)
    aap_state = aap.mount(app, state)
    app[SELF_GUARDED_KEY] = tuple(
        resource.get_info()["app"]
        for resource in app.router.resources()
        if isinstance(resource, web.PrefixedSubAppResource)
    )
    # The metis surface takes the same key, loaded once by the AAP mount (metis/http/apikey.py).
    state.auth = ServerAuth(
        aap_state.api_key,
        state.settings.file.auth,
        sessions_file=state.settings.home / SESSIONS_FILE,  # browser sessions survive a restart
    )
    if not state.auth.required:
        app.on_startup.append(_warn_unauthenticated)
    route_specs = unique_specs(specs)
    document: Callable[[], dict[str, object]] = functools.cache(
        lambda: openapi_document(route_specs, metis_version(), state.settings)
    )
    app[system.OPENAPI_KEY] = document
    app.on_response_prepare.append(add_security_headers)
    return app


def openapi_document(specs: list[RouteSpec], version: str, settings: Settings) -> dict[str, object]:
    """The daemon's `/openapi.json`: the metis operations, then the mounted AAP ones, with the
    limits `settings` sets."""
    return aap.extend_openapi(build_openapi(specs, version, settings), settings)


async def _warn_unauthenticated(_app: web.Application) -> None:
    log.warning(
        "auth.required is false: the metis REST API and WebSocket accept requests without "
        "the API key; any local process can drive this daemon (AAP still requires the key)"
    )


def new_state(settings: Settings, app: Application | None = None) -> ServerState:
    return ServerState(
        settings=settings,
        app=app or Application.build(settings),
        host=settings.host,
        port=settings.port,
    )
