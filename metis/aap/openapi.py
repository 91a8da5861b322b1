"""The AAP routes in `/openapi.json`, from the same route tables that register them.

AAP operations list AAP error codes (`metis/aap/errors.py`) in `x-error-codes`; they never mix
with the metis REST table.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from metis.aap import routes_v1, routes_v3
from metis.aap.errors import AAP_ERROR_CODES
from metis.aap.http import AapRoute

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


def _ref(model: type[BaseModel], components: dict[str, Any], prefix: str) -> dict[str, Any]:
    name = f"{prefix}{model.__name__}"
    schema = model.model_json_schema(
        by_alias=True, ref_template="#/components/schemas/" + prefix + "{model}"
    )
    for sub, definition in schema.pop("$defs", {}).items():
        components.setdefault(prefix + sub, definition)
    components.setdefault(name, schema)
    return {"$ref": f"#/components/schemas/{name}"}


def _error_schema(codes: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message", "details"],
                "properties": {
                    "code": {"type": "string", "enum": codes},
                    "message": {"type": "string"},
                    "details": {"type": "object"},
                },
            }
        },
    }


def _operation(route: AapRoute, version: int, components: dict[str, Any]) -> dict[str, Any]:
    prefix = f"AapV{version}"
    codes = list(dict.fromkeys((*route.errors, *_ALWAYS, *(_WITH_BODY if route.body else ()))))
    if route.method == "DELETE":
        codes.append("origin_not_allowed")
    op: dict[str, Any] = {
        "summary": route.summary,
        "tags": [f"aap-v{version}"],
        "responses": {},
        "x-error-codes": list(dict.fromkeys(codes)),
    }
    params = [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
        for n in re.findall(r"{(\w+)}", route.path)
    ]
    if params:
        op["parameters"] = params
    if not route.public:
        op["security"] = [{"aapBearer": []}]
    if route.request_model is not None:
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": _ref(route.request_model, components, prefix)}
            },
        }
    success: dict[str, Any] = {"description": "success"}
    if route.response_model is not None:
        schema = _ref(route.response_model, components, prefix)
        success["content"] = {"application/json": {"schema": schema}}
    op["responses"][str(route.status)] = success
    if route.streams:
        # An SSE reply is always 200, whatever the JSON reply's status.
        stream = op["responses"].setdefault("200", {"description": "success (stream)"})
        stream.setdefault("content", {})["text/event-stream"] = {"schema": {"type": "string"}}
    by_status: dict[int, list[str]] = {}
    for code in op["x-error-codes"]:
        by_status.setdefault(AAP_ERROR_CODES[code], []).append(code)
    for status, status_codes in sorted(by_status.items()):
        op["responses"][str(status)] = {
            "description": ", ".join(status_codes),
            "content": {"application/json": {"schema": _error_schema(status_codes)}},
        }
    return op


def extend(doc: dict[str, Any]) -> dict[str, Any]:
    """Add every AAP route (and each sub-app's preflight catch-all) to a metis OpenAPI doc."""
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    schemes = doc["components"].setdefault("securitySchemes", {})
    schemes["aapBearer"] = {"type": "http", "scheme": "bearer"}
    for version, table in ((3, routes_v3.routes), (1, routes_v1.routes)):
        base = PREFIXES[version]
        for route in table.routes:
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
