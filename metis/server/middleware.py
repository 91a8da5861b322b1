"""Request guards in their precedence order (docs/api.md), the error envelope, and access logs.

Order: host_not_allowed → service_shutting_down → unauthorized → route_not_found /
method_not_allowed → origin_not_allowed → payload_too_large → unsupported_media_type →
validation_error of what the route does not read (an undeclared query parameter, a body on a
route taking none) → (handler: validation_error …).
A refused request reaches no handler, so it writes no row and no event. `unauthorized` comes
before routing, so a client without the key learns nothing about which paths exist.

Requests the router hands to a sub-app in `SELF_GUARDED_KEY` (the AAP sub-apps, mounted by
`metis/server/app.py`) take their own pipeline (CORS, shutdown, auth, 404/405, body checks and
error envelope); only the Host check applies here to both surfaces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from metis.core.errors import DomainError
from metis.dashboard.routes import index, not_found_page, static
from metis.http.body import close_if_unsolicited
from metis.http.errors import error_response
from metis.http.routes import STATE_CHANGING_METHODS, RouteSpec, loopback_origins, spec_of
from metis.server.auth import CHALLENGE, Credential
from metis.server.errors import ApiError, from_domain
from metis.server.http import has_body, refuse_undeclared
from metis.server.state import STATE_KEY, ServerState

log = logging.getLogger("metis.access")
errlog = logging.getLogger(__name__)

# Mounted sub-apps that run their own request pipeline.
SELF_GUARDED_KEY = web.AppKey("metis.self_guarded_apps", tuple)

# The dashboard's page and files: their query is not checked, as a web server's files' is not
# (a cache buster or a link's tracking parameter is no mistake made against the API).
_PAGES = (index, static)


def _self_guarded(request: web.Request) -> bool:
    """Whether the router handed the request to a self-guarded sub-app.

    Decided from the router's own match, never from `request.path`: that path is fully
    percent-decoded, while the router matches `%2F` as it came (`/aap%2Fsessions` is not under
    `/aap`). Judging by the decoded path once let such a request skip the metis guards and
    then match no route at all.
    """
    guarded = request.app.get(SELF_GUARDED_KEY, ())
    return any(app in guarded for app in request.match_info.apps)


def host_allowed(host: str | None, port: int) -> bool:
    """Only loopback names/addresses with the bound port (DNS-rebinding defence)."""
    if not host:
        return False
    host = host.lower()
    return host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}")


def origin_allowed(origin: str, state: ServerState) -> bool:
    own = loopback_origins(state.port)
    return origin.lower() in own or origin in state.settings.file.allowed_origins


def is_websocket_upgrade(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"


def _check_host(request: web.Request, state: ServerState) -> None:
    if not host_allowed(request.headers.get("Host"), state.port):
        raise ApiError("host_not_allowed", "Host header is not an allowed loopback name")


def _check_auth(request: web.Request, state: ServerState) -> Credential | None:
    """The request's credential (metis/server/auth.py); None when its route needs none."""
    auth = state.auth
    spec = spec_of(request)
    if auth is not None and (not auth.required or (spec is not None and not spec.needs_key)):
        return None
    credential = auth.credential(request) if auth is not None else None
    if credential is None:
        raise ApiError(
            "unauthorized",
            "a valid `Authorization: Bearer <key>` is required (the key is METIS_API_KEY, "
            "else the file METIS_HOME/api_key)",
            headers=dict(CHALLENGE),
        )
    return credential


def _browser_went_nowhere(request: web.Request) -> bool:
    """A browser navigating (an address typed or a link followed: `Sec-Fetch-Mode: navigate`,
    which browsers set themselves and pages cannot) to a path no route serves."""
    return (
        request.method in ("GET", "HEAD")
        and request.headers.get("Sec-Fetch-Mode") == "navigate"
        and isinstance(request.match_info.http_exception, web.HTTPNotFound)
    )


def _check_preconditions(request: web.Request, state: ServerState) -> None:
    _check_host(request, state)
    if state.shutting_down:
        raise ApiError("service_shutting_down", "metis is shutting down")
    credential = _check_auth(request, state)
    http_exc = request.match_info.http_exception
    if http_exc is not None:
        if isinstance(http_exc, web.HTTPMethodNotAllowed):
            allowed = sorted(http_exc.allowed_methods)
            raise ApiError(
                "method_not_allowed",
                f"{request.method} is not allowed on {request.path}",
                {"allowed": allowed},
                headers={"Allow": ", ".join(allowed)},
            )
        raise ApiError("route_not_found", f"no route for {request.path}", {"path": request.path})
    origin = request.headers.get("Origin")
    guarded = request.method in STATE_CHANGING_METHODS or is_websocket_upgrade(request)
    if origin is not None and guarded and not origin_allowed(origin, state):
        raise ApiError("origin_not_allowed", "Origin is not allowed", {"origin": origin})
    # A browser session may only change state from the daemon's own pages: the Origin must be
    # present and one of its loopback origins (`allowed_origins` does not extend this).
    if (
        credential == "browser"
        and request.method in STATE_CHANGING_METHODS
        and (origin is None or origin.lower() not in loopback_origins(state.port))
    ):
        raise ApiError(
            "origin_not_allowed",
            "a browser-session request that changes state needs the daemon's own Origin",
            {"origin": origin},
        )
    spec = spec_of(request)
    if spec is None:
        return
    if spec.body != "none":
        _check_body_head(request, state, spec)
    refuse_undeclared(request, spec, query=spec.handler not in _PAGES)


def _check_body_head(request: web.Request, state: ServerState, spec: RouteSpec) -> None:
    """What the head says of the body of a route that takes one: its size and media type."""
    max_bytes = state.settings.limits.max_request_bytes
    length = request.content_length
    if length is not None and length > max_bytes:
        raise ApiError(
            "payload_too_large", f"body exceeds {max_bytes} bytes", {"max_bytes": max_bytes}
        )
    if has_body(request) or spec.body == "required":
        content_type = request.headers.get("Content-Type")
        if content_type is None or request.content_type.lower() != "application/json":
            raise ApiError(
                "unsupported_media_type",
                "the body must be application/json",
                {"content_type": content_type},
            )


@web.middleware
async def metis_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    state: ServerState = request.app[STATE_KEY]
    started = time.perf_counter()
    try:
        if _self_guarded(request):
            _check_host(request, state)  # DNS-rebinding defence for both surfaces
        elif _browser_went_nowhere(request):
            _check_host(request, state)
            handler = not_found_page  # it holds nothing: no key needed to be told so
        else:
            _check_preconditions(request, state)
        if request.path != "/health":  # a client, not a probe: its first turn is coming
            state.app.models.prepare_adapters()
        response = await handler(request)
    except ApiError as exc:
        response = error_response(exc)
        if exc.code == "payload_too_large":
            response.force_close()  # the unread body must not keep the connection busy
    except DomainError as exc:
        response = error_response(from_domain(exc))
    except web.HTTPRequestEntityTooLarge:
        max_bytes = state.settings.limits.max_request_bytes
        response = error_response(
            ApiError(
                "payload_too_large", f"body exceeds {max_bytes} bytes", {"max_bytes": max_bytes}
            )
        )
    except web.HTTPException as exc:
        errlog.error(
            "unexpected aiohttp HTTP exception %s on %s", exc.status, request.rel_url.raw_path
        )
        response = error_response(ApiError("internal_error", "internal error"))
    except Exception:
        errlog.exception("unhandled error on %s %s", request.method, request.rel_url.raw_path)
        response = error_response(ApiError("internal_error", "internal error"))
    close_if_unsolicited(request, response)
    elapsed_ms = (time.perf_counter() - started) * 1000
    # paths are logged as sent (percent-encoded): a decoded `%0a` would start a forged line
    log.info(
        "request method=%s path=%s status=%s ms=%.2f",
        request.method,
        request.rel_url.raw_path,
        response.status,
        elapsed_ms,
    )
    return response


SECURITY_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
"""What every response carries, the connection layer's refusals too (metis/server/malformed.py)."""


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: headers every metis response carries."""
    if isinstance(response, web.WebSocketResponse):
        return
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
