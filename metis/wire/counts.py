"""Counts as a person reads them: `1 turn`, `2 turns`, never `1 turn(s)`; the tokens a call or
turn read; and the totals a turn's end shows in the terminal app, `metis chat`, `metis run`
and `metis sessions show`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """`1 turn`, `0 turns`, `2 turns`: the count and the noun in its number (the plural is
    the singular with an `s` unless given)."""
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"


INPUT_BUCKETS = ("input_tokens", "cache_read_tokens", "cache_write_tokens")


def tokens_in(payload: Mapping[str, Any]) -> int:
    """The tokens a call (or a turn's calls) read, from a payload carrying the usage buckets.
    The buckets are disjoint, and with prompt caching most of a long session's input is read
    from the cache: `input_tokens` alone would say a call of 50,000 tokens read 3."""
    return sum(int(payload.get(name) or 0) for name in INPUT_BUCKETS)


def turn_totals(payload: Mapping[str, Any]) -> str:
    """The middle of a turn's end line, from its turn.completed/cancelled/failed payload:
    `1 model call · 3 tools run · $0.0012`. The tool count is of the calls that ran (a denied
    call is not counted), hence "run"."""
    calls = int(payload.get("llm_call_count") or 0)
    tools = int(payload.get("tool_call_count") or 0)
    cost = payload.get("total_cost_usd") or "0"
    return f"{counted(calls, 'model call')} · {counted(tools, 'tool run', 'tools run')} · ${cost}"
