"""The schema subset, strict validation, defaults."""

from __future__ import annotations

from typing import Any

import pytest

from metis.core.canonical.tools import ToolDefinition
from metis.core.tools.base import ToolRegistrationError
from metis.core.tools.registry import ToolRegistry
from metis.core.tools.schema import SchemaError, check_schema, validate, validate_input


def root(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "additionalProperties": False}


def noop_factory() -> Any:
    raise AssertionError("never instantiated in these tests")


@pytest.mark.parametrize(
    "schema",
    [
        root(x={"oneOf": [{"type": "string"}, {"type": "integer"}]}),
        root(x={"$ref": "#/definitions/x"}),
        root(x={"anyOf": [{"type": "string"}]}),
        root(x={"allOf": [{"type": "string"}]}),
        root(x={"not": {"type": "string"}}),
        root(x={"if": {"type": "string"}, "then": {"minLength": 1}}),
        root(x={"type": "object", "patternProperties": {"^a": {"type": "string"}}}),
        root(x={"type": "object", "additionalProperties": {"type": "string"}}),
        root(x={"type": "string", "frobnicate": True}),
        root(x=["not", "a", "schema"]),
        {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {}},
        {"type": "array", "items": {"type": "string"}, "additionalProperties": False},
        {"type": "object", "additionalProperties": False},
        root(x={"type": "date"}),
        root(x={"type": "string", "pattern": "("}),
        root(x={"type": "integer", "minimum": "1"}),
        root(x={"type": "integer", "default": "1"}),
        {**root(x={"type": "string"}), "required": ["y"]},
    ],
)
def test_schemas_outside_the_subset_are_refused(schema: Any) -> None:
    with pytest.raises(SchemaError):
        check_schema(schema)
    registry = ToolRegistry()
    with pytest.raises(ToolRegistrationError):
        registry.register(ToolDefinition(name="t", input_schema=schema), noop_factory)
    assert registry.get("t") is None


def test_the_full_subset_is_accepted() -> None:
    check_schema(
        {
            **root(
                s={
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 9,
                    "pattern": "^a",
                    "format": "path",
                    "description": "d",
                    "title": "t",
                    "examples": ["ab"],
                    "default": "ab",
                },
                n={"type": ["number", "null"], "minimum": 0, "maximum": 1.5},
                e={"enum": ["a", 1, None]},
                c={"const": 3},
                a={"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
                o={"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]},
            ),
            "required": ["s"],
        }
    )


@pytest.mark.parametrize("name", ["Read", "1abc", "a-b", "", "a" * 65, "read file", "é"])
def test_bad_tool_names_are_refused(name: str) -> None:
    with pytest.raises(ToolRegistrationError, match="invalid tool name"):
        ToolRegistry().register(ToolDefinition(name=name, input_schema=root()), noop_factory)


def test_duplicate_names_and_non_string_path_fields_are_refused() -> None:
    registry = ToolRegistry()
    registry.register(ToolDefinition(name="t", input_schema=root()), noop_factory)
    with pytest.raises(ToolRegistrationError, match="already registered"):
        registry.register(ToolDefinition(name="t", input_schema=root()), noop_factory)
    bad = ToolDefinition(name="u", input_schema=root(p={"type": "integer"}), path_fields=("p",))
    with pytest.raises(ToolRegistrationError, match="path field"):
        registry.register(bad, noop_factory)


SCHEMA = {
    **root(
        path={"type": "string", "minLength": 1},
        offset={"type": "integer", "minimum": 1},
        ratio={"type": "number", "maximum": 1},
        flag={"type": "boolean", "default": False},
        mode={"enum": ["fast", "slow"], "default": "fast"},
        tags={"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        inner={
            "type": "object",
            "properties": {"depth": {"type": "integer", "default": 2}},
            "additionalProperties": False,
        },
    ),
    "required": ["path"],
}


def paths(value: Any) -> list[tuple[str, str]]:
    return [(e.path, e.message) for e in validate(SCHEMA, value)]


def test_validation_is_strict_without_coercion() -> None:
    assert paths({"path": "a", "offset": "10"}) == [("$.offset", "expected integer, got string")]
    assert paths({"path": "a", "offset": True}) == [("$.offset", "expected integer, got boolean")]
    assert paths({"path": "a", "offset": 10.5}) == [("$.offset", "expected integer, got number")]
    assert paths({"path": "a", "ratio": "0.5"}) == [("$.ratio", "expected number, got string")]
    assert paths({"path": "a", "ratio": 1, "offset": 3}) == []
    assert paths({"path": "a", "flag": 0}) == [("$.flag", "expected boolean, got integer")]
    assert paths({"path": "a", "ratio": float("nan")}) == [("$.ratio", "must be a finite number")]
    assert paths([]) == [("$", "expected object, got array")]


def test_a_whole_number_written_with_a_fraction_is_an_integer_and_reaches_the_tool_as_one() -> None:
    """JSON Schema counts 10.0 as an integer, and local models write whole numbers so."""
    result = validate_input(SCHEMA, {"path": "a", "offset": 10.0, "ratio": 1.0})
    assert result.ok and result.value is not None
    assert result.value["offset"] == 10 and isinstance(result.value["offset"], int)
    assert isinstance(result.value["ratio"], float)  # a number stays as written
    assert paths({"path": "a", "offset": float("inf")}) == [
        ("$.offset", "expected integer, got number")
    ]


def test_error_messages_and_paths() -> None:
    value = {
        "offset": 0,
        "ratio": 2,
        "mode": "medium",
        "tags": ["abcd", 5, "x"],
        "inner": {"depth": "deep", "x": 1},
        "zzz": 1,
        "a b": 2,
    }
    assert paths(value) == [
        ("$.path", "is required"),
        ("$.offset", "must be >= 1"),
        ("$.ratio", "must be <= 1"),
        ("$.mode", 'must be one of: "fast", "slow"'),
        ("$.tags", "must have at most 2 items"),
        ("$.tags[0]", "must be at most 3 characters long"),
        ("$.tags[1]", "expected string, got integer"),
        ("$.inner.depth", "expected integer, got string"),
        ("$.inner.x", "is not an allowed property"),
        ('$["a b"]', "is not an allowed property"),
        ("$.zzz", "is not an allowed property"),
    ]


def test_errors_are_capped_at_twenty_in_a_stable_order() -> None:
    value = {"path": "a", **{f"extra{i:02}": i for i in range(30)}}
    first = paths(value)
    assert len(first) == 20
    assert first == paths(dict(reversed(list(value.items()))))
    assert first[0] == ("$.extra00", "is not an allowed property")


def test_defaults_are_filled_only_after_successful_validation() -> None:
    result = validate_input(SCHEMA, {"path": "a", "inner": {}})
    assert result.ok
    assert result.value == {"path": "a", "inner": {"depth": 2}, "flag": False, "mode": "fast"}
    bad = validate_input(SCHEMA, {"path": 1})
    assert not bad.ok and bad.value is None
    assert [e.as_dict() for e in bad.errors] == [
        {"path": "$.path", "message": "expected string, got integer"}
    ]
