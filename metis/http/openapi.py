"""OpenAPI 3.1 assembly from route specs: schema components, path and query parameters, the
error envelope's schema per status, server-sent event streams, and the document itself.

A surface decides which error codes an operation lists (its own guards) and passes its own
closed code → status table; everything else is built here.

Limits that are settings (page sizes, a reason's length, an image's size) are declared on the
wire models with `from_setting(...)` markers and resolved against the running daemon's settings
when the document is built (`resolve_settings`): the document states the limits this daemon
enforces, from the same values the handlers read, so the two cannot drift.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.config import JsonDict

from metis.http.routes import RouteSpec

SETTING_KEY = "x-setting"
STRING = {"type": "string"}


def from_setting(**keywords: str) -> JsonDict:
    """A schema fragment whose keywords take a setting's value when the document is built:
    `Field(json_schema_extra=from_setting(maxLength="reason_chars"))`; the names are the
    surface's (the lookup it passes to `resolve_settings`)."""
    return {SETTING_KEY: {**keywords}}


def resolve_settings(node: Any, lookup: Callable[[str], Any]) -> None:
    """Replace every `from_setting` marker under `node` (in place) by its keywords' values."""
    if isinstance(node, dict):
        marker = node.pop(SETTING_KEY, None)
        if marker is not None:
            for keyword, name in marker.items():
                node[keyword] = lookup(name)
        for value in node.values():
            resolve_settings(value, lookup)
    elif isinstance(node, list):
        for value in node:
            resolve_settings(value, lookup)


def base64_length(raw_bytes: int) -> int:
    """The length of the (padded) base64 text of `raw_bytes` bytes: a byte limit as a string's."""
    return 4 * ((raw_bytes + 2) // 3)


# Standard base64 with its padding, as `base64.b64decode(..., validate=True)` accepts it.
BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


def schema_ref(
    model: type[BaseModel], components: dict[str, Any], prefix: str = ""
) -> dict[str, Any]:
    """`model`'s schema (and its `$defs`) added to `components` under `prefix`; its `$ref`."""
    name = f"{prefix}{model.__name__}"
    schema = model.model_json_schema(
        by_alias=True, ref_template="#/components/schemas/" + prefix + "{model}"
    )
    for sub, definition in schema.pop("$defs", {}).items():
        components.setdefault(prefix + sub, definition)
    components.setdefault(name, schema)
    return {"$ref": f"#/components/schemas/{name}"}


def error_schema(codes: list[str]) -> dict[str, Any]:
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


def path_parameters(
    path: str, schemas: Mapping[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Every `{name}` of an OpenAPI path template; `schemas` gives a name its value's shape
    (an id's pattern), a plain string otherwise."""
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": dict((schemas or {}).get(name, STRING)),
        }
        for name in re.findall(r"{(\w+)}", path)
    ]


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """One parameter per field of a query model, with its constraints.

    A query value is never JSON `null`: an optional field's `null` branch and `null` default
    are dropped, leaving the type the server parses the text into.
    """
    properties = model.model_json_schema()["properties"]
    params = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        schema = _without_null(dict(properties.get(key, {})))
        schema.pop("title", None)
        param: dict[str, Any] = {"name": key, "in": "query", "required": field.is_required()}
        description = schema.pop("description", None)
        if description:
            param["description"] = description
        param["schema"] = schema
        params.append(param)
    return params


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    branches = schema.get("anyOf")
    if branches is not None:
        kept = [b for b in branches if b.get("type") != "null"]
        if len(kept) == 1:
            del schema["anyOf"]
            schema = {**kept[0], **schema}
        else:
            schema["anyOf"] = kept
    if schema.get("default", 0) is None:
        del schema["default"]
    return schema


def event_stream(events: Mapping[str, dict[str, Any]], description: str) -> dict[str, Any]:
    """A `text/event-stream` media type: the body is SSE text (`schema`), and `x-itemSchema`
    describes each event it carries — its `event` name and its `data`, one JSON document of the
    named schema. (OpenAPI 3.2 names this `itemSchema`; 3.1 has no keyword for a sequence.)"""
    items = [
        {
            "type": "object",
            "required": ["event", "data"],
            "properties": {
                "event": {"const": name},
                "data": {
                    "type": "string",
                    "contentMediaType": "application/json",
                    "contentSchema": schema,
                },
            },
        }
        for name, schema in events.items()
    ]
    return {
        "schema": {
            "type": "string",
            "contentMediaType": "text/event-stream",
            "description": description,
        },
        "x-itemSchema": {"oneOf": items},
    }


def request_body(
    spec: RouteSpec, components: dict[str, Any], prefix: str = ""
) -> dict[str, Any] | None:
    if spec.request_model is None:
        return None
    return {
        "required": spec.body == "required",
        "content": {
            "application/json": {"schema": schema_ref(spec.request_model, components, prefix)}
        },
    }


def success_response(
    spec: RouteSpec, components: dict[str, Any], prefix: str = ""
) -> dict[str, Any]:
    success: dict[str, Any] = {"description": "success"}
    if spec.response_model is not None:
        schema = schema_ref(spec.response_model, components, prefix)
        success["content"] = {"application/json": {"schema": schema}}
    elif spec.documents:
        success["content"] = {media: {"schema": {"type": "string"}} for media in spec.documents}
    return success


def add_error_responses(responses: dict[str, Any], codes: list[str], table: dict[str, int]) -> None:
    """One response per status, listing its codes (in `codes` order) and the envelope schema."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        by_status.setdefault(table[code], []).append(code)
    for status, status_codes in sorted(by_status.items()):
        responses[str(status)] = {
            "description": ", ".join(status_codes),
            "content": {"application/json": {"schema": error_schema(status_codes)}},
        }


def document(
    title: str,
    version: str,
    paths: dict[str, dict[str, Any]],
    components: dict[str, Any],
    security_schemes: dict[str, Any],
) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": security_schemes},
    }
