"""The JSON Schema subset tools may use: registration-time checks and strict validation.

A tool's schema is checked once, when it is registered, so validation can trust its shape.
Model input is validated strictly (no coercion: `"10"` is not an integer, `true` is not a
number) because the model must learn the real types from the error, not have them guessed.
A number written with a zero fraction (`10.0`) is an integer, as JSON Schema counts it (JSON has
one number type, and local models write whole numbers so): it is handed to the tool as `10`.
Errors come out in a stable order, at most 20, so an event and the model's result text agree.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from metis.core.tools.base import ToolRegistrationError

MAX_ERRORS = 20
UNPARSED_ARGUMENTS = "metis_unparsed_arguments"

ALLOWED_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "pattern",
        "format",
        "default",
        "description",
        "title",
        "examples",
    }
)
JSON_TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")


class SchemaError(ToolRegistrationError):
    """A schema outside the supported subset."""


@dataclass(frozen=True)
class InputError:
    """One validation problem; `path` is `$` or like `$.offset`, `$.items[0]`."""

    path: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "message": self.message}


@dataclass(frozen=True)
class InputValidation:
    """Result of `validate_input`: the errors, or the input with defaults filled in."""

    errors: tuple[InputError, ...]
    value: dict[str, Any] | None

    @property
    def ok(self) -> bool:
        return not self.errors


# ---------------------------------------------------------------------------------------------
# Registration-time check
# ---------------------------------------------------------------------------------------------


def check_schema(schema: Any) -> None:
    """Raise `SchemaError` unless `schema` is a supported root schema."""
    if not isinstance(schema, dict):
        raise SchemaError("input_schema must be an object")
    if schema.get("type") != "object":
        raise SchemaError('input_schema must have "type": "object"')
    if not isinstance(schema.get("properties"), dict):
        raise SchemaError('input_schema must have "properties"')
    if schema.get("additionalProperties") is not False:
        raise SchemaError('input_schema must have "additionalProperties": false')
    _check_node(schema, "$")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_node(node: Any, where: str) -> None:
    if not isinstance(node, dict):
        raise SchemaError(f"{where}: a schema must be an object")
    for key in node:
        if key not in ALLOWED_KEYWORDS:
            raise SchemaError(f"{where}: keyword {key!r} is not supported")
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        if not types or any(t not in JSON_TYPES for t in types) or len(set(types)) != len(types):
            raise SchemaError(f"{where}: invalid type {node['type']!r}")
    if "properties" in node:
        props = node["properties"]
        if not isinstance(props, dict) or not all(isinstance(k, str) for k in props):
            raise SchemaError(f"{where}: properties must map names to schemas")
        for name, sub in props.items():
            _check_node(sub, _child(where, name))
    if "required" in node:
        required = node["required"]
        if (
            not isinstance(required, list)
            or not all(isinstance(r, str) for r in required)
            or len(set(required)) != len(required)
        ):
            raise SchemaError(f"{where}: required must be a list of distinct names")
        missing = [r for r in required if r not in node.get("properties", {})]
        if missing:
            raise SchemaError(f"{where}: required names undeclared properties {missing}")
    if "additionalProperties" in node and not isinstance(node["additionalProperties"], bool):
        raise SchemaError(f"{where}: additionalProperties must be a boolean")
    if "items" in node:
        _check_node(node["items"], f"{where}[]")
    if "enum" in node and (not isinstance(node["enum"], list) or not node["enum"]):
        raise SchemaError(f"{where}: enum must be a non-empty list")
    for key in ("minimum", "maximum"):
        if key in node and not _is_number(node[key]):
            raise SchemaError(f"{where}: {key} must be a number")
    for key in ("minLength", "maxLength", "minItems", "maxItems"):
        if key in node and not _is_count(node[key]):
            raise SchemaError(f"{where}: {key} must be a non-negative integer")
    if "pattern" in node:
        if not isinstance(node["pattern"], str):
            raise SchemaError(f"{where}: pattern must be a string")
        try:
            re.compile(node["pattern"])
        except re.error as exc:
            raise SchemaError(f"{where}: pattern does not compile: {exc}") from None
    for key in ("format", "description", "title"):
        if key in node and not isinstance(node[key], str):
            raise SchemaError(f"{where}: {key} must be a string")
    if "examples" in node and not isinstance(node["examples"], list):
        raise SchemaError(f"{where}: examples must be a list")
    if "default" in node:
        problems = validate(node, node["default"])
        if problems:
            raise SchemaError(f"{where}: default is invalid: {problems[0].message}")


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


class _Full(Exception):
    """Raised internally once MAX_ERRORS problems were collected."""


class _Collector:
    def __init__(self) -> None:
        self.errors: list[InputError] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append(InputError(path, message))
        if len(self.errors) >= MAX_ERRORS:
            raise _Full


def validate(schema: Mapping[str, Any], value: Any) -> list[InputError]:
    """Every problem of `value` against a checked schema, in a stable order, at most 20."""
    out = _Collector()
    with contextlib.suppress(_Full):
        _validate(schema, value, "$", out)
    return out.errors


def unparsed_input(reason: str) -> dict[str, Any]:
    """The input of a call whose arguments were not a JSON object (the model's broken JSON).

    It stays an object, so the stored call can be sent back to the provider as it is, and it
    carries why, so `validate_input` reports that instead of every required field missing
    (feedback that sends a model round in circles).
    """
    return {UNPARSED_ARGUMENTS: reason}


def _unparsed_reason(value: Any) -> str | None:
    if isinstance(value, dict) and len(value) == 1:
        reason = value.get(UNPARSED_ARGUMENTS)
        if isinstance(reason, str):
            return reason
    return None


def validate_input(schema: Mapping[str, Any], value: Any) -> InputValidation:
    """Validate a tool input; on success return it with the schema's defaults filled in."""
    unparsed = _unparsed_reason(value)
    if unparsed is not None:
        return InputValidation((InputError("$", unparsed),), None)
    errors = validate(schema, value)
    if errors:
        return InputValidation(tuple(errors), None)
    return InputValidation((), apply_defaults(schema, value))


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """A copy of a valid `value` with absent properties set to their `default` (recursively),
    and whole numbers where an integer is expected as integers."""
    if isinstance(value, float):
        return _as_integer(schema, value)
    if isinstance(value, dict) and "properties" in schema:
        props: dict[str, Any] = schema["properties"]
        out = {k: apply_defaults(props.get(k, {}), v) for k, v in value.items()}
        for name, sub in props.items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return copy.deepcopy(value)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _has_type(value: Any, expected: str) -> bool:
    actual = _type_name(value)
    if expected == "number":
        return actual in ("integer", "number")
    if expected == "integer" and actual == "number":
        return _whole(value)
    return actual == expected


def _whole(value: float) -> bool:
    return math.isfinite(value) and value.is_integer()


def _as_integer(schema: Mapping[str, Any], value: float) -> int | float:
    """`10.0` where the schema takes an integer (and not any number) as the tool expects it."""
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    return int(value) if "integer" in kinds and "number" not in kinds and _whole(value) else value


def _child(path: str, key: str) -> str:
    if _IDENT_RE.match(key):
        return f"{path}.{key}"
    shown = key if len(key) <= 100 else key[:99] + "…"
    return f"{path}[{json.dumps(shown, ensure_ascii=False)}]"


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 100 else text[:99] + "…"


def _num(value: float) -> str:
    return json.dumps(value)


def _validate(schema: Mapping[str, Any], value: Any, path: str, out: _Collector) -> None:
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_has_type(value, t) for t in types):
            out.add(path, f"expected {' or '.join(types)}, got {_type_name(value)}")
            return
    if isinstance(value, float) and not math.isfinite(value):
        out.add(path, "must be a finite number")
        return
    if "enum" in schema and not any(_json_equal(value, e) for e in schema["enum"]):
        out.add(path, "must be one of: " + ", ".join(_show(e) for e in schema["enum"]))
    if "const" in schema and not _json_equal(value, schema["const"]):
        out.add(path, f"must be {_show(schema['const'])}")
    if _is_number(value):
        if "minimum" in schema and value < schema["minimum"]:
            out.add(path, f"must be >= {_num(schema['minimum'])}")
        if "maximum" in schema and value > schema["maximum"]:
            out.add(path, f"must be <= {_num(schema['maximum'])}")
    elif isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            out.add(path, f"must be at least {schema['minLength']} characters long")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.add(path, f"must be at most {schema['maxLength']} characters long")
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            out.add(path, f"must match the pattern {_show(schema['pattern'])}")
    elif isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.add(path, f"must have at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            out.add(path, f"must have at most {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                _validate(schema["items"], item, f"{path}[{i}]", out)
    elif isinstance(value, dict):
        _validate_object(schema, value, path, out)


def _validate_object(
    schema: Mapping[str, Any], value: dict[str, Any], path: str, out: _Collector
) -> None:
    props: dict[str, Any] = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            out.add(_child(path, name), "is required")
    for name, sub in props.items():
        if name in value:
            _validate(sub, value[name], _child(path, name), out)
    if schema.get("additionalProperties") is False:
        for name in sorted(k for k in value if k not in props):
            out.add(_child(path, str(name)), "is not an allowed property")


def _json_equal(a: Any, b: Any) -> bool:
    """JSON equality: `1 == 1.0` but `True != 1`, element-wise for containers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    return type(a) is type(b) and a == b
