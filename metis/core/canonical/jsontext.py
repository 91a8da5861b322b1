"""JSON text at the edges: strict parsing of what clients send, and the canonical form that is hashed."""

from __future__ import annotations

import json
import re
from typing import Any

import jiter

# A number can only overflow to infinity with a three-digit exponent: the walk below runs
# only for texts that have one.
_HUGE_EXPONENT = re.compile(r"[0-9][eE]\+?[0-9]{3,}")


def parse_client_json(text: str) -> Any:
    """A client's JSON text (REST and AAP bodies, WebSocket frames), RFC 8259 only.

    Stricter than `json.loads` where it matters downstream: an escaped lone surrogate cannot be
    stored or sent as UTF-8, and NaN, Infinity or a number overflowing to infinity (`1e999`)
    cannot be written back as JSON, so one stored value would break every later read; nesting
    deeper than the parser's limit (about 200 levels) is refused before anything recurses
    into it. A key given twice in one object is refused too, never last-wins: which of two
    answers (`"decision": "deny", "decision": "allow"`) a client meant is not ours to guess,
    as in YAML config (metis/core/config/yaml_source.py). Raises ValueError for all of them.
    """
    try:
        value = jiter.from_json(text.encode(), allow_inf_nan=False, catch_duplicate_keys=True)
    except ValueError as exc:
        raise ValueError(_shortened(str(exc))) from None
    if _HUGE_EXPONENT.search(text) and _has_non_finite(value):
        raise ValueError("a number is out of range")
    return value


# The most of a parser's message a refusal repeats: a repeated key is quoted in it, and a key
# can be as long as the body.
_MESSAGE_CHARS = 160


def _shortened(message: str) -> str:
    """The parser's message, its middle cut when long: the start says what, the end where."""
    if len(message) <= _MESSAGE_CHARS:
        return message
    return f"{message[: _MESSAGE_CHARS - 41]}…{message[-40:]}"


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def canonical_json(value: Any) -> str:
    """Sorted-key compact JSON: the form hashed for `input_sha256` and sizes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
