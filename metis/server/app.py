"""The aiohttp application: routes from the route tables, guards, lifecycle hooks."""

from __future__ import annotations

from aiohttp import web

from metis.aap import app as aap
from metis.aap import openapi as aap_openapi
from metis.core.runtime import Core
from metis.server import ws
from metis.server.http import ROUTE_SPEC_KEY, RouteSpec
from metis.server.middleware import add_security_headers, metis_middleware
from metis.server.openapi import build_openapi
from metis.server.routes import routing, sessions, system, turns
from metis.server.state import STATE_KEY, ServerState

ROUTE_TABLES = (sessions.routes, turns.routes, routing.routes, system.routes, ws.routes)


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
    aap.mount(app, state)  # AAP v1 at /aap/v1 and v3 at /aap (own pipeline, metis/aap/app.py)
    app[system.OPENAPI_KEY] = aap_openapi.extend(
        build_openapi(list(specs.values()), system.metis_version())
    )
    app.on_response_prepare.append(add_security_headers)
    return app


def new_state(settings, core: Core | None = None) -> ServerState:  # type: ignore[no-untyped-def]
    return ServerState(
        settings=settings, core=core or Core(settings), host=settings.host, port=settings.port
    )
