"""OpenAPI 3.1 assembly from route specs: schema components, path parameters, the error
envelope's schema per status, and the document itself.

A surface decides which error codes an operation lists (its own guards) and passes its own
closed code → status table; everything else is built here.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from metis.http.routes import RouteSpec


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


def path_parameters(path: str) -> list[dict[str, Any]]:
    return [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", path)
    ]


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    params = []
    for name, field in model.model_fields.items():
        schema = model.model_json_schema()["properties"].get(field.alias or name, {})
        params.append(
            {"name": field.alias or name, "in": "query", "required": False, "schema": schema}
        )
    return params


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
