"""The metis operations of the OpenAPI 3.1 document: every route, its wire models and its
error codes.

Generated once at start-up from the same `RouteSpec`s that register the aiohttp routes, so the
document cannot drift from the router. Assembly is the kernel's (`metis/http/openapi.py`);
this module decides which of the metis codes each operation lists, the shape of each path
parameter, and the values of the limits that are settings.
"""

from __future__ import annotations

import re
from typing import Any

from metis.config import Settings
from metis.core.canonical.ids import ULID_CHARS
from metis.http import openapi
from metis.http.routes import STATE_CHANGING_METHODS, RouteSpec
from metis.server.errors import ERROR_CODES

_ALWAYS = ("host_not_allowed", "service_shutting_down", "internal_error")
SECURITY_SCHEME = "metisBearer"
_BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "The daemon's key (METIS_API_KEY, else the file METIS_HOME/api_key), or a "
    "browser session's secret (handed out by GET /login in its redirect's URL fragment).",
}
# A path parameter's shape by name: the same name is the same kind of id on every route. A
# value outside it names nothing (404), never a malformed request.
PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    "session_id": {"type": "string", "pattern": f"^sess_{ULID_CHARS}$"},
    "turn_id": {"type": "string", "pattern": f"^{ULID_CHARS}$"},
    "request_id": {"type": "string", "pattern": f"^{ULID_CHARS}$"},
    "model": {"type": "string", "minLength": 1},
    "name": {"type": "string", "minLength": 1},
}


def _any_case(pattern: str) -> str:
    """A pattern matching letters in either case (ECMA-262 patterns have no inline flags)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in pattern)


# A WebSocket upgrade is a GET with these; without them the answer is 426 upgrade_required.
_UPGRADE = [
    {
        "name": "attach",
        "in": "query",
        "required": True,
        "description": "the single-use attach token of GET /sessions/{session_id}",
        "schema": {"type": "string"},
    },
    *(
        {"name": name, "in": "header", "required": True, "schema": schema}
        for name, schema in (
            ("Upgrade", {"type": "string", "pattern": _any_case("^websocket$")}),
            ("Connection", {"type": "string", "pattern": _any_case("upgrade")}),
            ("Sec-WebSocket-Key", {"type": "string"}),
            ("Sec-WebSocket-Version", {"const": "13"}),
        )
    ),
]
_WITH_BODY = (
    "payload_too_large",
    "unsupported_media_type",
    "validation_error",
    # from the body's read (`read_body`): framing the parser could not read, a stalled body
    "malformed_request",
    "request_timeout",
)


def _operation(spec: RouteSpec, components: dict[str, Any]) -> dict[str, Any]:
    codes = list(
        dict.fromkeys(
            (
                *spec.errors,
                *_ALWAYS,
                *(("unauthorized",) if spec.needs_key else ()),
                *(("origin_not_allowed",) if spec.origin_checked else ()),
                # a write that finds the store locked by another process (metis/core/errors.py)
                *(("store_locked",) if spec.method in STATE_CHANGING_METHODS else ()),
                *(_WITH_BODY if spec.body != "none" else ()),
                # every route refuses a query parameter it does not declare, and a body when
                # it takes none (`refuse_undeclared` in metis/server/http.py)
                "validation_error",
            )
        )
    )
    op: dict[str, Any] = {"summary": spec.summary, "tags": [spec.tag], "responses": {}}
    # public routes and the WebSocket upgrade (authorised by its attach token) need no key
    op["security"] = [{SECURITY_SCHEME: []}] if spec.needs_key else []
    params = openapi.path_parameters(path_template(spec.path), PATH_PARAMETERS)
    if spec.query_model is not None:
        params += openapi.query_parameters(spec.query_model)
    if spec.websocket:
        params += _UPGRADE
    if params:
        op["parameters"] = params
    body = openapi.request_body(spec, components)
    if body is not None:
        op["requestBody"] = body
    op["responses"][str(spec.status)] = openapi.success_response(spec, components)
    openapi.add_error_responses(op["responses"], codes, ERROR_CODES)
    op["x-error-codes"] = codes
    return op


def path_template(path: str) -> str:
    """An aiohttp path as an OpenAPI template: `/static/{name:.+}` → `/static/{name}`."""
    return re.sub(r"{(\w+):[^}]+}", r"{\1}", path)


def setting_limits(settings: Settings) -> dict[str, Any]:
    """The values of the `from_setting` names the metis wire models use: what this daemon's
    handlers enforce (`page_limit`, the confirmation handler, core's image check)."""
    limits, pages = settings.limits, settings.pages
    return {
        "pages.sessions": pages.sessions.maximum,
        "pages.messages": pages.messages.maximum,
        "pages.events": pages.events.maximum,
        "reason_chars": limits.max_reason_chars,
        "image_base64_chars": openapi.base64_length(limits.max_image_bytes),
    }


def build_openapi(specs: list[RouteSpec], version: str, settings: Settings) -> dict[str, Any]:
    components: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    for spec in specs:
        operations = paths.setdefault(path_template(spec.path), {})
        operations[spec.method.lower()] = _operation(spec, components)
    doc = openapi.document("metis", version, paths, components, {SECURITY_SCHEME: _BEARER})
    openapi.resolve_settings(doc, setting_limits(settings).__getitem__)
    return doc
