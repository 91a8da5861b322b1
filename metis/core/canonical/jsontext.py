"""JSON text at the edges: strict parsing of what clients send, and the canonical form that is hashed."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from pydantic_core import from_json

# A number can only overflow to infinity with a three-digit exponent: the walk below runs
# only for texts that have one.
_HUGE_EXPONENT = re.compile(r"[0-9][eE]\+?[0-9]{3,}")


def parse_client_json(text: str) -> Any:
    """A client's JSON text (REST and AAP bodies, WebSocket frames), RFC 8259 only.

    Stricter than `json.loads` where it matters downstream: an escaped lone surrogate cannot be
    stored or sent as UTF-8, and NaN, Infinity or a number overflowing to infinity (`1e999`)
    cannot be written back as JSON, so one stored value would break every later read; nesting
    deeper than `from_json`'s limit (about 200 levels) is refused before anything recurses
    into it. A key given twice in one object is refused too, never last-wins: which of two
    answers (`"decision": "deny", "decision": "allow"`) a client meant is not ours to guess,
    as in YAML config (metis/core/config/yaml_source.py). Raises ValueError for all of them.
    """
    value = from_json(text, allow_inf_nan=False)
    if _HUGE_EXPONENT.search(text) and _has_non_finite(value):
        raise ValueError("a number is out of range")
    if isinstance(value, (dict, list)):  # only containers hold objects
        _KEYS_CHECK.decode(text)
    return value


# The most of a repeated key a refusal quotes: it names the key, and stays small.
_QUOTED_KEY_CHARS = 64


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> None:
    """The second pass's `object_pairs_hook`: it sees every key of each object, which
    `from_json` (last one wins) does not. It builds nothing: the value is `from_json`'s.

    Two passes cost less than one `json.loads` with this hook plus the checks `from_json`
    makes (docs/decisions.md, "Duplicate JSON keys")."""
    if len(dict(pairs)) < len(pairs):
        key = next(k for k, n in Counter(k for k, _ in pairs).items() if n > 1)
        if len(key) > _QUOTED_KEY_CHARS:
            key = key[:_QUOTED_KEY_CHARS] + "…"
        raise ValueError(f"duplicate key {key!r}")


_KEYS_CHECK = json.JSONDecoder(object_pairs_hook=_refuse_repeated_keys)


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
