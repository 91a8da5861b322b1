"""OpenAPI 3.1 generated from the route table: every route, its wire models and its error codes.

Generated once at start-up from the same `RouteSpec`s that register the aiohttp routes, so the
document cannot drift from the router.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from metis.server.errors import ERROR_CODES
from metis.server.http import RouteSpec

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


def _schema_ref(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components.setdefault(model.__name__, schema)
    return {"$ref": f"#/components/schemas/{model.__name__}"}


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
    params = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", path_template(spec.path))
    ]
    if spec.query_model is not None:
        for name, field in spec.query_model.model_fields.items():
            schema = spec.query_model.model_json_schema()["properties"].get(field.alias or name, {})
            params.append(
                {"name": field.alias or name, "in": "query", "required": False, "schema": schema}
            )
    if params:
        op["parameters"] = params
    if spec.request_model is not None:
        op["requestBody"] = {
            "required": spec.body == "required",
            "content": {
                "application/json": {"schema": _schema_ref(spec.request_model, components)}
            },
        }
    success: dict[str, Any] = {"description": "success"}
    if spec.response_model is not None:
        success["content"] = {
            "application/json": {"schema": _schema_ref(spec.response_model, components)}
        }
    op["responses"][str(spec.status)] = success
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(ERROR_CODES[code], []).append(code)
    for status, status_codes in sorted(by_status.items()):
        op["responses"][str(status)] = {
            "description": ", ".join(status_codes),
            "content": {"application/json": {"schema": _error_schema(status_codes)}},
        }
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
    return {
        "openapi": "3.1.0",
        "info": {"title": "metis", "version": version},
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {SECURITY_SCHEME: _BEARER}},
    }
