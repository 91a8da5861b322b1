"""The aiohttp application: routes from the route tables, guards, lifecycle hooks."""

from __future__ import annotations

import logging

from aiohttp import web

from metis.aap import app as aap
from metis.aap import openapi as aap_openapi
from metis.core.runtime import Core
from metis.dashboard import routes as dashboard
from metis.server import titles, ws
from metis.server.auth import SESSIONS_FILE, ServerAuth
from metis.server.http import ROUTE_SPEC_KEY, RouteSpec
from metis.server.middleware import add_security_headers, metis_middleware
from metis.server.openapi import build_openapi
from metis.server.routes import login, routing, sessions, system, turns
from metis.server.state import STATE_KEY, ServerState

log = logging.getLogger(__name__)

ROUTE_TABLES = (
    sessions.routes,
    turns.routes,
    routing.routes,
    system.routes,
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
    specs: dict[object, RouteSpec] = {}
    for spec in all_specs():
        specs[app.router.add_route(spec.method, spec.path, spec.handler)] = spec
    app[ROUTE_SPEC_KEY] = specs
    # AAP v1 at /aap/v1 and v3 at /aap (own pipeline, metis/aap/app.py)
    aap_state = aap.mount(app, state)
    state.core.store.register(titles.extension())  # set session titles (metis/server/titles.py)
    # The metis surface takes the same key, loaded once by the AAP mount (metis/aap/auth.py).
    state.auth = ServerAuth(
        aap_state.api_key,
        state.settings.file.auth,
        sessions_file=state.settings.home / SESSIONS_FILE,  # browser sessions survive a restart
    )
    if not state.auth.required:
        app.on_startup.append(_warn_unauthenticated)
    app[system.OPENAPI_KEY] = aap_openapi.extend(
        build_openapi(list(specs.values()), system.metis_version())
    )
    app.on_response_prepare.append(add_security_headers)
    return app


async def _warn_unauthenticated(_app: web.Application) -> None:
    log.warning(
        "auth.required is false: the metis REST API and WebSocket accept requests without "
        "the API key; any local process can drive this daemon (AAP still requires the key)"
    )


def new_state(settings, core: Core | None = None) -> ServerState:  # type: ignore[no-untyped-def]
    return ServerState(
        settings=settings, core=core or Core(settings), host=settings.host, port=settings.port
    )
