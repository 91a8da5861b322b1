"""The AAP sub-apps (`/aap/v1` and `/aap`) and their request pipeline.

Order for every request under `/aap`, after the app-wide Host check of the metis middleware:
CORS (a preflight is answered here, without auth) → shutdown → Origin check → auth →
routing errors (404/405, produced here so they carry CORS headers and the AAP envelope) → body
checks → handler → the one AAP error mapper. The metis surface never sees CORS.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from metis.aap import routes_v1, routes_v3
from metis.aap.agents import AgentCatalog
from metis.aap.auth import REALM_HEADER, bearer_token, key_matches, load_api_key
from metis.aap.cors import CorsPolicy
from metis.aap.errors import AapError, error_response, from_domain
from metis.aap.http import AAP_STATE_KEY, BODY_KEY, CORS_KEY, AapRoute, AapRoutes, AapState
from metis.aap.sessions import discard_unfinished_creations
from metis.aap.store import AapStore
from metis.aap.workspaces import Workspaces
from metis.core.canonical import parse_client_json
from metis.core.errors import DomainError

log = logging.getLogger(__name__)

V3_PREFIX = "/aap"
V1_PREFIX = "/aap/v1"
ROUTES_KEY = web.AppKey("metis.aap.routes", dict)
_STATE_CHANGING = frozenset({"POST", "PUT", "DELETE"})


def is_aap_path(path: str) -> bool:
    """Paths the AAP pipeline owns (the metis middleware only checks their Host)."""
    return path == V3_PREFIX or path.startswith(V3_PREFIX + "/")


# ---- the pipeline ----------------------------------------------------------------------------


async def _preflight(request: web.Request) -> web.Response:
    """Catch-all `OPTIONS`: answered by the middleware before it gets here."""
    return web.Response(status=204)


def _route_of(request: web.Request) -> AapRoute | None:
    routes: dict[Any, AapRoute] = request.match_info.current_app.get(ROUTES_KEY, {})
    return routes.get(request.match_info.route)


def _authorize(request: web.Request, state: AapState, route: AapRoute | None) -> None:
    token = bearer_token(request.headers.get("Authorization"))
    if route is not None and route.public and not token:
        return  # /meta is public; only a non-empty wrong key is refused
    if not token or not key_matches(token, state.api_key.value):
        raise AapError(
            "unauthorized",
            "a valid `Authorization: Bearer <key>` is required",
            headers=REALM_HEADER,
        )


def _routing_error(request: web.Request) -> None:
    http_exc = request.match_info.http_exception
    if http_exc is None:
        return
    if isinstance(http_exc, web.HTTPMethodNotAllowed):
        allowed = sorted(set(http_exc.allowed_methods) - {"OPTIONS"})
        if allowed:  # a known path (OPTIONS alone is the preflight catch-all)
            allow = ", ".join([*allowed, "OPTIONS"])
            raise AapError(
                "method_not_allowed",
                f"{request.method} is not allowed on {request.path}",
                {"allowed": [*allowed, "OPTIONS"]},
                headers={"Allow": allow},
            )
    raise AapError("not_found", f"no AAP route for {request.path}", {"path": request.path})


async def _read_json_body(request: web.Request, max_bytes: int) -> None:
    if request.content_type.lower() != "application/json":
        raise AapError(
            "unsupported_media_type",
            "the body must be application/json",
            {"content_type": request.headers.get("Content-Type")},
        )
    too_large = AapError(
        "request_too_large", f"body exceeds {max_bytes} bytes", {"max_bytes": max_bytes}
    )
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large
    data = bytearray()
    while True:
        chunk = await request.content.read(65536)
        if not chunk:
            break
        data += chunk
        if len(data) > max_bytes:
            raise too_large
    try:
        value = parse_client_json(data.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError included
        raise AapError("invalid_json", "the body is not valid JSON") from None
    if not isinstance(value, dict):
        raise AapError("invalid_json", "the body must be a JSON object")
    request[BODY_KEY] = value


async def _pipeline(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    state = request.config_dict[AAP_STATE_KEY]
    origin = request.headers.get("Origin")
    if request.method == "OPTIONS":
        return web.Response(status=204, headers=state.cors.preflight_headers(origin))
    if state.server.shutting_down:
        raise AapError("service_shutting_down", "metis is shutting down")
    if origin is not None and request.method in _STATE_CHANGING and not state.cors.allowed(origin):
        raise AapError("origin_not_allowed", "Origin is not allowed", {"origin": origin})
    route = _route_of(request)
    _authorize(request, state, route)
    _routing_error(request)
    if route is not None and route.body:
        await _read_json_body(request, state.settings.max_request_bytes)
    return await handler(request)


@web.middleware
async def aap_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    state: AapState = request.config_dict[AAP_STATE_KEY]
    cors = state.cors.response_headers(request.headers.get("Origin"))
    request[CORS_KEY] = cors
    try:
        response = await _pipeline(request, handler)
    except AapError as exc:
        response = error_response(exc)
    except DomainError as exc:
        response = error_response(from_domain(exc))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        response = error_response(AapError("internal_error", "internal error"))
    if not response.prepared:
        response.headers.update(cors)
    return response


# ---- mounting --------------------------------------------------------------------------------


def _sub_app(table: AapRoutes, state: AapState) -> web.Application:
    app = web.Application(middlewares=[aap_middleware])
    app[AAP_STATE_KEY] = state
    mapping: dict[Any, AapRoute] = {}
    for spec in table.routes:
        mapping[app.router.add_route(spec.method, spec.path, spec.handler)] = spec
    app.router.add_route("OPTIONS", "/{tail:.*}", _preflight)
    app[ROUTES_KEY] = mapping
    return app


def build_state(server: Any) -> AapState:
    settings = server.settings
    aap = settings.file.aap
    api_key = load_api_key(settings.home, settings.api_key)
    if api_key.created:
        # First start: say where the key is so the user can configure an AAP client. The key
        # itself is never printed or logged (a terminal's scrollback is not a secret store).
        print(f"metis: API key created in {api_key.path} (mode 0600)", flush=True)
    workspaces = Workspaces(settings.home, aap, settings.file.default_workspace)
    workspaces.ensure_default()
    return AapState(
        server=server,
        settings=aap,
        api_key=api_key,
        cors=CorsPolicy(aap.effective_cors_origins(), lambda: own_origins(server.port)),
        workspaces=workspaces,
        agents=AgentCatalog(server.core, workspaces),
        store=AapStore(server.core.db),
    )


def own_origins(port: int) -> tuple[str, ...]:
    return (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}")


def mount(app: web.Application, server: Any) -> AapState:
    """Add `/aap/v1` (first, so prefix resolution hands `/aap/v1/*` to v1) and `/aap`."""
    state = build_state(server)

    async def discard_unfinished(_app: web.Application) -> None:  # before the port listens
        await discard_unfinished_creations(state)

    app.on_startup.append(discard_unfinished)
    app.add_subapp(V1_PREFIX, _sub_app(routes_v1.routes, state))
    app.add_subapp(V3_PREFIX, _sub_app(routes_v3.routes, state))
    app[AAP_STATE_KEY] = state
    return state
