"""The AAP sub-apps (`/aap/v1` and `/aap`), their request pipeline, and their part of
`/openapi.json` (built from the same route tables that register them).

Order for every request under `/aap`, after the app-wide Host check of the metis middleware:
CORS (a preflight is answered here, without auth) → shutdown → Origin check → auth →
routing errors (404/405, produced here so they carry CORS headers and the AAP envelope) → body
checks → handler → the one AAP error mapper. The metis surface never sees CORS.
"""

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from metis.aap import routes_v1, routes_v3
from metis.aap.agents import AgentCatalog, Workspaces
from metis.aap.errors import AAP_ERROR_CODES, AapError, error_response, from_domain
from metis.aap.http import AAP_STATE_KEY, BODY_KEY, CORS_KEY, AapState, CorsPolicy, Host
from metis.aap.sessions import discard_unfinished_creations
from metis.aap.store import AapStore, extension
from metis.aap.wire import StopReason, Wire
from metis.config import AapSettings, Settings
from metis.core.canonical.ids import ULID_CHARS
from metis.core.errors import DomainError
from metis.http import body, openapi
from metis.http.apikey import bearer_token, key_matches, load_api_key
from metis.http.routes import RouteSpec, RouteTable, add_routes, loopback_origins, spec_of

# ---------------------------------------------------------------------------------------------
# The AAP routes in `/openapi.json`, from the same route tables that register them.
# ---------------------------------------------------------------------------------------------

_ALWAYS = (
    "unauthorized",  # `GET /meta` too: it is public, but a non-empty wrong key is refused
    "not_found",
    "method_not_allowed",
    "service_shutting_down",
    "internal_error",
)
_WITH_BODY = (
    "origin_not_allowed",
    "request_too_large",
    "unsupported_media_type",
    "invalid_json",
    "validation_error",
)
PREFIXES = {3: "/aap", 1: "/aap/v1"}
PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    # a value outside it names no session: 404 session_not_found
    "session_id": {"type": "string", "pattern": f"^sess_{ULID_CHARS}$"},
    "tail": {"type": "string"},
}
# The longest `data:image/<type>;base64,` prefix a data URI may carry (jpeg, webp).
_DATA_URI_PREFIX = len("data:image/jpeg;base64,")


# ---- the events of a turn's `text/event-stream` reply (rendered by `stream.py`) --


class SessionStart(Wire):
    session_id: str


class TurnStart(Wire):
    pass


class Delta(Wire):
    delta: str


class Text(Wire):
    text: str


class Thinking(Wire):
    thinking: str


class ToolCall(Wire):
    tool_call_id: str
    name: str
    input: dict[str, Any]


class ToolResult(Wire):
    tool_call_id: str
    content: str | list[dict[str, Any]]


class TurnStop(Wire):
    stop_reason: StopReason


STREAM_EVENTS: dict[str, type[BaseModel]] = {
    "session_start": SessionStart,  # the first event of a v1 create-and-run only
    "turn_start": TurnStart,
    "text_delta": Delta,  # stream "delta" only
    "thinking_delta": Delta,  # stream "delta" only
    "text": Text,  # stream "message" only
    "thinking": Thinking,  # stream "message" only
    "tool_call": ToolCall,
    "tool_result": ToolResult,
    "turn_stop": TurnStop,  # always the last event
}
_STREAM = (
    'Server-sent events (stream "delta" or "message"), in order: turn_start, the turn\'s '
    "events, then turn_stop; comment lines keep an idle stream alive."
)


def setting_limits(settings: AapSettings) -> dict[str, Any]:
    """The values of the `from_setting` names the AAP wire models use (`mapping.py` checks)."""
    return {
        "image_uri_chars": _DATA_URI_PREFIX + openapi.base64_length(settings.max_image_bytes),
    }


def _operation(route: RouteSpec, version: int, components: dict[str, Any]) -> dict[str, Any]:
    prefix = f"AapV{version}"
    has_body = route.body != "none"
    codes = list(dict.fromkeys((*route.errors, *_ALWAYS, *(_WITH_BODY if has_body else ()))))
    if route.method == "DELETE":
        codes.append("origin_not_allowed")
    if route.method != "GET":  # a write that finds the store locked by another process
        codes.append("store_locked")
    op: dict[str, Any] = {
        "summary": route.summary,
        "tags": [route.tag],
        "responses": {},
        "x-error-codes": list(dict.fromkeys(codes)),
    }
    params = openapi.path_parameters(route.path, PATH_PARAMETERS)
    if route.query_model is not None:
        params += openapi.query_parameters(route.query_model)
    if params:
        op["parameters"] = params
    op["security"] = [] if route.public else [{"aapBearer": []}]  # public: `/meta`
    body = openapi.request_body(route, components, prefix)
    if body is not None:
        op["requestBody"] = body
    op["responses"][str(route.status)] = openapi.success_response(route, components, prefix)
    if route.streams:
        # An SSE reply is always 200, whatever the JSON reply's status.
        stream = op["responses"].setdefault("200", {"description": "success (stream)"})
        events = {
            name: openapi.schema_ref(model, components, f"{prefix}Stream")
            for name, model in STREAM_EVENTS.items()
        }
        stream.setdefault("content", {})["text/event-stream"] = openapi.event_stream(
            events, _STREAM
        )
    openapi.add_error_responses(op["responses"], op["x-error-codes"], AAP_ERROR_CODES)
    return op


def extend(doc: dict[str, Any], settings: AapSettings) -> dict[str, Any]:
    """Add every AAP route (and each sub-app's preflight catch-all) to a metis OpenAPI doc,
    with the limits `settings` sets."""
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    schemes = doc["components"].setdefault("securitySchemes", {})
    schemes["aapBearer"] = {"type": "http", "scheme": "bearer"}
    for version, table in ((3, routes_v3.routes), (1, routes_v1.routes)):
        base = PREFIXES[version]
        for route in table.specs:
            path = base + route.path
            doc["paths"].setdefault(path, {})[route.method.lower()] = _operation(
                route, version, components
            )
        doc["paths"].setdefault(base + "/{tail}", {})["options"] = {
            "summary": "CORS preflight for any AAP path (no auth)",
            "tags": [f"aap-v{version}"],
            "parameters": openapi.path_parameters("/{tail}", PATH_PARAMETERS),
            "security": [],
            "responses": {"204": {"description": "preflight answered"}},
            "x-error-codes": [],
        }
    openapi.resolve_settings(doc, setting_limits(settings).__getitem__)
    return doc


# ---------------------------------------------------------------------------------------------
# The AAP sub-apps (`/aap/v1` and `/aap`) and their request pipeline.
# ---------------------------------------------------------------------------------------------

log = logging.getLogger(__name__)

V3_PREFIX = "/aap"
V1_PREFIX = "/aap/v1"
# Every path under it is the AAP pipeline's (the metis middleware only checks its Host).
PREFIX = V3_PREFIX
_STATE_CHANGING = frozenset({"POST", "PUT", "DELETE"})
REALM_HEADER = {"WWW-Authenticate": 'Bearer realm="metis-aap"'}


# ---- the pipeline ----------------------------------------------------------------------------


async def _preflight(request: web.Request) -> web.Response:
    """Catch-all `OPTIONS`: answered by the middleware before it gets here."""
    return web.Response(status=204)


def _authorize(request: web.Request, state: AapState, route: RouteSpec | None) -> None:
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


async def _read_json_body(request: web.Request, max_bytes: int, timeout_s: float) -> None:
    if not body.is_json(request):
        raise AapError(
            "unsupported_media_type",
            "the body must be application/json",
            {"content_type": request.headers.get("Content-Type")},
        )
    try:
        raw = await body.read_capped(request, max_bytes, timeout_s)
        request[BODY_KEY] = body.decode_json_object(raw)
    except body.BodyRefused as exc:
        if exc.reason == "too_large":
            raise AapError("request_too_large", exc.message, {"max_bytes": max_bytes}) from None
        if exc.reason == "not_object":
            raise AapError("invalid_json", "the body must be a JSON object") from None
        if exc.reason == "too_slow":  # AAP's closed table has no timeout code
            raise AapError("invalid_json", exc.message, headers={"Connection": "close"}) from None
        if exc.reason == "malformed":  # what is wrong with it, e.g. `duplicate key 'name'`
            raise AapError("invalid_json", exc.message) from None
        raise AapError("invalid_json", "the body is not valid JSON") from None


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
    route = spec_of(request)
    _authorize(request, state, route)
    _routing_error(request)
    if route is not None and route.body != "none":
        await _read_json_body(
            request,
            state.settings.max_request_bytes,
            state.server.settings.limits.body_read_timeout_s,
        )
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
        log.exception("unhandled error on %s %s", request.method, request.rel_url.raw_path)
        response = error_response(AapError("internal_error", "internal error"))
    if not response.prepared:
        response.headers.update(cors)
    return response


# ---- mounting --------------------------------------------------------------------------------


def _sub_app(table: RouteTable, state: AapState) -> web.Application:
    app = web.Application(middlewares=[aap_middleware])
    app[AAP_STATE_KEY] = state
    add_routes(app, table.specs)
    app.router.add_route("OPTIONS", "/{tail:.*}", _preflight)
    return app


def build_state(server: Host) -> AapState:
    settings = server.settings
    aap = settings.file.aap
    api_key = load_api_key(settings.home, settings.api_key)  # its creation: `metis serve`'s banner
    workspaces = Workspaces(settings.scratch_workspaces_path, aap, settings.file.default_workspace)
    workspaces.ensure_default()
    state = AapState(
        server=server,
        settings=aap,
        api_key=api_key,
        cors=CorsPolicy(aap.effective_cors_origins(), lambda: loopback_origins(server.port)),
        workspaces=workspaces,
        agents=AgentCatalog(server.app.models, workspaces),
        # the AAP tables' migration track and the start-up repair of an interrupted creation
        # (run by Core.start before the port listens)
        aap_store=server.app.extend_store(
            extension(lambda: discard_unfinished_creations(state)), AapStore
        ),
    )
    return state


def extend_openapi(doc: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Add the AAP operations to the daemon's OpenAPI document (`extend` above)."""
    return extend(doc, settings.file.aap)


def mount(app: web.Application, server: Host) -> AapState:
    """Add `/aap/v1` (first, so prefix resolution hands `/aap/v1/*` to v1) and `/aap`."""
    state = build_state(server)
    app.add_subapp(V1_PREFIX, _sub_app(routes_v1.routes, state))
    app.add_subapp(V3_PREFIX, _sub_app(routes_v3.routes, state))
    app[AAP_STATE_KEY] = state
    return state
