"""Schema fragments shared by the built-in tools."""

from __future__ import annotations

from typing import Any

from metis.core.tools.sandbox import MAX_PATH_CHARS


def path_schema(description: str, **extra: Any) -> dict[str, Any]:
    """The `path` schema: a string of 1..4,096 characters."""
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_PATH_CHARS,
        "description": description,
        **extra,
    }


def object_schema(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return schema
