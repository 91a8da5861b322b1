"""Counts as a person reads them: `1 turn`, `2 turns`, never `1 turn(s)`; and the totals a
turn's end shows in the terminal app, `metis chat`, `metis run` and `metis sessions show`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def counted(n: int, singular: str, plural: str | None = None) -> str:
    """`1 turn`, `0 turns`, `2 turns`: the count and the noun in its number (the plural is
    the singular with an `s` unless given)."""
    return f"{n} {singular if n == 1 else (plural or singular + 's')}"


def turn_totals(payload: Mapping[str, Any]) -> str:
    """The middle of a turn's end line, from its turn.completed/cancelled/failed payload:
    `1 model call · 3 tools run · $0.0012`. The tool count is of the calls that ran (a denied
    call is not counted), hence "run"."""
    calls = int(payload.get("llm_call_count") or 0)
    tools = int(payload.get("tool_call_count") or 0)
    cost = payload.get("total_cost_usd") or "0"
    return f"{counted(calls, 'model call')} · {counted(tools, 'tool run', 'tools run')} · ${cost}"
