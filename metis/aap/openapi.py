"""The AAP routes in `/openapi.json`, from the same route tables that register them.

AAP operations list AAP error codes (`metis/aap/errors.py`) in `x-error-codes`; they never mix
with the metis REST table.
"""

from __future__ import annotations

from typing import Any

from metis.aap import routes_v1, routes_v3
from metis.aap.errors import AAP_ERROR_CODES
from metis.http import openapi
from metis.http.routes import RouteSpec

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


def _operation(route: RouteSpec, version: int, components: dict[str, Any]) -> dict[str, Any]:
    prefix = f"AapV{version}"
    has_body = route.body != "none"
    codes = list(dict.fromkeys((*route.errors, *_ALWAYS, *(_WITH_BODY if has_body else ()))))
    if route.method == "DELETE":
        codes.append("origin_not_allowed")
    op: dict[str, Any] = {
        "summary": route.summary,
        "tags": [route.tag],
        "responses": {},
        "x-error-codes": list(dict.fromkeys(codes)),
    }
    params = openapi.path_parameters(route.path)
    if params:
        op["parameters"] = params
    if not route.public:
        op["security"] = [{"aapBearer": []}]
    body = openapi.request_body(route, components, prefix)
    if body is not None:
        op["requestBody"] = body
    op["responses"][str(route.status)] = openapi.success_response(route, components, prefix)
    if route.streams:
        # An SSE reply is always 200, whatever the JSON reply's status.
        stream = op["responses"].setdefault("200", {"description": "success (stream)"})
        stream.setdefault("content", {})["text/event-stream"] = {"schema": {"type": "string"}}
    openapi.add_error_responses(op["responses"], op["x-error-codes"], AAP_ERROR_CODES)
    return op


def extend(doc: dict[str, Any]) -> dict[str, Any]:
    """Add every AAP route (and each sub-app's preflight catch-all) to a metis OpenAPI doc."""
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
            "responses": {"204": {"description": "preflight answered"}},
            "x-error-codes": [],
        }
    return doc
