"""The metis operations of the OpenAPI 3.1 document: every route, its wire models and its
error codes.

Generated once at start-up from the same `RouteSpec`s that register the aiohttp routes, so the
document cannot drift from the router. Assembly is the kernel's (`metis/http/openapi.py`);
this module decides which of the metis codes each operation lists.
"""

from __future__ import annotations

import re
from typing import Any

from metis.http import openapi
from metis.http.routes import RouteSpec
from metis.server.errors import ERROR_CODES

_ALWAYS = ("host_not_allowed", "service_shutting_down", "internal_error")
SECURITY_SCHEME = "metisBearer"
_BEARER = {
    "type": "http",
    "scheme": "bearer",
    "description": "The daemon's key (METIS_API_KEY, else the file METIS_HOME/api_key); a browser "
    "session cookie from GET /login is accepted in its place.",
}
_WITH_BODY = (
    "payload_too_large",
    "unsupported_media_type",
    "validation_error",
)


def _operation(spec: RouteSpec, components: dict[str, Any]) -> dict[str, Any]:
    codes = list(
        dict.fromkeys(
            (
                *spec.errors,
                *_ALWAYS,
                *(("unauthorized",) if spec.needs_key else ()),
                *(("origin_not_allowed",) if spec.origin_checked else ()),
                *(_WITH_BODY if spec.body != "none" else ()),
            )
        )
    )
    if spec.query_model is not None and "validation_error" not in codes:
        codes.append("validation_error")
    op: dict[str, Any] = {"summary": spec.summary, "tags": [spec.tag], "responses": {}}
    # public routes and the WebSocket upgrade (authorised by its attach token) need no key
    op["security"] = [{SECURITY_SCHEME: []}] if spec.needs_key else []
    params = openapi.path_parameters(path_template(spec.path))
    if spec.query_model is not None:
        params += openapi.query_parameters(spec.query_model)
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


def build_openapi(specs: list[RouteSpec], version: str) -> dict[str, Any]:
    components: dict[str, Any] = {}
    paths: dict[str, dict[str, Any]] = {}
    for spec in specs:
        operations = paths.setdefault(path_template(spec.path), {})
        operations[spec.method.lower()] = _operation(spec, components)
    return openapi.document("metis", version, paths, components, {SECURITY_SCHEME: _BEARER})
