"""Typed field checks shared by the `models.yaml` and `routing.yaml` validators.

Both files promise the same diagnostics: every problem collected in one
pass, each message starting with its dotted path, one closed vocabulary of codes, and the same
type rules (booleans are never integers, integers are never floats). Keeping the checks here
means the two validators cannot drift apart in wording or strictness.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, TypeVar

from metis.core.config.yaml_source import (
    THE_CONTAINER,
    Diagnostic,
    MarkedDict,
    MarkedList,
    suggest,
)

_Number = TypeVar("_Number", int, float)

Position = tuple[int | None, int | None]
NO_POSITION: Position = (None, None)


def position(container: Any, key: Any = THE_CONTAINER) -> Position:
    """Line and column of a key (mapping) or item (sequence), else of the container itself."""
    if isinstance(container, MarkedDict):
        if key is not THE_CONTAINER and key in container.key_marks:
            return container.key_marks[key]
        return (container.line, container.column)
    if isinstance(container, MarkedList):
        if isinstance(key, int) and 0 <= key < len(container.item_marks):
            return container.item_marks[key]
        return (container.line, container.column)
    return NO_POSITION


def join(path: str, key: str | int) -> str:
    """`rules[2].when` style paths; keys that are not identifiers are quoted like `a["/x"]`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{path}[{json.dumps(key)}]"
    return f"{path}.{key}" if path else key


def yaml_key(key: object) -> str:
    """A mapping key as YAML spells it: a key left empty or written `~` or `null` is `null`
    (never Python's `None`), a boolean `true` or `false`; a string or a number as it is."""
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    return str(key)


def join_key(path: str, key: object) -> str:
    """The path of a mapping's entry, whatever YAML made of its key: a string as `join` words
    it, any other scalar in YAML's spelling (`workspaces.null`, `providers.true`)."""
    if isinstance(key, str):
        return join(path, key)
    return f"{path}.{yaml_key(key)}" if path else yaml_key(key)


def quoted_key(key: object) -> str:
    """A key named in a message: a string in quotes, any other scalar in YAML's spelling
    (`unknown key null`), so that neither reads as the other."""
    return f"'{key}'" if isinstance(key, str) else yaml_key(key)


def prefix(path: str) -> str:
    """The message prefix for a path: `"rules[1]: "`, or nothing at the top level."""
    return f"{path}: " if path else ""


def type_name(value: Any) -> str:
    """The YAML name of a value's type for `wrong_type` messages, so both validators word them the
    same."""
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
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


@dataclass
class Collector:
    """Accumulates diagnostics so validation never stops at the first problem."""

    diagnostics: list[Diagnostic] = field(default_factory=list)

    def error(self, code: str, path: str, where: Position, message: str) -> None:
        self.diagnostics.append(Diagnostic("error", code, path, where[0], where[1], message))

    def warning(self, code: str, path: str, where: Position, message: str) -> None:
        self.diagnostics.append(Diagnostic("warning", code, path, where[0], where[1], message))

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "warning"]

    def has_errors(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)

    def sorted(self) -> list[Diagnostic]:
        """Errors then warnings, each in document order (positionless file-level ones first)."""

        def key(d: Diagnostic) -> tuple[int, int, int]:
            return (0 if d.severity == "error" else 1, d.line or 0, d.column or 0)

        return sorted(self.diagnostics, key=key)

    # ---- typed reads --------------------------------------------------------------------

    def wrong_type(self, path: str, where: Position, expected: str, value: Any) -> None:
        self.error(
            "wrong_type", path, where, f"{prefix(path)}expected {expected}, got {type_name(value)}"
        )

    def check_keys(
        self,
        mapping: MarkedDict,
        path: str,
        allowed: Sequence[str],
        required: Iterable[str] = (),
        *,
        noun: str = "key",
        code: str = "unknown_key",
        list_allowed: bool = True,
    ) -> None:
        """Unknown keys (naming the allowed ones, with a close-match hint) and missing keys."""
        for key in mapping:
            if key not in allowed:
                hint = suggest(key, list(allowed)) if isinstance(key, str) else ""
                allowed_text = f" (allowed: {', '.join(allowed)})" if list_allowed else ""
                self.error(
                    code,
                    path,
                    position(mapping, key),
                    f"{prefix(path)}unknown {noun} {quoted_key(key)}{allowed_text}{hint}",
                )
        for key in required:
            if key not in mapping:
                self.error(
                    "missing_key",
                    path,
                    position(mapping),
                    f"{prefix(path)}missing required key '{key}'",
                )

    def mapping(self, value: Any, path: str, where: Position) -> MarkedDict | None:
        """The value as a `MarkedDict`, or None with a `wrong_type` error recorded; like every check
        below, it records and never raises, so one pass finds every problem."""
        if isinstance(value, dict):
            return value if isinstance(value, MarkedDict) else MarkedDict(value)
        self.wrong_type(path, where, "a mapping", value)
        return None

    def list_of(self, value: Any, path: str, where: Position) -> MarkedList | None:
        if isinstance(value, list):
            return value if isinstance(value, MarkedList) else MarkedList(value)
        self.wrong_type(path, where, "a list", value)
        return None

    def boolean(self, value: Any, path: str, where: Position) -> bool | None:
        if isinstance(value, bool):
            return value
        self.wrong_type(path, where, "a boolean (true or false)", value)
        return None

    def integer(
        self,
        value: Any,
        path: str,
        where: Position,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        """The value if it is an integer (never a boolean) within the bounds, else None with the
        error recorded."""
        if isinstance(value, bool) or not isinstance(value, int):
            self.wrong_type(path, where, "an integer", value)
            return None
        return self._in_range(value, path, where, minimum, maximum)

    def number(
        self,
        value: Any,
        path: str,
        where: Position,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        positive: bool = False,
    ) -> float | None:
        """The value as a float if it is a finite number (an integer is accepted, a boolean never)
        within the bounds, else None with the error recorded."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.wrong_type(path, where, "a number", value)
            return None
        if not math.isfinite(value):
            self.error("out_of_range", path, where, f"{prefix(path)}must be a finite number")
            return None
        if positive and value <= 0:
            self.error("out_of_range", path, where, f"{prefix(path)}must be greater than 0")
            return None
        return self._in_range(float(value), path, where, minimum, maximum)

    def _in_range(
        self,
        value: _Number,
        path: str,
        where: Position,
        minimum: float | None,
        maximum: float | None,
    ) -> _Number | None:
        if minimum is not None and value < minimum:
            self.error("out_of_range", path, where, f"{prefix(path)}must be at least {minimum}")
            return None
        if maximum is not None and value > maximum:
            self.error("out_of_range", path, where, f"{prefix(path)}must be at most {maximum}")
            return None
        return value

    def string(
        self,
        value: Any,
        path: str,
        where: Position,
        *,
        nonempty: bool = False,
        choices: Sequence[str] | None = None,
        pattern: re.Pattern[str] | None = None,
        pattern_text: str = "",
    ) -> str | None:
        """The value if it is a string meeting the options (non-empty, one of `choices`, matching
        `pattern`), else None with the error recorded."""
        if not isinstance(value, str):
            expected = (
                f"one of {', '.join(choices)}"
                if choices
                else "a non-empty string"
                if nonempty
                else "a string"
            )
            self.wrong_type(path, where, expected, value)
            return None
        if nonempty and not value:
            self.error("out_of_range", path, where, f"{prefix(path)}must not be empty")
            return None
        if choices is not None and value not in choices:
            hint = suggest(value, list(choices))
            self.error(
                "out_of_range",
                path,
                where,
                f"{prefix(path)}'{value}' is not one of {', '.join(choices)}{hint}",
            )
            return None
        if pattern is not None and not pattern.fullmatch(value):
            self.error(
                "out_of_range",
                path,
                where,
                f"{prefix(path)}'{value}' does not match {pattern_text or pattern.pattern}",
            )
            return None
        return value

    def decimal(self, value: Any, path: str, where: Position) -> Decimal | None:
        """A non-negative finite Decimal from a quoted string or a YAML number (via `str()`)."""
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            self.wrong_type(path, where, "a number or numeric string", value)
            return None
        try:
            result = Decimal(str(value).strip())
        except InvalidOperation:
            self.wrong_type(path, where, "a number or numeric string", value)
            return None
        if not result.is_finite():
            self.error("out_of_range", path, where, f"{prefix(path)}must be a finite number")
            return None
        if result < 0:
            self.error("out_of_range", path, where, f"{prefix(path)}must not be negative")
            return None
        return result.copy_abs()  # "-0" reads as 0


def format_diagnostic(source: str | os.PathLike[str], diagnostic: Diagnostic) -> str:
    """`file:line:col: severity: message` for terminals (the CLI `check` commands)."""
    where = str(source)
    if diagnostic.line is not None:
        where += f":{diagnostic.line}"
        if diagnostic.column is not None:
            where += f":{diagnostic.column}"
    return f"{where}: {diagnostic.severity}: {diagnostic.message} [{diagnostic.code}]"
